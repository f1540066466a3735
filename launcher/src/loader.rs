// SPDX-License-Identifier: GPL-2.0
//! The guest ELF loader: checks a static x86-64 executable against guest
//! memory and copies its `PT_LOAD` segments to their guest-physical
//! addresses.
//!
//! `goblin` parses the ELF header and the program headers; every rule the
//! guest must follow is checked here, before a single byte is copied, so a
//! rejected image leaves guest memory untouched. Accepted: ELF64,
//! little-endian, x86-64, `ET_EXEC`, at least one `PT_LOAD`, no `PT_INTERP`
//! or `PT_DYNAMIC` (the guest is not a static executable otherwise); other
//! program headers (`PT_GNU_STACK`, `PT_NOTE`, ...) are ignored. Each
//! `PT_LOAD` needs `p_filesz <= p_memsz`, a file range inside the file, and a
//! guest-physical range `[p_paddr, p_paddr + p_memsz)` at or above
//! [`abi::LGUEST_LOAD_MIN`] and below the last page of RAM (the command
//! line's), overlapping no other segment; no sum may overflow. The entry point
//! must lie inside an executable (`PF_X`) segment's guest-physical range: the
//! guest starts with virtual = physical. Every error names the file and the
//! segment (by its index in the program header table).
//!
//! A Linux guest's `vmlinux` names its entry with an ELF note instead
//! (`"lguest"`, type [`LGUEST_ELFNOTE_ENTRY`], the entry's virtual address,
//! 8 bytes: `arch/x86/lguest/head_64.S` of `guest/linux/`), as Xen's
//! `XEN_ELFNOTE_ENTRY` does; `e_entry` is the native boot's. Where the note
//! is there, the entry is the guest-physical address of that virtual
//! address in the `PT_LOAD` segment that holds it (`p_vaddr` to
//! `p_paddr`), in any segment: `vmlinux` keeps its init text in a segment
//! without `PF_X`. Notes are read from the `PT_NOTE` segments (at most
//! [`MAX_NOTES`] bytes each).
//!
//! [`load_file`] takes only a regular file (`/dev/zero`, a FIFO or a
//! directory is an error naming the path and what it is) and reads only
//! what it needs with positioned reads: the ELF header, the program header
//! table (within the first [`MAX_HEADERS`] bytes), then each segment's file
//! bytes, which fit in guest RAM; so a huge file costs no more than that.

use std::fmt;
use std::fs::File;
use std::os::unix::fs::{FileExt, FileTypeExt, OpenOptionsExt};
use std::path::Path;

use goblin::container::{Container, Ctx, Endian};
use goblin::elf::header::{self, EM_X86_64, ET_EXEC};
use goblin::elf::program_header::{self, PF_X, PT_DYNAMIC, PT_INTERP, PT_LOAD, PT_NOTE};
use goblin::elf::{Elf, ProgramHeader};
use lguest_abi as abi;

use crate::memory::{GuestMemory, MemoryError, Size, PAGE_SIZE};

/// The size of an ELF64 header.
const EHDR_SIZE: usize = 64;
/// The size of an ELF64 program header.
const PHDR_SIZE: usize = 56;

/// A guest image that failed to load: which file, and what is wrong with it.
///
/// It prints as "FILE: PROBLEM"; its `source()` is the problem's cause (an
/// I/O error, say), so anyhow's `{:#}` shows each part once.
#[derive(Debug)]
pub struct LoadError {
    /// The file, as the user named it.
    pub file: String,
    /// What is wrong.
    pub problem: Problem,
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.file, self.problem)
    }
}

impl std::error::Error for LoadError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        std::error::Error::source(&self.problem)
    }
}

/// A half-open guest-physical or file range, printed as `[0x..-0x..)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Range {
    /// First byte.
    pub start: u64,
    /// One past the last byte.
    pub end: u64,
}

impl fmt::Display for Range {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[{:#x}-{:#x})", self.start, self.end)
    }
}

/// What is wrong with a guest image.
#[derive(Debug, thiserror::Error)]
pub enum Problem {
    /// The file could not be read.
    #[error("cannot read the file")]
    Read(#[source] std::io::Error),
    /// Not a regular file (`/dev/zero`, a FIFO, a directory).
    #[error("not a regular file ({0}); the guest must be an ELF file")]
    NotRegular(&'static str),
    /// The program header table ends past the part the loader reads.
    #[error("the program header table ends at {end:#x}, past the first {MAX_HEADERS:#x} bytes that hold the headers")]
    HeadersTooFar {
        /// Its end in the file.
        end: u64,
    },
    /// The file is empty.
    #[error("the file is empty")]
    Empty,
    /// The file does not start with the ELF magic.
    #[error("not an ELF file")]
    NotElf,
    /// A Linux boot image (the boot protocol's "HdrS" at 0x202).
    #[error("a Linux bzImage, which lguest cannot boot: give the uncompressed vmlinux of a kernel built with CONFIG_LGUEST_GUEST (guest/linux)")]
    BzImage,
    /// A Linux vmlinux without the "lguest" entry note.
    #[error(
        "a Linux vmlinux without the \"lguest\" entry note: build the kernel with CONFIG_LGUEST_GUEST (guest/linux)"
    )]
    LinuxWithoutEntry,
    /// The file ends before something it describes.
    #[error("truncated: {what} {range} lies past the end of the file ({len} bytes)")]
    Truncated {
        /// What is cut off.
        what: &'static str,
        /// Its file range.
        range: Range,
        /// The file's length.
        len: u64,
    },
    /// Not ELF64.
    #[error("not a 64-bit ELF file (EI_CLASS {0})")]
    Class(u8),
    /// Not little-endian.
    #[error("not a little-endian ELF file (EI_DATA {0})")]
    Endian(u8),
    /// An ELF version other than 1.
    #[error("unknown ELF version {0}")]
    Version(u32),
    /// Not x86-64.
    #[error("built for machine {machine} ({name}), not x86-64")]
    Machine {
        /// `e_machine`.
        machine: u16,
        /// Its name.
        name: &'static str,
    },
    /// Not `ET_EXEC`.
    #[error("ELF type {ty} ({name}) is not an executable (ET_EXEC); link the guest static and non-PIE")]
    Type {
        /// `e_type`.
        ty: u16,
        /// Its name.
        name: &'static str,
    },
    /// `e_phentsize` is not the ELF64 program header size.
    #[error("program header entries are {0} bytes, not 56")]
    PhentSize(u16),
    /// goblin refused the headers.
    #[error("bad ELF headers: {0}")]
    Parse(String),
    /// A `PT_INTERP` or `PT_DYNAMIC` program header.
    #[error("not a static executable: segment {index} is {kind}")]
    NotStatic {
        /// Program header index.
        index: usize,
        /// `PT_INTERP` or `PT_DYNAMIC`.
        kind: &'static str,
    },
    /// No `PT_LOAD` program header.
    #[error("no PT_LOAD segment: nothing to load")]
    NoLoad,
    /// `p_filesz > p_memsz`.
    #[error("segment {index}: p_filesz {filesz:#x} is larger than p_memsz {memsz:#x}")]
    FileszOverMemsz {
        /// Program header index.
        index: usize,
        /// `p_filesz`.
        filesz: u64,
        /// `p_memsz`.
        memsz: u64,
    },
    /// A start plus a size overflows.
    #[error("segment {index}: {start_name} {start:#x} + {size_name} {size:#x} overflows")]
    Overflow {
        /// Program header index.
        index: usize,
        /// `p_paddr` or `p_offset`.
        start_name: &'static str,
        /// Its value.
        start: u64,
        /// `p_memsz` or `p_filesz`.
        size_name: &'static str,
        /// Its value.
        size: u64,
    },
    /// A segment's bytes are not all in the file.
    #[error("segment {index}: file range {range} lies past the end of the file ({len} bytes)")]
    FileRange {
        /// Program header index.
        index: usize,
        /// `[p_offset, p_offset + p_filesz)`.
        range: Range,
        /// The file's length.
        len: u64,
    },
    /// A segment starts below `LGUEST_LOAD_MIN`.
    #[error("segment {index} {range} starts below {min:#x} (the first 1 MiB of the guest stays unmapped)")]
    BelowLoadMin {
        /// Program header index.
        index: usize,
        /// Its guest-physical range.
        range: Range,
        /// `LGUEST_LOAD_MIN`.
        min: u64,
    },
    /// A segment does not fit in guest RAM below the command-line page.
    #[error("segment {index} {range} lies outside guest memory ({mem}; its last page holds the command line)")]
    OutsideMemory {
        /// Program header index.
        index: usize,
        /// Its guest-physical range.
        range: Range,
        /// Guest RAM size.
        mem: Size,
    },
    /// Two segments overlap in guest-physical memory.
    #[error("segments {a} {a_range} and {b} {b_range} overlap")]
    Overlap {
        /// One program header index.
        a: usize,
        /// Its range.
        a_range: Range,
        /// The other program header index.
        b: usize,
        /// Its range.
        b_range: Range,
    },
    /// The entry point is not in an executable segment.
    #[error("entry point {0:#x} is not inside an executable (PF_X) segment")]
    EntryNotExecutable(u64),
    /// The "lguest" entry note's descriptor is not 8 bytes.
    #[error("the \"lguest\" entry note has {0} bytes, not 8")]
    BadEntryNote(usize),
    /// The "lguest" entry note names an address no segment holds.
    #[error("the \"lguest\" entry note names {0:#x}, which no PT_LOAD segment holds")]
    NoteEntryOutside(u64),
    /// A Linux kernel larger than guest RAM.
    #[error("a Linux kernel ending at {end:#x}, past the end of guest memory ({mem}): give --memory {need} or more")]
    LinuxTooBig {
        /// Where its image ends.
        end: u64,
        /// Guest RAM.
        mem: Size,
        /// What would do.
        need: Size,
    },
    /// Copying into guest memory failed (should not happen after the checks).
    #[error("copying into guest memory")]
    Memory(#[source] MemoryError),
}

/// One `PT_LOAD` segment that passed the checks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Segment {
    /// Its index in the program header table.
    pub index: usize,
    /// Guest-physical load address.
    pub paddr: u64,
    /// Virtual address (the Linux guest's note names its entry by it).
    pub vaddr: u64,
    /// Bytes in memory.
    pub memsz: u64,
    /// Bytes in the file (the rest is zero-filled).
    pub filesz: u64,
    /// File offset of its bytes.
    pub offset: u64,
    /// `PF_*` flags.
    pub flags: u32,
}

impl Segment {
    /// Its guest-physical range.
    pub fn range(&self) -> Range {
        // Cannot overflow: checked when the segment was accepted.
        Range { start: self.paddr, end: self.paddr + self.memsz }
    }
}

/// A checked guest image.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Image {
    /// The entry point (guest-physical = guest-virtual at boot).
    pub entry: u64,
    /// The `PT_LOAD` segments, in program header order.
    pub segments: Vec<Segment>,
    /// The `PT_NOTE` segments: (file offset, size).
    pub notes: Vec<(u64, u64)>,
    /// A Linux kernel with the "lguest" entry note: booted with
    /// `boot_params` (`linux.rs`).
    pub linux: bool,
}

/// Where a Linux bzImage has its boot-protocol magic, "HdrS".
const BZIMAGE_MAGIC_AT: usize = 0x202;

/// The ELF note type of the Linux guest's entry (name `"lguest"`).
pub const LGUEST_ELFNOTE_ENTRY: u32 = 1;

/// The most bytes of one `PT_NOTE` segment the loader reads.
pub const MAX_NOTES: u64 = 64 << 10;

/// The descriptor of note `name`, of type `ty` (or any type: `None`), in
/// `notes` (a `PT_NOTE` segment's bytes: 4-byte name size, descriptor size
/// and type, then the name and the descriptor, each padded to 4 bytes).
fn find_note<'a>(notes: &'a [u8], name: &str, ty: Option<u32>) -> Option<&'a [u8]> {
    let word = |at: usize| Some(u32::from_le_bytes(notes.get(at..at + 4)?.try_into().ok()?));
    let mut at = 0usize;
    while at + 12 <= notes.len() {
        let (namesz, descsz, t) = (word(at)? as usize, word(at + 4)? as usize, word(at + 8)?);
        let name_at = at + 12;
        let desc_at = name_at.checked_add(namesz.checked_add(3)? & !3)?;
        let next = desc_at.checked_add(descsz.checked_add(3)? & !3)?;
        let n = notes.get(name_at..name_at + namesz)?;
        let desc = notes.get(desc_at..desc_at + descsz)?;
        if ty.is_none_or(|ty| t == ty) && n.strip_suffix(&[0]).unwrap_or(n) == name.as_bytes() {
            return Some(desc);
        }
        at = next;
    }
    None
}

impl Image {
    /// The guest-physical address of virtual address `va`, in the segment
    /// that holds it.
    fn phys_of(&self, va: u64) -> Option<u64> {
        self.segments.iter().find(|s| s.vaddr <= va && va - s.vaddr < s.memsz).map(|s| s.paddr + (va - s.vaddr))
    }
}

/// The most bytes of headers (the ELF header and the program header
/// table) the loader reads from a file: a table of 65535 entries at the
/// usual offset fits easily.
pub const MAX_HEADERS: u64 = 4 << 20;

/// Where the loader reads an image from: positioned reads, so that only
/// the headers and the segments' bytes are read (a file in the launcher,
/// a fake that counts the reads in tests).
pub trait ReadAt {
    /// Reads exactly `buf.len()` bytes at `offset`.
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()>;
}

impl ReadAt for File {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        FileExt::read_exact_at(self, buf, offset)
    }
}

/// What kind of file, for the error about a guest that is not a regular one.
fn file_kind(ty: std::fs::FileType) -> &'static str {
    if ty.is_dir() {
        "a directory"
    } else if ty.is_char_device() {
        "a character device"
    } else if ty.is_block_device() {
        "a block device"
    } else if ty.is_fifo() {
        "a FIFO"
    } else if ty.is_socket() {
        "a socket"
    } else {
        "not a regular file"
    }
}

/// Reads the guest at `path`, checks it, and loads it into `mem`.
///
/// The file must be a regular file (so `/dev/zero`, a FIFO or a terminal is
/// refused at once, without reading), and only its headers and its
/// segments' bytes are read: a huge file costs no more than its segments,
/// which must fit in guest RAM. It is opened `O_NONBLOCK`, so that opening
/// a FIFO does not wait for a writer.
pub fn load_file(path: &Path, mem: &GuestMemory) -> Result<Image, LoadError> {
    let name = path.display().to_string();
    let fail = |problem| LoadError { file: name.clone(), problem };
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| fail(Problem::Read(e)))?;
    let meta = file.metadata().map_err(|e| fail(Problem::Read(e)))?;
    if !meta.file_type().is_file() {
        return Err(fail(Problem::NotRegular(file_kind(meta.file_type()))));
    }
    load_from(&name, &file, meta.len(), mem)
}

/// Checks the image of `len` bytes that `src` reads (called `file` in
/// errors) and loads it into `mem`, reading only the headers and the
/// segments. Nothing is written unless every check passes and every
/// segment was read.
pub fn load_from(file: &str, src: &dyn ReadAt, len: u64, mem: &GuestMemory) -> Result<Image, LoadError> {
    let fail = |problem| LoadError { file: file.to_owned(), problem };
    let headers = read_headers(src, len).map_err(fail)?;
    let mut image = match check_headers(&headers, len, mem.mem_size()) {
        Err(Problem::OutsideMemory { .. }) if linux_too_big(&headers, src, len) => {
            let image = check_headers(&headers, len, abi::LGUEST_MAX_MEM + PAGE_SIZE).map_err(fail)?;
            let end = image.segments.iter().map(|s| s.range().end).max().unwrap_or(0);
            return Err(fail(Problem::LinuxTooBig {
                end,
                mem: Size(mem.mem_size()),
                need: Size(crate::linux::min_memory(end, 0)),
            }));
        }
        other => other.map_err(fail)?,
    };
    note_entry(&mut image, src, len).map_err(fail)?;
    let mut data = Vec::new();
    for seg in &image.segments {
        // CAST: a checked segment's file bytes fit in guest RAM (at most
        // 4 GiB), so in usize.
        let mut bytes = vec![0u8; seg.filesz as usize];
        src.read_exact_at(&mut bytes, seg.offset).map_err(|e| fail(Problem::Read(e)))?;
        data.push(bytes);
    }
    for (seg, bytes) in image.segments.iter().zip(&data) {
        mem.write(seg.paddr, bytes).map_err(|e| fail(Problem::Memory(e)))?;
        mem.zero(seg.paddr + seg.filesz, seg.memsz - seg.filesz).map_err(|e| fail(Problem::Memory(e)))?;
    }
    Ok(image)
}

/// The first bytes of an image of `len` bytes: the ELF header and, if the
/// header is ELF64 little-endian and the table lies inside the file, the
/// whole program header table (the checks report anything else).
fn read_headers(src: &dyn ReadAt, len: u64) -> Result<Vec<u8>, Problem> {
    // CAST: at most EHDR_SIZE.
    let mut head = vec![0u8; len.min(EHDR_SIZE as u64) as usize];
    src.read_exact_at(&mut head, 0).map_err(Problem::Read)?;
    let elf64le = head.len() == EHDR_SIZE
        && head[..header::SELFMAG] == header::ELFMAG[..]
        && head[header::EI_CLASS] == header::ELFCLASS64
        && head[header::EI_DATA] == header::ELFDATA2LSB;
    if !elf64le {
        // Not ELF: enough to tell a bzImage by its boot-protocol magic.
        if head.len() == EHDR_SIZE && head[..header::SELFMAG] != header::ELFMAG[..] {
            let mut more = vec![0u8; len.min(BZIMAGE_MAGIC_AT as u64 + 4) as usize];
            src.read_exact_at(&mut more, 0).map_err(Problem::Read)?;
            return Ok(more);
        }
        return Ok(head);
    }
    let mut phoff = [0u8; 8];
    phoff.copy_from_slice(&head[32..40]);
    let phoff = u64::from_le_bytes(phoff);
    let phnum = u64::from(u16::from_le_bytes([head[56], head[57]]));
    let end = phoff.saturating_add(phnum * PHDR_SIZE as u64);
    if end <= EHDR_SIZE as u64 || end > len {
        return Ok(head);
    }
    if end > MAX_HEADERS {
        return Err(Problem::HeadersTooFar { end });
    }
    // CAST: at most MAX_HEADERS.
    head.resize(end as usize, 0);
    src.read_exact_at(&mut head[EHDR_SIZE..], EHDR_SIZE as u64).map_err(Problem::Read)?;
    Ok(head)
}

/// Checks the ELF image `bytes` (called `file` in errors) and loads it into
/// `mem`. Nothing is written unless every check passes.
#[cfg(test)]
pub fn load(file: &str, bytes: &[u8], mem: &GuestMemory) -> Result<Image, LoadError> {
    load_from(file, &bytes, len64(bytes), mem)
}

/// An image in memory (tests).
#[cfg(test)]
impl ReadAt for &[u8] {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        let data = usize::try_from(offset)
            .ok()
            .and_then(|start| self.get(start..start.checked_add(buf.len())?))
            .ok_or(std::io::ErrorKind::UnexpectedEof)?;
        buf.copy_from_slice(data);
        Ok(())
    }
}

/// The length of a byte slice as u64.
fn len64(bytes: &[u8]) -> u64 {
    // CAST: usize is at most 64 bits on every supported host.
    bytes.len() as u64
}

/// Checks the ELF header of `bytes` and returns it.
fn check_header(bytes: &[u8]) -> Result<header::Header, Problem> {
    if bytes.is_empty() {
        return Err(Problem::Empty);
    }
    let magic_len = bytes.len().min(header::SELFMAG);
    if bytes[..magic_len] != header::ELFMAG[..magic_len] {
        if bytes.get(BZIMAGE_MAGIC_AT..BZIMAGE_MAGIC_AT + 4) == Some(b"HdrS") {
            return Err(Problem::BzImage);
        }
        return Err(Problem::NotElf);
    }
    if bytes.len() < EHDR_SIZE {
        return Err(Problem::Truncated {
            what: "the ELF header",
            range: Range { start: 0, end: EHDR_SIZE as u64 },
            len: len64(bytes),
        });
    }
    let class = bytes[header::EI_CLASS];
    if class != header::ELFCLASS64 {
        return Err(Problem::Class(class));
    }
    let data = bytes[header::EI_DATA];
    if data != header::ELFDATA2LSB {
        return Err(Problem::Endian(data));
    }
    if bytes[header::EI_VERSION] != header::EV_CURRENT {
        return Err(Problem::Version(u32::from(bytes[header::EI_VERSION])));
    }
    let hdr = Elf::parse_header(bytes).map_err(|e| Problem::Parse(e.to_string()))?;
    if hdr.e_version != u32::from(header::EV_CURRENT) {
        return Err(Problem::Version(hdr.e_version));
    }
    if hdr.e_machine != EM_X86_64 {
        return Err(Problem::Machine { machine: hdr.e_machine, name: header::machine_to_str(hdr.e_machine) });
    }
    if hdr.e_type != ET_EXEC {
        return Err(Problem::Type { ty: hdr.e_type, name: header::et_to_str(hdr.e_type) });
    }
    Ok(hdr)
}

/// Checks one `PT_LOAD` header against the file and guest memory.
fn check_segment(index: usize, ph: &ProgramHeader, file_len: u64, mem_size: u64) -> Result<Segment, Problem> {
    let seg = Segment {
        index,
        paddr: ph.p_paddr,
        vaddr: ph.p_vaddr,
        memsz: ph.p_memsz,
        filesz: ph.p_filesz,
        offset: ph.p_offset,
        flags: ph.p_flags,
    };
    if seg.filesz > seg.memsz {
        return Err(Problem::FileszOverMemsz { index, filesz: seg.filesz, memsz: seg.memsz });
    }
    let end = seg.paddr.checked_add(seg.memsz).ok_or(Problem::Overflow {
        index,
        start_name: "p_paddr",
        start: seg.paddr,
        size_name: "p_memsz",
        size: seg.memsz,
    })?;
    let file_end = seg.offset.checked_add(seg.filesz).ok_or(Problem::Overflow {
        index,
        start_name: "p_offset",
        start: seg.offset,
        size_name: "p_filesz",
        size: seg.filesz,
    })?;
    if file_end > file_len {
        return Err(Problem::FileRange { index, range: Range { start: seg.offset, end: file_end }, len: file_len });
    }
    let range = Range { start: seg.paddr, end };
    if seg.paddr < abi::LGUEST_LOAD_MIN {
        return Err(Problem::BelowLoadMin { index, range, min: abi::LGUEST_LOAD_MIN });
    }
    if end > mem_size.saturating_sub(PAGE_SIZE) {
        return Err(Problem::OutsideMemory { index, range, mem: Size(mem_size) });
    }
    Ok(seg)
}

/// Checks the image `bytes` for a guest with `mem_size` bytes of RAM,
/// without touching guest memory.
#[cfg(test)]
pub fn check(bytes: &[u8], mem_size: u64) -> Result<Image, Problem> {
    let mut image = check_headers(bytes, len64(bytes), mem_size)?;
    note_entry(&mut image, &bytes, len64(bytes))?;
    Ok(image)
}

/// Checks an image of `file_len` bytes whose first bytes, at least its
/// headers ([`read_headers`]), are `bytes`.
fn check_headers(bytes: &[u8], file_len: u64, mem_size: u64) -> Result<Image, Problem> {
    let hdr = check_header(bytes)?;
    if usize::from(hdr.e_phentsize) != PHDR_SIZE {
        return Err(Problem::PhentSize(hdr.e_phentsize));
    }
    // The table's size is at most 65535 * 56, so only the offset can overflow.
    let table_len = u64::from(hdr.e_phnum) * PHDR_SIZE as u64;
    let table = Range { start: hdr.e_phoff, end: hdr.e_phoff.saturating_add(table_len) };
    if hdr.e_phoff.checked_add(table_len).is_none_or(|end| end > file_len) {
        return Err(Problem::Truncated { what: "the program header table", range: table, len: file_len });
    }
    if table.end > len64(bytes) {
        // Only a table past MAX_HEADERS was not read.
        return Err(Problem::HeadersTooFar { end: table.end });
    }
    let phoff = usize::try_from(hdr.e_phoff).map_err(|e| Problem::Parse(e.to_string()))?;
    let ctx = Ctx::new(Container::Big, Endian::Little);
    let phdrs =
        ProgramHeader::parse(bytes, phoff, usize::from(hdr.e_phnum), ctx).map_err(|e| Problem::Parse(e.to_string()))?;

    for (index, ph) in phdrs.iter().enumerate() {
        if ph.p_type == PT_INTERP || ph.p_type == PT_DYNAMIC {
            return Err(Problem::NotStatic { index, kind: program_header::pt_to_str(ph.p_type) });
        }
    }
    let mut segments = Vec::new();
    for (index, ph) in phdrs.iter().enumerate().filter(|(_, ph)| ph.p_type == PT_LOAD) {
        segments.push(check_segment(index, ph, file_len, mem_size)?);
    }
    if segments.is_empty() {
        return Err(Problem::NoLoad);
    }

    // Overlaps: sort by start; empty segments occupy nothing.
    let mut sorted: Vec<&Segment> = segments.iter().filter(|s| s.memsz != 0).collect();
    sorted.sort_by_key(|s| (s.paddr, s.index));
    for pair in sorted.windows(2) {
        if let [a, b] = pair {
            if b.paddr < a.range().end {
                let (a, b) = if a.index < b.index { (a, b) } else { (b, a) };
                return Err(Problem::Overlap { a: a.index, a_range: a.range(), b: b.index, b_range: b.range() });
            }
        }
    }

    let notes: Vec<(u64, u64)> = phdrs
        .iter()
        .filter(|ph| ph.p_type == PT_NOTE && ph.p_filesz > 0)
        .map(|ph| (ph.p_offset, ph.p_filesz))
        .collect();
    let image = Image { entry: hdr.e_entry, segments, notes, linux: false };
    // With notes, the entry may be a Linux guest's note's (load_from).
    if image.notes.is_empty() {
        check_entry(&image)?;
    }
    Ok(image)
}

/// Whether an image whose segments do not fit in guest memory is a Linux
/// guest that would fit in more (so that the error can say so).
fn linux_too_big(headers: &[u8], src: &dyn ReadAt, len: u64) -> bool {
    let Ok(mut image) = check_headers(headers, len, abi::LGUEST_MAX_MEM + PAGE_SIZE) else { return false };
    note_entry(&mut image, src, len).is_ok() && image.linux
}

/// The entry point must be in an executable segment.
fn check_entry(image: &Image) -> Result<(), Problem> {
    let entry = image.entry;
    let runnable = image.segments.iter().any(|s| s.flags & PF_X != 0 && s.paddr <= entry && entry < s.range().end);
    if !runnable {
        return Err(Problem::EntryNotExecutable(entry));
    }
    Ok(())
}

/// The entry of `image` whose `PT_NOTE` segments `src` reads: the Linux
/// guest's note's if there is one, else `e_entry` (checked as always).
fn note_entry(image: &mut Image, src: &dyn ReadAt, file_len: u64) -> Result<(), Problem> {
    let mut linux = false;
    for &(offset, size) in &image.notes {
        let end = offset.checked_add(size).filter(|&e| e <= file_len);
        if end.is_none() || size > MAX_NOTES {
            continue;
        }
        // CAST: at most MAX_NOTES.
        let mut bytes = vec![0u8; size as usize];
        src.read_exact_at(&mut bytes, offset).map_err(Problem::Read)?;
        // Notes named "Linux" (of any type) say the image is a kernel.
        linux |= find_note(&bytes, "Linux", None).is_some();
        let Some(desc) = find_note(&bytes, "lguest", Some(LGUEST_ELFNOTE_ENTRY)) else { continue };
        let va = <[u8; 8]>::try_from(desc).map(u64::from_le_bytes).map_err(|_| Problem::BadEntryNote(desc.len()))?;
        image.entry = image.phys_of(va).ok_or(Problem::NoteEntryOutside(va))?;
        image.linux = true;
        return Ok(());
    }
    if linux {
        return Err(Problem::LinuxWithoutEntry);
    }
    check_entry(image)
}

#[cfg(test)]
pub(crate) mod tests {
    use goblin::elf::program_header::{PF_R, PF_W, PT_GNU_STACK, PT_NOTE};

    use super::*;

    const MEM: u64 = 64 << 20;

    /// One program header of a test image.
    #[derive(Clone, Copy, Debug)]
    pub(crate) struct Ph {
        pub ty: u32,
        pub flags: u32,
        pub offset: u64,
        pub paddr: u64,
        pub filesz: u64,
        pub memsz: u64,
    }

    impl Ph {
        pub fn load(flags: u32, offset: u64, paddr: u64, filesz: u64, memsz: u64) -> Self {
            Self { ty: PT_LOAD, flags, offset, paddr, filesz, memsz }
        }
    }

    /// A hand-laid ELF64 image: header fields that tests may spoil.
    #[derive(Clone, Debug)]
    pub(crate) struct ElfImage {
        pub class: u8,
        pub data: u8,
        pub ty: u16,
        pub machine: u16,
        pub entry: u64,
        pub phentsize: u16,
        pub phdrs: Vec<Ph>,
        /// (file offset, bytes) to place after the headers.
        pub payload: Vec<(u64, Vec<u8>)>,
    }

    impl ElfImage {
        /// A valid x86-64 ET_EXEC image with no program headers.
        pub fn new(entry: u64) -> Self {
            Self {
                class: header::ELFCLASS64,
                data: header::ELFDATA2LSB,
                ty: ET_EXEC,
                machine: EM_X86_64,
                entry,
                phentsize: PHDR_SIZE as u16,
                phdrs: Vec::new(),
                payload: Vec::new(),
            }
        }

        /// Lays the image out: header at 0, program headers at 64, payload
        /// where it says.
        pub fn build(&self) -> Vec<u8> {
            let mut out = Vec::new();
            out.extend_from_slice(header::ELFMAG);
            out.extend_from_slice(&[self.class, self.data, header::EV_CURRENT, 0]);
            out.resize(16, 0);
            out.extend_from_slice(&self.ty.to_le_bytes());
            out.extend_from_slice(&self.machine.to_le_bytes());
            out.extend_from_slice(&1u32.to_le_bytes()); // e_version
            out.extend_from_slice(&self.entry.to_le_bytes());
            out.extend_from_slice(&(EHDR_SIZE as u64).to_le_bytes()); // e_phoff
            out.extend_from_slice(&0u64.to_le_bytes()); // e_shoff
            out.extend_from_slice(&0u32.to_le_bytes()); // e_flags
            out.extend_from_slice(&(EHDR_SIZE as u16).to_le_bytes()); // e_ehsize
            out.extend_from_slice(&self.phentsize.to_le_bytes());
            out.extend_from_slice(&(self.phdrs.len() as u16).to_le_bytes());
            out.extend_from_slice(&64u16.to_le_bytes()); // e_shentsize
            out.extend_from_slice(&0u16.to_le_bytes()); // e_shnum
            out.extend_from_slice(&0u16.to_le_bytes()); // e_shstrndx
            assert_eq!(out.len(), EHDR_SIZE);
            for ph in &self.phdrs {
                out.extend_from_slice(&ph.ty.to_le_bytes());
                out.extend_from_slice(&ph.flags.to_le_bytes());
                out.extend_from_slice(&ph.offset.to_le_bytes());
                out.extend_from_slice(&ph.paddr.to_le_bytes()); // p_vaddr
                out.extend_from_slice(&ph.paddr.to_le_bytes());
                out.extend_from_slice(&ph.filesz.to_le_bytes());
                out.extend_from_slice(&ph.memsz.to_le_bytes());
                out.extend_from_slice(&0x1000u64.to_le_bytes()); // p_align
            }
            for (offset, bytes) in &self.payload {
                let start = *offset as usize;
                if out.len() < start + bytes.len() {
                    out.resize(start + bytes.len(), 0);
                }
                out[start..start + bytes.len()].copy_from_slice(bytes);
            }
            out
        }
    }

    /// A typical guest: text at 1 MiB, data + bss at 2 MiB, a GNU_STACK and
    /// a note that must be ignored.
    pub(crate) fn guest_image() -> ElfImage {
        let mut img = ElfImage::new(0x10_0010);
        img.phdrs = vec![
            Ph::load(PF_R | PF_X, 0x1000, 0x10_0000, 0x20, 0x20),
            Ph::load(PF_R | PF_W, 0x2000, 0x20_0000, 0x10, 0x3000),
            Ph { ty: PT_GNU_STACK, flags: PF_R | PF_W, offset: 0, paddr: 0, filesz: 0, memsz: 0 },
            Ph { ty: PT_NOTE, flags: PF_R, offset: 0x1000, paddr: 0, filesz: 4, memsz: 4 },
        ];
        img.payload = vec![(0x1000, (0..0x20).collect()), (0x2000, vec![0x55; 0x10])];
        img
    }

    fn problem(img: &ElfImage) -> Problem {
        check(&img.build(), MEM).expect_err("image must be rejected")
    }

    fn memory() -> GuestMemory {
        GuestMemory::new(MEM, 1).expect("guest memory")
    }

    /// An ELF note: name, type, descriptor.
    fn note(name: &str, ty: u32, desc: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend((name.len() as u32 + 1).to_le_bytes());
        out.extend((desc.len() as u32).to_le_bytes());
        out.extend(ty.to_le_bytes());
        out.extend(name.as_bytes());
        out.push(0);
        while out.len() % 4 != 0 {
            out.push(0);
        }
        out.extend(desc);
        while out.len() % 4 != 0 {
            out.push(0);
        }
        out
    }

    /// `guest_image` with a `PT_NOTE` of `notes` at file offset 0x3000.
    fn with_notes(notes: Vec<u8>) -> ElfImage {
        let mut img = guest_image();
        img.phdrs.push(Ph { ty: PT_NOTE, flags: PF_R, offset: 0x3000, paddr: 0, filesz: notes.len() as u64, memsz: 0 });
        img.payload.push((0x3000, notes));
        img
    }

    /// A Linux guest's "lguest" note names the entry, in any segment (here
    /// the data segment, without PF_X), after other notes; without it the
    /// ELF entry is checked as before; a bad note is a clear error.
    #[test]
    fn the_lguest_note_names_the_entry() {
        let mut notes = note("Linux", 1, b"OPEN");
        notes.extend(note("GNU", 3, &[7; 20]));
        notes.extend(note("lguest", LGUEST_ELFNOTE_ENTRY, &0x20_0008u64.to_le_bytes()));
        let image = check(&with_notes(notes).build(), MEM).expect("valid");
        assert_eq!(image.entry, 0x20_0008);
        assert!(image.linux, "booted as Linux");
        assert!(!check(&guest_image().build(), MEM).expect("valid").linux);
        // A kernel without the note: a clear error, not one about PF_X.
        let img = with_notes(note("Linux", 1, b"OPEN"));
        assert!(matches!(problem(&img), Problem::LinuxWithoutEntry), "{}", problem(&img));
        // Another name, or another type: the ELF entry.
        let image = check(&with_notes(note("lguesu", 1, &0x20_0008u64.to_le_bytes())).build(), MEM).expect("valid");
        assert_eq!(image.entry, 0x10_0010);
        let image = check(&with_notes(note("lguest", 2, &0x20_0008u64.to_le_bytes())).build(), MEM).expect("valid");
        assert_eq!(image.entry, 0x10_0010);
        let img = with_notes(note("lguest", 1, &[1, 2, 3, 4]));
        assert!(matches!(problem(&img), Problem::BadEntryNote(4)), "{}", problem(&img));
        let img = with_notes(note("lguest", 1, &0x90_0000u64.to_le_bytes()));
        assert!(matches!(problem(&img), Problem::NoteEntryOutside(0x90_0000)), "{}", problem(&img));
        // A truncated note is no note.
        let mut cut = note("lguest", 1, &0x20_0008u64.to_le_bytes());
        cut.truncate(cut.len() - 4);
        let image = check(&with_notes(cut).build(), MEM).expect("valid");
        assert_eq!(image.entry, 0x10_0010);
    }

    /// A Linux kernel that does not fit gets an error that says so and what
    /// would do; another image the usual one.
    #[test]
    fn a_linux_kernel_too_big_for_memory() {
        let linux = with_notes(note("lguest", LGUEST_ELFNOTE_ENTRY, &0x20_0008u64.to_le_bytes())).build();
        let small = GuestMemory::new(2 << 20, 1).expect("memory");
        let e = load("vmlinux", &linux, &small).expect_err("too big");
        assert_eq!(
            e.to_string(),
            "vmlinux: a Linux kernel ending at 0x203000, past the end of guest memory (2 MiB): give --memory 32 MiB or more"
        );
        let e = load("g.elf", &guest_image().build(), &small).expect_err("too big");
        assert!(matches!(e.problem, Problem::OutsideMemory { .. }), "{e}");
    }

    #[test]
    fn valid_image_loads() {
        let mem = memory();
        // Dirty the bss first: the loader must zero it, not trust the mapping.
        mem.write(0x20_0000, &[0xEE; 0x4000]).expect("dirty");
        let image = load("guest.elf", &guest_image().build(), &mem).expect("valid image");
        assert_eq!(image.entry, 0x10_0010);
        assert_eq!(image.segments.len(), 2);
        assert_eq!(image.segments[1].index, 1);
        let mut text = [0u8; 0x20];
        mem.read(0x10_0000, &mut text).expect("read text");
        assert_eq!(text.to_vec(), (0..0x20).collect::<Vec<u8>>());
        let mut data = vec![0u8; 0x4000];
        mem.read(0x20_0000, &mut data).expect("read data");
        assert!(data[..0x10].iter().all(|&b| b == 0x55), "file bytes");
        assert!(data[0x10..0x3000].iter().all(|&b| b == 0), "bss zeroed");
        assert!(data[0x3000..].iter().all(|&b| b == 0xEE), "nothing past memsz touched");
    }

    #[test]
    fn rejected_image_touches_nothing() {
        let mem = memory();
        let mut img = guest_image();
        img.entry = 0x20_0000; // in the data segment
        let err = load("guest.elf", &img.build(), &mem).expect_err("bad entry");
        assert!(matches!(err.problem, Problem::EntryNotExecutable(0x20_0000)), "{err}");
        let mut text = [0xFFu8; 0x20];
        mem.read(0x10_0000, &mut text).expect("read");
        assert_eq!(text, [0; 0x20]);
    }

    /// A temporary path, removed when dropped.
    struct TempPath(std::path::PathBuf);

    impl TempPath {
        fn new(what: &str) -> Self {
            static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
            let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            Self(std::env::temp_dir().join(format!("lguest-loader-test-{}-{what}-{n}", std::process::id())))
        }
    }

    impl Drop for TempPath {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0).or_else(|_| std::fs::remove_dir(&self.0));
        }
    }

    /// An image of `len` bytes made of `pieces` (offset, bytes) and zeros
    /// elsewhere, that counts the bytes read.
    struct Sparse {
        len: u64,
        pieces: Vec<(u64, Vec<u8>)>,
        read: std::cell::Cell<u64>,
    }

    impl ReadAt for Sparse {
        fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
            let end = offset + buf.len() as u64;
            if end > self.len {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            buf.fill(0);
            for (at, bytes) in &self.pieces {
                let (from, to) = (offset.max(*at), end.min(at + bytes.len() as u64));
                if from < to {
                    buf[(from - offset) as usize..(to - offset) as usize]
                        .copy_from_slice(&bytes[(from - at) as usize..(to - at) as usize]);
                }
            }
            self.read.set(self.read.get() + buf.len() as u64);
            Ok(())
        }
    }

    /// `/dev/zero`, a directory or a FIFO is refused before anything is
    /// read, with the path and what it is; opening the FIFO (no writer)
    /// does not block.
    #[test]
    fn load_file_refuses_what_is_not_a_regular_file() {
        let shown = |path: &Path| format!("{:#}", anyhow::Error::new(load_file(path, &memory()).expect_err("refused")));
        assert_eq!(
            shown(Path::new("/dev/zero")),
            "/dev/zero: not a regular file (a character device); the guest must be an ELF file"
        );
        let dir = TempPath::new("dir");
        std::fs::create_dir(&dir.0).expect("mkdir");
        assert!(shown(&dir.0).ends_with(": not a regular file (a directory); the guest must be an ELF file"));
        let fifo = TempPath::new("fifo");
        let name = std::ffi::CString::new(fifo.0.as_os_str().as_encoded_bytes()).expect("path");
        // SAFETY: mkfifo reads the NUL-terminated path, a live CString.
        assert_eq!(unsafe { libc::mkfifo(name.as_ptr(), 0o600) }, 0, "mkfifo");
        let (tx, rx) = std::sync::mpsc::channel();
        let path = fifo.0.clone();
        std::thread::spawn(move || tx.send(shown(&path)).expect("send"));
        let msg = rx.recv_timeout(std::time::Duration::from_secs(10)).expect("opening a FIFO must not block");
        assert!(msg.ends_with(": not a regular file (a FIFO); the guest must be an ELF file"), "{msg}");
    }

    /// Only the headers and the segments' file bytes are read, however
    /// long the file is; the loaded guest is the same as from a buffer.
    #[test]
    fn only_the_headers_and_the_segments_are_read() {
        let img = guest_image();
        let bytes = img.build();
        let src = Sparse { len: 16 << 20, pieces: vec![(0, bytes.clone())], read: Default::default() };
        let mem = memory();
        let image = load_from("big.elf", &src, src.len, &mem).expect("loads");
        assert_eq!(image, check(&bytes, MEM).expect("valid"));
        let headers = (EHDR_SIZE + PHDR_SIZE * img.phdrs.len()) as u64;
        assert_eq!(src.read.get(), headers + 4 + 0x20 + 0x10, "headers, the note, then the two segments");
        let mut text = [0u8; 0x20];
        mem.read(0x10_0000, &mut text).expect("read text");
        assert_eq!(text.to_vec(), (0..0x20).collect::<Vec<u8>>());
    }

    /// A real file far larger than guest RAM (sparse: 1 TiB) loads at once.
    #[test]
    fn a_huge_file_loads_without_reading_it_all() {
        let path = TempPath::new("huge");
        std::fs::write(&path.0, guest_image().build()).expect("write");
        std::fs::OpenOptions::new().write(true).open(&path.0).expect("open").set_len(1 << 40).expect("set_len");
        let start = std::time::Instant::now();
        let image = load_file(&path.0, &memory()).expect("loads");
        assert_eq!(image.entry, 0x10_0010);
        assert!(start.elapsed() < std::time::Duration::from_secs(10), "took {:?}", start.elapsed());
    }

    /// A program header table far into the file is refused by name, not
    /// read into memory.
    #[test]
    fn a_program_header_table_far_away_is_refused() {
        let mut bytes = guest_image().build();
        let table = bytes[EHDR_SIZE..EHDR_SIZE + 4 * PHDR_SIZE].to_vec();
        let far = 8u64 << 20;
        bytes[32..40].copy_from_slice(&far.to_le_bytes());
        let src = Sparse { len: 16 << 20, pieces: vec![(0, bytes), (far, table)], read: Default::default() };
        let err = load_from("far.elf", &src, src.len, &memory()).expect_err("refused");
        assert!(matches!(err.problem, Problem::HeadersTooFar { end } if end == far + 4 * PHDR_SIZE as u64), "{err}");
        assert_eq!(src.read.get(), EHDR_SIZE as u64, "only the ELF header was read");
        assert!(err.to_string().starts_with("far.elf: the program header table ends at 0x8000e0"), "{err}");
    }

    /// A file that is shorter than its segments say is still reported as
    /// such (the length comes from fstat, not from the bytes read).
    #[test]
    fn a_truncated_file_is_reported_from_its_length() {
        let bytes = guest_image().build();
        let path = TempPath::new("short");
        std::fs::write(&path.0, &bytes[..0x1010]).expect("write");
        let err = load_file(&path.0, &memory()).expect_err("truncated");
        assert!(matches!(err.problem, Problem::FileRange { index: 0, len: 0x1010, .. }), "{err}");
    }

    #[test]
    fn errors_name_the_file() {
        let err = load("path/to/guest.elf", &[], &memory()).expect_err("empty");
        assert_eq!(err.to_string(), "path/to/guest.elf: the file is empty");
        let err = load_file(Path::new("/nonexistent/guest.elf"), &memory()).expect_err("missing");
        let shown = format!("{:#}", anyhow::Error::new(err));
        assert!(shown.starts_with("/nonexistent/guest.elf: cannot read the file: No such file"), "{shown}");
    }

    #[test]
    fn empty_file() {
        assert!(matches!(check(&[], MEM), Err(Problem::Empty)));
    }

    #[test]
    fn not_elf() {
        assert!(matches!(check(b"#!/bin/sh\necho hi\n", MEM), Err(Problem::NotElf)));
        assert!(matches!(check(b"\x7fEL", MEM), Err(Problem::Truncated { .. })));
        assert!(matches!(check(b"MZ", MEM), Err(Problem::NotElf)));
    }

    /// A bzImage is named as such (its boot-protocol magic at 0x202), read
    /// from a file as from a buffer; without the magic it is just not ELF.
    #[test]
    fn bzimage_is_named() {
        let mut bz = vec![0u8; 0x1000];
        bz[..2].copy_from_slice(b"MZ");
        bz[0x202..0x206].copy_from_slice(b"HdrS");
        assert!(matches!(check(&bz, MEM), Err(Problem::BzImage)));
        let mem = memory();
        let err = load("bzImage", &bz, &mem).expect_err("a bzImage");
        assert!(matches!(err.problem, Problem::BzImage), "{err}");
        assert!(err.to_string().contains("vmlinux"), "{err}");
        bz[0x205] = b'T';
        assert!(matches!(check(&bz, MEM), Err(Problem::NotElf)));
    }

    #[test]
    fn truncated_file() {
        let bytes = guest_image().build();
        // Inside the ELF header.
        let p = check(&bytes[..40], MEM).expect_err("short header");
        assert!(matches!(p, Problem::Truncated { what: "the ELF header", len: 40, .. }), "{p}");
        // Inside the program header table.
        let p = check(&bytes[..100], MEM).expect_err("short table");
        assert!(matches!(p, Problem::Truncated { what: "the program header table", .. }), "{p}");
        assert_eq!(
            p.to_string(),
            "truncated: the program header table [0x40-0x120) lies past the end of the file (100 bytes)"
        );
        // Inside a segment's bytes.
        let p = check(&bytes[..0x1010], MEM).expect_err("short segment");
        assert!(matches!(p, Problem::FileRange { index: 0, .. }), "{p}");
        assert_eq!(p.to_string(), "segment 0: file range [0x1000-0x1020) lies past the end of the file (4112 bytes)");
    }

    #[test]
    fn wrong_class() {
        let mut img = guest_image();
        img.class = 1; // ELFCLASS32
        assert!(matches!(problem(&img), Problem::Class(1)));
    }

    #[test]
    fn wrong_endianness() {
        let mut img = guest_image();
        img.data = 2; // ELFDATA2MSB
        assert!(matches!(problem(&img), Problem::Endian(2)));
    }

    #[test]
    fn wrong_machine() {
        let mut img = guest_image();
        img.machine = header::EM_AARCH64;
        let p = problem(&img);
        assert!(matches!(p, Problem::Machine { machine: header::EM_AARCH64, .. }), "{p}");
        assert!(p.to_string().contains("not x86-64"), "{p}");
    }

    #[test]
    fn wrong_type() {
        let mut img = guest_image();
        img.ty = header::ET_DYN;
        let p = problem(&img);
        assert!(matches!(p, Problem::Type { ty: header::ET_DYN, .. }), "{p}");
        img.ty = header::ET_REL;
        assert!(matches!(problem(&img), Problem::Type { ty: header::ET_REL, .. }));
    }

    #[test]
    fn wrong_phentsize() {
        let mut img = guest_image();
        img.phentsize = 32;
        assert!(matches!(problem(&img), Problem::PhentSize(32)));
    }

    #[test]
    fn dynamic_images_are_refused() {
        let mut img = guest_image();
        img.phdrs.insert(0, Ph { ty: PT_INTERP, flags: PF_R, offset: 0x1000, paddr: 0, filesz: 4, memsz: 4 });
        let p = problem(&img);
        assert_eq!(p.to_string(), "not a static executable: segment 0 is PT_INTERP");
        let mut img = guest_image();
        img.phdrs.push(Ph { ty: PT_DYNAMIC, flags: PF_R, offset: 0x1000, paddr: 0, filesz: 4, memsz: 4 });
        assert!(matches!(problem(&img), Problem::NotStatic { index: 4, kind: "PT_DYNAMIC" }));
    }

    #[test]
    fn no_pt_load() {
        let mut img = guest_image();
        img.phdrs.retain(|ph| ph.ty != PT_LOAD);
        assert!(matches!(problem(&img), Problem::NoLoad));
        img.phdrs.clear();
        assert!(matches!(problem(&img), Problem::NoLoad));
    }

    #[test]
    fn segment_outside_memory() {
        let mut img = guest_image();
        img.phdrs[1].paddr = MEM - 0x1000; // the command-line page
        let p = problem(&img);
        assert!(matches!(p, Problem::OutsideMemory { index: 1, .. }), "{p}");
        assert_eq!(
            p.to_string(),
            "segment 1 [0x3fff000-0x4002000) lies outside guest memory (64 MiB; its last page holds the command line)"
        );
        // Right up to the command-line page is fine.
        let mut img = guest_image();
        img.phdrs[1].paddr = MEM - 0x1000 - 0x3000;
        check(&img.build(), MEM).expect("fits exactly");
        // Far beyond RAM.
        img.phdrs[1].paddr = 1 << 40;
        assert!(matches!(problem(&img), Problem::OutsideMemory { index: 1, .. }));
    }

    #[test]
    fn segment_below_load_min() {
        let mut img = guest_image();
        img.phdrs[1].paddr = 0xF_F000;
        let p = problem(&img);
        assert!(matches!(p, Problem::BelowLoadMin { index: 1, .. }), "{p}");
        img.phdrs[1].paddr = 0;
        assert!(matches!(problem(&img), Problem::BelowLoadMin { index: 1, .. }));
    }

    #[test]
    fn overlapping_segments() {
        let mut img = guest_image();
        img.phdrs[1].paddr = 0x10_0010; // inside the text segment
        let p = problem(&img);
        assert!(matches!(p, Problem::Overlap { a: 0, b: 1, .. }), "{p}");
        assert_eq!(p.to_string(), "segments 0 [0x100000-0x100020) and 1 [0x100010-0x103010) overlap");
        // Listed in the other order, the same two are named in index order.
        img.phdrs.swap(0, 1);
        img.entry = 0x10_0000;
        assert!(matches!(problem(&img), Problem::Overlap { a: 0, b: 1, .. }));
        // Touching is not overlapping.
        let mut img = guest_image();
        img.phdrs[1].paddr = 0x10_0020;
        check(&img.build(), MEM).expect("adjacent segments");
    }

    #[test]
    fn filesz_larger_than_memsz() {
        let mut img = guest_image();
        img.phdrs[0].filesz = 0x21;
        let p = problem(&img);
        assert!(matches!(p, Problem::FileszOverMemsz { index: 0, filesz: 0x21, memsz: 0x20 }), "{p}");
    }

    #[test]
    fn huge_sizes_do_not_overflow() {
        let mut img = guest_image();
        img.phdrs[1].memsz = u64::MAX;
        assert!(matches!(problem(&img), Problem::Overflow { index: 1, start_name: "p_paddr", .. }));
        let mut img = guest_image();
        img.phdrs[1].offset = u64::MAX - 4;
        assert!(matches!(problem(&img), Problem::Overflow { index: 1, start_name: "p_offset", .. }));
        let mut img = guest_image();
        img.phdrs[1].paddr = u64::MAX - 0x1000;
        img.phdrs[1].memsz = 0x1000;
        assert!(matches!(problem(&img), Problem::OutsideMemory { index: 1, .. }));
        let mut img = guest_image();
        img.phdrs[1].filesz = u64::MAX;
        img.phdrs[1].memsz = u64::MAX;
        assert!(matches!(problem(&img), Problem::Overflow { .. }));
    }

    #[test]
    fn entry_must_be_in_an_executable_segment() {
        let mut img = guest_image();
        img.entry = 0x20_0000; // data segment, not PF_X
        assert!(matches!(problem(&img), Problem::EntryNotExecutable(0x20_0000)));
        img.entry = 0x10_0020; // one past the text segment
        assert!(matches!(problem(&img), Problem::EntryNotExecutable(0x10_0020)));
        img.entry = 0; // nowhere
        assert_eq!(problem(&img).to_string(), "entry point 0x0 is not inside an executable (PF_X) segment");
        img.entry = 0x10_001F; // last byte of text
        check(&img.build(), MEM).expect("entry at the last byte");
    }

    #[test]
    fn empty_segments_are_harmless() {
        let mut img = guest_image();
        img.phdrs.push(Ph::load(PF_R, 0, 0x10_0000, 0, 0));
        let image = check(&img.build(), MEM).expect("empty segment");
        assert_eq!(image.segments.len(), 3);
    }
}

/// Property tests: whatever the bytes of a guest image, the loader never
/// panics, and what it accepts stays inside guest RAM below the command
/// line page, without overlaps, with the entry in an executable segment;
/// what it refuses leaves guest memory untouched.
#[cfg(test)]
mod props {
    use goblin::elf::program_header::{PF_R, PF_W};
    use proptest::prelude::*;

    use super::tests::{guest_image, ElfImage, Ph};
    use super::*;

    const MEM: u64 = 4 << 20;

    fn check(bytes: &[u8]) -> Result<(), TestCaseError> {
        let mem = GuestMemory::new(MEM, 0).expect("guest memory");
        match load("fuzz.elf", bytes, &mem) {
            Ok(image) => {
                let limit = MEM - 4096;
                let mut ranges: Vec<(u64, u64)> = Vec::new();
                for s in &image.segments {
                    prop_assert!(s.filesz <= s.memsz);
                    prop_assert!(s.paddr >= abi::LGUEST_LOAD_MIN);
                    let end = s.paddr.checked_add(s.memsz).expect("no overflow");
                    prop_assert!(end <= limit, "segment ends at {end:#x}");
                    for &(a, b) in &ranges {
                        prop_assert!(end <= a || s.paddr >= b, "overlap");
                    }
                    ranges.push((s.paddr, end));
                }
                prop_assert!(image
                    .segments
                    .iter()
                    .any(|s| s.flags & PF_X != 0 && image.entry >= s.paddr && image.entry < s.paddr + s.memsz));
            }
            Err(_) => {
                let mut buf = vec![0u8; MEM as usize];
                mem.read(0, &mut buf).expect("read back");
                prop_assert!(buf.iter().all(|&b| b == 0), "a refused image changed guest memory");
            }
        }
        Ok(())
    }

    fn small_image() -> ElfImage {
        let mut img = ElfImage::new(0x10_0010);
        img.phdrs = vec![
            Ph::load(PF_R | PF_X, 0x1000, 0x10_0000, 0x20, 0x20),
            Ph::load(PF_R | PF_W, 0x2000, 0x20_0000, 0x10, 0x3000),
        ];
        img.payload = vec![(0x1000, vec![0x90; 0x20]), (0x2000, vec![1; 0x10])];
        img
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Random bytes flipped anywhere in a valid image.
        #[test]
        fn flipped_bytes(flips in proptest::collection::vec((0usize..0x2100, any::<u8>()), 1..16)) {
            let mut bytes = small_image().build();
            for (at, v) in flips {
                if at < bytes.len() {
                    bytes[at] = v;
                }
            }
            check(&bytes)?;
        }

        /// A valid image cut short anywhere.
        #[test]
        fn truncated(len in 0usize..0x2100) {
            let bytes = guest_image().build();
            check(&bytes[..len.min(bytes.len())])?;
        }

        /// Program headers with arbitrary fields.
        #[test]
        fn random_program_headers(
            phs in proptest::collection::vec((any::<u32>(), any::<u32>(), any::<u64>(), any::<u64>(), any::<u64>(), any::<u64>()), 0..6),
            entry in any::<u64>(),
        ) {
            let mut img = small_image();
            img.entry = entry;
            img.phdrs = phs
                .into_iter()
                .map(|(ty, flags, offset, paddr, filesz, memsz)| Ph { ty: ty % 8, flags, offset: offset % 0x4000, paddr: paddr % (8 << 20), filesz: filesz % 0x4000, memsz: memsz % (8 << 20) })
                .collect();
            check(&img.build())?;
        }

        /// Arbitrary bytes.
        #[test]
        fn garbage(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            check(&bytes)?;
        }
    }
}
