// SPDX-License-Identifier: GPL-2.0
//! The interrupt and timer actions of `guest-ops`: `irqpending`, `twoirqs
//! [MS]`, `timer N`, `sleep MS`, `irqstorm N` and `latency`. Each prints
//! `guest-ops: <action>: ...` lines and powers off with
//! `guest-ops: <action>: done`, or crashes with `guest-ops: <action>: ...`
//! when the host did not keep the contract (see `lguest_guest::paravirt`
//! and `lguest_guest::interrupts`).
//!
//! Busy-waits for the host are bounded by [`WAIT_CYCLES`] TSC cycles, and
//! time is measured with the TSC; where a time has to become cycles and
//! the host gave no `tsc_khz`, a 3 GHz TSC is assumed ([`FALLBACK_KHZ`]).

use core::arch::asm;
use core::hint::black_box;
use core::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use lguest_guest::clock::{self, rdtsc};
use lguest_guest::interrupts::{self, TrapFrame};
use lguest_guest::{crash_fmt, data, paravirt, println};

use crate::{done, parse_count};

/// The longest busy-wait for the host: 2e9 TSC cycles (about 1 s at 2 GHz).
const WAIT_CYCLES: u64 = 2_000_000_000;
/// The TSC rate assumed when `lguest_data.tsc_khz` is 0.
const FALLBACK_KHZ: u32 = 3_000_000;
/// 1 ms in ns.
const MS: u64 = 1_000_000;

/// The TSC rate: the host's, or [`FALLBACK_KHZ`].
fn khz() -> u32 {
    match data::tsc_khz() {
        0 => FALLBACK_KHZ,
        khz => khz,
    }
}

/// Where `now_ns` comes from, for the console.
fn clock_source() -> &'static str {
    if clock::tsc_is_clock() {
        "TSC"
    } else {
        "lguest_data.time (no tsc_khz)"
    }
}

/// Busy-waits, without hypercalls, until `cond` holds; returns the TSC
/// cycles waited, or `None` after `max_cycles`.
fn spin_until(max_cycles: u64, mut cond: impl FnMut() -> bool) -> Option<u64> {
    let start = rdtsc();
    loop {
        let waited = rdtsc().wrapping_sub(start);
        if cond() {
            return Some(waited);
        }
        if waited > max_cycles {
            return None;
        }
        core::hint::spin_loop();
    }
}

/// Busy-waits `cycles` TSC cycles without hypercalls.
fn spin_cycles(cycles: u64) {
    let start = rdtsc();
    while rdtsc().wrapping_sub(start) < cycles {
        core::hint::spin_loop();
    }
}

/// Installs the clock's IRQ 0 handler (and any other handler set).
fn init_clock(action: &str) {
    if let Err(e) = clock::init() {
        crash_fmt(format_args!("guest-ops: {action}: {e}"));
    }
}

/// With interrupts off and an interrupt on its way, waits for the host to
/// say it holds one back; returns the TSC cycles it took.
fn wait_pending(action: &str) -> u64 {
    match spin_until(WAIT_CYCLES, || data::irq_pending() != 0) {
        Some(cycles) => cycles,
        None => crash_fmt(format_args!("guest-ops: {action}: irq_pending not set after {WAIT_CYCLES} TSC cycles")),
    }
}

/// `irqpending`: an interrupt that arrives while interrupts are off is held
/// back, announced in `irq_pending`, and delivered by `irq_enable`.
pub fn irqpending() -> ! {
    let a = "irqpending";
    init_clock(a);
    paravirt::irq_disable();
    let before = clock::ticks();
    println!("guest-ops: irqpending: interrupts off, arming the timer for 100 us");
    clock::set_event(100_000);
    let cycles = wait_pending(a);
    let pending = data::irq_pending();
    let count = clock::ticks() - before;
    println!(
        "guest-ops: irqpending: host set irq_pending {pending:#x} after {cycles} TSC cycles; timer interrupts {count}"
    );
    if count != 0 {
        crash_fmt(format_args!("guest-ops: irqpending: {count} timer interrupts delivered with interrupts off"));
    }
    paravirt::irq_enable();
    let count = clock::ticks() - before;
    let pending = data::irq_pending();
    println!("guest-ops: irqpending: after irq_enable: timer interrupts {count}, irq_pending {pending:#x}");
    if paravirt::irq_check() {
        if count != 1 || pending != 0 {
            crash_fmt(format_args!(
                "guest-ops: irqpending: after irq_enable: {count} timer interrupts (want 1), irq_pending {pending:#x} (want 0)"
            ));
        }
        println!("guest-ops: irqpending: delivered at irq_enable");
    } else {
        // noirqcheck: nobody asks; the host delivers at its next exit.
        let Some(cycles) = spin_until(WAIT_CYCLES, || clock::ticks() != before) else {
            crash_fmt(format_args!("guest-ops: irqpending: noirqcheck: not delivered after {WAIT_CYCLES} TSC cycles"));
        };
        println!("guest-ops: irqpending: noirqcheck: delivered {cycles} TSC cycles after irq_enable");
    }
    done(a)
}

/// Interrupts on IRQ 1 (raised by the launcher).
static IRQ1: AtomicU64 = AtomicU64::new(0);

fn irq1(_frame: &mut TrapFrame) {
    IRQ1.fetch_add(1, Ordering::Relaxed);
}

/// `twoirqs [MS]`: two interrupts held back at once (the timer, and IRQ 1
/// from the launcher, `--irq-every MS:1`) are both delivered by one
/// `irq_enable`. After `irq_pending` is first seen, it waits MS ms
/// (default 50) more so that IRQ 1 has been raised too.
pub fn twoirqs(arg: Option<&str>) -> ! {
    let a = "twoirqs";
    let ms = if arg.is_some() { parse_count(a, arg) } else { 50 };
    if let Err(e) = interrupts::set_irq_handler(1, irq1) {
        crash_fmt(format_args!("guest-ops: twoirqs: {e}"));
    }
    init_clock(a);
    paravirt::irq_disable();
    let before = clock::ticks();
    println!("guest-ops: twoirqs: interrupts off, arming the timer for 100 us, then waiting {ms} ms for IRQ 1");
    clock::set_event(100_000);
    let cycles = wait_pending(a);
    spin_cycles(clock::ns_to_cycles(ms.saturating_mul(MS), khz()));
    let (t, i, p) = (clock::ticks() - before, IRQ1.load(Ordering::Relaxed), data::irq_pending());
    println!("guest-ops: twoirqs: irq_pending set after {cycles} TSC cycles; before irq_enable: irq0 {t} irq1 {i} irq_pending {p:#x}");
    if t != 0 || i != 0 {
        crash_fmt(format_args!("guest-ops: twoirqs: interrupts delivered while off (irq0 {t} irq1 {i})"));
    }
    paravirt::irq_enable();
    let (t, i, p) = (clock::ticks() - before, IRQ1.load(Ordering::Relaxed), data::irq_pending());
    println!("guest-ops: twoirqs: after irq_enable: irq0 {t} irq1 {i} irq_pending {p:#x}");
    if t < 1 || i < 1 || p != 0 {
        crash_fmt(format_args!(
            "guest-ops: twoirqs: after irq_enable: irq0 {t} irq1 {i} (want both >= 1), irq_pending {p:#x} (want 0)"
        ));
    }
    done(a)
}

/// `timer N`: N sleeps of 1 ms, each a one-shot timer event and a halt.
pub fn timer(arg: Option<&str>) -> ! {
    let a = "timer";
    let n = parse_count(a, arg);
    init_clock(a);
    println!(
        "guest-ops: timer: {n} sleeps of 1 ms with LHCALL_HALT, clock {}, tsc_khz {}",
        clock_source(),
        data::tsc_khz()
    );
    let (t0, c0, ticks0) = (clock::now_ns(), rdtsc(), clock::ticks());
    let (mut wakeups, mut min, mut max) = (0, u64::MAX, 0);
    for _ in 0..n {
        let start = rdtsc();
        wakeups += clock::sleep_ns(MS);
        let cycles = rdtsc().wrapping_sub(start);
        min = min.min(cycles);
        max = max.max(cycles);
    }
    let elapsed = clock::now_ns().saturating_sub(t0);
    let cycles = rdtsc().wrapping_sub(c0);
    let ticks = clock::ticks() - ticks0;
    if n == 0 {
        min = 0;
    }
    println!(
        "guest-ops: timer: {n} sleeps: {ticks} timer interrupts, {wakeups} wake-ups, {elapsed} ns elapsed, {cycles} TSC cycles (per sleep min {min} max {max})"
    );
    // Each wake-up from HALT is exactly one timer interrupt (nothing else
    // is armed), every sleep needed at least one, and no sleep was shorter
    // than 1 ms in TSC cycles (a second clock: `now_ns` is what the sleep
    // loop itself watches), allowing 0.1% for the kHz rounding.
    let one_ms = u64::from(data::tsc_khz()) * 999 / 1000;
    if ticks != wakeups || wakeups < n || elapsed < n.saturating_mul(MS) || min < one_ms {
        crash_fmt(format_args!(
            "guest-ops: timer: {ticks} timer interrupts for {wakeups} wake-ups (want equal, >= {n}), {elapsed} ns (want >= {}), shortest sleep {min} TSC cycles (want >= {one_ms})",
            n.saturating_mul(MS)
        ));
    }
    done(a)
}

/// `sleep MS`: one sleep of MS milliseconds with halt; the host should use
/// no CPU meanwhile.
pub fn sleep(arg: Option<&str>) -> ! {
    let a = "sleep";
    let ms = parse_count(a, arg);
    init_clock(a);
    println!("guest-ops: sleep: sleeping {ms} ms with LHCALL_HALT, clock {}", clock_source());
    let (t0, c0, ticks0) = (clock::now_ns(), rdtsc(), clock::ticks());
    let wakeups = clock::sleep_ns(ms.saturating_mul(MS));
    let elapsed = clock::now_ns().saturating_sub(t0);
    let cycles = rdtsc().wrapping_sub(c0);
    let ticks = clock::ticks() - ticks0;
    println!(
        "guest-ops: sleep: slept {elapsed} ns ({cycles} TSC cycles), {ticks} timer interrupts, {wakeups} wake-ups"
    );
    if elapsed < ms.saturating_mul(MS) {
        crash_fmt(format_args!("guest-ops: sleep: woke after {elapsed} ns, before {ms} ms"));
    }
    done(a)
}

/// The timer period of `irqstorm`.
const STORM_NS: u64 = 20_000;
/// Spins per register check (a few microseconds).
const STORM_SPINS: u64 = 5_000;
/// Set when `irqstorm` is over: the timer callback stops re-arming.
static STORM_STOP: AtomicBool = AtomicBool::new(false);

/// The `irqstorm` timer callback: again in 20 us.
fn storm_rearm() {
    if !STORM_STOP.load(Ordering::Relaxed) {
        clock::set_event(STORM_NS);
    }
}

/// What [`check_registers`] XORs into the seed for RAX, RBX, RDX, RSI,
/// RBP, R8..R15 and RDI (in the order it stores them).
const REG_XOR: [u64; 14] =
    [0x1111, 0x2222, 0x3333, 0, 0x4444, 0x6666, 0x7777, 0x8888, 0x9999, 0xaaaa, 0xbbbb, 0xcccc, 0xdddd, 0x5555];
/// The names of those registers, for the crash message.
const REG_NAMES: [&str; 14] =
    ["rax", "rbx", "rdx", "rsi", "rbp", "r8", "r9", "r10", "r11", "r12", "r13", "r14", "r15", "rdi"];

/// Loads every general register but RSP and RCX with `seed ^ REG_XOR[i]`,
/// spins `spins` times on RCX (interrupts may come in at any instruction
/// when they are on), then stores them all and compares: an interrupt path
/// that loses a register shows here. Returns the first wrong register.
fn check_registers(seed: u64, spins: u64) -> Result<(), (&'static str, u64, u64)> {
    let mut out = [0u64; 14];
    // SAFETY: RBX and RBP (which cannot be operands) are saved on the stack
    // and restored; every other register it changes is declared. It writes
    // only `out` (14 u64s, through RDI), and its stack use is balanced.
    unsafe {
        asm!(
            "push rbx",
            "push rbp",
            "push rdi",
            "mov rax, rsi",
            "xor rax, {x0}",
            "mov rbx, rsi",
            "xor rbx, {x1}",
            "mov rdx, rsi",
            "xor rdx, {x2}",
            "mov rbp, rsi",
            "xor rbp, {x4}",
            "mov r8, rsi",
            "xor r8, {x5}",
            "mov r9, rsi",
            "xor r9, {x6}",
            "mov r10, rsi",
            "xor r10, {x7}",
            "mov r11, rsi",
            "xor r11, {x8}",
            "mov r12, rsi",
            "xor r12, {x9}",
            "mov r13, rsi",
            "xor r13, {x10}",
            "mov r14, rsi",
            "xor r14, {x11}",
            "mov r15, rsi",
            "xor r15, {x12}",
            "mov rdi, rsi",
            "xor rdi, {x13}",
            "2:",
            "dec rcx",
            "jnz 2b",
            "xchg rdi, [rsp]",
            "mov [rdi], rax",
            "mov [rdi + 8], rbx",
            "mov [rdi + 16], rdx",
            "mov [rdi + 24], rsi",
            "mov [rdi + 32], rbp",
            "mov [rdi + 40], r8",
            "mov [rdi + 48], r9",
            "mov [rdi + 56], r10",
            "mov [rdi + 64], r11",
            "mov [rdi + 72], r12",
            "mov [rdi + 80], r13",
            "mov [rdi + 88], r14",
            "mov [rdi + 96], r15",
            "pop rax",
            "mov [rdi + 104], rax",
            "pop rbp",
            "pop rbx",
            x0 = const REG_XOR[0],
            x1 = const REG_XOR[1],
            x2 = const REG_XOR[2],
            x4 = const REG_XOR[4],
            x5 = const REG_XOR[5],
            x6 = const REG_XOR[6],
            x7 = const REG_XOR[7],
            x8 = const REG_XOR[8],
            x9 = const REG_XOR[9],
            x10 = const REG_XOR[10],
            x11 = const REG_XOR[11],
            x12 = const REG_XOR[12],
            x13 = const REG_XOR[13],
            inout("rdi") out.as_mut_ptr() => _,
            inout("rsi") seed => _,
            inout("rcx") spins.max(1) => _,
            out("rax") _,
            out("rdx") _,
            out("r8") _,
            out("r9") _,
            out("r10") _,
            out("r11") _,
            out("r12") _,
            out("r13") _,
            out("r14") _,
            out("r15") _,
        );
    }
    for ((&got, &xor), &name) in out.iter().zip(REG_XOR.iter()).zip(REG_NAMES.iter()) {
        if got != seed ^ xor {
            return Err((name, got, seed ^ xor));
        }
    }
    Ok(())
}

/// Words of the stack array `irqstorm` checks.
const STACK_WORDS: usize = 32;

/// The value of word `i` of round `round`'s stack array.
fn stack_word(round: u64, i: usize) -> u64 {
    (round.wrapping_mul(0x9e37_79b9_7f4a_7c15)) ^ (i as u64).wrapping_mul(0x0101_0101_0101_0101)
}

/// `irqstorm N`: the timer re-arms itself every 20 us while N rounds of
/// irq_disable / register check / irq_enable / register check run, and a
/// stack array is verified after each round.
pub fn irqstorm(arg: Option<&str>) -> ! {
    let a = "irqstorm";
    let n = parse_count(a, arg);
    clock::set_callback(storm_rearm);
    init_clock(a);
    println!(
        "guest-ops: irqstorm: {n} rounds of irq_disable + irq_enable with the timer every {} us, checking registers and stack",
        STORM_NS / 1000
    );
    let ticks0 = clock::ticks();
    clock::set_event(STORM_NS);
    for round in 0..n {
        paravirt::irq_disable();
        let mut words = [0u64; STACK_WORDS];
        for (i, w) in words.iter_mut().enumerate() {
            *w = stack_word(round, i);
        }
        // Make the compiler keep the array in memory, on the stack.
        black_box(&mut words);
        let off = check_registers(round, STORM_SPINS);
        paravirt::irq_enable();
        let on = check_registers(!round, STORM_SPINS);
        if let Err((reg, got, want)) = off.and(on) {
            crash_fmt(format_args!("guest-ops: irqstorm: round {round}: {reg} is {got:#x}, expected {want:#x}"));
        }
        let words = black_box(words);
        if let Some(i) = (0..STACK_WORDS).find(|&i| words[i] != stack_word(round, i)) {
            crash_fmt(format_args!(
                "guest-ops: irqstorm: round {round}: stack word {i} is {:#x}, expected {:#x}",
                words[i],
                stack_word(round, i)
            ));
        }
    }
    STORM_STOP.store(true, Ordering::Relaxed);
    clock::set_event(0);
    let taken = clock::ticks() - ticks0;
    println!("guest-ops: irqstorm: {n} rounds, {taken} timer interrupts taken, registers and stack intact");
    done(a)
}

/// Rounds of `latency`.
const LATENCY_ROUNDS: usize = 20;
/// The TSC when the timer handler first ran in this round (0: not yet).
static T1: AtomicU64 = AtomicU64::new(0);

/// The `latency` timer callback: records the first delivery.
fn record_t1() {
    let _ = T1.compare_exchange(0, rdtsc(), Ordering::Relaxed, Ordering::Relaxed);
}

/// `latency`: TSC cycles from `irq_enable` with an interrupt pending to its
/// handler; with `noirqcheck`, the delivery waits for the host's next exit.
pub fn latency() -> ! {
    let a = "latency";
    clock::set_callback(record_t1);
    init_clock(a);
    let check = if paravirt::irq_check() { "on" } else { "off (noirqcheck)" };
    println!("guest-ops: latency: {LATENCY_ROUNDS} rounds, timer 50 us, irq_pending check {check}");
    let mut cycles = [0u64; LATENCY_ROUNDS];
    for (round, slot) in cycles.iter_mut().enumerate() {
        T1.store(0, Ordering::Relaxed);
        paravirt::irq_disable();
        let stale = data::irq_pending();
        if stale != 0 {
            crash_fmt(format_args!(
                "guest-ops: latency: round {round}: irq_pending {stale:#x} before the timer was armed (not cleared after the last delivery)"
            ));
        }
        clock::set_event(50_000);
        wait_pending(a);
        let t0 = rdtsc();
        paravirt::irq_enable();
        let mut t1 = T1.load(Ordering::Relaxed);
        if t1 == 0 {
            if spin_until(WAIT_CYCLES, || T1.load(Ordering::Relaxed) != 0).is_none() {
                crash_fmt(format_args!(
                    "guest-ops: latency: round {round}: not delivered after {WAIT_CYCLES} TSC cycles"
                ));
            }
            t1 = T1.load(Ordering::Relaxed);
        }
        *slot = t1.wrapping_sub(t0);
        println!("guest-ops: latency: {} cycles", *slot);
    }
    cycles.sort_unstable();
    println!(
        "guest-ops: latency: min {} median {} cycles ({LATENCY_ROUNDS} rounds, irq_pending check {check})",
        cycles[0],
        cycles[LATENCY_ROUNDS / 2]
    );
    done(a)
}

/// Rounds of `window`.
const WINDOW_ROUNDS: u64 = 20;
/// The timer delay of `window`: far inside the host's widened window.
const WINDOW_NS: u64 = 100_000;
/// Loop turns the guest made since it armed the timer.
static TURNS: AtomicU64 = AtomicU64::new(0);
/// `TURNS` when the timer handler ran (`u64::MAX`: not yet).
static TURNS_AT_IRQ: AtomicU64 = AtomicU64::new(u64::MAX);

/// The `window` timer callback: records how far the guest got.
fn record_turns() {
    let _ = TURNS_AT_IRQ.compare_exchange(u64::MAX, TURNS.load(Ordering::SeqCst), Ordering::SeqCst, Ordering::SeqCst);
}

/// `window [N]`: with interrupts on, arms the timer for 100 us and counts
/// loop turns until its handler runs. Run on a host whose run loop waits
/// (the test knob `entry_window_delay_us`) between its look for interrupts
/// and the entry, the timer fires in that window, after the arming
/// hypercall and before the guest runs again: the host must give up that
/// entry and deliver at once, so the handler sees 0 turns. A host that
/// entered anyway would deliver at its next exit (a host tick), after many
/// turns. Reports `window: N of N rounds delivered before the guest ran`.
pub fn window(arg: Option<&str>) -> ! {
    let a = "window";
    let n = arg.map_or(WINDOW_ROUNDS, |_| parse_count(a, arg));
    clock::set_callback(record_turns);
    init_clock(a);
    paravirt::irq_enable();
    println!("guest-ops: window: {n} rounds, timer {} us, virtual interrupts on", WINDOW_NS / 1000);
    let mut early = 0;
    for round in 0..n {
        TURNS.store(0, Ordering::SeqCst);
        TURNS_AT_IRQ.store(u64::MAX, Ordering::SeqCst);
        clock::set_event(WINDOW_NS);
        let waited = spin_until(WAIT_CYCLES, || {
            if TURNS_AT_IRQ.load(Ordering::SeqCst) != u64::MAX {
                return true;
            }
            TURNS.fetch_add(1, Ordering::SeqCst);
            false
        });
        if waited.is_none() {
            crash_fmt(format_args!(
                "guest-ops: window: round {round}: no timer interrupt after {WAIT_CYCLES} TSC cycles"
            ));
        }
        let turns = TURNS_AT_IRQ.load(Ordering::SeqCst);
        println!("guest-ops: window: round {round}: {turns} loop turns before the interrupt");
        early += u64::from(turns == 0);
    }
    println!("guest-ops: window: {early} of {n} rounds delivered before the guest ran");
    done(a)
}
