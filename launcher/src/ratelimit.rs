// SPDX-License-Identifier: GPL-2.0
//! Warnings that the guest can trigger at will, rate-limited and counted.
//!
//! A guest that notifies a stray address in a loop, or resets and breaks a
//! device over and over, must not flood stderr at the default (`warn`)
//! level. Each kind of such warning (per device where there is one) has a
//! [`GuestWarnings`]: it counts every occurrence (shown by `--stats` and
//! SIGUSR1's dump), logs the first [`BURST`] of each [`PERIOD`] at warn
//! level (so the first occurrence always shows), and holds the rest back;
//! the next warning that is logged says how many were held back before it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Warnings of one kind logged per [`PERIOD`] at most.
pub const BURST: u32 = 5;
/// The rate limit's window.
pub const PERIOD: Duration = Duration::from_secs(1);

/// The current window of a [`GuestWarnings`].
#[derive(Debug)]
struct Window {
    /// When it began (`None`: no warning yet).
    start: Option<Instant>,
    /// Warnings logged in it.
    logged: u32,
    /// Warnings held back since the last one logged.
    held: u64,
}

/// What to do with one occurrence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Log it, saying that `suppressed` were held back before it.
    Log {
        /// Occurrences not logged since the last one that was.
        suppressed: u64,
    },
    /// Do not log it (it is counted).
    Quiet,
}

/// One kind of guest-triggered warning: its counters and its rate limit.
#[derive(Debug)]
pub struct GuestWarnings {
    count: AtomicU64,
    suppressed: AtomicU64,
    window: Mutex<Window>,
}

impl Default for GuestWarnings {
    fn default() -> Self {
        Self::new()
    }
}

impl GuestWarnings {
    /// No occurrence yet.
    pub const fn new() -> Self {
        Self {
            count: AtomicU64::new(0),
            suppressed: AtomicU64::new(0),
            window: Mutex::new(Window { start: None, logged: 0, held: 0 }),
        }
    }

    /// Counts one occurrence at `now` and says whether to log it.
    pub fn admit(&self, now: Instant) -> Verdict {
        self.count.fetch_add(1, Ordering::Relaxed);
        let mut w = self.window.lock().unwrap_or_else(|e| e.into_inner());
        if w.start.is_none_or(|start| now.saturating_duration_since(start) >= PERIOD) {
            w.start = Some(now);
            w.logged = 0;
        }
        if w.logged < BURST {
            w.logged += 1;
            Verdict::Log { suppressed: std::mem::take(&mut w.held) }
        } else {
            w.held += 1;
            self.suppressed.fetch_add(1, Ordering::Relaxed);
            Verdict::Quiet
        }
    }

    /// Counts one occurrence and logs `message()` at warn level unless the
    /// rate limit holds it back; returns whether it was logged.
    pub fn warn(&self, message: impl FnOnce() -> String) -> bool {
        match self.admit(Instant::now()) {
            Verdict::Log { suppressed: 0 } => {
                log::warn!("{}", message());
                true
            }
            Verdict::Log { suppressed } => {
                log::warn!("{} ({suppressed} more like it suppressed before this one)", message());
                true
            }
            Verdict::Quiet => false,
        }
    }

    /// Occurrences in all.
    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    /// Occurrences the rate limit kept off stderr.
    pub fn suppressed(&self) -> u64 {
        self.suppressed.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The first BURST of a window are logged, the rest counted and held
    /// back; the first logged in the next window says how many were.
    #[test]
    fn bursts_per_period_then_a_count_of_the_rest() {
        let w = GuestWarnings::new();
        let t0 = Instant::now();
        for i in 0..BURST {
            assert_eq!(w.admit(t0 + Duration::from_millis(u64::from(i))), Verdict::Log { suppressed: 0 }, "{i}");
        }
        for i in 0..1000u64 {
            assert_eq!(w.admit(t0 + Duration::from_micros(500 * i)), Verdict::Quiet, "{i}");
        }
        assert_eq!((w.count(), w.suppressed()), (u64::from(BURST) + 1000, 1000));
        let t1 = t0 + PERIOD;
        assert_eq!(w.admit(t1), Verdict::Log { suppressed: 1000 });
        assert_eq!(w.admit(t1), Verdict::Log { suppressed: 0 });
        assert_eq!((w.count(), w.suppressed()), (u64::from(BURST) + 1002, 1000));
    }

    /// warn() logs the first occurrence, and a flood of a million costs at
    /// most BURST lines per period (the test runs well within two).
    #[test]
    fn a_flood_is_mostly_counted() {
        let w = GuestWarnings::default();
        let start = Instant::now();
        let logged = (0..1_000_000).filter(|_| w.warn(|| "stray".into())).count() as u64;
        let periods = start.elapsed().as_secs() + 1;
        assert!(logged >= 1, "the first is logged");
        assert!(logged <= u64::from(BURST) * periods, "{logged} lines in {periods} periods");
        assert_eq!(w.count(), 1_000_000);
        assert_eq!(w.suppressed(), 1_000_000 - logged);
    }
}
