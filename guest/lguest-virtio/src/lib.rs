// SPDX-License-Identifier: GPL-2.0
//! The pure logic of the guest's virtio drivers on the lguest bus: no
//! hypercalls, no device memory, nothing but arithmetic on bytes, so that it
//! is tested on the build host (`cargo test --target x86_64-unknown-linux-gnu
//! -p lguest-virtio` in `guest/`) while the guest library
//! (`lguest-guest`, features `virtio` and `net`) uses it unchanged.
//!
//! - [`parse_table`]: the device table (the first page of the device
//!   window, see `abi/src/bus.rs`), from a copy of its bytes.
//! - [`need_event`]: the wrap-safe test of `VIRTIO_RING_F_EVENT_IDX`.
//! - [`NetHdr`]: the 12-byte `struct virtio_net_hdr_v1`.
//! - [`checksum`]: the Internet checksum, finishing a partial checksum the
//!   device left (`VIRTIO_NET_HDR_F_NEEDS_CSUM` on receive), and preparing
//!   a TCP frame for checksum and segmentation offload on transmit.
#![cfg_attr(not(test), no_std)]

use lguest_abi::bus::{LguestDeviceDesc, LGUEST_BUS_CONFIG_SIZE, LGUEST_BUS_DESC_SIZE, LGUEST_BUS_MAX_QUEUES};

pub mod checksum;

/// The guest interrupt lines there are (`LGUEST_IRQS`).
pub const IRQS: u32 = lguest_abi::LGUEST_IRQS as u32;

/// What the guest needs to know of one slot of the device table to decide
/// whether and how to drive it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotInfo {
    /// The slot (0 is the first descriptor of the table).
    pub index: usize,
    /// The virtio device ID (1 net, 2 block, 3 console, 4 rng, ...).
    pub device_type: u32,
    /// Queues the device has.
    pub num_queues: u32,
    /// Its interrupt line.
    pub irq: u32,
    /// The largest size of each queue (0: no such queue).
    pub num_max: [u16; LGUEST_BUS_MAX_QUEUES],
    /// Bytes of configuration space.
    pub config_len: u32,
    /// Why the guest must not drive the device, if it breaks the ABI.
    pub problem: Option<&'static str>,
}

/// Reads a little-endian `u32` at `off` of `b`.
fn le32(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
}

/// Reads a little-endian `u16` at `off` of `b`.
fn le16(b: &[u8], off: usize) -> u16 {
    u16::from_le_bytes([b[off], b[off + 1]])
}

/// Byte offsets in a descriptor (the layout is asserted in the ABI crate).
mod off {
    use core::mem::offset_of;

    use lguest_abi::bus::{LguestDeviceDesc, LguestVqConfig};

    pub const DEVICE_TYPE: usize = offset_of!(LguestDeviceDesc, device_type);
    pub const NUM_QUEUES: usize = offset_of!(LguestDeviceDesc, num_queues);
    pub const IRQ: usize = offset_of!(LguestDeviceDesc, irq);
    pub const CONFIG_LEN: usize = offset_of!(LguestDeviceDesc, config_len);
    pub const QUEUES: usize = offset_of!(LguestDeviceDesc, queues);
    pub const VQ_SIZE: usize = core::mem::size_of::<LguestVqConfig>();
    pub const VQ_NUM_MAX: usize = offset_of!(LguestVqConfig, num_max);
}

/// Decodes slot `index` from its `LGUEST_BUS_DESC_SIZE` bytes; `None` for
/// the slot that ends the table (`device_type == 0`).
pub fn parse_slot(index: usize, b: &[u8]) -> Option<SlotInfo> {
    if b.len() < LGUEST_BUS_DESC_SIZE {
        return None;
    }
    let device_type = le32(b, off::DEVICE_TYPE);
    if device_type == 0 {
        return None;
    }
    let num_queues = le32(b, off::NUM_QUEUES);
    let irq = le32(b, off::IRQ);
    let config_len = le32(b, off::CONFIG_LEN);
    let mut num_max = [0u16; LGUEST_BUS_MAX_QUEUES];
    for (q, n) in num_max.iter_mut().enumerate() {
        *n = le16(b, off::QUEUES + q * off::VQ_SIZE + off::VQ_NUM_MAX);
    }
    let problem = if num_queues as usize > LGUEST_BUS_MAX_QUEUES {
        Some("too many queues")
    } else if irq >= IRQS {
        Some("no such interrupt line")
    } else if config_len as usize > LGUEST_BUS_CONFIG_SIZE {
        Some("configuration space too long")
    } else if num_max[..num_queues as usize].iter().any(|&n| n != 0 && !n.is_power_of_two()) {
        Some("a queue size is not a power of two")
    } else {
        None
    };
    Some(SlotInfo { index, device_type, num_queues, irq, num_max, config_len, problem })
}

/// The devices of a device table, from a copy of its first page: slots in
/// order up to the first with `device_type == 0` (or the last slot).
pub fn parse_table(page: &[u8]) -> impl Iterator<Item = SlotInfo> + '_ {
    page.chunks_exact(LGUEST_BUS_DESC_SIZE).enumerate().map_while(|(i, b)| parse_slot(i, b))
}

/// Whether a side that moved its index from `old` to `new` must notify the
/// other, which asked to hear when the index passes `event` (virtio 1.2
/// §2.7.10, `vring_need_event`): wrap-safe, so it holds across 65535 -> 0.
pub const fn need_event(event: u16, new: u16, old: u16) -> bool {
    new.wrapping_sub(event).wrapping_sub(1) < new.wrapping_sub(old)
}

/// The `used_event` that asks for an interrupt once `count` (at least 1)
/// more buffers are used, for a driver that has popped `popped`.
pub const fn arm_used_event(popped: u16, count: u16) -> u16 {
    let count = if count == 0 { 1 } else { count };
    popped.wrapping_add(count - 1)
}

/// The `used_event` that asks for no interrupt for as long as the protocol
/// allows: one behind what the driver popped, so the device's index only
/// crosses it after 65535 more buffers, which it cannot use without the
/// driver popping (and so re-arming or disarming again) first.
pub const fn disarmed_used_event(popped: u16) -> u16 {
    popped.wrapping_sub(1)
}

/// Byte offsets of the split-ring fields the drivers read or write
/// themselves (virtio 1.2 §2.7): `used_event` at the end of the available
/// ring, `avail_event` at the end of the used ring.
pub mod ring {
    /// Offset of `used_event` in the driver area of a queue of `size`.
    pub const fn used_event_offset(size: usize) -> usize {
        4 + 2 * size
    }

    /// Offset of `avail_event` in the device area of a queue of `size`.
    pub const fn avail_event_offset(size: usize) -> usize {
        4 + 8 * size
    }

    /// Offset of `idx` in the driver area (and in the device area).
    pub const IDX_OFFSET: usize = 2;
}

/// virtio-net feature bits (virtio 1.2 §5.1.3).
pub mod net_features {
    /// The device handles packets with a partial checksum (`CSUM`).
    pub const CSUM: u64 = 1 << 0;
    /// The driver handles packets with a partial checksum (`GUEST_CSUM`).
    pub const GUEST_CSUM: u64 = 1 << 1;
    /// The device has a MAC address in its configuration space.
    pub const MAC: u64 = 1 << 5;
    /// The device takes TCP/IPv4 segmentation offload (`HOST_TSO4`).
    pub const HOST_TSO4: u64 = 1 << 11;
    /// The device takes TCP/IPv6 segmentation offload (`HOST_TSO6`).
    pub const HOST_TSO6: u64 = 1 << 12;
    /// The device has a link status in its configuration space.
    pub const STATUS: u64 = 1 << 16;
    /// `VIRTIO_RING_F_EVENT_IDX`.
    pub const RING_EVENT_IDX: u64 = 1 << 29;
    /// `VIRTIO_F_VERSION_1`.
    pub const VERSION_1: u64 = 1 << 32;
}

/// `struct virtio_net_hdr_v1`: what precedes every frame on a virtio-net
/// queue once `VIRTIO_F_VERSION_1` is negotiated (12 bytes, little-endian).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NetHdr {
    /// `VIRTIO_NET_HDR_F_*`.
    pub flags: u8,
    /// `VIRTIO_NET_HDR_GSO_*`.
    pub gso_type: u8,
    /// Bytes of headers (Ethernet, IP, TCP) to repeat in each segment.
    pub hdr_len: u16,
    /// Payload bytes per segment (the MSS).
    pub gso_size: u16,
    /// Where the checksummed part starts.
    pub csum_start: u16,
    /// Where, from `csum_start`, the checksum goes.
    pub csum_offset: u16,
    /// Buffers merged into this packet (receive, `MRG_RXBUF`); 0 otherwise.
    pub num_buffers: u16,
}

impl NetHdr {
    /// Bytes of the header.
    pub const SIZE: usize = 12;
    /// `VIRTIO_NET_HDR_F_NEEDS_CSUM`: the checksum at `csum_start +
    /// csum_offset` holds only the pseudo-header sum; the rest is to do.
    pub const F_NEEDS_CSUM: u8 = 1;
    /// `VIRTIO_NET_HDR_F_DATA_VALID`: the device checked the checksum.
    pub const F_DATA_VALID: u8 = 2;
    /// `VIRTIO_NET_HDR_GSO_NONE`.
    pub const GSO_NONE: u8 = 0;
    /// `VIRTIO_NET_HDR_GSO_TCPV4`.
    pub const GSO_TCPV4: u8 = 1;
    /// `VIRTIO_NET_HDR_GSO_TCPV6`.
    pub const GSO_TCPV6: u8 = 4;

    /// The header's bytes.
    pub fn to_bytes(&self) -> [u8; Self::SIZE] {
        let mut b = [0u8; Self::SIZE];
        b[0] = self.flags;
        b[1] = self.gso_type;
        b[2..4].copy_from_slice(&self.hdr_len.to_le_bytes());
        b[4..6].copy_from_slice(&self.gso_size.to_le_bytes());
        b[6..8].copy_from_slice(&self.csum_start.to_le_bytes());
        b[8..10].copy_from_slice(&self.csum_offset.to_le_bytes());
        b[10..12].copy_from_slice(&self.num_buffers.to_le_bytes());
        b
    }

    /// The header at the start of `b`, if `b` is long enough.
    pub fn from_bytes(b: &[u8]) -> Option<Self> {
        if b.len() < Self::SIZE {
            return None;
        }
        Some(Self {
            flags: b[0],
            gso_type: b[1],
            hdr_len: le16(b, 2),
            gso_size: le16(b, 4),
            csum_start: le16(b, 6),
            csum_offset: le16(b, 8),
            num_buffers: le16(b, 10),
        })
    }
}

/// Offsets of the device descriptor, for code that reads and writes it in
/// place.
pub const DESC_QUEUES_OFFSET: usize = off::QUEUES;

const _: () = assert!(core::mem::size_of::<LguestDeviceDesc>() == LGUEST_BUS_DESC_SIZE);

#[cfg(test)]
mod tests {
    use super::*;
    use lguest_abi::bus::{LguestVqConfig, LGUEST_BUS_MAX_DEVICES};

    fn bytes_of(d: &LguestDeviceDesc) -> Vec<u8> {
        // Build the bytes field by field (little-endian), as the launcher
        // lays them out, rather than transmuting.
        let mut b = vec![0u8; LGUEST_BUS_DESC_SIZE];
        b[0..4].copy_from_slice(&d.device_type.to_le_bytes());
        b[4..8].copy_from_slice(&d.num_queues.to_le_bytes());
        b[8..12].copy_from_slice(&d.irq.to_le_bytes());
        b[40..44].copy_from_slice(&d.config_len.to_le_bytes());
        for (q, vq) in d.queues.iter().enumerate() {
            let o = 48 + 32 * q;
            b[o..o + 2].copy_from_slice(&vq.num_max.to_le_bytes());
        }
        b
    }

    fn dev(device_type: u32, irq: u32, queues: &[u16]) -> LguestDeviceDesc {
        let mut d = LguestDeviceDesc { device_type, irq, num_queues: queues.len() as u32, ..Default::default() };
        for (q, &n) in queues.iter().enumerate() {
            d.queues[q] = LguestVqConfig { num_max: n, ..Default::default() };
        }
        d
    }

    #[test]
    fn offsets_match_the_abi() {
        assert_eq!(off::CONFIG_LEN, 40);
        assert_eq!(off::QUEUES, 48);
        assert_eq!(off::VQ_SIZE, 32);
    }

    #[test]
    fn table_ends_at_the_first_empty_slot() {
        let mut page = Vec::new();
        page.extend(bytes_of(&dev(3, 1, &[64, 64])));
        page.extend(bytes_of(&dev(4, 2, &[64])));
        page.extend(bytes_of(&LguestDeviceDesc::default()));
        page.extend(bytes_of(&dev(2, 3, &[128])));
        page.resize(4096, 0);
        let slots: Vec<_> = parse_table(&page).collect();
        assert_eq!(slots.len(), 2);
        assert_eq!(slots[0].device_type, 3);
        assert_eq!(slots[0].num_max[..2], [64, 64]);
        assert_eq!(slots[1].index, 1);
        assert_eq!(slots[1].irq, 2);
        assert!(slots.iter().all(|s| s.problem.is_none()));
    }

    #[test]
    fn full_table_and_bad_slots() {
        let mut page = Vec::new();
        for i in 0..LGUEST_BUS_MAX_DEVICES {
            page.extend(bytes_of(&dev(1, i as u32, &[256, 256])));
        }
        assert_eq!(parse_table(&page).count(), LGUEST_BUS_MAX_DEVICES);
        let bad = |d: LguestDeviceDesc| parse_slot(0, &bytes_of(&d)).unwrap().problem;
        assert_eq!(bad(dev(1, 64, &[256])), Some("no such interrupt line"));
        assert_eq!(bad(dev(1, 0, &[100])), Some("a queue size is not a power of two"));
        let mut d = dev(1, 0, &[]);
        d.num_queues = 5;
        assert_eq!(bad(d), Some("too many queues"));
        let mut d = dev(1, 0, &[8]);
        d.config_len = 1000;
        assert_eq!(bad(d), Some("configuration space too long"));
        assert_eq!(parse_slot(0, &[0u8; 100]), None);
    }

    #[test]
    fn need_event_wraps() {
        // Event 5: moving 3 -> 6 crosses it; 6 -> 9 does not.
        assert!(need_event(5, 6, 3));
        assert!(!need_event(5, 9, 6));
        assert!(!need_event(5, 5, 3));
        // Across the wrap: event 65534, index 65533 -> 1.
        assert!(need_event(65534, 1, 65533));
        assert!(need_event(65535, 0, 65535));
        assert!(!need_event(65534, 1, 65535));
        // The naive `new >= event + 1` gets this one wrong.
        let (event, new) = (65534u16, 1u16);
        assert!(new < event.wrapping_add(1));
        // Exhaustive against the definition on small windows.
        for old in [0u16, 100, 65500, 65535] {
            for step in 0..300u16 {
                let new = old.wrapping_add(step);
                for back in 0..300u16 {
                    let event = new.wrapping_sub(back);
                    // event is in [old, new) iff back in 1..=step.
                    assert_eq!(need_event(event, new, old), back >= 1 && back <= step, "{event} {new} {old}");
                }
            }
        }
    }

    /// What a device does after using buffers `old..new`: interrupt if
    /// `need_event(used_event, new, old)`.
    fn device_signals(used_event: u16, old: u16, new: u16) -> bool {
        need_event(used_event, new, old)
    }

    #[test]
    fn armed_and_disarmed_used_event() {
        for popped in [0u16, 1, 1000, 65534, 65535] {
            // Armed for 1: the next used buffer interrupts.
            let e = arm_used_event(popped, 1);
            assert!(device_signals(e, popped, popped.wrapping_add(1)));
            // Armed for 4: batches of 3 do not, the one reaching 4 does.
            let e = arm_used_event(popped, 4);
            assert!(!device_signals(e, popped, popped.wrapping_add(3)));
            assert!(device_signals(e, popped.wrapping_add(3), popped.wrapping_add(4)));
            assert!(device_signals(e, popped, popped.wrapping_add(10)));
            assert_eq!(arm_used_event(popped, 0), arm_used_event(popped, 1));
            // Disarmed: no batch of up to a full ring (here 32768) signals,
            // whatever the device had used before.
            let e = disarmed_used_event(popped);
            for before in [0u16, 1, 255] {
                let old = popped.wrapping_add(before);
                for n in [1u16, 2, 256, 32768] {
                    assert!(!device_signals(e, old, old.wrapping_add(n)), "{popped} {before} {n}");
                }
            }
        }
    }

    #[test]
    fn ring_offsets() {
        assert_eq!(ring::used_event_offset(256), 516);
        assert_eq!(ring::avail_event_offset(256), 2052);
    }

    #[test]
    fn net_header_round_trip() {
        let h = NetHdr {
            flags: NetHdr::F_NEEDS_CSUM,
            gso_type: NetHdr::GSO_TCPV4,
            hdr_len: 54,
            gso_size: 1448,
            csum_start: 34,
            csum_offset: 16,
            num_buffers: 0,
        };
        let b = h.to_bytes();
        assert_eq!(b, [1, 1, 54, 0, 0xa8, 5, 34, 0, 16, 0, 0, 0]);
        assert_eq!(NetHdr::from_bytes(&b), Some(h));
        assert_eq!(NetHdr::from_bytes(&b[..11]), None);
    }
}
