// SPDX-License-Identifier: GPL-2.0
//! `blk`: checks the virtio disk. Command line (all optional):
//!
//! - `sectors=N`: how many sectors to test (default 256, at most the
//!   disk's size);
//! - `start=S`: the first sector (default 0);
//! - `chunk=C`: sectors per request (default 32);
//! - `hold`: after the check, print `blk: holding` and sleep forever
//!   (for a test that kills the launcher after the flush).
//!
//! On a writable disk it writes a pattern over the sectors (each sector's
//! bytes depend on its number, so a misplaced write shows), flushes, reads
//! everything back, checks it, and powers off with
//!
//! ```text
//! blk: wrote N sectors, flushed, verified OK
//! ```
//!
//! On a read-only disk (`VIRTIO_BLK_F_RO`) it checks that a write fails
//! with an error and that reading works, and powers off with `blk:
//! read-only: write refused (...), read N sectors OK`. Anything else (no
//! disk, an I/O error, a mismatch) crashes the guest with the reason.
#![no_std]
#![no_main]

extern crate alloc;

use alloc::vec;

use lguest_guest::bus;
use lguest_guest::virtio::Blk;
use lguest_guest::{crash_fmt, entry, poweroff_fmt, println, Args};

entry!(main);

/// Byte `i` of sector `sector` in the test pattern.
fn pattern(sector: u64, i: usize) -> u8 {
    let x = sector.wrapping_mul(0x9e37_79b9).wrapping_add(i as u64 * 131 + 7);
    (x ^ (x >> 8) ^ (x >> 16)) as u8
}

/// The value of `name=` on the command line, or `default`.
fn arg(args: &Args, name: &str, default: u64) -> u64 {
    for w in args {
        if let Some(v) = w.strip_prefix(name).and_then(|r| r.strip_prefix('=')) {
            match v.parse() {
                Ok(n) => return n,
                Err(_) => crash_fmt(format_args!("blk: bad {name}={v}")),
            }
        }
    }
    default
}

fn main(args: Args) -> ! {
    if let Err(e) = bus::init() {
        crash_fmt(format_args!("blk: interrupts: {e}"));
    }
    let mut blk = match Blk::open() {
        Ok(Some(b)) => b,
        Ok(None) => crash_fmt(format_args!("blk: no block device on the lguest bus")),
        Err(e) => crash_fmt(format_args!("blk: {e}")),
    };
    let capacity = blk.capacity();
    let start = arg(&args, "start", 0);
    let chunk = arg(&args, "chunk", 32).clamp(1, 256);
    let sectors = arg(&args, "sectors", 256).min(capacity.saturating_sub(start));
    println!("blk: disk of {capacity} sectors{}", if blk.readonly() { ", read-only" } else { "" });
    if sectors == 0 {
        crash_fmt(format_args!("blk: nothing to test ({capacity} sectors, start {start})"));
    }
    let mut buf = vec![0u8; chunk as usize * Blk::SECTOR];

    if blk.readonly() {
        buf.fill(0x5a);
        match blk.write(start, &buf[..Blk::SECTOR]) {
            Ok(()) => crash_fmt(format_args!("blk: read-only device accepted a write")),
            Err(e) => {
                let mut s = start;
                while s < start + sectors {
                    let n = chunk.min(start + sectors - s);
                    if let Err(e) = blk.read(s, &mut buf[..n as usize * Blk::SECTOR]) {
                        crash_fmt(format_args!("blk: read of sector {s}: {e}"));
                    }
                    s += n;
                }
                println!("blk: read-only: write refused ({e}), read {sectors} sectors OK");
                poweroff_fmt(format_args!("blk: read-only: write refused ({e}), read {sectors} sectors OK"))
            }
        }
    }

    let t0 = lguest_guest::clock::now_ns();
    let mut s = start;
    while s < start + sectors {
        let n = chunk.min(start + sectors - s);
        for (k, sector) in buf.chunks_mut(Blk::SECTOR).take(n as usize).enumerate() {
            for (i, b) in sector.iter_mut().enumerate() {
                *b = pattern(s + k as u64, i);
            }
        }
        if let Err(e) = blk.write(s, &buf[..n as usize * Blk::SECTOR]) {
            crash_fmt(format_args!("blk: write of sectors {s}..{}: {e}", s + n));
        }
        s += n;
    }
    if let Err(e) = blk.flush() {
        crash_fmt(format_args!("blk: flush: {e}"));
    }
    let mut s = start;
    while s < start + sectors {
        let n = chunk.min(start + sectors - s);
        buf.fill(0);
        if let Err(e) = blk.read(s, &mut buf[..n as usize * Blk::SECTOR]) {
            crash_fmt(format_args!("blk: read of sectors {s}..{}: {e}", s + n));
        }
        for (k, sector) in buf.chunks(Blk::SECTOR).take(n as usize).enumerate() {
            let num = s + k as u64;
            if let Some(i) = sector.iter().enumerate().position(|(i, &b)| b != pattern(num, i)) {
                crash_fmt(format_args!(
                    "blk: sector {num} byte {i} reads {:#04x}, wrote {:#04x}",
                    sector[i],
                    pattern(num, i)
                ));
            }
        }
        s += n;
    }
    let t1 = lguest_guest::clock::now_ns();
    println!(
        "blk: {} us, {} interrupts, {} kicks",
        (t1 - t0) / 1000,
        bus::interrupts_taken(blk.slot()),
        bus::kicks(blk.slot())
    );
    println!("blk: wrote {sectors} sectors, flushed, verified OK");
    if args.iter().any(|w| w == "hold") {
        // For the durability test: the launcher is killed from outside
        // now; what was flushed must be in the image.
        println!("blk: holding");
        loop {
            lguest_guest::clock::sleep_ns(1_000_000_000);
        }
    }
    poweroff_fmt(format_args!("blk: wrote {sectors} sectors, flushed, verified OK"))
}
