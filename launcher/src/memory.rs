// SPDX-License-Identifier: GPL-2.0
//! Guest memory: the launcher's mapping of guest-physical `[0, mem_size)`
//! (RAM) and the device window right above it, and bounds-checked copies in
//! and out of it.
//!
//! It is built on rust-vmm's `vm-memory` (`GuestMemoryMmap`, feature
//! `backend-mmap`) because that fits cleanly: one `MmapRegion` built with our
//! own flags (`MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE`, read/write),
//! placed at `GuestAddress(0)`, gives bounds-checked, volatile-safe
//! `read_slice`/`write_slice` (the guest writes this memory behind our back,
//! so plain Rust references into it would be unsound) and the host address
//! for `LguestVmConfig::mem_base`. No `unsafe` is needed here. What
//! `vm-memory` does not know is the lguest layout (RAM, then device pages),
//! so that is this type's job, together with errors that say which range was
//! wrong.
//!
//! Device models get a second `GuestMemoryMmap`, [`GuestMemory::ram`], over
//! the same mapping but covering RAM only: every address a guest puts in a
//! virtqueue is then checked by `vm-memory` against RAM, and a descriptor
//! cannot point a device at the device table.

use std::fmt;

use vm_memory::mmap::MmapRegionBuilder;
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestRegionMmap};

/// The guest page size.
pub const PAGE_SIZE: u64 = 4096;

/// Errors from setting up or accessing guest memory.
#[derive(Debug, thiserror::Error)]
pub enum MemoryError {
    /// The RAM size is not a non-zero multiple of the page size.
    #[error("guest memory size {0:#x} is not a non-zero multiple of 4096 bytes")]
    BadSize(u64),
    /// RAM plus the device window does not fit this process.
    #[error("{mem_size:#x} bytes of guest RAM plus {device_pages} device pages do not fit this process")]
    TooBig {
        /// Bytes of RAM asked for.
        mem_size: u64,
        /// Device pages asked for.
        device_pages: u64,
    },
    /// `mmap` of the guest memory failed.
    #[error("cannot map {size} of guest memory")]
    Map {
        /// The size of the mapping.
        size: Size,
        /// What `vm-memory` reported.
        source: vm_memory::mmap::MmapRegionError,
    },
    /// `vm-memory` refused the region.
    #[error("cannot set up guest memory: {0}")]
    Region(String),
    /// An access to guest-physical memory is out of bounds.
    #[error("guest-physical [{start:#x}-{end:#x}) lies outside {what} ({size})")]
    OutOfRange {
        /// First byte of the access.
        start: u64,
        /// One past the last byte (saturated on overflow).
        end: u64,
        /// "guest RAM" or "guest memory".
        what: &'static str,
        /// The size of that area.
        size: Size,
    },
    /// `vm-memory` failed an access it had bounds-checked (should not happen).
    #[error("guest-physical access at {gpa:#x} failed")]
    Access {
        /// The address.
        gpa: u64,
        /// What `vm-memory` reported.
        source: vm_memory::GuestMemoryError,
    },
}

/// A byte count that prints as "64 MiB" when it is a whole number of KiB,
/// MiB or GiB, and as hex bytes otherwise.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Size(pub u64);

impl fmt::Display for Size {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.0;
        for (shift, unit) in [(30, "GiB"), (20, "MiB"), (10, "KiB")] {
            if n != 0 && n.is_multiple_of(1 << shift) {
                return write!(f, "{} {unit}", n >> shift);
            }
        }
        write!(f, "{n:#x} bytes")
    }
}

/// A string read out of guest memory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GuestStr {
    /// The bytes before the NUL (or all that could be read).
    pub bytes: Vec<u8>,
    /// Whether a NUL ended it (false: the limit came first).
    pub terminated: bool,
}

/// Guest RAM and the device window, mapped in the launcher.
#[derive(Debug)]
pub struct GuestMemory {
    /// RAM only, for the device models; borrows the mapping `mem` owns
    /// (declared first, so it is dropped first).
    ram: GuestMemoryMmap,
    mem: GuestMemoryMmap,
    mem_size: u64,
    device_pages: u64,
}

impl GuestMemory {
    /// Maps `mem_size` bytes of RAM and `device_pages` pages above it:
    /// anonymous, private, read/write and `MAP_NORESERVE` (untouched guest
    /// pages cost nothing), zero-filled by the kernel.
    pub fn new(mem_size: u64, device_pages: u64) -> Result<Self, MemoryError> {
        if mem_size == 0 || !mem_size.is_multiple_of(PAGE_SIZE) {
            return Err(MemoryError::BadSize(mem_size));
        }
        let too_big = MemoryError::TooBig { mem_size, device_pages };
        let total = device_pages.checked_mul(PAGE_SIZE).and_then(|d| d.checked_add(mem_size)).ok_or(too_big)?;
        let len = usize::try_from(total).map_err(|_| MemoryError::TooBig { mem_size, device_pages })?;
        let region = MmapRegionBuilder::new(len)
            .with_mmap_prot(libc::PROT_READ | libc::PROT_WRITE)
            .with_mmap_flags(libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE)
            .build()
            .map_err(|source| MemoryError::Map { size: Size(total), source })?;
        let region = GuestRegionMmap::new(region, GuestAddress(0))
            .ok_or_else(|| MemoryError::Region("the region's end overflows".into()))?;
        let base = region.as_ptr();
        let mem = GuestMemoryMmap::from_regions(vec![region]).map_err(|e| MemoryError::Region(e.to_string()))?;
        let ram_len = usize::try_from(mem_size).map_err(|_| MemoryError::TooBig { mem_size, device_pages })?;
        // SAFETY: `[base, base + ram_len)` is the start of the mapping that
        // `mem` just made (ram_len <= len) with these protections and flags;
        // a region built by `build_raw` never unmaps it, and `ram` is dropped
        // before `mem` (field order) and only lent out with `&self`, so the
        // mapping outlives every use of it.
        let raw = unsafe {
            vm_memory::mmap::MmapRegion::build_raw(
                base,
                ram_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            )
        }
        .map_err(|source| MemoryError::Map { size: Size(mem_size), source })?;
        let raw = GuestRegionMmap::new(raw, GuestAddress(0))
            .ok_or_else(|| MemoryError::Region("the RAM view's end overflows".into()))?;
        let ram = GuestMemoryMmap::from_regions(vec![raw]).map_err(|e| MemoryError::Region(e.to_string()))?;
        Ok(Self { ram, mem, mem_size, device_pages })
    }

    /// Guest RAM alone, as `vm-memory` sees it: what device models and
    /// virtqueues use.
    pub fn ram(&self) -> &GuestMemoryMmap {
        &self.ram
    }

    /// RAM and the device window, as `vm-memory` sees them: for the device
    /// table.
    pub fn all(&self) -> &GuestMemoryMmap {
        &self.mem
    }

    /// Bytes of guest RAM.
    pub fn mem_size(&self) -> u64 {
        self.mem_size
    }

    /// Pages of the device window above RAM.
    pub fn device_pages(&self) -> u64 {
        self.device_pages
    }

    /// Bytes of RAM plus device window: the whole mapping.
    pub fn total_size(&self) -> u64 {
        // Cannot overflow: `new` checked it.
        self.mem_size + self.device_pages * PAGE_SIZE
    }

    /// Whether `gpa` is in RAM.
    pub fn in_ram(&self, gpa: u64) -> bool {
        gpa < self.mem_size
    }

    /// Whether `gpa` is in the device window above RAM.
    pub fn in_device_window(&self, gpa: u64) -> bool {
        (self.mem_size..self.total_size()).contains(&gpa)
    }

    /// The launcher address of guest-physical 0 (`LguestVmConfig::mem_base`).
    pub fn host_base(&self) -> Result<u64, MemoryError> {
        let ptr =
            self.mem.get_host_address(GuestAddress(0)).map_err(|source| MemoryError::Access { gpa: 0, source })?;
        // CAST: a pointer always fits in u64 on the 64-bit hosts lguest runs on.
        Ok(ptr as usize as u64)
    }

    /// Checks that `[gpa, gpa + len)` lies inside the whole mapping.
    fn check(&self, gpa: u64, len: usize) -> Result<(), MemoryError> {
        let end = u64::try_from(len).ok().and_then(|l| gpa.checked_add(l));
        match end {
            Some(end) if end <= self.total_size() => Ok(()),
            _ => Err(MemoryError::OutOfRange {
                start: gpa,
                end: end.unwrap_or(u64::MAX),
                what: "guest memory",
                size: Size(self.total_size()),
            }),
        }
    }

    /// Copies `data` into guest memory at `gpa`.
    pub fn write(&self, gpa: u64, data: &[u8]) -> Result<(), MemoryError> {
        self.check(gpa, data.len())?;
        self.mem.write_slice(data, GuestAddress(gpa)).map_err(|source| MemoryError::Access { gpa, source })
    }

    /// Copies guest memory at `gpa` into `buf`.
    pub fn read(&self, gpa: u64, buf: &mut [u8]) -> Result<(), MemoryError> {
        self.check(gpa, buf.len())?;
        self.mem.read_slice(buf, GuestAddress(gpa)).map_err(|source| MemoryError::Access { gpa, source })
    }

    /// Sets `[gpa, gpa + len)` to zero.
    pub fn zero(&self, gpa: u64, len: u64) -> Result<(), MemoryError> {
        static ZEROES: [u8; 64 * 1024] = [0; 64 * 1024];
        let too_far = || MemoryError::OutOfRange {
            start: gpa,
            end: gpa.saturating_add(len),
            what: "guest memory",
            size: Size(self.total_size()),
        };
        let end = gpa.checked_add(len).filter(|&end| end <= self.total_size()).ok_or_else(too_far)?;
        let mut at = gpa;
        while at < end {
            // CAST: at most ZEROES.len(), which fits usize.
            let n = (end - at).min(ZEROES.len() as u64) as usize;
            self.write(at, &ZEROES[..n])?;
            at += n as u64;
        }
        Ok(())
    }

    /// Reads a NUL-terminated string at `gpa` in RAM: at most `max` bytes,
    /// and never past the end of RAM. Without a NUL in that range, returns
    /// what there is with `terminated == false`.
    pub fn read_cstr(&self, gpa: u64, max: usize) -> Result<GuestStr, MemoryError> {
        if !self.in_ram(gpa) {
            return Err(MemoryError::OutOfRange {
                start: gpa,
                end: gpa.saturating_add(1),
                what: "guest RAM",
                size: Size(self.mem_size),
            });
        }
        let room = self.mem_size - gpa;
        // CAST: min with a usize fits usize.
        let limit = room.min(max as u64) as usize;
        let mut bytes = Vec::new();
        let mut chunk = [0u8; 256];
        while bytes.len() < limit {
            let n = (limit - bytes.len()).min(chunk.len());
            // CAST: bytes.len() < limit <= room, which fits u64.
            self.read(gpa + bytes.len() as u64, &mut chunk[..n])?;
            if let Some(nul) = chunk[..n].iter().position(|&b| b == 0) {
                bytes.extend_from_slice(&chunk[..nul]);
                return Ok(GuestStr { bytes, terminated: true });
            }
            bytes.extend_from_slice(&chunk[..n]);
        }
        Ok(GuestStr { bytes, terminated: false })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mem() -> GuestMemory {
        GuestMemory::new(2 << 20, 1).expect("2 MiB of guest memory")
    }

    #[test]
    fn layout() {
        let m = mem();
        assert_eq!(m.mem_size(), 2 << 20);
        assert_eq!(m.device_pages(), 1);
        assert_eq!(m.total_size(), (2 << 20) + 4096);
        assert!(m.in_ram(0) && m.in_ram((2 << 20) - 1) && !m.in_ram(2 << 20));
        assert!(m.in_device_window(2 << 20) && m.in_device_window((2 << 20) + 4095));
        assert!(!m.in_device_window((2 << 20) + 4096) && !m.in_device_window(0));
        let base = m.host_base().expect("host base");
        assert_ne!(base, 0);
        assert_eq!(base % 4096, 0, "mem_base must be page aligned");
    }

    #[test]
    fn bad_sizes() {
        assert!(matches!(GuestMemory::new(0, 1), Err(MemoryError::BadSize(0))));
        assert!(matches!(GuestMemory::new(4097, 1), Err(MemoryError::BadSize(4097))));
        assert!(matches!(GuestMemory::new(4096, u64::MAX), Err(MemoryError::TooBig { .. })));
    }

    #[test]
    fn copy_in_and_out() {
        let m = mem();
        m.write(0x1000, b"hello").expect("write");
        let mut buf = [0u8; 5];
        m.read(0x1000, &mut buf).expect("read");
        assert_eq!(&buf, b"hello");
        // The last byte of the device window is reachable, one more is not.
        let end = m.total_size();
        m.write(end - 1, b"x").expect("last byte");
        let err = m.write(end - 1, b"xy").expect_err("past the end");
        assert!(err.to_string().contains("lies outside guest memory"), "{err}");
        assert!(m.read(u64::MAX, &mut buf).is_err());
        assert!(m.write(u64::MAX - 1, b"abc").is_err());
        m.write(0, b"").expect("empty write at 0");
    }

    #[test]
    fn ram_view_shares_the_mapping_and_stops_at_ram() {
        let m = mem();
        m.write(0x5000, b"shared").expect("write");
        let mut buf = [0u8; 6];
        m.ram().read_slice(&mut buf, GuestAddress(0x5000)).expect("read through the RAM view");
        assert_eq!(&buf, b"shared");
        m.ram().write_slice(b"back", GuestAddress(0x6000)).expect("write through the RAM view");
        let mut buf = [0u8; 4];
        m.read(0x6000, &mut buf).expect("read");
        assert_eq!(&buf, b"back");
        // The device window is outside the RAM view, inside the whole one.
        assert!(m.ram().write_slice(b"x", GuestAddress(m.mem_size())).is_err());
        assert!(m.all().write_slice(b"x", GuestAddress(m.mem_size())).is_ok());
    }

    #[test]
    fn zero_fill() {
        let m = mem();
        m.write(0x2000, &[0xAA; 0x3000]).expect("write");
        m.zero(0x2100, 0x2000).expect("zero");
        let mut buf = vec![0u8; 0x3000];
        m.read(0x2000, &mut buf).expect("read");
        assert!(buf[..0x100].iter().all(|&b| b == 0xAA));
        assert!(buf[0x100..0x2100].iter().all(|&b| b == 0));
        assert!(buf[0x2100..].iter().all(|&b| b == 0xAA));
        assert!(m.zero(m.total_size() - 1, 2).is_err());
        assert!(m.zero(1, u64::MAX).is_err());
    }

    #[test]
    fn cstr() {
        let m = mem();
        m.write(0x3000, b"hi there\0junk").expect("write");
        let s = m.read_cstr(0x3000, 4096).expect("read");
        assert_eq!(s, GuestStr { bytes: b"hi there".to_vec(), terminated: true });
        // Limited by `max`.
        let s = m.read_cstr(0x3000, 2).expect("read");
        assert_eq!(s, GuestStr { bytes: b"hi".to_vec(), terminated: false });
        // A string longer than one internal chunk.
        let long = vec![b'a'; 1000];
        m.write(0x4000, &long).expect("write");
        let s = m.read_cstr(0x4000, 4096).expect("read");
        assert_eq!(s, GuestStr { bytes: long, terminated: true });
        // Stops at the end of RAM, not in the device window.
        let end = m.mem_size();
        m.write(end - 3, b"abc").expect("write");
        m.write(end, b"def\0").expect("write device page");
        let s = m.read_cstr(end - 3, 4096).expect("read");
        assert_eq!(s, GuestStr { bytes: b"abc".to_vec(), terminated: false });
        // Outside RAM is an error.
        assert!(m.read_cstr(end, 10).is_err());
        assert!(m.read_cstr(u64::MAX, 10).is_err());
    }

    #[test]
    fn sizes_print_readably() {
        assert_eq!(Size(64 << 20).to_string(), "64 MiB");
        assert_eq!(Size(4 << 30).to_string(), "4 GiB");
        assert_eq!(Size(16 << 10).to_string(), "16 KiB");
        assert_eq!(Size(0x1234).to_string(), "0x1234 bytes");
    }
}
