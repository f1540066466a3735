// SPDX-License-Identifier: GPL-2.0
//! [`entry!`](macro@crate::entry): how a guest binary names its `main`.
//!
//! `entry!(main)` defines `lguest_start`, the symbol `_start` calls, as
//! [`boot`](crate::start::boot) with `main`. `main` takes [`Args`] and may
//!
//! - never return (`fn main(args: Args) -> !`), stopping the guest itself;
//! - return `()`: the guest then powers off with "main returned";
//! - return `Result<(), E>` with `E: Display`: `Ok` powers off as above,
//!   `Err(e)` stops the guest as crashed with `e` as the message.

use core::fmt::Display;

use crate::shutdown::{crash_fmt, poweroff};
use crate::Args;

/// A guest's `main`; implemented for the function pointer types above.
pub trait Main {
    /// Runs `main` with `args`, then stops the guest according to its result.
    fn run(self, args: Args) -> !;
}

impl Main for fn(Args) -> ! {
    fn run(self, args: Args) -> ! {
        self(args)
    }
}

impl Main for fn(Args) {
    fn run(self, args: Args) -> ! {
        self(args);
        poweroff("main returned")
    }
}

impl<E: Display> Main for fn(Args) -> Result<(), E> {
    fn run(self, args: Args) -> ! {
        match self(args) {
            Ok(()) => poweroff("main returned"),
            Err(e) => crash_fmt(format_args!("{e}")),
        }
    }
}

/// Names the guest's `main`: `entry!(main);` at the top level of the
/// binary crate (which is `#![no_std]` and `#![no_main]`).
#[macro_export]
macro_rules! entry {
    ($main:path) => {
        /// Called by `_start` (in `lguest-guest`) on the boot stack.
        #[no_mangle]
        pub extern "C" fn lguest_start(cmdline_pa: u64, mem_size: u64) -> ! {
            $crate::start::boot(cmdline_pa, mem_size, $main as fn($crate::Args) -> _)
        }
    };
}
