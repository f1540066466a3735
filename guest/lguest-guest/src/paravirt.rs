// SPDX-License-Identifier: GPL-2.0
//! The paravirt operations: what a guest does instead of the privileged
//! instructions it may not execute in ring 3 (`cli`, `sti`, `pushf`/`popf`
//! of IF, `hlt`, the local APIC timer).
//!
//! [`Paravirt`] names the operations; [`Lguest`] implements them as plain
//! functions over the shared `lguest_data` page and hypercalls. There are no
//! patchable call sites and no patch templates: callers are statically
//! dispatched and the compiler inlines what it likes.
//!
//! The virtual IF lives in `lguest_data.irq_enabled`. The host never
//! delivers an interrupt while it is 0; instead it sets `irq_pending` and
//! waits. The guest, on re-enabling ([`irq_enable`], [`restore_fl`] with
//! IF), reads `irq_pending` and, while it is non-zero, makes
//! `LHCALL_SEND_INTERRUPTS`: the host delivers one interrupt (its handler
//! runs before the hypercall returns) and sets `irq_pending` again if more
//! remain, or clears it. So when `irq_enable` returns, every interrupt that
//! was pending and deliverable has been handled. That check can be switched
//! off with the command-line word `noirqcheck` (see [`set_irq_check`]), to
//! measure what it costs; interrupts held back then wait for the guest's
//! next exit (a host timer tick, or a hypercall).
//!
//! The other half of the protocol, returning from a handler with the IF of
//! the interrupted code, is the paravirt `iret` in [`crate::interrupts`].

use core::sync::atomic::{AtomicBool, Ordering};

use lguest_abi::{LHCALL_FLUSH_ASYNC, LHCALL_HALT, LHCALL_SEND_INTERRUPTS, LHCALL_SET_CLOCKEVENT, X86_EFLAGS_IF};

use crate::data;
use crate::hcall::hcall;

/// The operations a paravirtual guest kernel needs from its hypervisor.
pub trait Paravirt {
    /// Turns (virtual) interrupts off: the `cli` of a guest.
    fn irq_disable();
    /// Turns (virtual) interrupts on and takes any that were held back: the
    /// `sti` of a guest.
    fn irq_enable();
    /// The interrupt flag: [`X86_EFLAGS_IF`] if interrupts are on, else 0
    /// (the IF part of `pushf`).
    fn save_fl() -> u64;
    /// Restores a value from [`Paravirt::save_fl`] (the IF part of `popf`).
    fn restore_fl(flags: u64);
    /// Turns interrupts on and waits for one: the `sti; hlt` of a guest.
    /// Returns after one was delivered (its handler has run), with
    /// interrupts on. The host sleeps meanwhile, until an interrupt or a
    /// signal to the launcher; if every line is blocked, nothing could wake
    /// the guest, and RUN ends with `LGUEST_EXIT_HALT` instead.
    fn halt();
    /// Arms the one-shot clock event `delta_ns` nanoseconds from now.
    fn set_clockevent(delta_ns: u64);
    /// Runs the hypercalls queued in the async ring.
    fn flush_async();
    /// CPUID of `leaf`, `subleaf` as the launcher wants the guest to see
    /// it: EAX, EBX, ECX, EDX.
    fn cpuid(leaf: u32, subleaf: u32) -> [u32; 4];
}

/// The lguest backend of [`Paravirt`].
#[derive(Clone, Copy, Debug, Default)]
pub struct Lguest;

/// Whether re-enabling interrupts checks `irq_pending` (the default).
static IRQ_CHECK: AtomicBool = AtomicBool::new(true);

/// Turns the `irq_pending` check of [`Paravirt::irq_enable`] and
/// [`Paravirt::restore_fl`] on or off (`noirqcheck` on the command line
/// turns it off before `main` runs).
pub fn set_irq_check(on: bool) {
    IRQ_CHECK.store(on, Ordering::Relaxed);
}

/// Whether the `irq_pending` check is on.
pub fn irq_check() -> bool {
    IRQ_CHECK.load(Ordering::Relaxed)
}

/// Makes a hypercall that takes no addresses.
fn hcall_plain(nr: u64, a1: u64) -> u64 {
    // SAFETY: the hypercalls made through here (SEND_INTERRUPTS, HALT,
    // SET_CLOCKEVENT, FLUSH_ASYNC) take no guest addresses; FLUSH_ASYNC reads
    // the async ring, which lives in `lguest_data` and is always valid.
    unsafe { hcall(nr, a1, 0, 0, 0) }
}

/// Interrupts were just re-enabled: while the host holds some back, ask
/// for them, one `LHCALL_SEND_INTERRUPTS` per delivery.
///
/// No fence is needed between the store to `irq_enabled` and this load of
/// `irq_pending`: the host only writes `irq_pending` while this (single)
/// vCPU is stopped in the host, and the exit itself orders everything. The
/// loop also stops if interrupts went off again (a handler that changed its
/// frame's IF): the host cannot deliver then, and would keep `irq_pending`
/// set.
#[inline]
fn deliver_pending() {
    while irq_check() && data::irq_pending() != 0 && data::irq_enabled() != 0 {
        hcall_plain(LHCALL_SEND_INTERRUPTS, 0);
    }
}

/// `cli`.
#[inline]
pub fn irq_disable() {
    data::set_irq_enabled(0);
}

/// `sti`.
#[inline]
pub fn irq_enable() {
    data::set_irq_enabled(X86_EFLAGS_IF);
    deliver_pending();
}

/// `pushf`, IF only.
#[inline]
pub fn save_fl() -> u64 {
    data::irq_enabled()
}

/// `popf`, IF only. Bits other than IF are dropped, so that the host only
/// ever sees 0 or [`X86_EFLAGS_IF`].
#[inline]
pub fn restore_fl(flags: u64) {
    let flags = flags & X86_EFLAGS_IF;
    data::set_irq_enabled(flags);
    if flags != 0 {
        deliver_pending();
    }
}

/// `sti; hlt`: `LHCALL_HALT` turns the virtual IF on (the host writes
/// `irq_enabled`) and sleeps until an interrupt is deliverable, then
/// delivers it before returning. Call it with interrupts *off* after
/// checking for work (and arming a timer), so that an interrupt arriving in
/// between is not lost: the host then sees it pending and does not sleep.
/// Returns with interrupts on.
pub fn halt() {
    hcall_plain(LHCALL_HALT, 0);
}

/// Arms the one-shot clock event: IRQ 0 in `delta_ns` nanoseconds (0
/// cancels it). A new one replaces the old. See [`crate::clock`].
pub fn set_clockevent(delta_ns: u64) {
    hcall_plain(LHCALL_SET_CLOCKEVENT, delta_ns);
}

/// Runs the async ring (a no-op while nothing is queued).
pub fn flush_async() {
    hcall_plain(LHCALL_FLUSH_ASYNC, 0);
}

/// CPUID through the forced-emulation prefix (`LGUEST_EMULATE_PREFIX`):
/// the host answers from the launcher's table (`LGUEST_SET_CPUID`, e.g.
/// `lguest run --cpuid filtered`), or with the host CPU's values if the
/// launcher set none. It costs one exit, like a hypercall; a plain `cpuid`
/// shows the host CPU wherever the host cannot make CPUID fault.
pub fn cpuid(leaf: u32, subleaf: u32) -> [u32; 4] {
    let (a, b, c, d): (u32, u32, u32, u32);
    // SAFETY: the prefix's `ud2` traps to the host, which emulates the
    // `cpuid` after it and resumes past both, changing only the four
    // registers declared here; RBX, reserved by LLVM, is saved in a
    // scratch register around it.
    unsafe {
        core::arch::asm!(
            "mov {b:r}, rbx",
            ".byte 0x0f, 0x0b, 0x6c, 0x67, 0x75",
            "cpuid",
            "xchg {b:r}, rbx",
            b = out(reg) b,
            inout("eax") leaf => a,
            inout("ecx") subleaf => c,
            out("edx") d,
            options(nostack, preserves_flags),
        )
    }
    [a, b, c, d]
}

impl Paravirt for Lguest {
    #[inline]
    fn cpuid(leaf: u32, subleaf: u32) -> [u32; 4] {
        cpuid(leaf, subleaf)
    }
    #[inline]
    fn irq_disable() {
        irq_disable();
    }
    #[inline]
    fn irq_enable() {
        irq_enable();
    }
    #[inline]
    fn save_fl() -> u64 {
        save_fl()
    }
    #[inline]
    fn restore_fl(flags: u64) {
        restore_fl(flags);
    }
    #[inline]
    fn halt() {
        halt();
    }
    #[inline]
    fn set_clockevent(delta_ns: u64) {
        set_clockevent(delta_ns);
    }
    #[inline]
    fn flush_async() {
        flush_async();
    }
}
