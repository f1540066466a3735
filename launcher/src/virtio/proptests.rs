// SPDX-License-Identifier: GPL-2.0
//! Property tests of the virtqueue handling: whatever a driver puts in a
//! ring (random descriptor tables, flags, lengths, chains, head indices and
//! available indices), a device model (rng, block, console both ways, net
//! both ways) either serves requests within the buffers it was given or
//! asks for a reset. It never panics; it never changes a byte of guest RAM
//! that no device-writable descriptor names (direct, or in an indirect
//! table, which the checker follows), outside the used rings: all of RAM
//! is compared, on every case, and read-only buffers count as forbidden;
//! and it never reports more bytes than the chain's device-writable
//! buffers hold.

use proptest::prelude::*;

use std::fs::File;
use std::io::Write as _;
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixDatagram;

use super::block::{Block, DiskOptions};
use super::bus::{Bus, IrqLine};
use super::console::Console;
use super::net::Net;
use super::rng::Rng;
use super::tap::TapControl;
use super::testring::{self, TestRing};
use super::*;
use crate::memory::GuestMemory;
use lguest_abi::bus::VIRTIO_STATUS_DEVICE_NEEDS_RESET;

const MEM: u64 = 4 << 20;
const RING: u64 = 0x1_0000;
/// Where the buffers live: the device may write here and in the used ring.
const BUF: u64 = 0x10_0000;
const BUF_LEN: u64 = 0x1_0000;
/// A canary region right after the buffers: must never change.
const CANARY: u64 = BUF + BUF_LEN;
const CANARY_LEN: usize = 0x1_0000;
const QSIZE: u16 = 16;

struct NoIrq;

impl IrqLine for NoIrq {
    fn raise(&self) -> std::io::Result<()> {
        Ok(())
    }
}

/// One random descriptor.
#[derive(Clone, Debug)]
struct Desc {
    addr: u64,
    len: u32,
    flags: u16,
    next: u16,
}

/// A well-formed descriptor inside the buffers (chains of these are
/// requests a device can serve).
fn good_desc() -> impl Strategy<Value = Desc> {
    let flags = prop_oneof![4 => Just(2u16), 2 => Just(3u16), 1 => 0..2u16];
    (0..BUF_LEN - 4096, 1..4096u32, flags, 0..QSIZE).prop_map(|(o, len, flags, next)| Desc {
        addr: BUF + o,
        len,
        flags,
        next,
    })
}

/// A descriptor: mostly well-formed, sometimes anything.
fn desc() -> impl Strategy<Value = Desc> {
    prop_oneof![6 => good_desc(), 1 => any_desc()]
}

fn any_desc() -> impl Strategy<Value = Desc> {
    let addr = prop_oneof![
        // Inside the buffers (sometimes running past their end).
        (0..BUF_LEN).prop_map(|o| BUF + o),
        // Anywhere else in RAM (below the buffers or above the canary),
        // at the end of RAM, past it, huge.
        0..BUF,
        CANARY + CANARY_LEN as u64..MEM,
        Just(MEM - 8),
        Just(MEM),
        any::<u64>(),
        Just(u64::MAX - 3),
    ];
    let len = prop_oneof![0..4096u32, Just(0u32), Just(u32::MAX), any::<u32>(), 4096..0x2_0000u32];
    // NEXT, WRITE, INDIRECT, and junk bits.
    let flags = prop_oneof![0..8u16, any::<u16>()];
    let next = prop_oneof![0..QSIZE, any::<u16>()];
    (addr, len, flags, next).prop_map(|(addr, len, flags, next)| Desc { addr, len, flags, next })
}

/// A random ring: the descriptor table, the heads offered, and an
/// available index (normally the number of heads, sometimes anything).
fn ring() -> impl Strategy<Value = (Vec<Desc>, Vec<u16>, Option<u16>)> {
    (
        prop::collection::vec(desc(), QSIZE as usize),
        prop::collection::vec(prop_oneof![9 => 0..QSIZE, 1 => any::<u16>()], 1..8),
        prop::option::weighted(0.1, any::<u16>()),
    )
}

/// The device-writable ranges `descs` name: direct WRITE descriptors, and
/// the WRITE entries of every indirect table a descriptor points at (read
/// from `mem` as the device would find it).
fn writable_ranges(mem: &GuestMemory, descs: &[Desc]) -> Vec<(u64, u64)> {
    let mut v = Vec::new();
    for d in descs {
        if d.flags & 4 != 0 {
            let n = (u64::from(d.len) / 16).min(4096);
            for k in 0..n {
                let mut e = [0u8; 16];
                if mem.read(d.addr.wrapping_add(16 * k), &mut e).is_err() {
                    break;
                }
                let addr = u64::from_le_bytes(e[..8].try_into().unwrap_or_default());
                let len = u32::from_le_bytes(e[8..12].try_into().unwrap_or_default());
                let flags = u16::from_le_bytes(e[12..14].try_into().unwrap_or_default());
                if flags & 2 != 0 {
                    v.push((addr, addr.saturating_add(u64::from(len))));
                }
            }
        } else if d.flags & 2 != 0 {
            v.push((d.addr, d.addr.saturating_add(u64::from(d.len))));
        }
    }
    v
}

/// The room a chain from head `id` may receive: its WRITE buffers, those
/// of an indirect table included (none: no bound is known; None).
fn room(mem: &GuestMemory, descs: &[Desc], id: u16) -> Option<u64> {
    let mut room = 0u64;
    let mut i = id;
    for _ in 0..QSIZE {
        let d = &descs[usize::from(i)];
        if d.flags & 4 != 0 {
            for (a, b) in writable_ranges(mem, std::slice::from_ref(d)) {
                room = room.saturating_add(b - a);
            }
        } else if d.flags & 2 != 0 {
            room += u64::from(d.len);
        }
        if d.flags & 1 == 0 || d.next >= QSIZE {
            return Some(room);
        }
        i = d.next;
    }
    // A loop: the device must refuse it, so nothing may be used.
    Some(0)
}

/// Builds the ring in `mem` for slot 0 queue `q` and wakes the device with
/// `events`; checks the properties.
fn check(
    model: Box<dyn VirtioDevice>,
    q: usize,
    features: u64,
    (descs, heads, avail): (&[Desc], &[u16], Option<u16>),
    events: Events,
) -> Result<(), TestCaseError> {
    let mem = GuestMemory::new(MEM, 1).expect("memory");
    // Every byte of RAM starts as 0xa5, so that any write shows.
    mem.write(0, &vec![0xa5; MEM as usize]).expect("fill");
    let bus = Bus::new(&mem, vec![model], |_| Box::new(NoIrq)).expect("bus");
    let mut ring = TestRing::new(&mem, RING, QSIZE);
    let mut used_rings = vec![(ring.used, ring.used + 6 + 8 * u64::from(QSIZE))];
    for qq in 0..=q {
        if qq == q {
            ring.configure(&mem, 0, qq);
        } else {
            let other = TestRing::new(&mem, RING + 0x1_0000 * (qq as u64 + 1), QSIZE);
            other.configure(&mem, 0, qq);
            used_rings.push((other.used, other.used + 6 + 8 * u64::from(QSIZE)));
        }
    }
    testring::start(&mem, &bus, 0, features);
    for (i, d) in descs.iter().enumerate() {
        // CAST: i < QSIZE.
        ring.set_desc(&mem, i as u16, d.addr, d.len, d.flags, d.next);
    }
    for &h in heads {
        ring.publish(&mem, h);
    }
    if let Some(idx) = avail {
        ring.set_avail_idx(&mem, idx);
    }
    let allowed = writable_ranges(&mem, descs);
    let rooms: Vec<Option<u64>> = (0..QSIZE).map(|id| room(&mem, descs, id)).collect();
    let mut before = vec![0u8; MEM as usize];
    mem.read(0, &mut before).expect("snapshot");
    bus.service(0, events);
    bus.service(0, events);

    let mut after = vec![0u8; MEM as usize];
    mem.read(0, &mut after).expect("read RAM");
    let may_change = |a: u64| allowed.iter().chain(&used_rings).any(|&(lo, hi)| lo <= a && a < hi);
    // Page by page (a slice compare is a memcmp even unoptimised), then
    // byte by byte in the pages that differ.
    let stray =
        before.chunks(4096).zip(after.chunks(4096)).enumerate().filter(|(_, (b, a))| b != a).find_map(|(p, (b, a))| {
            (0..b.len()).map(|i| p * 4096 + i).find(|&i| b[i % 4096] != a[i % 4096] && !may_change(i as u64))
        });
    prop_assert!(
        stray.is_none(),
        "the device changed RAM at {:#x}, which no device-writable descriptor names",
        stray.unwrap_or(0)
    );
    let reset = testring::status(&mem, 0) & VIRTIO_STATUS_DEVICE_NEEDS_RESET != 0;
    // A device-writable buffer over the rings themselves (the driver gave
    // its own ring as a buffer) lets the device's data land in the used
    // ring: the device did as told, and the used entries say nothing then.
    let ring_end = RING + 0x3_0000;
    let over_rings = allowed.iter().any(|&(lo, hi)| lo < ring_end && hi > RING);
    if over_rings {
        return Ok(());
    }
    let used = ring.used_idx(&mem);
    prop_assert!(used <= heads.len() as u16, "{used} used entries for {} offered", heads.len());
    for n in 0..used {
        let (id, len) = ring.used_elem(&mem, n);
        prop_assert!(id < u32::from(QSIZE), "used id {id} outside the ring");
        // CAST: id < QSIZE, checked above.
        if let Some(room) = rooms[id as usize] {
            prop_assert!(u64::from(len) <= room, "used len {len} > writable room {room}");
        }
    }
    if std::env::var_os("LGUEST_PROP_STATS").is_some() {
        eprintln!("proptest case: used {used}, reset {reset}");
    }
    Ok(())
}

/// A tap that takes every setting.
struct AnyTap;

impl TapControl for AnyTap {
    fn set_vnet_hdr_size(&self, _: usize) -> std::io::Result<()> {
        Ok(())
    }
    fn set_offload(&self, _: u32) -> std::io::Result<()> {
        Ok(())
    }
}

/// A net device on a socket pair; the host end has `frames` waiting.
fn net_with_frames(frames: usize) -> (Net, UnixDatagram) {
    let (dev, host) = UnixDatagram::pair().expect("socketpair");
    dev.set_nonblocking(true).expect("nonblocking");
    for i in 0..frames {
        // CAST: the low byte is the point.
        host.send(&vec![i as u8; 60 + 700 * i]).expect("frame");
    }
    (Net::new(File::from(OwnedFd::from(dev)), Box::new(AnyTap), "prop0", true, 0), host)
}

fn kick(q: usize) -> Events {
    Events { kicked: 1 << q, ..Events::default() }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn rng_survives_any_ring((descs, heads, avail) in ring()) {
        check(Box::new(Rng), 0, VIRTIO_F_VERSION_1, (&descs, &heads, avail), kick(0))?;
    }

    #[test]
    fn block_survives_any_ring((descs, heads, avail) in ring()) {
        let path = std::env::temp_dir().join(format!("lguest-prop-{}.img", std::process::id()));
        std::fs::write(&path, vec![0u8; 64 * 512]).expect("disk");
        let opts: DiskOptions = path.display().to_string().parse().expect("options");
        let disk = Block::open(&opts, 0).expect("open disk");
        let features = VIRTIO_F_VERSION_1 | super::block::VIRTIO_BLK_F_FLUSH;
        let r = check(Box::new(disk), 0, features, (&descs, &heads, avail), kick(0));
        let _ = std::fs::remove_file(&path);
        r?;
    }

    #[test]
    fn console_output_survives_any_ring((descs, heads, avail) in ring()) {
        let console = Console::new(None, Box::new(std::io::sink()));
        check(Box::new(console), 1, VIRTIO_F_VERSION_1, (&descs, &heads, avail), kick(1))?;
    }

    #[test]
    fn console_input_survives_any_ring((descs, heads, avail) in ring()) {
        let (reader, mut writer) = std::io::pipe().expect("pipe");
        writer.write_all(&[b'x'; 5000]).expect("input");
        let console = Console::new(Some(File::from(OwnedFd::from(reader))), Box::new(std::io::sink()));
        let events = Events { kicked: 1, input: 1, ..Events::default() };
        check(Box::new(console), 0, VIRTIO_F_VERSION_1, (&descs, &heads, avail), events)?;
    }

    #[test]
    fn net_receive_survives_any_ring((descs, heads, avail) in ring()) {
        let (net, _host) = net_with_frames(4);
        let events = Events { kicked: 1, input: 1, ..Events::default() };
        check(Box::new(net), 0, VIRTIO_F_VERSION_1, (&descs, &heads, avail), events)?;
    }

    #[test]
    fn net_transmit_survives_any_ring((descs, heads, avail) in ring()) {
        let (net, _host) = net_with_frames(0);
        check(Box::new(net), 1, VIRTIO_F_VERSION_1, (&descs, &heads, avail), kick(1))?;
    }
}
