// SPDX-License-Identifier: GPL-2.0
//! Property tests of the virtqueue handling: whatever a driver puts in a
//! ring (random descriptor tables, flags, lengths, chains, head indices and
//! available indices), a device model either serves requests within the
//! buffers it was given or asks for a reset. It never panics, never writes
//! a byte of a canary region that no descriptor names, and never reports
//! more bytes than the chain's device-writable buffers hold.

use proptest::prelude::*;

use super::block::{Block, DiskOptions};
use super::bus::{Bus, IrqLine};
use super::rng::Rng;
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

/// Builds the ring in `mem` for slot 0 queue `q` and kicks the device;
/// checks the properties.
fn check(
    model: Box<dyn VirtioDevice>,
    q: usize,
    features: u64,
    descs: &[Desc],
    heads: &[u16],
    avail: Option<u16>,
) -> Result<(), TestCaseError> {
    let mem = GuestMemory::new(MEM, 1).expect("memory");
    let bus = Bus::new(&mem, vec![model], |_| Box::new(NoIrq)).expect("bus");
    let mut ring = TestRing::new(&mem, RING, QSIZE);
    for qq in 0..=q {
        if qq == q {
            ring.configure(&mem, 0, qq);
        } else {
            TestRing::new(&mem, RING + 0x1_0000 * (qq as u64 + 1), QSIZE).configure(&mem, 0, qq);
        }
    }
    testring::start(&mem, &bus, 0, features);
    mem.write(CANARY, &[0xa5; CANARY_LEN]).expect("canary");
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
    bus.service(0, Events { kicked: 1 << q, ..Events::default() });
    bus.service(0, Events { kicked: 1 << q, ..Events::default() });

    let mut canary = vec![0u8; CANARY_LEN];
    mem.read(CANARY, &mut canary).expect("read canary");
    // A byte of the canary may change only if a descriptor named it (an
    // indirect table's entries come from memory the test does not follow:
    // then nothing is checked).
    let named = |a: u64| descs.iter().any(|d| d.addr <= a && a < d.addr.saturating_add(u64::from(d.len)));
    if !descs.iter().any(|d| d.flags & 4 != 0) {
        let stray = canary.iter().enumerate().find(|&(i, &b)| b != 0xa5 && !named(CANARY + i as u64));
        prop_assert!(
            stray.is_none(),
            "the device wrote at {:#x}, which no descriptor names",
            CANARY + stray.map_or(0, |(i, _)| i) as u64
        );
    }
    let reset = testring::status(&mem, 0) & VIRTIO_STATUS_DEVICE_NEEDS_RESET != 0;
    // A device-writable buffer over the rings themselves (the driver gave
    // its own ring as a buffer) lets the device's data land in the used
    // ring: the device did as told, and the used entries say nothing then.
    let ring_end = RING + 0x2000;
    let over_rings =
        descs.iter().any(|d| d.flags & 2 != 0 && d.addr < ring_end && d.addr.saturating_add(u64::from(d.len)) > RING);
    if over_rings {
        return Ok(());
    }
    let used = ring.used_idx(&mem);
    prop_assert!(used <= heads.len() as u16, "{used} used entries for {} offered", heads.len());
    for n in 0..used {
        let (id, len) = ring.used_elem(&mem, n);
        prop_assert!(id < u32::from(QSIZE), "used id {id} outside the ring");
        // What the chain at `id` may receive: its device-writable buffers
        // (direct chains only; an indirect one is bounded by 4 GiB).
        let mut room = 0u64;
        let mut i = id as u16;
        let mut indirect = false;
        for _ in 0..QSIZE {
            let d = &descs[usize::from(i)];
            indirect |= d.flags & 4 != 0;
            if d.flags & 2 != 0 {
                room += u64::from(d.len);
            }
            if d.flags & 1 == 0 || d.next >= QSIZE {
                break;
            }
            i = d.next;
        }
        prop_assert!(indirect || u64::from(len) <= room, "used len {len} > writable room {room}");
    }
    if std::env::var_os("LGUEST_PROP_STATS").is_some() {
        eprintln!("proptest case: used {used}, reset {reset}");
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn rng_survives_any_ring((descs, heads, avail) in ring()) {
        check(Box::new(Rng), 0, VIRTIO_F_VERSION_1, &descs, &heads, avail)?;
    }

    #[test]
    fn block_survives_any_ring((descs, heads, avail) in ring()) {
        let path = std::env::temp_dir().join(format!("lguest-prop-{}.img", std::process::id()));
        std::fs::write(&path, vec![0u8; 64 * 512]).expect("disk");
        let opts: DiskOptions = path.display().to_string().parse().expect("options");
        let disk = Block::open(&opts, 0).expect("open disk");
        let features = VIRTIO_F_VERSION_1 | super::block::VIRTIO_BLK_F_FLUSH;
        let r = check(Box::new(disk), 0, features, &descs, &heads, avail);
        let _ = std::fs::remove_file(&path);
        r?;
    }
}
