// SPDX-License-Identifier: GPL-2.0
//! The peer benchmark's one program (Documentation/dev/testing.rst,
//! "Peers"): the same static binary runs on the QEMU host, inside
//! User-Mode Linux, under gVisor's runsc and in the lguest Linux guest
//! (`lginit=peer`), so that each environment's figures come from the same
//! instructions. `harness/peerbench.sh` runs it and takes the ratios.
//!
//! Each subcommand prints one line of TSC cycles per operation, the
//! median of `K` samples (default 5) with their spread:
//!
//! - `getpid N [K]`: N null system calls (`getpid` by the `syscall`
//!   instruction), `peer: getpid C cycles (...)`;
//! - `fault N [K]`: first touch of N fresh anonymous pages (demand-zero
//!   faults), cycles per page, `peer: fault C cycles (...)`;
//! - `fork N [K]`: N rounds of fork, the child writing one byte in each of
//!   64 pages it shares copy-on-write and exiting, the parent waiting;
//!   cycles per round, `peer: fork C cycles (...)`;
//! - `start`: `peer: start` at once, for the caller's start-to-first-output
//!   timing;
//! - `all [GETPID_N FAULT_N FORK_N [K]]`: `start`, then the three (one
//!   start-up of a slow environment for all of them), then `peer: done`;
//! - `time SECONDS CMD ARGS...`: the caller's side. Runs CMD (an
//!   environment running this program's `all`), passes its `peer:` lines
//!   to stdout and its other lines to stderr, and adds
//!   `peer: start_ms MS ms` when the `peer: start` line arrives (wall
//!   clock from the spawn) and `peer: exit STATUS after MS ms` at its end,
//!   or `peer: timeout after MS ms` when it is still running after SECONDS
//!   (then it is killed);
//! - `tap NAME`: creates the persistent tap NAME (with virtio-net headers,
//!   as the launcher opens it) for the TCP stream rows, which the
//!   launcher and UML's vector tap transport then attach to.
//!
//! The TSC is the QEMU host's in every environment: none of them traps
//! `rdtsc`. Under `-icount shift=0` it counts instructions. Exits 1 with a
//! `peer: FAILED: ...` line when a system call fails.

use std::io::{BufRead, Write};
use std::time::{Duration, Instant};

/// Pages each forked child writes (what `lguest_bench`'s `host_fork_cycles`
/// and the guest's `pf_fork` use).
const FORK_PAGES: usize = 64;

const PAGE: usize = 4096;

fn rdtsc() -> u64 {
    // SAFETY: rdtsc only reads the time-stamp counter.
    unsafe { core::arch::x86_64::_rdtsc() }
}

/// TSC cycles per `getpid`.
fn getpid_cycles(n: u64) -> Result<f64, String> {
    let start = rdtsc();
    for _ in 0..n {
        // SAFETY: getpid has no preconditions.
        unsafe { libc::syscall(libc::SYS_getpid) };
    }
    Ok((rdtsc() - start) as f64 / n as f64)
}

/// TSC cycles per first touch of a fresh anonymous page, over `pages`
/// pages of a new mapping (unmapped again afterwards).
fn fault_cycles(pages: usize) -> Result<f64, String> {
    let len = pages * PAGE;
    let m = lguest_selftests::Mapping::anon(len).map_err(|e| format!("mmap of {len} bytes: {e}"))?;
    let start = rdtsc();
    for i in 0..pages {
        m.put(i * PAGE, 1u8);
    }
    Ok((rdtsc() - start) as f64 / pages as f64)
}

/// TSC cycles per fork + `FORK_PAGES` copy-on-write writes in the child +
/// exit + wait, over `n` rounds.
fn fork_cycles(n: u64) -> Result<f64, String> {
    let mut buf = vec![0u8; FORK_PAGES * PAGE];
    for i in 0..FORK_PAGES {
        buf[i * PAGE] = 1;
    }
    let ptr = buf.as_mut_ptr();
    let start = rdtsc();
    for _ in 0..n {
        // SAFETY: fork(2); the child only writes to its copy of `buf` and
        // calls _exit(2), both async-signal-safe.
        match unsafe { libc::fork() } {
            -1 => return Err(format!("fork: {}", std::io::Error::last_os_error())),
            0 => {
                for i in 0..FORK_PAGES {
                    // SAFETY: inside the child's copy of `buf`.
                    unsafe { ptr.add(i * PAGE).write_volatile(2) };
                }
                // SAFETY: ends the child without running the parent's exit code.
                unsafe { libc::_exit(0) };
            }
            pid => {
                let mut status = 0;
                // SAFETY: waits for our own child; `status` is a valid int.
                if unsafe { libc::waitpid(pid, &mut status, 0) } != pid || status != 0 {
                    return Err(format!("waitpid: {} (status {status:#x})", std::io::Error::last_os_error()));
                }
            }
        }
    }
    Ok((rdtsc() - start) as f64 / n as f64)
}

/// Median, min and max of `v` (not empty).
fn spread(v: &mut [f64]) -> (f64, f64, f64) {
    v.sort_by(f64::total_cmp);
    let mid = v.len() / 2;
    let median = if v.len() % 2 == 1 { v[mid] } else { (v[mid - 1] + v[mid]) / 2.0 };
    (median, v[0], v[v.len() - 1])
}

/// Takes `k` samples of `f` and prints `peer: NAME MEDIAN cycles (...)`.
fn figure(name: &str, what: &str, k: usize, mut f: impl FnMut() -> Result<f64, String>) -> Result<(), String> {
    let mut v = Vec::with_capacity(k);
    for _ in 0..k {
        v.push(f().map_err(|e| format!("{name}: {e}"))?);
    }
    let (median, min, max) = spread(&mut v);
    println!("peer: {name} {median:.0} cycles (median of {k}, min {min:.0}, max {max:.0}; {what})");
    // Flushed at once: the callers read the lines as they come.
    let _ = std::io::stdout().flush();
    Ok(())
}

/// The numeric argument `i` of `args`, or `default` when it is absent.
fn arg(args: &[String], i: usize, default: u64) -> Result<u64, String> {
    match args.get(i) {
        None => Ok(default),
        Some(s) => s.parse().ok().filter(|&n| n > 0).ok_or_else(|| format!("bad count '{s}'")),
    }
}

fn getpid(n: u64, k: usize) -> Result<(), String> {
    figure("getpid", &format!("{n} getpid system calls"), k, || getpid_cycles(n))
}

fn fault(n: u64, k: usize) -> Result<(), String> {
    figure("fault", &format!("first touch of {n} fresh anonymous pages, per page"), k, || fault_cycles(n as usize))
}

fn fork(n: u64, k: usize) -> Result<(), String> {
    figure("fork", &format!("{n} forks, {FORK_PAGES} copy-on-write pages written by the child, exit, wait"), k, || {
        fork_cycles(n)
    })
}

fn start() {
    println!("peer: start");
    let _ = std::io::stdout().flush();
}

/// `time SECONDS CMD ARGS...` (see the top of the file).
fn time(secs: u64, cmd: &[String]) -> Result<(), String> {
    let Some((prog, rest)) = cmd.split_first() else {
        return Err("time: no command".into());
    };
    let spawned = Instant::now();
    let mut child = std::process::Command::new(prog)
        .args(rest)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| format!("time: {prog}: {e}"))?;
    let Some(out) = child.stdout.take() else {
        return Err("time: no stdout pipe".into());
    };
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(out).split(b'\n') {
            let Ok(line) = line else { break };
            if tx.send(String::from_utf8_lossy(&line).trim_end().to_string()).is_err() {
                break;
            }
        }
    });
    let deadline = spawned + Duration::from_secs(secs);
    let ms = |t: Instant| t.duration_since(spawned).as_secs_f64() * 1000.0;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) => {
                // A console may prefix the guest's line (no line discipline
                // in between): the marker counts anywhere in the line.
                match line.find("peer: ") {
                    Some(at) => {
                        let l = &line[at..];
                        if l == "peer: start" {
                            println!("peer: start_ms {:.0} ms", ms(Instant::now()));
                        }
                        println!("{l}");
                        let _ = std::io::stdout().flush();
                    }
                    None => eprintln!("{line}"),
                }
            }
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                let _ = child.kill();
                let _ = child.wait();
                println!("peer: timeout after {:.0} ms", ms(Instant::now()));
                return Ok(());
            }
        }
    }
    // The output closed: the command is ending (or has left a child
    // holding nothing); wait for it within the same deadline.
    loop {
        match child.try_wait() {
            Ok(Some(st)) => {
                println!("peer: exit {} after {:.0} ms", st.code().unwrap_or(-1), ms(Instant::now()));
                return Ok(());
            }
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                println!("peer: timeout after {:.0} ms", ms(Instant::now()));
                return Ok(());
            }
            Err(e) => return Err(format!("time: wait: {e}")),
        }
    }
}

/// `tap NAME` (see the top of the file).
fn tap(name: &str) -> Result<(), String> {
    use std::os::fd::AsRawFd;
    let tun = lguest_selftests::open_tap(name).map_err(|e| format!("tap {name}: {e:?}"))?;
    // SAFETY: TUNSETPERSIST takes an integer argument.
    if unsafe { libc::ioctl(tun.as_raw_fd(), libc::TUNSETPERSIST, 1 as libc::c_ulong) } != 0 {
        return Err(format!("TUNSETPERSIST {name}: {}", std::io::Error::last_os_error()));
    }
    Ok(())
}

fn run(args: &[String]) -> Result<(), String> {
    let cmd = args.get(1).map(String::as_str).unwrap_or("");
    match cmd {
        "getpid" => getpid(arg(args, 2, 20_000)?, arg(args, 3, 5)? as usize),
        "fault" => fault(arg(args, 2, 256)?, arg(args, 3, 5)? as usize),
        "fork" => fork(arg(args, 2, 20)?, arg(args, 3, 5)? as usize),
        "start" => {
            start();
            Ok(())
        }
        "tap" => tap(args.get(2).map(String::as_str).unwrap_or("")),
        "time" => time(arg(args, 2, 600)?, &args[3.min(args.len())..]),
        "all" => {
            start();
            let k = arg(args, 5, 5)? as usize;
            getpid(arg(args, 2, 20_000)?, k)?;
            fault(arg(args, 3, 256)?, k)?;
            fork(arg(args, 4, 20)?, k)?;
            println!("peer: done");
            Ok(())
        }
        _ => Err(format!(
            "usage: {} getpid|fault|fork N [K] | start | all [GETPID_N FAULT_N FORK_N [K]] | time SECONDS CMD... | tap NAME",
            args.first().map(String::as_str).unwrap_or("lguest_peer_bench")
        )),
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Err(e) = run(&args) {
        println!("peer: FAILED: {e}");
        std::process::exit(1);
    }
}
