// SPDX-License-Identifier: GPL-2.0
//! Time: the one-shot clock event (IRQ 0), a nanosecond clock, and sleeping
//! with `LHCALL_HALT`.
//!
//! - [`set_event`] arms the host's one-shot timer with
//!   `LHCALL_SET_CLOCKEVENT(ns from now)`; it raises IRQ 0, whose handler
//!   ([`init`] installs it) counts [`ticks`] and calls the [`set_callback`]
//!   function, in interrupt context.
//! - [`now_ns`] is the TSC scaled by `lguest_data.tsc_khz` when the host
//!   found the TSC stable (`tsc_khz != 0`): monotonic, fine-grained, from an
//!   unspecified origin. Otherwise it is `lguest_data.time`, the wall clock,
//!   which the host only writes at `LHCALL_LGUEST_INIT` and at each delivery,
//!   so it only moves when the guest takes an interrupt or trap.
//! - [`sleep_ns`] arms the event for the time left and halts until the
//!   deadline has passed; each wake-up is one interrupt (any IRQ, not only
//!   the timer), after which it re-arms for what is left. While halted the
//!   guest uses no CPU.
//!
//! No function here may be called from an interrupt handler except
//! [`set_event`], [`now_ns`], [`rdtsc`] and [`ticks`].

use core::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use crate::interrupts::{self, TrapFrame};
use crate::{data, paravirt};

/// The IRQ of the clock event.
pub const TIMER_IRQ: u8 = 0;
/// Nanoseconds per second.
pub const NSEC_PER_SEC: u64 = 1_000_000_000;

/// Timer interrupts taken since boot.
static TICKS: AtomicU64 = AtomicU64::new(0);
/// The callback, as `fn() as usize` (0: none).
static CALLBACK: AtomicUsize = AtomicUsize::new(0);

/// Reads the time-stamp counter (the host leaves CR4.TSD clear, so this
/// works in ring 3 without an exit).
#[inline]
pub fn rdtsc() -> u64 {
    let (lo, hi): (u32, u32);
    // SAFETY: `rdtsc` only writes EDX:EAX; it touches no memory or stack.
    unsafe { core::arch::asm!("rdtsc", out("eax") lo, out("edx") hi, options(nomem, nostack, preserves_flags)) };
    (u64::from(hi) << 32) | u64::from(lo)
}

/// Installs the IRQ 0 handler (and every other handler set so far, see
/// [`interrupts::install`]), which unblocks IRQ 0. Interrupts stay as they
/// are (off at boot). Calling it again does no harm.
pub fn init() -> Result<(), interrupts::Error> {
    interrupts::set_irq_handler(TIMER_IRQ, tick)?;
    interrupts::install()
}

/// Sets the function the timer interrupt calls (after counting the tick),
/// with interrupts off, on the interrupted code's stack. It may call
/// [`set_event`] to re-arm.
pub fn set_callback(callback: fn()) {
    CALLBACK.store(callback as usize, Ordering::Release);
}

/// Removes the callback.
pub fn clear_callback() {
    CALLBACK.store(0, Ordering::Release);
}

/// Timer interrupts taken since boot.
pub fn ticks() -> u64 {
    TICKS.load(Ordering::Relaxed)
}

/// The IRQ 0 handler.
fn tick(_frame: &mut TrapFrame) {
    TICKS.fetch_add(1, Ordering::Relaxed);
    let raw = CALLBACK.load(Ordering::Acquire);
    if raw != 0 {
        // SAFETY: the only non-zero values stored in CALLBACK are `fn()`
        // pointers cast to usize (`set_callback`), which fit a usize.
        let callback = unsafe { core::mem::transmute::<usize, fn()>(raw) };
        callback();
    }
}

/// Arms the one-shot clock event to raise IRQ 0 `ns` nanoseconds from now
/// (`LHCALL_SET_CLOCKEVENT`), replacing any armed one; 0 cancels it. The
/// host rounds delays below 1 us up to 1 us.
pub fn set_event(ns: u64) {
    paravirt::set_clockevent(ns);
}

/// Converts TSC cycles to nanoseconds at `khz` kHz (not 0), without
/// overflow for any realistic uptime: whole milliseconds, then the rest.
pub fn cycles_to_ns(cycles: u64, khz: u32) -> u64 {
    let khz = u64::from(khz.max(1));
    let ms = cycles / khz;
    let rest = cycles % khz;
    ms.saturating_mul(1_000_000).saturating_add(rest * 1_000_000 / khz)
}

/// Converts nanoseconds to TSC cycles at `khz` kHz.
pub fn ns_to_cycles(ns: u64, khz: u32) -> u64 {
    let khz = u64::from(khz);
    let ms = ns / 1_000_000;
    let rest = ns % 1_000_000;
    ms.saturating_mul(khz).saturating_add(rest * khz / 1_000_000)
}

/// Whether [`now_ns`] comes from the TSC (the host said it is stable).
pub fn tsc_is_clock() -> bool {
    data::tsc_khz() != 0
}

/// Nanoseconds: from the TSC when `tsc_khz` is known, else from the wall
/// clock in `lguest_data.time` (see the module documentation).
pub fn now_ns() -> u64 {
    match data::tsc_khz() {
        0 => {
            let t = data::time();
            t.sec.saturating_mul(NSEC_PER_SEC).saturating_add(t.nsec)
        }
        khz => cycles_to_ns(rdtsc(), khz),
    }
}

/// Sleeps at least `ns` nanoseconds by [`now_ns`], halting in between, and
/// returns how many times the guest woke up (interrupts taken while
/// halted; at least 1 unless `ns` is 0).
///
/// Each round turns interrupts off, checks the time, arms the event for
/// what is left and halts, which turns them on again atomically: an
/// interrupt cannot slip in between arming and halting and leave the guest
/// asleep with nothing armed. The caller's interrupt flag is restored at
/// the end. Needs [`init`] (else IRQ 0 stays blocked and the guest sleeps
/// until some other interrupt). Without a stable TSC the clock only moves
/// at deliveries: a wake-up by another interrupt can then end the sleep
/// early by as much as the clock was stale when the sleep began.
pub fn sleep_ns(ns: u64) -> u64 {
    let flags = paravirt::save_fl();
    let deadline = now_ns().saturating_add(ns);
    let mut wakeups = 0;
    loop {
        paravirt::irq_disable();
        let now = now_ns();
        if now >= deadline {
            break;
        }
        set_event(deadline - now);
        paravirt::halt();
        wakeups += 1;
    }
    paravirt::restore_fl(flags);
    wakeups
}
