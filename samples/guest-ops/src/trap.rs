// SPDX-License-Identifier: GPL-2.0
//! `trap NAME`: raises one exception with a handler installed for every
//! exception vector, and checks what the host delivered.
//!
//! NAME is one of `de` (#DE, div by 0), `db` (#DB, single step with TF),
//! `icebp` (#DB by INT1: not under QEMU TCG 7.x, see [`TRAPS`]), `bp`
//! (int3), `of` (int $4), `ud` (ud2), `ss` (non-canonical SS-relative
//! read), `gp` (cli), `gperr` (int $0x80), `pf` (read of 0x1000), `pfw`
//! (write of 0x1000), `ac` (misaligned read with AC set), `xm` (an SSE
//! division by zero with the exception unmasked in MXCSR). #NM is not
//! possible: the guest's FPU is always usable (the host loads its state at
//! its first FPU instruction; only XFD-armed components, AMX, raise it).
//!
//! The action installs [`handler`] for all of
//! [`interrupts::EXCEPTION_VECTORS`] (trap gates, #PF an interrupt gate),
//! then announces
//!
//! ```text
//! guest-ops: trap: NAME: executing INSN (expect vector V error 0xE)
//! ```
//!
//! and executes the instruction. Just before it, the assembly records the
//! instruction's address, the stack pointer and where to resume (right
//! after it). The handler prints
//!
//! ```text
//! guest-ops: trap: vector V error 0xE cr2 0xC
//! guest-ops: trap: frame rip 0xR (insn+N) cs 0x33 ss 0x2b rsp 0xS (was 0xS) rflags 0xF
//! ```
//!
//! (V and N decimal, the rest hex; cr2 is `lguest_data.cr2`, meaningful for
//! #PF only), then resumes after the instruction by changing the frame's
//! RIP (and clearing AC and TF in its RFLAGS), which exercises the paravirt
//! `iret`. Back in the action, it prints `guest-ops: trap: resumed after the
//! handler` and checks: the (vector, error code) pair (hardware's, or where
//! QEMU's TCG differs, its: `ss` may give #GP(0), `gperr` error 0x802
//! instead of 0x402), cr2 (#PF), the saved RIP (the instruction for faults,
//! after it for the traps `db`, `icebp`, `bp`, `of`), CS 0x33, SS 0x2b, the
//! saved RSP, where the host put the frame (the saved RIP at
//! `(RSP & !0xF) - 40`), and the IF bit of the saved RFLAGS (the virtual IF
//! at the instruction: off). A mismatch crashes with
//! `guest-ops: trap: NAME: <what> is 0x.., expected 0x..`. Success powers off
//! with `guest-ops: trap: done`. An instruction that does not trap prints
//! `guest-ops: trap: NAME: no trap` and crashes with that, except `ac`,
//! which prints why (the host runs the guest with CR0.AM clear) and powers
//! off with `guest-ops: trap: done`.
//!
//! A trap outside the recorded instruction crashes from the handler with
//! `guest-ops: trap: unexpected vector V (#XX) error 0x.. cr2 0x.. at rip
//! 0x..`.

use core::arch::asm;
use core::fmt;
use core::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use lguest_guest::abi::{LGUEST_GUEST_CS, LGUEST_GUEST_SS, LGUEST_KERNEL_CS, LGUEST_KERNEL_SS, X86_EFLAGS_IF};
use lguest_guest::interrupts::{self, TrapFrame, X86_EFLAGS_AC, X86_EFLAGS_TF};
use lguest_guest::{crash_fmt, data, paravirt, poweroff, println};

/// One `trap` test.
struct Trap {
    /// The command-line word.
    name: &'static str,
    /// The instruction, for the console.
    what: &'static str,
    /// The (vector, error code) pairs the host may deliver: the first is
    /// what hardware does, any other what QEMU's TCG does instead. The error
    /// code is 0 where the CPU pushes none (the stub pushes 0 then).
    expect: &'static [(u64, u64)],
    /// Bytes from the instruction to the saved RIP: 0 for faults, the
    /// instruction's length for traps.
    rip_offset: u64,
    /// The expected cr2, for #PF.
    cr2: Option<u64>,
    /// Executes it between the recording and the resume label.
    run: fn(),
}

/// An unmapped address (the first MiB never is mapped).
const UNMAPPED: u64 = 0x1000;

/// #PF error code bits: write, user (present is clear: nothing is mapped).
const PF_WRITE: u64 = 1 << 1;

/// The #GP error code of `int $0x80` through a gate ring 3 may not use: the
/// IDT selector, vector * 8 + 2 on hardware; QEMU's TCG gives vector * 16
/// + 2 (see Documentation/guest-abi.rst).
const INT80_ERROR: u64 = (0x80 << 3) | 2;
const INT80_ERROR_TCG: u64 = (0x80 << 4) | 2;

/// A non-canonical offset: added to RSP it makes an SS-relative address
/// that is not canonical, which raises #SS(0) on hardware (#GP(0) under
/// QEMU's TCG, which does not tell the segments apart).
const NONCANONICAL: u64 = 1 << 63;

/// Every `trap` test. Not here: #BR (BOUND is invalid in 64-bit mode), #TS,
/// #NP (need descriptor games), #MF and #XM (need the x87 or SSE, which the
/// guest has not: #NM comes first), #CP (CET).
///
/// `db` single-steps with RFLAGS.TF. `icebp` raises #DB with INT1 (ICEBP)
/// instead; do not run it under QEMU's TCG before 8.0, which treats ICEBP as
/// a gdbstub breakpoint and stops the whole virtual machine.
const TRAPS: &[Trap] = &[
    Trap { name: "de", what: "div %rcx (rcx = 0)", expect: &[(0, 0)], rip_offset: 0, cr2: None, run: de },
    Trap {
        name: "db",
        what: "nop with RFLAGS.TF set (single step)",
        expect: &[(1, 0)],
        rip_offset: 1,
        cr2: None,
        run: db,
    },
    Trap { name: "icebp", what: "int1 (icebp)", expect: &[(1, 0)], rip_offset: 1, cr2: None, run: icebp },
    Trap { name: "bp", what: "int3", expect: &[(3, 0)], rip_offset: 1, cr2: None, run: bp },
    Trap { name: "of", what: "int $4", expect: &[(4, 0)], rip_offset: 2, cr2: None, run: of },
    Trap { name: "ud", what: "ud2", expect: &[(6, 0)], rip_offset: 0, cr2: None, run: ud },
    Trap { name: "xm", what: "divss by zero (MXCSR.ZM clear)", expect: &[(19, 0)], rip_offset: 0, cr2: None, run: xm },
    Trap {
        name: "ss",
        what: "mov (%rsp + 1<<63),%rax (non-canonical, SS-relative)",
        expect: &[(12, 0), (13, 0)],
        rip_offset: 0,
        cr2: None,
        run: ss,
    },
    Trap { name: "gp", what: "cli", expect: &[(13, 0)], rip_offset: 0, cr2: None, run: gp },
    Trap {
        name: "gperr",
        what: "int $0x80 (a gate ring 3 may not use)",
        expect: &[(13, INT80_ERROR), (13, INT80_ERROR_TCG)],
        rip_offset: 0,
        cr2: None,
        run: gperr,
    },
    Trap {
        name: "pf",
        what: "mov (0x1000),%rax (unmapped)",
        expect: &[(14, 0)],
        rip_offset: 0,
        cr2: Some(UNMAPPED),
        run: pf,
    },
    Trap {
        name: "pfw",
        what: "mov %rax,(0x1000) (unmapped)",
        expect: &[(14, PF_WRITE)],
        rip_offset: 0,
        cr2: Some(UNMAPPED),
        run: pfw,
    },
    Trap {
        name: "ac",
        what: "misaligned 4-byte read with RFLAGS.AC set",
        expect: &[(17, 0)],
        rip_offset: 0,
        cr2: None,
        run: ac,
    },
];

/// Displays the names of the tests, separated by `|`.
pub struct Names;

impl fmt::Display for Names {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (n, trap) in TRAPS.iter().enumerate() {
            let sep = if n == 0 { "" } else { " | " };
            write!(f, "{sep}{}", trap.name)?;
        }
        Ok(())
    }
}

// What the assembly records before the instruction (0: not armed).
/// Where the handler resumes: the end of the asm block.
static RESUME: AtomicU64 = AtomicU64::new(0);
/// The address of the instruction.
static INSN: AtomicU64 = AtomicU64::new(0);
/// RSP at the instruction.
static RSP: AtomicU64 = AtomicU64::new(0);

// What the handler saw.
/// Whether the handler ran.
static TAKEN: AtomicBool = AtomicBool::new(false);
static SEEN_VECTOR: AtomicU64 = AtomicU64::new(0);
static SEEN_ERROR: AtomicU64 = AtomicU64::new(0);
static SEEN_CR2: AtomicU64 = AtomicU64::new(0);
static SEEN_RIP: AtomicU64 = AtomicU64::new(0);
static SEEN_CS: AtomicU64 = AtomicU64::new(0);
static SEEN_SS: AtomicU64 = AtomicU64::new(0);
static SEEN_RSP: AtomicU64 = AtomicU64::new(0);
static SEEN_RFLAGS: AtomicU64 = AtomicU64::new(0);
/// The address of the saved RIP, i.e. of the hardware frame minus the
/// error code: where the host put it.
static SEEN_FRAME: AtomicU64 = AtomicU64::new(0);

/// Records the instruction's address, RSP and the resume address, then runs
/// `$setup`, the instruction `$insn` (labelled `3:`), and, at the resume
/// label `2:`, `$cleanup`; then the operands. The instructions are string
/// literals in Intel syntax.
macro_rules! at_trap {
    ([$($setup:literal),*], [$($insn:literal),+], [$($cleanup:literal),*] $(, $($op:tt)*)?) => {
        asm!(
            "lea {tmp}, [rip + 2f]",
            "mov qword ptr [{resume}], {tmp}",
            "lea {tmp}, [rip + 3f]",
            "mov qword ptr [{insn}], {tmp}",
            "mov qword ptr [{sp_slot}], rsp",
            $($setup,)*
            "3:",
            $($insn,)+
            "2:",
            $($cleanup,)*
            tmp = out(reg) _,
            resume = in(reg) RESUME.as_ptr(),
            insn = in(reg) INSN.as_ptr(),
            sp_slot = in(reg) RSP.as_ptr(),
            $($($op)*)?
        )
    };
}

// Safety, for every test below: the instruction either raises the expected
// exception, whose handler resumes at the `2:` label with every register as
// it was (the stub saves and restores them all, and the handler changes
// only RIP and RFLAGS.AC/TF), or it completes, harmlessly: each declares
// the registers it changes, and none writes memory a Rust object lives in
// (addresses under 1 MiB are not mapped; the records are atomics). Nothing
// is marked `nomem` or `nostack`: the handler runs on this stack, below
// RSP, and writes memory.

fn de() {
    // SAFETY: see above; DIV by zero raises #DE.
    unsafe {
        at_trap!(
            ["xor ecx, ecx"],
            ["div rcx"],
            [],
            inout("rax") 1u64 => _,
            inout("rdx") 0u64 => _,
            out("rcx") _
        )
    }
}

fn db() {
    // SAFETY: see above; POPFQ sets TF (allowed at CPL 3), which raises a
    // single-step #DB after the instruction that follows, the NOP; the
    // host clears TF on delivery and the handler clears it in the frame.
    unsafe { at_trap!(["pushfq", "or qword ptr [rsp], 0x100", "popfq"], ["nop"], []) }
}

fn icebp() {
    // SAFETY: see above; ICEBP (0xF1, which LLVM has no mnemonic for)
    // raises a trap-like #DB that no IDT gate's DPL can stop.
    unsafe { at_trap!([], [".byte 0xf1"], []) }
}

fn bp() {
    // SAFETY: see above; INT3 raises a trap-like #BP.
    unsafe { at_trap!([], ["int3"], []) }
}

fn of() {
    // SAFETY: see above; INT $4 goes through one of the two gates ring 3 may
    // use (with 3 and the hypercall's): a trap-like #OF.
    unsafe { at_trap!([], ["int 4"], []) }
}

fn ud() {
    // SAFETY: see above; UD2 raises #UD.
    unsafe { at_trap!([], ["ud2"], []) }
}

fn xm() {
    // SAFETY: see above; with the zero-divide exception unmasked (MXCSR
    // 0x1d80, loaded from a stack slot below RSP, which the handler's frame
    // does not reach before the fault) a scalar SSE division by zero raises
    // #XM; the cleanup puts the default MXCSR back. It changes XMM0 and
    // XMM1, which this soft-float program never uses (they cannot even be
    // named as clobbers).
    unsafe {
        at_trap!(
            ["mov dword ptr [rsp - 8], 0x1d80", "ldmxcsr [rsp - 8]", "xorps xmm0, xmm0", "mov {v:e}, 1", "cvtsi2ss xmm1, {v:e}"],
            ["divss xmm1, xmm0"],
            ["mov dword ptr [rsp - 8], 0x1f80", "ldmxcsr [rsp - 8]"],
            v = out(reg) _
        )
    }
}

fn ss() {
    // SAFETY: see above; RSP + 2^63 is not canonical, and a memory operand
    // based on RSP is SS-relative, so this raises #SS(0); it reads nothing.
    unsafe { at_trap!([], ["mov {v}, qword ptr [rsp + {off}]"], [], v = lateout(reg) _, off = in(reg) NONCANONICAL) }
}

fn gp() {
    // SAFETY: see above; CLI at CPL 3 with IOPL 0 raises #GP(0).
    unsafe { at_trap!([], ["cli"], []) }
}

fn gperr() {
    // SAFETY: see above; INT $0x80 through a gate with DPL 0 raises #GP with
    // the IDT selector as the error code. The guest has no system-call gate
    // (it never set `syscall_vec`), so nothing else can run it: the host
    // reflects the #GP or kills the guest, and changes no register.
    unsafe { at_trap!([], ["int 0x80"], []) }
}

fn pf() {
    // SAFETY: see above; UNMAPPED is below 1 MiB, never mapped: #PF.
    unsafe { at_trap!([], ["mov {v}, qword ptr [{addr}]"], [], v = lateout(reg) _, addr = in(reg) UNMAPPED) }
}

fn pfw() {
    // SAFETY: see above; a write to UNMAPPED: #PF with the write bit. No Rust
    // object lives there.
    unsafe { at_trap!([], ["mov qword ptr [{addr}], {v}"], [], v = in(reg) 0u64, addr = in(reg) UNMAPPED) }
}

/// The target of `ac`'s misaligned read.
static AC_BUF: [u64; 2] = [0; 2];

fn ac() {
    let misaligned = AC_BUF.as_ptr().cast::<u8>().wrapping_add(1);
    // SAFETY: see above; sets RFLAGS.AC (allowed at CPL 3), reads 4 bytes at
    // an odd address inside AC_BUF (#AC if the host runs us with CR0.AM set,
    // else a plain read) and clears AC again at the resume label (the
    // handler clears it in the frame too). pushfq/popfq keep RSP balanced.
    unsafe {
        at_trap!(
            ["pushfq", "or qword ptr [rsp], 0x40000", "popfq"],
            ["mov {v:e}, dword ptr [{p}]"],
            ["pushfq", "and qword ptr [rsp], -0x40001", "popfq"],
            v = lateout(reg) _,
            p = in(reg) misaligned
        )
    }
}

/// The exception handler: prints what arrived, records it, and resumes
/// after the instruction.
fn handler(frame: &mut TrapFrame) {
    let cr2 = data::cr2();
    let resume = RESUME.swap(0, Ordering::AcqRel);
    println!("guest-ops: trap: vector {} error {:#x} cr2 {cr2:#x}", frame.vector, frame.error);
    if resume == 0 {
        crash_fmt(format_args!(
            "guest-ops: trap: unexpected vector {} ({}) error {:#x} cr2 {cr2:#x} at rip {:#x}",
            frame.vector,
            u8::try_from(frame.vector).map_or("?", interrupts::vector_name),
            frame.error,
            frame.rip
        ));
    }
    let insn = INSN.load(Ordering::Relaxed);
    println!(
        "guest-ops: trap: frame rip {:#x} (insn+{}) cs {:#x} ss {:#x} rsp {:#x} (was {:#x}) rflags {:#x}",
        frame.rip,
        frame.rip.wrapping_sub(insn),
        frame.cs,
        frame.ss,
        frame.rsp,
        RSP.load(Ordering::Relaxed),
        frame.rflags
    );
    SEEN_VECTOR.store(frame.vector, Ordering::Relaxed);
    SEEN_ERROR.store(frame.error, Ordering::Relaxed);
    SEEN_CR2.store(cr2, Ordering::Relaxed);
    SEEN_RIP.store(frame.rip, Ordering::Relaxed);
    SEEN_CS.store(frame.cs, Ordering::Relaxed);
    SEEN_SS.store(frame.ss, Ordering::Relaxed);
    SEEN_RSP.store(frame.rsp, Ordering::Relaxed);
    SEEN_RFLAGS.store(frame.rflags, Ordering::Relaxed);
    SEEN_FRAME.store(core::ptr::addr_of!(frame.rip) as u64, Ordering::Relaxed);
    TAKEN.store(true, Ordering::Release);
    frame.rip = resume;
    frame.rflags &= !(X86_EFLAGS_AC | X86_EFLAGS_TF);
}

/// The trap test called `name`.
fn find(name: &str) -> Option<&'static Trap> {
    TRAPS.iter().find(|t| t.name == name)
}

/// `trap NAME`.
pub fn run(arg: Option<&str>) -> ! {
    let Some(trap) = arg.and_then(find) else {
        println!("guest-ops: trap: NAME is one of: {Names} (xm needs SSE: not possible)");
        crash_fmt(format_args!("guest-ops: trap: unknown or missing NAME {:?}", arg.unwrap_or("")));
    };
    for &vector in interrupts::EXCEPTION_VECTORS {
        if let Err(e) = interrupts::set_trap_handler(vector, handler) {
            crash_fmt(format_args!("guest-ops: trap: {e}"));
        }
    }
    if let Err(e) = interrupts::install() {
        crash_fmt(format_args!("guest-ops: trap: {e}"));
    }
    let name = trap.name;
    let flags = paravirt::save_fl();
    let (vector, error) = trap.expect.first().copied().unwrap_or_default();
    println!("guest-ops: trap: {name}: executing {} (expect vector {vector} error {error:#x})", trap.what);
    (trap.run)();
    if !TAKEN.load(Ordering::Acquire) {
        println!("guest-ops: trap: {name}: no trap");
        if name == "ac" {
            println!("guest-ops: trap: ac: alignment checking is off (the host runs the guest with CR0.AM clear)");
            poweroff("guest-ops: trap: done");
        }
        crash_fmt(format_args!("guest-ops: trap: {name}: no trap"));
    }
    println!("guest-ops: trap: resumed after the handler");
    if let Err(e) = check(trap, flags) {
        crash_fmt(format_args!("guest-ops: trap: {name}: {e}"));
    }
    poweroff("guest-ops: trap: done")
}

/// One thing the handler saw that is not what the contract says.
struct Mismatch(&'static str, u64, u64);

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} is {:#x}, expected {:#x}", self.0, self.1, self.2)
    }
}

/// Compares what the handler recorded with what `trap` should deliver;
/// `flags` is the virtual IF at the instruction.
fn check(trap: &Trap, flags: u64) -> Result<(), Mismatch> {
    let same = |what, got: u64, want: u64| if got == want { Ok(()) } else { Err(Mismatch(what, got, want)) };
    let insn = INSN.load(Ordering::Relaxed);
    let rsp = RSP.load(Ordering::Relaxed);
    let (vector, error) = (SEEN_VECTOR.load(Ordering::Relaxed), SEEN_ERROR.load(Ordering::Relaxed));
    if !trap.expect.contains(&(vector, error)) {
        let (want_vector, want_error) = trap.expect.first().copied().unwrap_or_default();
        same("the vector", vector, want_vector)?;
        same("the error code", error, want_error)?;
        // Each alone matches the hardware pair, yet the pair is not listed.
        return Err(Mismatch("the error code", error, want_error));
    }
    if let Some(cr2) = trap.cr2 {
        same("cr2", SEEN_CR2.load(Ordering::Relaxed), cr2)?;
    }
    same("the saved rip", SEEN_RIP.load(Ordering::Relaxed), insn + trap.rip_offset)?;
    // Kernel mode's selectors: the lguest pair, or Linux's with
    // `linuxframes`.
    let (cs, ss) = if interrupts::linux_frames() {
        (LGUEST_KERNEL_CS, LGUEST_KERNEL_SS)
    } else {
        (LGUEST_GUEST_CS, LGUEST_GUEST_SS)
    };
    same("the saved cs", SEEN_CS.load(Ordering::Relaxed), cs)?;
    same("the saved ss", SEEN_SS.load(Ordering::Relaxed), ss)?;
    same("the saved rsp", SEEN_RSP.load(Ordering::Relaxed), rsp)?;
    // new RSP = (old & !0xF) - 40 (- 48 with an error code, which sits
    // below RIP): RIP is always at (old & !0xF) - 40.
    same("the address of the saved rip", SEEN_FRAME.load(Ordering::Relaxed), (rsp & !0xF) - 40)?;
    same("the saved virtual IF", SEEN_RFLAGS.load(Ordering::Relaxed) & X86_EFLAGS_IF, flags & X86_EFLAGS_IF)?;
    Ok(())
}
