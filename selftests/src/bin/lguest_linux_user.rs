// SPDX-License-Identifier: GPL-2.0
//! A user program for the Linux guest (`guest/linux/init`, `lginit=test`;
//! `lguest_run_test:linux_userspace` checks its line): SSE arithmetic and
//! thread-local storage, in four threads that switch while they work, so
//! the guest kernel must keep each thread's FPU state and FS base.
//!
//! Prints `lginit: user ok <sum> <tls values>` or `lginit: user FAILED: ...`.

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

fn main() {
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
