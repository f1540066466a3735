// SPDX-License-Identifier: GPL-2.0
//! The early console: [`print!`](crate::print) and
//! [`println!`](crate::println).
//!
//! Text collects in a line buffer of [`LINE_MAX`] bytes, which goes to the
//! host with `LHCALL_NOTIFY(guest-physical address of the NUL-terminated
//! text, 0)` at each newline (included in the text) and whenever it is full
//! (then without one); the launcher prints each string exactly as given. A
//! partial line waits for the next newline, [`flush`], or shutdown.

use core::fmt::{self, Write};
use core::sync::atomic::{AtomicBool, Ordering};

use lguest_abi::LHCALL_NOTIFY;

use crate::cell::GuestCell;
use crate::cstr::CStrBuf;
use crate::hcall::hcall;

/// Bytes of text sent in one `LHCALL_NOTIFY` at most (the NUL not counted).
pub const LINE_MAX: usize = 256;

/// A line of console output on its way to the host.
struct LineBuf(CStrBuf<{ LINE_MAX + 1 }>);

impl LineBuf {
    const fn new() -> Self {
        Self(CStrBuf::new())
    }

    /// Sends the text to the host, if there is any.
    fn flush(&mut self) {
        if self.0.is_empty() {
            return;
        }
        let pa = self.0.as_cstr_phys();
        // SAFETY: `pa` is the address of NUL-terminated text in this buffer,
        // which stays put and unchanged until the host has read it: the host
        // reads it during the hypercall.
        unsafe {
            hcall(LHCALL_NOTIFY, pa, 0, 0, 0);
        }
        self.0.clear();
    }

    /// Appends `c`, sending the line first if it is full, and after if `c`
    /// ends it.
    fn push(&mut self, c: char) {
        if !self.0.push_char(c) {
            self.flush();
            // An empty buffer has room for any character (4 bytes at most).
            self.0.push_char(c);
        }
        if c == '\n' {
            self.flush();
        }
    }
}

impl Write for LineBuf {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        s.chars().for_each(|c| self.push(c));
        Ok(())
    }
}

/// The console's line buffer, and whether someone is writing to it.
static CONSOLE: GuestCell<LineBuf> = GuestCell::new(LineBuf::new());
static CONSOLE_BUSY: AtomicBool = AtomicBool::new(false);

/// Runs `f` on the console's line buffer, or returns `None` if the console
/// is already being written: a `Display` impl printing from inside a
/// `print!`, or an interrupt handler printing while the code it interrupted
/// was. The `swap` is one `xchg`, so a handler sees the flag either clear
/// (and owns the buffer until it clears it again, before returning) or set.
fn with_console<R>(f: impl FnOnce(&mut LineBuf) -> R) -> Option<R> {
    if CONSOLE_BUSY.swap(true, Ordering::Acquire) {
        return None;
    }
    // SAFETY: CONSOLE_BUSY was false and is now set by us, so no other
    // reference to CONSOLE exists (one vCPU; a nested call, from a `Display`
    // impl or an interrupt handler, took the early return above) until we
    // clear it below.
    let con = unsafe { &mut *CONSOLE.get() };
    let ret = f(con);
    CONSOLE_BUSY.store(false, Ordering::Release);
    Some(ret)
}

/// Writes formatted text to the console. Use [`print!`](crate::print).
#[doc(hidden)]
pub fn _print(args: fmt::Arguments<'_>) {
    // A write can only fail if a `Display` impl fails: nothing to do then.
    if with_console(|con| con.write_fmt(args)).is_none() {
        // Nested: print through a line buffer of our own on the stack (an
        // interrupted partial line stays in CONSOLE and comes out later).
        let mut line = LineBuf::new();
        let _ = line.write_fmt(args);
        line.flush();
    }
}

/// Sends a partial line now (shutdown does this before it stops the guest).
pub fn flush() {
    with_console(LineBuf::flush);
}

/// Prints to the lguest console.
#[macro_export]
macro_rules! print {
    ($($arg:tt)*) => {
        $crate::console::_print(::core::format_args!($($arg)*))
    };
}

/// Prints to the lguest console, with a newline.
#[macro_export]
macro_rules! println {
    () => {
        $crate::console::_print(::core::format_args!("\n"))
    };
    ($($arg:tt)*) => {
        $crate::console::_print(::core::format_args!("{}\n", ::core::format_args!($($arg)*)))
    };
}
