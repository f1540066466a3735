// SPDX-License-Identifier: GPL-2.0
//! `guest-ops`: a guest that does one thing, chosen by the first word of its
//! command line, for the host selftests. It reports with console lines
//! `guest-ops: <action>: ...` and, when it gets to the end, powers off with
//! `guest-ops: <action>: done` (or `... survived` after a forbidden
//! instruction). Whether a forbidden instruction is reflected or kills the
//! guest is the host's decision; this guest only performs it, after saying
//! so on the console.
//!
//! Actions (see [`usage`]):
//!
//! - `hello`, `args`, `crash`, `badcall`, `badiret`, `spin`, `hcalls N`,
//!   `irqtoggle N`, `setsyscall ENTRY FLAGS` (hex: `LHCALL_SET_SYSCALL`),
//!   `sysret` (a direct entry, then its return on the linear map),
//!   `debugregs` (`LHCALL_SET_DEBUGREGS`: what the host arms, then a DR7
//!   with a reserved bit);
//! - `data`, `paravirt`, `hcall-halt`, `hcall-halt-blocked`: the shared
//!   page and the paravirt ops;
//! - one instruction each, with no handlers installed: `cli`, `sti`, `hlt`,
//!   `readcr3`, `writecr3`, `in`, `out`, `wrmsr`, `rdmsr`, `sgdt`, `sidt`,
//!   `syscall`, `sysenter`, `int80`, `int3`, `ud2`, `fpu`, `sse`,
//!   `readnull`, `divzero`, `readswitcher ADDR`, `writeswitcher ADDR` (ADDR
//!   in hex), and `cpuid`, `badprefix` (the forced-emulation prefix);
//! - traps delivered to handlers: `trap NAME` (see [`trap`]);
//! - interrupts and the timer: `irqpending`, `twoirqs [MS]`, `timer N`,
//!   `sleep MS`, `irqstorm N`, `latency`, `window [N]` (see [`irq`]).
#![no_std]
#![no_main]

mod insn;
mod irq;
mod trap;

use lguest_guest::abi::LHCALL_FLUSH_ASYNC;
use lguest_guest::{crash, crash_fmt, data, entry, hcall, poweroff_fmt, println, Args, Lguest, Paravirt};

entry!(main);

/// A hypercall number the host does not know.
const BAD_HCALL: u64 = 9999;

fn main(args: Args) -> ! {
    let mut words = args.iter();
    let Some(action) = words.next() else {
        usage();
        crash("guest-ops: no action given");
    };
    let arg = words.next();
    match action {
        "hello" => hello(),
        "args" => print_args(args),
        "crash" => panic!("deliberate crash"),
        "badcall" => badcall(),
        "badiret" => badiret(),
        "setsyscall" => setsyscall(parse_addr(action, arg), parse_addr(action, words.next())),
        "sysret" => sysret(),
        "debugregs" => debugregs(),
        "spin" => spin(),
        "hcalls" => hcalls(arg),
        "irqtoggle" => irqtoggle(arg),
        "data" => show_data(),
        "paravirt" => paravirt(),
        "hcall-halt" => hcall_halt(),
        "hcall-halt-blocked" => hcall_halt_blocked(),
        "trap" => trap::run(arg),
        "irqpending" => irq::irqpending(),
        "twoirqs" => irq::twoirqs(arg),
        "timer" => irq::timer(arg),
        "sleep" => irq::sleep(arg),
        "irqstorm" => irq::irqstorm(arg),
        "latency" => irq::latency(),
        "window" => irq::window(arg),
        "readswitcher" => insn::read_at(action, parse_addr(action, arg)),
        "writeswitcher" => insn::write_at(action, parse_addr(action, arg)),
        _ => match insn::find(action) {
            Some(insn) => insn::execute(insn),
            None => {
                usage();
                crash_fmt(format_args!("guest-ops: unknown action {action:?}"))
            }
        },
    }
}

/// Lists the actions on the console.
fn usage() {
    println!("guest-ops: usage: guest-ops ACTION [ARG]");
    println!("guest-ops:   hello | args | crash | badcall | badiret | spin | hcalls N | irqtoggle N");
    println!("guest-ops:   setsyscall ENTRY FLAGS (hex) | sysret | debugregs");
    println!("guest-ops:   data | paravirt | hcall-halt | hcall-halt-blocked");
    println!("guest-ops:   readswitcher ADDR | writeswitcher ADDR  (ADDR in hex)");
    println!("guest-ops:   {}", insn::Names);
    println!("guest-ops:   trap {}", trap::Names);
    println!("guest-ops:   irqpending | twoirqs [MS] | timer N | sleep MS | irqstorm N | latency | window [N]");
    println!("guest-ops:   (library word: noirqcheck)");
}

/// Powers off with `guest-ops: <action>: done`.
pub(crate) fn done(action: &str) -> ! {
    poweroff_fmt(format_args!("guest-ops: {action}: done"))
}

fn hello() -> ! {
    println!("guest-ops: hello: Hello from the lguest guest");
    done("hello")
}

fn print_args(args: Args) -> ! {
    println!("guest-ops: args: {} words in \"{}\"", args.len(), args.as_str());
    for (i, word) in args.iter().enumerate() {
        println!("guest-ops: args: {i}: {word}");
    }
    done("args")
}

fn badcall() -> ! {
    println!("guest-ops: badcall: making hypercall {BAD_HCALL}");
    // SAFETY: no addresses are passed; the host should kill the guest, and if
    // it returns instead, nothing in the guest changed.
    let ret = unsafe { hcall(BAD_HCALL, 0, 0, 0, 0) };
    println!("guest-ops: badcall: survived, returned {ret:#x}");
    poweroff_fmt(format_args!("guest-ops: badcall: survived"))
}

/// `LHCALL_IRET` to kernel mode (CS 0x10, RPL 0) through a frame whose SS
/// is not the kernel's (0x2b): only the guest kernel can make that
/// mistake, and the host must kill the guest (without Linux frames, for
/// the call itself).
fn badiret() -> ! {
    println!("guest-ops: badiret: LHCALL_IRET with cs 0x10 ss 0x2b");
    // SAFETY: the frame is six words on our own stack; the host should
    // kill the guest, and if it returns to `1:` instead, RSP is back where
    // it was and only RAX changed.
    unsafe {
        core::arch::asm!(
            "mov {saved}, rsp",
            "push 0x2b",
            "push {saved}",
            "pushfq",
            "push 0x10",
            "lea {tmp}, [rip + 2f]",
            "push {tmp}",
            "push 0",
            "mov eax, {iret}",
            "int 0x1f",
            "2:",
            "mov rsp, {saved}",
            saved = out(reg) _,
            tmp = out(reg) _,
            iret = const lguest_guest::abi::LHCALL_IRET,
            out("rax") _,
        );
    }
    poweroff_fmt(format_args!("guest-ops: badiret: survived"))
}

/// `LHCALL_SET_SYSCALL(entry, flags)`; the host kills the guest for a bad
/// entry or unknown flags.
fn setsyscall(entry: u64, flags: u64) -> ! {
    println!("guest-ops: setsyscall: entry {entry:#x} flags {flags:#x}");
    // SAFETY: registering an entry changes only what a user-mode `syscall`
    // does, and this guest never runs user mode.
    unsafe { hcall(lguest_guest::abi::LHCALL_SET_SYSCALL, entry, flags, 0, 0) };
    poweroff_fmt(format_args!("guest-ops: setsyscall: survived"))
}

/// A direct system-call entry (this function), then the direct return to
/// user mode while the guest still runs on the host's linear map: user
/// mode needs the guest's own tables, so the host must kill the guest.
fn sysret() -> ! {
    println!("guest-ops: sysret: int $0x1b on the linear map");
    let entry = sysret as fn() -> ! as usize as u64;
    // SAFETY: as in `setsyscall`; the `int` must not come back (if it did,
    // only RCX and R11, given as inputs, were involved).
    unsafe {
        hcall(lguest_guest::abi::LHCALL_SET_SYSCALL, entry, lguest_guest::abi::LGUEST_SYSCALL_DIRECT, 0, 0);
        core::arch::asm!("int 0x1b", in("rcx") 0x40_0000u64, in("r11") 0x202u64);
    }
    poweroff_fmt(format_args!("guest-ops: sysret: survived"))
}

/// Four write watches, on a user address, the switcher's slot, the upper
/// half and the end of user space: the host must arm the first alone and
/// say so (RAX, the DR7 it armed); then a DR7 with bit 32 set, which only
/// the guest kernel can write (natively a #GP): the host must kill.
fn debugregs() -> ! {
    let addrs = [0x7fff_0000_0000, 0xffff_8000_0000_0000, 0xffff_ffff_8000_0000, lguest_guest::abi::GUEST_VA_END];
    for (i, a) in addrs.iter().enumerate() {
        data::set_debugreg(i, *a);
    }
    let dr7 = (0..4).fold(0u64, |d, i| d | 1 << (2 * i) | 1 << (16 + 4 * i));
    // SAFETY: the host reads the four addresses and arms at most write
    // watches on user addresses, which this guest never writes.
    let armed = unsafe { hcall(lguest_guest::abi::LHCALL_SET_DEBUGREGS, dr7, 0, 0, 0) };
    println!("guest-ops: debugregs: asked {dr7:#x}, armed {armed:#x}");
    // SAFETY: as above; the host should kill the guest here.
    unsafe { hcall(lguest_guest::abi::LHCALL_SET_DEBUGREGS, 1 << 32 | 1, 0, 0, 0) };
    poweroff_fmt(format_args!("guest-ops: debugregs: survived"))
}

fn spin() -> ! {
    println!("guest-ops: spin: spinning forever without hypercalls");
    loop {
        core::hint::spin_loop();
    }
}

/// The decimal count argument of `action`.
pub(crate) fn parse_count(action: &str, arg: Option<&str>) -> u64 {
    match arg.and_then(|a| a.parse::<u64>().ok()) {
        Some(n) => n,
        None => crash_fmt(format_args!("guest-ops: {action}: needs a decimal count")),
    }
}

fn hcalls(arg: Option<&str>) -> ! {
    let n = parse_count("hcalls", arg);
    println!("guest-ops: hcalls: making {n} LHCALL_FLUSH_ASYNC ({LHCALL_FLUSH_ASYNC}) hypercalls");
    let mut made = 0u64;
    let start = rdtsc();
    while made < n {
        Lguest::flush_async();
        made += 1;
    }
    let cycles = rdtsc().wrapping_sub(start);
    println!("guest-ops: hcalls: made {made} hypercalls");
    println!("guest-ops: hcalls: {cycles} TSC cycles, {} per hypercall", cycles.checked_div(made).unwrap_or(0));
    done("hcalls")
}

/// Disables and re-enables (virtual) interrupts N times: the cost of the
/// `irq_pending` check, with or without `noirqcheck`.
fn irqtoggle(arg: Option<&str>) -> ! {
    let n = parse_count("irqtoggle", arg);
    let check = if lguest_guest::paravirt::irq_check() { "on" } else { "off (noirqcheck)" };
    println!("guest-ops: irqtoggle: {n} x irq_disable + irq_enable, irq_pending check {check}");
    for _ in 0..n {
        Lguest::irq_disable();
        Lguest::irq_enable();
    }
    Lguest::irq_disable();
    println!("guest-ops: irqtoggle: toggled {n} times");
    done("irqtoggle")
}

/// Shows what the host wrote into `lguest_data` at `LHCALL_LGUEST_INIT`.
fn show_data() -> ! {
    let t = data::time();
    println!("guest-ops: data: lguest_data at {:#x}", data::address());
    println!("guest-ops: data: reserve_mem {:#x}", data::reserve_mem());
    println!("guest-ops: data: tsc_khz {}", data::tsc_khz());
    println!("guest-ops: data: time {}.{:09}", t.sec, t.nsec);
    println!("guest-ops: data: noirq_iret {:#x}", data::noirq_iret());
    done("data")
}

/// Runs the paravirt interrupt-flag operations and checks what they report.
fn paravirt() -> ! {
    let check = |what: &str, got: u64, want: u64| {
        let verdict = if got == want { "ok" } else { "WRONG" };
        println!("guest-ops: paravirt: {what}: save_fl {got:#x}, want {want:#x}: {verdict}");
        got == want
    };
    let if_on = lguest_guest::abi::X86_EFLAGS_IF;
    let mut good = check("at boot", Lguest::save_fl(), 0);
    Lguest::irq_enable();
    good &= check("after irq_enable", Lguest::save_fl(), if_on);
    Lguest::irq_disable();
    good &= check("after irq_disable", Lguest::save_fl(), 0);
    Lguest::restore_fl(if_on);
    good &= check("after restore_fl(IF)", Lguest::save_fl(), if_on);
    Lguest::restore_fl(0);
    good &= check("after restore_fl(0)", Lguest::save_fl(), 0);
    if !good {
        crash("guest-ops: paravirt: wrong interrupt flag");
    }
    done("paravirt")
}

/// Halts with interrupts on and no timer armed, but with the timer's line,
/// IRQ 0, open (its handler installed): something *could* wake the guest,
/// so the host sleeps (using no CPU) until the launcher raises an interrupt
/// or gets a signal, which ends RUN with `EINTR`. An IRQ 0 from the
/// launcher wakes it: it prints `woke up` and powers off.
fn hcall_halt() -> ! {
    if let Err(e) = lguest_guest::clock::init() {
        crash_fmt(format_args!("guest-ops: hcall-halt: {e}"));
    }
    println!(
        "guest-ops: hcall-halt: LHCALL_HALT with interrupts on, IRQ 0 open, no timer armed: sleeping until a signal"
    );
    Lguest::halt();
    println!("guest-ops: hcall-halt: woke up (timer interrupts {})", lguest_guest::clock::ticks());
    done("hcall-halt")
}

/// Halts with interrupts on and every interrupt line blocked (no handler
/// installed): nothing can ever wake the guest, so the host ends RUN with
/// `LGUEST_EXIT_HALT` (`lguest run` exits with status 3).
fn hcall_halt_blocked() -> ! {
    Lguest::irq_enable();
    println!("guest-ops: hcall-halt-blocked: LHCALL_HALT with every IRQ blocked: nothing can wake us");
    Lguest::halt();
    println!("guest-ops: hcall-halt-blocked: woke up");
    done("hcall-halt-blocked")
}

/// The hexadecimal address argument of `action` (with or without `0x`).
fn parse_addr(action: &str, arg: Option<&str>) -> u64 {
    let digits = arg.map(|a| a.strip_prefix("0x").unwrap_or(a));
    match digits.and_then(|d| u64::from_str_radix(d, 16).ok()) {
        Some(addr) => addr,
        None => crash_fmt(format_args!("guest-ops: {action}: needs a hex address")),
    }
}

/// The time-stamp counter (readable in ring 3: the host leaves CR4.TSD off).
fn rdtsc() -> u64 {
    lguest_guest::clock::rdtsc()
}
