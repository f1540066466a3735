// SPDX-License-Identifier: GPL-2.0
//! Tests of the bus protocol and the device models, driven through guest
//! memory as a driver would, with hand-built rings (`testring.rs`).

use std::fs::File;
use std::io::Write;
use std::mem::offset_of;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::UnixDatagram;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use lguest_abi::bus::{
    LguestBus, LguestDeviceDesc, LguestVqConfig, LGUEST_ISR_CONFIG, LGUEST_ISR_QUEUE, VIRTIO_STATUS_ACKNOWLEDGE,
    VIRTIO_STATUS_DEVICE_NEEDS_RESET, VIRTIO_STATUS_DRIVER, VIRTIO_STATUS_DRIVER_OK, VIRTIO_STATUS_FAILED,
    VIRTIO_STATUS_FEATURES_OK,
};

use super::block::{self, Block, DiskOptions};
use super::bus::{Bus, IrqLine};
use super::console::{self, Console};
use super::net::{self, Net, NetOptions};
use super::rng::{self, Rng};
use super::tap::TapControl;
use super::testring::{self, TestRing};
use super::*;
use crate::memory::GuestMemory;

const MEM: u64 = 4 << 20;
const RING0: u64 = 0x1_0000;
const RING1: u64 = 0x2_0000;
const BUF: u64 = 0x10_0000;
const FEATURES: u64 = VIRTIO_F_VERSION_1;
const OK: u32 = VIRTIO_STATUS_ACKNOWLEDGE | VIRTIO_STATUS_DRIVER | VIRTIO_STATUS_FEATURES_OK | VIRTIO_STATUS_DRIVER_OK;

/// An interrupt line that counts.
struct CountIrq(Arc<AtomicU64>);

impl IrqLine for CountIrq {
    fn raise(&self) -> std::io::Result<()> {
        self.0.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

fn memory() -> GuestMemory {
    GuestMemory::new(MEM, 1).expect("memory")
}

/// A bus with `models`; returns it and one interrupt counter per device.
fn bus<'m>(mem: &'m GuestMemory, models: Vec<Box<dyn VirtioDevice>>) -> (Bus<'m>, Vec<Arc<AtomicU64>>) {
    let mut counters = Vec::new();
    let bus = Bus::new(mem, models, |_| {
        let c = Arc::new(AtomicU64::new(0));
        counters.push(c.clone());
        Box::new(CountIrq(c))
    })
    .expect("bus");
    (bus, counters)
}

fn irqs(c: &[Arc<AtomicU64>], slot: usize) -> u64 {
    c[slot].load(Ordering::SeqCst)
}

fn kick(q: usize) -> Events {
    Events { kicked: 1 << q, ..Events::default() }
}

fn read(mem: &GuestMemory, addr: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    mem.read(addr, &mut v).expect("read");
    v
}

fn needs_reset(mem: &GuestMemory, slot: usize) -> bool {
    testring::status(mem, slot) & VIRTIO_STATUS_DEVICE_NEEDS_RESET != 0
}

// ---------------------------------------------------------------------------
// The table and the status protocol.
// ---------------------------------------------------------------------------

#[test]
fn table_describes_each_device() {
    let mem = memory();
    let (bus, _) = bus(&mem, vec![Box::new(Rng), Box::new(Console::new(None, Box::new(Vec::new())))]);
    assert_eq!(bus.len(), 2);
    let ty = offset_of!(LguestDeviceDesc, device_type);
    assert_eq!(testring::desc_u32(&mem, 0, ty), VIRTIO_ID_RNG);
    assert_eq!(testring::desc_u32(&mem, 1, ty), VIRTIO_ID_CONSOLE);
    assert_eq!(testring::desc_u32(&mem, 2, ty), 0, "the table ends");
    assert_eq!(testring::desc_u32(&mem, 0, offset_of!(LguestDeviceDesc, num_queues)), 1);
    assert_eq!(testring::desc_u32(&mem, 1, offset_of!(LguestDeviceDesc, num_queues)), 2);
    assert_eq!(testring::desc_u32(&mem, 0, offset_of!(LguestDeviceDesc, irq)), 1);
    assert_eq!(testring::desc_u32(&mem, 1, offset_of!(LguestDeviceDesc, irq)), 2);
    let f = testring::device_features(&mem, 0);
    assert_eq!(f & TRANSPORT_FEATURES, TRANSPORT_FEATURES, "VERSION_1, EVENT_IDX offered: {f:#x}");
    let lb = LguestBus::new(MEM);
    let num_max = read(&mem, lb.vq_addr(1, 1) + offset_of!(LguestVqConfig, num_max) as u64, 2);
    assert_eq!(u16::from_le_bytes([num_max[0], num_max[1]]), 64);
    assert_eq!(testring::status(&mem, 0), 0);
}

#[test]
fn unoffered_features_are_refused() {
    let mem = memory();
    let (bus, _) = bus(&mem, vec![Box::new(Rng)]);
    let s = testring::negotiate(&mem, &bus, 0, FEATURES | 1 << 50);
    assert_eq!(s & VIRTIO_STATUS_FEATURES_OK, 0, "FEATURES_OK cleared");
    assert_eq!(bus.acked_status(0) & VIRTIO_STATUS_FEATURES_OK, 0);
    // The driver retries with what was offered.
    let s = testring::negotiate(&mem, &bus, 0, FEATURES | VIRTIO_F_RING_EVENT_IDX);
    assert_ne!(s & VIRTIO_STATUS_FEATURES_OK, 0, "FEATURES_OK kept");
}

/// A driver that resets and breaks the device in a loop, or keeps taking
/// features that were not offered, is counted per device in --stats (text
/// and JSON), and all but a burst of its warnings are held back.
#[test]
fn a_reset_and_break_loop_is_counted_and_rate_limited() {
    let mem = memory();
    let (bus, _) = bus(&mem, vec![Box::new(Rng), Box::new(Rng)]);
    let broken = VIRTIO_STATUS_ACKNOWLEDGE | VIRTIO_STATUS_DRIVER | VIRTIO_STATUS_DRIVER_OK;
    for _ in 0..200 {
        testring::set_status(&mem, &bus, 0, 0);
        testring::set_status(&mem, &bus, 0, broken);
        assert!(needs_reset(&mem, 0));
    }
    for _ in 0..50 {
        testring::set_status(&mem, &bus, 1, 0);
        testring::negotiate(&mem, &bus, 1, FEATURES | 1 << 50);
    }
    let (failures, features) = bus.driver_errors(0);
    assert_eq!((failures.count(), features.count()), (200, 0));
    assert!(failures.suppressed() >= 200 - 2 * u64::from(crate::ratelimit::BURST), "{}", failures.suppressed());
    let (failures, features) = bus.driver_errors(1);
    assert_eq!((failures.count(), features.count()), (0, 50));
    assert!(features.suppressed() >= 50 - 2 * u64::from(crate::ratelimit::BURST));
    let json = bus.stats_json();
    assert_eq!((json[0]["needed_reset"].as_u64(), json[0]["unoffered_features"].as_u64()), (Some(200), Some(0)));
    assert_eq!(json[0]["warnings_suppressed"].as_u64(), Some(bus.driver_errors(0).0.suppressed()));
    assert_eq!((json[1]["needed_reset"].as_u64(), json[1]["unoffered_features"].as_u64()), (Some(0), Some(50)));
    let text = bus.stats();
    assert!(text.contains("  driver errors: 200 resets needed, 0 unoffered feature sets ("), "{text}");
    assert!(text.contains("  driver errors: 0 resets needed, 50 unoffered feature sets ("), "{text}");
}

#[test]
fn driver_ok_without_features_ok_needs_reset() {
    let mem = memory();
    let (bus, c) = bus(&mem, vec![Box::new(Rng)]);
    testring::set_status(&mem, &bus, 0, VIRTIO_STATUS_ACKNOWLEDGE | VIRTIO_STATUS_DRIVER | VIRTIO_STATUS_DRIVER_OK);
    assert!(needs_reset(&mem, 0));
    assert_eq!(testring::isr(&mem, 0) & LGUEST_ISR_CONFIG, LGUEST_ISR_CONFIG);
    assert_eq!(irqs(&c, 0), 1);
}

/// A started rng with one ring; returns the ring.
fn started_rng(mem: &GuestMemory, bus: &Bus<'_>, features: u64) -> TestRing {
    let ring = TestRing::new(mem, RING0, 16);
    ring.configure(mem, 0, 0);
    assert_eq!(testring::start(mem, bus, 0, features), OK);
    ring
}

#[test]
fn rng_fills_buffers_and_interrupts() {
    let mem = memory();
    let (bus, c) = bus(&mem, vec![Box::new(Rng)]);
    let mut ring = started_rng(&mem, &bus, FEATURES);
    let head = ring.add_chain(&mem, &[(BUF, 64, true), (BUF + 0x1000, 64, true)]);
    bus.service(0, kick(0));
    assert_eq!(ring.used_idx(&mem), 1);
    assert_eq!(ring.used_elem(&mem, 0), (u32::from(head), 128));
    assert!(read(&mem, BUF, 64).iter().any(|&b| b != 0), "random bytes");
    assert!(read(&mem, BUF + 0x1000, 64).iter().any(|&b| b != 0), "second buffer too");
    assert_eq!(read(&mem, BUF + 64, 16), vec![0; 16], "nothing past the buffer");
    assert_eq!(irqs(&c, 0), 1);
    assert_eq!(testring::isr(&mem, 0), LGUEST_ISR_QUEUE);
    assert_eq!(bus.device_stats(0).queues[0].bytes.load(Ordering::Relaxed), 128);
}

#[test]
fn rng_caps_huge_requests() {
    let mem = memory();
    let (bus, _) = bus(&mem, vec![Box::new(Rng)]);
    let mut ring = started_rng(&mem, &bus, FEATURES);
    ring.add_chain(&mem, &[(BUF, 1 << 20, true)]);
    bus.service(0, kick(0));
    // CAST: MAX_REQUEST fits u32.
    assert_eq!(ring.used_elem(&mem, 0).1, rng::MAX_REQUEST as u32);
    assert!(!needs_reset(&mem, 0));
}

#[test]
fn event_idx_suppresses_interrupts() {
    let mem = memory();
    let (bus, c) = bus(&mem, vec![Box::new(Rng)]);
    let mut ring = started_rng(&mem, &bus, FEATURES | VIRTIO_F_RING_EVENT_IDX);
    // Interrupt only once the used index passes 2.
    ring.set_used_event(&mem, 2);
    ring.add_chain(&mem, &[(BUF, 8, true)]);
    bus.service(0, kick(0));
    assert_eq!((ring.used_idx(&mem), irqs(&c, 0)), (1, 0));
    ring.add_chain(&mem, &[(BUF, 8, true)]);
    ring.add_chain(&mem, &[(BUF, 8, true)]);
    bus.service(0, kick(0));
    assert_eq!((ring.used_idx(&mem), irqs(&c, 0)), (3, 1));
}

#[test]
fn reset_stops_queues_and_clears_state() {
    let mem = memory();
    let (bus, _) = bus(&mem, vec![Box::new(Rng)]);
    let mut ring = started_rng(&mem, &bus, FEATURES);
    testring::set_status(&mem, &bus, 0, 0);
    assert_eq!(testring::status(&mem, 0), 0);
    assert_eq!(bus.acked_status(0), 0);
    let ready = read(&mem, LguestBus::new(MEM).vq_addr(0, 0) + offset_of!(LguestVqConfig, ready) as u64, 2);
    assert_eq!(ready, [0, 0], "ready reads 0 after a reset");
    // A kick after the reset does nothing.
    ring.add_chain(&mem, &[(BUF, 8, true)]);
    bus.service(0, kick(0));
    assert_eq!(ring.used_idx(&mem), 0);
    // The driver can start again from scratch.
    let mut ring = started_rng(&mem, &bus, FEATURES);
    ring.add_chain(&mem, &[(BUF, 8, true)]);
    bus.service(0, kick(0));
    assert_eq!(ring.used_idx(&mem), 1);
}

#[test]
fn failed_stops_the_device() {
    let mem = memory();
    let (bus, _) = bus(&mem, vec![Box::new(Rng)]);
    let mut ring = started_rng(&mem, &bus, FEATURES);
    testring::set_status(&mem, &bus, 0, OK | VIRTIO_STATUS_FAILED);
    ring.add_chain(&mem, &[(BUF, 8, true)]);
    bus.service(0, kick(0));
    assert_eq!(ring.used_idx(&mem), 0);
}

/// Starts an rng whose queue 0 was configured by `setup`; returns whether
/// the device refused (DEVICE_NEEDS_RESET) and the interrupts raised.
fn start_with(setup: impl Fn(&GuestMemory)) -> (bool, u64, u32) {
    let mem = memory();
    let (bus, c) = bus(&mem, vec![Box::new(Rng)]);
    TestRing::new(&mem, RING0, 16).configure(&mem, 0, 0);
    setup(&mem);
    let s = testring::negotiate(&mem, &bus, 0, FEATURES);
    testring::set_status(&mem, &bus, 0, s | VIRTIO_STATUS_DRIVER_OK);
    (needs_reset(&mem, 0), irqs(&c, 0), testring::isr(&mem, 0))
}

fn vq_write(mem: &GuestMemory, q: usize, field: usize, bytes: &[u8]) {
    mem.write(LguestBus::new(MEM).vq_addr(0, q) + field as u64, bytes).expect("write");
}

#[test]
fn good_queue_configuration_starts() {
    assert_eq!(start_with(|_| {}), (false, 0, 0));
}

#[test]
fn bad_queue_configurations_need_reset() {
    let num = offset_of!(LguestVqConfig, num);
    let desc = offset_of!(LguestVqConfig, desc);
    let driver = offset_of!(LguestVqConfig, driver);
    let device = offset_of!(LguestVqConfig, device);
    let ready = offset_of!(LguestVqConfig, ready);
    type Setup = Box<dyn Fn(&GuestMemory)>;
    let cases: Vec<(&str, Setup)> = vec![
        ("size not a power of two", Box::new(move |m| vq_write(m, 0, num, &3u16.to_le_bytes()))),
        ("size 0", Box::new(move |m| vq_write(m, 0, num, &0u16.to_le_bytes()))),
        ("size above num_max", Box::new(move |m| vq_write(m, 0, num, &128u16.to_le_bytes()))),
        ("descriptors in the device window", Box::new(move |m| vq_write(m, 0, desc, &MEM.to_le_bytes()))),
        ("descriptors past RAM", Box::new(move |m| vq_write(m, 0, desc, &(MEM - 16).to_le_bytes()))),
        ("descriptors at u64::MAX", Box::new(move |m| vq_write(m, 0, desc, &(u64::MAX - 15).to_le_bytes()))),
        ("misaligned descriptors", Box::new(move |m| vq_write(m, 0, desc, &(RING0 + 8).to_le_bytes()))),
        ("misaligned driver ring", Box::new(move |m| vq_write(m, 0, driver, &(RING0 + 0x801).to_le_bytes()))),
        ("used ring past RAM", Box::new(move |m| vq_write(m, 0, device, &(MEM - 8).to_le_bytes()))),
        ("used ring at 0", Box::new(move |m| vq_write(m, 0, device, &0u64.to_le_bytes()))),
        ("ready is 2", Box::new(move |m| vq_write(m, 0, ready, &2u16.to_le_bytes()))),
        ("a queue that does not exist", Box::new(move |m| vq_write(m, 1, ready, &1u16.to_le_bytes()))),
    ];
    for (what, setup) in cases {
        let (reset, irqs, isr) = start_with(setup);
        assert!(reset, "{what}: DEVICE_NEEDS_RESET");
        assert_eq!((irqs, isr), (1, LGUEST_ISR_CONFIG), "{what}: a configuration interrupt");
    }
}

#[test]
fn needs_reset_sticks_until_reset() {
    let mem = memory();
    let (bus, _) = bus(&mem, vec![Box::new(Rng)]);
    let mut ring = started_rng(&mem, &bus, FEATURES);
    ring.add_chain(&mem, &[(MEM, 8, true)]);
    bus.service(0, kick(0));
    assert!(needs_reset(&mem, 0));
    // The driver writes the status without the bit: it stays.
    testring::set_status(&mem, &bus, 0, OK);
    assert!(needs_reset(&mem, 0));
    testring::set_status(&mem, &bus, 0, 0);
    assert!(!needs_reset(&mem, 0));
    let mut ring = started_rng(&mem, &bus, FEATURES);
    ring.add_chain(&mem, &[(BUF, 8, true)]);
    bus.service(0, kick(0));
    assert_eq!(ring.used_idx(&mem), 1);
}

// ---------------------------------------------------------------------------
// Malformed chains.
// ---------------------------------------------------------------------------

/// Runs `build` on a started rng's ring, kicks, and checks that the device
/// asked for a reset (and did not use the chain).
fn malformed(what: &str, build: impl Fn(&GuestMemory, &mut TestRing)) {
    let mem = memory();
    let (bus, c) = bus(&mem, vec![Box::new(Rng)]);
    let mut ring = started_rng(&mem, &bus, FEATURES);
    build(&mem, &mut ring);
    bus.service(0, kick(0));
    assert!(needs_reset(&mem, 0), "{what}: DEVICE_NEEDS_RESET");
    assert_eq!(testring::isr(&mem, 0) & LGUEST_ISR_CONFIG, LGUEST_ISR_CONFIG, "{what}: config isr");
    assert!(irqs(&c, 0) >= 1, "{what}: interrupt");
    assert_eq!(ring.used_idx(&mem), 0, "{what}: nothing used");
    // Further kicks do nothing until a reset.
    bus.service(0, kick(0));
    assert_eq!(ring.used_idx(&mem), 0, "{what}: stopped");
}

#[test]
fn malformed_chains_need_reset() {
    malformed("a loop", |m, r| {
        r.set_desc(m, 0, BUF, 8, 1 | 2, 1);
        r.set_desc(m, 1, BUF, 8, 1 | 2, 0);
        r.publish(m, 0);
    });
    malformed("a self loop", |m, r| {
        r.set_desc(m, 0, BUF, 8, 1 | 2, 0);
        r.publish(m, 0);
    });
    malformed("next out of range", |m, r| {
        r.set_desc(m, 0, BUF, 8, 1 | 2, 999);
        r.publish(m, 0);
    });
    malformed("head out of range", |m, r| r.publish(m, 16));
    malformed("a buffer in the device window", |m, r| {
        r.add_chain(m, &[(MEM, 8, true)]);
    });
    malformed("a buffer across the end of RAM", |m, r| {
        r.add_chain(m, &[(MEM - 4, 8, true)]);
    });
    malformed("an address that wraps", |m, r| {
        r.add_chain(m, &[(u64::MAX - 3, 8, true)]);
    });
    malformed("a huge length", |m, r| {
        r.add_chain(m, &[(BUF, u32::MAX, true)]);
    });
    malformed("a readable buffer for the rng", |m, r| {
        r.add_chain(m, &[(BUF, 8, false)]);
    });
    malformed("readable after writable", |m, r| {
        r.add_chain(m, &[(BUF, 8, true), (BUF + 8, 8, false)]);
    });
    malformed("an available index far ahead", |m, r| r.set_avail_idx(m, 100));
    malformed("a nested indirect table", |m, r| {
        let table = BUF + 0x8000;
        // Entry 0 of the indirect table is itself indirect.
        m.write(table, &(table).to_le_bytes()).expect("w");
        m.write(table + 8, &16u32.to_le_bytes()).expect("w");
        m.write(table + 12, &4u16.to_le_bytes()).expect("w");
        r.set_desc(m, 0, table, 16, 4, 0);
        r.publish(m, 0);
    });
    malformed("an indirect table with NEXT", |m, r| {
        r.set_desc(m, 0, BUF + 0x8000, 16, 4 | 1, 1);
        r.publish(m, 0);
    });
    malformed("an indirect table of odd length", |m, r| {
        r.set_desc(m, 0, BUF + 0x8000, 17, 4, 0);
        r.publish(m, 0);
    });
    malformed("an indirect table outside RAM", |m, r| {
        r.set_desc(m, 0, MEM - 16, 32, 4, 0);
        r.publish(m, 0);
    });
    malformed("an indirect table that loops", |m, r| {
        let table = BUF + 0x8000;
        for i in 0..2u64 {
            let e = table + 16 * i;
            m.write(e, &BUF.to_le_bytes()).expect("w");
            m.write(e + 8, &8u32.to_le_bytes()).expect("w");
            m.write(e + 12, &3u16.to_le_bytes()).expect("w");
            // CAST: 0 or 1.
            m.write(e + 14, &((1 - i) as u16).to_le_bytes()).expect("w");
        }
        r.set_desc(m, 0, table, 32, 4, 0);
        r.publish(m, 0);
    });
}

#[test]
fn indirect_chains_work() {
    let mem = memory();
    let (bus, _) = bus(&mem, vec![Box::new(Rng)]);
    let mut ring = started_rng(&mem, &bus, FEATURES | VIRTIO_F_RING_INDIRECT_DESC);
    let table = BUF + 0x8000;
    for i in 0..2u64 {
        let e = table + 16 * i;
        mem.write(e, &(BUF + 0x100 * i).to_le_bytes()).expect("w");
        mem.write(e + 8, &16u32.to_le_bytes()).expect("w");
        mem.write(e + 12, &(if i == 0 { 3u16 } else { 2 }).to_le_bytes()).expect("w");
        mem.write(e + 14, &1u16.to_le_bytes()).expect("w");
    }
    ring.set_desc(&mem, 0, table, 32, 4, 0);
    ring.publish(&mem, 0);
    bus.service(0, kick(0));
    assert!(!needs_reset(&mem, 0));
    assert_eq!(ring.used_elem(&mem, 0), (0, 32));
}

// ---------------------------------------------------------------------------
// Console.
// ---------------------------------------------------------------------------

/// A Write that keeps what it gets.
#[derive(Clone, Default)]
struct Shared(Arc<Mutex<Vec<u8>>>);

impl Write for Shared {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("lock").extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn started_console(
    mem: &GuestMemory,
    input: Option<File>,
    out: Shared,
) -> (Bus<'_>, Vec<Arc<AtomicU64>>, TestRing, TestRing) {
    started(mem, Console::new(input, Box::new(out)))
}

/// `console` on a bus, started with two rings of 16.
fn started(mem: &GuestMemory, console: Console) -> (Bus<'_>, Vec<Arc<AtomicU64>>, TestRing, TestRing) {
    let (bus, c) = bus(mem, vec![Box::new(console)]);
    let rx = TestRing::new(mem, RING0, 16);
    let tx = TestRing::new(mem, RING1, 16);
    rx.configure(mem, 0, 0);
    tx.configure(mem, 0, 1);
    assert_eq!(testring::start(mem, &bus, 0, FEATURES), OK);
    (bus, c, rx, tx)
}

#[test]
fn console_output_reaches_the_host() {
    let mem = memory();
    let out = Shared::default();
    let (bus, c, _rx, mut tx) = started_console(&mem, None, out.clone());
    mem.write(BUF, b"Hello, ").expect("w");
    mem.write(BUF + 0x100, b"console!\n").expect("w");
    tx.add_chain(&mem, &[(BUF, 7, false), (BUF + 0x100, 9, false)]);
    tx.add_chain(&mem, &[(BUF, 5, false)]);
    bus.service(0, kick(1));
    assert_eq!(out.0.lock().expect("lock").as_slice(), b"Hello, console!\nHello");
    assert_eq!(tx.used_idx(&mem), 2);
    assert_eq!(irqs(&c, 0), 1, "one interrupt for the batch");
}

#[test]
fn console_input_reaches_the_guest() {
    let mem = memory();
    let (reader, mut writer) = std::io::pipe().expect("pipe");
    let input = File::from(OwnedFd::from(reader));
    let (bus, c, mut rx, _tx) = started_console(&mem, Some(input), Shared::default());
    rx.add_chain(&mem, &[(BUF, 64, true)]);
    writer.write_all(b"ls\n").expect("write");
    bus.service(0, Events { input: 1, ..Events::default() });
    assert_eq!(rx.used_elem(&mem, 0), (0, 3));
    assert_eq!(read(&mem, BUF, 3), b"ls\n");
    assert_eq!(irqs(&c, 0), 1);
    // No buffer left: the input is not read (nor polled) until a kick.
    writer.write_all(b"x").expect("write");
    bus.service(0, Events { input: 1, ..Events::default() });
    assert_eq!(rx.used_idx(&mem), 1);
    rx.add_chain(&mem, &[(BUF + 0x100, 64, true)]);
    bus.service(0, Events { kicked: 1, input: 1, ..Events::default() });
    assert_eq!(rx.used_idx(&mem), 2);
    assert_eq!(read(&mem, BUF + 0x100, 1), b"x");
    // End of input: the buffer stays with the device, unused.
    drop(writer);
    rx.add_chain(&mem, &[(BUF + 0x200, 64, true)]);
    bus.service(0, Events { kicked: 1, input: 1, ..Events::default() });
    assert_eq!(rx.used_idx(&mem), 2);
    assert!(!needs_reset(&mem, 0));
}

/// With the launcher's input hold, what was typed before the guest's
/// console was up waits: not polled nor read after DRIVER_OK, even with
/// buffers posted, until the driver sends its first output; then it comes
/// whole.
#[test]
fn console_input_waits_for_the_first_output() {
    let mem = memory();
    let (reader, mut writer) = std::io::pipe().expect("pipe");
    let input = File::from(OwnedFd::from(reader));
    writer.write_all(b"typed during boot\n").expect("write");
    let console =
        Console::new(Some(input), Box::new(Shared::default())).with_input_hold(std::time::Duration::from_secs(3600));
    let (bus, _, mut rx, mut tx) = started(&mem, console);
    rx.add_chain(&mem, &[(BUF, 64, true)]);
    bus.service(0, Events { start: true, input: 1, ..Events::default() });
    assert_eq!(rx.used_idx(&mem), 0, "input went before the driver's first output");
    // The first output ends the hold.
    mem.write(BUF + 0x200, b"login: ").expect("w");
    tx.add_chain(&mem, &[(BUF + 0x200, 7, false)]);
    bus.service(0, kick(1));
    bus.service(0, Events { input: 1, ..Events::default() });
    assert_eq!(rx.used_elem(&mem, 0), (0, 18));
    assert_eq!(read(&mem, BUF, 18), b"typed during boot\n");
}

/// Without output the hold ends by itself: a guest that reads before it
/// writes gets its input (here after 50 ms).
#[test]
fn console_input_hold_ends_by_itself() {
    let mem = memory();
    let (reader, mut writer) = std::io::pipe().expect("pipe");
    let input = File::from(OwnedFd::from(reader));
    writer.write_all(b"x").expect("write");
    let console =
        Console::new(Some(input), Box::new(Shared::default())).with_input_hold(std::time::Duration::from_millis(50));
    let (bus, _, mut rx, _tx) = started(&mem, console);
    rx.add_chain(&mem, &[(BUF, 64, true)]);
    bus.service(0, Events { start: true, input: 1, ..Events::default() });
    assert_eq!(rx.used_idx(&mem), 0);
    std::thread::sleep(std::time::Duration::from_millis(60));
    bus.service(0, Events { timeout: true, ..Events::default() });
    bus.service(0, Events { input: 1, ..Events::default() });
    assert_eq!(rx.used_elem(&mem, 0), (0, 1));
}

/// On a terminal the console offers VIRTIO_CONSOLE_F_SIZE with the
/// window's columns and rows; a resize (SIGWINCH's eventfd) writes the new
/// size with the generation bumped twice and raises one configuration
/// interrupt; no resize, no interrupt.
#[test]
fn console_window_size_follows_the_terminal() {
    let (master, path) = console::open_pty().expect("pty");
    let slave = std::fs::OpenOptions::new().read(true).write(true).open(&path).expect("slave");
    crate::virtio::term::set_window_size(slave.as_raw_fd(), 132, 43).expect("size");
    let console = Console::new(Some(slave.try_clone().expect("dup")), Box::new(Shared::default()))
        .with_window_size()
        .expect("window size");
    assert_eq!(console.features(), console::VIRTIO_CONSOLE_F_SIZE);
    let mem = memory();
    let (bus, c) = bus(&mem, vec![Box::new(console)]);
    let desc = LguestBus::new(MEM).desc_addr(0);
    let cfg_at = desc + offset_of!(LguestDeviceDesc, config) as u64;
    let gen_at = desc + offset_of!(LguestDeviceDesc, config_generation) as u64;
    let le16 = |b: &[u8]| u16::from_le_bytes([b[0], b[1]]);
    let cfg = read(&mem, cfg_at, 12);
    assert_eq!((le16(&cfg[0..]), le16(&cfg[2..])), (132, 43), "cols, rows");
    let rx = TestRing::new(&mem, RING0, 16);
    let tx = TestRing::new(&mem, RING1, 16);
    rx.configure(&mem, 0, 0);
    tx.configure(&mem, 0, 1);
    let with_size = FEATURES | console::VIRTIO_CONSOLE_F_SIZE;
    assert_eq!(testring::start(&mem, &bus, 0, with_size), OK);
    bus.service(0, Events { start: true, ..Events::default() });
    assert_eq!(irqs(&c, 0), 0, "no change, no interrupt");
    crate::virtio::term::set_window_size(slave.as_raw_fd(), 80, 24).expect("resize");
    bus.service(0, Events { input: 4, ..Events::default() });
    let cfg = read(&mem, cfg_at, 4);
    assert_eq!((le16(&cfg[0..]), le16(&cfg[2..])), (80, 24));
    assert_eq!(read(&mem, gen_at, 4), 2u32.to_le_bytes(), "the generation, bumped around the change");
    assert_eq!(irqs(&c, 0), 1);
    assert_eq!(testring::isr(&mem, 0), LGUEST_ISR_CONFIG);
    bus.service(0, Events { input: 4, ..Events::default() });
    assert_eq!(irqs(&c, 0), 1, "the same size again: no interrupt");
    drop(master);
}

/// The escape key on the console's input: Ctrl-] x stops (the launcher
/// gets signals::escape, the rest is dropped and the input is not read
/// again); Ctrl-] Ctrl-] sends one Ctrl-]; Ctrl-] followed by another key
/// sends both.
#[test]
fn console_escape_key() {
    let mut e = console::Escape::new(0x1d);
    let mut out = Vec::new();
    assert_eq!(e.filter(b"ab\x1d\x1dc\x1dq", &mut out), None);
    assert_eq!(out, b"ab\x1dc\x1dq");
    out.clear();
    // Split across reads.
    assert_eq!(e.filter(b"z\x1d", &mut out), None);
    assert_eq!(e.filter(b"?", &mut out), Some(console::EscapeAction::Help));
    assert_eq!(e.filter(b"\x1d", &mut out), None);
    assert_eq!(e.filter(b"xlost", &mut out), Some(console::EscapeAction::Stop));
    assert_eq!(out, b"z");
    assert_eq!(console::parse_escape("^]"), Ok(console::EscapeKey(Some(0x1d))));
    assert_eq!(console::parse_escape("^a"), Ok(console::EscapeKey(Some(1))));
    assert_eq!(console::parse_escape("none"), Ok(console::EscapeKey(None)));
    assert!(console::parse_escape("]").is_err() && console::parse_escape("^1").is_err());
    assert_eq!(console::describe_key(0x1d), "Ctrl-]");
    assert!(e.help().contains("Ctrl-] x  stop the guest"));
}

/// A writer that blocks until `open` is set, then keeps what it gets.
#[derive(Clone, Default)]
struct Gate {
    open: Arc<std::sync::atomic::AtomicBool>,
    out: Shared,
}

impl Write for Gate {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        while !self.open.load(Ordering::SeqCst) {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        self.out.write(b)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// With stdout blocked (a pipe nobody reads), the console's device thread
/// does not block: it takes output until its queue is full, then holds the
/// rest back (the driver's chains stay unused) while the lock is free for
/// the vCPU thread's status changes; once the writer drains, every byte
/// comes out, in order.
#[test]
fn console_output_never_blocks_the_device_on_a_blocked_writer() {
    let mem = memory();
    let gate = Gate::default();
    let console = Console::with_writer_thread(None, Box::new(gate.clone())).expect("console");
    let (bus, _) = bus(&mem, vec![Box::new(console)]);
    // Dropped before the bus, also when an assertion fails: the console's
    // Drop waits for its writer, which must not stay blocked.
    struct OpenOnDrop(Arc<std::sync::atomic::AtomicBool>);
    impl Drop for OpenOnDrop {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }
    let _open = OpenOnDrop(gate.open.clone());
    let rx = TestRing::new(&mem, RING0, 16);
    let mut tx = TestRing::new(&mem, RING1, 16);
    rx.configure(&mem, 0, 0);
    tx.configure(&mem, 0, 1);
    assert_eq!(testring::start(&mem, &bus, 0, FEATURES), OK);
    // 16 chains of 64 KiB each: four times the queue.
    let chunk = 64 * 1024u32;
    let mut want = Vec::new();
    for i in 0..16u8 {
        let data = vec![b'a' + i; chunk as usize];
        mem.write(BUF + u64::from(i) * u64::from(chunk), &data).expect("w");
        tx.add_chain(&mem, &[(BUF + u64::from(i) * u64::from(chunk), chunk, false)]);
        want.extend_from_slice(&data);
    }
    let bus = &bus;
    std::thread::scope(|s| {
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        s.spawn(move || {
            bus.service(0, kick(1));
            let _ = done_tx.send(());
        });
        // A direct writer would block here until the gate opens (never).
        assert!(done_rx.recv_timeout(std::time::Duration::from_secs(20)).is_ok(), "the device blocked on its output");
    });
    let used = tx.used_idx(&mem);
    assert!(used < 16, "all {used} chains taken although the writer is blocked");
    assert!(u64::from(used) * u64::from(chunk) >= console::QUEUE_MAX as u64, "only {used} chains taken");
    // The lock is free: a status change goes through (a reset would do).
    bus.notify(LguestBus::new(MEM).desc_addr(0));
    // Open the gate; the device, woken by the queue's room, takes the rest.
    gate.open.store(true, Ordering::SeqCst);
    for _ in 0..10_000 {
        if tx.used_idx(&mem) == 16 && gate.out.0.lock().expect("lock").len() == want.len() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
        bus.service(0, Events { input: 2, ..Events::default() });
    }
    assert_eq!(tx.used_idx(&mem), 16);
    assert!(*gate.out.0.lock().expect("lock") == want, "the output is not every byte in order");
}

/// Once the launcher stops (`Bus::shutdown`), no device takes another
/// chain: a stop never waits for the guest's queued I/O.
#[test]
fn stopping_devices_take_no_more_chains() {
    let mem = memory();
    let disk = TempDisk::new(64);
    let dev = Block::open(&disk_opts(&disk, false), 0).expect("open");
    let out = Shared::default();
    let (bus, _) = bus(&mem, vec![Box::new(Rng), Box::new(dev), Box::new(Console::new(None, Box::new(out.clone())))]);
    let mut rng_ring = TestRing::new(&mem, RING0, 16);
    rng_ring.configure(&mem, 0, 0);
    assert_eq!(testring::start(&mem, &bus, 0, FEATURES), OK);
    let mut blk_ring = TestRing::new(&mem, RING1, 16);
    blk_ring.configure(&mem, 1, 0);
    assert_eq!(testring::start(&mem, &bus, 1, FEATURES), OK);
    let mut con_tx = TestRing::new(&mem, 0x3_0000, 16);
    let con_rx = TestRing::new(&mem, 0x4_0000, 16);
    con_rx.configure(&mem, 2, 0);
    con_tx.configure(&mem, 2, 1);
    assert_eq!(testring::start(&mem, &bus, 2, FEATURES), OK);
    rng_ring.add_chain(&mem, &[(BUF, 64, true)]);
    mem.write(HDR, &header(block::VIRTIO_BLK_T_IN, 0)).expect("w");
    blk_ring.add_chain(&mem, &[(HDR, 16, false), (DATA, 4096, true), (STATUS, 1, true)]);
    con_tx.add_chain(&mem, &[(BUF + 0x8000, 8, false)]);
    bus.shutdown();
    for dev in 0..3 {
        bus.service(dev, Events { kicked: 3, ..Events::default() });
    }
    assert_eq!(rng_ring.used_idx(&mem), 0, "rng took a chain");
    assert_eq!(blk_ring.used_idx(&mem), 0, "block took a chain");
    assert_eq!(con_tx.used_idx(&mem), 0, "console took a chain");
    assert!(out.0.lock().expect("lock").is_empty());
}

#[test]
fn console_output_with_a_writable_buffer_needs_reset() {
    let mem = memory();
    let (bus, _, _rx, mut tx) = started_console(&mem, None, Shared::default());
    tx.add_chain(&mem, &[(BUF, 8, true)]);
    bus.service(0, kick(1));
    assert!(needs_reset(&mem, 0));
}

// ---------------------------------------------------------------------------
// Block.
// ---------------------------------------------------------------------------

/// A temporary disk image that is removed on drop.
struct TempDisk(std::path::PathBuf);

impl TempDisk {
    fn new(sectors: u64) -> Self {
        static N: AtomicU64 = AtomicU64::new(0);
        let path = std::env::temp_dir().join(format!(
            "lguest-blk-test-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
        ));
        let data: Vec<u8> = (0..sectors * 512).map(|i| (i % 251) as u8).collect();
        std::fs::write(&path, data).expect("disk image");
        Self(path)
    }
}

impl Drop for TempDisk {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn header(kind: u32, sector: u64) -> [u8; 16] {
    let mut h = [0u8; 16];
    h[..4].copy_from_slice(&kind.to_le_bytes());
    h[8..].copy_from_slice(&sector.to_le_bytes());
    h
}

const HDR: u64 = BUF;
const DATA: u64 = BUF + 0x1000;
const STATUS: u64 = BUF + 0x3000;

fn disk_opts(disk: &TempDisk, ro: bool) -> DiskOptions {
    DiskOptions { read_only: ro, ..DiskOptions::new(disk.0.clone()) }
}

fn started_block<'m>(mem: &'m GuestMemory, disk: &TempDisk, ro: bool) -> (Bus<'m>, TestRing) {
    let dev = Block::open(&disk_opts(disk, ro), 0).expect("open");
    let (bus, _) = bus(mem, vec![Box::new(dev)]);
    let ring = TestRing::new(mem, RING0, 16);
    ring.configure(mem, 0, 0);
    let f = testring::device_features(mem, 0);
    assert_eq!(f & block::VIRTIO_BLK_F_FLUSH, block::VIRTIO_BLK_F_FLUSH);
    assert_eq!(f & block::VIRTIO_BLK_F_RO != 0, ro);
    assert_eq!(testring::start(mem, &bus, 0, FEATURES | block::VIRTIO_BLK_F_FLUSH | (f & block::VIRTIO_BLK_F_RO)), OK);
    (bus, ring)
}

/// Sends one request (header, optional data, status) and returns (status,
/// used length).
fn blk_request(
    mem: &GuestMemory,
    bus: &Bus<'_>,
    ring: &mut TestRing,
    kind: u32,
    sector: u64,
    data: Option<(u32, bool)>,
) -> (u8, u32) {
    mem.write(HDR, &header(kind, sector)).expect("w");
    mem.write(STATUS, &[0xff]).expect("w");
    let mut bufs = vec![(HDR, 16, false)];
    if let Some((len, write)) = data {
        bufs.push((DATA, len, write));
    }
    bufs.push((STATUS, 1, true));
    ring.add_chain(mem, &bufs);
    let before = ring.used_idx(mem);
    bus.service(0, kick(0));
    assert_eq!(ring.used_idx(mem), before.wrapping_add(1), "request completed");
    (read(mem, STATUS, 1)[0], ring.used_elem(mem, before).1)
}

#[test]
fn block_capacity_is_in_the_config() {
    let mem = memory();
    let disk = TempDisk::new(8);
    let (_bus, _) = started_block(&mem, &disk, false);
    let cfg = read(&mem, LguestBus::new(MEM).desc_addr(0) + offset_of!(LguestDeviceDesc, config) as u64, 8);
    assert_eq!(u64::from_le_bytes(cfg.try_into().expect("8 bytes")), 8);
    assert_eq!(testring::desc_u32(&mem, 0, offset_of!(LguestDeviceDesc, config_len)), 8);
}

#[test]
fn block_reads_writes_and_flushes() {
    let mem = memory();
    let disk = TempDisk::new(8);
    let (bus, mut ring) = started_block(&mem, &disk, false);
    // Read sector 2.
    let (st, used) = blk_request(&mem, &bus, &mut ring, block::VIRTIO_BLK_T_IN, 2, Some((1024, true)));
    assert_eq!((st, used), (block::VIRTIO_BLK_S_OK, 1025));
    let expect: Vec<u8> = (1024..2048u64).map(|i| (i % 251) as u8).collect();
    assert_eq!(read(&mem, DATA, 1024), expect);
    // Write sector 5, flush, and find it in the file.
    mem.write(DATA, &[0xAB; 512]).expect("w");
    let (st, used) = blk_request(&mem, &bus, &mut ring, block::VIRTIO_BLK_T_OUT, 5, Some((512, false)));
    assert_eq!((st, used), (block::VIRTIO_BLK_S_OK, 1));
    let (st, _) = blk_request(&mem, &bus, &mut ring, block::VIRTIO_BLK_T_FLUSH, 0, None);
    assert_eq!(st, block::VIRTIO_BLK_S_OK);
    let file = std::fs::read(&disk.0).expect("read image");
    assert_eq!(&file[5 * 512..6 * 512], &[0xAB; 512]);
    assert_eq!(file[4 * 512 + 511], ((4 * 512 + 511) % 251) as u8, "neighbours untouched");
    // GET_ID.
    let (st, used) = blk_request(&mem, &bus, &mut ring, block::VIRTIO_BLK_T_GET_ID, 0, Some((20, true)));
    assert_eq!((st, used), (block::VIRTIO_BLK_S_OK, 21));
    assert!(read(&mem, DATA, 20).starts_with(b"lguest-blk0"));
    // Unknown request type.
    let (st, _) = blk_request(&mem, &bus, &mut ring, 77, 0, None);
    assert_eq!(st, block::VIRTIO_BLK_S_UNSUPP);
}

#[test]
fn block_out_of_range_is_an_io_error() {
    let mem = memory();
    let disk = TempDisk::new(8);
    let (bus, mut ring) = started_block(&mem, &disk, false);
    for (kind, sector, len, write) in [
        (block::VIRTIO_BLK_T_IN, 8, 512, true),
        (block::VIRTIO_BLK_T_IN, 7, 1024, true),
        (block::VIRTIO_BLK_T_OUT, 8, 512, false),
        (block::VIRTIO_BLK_T_IN, u64::MAX, 512, true),
        (block::VIRTIO_BLK_T_OUT, u64::MAX / 512, 512, false),
    ] {
        let (st, _) = blk_request(&mem, &bus, &mut ring, kind, sector, Some((len, write)));
        assert_eq!(st, block::VIRTIO_BLK_S_IOERR, "type {kind} sector {sector}");
    }
    assert!(!needs_reset(&mem, 0));
    assert_eq!(std::fs::metadata(&disk.0).expect("stat").len(), 8 * 512, "the image did not grow");
}

#[test]
fn block_read_only_refuses_writes() {
    let mem = memory();
    let disk = TempDisk::new(8);
    let before = std::fs::read(&disk.0).expect("read");
    let (bus, mut ring) = started_block(&mem, &disk, true);
    mem.write(DATA, &[0xCD; 512]).expect("w");
    let (st, _) = blk_request(&mem, &bus, &mut ring, block::VIRTIO_BLK_T_OUT, 0, Some((512, false)));
    assert_eq!(st, block::VIRTIO_BLK_S_IOERR);
    let (st, _) = blk_request(&mem, &bus, &mut ring, block::VIRTIO_BLK_T_IN, 0, Some((512, true)));
    assert_eq!(st, block::VIRTIO_BLK_S_OK);
    drop(bus);
    assert_eq!(std::fs::read(&disk.0).expect("read"), before);
}

#[test]
fn block_requests_without_header_or_status_need_reset() {
    for (what, bufs) in [
        ("short header", vec![(HDR, 8u32, false), (STATUS, 1, true)]),
        ("no status byte", vec![(HDR, 16, false), (DATA, 512, false)]),
    ] {
        let mem = memory();
        let disk = TempDisk::new(8);
        let (bus, mut ring) = started_block(&mem, &disk, false);
        mem.write(HDR, &header(block::VIRTIO_BLK_T_IN, 0)).expect("w");
        ring.add_chain(&mem, &bufs);
        bus.service(0, kick(0));
        assert!(needs_reset(&mem, 0), "{what}");
    }
}

#[test]
fn disk_options_parse() {
    let plain = DiskOptions::new("a.img");
    assert_eq!("a.img".parse::<DiskOptions>(), Ok(plain.clone()));
    assert_eq!("a.img,ro".parse::<DiskOptions>(), Ok(DiskOptions { read_only: true, ..plain.clone() }));
    assert_eq!("path=a.img".parse::<DiskOptions>(), Ok(plain.clone()));
    assert_eq!(
        "path=a.img,readonly=on,direct=on,id=data0,lock=off".parse::<DiskOptions>(),
        Ok(DiskOptions { read_only: true, direct: true, id: Some("data0".into()), lock: false, ..plain.clone() })
    );
    assert_eq!("readonly=off,path=a.img".parse::<DiskOptions>(), Ok(plain.clone()));
    assert_eq!("a.img,direct=on".parse::<DiskOptions>(), Ok(DiskOptions { direct: true, ..plain }));
    for bad in
        ["a.img,rw", "", "readonly=on", "path=", "a.img,readonly=yes", "a.img,id=", "a.img,id=this-id-is-far-too-long"]
    {
        assert!(bad.parse::<DiskOptions>().is_err(), "{bad:?} was accepted");
    }
}

/// A comma in a disk's path is written `,,` (QEMU's escape), in both
/// forms; a single comma still separates options.
#[test]
fn disk_paths_with_commas() {
    let path = |s: &str| s.parse::<DiskOptions>().map(|o| (o.path, o.read_only));
    assert_eq!(path("path=a,,b.img"), Ok(("a,b.img".into(), false)));
    assert_eq!(path("path=a,,b.img,readonly=on"), Ok(("a,b.img".into(), true)));
    assert_eq!(path("readonly=on,path=/x/,,,,y"), Ok(("/x/,,y".into(), true)));
    assert_eq!(path("a,,b.img,ro"), Ok(("a,b.img".into(), true)));
    assert_eq!(path("img,,,ro"), Ok(("img,".into(), true)), "`,,` then `,`");
    assert_eq!(path("a,b.img").map_err(|e| e.contains(",,")), Err(true), "a lone comma splits; the error says ,,");
    assert_eq!(block::split_options("a,,b,c,,"), ["a,b", "c,"]);
    assert_eq!(block::split_options(""), [""]);
}

/// One thing the block device asked of its disk.
#[derive(Clone, Debug, PartialEq, Eq)]
enum DiskOp {
    Read(u64, usize),
    Write(u64, usize),
    Sync,
}

/// A disk in memory that records every operation; `fail_sync` makes
/// fdatasync fail (EIO).
#[derive(Clone, Default)]
struct RecordingDisk {
    ops: Arc<Mutex<Vec<DiskOp>>>,
    data: Arc<Mutex<Vec<u8>>>,
    fail_sync: Arc<std::sync::atomic::AtomicBool>,
}

impl block::Disk for RecordingDisk {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        self.ops.lock().expect("lock").push(DiskOp::Read(offset, buf.len()));
        let d = self.data.lock().expect("lock");
        let o = offset as usize;
        buf.copy_from_slice(&d[o..o + buf.len()]);
        Ok(())
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> std::io::Result<()> {
        self.ops.lock().expect("lock").push(DiskOp::Write(offset, buf.len()));
        let o = offset as usize;
        self.data.lock().expect("lock")[o..o + buf.len()].copy_from_slice(buf);
        Ok(())
    }
    fn sync_data(&self) -> std::io::Result<()> {
        self.ops.lock().expect("lock").push(DiskOp::Sync);
        if self.fail_sync.load(Ordering::SeqCst) {
            return Err(std::io::Error::from_raw_os_error(libc::EIO));
        }
        Ok(())
    }
}

impl RecordingDisk {
    fn new(sectors: usize) -> Self {
        let d = Self::default();
        *d.data.lock().expect("lock") = vec![0; sectors * 512];
        d
    }
    fn take(&self) -> Vec<DiskOp> {
        std::mem::take(&mut *self.ops.lock().expect("lock"))
    }
}

/// A block device on `disk`, started with `features`.
fn started_recording<'m>(mem: &'m GuestMemory, disk: &RecordingDisk, features: u64) -> (Bus<'m>, TestRing) {
    let dev = Block::new(Box::new(disk.clone()), 64 * 512, "rec.img", false, 0);
    let (bus, _) = bus(mem, vec![Box::new(dev)]);
    let ring = TestRing::new(mem, RING0, 16);
    ring.configure(mem, 0, 0);
    assert_eq!(testring::start(mem, &bus, 0, features), OK);
    (bus, ring)
}

/// With FLUSH negotiated (writeback), a write goes to the disk without a
/// sync, and a flush is one fdatasync that happens before the flush
/// completes; nothing is synced that was not asked for.
#[test]
fn block_writeback_syncs_on_flush_only() {
    let mem = memory();
    let disk = RecordingDisk::new(64);
    let (bus, mut ring) = started_recording(&mem, &disk, FEATURES | block::VIRTIO_BLK_F_FLUSH);
    mem.write(DATA, &[0x11; 1024]).expect("w");
    let (st, _) = blk_request(&mem, &bus, &mut ring, block::VIRTIO_BLK_T_OUT, 3, Some((1024, false)));
    assert_eq!(st, block::VIRTIO_BLK_S_OK);
    assert_eq!(disk.take(), [DiskOp::Write(3 * 512, 1024)], "a write, no sync");
    let (st, _) = blk_request(&mem, &bus, &mut ring, block::VIRTIO_BLK_T_FLUSH, 0, None);
    assert_eq!(st, block::VIRTIO_BLK_S_OK);
    assert_eq!(disk.take(), [DiskOp::Sync], "the flush is one fdatasync");
    assert_eq!(&disk.data.lock().expect("lock")[3 * 512..5 * 512], &[0x11; 1024]);
}

/// Without FLUSH (the driver expects writethrough), every write is synced
/// before it completes.
#[test]
fn block_writethrough_without_flush() {
    let mem = memory();
    let disk = RecordingDisk::new(64);
    let (bus, mut ring) = started_recording(&mem, &disk, FEATURES);
    for sector in [1, 9] {
        mem.write(DATA, &[0x22; 512]).expect("w");
        let (st, _) = blk_request(&mem, &bus, &mut ring, block::VIRTIO_BLK_T_OUT, sector, Some((512, false)));
        assert_eq!(st, block::VIRTIO_BLK_S_OK);
        assert_eq!(disk.take(), [DiskOp::Write(sector * 512, 512), DiskOp::Sync], "sector {sector}");
    }
    // Reads need no sync.
    let (st, _) = blk_request(&mem, &bus, &mut ring, block::VIRTIO_BLK_T_IN, 1, Some((512, true)));
    assert_eq!(st, block::VIRTIO_BLK_S_OK);
    assert_eq!(disk.take(), [DiskOp::Read(512, 512)]);
}

/// A failed fdatasync: the flush gets IOERR, the device needs a reset, and
/// after the reset every write and flush still fails (the kernel may have
/// dropped the data), though reads work.
#[test]
fn block_sync_failure_fails_the_device_for_good() {
    let mem = memory();
    let disk = RecordingDisk::new(64);
    let features = FEATURES | block::VIRTIO_BLK_F_FLUSH;
    let (bus, mut ring) = started_recording(&mem, &disk, features);
    mem.write(DATA, &[0x33; 512]).expect("w");
    let (st, _) = blk_request(&mem, &bus, &mut ring, block::VIRTIO_BLK_T_OUT, 0, Some((512, false)));
    assert_eq!(st, block::VIRTIO_BLK_S_OK);
    disk.fail_sync.store(true, Ordering::SeqCst);
    let (st, _) = blk_request(&mem, &bus, &mut ring, block::VIRTIO_BLK_T_FLUSH, 0, None);
    assert_eq!(st, block::VIRTIO_BLK_S_IOERR, "the flush failed");
    assert!(needs_reset(&mem, 0), "the device needs a reset");
    // Reset and start again; the disk now syncs fine, but it is too late.
    disk.fail_sync.store(false, Ordering::SeqCst);
    testring::set_status(&mem, &bus, 0, 0);
    let mut ring = TestRing::new(&mem, RING0, 16);
    ring.configure(&mem, 0, 0);
    assert_eq!(testring::start(&mem, &bus, 0, features), OK);
    disk.take();
    let (st, _) = blk_request(&mem, &bus, &mut ring, block::VIRTIO_BLK_T_OUT, 0, Some((512, false)));
    assert_eq!(st, block::VIRTIO_BLK_S_IOERR, "a write after the failure");
    let (st, _) = blk_request(&mem, &bus, &mut ring, block::VIRTIO_BLK_T_FLUSH, 0, None);
    assert_eq!(st, block::VIRTIO_BLK_S_IOERR, "a flush after the failure");
    assert_eq!(disk.take(), [], "nothing reached the disk");
    let (st, _) = blk_request(&mem, &bus, &mut ring, block::VIRTIO_BLK_T_IN, 0, Some((512, true)));
    assert_eq!(st, block::VIRTIO_BLK_S_OK, "reads still work");
}

/// The advisory lock: two read-write opens of one image conflict, with an
/// error that says so; read-only opens share; a read-only open conflicts
/// with a read-write one; `lock=off` opts out.
#[test]
fn block_images_are_locked() {
    let disk = TempDisk::new(8);
    let rw = disk_opts(&disk, false);
    let ro = disk_opts(&disk, true);
    let first = Block::open(&rw, 0).expect("first open");
    let err = Block::open(&rw, 1).expect_err("a second writer");
    assert!(err.to_string().contains("is in use") && err.to_string().contains("lock=off"), "{err}");
    assert!(Block::open(&ro, 1).is_err(), "a reader while a writer holds it");
    assert!(Block::open(&DiskOptions { lock: false, ..rw.clone() }, 1).is_ok(), "lock=off");
    drop(first);
    let r1 = Block::open(&ro, 0).expect("a reader");
    let r2 = Block::open(&ro, 1).expect("a second reader");
    assert!(Block::open(&rw, 2).is_err(), "a writer while readers hold it");
    drop((r1, r2));
    assert!(Block::open(&rw, 0).is_ok(), "free again");
}

/// The capacity comes from the end of the file, whatever stat says (a block
/// device has no stat size); a directory is refused.
#[test]
fn block_size_and_kind() {
    let disk = TempDisk::new(24);
    let dev = Block::open(&disk_opts(&disk, true), 0).expect("open");
    assert_eq!(dev.config()[..8], 24u64.to_le_bytes());
    let err = Block::open(&DiskOptions { read_only: true, ..DiskOptions::new(std::env::temp_dir()) }, 0)
        .expect_err("a directory");
    assert!(err.to_string().contains("neither a regular file nor a block device"), "{err}");
}

/// A loop device over an image of 77 sectors (this needs root and
/// losetup, as the test machines have; without them there is nothing to
/// check): its stat size is 0, and the disk has 77 sectors, read-only and
/// read-write, without the lock and with it.
#[test]
fn block_device_capacity_comes_from_its_end() {
    let disk = TempDisk::new(77);
    let out = std::process::Command::new("losetup").args(["-f", "--show"]).arg(&disk.0).output();
    let dev = match out {
        Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout).trim().to_string(),
        other => {
            eprintln!("no loop device ({other:?}): nothing to check");
            return;
        }
    };
    struct Detach(String);
    impl Drop for Detach {
        fn drop(&mut self) {
            let _ = std::process::Command::new("losetup").args(["-d", &self.0]).status();
        }
    }
    let _detach = Detach(dev.clone());
    assert_eq!(std::fs::metadata(&dev).expect("stat").len(), 0, "a block device has no stat size");
    for (ro, lock) in [(true, false), (false, true)] {
        let opts = DiskOptions { read_only: ro, lock, ..DiskOptions::new(dev.clone()) };
        let blk = Block::open(&opts, 0).expect("open the loop device");
        assert_eq!(blk.config()[..8], 77u64.to_le_bytes(), "{dev}: capacity (ro {ro})");
    }
}

/// `id=` is what GET_ID returns.
#[test]
fn block_id_option() {
    let mem = memory();
    let disk = TempDisk::new(8);
    let opts = DiskOptions { id: Some("data-disk".into()), ..disk_opts(&disk, false) };
    let dev = Block::open(&opts, 0).expect("open");
    let (bus, _) = bus(&mem, vec![Box::new(dev)]);
    let mut ring = TestRing::new(&mem, RING0, 16);
    ring.configure(&mem, 0, 0);
    assert_eq!(testring::start(&mem, &bus, 0, FEATURES), OK);
    let (st, used) = blk_request(&mem, &bus, &mut ring, block::VIRTIO_BLK_T_GET_ID, 0, Some((20, true)));
    assert_eq!((st, used), (block::VIRTIO_BLK_S_OK, 21));
    assert_eq!(read(&mem, DATA, 20), b"data-disk\0\0\0\0\0\0\0\0\0\0\0");
}

// ---------------------------------------------------------------------------
// Net.
// ---------------------------------------------------------------------------

/// Records what the device asked of its tap.
#[derive(Clone, Default)]
struct FakeTapCtl(Arc<Mutex<Vec<(usize, u32)>>>);

impl TapControl for FakeTapCtl {
    fn set_vnet_hdr_size(&self, size: usize) -> std::io::Result<()> {
        self.0.lock().expect("lock").push((size, u32::MAX));
        Ok(())
    }
    fn set_offload(&self, flags: u32) -> std::io::Result<()> {
        self.0.lock().expect("lock").push((usize::MAX, flags));
        Ok(())
    }
}

/// A started net device on one end of a datagram socket pair (a tap keeps
/// frame boundaries too); returns the bus, irq counters, both rings and the
/// "host" end.
fn started_net(
    mem: &GuestMemory,
    batch: bool,
    features: u64,
) -> (Bus<'_>, Vec<Arc<AtomicU64>>, TestRing, TestRing, UnixDatagram, FakeTapCtl) {
    let (dev_end, host_end) = UnixDatagram::pair().expect("socketpair");
    dev_end.set_nonblocking(true).expect("nonblocking");
    let ctl = FakeTapCtl::default();
    let net = Net::new(File::from(OwnedFd::from(dev_end)), Box::new(ctl.clone()), "fake0", batch, 0);
    let (bus, c) = bus(mem, vec![Box::new(net)]);
    let rx = TestRing::new(mem, RING0, 16);
    let tx = TestRing::new(mem, RING1, 16);
    rx.configure(mem, 0, 0);
    tx.configure(mem, 0, 1);
    assert_eq!(testring::start(mem, &bus, 0, features), OK);
    (bus, c, rx, tx, host_end, ctl)
}

fn frame(i: u8, len: usize) -> Vec<u8> {
    let mut f = vec![0u8; 12];
    f.extend((0..len).map(|k| i.wrapping_add(k as u8)));
    f
}

#[test]
fn net_config_and_offloads() {
    let mem = memory();
    let features = FEATURES | net::VIRTIO_NET_F_GUEST_CSUM | net::VIRTIO_NET_F_GUEST_TSO4 | net::VIRTIO_NET_F_MAC;
    let (_bus, _, _, _, _, ctl) = started_net(&mem, true, features);
    let cfg = read(&mem, LguestBus::new(MEM).desc_addr(0) + offset_of!(LguestDeviceDesc, config) as u64, 8);
    assert_eq!(&cfg[..3], &[0x52, 0x54, 0x00], "a MAC address");
    assert_eq!(&cfg[6..], &[1, 0], "link up");
    assert_eq!(ctl.0.lock().expect("lock").as_slice(), &[(12, u32::MAX), (usize::MAX, 0x01 | 0x02)]);
    assert_eq!(net::offloads(FEATURES), 0, "no GUEST_CSUM: no offloads");
}

/// A reset clears the tap offloads the last negotiation set, at once
/// rather than at the next DRIVER_OK; so does a device failure. A device
/// that set none makes no ioctl at reset.
#[test]
fn net_reset_clears_the_tap_offloads() {
    let mem = memory();
    let features = FEATURES | net::VIRTIO_NET_F_GUEST_CSUM | net::VIRTIO_NET_F_GUEST_TSO4;
    let (bus, _, _rx, mut tx, _host, ctl) = started_net(&mem, true, features);
    let offload_calls = || ctl.0.lock().expect("lock").iter().filter(|c| c.0 == usize::MAX).map(|c| c.1).collect();
    let calls: Vec<u32> = offload_calls();
    assert_eq!(calls, [0x01 | 0x02], "CSUM | TSO4 set at DRIVER_OK");
    testring::set_status(&mem, &bus, 0, 0);
    let calls: Vec<u32> = offload_calls();
    assert_eq!(calls, [0x03, 0], "cleared at the reset");
    // A second reset has nothing to clear.
    testring::set_status(&mem, &bus, 0, 0);
    assert_eq!(offload_calls().len(), 2);
    // Again with offloads, then a broken driver: the failure clears them.
    let rx = testring::TestRing::new(&mem, RING0, 16);
    rx.configure(&mem, 0, 0);
    tx.configure(&mem, 0, 1);
    assert_eq!(testring::start(&mem, &bus, 0, features), OK);
    tx.add_chain(&mem, &[(BUF, 12, false), (BUF + 12, 60, true)]);
    bus.service(0, kick(1));
    assert!(needs_reset(&mem, 0));
    let calls: Vec<u32> = offload_calls();
    assert_eq!(calls, [0x03, 0, 0x03, 0], "cleared when the device failed");
    // A driver without offloads: nothing to clear at its reset.
    testring::set_status(&mem, &bus, 0, 0);
    rx.configure(&mem, 0, 0);
    testring::TestRing::new(&mem, RING1, 16).configure(&mem, 0, 1);
    assert_eq!(testring::start(&mem, &bus, 0, FEATURES), OK);
    testring::set_status(&mem, &bus, 0, 0);
    let calls: Vec<u32> = offload_calls();
    assert_eq!(calls, [0x03, 0, 0x03, 0, 0], "only the activation's own (none)");
}

#[test]
fn net_receive_batches_interrupts() {
    let mem = memory();
    let (bus, c, mut rx, _tx, host, _) = started_net(&mem, true, FEATURES);
    for k in 0..8u64 {
        rx.add_chain(&mem, &[(BUF + 0x1000 * k, 2048, true)]);
    }
    bus.service(0, kick(0));
    assert_eq!(irqs(&c, 0), 0, "no frames yet");
    for i in 0..5 {
        host.send(&frame(i, 60 + usize::from(i))).expect("send");
    }
    bus.service(0, Events { input: 1, ..Events::default() });
    assert_eq!(rx.used_idx(&mem), 5);
    assert_eq!(irqs(&c, 0), 1, "one interrupt for five frames");
    for i in 0..5u16 {
        let (_, len) = rx.used_elem(&mem, i);
        assert_eq!(len as usize, 12 + 60 + usize::from(i));
        let got = read(&mem, BUF + 0x1000 * u64::from(i), len as usize);
        assert_eq!(&got[10..12], &[1, 0], "num_buffers = 1");
        assert_eq!(&got[12..], &frame(i as u8, 60 + usize::from(i))[12..]);
    }
    let s = bus.device_stats(0);
    assert_eq!(s.queues[0].chains.load(Ordering::Relaxed), 5);
    assert_eq!(s.queues[0].bytes.load(Ordering::Relaxed), 60 + 61 + 62 + 63 + 64);
}

#[test]
fn net_receive_without_batching_interrupts_per_frame() {
    let mem = memory();
    let (bus, c, mut rx, _tx, host, _) = started_net(&mem, false, FEATURES);
    for k in 0..8u64 {
        rx.add_chain(&mem, &[(BUF + 0x1000 * k, 2048, true)]);
    }
    for i in 0..5 {
        host.send(&frame(i, 60)).expect("send");
    }
    bus.service(0, Events { kicked: 1, input: 1, ..Events::default() });
    assert_eq!(rx.used_idx(&mem), 5);
    assert_eq!(irqs(&c, 0), 5);
}

#[test]
fn net_receive_waits_for_buffers() {
    let mem = memory();
    let (bus, c, mut rx, _tx, host, _) = started_net(&mem, true, FEATURES);
    for k in 0..3u64 {
        rx.add_chain(&mem, &[(BUF + 0x1000 * k, 2048, true)]);
    }
    for i in 0..5 {
        host.send(&frame(i, 100)).expect("send");
    }
    bus.service(0, Events { kicked: 1, input: 1, ..Events::default() });
    assert_eq!((rx.used_idx(&mem), irqs(&c, 0)), (3, 1), "the ring ran dry: one interrupt");
    // The tap is still readable, but the device does not spin on it.
    bus.service(0, Events { input: 1, ..Events::default() });
    assert_eq!((rx.used_idx(&mem), irqs(&c, 0)), (3, 1));
    for k in 3..8u64 {
        rx.add_chain(&mem, &[(BUF + 0x1000 * k, 2048, true)]);
    }
    bus.service(0, kick(0));
    assert_eq!((rx.used_idx(&mem), irqs(&c, 0)), (5, 2));
    let (_, len) = rx.used_elem(&mem, 4);
    assert_eq!(read(&mem, BUF + 0x4000 + 12, len as usize - 12), frame(4, 100)[12..]);
}

#[test]
fn net_safety_net_interrupts_what_event_idx_held_back() {
    let mem = memory();
    let (bus, c, mut rx, _tx, host, _) = started_net(&mem, true, FEATURES | VIRTIO_F_RING_EVENT_IDX);
    for k in 0..4u64 {
        rx.add_chain(&mem, &[(BUF + 0x1000 * k, 2048, true)]);
    }
    // The driver asks for an interrupt only after 10 frames.
    rx.set_used_event(&mem, 9);
    bus.service(0, kick(0));
    host.send(&frame(0, 60)).expect("send");
    bus.service(0, Events { input: 1, ..Events::default() });
    assert_eq!((rx.used_idx(&mem), irqs(&c, 0)), (1, 0));
    bus.service(0, Events { timeout: true, ..Events::default() });
    assert_eq!(irqs(&c, 0), 1, "the safety net fired");
    assert_eq!(bus.device_stats(0).timer_irqs.load(Ordering::Relaxed), 1);
    bus.service(0, Events { timeout: true, ..Events::default() });
    assert_eq!(irqs(&c, 0), 1, "once");
}

#[test]
fn net_drops_frames_too_big_for_the_buffers() {
    let mem = memory();
    let (bus, _c, mut rx, _tx, host, _) = started_net(&mem, true, FEATURES);
    rx.add_chain(&mem, &[(BUF, 100, true)]);
    host.send(&frame(0, 500)).expect("send");
    host.send(&frame(1, 50)).expect("send");
    bus.service(0, Events { kicked: 1, input: 1, ..Events::default() });
    assert_eq!(rx.used_idx(&mem), 1);
    assert_eq!(rx.used_elem(&mem, 0).1, 62, "the small frame got the buffer");
    assert_eq!(bus.device_stats(0).dropped.load(Ordering::Relaxed), 1);
}

#[test]
fn net_transmit_drains_the_ring_with_one_interrupt() {
    let mem = memory();
    let (bus, c, _rx, mut tx, host, _) = started_net(&mem, true, FEATURES);
    for i in 0..3u8 {
        let f = frame(i, 200);
        let at = BUF + 0x1000 * u64::from(i);
        mem.write(at, &f).expect("w");
        // Header and payload in separate buffers, as drivers often do.
        tx.add_chain(&mem, &[(at, 12, false), (at + 12, 200, false)]);
    }
    bus.service(0, kick(1));
    assert_eq!(tx.used_idx(&mem), 3);
    assert_eq!(irqs(&c, 0), 1);
    host.set_nonblocking(true).expect("nonblocking");
    let mut buf = [0u8; 4096];
    for i in 0..3u8 {
        let n = host.recv(&mut buf).expect("a frame");
        assert_eq!(&buf[..n], frame(i, 200).as_slice());
    }
    assert!(host.recv(&mut buf).is_err(), "exactly three frames");
    assert_eq!(bus.device_stats(0).queues[1].bytes.load(Ordering::Relaxed), 600);
}

#[test]
fn net_transmit_with_a_writable_buffer_needs_reset() {
    let mem = memory();
    let (bus, _c, _rx, mut tx, _host, _) = started_net(&mem, true, FEATURES);
    tx.add_chain(&mem, &[(BUF, 12, false), (BUF + 12, 60, true)]);
    bus.service(0, kick(1));
    assert!(needs_reset(&mem, 0));
}

/// A tap whose interface was deleted: every ioctl says EBADFD.
struct GoneTap;

impl TapControl for GoneTap {
    fn set_vnet_hdr_size(&self, _: usize) -> std::io::Result<()> {
        Err(std::io::Error::from_raw_os_error(libc::EBADFD))
    }
    fn set_offload(&self, _: u32) -> std::io::Result<()> {
        Err(std::io::Error::from_raw_os_error(libc::EBADFD))
    }
}

/// A tap that is gone (EBADFD) is not a device reset, which would only
/// fail again forever: the bus records why the launcher must stop, naming
/// the device, and kicks the vCPU thread out of RUN to see it.
#[test]
fn a_gone_tap_stops_the_launcher() {
    let mem = memory();
    let (dev_end, _host_end) = UnixDatagram::pair().expect("socketpair");
    let net = Net::new(File::from(OwnedFd::from(dev_end)), Box::new(GoneTap), "lgtap0", true, 0);
    let (bus, _) = bus(&mem, vec![Box::new(net)]);
    let kicks = Arc::new(AtomicU64::new(0));
    let k = kicks.clone();
    bus.set_vcpu_kick(Box::new(move || {
        k.fetch_add(1, Ordering::SeqCst);
    }));
    let rx = TestRing::new(&mem, RING0, 16);
    let tx = TestRing::new(&mem, RING1, 16);
    rx.configure(&mem, 0, 0);
    tx.configure(&mem, 0, 1);
    assert!(bus.fatal().is_none());
    testring::start(&mem, &bus, 0, FEATURES);
    let why = bus.fatal().expect("the launcher must stop");
    assert!(why.contains("net0 (lgtap0)") && why.contains("TUNSETVNETHDRSZ"), "{why}");
    assert_eq!(kicks.load(Ordering::SeqCst), 1, "the vCPU thread was kicked");
}

#[test]
fn net_options_parse() {
    use net::TapSource;
    let tap = |name: &str| NetOptions { tap: TapSource::Name(name.into()), mac: None, batch: true, offload: true };
    assert_eq!("tap=tap0".parse::<NetOptions>(), Ok(tap("tap0")));
    assert_eq!("tap=t,nobatch".parse::<NetOptions>(), Ok(NetOptions { batch: false, ..tap("t") }));
    assert_eq!("tap=t,batch=off".parse::<NetOptions>(), Ok(NetOptions { batch: false, ..tap("t") }));
    assert_eq!(
        "tap=t,nooffload,nobatch".parse::<NetOptions>(),
        Ok(NetOptions { batch: false, offload: false, ..tap("t") })
    );
    assert_eq!(
        "fd=3,mac=02:aa:bb:cc:dd:0e,offload=off,batch=on".parse::<NetOptions>(),
        Ok(NetOptions {
            tap: TapSource::Fd(3),
            mac: Some([2, 0xaa, 0xbb, 0xcc, 0xdd, 0x0e]),
            batch: true,
            offload: false
        })
    );
    for bad in [
        "tap=",
        "nobatch",
        "tap=x,fast",
        "tap=averyveryverylongname",
        "tap=a,fd=3",
        "fd=-1",
        "fd=x",
        "tap=a,mac=01:00:5e:00:00:01",
        "tap=a,mac=52:54:00:12:34",
        "tap=a,mac=52:54:00:12:34:zz",
        "tap=a,batch=maybe",
    ] {
        assert!(bad.parse::<NetOptions>().is_err(), "{bad:?} was accepted");
    }
}

/// The default MAC: stable for a tap name, different between names,
/// locally administered and unicast; and `with_mac` is what the config
/// space shows.
#[test]
fn net_default_and_chosen_mac() {
    assert_eq!(net::default_mac("lgtap0"), net::default_mac("lgtap0"));
    let macs: Vec<[u8; 6]> =
        ["tap0", "tap1", "lgtap0", "lgtap1", "br0-guest"].iter().map(|n| net::default_mac(n)).collect();
    for (i, a) in macs.iter().enumerate() {
        assert!(macs[i + 1..].iter().all(|b| b != a), "{a:02x?} twice");
        assert_eq!(a[0] & 3, 2, "locally administered unicast");
    }
    assert_eq!(net::mac_text(&[0x52, 0x54, 0, 0xab, 1, 0xff]), "52:54:00:ab:01:ff");
    let mem = memory();
    let (dev_end, _host_end) = UnixDatagram::pair().expect("pair");
    let ctl = FakeTapCtl::default();
    let dev = Net::new(File::from(OwnedFd::from(dev_end)), Box::new(ctl), "x", true, 0).with_mac([2, 1, 2, 3, 4, 5]);
    let (_bus, _) = bus(&mem, vec![Box::new(dev)]);
    let cfg = read(&mem, LguestBus::new(MEM).desc_addr(0) + offset_of!(LguestDeviceDesc, config) as u64, 6);
    assert_eq!(cfg, [2, 1, 2, 3, 4, 5]);
}

// ---------------------------------------------------------------------------
// The device thread and the vCPU path.
// ---------------------------------------------------------------------------

#[test]
fn device_thread_serves_kicks_and_shuts_down() {
    let mem = memory();
    let (bus, c) = bus(&mem, vec![Box::new(Rng)]);
    let mut ring = started_rng(&mem, &bus, FEATURES);
    std::thread::scope(|s| {
        s.spawn(|| bus.run_device(0));
        ring.add_chain(&mem, &[(BUF, 32, true)]);
        // The kick arrives as the vCPU thread would pass it on.
        assert!(bus.notify(LguestBus::new(MEM).vq_addr(0, 0)));
        let t = std::time::Instant::now();
        while ring.used_idx(&mem) == 0 && t.elapsed() < std::time::Duration::from_secs(5) {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert_eq!(ring.used_idx(&mem), 1);
        assert_eq!(irqs(&c, 0), 1);
        bus.shutdown();
    });
    assert_eq!(bus.device_stats(0).queues[0].kicks.load(Ordering::Relaxed), 1);
    assert!(
        bus.stats().contains("rng (irq 1):\n  queue 0: 1 kicks, 1 interrupts, 1 chains, 32 bytes"),
        "{}",
        bus.stats()
    );
}

#[test]
fn notifications_that_mean_nothing_are_refused() {
    let mem = memory();
    let (bus, _) = bus(&mem, vec![Box::new(Rng)]);
    let lb = LguestBus::new(MEM);
    assert!(!bus.notify(lb.desc_addr(1)), "an empty slot");
    assert!(!bus.notify(lb.vq_addr(0, 1)), "a queue the device lacks");
    assert!(!bus.notify(lb.desc_addr(0) + 4));
    assert!(!bus.notify(0x1000));
}

#[test]
fn vcpu_exits_reach_the_bus() {
    use crate::dev::ExitData;
    use crate::exit::{handle_exit, Action};
    let mem = memory();
    let (bus, _) = bus(&mem, vec![Box::new(Rng)]);
    let lb = LguestBus::new(MEM);
    mem.write(lb.desc_addr(0) + offset_of!(LguestDeviceDesc, status) as u64, &VIRTIO_STATUS_ACKNOWLEDGE.to_le_bytes())
        .expect("w");
    let exit = ExitData { notify_addr: lb.desc_addr(0), ..ExitData::new(lguest_abi::LGUEST_EXIT_NOTIFY) };
    let mut out = Vec::new();
    assert_eq!(handle_exit(&exit, &mem, Some(&bus), &mut out).expect("handled"), Action::Continue);
    assert_eq!(bus.acked_status(0), VIRTIO_STATUS_ACKNOWLEDGE);
    assert!(out.is_empty());
}

#[test]
fn chain_reader_and_writer_cross_buffers() {
    let mem = memory();
    let chain = Chain {
        head: 0,
        readable: vec![chain::Buf { addr: BUF, len: 3 }, chain::Buf { addr: BUF + 0x100, len: 5 }],
        writable: vec![chain::Buf { addr: BUF + 0x200, len: 2 }, chain::Buf { addr: BUF + 0x300, len: 4 }],
    };
    mem.write(BUF, b"abc").expect("w");
    mem.write(BUF + 0x100, b"defgh").expect("w");
    let mut r = chain.reader();
    let mut two = [0u8; 2];
    assert_eq!(r.read(mem.ram(), &mut two), 2);
    assert_eq!(&two, b"ab");
    assert_eq!(r.read_to_vec(mem.ram(), 100), b"cdefgh");
    let mut w = chain.writer();
    assert_eq!(w.write(mem.ram(), b"123456789"), 6);
    assert_eq!(w.written(), 6);
    assert_eq!(read(&mem, BUF + 0x200, 2), b"12");
    assert_eq!(read(&mem, BUF + 0x300, 4), b"3456");
}

#[test]
fn chains_longer_than_4_gib_are_refused() {
    let mem = GuestMemory::new(8 << 20, 1).expect("memory");
    let ring = TestRing::new(&mem, RING0, 16);
    let table = BUF;
    for i in 0..1024u64 {
        let e = table + 16 * i;
        mem.write(e, &0x1000u64.to_le_bytes()).expect("w");
        mem.write(e + 8, &((7u32 << 20) - 0x1000).to_le_bytes()).expect("w");
        mem.write(e + 12, &(if i == 1023 { 2u16 } else { 3 }).to_le_bytes()).expect("w");
        // CAST: i < 1023 here.
        mem.write(e + 14, &((i + 1) as u16).to_le_bytes()).expect("w");
    }
    ring.set_desc(&mem, 0, table, 1024 * 16, 4, 0);
    assert_eq!(chain::walk(mem.ram(), ring.desc, ring.size, 0), Err(ChainError::TooLong));
}
