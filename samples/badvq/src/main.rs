// SPDX-License-Identifier: GPL-2.0
//! `badvq`: a hostile driver. It sets up the entropy device's queue itself
//! (its own split ring, no virtio-drivers queue) and feeds the launcher one
//! malformed request after another:
//!
//! - a buffer outside guest memory;
//! - a descriptor chain that loops;
//! - a buffer the device may only read, where it must write;
//! - a buffer of 4 GiB - 1 bytes;
//! - a head index beyond the ring;
//! - an available index far ahead of the ring;
//! - an indirect table pointing outside guest memory.
//!
//! After each it waits for the device to set `DEVICE_NEEDS_RESET`, prints
//! `badvq: CASE: device needs reset`, resets the device and sets it up
//! again. At the end it makes one good request (16 bytes of entropy) to
//! show the device and the launcher survived, and powers off with `badvq:
//! done`. A case the device accepts, or a good request that fails, crashes
//! the guest.
#![no_std]
#![no_main]

extern crate alloc;

use core::ptr::{read_volatile, write_volatile};

use lguest_guest::bus::{self, LguestTransport};
use lguest_guest::virtio_drivers::transport::{DeviceStatus, Transport};
use lguest_guest::{clock, crash_fmt, entry, poweroff, println, Args};

entry!(main);

/// The virtio entropy device.
const RNG: u32 = 4;
/// Queue size.
const QSIZE: u16 = 16;
/// VIRTIO_F_VERSION_1.
const VERSION_1: u64 = 1 << 32;
/// VIRTIO_F_INDIRECT_DESC.
const INDIRECT_DESC: u64 = 1 << 28;
/// Descriptor flags.
const NEXT: u16 = 1;
const WRITE: u16 = 2;
const INDIRECT: u16 = 4;

/// The ring memory: descriptors, then the available ring, then the used
/// ring, a page each, and a page of buffers (identity mapped: virtual =
/// guest-physical).
struct Ring {
    base: u64,
    avail_idx: u16,
    used_seen: u16,
}

impl Ring {
    fn new() -> Self {
        let layout =
            core::alloc::Layout::from_size_align(4 * 4096, 4096).unwrap_or_else(|_| crash_fmt(format_args!("layout")));
        // SAFETY: a non-zero size; the memory is ours until the guest ends.
        let p = unsafe { alloc::alloc::alloc_zeroed(layout) };
        if p.is_null() {
            crash_fmt(format_args!("badvq: no memory for the ring"));
        }
        Self { base: p as u64, avail_idx: 0, used_seen: 0 }
    }

    fn desc_pa(&self) -> u64 {
        self.base
    }
    fn avail_pa(&self) -> u64 {
        self.base + 4096
    }
    fn used_pa(&self) -> u64 {
        self.base + 2 * 4096
    }
    fn buf_pa(&self) -> u64 {
        self.base + 3 * 4096
    }

    /// Writes descriptor `i`.
    fn desc(&self, i: u16, addr: u64, len: u32, flags: u16, next: u16) {
        let d = (self.base + 16 * u64::from(i)) as *mut u8;
        // SAFETY: descriptor `i` (< 256) lies in the ring's first page,
        // which this guest owns; the device only reads it.
        unsafe {
            write_volatile(d.cast::<u64>(), addr);
            write_volatile(d.add(8).cast::<u32>(), len);
            write_volatile(d.add(12).cast::<u16>(), flags);
            write_volatile(d.add(14).cast::<u16>(), next);
        }
    }

    /// Offers `head` in the available ring and advances its index by
    /// `step` (1 normally).
    fn offer(&mut self, head: u16, step: u16) {
        let a = self.avail_pa() as *mut u16;
        // SAFETY: the available ring is the ring's second page: flags, idx,
        // then QSIZE entries.
        unsafe {
            write_volatile(a.add(2 + usize::from(self.avail_idx % QSIZE)), head);
            self.avail_idx = self.avail_idx.wrapping_add(step);
            core::sync::atomic::fence(core::sync::atomic::Ordering::SeqCst);
            write_volatile(a.add(1), self.avail_idx);
        }
    }

    /// The used ring's index.
    fn used_idx(&self) -> u16 {
        // SAFETY: the used ring's index, in the ring's third page.
        unsafe { read_volatile((self.used_pa() as *const u16).add(1)) }
    }

    /// The length of used entry `n`.
    fn used_len(&self, n: u16) -> u32 {
        let e = self.used_pa() + 4 + 8 * u64::from(n % QSIZE);
        // SAFETY: used entry `n % QSIZE`, in the ring's third page.
        unsafe { read_volatile((e + 4) as *const u32) }
    }
}

/// Resets the device and sets its one queue up on a fresh ring.
fn setup(t: &mut LguestTransport, features: u64) -> Ring {
    t.set_status(DeviceStatus::empty());
    if t.get_status() != DeviceStatus::empty() {
        crash_fmt(format_args!("badvq: the device did not reset: {:?}", t.get_status()));
    }
    t.set_status(DeviceStatus::ACKNOWLEDGE | DeviceStatus::DRIVER);
    let offered = t.read_device_features();
    t.write_driver_features(offered & features);
    t.set_status(DeviceStatus::ACKNOWLEDGE | DeviceStatus::DRIVER | DeviceStatus::FEATURES_OK);
    if !t.features_ok() {
        crash_fmt(format_args!("badvq: features refused"));
    }
    let ring = Ring::new();
    t.queue_set(0, u32::from(QSIZE), ring.desc_pa(), ring.avail_pa(), ring.used_pa());
    t.set_status(
        DeviceStatus::ACKNOWLEDGE | DeviceStatus::DRIVER | DeviceStatus::FEATURES_OK | DeviceStatus::DRIVER_OK,
    );
    ring
}

/// Waits up to 5 s for `cond`.
fn wait(mut cond: impl FnMut() -> bool) -> bool {
    let deadline = clock::now_ns() + 5_000_000_000;
    bus::wait_until(|| cond() || clock::now_ns() > deadline);
    cond()
}

fn main(_args: Args) {
    if let Err(e) = bus::init() {
        crash_fmt(format_args!("badvq: interrupts: {e}"));
    }
    let Some(info) = bus::find(RNG) else { crash_fmt(format_args!("badvq: no entropy device")) };
    let mut t = LguestTransport::new(info).unwrap_or_else(|e| crash_fmt(format_args!("badvq: {e}")));
    let kick = t.kicker(0);
    let outside = 64u64 << 30;
    type Case = (&'static str, u64, fn(&mut Ring, u64));
    let cases: [Case; 7] = [
        ("buffer outside guest memory", VERSION_1, |r, out| {
            r.desc(0, out, 16, WRITE, 0);
            r.offer(0, 1);
        }),
        ("looping chain", VERSION_1, |r, _| {
            let b = r.buf_pa();
            r.desc(0, b, 8, WRITE | NEXT, 1);
            r.desc(1, b + 8, 8, WRITE | NEXT, 0);
            r.offer(0, 1);
        }),
        ("read-only buffer for the device to fill", VERSION_1, |r, _| {
            r.desc(0, r.buf_pa(), 16, 0, 0);
            r.offer(0, 1);
        }),
        ("buffer of 4 GiB - 1 bytes", VERSION_1, |r, _| {
            r.desc(0, r.buf_pa(), u32::MAX, WRITE, 0);
            r.offer(0, 1);
        }),
        ("head index beyond the ring", VERSION_1, |r, _| {
            r.offer(999, 1);
        }),
        ("available index far ahead", VERSION_1, |r, _| {
            r.desc(0, r.buf_pa(), 16, WRITE, 0);
            r.offer(0, 1000);
        }),
        ("indirect table outside guest memory", VERSION_1 | INDIRECT_DESC, |r, out| {
            r.desc(0, out, 64, INDIRECT, 0);
            r.offer(0, 1);
        }),
    ];
    for (name, features, make) in cases {
        let mut ring = setup(&mut t, features);
        make(&mut ring, outside);
        kick.kick();
        if !wait(|| t.needs_reset()) {
            crash_fmt(format_args!(
                "badvq: {name}: the device did not ask for a reset (status {:?}, used idx {})",
                t.get_status(),
                ring.used_idx()
            ));
        }
        println!("badvq: {name}: device needs reset");
    }
    // The device and the launcher survived: a good request works.
    let mut ring = setup(&mut t, VERSION_1);
    ring.desc(0, ring.buf_pa(), 16, WRITE, 0);
    ring.offer(0, 1);
    kick.kick();
    if !wait(|| ring.used_idx() != ring.used_seen) {
        crash_fmt(format_args!("badvq: the good request was not answered (status {:?})", t.get_status()));
    }
    let len = ring.used_len(ring.used_seen);
    if len != 16 || t.needs_reset() {
        crash_fmt(format_args!("badvq: the good request: {len} bytes, status {:?}", t.get_status()));
    }
    println!("badvq: good request after the resets: {len} bytes of entropy");
    poweroff("badvq: done")
}
