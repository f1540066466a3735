// SPDX-License-Identifier: GPL-2.0
//! Traps and interrupts: the guest's interrupt descriptor table, kept by the
//! host, and the entry stubs and paravirt `iret` behind it.
//!
//! # What the host does
//!
//! The guest tells the host, one vector at a time, where its handlers are:
//! `LHCALL_LOAD_IDT_ENTRY(vector, handler address, gate type)`, with gate
//! type [`GATE_INTERRUPT`] (0xE: the host clears the virtual IF,
//! `lguest_data.irq_enabled`, on delivery) or [`GATE_TRAP`] (0xF: it leaves
//! it alone). Vectors 2 (NMI), 8 (#DF), 18 (#MC) and 0x1F (the hypercall
//! gate) are refused, so are handlers that are not guest addresses (at or
//! above `lguest_data.reserve_mem` in the lower half, or below
//! `GUEST_UPPER_START` in the upper half); refused means the guest is
//! killed, so [`set_trap_handler`] only takes the vectors in
//! [`EXCEPTION_VECTORS`] and [`install`] checks the address.
//!
//! When the guest raises exception vector V and has an entry for it, the
//! host delivers it there; without one, the host kills the guest. IRQ `n`
//! (0..63) arrives at vector `32 + n` ([`FIRST_IRQ_VECTOR`]), never while
//! its bit in `lguest_data.blocked_interrupts` is set nor while the virtual
//! IF is off (see [`crate::paravirt`] for what happens then). Delivery
//! pushes, on the guest's *current* stack (in guest kernel mode; from
//! guest user mode, see below), a frame exactly like 64-bit hardware's:
//!
//! ```text
//!   new RSP = (old RSP & !0xF) - 40, or - 48 with an error code
//!   new RSP -> [error code]   only vectors 8, 10-14, 17, 21, 29, 30
//!              RIP
//!              CS       0x33
//!              RFLAGS   the guest's, bit 9 = the virtual IF at delivery
//!              RSP      old RSP
//!              SS       0x2b
//! ```
//!
//! then jumps to the handler with TF cleared (and, for an interrupt gate,
//! `irq_enabled = 0`). It writes `lguest_data.time` at every delivery and,
//! for #PF, the faulting address to `lguest_data.cr2` first.
//!
//! # The stubs
//!
//! One stub per vector `0..NR_VECTORS` (all 32 exception vectors, so the
//! table is uniform, and all [`LGUEST_IRQS`] IRQ vectors, 32..95), each in a
//! 16-byte slot at `lguest_idt_stubs + 16 * vector` ([`stub_address`]):
//!
//! ```text
//!   pushq $0            (only for vectors without an error code)
//!   pushq $vector
//!   jmp lguest_idt_common
//! ```
//!
//! so every frame has the same shape, [`TrapFrame`]: `lguest_idt_common`
//! pushes the 15 general registers on top of vector and error code, clears
//! RFLAGS (DF for Rust, AC so the handler's unaligned accesses cannot raise
//! #AC; `popfq` at CPL 3 cannot touch IF or IOPL), and calls the Rust
//! dispatcher with `(vector, error code, &mut TrapFrame)` on a 16-byte
//! aligned stack. The handler it looks up may change any field of the frame
//! (the registers, RIP, RFLAGS) to change what resumes.
//!
//! # The paravirt `iret`
//!
//! Returning must restore the virtual IF from the frame's RFLAGS and then
//! `iretq`, and an interrupt must not come in between: the IF would already
//! be on while we still stand on the old frame. lguest's answer is an
//! address the host never interrupts, `lguest_data.noirq_iret`: here it is
//! the `iretq` itself, and the store of the IF is the instruction right
//! before it, a `popq` into `irq_enabled` of a value the stub put in the
//! error-code slot while it still had registers to spare:
//!
//! ```text
//!   movq  RFLAGS(%rsp), %rax ; andl $0x200, %eax ; movq %rax, ERROR(%rsp)
//!   popq  %r15 ... popq %rax            (the interrupted registers)
//!   addq  $8, %rsp                      (the vector)
//!   popq  lguest_data+irq_enabled(%rip) (the IF; RSP now at the frame)
//! lguest_noirq_iret:
//!   iretq
//! ```
//!
//! Before the `popq`, the IF is still what the handler ran with (off for
//! interrupt gates), so an interrupt there nests harmlessly below us; after
//! it, RIP is `noirq_iret` until the `iretq` has left. `iretq` from ring 3
//! to ring 3 is legal, and the hardware IF in the frame is ignored at CPL 3.
//! [`crate::data`] writes `noirq_iret` at boot, before `LHCALL_LGUEST_INIT`.
//!
//! # Frames from guest user mode
//!
//! What arrives while the guest runs in user mode ([`crate::user`]) comes
//! on the kernel stack of `LHCALL_SET_STACK`, with CS
//! [`LGUEST_USER_CS`] (0x3b, a marker, not a selector) and the user's RSP
//! ([`TrapFrame::from_user`]). Such a frame cannot be left with `iretq`:
//! after the handler, the return path compares the frame's CS with
//! `LGUEST_USER_CS` and, if it is, jumps to `lguest_user_return`, which
//! rewrites the vector, error, RIP and CS slots into an `LguestIretUser`
//! frame (RAX, RIP, RFLAGS, RSP), pops the other 14 registers and makes
//! `LHCALL_IRET_USER` with RSP at that frame. The kernel stack is empty
//! again afterwards. Kernel-mode frames take the paravirt `iret` below,
//! unchanged.
//!
//! # Gates
//!
//! Exceptions use trap gates (an interrupt may nest in their handlers,
//! which is what the interrupted code allowed anyway), except #PF, which
//! uses an interrupt gate: `lguest_data.cr2` holds only the latest fault,
//! so no interrupt may run (and fault) before its handler has read it with
//! [`data::cr2`], which a #PF handler should do first thing. IRQs use
//! interrupt gates.
//!
//! # Use
//!
//! ```ignore
//! interrupts::set_trap_handler(14, page_fault)?;  // fn(&mut TrapFrame)
//! interrupts::set_irq_handler(1, my_device)?;
//! interrupts::install()?;  // LOAD_IDT_ENTRY for each; unblocks IRQ 1
//! paravirt::irq_enable();
//! ```
//!
//! Handlers run with the interrupted code's stack below them, on one vCPU:
//! state they share with other code must be atomics (or guarded by an
//! atomic flag, as the console is). They must not use SSE or x87 (the
//! target has neither). [`crate::clock`] uses IRQ 0.

use core::arch::global_asm;
use core::fmt;
use core::mem::offset_of;
use core::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use lguest_abi::{
    LguestData, LguestIretUser, LGUEST_GUEST_CS, LGUEST_GUEST_SS, LGUEST_IRQS, LGUEST_KERNEL_CS, LGUEST_KERNEL_SS,
    LGUEST_SYSRET_VECTOR, LGUEST_USER_CS, LHCALL_IRET, LHCALL_IRET_USER, LHCALL_LOAD_IDT_ENTRY, X86_EFLAGS_IF,
};

use crate::data;
use crate::hcall::hcall;
use crate::shutdown::crash_fmt;

/// The vector of IRQ 0; IRQ `n` arrives at `FIRST_IRQ_VECTOR + n`.
pub const FIRST_IRQ_VECTOR: u8 = 32;
/// The number of vectors with a stub: every exception vector and every IRQ.
pub const NR_VECTORS: usize = FIRST_IRQ_VECTOR as usize + LGUEST_IRQS;
/// Bytes between two stubs.
pub const STUB_SIZE: u64 = 16;
/// Gate type of `LHCALL_LOAD_IDT_ENTRY`: the host turns the virtual IF off
/// on delivery.
pub const GATE_INTERRUPT: u64 = 0xE;
/// Gate type of `LHCALL_LOAD_IDT_ENTRY`: the virtual IF stays as it was.
pub const GATE_TRAP: u64 = 0xF;
/// The exception vectors the host may deliver to the guest, and so the only
/// ones [`set_trap_handler`] takes: #DE, #DB, #BP, #OF, #BR, #UD, #NM, #TS,
/// #NP, #SS, #GP, #PF, #MF, #AC, #XM, #CP. (2, 8, 18 and 31 (0x1F) are
/// refused by the host; 9, 15, 20 and 22-30 are reserved or never arise.)
pub const EXCEPTION_VECTORS: &[u8] = &[0, 1, 3, 4, 5, 6, 7, 10, 11, 12, 13, 14, 16, 17, 19, 21];
/// The page-fault vector.
pub const PAGE_FAULT: u8 = 14;
/// RFLAGS: trap flag.
pub const X86_EFLAGS_TF: u64 = 1 << 8;
/// RFLAGS: alignment check.
pub const X86_EFLAGS_AC: u64 = 1 << 18;

/// Whether the CPU pushes an error code for `vector` (the stubs push a 0
/// for the others). The assembly below has the same list.
pub const fn has_error_code(vector: u8) -> bool {
    matches!(vector, 8 | 10 | 11 | 12 | 13 | 14 | 17 | 21 | 29 | 30)
}

/// The short name of an exception vector ("#PF"), or "IRQ" above 31.
pub const fn vector_name(vector: u8) -> &'static str {
    match vector {
        0 => "#DE",
        1 => "#DB",
        2 => "NMI",
        3 => "#BP",
        4 => "#OF",
        5 => "#BR",
        6 => "#UD",
        7 => "#NM",
        8 => "#DF",
        10 => "#TS",
        11 => "#NP",
        12 => "#SS",
        13 => "#GP",
        14 => "#PF",
        16 => "#MF",
        17 => "#AC",
        18 => "#MC",
        19 => "#XM",
        20 => "#VE",
        21 => "#CP",
        9 | 15 | 22..=31 => "reserved",
        _ => "IRQ",
    }
}

/// What the stubs leave on the stack: the interrupted code's registers,
/// the vector, the error code (0 where the CPU pushes none), and the
/// hardware-shaped frame the host pushed. Lowest address first.
///
/// A handler may change any of it; the return path restores the registers
/// from here, takes the virtual IF from `rflags` bit 9, and `iretq`s to
/// `rip` with `rflags` and `rsp` (CS and SS must stay as they are: the
/// `iretq` would fault otherwise).
#[repr(C)]
#[derive(Debug)]
pub struct TrapFrame {
    /// General registers of the interrupted code.
    pub r15: u64,
    /// General registers of the interrupted code.
    pub r14: u64,
    /// General registers of the interrupted code.
    pub r13: u64,
    /// General registers of the interrupted code.
    pub r12: u64,
    /// General registers of the interrupted code.
    pub r11: u64,
    /// General registers of the interrupted code.
    pub r10: u64,
    /// General registers of the interrupted code.
    pub r9: u64,
    /// General registers of the interrupted code.
    pub r8: u64,
    /// General registers of the interrupted code.
    pub rbp: u64,
    /// General registers of the interrupted code.
    pub rdi: u64,
    /// General registers of the interrupted code.
    pub rsi: u64,
    /// General registers of the interrupted code.
    pub rdx: u64,
    /// General registers of the interrupted code.
    pub rcx: u64,
    /// General registers of the interrupted code.
    pub rbx: u64,
    /// General registers of the interrupted code.
    pub rax: u64,
    /// The vector (pushed by the stub).
    pub vector: u64,
    /// The error code (pushed by the host, or 0 by the stub). On return the
    /// slot carries the virtual IF for the paravirt `iret`.
    pub error: u64,
    /// Where the interrupted code resumes.
    pub rip: u64,
    /// Its code segment: [`lguest_abi::LGUEST_GUEST_CS`] from kernel mode
    /// and [`LGUEST_USER_CS`] from user mode, or with Linux frames
    /// ([`linux_frames`]) [`LGUEST_KERNEL_CS`] and `LGUEST_GUEST_CS`.
    pub cs: u64,
    /// Its flags; bit 9 is the virtual IF it had.
    pub rflags: u64,
    /// Its stack pointer.
    pub rsp: u64,
    /// Its stack segment ([`lguest_abi::LGUEST_GUEST_SS`], or with Linux
    /// frames [`LGUEST_KERNEL_SS`] from kernel mode).
    pub ss: u64,
}

impl TrapFrame {
    /// The IRQ number, if this is an interrupt.
    pub fn irq(&self) -> Option<u8> {
        let irq = self.vector.checked_sub(u64::from(FIRST_IRQ_VECTOR))?;
        u8::try_from(irq).ok().filter(|&n| usize::from(n) < LGUEST_IRQS)
    }

    /// Whether the interrupted code ran in guest user mode (the host put
    /// [`LGUEST_USER_CS`] in the frame, on the kernel stack of
    /// `LHCALL_SET_STACK`; with Linux frames, a CS with RPL 3, as Linux's
    /// `user_mode(regs)` asks). Such a frame is returned through with
    /// `LHCALL_IRET_USER` or `LHCALL_IRET` (see [`crate::user`]), which the
    /// return path does by itself.
    pub fn from_user(&self) -> bool {
        if linux_frames() {
            self.cs & 3 != 0
        } else {
            self.cs == LGUEST_USER_CS
        }
    }

    /// The CS and SS the host must have put in the frame, for user mode
    /// (`user`) or kernel mode.
    fn expected_selectors(user: bool) -> (u64, u64) {
        match (linux_frames(), user) {
            (true, false) => (LGUEST_KERNEL_CS, LGUEST_KERNEL_SS),
            (true, true) | (false, false) => (LGUEST_GUEST_CS, LGUEST_GUEST_SS),
            (false, true) => (LGUEST_USER_CS, LGUEST_GUEST_SS),
        }
    }

    /// Whether the interrupted code had (virtual) interrupts on.
    pub fn interrupts_were_on(&self) -> bool {
        self.rflags & X86_EFLAGS_IF != 0
    }
}

/// A trap or interrupt handler. It runs on the interrupted code's stack
/// with the virtual IF off (interrupt gates) or as it was (trap gates).
pub type Handler = fn(&mut TrapFrame);

// Offsets the assembly uses, from the struct itself.
const OFF_VECTOR: usize = offset_of!(TrapFrame, vector);
const OFF_ERROR: usize = offset_of!(TrapFrame, error);
const OFF_RFLAGS: usize = offset_of!(TrapFrame, rflags);
const _: () = {
    // lguest_user_return turns the vector, error, rip and cs slots into
    // the LguestIretUser frame (rax, rip, rflags, rsp).
    assert!(core::mem::size_of::<LguestIretUser>() == 4 * 8);
    assert!(OFF_ERROR == OFF_VECTOR + 8);
    // 15 registers, vector, error code, the 5-word hardware frame.
    assert!(core::mem::size_of::<TrapFrame>() == 22 * 8);
    assert!(OFF_VECTOR == 15 * 8);
    assert!(OFF_ERROR + 8 == offset_of!(TrapFrame, rip));
    // The iret pops the error-code slot into `irq_enabled`, a u64.
    assert!(core::mem::size_of::<u64>() == 8);
};

// The stubs and the common entry and return path; see the module
// documentation. AT&T syntax, so that `$vector` is plainly an immediate.
//
// Alignment: the host leaves RSP at 16n - 40 (no error code) or 16n - 48;
// the stubs make both 16n - 56, and 15 pushes more make 16n - 176 = 16m,
// so the `andq` below changes nothing when the host keeps to the contract;
// it is there so that a host that does not cannot misalign Rust code. RBX
// (callee-saved) keeps the frame address across the call.
global_asm!(
    ".pushsection .text.lguest_idt, \"ax\", @progbits",
    // The three return paths restore R15 to RBX from the frame alike.
    ".macro lguest_pop_regs",
    "    popq %r15; popq %r14; popq %r13; popq %r12; popq %r11; popq %r10; popq %r9",
    "    popq %r8; popq %rbp; popq %rdi; popq %rsi; popq %rdx; popq %rcx; popq %rbx",
    ".endm",
    ".balign 16",
    ".globl lguest_idt_stubs",
    ".type lguest_idt_stubs, @function",
    "lguest_idt_stubs:",
    ".set lguest_idt_vector, 0",
    ".rept {nr_vectors}",
    "    .balign {stub_size}",
    "    .if (lguest_idt_vector != 8) && (lguest_idt_vector != 10) && (lguest_idt_vector != 11) && (lguest_idt_vector != 12) && (lguest_idt_vector != 13) && (lguest_idt_vector != 14) && (lguest_idt_vector != 17) && (lguest_idt_vector != 21) && (lguest_idt_vector != 29) && (lguest_idt_vector != 30)",
    "    pushq $0",
    "    .endif",
    "    pushq $lguest_idt_vector",
    "    jmp lguest_idt_common",
    "    .set lguest_idt_vector, lguest_idt_vector + 1",
    ".endr",
    ".size lguest_idt_stubs, . - lguest_idt_stubs",
    "",
    ".balign 16",
    ".type lguest_idt_common, @function",
    "lguest_idt_common:",
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
    "    movq {off_vector}(%rsp), %rdi",
    "    movq {off_error}(%rsp), %rsi",
    "    movq %rsp, %rdx",
    "    andq $-16, %rsp",
    "    call {dispatch}",
    "    movq %rbx, %rsp",
    "    cmpb $0, {linux_frames}(%rip)",
    "    jne lguest_iret_return",
    "    cmpq ${user_cs}, {off_cs}(%rsp)",
    "    je lguest_user_return",
    "    movq {off_rflags}(%rsp), %rax",
    "    andl ${if_mask}, %eax",
    "    movq %rax, {off_error}(%rsp)",
    "    lguest_pop_regs",
    "    popq %rax",
    "    addq $8, %rsp",
    "    popq {lguest_data}+{off_irq_enabled}(%rip)",
    ".globl lguest_noirq_iret",
    "lguest_noirq_iret:",
    "    iretq",
    ".size lguest_idt_common, . - lguest_idt_common",
    "",
    ".balign 16",
    ".globl lguest_user_return",
    ".type lguest_user_return, @function",
    "lguest_user_return:",
    // With Linux frames every frame is left with LHCALL_IRET, its
    // selectors included.
    "    cmpb $0, {linux_frames}(%rip)",
    "    jne lguest_iret_return",
    // The direct return where it restores the frame exactly: with a direct
    // system-call entry registered, and RCX = RIP, R11 = RFLAGS in the
    // frame (a `syscall`'s, unless the handler changed them), every
    // register is popped, RSP becomes the user's and `int $0x1b` leaves,
    // virtual interrupts off for the next entry (the direct contract).
    "    cmpb $0, {direct}(%rip)",
    "    je 1f",
    "    movq {off_rip}(%rsp), %rax",
    "    cmpq %rax, {off_rcx}(%rsp)",
    "    jne 1f",
    "    movq {off_rflags}(%rsp), %rax",
    "    cmpq %rax, {off_r11}(%rsp)",
    "    jne 1f",
    "    movq $0, {lguest_data}+{off_irq_enabled}(%rip)",
    "    lguest_pop_regs",
    "    popq %rax",
    "    movq {sysret_rsp}(%rsp), %rsp",
    "    int ${sysret}",
    "    ud2",
    "1:  movq {off_rip}(%rsp), %rax",
    "    movq %rax, {off_error}(%rsp)",
    "    movq {off_rflags}(%rsp), %rax",
    "    movq %rax, {off_rip}(%rsp)",
    "    movq {off_rsp}(%rsp), %rax",
    "    movq %rax, {off_cs}(%rsp)",
    "    movq {off_rax}(%rsp), %rax",
    "    movq %rax, {off_vector}(%rsp)",
    "    lguest_pop_regs",
    "    addq $8, %rsp",
    "    movl ${iret_user}, %eax",
    "    int $0x1f",
    "    ud2",
    ".size lguest_user_return, . - lguest_user_return",
    "",
    ".balign 16",
    ".type lguest_iret_return, @function",
    "lguest_iret_return:",
    "    movq {off_rax}(%rsp), %rax",
    "    movq %rax, {off_error}(%rsp)",
    "    lguest_pop_regs",
    "    addq $16, %rsp",
    "    movl ${iret}, %eax",
    "    int $0x1f",
    "    ud2",
    ".size lguest_iret_return, . - lguest_iret_return",
    ".popsection",
    nr_vectors = const NR_VECTORS,
    stub_size = const STUB_SIZE,
    off_vector = const OFF_VECTOR,
    off_error = const OFF_ERROR,
    off_rflags = const OFF_RFLAGS,
    off_rip = const offset_of!(TrapFrame, rip),
    off_cs = const offset_of!(TrapFrame, cs),
    off_rsp = const offset_of!(TrapFrame, rsp),
    off_rax = const offset_of!(TrapFrame, rax),
    off_rcx = const offset_of!(TrapFrame, rcx),
    off_r11 = const offset_of!(TrapFrame, r11),
    sysret_rsp = const offset_of!(TrapFrame, rsp) - offset_of!(TrapFrame, vector),
    sysret = const LGUEST_SYSRET_VECTOR,
    direct = sym DIRECT_RETURN,
    user_cs = const LGUEST_USER_CS,
    iret_user = const LHCALL_IRET_USER,
    iret = const LHCALL_IRET,
    linux_frames = sym LINUX_FRAMES,
    if_mask = const X86_EFLAGS_IF,
    off_irq_enabled = const offset_of!(LguestData, irq_enabled),
    dispatch = sym dispatch,
    lguest_data = sym data::LGUEST_DATA,
    options(att_syntax),
);

/// A direct system-call entry is registered: `lguest_user_return` may leave
/// with `int $LGUEST_SYSRET_VECTOR` ([`crate::user::set_syscall_direct`]).
static DIRECT_RETURN: AtomicBool = AtomicBool::new(false);

pub(crate) fn set_direct_return(on: bool) {
    DIRECT_RETURN.store(on, Ordering::Relaxed);
}

/// Frames with Linux's selectors, left with `LHCALL_IRET` (the library
/// word `linuxframes`, given to the host at `LHCALL_LGUEST_INIT`). Read by
/// the return path above.
static LINUX_FRAMES: AtomicBool = AtomicBool::new(false);

/// Asks for Linux frames (`LGUEST_INIT_LINUX_FRAMES`); before
/// `LHCALL_LGUEST_INIT` only, which [`crate::data`] makes with it.
pub(crate) fn set_linux_frames(on: bool) {
    LINUX_FRAMES.store(on, Ordering::Relaxed);
}

/// Whether the host builds Linux frames for this guest (see
/// [`lguest_abi::LGUEST_INIT_LINUX_FRAMES`]).
pub fn linux_frames() -> bool {
    LINUX_FRAMES.load(Ordering::Relaxed)
}

extern "C" {
    /// The stub of vector 0; vector `v`'s is [`STUB_SIZE`] * `v` further.
    static lguest_idt_stubs: u8;
    /// The `iretq` of the return path: `lguest_data.noirq_iret`.
    static lguest_noirq_iret: u8;
}

/// The address of the `iretq` the host must never interrupt (a virtual
/// address: the RIP the host compares).
pub fn noirq_iret() -> u64 {
    core::ptr::addr_of!(lguest_noirq_iret) as u64
}

/// The address of the entry stub of `vector` (below [`NR_VECTORS`]).
pub fn stub_address(vector: u8) -> Option<u64> {
    if usize::from(vector) >= NR_VECTORS {
        return None;
    }
    // Handlers are virtual addresses (where the guest runs them).
    let base = core::ptr::addr_of!(lguest_idt_stubs) as u64;
    Some(base + STUB_SIZE * u64::from(vector))
}

/// The handlers, by vector, as `Handler as usize` (0: none). Atomics,
/// because the dispatcher reads them in interrupt context.
static HANDLERS: [AtomicUsize; NR_VECTORS] = [const { AtomicUsize::new(0) }; NR_VECTORS];

/// Whether [`install`] ran: from then on, setting a handler also tells the
/// host at once.
static INSTALLED: AtomicBool = AtomicBool::new(false);

/// Why a handler was not set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Error {
    /// The exception vector is not one the host delivers
    /// ([`EXCEPTION_VECTORS`]); loading it might get the guest killed.
    NotDeliverable(u8),
    /// There is no such IRQ (0..[`LGUEST_IRQS`]).
    NoSuchIrq(u8),
    /// The stubs are not at a guest address: at or above
    /// `lguest_data.reserve_mem` in the lower half, or in the guard hole,
    /// which the host refuses (they never are, for an image linked at
    /// 2 MiB or in the top 2 GiB).
    AboveReserveMem(u64),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Error::NotDeliverable(v) => write!(f, "vector {v} is not a deliverable exception"),
            Error::NoSuchIrq(n) => write!(f, "no IRQ {n} (there are {LGUEST_IRQS})"),
            Error::AboveReserveMem(a) => write!(f, "handler {a:#x} is not a guest address (reserve_mem, guard hole)"),
        }
    }
}

/// The gate type for `vector` (see the module documentation).
pub const fn gate_type(vector: u8) -> u64 {
    if vector >= FIRST_IRQ_VECTOR || vector == PAGE_FAULT {
        GATE_INTERRUPT
    } else {
        GATE_TRAP
    }
}

/// Sets the handler of exception `vector` (one of [`EXCEPTION_VECTORS`]).
/// After [`install`], the host is told at once.
pub fn set_trap_handler(vector: u8, handler: Handler) -> Result<(), Error> {
    if !EXCEPTION_VECTORS.contains(&vector) {
        return Err(Error::NotDeliverable(vector));
    }
    set(vector, handler)
}

/// Sets the handler of IRQ `irq` (0..[`LGUEST_IRQS`]). After [`install`],
/// the host is told at once and the IRQ is unblocked.
pub fn set_irq_handler(irq: u8, handler: Handler) -> Result<(), Error> {
    if usize::from(irq) >= LGUEST_IRQS {
        return Err(Error::NoSuchIrq(irq));
    }
    set(FIRST_IRQ_VECTOR + irq, handler)
}

/// Records `handler` for `vector` (< [`NR_VECTORS`], checked by callers)
/// and, once installed, loads it.
fn set(vector: u8, handler: Handler) -> Result<(), Error> {
    HANDLERS[usize::from(vector)].store(handler as usize, Ordering::Release);
    if INSTALLED.load(Ordering::Acquire) {
        load(vector)?;
    }
    Ok(())
}

/// Makes the host's IDT entry for `vector` point at its stub and, for an
/// IRQ, unblocks it (in that order: the entry must exist before the host
/// may deliver).
fn load(vector: u8) -> Result<(), Error> {
    let Some(stub) = stub_address(vector) else {
        return Err(Error::NotDeliverable(vector));
    };
    let reserve = data::reserve_mem();
    let upper = stub >= lguest_abi::GUEST_UPPER_START;
    if !upper && reserve != 0 && stub + STUB_SIZE > reserve {
        return Err(Error::AboveReserveMem(stub));
    }
    // SAFETY: `stub` is the entry stub of `vector` in our text, which stays
    // where it is; the host stores the address and never writes through it.
    // `vector` is an exception vector the host delivers or an IRQ vector
    // (callers check), so the host does not refuse it.
    unsafe {
        hcall(LHCALL_LOAD_IDT_ENTRY, u64::from(vector), stub, gate_type(vector), 0);
    }
    if vector >= FIRST_IRQ_VECTOR {
        data::unblock_irq(vector - FIRST_IRQ_VECTOR);
    }
    Ok(())
}

/// Tells the host about every handler set so far (`LHCALL_LOAD_IDT_ENTRY`
/// with the vector's stub and gate type) and unblocks the IRQs that have
/// one. Handlers set afterwards are loaded as they are set. Calling it again
/// reloads them all; it does not change the virtual IF.
pub fn install() -> Result<(), Error> {
    for (vector, slot) in (0u8..).zip(HANDLERS.iter()) {
        if slot.load(Ordering::Acquire) != 0 {
            load(vector)?;
        }
    }
    INSTALLED.store(true, Ordering::Release);
    Ok(())
}

/// Blocks IRQ `irq`: the host holds it back (`blocked_interrupts`).
pub fn block(irq: u8) {
    data::block_irq(irq);
}

/// Unblocks IRQ `irq`. [`install`] and [`set_irq_handler`] do this for
/// each IRQ with a handler; unblocking one without a handler gets the
/// guest crashed at the first such interrupt.
pub fn unblock(irq: u8) {
    data::unblock_irq(irq);
}

/// Where every stub goes: finds the handler of `vector` and runs it.
///
/// Called by `lguest_idt_common` with the stack 16-byte aligned, DF and AC
/// clear, and `frame` pointing at the saved state on the stack.
extern "C" fn dispatch(vector: u64, error: u64, frame: *mut TrapFrame) {
    // SAFETY: `frame` is the TrapFrame the stub just pushed on this stack,
    // properly aligned, live until we return, and nothing else refers to it.
    let frame = unsafe { &mut *frame };
    // A frame the host built must say where the event came from as the
    // ABI says: an interrupted user or kernel context, nothing else; but
    // for the #GP of a return to user mode with selectors the CPU refuses
    // (Linux frames only), whose frame carries those selectors, as a
    // native one does.
    let user = frame.from_user();
    let bad_return = user && linux_frames() && vector == 13;
    if (frame.cs, frame.ss) != TrapFrame::expected_selectors(user) && !bad_return {
        crash_fmt(format_args!(
            "lguest-guest: vector {vector}: frame cs {:#x} ss {:#x}, not the {} selectors of this ABI",
            frame.cs,
            frame.ss,
            if user { "user" } else { "kernel" }
        ));
    }
    let raw = usize::try_from(vector).ok().and_then(|v| HANDLERS.get(v)).map_or(0, |h| h.load(Ordering::Acquire));
    if raw == 0 {
        unexpected(vector, error, frame);
    }
    // SAFETY: the only non-zero values ever stored in HANDLERS are `Handler`
    // function pointers cast to usize (in `set`), and a function pointer
    // fits a usize on x86-64; so this turns it back into what it was.
    let handler = unsafe { core::mem::transmute::<usize, Handler>(raw) };
    handler(frame);
}

/// A vector with no handler reached the dispatcher (an IRQ unblocked by
/// hand, or the host delivering what it should not): crash with it.
#[cold]
fn unexpected(vector: u64, error: u64, frame: &TrapFrame) -> ! {
    let name = u8::try_from(vector).map_or("?", vector_name);
    let cr2 = data::cr2();
    crash_fmt(format_args!(
        "lguest-guest: no handler for vector {vector} ({name}) error {error:#x} cr2 {cr2:#x} at rip {:#x}",
        frame.rip
    ))
}
