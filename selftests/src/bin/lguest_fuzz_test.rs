// SPDX-License-Identifier: GPL-2.0
//! The guest fuzzer (`samples/fuzz`) against the host: random hypercalls
//! with random and edge-case arguments, random IDT and async-ring contents,
//! traps and privileged instructions, seeded and reproducible.
//!
//! - `valid_ops_never_kill`: operations the host must accept never get the
//!   guest killed, and every promise the guest checks (registers across a
//!   hypercall, vectors of reflected traps, the async ring) holds.
//! - `fatal_ops_kill_with_reason`: with a `kill_rate` of 2 to 50 permille
//!   each run ends with one fatal operation, announced by the guest with
//!   the kill reason it expects; the host must kill the guest with exactly
//!   that reason, and the launcher must stop with status 2 (never crash,
//!   never hang). The reasons are tallied.
//! - `million_hypercalls`: at least [`MILLION`] hypercalls in all (the
//!   host's count, from `lguest -v`), after which the host still runs a
//!   guest.
//!
//! Any failing run is reported with its seed and command line, so that it
//! can be reproduced with `lguest run --memory 16M fuzz seed=S count=N
//! kill_rate=K`.
//!
//! Needs `lguest` (`$LGUEST_BIN`, default /usr/bin/lguest) and the sample
//! guests (`$LGUEST_GUESTS`, default /usr/share/lguest/guests).

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use lguest_selftests::{self as t, check, check_eq, fail, strings, Outcome, Proc, TestResult};

/// Operations of the `valid_ops_never_kill` run: about 6 s on the normal
/// kernel under TCG, 30 s on the debug kernel (KASAN, lockdep).
const VALID_OPS: u64 = 200_000;
/// Runs of `fatal_ops_kill_with_reason` (seeds 1 to this).
const FATAL_RUNS: u64 = 100;
/// `kill_rate` of those runs, in permille per operation, by seed modulo 4:
/// most die within a few dozen operations, some after hundreds (by then
/// the guest may run on its own page tables).
const FATAL_KILL_RATES: [u64; 4] = [50, 20, 5, 2];
/// Operations of each of those runs: with the lowest rate, a run ends
/// without a fatal operation about once in 3000.
const FATAL_OPS: u64 = 4000;
/// The hypercalls `million_hypercalls` wants, in all.
const MILLION: u64 = 1_000_000;
/// Operations per run of `million_hypercalls`.
const MILLION_OPS: u64 = 400_000;
/// Guests that `million_hypercalls` runs at once (the QEMU host has 2 CPUs).
const MILLION_PARALLEL: usize = 2;
/// Runs `million_hypercalls` and `page_table_ops` may make before giving
/// up: four times what they need. Work done, not time, bounds them, so a
/// slow machine or the debug kernel only takes longer.
const RUNS_CAP: u64 = 4;
/// The longest one run may take: only a hung guest or launcher comes near
/// it (a run of 400000 operations takes about 20 s under TCG on the normal
/// kernel, 60 s on the debug kernel, three times that on a slow machine).
const RUN_TIMEOUT: Duration = Duration::from_secs(600);
/// The longest one run of `fatal_ops_kill_with_reason` may take.
const FATAL_TIMEOUT: Duration = Duration::from_secs(120);

/// The short run of every `make test` (`LGUEST_SMOKE=1`): a tenth of the
/// work, seeds from a random base (printed), so CI meets new ones.
fn smoke() -> bool {
    std::env::var("LGUEST_SMOKE").is_ok_and(|v| v == "1")
}

/// What one run of the program does: the full counts, or the smoke run's.
struct Plan {
    /// Added to every seed.
    base: u64,
    valid_ops: u64,
    fatal_runs: u64,
    million: u64,
    page_table_updates: u64,
}

fn plan() -> Plan {
    if !smoke() {
        return Plan {
            base: 0,
            valid_ops: VALID_OPS,
            fatal_runs: FATAL_RUNS,
            million: MILLION,
            page_table_updates: PAGE_TABLE_UPDATES,
        };
    }
    // LGUEST_FUZZ_BASE=N replays a short run (its base is printed).
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    let base = std::env::var("LGUEST_FUZZ_BASE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or((now.as_secs() ^ (now.subsec_nanos() as u64) << 16) % 1_000_000 * 10_000);
    println!("# short run: seed base {base} (LGUEST_FUZZ_BASE={base} replays it)");
    Plan {
        base,
        valid_ops: VALID_OPS / 10,
        fatal_runs: FATAL_RUNS / 10,
        million: MILLION / 10,
        page_table_updates: PAGE_TABLE_UPDATES / 10,
    }
}

use lguest_selftests::guest;

/// What the fuzz test reads in a launcher run's output.
trait FuzzOutcome {
    fn host_counts(&self) -> Option<(u64, u64)>;
    fn guest_counts(&self, seed: u64) -> Option<(u64, u64)>;
    fn paging_counts(&self, seed: u64) -> Option<(u64, u64, u64)>;
    fn kill_reason(&self) -> Option<&str>;
}

/// The launcher's status for a guest the host killed (`lguest run --help`).
const EXIT_KILLED: i32 = 11;

impl FuzzOutcome for Outcome {
    /// The host's counts of exits and hypercalls, from `lguest -v`'s
    /// "vCPU 0: N exits, M hypercalls".
    fn host_counts(&self) -> Option<(u64, u64)> {
        let line = self.stderr.lines().find(|l| l.contains(" exits, ") && l.ends_with(" hypercalls"))?;
        let (exits, hcalls) = line.rsplit_once(": ")?.1.split_once(" exits, ")?;
        Some((exits.parse().ok()?, hcalls.strip_suffix(" hypercalls")?.parse().ok()?))
    }

    /// The guest's own count from its last line, `fuzz: seed S: N ops, H
    /// hypercalls`: (N, H).
    fn guest_counts(&self, seed: u64) -> Option<(u64, u64)> {
        let prefix = format!("fuzz: seed {seed}: ");
        let line = self.stdout.lines().rev().find(|l| l.starts_with(&prefix) && l.ends_with(" hypercalls"))?;
        let rest = line.strip_prefix(&prefix)?;
        let (ops, hcalls) = rest.split_once(" ops, ")?;
        Some((ops.parse().ok()?, hcalls.strip_suffix(" hypercalls")?.parse().ok()?))
    }

    /// The guest's paging line, `... N entry updates, A accesses, F of them
    /// faults`: (N, A, F).
    fn paging_counts(&self, seed: u64) -> Option<(u64, u64, u64)> {
        let prefix = format!("fuzz: seed {seed}: paging: ");
        let line = self.stdout.lines().find(|l| l.starts_with(&prefix))?;
        let (_, rest) = line.split_once(", ")?;
        let (updates, rest) = rest.split_once(" entry updates, ")?;
        let (accesses, rest) = rest.split_once(" accesses, ")?;
        let faults = rest.strip_suffix(" of them faults")?;
        Some((updates.parse().ok()?, accesses.parse().ok()?, faults.parse().ok()?))
    }

    /// The reason after `lguest: guest killed by the host: `, if any.
    fn kill_reason(&self) -> Option<&str> {
        self.stderr.lines().find_map(|l| l.strip_prefix("lguest: guest killed by the host: "))
    }
}

/// Starts `lguest -v run --memory 16M GUEST ARGS...`.
fn spawn(guest_name: &str, args: &[String]) -> Result<Proc, t::NotPassed> {
    let mut a = strings(&["-v", "run", "--memory", "16M", &guest(guest_name)]);
    a.extend_from_slice(args);
    Proc::launcher(&a, None)
}

/// Page-table entry updates the page-table test wants in all.
const PAGE_TABLE_UPDATES: u64 = 100_000;
/// Operations per run of the page-table test, and how many of a thousand
/// are page-table operations.
const PAGE_TABLE_OPS: u64 = 100_000;
const PAGE_TABLE_RATE: u64 = 900;

fn fuzz_args(seed: u64, count: u64, kill_rate: u64) -> Vec<String> {
    vec![format!("seed={seed}"), format!("count={count}"), format!("kill_rate={kill_rate}")]
}

/// Checks a run with `kill_rate=0`: powered off (status 0) after the final
/// line; returns the host's hypercall count.
fn check_clean(o: &Outcome, seed: u64, count: u64) -> Result<u64, t::NotPassed> {
    if o.code != 0 || o.kill_reason().is_some() {
        fail!("seed {seed}: a valid operation ended the guest: {}", o.describe());
    }
    let Some((ops, guest_hcalls)) = o.guest_counts(seed) else {
        fail!("seed {seed}: no final line: {}", o.describe());
    };
    check_eq!(ops, count, format!("seed {seed}: operations done ({})", o.describe()));
    let Some((_, host)) = o.host_counts() else {
        fail!("seed {seed}: no hypercall count from lguest -v: {}", o.describe());
    };
    check!(
        host >= guest_hcalls,
        "seed {seed}: the host counted {host} hypercalls, fewer than the guest's own {guest_hcalls}: {}",
        o.describe()
    );
    Ok(host)
}

/// Operations the host must accept never kill the guest, and the guest's
/// checks (registers across hypercalls, trap vectors, the async ring) hold.
fn valid_ops_never_kill() -> TestResult {
    let p = plan();
    let seed = p.base + 1;
    let valid_ops = p.valid_ops;
    let o = spawn("fuzz", &fuzz_args(seed, valid_ops, 0))?.wait(RUN_TIMEOUT)?;
    let host = check_clean(&o, seed, valid_ops)?;
    for line in
        o.stdout.lines().filter(|l| !l.contains(": progress: ") && (l.contains(" traps, ") || l.contains(": paging: ")))
    {
        println!("# valid_ops_never_kill: {line}");
    }
    let exits = o.host_counts().map_or(0, |c| c.0);
    println!(
        "# valid_ops_never_kill: seed {seed}: {valid_ops} ops, {host} hypercalls and {exits} exits (host counts) in \
         {:.1} s ({:.0} hypercalls/s)",
        o.took.as_secs_f64(),
        host as f64 / o.took.as_secs_f64()
    );
    Ok(())
}

/// A kill reason with its numbers replaced by `N`, for the tally.
fn reason_kind(reason: &str) -> String {
    let mut out = String::new();
    let mut chars = reason.chars().peekable();
    while let Some(c) = chars.next() {
        if c.is_ascii_digit() {
            if c == '0' && chars.peek() == Some(&'x') {
                chars.next();
            }
            while chars.peek().is_some_and(|c| c.is_ascii_hexdigit()) {
                chars.next();
            }
            out.push('N');
        } else {
            out.push(c);
        }
    }
    out
}

/// With a kill rate of 2 to 50 permille every run ends in one fatal
/// operation (all but about one in 10000 runs): the host must kill the
/// guest with the reason the guest announced, and the launcher stop with
/// status 2. A run that ends without a fatal operation must have powered
/// off after its last operation.
fn fatal_ops_kill_with_reason() -> TestResult {
    let mut tally: BTreeMap<String, u32> = BTreeMap::new();
    let mut failures = Vec::new();
    let start = Instant::now();
    let p = plan();
    let runs = p.fatal_runs;
    println!("# seeds {} to {}", p.base + 1, p.base + runs);
    for seed in p.base + 1..=p.base + runs {
        let kill_rate = FATAL_KILL_RATES[(seed % 4) as usize];
        let o = spawn("fuzz", &fuzz_args(seed, FATAL_OPS, kill_rate))?.wait(FATAL_TIMEOUT)?;
        let expect = o.stdout.lines().rev().find_map(|l| l.split_once("; expect: ").map(|(_, e)| e.to_owned()));
        match (o.code, o.kill_reason(), expect) {
            (EXIT_KILLED, Some(reason), Some(expect)) if reason.starts_with(&expect) => {
                *tally.entry(reason_kind(reason)).or_default() += 1;
            }
            (EXIT_KILLED, Some(reason), Some(expect)) => {
                failures.push(format!("seed {seed}: killed with {reason:?}, expected {expect:?}: {}", o.describe()))
            }
            (EXIT_KILLED, Some(reason), None) => failures
                .push(format!("seed {seed}: killed with {reason:?} before any fatal operation: {}", o.describe())),
            (0, None, None) if o.guest_counts(seed).is_some() => {
                *tally.entry("(no fatal operation: powered off)".into()).or_default() += 1;
            }
            _ => failures.push(format!("seed {seed}: not killed as expected: {}", o.describe())),
        }
    }
    for (reason, n) in &tally {
        println!("# reason: {reason}: {n}");
    }
    println!("# fatal_ops_kill_with_reason: {runs} runs in {:.1} s", start.elapsed().as_secs_f64());
    if !failures.is_empty() {
        fail!("{} of {runs} runs failed:\n{}", failures.len(), failures.join("\n"));
    }
    let hello = spawn("hello", &["after".into(), "the".into(), "kills".into()])?.wait(RUN_TIMEOUT)?;
    check_eq!(hello.code, 0, format!("hello after the kills ({})", hello.describe()));
    Ok(())
}

/// At least a million hypercalls in all, counted by the host, then the
/// host still runs a guest.
fn million_hypercalls() -> TestResult {
    let start = Instant::now();
    let p = plan();
    let mut total = 0u64;
    let mut runs = 0u64;
    let mut seed = p.base + 1000;
    let ops = MILLION_OPS.min(p.million / MILLION_PARALLEL as u64);
    let cap = RUNS_CAP * p.million.div_ceil(ops);
    println!("# seeds from {seed}");
    while total < p.million {
        if runs >= cap {
            fail!("only {total} hypercalls in {runs} runs of {ops} operations");
        }
        let batch: Vec<(u64, Proc)> = (0..MILLION_PARALLEL)
            .map(|i| {
                let s = seed + i as u64;
                spawn("fuzz", &fuzz_args(s, ops, 0)).map(|r| (s, r))
            })
            .collect::<Result<_, _>>()?;
        seed += MILLION_PARALLEL as u64;
        for (s, r) in batch {
            let o = r.wait(RUN_TIMEOUT)?;
            total += check_clean(&o, s, ops)?;
            runs += 1;
        }
    }
    let took = start.elapsed().as_secs_f64();
    println!(
        "# million_hypercalls: {total} hypercalls in {runs} runs of {ops} ops ({} at once), {took:.1} s, {:.0} hypercalls/s",
        MILLION_PARALLEL,
        total as f64 / took
    );
    let hello = spawn("hello", &["after".into(), "the".into(), "fuzzing".into()])?.wait(RUN_TIMEOUT)?;
    check_eq!(hello.code, 0, format!("hello after the fuzzing ({})", hello.describe()));
    check!(hello.stdout.contains("Hello from the lguest guest"), "no greeting: {}", hello.describe());
    Ok(())
}

/// At least 10^5 page-table entry updates (each told to the host with
/// SET_PTE, the async ring or a flush, and most followed by an access whose
/// outcome the guest checks) from runs with `paging=900`; none may kill.
fn page_table_ops() -> TestResult {
    // The debug kernel (KASAN, lockdep) is several times slower: there
    // the point is its checkers, and a fifth of the work will do.
    let debug = t::debug_kernel();
    let p = plan();
    let (target, ops) = if debug {
        (p.page_table_updates / 5, PAGE_TABLE_OPS / 5)
    } else {
        (p.page_table_updates, PAGE_TABLE_OPS * p.page_table_updates / PAGE_TABLE_UPDATES)
    };
    let start = Instant::now();
    let (mut updates, mut accesses, mut faults, mut runs) = (0u64, 0u64, 0u64, 0u64);
    let mut seed = p.base + 5000;
    println!("# seeds from {seed}");
    // Each run of `ops` operations makes about target/2 updates (two run at
    // once); give up after four times the runs that needs.
    let cap = RUNS_CAP * 2 * MILLION_PARALLEL as u64;
    while updates < target {
        if runs >= cap {
            fail!("only {updates} page-table updates in {runs} runs of {ops} operations");
        }
        let mut args = fuzz_args(seed, ops, 0);
        args.push(format!("paging={PAGE_TABLE_RATE}"));
        let batch: Vec<(u64, Proc)> = (0..MILLION_PARALLEL as u64)
            .map(|i| {
                let mut a = args.clone();
                a[0] = format!("seed={}", seed + i);
                spawn("fuzz", &a).map(|r| (seed + i, r))
            })
            .collect::<Result<_, _>>()?;
        seed += MILLION_PARALLEL as u64;
        for (s, r) in batch {
            let o = r.wait(RUN_TIMEOUT)?;
            check_clean(&o, s, ops)?;
            let Some((u, a, f)) = o.paging_counts(s) else {
                fail!("seed {s}: no paging line: {}", o.describe());
            };
            updates += u;
            accesses += a;
            faults += f;
            runs += 1;
        }
    }
    if debug {
        println!("# debug kernel: a fifth of the work");
    }
    println!(
        "# page_table_ops: {updates} entry updates, {accesses} checked accesses ({faults} faults as expected) in {runs} \
         runs, {:.1} s",
        start.elapsed().as_secs_f64()
    );
    Ok(())
}

fn main() -> ExitCode {
    t::run(&[
        ("valid_ops_never_kill", valid_ops_never_kill),
        ("fatal_ops_kill_with_reason", fatal_ops_kill_with_reason),
        ("million_hypercalls", million_hypercalls),
        ("page_table_ops", page_table_ops),
    ])
}
