// SPDX-License-Identifier: GPL-2.0
//! The heap (feature `alloc`): a `#[global_allocator]` over the free RAM
//! above the image, so that a guest may use `alloc` (`Box`, `Vec`, ...).
//!
//! The arena is guest-physical `[end of the image, RAM size - 4 KiB)`: all
//! of it is mapped virtual = physical from entry, nothing of the image or
//! its stack is in it, and the last page, where the launcher left the
//! command line, stays out. It is set up at the first allocation, so a
//! guest that never allocates never touches that memory. The allocator is
//! `linked_list_allocator`'s first-fit [`Heap`]; a lock is not needed on one
//! vCPU, only interrupts off around each operation, which makes allocating
//! from an interrupt handler safe as well.
//!
//! Allocation failure takes the default path of `alloc` (a panic, which
//! crashes the guest with the message).
//!
//! [`crate::frames`] hands out pages from the same RAM: a guest that uses
//! both calls [`set_arena`] before its first allocation and gives the
//! frame allocator the rest.

use core::alloc::{GlobalAlloc, Layout};
use core::ptr::{null_mut, NonNull};
use core::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use linked_list_allocator::Heap;

use crate::cell::GuestCell;
use crate::{paravirt, start};

/// The last page of RAM holds the launcher's command line.
const TOP_RESERVED: u64 = 4096;

/// The allocator behind `alloc` in a guest with feature `alloc`.
pub struct GuestHeap {
    heap: GuestCell<Heap>,
    ready: AtomicBool,
    used: AtomicU64,
    custom_size: AtomicU64,
}

#[global_allocator]
static HEAP: GuestHeap = GuestHeap {
    heap: GuestCell::new(Heap::empty()),
    ready: AtomicBool::new(false),
    used: AtomicU64::new(0),
    custom_size: AtomicU64::new(0),
};

/// The arena: `(start, size)`, page aligned.
pub fn arena() -> (u64, u64) {
    let start = (start::image().end + 4095) & !4095;
    let end = start::ram_size().saturating_sub(TOP_RESERVED) & !4095;
    (start, end.saturating_sub(start))
}

/// Bytes of the arena.
pub fn size() -> u64 {
    let custom = HEAP.custom_size.load(Ordering::Relaxed);
    if custom != 0 {
        custom
    } else {
        arena().1
    }
}

/// Makes the heap `[start, start + size)` instead of [`arena`], so that a
/// guest can share the free RAM with something else (the frame allocator of
/// [`crate::frames`], say). Only before the first allocation, and only for
/// RAM above the image and below the command-line page; returns whether it
/// took.
pub fn set_arena(start: u64, size: u64) -> bool {
    let (lo, default_size) = arena();
    let Some(end) = start.checked_add(size) else { return false };
    if start < lo || end > lo + default_size || size == 0 {
        return false;
    }
    HEAP.with_init(Some((start, size)), |_| ())
}

/// Bytes allocated now (as asked for, without the allocator's overhead).
pub fn used() -> u64 {
    HEAP.used.load(Ordering::Relaxed)
}

impl GuestHeap {
    /// Runs `f` on the heap with interrupts off, setting it up first if
    /// this is the first use.
    fn with<R>(&self, f: impl FnOnce(&mut Heap) -> R) -> R {
        let mut r = None;
        self.with_init(None, |heap| r = Some(f(heap)));
        r.expect("heap: with ran f")
    }

    /// Sets the heap up over `arena` (or the default arena) if it is not
    /// yet, then runs `f` on it, with interrupts off; returns whether this
    /// call set it up.
    fn with_init(&self, arena_override: Option<(u64, u64)>, f: impl FnOnce(&mut Heap)) -> bool {
        let flags = paravirt::save_fl();
        paravirt::irq_disable();
        // SAFETY: interrupts are off and the guest has one vCPU, so nothing
        // else runs until we turn them back on: this is the only reference
        // to the heap (the callers of `with` do not nest).
        let heap = unsafe { &mut *self.heap.get() };
        let fresh = !self.ready.load(Ordering::Relaxed);
        if fresh {
            let (start, size) = arena_override.unwrap_or_else(arena);
            if arena_override.is_some() {
                self.custom_size.store(size, Ordering::Relaxed);
            }
            if size > 0 {
                // SAFETY: the arena is RAM above the image and below the
                // command-line page (`arena`, or checked by `set_arena`),
                // mapped virtual = physical and writable from entry; a
                // guest that also uses the frame allocator gives the two
                // disjoint ranges (see the module documentation). It is set
                // up exactly once.
                unsafe { heap.init(start as *mut u8, size as usize) };
            }
            self.ready.store(true, Ordering::Relaxed);
        }
        if arena_override.is_none() || fresh {
            f(heap);
        }
        paravirt::restore_fl(flags);
        fresh
    }
}

// SAFETY: `alloc` returns memory of the layout from the arena, or null;
// blocks are handed out once until `dealloc` returns them (the
// linked-list allocator's contract), with interrupts off around each
// operation so that handlers cannot interleave.
unsafe impl GlobalAlloc for GuestHeap {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = self.with(|heap| heap.allocate_first_fit(layout).map_or(null_mut(), NonNull::as_ptr));
        if !p.is_null() {
            self.used.fetch_add(layout.size() as u64, Ordering::Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if let Some(p) = NonNull::new(ptr) {
            // SAFETY: the caller passes a block `alloc` returned with this
            // layout and does not use it afterwards.
            self.with(|heap| unsafe { heap.deallocate(p, layout) });
            self.used.fetch_sub(layout.size() as u64, Ordering::Relaxed);
        }
    }
}
