// SPDX-License-Identifier: GPL-2.0
//! The guest's `struct lguest_data`: the page it shares with the host.
//!
//! It is a static, alone in its own page, registered with
//! `LHCALL_LGUEST_INIT` before anything else happens. The host writes some
//! fields (`irq_pending`, `time`, `cr2`, `reserve_mem`, ...) while the guest
//! is not running, so every access goes through a volatile read or write of
//! one field: the compiler must neither cache nor elide them.

use core::ptr::{addr_of, addr_of_mut};

use lguest_abi::{
    HcallArgs, LguestData, LguestTime, LGUEST_IRQS, LHCALL_LGUEST_INIT, LHCALL_RING_SIZE, LHCALL_STATUS_DONE,
};

use crate::cell::GuestCell;
use crate::hcall::hcall;
use crate::virt_to_phys;

/// `LguestData` padded and aligned to a page of its own, so that the host's
/// view of it never straddles a page boundary.
#[repr(C, align(4096))]
struct DataPage(GuestCell<LguestData>);

/// The state at boot: virtual interrupts off, every interrupt line blocked
/// (this guest handles none yet), the async hypercall ring empty (every
/// entry `LHCALL_STATUS_DONE`), nothing written by the host yet.
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
};

/// The shared page. Only the volatile accessors below touch it.
static LGUEST_DATA: DataPage = DataPage(GuestCell::new(INITIAL));

/// A raw pointer to the shared page.
fn data() -> *mut LguestData {
    LGUEST_DATA.0.get()
}

/// Registers the shared page with the host (`LHCALL_LGUEST_INIT`). Called
/// once, first thing, by `lguest_start`.
pub(crate) fn init() {
    // SAFETY: the argument is the guest-physical address of a page-aligned
    // `LguestData` in a static, which lives (and stays where it is) for as
    // long as the guest runs; the host may write it at any time the guest is
    // not running, and every guest access is volatile.
    unsafe {
        hcall(LHCALL_LGUEST_INIT, virt_to_phys(data()), 0, 0, 0);
    }
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

/// Reads `irq_pending`: non-zero when the host holds an interrupt back until
/// the guest enables interrupts.
#[inline]
pub fn irq_pending() -> u64 {
    // SAFETY: as in `irq_enabled`.
    unsafe { addr_of!((*data()).irq_pending).read_volatile() }
}

/// Reads `reserve_mem`: the guest must not use virtual addresses at or
/// above it (the switcher lives there). 0 until the host has written it.
pub fn reserve_mem() -> u64 {
    // SAFETY: as in `irq_enabled`.
    unsafe { addr_of!((*data()).reserve_mem).read_volatile() }
}

/// Reads `tsc_khz`: the TSC frequency when the host says it is stable, else 0.
pub fn tsc_khz() -> u32 {
    // SAFETY: as in `irq_enabled`, for an aligned u32 field.
    unsafe { addr_of!((*data()).tsc_khz).read_volatile() }
}

/// Reads the wall-clock time the host last wrote.
pub fn time() -> LguestTime {
    // SAFETY: as in `irq_enabled`; each u64 is read once, so a torn pair is
    // possible only if the host wrote it between the reads, which it cannot
    // do while this vCPU runs.
    unsafe {
        let t = addr_of!((*data()).time);
        LguestTime { sec: addr_of!((*t).sec).read_volatile(), nsec: addr_of!((*t).nsec).read_volatile() }
    }
}

/// The guest-physical address of the shared page (for diagnostics).
pub fn address() -> u64 {
    virt_to_phys(data())
}
