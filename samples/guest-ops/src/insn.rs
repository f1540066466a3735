// SPDX-License-Identifier: GPL-2.0
//! The instruction actions of `guest-ops`: each executes one instruction that
//! a ring-3 guest may not, or should not, execute, exactly once, with inline
//! asm (the compiler emits none of them by itself).
//!
//! Every action first prints `guest-ops: <name>: executing <instruction>`;
//! if execution comes back, it prints what it got, then
//! `guest-ops: <name>: survived`, and powers off with that message.
//!
//! Safety, for all of them: in ring 3 each instruction either traps to the
//! host (which kills the guest or reflects the trap, which kills it too: the
//! guest has no handlers) or does something harmless to this program; the
//! registers each may change are declared, and the instructions that enter
//! the host are not marked `nomem`, since the host may touch guest memory.

use core::arch::asm;
use core::fmt;

use lguest_guest::{crash_fmt, poweroff_fmt, println};

/// One instruction action.
pub struct Insn {
    /// The action's name (the command-line word).
    pub name: &'static str,
    /// The instruction, for the console.
    what: &'static str,
    /// Executes it, and prints anything it produced.
    run: fn(&str),
}

/// `IA32_EFER`, the MSR `rdmsr` and `wrmsr` aim at.
const MSR_EFER: u32 = 0xc000_0080;

/// What `writeswitcher` writes: "lguest!!" in ASCII.
const POISON: u64 = 0x2121_7473_6575_676c;

const INSNS: &[Insn] = &[
    Insn { name: "cli", what: "cli", run: cli },
    Insn { name: "sti", what: "sti", run: sti },
    Insn { name: "hlt", what: "hlt", run: hlt },
    Insn { name: "readcr3", what: "mov %cr3,%rax", run: readcr3 },
    Insn { name: "writecr3", what: "mov %rax,%cr3 (rax = 0)", run: writecr3 },
    Insn { name: "in", what: "inb $0x80,%al", run: inb },
    Insn { name: "inl", what: "inl %dx,%eax (dx = 0x70, rax = -1 << 40)", run: inl },
    Insn { name: "out", what: "outb %al,$0x80", run: outb },
    Insn { name: "readcr0", what: "mov %cr0,%r9", run: readcr0 },
    Insn { name: "readcr4", what: "mov %cr4,%rax", run: readcr4 },
    Insn { name: "readcr8", what: "mov %cr8,%rax", run: readcr8 },
    Insn { name: "wbinvd", what: "wbinvd", run: wbinvd },
    Insn { name: "xsetbv", what: "xsetbv (XCR0 = x87|SSE)", run: xsetbv },
    Insn { name: "xsetbad", what: "xsetbv (XCR0 = 0)", run: xsetbad },
    Insn { name: "wrmsr", what: "wrmsr (ecx = 0xc0000080, edx:eax = 0)", run: wrmsr },
    Insn { name: "rdmsr", what: "rdmsr (ecx = 0xc0000080)", run: rdmsr },
    Insn { name: "sgdt", what: "sgdt (to the stack)", run: sgdt },
    Insn { name: "sidt", what: "sidt (to the stack)", run: sidt },
    Insn { name: "syscall", what: "syscall", run: syscall },
    Insn { name: "sysenter", what: "sysenter", run: sysenter },
    Insn { name: "int80", what: "int $0x80", run: int80 },
    Insn { name: "int3", what: "int3", run: int3 },
    Insn { name: "ud2", what: "ud2", run: ud2 },
    Insn { name: "fpu", what: "fninit (x87)", run: fpu },
    Insn { name: "sse", what: "xorps %xmm0,%xmm0 (SSE)", run: sse },
    Insn { name: "cpuid", what: "cpuid (leaves 0x40000000 and 1, with the emulation prefix, then plain)", run: cpuid },
    Insn { name: "badprefix", what: "the emulation prefix before a nop", run: badprefix },
    Insn { name: "readnull", what: "mov (0),%rax", run: readnull },
    Insn { name: "divzero", what: "div %rcx (rcx = 0)", run: divzero },
];

/// The instruction action called `name`.
pub fn find(name: &str) -> Option<&'static Insn> {
    INSNS.iter().find(|i| i.name == name)
}

/// Displays the names of all instruction actions, separated by `|`.
pub struct Names;

impl fmt::Display for Names {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (n, insn) in INSNS.iter().enumerate() {
            let sep = if n == 0 { "" } else { " | " };
            write!(f, "{sep}{}", insn.name)?;
        }
        Ok(())
    }
}

/// Runs `insn` between the two console lines.
pub fn execute(insn: &Insn) -> ! {
    println!("guest-ops: {}: executing {}", insn.name, insn.what);
    (insn.run)(insn.name);
    survived(insn.name)
}

/// Execution came back: say so and power off.
fn survived(name: &str) -> ! {
    println!("guest-ops: {name}: survived");
    poweroff_fmt(format_args!("guest-ops: {name}: survived"))
}

fn cli(_: &str) {
    // SAFETY: see the module documentation; `cli` touches only IF.
    unsafe { asm!("cli", options(nomem, nostack)) }
}

fn sti(_: &str) {
    // SAFETY: see the module documentation; `sti` touches only IF.
    unsafe { asm!("sti", options(nomem, nostack)) }
}

fn hlt(_: &str) {
    // SAFETY: see the module documentation; `hlt` changes no state.
    unsafe { asm!("hlt", options(nomem, nostack)) }
}

fn readcr3(name: &str) {
    let cr3: u64;
    // SAFETY: see the module documentation; only the output register changes.
    unsafe { asm!("mov {}, cr3", out(reg) cr3, options(nomem, nostack)) }
    println!("guest-ops: {name}: cr3 = {cr3:#x}");
}

fn writecr3(_: &str) {
    // SAFETY: see the module documentation; at CPL 3 this always faults.
    unsafe { asm!("mov cr3, {}", in(reg) 0u64, options(nostack)) }
}

fn inb(name: &str) {
    let value: u8;
    // SAFETY: see the module documentation; port 0x80 is the POST port.
    unsafe { asm!("in al, 0x80", out("al") value, options(nomem, nostack)) }
    println!("guest-ops: {name}: read {value:#x}");
}

fn inl(name: &str) {
    let value: u64;
    // SAFETY: see the module documentation; port 0x70 is the CMOS index.
    // A 32-bit IN clears the upper half of RAX.
    unsafe { asm!("in eax, dx", in("dx") 0x70u16, inout("rax") u64::MAX << 40 => value, options(nomem, nostack)) }
    println!("guest-ops: {name}: read {value:#x}");
}

fn readcr0(name: &str) {
    let cr0: u64;
    // SAFETY: see the module documentation; only the output register
    // changes (R9: a REX-prefixed form).
    unsafe { asm!("mov r9, cr0", out("r9") cr0, options(nomem, nostack)) }
    println!("guest-ops: {name}: cr0 = {cr0:#x}");
}

fn readcr4(name: &str) {
    let cr4: u64;
    // SAFETY: see the module documentation; only the output register changes.
    unsafe { asm!("mov rax, cr4", out("rax") cr4, options(nomem, nostack)) }
    println!("guest-ops: {name}: cr4 = {cr4:#x}");
}

fn readcr8(name: &str) {
    let cr8: u64;
    // SAFETY: see the module documentation; only the output register changes.
    unsafe { asm!("mov rax, cr8", out("rax") cr8, options(nomem, nostack)) }
    println!("guest-ops: {name}: cr8 = {cr8:#x}");
}

/// CPUID of `leaf` (subleaf 0) behind the forced-emulation prefix.
fn cpuid_prefixed(leaf: u32) -> [u32; 4] {
    lguest_guest::paravirt::cpuid(leaf, 0)
}

/// The 12 bytes of EBX, ECX, EDX, non-printable ones as dots.
fn vendor(v: [u32; 4]) -> [u8; 12] {
    let mut s = [0u8; 12];
    for (i, w) in v[1..].iter().enumerate() {
        for (j, b) in w.to_le_bytes().into_iter().enumerate() {
            s[4 * i + j] = if b.is_ascii_graphic() { b } else { b'.' };
        }
    }
    s
}

fn cpuid(name: &str) {
    let hv = cpuid_prefixed(0x4000_0000);
    let v = vendor(hv);
    let v = core::str::from_utf8(&v).unwrap_or("?");
    println!("guest-ops: {name}: prefixed 0x40000000: eax {:#x} vendor {v}", hv[0]);
    let l1 = cpuid_prefixed(1);
    println!("guest-ops: {name}: prefixed 1: ecx {:#x} edx {:#x}", l1[2], l1[3]);
    let plain = core::arch::x86_64::__cpuid_count(1, 0);
    println!("guest-ops: {name}: plain 1: ecx {:#x} edx {:#x}", plain.ecx, plain.edx);
}

fn badprefix(_: &str) {
    // SAFETY: see the module documentation; the prefix's ud2 is a #UD the
    // host does not emulate (no cpuid follows), so the guest is killed.
    unsafe { asm!(".byte 0x0f, 0x0b, 0x6c, 0x67, 0x75", "nop", options(nomem, nostack)) }
}

fn wbinvd(_: &str) {
    // SAFETY: see the module documentation; at CPL 3 this faults.
    unsafe { asm!("wbinvd", options(nomem, nostack)) }
}

fn xsetbv(name: &str) {
    // SAFETY: see the module documentation; at CPL 3 this faults (the host
    // emulates it; the CPU's XCR0 does not change).
    unsafe { asm!("xsetbv", in("ecx") 0u32, in("eax") 3u32, in("edx") 0u32, options(nomem, nostack)) }
    println!("guest-ops: {name}: XCR0 set to 0x3");
}

fn xsetbad(_: &str) {
    // SAFETY: as in `xsetbv`; XCR0 without x87 is #GP on hardware too.
    unsafe { asm!("xsetbv", in("ecx") 0u32, in("eax") 0u32, in("edx") 0u32, options(nomem, nostack)) }
}

fn outb(_: &str) {
    // SAFETY: see the module documentation; port 0x80 is the POST port.
    unsafe { asm!("out 0x80, al", in("al") 0u8, options(nomem, nostack)) }
}

fn wrmsr(_: &str) {
    // SAFETY: see the module documentation; WRMSR always faults at CPL 3.
    unsafe { asm!("wrmsr", in("ecx") MSR_EFER, in("eax") 0u32, in("edx") 0u32, options(nostack)) }
}

fn rdmsr(name: &str) {
    let (lo, hi): (u32, u32);
    // SAFETY: see the module documentation; only EAX and EDX change.
    unsafe { asm!("rdmsr", in("ecx") MSR_EFER, out("eax") lo, out("edx") hi, options(nomem, nostack)) }
    println!("guest-ops: {name}: EFER = {:#x}", (u64::from(hi) << 32) | u64::from(lo));
}

/// Prints the 10-byte descriptor-table register image `sgdt`/`sidt` stored.
fn print_dtr(name: &str, dtr: &[u8; 10]) {
    let limit = u16::from_le_bytes([dtr[0], dtr[1]]);
    let mut base = [0u8; 8];
    base.copy_from_slice(&dtr[2..]);
    println!("guest-ops: {name}: base {:#x} limit {limit:#x}", u64::from_le_bytes(base));
}

fn sgdt(name: &str) {
    let mut dtr = [0u8; 10];
    // SAFETY: see the module documentation; `sgdt` stores 10 bytes at the
    // address given, which is `dtr`, ours and 10 bytes long.
    unsafe { asm!("sgdt [{}]", in(reg) dtr.as_mut_ptr(), options(nostack)) }
    print_dtr(name, &dtr);
}

fn sidt(name: &str) {
    let mut dtr = [0u8; 10];
    // SAFETY: as in `sgdt`, for `sidt`.
    unsafe { asm!("sidt [{}]", in(reg) dtr.as_mut_ptr(), options(nostack)) }
    print_dtr(name, &dtr);
}

fn syscall(_: &str) {
    // SAFETY: see the module documentation; SYSCALL overwrites RCX and R11,
    // and whatever the host does with it may change any caller-saved
    // register, all of which are declared clobbered.
    unsafe { asm!("syscall", clobber_abi("C")) }
}

fn sysenter(_: &str) {
    // SAFETY: as in `syscall`, for SYSENTER (a #UD on AMD in long mode).
    unsafe { asm!("sysenter", clobber_abi("C")) }
}

fn int80(_: &str) {
    // SAFETY: as in `syscall`, for the legacy system-call gate.
    unsafe { asm!("int 0x80", clobber_abi("C")) }
}

fn int3(_: &str) {
    // SAFETY: see the module documentation; a breakpoint trap.
    unsafe { asm!("int3") }
}

fn ud2(_: &str) {
    // SAFETY: see the module documentation; an invalid-opcode trap.
    unsafe { asm!("ud2") }
}

fn fpu(_: &str) {
    // SAFETY: see the module documentation; with CR0.TS set it raises #NM;
    // if it ran, it would only reset the x87 state, which nothing here uses.
    unsafe { asm!("fninit", options(nomem, nostack)) }
}

fn sse(_: &str) {
    // SAFETY: see the module documentation; with CR0.TS set it raises #NM;
    // if it ran, it would only zero XMM0, which nothing here uses (SSE is
    // off for this target, so XMM0 cannot even be named as a clobber).
    unsafe { asm!("xorps xmm0, xmm0", options(nomem, nostack)) }
}

fn readnull(name: &str) {
    let value: u64;
    // SAFETY: see the module documentation; address 0 is not mapped (the
    // first MiB never is), so this faults; no Rust object lives there.
    unsafe { asm!("mov {}, [{}]", lateout(reg) value, in(reg) 0u64, options(nostack, readonly)) }
    println!("guest-ops: {name}: read {value:#x}");
}

fn divzero(_: &str) {
    // SAFETY: see the module documentation; DIV by zero raises #DE; only
    // RAX and RDX (and RCX, zeroed first) change.
    unsafe {
        asm!(
            "xor ecx, ecx",
            "div rcx",
            inout("rax") 1u64 => _,
            inout("rdx") 0u64 => _,
            out("rcx") _,
            options(nomem, nostack),
        )
    }
}

/// `readswitcher ADDR`: reads the u64 at `addr`.
pub fn read_at(name: &str, addr: u64) -> ! {
    println!("guest-ops: {name}: executing mov ({addr:#x}),%rax");
    let value: u64;
    // SAFETY: see the module documentation; a read of any address either
    // faults or returns a value; it is asm, so it makes no claim about Rust
    // objects.
    unsafe { asm!("mov {}, [{}]", lateout(reg) value, in(reg) addr, options(nostack, readonly)) }
    println!("guest-ops: {name}: read {value:#x}");
    survived(name)
}

/// `writeswitcher ADDR`: writes [`POISON`] to the u64 at `addr`, which must
/// not be in the guest image (which holds every Rust object, stack included).
pub fn write_at(name: &str, addr: u64) -> ! {
    let image = lguest_guest::start::image();
    if addr.saturating_add(8) > image.start && addr < image.end {
        crash_fmt(format_args!("guest-ops: {name}: {addr:#x} is inside the guest image {image:#x?}"));
    }
    println!("guest-ops: {name}: executing mov %rax,({addr:#x}) (rax = {POISON:#x})");
    // SAFETY: see the module documentation; `addr` is outside the guest image
    // (checked above), so no Rust object is overwritten: it faults, or it
    // changes memory this program never uses.
    unsafe { asm!("mov [{}], {}", in(reg) addr, in(reg) POISON, options(nostack)) }
    survived(name)
}
