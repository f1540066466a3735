// SPDX-License-Identifier: GPL-2.0
//! Test helpers: a driver's side of the lguest bus and of split rings,
//! written by hand into guest memory, so that tests can also build rings a
//! real driver never would.

use std::mem::offset_of;

use lguest_abi::bus::{LguestBus, LguestDeviceDesc, LguestVqConfig};
use lguest_abi::bus::{
    VIRTIO_STATUS_ACKNOWLEDGE, VIRTIO_STATUS_DRIVER, VIRTIO_STATUS_DRIVER_OK, VIRTIO_STATUS_FEATURES_OK,
};

use super::bus::Bus;
use crate::memory::GuestMemory;

/// A split ring in guest memory, from the driver's side.
#[derive(Clone, Debug)]
pub struct TestRing {
    /// Descriptor table address.
    pub desc: u64,
    /// Available ring address.
    pub avail: u64,
    /// Used ring address.
    pub used: u64,
    /// Queue size.
    pub size: u16,
    next_desc: u16,
    avail_idx: u16,
}

fn w16(mem: &GuestMemory, addr: u64, v: u16) {
    mem.write(addr, &v.to_le_bytes()).expect("write u16");
}

fn r16(mem: &GuestMemory, addr: u64) -> u16 {
    let mut b = [0u8; 2];
    mem.read(addr, &mut b).expect("read u16");
    u16::from_le_bytes(b)
}

fn r32(mem: &GuestMemory, addr: u64) -> u32 {
    let mut b = [0u8; 4];
    mem.read(addr, &mut b).expect("read u32");
    u32::from_le_bytes(b)
}

impl TestRing {
    /// A ring of `size` entries at `base` (page aligned), zeroed.
    pub fn new(mem: &GuestMemory, base: u64, size: u16) -> Self {
        let n = u64::from(size);
        let avail = base + 16 * n;
        let used = (avail + 6 + 2 * n + 4095) & !4095;
        mem.zero(base, used + 6 + 8 * n - base).expect("zero ring");
        Self { desc: base, avail, used, size, next_desc: 0, avail_idx: 0 }
    }

    /// Writes descriptor `i` raw.
    pub fn set_desc(&self, mem: &GuestMemory, i: u16, addr: u64, len: u32, flags: u16, next: u16) {
        let at = self.desc + 16 * u64::from(i);
        let mut b = [0u8; 16];
        b[..8].copy_from_slice(&addr.to_le_bytes());
        b[8..12].copy_from_slice(&len.to_le_bytes());
        b[12..14].copy_from_slice(&flags.to_le_bytes());
        b[14..].copy_from_slice(&next.to_le_bytes());
        mem.write(at, &b).expect("write descriptor");
    }

    /// Builds a chain of `(addr, len, device_writable)` buffers and makes
    /// it available; returns its head.
    pub fn add_chain(&mut self, mem: &GuestMemory, bufs: &[(u64, u32, bool)]) -> u16 {
        let head = self.next_desc;
        for (k, &(addr, len, write)) in bufs.iter().enumerate() {
            let i = (self.next_desc + k as u16) % self.size;
            let last = k + 1 == bufs.len();
            let flags = if last { 0 } else { 1 } | if write { 2 } else { 0 };
            self.set_desc(mem, i, addr, len, flags, (i + 1) % self.size);
        }
        self.next_desc = (self.next_desc + bufs.len() as u16) % self.size;
        self.publish(mem, head);
        head
    }

    /// Puts `head` in the available ring.
    pub fn publish(&mut self, mem: &GuestMemory, head: u16) {
        w16(mem, self.avail + 4 + 2 * u64::from(self.avail_idx % self.size), head);
        self.avail_idx = self.avail_idx.wrapping_add(1);
        w16(mem, self.avail + 2, self.avail_idx);
    }

    /// Sets the available index directly.
    pub fn set_avail_idx(&mut self, mem: &GuestMemory, idx: u16) {
        self.avail_idx = idx;
        w16(mem, self.avail + 2, idx);
    }

    /// The used index.
    pub fn used_idx(&self, mem: &GuestMemory) -> u16 {
        r16(mem, self.used + 2)
    }

    /// Used element `i`: (id, len).
    pub fn used_elem(&self, mem: &GuestMemory, i: u16) -> (u32, u32) {
        let at = self.used + 4 + 8 * u64::from(i % self.size);
        (r32(mem, at), r32(mem, at + 4))
    }

    /// EVENT_IDX: interrupt me when used index passes `v`.
    pub fn set_used_event(&self, mem: &GuestMemory, v: u16) {
        w16(mem, self.avail + 4 + 2 * u64::from(self.size), v);
    }

    /// Writes this ring into queue `q` of slot `slot`, ready.
    pub fn configure(&self, mem: &GuestMemory, slot: usize, q: usize) {
        let bus = LguestBus::new(mem.mem_size());
        let at = bus.vq_addr(slot, q);
        w16(mem, at + offset_of!(LguestVqConfig, num) as u64, self.size);
        w16(mem, at + offset_of!(LguestVqConfig, ready) as u64, 1);
        mem.write(at + offset_of!(LguestVqConfig, desc) as u64, &self.desc.to_le_bytes()).expect("desc");
        mem.write(at + offset_of!(LguestVqConfig, driver) as u64, &self.avail.to_le_bytes()).expect("driver");
        mem.write(at + offset_of!(LguestVqConfig, device) as u64, &self.used.to_le_bytes()).expect("device");
    }
}

/// A u32 field of slot `slot`'s descriptor.
pub fn desc_u32(mem: &GuestMemory, slot: usize, off: usize) -> u32 {
    r32(mem, LguestBus::new(mem.mem_size()).desc_addr(slot) + off as u64)
}

/// The device's status.
pub fn status(mem: &GuestMemory, slot: usize) -> u32 {
    desc_u32(mem, slot, offset_of!(LguestDeviceDesc, status))
}

/// The device's isr.
pub fn isr(mem: &GuestMemory, slot: usize) -> u32 {
    desc_u32(mem, slot, offset_of!(LguestDeviceDesc, isr))
}

/// The features the device offers.
pub fn device_features(mem: &GuestMemory, slot: usize) -> u64 {
    let mut b = [0u8; 8];
    let at = LguestBus::new(mem.mem_size()).desc_addr(slot) + offset_of!(LguestDeviceDesc, device_features) as u64;
    mem.read(at, &mut b).expect("read");
    u64::from_le_bytes(b)
}

/// Writes the status and notifies, as a driver does.
pub fn set_status(mem: &GuestMemory, bus: &Bus<'_>, slot: usize, status: u32) {
    let lb = LguestBus::new(mem.mem_size());
    let at = lb.desc_addr(slot) + offset_of!(LguestDeviceDesc, status) as u64;
    mem.write(at, &status.to_le_bytes()).expect("status");
    assert!(bus.notify(lb.desc_addr(slot)));
}

/// Negotiates `features` (FEATURES_OK) without DRIVER_OK; returns the
/// status the device left.
pub fn negotiate(mem: &GuestMemory, bus: &Bus<'_>, slot: usize, features: u64) -> u32 {
    let lb = LguestBus::new(mem.mem_size());
    set_status(mem, bus, slot, VIRTIO_STATUS_ACKNOWLEDGE | VIRTIO_STATUS_DRIVER);
    let at = lb.desc_addr(slot) + offset_of!(LguestDeviceDesc, driver_features) as u64;
    mem.write(at, &features.to_le_bytes()).expect("features");
    set_status(mem, bus, slot, VIRTIO_STATUS_ACKNOWLEDGE | VIRTIO_STATUS_DRIVER | VIRTIO_STATUS_FEATURES_OK);
    status(mem, slot)
}

/// Full driver start-up with `features`: returns the final status.
pub fn start(mem: &GuestMemory, bus: &Bus<'_>, slot: usize, features: u64) -> u32 {
    let s = negotiate(mem, bus, slot, features);
    assert_ne!(s & VIRTIO_STATUS_FEATURES_OK, 0, "features refused");
    set_status(mem, bus, slot, s | VIRTIO_STATUS_DRIVER_OK);
    status(mem, slot)
}
