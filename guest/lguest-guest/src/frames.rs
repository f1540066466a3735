// SPDX-License-Identifier: GPL-2.0
//! Physical frames: a page allocator over free guest RAM, for page tables
//! ([`crate::paging`]) and the pages they map.
//!
//! The pool is a range of guest-physical memory, by default
//! [`free_ram`]: from the end of the image (its statics and boot stack) to
//! the last page of RAM, which holds the launcher's command line. Frames
//! are handed out from a bump pointer; freed ones go on a free list (one
//! for 4 KiB frames, one for 2 MiB frames) threaded through their first
//! word. Every frame is touched through the identity map the guest runs on
//! (virtual = physical for RAM, which [`crate::paging`]'s kernel map keeps),
//! and every frame handed out is zeroed.
//!
//! The heap (feature `alloc`, `crate::heap`) uses the same RAM above the
//! image: a guest that uses both must give the frame allocator a range the
//! heap does not use (see [`init`]).
//!
//! All operations run with virtual interrupts off, so an interrupt handler
//! may allocate too (there is one vCPU).

use core::ops::Range;
use core::ptr;

use crate::cell::GuestCell;
use crate::paravirt;
use crate::start;

/// Bytes of a small frame.
pub const FRAME_SIZE: u64 = 4096;
/// Bytes of a large frame.
pub const LARGE_FRAME_SIZE: u64 = 2 << 20;
/// The last page of RAM holds the launcher's command line.
const TOP_RESERVED: u64 = FRAME_SIZE;

/// The allocator's state.
struct Pool {
    /// Next never-used byte.
    next: u64,
    /// End of the pool.
    end: u64,
    /// Head of the free list of 4 KiB frames (0: empty).
    free_small: u64,
    /// Head of the free list of 2 MiB frames (0: empty).
    free_large: u64,
    /// Bytes handed out and not freed.
    used: u64,
    /// Bytes of the pool.
    size: u64,
}

static POOL: GuestCell<Pool> = GuestCell::new(Pool { next: 0, end: 0, free_small: 0, free_large: 0, used: 0, size: 0 });

/// Runs `f` on the pool with interrupts off.
fn with<R>(f: impl FnOnce(&mut Pool) -> R) -> R {
    let flags = paravirt::save_fl();
    paravirt::irq_disable();
    // SAFETY: interrupts are off and there is one vCPU, so nothing else
    // runs until `restore_fl`; no function here calls `with` again, so this
    // is the only reference to the pool.
    let r = f(unsafe { &mut *POOL.get() });
    paravirt::restore_fl(flags);
    r
}

/// The default pool: guest-physical `[end of the image, RAM size - 4 KiB)`,
/// page aligned.
pub fn free_ram() -> Range<u64> {
    let start = start::image().end.next_multiple_of(FRAME_SIZE);
    let end = start::ram_size().saturating_sub(TOP_RESERVED) & !(FRAME_SIZE - 1);
    start..end.max(start)
}

/// Makes `range` (rounded inwards to whole pages) the pool, forgetting any
/// previous one. The range must be guest RAM that nothing else uses, above
/// `LGUEST_LOAD_MIN`, mapped virtual = physical and writable.
pub fn init(range: Range<u64>) {
    let start = range.start.next_multiple_of(FRAME_SIZE);
    let end = (range.end & !(FRAME_SIZE - 1)).max(start);
    with(|p| *p = Pool { next: start, end, free_small: 0, free_large: 0, used: 0, size: end - start });
}

/// [`init`] with [`free_ram`].
pub fn init_free_ram() {
    init(free_ram());
}

/// Zeroes `len` bytes at guest-physical `pa`.
fn zero(pa: u64, len: u64) {
    // SAFETY: `pa..pa + len` is a frame of the pool just taken off a list
    // or the bump pointer: RAM nobody else uses, identity mapped, writable
    // (the contract of `init`).
    unsafe { ptr::write_bytes(pa as *mut u8, 0, len as usize) }
}

/// Pops the head of the free list at `head`.
fn pop(head: &mut u64) -> Option<u64> {
    let pa = *head;
    if pa == 0 {
        return None;
    }
    // SAFETY: a free frame's first word holds the next free frame; the
    // frame is identity mapped RAM of the pool that only this list uses.
    *head = unsafe { ptr::read_volatile(pa as *const u64) };
    Some(pa)
}

/// Pushes `pa` on the free list at `head`.
fn push(head: &mut u64, pa: u64) {
    // SAFETY: `pa` is a frame of the pool its owner gave back; from now on
    // only the list uses it (as in `pop`).
    unsafe { ptr::write_volatile(pa as *mut u64, *head) };
    *head = pa;
}

/// A zeroed 4 KiB frame (its guest-physical address), or `None` when the
/// pool is exhausted.
pub fn alloc() -> Option<u64> {
    let pa = with(|p| {
        let pa = pop(&mut p.free_small).or_else(|| {
            (p.next + FRAME_SIZE <= p.end).then(|| {
                p.next += FRAME_SIZE;
                p.next - FRAME_SIZE
            })
        })?;
        p.used += FRAME_SIZE;
        Some(pa)
    })?;
    zero(pa, FRAME_SIZE);
    Some(pa)
}

/// A zeroed, 2 MiB aligned 2 MiB frame, or `None`. The small frames the
/// alignment skips go on the small free list.
pub fn alloc_large() -> Option<u64> {
    let pa = with(|p| {
        let pa = match pop(&mut p.free_large) {
            Some(pa) => pa,
            None => {
                let pa = p.next.next_multiple_of(LARGE_FRAME_SIZE);
                if pa + LARGE_FRAME_SIZE > p.end {
                    return None;
                }
                while p.next < pa {
                    push(&mut p.free_small, p.next);
                    p.next += FRAME_SIZE;
                }
                p.next = pa + LARGE_FRAME_SIZE;
                pa
            }
        };
        p.used += LARGE_FRAME_SIZE;
        Some(pa)
    })?;
    zero(pa, LARGE_FRAME_SIZE);
    Some(pa)
}

/// Gives back a 4 KiB frame from [`alloc`]. Nothing may map or use it any
/// more (the caller has told the host about the unmapping).
pub fn free(pa: u64) {
    debug_assert!(pa.is_multiple_of(FRAME_SIZE));
    with(|p| {
        push(&mut p.free_small, pa);
        p.used -= FRAME_SIZE;
    });
}

/// Gives back a 2 MiB frame from [`alloc_large`].
pub fn free_large(pa: u64) {
    debug_assert!(pa.is_multiple_of(LARGE_FRAME_SIZE));
    with(|p| {
        push(&mut p.free_large, pa);
        p.used -= LARGE_FRAME_SIZE;
    });
}

/// Bytes handed out and not freed.
pub fn used() -> u64 {
    with(|p| p.used)
}

/// Bytes of the pool.
pub fn size() -> u64 {
    with(|p| p.size)
}
