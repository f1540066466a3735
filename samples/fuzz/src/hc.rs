// SPDX-License-Identifier: GPL-2.0
//! Hypercalls with every other register and the arithmetic flags filled
//! with random values, checked afterwards: the ABI says only RAX changes
//! (to 0), even when an interrupt is delivered on the way back.

use core::arch::asm;
use core::sync::atomic::{AtomicU64, Ordering};

use crate::fail;
use crate::rng::Rng;

/// Hypercalls (`int $0x1f`) the fuzzer made itself (not counting those of
/// the guest library: console output, `irq_enable`, ...).
pub static HCALLS: AtomicU64 = AtomicU64::new(0);

// RBX and RBP cannot be asm operands: they go in and out through these.
static IN_RBX: AtomicU64 = AtomicU64::new(0);
static IN_RBP: AtomicU64 = AtomicU64::new(0);
static IN_FLAGS: AtomicU64 = AtomicU64::new(0);
static OUT_RBX: AtomicU64 = AtomicU64::new(0);
static OUT_RBP: AtomicU64 = AtomicU64::new(0);
static OUT_FLAGS: AtomicU64 = AtomicU64::new(0);
/// RSP across [`wild_stack`].
static SAVED_RSP: AtomicU64 = AtomicU64::new(0);

/// RFLAGS bits a hypercall must preserve: CF, PF, AF, ZF, SF, DF, OF.
const FLAGS_KEPT: u64 = 0x1 | 0x4 | 0x10 | 0x40 | 0x80 | 0x400 | 0x800;

/// The names of the registers, in the order of `hcall`'s arrays.
const NAMES: [&str; 13] = ["rdi", "rsi", "rdx", "r10", "rbx", "rcx", "rbp", "r8", "r9", "r11", "r12", "r13", "r14"];

/// Makes hypercall `nr` with arguments `a`, random values in every other
/// general register (but RSP) and random arithmetic flags and DF, and
/// checks that RAX came back 0 and everything else unchanged. Never use it
/// for a hypercall that takes an address the host dereferences unless the
/// address is good (see the callers).
pub fn hcall(rng: &mut Rng, nr: u64, a: [u64; 4]) {
    let junk: [u64; 10] = core::array::from_fn(|_| rng.arg());
    let flags = rng.next() & FLAGS_KEPT;
    IN_RBX.store(junk[0], Ordering::Relaxed);
    IN_RBP.store(junk[2], Ordering::Relaxed);
    IN_FLAGS.store(flags, Ordering::Relaxed);
    let (rax, rdi, rsi, rdx, r10): (u64, u64, u64, u64, u64);
    let (rcx, r8, r9, r11, r12, r13, r14, r15): (u64, u64, u64, u64, u64, u64, u64, u64);
    // SAFETY: `int $0x1f` enters the host, which may read and write guest
    // memory (nothing is `nomem`) and may deliver an interrupt on the way
    // back, on this stack below RSP (nothing is `nostack`; the handler
    // preserves every register). RBX and RBP are saved on the stack and
    // restored before the end; DF is cleared again (`cld`) after the flags
    // were recorded. Every register the asm touches is an operand. The
    // caller vouches for the hypercall's arguments.
    unsafe {
        asm!(
            "push rbx",
            "push rbp",
            "mov rbx, qword ptr [rip + {in_rbx}]",
            "mov rbp, qword ptr [rip + {in_rbp}]",
            "push qword ptr [rip + {in_flags}]",
            "popfq",
            "int 0x1f",
            "pushfq",
            "pop qword ptr [rip + {out_flags}]",
            "mov qword ptr [rip + {out_rbx}], rbx",
            "mov qword ptr [rip + {out_rbp}], rbp",
            "pop rbp",
            "pop rbx",
            "cld",
            in_rbx = sym IN_RBX,
            in_rbp = sym IN_RBP,
            in_flags = sym IN_FLAGS,
            out_rbx = sym OUT_RBX,
            out_rbp = sym OUT_RBP,
            out_flags = sym OUT_FLAGS,
            inout("rax") nr => rax,
            inout("rdi") a[0] => rdi,
            inout("rsi") a[1] => rsi,
            inout("rdx") a[2] => rdx,
            inout("r10") a[3] => r10,
            inout("rcx") junk[1] => rcx,
            inout("r8") junk[3] => r8,
            inout("r9") junk[4] => r9,
            inout("r11") junk[5] => r11,
            inout("r12") junk[6] => r12,
            inout("r13") junk[7] => r13,
            inout("r14") junk[8] => r14,
            inout("r15") junk[9] => r15,
        );
    }
    HCALLS.fetch_add(1, Ordering::Relaxed);
    if rax != 0 {
        fail(format_args!("hypercall {nr} returned rax {rax:#x}, not 0"));
    }
    let before =
        [a[0], a[1], a[2], a[3], junk[0], junk[1], junk[2], junk[3], junk[4], junk[5], junk[6], junk[7], junk[8]];
    let after = [
        rdi,
        rsi,
        rdx,
        r10,
        OUT_RBX.load(Ordering::Relaxed),
        rcx,
        OUT_RBP.load(Ordering::Relaxed),
        r8,
        r9,
        r11,
        r12,
        r13,
        r14,
    ];
    for ((name, b), a) in NAMES.iter().zip(before).zip(after) {
        if a != b {
            fail(format_args!("hypercall {nr} changed {name}: {b:#x} -> {a:#x}"));
        }
    }
    if r15 != junk[9] {
        fail(format_args!("hypercall {nr} changed r15: {:#x} -> {r15:#x}", junk[9]));
    }
    let out = OUT_FLAGS.load(Ordering::Relaxed);
    if (out ^ flags) & FLAGS_KEPT != 0 {
        fail(format_args!("hypercall {nr} changed the flags: {flags:#x} -> {:#x}", out & FLAGS_KEPT));
    }
}

/// Makes a hypercall that must kill the guest, with plain registers. If it
/// returns, the host let a forbidden call through: that is the failure.
pub fn fatal_hcall(nr: u64, a: [u64; 4]) -> ! {
    HCALLS.fetch_add(1, Ordering::Relaxed);
    // SAFETY: the host is expected to kill the guest here; if it does not,
    // the arguments were checked by nothing but the host, and the guest
    // stops at once (`fail`) without using anything they may have touched.
    let ret = unsafe { lguest_guest::hcall(nr, a[0], a[1], a[2], a[3]) };
    fail(format_args!("survived: hypercall {nr} returned {ret:#x}"))
}

/// Makes hypercall `nr` (one without addresses) with RSP pointing at
/// `rsp`, somewhere the guest cannot write: the host must not care, since
/// virtual interrupts are off (the caller sees to it) and so nothing is
/// delivered on the way back.
pub fn wild_stack(nr: u64, rsp: u64) {
    let rax: u64;
    // SAFETY: the host only reads the registers; with the virtual IF off it
    // delivers nothing, so nothing is pushed on the wild stack. RSP is put
    // back from SAVED_RSP before anything else runs. The hypercall must take
    // no addresses (the caller's promise).
    unsafe {
        asm!(
            "mov qword ptr [rip + {saved}], rsp",
            "mov rsp, {wild}",
            "int 0x1f",
            "mov rsp, qword ptr [rip + {saved}]",
            saved = sym SAVED_RSP,
            wild = in(reg) rsp,
            inout("rax") nr => rax,
            in("rdi") 0u64,
            in("rsi") 0u64,
            in("rdx") 0u64,
            in("r10") 0u64,
        );
    }
    HCALLS.fetch_add(1, Ordering::Relaxed);
    if rax != 0 {
        fail(format_args!("hypercall {nr} with rsp {rsp:#x} returned rax {rax:#x}"));
    }
}

/// Raises an exception with RSP at `rsp`, where the host cannot push the
/// frame: the host must kill the guest. Virtual interrupts must be off.
pub fn trap_on_wild_stack(rsp: u64) -> ! {
    // SAFETY: as in `wild_stack`: the host cannot deliver the #BP (the frame
    // would not be in guest memory) and kills the guest; if it returned
    // after all, RSP is restored before anything else runs.
    unsafe {
        asm!(
            "mov qword ptr [rip + {saved}], rsp",
            "mov rsp, {wild}",
            "int3",
            "mov rsp, qword ptr [rip + {saved}]",
            saved = sym SAVED_RSP,
            wild = in(reg) rsp,
        );
    }
    fail(format_args!("survived: int3 with rsp {rsp:#x}"))
}
