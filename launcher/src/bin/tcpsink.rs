// SPDX-License-Identifier: GPL-2.0
//! `lguest-tcpsink`: the host side of the network benchmark (what tcpblast's
//! receiver was). It takes one TCP connection, by listening (the default)
//! or by connecting (`--connect`, retried until the guest listens), then
//! either receives until EOF, checking every byte against the stream
//! pattern the guest's `tcpblast` sends (byte `i` is `(i * 131 + 7) % 251`)
//! and, with `--expect N`, the count; or sends `--send N` bytes of that
//! pattern and waits until the guest acknowledged all of it. It prints
//! `tcpsink: BYTES bytes in SECONDS s, RATE MB/s` (MB = 10^6 bytes; the
//! time runs from the first byte to EOF when receiving, from the connection
//! to the last acknowledgement when sending) and exits 1 on a wrong byte, a wrong
//! count, a timeout or an I/O error.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Parser;

/// The period of the stream pattern.
const PERIOD: u64 = 251;

/// Byte `i` of the stream.
fn pattern(i: u64) -> u8 {
    // CAST: the value is below 251.
    ((i % PERIOD * 131 + 7) % PERIOD) as u8
}

/// Host side of the lguest network benchmark.
#[derive(Debug, Parser)]
#[command(name = "lguest-tcpsink", version)]
struct Cli {
    /// Address to listen on (or, with --connect, to connect to).
    #[arg(value_name = "ADDR:PORT")]
    addr: String,
    /// Connect to ADDR:PORT instead of listening.
    #[arg(long)]
    connect: bool,
    /// Receive mode: fail unless exactly N bytes arrive.
    #[arg(long, value_name = "N", conflicts_with = "send")]
    expect: Option<u64>,
    /// Send mode: send N bytes of the pattern, then wait until they are
    /// acknowledged.
    #[arg(long, value_name = "N")]
    send: Option<u64>,
    /// Give up after this many seconds.
    #[arg(long, value_name = "SECONDS", default_value_t = 300)]
    timeout: u64,
}

/// Checks `buf` as the stream from offset `off`; the first wrong offset.
fn check(buf: &[u8], off: u64) -> Option<u64> {
    let mut p = off % PERIOD;
    for (k, &b) in buf.iter().enumerate() {
        // CAST: p < 251.
        if b != ((p * 131 + 7) % PERIOD) as u8 {
            return Some(off + k as u64);
        }
        p += 1;
        if p == PERIOD {
            p = 0;
        }
    }
    None
}

/// Receives until EOF; returns (bytes, seconds from the first byte).
fn receive(s: &mut TcpStream, expect: Option<u64>) -> Result<(u64, f64)> {
    let mut buf = vec![0u8; 1 << 20];
    let mut total = 0u64;
    let mut start = None;
    loop {
        let n = match s.read(&mut buf) {
            Ok(n) => n,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) => return Err(e).context(format!("receiving after {total} bytes")),
        };
        if n == 0 {
            break;
        }
        start.get_or_insert_with(Instant::now);
        if let Some(at) = check(&buf[..n], total) {
            bail!("wrong byte at offset {at}: {:#04x}, expected {:#04x}", buf[(at - total) as usize], pattern(at));
        }
        total += n as u64;
        if expect.is_some_and(|e| total > e) {
            bail!("more than the expected {} bytes", expect.unwrap_or(0));
        }
    }
    let secs = start.map_or(0.0, |t| t.elapsed().as_secs_f64());
    if let Some(e) = expect {
        if total != e {
            bail!("{total} bytes arrived, {e} expected");
        }
    }
    Ok((total, secs))
}

/// Bytes sent on `s` that the peer has not acknowledged yet (`SIOCOUTQ`;
/// our FIN counts as one).
fn unacked(s: &TcpStream) -> std::io::Result<u64> {
    use std::os::fd::AsRawFd;
    let mut n: libc::c_int = 0;
    // SAFETY: SIOCOUTQ (TIOCOUTQ) writes one int to the pointer, which is a
    // live, exclusively borrowed local for the whole call.
    let ret = unsafe { libc::ioctl(s.as_raw_fd(), libc::TIOCOUTQ, &mut n as *mut libc::c_int) };
    if ret < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(u64::try_from(n).unwrap_or(0))
}

/// Sends `n` bytes of the pattern and closes the sending side; returns the
/// seconds until the peer acknowledged everything (or closed).
fn send(s: &mut TcpStream, n: u64, deadline: Instant) -> Result<f64> {
    let start = Instant::now();
    // A buffer that holds the stream from any offset that is a multiple
    // of the period: 4096 periods.
    let chunk: Vec<u8> = (0..PERIOD * 4096).map(pattern).collect();
    let mut sent = 0u64;
    while sent < n {
        // CAST: min with the chunk's length fits usize.
        let k = (n - sent).min(chunk.len() as u64) as usize;
        s.write_all(&chunk[..k]).with_context(|| format!("sending after {sent} bytes"))?;
        sent += k as u64;
    }
    s.shutdown(Shutdown::Write).context("closing the sending side")?;
    // Done when everything, FIN included, is acknowledged: the guest may
    // power off without closing its side.
    s.set_nonblocking(true)?;
    let mut rest = [0u8; 4096];
    loop {
        match s.read(&mut rest) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::WouldBlock || e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e).context("waiting for the peer's acknowledgements"),
        }
        if unacked(s).context("SIOCOUTQ")? == 0 {
            break;
        }
        if Instant::now() >= deadline {
            bail!("timed out with {} bytes unacknowledged", unacked(s).unwrap_or(0));
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    Ok(start.elapsed().as_secs_f64())
}

fn connect(cli: &Cli, deadline: Instant) -> Result<TcpStream> {
    if cli.connect {
        loop {
            match TcpStream::connect(&cli.addr) {
                Ok(s) => return Ok(s),
                Err(_) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(100));
                }
                Err(e) => return Err(e).with_context(|| format!("connecting to {}", cli.addr)),
            }
        }
    }
    let l = TcpListener::bind(&cli.addr).with_context(|| format!("listening on {}", cli.addr))?;
    eprintln!("tcpsink: listening on {}", cli.addr);
    l.set_nonblocking(true)?;
    loop {
        match l.accept() {
            Ok((s, peer)) => {
                eprintln!("tcpsink: connection from {peer}");
                s.set_nonblocking(false)?;
                return Ok(s);
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => return Err(e).context("waiting for a connection"),
        }
    }
}

fn run(cli: &Cli) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(cli.timeout);
    let mut s = connect(cli, deadline)?;
    let left = deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1));
    s.set_read_timeout(Some(left))?;
    s.set_write_timeout(Some(left))?;
    let (bytes, secs) = match cli.send {
        Some(n) => (n, send(&mut s, n, deadline)?),
        None => receive(&mut s, cli.expect)?,
    };
    let rate = if secs > 0.0 { bytes as f64 / secs / 1e6 } else { 0.0 };
    println!("tcpsink: {bytes} bytes in {secs:.3} s, {rate:.1} MB/s");
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(&cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tcpsink: {e:#}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pattern_matches_the_guest() {
        assert_eq!(pattern(0), 7);
        assert_eq!(pattern(1), 138);
        assert_eq!(u64::from(pattern(2)), (2 * 131 + 7) % 251);
        assert_eq!(pattern(251), 7);
        assert_eq!(u64::from(pattern(1 << 40)), ((1u64 << 40) * 131 + 7) % 251);
        let v: Vec<u8> = (1000..3000).map(pattern).collect();
        assert_eq!(check(&v, 1000), None);
        let mut w = v.clone();
        w[17] ^= 1;
        assert_eq!(check(&w, 1000), Some(1017));
    }

    #[test]
    fn loopback_send_and_receive() {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = l.local_addr().expect("addr");
        let t = std::thread::spawn(move || {
            let (mut s, _) = l.accept().expect("accept");
            receive(&mut s, Some(3_000_000))
        });
        let mut s = TcpStream::connect(addr).expect("connect");
        let chunk: Vec<u8> = (0..3_000_000).map(pattern).collect();
        s.write_all(&chunk).expect("write");
        drop(s);
        let (bytes, _) = t.join().expect("join").expect("received");
        assert_eq!(bytes, 3_000_000);
    }

    #[test]
    fn wrong_bytes_and_counts_fail() {
        for (data, expect) in [(vec![7u8, 138, 0], None), ((0..10).map(pattern).collect(), Some(11))] {
            let l = TcpListener::bind("127.0.0.1:0").expect("bind");
            let addr = l.local_addr().expect("addr");
            let t = std::thread::spawn(move || {
                let (mut s, _) = l.accept().expect("accept");
                receive(&mut s, expect)
            });
            let mut s = TcpStream::connect(addr).expect("connect");
            s.write_all(&data).expect("write");
            drop(s);
            assert!(t.join().expect("join").is_err());
        }
    }

    #[test]
    fn sending_closes_after_n_bytes() {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = l.local_addr().expect("addr");
        let t = std::thread::spawn(move || {
            let (mut s, _) = l.accept().expect("accept");
            send(&mut s, 1_234_567, Instant::now() + Duration::from_secs(30))
        });
        let mut s = TcpStream::connect(addr).expect("connect");
        let (n, _) = receive(&mut s, Some(1_234_567)).expect("pattern");
        drop(s);
        assert_eq!(n, 1_234_567);
        t.join().expect("join").expect("sent");
    }
}
