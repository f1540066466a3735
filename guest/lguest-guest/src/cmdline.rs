// SPDX-License-Identifier: GPL-2.0
//! The command line: copied once at boot from where the launcher left it
//! (RDI, in the last page of RAM) into a static buffer, and handed to the
//! guest's `main` as [`Args`], its words split at ASCII whitespace.
//!
//! The copy stops at the first NUL, after `LGUEST_CMDLINE_MAX - 1` bytes, or
//! at the end of RAM, whichever comes first; an address outside RAM (below
//! `LGUEST_LOAD_MIN` or at or above the RAM size) gives an empty command
//! line. Bytes that are not UTF-8 become `?`.
//!
//! Words the library itself understands are acted on here and left out of
//! [`Args::iter`] (they stay in [`Args::as_str`]):
//!
//! - `noirqcheck`: re-enabling interrupts does not check `irq_pending`
//!   (see [`crate::paravirt::set_irq_check`]);
//! - `linuxframes`: the host builds frames with Linux's selectors, left
//!   with `LHCALL_IRET` (see [`crate::interrupts::linux_frames`]);
//! - `tlbshadows`: the host's shadow page tables follow TLB semantics
//!   (`LGUEST_INIT_TLB_SHADOWS`, see [`crate::data::tlb_shadows`]); the
//!   library still reports every change it makes, which drops at least as
//!   much as an `invlpg` would.

use core::str::SplitAsciiWhitespace;

use lguest_abi::{LGUEST_CMDLINE_MAX, LGUEST_LOAD_MIN};

use crate::cell::GuestCell;
use crate::paravirt;

/// Words consumed by the library (see the module documentation).
const LIBRARY_WORDS: &[&str] = &["noirqcheck", "linuxframes", "tlbshadows"];

/// The copy of the command line.
static CMDLINE: GuestCell<[u8; LGUEST_CMDLINE_MAX]> = GuestCell::new([0; LGUEST_CMDLINE_MAX]);

/// The command line, as given to the guest's `main`.
#[derive(Clone, Copy, Debug)]
pub struct Args {
    line: &'static str,
}

impl Args {
    /// The whole command line, library words included.
    pub fn as_str(&self) -> &'static str {
        self.line
    }

    /// The words for the guest, in order.
    pub fn iter(&self) -> Words {
        Words(self.line.split_ascii_whitespace())
    }

    /// Word `n` (from 0), if there is one.
    pub fn get(&self, n: usize) -> Option<&'static str> {
        self.iter().nth(n)
    }

    /// The first word, if any.
    pub fn first(&self) -> Option<&'static str> {
        self.get(0)
    }

    /// The number of words.
    pub fn len(&self) -> usize {
        self.iter().count()
    }

    /// Whether there are no words.
    pub fn is_empty(&self) -> bool {
        self.first().is_none()
    }
}

impl IntoIterator for Args {
    type Item = &'static str;
    type IntoIter = Words;

    fn into_iter(self) -> Words {
        self.iter()
    }
}

impl IntoIterator for &Args {
    type Item = &'static str;
    type IntoIter = Words;

    fn into_iter(self) -> Words {
        self.iter()
    }
}

/// An iterator over the guest's words of the command line.
#[derive(Clone, Debug)]
pub struct Words(SplitAsciiWhitespace<'static>);

impl Iterator for Words {
    type Item = &'static str;

    fn next(&mut self) -> Option<&'static str> {
        self.0.by_ref().find(|w| !LIBRARY_WORDS.contains(w))
    }
}

/// How many bytes may be read at `pa`: none outside RAM, else up to the end
/// of RAM, at most `LGUEST_CMDLINE_MAX - 1` (room for our own NUL).
fn readable(pa: u64, mem_size: u64) -> usize {
    if pa < LGUEST_LOAD_MIN || pa >= mem_size {
        return 0;
    }
    let max = LGUEST_CMDLINE_MAX - 1;
    usize::try_from(mem_size - pa).map_or(max, |left| left.min(max))
}

/// Replaces every byte of `buf` that is not part of valid UTF-8 with `?`,
/// and returns it as a string.
fn sanitize(buf: &mut [u8]) -> &str {
    while let Err(e) = core::str::from_utf8(buf) {
        let bad = e.valid_up_to();
        let n = e.error_len().unwrap_or(buf.len() - bad);
        buf[bad..bad + n].fill(b'?');
    }
    core::str::from_utf8(buf).unwrap_or("")
}

/// Copies the command line at guest-physical `pa` and acts on the library's
/// words. Called once by `lguest_start`, before `main`.
pub(crate) fn init(pa: u64, mem_size: u64) -> Args {
    // SAFETY: called once, before `main`, so nothing else refers to CMDLINE;
    // from here on it is only read, through the `&'static str` below.
    let buf: &'static mut [u8; LGUEST_CMDLINE_MAX] = unsafe { &mut *CMDLINE.get() };
    let mut len = 0;
    for (i, slot) in buf.iter_mut().take(readable(pa, mem_size)).enumerate() {
        // SAFETY: `pa + i` lies in [LGUEST_LOAD_MIN, mem_size) (`readable`
        // bounds it), and the launcher maps all of RAM at virtual = physical,
        // readable; the volatile read keeps the compiler from assuming
        // anything about memory it did not allocate.
        let byte = unsafe { ((pa + i as u64) as *const u8).read_volatile() };
        if byte == 0 {
            break;
        }
        *slot = byte;
        len = i + 1;
    }
    let line = sanitize(&mut buf[..len]);
    let args = Args { line };
    if line.split_ascii_whitespace().any(|w| w == "noirqcheck") {
        paravirt::set_irq_check(false);
    }
    if line.split_ascii_whitespace().any(|w| w == "linuxframes") {
        crate::interrupts::set_linux_frames(true);
    }
    if line.split_ascii_whitespace().any(|w| w == "tlbshadows") {
        crate::data::set_tlb_shadows(true);
    }
    args
}
