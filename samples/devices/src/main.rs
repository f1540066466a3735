// SPDX-License-Identifier: GPL-2.0
//! `devices`: the demo guest of the lguest bus. It lists the devices the
//! launcher gave it (on the early console), then, over the virtio console
//! when there is one (else the early console):
//!
//! - greets;
//! - reads 16 bytes from the entropy source (halting while it waits) and
//!   prints them in hex;
//! - on a disk: writes a sector (the last one) and reads it back, or only
//!   reads sector 0 of a read-only disk;
//! - on a network card: prints its MAC address and offloads;
//!
//! and powers off with "devices: done". A device that fails crashes the
//! guest with the error. With `echo` on the command line it also reads one
//! line from the virtio console (the launcher's stdin) and writes it back
//! as `devices: echo: LINE` (a console round trip). With `flood` it
//! writes lines to the virtio console forever, with `floodhc` to the
//! hypercall console (for the launcher's stop tests: its stdout is a pipe
//! nobody reads).
#![no_std]
#![no_main]

extern crate alloc;

use core::fmt::{self, Write};

use lguest_guest::bus::{self, BusError};
use lguest_guest::net::VirtioNet;
use lguest_guest::virtio::{self, Blk, LguestHal};
use lguest_guest::virtio_drivers::device::console::VirtIOConsole;
use lguest_guest::{entry, poweroff, println, Args};

entry!(main);

type Console = VirtIOConsole<LguestHal, bus::LguestTransport>;

/// Where the demo writes: the virtio console if there is one.
struct Out(Option<Console>);

impl Write for Out {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        match &mut self.0 {
            Some(c) => c.write_str(s),
            None => {
                lguest_guest::print!("{s}");
                Ok(())
            }
        }
    }
}

/// A failure, as the crash message.
struct Failed(alloc::string::String);

impl fmt::Display for Failed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<BusError> for Failed {
    fn from(e: BusError) -> Self {
        Failed(alloc::format!("devices: {e}"))
    }
}

impl From<fmt::Error> for Failed {
    fn from(_: fmt::Error) -> Self {
        Failed("devices: console write failed".into())
    }
}

fn fail(what: &str, e: impl fmt::Display) -> Failed {
    Failed(alloc::format!("devices: {what}: {e}"))
}

/// A page fault: crash with where it happened (more than the host says).
fn page_fault(frame: &mut lguest_guest::TrapFrame) {
    let cr2 = lguest_guest::data::cr2();
    lguest_guest::crash_fmt(format_args!(
        "devices: page fault at {cr2:#x} (error {:#x}) at rip {:#x} rsp {:#x}",
        frame.error, frame.rip, frame.rsp
    ))
}

/// Reads one line (without its newline) from the console, waiting (halted)
/// for input; gives up after 30 s.
fn read_line(c: &mut Console) -> Result<alloc::vec::Vec<u8>, Failed> {
    let deadline = lguest_guest::clock::now_ns() + 30_000_000_000;
    let mut line = alloc::vec::Vec::new();
    loop {
        match c.recv(true).map_err(|e| fail("console read", e))? {
            Some(b'\n') => return Ok(line),
            Some(b) => line.push(b),
            None if lguest_guest::clock::now_ns() > deadline => {
                return Err(Failed("devices: echo: no line on the console within 30 s".into()))
            }
            None => {
                bus::wait_until(|| matches!(c.recv(false), Ok(Some(_))) || lguest_guest::clock::now_ns() > deadline)
            }
        }
    }
}

fn main(args: Args) -> Result<(), Failed> {
    let echo = args.iter().any(|w| w == "echo");
    lguest_guest::interrupts::set_trap_handler(lguest_guest::interrupts::PAGE_FAULT, page_fault)
        .map_err(|e| fail("interrupts", e))?;
    bus::init().map_err(|e| fail("interrupts", e))?;
    let devices = bus::devices();
    println!("devices: {} on the lguest bus at {:#x}", devices.len(), bus::bus().base);
    for d in &devices {
        println!(
            "devices: slot {}: {} (type {}), irq {}, {} queues{}",
            d.index,
            bus::device_name(d.device_type),
            d.device_type,
            d.irq,
            d.num_queues,
            d.problem.map_or(alloc::string::String::new(), |p| alloc::format!(" [ignored: {p}]"))
        );
    }

    if args.iter().any(|w| w == "floodhc") {
        for n in 0u64.. {
            println!("devices: floodhc: line {n} of the hypercall console flood, which never ends");
        }
    }
    let mut out = Out(virtio::console()?);
    let via = if out.0.is_some() { "the virtio console" } else { "the early console (no virtio console)" };
    writeln!(out, "devices: hello from the lguest guest over {via}")?;
    if args.iter().any(|w| w == "flood") {
        for n in 0u64.. {
            writeln!(out, "devices: flood: line {n} of the virtio console flood, which never ends")?;
        }
    }
    if echo {
        let Some(c) = out.0.as_mut() else {
            return Err(Failed("devices: echo: no virtio console".into()));
        };
        let line = read_line(c)?;
        writeln!(out, "devices: echo: {}", alloc::string::String::from_utf8_lossy(&line))?;
    }

    match virtio::Rng::open()? {
        Some(mut rng) => {
            let mut bytes = [0u8; 16];
            let n = rng.fill(&mut bytes).map_err(|e| fail("rng", e))?;
            write!(out, "devices: rng: {n} bytes:")?;
            for b in &bytes[..n] {
                write!(out, " {b:02x}")?;
            }
            writeln!(out)?;
        }
        None => writeln!(out, "devices: rng: none")?,
    }

    match Blk::open()? {
        Some(mut blk) => {
            let sectors = blk.capacity();
            let mut buf = [0u8; Blk::SECTOR];
            if blk.readonly() || sectors == 0 {
                blk.read(0, &mut buf).map_err(|e| fail("blk read", e))?;
                writeln!(out, "devices: blk: {sectors} sectors, read-only; sector 0 starts {:02x?}", &buf[..8])?;
            } else {
                let last = sectors - 1;
                let text = b"lguest-rs devices demo sector\n";
                buf[..text.len()].copy_from_slice(text);
                blk.write(last, &buf).map_err(|e| fail("blk write", e))?;
                blk.flush().map_err(|e| fail("blk flush", e))?;
                let mut back = [0u8; Blk::SECTOR];
                blk.read(last, &mut back).map_err(|e| fail("blk read", e))?;
                if back != buf {
                    return Err(Failed("devices: blk: sector read back differs".into()));
                }
                writeln!(out, "devices: blk: {sectors} sectors; wrote, flushed and read back sector {last}: OK")?;
            }
        }
        None => writeln!(out, "devices: blk: none")?,
    }

    match VirtioNet::<256>::open()? {
        Some(net) => {
            let m = net.mac();
            writeln!(
                out,
                "devices: net: MAC {:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}, link {}, checksum offload {}, TSO {}",
                m[0],
                m[1],
                m[2],
                m[3],
                m[4],
                m[5],
                if net.link_up() { "up" } else { "down" },
                if net.csum() { "on" } else { "off" },
                if net.tso() { "on" } else { "off" },
            )?;
        }
        None => writeln!(out, "devices: net: none")?,
    }

    writeln!(
        out,
        "devices: heap {} KiB used of {} MiB",
        lguest_guest::heap::used() / 1024,
        lguest_guest::heap::size() >> 20
    )?;
    writeln!(out, "devices: done, powering off")?;
    drop(out);
    poweroff("devices: done")
}
