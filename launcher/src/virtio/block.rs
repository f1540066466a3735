// SPDX-License-Identifier: GPL-2.0
//! virtio-blk (device ID 2) over a host file or block device:
//! `--disk path=FILE[,readonly=on][,direct=on][,id=NAME][,lock=off]`, or
//! the short forms `--disk FILE` and `--disk FILE,ro`; a comma in FILE is
//! written `,,`, as in QEMU's option lists.
//!
//! One request queue. Each request is a 16-byte device-readable header
//! (type, reserved, sector), data, and a device-writable status byte at the
//! very end. Reads and writes go to the backing [`Disk`] with positioned
//! I/O in bounded chunks (a request is at most 4 GiB, and each buffer was
//! checked to lie in guest RAM).
//!
//! **Cache mode** (virtio 1.2 §5.2.6.2, and Linux's `virtblk_get_cache_mode`):
//! a driver that negotiated `VIRTIO_BLK_F_FLUSH` gets a writeback cache,
//! and `VIRTIO_BLK_T_FLUSH` is `fdatasync`, so once a flush completes,
//! every write completed before it is on stable storage. A driver that did
//! not negotiate it gets writethrough: every write is `fdatasync`ed before
//! it completes. A failed `fdatasync` fails its request with
//! `VIRTIO_BLK_S_IOERR` and the device with DEVICE_NEEDS_RESET; and since
//! the kernel may have dropped the dirty pages ("fsyncgate"), every later
//! write or flush fails too, across resets, as QEMU's `werror=stop` would
//! have it.
//!
//! The disk's size comes from seeking to its end (a block device has no
//! length in `stat`); anything that is neither a regular file nor a block
//! device is refused. The image is locked with `flock`: shared for a
//! read-only disk, exclusive otherwise (as QEMU does), so that a second
//! launcher cannot write an image another one uses; `lock=off` skips it.
//! `direct=on` opens it `O_DIRECT` (no host page cache; buffers are
//! aligned, and a request that is not whole sectors fails).
//!
//! A read-only disk offers `VIRTIO_BLK_F_RO` and fails writes with
//! `VIRTIO_BLK_S_IOERR`, as it does accesses past the end of the disk. A
//! request without a header or a status byte is a broken driver, not an I/O
//! error: the device then needs a reset.

use std::alloc::Layout;
use std::fs::{File, OpenOptions};
use std::io::{self, Seek, SeekFrom};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, FileTypeExt, OpenOptionsExt};
use std::path::PathBuf;
use std::sync::atomic::Ordering;

use super::chain::Chain;
use super::{DeviceError, Events, Queues, VirtioDevice, VIRTIO_ID_BLOCK};

/// `VIRTIO_BLK_F_RO`: the disk is read-only.
pub const VIRTIO_BLK_F_RO: u64 = 1 << virtio_bindings::virtio_blk::VIRTIO_BLK_F_RO;
/// `VIRTIO_BLK_F_FLUSH`: the device takes flush requests.
pub const VIRTIO_BLK_F_FLUSH: u64 = 1 << virtio_bindings::virtio_blk::VIRTIO_BLK_F_FLUSH;

/// Request types.
pub const VIRTIO_BLK_T_IN: u32 = virtio_bindings::virtio_blk::VIRTIO_BLK_T_IN;
/// Write.
pub const VIRTIO_BLK_T_OUT: u32 = virtio_bindings::virtio_blk::VIRTIO_BLK_T_OUT;
/// Flush.
pub const VIRTIO_BLK_T_FLUSH: u32 = virtio_bindings::virtio_blk::VIRTIO_BLK_T_FLUSH;
/// Device ID string.
pub const VIRTIO_BLK_T_GET_ID: u32 = virtio_bindings::virtio_blk::VIRTIO_BLK_T_GET_ID;

// CAST (the three below): the status values are 0, 1 and 2.
/// Status: done.
pub const VIRTIO_BLK_S_OK: u8 = virtio_bindings::virtio_blk::VIRTIO_BLK_S_OK as u8;
/// Status: I/O error (also: read-only, out of range).
pub const VIRTIO_BLK_S_IOERR: u8 = virtio_bindings::virtio_blk::VIRTIO_BLK_S_IOERR as u8;
/// Status: unknown request.
pub const VIRTIO_BLK_S_UNSUPP: u8 = virtio_bindings::virtio_blk::VIRTIO_BLK_S_UNSUPP as u8;

/// Bytes of a sector.
pub const SECTOR: u64 = 512;
/// Bytes of the ID string.
pub const ID_BYTES: usize = virtio_bindings::virtio_blk::VIRTIO_BLK_ID_BYTES as usize;
/// Bytes copied per step.
const CHUNK: usize = 1 << 20;
/// Alignment of the buffers for `direct=on`.
const DIRECT_ALIGN: usize = 4096;

/// What `--disk` asked for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DiskOptions {
    /// The backing file or block device.
    pub path: PathBuf,
    /// Read-only.
    pub read_only: bool,
    /// `O_DIRECT`: bypass the host's page cache.
    pub direct: bool,
    /// The ID string the guest reads (`VIRTIO_BLK_T_GET_ID`); default
    /// `lguest-blkN`.
    pub id: Option<String>,
    /// Take the advisory lock (the default).
    pub lock: bool,
}

impl DiskOptions {
    /// A read-write, locked disk on `path` with no other options.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self { path: path.into(), read_only: false, direct: false, id: None, lock: true }
    }
}

/// `on`/`off` (also `true`/`false`) for option `key`.
pub fn on_off(key: &str, value: &str) -> Result<bool, String> {
    match value {
        "on" | "true" => Ok(true),
        "off" | "false" => Ok(false),
        _ => Err(format!("{key}={value:?}: expected on or off")),
    }
}

/// Splits an option list at its commas, QEMU's way: a doubled comma `,,`
/// is a literal comma inside an item (so `path=a,,b.img,ro` is `path=a,b.img`
/// and `ro`).
pub fn split_options(s: &str) -> Vec<String> {
    let mut parts = Vec::new();
    let mut item = String::new();
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            ',' if chars.next_if_eq(&',').is_some() => item.push(','),
            ',' => parts.push(std::mem::take(&mut item)),
            c => item.push(c),
        }
    }
    parts.push(item);
    parts
}

impl std::str::FromStr for DiskOptions {
    type Err = String;

    /// `path=FILE,readonly=on|off,direct=on|off,id=NAME,lock=on|off` in any
    /// order, or `FILE[,KEY=VALUE...]` and `FILE,ro` (kvmtool's form). A
    /// comma in FILE is written `,,` ([`split_options`]).
    fn from_str(s: &str) -> Result<Self, String> {
        const USAGE: &str =
            "expected path=FILE[,readonly=on][,direct=on][,id=NAME][,lock=off] or FILE[,ro], with ,, for a comma in FILE";
        let mut opts = Self::new("");
        let mut path = None;
        let parts = split_options(s);
        for (i, part) in parts.iter().map(String::as_str).enumerate() {
            match part.split_once('=') {
                Some(("path", p)) => path = Some(p),
                Some(("readonly", v)) => opts.read_only = on_off("readonly", v)?,
                Some(("direct", v)) => opts.direct = on_off("direct", v)?,
                Some(("lock", v)) => opts.lock = on_off("lock", v)?,
                Some(("id", v)) => {
                    if v.is_empty() || v.len() > ID_BYTES || !v.bytes().all(|b| b.is_ascii_graphic()) {
                        return Err(format!("id={v:?}: 1 to {ID_BYTES} printable ASCII characters"));
                    }
                    opts.id = Some(v.to_owned());
                }
                None if part == "ro" && i > 0 => opts.read_only = true,
                None if i == 0 => path = Some(part),
                _ => return Err(format!("unknown disk option {part:?} ({USAGE})")),
            }
        }
        match path {
            Some(p) if !p.is_empty() => opts.path = PathBuf::from(p),
            _ => return Err(format!("no disk path ({USAGE})")),
        }
        Ok(opts)
    }
}

/// What a block device needs of its backing store (a file; a recording
/// fake in tests).
pub trait Disk: Send {
    /// Reads exactly `buf.len()` bytes at `offset`.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;
    /// Writes all of `buf` at `offset`.
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()>;
    /// `fdatasync`.
    fn sync_data(&self) -> io::Result<()>;
}

impl Disk for File {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.read_exact_at(buf, offset)
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.write_all_at(buf, offset)
    }

    fn sync_data(&self) -> io::Result<()> {
        File::sync_data(self)
    }
}

/// A zeroed buffer aligned for `O_DIRECT`.
struct Buffer {
    ptr: std::ptr::NonNull<u8>,
    len: usize,
}

// SAFETY: the buffer is plain bytes owned by this value alone.
unsafe impl Send for Buffer {}

impl Buffer {
    fn new(len: usize) -> Self {
        let len = len.max(1);
        // The alignment is a power of two and the length is at most CHUNK,
        // so the layout is valid.
        let layout = Layout::from_size_align(len, DIRECT_ALIGN).unwrap_or(Layout::new::<u8>());
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        let Some(ptr) = std::ptr::NonNull::new(ptr) else { std::alloc::handle_alloc_error(layout) };
        Self { ptr, len }
    }

    fn as_mut(&mut self) -> &mut [u8] {
        // SAFETY: `ptr` is a live allocation of `len` initialised (zeroed)
        // bytes that only this value, borrowed mutably here, reaches.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        let layout = Layout::from_size_align(self.len, DIRECT_ALIGN).unwrap_or(Layout::new::<u8>());
        // SAFETY: allocated in `new` with this same layout.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), layout) };
    }
}

/// Why a disk cannot be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// open(2) failed.
    #[error("cannot open {path}{}", if *.direct { " with direct=on (O_DIRECT; the file system may not support it)" } else { "" })]
    Open {
        /// The path.
        path: String,
        /// Whether O_DIRECT was asked for.
        direct: bool,
        /// The error.
        source: io::Error,
    },
    /// Neither a regular file nor a block device.
    #[error("{0} is neither a regular file nor a block device")]
    NotADisk(String),
    /// Another process holds the lock.
    #[error(
        "{path} is in use: another process (another lguest?) holds {} lock on it; lock=off shares it anyway",
        if *.read_only { "an exclusive" } else { "a" }
    )]
    Locked {
        /// The path.
        path: String,
        /// This disk is read-only (it wanted a shared lock).
        read_only: bool,
    },
    /// Another error.
    #[error("{what} {path}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The path.
        path: String,
        /// The error.
        source: io::Error,
    },
}

/// A block device.
pub struct Block {
    disk: Box<dyn Disk>,
    name: String,
    read_only: bool,
    direct: bool,
    /// Bytes of the disk, a whole number of sectors.
    size: u64,
    id: [u8; ID_BYTES],
    /// The driver negotiated FLUSH: writeback; otherwise writethrough.
    writeback: bool,
    /// An fdatasync failed: every later write and flush fails.
    sync_failed: bool,
    /// The sync error of the current request, to fail the device with.
    pending_failure: Option<io::Error>,
}

impl std::fmt::Debug for Block {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Block").field("name", &self.name).field("size", &self.size).finish_non_exhaustive()
    }
}

/// `flock(fd, how | LOCK_NB)`; false if another holds a conflicting lock.
fn flock(file: &File, how: libc::c_int) -> io::Result<bool> {
    // SAFETY: flock only takes the descriptor number, of a live File.
    if unsafe { libc::flock(file.as_raw_fd(), how | libc::LOCK_NB) } == 0 {
        return Ok(true);
    }
    let e = io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
        Ok(false)
    } else {
        Err(e)
    }
}

impl Block {
    /// Opens the disk `opts` as device number `n`.
    pub fn open(opts: &DiskOptions, n: usize) -> Result<Self, OpenError> {
        let path = opts.path.display().to_string();
        let io = |what: &'static str| {
            let path = path.clone();
            move |source| OpenError::Io { what, path, source }
        };
        let mut file = OpenOptions::new()
            .read(true)
            .write(!opts.read_only)
            .custom_flags(libc::O_CLOEXEC | if opts.direct { libc::O_DIRECT } else { 0 })
            .open(&opts.path)
            .map_err(|source| OpenError::Open { path: path.clone(), direct: opts.direct, source })?;
        let kind = file.metadata().map_err(io("cannot stat"))?.file_type();
        if !kind.is_file() && !kind.is_block_device() {
            return Err(OpenError::NotADisk(path));
        }
        if opts.lock {
            let how = if opts.read_only { libc::LOCK_SH } else { libc::LOCK_EX };
            if !flock(&file, how).map_err(io("cannot lock"))? {
                return Err(OpenError::Locked { path, read_only: opts.read_only });
            }
        }
        // A block device's stat size is 0: its size is where its end is.
        let len = file.seek(SeekFrom::End(0)).map_err(io("cannot find the size of"))?;
        let mut dev = Self::new(Box::new(file), len, &path, opts.read_only, n);
        dev.direct = opts.direct;
        if let Some(id) = &opts.id {
            dev.id = [0; ID_BYTES];
            dev.id[..id.len()].copy_from_slice(id.as_bytes());
            dev.name = format!("blk{n} {id} ({path}{})", if opts.read_only { ", ro" } else { "" });
        }
        Ok(dev)
    }

    /// A block device of `len` bytes on `disk`.
    pub fn new(disk: Box<dyn Disk>, len: u64, path: &str, read_only: bool, n: usize) -> Self {
        let size = len - len % SECTOR;
        if size != len {
            log::warn!("{path}: {len} bytes are not whole sectors; the last {} are left out", len - size);
        }
        let mut id = [0u8; ID_BYTES];
        let text = format!("lguest-blk{n}");
        id[..text.len().min(ID_BYTES)].copy_from_slice(&text.as_bytes()[..text.len().min(ID_BYTES)]);
        let name = format!("blk{n} ({path}{})", if read_only { ", ro" } else { "" });
        Self {
            disk,
            name,
            read_only,
            direct: false,
            size,
            id,
            writeback: false,
            sync_failed: false,
            pending_failure: None,
        }
    }

    /// `fdatasync`; a failure is remembered for good and fails the device.
    fn sync(&mut self) -> bool {
        match self.disk.sync_data() {
            Ok(()) => true,
            Err(e) => {
                log::warn!("{}: fdatasync: {e}; every later write and flush fails", self.name);
                self.sync_failed = true;
                self.pending_failure = Some(e);
                false
            }
        }
    }

    /// Carries out one request; returns (status, bytes written to the guest
    /// before the status byte).
    fn request(&mut self, qs: &Queues<'_>, chain: &Chain) -> Result<(u8, u64), DeviceError> {
        let mem = qs.mem();
        let bad = |why: &str| DeviceError::Request { queue: 0, why: why.into() };
        if chain.readable_len() < 16 {
            return Err(bad("a request without a 16-byte header"));
        }
        let room = chain.writable_len();
        if room == 0 {
            return Err(bad("a request without a status byte"));
        }
        let mut reader = chain.reader();
        let mut header = [0u8; 16];
        reader.read(mem, &mut header);
        let kind = u32::from_le_bytes([header[0], header[1], header[2], header[3]]);
        let mut s = [0u8; 8];
        s.copy_from_slice(&header[8..]);
        let sector = u64::from_le_bytes(s);
        let mut writer = chain.writer();
        let data_in = room - 1;
        let data_out = chain.readable_len() - 16;
        let range_ok =
            |len: u64| sector.checked_mul(SECTOR).and_then(|o| o.checked_add(len)).is_some_and(|e| e <= self.size);
        match kind {
            VIRTIO_BLK_T_IN => {
                if !range_ok(data_in) {
                    return Ok((VIRTIO_BLK_S_IOERR, 0));
                }
                if self.direct && !data_in.is_multiple_of(SECTOR) {
                    return Ok((VIRTIO_BLK_S_IOERR, 0));
                }
                let mut buf = Buffer::new(CHUNK.min(usize::try_from(data_in).unwrap_or(CHUNK)));
                let buf = buf.as_mut();
                let mut off = sector * SECTOR;
                let mut left = data_in;
                while left > 0 {
                    if qs.stopping() {
                        return Ok((VIRTIO_BLK_S_IOERR, writer.written()));
                    }
                    // CAST: min with a usize fits usize.
                    let n = left.min(buf.len() as u64) as usize;
                    if self.disk.read_at(&mut buf[..n], off).is_err() {
                        return Ok((VIRTIO_BLK_S_IOERR, writer.written()));
                    }
                    writer.write(mem, &buf[..n]);
                    off += n as u64;
                    left -= n as u64;
                }
                Ok((VIRTIO_BLK_S_OK, writer.written()))
            }
            VIRTIO_BLK_T_OUT => {
                if self.read_only || self.sync_failed || !range_ok(data_out) {
                    return Ok((VIRTIO_BLK_S_IOERR, 0));
                }
                if self.direct && !data_out.is_multiple_of(SECTOR) {
                    return Ok((VIRTIO_BLK_S_IOERR, 0));
                }
                let mut buf = Buffer::new(CHUNK.min(usize::try_from(data_out).unwrap_or(CHUNK)));
                let buf = buf.as_mut();
                let mut off = sector * SECTOR;
                loop {
                    if qs.stopping() {
                        return Ok((VIRTIO_BLK_S_IOERR, 0));
                    }
                    let n = reader.read(mem, buf);
                    if n == 0 {
                        break;
                    }
                    if self.disk.write_at(&buf[..n], off).is_err() {
                        return Ok((VIRTIO_BLK_S_IOERR, 0));
                    }
                    off += n as u64;
                }
                // Writethrough: on stable storage before it completes.
                if !self.writeback && !self.sync() {
                    return Ok((VIRTIO_BLK_S_IOERR, 0));
                }
                qs.stats().queues[0].bytes.fetch_add(data_out, Ordering::Relaxed);
                Ok((VIRTIO_BLK_S_OK, 0))
            }
            VIRTIO_BLK_T_FLUSH => {
                if self.read_only {
                    return Ok((VIRTIO_BLK_S_OK, 0));
                }
                if self.sync_failed || !self.sync() {
                    return Ok((VIRTIO_BLK_S_IOERR, 0));
                }
                Ok((VIRTIO_BLK_S_OK, 0))
            }
            VIRTIO_BLK_T_GET_ID => {
                // CAST: min with ID_BYTES fits usize.
                let n = data_in.min(ID_BYTES as u64) as usize;
                writer.write(mem, &self.id[..n]);
                Ok((VIRTIO_BLK_S_OK, writer.written()))
            }
            _ => Ok((VIRTIO_BLK_S_UNSUPP, 0)),
        }
    }
}

/// Writes `status` into the last writable byte of `chain`.
fn put_status(qs: &Queues<'_>, chain: &Chain, status: u8) {
    if let Some(last) = chain.writable.iter().rev().find(|b| b.len > 0) {
        use vm_memory::Bytes;
        // The range was checked by the chain walk, so this cannot fail.
        let _ = qs.mem().write_slice(&[status], vm_memory::GuestAddress(last.addr + u64::from(last.len) - 1));
    }
}

impl VirtioDevice for Block {
    fn device_type(&self) -> u32 {
        VIRTIO_ID_BLOCK
    }

    fn name(&self) -> String {
        self.name.clone()
    }

    fn features(&self) -> u64 {
        VIRTIO_BLK_F_FLUSH | if self.read_only { VIRTIO_BLK_F_RO } else { 0 }
    }

    fn queue_max(&self) -> Vec<u16> {
        vec![128]
    }

    fn config(&self) -> Vec<u8> {
        // struct virtio_blk_config: capacity in 512-byte sectors first.
        (self.size / SECTOR).to_le_bytes().to_vec()
    }

    fn activate(&mut self, features: u64) -> Result<(), DeviceError> {
        self.writeback = features & VIRTIO_BLK_F_FLUSH != 0;
        log::info!("{}: {}", self.name, if self.writeback { "writeback (FLUSH negotiated)" } else { "writethrough" });
        Ok(())
    }

    fn process(&mut self, qs: &mut Queues<'_>, events: &Events) -> Result<(), DeviceError> {
        if !events.queue(0) {
            return Ok(());
        }
        loop {
            qs.disable_notification(0)?;
            while let Some(chain) = qs.pop(0)? {
                if qs.stopping() {
                    qs.unpop(0);
                    break;
                }
                let (status, data) = self.request(qs, &chain)?;
                put_status(qs, &chain, status);
                if status != VIRTIO_BLK_S_OK {
                    qs.stats().dropped.fetch_add(1, Ordering::Relaxed);
                }
                // CAST: data + 1 <= the chain's writable bytes < 4 GiB.
                qs.add_used(0, chain.head, (data + 1) as u32)?;
                qs.stats().queues[0].count(data);
                if let Some(source) = self.pending_failure.take() {
                    // The request got its IOERR; now the device fails.
                    qs.notify(0)?;
                    return Err(DeviceError::Host { what: "fdatasync failed", source });
                }
            }
            if qs.stopping() || !qs.enable_notification(0)? {
                break;
            }
        }
        qs.notify(0)?;
        Ok(())
    }

    fn stats(&self, s: &super::DeviceStats) -> String {
        format!("  {} requests failed\n", s.dropped.load(Ordering::Relaxed))
    }
}

impl Drop for Block {
    fn drop(&mut self) {
        if !self.read_only && !self.sync_failed {
            if let Err(e) = self.disk.sync_data() {
                log::warn!("{}: fdatasync at exit: {e}", self.name);
            }
        }
    }
}
