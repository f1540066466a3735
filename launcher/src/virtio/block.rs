// SPDX-License-Identifier: GPL-2.0
//! virtio-blk (device ID 2) over a host file: `--disk FILE[,ro]`.
//!
//! One request queue. Each request is a 16-byte device-readable header
//! (type, reserved, sector), data, and a device-writable status byte at the
//! very end. Reads and writes go straight to the file with `pread`/`pwrite`
//! in bounded chunks (a request is at most 4 GiB, and each buffer was
//! checked to lie in guest RAM); `VIRTIO_BLK_T_FLUSH` is `fdatasync`, so once
//! a flush completes, every write completed before it is on stable storage.
//! A read-only disk offers `VIRTIO_BLK_F_RO` and fails writes with
//! `VIRTIO_BLK_S_IOERR`, as it does accesses past the end of the disk. A
//! request without a header or a status byte is a broken driver, not an I/O
//! error: the device then needs a reset.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

use super::chain::Chain;
use super::{DeviceError, Events, Queues, VirtioDevice, VIRTIO_ID_BLOCK};

/// `VIRTIO_BLK_F_RO`: the disk is read-only.
pub const VIRTIO_BLK_F_RO: u64 = 1 << 5;
/// `VIRTIO_BLK_F_FLUSH`: the device takes flush requests.
pub const VIRTIO_BLK_F_FLUSH: u64 = 1 << 9;

/// Request types.
pub const VIRTIO_BLK_T_IN: u32 = 0;
/// Write.
pub const VIRTIO_BLK_T_OUT: u32 = 1;
/// Flush.
pub const VIRTIO_BLK_T_FLUSH: u32 = 4;
/// Device ID string.
pub const VIRTIO_BLK_T_GET_ID: u32 = 8;

/// Status: done.
pub const VIRTIO_BLK_S_OK: u8 = 0;
/// Status: I/O error (also: read-only, out of range).
pub const VIRTIO_BLK_S_IOERR: u8 = 1;
/// Status: unknown request.
pub const VIRTIO_BLK_S_UNSUPP: u8 = 2;

/// Bytes of a sector.
pub const SECTOR: u64 = 512;
/// Bytes of the ID string.
const ID_BYTES: usize = 20;
/// Bytes copied per step.
const CHUNK: usize = 1 << 20;

/// What `--disk` asked for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DiskOptions {
    /// The backing file.
    pub path: PathBuf,
    /// Read-only.
    pub read_only: bool,
}

impl std::str::FromStr for DiskOptions {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let (path, rest) = match s.split_once(',') {
            Some((p, r)) => (p, Some(r)),
            None => (s, None),
        };
        if path.is_empty() {
            return Err("expected FILE[,ro]".into());
        }
        let read_only = match rest {
            None => false,
            Some("ro") => true,
            Some(other) => return Err(format!("unknown disk option {other:?} (expected ro)")),
        };
        Ok(Self { path: PathBuf::from(path), read_only })
    }
}

/// A block device.
#[derive(Debug)]
pub struct Block {
    file: File,
    name: String,
    read_only: bool,
    /// Bytes of the disk, a whole number of sectors.
    size: u64,
    id: [u8; ID_BYTES],
}

impl Block {
    /// Opens the disk `opts` as device number `n`.
    pub fn open(opts: &DiskOptions, n: usize) -> std::io::Result<Self> {
        let file = OpenOptions::new().read(true).write(!opts.read_only).open(&opts.path)?;
        Self::new(file, &opts.path, opts.read_only, n)
    }

    /// A block device on `file`.
    pub fn new(file: File, path: &Path, read_only: bool, n: usize) -> std::io::Result<Self> {
        let len = file.metadata()?.len();
        let size = len - len % SECTOR;
        if size != len {
            log::warn!("{}: {} bytes are not whole sectors; the last {} are left out", path.display(), len, len - size);
        }
        let mut id = [0u8; ID_BYTES];
        let text = format!("lguest-blk{n}");
        id[..text.len().min(ID_BYTES)].copy_from_slice(&text.as_bytes()[..text.len().min(ID_BYTES)]);
        let name = format!("blk{n} ({}{})", path.display(), if read_only { ", ro" } else { "" });
        Ok(Self { file, name, read_only, size, id })
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
                let mut buf = vec![0u8; CHUNK.min(usize::try_from(data_in).unwrap_or(CHUNK))];
                let mut off = sector * SECTOR;
                let mut left = data_in;
                while left > 0 {
                    if qs.stopping() {
                        return Ok((VIRTIO_BLK_S_IOERR, writer.written()));
                    }
                    // CAST: min with a usize fits usize.
                    let n = left.min(buf.len() as u64) as usize;
                    if self.file.read_exact_at(&mut buf[..n], off).is_err() {
                        return Ok((VIRTIO_BLK_S_IOERR, writer.written()));
                    }
                    writer.write(mem, &buf[..n]);
                    off += n as u64;
                    left -= n as u64;
                }
                Ok((VIRTIO_BLK_S_OK, writer.written()))
            }
            VIRTIO_BLK_T_OUT => {
                if self.read_only || !range_ok(data_out) {
                    return Ok((VIRTIO_BLK_S_IOERR, 0));
                }
                let mut buf = vec![0u8; CHUNK.min(usize::try_from(data_out).unwrap_or(CHUNK))];
                let mut off = sector * SECTOR;
                loop {
                    if qs.stopping() {
                        return Ok((VIRTIO_BLK_S_IOERR, 0));
                    }
                    let n = reader.read(mem, &mut buf);
                    if n == 0 {
                        break;
                    }
                    if self.file.write_all_at(&buf[..n], off).is_err() {
                        return Ok((VIRTIO_BLK_S_IOERR, 0));
                    }
                    off += n as u64;
                }
                qs.stats().queues[0].bytes.fetch_add(data_out, Ordering::Relaxed);
                Ok((VIRTIO_BLK_S_OK, 0))
            }
            VIRTIO_BLK_T_FLUSH => {
                if self.read_only {
                    return Ok((VIRTIO_BLK_S_OK, 0));
                }
                match self.file.sync_data() {
                    Ok(()) => Ok((VIRTIO_BLK_S_OK, 0)),
                    Err(e) => {
                        log::warn!("{}: fdatasync: {e}", self.name);
                        Ok((VIRTIO_BLK_S_IOERR, 0))
                    }
                }
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
        if !self.read_only {
            if let Err(e) = self.file.sync_data() {
                log::warn!("{}: fdatasync at exit: {e}", self.name);
            }
        }
    }
}
