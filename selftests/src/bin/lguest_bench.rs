// SPDX-License-Identifier: GPL-2.0
//! Benchmarks (not tests: they assert nothing and print numbers).
//!
//! - hypercall round trip: a guest makes N no-op hypercalls and times them
//!   with the TSC; the same run times N `getpid` system calls on the host.
//!   The ratio is what TCG cannot distort much; under `-icount shift=0` the
//!   TSC advances with instructions, so both are instruction counts.
//!
//! - interrupt delivery latency after the guest re-enables interrupts, with
//!   the `irq_pending` check (delivery at the SEND_INTERRUPTS hypercall)
//!   and without it (`noirqcheck`: delivery waits for the next exit).
//!
//! - page faults and address spaces (`pfbench`): a guest demand-paging
//!   round trip from guest user mode, the host's shadow fault alone, and a
//!   fork-like cycle (build, fill, switch, touch, tear down 64 pages).
//!
//! Output: one `bench: name value unit` line per figure.

use std::process::Command;

fn rdtsc() -> u64 {
    // SAFETY: rdtsc only reads the time-stamp counter.
    unsafe { core::arch::x86_64::_rdtsc() }
}

fn getpid_cycles(n: u64) -> f64 {
    let start = rdtsc();
    for _ in 0..n {
        // SAFETY: getpid has no preconditions.
        unsafe { libc::syscall(libc::SYS_getpid) };
    }
    (rdtsc() - start) as f64 / n as f64
}

fn hypercall_cycles(n: u64) -> Option<f64> {
    let guests = std::env::var("LGUEST_GUESTS").unwrap_or_else(|_| "/usr/share/lguest/guests".into());
    let out = Command::new(std::env::var("LGUEST_BIN").unwrap_or_else(|_| "/usr/bin/lguest".into()))
        .args(["run", "--memory", "16M", &format!("{guests}/guest-ops"), "hcalls", &n.to_string()])
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().find(|l| l.contains("TSC cycles"))?;
    let cycles: f64 = line.split_whitespace().find_map(|w| w.parse().ok())?;
    Some(cycles / n as f64)
}

/// Median interrupt delivery latency after re-enabling, in TSC cycles,
/// from `guest-ops latency [noirqcheck]`.
fn latency(noirqcheck: bool) -> Option<u64> {
    let guests = std::env::var("LGUEST_GUESTS").unwrap_or_else(|_| "/usr/share/lguest/guests".into());
    let mut args =
        vec!["run".to_string(), "--memory".into(), "16M".into(), format!("{guests}/guest-ops"), "latency".into()];
    if noirqcheck {
        args.push("noirqcheck".into());
    }
    let out = Command::new(std::env::var("LGUEST_BIN").unwrap_or_else(|_| "/usr/bin/lguest".into()))
        .args(&args)
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().find(|l| l.contains("median"))?;
    let mut words = line.split_whitespace();
    words.find(|w| *w == "median")?;
    words.next()?.parse().ok()
}

/// The `NAME=VALUE` figures of `pfbench` (page-fault round trips and a
/// fork-like address-space cycle, in TSC cycles).
fn pfbench() -> Option<Vec<(String, u64)>> {
    let guests = std::env::var("LGUEST_GUESTS").unwrap_or_else(|_| "/usr/share/lguest/guests".into());
    let out = Command::new(std::env::var("LGUEST_BIN").unwrap_or_else(|_| "/usr/bin/lguest".into()))
        .args(["run", "--memory", "32M", &format!("{guests}/pfbench")])
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let figures: Vec<(String, u64)> = text
        .lines()
        .filter_map(|l| l.strip_prefix("pfbench: "))
        .filter_map(|l| l.split_whitespace().next()?.split_once('='))
        .filter(|(k, _)| k.ends_with("_cycles"))
        .filter_map(|(k, v)| Some((k.to_string(), v.parse().ok()?)))
        .collect();
    (!figures.is_empty()).then_some(figures)
}

/// The host's own demand-zero page fault: TSC cycles per first touch of
/// `pages` fresh anonymous pages (what `pf_fault_roundtrip` is for the
/// guest).
fn host_fault_cycles(pages: usize) -> Option<u64> {
    let m = lguest_selftests::Mapping::anon(pages * 4096).ok()?;
    let start = rdtsc();
    for i in 0..pages {
        m.put(i * 4096, 1u8);
    }
    Some((rdtsc() - start) / pages as u64)
}

/// The host's fork-like cycle: fork a child that writes to `pages` pages
/// of the parent's (copy-on-write faults) and exits; the parent waits.
/// TSC cycles per iteration (what `pf_fork` is for the guest).
fn host_fork_cycles(pages: usize, iterations: u64) -> Option<u64> {
    let mut buf = vec![0u8; pages * 4096];
    for i in 0..pages {
        buf[i * 4096] = 1;
    }
    let start = rdtsc();
    for _ in 0..iterations {
        // SAFETY: fork(2); the child only writes to its copy of `buf` and
        // calls _exit(2), both async-signal-safe.
        match unsafe { libc::fork() } {
            -1 => return None,
            0 => {
                for i in 0..pages {
                    // SAFETY: inside the child's copy of `buf`.
                    unsafe { buf.as_mut_ptr().add(i * 4096).write_volatile(2) };
                }
                // SAFETY: ends the child without running the parent's exit code.
                unsafe { libc::_exit(0) };
            }
            pid => {
                let mut status = 0;
                // SAFETY: waits for our own child.
                unsafe { libc::waitpid(pid, &mut status, 0) };
            }
        }
    }
    Some((rdtsc() - start) / iterations)
}

fn main() {
    let n = 200_000;
    let getpid = getpid_cycles(n);
    println!("bench: getpid {getpid:.0} cycles");
    match hypercall_cycles(n) {
        Some(h) => {
            println!("bench: hypercall_round_trip {h:.0} cycles");
            println!("bench: hypercall_vs_getpid {:.2} ratio", h / getpid);
        }
        None => {
            println!("bench: hypercall_round_trip failed");
            std::process::exit(1);
        }
    }
    match (latency(false), latency(true)) {
        (Some(on), Some(off)) => {
            println!("bench: irq_latency_with_check {on} cycles (median of 20)");
            println!("bench: irq_latency_without_check {off} cycles (median of 20, noirqcheck)");
            println!("bench: irq_latency_ratio {:.1} ratio (without / with)", off as f64 / on.max(1) as f64);
        }
        _ => println!("bench: irq_latency failed"),
    }
    let host_fault = host_fault_cycles(512);
    let host_fork = host_fork_cycles(64, 100);
    if let Some(c) = host_fault {
        println!("bench: host_fault_cycles {c} cycles (first touch of a fresh anonymous page)");
    }
    if let Some(c) = host_fork {
        println!("bench: host_fork_cycles {c} cycles (fork, 64 copy-on-write pages written, exit, wait)");
    }
    match pfbench() {
        Some(figures) => {
            for (name, value) in &figures {
                println!("bench: pf_{name} {value} cycles");
            }
            let get = |n: &str| figures.iter().find(|(k, _)| k == n).map(|(_, v)| *v as f64);
            if let (Some(g), Some(h)) = (get("fault_roundtrip_cycles"), host_fault) {
                println!(
                    "bench: pf_fault_vs_host {:.1} ratio (guest demand paging / host demand-zero fault)",
                    g / h as f64
                );
            }
            if let (Some(g), Some(h)) = (get("fork_cycles"), host_fork) {
                println!("bench: pf_fork_vs_host {:.2} ratio (guest address-space cycle / host fork)", g / h as f64);
            }
        }
        None => println!("bench: pfbench failed"),
    }
}
