// SPDX-License-Identifier: GPL-2.0
//! A user program for the Linux guest (`guest/linux/init`, `lginit=test`;
//! `lguest_run_test:linux_userspace` checks its line): SSE arithmetic and
//! thread-local storage, in four threads that switch while they work, so
//! the guest kernel must keep each thread's FPU state and FS base.
//!
//! Prints `lginit: user ok <sum> <tls values>` or `lginit: user FAILED: ...`.
//!
//! `lguest-linux-user bench N` instead times N `getpid` system calls and
//! N / 100 fork+exec+exit+wait of `/bin/true` with the TSC (`lginit=bench`,
//! for `lguest_bench`): `lginit: bench getpid <cycles> spawn <cycles>`.

use std::cell::Cell;

thread_local! {
    static MINE: Cell<u64> = const { Cell::new(0) };
}

/// The sum of the square roots of `from..from + n` (`sqrtsd`, `addsd`: SSE2),
/// yielding every 100 steps so that the threads interleave.
fn work(from: u64, n: u64) -> f64 {
    let mut sum = 0.0f64;
    for i in from..from + n {
        sum += (i as f64).sqrt();
        if i % 100 == 0 {
            std::thread::yield_now();
        }
    }
    sum
}

fn rdtsc() -> u64 {
    // SAFETY: rdtsc only reads the time-stamp counter.
    unsafe { core::arch::x86_64::_rdtsc() }
}

/// TSC cycles per `getpid` and per fork+exec+exit+wait of `/bin/true`.
fn bench(n: u64) {
    let start = rdtsc();
    for _ in 0..n {
        // SAFETY: getpid has no preconditions.
        unsafe { libc::syscall(libc::SYS_getpid) };
    }
    let getpid = (rdtsc() - start) as f64 / n as f64;
    let spawns = (n / 100).max(1);
    let start = rdtsc();
    for _ in 0..spawns {
        match std::process::Command::new("/bin/true").status() {
            Ok(st) if st.success() => {}
            other => {
                println!("lginit: bench FAILED: /bin/true: {other:?}");
                return;
            }
        }
    }
    let spawn = (rdtsc() - start) as f64 / spawns as f64;
    println!("lginit: bench getpid {getpid:.0} spawn {spawn:.0}");
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("bench") {
        bench(args.get(2).and_then(|n| n.parse().ok()).unwrap_or(100_000));
        return;
    }
    let expected: Vec<f64> = (0..4).map(|k| work(1 + k * 1000, 1000)).collect();
    let threads: Vec<_> = (0..4u64)
        .map(|k| {
            std::thread::spawn(move || {
                MINE.with(|m| m.set(100 + k));
                let sum = work(1 + k * 1000, 1000);
                (sum, MINE.with(Cell::get))
            })
        })
        .collect();
    let mut failures = Vec::new();
    let mut tls = Vec::new();
    for (k, t) in threads.into_iter().enumerate() {
        match t.join() {
            Ok((sum, mine)) => {
                if sum.to_bits() != expected[k].to_bits() {
                    failures.push(format!("thread {k}: sum {sum} (want {})", expected[k]));
                }
                if mine != 100 + k as u64 {
                    failures.push(format!("thread {k}: thread-local {mine} (want {})", 100 + k));
                }
                tls.push(mine);
            }
            Err(_) => failures.push(format!("thread {k} panicked")),
        }
    }
    let main_tls = MINE.with(Cell::get);
    if main_tls != 0 {
        failures.push(format!("main thread's thread-local is {main_tls}"));
    }
    let total: f64 = expected.iter().sum();
    if failures.is_empty() {
        println!("lginit: user ok {total:.6} {tls:?}");
    } else {
        println!("lginit: user FAILED: {}", failures.join("; "));
    }
}
