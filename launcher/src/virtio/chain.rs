// SPDX-License-Identifier: GPL-2.0
//! Walking one descriptor chain, trusting nothing.
//!
//! `virtio-queue` pops chain heads off the available ring, but its own chain
//! iterator ends a chain quietly on a loop, an index out of range or an
//! unreadable descriptor, which would hide a broken driver. So the launcher
//! walks each chain itself, once, into a [`Chain`]: a list of buffers whose
//! every byte is checked to lie in guest RAM, readable ones first, then
//! writable ones. Any rule broken is a [`ChainError`], which the caller turns
//! into `DEVICE_NEEDS_RESET`. Devices then copy through [`ChainReader`] and
//! [`ChainWriter`], which only touch those checked ranges.

use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryMmap};

// CAST (the three below): virtio-bindings' flags are 1, 2 and 4.
/// `VIRTQ_DESC_F_NEXT`: the chain continues at `next`.
pub const VIRTQ_DESC_F_NEXT: u16 = virtio_bindings::virtio_ring::VRING_DESC_F_NEXT as u16;
/// `VIRTQ_DESC_F_WRITE`: the buffer is device-writable.
pub const VIRTQ_DESC_F_WRITE: u16 = virtio_bindings::virtio_ring::VRING_DESC_F_WRITE as u16;
/// `VIRTQ_DESC_F_INDIRECT`: the buffer is a table of descriptors.
pub const VIRTQ_DESC_F_INDIRECT: u16 = virtio_bindings::virtio_ring::VRING_DESC_F_INDIRECT as u16;

/// The most descriptors an indirect table may hold.
pub const MAX_INDIRECT: u32 = 1024;

/// Bytes of one split-ring descriptor.
const DESC_SIZE: u64 = 16;

/// How a descriptor chain broke the rules.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ChainError {
    /// A descriptor index is not below the table's size.
    #[error("descriptor index {index} is outside a table of {size}")]
    IndexOutOfRange {
        /// The index.
        index: u16,
        /// The table size.
        size: u32,
    },
    /// The chain is longer than its table: it loops.
    #[error("the chain loops (more than {0} descriptors)")]
    Loop(u32),
    /// A descriptor table or buffer is not inside guest RAM.
    #[error("buffer [{addr:#x}, +{len:#x}) is outside guest RAM")]
    OutOfRange {
        /// Its guest-physical address.
        addr: u64,
        /// Its length.
        len: u64,
    },
    /// A device-readable buffer follows a device-writable one.
    #[error("a device-readable buffer follows a device-writable one")]
    ReadableAfterWritable,
    /// An indirect table inside an indirect table, or with `NEXT` set.
    #[error("bad indirect descriptor: {0}")]
    Indirect(&'static str),
    /// The buffers add up to more than 4 GiB (virtio 1.2 §2.7.5.2).
    #[error("the chain is longer than 4 GiB")]
    TooLong,
}

/// One buffer of a chain, inside guest RAM.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Buf {
    /// Guest-physical address.
    pub addr: u64,
    /// Bytes.
    pub len: u32,
}

/// A checked descriptor chain: device-readable buffers, then writable ones.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Chain {
    /// The head index, for the used ring.
    pub head: u16,
    /// Device-readable buffers, in order.
    pub readable: Vec<Buf>,
    /// Device-writable buffers, in order.
    pub writable: Vec<Buf>,
}

fn total(bufs: &[Buf]) -> u64 {
    bufs.iter().map(|b| u64::from(b.len)).sum()
}

impl Chain {
    /// Bytes the device may read.
    pub fn readable_len(&self) -> u64 {
        total(&self.readable)
    }

    /// Bytes the device may write.
    pub fn writable_len(&self) -> u64 {
        total(&self.writable)
    }

    /// A cursor over the readable buffers.
    pub fn reader(&self) -> ChainReader<'_> {
        ChainReader { pos: Cursor { bufs: &self.readable, at: 0, off: 0 } }
    }

    /// A cursor over the writable buffers.
    pub fn writer(&self) -> ChainWriter<'_> {
        ChainWriter { pos: Cursor { bufs: &self.writable, at: 0, off: 0 }, written: 0 }
    }
}

/// One raw descriptor, as read (once) from guest memory.
#[derive(Clone, Copy, Debug)]
struct RawDesc {
    addr: u64,
    len: u32,
    flags: u16,
    next: u16,
}

fn read_desc(mem: &GuestMemoryMmap, table: u64, index: u16) -> Result<RawDesc, ChainError> {
    let addr = table + u64::from(index) * DESC_SIZE;
    let mut raw = [0u8; DESC_SIZE as usize];
    mem.read_slice(&mut raw, GuestAddress(addr)).map_err(|_| ChainError::OutOfRange { addr, len: DESC_SIZE })?;
    let [a0, a1, a2, a3, a4, a5, a6, a7, l0, l1, l2, l3, f0, f1, n0, n1] = raw;
    Ok(RawDesc {
        addr: u64::from_le_bytes([a0, a1, a2, a3, a4, a5, a6, a7]),
        len: u32::from_le_bytes([l0, l1, l2, l3]),
        flags: u16::from_le_bytes([f0, f1]),
        next: u16::from_le_bytes([n0, n1]),
    })
}

fn in_ram(mem: &GuestMemoryMmap, addr: u64, len: u64) -> bool {
    if len == 0 {
        return true;
    }
    match usize::try_from(len) {
        Ok(l) => addr.checked_add(len).is_some() && mem.check_range(GuestAddress(addr), l),
        Err(_) => false,
    }
}

/// Walks the chain starting at `head` of the descriptor table at
/// `desc_table` (of `size` entries, already checked to lie in RAM).
pub fn walk(mem: &GuestMemoryMmap, desc_table: u64, size: u16, head: u16) -> Result<Chain, ChainError> {
    let mut chain = Chain { head, ..Chain::default() };
    let mut table = desc_table;
    let mut table_size = u32::from(size);
    let mut index = head;
    let mut indirect = false;
    let mut seen = 0u32;
    let mut bytes = 0u64;
    loop {
        if u32::from(index) >= table_size {
            return Err(ChainError::IndexOutOfRange { index, size: table_size });
        }
        seen += 1;
        if seen > table_size {
            return Err(ChainError::Loop(table_size));
        }
        let desc = read_desc(mem, table, index)?;
        if desc.flags & VIRTQ_DESC_F_INDIRECT != 0 {
            if indirect {
                return Err(ChainError::Indirect("an indirect table inside an indirect table"));
            }
            if desc.flags & VIRTQ_DESC_F_NEXT != 0 {
                return Err(ChainError::Indirect("INDIRECT together with NEXT"));
            }
            let entries = desc.len / DESC_SIZE as u32;
            if desc.len == 0 || !desc.len.is_multiple_of(DESC_SIZE as u32) || entries > MAX_INDIRECT {
                return Err(ChainError::Indirect("table length is not a multiple of 16 in [16, 16 KiB]"));
            }
            if !in_ram(mem, desc.addr, u64::from(desc.len)) || !desc.addr.is_multiple_of(DESC_SIZE) {
                return Err(ChainError::OutOfRange { addr: desc.addr, len: u64::from(desc.len) });
            }
            indirect = true;
            table = desc.addr;
            table_size = entries;
            index = 0;
            seen = 0;
            continue;
        }
        if !in_ram(mem, desc.addr, u64::from(desc.len)) {
            return Err(ChainError::OutOfRange { addr: desc.addr, len: u64::from(desc.len) });
        }
        bytes += u64::from(desc.len);
        if bytes > u64::from(u32::MAX) {
            return Err(ChainError::TooLong);
        }
        let buf = Buf { addr: desc.addr, len: desc.len };
        if desc.flags & VIRTQ_DESC_F_WRITE != 0 {
            chain.writable.push(buf);
        } else if chain.writable.is_empty() {
            chain.readable.push(buf);
        } else {
            return Err(ChainError::ReadableAfterWritable);
        }
        if desc.flags & VIRTQ_DESC_F_NEXT == 0 {
            return Ok(chain);
        }
        index = desc.next;
    }
}

/// A position in a list of buffers, for [`ChainReader`] and [`ChainWriter`].
#[derive(Debug)]
struct Cursor<'c> {
    bufs: &'c [Buf],
    at: usize,
    off: u32,
}

impl Cursor<'_> {
    /// The next piece of at most `max` bytes (a run inside one buffer), and
    /// moves past it; `None` at the end.
    fn next(&mut self, max: usize) -> Option<(GuestAddress, usize)> {
        loop {
            let buf = self.bufs.get(self.at)?;
            // CAST: u32 to usize is lossless on 64-bit hosts.
            let left = (buf.len - self.off) as usize;
            if left == 0 {
                self.at += 1;
                self.off = 0;
                continue;
            }
            let n = left.min(max);
            let addr = GuestAddress(buf.addr + u64::from(self.off));
            // CAST: n <= left, which came from a u32.
            self.off += n as u32;
            return Some((addr, n));
        }
    }

    /// Bytes left from here to the end.
    fn left(&self) -> u64 {
        self.bufs[self.at.min(self.bufs.len())..].iter().map(|b| u64::from(b.len)).sum::<u64>() - u64::from(self.off)
    }
}

/// Reads the device-readable part of a chain in order.
#[derive(Debug)]
pub struct ChainReader<'c> {
    pos: Cursor<'c>,
}

impl ChainReader<'_> {
    /// Copies up to `out.len()` bytes; returns how many (0 at the end).
    pub fn read(&mut self, mem: &GuestMemoryMmap, out: &mut [u8]) -> usize {
        let mut done = 0;
        while done < out.len() {
            let Some((addr, n)) = self.pos.next(out.len() - done) else { break };
            // The range was checked by `walk`; a failure cannot happen, and
            // would only leave zeroes in `out`.
            if mem.read_slice(&mut out[done..done + n], addr).is_err() {
                out[done..done + n].fill(0);
            }
            done += n;
        }
        done
    }

    /// Reads everything that is left, up to `max` bytes.
    pub fn read_to_vec(&mut self, mem: &GuestMemoryMmap, max: usize) -> Vec<u8> {
        // CAST: min with a usize fits usize.
        let mut v = vec![0u8; self.pos.left().min(max as u64) as usize];
        let n = self.read(mem, &mut v);
        v.truncate(n);
        v
    }
}

/// Writes the device-writable part of a chain in order.
#[derive(Debug)]
pub struct ChainWriter<'c> {
    pos: Cursor<'c>,
    written: u64,
}

impl ChainWriter<'_> {
    /// Copies as much of `data` as fits; returns how many bytes.
    pub fn write(&mut self, mem: &GuestMemoryMmap, data: &[u8]) -> usize {
        let mut done = 0;
        while done < data.len() {
            let Some((addr, n)) = self.pos.next(data.len() - done) else { break };
            // The range was checked by `walk`, so this cannot fail.
            let _ = mem.write_slice(&data[done..done + n], addr);
            done += n;
        }
        self.written += done as u64;
        done
    }

    /// Bytes written so far (the used length).
    pub fn written(&self) -> u64 {
        self.written
    }
}
