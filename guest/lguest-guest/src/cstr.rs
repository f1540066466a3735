// SPDX-License-Identifier: GPL-2.0
//! [`CStrBuf`]: a fixed buffer of text that is handed to the host as a
//! NUL-terminated string (console lines, shutdown messages).
//!
//! The host stops at the first NUL, so a NUL inside the text would silently
//! cut it short: [`CStrBuf::push_char`] writes it as `^@` instead. Text is
//! only ever cut at a character boundary, so what the host gets is UTF-8,
//! and once something did not fit, nothing more is taken until
//! [`CStrBuf::clear`], so the text is always a prefix of what was written.

use crate::virt_to_phys;

/// Up to `N - 1` bytes of UTF-8 text plus room for the terminating NUL.
pub struct CStrBuf<const N: usize> {
    buf: [u8; N],
    len: usize,
    /// Something did not fit: refuse everything until `clear`.
    full: bool,
}

impl<const N: usize> CStrBuf<N> {
    /// An empty buffer.
    pub const fn new() -> Self {
        Self { buf: [0; N], len: 0, full: false }
    }

    /// Bytes of text held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no text is held.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Forgets the text.
    pub fn clear(&mut self) {
        self.len = 0;
        self.full = false;
    }

    /// Appends `c` (a NUL as `^@`) if it fits with the terminator; returns
    /// whether it did. Nothing is written when it does not fit, nor after.
    pub fn push_char(&mut self, c: char) -> bool {
        if c == '\0' {
            return self.push_str_whole("^@");
        }
        let mut utf8 = [0; 4];
        self.push_str_whole(c.encode_utf8(&mut utf8))
    }

    /// Appends `s` entirely, or nothing if it does not fit.
    fn push_str_whole(&mut self, s: &str) -> bool {
        let end = self.len + s.len();
        if self.full || end >= N {
            self.full = true;
            return false;
        }
        self.buf[self.len..end].copy_from_slice(s.as_bytes());
        self.len = end;
        true
    }

    /// Appends as much of `s` as fits, whole characters only.
    pub fn push_str_truncating(&mut self, s: &str) {
        for c in s.chars() {
            if !self.push_char(c) {
                return;
            }
        }
    }

    /// Terminates the text with a NUL and returns its guest-physical
    /// address, valid until `self` is next changed or moved.
    pub fn as_cstr_phys(&mut self) -> u64 {
        // `len < N` always holds: `push_str_whole` keeps a byte spare.
        self.buf[self.len] = 0;
        virt_to_phys(self.buf.as_ptr())
    }

    /// The text held.
    pub fn as_str(&self) -> &str {
        // Only whole UTF-8 characters are ever pushed.
        core::str::from_utf8(&self.buf[..self.len]).unwrap_or("")
    }
}

impl<const N: usize> Default for CStrBuf<N> {
    fn default() -> Self {
        Self::new()
    }
}

/// Writing truncates: what does not fit is dropped (whole characters).
impl<const N: usize> core::fmt::Write for CStrBuf<N> {
    fn write_str(&mut self, s: &str) -> core::fmt::Result {
        self.push_str_truncating(s);
        Ok(())
    }
}
