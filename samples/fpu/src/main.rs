// SPDX-License-Identifier: GPL-2.0
//! `fpu`: the guest's FPU, SSE and AVX registers are its own.
//!
//! Command line: `seed=N` (the pattern, default 1), `ms=M` (how long each
//! phase runs, default 2000), `spin=S` (iterations with the pattern held in
//! each round, default 2000).
//!
//! With a 50 us timer interrupting it, the guest runs `fpu_hammer` (see
//! `hammer.s`: 16 XMM or YMM registers, one x87 value and MXCSR loaded with
//! a pattern made from the seed and the round, held for `spin` iterations,
//! stored and compared) in two phases:
//!
//! 1. in guest kernel mode for `ms` milliseconds;
//! 2. in guest user mode (the same code, mapped as a user program with its
//!    own seed, `seed + 1000`), for as many rounds as the kernel phase
//!    managed, exiting with the number of rounds that saw a change.
//!
//! Each timer interrupt is an exit to the host and a new entry (the host
//! saves and restores the guest's state around each); another guest or a
//! host process hammering its own registers on the same CPUs would show
//! through as a changed value. The guest powers off with `fpu: done: ...`
//! (rounds, interrupts, AVX or SSE) or crashes naming what changed.
#![no_std]
#![no_main]

use core::arch::global_asm;
use core::ptr::addr_of;

use lguest_guest::paging::{self, pte, AddressSpace, PageSize, PAGE_SIZE, USER_START};
use lguest_guest::user::{self, Exit, UserRegs, SYS_EXIT};
use lguest_guest::{clock, crash_fmt, entry, frames, paravirt, poweroff_fmt, println, Args};

entry!(main);

/// Where the user program's code is mapped, and its stack.
const USER_CODE: u64 = USER_START;
const USER_STACK_TOP: u64 = USER_START + 0x40_0000;
const STACK_PAGES: u64 = 4;
/// The timer period in both phases.
const TIMER_NS: u64 = 50_000;
/// Rounds per call in the kernel phase (between two looks at the clock).
const BATCH: u64 = 8;

// The program's pages: the shared hammer and a user entry that calls it
// (arguments in RDI, RSI, RDX, RCX, set by the kernel) and exits with its
// result.
global_asm!(
    ".pushsection .text.user_prog, \"ax\", @progbits",
    ".balign 4096",
    ".globl user_prog_start",
    "user_prog_start:",
    include_str!("hammer.s"),
    ".balign 16",
    ".globl fpu_user_entry",
    "fpu_user_entry:",
    "    call fpu_hammer",
    "    mov rdi, rax",
    "    mov eax, {sys_exit}",
    "    int 0x80",
    "    ud2",
    ".balign 4096",
    ".globl user_prog_end",
    "user_prog_end:",
    ".popsection",
    sys_exit = const SYS_EXIT,
);

extern "C" {
    static user_prog_start: u8;
    static user_prog_end: u8;
    static fpu_user_entry: u8;
    fn fpu_hammer(seed: u64, rounds: u64, flags: u64, spin: u64) -> u64;
    fn fpu_has_avx() -> u32;
}

fn fail(what: core::fmt::Arguments<'_>) -> ! {
    crash_fmt(format_args!("fpu: FAIL: {what}"))
}

/// The value of `key=N` on the command line, or `default`.
fn arg(args: &Args, key: &str, default: u64) -> u64 {
    for word in args.iter() {
        if let Some(v) = word.strip_prefix(key).and_then(|w| w.strip_prefix('=')) {
            return v.parse().unwrap_or_else(|_| fail(format_args!("{key}={v}: not a number")));
        }
    }
    default
}

/// The clock callback: re-arms the timer.
fn rearm() {
    clock::set_event(TIMER_NS);
}

fn main(args: Args) -> ! {
    let seed = arg(&args, "seed", 1);
    let ms = arg(&args, "ms", 2000);
    let spin = arg(&args, "spin", 2000).max(1);
    frames::init_free_ram();
    if let Err(e) = paging::init_kernel() {
        fail(format_args!("kernel map: {e}"));
    }
    let mut space = AddressSpace::new().unwrap_or_else(|e| fail(format_args!("address space: {e}")));
    space.activate();
    if let Err(e) = user::init() {
        fail(format_args!("user::init: {e}"));
    }
    let start = lguest_guest::virt_to_phys(addr_of!(user_prog_start));
    let end = lguest_guest::virt_to_phys(addr_of!(user_prog_end));
    for pa in (start..end).step_by(PAGE_SIZE as usize) {
        if let Err(e) = space.map(USER_CODE + (pa - start), pa, PageSize::Small, pte::US) {
            fail(format_args!("mapping the program: {e}"));
        }
    }
    for i in 1..=STACK_PAGES {
        let frame = frames::alloc().unwrap_or_else(|| fail(format_args!("out of frames")));
        if let Err(e) = space.map(USER_STACK_TOP - i * PAGE_SIZE, frame, PageSize::Small, pte::US | pte::RW | pte::NX) {
            fail(format_args!("mapping the stack: {e}"));
        }
    }
    // SAFETY: fpu_has_avx only runs cpuid and xgetbv (both allowed in ring 3
    // here: XGETBV needs CR4.OSXSAVE, which it checks first).
    let avx = unsafe { fpu_has_avx() } != 0;
    let what = if avx { "AVX (16 YMM registers)" } else { "SSE (16 XMM registers)" };
    println!("fpu: seed {seed}, {ms} ms per phase, spin {spin}, {what}, x87 and MXCSR");
    if let Err(e) = clock::init() {
        fail(format_args!("clock: {e}"));
    }
    clock::set_callback(rearm);

    // Phase 1: guest kernel mode, interrupts on.
    let ticks0 = clock::ticks();
    paravirt::irq_enable();
    clock::set_event(TIMER_NS);
    let t0 = clock::now_ns();
    let (mut rounds, mut changed) = (0u64, 0u64);
    while clock::now_ns() - t0 < ms * 1_000_000 {
        // SAFETY: fpu_hammer follows the C ABI and touches only its own
        // stack frame and the FPU registers, which this (soft-float) kernel
        // never uses.
        changed += unsafe { fpu_hammer(seed, BATCH, avx as u64, spin) };
        rounds += BATCH;
    }
    paravirt::irq_disable();
    let kticks = clock::ticks() - ticks0;
    if changed != 0 {
        fail(format_args!("kernel mode: {changed} of {rounds} rounds saw a register change"));
    }
    if kticks == 0 {
        fail(format_args!("kernel mode: no timer interrupt in {ms} ms"));
    }
    println!("fpu: kernel mode: {rounds} rounds, {kticks} timer interrupts, no register changed");

    // Phase 2: guest user mode, as many rounds, another pattern.
    let ticks1 = clock::ticks();
    let entry = lguest_guest::virt_to_phys(addr_of!(fpu_user_entry));
    let mut regs = UserRegs::new(USER_CODE + (entry - start), USER_STACK_TOP);
    regs.rdi = seed + 1000;
    regs.rsi = rounds;
    regs.rdx = avx as u64;
    regs.rcx = spin;
    let t1 = clock::now_ns();
    let exit = user::run(&regs);
    let user_ms = (clock::now_ns() - t1) / 1_000_000;
    clock::clear_callback();
    clock::set_event(0);
    let uticks = clock::ticks() - ticks1;
    match exit {
        Exit::Exited(0) => {}
        Exit::Exited(n) => fail(format_args!("user mode: {n} of {rounds} rounds saw a register change")),
        other => fail(format_args!("user mode: the program ended with {other:x?}")),
    }
    if uticks == 0 {
        fail(format_args!("user mode: no timer interrupt in {user_ms} ms"));
    }
    println!("fpu: user mode: {rounds} rounds in {user_ms} ms, {uticks} timer interrupts, no register changed");
    let done = format_args!(
        "fpu: done: seed {seed}, {what}: kernel {rounds} rounds {kticks} interrupts, user {rounds} rounds {uticks} interrupts, 0 changed"
    );
    println!("{done}");
    poweroff_fmt(done)
}
