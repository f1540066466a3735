// SPDX-License-Identifier: GPL-2.0
//! The Linux boot protocol, for a `vmlinux` with the "lguest" entry note
//! (`guest/linux/`): the launcher plays the boot loader's part and fills a
//! `struct boot_params` (the "zero page", `Documentation/arch/x86/zero-page.rst`
//! and `boot.rst` in the kernel), whose guest-physical address the guest
//! gets in RSI.
//!
//! Guest RAM, from the top down:
//!
//! - the last page: the command line (as for every guest, `boot.rs`);
//! - the page below it: `boot_params`;
//! - below that, page aligned, the initramfs (`--initrd`), if any;
//! - the kernel, loaded at its `p_paddr` (16 MiB up) by the loader.
//!
//! `boot_params` holds: the boot protocol's signature and version (2.15,
//! so that the kernel trusts the fields below), loader type 0xff (no
//! assigned ID), `LOADED_HIGH`, `hardware_subarch` = `X86_SUBARCH_LGUEST`,
//! the command line's address and size, the initramfs's address and size,
//! and an e820 table of one entry: RAM from 0 to the end of guest memory
//! (the kernel reserves the first 1 MiB itself; the device window above
//! RAM is the lguest bus's, not RAM).
//!
//! The kernel needs room beyond its image and the initramfs:
//! [`MIN_FREE`]; a `--memory` too small for that is an error that says
//! what would do ([`min_memory`]).

use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};

use crate::loader::{Image, Range};
use crate::memory::{GuestMemory, MemoryError, Size, PAGE_SIZE};

/// `boot_params` is one page.
pub const BOOT_PARAMS_SIZE: usize = 4096;

/// Offsets in `struct boot_params` (`arch/x86/include/uapi/asm/bootparam.h`).
pub mod offset {
    /// `e820_entries` (u8).
    pub const E820_ENTRIES: usize = 0x1e8;
    /// `hdr.boot_flag` (u16, 0xAA55).
    pub const BOOT_FLAG: usize = 0x1fe;
    /// `hdr.header` (u32, "HdrS").
    pub const HEADER: usize = 0x202;
    /// `hdr.version` (u16).
    pub const VERSION: usize = 0x206;
    /// `hdr.type_of_loader` (u8).
    pub const TYPE_OF_LOADER: usize = 0x210;
    /// `hdr.loadflags` (u8).
    pub const LOADFLAGS: usize = 0x211;
    /// `hdr.ramdisk_image` (u32).
    pub const RAMDISK_IMAGE: usize = 0x218;
    /// `hdr.ramdisk_size` (u32).
    pub const RAMDISK_SIZE: usize = 0x21c;
    /// `hdr.cmd_line_ptr` (u32).
    pub const CMD_LINE_PTR: usize = 0x228;
    /// `hdr.initrd_addr_max` (u32).
    pub const INITRD_ADDR_MAX: usize = 0x22c;
    /// `hdr.cmdline_size` (u32).
    pub const CMDLINE_SIZE: usize = 0x238;
    /// `hdr.hardware_subarch` (u32).
    pub const HARDWARE_SUBARCH: usize = 0x23c;
    /// `e820_table` (20-byte entries: addr u64, size u64, type u32).
    pub const E820_TABLE: usize = 0x2d0;
}

/// `X86_SUBARCH_LGUEST` (`enum x86_hardware_subarch`).
pub const X86_SUBARCH_LGUEST: u32 = 1;
/// Boot protocol 2.15.
pub const BOOT_PROTOCOL: u16 = 0x020f;
/// `E820_TYPE_RAM`.
pub const E820_RAM: u32 = 1;
/// `LOADED_HIGH`: the kernel is above 1 MiB.
const LOADED_HIGH: u8 = 1;

/// The least RAM a Linux guest needs beyond its image, its initramfs and
/// the two pages of boot data: page tables, `struct page`s, the slab and
/// the unpacked initramfs.
pub const MIN_FREE: u64 = 16 << 20;

/// What goes wrong setting up a Linux boot.
#[derive(Debug, thiserror::Error)]
pub enum LinuxError {
    /// The initramfs cannot be read.
    #[error("{}: cannot read the initramfs", path.display())]
    Initrd {
        /// As given.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The initramfs is not a regular file.
    #[error("{}: the initramfs is not a regular file", path.display())]
    InitrdNotFile {
        /// As given.
        path: PathBuf,
    },
    /// Guest RAM is too small for the kernel, the initramfs and the room
    /// the kernel needs.
    #[error(
        "--memory {mem} is too small for this kernel{with}: it ends at {kernel_end:#x} and needs {free} more to boot; give --memory {need} or more",
        free = Size(MIN_FREE),
        with = if *initrd > 0 { format!(" and its {initrd}-byte initramfs") } else { String::new() }
    )]
    TooSmall {
        /// Guest RAM.
        mem: Size,
        /// Where the kernel image ends (guest-physical).
        kernel_end: u64,
        /// Bytes of initramfs.
        initrd: u64,
        /// What would do.
        need: Size,
    },
    /// `--initrd` for a guest that is not a Linux kernel.
    #[error("--initrd is for a Linux guest (a vmlinux built with CONFIG_LGUEST_GUEST); {0} is not one")]
    NotLinux(String),
    /// Writing guest memory (cannot happen once the layout is checked).
    #[error("writing the boot data")]
    Memory(#[from] MemoryError),
}

/// The least `--memory` for a kernel image ending at `kernel_end` with
/// `initrd` bytes of initramfs: rounded up to 16 MiB.
pub fn min_memory(kernel_end: u64, initrd: u64) -> u64 {
    let need = kernel_end.saturating_add(MIN_FREE).saturating_add(initrd.next_multiple_of(PAGE_SIZE)) + 2 * PAGE_SIZE;
    need.next_multiple_of(16 << 20)
}

/// Where the boot data go in `mem_size` bytes of RAM.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    /// `boot_params`.
    pub boot_params: u64,
    /// The command line.
    pub cmdline: u64,
    /// The initramfs.
    pub initrd: Option<Range>,
}

/// Places the boot data for a kernel ending at `kernel_end` and `initrd`
/// bytes of initramfs (0: none) in `mem_size` bytes of RAM.
pub fn layout(mem_size: u64, kernel_end: u64, initrd: u64) -> Result<Layout, LinuxError> {
    let need = min_memory(kernel_end, initrd);
    let too_small = || LinuxError::TooSmall { mem: Size(mem_size), kernel_end, initrd, need: Size(need) };
    if mem_size < need {
        return Err(too_small());
    }
    let cmdline = crate::boot::cmdline_gpa(mem_size);
    let boot_params = cmdline - PAGE_SIZE;
    let initrd = (initrd > 0).then(|| {
        let start = (boot_params - initrd) & !(PAGE_SIZE - 1);
        Range { start, end: start + initrd }
    });
    Ok(Layout { boot_params, cmdline, initrd })
}

/// The bytes of `boot_params` for `layout` in `mem_size` bytes of RAM, with
/// a command line of `cmdline_len` bytes.
pub fn boot_params(mem_size: u64, layout: &Layout, cmdline_len: usize) -> Vec<u8> {
    let mut bp = vec![0u8; BOOT_PARAMS_SIZE];
    let mut put = |at: usize, bytes: &[u8]| bp[at..at + bytes.len()].copy_from_slice(bytes);
    put(offset::BOOT_FLAG, &0xAA55u16.to_le_bytes());
    put(offset::HEADER, b"HdrS");
    put(offset::VERSION, &BOOT_PROTOCOL.to_le_bytes());
    put(offset::TYPE_OF_LOADER, &[0xff]);
    put(offset::LOADFLAGS, &[LOADED_HIGH]);
    // CAST: guest RAM is at most 4 GiB, so every address in it fits u32
    // (the last page's start is below 2^32).
    put(offset::CMD_LINE_PTR, &(layout.cmdline as u32).to_le_bytes());
    put(offset::CMDLINE_SIZE, &(cmdline_len as u32).to_le_bytes());
    put(offset::INITRD_ADDR_MAX, &u32::MAX.to_le_bytes());
    if let Some(r) = layout.initrd {
        put(offset::RAMDISK_IMAGE, &(r.start as u32).to_le_bytes());
        put(offset::RAMDISK_SIZE, &((r.end - r.start) as u32).to_le_bytes());
    }
    put(offset::HARDWARE_SUBARCH, &X86_SUBARCH_LGUEST.to_le_bytes());
    put(offset::E820_ENTRIES, &[1]);
    put(offset::E820_TABLE, &0u64.to_le_bytes());
    put(offset::E820_TABLE + 8, &mem_size.to_le_bytes());
    put(offset::E820_TABLE + 16, &E820_RAM.to_le_bytes());
    bp
}

/// Reads the initramfs at `path` whole.
fn read_initrd(path: &Path) -> Result<Vec<u8>, LinuxError> {
    let fail = |source| LinuxError::Initrd { path: path.to_owned(), source };
    let mut file = File::open(path).map_err(fail)?;
    if !file.metadata().map_err(fail)?.file_type().is_file() {
        return Err(LinuxError::InitrdNotFile { path: path.to_owned() });
    }
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes).map_err(fail)?;
    Ok(bytes)
}

/// Sets up the boot of the Linux kernel `image` (already loaded) in `mem`,
/// with a command line of `cmdline_len` bytes already written
/// (`boot::write_cmdline`) and the initramfs at `initrd`: writes it and
/// `boot_params`, and returns the layout (RSI is `boot_params`).
pub fn setup(
    mem: &GuestMemory,
    image: &Image,
    cmdline_len: usize,
    initrd: Option<&Path>,
) -> Result<Layout, LinuxError> {
    let data = initrd.map(read_initrd).transpose()?.unwrap_or_default();
    let kernel_end = image.segments.iter().map(|s| s.range().end).max().unwrap_or(0);
    let layout = layout(mem.mem_size(), kernel_end, data.len() as u64)?;
    if let Some(r) = layout.initrd {
        mem.write(r.start, &data)?;
    }
    mem.write(layout.boot_params, &boot_params(mem.mem_size(), &layout, cmdline_len))?;
    Ok(layout)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn u32_at(bp: &[u8], at: usize) -> u32 {
        u32::from_le_bytes(bp[at..at + 4].try_into().expect("4 bytes"))
    }

    #[test]
    fn boot_data_sit_at_the_top_of_ram() {
        let l = layout(64 << 20, 0x0280_0000, 0).expect("fits");
        assert_eq!(l.cmdline, (64 << 20) - 4096);
        assert_eq!(l.boot_params, (64 << 20) - 8192);
        assert_eq!(l.initrd, None);
        let l = layout(64 << 20, 0x0280_0000, 10_000).expect("fits");
        // Page aligned, right below boot_params.
        assert_eq!(l.initrd, Some(Range { start: (64 << 20) - 8192 - 12288, end: (64 << 20) - 8192 - 12288 + 10_000 }));
    }

    #[test]
    fn too_little_memory_says_what_would_do() {
        // A 40 MiB kernel needs 40 + 16 MiB and two pages: 64 MiB.
        assert_eq!(min_memory(40 << 20, 0), 64 << 20);
        assert!(layout(64 << 20, 40 << 20, 0).is_ok());
        let e = layout(48 << 20, 40 << 20, 0).expect_err("too small");
        assert_eq!(
            e.to_string(),
            "--memory 48 MiB is too small for this kernel: it ends at 0x2800000 and needs 16 MiB more to boot; give --memory 64 MiB or more"
        );
        let e = layout(64 << 20, 40 << 20, 8 << 20).expect_err("too small with an initramfs");
        assert_eq!(
            e.to_string(),
            "--memory 64 MiB is too small for this kernel and its 8388608-byte initramfs: it ends at 0x2800000 and needs 16 MiB more to boot; give --memory 80 MiB or more"
        );
    }

    #[test]
    fn boot_params_fields() {
        let mem = 128u64 << 20;
        let l = layout(mem, 0x0300_0000, 5000).expect("fits");
        let bp = boot_params(mem, &l, 42);
        assert_eq!(bp.len(), 4096);
        assert_eq!(&bp[0x1fe..0x200], &[0x55, 0xaa]);
        assert_eq!(&bp[0x202..0x206], b"HdrS");
        assert_eq!(&bp[0x206..0x208], &[0x0f, 0x02]);
        assert_eq!(bp[0x210], 0xff);
        assert_eq!(bp[0x211], 1);
        assert_eq!(u32_at(&bp, 0x228), (mem - 4096) as u32);
        assert_eq!(u32_at(&bp, 0x238), 42);
        let r = l.initrd.expect("initrd");
        assert_eq!(u32_at(&bp, 0x218), r.start as u32);
        assert_eq!(u32_at(&bp, 0x21c), 5000);
        assert_eq!(u32_at(&bp, 0x23c), 1, "X86_SUBARCH_LGUEST");
        assert_eq!(bp[0x1e8], 1, "one e820 entry");
        assert_eq!(&bp[0x2d0..0x2d8], &0u64.to_le_bytes());
        assert_eq!(&bp[0x2d8..0x2e0], &mem.to_le_bytes());
        assert_eq!(u32_at(&bp, 0x2e0), 1, "E820_TYPE_RAM");
        // The sentinel (0x1ef) stays 0, so the kernel keeps every field.
        assert_eq!(bp[0x1ef], 0);
        // Nothing else is set.
        let set: usize = bp.iter().filter(|&&b| b != 0).count();
        assert!(set <= 30, "{set} bytes set");
    }

    #[test]
    fn setup_writes_the_initramfs_and_boot_params() {
        let dir = std::env::temp_dir().join(format!("lguest-linux-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("initrd");
        std::fs::write(&path, b"070701 a cpio, or so").expect("write");
        let mem = GuestMemory::new(64 << 20, 1).expect("memory");
        let image = crate::loader::tests::guest_image().build();
        let image = crate::loader::load("g", &image, &mem).expect("load");
        let l = setup(&mem, &image, 0, Some(&path)).expect("setup");
        let r = l.initrd.expect("initrd");
        let mut back = vec![0u8; 20];
        mem.read(r.start, &mut back).expect("read");
        assert_eq!(back, b"070701 a cpio, or so");
        let mut bp = vec![0u8; 4096];
        mem.read(l.boot_params, &mut bp).expect("read");
        assert_eq!(&bp[0x202..0x206], b"HdrS");
        let e = setup(&mem, &image, 0, Some(&dir)).expect_err("a directory");
        assert!(e.to_string().ends_with("the initramfs is not a regular file"), "{e}");
        let e = setup(&mem, &image, 0, Some(&dir.join("missing"))).expect_err("missing");
        assert!(e.to_string().ends_with("missing: cannot read the initramfs"), "{e}");
        std::fs::remove_dir_all(&dir).expect("clean up");
    }
}
