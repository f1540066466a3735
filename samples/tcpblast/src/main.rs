// SPDX-License-Identifier: GPL-2.0
//! `tcpblast`: TCP bulk transfer over virtio-net with smoltcp, the guest
//! side of the throughput benchmark. Command line:
//!
//! ```text
//! ip=192.168.2.2/24 peer=192.168.2.1:9999 send=67108864   connect, send N bytes, close
//! ip=192.168.2.2/24 peer=192.168.2.1:9999 recv=67108864   connect, receive N bytes, check them
//! ip=192.168.2.2/24 listen=9999 send=N | recv=N           the same, but wait for the host to connect
//! ip=192.168.2.2/24 ping=SECONDS                           only answer pings for that long
//! ip=192.168.2.2/24 ping=SECONDS pinghost=192.168.2.1      ... and ping the host 5 times
//! timeout=SECONDS                                          give up after that long (default 300)
//! notso, nocsum                                            leave out TSO, or all checksum offloads
//! irqdriven [spin=US] [busy=OFF/ON]                        work as a Linux guest does (see below)
//! sndbuf=BYTES rcvbuf=BYTES                                the TCP socket's buffers (default 4 MiB, or
//!                                                          1 MiB with a small heap, on the side that
//!                                                          moves the data; 64 KiB on the other)
//! ```
//!
//! The stream carries the pattern byte `i` = `(i * 131 + 7) % 251` (the
//! host's `lguest-tcpsink` uses the same); when receiving, the guest checks
//! every byte. It answers pings (smoltcp's `auto-icmp-echo-reply`)
//! throughout. At the end it prints the bytes, the guest-side time from the
//! connection's establishment to the last byte acknowledged (sending) or
//! received (receiving), and counters (packets, interrupts taken, kicks,
//! halts), then powers off with `tcpblast: done`. A reset connection, a
//! wrong byte or the timeout crashes the guest with the reason.
//!
//! The main loop is: poll the interface, move data, announce queued
//! buffers to the device; then, with interrupts off, arm the device's
//! interrupts and the timer for smoltcp's next deadline and halt, unless
//! there is work already. The guest spins only while there is work.
//!
//! With `irqdriven` the guest works as a Linux guest kernel does instead,
//! which is what the `irq_pending` check (and `noirqcheck`) is about:
//!
//! - the device's interrupts stay armed; its handler only counts (the
//!   "work" flag), and received frames are processed and transmit buffers
//!   reclaimed only in a NAPI poll run after such an interrupt, never by
//!   looking at the rings otherwise;
//! - every ring manipulation and kick (`Interface::poll`, which receives
//!   and transmits, the flush, the NAPI poll) runs with virtual interrupts
//!   off, as under Linux's `spin_lock_irqsave`; interrupts that arrive then
//!   are held back until interrupts come on again;
//! - when there is nothing it can do (blocked on the transmit ring or the
//!   TCP window, or waiting for data), the guest spins with interrupts on,
//!   watching the work flag and smoltcp's next deadline, for up to
//!   `spin=US` microseconds (default 50000, far more than a round trip, so
//!   it does not halt during a transfer) before it halts;
//! - with `busy=OFF/ON` it is not idle while it waits but runs a background
//!   job as a loaded kernel does: OFF microseconds in a critical section
//!   (interrupts off), then ON microseconds with interrupts on, again and
//!   again. An interrupt that comes during the critical section is held
//!   back until interrupts come on: with the `irq_pending` check it is
//!   taken then; without it, only when the guest next exits to the host
//!   while its interrupts are on.
#![no_std]
#![no_main]

extern crate alloc;

use alloc::vec;
use alloc::vec::Vec;

use lguest_guest::net::{VirtioNet, DRIVER_FEATURES};
use lguest_guest::net_features;
use lguest_guest::smoltcp::iface::{Config, Interface, SocketSet};
use lguest_guest::smoltcp::phy::ChecksumCapabilities;
use lguest_guest::smoltcp::socket::{icmp, tcp};
use lguest_guest::smoltcp::time::{Duration, Instant};
use lguest_guest::smoltcp::wire::{
    EthernetAddress, HardwareAddress, Icmpv4Packet, Icmpv4Repr, IpAddress, IpCidr, Ipv4Address,
};
use lguest_guest::{bus, clock, crash_fmt, entry, paravirt, poweroff, println, Args};

entry!(main);

/// Echo requests sent to the host with `pinghost=`, and their identifier.
const PINGS: u16 = 5;
const PING_IDENT: u16 = 0x4c47;

/// The period of the stream pattern.
const PERIOD: usize = 251;

/// Byte `i` of the stream.
fn pattern(i: u64) -> u8 {
    ((i * 131 + 7) % PERIOD as u64) as u8
}

/// What to do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Send(u64),
    Recv(u64),
    Ping(u64),
}

struct Opts {
    ip: Ipv4Address,
    prefix: u8,
    peer: Option<(Ipv4Address, u16)>,
    listen: Option<u16>,
    mode: Mode,
    timeout_s: u64,
    /// Offloads to leave out (`notso`, `nocsum`).
    no_features: u64,
    /// `irqdriven`: Linux-like interrupt-driven operation.
    irq_driven: bool,
    /// `spin=US`: how long an interrupt-driven guest spins before halting.
    spin_ns: u64,
    /// `busy=OFF/ON` (microseconds): instead of spinning idle, an
    /// interrupt-driven guest runs a background job in slices of OFF with
    /// interrupts off, each followed by ON with interrupts on.
    busy: Option<(u64, u64)>,
    /// `pinghost=A.B.C.D`: send echo requests there (in `ping=` mode).
    ping_host: Option<Ipv4Address>,
    /// `sndbuf=BYTES`, `rcvbuf=BYTES`: the TCP socket's buffers (the send
    /// buffer bounds the bytes in flight, the receive buffer the window).
    sndbuf: Option<usize>,
    rcvbuf: Option<usize>,
}

fn bad(what: &str, v: &str) -> ! {
    crash_fmt(format_args!(
        "tcpblast: bad {what} '{v}' (usage: ip=A.B.C.D/N [peer=A.B.C.D:PORT | listen=PORT] send=N|recv=N|ping=SECONDS [timeout=SECONDS])"
    ))
}

fn parse_ip(s: &str) -> Option<Ipv4Address> {
    let mut o = [0u8; 4];
    let mut parts = s.split('.');
    for b in &mut o {
        *b = parts.next()?.parse().ok()?;
    }
    parts.next().is_none().then(|| Ipv4Address::new(o[0], o[1], o[2], o[3]))
}

fn parse(args: &Args) -> Opts {
    let mut ip = None;
    let mut peer = None;
    let mut listen = None;
    let mut mode = None;
    let mut timeout_s = 300;
    let mut no_features = 0;
    let mut irq_driven = false;
    let mut spin_ns = 50_000_000;
    let mut busy = None;
    let mut ping_host = None;
    let (mut sndbuf, mut rcvbuf) = (None, None);
    for w in args {
        let (k, v) = w.split_once('=').unwrap_or((w, ""));
        let num = |v: &str| v.parse::<u64>().unwrap_or_else(|_| bad(k, v));
        match k {
            "ip" => {
                let (a, n) = v.split_once('/').unwrap_or((v, "24"));
                let a = parse_ip(a).unwrap_or_else(|| bad("ip", v));
                let n = n.parse::<u8>().ok().filter(|&n| n <= 32).unwrap_or_else(|| bad("ip", v));
                ip = Some((a, n));
            }
            "peer" => {
                let (a, p) = v.split_once(':').unwrap_or_else(|| bad("peer", v));
                let a = parse_ip(a).unwrap_or_else(|| bad("peer", v));
                peer = Some((a, p.parse().unwrap_or_else(|_| bad("peer", v))));
            }
            "listen" => listen = Some(v.parse().unwrap_or_else(|_| bad("listen", v))),
            "send" => mode = Some(Mode::Send(num(v))),
            "recv" => mode = Some(Mode::Recv(num(v))),
            "ping" => mode = Some(Mode::Ping(num(v))),
            "timeout" => timeout_s = num(v),
            "notso" => no_features |= net_features::HOST_TSO4,
            "nocsum" => no_features |= net_features::CSUM | net_features::GUEST_CSUM | net_features::HOST_TSO4,
            "irqdriven" => irq_driven = true,
            "spin" => spin_ns = num(v).saturating_mul(1000),
            "busy" => {
                let (off, on) = v.split_once('/').unwrap_or((v, "1"));
                let (off, on) = (num(off), num(on));
                if !(1..=1_000_000).contains(&off) || on > 1_000_000 {
                    bad(k, v);
                }
                busy = Some((off * 1000, on * 1000));
            }
            "pinghost" => ping_host = Some(parse_ip(v).unwrap_or_else(|| bad("pinghost", v))),
            // smoltcp's window field: at most 1 GiB with scaling.
            "sndbuf" | "rcvbuf" => {
                let n = num(v);
                if !(4096..=1 << 30).contains(&n) {
                    bad(k, v);
                }
                *(if k == "sndbuf" { &mut sndbuf } else { &mut rcvbuf }) = Some(n as usize);
            }
            _ => bad("word", w),
        }
    }
    let Some((ip, prefix)) = ip else { bad("command line", args.as_str()) };
    let Some(mode) = mode else { bad("command line", args.as_str()) };
    if !matches!(mode, Mode::Ping(_)) && peer.is_none() && listen.is_none() {
        bad("command line (send and recv need peer= or listen=)", args.as_str());
    }
    Opts {
        ip,
        prefix,
        peer,
        listen,
        mode,
        timeout_s,
        no_features,
        irq_driven,
        spin_ns,
        busy,
        ping_host,
        sndbuf,
        rcvbuf,
    }
}

/// `spin_lock_irqsave`'s half: interrupts off, returning the old flag for
/// [`paravirt::restore_fl`].
fn irq_save() -> u64 {
    let flags = paravirt::save_fl();
    paravirt::irq_disable();
    flags
}

/// [`paravirt::restore_fl`], counting in `held` the times an interrupt
/// came while interrupts were off (the host set `irq_pending`).
fn irq_restore(flags: u64, held: &mut u64) {
    if flags != 0 && lguest_guest::data::irq_pending() != 0 {
        *held += 1;
    }
    paravirt::restore_fl(flags);
}

/// Runs the background job (a busy loop) from `t` for `ns` nanoseconds;
/// returns the time at the end.
fn background(mut t: u64, ns: u64) -> u64 {
    let end = t.saturating_add(ns);
    while t < end {
        core::hint::spin_loop();
        t = clock::now_ns();
    }
    t
}

fn now() -> Instant {
    Instant::from_micros((clock::now_ns() / 1000) as i64)
}

/// The pattern from offset `off` on, ready to copy: `table[off % 251..]`
/// is the stream from `off` for at least `table.len() - 251` bytes.
fn pattern_table(len: usize) -> Vec<u8> {
    (0..len + PERIOD).map(|i| pattern(i as u64)).collect()
}

fn main(args: Args) -> ! {
    let o = parse(&args);
    if let Err(e) = bus::init() {
        crash_fmt(format_args!("tcpblast: interrupts: {e}"));
    }
    let mut net = match VirtioNet::<256>::open_with(DRIVER_FEATURES & !o.no_features) {
        Ok(Some(n)) => n,
        Ok(None) => crash_fmt(format_args!("tcpblast: no network device on the lguest bus")),
        Err(e) => crash_fmt(format_args!("tcpblast: net: {e}")),
    };
    let mac = net.mac();
    println!(
        "tcpblast: MAC {:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}, ip {}/{}, checksum offload {}, TSO {}, heap {} MiB",
        mac[0],
        mac[1],
        mac[2],
        mac[3],
        mac[4],
        mac[5],
        o.ip,
        o.prefix,
        if net.csum() { "on" } else { "off" },
        if net.tso() { "on" } else { "off" },
        lguest_guest::heap::size() >> 20
    );

    let mut config = Config::new(HardwareAddress::Ethernet(EthernetAddress(mac)));
    config.random_seed = clock::rdtsc();
    let mut iface = Interface::new(config, &mut net, now());
    iface.update_ip_addrs(|a| {
        let _ = a.push(IpCidr::new(IpAddress::Ipv4(o.ip), o.prefix));
    });

    // Socket buffers: the send buffer bounds the bytes in flight, the
    // receive buffer the window (over 64 KiB turns window scaling on).
    let big = lguest_guest::heap::size() >= 48 << 20;
    let (rx_len, tx_len) = match o.mode {
        Mode::Send(_) => (64 << 10, if big { 4 << 20 } else { 1 << 20 }),
        Mode::Recv(_) => (if big { 4 << 20 } else { 1 << 20 }, 64 << 10),
        Mode::Ping(_) => (4 << 10, 4 << 10),
    };
    let (rx_len, tx_len) = (o.rcvbuf.unwrap_or(rx_len), o.sndbuf.unwrap_or(tx_len));
    let mut sock =
        tcp::Socket::new(tcp::SocketBuffer::new(vec![0u8; rx_len]), tcp::SocketBuffer::new(vec![0u8; tx_len]));
    sock.set_nagle_enabled(false);
    let mut sockets = SocketSet::new(vec![]);
    let handle = sockets.add(sock);
    if let Mode::Ping(_) = o.mode {
        // No connection.
    } else if let Some(port) = o.listen {
        if let Err(e) = sockets.get_mut::<tcp::Socket>(handle).listen(port) {
            crash_fmt(format_args!("tcpblast: listen {port}: {e}"));
        }
        println!("tcpblast: listening on port {port}");
    } else if let Some((peer, port)) = o.peer {
        let local = 49152 + (clock::rdtsc() % 16384) as u16;
        if let Err(e) = sockets.get_mut::<tcp::Socket>(handle).connect(iface.context(), (peer, port), local) {
            crash_fmt(format_args!("tcpblast: connect: {e}"));
        }
        println!("tcpblast: connecting to {peer}:{port}");
    }

    // Pings to the host: an ICMP socket, one echo request every 200 ms.
    let icmp_handle = o.ping_host.map(|_| {
        let rx = icmp::PacketBuffer::new(vec![icmp::PacketMetadata::EMPTY; 8], vec![0u8; 2048]);
        let tx = icmp::PacketBuffer::new(vec![icmp::PacketMetadata::EMPTY; 8], vec![0u8; 2048]);
        let mut s = icmp::Socket::new(rx, tx);
        if let Err(e) = s.bind(icmp::Endpoint::Ident(PING_IDENT)) {
            crash_fmt(format_args!("tcpblast: icmp bind: {e}"));
        }
        sockets.add(s)
    });
    let (mut pings_sent, mut ping_replies, mut next_ping) = (0u16, 0u16, 0u64);

    let table = pattern_table(256 << 10);
    let t_boot = clock::now_ns();
    let deadline = t_boot + o.timeout_s * clock::NSEC_PER_SEC;
    let ping_end = if let Mode::Ping(s) = o.mode { t_boot + s * clock::NSEC_PER_SEC } else { u64::MAX };
    let (mut moved, mut t_start, mut t_end) = (0u64, None::<u64>, None::<u64>);
    let mut was_connected = false;
    let mut closing = false;
    // A connection refused (the host's listener not there yet) is retried
    // every half second, as the host's tcpsink retries its connect.
    let (mut refused, mut retry_at) = (0u64, None::<u64>);
    let (mut halts, mut polls) = (0u64, 0u64);
    // Interrupt-driven mode: the device's interrupts seen so far, NAPI
    // polls run, and waits that spun (how many of those ended by an
    // interrupt, not by smoltcp's deadline, and the time they took).
    let slot = net.transport().info().index;
    let mut irqs_seen = bus::interrupts_taken(slot);
    let (mut napis, mut spins, mut spin_wakes, mut spin_ns) = (0u64, 0u64, 0u64, 0u64);
    // Interrupt-driven mode: critical sections an interrupt came in, and
    // (without the `irq_pending` check) waits that began with one held
    // back, and how long those took to end.
    let (mut held, mut held_waits, mut held_wait_ns) = (0u64, 0u64, 0u64);
    // `busy=`: the background job's time, and its critical sections an
    // interrupt came in.
    let (mut busy_ns, mut busy_held) = (0u64, 0u64);
    if o.irq_driven {
        let f = irq_save();
        net.set_irq_driven(true);
        paravirt::restore_fl(f);
        println!("tcpblast: interrupt-driven, spinning up to {} us before halting", o.spin_ns / 1000);
    }

    loop {
        if o.irq_driven {
            // The work flag: an interrupt came, or re-arming found work.
            let n = bus::interrupts_taken(slot);
            let napi = n != irqs_seen || net.napi_due();
            irqs_seen = n;
            let f = irq_save();
            if napi {
                net.napi_poll();
                napis += 1;
            }
            iface.poll(now(), &mut net, &mut sockets);
            if napi {
                net.napi_complete();
            }
            irq_restore(f, &mut held);
        } else {
            iface.poll(now(), &mut net, &mut sockets);
        }
        polls += 1;
        let t = clock::now_ns();
        if let (Some(h), Some(host)) = (icmp_handle, o.ping_host) {
            let s = sockets.get_mut::<icmp::Socket>(h);
            if pings_sent < PINGS && t >= next_ping && s.can_send() {
                let repr = Icmpv4Repr::EchoRequest { ident: PING_IDENT, seq_no: pings_sent, data: b"lguest-rs ping" };
                let mut buf = vec![0u8; repr.buffer_len()];
                repr.emit(&mut Icmpv4Packet::new_unchecked(&mut buf[..]), &ChecksumCapabilities::default());
                if s.send_slice(&buf, IpAddress::Ipv4(host)).is_ok() {
                    pings_sent += 1;
                    next_ping = t + 200_000_000;
                }
            }
            let mut rbuf = [0u8; 256];
            while let Ok((n, _)) = s.recv_slice(&mut rbuf) {
                let reply = Icmpv4Packet::new_checked(&rbuf[..n])
                    .ok()
                    .and_then(|p| Icmpv4Repr::parse(&p, &ChecksumCapabilities::default()).ok());
                if let Some(Icmpv4Repr::EchoReply { ident: PING_IDENT, .. }) = reply {
                    ping_replies += 1;
                }
            }
        }
        if t >= ping_end {
            break;
        }
        if t >= deadline {
            crash_fmt(format_args!("tcpblast: timed out after {} s with {moved} bytes moved", o.timeout_s));
        }
        let s = sockets.get_mut::<tcp::Socket>(handle);
        if let (Some((peer, port)), false, None, false) =
            (o.peer, was_connected, o.listen, matches!(o.mode, Mode::Ping(_)))
        {
            if s.state() == tcp::State::Closed {
                match retry_at {
                    None => {
                        refused += 1;
                        if refused == 1 {
                            println!("tcpblast: {peer}:{port} refused the connection; retrying every 0.5 s");
                        }
                        retry_at = Some(t + 500_000_000);
                    }
                    Some(at) if t >= at => {
                        retry_at = None;
                        let local = 49152 + (clock::rdtsc() % 16384) as u16;
                        if let Err(e) = s.connect(iface.context(), (peer, port), local) {
                            crash_fmt(format_args!("tcpblast: connect: {e}"));
                        }
                    }
                    Some(_) => {}
                }
            }
        }
        if s.is_active() && s.state() != tcp::State::SynSent && s.state() != tcp::State::SynReceived && !was_connected {
            was_connected = true;
            t_start = Some(t);
            println!(
                "tcpblast: connected ({})",
                s.remote_endpoint().map_or(alloc::string::String::new(), |e| alloc::format!("{e}"))
            );
        }
        let mut did = false;
        match o.mode {
            Mode::Send(total) => {
                while moved < total && s.can_send() {
                    let n = s
                        .send(|buf| {
                            let n = buf.len().min((total - moved) as usize).min(table.len() - PERIOD);
                            let off = (moved % PERIOD as u64) as usize;
                            buf[..n].copy_from_slice(&table[off..off + n]);
                            (n, n)
                        })
                        .unwrap_or(0);
                    if n == 0 {
                        break;
                    }
                    moved += n as u64;
                    did = true;
                }
                if moved == total && !closing && was_connected {
                    s.close();
                    closing = true;
                    did = true;
                }
                if closing
                    && s.send_queue() == 0
                    && matches!(s.state(), tcp::State::FinWait2 | tcp::State::TimeWait | tcp::State::Closed)
                {
                    t_end.get_or_insert(t);
                    break;
                }
            }
            Mode::Recv(total) => {
                while s.can_recv() {
                    let r = s.recv(|buf| {
                        let mut bad = None;
                        let mut done = 0;
                        while done < buf.len() {
                            let pos = moved + done as u64;
                            let off = (pos % PERIOD as u64) as usize;
                            let n = (buf.len() - done).min(table.len() - PERIOD);
                            if buf[done..done + n] != table[off..off + n] {
                                let i = (0..n).find(|&i| buf[done + i] != table[off + i]).unwrap_or(0);
                                bad = Some((pos + i as u64, buf[done + i]));
                                break;
                            }
                            done += n;
                        }
                        (buf.len(), (buf.len(), bad))
                    });
                    match r {
                        Ok((_, Some((pos, b)))) => {
                            crash_fmt(format_args!("tcpblast: byte {pos} is {b:#04x}, expected {:#04x}", pattern(pos)))
                        }
                        Ok((n, None)) => {
                            moved += n as u64;
                            did = true;
                        }
                        Err(_) => break,
                    }
                }
                if moved > total {
                    crash_fmt(format_args!("tcpblast: received {moved} bytes, more than the {total} expected"));
                }
                if moved == total && t_end.is_none() {
                    t_end = Some(t);
                    s.close();
                    closing = true;
                    did = true;
                }
                // Done once our FIN is acknowledged (not at LastAck: the FIN
                // may still be on its way).
                if closing && matches!(s.state(), tcp::State::Closed | tcp::State::TimeWait | tcp::State::FinWait2) {
                    break;
                }
            }
            Mode::Ping(_) => {}
        }
        if was_connected && !closing && !s.is_open() {
            crash_fmt(format_args!("tcpblast: connection closed by the peer after {moved} bytes"));
        }
        if was_connected && !s.is_active() && !closing {
            crash_fmt(format_args!("tcpblast: connection reset after {moved} bytes"));
        }
        if o.irq_driven {
            let f = irq_save();
            if did {
                iface.poll(now(), &mut net, &mut sockets);
            }
            net.flush();
            irq_restore(f, &mut held);
        } else {
            if did {
                iface.poll(now(), &mut net, &mut sockets);
            }
            net.flush();
        }

        // Wait for the next thing to do.
        let delay = iface.poll_delay(now(), &sockets);
        if delay == Some(Duration::ZERO) && !net.tx_blocked() {
            continue;
        }
        if o.irq_driven {
            // A busy kernel: spin with interrupts on until the work flag
            // moves or smoltcp's deadline comes; halt only after the spin
            // budget.
            let work = |net: &VirtioNet<256>| bus::interrupts_taken(slot) != irqs_seen || net.napi_due();
            let t0 = clock::now_ns();
            let until = match delay {
                Some(d) if d > Duration::ZERO => t0.saturating_add(d.total_micros().saturating_mul(1000)),
                // Blocked on the ring with nothing else due: only the
                // interrupt ends the wait.
                _ => u64::MAX,
            };
            let spin_end = t0.saturating_add(o.spin_ns);
            spins += 1;
            let was_held = lguest_guest::data::irq_pending() != 0;
            let mut t = t0;
            while !work(&net) && t < until && t < spin_end && t < deadline && t < ping_end {
                match o.busy {
                    None => {
                        core::hint::spin_loop();
                        t = clock::now_ns();
                    }
                    Some((off, on)) => {
                        // A slice of the background job as a busy kernel
                        // runs it: mostly in critical sections, with
                        // interrupts on only between them.
                        let (f, t1) = (irq_save(), t);
                        t = background(t, off);
                        irq_restore(f, &mut busy_held);
                        t = background(t, on);
                        busy_ns += t - t1;
                    }
                }
            }
            spin_ns += t - t0;
            if was_held {
                held_waits += 1;
                held_wait_ns += t - t0;
            }
            if work(&net) {
                spin_wakes += 1;
                continue;
            }
            if t < spin_end {
                continue;
            }
            paravirt::irq_disable();
            if work(&net) {
                paravirt::irq_enable();
                continue;
            }
        } else {
            paravirt::irq_disable();
            if net.arm() {
                net.disarm();
                paravirt::irq_enable();
                continue;
            }
        }
        let mut ns = delay.map_or(1_000_000_000, |d| d.total_micros().saturating_mul(1000));
        if net.tx_blocked() || ns == 0 {
            // Waiting for the device to send: its interrupt comes; the
            // timer is only a safety net.
            ns = 10_000_000;
        }
        ns = ns.clamp(1_000, 1_000_000_000).min(deadline.saturating_sub(clock::now_ns()).max(1_000));
        if let Some(at) = retry_at {
            ns = ns.min(at.saturating_sub(clock::now_ns()).max(1_000));
        }
        if ping_end != u64::MAX {
            ns = ns.min(ping_end.saturating_sub(clock::now_ns()).max(1_000));
        }
        if icmp_handle.is_some() && pings_sent < PINGS {
            ns = ns.min(next_ping.saturating_sub(clock::now_ns()).max(1_000));
        }
        clock::set_event(ns);
        paravirt::halt();
        halts += 1;
        if !o.irq_driven {
            net.disarm();
        }
    }

    let st = net.stats();
    let tx_kicks = bus::kicks(slot);
    let irqs = bus::interrupts_taken(slot);
    match o.mode {
        Mode::Ping(s) => {
            println!("tcpblast: ping: answered for {s} s; rx {} packets, tx {} packets", st.rx_packets, st.tx_packets);
            if let Some(host) = o.ping_host {
                println!("tcpblast: ping host {host}: {pings_sent} sent, {ping_replies} replies");
            }
        }
        Mode::Send(_) | Mode::Recv(_) => {
            let (t0, t1) = (t_start.unwrap_or(t_boot), t_end.unwrap_or_else(clock::now_ns));
            let us = ((t1 - t0) / 1000).max(1);
            println!(
                "tcpblast: {} {moved} bytes in {us} us guest-side ({} Mbit/s)",
                if let Mode::Send(_) = o.mode { "sent" } else { "received" },
                moved * 8 / us
            );
        }
    }
    println!(
        "tcpblast: packets tx {} (tso {}) rx {} (csum completed {}); tx ring full {}, dropped {}",
        st.tx_packets, st.tx_gso_packets, st.rx_packets, st.rx_csum_completed, st.tx_ring_full, st.tx_dropped
    );
    println!(
        "tcpblast: interrupts {irqs} (net), timer {}, kicks {tx_kicks}, halts {halts}, polls {polls}",
        clock::ticks()
    );
    if o.irq_driven {
        println!(
            "tcpblast: interrupt-driven: napi polls {napis}, spin waits {spins} ({spin_wakes} ended by an interrupt, {} us in all), irq_pending check {}",
            spin_ns / 1000,
            if paravirt::irq_check() { "on" } else { "off" }
        );
        println!(
            "tcpblast: interrupt-driven: interrupts held back in {held} critical sections; {held_waits} waits began with one held back, {} us in those",
            held_wait_ns / 1000
        );
        if let Some((off, on)) = o.busy {
            println!(
                "tcpblast: interrupt-driven: background job ({} us off, {} us on): {} us done, interrupts held back in {busy_held} of its critical sections",
                off / 1000,
                on / 1000,
                busy_ns / 1000
            );
        }
    }
    poweroff("tcpblast: done")
}
