// SPDX-License-Identifier: GPL-2.0
//! Stopping the guest: [`poweroff`], [`restart`] and [`crash`], all
//! `LHCALL_SHUTDOWN(guest-physical address of a NUL-terminated message,
//! LGUEST_SHUTDOWN_*)`.
//!
//! The message goes to the launcher in `LguestRun::message`, so it is cut to
//! `LGUEST_MESSAGE_LEN - 1` bytes here. Pending console output is sent first.
//! `LHCALL_SHUTDOWN` does not return; if it ever did, the guest spins.

use core::fmt::{self, Write};
use core::sync::atomic::{AtomicBool, Ordering};

use lguest_abi::{
    LGUEST_MESSAGE_LEN, LGUEST_SHUTDOWN_CRASH, LGUEST_SHUTDOWN_POWEROFF, LGUEST_SHUTDOWN_RESTART, LHCALL_SHUTDOWN,
};

use crate::cell::GuestCell;
use crate::console;
use crate::cstr::CStrBuf;
use crate::hcall::hcall;
use crate::virt_to_phys;

/// The message of the shutdown in progress, and whether one is in progress.
static MESSAGE: GuestCell<CStrBuf<LGUEST_MESSAGE_LEN>> = GuestCell::new(CStrBuf::new());
static SHUTTING_DOWN: AtomicBool = AtomicBool::new(false);

/// The message when formatting the first message shut down again (a
/// `Display` impl that panics, say).
static NESTED: &[u8] = b"lguest-guest: shutdown while formatting the shutdown message\0";

/// Powers the guest off with `msg`.
pub fn poweroff(msg: &str) -> ! {
    shutdown(LGUEST_SHUTDOWN_POWEROFF, format_args!("{msg}"))
}

/// Powers the guest off with a formatted message.
pub fn poweroff_fmt(args: fmt::Arguments<'_>) -> ! {
    shutdown(LGUEST_SHUTDOWN_POWEROFF, args)
}

/// Asks the launcher to restart the guest, with `msg`.
pub fn restart(msg: &str) -> ! {
    shutdown(LGUEST_SHUTDOWN_RESTART, format_args!("{msg}"))
}

/// Stops the guest as crashed with `msg` (for errors that are not bugs in
/// the guest, such as a bad command line; bugs panic).
pub fn crash(msg: &str) -> ! {
    shutdown(LGUEST_SHUTDOWN_CRASH, format_args!("{msg}"))
}

/// Stops the guest as crashed with a formatted message (the panic handler
/// uses this).
pub fn crash_fmt(args: fmt::Arguments<'_>) -> ! {
    shutdown(LGUEST_SHUTDOWN_CRASH, args)
}

/// Sends pending output, formats the message and makes `LHCALL_SHUTDOWN`
/// with `reason` (`LGUEST_SHUTDOWN_*`).
pub fn shutdown(reason: u64, args: fmt::Arguments<'_>) -> ! {
    console::flush();
    if SHUTTING_DOWN.swap(true, Ordering::Acquire) {
        // We are inside the formatting below; MESSAGE is in use.
        shutdown_raw(virt_to_phys(NESTED.as_ptr()), LGUEST_SHUTDOWN_CRASH);
    }
    // SAFETY: SHUTTING_DOWN was false and is now set for good, so this is the
    // only reference to MESSAGE that will ever exist (one vCPU; a nested
    // shutdown, from a `Display` impl or an interrupt handler, took the
    // branch above).
    let msg = unsafe { &mut *MESSAGE.get() };
    msg.clear();
    // Formatting only fails if a `Display` impl does: send what we have.
    let _ = msg.write_fmt(args);
    shutdown_raw(msg.as_cstr_phys(), reason)
}

/// Makes `LHCALL_SHUTDOWN` with the message at `msg_pa`, then spins.
fn shutdown_raw(msg_pa: u64, reason: u64) -> ! {
    // SAFETY: `msg_pa` is the guest-physical address of NUL-terminated text
    // in a static (MESSAGE or NESTED) that nothing changes any more.
    unsafe {
        hcall(LHCALL_SHUTDOWN, msg_pa, reason, 0, 0);
    }
    // The host must not return from SHUTDOWN; if it does, stay put without
    // making further hypercalls.
    loop {
        core::hint::spin_loop();
    }
}
