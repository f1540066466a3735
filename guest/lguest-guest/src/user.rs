// SPDX-License-Identifier: GPL-2.0
//! Guest user mode: running code in a user address space, system calls
//! (`int $0x80`), and the exceptions it raises.
//!
//! # Entering and leaving
//!
//! [`run`] saves the kernel's callee-saved registers and stack pointer,
//! loads every user register from a [`UserRegs`], pushes an
//! `LguestIretUser` frame (RAX, RIP, RFLAGS, RSP) and makes
//! `LHCALL_IRET_USER` with RSP pointing at it: the host switches to the
//! user shadow table of the active root (only pages with U/S at every
//! level) and runs the code with virtual interrupts on.
//!
//! Anything that happens in user mode (an interrupt, an exception, a system
//! call, a hypercall attempt, which the host turns into #GP with error code
//! `0x1f << 3 | 2 = 0xfa`) is delivered to the guest kernel's handler on the
//! kernel stack set with `LHCALL_SET_STACK` ([`init`] gives it a static
//! 32 KiB stack), in a frame whose CS is `LGUEST_USER_CS`
//! ([`TrapFrame::from_user`]). The library's return path notices that CS
//! and goes back with `LHCALL_IRET_USER` instead of `iretq`, after
//! restoring every register from the frame; so a handler may simply
//! return (after changing the frame if it likes), and an interrupt in user
//! mode is transparent to the user code.
//!
//! A handler ends the user program with [`exit`]: it abandons the kernel
//! stack and returns from [`run`] in the kernel context that called it,
//! with the reason and the user's registers ([`last_regs`]).
//!
//! # System calls
//!
//! `int $0x80` (IDT entry [`LGUEST_SYSCALL_VECTOR`], a trap gate) or the
//! `syscall` instruction (through the host, [`set_syscall_entry`]), with
//! the number in RAX and arguments in RDI, RSI, RDX, R10, result in RAX,
//! every other register preserved (except that `syscall`, as on hardware,
//! leaves the return address in RCX and the RFLAGS in R11). [`set_syscalls`] installs a table of
//! [`Syscall`] functions indexed by number; unknown numbers return
//! [`ENOSYS`]. [`DEFAULT_SYSCALLS`]: [`SYS_EXIT`] (ends [`run`] with
//! `Exit::Exited(rdi)`), [`SYS_WRITE`] (prints `rsi` bytes at user address
//! `rdi` on the console, after checking that every page is mapped for
//! user mode; returns the count) and [`SYS_COUNTER`] (returns how many
//! times it was called).
//!
//! # Exceptions
//!
//! [`init`] puts a handler on every exception vector the host delivers. For
//! an exception in user mode it first asks the hook of [`set_fault_hook`]
//! (which may fix things up and resume) and otherwise kills the program:
//! [`run`] returns [`Exit::Killed`] with vector, error code, `cr2` and RIP.
//! A page fault from user mode has the U bit (4) in its error code, one
//! from kernel mode does not. In kernel mode, a fault inside
//! [`crate::paging::probe`] is reported to the probe; anything else crashes
//! the guest with the details.

use core::arch::global_asm;
use core::mem::offset_of;
use core::ptr;
use core::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

pub use lguest_abi::{LGUEST_BASE_FS, LGUEST_BASE_GS, LGUEST_BASE_USER_GS};
use lguest_abi::{
    LGUEST_GUEST_SS, LGUEST_SYSCALL_DIRECT, LGUEST_SYSCALL_VECTOR, LGUEST_USER_CS, LHCALL_IRET_USER,
    LHCALL_LOAD_IDT_ENTRY, LHCALL_SET_SEGMENT_BASE, LHCALL_SET_STACK, LHCALL_SET_SYSCALL,
};

use crate::cell::GuestCell;
use crate::hcall::hcall;
use crate::interrupts::{self, TrapFrame, EXCEPTION_VECTORS, PAGE_FAULT};
use crate::paging::{self, PAGE_SIZE, USER_END, USER_START};
use crate::{crash_fmt, data, paravirt, print};

/// System call: end the program; RDI is the exit code.
pub const SYS_EXIT: u64 = 0;
/// System call: write RSI bytes at RDI to the console; returns the count.
pub const SYS_WRITE: u64 = 1;
/// System call: returns the number of `SYS_COUNTER` calls before this one.
pub const SYS_COUNTER: u64 = 2;
/// The result of an unknown system call (`-ENOSYS`).
pub const ENOSYS: u64 = -38i64 as u64;
/// The result of a system call with a bad buffer (`-EFAULT`).
pub const EFAULT: u64 = -14i64 as u64;
/// The error code of the #GP a hypercall from user mode becomes.
pub const HCALL_GP_ERROR: u64 = (lguest_abi::LGUEST_TRAP_ENTRY as u64) << 3 | 2;
/// Bytes of the kernel stack for entries from user mode.
pub const KERNEL_STACK_SIZE: usize = 32 * 1024;
/// User RFLAGS to start with: only the reserved bit 1 (IF is implied).
pub const USER_RFLAGS: u64 = 0x2;

/// The registers of user code.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UserRegs {
    /// General registers.
    pub rax: u64,
    /// General registers.
    pub rbx: u64,
    /// General registers.
    pub rcx: u64,
    /// General registers.
    pub rdx: u64,
    /// General registers.
    pub rsi: u64,
    /// General registers.
    pub rdi: u64,
    /// General registers.
    pub rbp: u64,
    /// General registers.
    pub r8: u64,
    /// General registers.
    pub r9: u64,
    /// General registers.
    pub r10: u64,
    /// General registers.
    pub r11: u64,
    /// General registers.
    pub r12: u64,
    /// General registers.
    pub r13: u64,
    /// General registers.
    pub r14: u64,
    /// General registers.
    pub r15: u64,
    /// Where the code starts (a user address).
    pub rip: u64,
    /// Its flags (arithmetic flags, DF, TF, AC; IF is implied).
    pub rflags: u64,
    /// Its stack pointer (a user address).
    pub rsp: u64,
}

impl UserRegs {
    /// Registers for code at `rip` with stack `rsp`, everything else 0.
    pub const fn new(rip: u64, rsp: u64) -> Self {
        Self {
            rax: 0,
            rbx: 0,
            rcx: 0,
            rdx: 0,
            rsi: 0,
            rdi: 0,
            rbp: 0,
            r8: 0,
            r9: 0,
            r10: 0,
            r11: 0,
            r12: 0,
            r13: 0,
            r14: 0,
            r15: 0,
            rip,
            rflags: USER_RFLAGS,
            rsp,
        }
    }

    /// The user registers in a frame from user mode.
    pub fn from_frame(f: &TrapFrame) -> Self {
        Self {
            rax: f.rax,
            rbx: f.rbx,
            rcx: f.rcx,
            rdx: f.rdx,
            rsi: f.rsi,
            rdi: f.rdi,
            rbp: f.rbp,
            r8: f.r8,
            r9: f.r9,
            r10: f.r10,
            r11: f.r11,
            r12: f.r12,
            r13: f.r13,
            r14: f.r14,
            r15: f.r15,
            rip: f.rip,
            rflags: f.rflags,
            rsp: f.rsp,
        }
    }
}

impl UserRegs {
    /// Puts these registers into a frame from user mode, so that the
    /// return from the handler resumes them (a context switch).
    pub fn to_frame(&self, f: &mut TrapFrame) {
        f.rax = self.rax;
        f.rbx = self.rbx;
        f.rcx = self.rcx;
        f.rdx = self.rdx;
        f.rsi = self.rsi;
        f.rdi = self.rdi;
        f.rbp = self.rbp;
        f.r8 = self.r8;
        f.r9 = self.r9;
        f.r10 = self.r10;
        f.r11 = self.r11;
        f.r12 = self.r12;
        f.r13 = self.r13;
        f.r14 = self.r14;
        f.r15 = self.r15;
        f.rip = self.rip;
        f.rflags = self.rflags;
        f.rsp = self.rsp;
    }
}

/// How a user program ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exit {
    /// It called [`SYS_EXIT`] (or a handler called [`exit`] with this).
    Exited(u64),
    /// It was killed for an exception.
    Killed {
        /// The vector.
        vector: u64,
        /// The error code.
        error: u64,
        /// `lguest_data.cr2` (meaningful for a page fault).
        cr2: u64,
        /// Where it happened.
        rip: u64,
    },
}

/// A system call: gets the user's frame (number in RAX, arguments in RDI,
/// RSI, RDX, R10), returns the result for RAX. It may also call [`exit`].
pub type Syscall = fn(&mut TrapFrame) -> u64;

/// A hook for exceptions in user mode: gets the frame and `cr2`, returns
/// true to resume the program (with the frame as the hook left it), false
/// to kill it.
pub type FaultHook = fn(&mut TrapFrame, u64) -> bool;

/// The system calls [`init`] installs.
pub static DEFAULT_SYSCALLS: [Syscall; 3] = [sys_exit, sys_write, sys_counter];

/// The system-call table: a `&'static [Syscall]` as (address, length).
static SYSCALLS: AtomicUsize = AtomicUsize::new(0);
static NR_SYSCALLS: AtomicUsize = AtomicUsize::new(0);
/// The fault hook (0: none), a `FaultHook` as usize.
static FAULT_HOOK: AtomicUsize = AtomicUsize::new(0);
/// System calls made.
static SYSCALL_COUNT: AtomicU64 = AtomicU64::new(0);
/// `SYS_COUNTER` calls made.
static COUNTER: AtomicU64 = AtomicU64::new(0);

/// The kernel stack of entries from user mode.
#[repr(C, align(16))]
struct KernelStack([u8; KERNEL_STACK_SIZE]);
static KERNEL_STACK: GuestCell<KernelStack> = GuestCell::new(KernelStack([0; KERNEL_STACK_SIZE]));

/// The user RSP at a direct `syscall`, while its entry switches stacks.
static DIRECT_USER_RSP: AtomicU64 = AtomicU64::new(0);

/// The kernel context [`run`] saved: its stack pointer (0: not in [`run`]).
static KERNEL_RSP: AtomicU64 = AtomicU64::new(0);
/// How the program ended, for [`run`] (written by [`exit`]).
static EXIT: GuestCell<Option<Exit>> = GuestCell::new(None);
/// The user's registers when it last left user mode for good.
static LAST_REGS: GuestCell<UserRegs> = GuestCell::new(UserRegs::new(0, 0));
/// Whether [`init`] ran.
static READY: AtomicBool = AtomicBool::new(false);

// `lguest_user_enter(regs, saved_rsp)`: saves the callee-saved registers
// on the current stack and the stack pointer in `*saved_rsp`, loads the
// user registers from `regs` and makes LHCALL_IRET_USER with the frame on
// the current stack. It "returns" when `lguest_user_leave(rsp)` switches
// back to the saved stack and pops the registers.
//
// `lguest_syscall_entry`: the IDT entry of `int $0x80`. It builds a
// TrapFrame exactly like the library's stubs (error 0, vector 0x80, the 15
// registers), calls `syscall_dispatch` and leaves through
// `lguest_user_return` (interrupts.rs): LHCALL_IRET_USER, the direct
// return, or with Linux frames LHCALL_IRET.
// Alignment as in interrupts.rs: the host leaves RSP at 16n - 40, two
// pushes and 15 more make it 16n - 176.
global_asm!(
    ".pushsection .text.lguest_user, \"ax\", @progbits",
    ".balign 16",
    ".globl lguest_user_enter",
    ".type lguest_user_enter, @function",
    "lguest_user_enter:",
    "    pushq %rbp",
    "    pushq %rbx",
    "    pushq %r12",
    "    pushq %r13",
    "    pushq %r14",
    "    pushq %r15",
    "    movq %rsp, (%rsi)",
    "    subq $32, %rsp",
    "    movq {rax}(%rdi), %rax",
    "    movq %rax, 0(%rsp)",
    "    movq {rip}(%rdi), %rax",
    "    movq %rax, 8(%rsp)",
    "    movq {rflags}(%rdi), %rax",
    "    movq %rax, 16(%rsp)",
    "    movq {rsp}(%rdi), %rax",
    "    movq %rax, 24(%rsp)",
    "    movq {rbx}(%rdi), %rbx",
    "    movq {rcx}(%rdi), %rcx",
    "    movq {rdx}(%rdi), %rdx",
    "    movq {rsi}(%rdi), %rsi",
    "    movq {rbp}(%rdi), %rbp",
    "    movq {r8}(%rdi), %r8",
    "    movq {r9}(%rdi), %r9",
    "    movq {r10}(%rdi), %r10",
    "    movq {r11}(%rdi), %r11",
    "    movq {r12}(%rdi), %r12",
    "    movq {r13}(%rdi), %r13",
    "    movq {r14}(%rdi), %r14",
    "    movq {r15}(%rdi), %r15",
    "    movq {rdi}(%rdi), %rdi",
    "    movl ${iret_user}, %eax",
    "    int $0x1f",
    "    ud2",
    ".size lguest_user_enter, . - lguest_user_enter",
    "",
    ".balign 16",
    ".globl lguest_user_leave",
    ".type lguest_user_leave, @function",
    "lguest_user_leave:",
    "    movq %rdi, %rsp",
    "    popq %r15",
    "    popq %r14",
    "    popq %r13",
    "    popq %r12",
    "    popq %rbx",
    "    popq %rbp",
    "    ret",
    ".size lguest_user_leave, . - lguest_user_leave",
    "",
    ".balign 16",
    ".globl lguest_syscall_entry",
    ".type lguest_syscall_entry, @function",
    "lguest_syscall_entry:",
    "    pushq $0",
    "    pushq ${vector}",
    "    pushq %rax",
    "    pushq %rbx",
    "    pushq %rcx",
    "    pushq %rdx",
    "    pushq %rsi",
    "    pushq %rdi",
    "    pushq %rbp",
    "    pushq %r8",
    "    pushq %r9",
    "    pushq %r10",
    "    pushq %r11",
    "    pushq %r12",
    "    pushq %r13",
    "    pushq %r14",
    "    pushq %r15",
    "    pushq $0",
    "    popfq",
    "    movq %rsp, %rbx",
    "    movq %rsp, %rdi",
    "    andq $-16, %rsp",
    "    call {dispatch}",
    "    movq %rbx, %rsp",
    "    jmp lguest_user_return",
    ".size lguest_syscall_entry, . - lguest_syscall_entry",
    "",
    // `lguest_syscall_direct`: the `syscall` entry of LGUEST_SYSCALL_DIRECT,
    // entered with the user's RSP, RCX and R11 as the instruction leaves
    // them and virtual interrupts off. It takes the kernel stack (always
    // empty when user mode calls) and pushes the frame the host would have
    // pushed for `int $0x80` from user mode, then joins that entry; the
    // return path sees RCX = RIP and R11 = RFLAGS and goes back with
    // `int $LGUEST_SYSRET_VECTOR` (interrupts.rs).
    ".balign 16",
    ".globl lguest_syscall_direct",
    ".type lguest_syscall_direct, @function",
    "lguest_syscall_direct:",
    "    movq %rsp, {user_rsp}(%rip)",
    "    leaq {stack}+{stack_size}(%rip), %rsp",
    "    pushq ${user_ss}",
    "    pushq {user_rsp}(%rip)",
    "    pushq %r11",
    "    pushq ${user_cs}",
    "    pushq %rcx",
    "    jmp lguest_syscall_entry",
    ".size lguest_syscall_direct, . - lguest_syscall_direct",
    ".popsection",
    rax = const offset_of!(UserRegs, rax),
    rbx = const offset_of!(UserRegs, rbx),
    rcx = const offset_of!(UserRegs, rcx),
    rdx = const offset_of!(UserRegs, rdx),
    rsi = const offset_of!(UserRegs, rsi),
    rdi = const offset_of!(UserRegs, rdi),
    rbp = const offset_of!(UserRegs, rbp),
    r8 = const offset_of!(UserRegs, r8),
    r9 = const offset_of!(UserRegs, r9),
    r10 = const offset_of!(UserRegs, r10),
    r11 = const offset_of!(UserRegs, r11),
    r12 = const offset_of!(UserRegs, r12),
    r13 = const offset_of!(UserRegs, r13),
    r14 = const offset_of!(UserRegs, r14),
    r15 = const offset_of!(UserRegs, r15),
    rip = const offset_of!(UserRegs, rip),
    rflags = const offset_of!(UserRegs, rflags),
    rsp = const offset_of!(UserRegs, rsp),
    iret_user = const LHCALL_IRET_USER,
    vector = const LGUEST_SYSCALL_VECTOR,
    dispatch = sym syscall_dispatch,
    user_rsp = sym DIRECT_USER_RSP,
    stack = sym KERNEL_STACK,
    stack_size = const KERNEL_STACK_SIZE,
    user_ss = const LGUEST_GUEST_SS,
    user_cs = const LGUEST_USER_CS,
    options(att_syntax),
);

extern "C" {
    fn lguest_user_enter(regs: *const UserRegs, saved_rsp: *mut u64);
    fn lguest_user_leave(rsp: u64) -> !;
    static lguest_syscall_entry: u8;
    static lguest_syscall_direct: u8;
}

/// Why [`init`] failed.
pub type Error = interrupts::Error;

/// Sets up user mode: the kernel stack (`LHCALL_SET_STACK`), the
/// system-call entry (IDT entry 0x80, a trap gate) with
/// [`DEFAULT_SYSCALLS`] unless a table was set, and a handler on every
/// exception vector (replacing any the guest set). The guest must run on
/// its own page tables ([`crate::paging`]) before [`run`].
pub fn init() -> Result<(), Error> {
    for &v in EXCEPTION_VECTORS {
        interrupts::set_trap_handler(v, exception)?;
    }
    interrupts::install()?;
    if SYSCALLS.load(Ordering::Relaxed) == 0 {
        set_syscalls(&DEFAULT_SYSCALLS);
    }
    // Virtual addresses: the host pushes frames and jumps there.
    let top = KERNEL_STACK.get() as u64 + KERNEL_STACK_SIZE as u64;
    let entry = ptr::addr_of!(lguest_syscall_entry) as u64;
    // SAFETY: the stack is a static used only for entries from user mode;
    // the entry is our code. Neither moves.
    unsafe {
        hcall(LHCALL_SET_STACK, top, 0, 0, 0);
        hcall(LHCALL_LOAD_IDT_ENTRY, u64::from(LGUEST_SYSCALL_VECTOR), entry, interrupts::GATE_TRAP, 0);
    }
    set_syscall_entry(true);
    READY.store(true, Ordering::Release);
    Ok(())
}

/// Registers (or, with `false`, removes) the entry of the `syscall`
/// instruction (`LHCALL_SET_SYSCALL`): the same stub as `int $0x80`, since
/// the host enters it with the same frame; RCX and R11 come in holding the
/// return address and the user RFLAGS, as hardware leaves them, and go back
/// to user mode so. Without it a user-mode `syscall` is #UD. [`init`]
/// registers it.
pub fn set_syscall_entry(on: bool) {
    let entry = if on { ptr::addr_of!(lguest_syscall_entry) as u64 } else { 0 };
    interrupts::set_direct_return(false);
    // SAFETY: the entry is our code, which does not move.
    unsafe { hcall(LHCALL_SET_SYSCALL, entry, 0, 0, 0) };
}

/// Registers the direct `syscall` entry ([`LGUEST_SYSCALL_DIRECT`]): the
/// switcher enters it without an exit, with the user's RSP, and system
/// calls go back to user mode with `int $LGUEST_SYSRET_VECTOR`, also
/// without an exit (where the host has FSGSBASE; through the host
/// elsewhere). The registers are the same as with [`set_syscall_entry`].
/// Not with Linux frames (the entry pushes the library's own user frame);
/// there it registers the ordinary entry.
pub fn set_syscall_direct() {
    if interrupts::linux_frames() {
        set_syscall_entry(true);
        return;
    }
    let entry = ptr::addr_of!(lguest_syscall_direct) as u64;
    interrupts::set_direct_return(true);
    // SAFETY: the entry is our code, which does not move; it keeps the
    // direct contract (it switches to the kernel stack before it pushes).
    unsafe { hcall(LHCALL_SET_SYSCALL, entry, LGUEST_SYSCALL_DIRECT, 0, 0) };
}

/// Sets a segment base with `LHCALL_SET_SEGMENT_BASE`: `which` is
/// [`LGUEST_BASE_FS`] (both modes), [`LGUEST_BASE_GS`] (this, the kernel's)
/// or [`LGUEST_BASE_USER_GS`] (user mode's, swapped in by the host at each
/// entry to user mode and out at each return to the kernel). `base` must be
/// canonical, or the host kills the guest. Where the host enables
/// FSGSBASE, `wrfsbase`/`wrgsbase` do the same for the current mode
/// without an exit.
pub fn set_segment_base(which: u64, base: u64) {
    // SAFETY: setting a base changes only how FS- or GS-relative accesses
    // resolve; this library makes none.
    unsafe { hcall(LHCALL_SET_SEGMENT_BASE, which, base, 0, 0) };
}

/// Installs the system-call table: number `n` calls `table[n]`.
pub fn set_syscalls(table: &'static [Syscall]) {
    NR_SYSCALLS.store(0, Ordering::Release);
    SYSCALLS.store(table.as_ptr() as usize, Ordering::Release);
    NR_SYSCALLS.store(table.len(), Ordering::Release);
}

/// Installs (or with `None` removes) the hook for exceptions in user mode.
pub fn set_fault_hook(hook: Option<FaultHook>) {
    FAULT_HOOK.store(hook.map_or(0, |h| h as usize), Ordering::Release);
}

/// System calls made so far.
pub fn syscalls() -> u64 {
    SYSCALL_COUNT.load(Ordering::Relaxed)
}

/// `SYS_COUNTER` calls made so far.
pub fn counter() -> u64 {
    COUNTER.load(Ordering::Relaxed)
}

/// The user's registers when the last [`run`] ended.
pub fn last_regs() -> UserRegs {
    // SAFETY: written only by `exit` while `run` waits, read here outside
    // of `run`: no overlapping access.
    unsafe { *LAST_REGS.get() }
}

/// Runs user code with `regs` in the active address space until it exits
/// or is killed. The virtual IF is as it was when this returns. Not
/// re-entrant: one user program at a time.
pub fn run(regs: &UserRegs) -> Exit {
    if !READY.load(Ordering::Acquire) || paging::active_root() == 0 {
        crash_fmt(format_args!("user: run() before user::init() and an active address space"));
    }
    if KERNEL_RSP.load(Ordering::Acquire) != 0 {
        crash_fmt(format_args!("user: run() while a user program runs"));
    }
    let flags = paravirt::save_fl();
    // SAFETY: no `run` is active (checked), so nothing else uses EXIT now.
    unsafe { *EXIT.get() = None };
    // SAFETY: `lguest_user_enter` keeps the C ABI: it returns (through
    // `lguest_user_leave`, called by `exit` on the kernel stack) with the
    // callee-saved registers and the stack pointer it saved, and nothing
    // of this frame is touched in between (user code cannot reach kernel
    // pages; the kernel stack is another static). `regs` is read before
    // the hypercall.
    unsafe { lguest_user_enter(regs, KERNEL_RSP.as_ptr()) };
    KERNEL_RSP.store(0, Ordering::Release);
    paravirt::restore_fl(flags);
    // SAFETY: `exit` wrote it before leaving; no handler runs `exit` now.
    unsafe { (*EXIT.get()).unwrap_or(Exit::Exited(u64::MAX)) }
}

/// Ends the running user program: [`run`] returns `how`. Called by a
/// system call or an exception handler with the frame from user mode;
/// the kernel stack it runs on is abandoned.
pub fn exit(frame: &TrapFrame, how: Exit) -> ! {
    let rsp = KERNEL_RSP.load(Ordering::Acquire);
    if rsp == 0 || !frame.from_user() {
        crash_fmt(format_args!("user: exit({how:?}) without a user program, at rip {:#x}", frame.rip));
    }
    // SAFETY: `run` is waiting in `lguest_user_enter`; nothing else
    // touches these until it returns.
    unsafe {
        *LAST_REGS.get() = UserRegs::from_frame(frame);
        *EXIT.get() = Some(how);
    }
    // SAFETY: `rsp` is what `lguest_user_enter` saved for this `run`; the
    // stack below it (the caller of `run`) is intact, since only the
    // kernel stack was used since.
    unsafe { lguest_user_leave(rsp) }
}

/// `int $0x80`: runs the system call in RAX.
extern "C" fn syscall_dispatch(frame: *mut TrapFrame) {
    // SAFETY: the entry stub passes the TrapFrame it just pushed on this
    // stack; nothing else refers to it.
    let frame = unsafe { &mut *frame };
    if !frame.from_user() {
        crash_fmt(format_args!("user: int $0x80 from kernel mode at rip {:#x}", frame.rip));
    }
    SYSCALL_COUNT.fetch_add(1, Ordering::Relaxed);
    let table = SYSCALLS.load(Ordering::Acquire) as *const Syscall;
    let n = NR_SYSCALLS.load(Ordering::Acquire);
    let nr = frame.rax;
    frame.rax = match usize::try_from(nr) {
        Ok(i) if i < n && !table.is_null() => {
            // SAFETY: `table` and `n` come from one `&'static [Syscall]`
            // (`set_syscalls` stores the length last and clears it first),
            // and `i < n`.
            let f = unsafe { *table.add(i) };
            f(frame)
        }
        _ => ENOSYS,
    };
}

/// The handler of every exception vector (see the module documentation).
fn exception(frame: &mut TrapFrame) {
    let cr2 = if frame.vector == u64::from(PAGE_FAULT) { data::cr2() } else { 0 };
    if frame.from_user() {
        let hook = FAULT_HOOK.load(Ordering::Acquire);
        if hook != 0 {
            // SAFETY: only `FaultHook`s cast to usize are stored.
            let hook = unsafe { core::mem::transmute::<usize, FaultHook>(hook) };
            if hook(frame, cr2) {
                return;
            }
        }
        let how = Exit::Killed { vector: frame.vector, error: frame.error, cr2, rip: frame.rip };
        exit(frame, how);
    }
    if paging::probe_fixup(frame, cr2) {
        return;
    }
    let vector = frame.vector;
    let name = u8::try_from(vector).map_or("?", interrupts::vector_name);
    crash_fmt(format_args!(
        "lguest-guest: kernel-mode {name} (vector {vector}) error {:#x} cr2 {cr2:#x} at rip {:#x} rsp {:#x}",
        frame.error, frame.rip, frame.rsp
    ))
}

/// Whether `[va, va + len)` is mapped for user mode in the active space;
/// calls `f` with each piece's guest-physical address and length.
pub fn user_range(va: u64, len: u64, mut f: impl FnMut(u64, u64)) -> bool {
    let Some(end) = va.checked_add(len) else { return false };
    if va < USER_START || end > USER_END {
        return false;
    }
    let root = paging::active_root();
    let mut at = va;
    while at < end {
        let Some(t) = paging::translate(root, at) else { return false };
        if !t.user {
            return false;
        }
        let n = (PAGE_SIZE - at % PAGE_SIZE).min(end - at);
        f(t.pa, n);
        at += n;
    }
    true
}

/// `SYS_EXIT(code)`.
pub fn sys_exit(frame: &mut TrapFrame) -> u64 {
    let code = frame.rdi;
    exit(frame, Exit::Exited(code))
}

/// `SYS_WRITE(buf, len)`: at most 4096 bytes, printed as text (bytes that
/// are not UTF-8 become `?`). `EFAULT` if any of it is not mapped for user
/// mode.
pub fn sys_write(frame: &mut TrapFrame) -> u64 {
    let (va, len) = (frame.rdi, frame.rsi.min(4096));
    if !user_range(va, len, |_, _| ()) {
        return EFAULT;
    }
    let mut buf = [0u8; 256];
    user_range(va, len, |pa, n| {
        let mut off = 0;
        while off < n {
            let k = (n - off).min(buf.len() as u64) as usize;
            // SAFETY: `pa..pa + n` is a user page of the active space in
            // guest RAM (checked by the walk), identity mapped for the
            // kernel; we only read it.
            unsafe { ptr::copy_nonoverlapping((pa + off) as *const u8, buf.as_mut_ptr(), k) };
            match core::str::from_utf8(&buf[..k]) {
                Ok(s) => print!("{s}"),
                Err(_) => {
                    for &b in &buf[..k] {
                        print!("{}", if b.is_ascii() { b as char } else { '?' });
                    }
                }
            }
            off += k as u64;
        }
    });
    len
}

/// `SYS_COUNTER()`.
pub fn sys_counter(_frame: &mut TrapFrame) -> u64 {
    COUNTER.fetch_add(1, Ordering::Relaxed)
}

/// The CS of a frame from user mode, re-exported for handlers.
pub const USER_CS: u64 = LGUEST_USER_CS;
