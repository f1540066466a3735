// SPDX-License-Identifier: GPL-2.0
//! The panic handler: a panic stops the guest with `LGUEST_SHUTDOWN_CRASH`
//! and the panic message, then where it happened, e.g.
//! `deliberate crash (at samples/guest-ops/src/main.rs:40:5)`. The message
//! comes first so that the 255-byte limit cuts the location, not the reason.

use core::panic::PanicInfo;

use crate::shutdown::crash_fmt;

#[panic_handler]
fn panic(info: &PanicInfo<'_>) -> ! {
    let msg = info.message();
    match info.location() {
        Some(loc) => crash_fmt(format_args!("{msg} (at {}:{}:{})", loc.file(), loc.line(), loc.column())),
        None => crash_fmt(format_args!("{msg}")),
    }
}
