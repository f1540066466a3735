// SPDX-License-Identifier: GPL-2.0
//! Deliberate traps: exceptions and privileged instructions, each reflected
//! by the host to the guest's handler, which resumes after the instruction.
//!
//! The asm of each case records where to resume (the `2:` label after the
//! instruction) in [`RESUME`] and then executes it. The [`handler`],
//! installed on every exception vector the host delivers, records the
//! vector, error code and `cr2` and resumes there. Back in Rust, the case
//! checks that the vector is one the instruction may raise (and, for a page
//! fault, the faulting address and the user and write bits); an instruction
//! that must trap and did not is a failure too. Some instructions may or may
//! not trap depending on the host (UMIP, CR0.AM): those are `optional`.
//!
//! A trap with nothing armed (an exception no case announced) is a failure
//! of the host or of this guest: it stops the guest as crashed.

use core::arch::asm;
use core::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use lguest_guest::abi::{LGUEST_GUEST_CS, LGUEST_GUEST_SS, X86_EFLAGS_IF};
use lguest_guest::interrupts::{self, TrapFrame, X86_EFLAGS_AC, X86_EFLAGS_TF};
use lguest_guest::{crash_fmt, data};

use crate::fail;
use crate::rng::Rng;

/// Exceptions the handler took.
pub static TRAPS: AtomicU64 = AtomicU64::new(0);

/// Where the handler resumes (0: no trap is expected).
static RESUME: AtomicU64 = AtomicU64::new(0);
/// Whether the handler ran since the case started, and what it saw.
static TAKEN: AtomicBool = AtomicBool::new(false);
static SEEN_VECTOR: AtomicU64 = AtomicU64::new(0);
static SEEN_ERROR: AtomicU64 = AtomicU64::new(0);
static SEEN_CR2: AtomicU64 = AtomicU64::new(0);

/// #PF error code bits.
const PF_WRITE: u64 = 1 << 1;
const PF_USER: u64 = 1 << 2;
/// RFLAGS.IOPL.
const IOPL: u64 = 3 << 12;

/// Records the resume address, then runs `$setup`, the instruction(s)
/// `$insn`, the resume label `2:` and `$cleanup`; then the operands.
macro_rules! at_trap {
    ([$($setup:literal),*], [$($insn:literal),+], [$($cleanup:literal),*] $(, $($op:tt)*)?) => {
        asm!(
            "lea {tmp}, [rip + 2f]",
            "mov qword ptr [{resume}], {tmp}",
            $($setup,)*
            $($insn,)+
            "2:",
            $($cleanup,)*
            tmp = out(reg) _,
            resume = in(reg) RESUME.as_ptr(),
            $($($op)*)?
        )
    };
}

/// The exception handler of every vector: records what arrived and resumes
/// at [`RESUME`].
fn handler(frame: &mut TrapFrame) {
    let cr2 = data::cr2();
    let resume = RESUME.swap(0, Ordering::AcqRel);
    if resume == 0 {
        crash_fmt(format_args!(
            "fuzz: unexpected vector {} ({}) error {:#x} cr2 {cr2:#x} at rip {:#x}",
            frame.vector,
            u8::try_from(frame.vector).map_or("?", interrupts::vector_name),
            frame.error,
            frame.rip
        ));
    }
    if frame.cs != LGUEST_GUEST_CS || frame.ss != LGUEST_GUEST_SS {
        crash_fmt(format_args!(
            "fuzz: vector {} delivered with cs {:#x} ss {:#x} at rip {:#x}",
            frame.vector, frame.cs, frame.ss, frame.rip
        ));
    }
    TRAPS.fetch_add(1, Ordering::Relaxed);
    SEEN_VECTOR.store(frame.vector, Ordering::Relaxed);
    SEEN_ERROR.store(frame.error, Ordering::Relaxed);
    SEEN_CR2.store(cr2, Ordering::Relaxed);
    TAKEN.store(true, Ordering::Release);
    frame.rip = resume;
    frame.rflags &= !(X86_EFLAGS_AC | X86_EFLAGS_TF);
}

/// Sets [`handler`] on every exception vector the host delivers (loaded by
/// the next `interrupts::install`).
pub fn set_handlers() {
    for &vector in interrupts::EXCEPTION_VECTORS {
        if let Err(e) = interrupts::set_trap_handler(vector, handler) {
            crash_fmt(format_args!("fuzz: {e}"));
        }
    }
}

/// A page fault to check: the address and whether it was a write.
#[derive(Clone, Copy)]
struct Pf {
    addr: u64,
    write: bool,
}

/// Runs one case: `f` executes the instruction under `at_trap!`.
fn run(name: &'static str, expect: &[u64], optional: bool, pf: Option<Pf>, f: impl FnOnce()) {
    TAKEN.store(false, Ordering::Relaxed);
    f();
    RESUME.store(0, Ordering::Release);
    if !TAKEN.load(Ordering::Acquire) {
        if optional {
            return;
        }
        fail(format_args!("trap {name}: the instruction did not trap (expected vector {expect:?})"));
    }
    let vector = SEEN_VECTOR.load(Ordering::Relaxed);
    let error = SEEN_ERROR.load(Ordering::Relaxed);
    let cr2 = SEEN_CR2.load(Ordering::Relaxed);
    if !expect.contains(&vector) {
        fail(format_args!("trap {name}: vector {vector} error {error:#x} cr2 {cr2:#x}, expected one of {expect:?}"));
    }
    if let (14, Some(pf)) = (vector, pf) {
        let write_ok = !pf.write || error & PF_WRITE != 0;
        // Kernel mode: the U bit is clear, as hardware reports it.
        if cr2 != pf.addr || error & PF_USER != 0 || !write_ok {
            fail(format_args!(
                "trap {name}: page fault at {:#x} (write {}) gave cr2 {cr2:#x} error {error:#x}",
                pf.addr, pf.write
            ));
        }
    }
}

/// An instruction the host emulates in guest kernel mode (or that just
/// runs, as the FPU's): it must not trap, and `check` must hold after it.
fn emulated(name: &'static str, f: impl FnOnce() -> bool) {
    TAKEN.store(false, Ordering::Relaxed);
    let ok = f();
    RESUME.store(0, Ordering::Release);
    if TAKEN.load(Ordering::Acquire) {
        let vector = SEEN_VECTOR.load(Ordering::Relaxed);
        fail(format_args!("{name}: trapped (vector {vector}); the host emulates it in kernel mode"));
    }
    if !ok {
        fail(format_args!("{name}: emulated with the wrong result"));
    }
}

fn read(addr: u64) -> u64 {
    let value: u64;
    // SAFETY: an 8-byte read of `addr`, which either faults (the handler
    // resumes at `2:`, and the value is the 0 it started with) or reads
    // memory no Rust object cares about; asm makes no claim about Rust
    // objects.
    unsafe { at_trap!([], ["mov {v}, qword ptr [{a}]"], [], v = inout(reg) 0u64 => value, a = in(reg) addr) }
    value
}

/// Writes `value` at `addr`. Only for addresses that are not mapped, or
/// that map memory no Rust object lives in (the scratch pages of
/// [`crate::paging`]).
fn write_value(addr: u64, value: u64) {
    // SAFETY: see above: it faults (the handler resumes at `2:`) or writes
    // memory no Rust object lives in.
    unsafe { at_trap!([], ["mov qword ptr [{a}], {v}"], [], v = in(reg) value, a = in(reg) addr) }
}

fn write(addr: u64) {
    write_value(addr, 0);
}

/// What a trap delivered: vector, error code, `cr2`.
pub type Trapped = (u64, u64, u64);

/// The trap `f` raised, if any.
fn trapped(f: impl FnOnce() -> u64) -> Result<u64, Trapped> {
    TAKEN.store(false, Ordering::Relaxed);
    let value = f();
    RESUME.store(0, Ordering::Release);
    if !TAKEN.load(Ordering::Acquire) {
        return Ok(value);
    }
    Err((SEEN_VECTOR.load(Ordering::Relaxed), SEEN_ERROR.load(Ordering::Relaxed), SEEN_CR2.load(Ordering::Relaxed)))
}

/// Reads the u64 at `addr`, or says which trap that raised.
pub fn try_read(addr: u64) -> Result<u64, Trapped> {
    trapped(|| read(addr))
}

/// Writes `value` at `addr` (see [`write_value`] for which addresses), or
/// says which trap that raised.
pub fn try_write(addr: u64, value: u64) -> Result<(), Trapped> {
    trapped(|| {
        write_value(addr, value);
        0
    })
    .map(|_| ())
}

/// Whether `addr` is readable: a read that faults (#PF) says no.
pub fn mapped(addr: u64) -> bool {
    match try_read(addr) {
        Ok(_) => true,
        Err((14, _, _)) => false,
        Err((vector, error, _)) => {
            fail(format_args!("probing {addr:#x}: vector {vector} error {error:#x}, expected a page fault"))
        }
    }
}

/// The number of cases [`random`] chooses from.
const CASES: u64 = 34;

/// A target for the misaligned read of the `ac` case.
static AC_BUF: [u64; 2] = [0; 2];

/// Runs one random trap case. `mem` is the size of RAM.
//
// Safety, for every asm block below: the instruction either raises the
// exception the case expects, whose handler resumes at `2:` with every
// register as it was (the stubs save them all; the handler changes only
// RIP and RFLAGS.AC/TF), or it completes harmlessly: each declares the
// registers it changes, and none writes memory a Rust object lives in
// (unmapped addresses only; `sgdt` and friends write the buffers given).
// None is `nomem` or `nostack`: the handler runs on this stack, below RSP.
pub fn random(rng: &mut Rng, mem: u64) {
    match rng.below(CASES) {
        // SAFETY: see above; a breakpoint trap.
        0 => run("int3", &[3], false, None, || unsafe { at_trap!([], ["int3"], []) }),
        // SAFETY: see above; an overflow trap through the one other gate
        // ring 3 may use.
        1 => run("int4", &[4], false, None, || unsafe { at_trap!([], ["int 4"], []) }),
        // SAFETY: see above.
        2 => run("ud2", &[6], false, None, || unsafe { at_trap!([], ["ud2"], []) }),
        3 => run("div0", &[0], false, None, || {
            let dividend = rng.next();
            // SAFETY: see above; DIV by zero raises #DE.
            unsafe {
                at_trap!(
                    ["xor ecx, ecx"],
                    ["div rcx"],
                    [],
                    inout("rax") dividend => _,
                    inout("rdx") 0u64 => _,
                    out("rcx") _
                )
            }
        }),
        4 => {
            let addr = rng.below(0x10_0000) & !7;
            run("read below 1 MiB", &[14], false, Some(Pf { addr, write: false }), || {
                read(addr);
            })
        }
        5 => {
            let addr = rng.below(0x10_0000) & !7;
            run("write below 1 MiB", &[14], false, Some(Pf { addr, write: true }), || write(addr))
        }
        6 => {
            let addr = rng.range(mem, (1 << 47) - 8) & !7;
            let addr = if rng.chance(500) { mem + (rng.below(0x2000) & !7) } else { addr };
            // Not in the scratch window of the guest's own page tables.
            let addr = if crate::paging::in_scratch(addr) { addr | (1 << 40) } else { addr };
            run("read above RAM", &[14], false, Some(Pf { addr, write: false }), || {
                read(addr);
            })
        }
        7 => {
            let addr = (0xffff_8000_0000_0000 | rng.next()) & !7;
            run("read upper half", &[14], false, Some(Pf { addr, write: false }), || {
                read(addr);
            })
        }
        8 => {
            // Bits 63 and 62 differ: not canonical with 4- or 5-level paging.
            let addr = ((rng.next() & !(1 << 63)) | (1 << 62)) & !7;
            run("read non-canonical", &[13], false, None, || {
                read(addr);
            })
        }
        9 => {
            // Canonical only with 5-level paging.
            let addr = rng.range(1 << 47, (1 << 56) - 8) & !7;
            run("read 2^47..2^56", &[13, 14], false, Some(Pf { addr, write: false }), || {
                read(addr);
            })
        }
        // SAFETY: see above; CLI at CPL 3, IOPL 0 raises #GP.
        10 => run("cli", &[13], false, None, || unsafe { at_trap!([], ["cli"], []) }),
        // SAFETY: as for CLI.
        11 => run("sti", &[13], false, None, || unsafe { at_trap!([], ["sti"], []) }),
        // SAFETY: HLT at CPL 3 raises #GP.
        12 => run("hlt", &[13], false, None, || unsafe { at_trap!([], ["hlt"], []) }),
        13 => {
            let port = rng.below(0x1_0000);
            // SAFETY: IN at CPL 3 with IOPL 0 and no I/O bitmap raises #GP,
            // which the host emulates in kernel mode: AL reads all ones.
            emulated("in", || {
                let v: u8;
                // SAFETY: see the comment above this case.
                unsafe { at_trap!([], ["in al, dx"], [], in("dx") port as u16, inout("al") 0u8 => v) };
                v == 0xff
            })
        }
        14 => {
            let port = rng.below(0x1_0000);
            let value = rng.next() as u8;
            // SAFETY: as for IN; the write is dropped.
            emulated("out", || {
                // SAFETY: see the comment above this case.
                unsafe { at_trap!([], ["out dx, al"], [], in("dx") port as u16, in("al") value) };
                true
            })
        }
        15 => {
            let msr = random_msr(rng);
            // SAFETY: RDMSR at CPL 3 raises #GP.
            run("rdmsr", &[13], false, None, || unsafe {
                at_trap!([], ["rdmsr"], [], in("ecx") msr, out("eax") _, out("edx") _)
            })
        }
        16 => {
            let msr = random_msr(rng);
            let value = rng.next();
            // SAFETY: WRMSR at CPL 3 raises #GP.
            run("wrmsr", &[13], false, None, || unsafe {
                at_trap!([], ["wrmsr"], [], in("ecx") msr, in("eax") value as u32, in("edx") (value >> 32) as u32)
            })
        }
        17 => match rng.below(4) {
            // SAFETY: reading a control register at CPL 3 raises #GP; the
            // host emulates CR0 and CR4 reads in kernel mode.
            0 => emulated("read cr0", || {
                let v: u64;
                // SAFETY: see the comment above this case.
                unsafe { at_trap!([], ["mov {v}, cr0"], [], v = out(reg) v) };
                v == 0x8005_0033
            }),
            // SAFETY: as above.
            1 => run("read cr3", &[13], false, None, || unsafe { at_trap!([], ["mov {v}, cr3"], [], v = out(reg) _) }),
            // SAFETY: as above; PAE, OSFXSR and OSXMMEXCPT are always set.
            2 => emulated("read cr4", || {
                let v: u64;
                // SAFETY: see the comment above this case.
                unsafe { at_trap!([], ["mov {v}, cr4"], [], v = out(reg) v) };
                v & 0x620 == 0x620
            }),
            // SAFETY: as above.
            _ => run("read cr8", &[13], false, None, || unsafe { at_trap!([], ["mov {v}, cr8"], [], v = out(reg) _) }),
        },
        18 => {
            let value = rng.arg();
            if rng.chance(500) {
                // SAFETY: writing a control register at CPL 3 raises #GP.
                run("write cr3", &[13], false, None, || unsafe {
                    at_trap!([], ["mov cr3, {v}"], [], v = in(reg) value)
                })
            } else {
                // SAFETY: as above.
                run("write cr0", &[13], false, None, || unsafe {
                    at_trap!([], ["mov cr0, {v}"], [], v = in(reg) value)
                })
            }
        }
        19 => {
            let value = rng.arg();
            if rng.chance(500) {
                // SAFETY: reading a debug register at CPL 3 raises #GP.
                run("read dr7", &[13], false, None, || unsafe { at_trap!([], ["mov {v}, dr7"], [], v = out(reg) _) })
            } else {
                // SAFETY: writing a debug register at CPL 3 raises #GP.
                run("write dr7", &[13], false, None, || unsafe {
                    at_trap!([], ["mov dr7, {v}"], [], v = in(reg) value)
                })
            }
        }
        20 => int_n(rng),
        // SAFETY: the FPU is the guest's (the host loads its state at the
        // first use); FNINIT only resets the x87 state, which this
        // soft-float program never uses.
        21 => emulated("fninit", || {
            // SAFETY: see the comment above this case.
            unsafe { at_trap!([], ["fninit"], []) };
            true
        }),
        22 => {
            // SAFETY: with EFER.SCE clear while the guest runs, SYSCALL
            // raises #UD; it would clobber RCX and R11, which are declared.
            run("syscall", &[6], false, None, || unsafe { at_trap!([], ["syscall"], [], out("rcx") _, out("r11") _) })
        }
        // SAFETY: SYSENTER raises #GP (SYSENTER_CS is 0) or #UD (AMD, TCG).
        23 => run("sysenter", &[6, 13], false, None, || unsafe {
            at_trap!([], ["sysenter"], [], out("rcx") _, out("rdx") _, out("r11") _)
        }),
        // SAFETY: POPFQ sets TF (allowed at CPL 3): #DB after the NOP; the
        // handler clears TF in the frame, and the cleanup clears it too.
        24 => run("single step", &[1], false, None, || unsafe {
            at_trap!(
                ["pushfq", "or qword ptr [rsp], 0x100", "popfq"],
                ["nop"],
                ["pushfq", "and qword ptr [rsp], -0x101", "popfq"]
            )
        }),
        25 => descriptor_store(rng),
        26 => {
            let misaligned = AC_BUF.as_ptr().cast::<u8>().wrapping_add(1 + rng.below(6) as usize);
            // SAFETY: sets RFLAGS.AC, reads 4 bytes inside AC_BUF at an odd
            // address (#AC if the host has CR0.AM, else a plain read) and
            // clears AC again; pushfq/popfq keep RSP balanced.
            run("misaligned with AC", &[17], true, None, || unsafe {
                at_trap!(
                    ["pushfq", "or qword ptr [rsp], 0x40000", "popfq"],
                    ["mov {v:e}, dword ptr [{p}]"],
                    ["pushfq", "and qword ptr [rsp], -0x40001", "popfq"],
                    v = lateout(reg) _,
                    p = in(reg) misaligned
                )
            })
        }
        27 => {
            // Bit 63 set and bit 62 clear in RSP + off: never canonical.
            let off = (1u64 << 63) | (rng.next() & 0x3fff_0000_0000_0000);
            // SAFETY: RSP + off is not canonical: #SS(0) on hardware, #GP(0)
            // under TCG; nothing is read.
            run("non-canonical stack read", &[12, 13], false, None, || unsafe {
                at_trap!([], ["mov {v}, qword ptr [rsp + {o}]"], [], v = lateout(reg) _, o = in(reg) off)
            })
        }
        28 => {
            let buf = [rng.next(), rng.next()];
            let p = buf.as_ptr();
            if rng.chance(500) {
                // SAFETY: LIDT at CPL 3 raises #GP before it reads anything.
                run("lidt", &[13], false, None, || unsafe { at_trap!([], ["lidt [{p}]"], [], p = in(reg) p) })
            } else {
                // SAFETY: LGDT at CPL 3 raises #GP before it reads anything.
                run("lgdt", &[13], false, None, || unsafe { at_trap!([], ["lgdt [{p}]"], [], p = in(reg) p) })
            }
        }
        // SAFETY: SWAPGS at CPL 3 raises #GP (#UD on FRED hosts, which the
        // module refuses).
        29 => run("swapgs", &[13, 6], false, None, || unsafe { at_trap!([], ["swapgs"], []) }),
        30 => {
            let addr = rng.arg();
            match rng.below(4) {
                // SAFETY: INVLPG at CPL 3 raises #GP.
                0 => run("invlpg", &[13], false, None, || unsafe {
                    at_trap!([], ["invlpg [{a}]"], [], a = in(reg) addr)
                }),
                // SAFETY: WBINVD at CPL 3 raises #GP; emulated (nothing).
                1 => emulated("wbinvd", || {
                    // SAFETY: see the comment above this case.
                    unsafe { at_trap!([], ["wbinvd"], []) };
                    true
                }),
                // SAFETY: CLTS at CPL 3 raises #GP.
                2 => run("clts", &[13], false, None, || unsafe { at_trap!([], ["clts"], []) }),
                // SAFETY: INVD at CPL 3 raises #GP.
                _ => run("invd", &[13], false, None, || unsafe { at_trap!([], ["invd"], []) }),
            }
        }
        31 => segment_load(rng),
        32 => iopl_popf(rng),
        33 => {
            let cs = rng.pick(&[0x08u64, 0x10, 0x18, 0x20, 0x28, 0x30, 0x31, 0x32, 0x0a, 0x12]);
            // An IRETQ frame whose CS has an RPL below the CPL: #GP(selector)
            // on hardware. QEMU's TCG before 8.0 reads the frame with
            // supervisor rights, which SMAP turns into a #PF (error 0x1) on
            // our own stack first; the host only emulates that IRETQ at
            // `noirq_iret` (see Documentation/guest-abi.rst), so here the
            // #PF is reflected.
            //
            // SAFETY: the fault comes before anything is popped, so RSP is
            // still below the frame at `2:`, where the cleanup drops it.
            run("iretq to ring 0", &[13, 14], false, None, || unsafe {
                at_trap!(
                    ["push 0x2b", "mov {t}, rsp", "push {t}", "pushfq", "push {cs}", "lea {t}, [rip + 2f]", "push {t}"],
                    ["iretq"],
                    ["add rsp, 40"],
                    t = out(reg) _,
                    cs = in(reg) cs
                )
            })
        }
        _ => unreachable!(),
    }
}

/// An MSR number: EFER, LSTAR, APIC_BASE, TSC, FS_BASE or a random one.
fn random_msr(rng: &mut Rng) -> u32 {
    if rng.chance(200) {
        rng.next() as u32
    } else {
        rng.pick(&[0xc000_0080u32, 0xc000_0082, 0x1b, 0x10, 0xc000_0100])
    }
}

/// `int $n` through a gate ring 3 may not use: #GP.
fn int_n(rng: &mut Rng) {
    // SAFETY, for each: the gate's DPL is 0, so INT n raises #GP(n * 8 + 2)
    // (n * 16 + 2 under TCG) and the handler resumes at `2:`.
    match rng.below(9) {
        // SAFETY: as above.
        0 => run("int 0x80", &[13], false, None, || unsafe { at_trap!([], ["int 0x80"], []) }),
        // SAFETY: as above.
        1 => run("int 0x20", &[13], false, None, || unsafe { at_trap!([], ["int 0x20"], []) }),
        // SAFETY: as above.
        2 => run("int 0x2", &[13], false, None, || unsafe { at_trap!([], ["int 0x2"], []) }),
        // SAFETY: as above.
        3 => run("int 0x8", &[13], false, None, || unsafe { at_trap!([], ["int 0x8"], []) }),
        // SAFETY: as above.
        4 => run("int 0x12", &[13], false, None, || unsafe { at_trap!([], ["int 0x12"], []) }),
        // SAFETY: as above.
        5 => run("int 0xff", &[13], false, None, || unsafe { at_trap!([], ["int 0xff"], []) }),
        // SAFETY: as above.
        6 => run("int 0x0", &[13], false, None, || unsafe { at_trap!([], ["int 0x0"], []) }),
        // SAFETY: as above.
        7 => run("int 0x1", &[13], false, None, || unsafe { at_trap!([], ["int 0x1"], []) }),
        // SAFETY: as above.
        _ => run("int 0xe", &[13], false, None, || unsafe { at_trap!([], ["int 0xe"], []) }),
    }
}

/// SGDT, SIDT, SLDT, STR, SMSW: #GP with UMIP, harmless without.
fn descriptor_store(rng: &mut Rng) {
    let mut buf = [0u8; 16];
    let p = buf.as_mut_ptr();
    // SAFETY, for each: the store goes to `buf` (16 bytes, ours) or to a
    // declared register, or UMIP turns it into #GP.
    match rng.below(5) {
        // SAFETY: as above.
        0 => run("sgdt", &[13], true, None, || unsafe { at_trap!([], ["sgdt [{p}]"], [], p = in(reg) p) }),
        // SAFETY: as above.
        1 => run("sidt", &[13], true, None, || unsafe { at_trap!([], ["sidt [{p}]"], [], p = in(reg) p) }),
        // SAFETY: as above.
        2 => run("sldt", &[13], true, None, || unsafe { at_trap!([], ["sldt {v:x}"], [], v = out(reg) _) }),
        // SAFETY: as above.
        3 => run("str", &[13], true, None, || unsafe { at_trap!([], ["str {v:x}"], [], v = out(reg) _) }),
        // SAFETY: as above.
        _ => run("smsw", &[13], true, None, || unsafe { at_trap!([], ["smsw {v:e}"], [], v = out(reg) _) }),
    }
    core::hint::black_box(&buf);
}

/// Loads a random selector into DS, ES, FS or GS: #GP (or #NP) for most,
/// fine for null and the user segments; the host puts null selectors back
/// at the next exit anyway.
fn segment_load(rng: &mut Rng) {
    let sel = if rng.chance(250) {
        rng.below(0x1_0000)
    } else {
        rng.pick(&[0u64, 3, 0x2b, 0x33, 0x23, 0x08, 0x10, 0x18, 0x40, 0x50, 0xfffc])
    };
    // SAFETY, for each: a segment load either faults (#GP or #NP with the
    // selector) or succeeds; 64-bit code ignores the DS and ES bases, and
    // nothing in this guest uses FS or GS.
    match rng.below(4) {
        // SAFETY: as above.
        0 => run("mov ds", &[13, 11], true, None, || unsafe { at_trap!([], ["mov ds, {s:e}"], [], s = in(reg) sel) }),
        // SAFETY: as above.
        1 => run("mov es", &[13, 11], true, None, || unsafe { at_trap!([], ["mov es, {s:e}"], [], s = in(reg) sel) }),
        // SAFETY: as above.
        2 => run("mov fs", &[13, 11], true, None, || unsafe { at_trap!([], ["mov fs, {s:e}"], [], s = in(reg) sel) }),
        // SAFETY: as above.
        _ => run("mov gs", &[13, 11], true, None, || unsafe { at_trap!([], ["mov gs, {s:e}"], [], s = in(reg) sel) }),
    }
}

/// POPF with IOPL 3 and IF clear must change neither (CPL 3): CLI still
/// raises #GP, and the hardware flags read back with IF set, IOPL 0.
fn iopl_popf(rng: &mut Rng) {
    let want = (rng.next() & 0xcd5) | IOPL;
    let mut flags = 0u64;
    let p = &mut flags as *mut u64;
    // SAFETY: POPFQ at CPL 3 ignores IF and IOPL; then CLI raises #GP and
    // the handler resumes at `2:`, where the flags are stored to `flags`
    // (ours) and DF is cleared.
    run("popf iopl 3; cli", &[13], false, None, || unsafe {
        at_trap!(["push {w}", "popfq"], ["cli"], ["pushfq", "pop qword ptr [{p}]", "cld"], w = in(reg) want, p = in(reg) p)
    });
    if flags & X86_EFLAGS_IF == 0 || flags & IOPL != 0 {
        fail(format_args!("after popf with IOPL 3 and IF 0 the flags are {flags:#x}"));
    }
}

/// The fatal traps: `(vector whose handler is removed, expected kill
/// reason, the instruction)`. Each announces itself, removes the handler
/// with `LHCALL_LOAD_IDT_ENTRY(vector, 0, ...)` and traps: the host must
/// kill the guest.
pub fn fatal(rng: &mut Rng) -> ! {
    let (vector, reason): (u64, &str) = match rng.below(7) {
        0 => (3, "unhandled trap: #BP breakpoint (vector 3, error 0x0)"),
        1 => (6, "unhandled trap: #UD invalid opcode (vector 6, error 0x0)"),
        2 => (0, "unhandled trap: #DE divide error (vector 0, error 0x0)"),
        3 => (13, "unhandled trap: #GP general protection (vector 13, error 0x0)"),
        4 => (4, "unhandled trap: #OF overflow (vector 4, error 0x0)"),
        5 => (1, "unhandled trap: #DB debug (vector 1, error 0x0)"),
        _ => (14, ""),
    };
    let addr = rng.below(0x10_0000) & !7;
    let gate = interrupts::gate_type(vector as u8);
    crate::hc::hcall(rng, lguest_guest::abi::LHCALL_LOAD_IDT_ENTRY, [vector, 0, gate, 0]);
    if vector == 14 {
        crate::announce(
            format_args!("read of {addr:#x} with no page-fault handler"),
            format_args!("page fault at {addr:#x} (error 0x0)"),
        );
    } else {
        crate::announce(format_args!("vector {vector} with no handler"), format_args!("{reason}"));
    }
    // SAFETY, for each: as in `random`; without a handler the host kills
    // the guest, and if it does not, the instruction is harmless.
    match vector {
        // SAFETY: as above.
        3 => unsafe { at_trap!([], ["int3"], []) },
        // SAFETY: as above.
        6 => unsafe { at_trap!([], ["ud2"], []) },
        // SAFETY: as above.
        0 => unsafe {
            at_trap!(["xor ecx, ecx"], ["div rcx"], [], inout("rax") 1u64 => _, inout("rdx") 0u64 => _, out("rcx") _)
        },
        // SAFETY: as above.
        13 => unsafe { at_trap!([], ["cli"], []) },
        // SAFETY: as above.
        4 => unsafe { at_trap!([], ["int 4"], []) },
        // SAFETY: as above.
        1 => unsafe {
            at_trap!(
                ["pushfq", "or qword ptr [rsp], 0x100", "popfq"],
                ["nop"],
                ["pushfq", "and qword ptr [rsp], -0x101", "popfq"]
            )
        },
        _ => {
            read(addr);
        }
    }
    fail(format_args!("survived: vector {vector} with no handler"))
}
