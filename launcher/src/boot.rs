// SPDX-License-Identifier: GPL-2.0
//! The boot protocol as the launcher keeps it: the guest RAM size from
//! `--memory`, the command line in the last page of RAM, and the registers
//! the guest starts with (RIP = entry, RDI = command line, RSI = RAM size,
//! or for a Linux guest its `boot_params`: `linux.rs`).

use std::ffi::OsString;
use std::os::unix::ffi::OsStrExt;

use lguest_abi as abi;

use crate::memory::{GuestMemory, MemoryError, Size, PAGE_SIZE};

/// The least guest RAM `lguest run` accepts.
pub const MIN_MEM: u64 = 2 << 20;

/// The default guest RAM.
pub const DEFAULT_MEM: &str = "64M";

/// A `--memory` value that is not acceptable.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum SizeError {
    /// Not a number with an optional K, M or G suffix.
    #[error("{0:?} is not a size: give bytes or a number with K, M or G (for example 64M)")]
    Syntax(String),
    /// Too large to be a u64 at all.
    #[error("{0:?} is too large")]
    Overflow(String),
    /// Below [`MIN_MEM`].
    #[error("{0} is too little guest memory: at least 2 MiB")]
    TooSmall(Size),
    /// Above `LGUEST_MAX_MEM`.
    #[error("{0} is too much guest memory: at most {max}", max = Size(abi::LGUEST_MAX_MEM))]
    TooLarge(Size),
    /// Not a multiple of 4096.
    #[error("{0:#x} bytes of guest memory is not a multiple of the 4 KiB page size")]
    NotPageMultiple(u64),
}

/// Parses a size such as `64M`, `1G`, `16K` or `65536` (bytes). Suffixes are
/// binary (K = 1024) and may be lower case.
pub fn parse_size(text: &str) -> Result<u64, SizeError> {
    let syntax = || SizeError::Syntax(text.to_owned());
    let (digits, shift) = match text.char_indices().last() {
        Some((i, 'k' | 'K')) => (&text[..i], 10),
        Some((i, 'm' | 'M')) => (&text[..i], 20),
        Some((i, 'g' | 'G')) => (&text[..i], 30),
        Some(_) => (text, 0),
        None => return Err(syntax()),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(syntax());
    }
    let n: u64 = digits.parse().map_err(|_| SizeError::Overflow(text.to_owned()))?;
    n.checked_mul(1 << shift).ok_or_else(|| SizeError::Overflow(text.to_owned()))
}

/// Parses and checks a guest RAM size (the `--memory` value parser).
pub fn parse_mem_size(text: &str) -> Result<u64, SizeError> {
    let size = parse_size(text)?;
    if size < MIN_MEM {
        return Err(SizeError::TooSmall(Size(size)));
    }
    if size > abi::LGUEST_MAX_MEM {
        return Err(SizeError::TooLarge(Size(size)));
    }
    if !size.is_multiple_of(PAGE_SIZE) {
        return Err(SizeError::NotPageMultiple(size));
    }
    Ok(size)
}

/// A command line that cannot be given to the guest.
#[derive(Debug, thiserror::Error)]
pub enum CmdlineError {
    /// Longer than `LGUEST_CMDLINE_MAX` with its NUL.
    #[error(
        "the guest command line is {len} bytes; at most {max} fit ({limit} bytes with the terminating NUL)",
        max = abi::LGUEST_CMDLINE_MAX - 1,
        limit = abi::LGUEST_CMDLINE_MAX
    )]
    TooLong {
        /// Its length without the NUL.
        len: usize,
    },
    /// An argument holds a NUL byte, which would cut the command line short.
    #[error("guest argument {0} contains a NUL byte")]
    Nul(usize),
    /// Guest RAM has no room for it (cannot happen with a checked size).
    #[error("writing the command line")]
    Memory(#[from] MemoryError),
}

/// Joins the guest arguments with single spaces.
pub fn join_args(args: &[OsString]) -> Result<Vec<u8>, CmdlineError> {
    let mut line = Vec::new();
    for (i, arg) in args.iter().enumerate() {
        let bytes = arg.as_bytes();
        if bytes.contains(&0) {
            return Err(CmdlineError::Nul(i));
        }
        if i > 0 {
            line.push(b' ');
        }
        line.extend_from_slice(bytes);
    }
    Ok(line)
}

/// The guest-physical address of the command line: the last page of RAM.
pub fn cmdline_gpa(mem_size: u64) -> u64 {
    mem_size.saturating_sub(PAGE_SIZE)
}

/// Writes `line` NUL-terminated at the start of the last page of RAM and
/// returns its guest-physical address.
pub fn write_cmdline(mem: &GuestMemory, line: &[u8]) -> Result<u64, CmdlineError> {
    if line.len() >= abi::LGUEST_CMDLINE_MAX {
        return Err(CmdlineError::TooLong { len: line.len() });
    }
    if let Some(i) = line.iter().position(|&b| b == 0) {
        return Err(CmdlineError::Nul(i));
    }
    let gpa = cmdline_gpa(mem.mem_size());
    let mut buf = Vec::with_capacity(line.len() + 1);
    buf.extend_from_slice(line);
    buf.push(0);
    mem.write(gpa, &buf)?;
    Ok(gpa)
}

/// The registers the guest starts with: `regs` (from GET_REGS) with RIP,
/// RDI and RSI set by the boot protocol (RSI: the RAM size, or a Linux
/// guest's `boot_params`).
pub fn boot_regs(regs: abi::LguestRegs, entry: u64, cmdline: u64, rsi: u64) -> abi::LguestRegs {
    abi::LguestRegs { rip: entry, rdi: cmdline, rsi, ..regs }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("64M"), Ok(64 << 20));
        assert_eq!(parse_size("64m"), Ok(64 << 20));
        assert_eq!(parse_size("1G"), Ok(1 << 30));
        assert_eq!(parse_size("16K"), Ok(16 << 10));
        assert_eq!(parse_size("65536"), Ok(65536));
        assert_eq!(parse_size("0"), Ok(0));
        for bad in ["", "M", "64MB", "-1", "1.5G", " 64M", "64 M", "0x1000", "६४"] {
            assert!(matches!(parse_size(bad), Err(SizeError::Syntax(_))), "{bad:?}");
        }
        assert!(matches!(parse_size("99999999999999999999"), Err(SizeError::Overflow(_))));
        assert!(matches!(parse_size("17179869184G"), Err(SizeError::Overflow(_))));
    }

    #[test]
    fn memory_sizes() {
        assert_eq!(parse_mem_size("64M"), Ok(64 << 20));
        assert_eq!(parse_mem_size("2M"), Ok(2 << 20));
        assert_eq!(parse_mem_size("4G"), Ok(4 << 30));
        assert_eq!(parse_mem_size(DEFAULT_MEM), Ok(64 << 20));
        assert_eq!(parse_mem_size("2097152"), Ok(2 << 20));
        let e = parse_mem_size("1M").expect_err("too small");
        assert_eq!(e.to_string(), "1 MiB is too little guest memory: at least 2 MiB");
        assert!(matches!(parse_mem_size("2097151"), Err(SizeError::TooSmall(_))));
        let e = parse_mem_size("5G").expect_err("too large");
        assert_eq!(e.to_string(), "5 GiB is too much guest memory: at most 4 GiB");
        assert!(matches!(parse_mem_size("4194305K"), Err(SizeError::TooLarge(_))));
        let e = parse_mem_size("2097153").expect_err("not a page multiple");
        assert_eq!(e.to_string(), "0x200001 bytes of guest memory is not a multiple of the 4 KiB page size");
        assert!(matches!(parse_mem_size("2050K"), Err(SizeError::NotPageMultiple(_))));
    }

    #[test]
    fn args_join_with_spaces() {
        let args: Vec<OsString> = ["console=hvc0", "quiet", ""].iter().map(OsString::from).collect();
        assert_eq!(join_args(&args).expect("join"), b"console=hvc0 quiet ");
        assert_eq!(join_args(&[]).expect("join"), b"");
    }

    #[test]
    fn cmdline_in_the_last_page() {
        let mem = GuestMemory::new(2 << 20, 1).expect("memory");
        let gpa = write_cmdline(&mem, b"hello world").expect("write");
        assert_eq!(gpa, (2 << 20) - 4096);
        let s = mem.read_cstr(gpa, abi::LGUEST_CMDLINE_MAX).expect("read");
        assert!(s.terminated);
        assert_eq!(s.bytes, b"hello world");
        // The empty command line is a lone NUL.
        let gpa = write_cmdline(&mem, b"").expect("write");
        let s = mem.read_cstr(gpa, abi::LGUEST_CMDLINE_MAX).expect("read");
        assert!(s.terminated && s.bytes.is_empty());
    }

    #[test]
    fn cmdline_limit() {
        let mem = GuestMemory::new(2 << 20, 1).expect("memory");
        let longest = vec![b'x'; abi::LGUEST_CMDLINE_MAX - 1];
        let gpa = write_cmdline(&mem, &longest).expect("the longest fits");
        let mut last = [0xFFu8; 1];
        mem.read(gpa + longest.len() as u64, &mut last).expect("read NUL");
        assert_eq!(last, [0]);
        let too_long = vec![b'x'; abi::LGUEST_CMDLINE_MAX];
        let e = write_cmdline(&mem, &too_long).expect_err("too long");
        assert_eq!(
            e.to_string(),
            "the guest command line is 4096 bytes; at most 4095 fit (4096 bytes with the terminating NUL)"
        );
        assert!(matches!(write_cmdline(&mem, b"a\0b"), Err(CmdlineError::Nul(1))));
    }

    #[test]
    fn registers() {
        let before = abi::LguestRegs { rax: 1, rsp: 0x9000, rip: 5, rdi: 6, rsi: 7, ..Default::default() };
        let after = boot_regs(before, 0x10_0000, 0x3FF_F000, 64 << 20);
        assert_eq!(after.rip, 0x10_0000);
        assert_eq!(after.rdi, 0x3FF_F000);
        assert_eq!(after.rsi, 64 << 20);
        assert_eq!((after.rax, after.rsp), (1, 0x9000), "other registers are kept");
    }
}
