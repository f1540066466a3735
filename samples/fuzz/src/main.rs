// SPDX-License-Identifier: GPL-2.0
//! `fuzz`: a guest that throws random operations at the host, seeded and
//! reproducible, for the host selftests.
//!
//! ```text
//! fuzz seed=N count=N [kill_rate=PERMILLE] [paging=PERMILLE]
//! ```
//!
//! It installs a handler on every exception vector the host delivers and
//! the timer's (IRQ 0), finds the size of RAM by probing (a read past the
//! end faults), and then performs `count` operations chosen by a splitmix64
//! generator seeded with `seed`. Every one of them is something the host
//! must accept:
//!
//! - hypercalls the host must take with any arguments (`FLUSH_ASYNC`,
//!   `SEND_INTERRUPTS`), with random values in every other register and
//!   random arithmetic flags, all checked afterwards (only RAX changes, to
//!   0);
//! - `SET_CLOCKEVENT` with random delays, 0 and huge ones included;
//!   `LOAD_IDT_ENTRY` for the vectors the guest uses (its own stubs, either
//!   gate type), for vectors that are never raised (any handler below 2^47,
//!   0 included); `NOTIFY` of the device window (which the launcher
//!   ignores) or of an empty string; `HALT` with the timer armed soon;
//!   a hypercall with RSP somewhere the guest cannot write (interrupts off);
//! - batches of such calls in the async ring, flushed by a hypercall and
//!   checked to have run; junk behind a status that is neither 0 nor DONE,
//!   which must not run;
//! - exceptions and privileged instructions (see [`traps`]), reflected to
//!   the guest's handler and resumed after;
//! - turning virtual interrupts off and on, blocking and unblocking lines;
//! - page tables: `FLUSH_TLB`, `SET_PMD`, `SET_PGD` and `SET_PTE` with any
//!   arguments; from a random operation in the first half of the run on,
//!   the guest's own page tables (`NEW_PGTABLE`) and random updates of a
//!   scratch window in them, each checked by accessing it (see
//!   [`paging`]).
//!
//! With `paging=P`, P operations in a thousand (default 0, on top of the
//! usual few) are page-table operations, from the first operation on.
//!
//! With probability `kill_rate`/1000 per operation (default 0), it instead
//! performs one operation the host must kill it for, announced first as
//!
//! ```text
//! fuzz: seed S: op N: fatal: <what>; expect: <the start of the kill reason>
//! ```
//!
//! (a bad or not yet supported hypercall, a bad `LOAD_IDT_ENTRY`,
//! `LGUEST_INIT` again, a bad `SHUTDOWN`, a forbidden or bad entry in the
//! async ring, a trap or the timer interrupt with its handler removed, a
//! trap with RSP where the frame cannot go, `NEW_PGTABLE` of something that
//! is not a page of RAM, a page-table entry pointing outside RAM or with
//! the page-size bit at the top level). The test checks that the host's
//! kill reason starts with the expected one. If the host lets the guest
//! live, it crashes with `fuzz: seed S op N: survived: ...`.
//!
//! Progress: `fuzz: seed S: progress: N ops, ...` every 100000 operations;
//! at the end `fuzz: seed S: N ops, H hypercalls` (H: the hypercalls the
//! fuzzer made itself, not those of the guest library), then power-off. Any
//! broken promise of the host (a register changed by a hypercall, a trap
//! with the wrong vector or none, a ring entry not run or run when it must
//! not be, an exception nobody expected) crashes the guest with
//! `fuzz: seed S op N: <what>`.
#![no_std]
#![no_main]

mod hc;
mod paging;
mod ring;
mod rng;
mod traps;

use core::fmt;
use core::sync::atomic::{AtomicU64, Ordering};

use lguest_guest::abi::{GUEST_UPPER_START, GUEST_VA_END};
use lguest_guest::abi::{
    LGUEST_IRQS, LGUEST_MAX_MEM, LGUEST_SHUTDOWN_POWEROFF, LHCALL_FLUSH_ASYNC, LHCALL_FLUSH_TLB, LHCALL_HALT,
    LHCALL_IRET_USER, LHCALL_LGUEST_INIT, LHCALL_LOAD_GDT_ENTRY, LHCALL_LOAD_IDT_ENTRY, LHCALL_LOAD_TLS,
    LHCALL_NEW_PGTABLE, LHCALL_NOTIFY, LHCALL_SEND_INTERRUPTS, LHCALL_SET_CLOCKEVENT, LHCALL_SET_PGD, LHCALL_SET_PMD,
    LHCALL_SET_PTE, LHCALL_SET_STACK, LHCALL_SHUTDOWN, LHCALL_TS, X86_EFLAGS_IF,
};
use lguest_guest::interrupts::{self, GATE_INTERRUPT, GATE_TRAP};
use lguest_guest::{clock, crash, crash_fmt, data, entry, paravirt, poweroff_fmt, println, Args};

use rng::Rng;

entry!(main);

/// Operations between two progress lines.
const PROGRESS_EVERY: u64 = 100_000;
/// One page.
pub const PAGE: u64 = 4096;
/// The lowest address of RAM that is mapped.
pub const LOAD_MIN: u64 = 0x10_0000;

/// The seed and the operation in progress, for messages.
static SEED: AtomicU64 = AtomicU64::new(0);
static OP: AtomicU64 = AtomicU64::new(0);

/// Stops the guest as crashed: the host broke a promise (or this guest has
/// a bug). The message names the seed and the operation.
pub fn fail(args: fmt::Arguments<'_>) -> ! {
    crash_fmt(format_args!("fuzz: seed {} op {}: {args}", SEED.load(Ordering::Relaxed), OP.load(Ordering::Relaxed)))
}

/// Announces a fatal operation and the kill reason it should get.
pub fn announce(what: fmt::Arguments<'_>, expect: fmt::Arguments<'_>) {
    println!(
        "fuzz: seed {}: op {}: fatal: {what}; expect: {expect}",
        SEED.load(Ordering::Relaxed),
        OP.load(Ordering::Relaxed)
    );
}

/// An empty console string.
static EMPTY: [u8; 1] = [0];

/// The hypercalls this host does not support yet, with their names.
const UNSUPPORTED: &[(u64, &str)] =
    &[(LHCALL_TS, "TS"), (LHCALL_LOAD_TLS, "LOAD_TLS"), (LHCALL_LOAD_GDT_ENTRY, "LOAD_GDT_ENTRY")];
/// The page-table hypercalls that take any arguments: the flushes, and
/// `SET_PTE`, which only drops the shadow of the page named.
const PAGE_TABLE_ANY: &[u64] = &[LHCALL_FLUSH_TLB, LHCALL_SET_PMD, LHCALL_SET_PGD, LHCALL_SET_PTE];
/// Every hypercall number the host knows.
const KNOWN: &[u64] = &[0, 1, 2, 4, 5, 6, 7, 8, 9, 10, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25];
/// Vectors the host keeps for itself.
const HOST_VECTORS: &[u64] = &[2, 8, 18, 31];
/// Exception vectors the CPU never raises here (reserved, #VE, ...).
const QUIET_EXCEPTIONS: &[u64] = &[9, 15, 20, 22, 23, 24, 25, 26, 27, 28, 29, 30];

/// What the fuzzer did, for the summary.
#[derive(Default)]
struct Stats {
    clockevents: u64,
    idt_loads: u64,
    ring_batches: u64,
    junk: u64,
    notifies: u64,
    halts: u64,
    wild_stacks: u64,
    toggles: u64,
}

struct Fuzz {
    rng: Rng,
    /// The size of RAM.
    mem: u64,
    /// The virtual IF the fuzzer last set.
    irq_on: bool,
    ring: ring::Ring,
    /// The guest's own page tables (if RAM has room for them), and the
    /// operation from which the fuzzer may switch to them.
    paging: Option<paging::Paging>,
    paging_from: u64,
    /// Extra page-table operations per thousand (`paging=`), on top of
    /// the usual mix.
    paging_rate: u64,
    stats: Stats,
}

fn usage() -> ! {
    println!("fuzz: usage: fuzz seed=N count=N [kill_rate=PERMILLE] [paging=PERMILLE]");
    crash("fuzz: bad command line")
}

fn main(args: Args) -> ! {
    let (mut seed, mut count, mut kill_rate, mut paging_rate) = (None, None, 0u64, 0u64);
    for word in args {
        let Some((key, value)) = word.split_once('=') else { usage() };
        let Ok(value) = value.parse::<u64>() else { usage() };
        match key {
            "seed" => seed = Some(value),
            "count" => count = Some(value),
            "kill_rate" if value <= 1000 => kill_rate = value,
            "paging" if value <= 1000 => paging_rate = value,
            _ => usage(),
        }
    }
    let (Some(seed), Some(count)) = (seed, count) else { usage() };
    SEED.store(seed, Ordering::Relaxed);

    traps::set_handlers();
    if let Err(e) = clock::init() {
        crash_fmt(format_args!("fuzz: {e}"));
    }
    let mem = probe_ram();
    println!("fuzz: seed {seed}: count {count}, kill_rate {kill_rate} permille, RAM {mem:#x} bytes");

    let paging = paging::Paging::build(mem);
    if paging.is_none() {
        println!("fuzz: seed {seed}: not enough RAM for page tables: no page-table operations");
    }
    let mut rng = Rng::new(seed);
    // With extra page-table operations asked for, from the start.
    let paging_from = if paging_rate > 0 { 0 } else { rng.below(count / 2 + 1) };
    let mut f = Fuzz {
        rng,
        mem,
        irq_on: false,
        ring: ring::Ring::new(),
        paging,
        paging_from,
        paging_rate,
        stats: Stats::default(),
    };
    for op in 0..count {
        OP.store(op, Ordering::Relaxed);
        if f.rng.chance(kill_rate) {
            f.fatal();
        }
        f.one(op);
        if (op + 1) % PROGRESS_EVERY == 0 {
            println!(
                "fuzz: seed {seed}: progress: {} ops, {} hypercalls, {} traps, {} timer interrupts",
                op + 1,
                hc::HCALLS.load(Ordering::Relaxed),
                traps::TRAPS.load(Ordering::Relaxed),
                clock::ticks()
            );
        }
    }
    OP.store(count, Ordering::Relaxed);
    paravirt::irq_disable();
    f.hcall(LHCALL_SET_CLOCKEVENT, [0, 0, 0, 0]);
    let s = &f.stats;
    println!(
        "fuzz: seed {seed}: {} traps, {} ring entries in {} batches, {} junk entries, {} clock events, {} IDT loads, \
         {} notifies, {} halts, {} wild stacks, {} irq toggles, {} timer interrupts",
        traps::TRAPS.load(Ordering::Relaxed),
        f.ring.total,
        s.ring_batches,
        s.junk,
        s.clockevents,
        s.idt_loads,
        s.notifies,
        s.halts,
        s.wild_stacks,
        s.toggles,
        clock::ticks()
    );
    if let Some(p) = &f.paging {
        println!(
            "fuzz: seed {seed}: paging: own tables from op {}{}, {} entry updates, {} accesses, {} of them faults",
            f.paging_from,
            if p.active.is_some() { "" } else { " (never switched)" },
            p.updates,
            p.accesses,
            p.faults
        );
    }
    println!("fuzz: seed {seed}: {count} ops, {} hypercalls", hc::HCALLS.load(Ordering::Relaxed));
    poweroff_fmt(format_args!("fuzz: seed {seed}: done"))
}

/// The size of RAM: the first page, above the image, whose read faults
/// (RAM is mapped linearly from 1 MiB to its end, nothing above).
fn probe_ram() -> u64 {
    let mut lo = (lguest_guest::start::image().end - 1) & !(PAGE - 1);
    let mut hi = LGUEST_MAX_MEM;
    if !traps::mapped(lo) || traps::mapped(hi) {
        crash_fmt(format_args!("fuzz: probing RAM: {lo:#x} should be mapped and {hi:#x} not"));
    }
    while hi - lo > PAGE {
        let mid = (lo + (hi - lo) / 2) & !(PAGE - 1);
        if traps::mapped(mid) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    hi
}

impl Fuzz {
    /// A checked hypercall (see [`hc::hcall`]).
    fn hcall(&mut self, nr: u64, a: [u64; 4]) {
        hc::hcall(&mut self.rng, nr, a);
    }

    /// Four random arguments.
    fn args(&mut self) -> [u64; 4] {
        [self.rng.arg(), self.rng.arg(), self.rng.arg(), self.rng.arg()]
    }

    /// One operation the host must accept.
    fn one(&mut self, op: u64) {
        // (No draw at all without `paging=`: old seeds replay unchanged.)
        if self.paging_rate > 0 && self.rng.chance(self.paging_rate) {
            if let Some(p) = self.paging.as_mut() {
                p.op(&mut self.rng, &mut self.ring);
                return;
            }
        }
        match self.rng.below(1000) {
            345..350 => {
                let nr = self.rng.pick(PAGE_TABLE_ANY);
                let a = self.args();
                self.hcall(nr, a);
            }
            350..380 if op >= self.paging_from && self.paging.is_some() => {
                if let Some(p) = self.paging.as_mut() {
                    p.op(&mut self.rng, &mut self.ring);
                }
            }
            0..380 => {
                let nr = if self.rng.chance(500) { LHCALL_FLUSH_ASYNC } else { LHCALL_SEND_INTERRUPTS };
                let a = self.args();
                self.hcall(nr, a);
            }
            380..460 => {
                let ns = self.clock_ns();
                let a = self.args();
                self.hcall(LHCALL_SET_CLOCKEVENT, [ns, a[1], a[2], a[3]]);
                self.stats.clockevents += 1;
            }
            460..530 => {
                let [v, h, g] = self.idt_entry();
                let extra = self.rng.arg();
                self.hcall(LHCALL_LOAD_IDT_ENTRY, [v, h, g, extra]);
                self.stats.idt_loads += 1;
            }
            530..600 => self.ring_batch(),
            600..615 => self.ring_junk(),
            615..625 => self.notify(),
            625..630 => self.halt(),
            630..640 => self.wild_stack(),
            640..890 => traps::random(&mut self.rng, self.mem),
            _ => self.toggle(),
        }
    }

    /// A clock-event delay: 0 (cancel), an edge value, short, long, or
    /// anything.
    fn clock_ns(&mut self) -> u64 {
        match self.rng.below(8) {
            0 => 0,
            1 => self.rng.pick(&[1, 999, 1000, 1001, i64::MAX as u64, 1 << 63, u64::MAX, 1 << 62]),
            2..=4 => self.rng.range(1000, 200_000),
            5 | 6 => self.rng.range(1_000_000, 10_000_000_000),
            _ => self.rng.next(),
        }
    }

    /// A `LOAD_IDT_ENTRY` the host must accept and that cannot hurt: a
    /// vector the guest uses, with its own stub; or a vector nothing ever
    /// raises, with any handler below 2^47.
    fn idt_entry(&mut self) -> [u64; 3] {
        let gate = if self.rng.chance(500) { GATE_INTERRUPT } else { GATE_TRAP };
        match self.rng.below(4) {
            0 | 1 => {
                let v = if self.rng.chance(100) {
                    u64::from(interrupts::FIRST_IRQ_VECTOR)
                } else {
                    u64::from(self.rng.pick(interrupts::EXCEPTION_VECTORS))
                };
                [v, stub(v), gate]
            }
            2 => {
                // Not the system-call vector: the trap tests raise `int
                // $0x80` and expect the #GP of a missing gate.
                let v = loop {
                    let v = self.rng.range(96, 255);
                    if v != u64::from(lguest_guest::abi::LGUEST_SYSCALL_VECTOR) {
                        break v;
                    }
                };
                let handler = match self.rng.below(4) {
                    0 => 0,
                    1 => self.rng.pick(&[1, 0x1000, LOAD_MIN, GUEST_VA_END - 1, GUEST_VA_END - 16, stub(3)]),
                    _ => self.rng.below(GUEST_VA_END),
                };
                [v, handler, gate]
            }
            _ => {
                let v = if self.rng.chance(500) {
                    self.rng.pick(QUIET_EXCEPTIONS)
                } else {
                    self.rng.range(u64::from(interrupts::FIRST_IRQ_VECTOR) + 1, 95)
                };
                let handler = if self.rng.chance(500) { 0 } else { stub(v) };
                [v, handler, gate]
            }
        }
    }

    /// An entry the host runs without complaint.
    fn ring_entry(&mut self) -> [u64; 5] {
        let a = self.args();
        if self.rng.chance(15) {
            return [self.rng.pick(PAGE_TABLE_ANY), a[0], a[1], a[2], a[3]];
        }
        match self.rng.below(4) {
            0 => [LHCALL_FLUSH_ASYNC, a[0], a[1], a[2], a[3]],
            1 => [LHCALL_SEND_INTERRUPTS, a[0], a[1], a[2], a[3]],
            2 => [LHCALL_SET_CLOCKEVENT, self.clock_ns(), a[1], a[2], a[3]],
            _ => {
                let [v, h, g] = self.idt_entry();
                [LHCALL_LOAD_IDT_ENTRY, v, h, g, a[3]]
            }
        }
    }

    /// Queues 1 to 16 entries (or a whole ring of 64), flushes them with a
    /// hypercall and checks that all ran.
    fn ring_batch(&mut self) {
        let n = if self.rng.chance(60) { 64 } else { self.rng.range(1, 16) };
        for _ in 0..n {
            let e = self.ring_entry();
            self.ring.queue(e);
        }
        let a = self.args();
        match self.rng.below(3) {
            0 => self.hcall(LHCALL_FLUSH_ASYNC, a),
            1 => self.hcall(LHCALL_SEND_INTERRUPTS, a),
            _ => {
                let ns = self.clock_ns();
                self.hcall(LHCALL_SET_CLOCKEVENT, [ns, a[1], a[2], a[3]]);
            }
        }
        self.ring.check_ran();
        self.stats.ring_batches += 1;
    }

    /// A junk entry (a status neither 0 nor DONE, and something fatal in
    /// it), maybe with a fatal queued entry behind it: nothing may run.
    fn ring_junk(&mut self) {
        let status = self.rng.range(1, 0xfe) as u8;
        let junk = [self.rng.pick(&[LHCALL_NOTIFY, LHCALL_SHUTDOWN, 9999, LHCALL_SET_PTE]), 0, 0, 0, 0];
        let behind = self.rng.chance(500).then_some([LHCALL_LGUEST_INIT, 0, 0, 0, 0]);
        self.ring.put_junk(junk, status, behind);
        let a = self.args();
        self.hcall(LHCALL_FLUSH_ASYNC, a);
        self.ring.check_junk(status, behind.is_some());
        self.stats.junk += 1;
    }

    /// `NOTIFY` of the device window (ignored by the launcher) or of an
    /// empty string (prints nothing).
    fn notify(&mut self) {
        let addr = if self.rng.chance(250) { EMPTY.as_ptr() as u64 } else { self.mem + self.rng.below(PAGE) };
        let a = self.args();
        self.hcall(LHCALL_NOTIFY, [addr, a[1], a[2], a[3]]);
        self.stats.notifies += 1;
    }

    /// `HALT` with the timer armed soon (and its line open): the host
    /// sleeps until it fires and returns through the interrupt.
    fn halt(&mut self) {
        interrupts::unblock(clock::TIMER_IRQ);
        paravirt::irq_disable();
        let ns = self.rng.range(1000, 100_000);
        let a = self.args();
        self.hcall(LHCALL_SET_CLOCKEVENT, [ns, a[1], a[2], a[3]]);
        let a = self.args();
        self.hcall(LHCALL_HALT, a);
        if paravirt::save_fl() != X86_EFLAGS_IF {
            fail(format_args!("after HALT the virtual IF is {:#x}", paravirt::save_fl()));
        }
        self.set_if(self.irq_on);
        self.stats.halts += 1;
    }

    /// A hypercall with RSP where the guest cannot write, interrupts off.
    fn wild_stack(&mut self) {
        let rsp = match self.rng.below(6) {
            0 => 0,
            1 => self.rng.below(LOAD_MIN),
            2 => self.mem + self.rng.below(1 << 30),
            3 => 0xffff_8000_0000_0000 | self.rng.next(),
            4 => (1 << 47) + self.rng.below(1 << 40),
            _ => self.rng.next(),
        };
        paravirt::irq_disable();
        let nr = if self.rng.chance(500) { LHCALL_FLUSH_ASYNC } else { LHCALL_SEND_INTERRUPTS };
        hc::wild_stack(nr, rsp);
        self.set_if(self.irq_on);
        self.stats.wild_stacks += 1;
    }

    /// Turns the virtual IF on or off as the fuzzer wants it.
    fn set_if(&mut self, on: bool) {
        self.irq_on = on;
        if on {
            paravirt::irq_enable();
        } else {
            paravirt::irq_disable();
        }
    }

    /// Virtual interrupts off or on, flags saved and restored, lines
    /// blocked and unblocked (no line but the timer's is ever raised).
    fn toggle(&mut self) {
        let want = if self.irq_on { X86_EFLAGS_IF } else { 0 };
        match self.rng.below(6) {
            0 => self.set_if(false),
            1 => self.set_if(true),
            2 => {
                let got = paravirt::save_fl();
                if got != want {
                    fail(format_args!("save_fl is {got:#x}, expected {want:#x}"));
                }
                paravirt::restore_fl(got);
            }
            3 => {
                let flags = self.rng.next();
                paravirt::restore_fl(flags);
                self.irq_on = flags & X86_EFLAGS_IF != 0;
            }
            4 => {
                if self.rng.chance(500) {
                    interrupts::block(clock::TIMER_IRQ);
                } else {
                    interrupts::unblock(clock::TIMER_IRQ);
                }
            }
            _ => {
                for _ in 0..self.rng.range(1, 8) {
                    let line = self.rng.range(1, LGUEST_IRQS as u64 - 1) as u8;
                    if self.rng.chance(500) {
                        interrupts::block(line);
                    } else {
                        interrupts::unblock(line);
                    }
                }
            }
        }
        self.stats.toggles += 1;
    }

    /// One operation the host must kill the guest for; it does not return.
    fn fatal(&mut self) -> ! {
        match self.rng.below(16) {
            14 => self.bad_new_pgtable(),
            15 if self.paging.is_some() => {
                let mem = self.mem;
                match self.paging.as_mut() {
                    Some(p) => p.fatal(&mut self.rng, mem),
                    None => self.bad_new_pgtable(),
                }
            }
            0 => {
                let nr = self.bad_nr();
                announce(format_args!("hypercall {nr}"), format_args!("bad hypercall {nr}"));
                hc::fatal_hcall(nr, self.args())
            }
            1 if self.rng.chance(300) => self.bad_user_mode(),
            1 => {
                let (nr, name) = self.unsupported();
                announce(
                    format_args!("hypercall {name}"),
                    format_args!("hypercall {name} is not supported by this host yet"),
                );
                hc::fatal_hcall(nr, self.args())
            }
            2..=5 => {
                let bad = self.bad_idt_entry();
                let entry = bad.entry();
                announce(
                    format_args!("LOAD_IDT_ENTRY({:#x}, {:#x}, {:#x})", entry[0], entry[1], entry[2]),
                    format_args!("{bad}"),
                );
                hc::fatal_hcall(LHCALL_LOAD_IDT_ENTRY, [entry[0], entry[1], entry[2], 0])
            }
            6 => {
                announce(format_args!("LGUEST_INIT again"), format_args!("LGUEST_INIT called twice"));
                let addr = if self.rng.chance(500) { data::address() } else { self.rng.arg() };
                hc::fatal_hcall(LHCALL_LGUEST_INIT, [addr, 0, 0, 0])
            }
            7 => {
                let reason = loop {
                    let r = self.rng.arg();
                    if !(1..=3).contains(&r) {
                        break r;
                    }
                };
                announce(format_args!("SHUTDOWN with reason {reason}"), format_args!("bad shutdown reason {reason}"));
                hc::fatal_hcall(LHCALL_SHUTDOWN, [EMPTY.as_ptr() as u64, reason, 0, 0])
            }
            8 => {
                let addr = match self.rng.below(4) {
                    0 => self.mem,
                    1 => self.mem + self.rng.below(1 << 30),
                    2 => self.rng.pick(&[u64::MAX, 1 << 47, 0xffff_8000_0000_0000]),
                    _ => self.rng.next() | self.mem.next_power_of_two(),
                };
                announce(
                    format_args!("SHUTDOWN with the message at {addr:#x}"),
                    format_args!("shutdown message address {addr:#x} is outside guest memory"),
                );
                hc::fatal_hcall(LHCALL_SHUTDOWN, [addr, LGUEST_SHUTDOWN_POWEROFF, 0, 0])
            }
            9 => {
                let (nr, name) =
                    self.rng.pick(&[(LHCALL_NOTIFY, "NOTIFY"), (LHCALL_SHUTDOWN, "SHUTDOWN"), (LHCALL_HALT, "HALT")]);
                let before = self.rng.below(8);
                announce(
                    format_args!("{name} in the async ring after {before} good entries"),
                    format_args!("hypercall {name} is not allowed in the async ring"),
                );
                for _ in 0..before {
                    let e = self.ring_entry();
                    self.ring.queue(e);
                }
                let a = self.args();
                self.ring.queue([nr, EMPTY.as_ptr() as u64, LGUEST_SHUTDOWN_POWEROFF, a[2], a[3]]);
                hc::fatal_hcall(LHCALL_FLUSH_ASYNC, [0; 4])
            }
            10 => self.bad_ring_entry(),
            11 => traps::fatal(&mut self.rng),
            12 => self.irq_without_handler(),
            13 => self.trap_on_wild_stack(),
            _ => self.bad_new_pgtable(),
        }
    }

    /// `NEW_PGTABLE` of an address that is not a page of RAM.
    fn bad_new_pgtable(&mut self) -> ! {
        let gpa = match self.rng.below(4) {
            0 => {
                let pa = self.rng.below(self.mem);
                if pa.is_multiple_of(PAGE) {
                    pa + 8
                } else {
                    pa
                }
            }
            1 => self.mem + self.rng.below(1 << 20) * PAGE,
            2 => self.rng.pick(&[!(PAGE - 1), 1 << 47, u64::MAX, self.mem - PAGE + 1]),
            _ => self.rng.next() | self.mem.next_power_of_two(),
        };
        announce(format_args!("NEW_PGTABLE({gpa:#x})"), format_args!("NEW_PGTABLE: bad page table address {gpa:#x}"));
        hc::fatal_hcall(LHCALL_NEW_PGTABLE, [gpa, 0, 0, 0])
    }

    /// A hypercall number the host does not know.
    fn bad_nr(&mut self) -> u64 {
        loop {
            let nr = match self.rng.below(3) {
                0 => self.rng.pick(&[3, 11, 12, 20, 31, 0x100, 9999, 1 << 32, u64::MAX]),
                1 => self.rng.below(64),
                _ => self.rng.next(),
            };
            if !KNOWN.contains(&nr) {
                return nr;
            }
        }
    }

    /// A user-mode hypercall the host must refuse: a bad kernel stack for
    /// `SET_STACK`, or `IRET_USER` before the guest has its own page tables
    /// or a kernel stack (the fuzzer never sets one).
    fn bad_user_mode(&mut self) -> ! {
        if self.rng.chance(500) {
            let stack = match self.rng.below(3) {
                0 => 0,
                1 => self.rng.pick(&[1 << 47, GUEST_VA_END + 8]),
                _ => {
                    let high = (1 << 47) + self.rng.below(1 << 40);
                    // The guard hole and non-canonical addresses: the top
                    // of the upper half is the guest's.
                    self.rng.pick(&[GUEST_UPPER_START - 8, 0xffff_8000_0000_0000, high])
                }
            };
            announce(format_args!("SET_STACK({stack:#x})"), format_args!("SET_STACK: bad kernel stack {stack:#x}"));
            let a = self.args();
            hc::fatal_hcall(LHCALL_SET_STACK, [stack, a[1], a[2], a[3]])
        }
        let own_tables = self.paging.as_ref().is_some_and(|p| p.active.is_some());
        let reason = if own_tables { "IRET_USER before SET_STACK" } else { "IRET_USER before NEW_PGTABLE" };
        announce(format_args!("IRET_USER"), format_args!("{reason}"));
        hc::fatal_hcall(LHCALL_IRET_USER, self.args())
    }

    /// A hypercall this host does not support yet.
    fn unsupported(&mut self) -> (u64, &'static str) {
        self.rng.pick(UNSUPPORTED)
    }

    /// A `LOAD_IDT_ENTRY` the host must refuse, and the reason it gives.
    fn bad_idt_entry(&mut self) -> IdtReason {
        let good_vector = |rng: &mut Rng| loop {
            let v = rng.below(256);
            if !HOST_VECTORS.contains(&v) {
                break v;
            }
        };
        let gate = if self.rng.chance(500) { GATE_INTERRUPT } else { GATE_TRAP };
        match self.rng.below(4) {
            0 => {
                let v = match self.rng.below(3) {
                    0 => 256,
                    1 => self.rng.pick(&[0x1_0000, 1 << 32, u64::MAX, 0x100 + 0x1f]),
                    _ => self.rng.next() | 0x100,
                };
                IdtReason::BadVector([v, stub(3), gate])
            }
            1 => IdtReason::HostVector([self.rng.pick(HOST_VECTORS), stub(3), gate]),
            2 => {
                let v = good_vector(&mut self.rng);
                let h = match self.rng.below(3) {
                    0 => self.rng.pick(&[1 << 47, GUEST_VA_END, GUEST_VA_END + 0x800]),
                    1 => self.rng.pick(&[GUEST_UPPER_START - 16, 0xffff_8000_0000_0000, 0x8000_0000_0000_0000]),
                    // Non-canonical: bit 47 set, bit 63 clear.
                    _ => (self.rng.next() | (1 << 47)) & !(1 << 63),
                };
                IdtReason::BadHandler([v, h, gate])
            }
            _ => {
                let v = good_vector(&mut self.rng);
                let t = loop {
                    let t = match self.rng.below(3) {
                        0 => self.rng.pick(&[0, 0xc, 0xd, 0x10, 0x10e, 0x8f, 0xffff_ffff_0000_000e]),
                        1 => self.rng.below(0x20),
                        _ => self.rng.next(),
                    };
                    if t != GATE_INTERRUPT && t != GATE_TRAP {
                        break t;
                    }
                };
                let h = if self.rng.chance(500) { 0 } else { stub(v.min(95)) };
                IdtReason::BadGate([v, h, t])
            }
        }
    }

    /// A bad entry in the async ring, after some good ones.
    fn bad_ring_entry(&mut self) -> ! {
        let before = self.rng.below(8);
        let a = self.args();
        let entry = match self.rng.below(3) {
            0 => {
                let nr = self.bad_nr();
                announce(format_args!("hypercall {nr} in the async ring"), format_args!("bad hypercall {nr}"));
                [nr, a[0], a[1], a[2], a[3]]
            }
            1 => {
                let (nr, name) = self.unsupported();
                announce(
                    format_args!("{name} in the async ring"),
                    format_args!("hypercall {name} is not supported by this host yet"),
                );
                [nr, a[0], a[1], a[2], a[3]]
            }
            _ => {
                let bad = self.bad_idt_entry();
                let e = bad.entry();
                announce(
                    format_args!("LOAD_IDT_ENTRY({:#x}, {:#x}, {:#x}) in the async ring", e[0], e[1], e[2]),
                    format_args!("{bad}"),
                );
                [LHCALL_LOAD_IDT_ENTRY, e[0], e[1], e[2], a[3]]
            }
        };
        for _ in 0..before {
            let e = self.ring_entry();
            self.ring.queue(e);
        }
        self.ring.queue(entry);
        hc::fatal_hcall(LHCALL_SEND_INTERRUPTS, [0; 4])
    }

    /// Removes the timer's handler, opens its line and arms it: the host
    /// must kill the guest when it cannot deliver the interrupt.
    fn irq_without_handler(&mut self) -> ! {
        let vector = u64::from(interrupts::FIRST_IRQ_VECTOR + clock::TIMER_IRQ);
        paravirt::irq_disable();
        announce(
            format_args!("timer interrupt with no handler"),
            format_args!("interrupt 0 is not blocked but the guest has no handler for vector {vector}"),
        );
        self.hcall(LHCALL_LOAD_IDT_ENTRY, [vector, 0, GATE_INTERRUPT, 0]);
        interrupts::unblock(clock::TIMER_IRQ);
        let ns = self.rng.range(1000, 100_000);
        self.hcall(LHCALL_SET_CLOCKEVENT, [ns, 0, 0, 0]);
        paravirt::irq_enable();
        for _ in 0..100_000 {
            paravirt::flush_async();
        }
        fail(format_args!("survived: timer interrupt with no handler"))
    }

    /// An exception with RSP where the host cannot push the frame.
    fn trap_on_wild_stack(&mut self) -> ! {
        let rsp = match self.rng.below(7) {
            0 => 0,
            1 => self.rng.below(LOAD_MIN),
            2 => LOAD_MIN + self.rng.below(0x28),
            3 => self.mem + 0x20 + self.rng.below(1 << 30),
            4 => 1 << 62,
            5 => 0xffff_8000_0000_0000 | self.rng.next(),
            _ => self.rng.next() | (1 << 47),
        };
        paravirt::irq_disable();
        announce(
            format_args!("int3 with rsp {rsp:#x}"),
            // The host says "is not in its memory" or "is not mapped in
            // guest memory", depending on its version.
            format_args!("cannot deliver vector 3: the guest stack at {rsp:#x} is not "),
        );
        hc::trap_on_wild_stack(rsp)
    }
}

/// The address of the guest library's entry stub of `vector` (< 96).
fn stub(vector: u64) -> u64 {
    match u8::try_from(vector).ok().and_then(interrupts::stub_address) {
        Some(a) => a,
        None => fail(format_args!("no stub for vector {vector}")),
    }
}

/// A `LOAD_IDT_ENTRY(vector, handler, type)` the host must refuse; its
/// `Display` is the reason the host gives.
#[derive(Clone, Copy)]
enum IdtReason {
    BadVector([u64; 3]),
    HostVector([u64; 3]),
    BadHandler([u64; 3]),
    BadGate([u64; 3]),
}

impl IdtReason {
    fn entry(self) -> [u64; 3] {
        match self {
            Self::BadVector(e) | Self::HostVector(e) | Self::BadHandler(e) | Self::BadGate(e) => e,
        }
    }
}

impl fmt::Display for IdtReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::BadVector([v, _, _]) => write!(f, "LOAD_IDT_ENTRY: bad vector {v}"),
            Self::HostVector([v, _, _]) => write!(f, "LOAD_IDT_ENTRY: vector {v} belongs to the host"),
            Self::BadHandler([v, h, _]) => {
                write!(f, "LOAD_IDT_ENTRY: handler {h:#x} for vector {v} is not a guest address")
            }
            Self::BadGate([v, _, t]) => write!(f, "LOAD_IDT_ENTRY: bad gate type {t:#x} for vector {v}"),
        }
    }
}
