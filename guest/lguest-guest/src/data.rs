// SPDX-License-Identifier: GPL-2.0
//! The guest's `struct lguest_data`: the page it shares with the host.
//!
//! It is a static, alone in its own page, registered with
//! `LHCALL_LGUEST_INIT` before anything else happens. The host writes some
//! fields (`irq_pending`, `time`, `cr2`, `reserve_mem`, ...) while the guest
//! is not running, so every access goes through a volatile read or write of
//! one field: the compiler must neither cache nor elide them.
//!
//! Interrupt handlers run on the guest's one vCPU in the middle of any code,
//! so a read-modify-write of a field the guest itself changes in a handler
//! must be one instruction: [`block_irq`] and [`unblock_irq`] use atomic
//! `lock or`/`lock and` on `blocked_interrupts`. The entry stubs of
//! [`crate::interrupts`] write `irq_enabled` from assembly (the paravirt
//! `iret`), which is why `LGUEST_DATA` is visible to the crate.

use core::ptr::{addr_of, addr_of_mut};
use core::sync::atomic::{AtomicU64, Ordering};

use lguest_abi::{
    HcallArgs, LguestData, LguestTime, LGUEST_INIT_LINUX_FRAMES, LGUEST_IRQS, LHCALL_LGUEST_INIT, LHCALL_RING_SIZE,
    LHCALL_STATUS_DONE,
};

use crate::cell::GuestCell;
use crate::hcall::hcall;
use crate::virt_to_phys;

/// `LguestData` padded and aligned to a page of its own, so that the host's
/// view of it never straddles a page boundary.
#[repr(C, align(4096))]
pub(crate) struct DataPage(GuestCell<LguestData>);

/// The state at boot: virtual interrupts off, every interrupt line blocked
/// (a line is unblocked when its handler is installed, see
/// [`crate::interrupts`]), the async hypercall ring empty (every entry
/// `LHCALL_STATUS_DONE`), nothing written by the host yet. `noirq_iret` is
/// filled in by [`init`] before the page is registered.
const INITIAL: LguestData = LguestData {
    irq_enabled: 0,
    blocked_interrupts: [u64::MAX; LGUEST_IRQS / 64],
    cr2: 0,
    time: LguestTime { sec: 0, nsec: 0 },
    irq_pending: 0,
    hcall_status: [LHCALL_STATUS_DONE; LHCALL_RING_SIZE],
    hcalls: [HcallArgs { arg0: 0, arg1: 0, arg2: 0, arg3: 0, arg4: 0 }; LHCALL_RING_SIZE],
    reserve_mem: 0,
    tsc_khz: 0,
    pad0: 0,
    noirq_iret: 0,
    kernel_address: 0,
    syscall_vec: 0,
    pad1: 0,
    kernel_sp0: 0,
    dr6: 0,
    debugreg: [0; 4],
};

/// The shared page. Only the volatile and atomic accessors below touch it,
/// and the paravirt `iret` of [`crate::interrupts`] (one `popq` into
/// `irq_enabled`, from assembly, by symbol).
pub(crate) static LGUEST_DATA: DataPage = DataPage(GuestCell::new(INITIAL));

/// A raw pointer to the shared page.
fn data() -> *mut LguestData {
    LGUEST_DATA.0.get()
}

/// Registers the shared page with the host (`LHCALL_LGUEST_INIT`). Called
/// once, first thing, by `lguest_start`.
///
/// `noirq_iret` (the address of the one `iretq` of the interrupt return
/// path) is written first, so the host has it from the start, long before
/// the guest can enable interrupts.
pub(crate) fn init() {
    let mut flags = if crate::interrupts::linux_frames() { LGUEST_INIT_LINUX_FRAMES } else { 0 };
    if tlb_shadows() {
        flags |= lguest_abi::LGUEST_INIT_TLB_SHADOWS;
    }
    // SAFETY: as in `irq_enabled`; the host only reads this field.
    unsafe { addr_of_mut!((*data()).noirq_iret).write_volatile(crate::interrupts::noirq_iret()) }
    // SAFETY: the argument is the guest-physical address of a page-aligned
    // `LguestData` in a static, which lives (and stays where it is) for as
    // long as the guest runs; the host may write it at any time the guest is
    // not running, and every guest access is volatile.
    unsafe {
        hcall(LHCALL_LGUEST_INIT, virt_to_phys(data()), flags, 0, 0);
    }
}

/// Whether the guest asks for TLB-semantics shadows (the command-line
/// word `tlbshadows`, given to the host at `LHCALL_LGUEST_INIT`).
static TLB_SHADOWS: core::sync::atomic::AtomicBool = core::sync::atomic::AtomicBool::new(false);

/// Asks for TLB-semantics shadows (`LGUEST_INIT_TLB_SHADOWS`); before
/// [`init`] only.
pub fn set_tlb_shadows(on: bool) {
    TLB_SHADOWS.store(on, Ordering::Relaxed);
}

/// Whether the shadows follow TLB semantics: then a change to the guest's
/// tables needs [`crate::paging::invlpg`] or a flush, not a report.
pub fn tlb_shadows() -> bool {
    TLB_SHADOWS.load(Ordering::Relaxed)
}

/// Reads `irq_enabled` (the virtual IF).
#[inline]
pub fn irq_enabled() -> u64 {
    // SAFETY: `data()` points to a live, aligned `LguestData`; a volatile read
    // of one aligned u64 field creates no reference, so it cannot alias.
    unsafe { addr_of!((*data()).irq_enabled).read_volatile() }
}

/// Writes `irq_enabled` (the virtual IF).
#[inline]
pub fn set_irq_enabled(value: u64) {
    // SAFETY: as in `irq_enabled`; the field is plain data the host only
    // reads, so any value is valid (the host checks it).
    unsafe { addr_of_mut!((*data()).irq_enabled).write_volatile(value) }
}

/// Writes `kernel_sp0`: the kernel stack of the next entry from user mode
/// (0: the one `LHCALL_SET_STACK` set), as a native kernel writes its TSS.
#[inline]
pub fn set_kernel_sp0(value: u64) {
    // SAFETY: as in `irq_enabled`; the host reads the field once per entry
    // from user mode and checks it.
    unsafe { addr_of_mut!((*data()).kernel_sp0).write_volatile(value) }
}

/// Writes `debugreg[i]`, DR`i`'s address for the next
/// `LHCALL_SET_DEBUGREGS`.
#[inline]
pub fn set_debugreg(i: usize, value: u64) {
    // SAFETY: as in `irq_enabled`; the host reads the fields once, at
    // the hypercall.
    unsafe { addr_of_mut!((*data()).debugreg[i & 3]).write_volatile(value) }
}

/// Reads `irq_pending`: non-zero when the host holds an interrupt back until
/// the guest enables interrupts.
#[inline]
pub fn irq_pending() -> u64 {
    // SAFETY: as in `irq_enabled`.
    unsafe { addr_of!((*data()).irq_pending).read_volatile() }
}

/// Reads `noirq_iret`: the address of the `iretq` the host never
/// interrupts (written at boot, before `LHCALL_LGUEST_INIT`).
pub fn noirq_iret() -> u64 {
    // SAFETY: as in `irq_enabled`.
    unsafe { addr_of!((*data()).noirq_iret).read_volatile() }
}

/// Reads `cr2`: the faulting address of the last page fault the host
/// delivered to the guest. A page-fault handler reads it first thing (the
/// #PF gate is an interrupt gate, so no interrupt can come in between and
/// fault again).
#[inline]
pub fn cr2() -> u64 {
    // SAFETY: as in `irq_enabled`.
    unsafe { addr_of!((*data()).cr2).read_volatile() }
}

/// `blocked_interrupts[0]` as an atomic: bit `n` blocks IRQ `n`.
fn blocked() -> &'static AtomicU64 {
    // SAFETY: the field is an aligned u64 in a static that lives for ever;
    // the guest only ever touches it through this atomic (the host reads it
    // while the guest is stopped, which is no concurrent Rust access).
    unsafe { AtomicU64::from_ptr(addr_of_mut!((*data()).blocked_interrupts[0])) }
}

/// Reads `blocked_interrupts[0]`: bit `n` set means the host never delivers
/// IRQ `n`.
pub fn blocked_interrupts() -> u64 {
    blocked().load(Ordering::Relaxed)
}

/// Sets the bit of IRQ `irq` (0..63) in `blocked_interrupts`: the host holds
/// it back until [`unblock_irq`]. Larger numbers are ignored.
pub fn block_irq(irq: u8) {
    if let Some(bit) = 1u64.checked_shl(u32::from(irq)) {
        // One `lock or`: an interrupt handler cannot slip in between.
        blocked().fetch_or(bit, Ordering::Relaxed);
    }
}

/// Clears the bit of IRQ `irq` (0..63) in `blocked_interrupts`: the host may
/// deliver it (when virtual interrupts are on). Larger numbers are ignored.
pub fn unblock_irq(irq: u8) {
    if let Some(bit) = 1u64.checked_shl(u32::from(irq)) {
        blocked().fetch_and(!bit, Ordering::Relaxed);
    }
}

/// Reads `reserve_mem`: the guest must not use lower-half virtual
/// addresses at or above it (the last page below 2^47); in the upper half,
/// addresses from `GUEST_UPPER_START` on are the guest's (below it is the
/// guard hole, where the switcher lives). 0 until the host has written it.
pub fn reserve_mem() -> u64 {
    // SAFETY: as in `irq_enabled`.
    unsafe { addr_of!((*data()).reserve_mem).read_volatile() }
}

/// Reads `tsc_khz`: the TSC frequency when the host says it is stable, else 0.
pub fn tsc_khz() -> u32 {
    // SAFETY: as in `irq_enabled`, for an aligned u32 field.
    unsafe { addr_of!((*data()).tsc_khz).read_volatile() }
}

/// Reads the wall-clock time the host last wrote (at `LHCALL_LGUEST_INIT`
/// and at every interrupt or trap it delivers).
pub fn time() -> LguestTime {
    // The host writes both fields while the guest is stopped, which now
    // includes an interrupt delivered between our two reads. Reading `sec`
    // again catches that: if it is unchanged, `nsec` belongs with it.
    loop {
        // SAFETY: as in `irq_enabled`, for the aligned u64s of `time`.
        let (sec, nsec, again) = unsafe {
            let t = addr_of!((*data()).time);
            let sec = addr_of!((*t).sec).read_volatile();
            let nsec = addr_of!((*t).nsec).read_volatile();
            (sec, nsec, addr_of!((*t).sec).read_volatile())
        };
        if sec == again {
            return LguestTime { sec, nsec };
        }
    }
}

/// The guest-physical address of the shared page (for diagnostics).
pub fn address() -> u64 {
    virt_to_phys(data())
}
