// SPDX-License-Identifier: GPL-2.0
//! `user`: runs a small program in guest user mode.
//!
//! The kernel builds its own page tables ([`lguest_guest::paging`]), makes
//! a fresh address space, maps the program (the page-aligned section
//! `.text.user_prog` of this image, read-only and executable for user
//! mode) and a user stack (read/write, no-execute), and runs it with
//! [`lguest_guest::user::run`]. The program, in assembly (position
//! independent: it runs at [`USER_CODE`], not where it was linked):
//!
//! 1. writes "hello from user mode" with the `write` system call;
//! 2. makes 1000 `getcounter` system calls and counts the ones that did not
//!    return the previous value plus one (R14);
//! 3. tries a hypercall, `int $0x1f` with `LHCALL_SHUTDOWN` and a message:
//!    the host must turn it into a #GP with error code 0xfa for the guest
//!    kernel (whose fault hook skips the instruction and puts a marker in
//!    RAX) and must not power off;
//! 4. reads a kernel-only page (the `lguest_data` page, whose address the
//!    kernel passes in RDI): the kernel's #PF handler must see a user-mode
//!    protection fault, error code U|P (0x5), at that address, and kills the
//!    program.
//!
//! 5. a second program spins with a pattern in 15 registers while a 50 us
//!    timer interrupts it: each interrupt enters the kernel from user mode
//!    and returns with `LHCALL_IRET_USER`; it exits with the number of
//!    registers that changed (0).
//!
//! 6. two threads, each with its own FS base, read their own TLS value
//!    with `%fs:0` while the kernel switches between them at its timer
//!    interrupts (registers through the frame, FS with
//!    `LHCALL_SET_SEGMENT_BASE`);
//!
//! 7. seven one-instruction programs (`hlt`, `cli`, a non-canonical read,
//!    `int3`, `ud2`, a division by zero, a jump to kernel code) must each
//!    be killed with the vector, error code and RIP of x86 hardware.
//!
//! With the word `direct` the kernel registers the direct system-call
//! entry (`LGUEST_SYSCALL_DIRECT`): every `syscall` above then goes
//! straight to it and back through the switcher, a 50 us timer interrupts
//! the 100000-call program, and the kernel makes 100000 hypercalls with
//! `syscall` itself, each checked like the user program's calls, the timer
//! interrupting those too. `calls=N` makes both counts N.
//!
//! The kernel then checks all of it and powers off with
//! `user: done: N syscalls (1 write, 1000 getcounter), hypercall -> #GP
//! error 0xfa, killed by #PF error 0x5 at ADDR` or crashes with what was
//! wrong.
#![no_std]
#![no_main]

use core::arch::global_asm;
use core::ptr::addr_of;
use core::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use lguest_guest::abi::{LGUEST_SHUTDOWN_POWEROFF, LHCALL_SHUTDOWN};
use lguest_guest::cell::GuestCell;
use lguest_guest::paging::{self, pte, AddressSpace, PageSize, PAGE_SIZE, USER_START};
use lguest_guest::user::{self, Exit, UserRegs, HCALL_GP_ERROR, SYS_COUNTER, SYS_EXIT, SYS_WRITE};
use lguest_guest::{clock, crash_fmt, entry, frames, interrupts, poweroff_fmt, println, Args, TrapFrame};

entry!(main);

/// Where the program's code is mapped.
const USER_CODE: u64 = USER_START;
/// Where its stack is mapped (4 pages below `USER_STACK_TOP`).
const USER_STACK_TOP: u64 = USER_START + 0x40_0000;
const STACK_PAGES: u64 = 4;
/// `getcounter` calls the program makes.
const COUNTER_CALLS: u64 = 1000;
/// What the fault hook puts in RAX when it skips the hypercall attempt.
const HCALL_MARKER: u64 = 0x1f1f_0bad;
/// The message the program writes.
const MESSAGE: &str = "hello from user mode\n";

// The user program. R12 = the kernel address to read (from RDI); R13 =
// what `write` returned; R14 = wrong counter values; RBX = RAX after the
// hypercall attempt. All RIP-relative, so it runs at any address.
global_asm!(
    ".pushsection .text.user_prog, \"ax\", @progbits",
    ".balign 4096",
    ".globl user_prog_start",
    "user_prog_start:",
    "    mov r12, rdi",
    "    lea rdi, [rip + 5f]",
    "    mov esi, {msg_len}",
    "    mov eax, {sys_write}",
    "    int 0x80",
    "    mov r13, rax",
    "    xor r14d, r14d",
    "    mov eax, {sys_counter}",
    "    int 0x80",
    "    mov r15, rax",
    "    mov ecx, {loops}",
    "2:  mov eax, {sys_counter}",
    "    int 0x80",
    "    inc r15",
    "    cmp rax, r15",
    "    je 3f",
    "    inc r14",
    "3:  dec ecx",
    "    jnz 2b",
    "    lea rdi, [rip + 6f]",
    "    mov esi, {poweroff}",
    "    mov eax, {shutdown}",
    "    int 0x1f",
    "    mov rbx, rax",
    "    mov rax, qword ptr [r12]",
    "    mov edi, 99",
    "    mov eax, {sys_exit}",
    "    int 0x80",
    "    ud2",
    "5:  .ascii \"hello from user mode\\n\"",
    "6:  .asciz \"user: the hypercall from user mode reached the host\"",
    // Single faulting instructions, for the exception table.
    ".balign 16",
    ".globl user_exc_hlt",
    "user_exc_hlt: hlt",
    "    ud2",
    ".balign 16",
    ".globl user_exc_cli",
    "user_exc_cli: cli",
    "    ud2",
    ".balign 16",
    ".globl user_exc_noncanon",
    "user_exc_noncanon: mov rax, 0x8000000000000000",
    "    mov rax, qword ptr [rax]",
    "    ud2",
    ".balign 16",
    ".globl user_exc_int3",
    "user_exc_int3: int3",
    "    ud2",
    ".balign 16",
    ".globl user_exc_ud2",
    "user_exc_ud2: ud2",
    ".balign 16",
    ".globl user_exc_sysret",
    "user_exc_sysret: int 0x1b",
    "    ud2",
    ".balign 16",
    ".globl user_exc_div",
    "user_exc_div: xor ecx, ecx",
    "    div rcx",
    "    ud2",
    ".balign 16",
    ".globl user_exc_exec_kernel",
    "user_exc_exec_kernel: jmp rdi",
    // The second program: RDI iterations of a loop with a pattern in every
    // other register, then exit with the number of registers that changed.
    ".balign 16",
    ".globl user_spin",
    "user_spin:",
    "    mov rax, 0x1111111111111111",
    "    mov rbx, 0x2222222222222222",
    "    mov rcx, 0x3333333333333333",
    "    mov rdx, 0x4444444444444444",
    "    mov rsi, 0x5555555555555555",
    "    mov rbp, 0x6666666666666666",
    "    mov r8, 0x7777777777777777",
    "    mov r9, 0x8888888888888888",
    "    mov r10, 0x9999999999999999",
    "    mov r11, 0xaaaaaaaaaaaaaaaa",
    "    mov r12, 0xbbbbbbbbbbbbbbbb",
    "    mov r13, 0xcccccccccccccccc",
    "    mov r14, 0xdddddddddddddddd",
    "    mov r15, 0xeeeeeeeeeeeeeeee",
    "7:  dec rdi",
    "    jnz 7b",
    "    push r8",
    "    xor edi, edi",
    "    mov r8, 0x1111111111111111",
    "    cmp rax, r8",
    "    je 8f",
    "    inc edi",
    "8:  pop r8",
    "    mov rax, 0x2222222222222222",
    "    cmp rbx, rax",
    "    je 8f",
    "    inc edi",
    "8:",
    "    mov rax, 0x3333333333333333",
    "    cmp rcx, rax",
    "    je 8f",
    "    inc edi",
    "8:",
    "    mov rax, 0x4444444444444444",
    "    cmp rdx, rax",
    "    je 8f",
    "    inc edi",
    "8:",
    "    mov rax, 0x5555555555555555",
    "    cmp rsi, rax",
    "    je 8f",
    "    inc edi",
    "8:",
    "    mov rax, 0x6666666666666666",
    "    cmp rbp, rax",
    "    je 8f",
    "    inc edi",
    "8:",
    "    mov rax, 0x7777777777777777",
    "    cmp r8, rax",
    "    je 8f",
    "    inc edi",
    "8:",
    "    mov rax, 0x8888888888888888",
    "    cmp r9, rax",
    "    je 8f",
    "    inc edi",
    "8:",
    "    mov rax, 0x9999999999999999",
    "    cmp r10, rax",
    "    je 8f",
    "    inc edi",
    "8:",
    "    mov rax, 0xaaaaaaaaaaaaaaaa",
    "    cmp r11, rax",
    "    je 8f",
    "    inc edi",
    "8:",
    "    mov rax, 0xbbbbbbbbbbbbbbbb",
    "    cmp r12, rax",
    "    je 8f",
    "    inc edi",
    "8:",
    "    mov rax, 0xcccccccccccccccc",
    "    cmp r13, rax",
    "    je 8f",
    "    inc edi",
    "8:",
    "    mov rax, 0xdddddddddddddddd",
    "    cmp r14, rax",
    "    je 8f",
    "    inc edi",
    "8:",
    "    mov rax, 0xeeeeeeeeeeeeeeee",
    "    cmp r15, rax",
    "    je 8f",
    "    inc edi",
    "8:",
    "    mov eax, {sys_exit}",
    "    int 0x80",
    "    ud2",
    // The third program: RDI `syscall`s of getcounter, each checked: RCX =
    // the address after the instruction, R11 = RFLAGS before it, RAX = the
    // last value + 1, ten other registers unchanged. It exits with the
    // number of calls that got anything wrong. [rsp]: RFLAGS before the
    // call; [rsp + 8]: the last counter value (one slot lower once RAX is
    // pushed).
    ".balign 16",
    ".globl user_syscalls",
    "user_syscalls:",
    "    mov r15, rdi",
    "    xor r14d, r14d",
    "    sub rsp, 16",
    "    mov eax, {sys_counter}",
    "    int 0x80",
    "    mov [rsp + 8], rax",
    "    mov rbx, 0x1212121212121212",
    "    mov rdx, 0x2323232323232323",
    "    mov rsi, 0x3434343434343434",
    "    mov rdi, 0x4545454545454545",
    "    mov rbp, 0x5656565656565656",
    "    mov r8, 0x6767676767676767",
    "    mov r9, 0x7878787878787878",
    "    mov r10, 0x8989898989898989",
    "    mov r12, 0x9a9a9a9a9a9a9a9a",
    "    mov r13, 0xabababababababab",
    "9:  pushfq",
    "    pop rax",
    "    mov [rsp], rax",
    "    mov eax, {sys_counter}",
    "    syscall",
    "10: push rax",
    "    lea rax, [rip + 10b]",
    "    cmp rcx, rax",
    "    jne 12f",
    "    mov rax, [rsp + 8]",
    "    cmp r11, rax",
    "    jne 12f",
    "    mov rax, [rsp + 16]",
    "    inc rax",
    "    cmp rax, [rsp]",
    "    jne 12f",
    "    mov [rsp + 16], rax",
    "    mov rcx, 0x1212121212121212",
    "    cmp rbx, rcx",
    "    jne 12f",
    "    mov rcx, 0x2323232323232323",
    "    cmp rdx, rcx",
    "    jne 12f",
    "    mov rcx, 0x3434343434343434",
    "    cmp rsi, rcx",
    "    jne 12f",
    "    mov rcx, 0x4545454545454545",
    "    cmp rdi, rcx",
    "    jne 12f",
    "    mov rcx, 0x5656565656565656",
    "    cmp rbp, rcx",
    "    jne 12f",
    "    mov rcx, 0x6767676767676767",
    "    cmp r8, rcx",
    "    jne 12f",
    "    mov rcx, 0x7878787878787878",
    "    cmp r9, rcx",
    "    jne 12f",
    "    mov rcx, 0x8989898989898989",
    "    cmp r10, rcx",
    "    jne 12f",
    "    mov rcx, 0x9a9a9a9a9a9a9a9a",
    "    cmp r12, rcx",
    "    jne 12f",
    "    mov rcx, 0xabababababababab",
    "    cmp r13, rcx",
    "    jne 12f",
    "    jmp 13f",
    "12: inc r14",
    "    mov rax, [rsp]",
    "    mov [rsp + 16], rax",
    "    mov rbx, 0x1212121212121212",
    "    mov rdx, 0x2323232323232323",
    "    mov rsi, 0x3434343434343434",
    "    mov rdi, 0x4545454545454545",
    "    mov rbp, 0x5656565656565656",
    "    mov r8, 0x6767676767676767",
    "    mov r9, 0x7878787878787878",
    "    mov r10, 0x8989898989898989",
    "    mov r12, 0x9a9a9a9a9a9a9a9a",
    "    mov r13, 0xabababababababab",
    "13: pop rax",
    "    dec r15",
    "    jnz 9b",
    "    mov rdi, r14",
    "    mov eax, {sys_exit}",
    "    int 0x80",
    "    ud2",
    // The fourth program: segment bases. R15 = the GS base it starts with,
    // R14 = the FS base; it writes RDI into its GS base, then asks the
    // kernel for the kernel's GS base (system call RSI) with int $0x80
    // (into R12) and with syscall (R13), and reads its GS base again (RBX).
    ".balign 16",
    ".globl user_gs",
    "user_gs:",
    "    rdgsbase r15",
    "    rdfsbase r14",
    "    wrgsbase rdi",
    "    mov rax, rsi",
    "    int 0x80",
    "    mov r12, rax",
    "    mov rax, rsi",
    "    syscall",
    "    mov r13, rax",
    "    rdgsbase rbx",
    "    xor edi, edi",
    "    mov eax, {sys_exit}",
    "    int 0x80",
    "    ud2",
    // The benchmark loops: RDI system calls of getcounter, with `syscall`
    // or with `int $0x80`, then exit.
    ".balign 16",
    ".globl user_bench_syscall",
    "user_bench_syscall:",
    "15: mov eax, {sys_counter}",
    "    syscall",
    "    dec rdi",
    "    jnz 15b",
    "    mov eax, {sys_exit}",
    "    int 0x80",
    "    ud2",
    ".balign 16",
    ".globl user_bench_int80",
    "user_bench_int80:",
    "16: mov eax, {sys_counter}",
    "    int 0x80",
    "    dec rdi",
    "    jnz 16b",
    "    mov eax, {sys_exit}",
    "    int 0x80",
    "    ud2",
    // The held interrupt: one SYS_HOLD `syscall` (the kernel arms the timer
    // and spins past it with interrupts off), then count in R12 until the
    // timer's handler ends the program. The tick must come before the
    // first count: at the return to user mode.
    ".balign 16",
    ".globl user_hold",
    "user_hold:",
    "    xor r12d, r12d",
    "    mov eax, {sys_hold}",
    "    syscall",
    "30: inc r12",
    "    jmp 30b",
    // A `syscall` with no entry registered: #UD at the instruction.
    ".balign 16",
    ".globl user_exc_syscall",
    "user_exc_syscall: syscall",
    "    ud2",
    // A thread of the TLS pair: RDI rounds, R12 the value its FS page must
    // hold; each round reads %fs:0 and counts mismatches in R14, then
    // spins; then more rounds until SYS_SWITCHES says the pair was
    // switched often enough. RAX carries only the calls' numbers and the
    // count (the other thread's exit may overwrite it: at worst one more
    // batch of rounds).
    ".balign 16",
    ".globl user_tls",
    "user_tls:",
    "    xor r14d, r14d",
    "20: mov rbx, fs:[0]",
    "    cmp rbx, r12",
    "    je 21f",
    "    inc r14",
    "21: mov ecx, {tls_spin}",
    "22: dec ecx",
    "    jnz 22b",
    "    dec rdi",
    "    jnz 20b",
    // Until the kernel has switched the pair often enough (however fast
    // the rounds went against the timer), more rounds.
    "    mov eax, {sys_switches}",
    "    int 0x80",
    "    cmp rax, {tls_min_switches}",
    "    jae 23f",
    "    mov edi, {tls_more_rounds}",
    "    jmp 20b",
    "23: mov rdi, r14",
    "    mov eax, {sys_thread_exit}",
    "    int 0x80",
    "    ud2",
    // A `syscall` whose handler changes the return (`sys_return_to`),
    // and the place a return with a bad RSP lands: exit(42), no stack.
    ".balign 16",
    ".globl user_return_to",
    "user_return_to:",
    "    mov eax, {sys_return_to}",
    "    syscall",
    "    ud2",
    ".balign 16",
    ".globl user_exit42",
    "user_exit42:",
    "    mov edi, 42",
    "    mov eax, {sys_exit}",
    "    int 0x80",
    "    ud2",
    ".balign 4096",
    ".globl user_prog_end",
    "user_prog_end:",
    ".popsection",
    msg_len = const MESSAGE.len(),
    sys_write = const SYS_WRITE,
    sys_counter = const SYS_COUNTER,
    sys_exit = const SYS_EXIT,
    loops = const COUNTER_CALLS - 1,
    tls_spin = const TLS_SPIN,
    sys_thread_exit = const SYS_THREAD_EXIT,
    sys_switches = const SYS_SWITCHES,
    tls_min_switches = const TLS_MIN_SWITCHES,
    tls_more_rounds = const TLS_ROUNDS / 10,
    sys_hold = const SYS_HOLD,
    sys_return_to = const SYS_RETURN_TO,
    poweroff = const LGUEST_SHUTDOWN_POWEROFF,
    shutdown = const LHCALL_SHUTDOWN,
);

// `kernel_syscall_hcalls(n)`: n `LHCALL_SEND_INTERRUPTS` hypercalls by
// `syscall` from kernel mode (the direct entry's), each checked: RCX = the
// address after the instruction, R11 = RFLAGS before it, nine other
// registers unchanged. Returns the number of calls that got anything
// wrong. SysV ABI (callee-saved registers kept).
global_asm!(
    ".pushsection .text, \"ax\", @progbits",
    ".balign 16",
    ".globl kernel_syscall_hcalls",
    "kernel_syscall_hcalls:",
    "    push rbx",
    "    push rbp",
    "    push r12",
    "    push r13",
    "    push r14",
    "    push r15",
    "    mov r14, rdi",
    "    xor r15d, r15d",
    "2:  mov rbx, 0x1212121212121212",
    "    mov rdx, 0x2323232323232323",
    "    mov rsi, 0x3434343434343434",
    "    mov rdi, 0x4545454545454545",
    "    mov rbp, 0x5656565656565656",
    "    mov r9, 0x7878787878787878",
    "    mov r10, 0x8989898989898989",
    "    mov r12, 0x9a9a9a9a9a9a9a9a",
    "    mov r13, 0xabababababababab",
    "    pushfq",
    "    pop r8",
    "    mov eax, {send_interrupts}",
    "    syscall",
    "3:  lea rax, [rip + 3b]",
    "    cmp rcx, rax",
    "    jne 4f",
    "    cmp r11, r8",
    "    jne 4f",
    "    mov rax, 0x1212121212121212",
    "    cmp rbx, rax",
    "    jne 4f",
    "    mov rax, 0x2323232323232323",
    "    cmp rdx, rax",
    "    jne 4f",
    "    mov rax, 0x3434343434343434",
    "    cmp rsi, rax",
    "    jne 4f",
    "    mov rax, 0x4545454545454545",
    "    cmp rdi, rax",
    "    jne 4f",
    "    mov rax, 0x5656565656565656",
    "    cmp rbp, rax",
    "    jne 4f",
    "    mov rax, 0x7878787878787878",
    "    cmp r9, rax",
    "    jne 4f",
    "    mov rax, 0x8989898989898989",
    "    cmp r10, rax",
    "    jne 4f",
    "    mov rax, 0x9a9a9a9a9a9a9a9a",
    "    cmp r12, rax",
    "    jne 4f",
    "    mov rax, 0xabababababababab",
    "    cmp r13, rax",
    "    jne 4f",
    "    jmp 5f",
    "4:  inc r15",
    "5:  dec r14",
    "    jnz 2b",
    "    mov rax, r15",
    "    pop r15",
    "    pop r14",
    "    pop r13",
    "    pop r12",
    "    pop rbp",
    "    pop rbx",
    "    ret",
    ".popsection",
    send_interrupts = const lguest_guest::abi::LHCALL_SEND_INTERRUPTS,
);

extern "C" {
    fn kernel_syscall_hcalls(n: u64) -> u64;
    static user_hold: u8;
    static user_exc_hlt: u8;
    static user_exc_cli: u8;
    static user_exc_noncanon: u8;
    static user_exc_int3: u8;
    static user_exc_ud2: u8;
    static user_exc_sysret: u8;
    static user_exc_div: u8;
    static user_exc_exec_kernel: u8;
    static user_spin: u8;
    static user_syscalls: u8;
    static user_gs: u8;
    static user_bench_syscall: u8;
    static user_bench_int80: u8;
    static user_exc_syscall: u8;
    static user_tls: u8;
    static user_return_to: u8;
    static user_exit42: u8;
    static user_prog_start: u8;
    static user_prog_end: u8;
}

/// #GP faults with the hypercall error code the hook saw.
static HCALL_GPS: AtomicU64 = AtomicU64::new(0);
/// Where it saw the last one.
static HCALL_RIP: AtomicU64 = AtomicU64::new(0);

/// The fault hook: a #GP with error 0xfa from user mode is the hypercall
/// attempt; skip the two-byte `int $0x1f` and resume with a marker in RAX.
/// Anything else kills the program.
///
/// Hardware reports a #GP of a gate's DPL check at the `int` instruction
/// itself; a frame whose RIP is already past it is a host bug: it is
/// counted in [`HCALL_RIP_AFTER`] (and fails the test at the end), and the
/// program resumes where that RIP says, so the rest still runs.
fn fault_hook(frame: &mut TrapFrame, _cr2: u64) -> bool {
    if frame.vector == 13 && frame.error == HCALL_GP_ERROR {
        HCALL_GPS.fetch_add(1, Ordering::Relaxed);
        HCALL_RIP.store(frame.rip, Ordering::Relaxed);
        if code_at(frame.rip) == INT_1F {
            frame.rip += 2;
        } else if code_at(frame.rip.wrapping_sub(2)) == INT_1F {
            HCALL_RIP_AFTER.fetch_add(1, Ordering::Relaxed);
        } else {
            return false;
        }
        frame.rax = HCALL_MARKER;
        return true;
    }
    false
}

/// The bytes of `int $0x1f`.
const INT_1F: [u8; 2] = [0xcd, 0x1f];
/// #GP frames of the hypercall attempt whose RIP was after the instruction.
static HCALL_RIP_AFTER: AtomicU64 = AtomicU64::new(0);

/// Two bytes of the program at user address `va` (zeros outside it).
fn code_at(va: u64) -> [u8; 2] {
    let len = PROG_LEN.load(Ordering::Relaxed);
    if !(USER_CODE..USER_CODE + len - 1).contains(&va) {
        return [0; 2];
    }
    // SAFETY: `va` and `va + 1` are in the program's pages, mapped (and
    // readable for the kernel, which may read user pages) in the active
    // space; read only.
    unsafe { core::ptr::read_volatile(va as *const [u8; 2]) }
}

/// Bytes of the program's pages.
static PROG_LEN: AtomicU64 = AtomicU64::new(0);

/// The system calls of the segment-base program: the defaults and one
/// that returns the kernel's own GS base as it finds it in the handler.
const SYS_GETGS: u64 = 3;
/// And one that returns where its frame is (the kernel stack in use).
const SYS_GETSP: u64 = 4;
static GS_SYSCALLS: [user::Syscall; 5] = [user::sys_exit, user::sys_write, user::sys_counter, sys_getgs, sys_getsp];

fn sys_getsp(frame: &mut TrapFrame) -> u64 {
    frame as *mut TrapFrame as u64
}

/// A second kernel stack, for `lguest_data.kernel_sp0`.
#[repr(C, align(16))]
struct Stack([u8; 8192]);
static mut SECOND_STACK: Stack = Stack([0; 8192]);

fn sys_getgs(_frame: &mut TrapFrame) -> u64 {
    rdgsbase()
}

/// This mode's GS base.
fn rdgsbase() -> u64 {
    let v: u64;
    // SAFETY: reads the GS base (FSGSBASE, checked before use); no memory.
    unsafe { core::arch::asm!("rdgsbase {}", out(reg) v, options(nomem, nostack)) };
    v
}

/// Whether the FSGSBASE instructions work here: CR4.FSGSBASE, which the
/// host emulates (a guest runs under the host's CR4; CPUID says only what
/// the CPU has, whether or not the host kernel turned it on).
fn fsgsbase() -> bool {
    let cr4: u64;
    // SAFETY: reading CR4 in guest kernel mode is emulated by the host; no
    // memory is touched.
    unsafe { core::arch::asm!("mov {}, cr4", out(reg) cr4, options(nomem, nostack)) };
    cr4 & 1 << 16 != 0
}

/// The held-interrupt program's system calls: the defaults and `SYS_HOLD`.
const SYS_HOLD: u64 = 3;
static HOLD_SYSCALLS: [user::Syscall; 4] = [user::sys_exit, user::sys_write, user::sys_counter, sys_hold];
/// How long `SYS_HOLD` spins, and the timer it arms: the timer fires while
/// the kernel holds it back (virtual interrupts off).
const HOLD_NS: u64 = 1_000_000_000;
const HOLD_TIMER_NS: u64 = 20_000;
/// What the held tick found in user mode: R12 (the count) and RIP, and
/// the expected RIP (after the `syscall`).
static HOLD_R12: AtomicU64 = AtomicU64::new(u64::MAX);
static HOLD_RIP: AtomicU64 = AtomicU64::new(0);

/// `SYS_HOLD`: arms the timer and spins in kernel mode, virtual interrupts
/// off (the direct entry leaves them so), until the host says that the
/// tick waits (`irq_pending`; however late TCG's timers run), or for
/// `HOLD_NS` at most.
fn sys_hold(_frame: &mut TrapFrame) -> u64 {
    clock::set_event(HOLD_TIMER_NS);
    let t0 = clock::now_ns();
    while lguest_guest::data::irq_pending() == 0 && clock::now_ns() - t0 < HOLD_NS {
        core::hint::spin_loop();
    }
    0
}

/// IRQ 0 during the held-interrupt program: records where user mode was,
/// and ends the program.
fn hold_tick(frame: &mut TrapFrame) {
    if frame.from_user() {
        HOLD_R12.store(frame.r12, Ordering::Relaxed);
        HOLD_RIP.store(frame.rip, Ordering::Relaxed);
        user::exit(frame, Exit::Exited(0));
    }
}

/// `syscall`s the third program makes, and hypercalls the kernel makes
/// with `syscall` in `direct` mode, unless the word `calls=N` says.
const SYSCALL_CALLS: u64 = 100_000;

/// The spinner's iterations, and the timer period while it runs.
const SPIN_LOOPS: u64 = 20_000_000;
const TIMER_NS: u64 = 50_000;

/// The clock callback: re-arms the timer.
/// Two user threads, each with its own FS base (a TLS page holding its own
/// value at offset 0), switched by this kernel at its timer interrupts
/// from user mode: the registers through the frame, the FS base with
/// `LHCALL_SET_SEGMENT_BASE`.
struct Thread {
    regs: UserRegs,
    fs: u64,
    done: bool,
    mismatches: u64,
}

const TLS_A: u64 = USER_START + 0x50_0000;
const TLS_B: u64 = USER_START + 0x51_0000;
/// Rounds per thread, and spins per round.
const TLS_ROUNDS: u64 = 20_000;
const TLS_SPIN: u64 = 100;
/// The threads' exit: the other thread runs on, the last one ends `run`.
/// The system call of `user_return_to`: its return goes where
/// [`RETURN_TO`] says (RIP, RSP, CS, SS; 0 leaves one as it is), RCX
/// following RIP so that the direct return takes it as it is.
const SYS_RETURN_TO: u64 = 3;
static RETURN_SYSCALLS: [user::Syscall; 4] = [user::sys_exit, user::sys_write, user::sys_counter, sys_return_to];
static RETURN_TO: [AtomicU64; 4] = [const { AtomicU64::new(0) }; 4];

fn sys_return_to(frame: &mut TrapFrame) -> u64 {
    let [rip, rsp, cs, ss] = RETURN_TO.each_ref().map(|a| a.load(Ordering::Relaxed));
    frame.rip = rip;
    frame.rcx = rip;
    if rsp != 0 {
        frame.rsp = rsp;
    }
    if cs != 0 {
        frame.cs = cs;
    }
    if ss != 0 {
        frame.ss = ss;
    }
    0
}

/// Returns to user mode that native x86 refuses or turns into a fault of
/// the process: each must end the program with the fault a CPU gives
/// (none ends the guest). The return goes out by whichever path this run
/// uses: `LHCALL_IRET_USER`, `LHCALL_IRET` with Linux frames, or the
/// direct return (`int $0x1b`). Returns how many cases ran.
fn bad_returns(start: u64) -> usize {
    let va = |sym: *const u8| USER_CODE + (lguest_guest::virt_to_phys(sym) - start);
    let (prog, exit42) = (va(addr_of!(user_return_to)), va(addr_of!(user_exit42)));
    // (name, rip, rsp, cs, ss, the exit)
    let mut cases: [(&str, u64, u64, u64, u64, Exit); 6] = [
        ("rip 0x7ffffffff000", 0x7fff_ffff_f000, 0, 0, 0, killed(14, 0x14, 0x7fff_ffff_f000)),
        ("rip 0xffff800000001000", 0xffff_8000_0000_1000, 0, 0, 0, killed(14, 0x14, 0xffff_8000_0000_1000)),
        ("rip 0x800000000000", 0x8000_0000_0000, 0, 0, 0, killed(13, 0, 0x8000_0000_0000)),
        ("rsp 0x800000000000", exit42, 0x8000_0000_0000, 0, 0, Exit::Exited(42)),
        ("cs 0x23", exit42, 0, 0x23, 0, killed(13, 0x20, exit42)),
        ("ss 0x1b", exit42, 0, 0, 0x1b, killed(13, 0x18, exit42)),
    ];
    // The selectors are the frame's only with Linux frames.
    let n = if interrupts::linux_frames() { cases.len() } else { 4 };
    user::set_syscalls(&RETURN_SYSCALLS);
    for (name, rip, rsp, cs, ss, want) in &mut cases[..n] {
        for (a, v) in RETURN_TO.iter().zip([*rip, *rsp, *cs, *ss]) {
            a.store(v, Ordering::Relaxed);
        }
        let got = user::run(&UserRegs::new(prog, USER_STACK_TOP));
        let same = match (got, *want) {
            (Exit::Killed { vector, error, rip, .. }, Exit::Killed { vector: v, error: e, rip: r, .. }) => {
                (vector, error, rip) == (v, e, r)
            }
            (got, want) => got == want,
        };
        if !same {
            fail(format_args!("the return to user mode with {name}: {got:x?}, expected {want:x?}"));
        }
    }
    user::set_syscalls(&user::DEFAULT_SYSCALLS);
    n
}

/// A program's end by exception `vector` with `error` at `rip`.
const fn killed(vector: u64, error: u64, rip: u64) -> Exit {
    Exit::Killed { vector, error, cr2: 0, rip }
}

const SYS_THREAD_EXIT: u64 = 5;
/// `SYS_SWITCHES()`: the pair's switches so far.
const SYS_SWITCHES: u64 = 6;
/// A thread ends only once the kernel has switched the pair this often.
const TLS_MIN_SWITCHES: u64 = 10;
static TLS_SYSCALLS: [user::Syscall; 7] =
    [user::sys_exit, user::sys_write, user::sys_counter, sys_getgs, sys_getsp, sys_thread_exit, sys_switches];

fn sys_switches(_frame: &mut TrapFrame) -> u64 {
    SWITCHES.load(Ordering::Relaxed)
}
static THREADS: GuestCell<[Thread; 2]> = GuestCell::new([
    Thread { regs: UserRegs::new(0, 0), fs: 0, done: false, mismatches: 0 },
    Thread { regs: UserRegs::new(0, 0), fs: 0, done: false, mismatches: 0 },
]);
static CURRENT: AtomicUsize = AtomicUsize::new(0);
static SWITCHES: AtomicU64 = AtomicU64::new(0);

/// Makes the other thread current, if it is still alive, through `frame`.
fn switch_thread(frame: &mut TrapFrame) -> bool {
    let cur = CURRENT.load(Ordering::Relaxed);
    let other = 1 - cur;
    // SAFETY: only the timer handler and the thread-exit call (both with
    // virtual interrupts off, on the one vCPU) and `main` outside `run`
    // touch THREADS: no overlapping access.
    let threads = unsafe { &mut *THREADS.get() };
    if threads[other].done {
        return false;
    }
    threads[cur].regs = UserRegs::from_frame(frame);
    threads[other].regs.to_frame(frame);
    user::set_segment_base(user::LGUEST_BASE_FS, threads[other].fs);
    CURRENT.store(other, Ordering::Relaxed);
    SWITCHES.fetch_add(1, Ordering::Relaxed);
    true
}

/// IRQ 0 during the TLS pair: re-arm, and from user mode switch threads.
fn tls_tick(frame: &mut TrapFrame) {
    clock::set_event(TIMER_NS);
    if frame.from_user() {
        switch_thread(frame);
    }
}

/// `SYS_THREAD_EXIT(mismatches)`.
fn sys_thread_exit(frame: &mut TrapFrame) -> u64 {
    let cur = CURRENT.load(Ordering::Relaxed);
    {
        // SAFETY: as in `switch_thread`.
        let threads = unsafe { &mut *THREADS.get() };
        threads[cur].done = true;
        threads[cur].mismatches = frame.rdi;
    }
    if !switch_thread(frame) {
        user::exit(frame, Exit::Exited(0));
    }
    // The return value lands in the other thread's RAX, which only holds
    // this call's number if it was interrupted right before its own call.
    SYS_THREAD_EXIT
}

/// Runs the TLS pair; returns (switches, mismatches of A, of B).
fn tls_threads(space: &mut AddressSpace, start: u64) -> (u64, u64, u64) {
    const VALUES: [u64; 2] = [0xa5a5_0000_0000_000a, 0x5a5a_0000_0000_000b];
    let entry = USER_CODE + (lguest_guest::virt_to_phys(addr_of!(user_tls)) - start);
    for (i, &va) in [TLS_A, TLS_B].iter().enumerate() {
        let frame = frames::alloc().unwrap_or_else(|| fail(format_args!("out of frames")));
        if let Err(e) = space.map(va, frame, PageSize::Small, pte::US | pte::RW | pte::NX) {
            fail(format_args!("mapping a TLS page: {e}"));
        }
        // SAFETY: `frame` is a free page of guest RAM just given to us,
        // mapped at its physical address in the kernel's linear map.
        unsafe { core::ptr::write_volatile(frame as *mut u64, VALUES[i]) };
        let mut regs = UserRegs::new(entry, USER_STACK_TOP - (i as u64) * 2 * PAGE_SIZE);
        regs.rdi = TLS_ROUNDS;
        regs.r12 = VALUES[i];
        // SAFETY: as in `switch_thread`; no user program runs yet.
        unsafe { (*THREADS.get())[i] = Thread { regs, fs: va, done: false, mismatches: 0 } };
    }
    CURRENT.store(0, Ordering::Relaxed);
    user::set_segment_base(user::LGUEST_BASE_FS, TLS_A);
    user::set_syscalls(&TLS_SYSCALLS);
    if let Err(e) = interrupts::set_irq_handler(0, tls_tick) {
        fail(format_args!("IRQ 0 handler: {e}"));
    }
    clock::set_event(TIMER_NS);
    // SAFETY: as above.
    let first = unsafe { (*THREADS.get())[0].regs };
    let got = user::run(&first);
    clock::set_event(0);
    user::set_syscalls(&user::DEFAULT_SYSCALLS);
    if got != Exit::Exited(0) {
        fail(format_args!("the TLS threads ended with {got:x?}"));
    }
    // SAFETY: as above; `run` has returned.
    let t = unsafe { &*THREADS.get() };
    if !t[0].done || !t[1].done {
        fail(format_args!("a TLS thread did not finish"));
    }
    (SWITCHES.load(Ordering::Relaxed), t[0].mismatches, t[1].mismatches)
}

fn rearm() {
    clock::set_event(TIMER_NS);
}

fn fail(what: core::fmt::Arguments<'_>) -> ! {
    crash_fmt(format_args!("user: FAIL: {what}"))
}

fn main(args: Args) -> ! {
    if lguest_guest::kernel_base() != 0 {
        // `user-upper`: say where it runs (the test checks it).
        println!("user: linked at {:#x}, main at {:#x}", lguest_guest::kernel_base(), main as fn(Args) -> ! as usize);
    }
    frames::init_free_ram();
    if let Err(e) = paging::init_kernel() {
        fail(format_args!("kernel map: {e}"));
    }
    let mut space = AddressSpace::new().unwrap_or_else(|e| fail(format_args!("address space: {e}")));
    space.activate();
    if let Err(e) = user::init() {
        fail(format_args!("user::init: {e}"));
    }
    let direct = args.iter().any(|w| w == "direct");
    let calls = args
        .iter()
        .find_map(|w| w.strip_prefix("calls=")?.parse::<u64>().ok())
        .filter(|&n| n > 0)
        .unwrap_or(SYSCALL_CALLS);
    let set_entry = || {
        if direct {
            user::set_syscall_direct();
        } else {
            user::set_syscall_entry(true);
        }
    };
    set_entry();
    if direct {
        println!("user: the direct system-call entry");
    }
    // `ibpb`: a barrier now and one at every entry from user mode.
    if args.iter().any(|w| w == "ibpb") {
        use lguest_guest::abi::{LGUEST_IBPB_DONE, LGUEST_IBPB_NOW, LGUEST_IBPB_USER_ENTRY, LHCALL_IBPB};
        // SAFETY: LHCALL_IBPB takes no address.
        let r = unsafe { lguest_guest::hcall::hcall(LHCALL_IBPB, LGUEST_IBPB_NOW | LGUEST_IBPB_USER_ENTRY, 0, 0, 0) };
        if r == LGUEST_IBPB_DONE {
            println!("user: IBPB at each entry from user mode");
        } else {
            println!("user: IBPB unavailable ({r})");
        }
    }
    if interrupts::linux_frames() {
        println!("user: Linux frames (LGUEST_INIT_LINUX_FRAMES)");
    }
    user::set_fault_hook(Some(fault_hook));

    // The program's pages, read-only and executable for user mode.
    let start = lguest_guest::virt_to_phys(addr_of!(user_prog_start));
    let end = lguest_guest::virt_to_phys(addr_of!(user_prog_end));
    for pa in (start..end).step_by(PAGE_SIZE as usize) {
        if let Err(e) = space.map(USER_CODE + (pa - start), pa, PageSize::Small, pte::US) {
            fail(format_args!("mapping the program: {e}"));
        }
    }
    PROG_LEN.store(end - start, Ordering::Relaxed);
    // Its stack.
    for i in 1..=STACK_PAGES {
        let frame = frames::alloc().unwrap_or_else(|| fail(format_args!("out of frames")));
        if let Err(e) = space.map(USER_STACK_TOP - i * PAGE_SIZE, frame, PageSize::Small, pte::US | pte::RW | pte::NX) {
            fail(format_args!("mapping the stack: {e}"));
        }
    }
    // `bench N`: only time N system calls each way, for lguest_bench.
    if args.first() == Some("bench") {
        let n: u64 = args.get(1).and_then(|w| w.parse().ok()).filter(|&n| n > 0).unwrap_or(10_000);
        for (what, sym) in [("syscall", addr_of!(user_bench_syscall)), ("int80", addr_of!(user_bench_int80))] {
            let va = USER_CODE + (lguest_guest::virt_to_phys(sym) - start);
            let mut regs = UserRegs::new(va, USER_STACK_TOP);
            regs.rdi = n;
            let t0 = clock::rdtsc();
            let got = user::run(&regs);
            let cycles = clock::rdtsc() - t0;
            // The loop leaves RDI at 0, the exit code.
            if got != Exit::Exited(0) {
                fail(format_args!("bench {what}: {got:x?}"));
            }
            let how = if direct && what == "syscall" { "direct syscall" } else { what };
            println!("user: bench: {n} {how} round trips in {cycles} TSC cycles");
        }
        if direct {
            let t0 = clock::rdtsc();
            // SAFETY: as for the checked run below.
            let bad = unsafe { kernel_syscall_hcalls(n) };
            let cycles = clock::rdtsc() - t0;
            if bad != 0 {
                fail(format_args!("bench: {bad} hypercalls by syscall saw a wrong register"));
            }
            println!("user: bench: {n} syscall hypercall round trips in {cycles} TSC cycles");
        }
        poweroff_fmt(format_args!("user: bench done"))
    }
    let kernel_page = lguest_guest::data::address();
    println!(
        "user: program {:#x}..{:#x} at {USER_CODE:#x}, stack at {:#x}, kernel page {kernel_page:#x}",
        start,
        end,
        USER_STACK_TOP - STACK_PAGES * PAGE_SIZE
    );

    let mut regs = UserRegs::new(USER_CODE, USER_STACK_TOP);
    regs.rdi = kernel_page;
    let exit = user::run(&regs);
    let r = user::last_regs();
    let syscalls = user::syscalls();
    println!("user: program ended: {exit:x?}");
    println!(
        "user: {syscalls} syscalls, write returned {}, wrong counter values {}, rax after the hypercall {:#x}",
        r.r13, r.r14, r.rbx
    );

    let Exit::Killed { vector, error, cr2, rip } = exit else {
        fail(format_args!("the program was not killed: {exit:?}"));
    };
    if vector != 14 || error != 0x5 || cr2 != kernel_page {
        fail(format_args!(
            "expected #PF error 0x5 at {kernel_page:#x}, got vector {vector} error {error:#x} cr2 {cr2:#x}"
        ));
    }
    if !(USER_CODE..USER_CODE + (end - start)).contains(&rip) {
        fail(format_args!("the fault's rip {rip:#x} is not in the program"));
    }
    if r.r13 != MESSAGE.len() as u64 {
        fail(format_args!("write returned {:#x}, expected {}", r.r13, MESSAGE.len()));
    }
    if r.r14 != 0 || user::counter() != COUNTER_CALLS {
        fail(format_args!("{} wrong counter values, {} getcounter calls", r.r14, user::counter()));
    }
    if syscalls != COUNTER_CALLS + 1 {
        fail(format_args!("{syscalls} syscalls, expected {}", COUNTER_CALLS + 1));
    }
    let gps = HCALL_GPS.load(Ordering::Relaxed);
    if gps != 1 || r.rbx != HCALL_MARKER {
        fail(format_args!("hypercall attempt: {gps} #GP 0xfa seen, rax after it {:#x}", r.rbx));
    }
    let hcall_rip = HCALL_RIP.load(Ordering::Relaxed);
    if HCALL_RIP_AFTER.load(Ordering::Relaxed) != 0 {
        fail(format_args!(
            "the #GP of int $0x1f from user mode has rip {hcall_rip:#x}, after the instruction (hardware: at it, {:#x})",
            hcall_rip - 2
        ));
    }
    println!("user: hypercall from user mode: #GP error {HCALL_GP_ERROR:#x} at {hcall_rip:#x}, did not reach the host");
    println!("user: kernel #PF handler: user-mode fault, error {error:#x} (U|P) at {cr2:#x}, rip {rip:#x}: killed");
    // Interrupts in user mode: a 50 us timer while the spinner runs; each
    // arrives on the kernel stack and returns with LHCALL_IRET_USER.
    if let Err(e) = clock::init() {
        fail(format_args!("clock: {e}"));
    }
    clock::set_callback(rearm);
    let ticks0 = clock::ticks();
    clock::set_event(TIMER_NS);
    let spin = lguest_guest::virt_to_phys(addr_of!(user_spin));
    let mut regs = UserRegs::new(USER_CODE + (spin - start), USER_STACK_TOP);
    regs.rdi = SPIN_LOOPS;
    let t0 = clock::now_ns();
    let spun = user::run(&regs);
    let spin_ms = (clock::now_ns() - t0) / 1_000_000;
    clock::clear_callback();
    clock::set_event(0);
    let ticks = clock::ticks() - ticks0;
    if spun != Exit::Exited(0) {
        fail(format_args!("the spinner ended with {spun:x?} (Exited(n): n registers changed)"));
    }
    if ticks == 0 {
        fail(format_args!("no timer interrupt in {spin_ms} ms of user mode"));
    }
    println!("user: {ticks} timer interrupts during {spin_ms} ms in user mode, 15 registers intact");

    // The syscall instruction: through the host to our entry, RCX and R11
    // as hardware leaves them, the other registers intact.
    // With the direct entry, the timer interrupts the calls too.
    let sc0 = user::syscalls();
    let sys = lguest_guest::virt_to_phys(addr_of!(user_syscalls));
    let mut regs = UserRegs::new(USER_CODE + (sys - start), USER_STACK_TOP);
    regs.rdi = calls;
    let ticks0 = clock::ticks();
    if direct {
        clock::set_callback(rearm);
        clock::set_event(TIMER_NS);
    }
    let got = user::run(&regs);
    if direct {
        clock::clear_callback();
        clock::set_event(0);
    }
    let ticks = clock::ticks() - ticks0;
    let made = user::syscalls() - sc0;
    if got != Exit::Exited(0) {
        fail(format_args!("the syscall program ended with {got:x?} (Exited(n): n calls saw a wrong register)"));
    }
    // Its own: one int $0x80 to start, the syscalls, the exit.
    if made != calls + 2 {
        fail(format_args!("the syscall program made {made} system calls, expected {}", calls + 2));
    }
    println!("user: {calls} syscall instructions: RCX, R11, RAX and 10 other registers right after each");
    if direct {
        if ticks == 0 {
            fail(format_args!("no timer interrupt during {calls} direct system calls"));
        }
        println!("user: {ticks} timer interrupts during the direct system calls");
        // The kernel's own hypercalls by syscall, with the timer
        // interrupting them (virtual interrupts on).
        let ticks0 = clock::ticks();
        clock::set_callback(rearm);
        clock::set_event(TIMER_NS);
        let flags = lguest_guest::paravirt::save_fl();
        lguest_guest::paravirt::irq_enable();
        // An interrupt returns with every register as it was.
        // SAFETY: the function keeps the SysV ABI; its hypercalls
        // (SEND_INTERRUPTS) change nothing but RCX, R11 and RAX.
        let bad = unsafe { kernel_syscall_hcalls(calls) };
        // Stopped with interrupts still on: a tick raised before the
        // cancel is taken by the time it returns (it is an exit).
        clock::clear_callback();
        clock::set_event(0);
        lguest_guest::paravirt::restore_fl(flags);
        let ticks = clock::ticks() - ticks0;
        if bad != 0 {
            fail(format_args!("{bad} of {calls} hypercalls by syscall saw a wrong register"));
        }
        if ticks == 0 {
            fail(format_args!("no timer interrupt during {calls} hypercalls by syscall"));
        }
        println!(
            "user: {calls} hypercalls by syscall: RCX, R11 and 9 other registers right after each, {ticks} timer interrupts among them"
        );
        // An interrupt the kernel held back during a system call is taken
        // at the return to user mode, before the first user instruction
        // (the switcher leaves that return to the host), not at some later
        // exit.
        user::set_syscalls(&HOLD_SYSCALLS);
        if let Err(e) = interrupts::set_irq_handler(0, hold_tick) {
            fail(format_args!("IRQ 0 handler: {e}"));
        }
        let hold = USER_CODE + (lguest_guest::virt_to_phys(addr_of!(user_hold)) - start);
        for round in 0..5 {
            HOLD_R12.store(u64::MAX, Ordering::Relaxed);
            HOLD_RIP.store(0, Ordering::Relaxed);
            let got = user::run(&UserRegs::new(hold, USER_STACK_TOP));
            let (r12, rip) = (HOLD_R12.load(Ordering::Relaxed), HOLD_RIP.load(Ordering::Relaxed));
            if got != Exit::Exited(0) || r12 != 0 || rip != hold + 10 {
                fail(format_args!(
                    "held interrupt, round {round}: {got:x?}, taken at rip {rip:#x} after {r12} counts (want {:#x}, 0)",
                    hold + 10
                ));
            }
        }
        user::set_syscalls(&user::DEFAULT_SYSCALLS);
        if let Err(e) = clock::init() {
            fail(format_args!("clock: {e}"));
        }
        println!("user: a timer interrupt held back in a system call: taken at the return, before the first user instruction (5 of 5)");
    }

    // Segment bases: one GS base per mode, swapped by the host at each
    // switch; FS the same in both.
    if fsgsbase() {
        const K: u64 = 0x7000_1000;
        const U: u64 = 0x7000_2000;
        const F: u64 = 0x7000_3000;
        const U2: u64 = 0x7000_4000;
        user::set_segment_base(user::LGUEST_BASE_GS, K);
        user::set_segment_base(user::LGUEST_BASE_USER_GS, U);
        user::set_segment_base(user::LGUEST_BASE_FS, F);
        if rdgsbase() != K {
            fail(format_args!("kernel GS base {:#x} after SET_SEGMENT_BASE, expected {K:#x}", rdgsbase()));
        }
        user::set_syscalls(&GS_SYSCALLS);
        let gs = lguest_guest::virt_to_phys(addr_of!(user_gs));
        let mut regs = UserRegs::new(USER_CODE + (gs - start), USER_STACK_TOP);
        regs.rdi = U2;
        regs.rsi = SYS_GETGS;
        let got = user::run(&regs);
        user::set_syscalls(&user::DEFAULT_SYSCALLS);
        let r = user::last_regs();
        let seen = [r.r15, r.r14, r.r12, r.r13, r.rbx, rdgsbase()];
        if got != Exit::Exited(0) || seen != [U, F, K, K, U2, K] {
            fail(format_args!(
                "segment bases: {got:x?}; user GS at start, FS, kernel GS in int $0x80 and in syscall, user GS after, \
                 kernel GS after: {seen:#x?}, expected {:#x?}",
                [U, F, K, K, U2, K]
            ));
        }
        println!("user: GS bases: user {U:#x} -> {U2:#x} (wrgsbase), kernel {K:#x} in both entries, FS {F:#x}");

        // kernel_sp0: entries from user mode land on the stack it names,
        // and on SET_STACK's again once it is 0.
        let base = lguest_guest::virt_to_phys(core::ptr::addr_of!(SECOND_STACK).cast::<u8>());
        let top = base + 8192;
        let mut frames = [0u64; 2];
        for (i, sp0) in [top, 0].into_iter().enumerate() {
            lguest_guest::data::set_kernel_sp0(sp0);
            user::set_syscalls(&GS_SYSCALLS);
            let mut regs = UserRegs::new(USER_CODE + (gs - start), USER_STACK_TOP);
            regs.rdi = U2;
            regs.rsi = SYS_GETSP;
            let got = user::run(&regs);
            user::set_syscalls(&user::DEFAULT_SYSCALLS);
            if got != Exit::Exited(0) {
                fail(format_args!("kernel_sp0 {sp0:#x}: {got:x?}"));
            }
            frames[i] = user::last_regs().r12;
        }
        if !(base..top).contains(&frames[0]) || (base..top).contains(&frames[1]) {
            fail(format_args!(
                "kernel_sp0: frames at {:#x} (wanted in {base:#x}..{top:#x}) and {:#x} (wanted outside it)",
                frames[0], frames[1]
            ));
        }
        println!("user: kernel_sp0: the entry's frame on the stack it names, and back on SET_STACK's at 0");
    } else {
        println!("user: no FSGSBASE: the segment-base program needs rdgsbase");
    }

    // FS-based TLS in two user threads switched by this kernel.
    let (switches, ma, mb) = tls_threads(&mut space, start);
    if switches < TLS_MIN_SWITCHES || ma != 0 || mb != 0 {
        fail(format_args!(
            "TLS threads: {switches} switches (want >= {TLS_MIN_SWITCHES}), mismatches {ma} and {mb} (want 0)"
        ));
    }
    println!("user: TLS: 2 threads, {switches} switches by the kernel, each read its own %fs:0 every round");

    // Exceptions in user mode: each kills the program with the vector,
    // error code and RIP hardware would give (RIP at the instruction for
    // faults, after it for the int3 trap).
    user::set_fault_hook(None);
    let kernel_fn = crate::main as fn(Args) -> ! as usize as u64;
    let sysret_gp = (u64::from(lguest_guest::abi::LGUEST_SYSRET_VECTOR) << 3) | 2;
    let cases: [(&str, u64, u64, u64, u64, u64); 8] = [
        ("hlt", addr_of!(user_exc_hlt) as u64, 0, 13, 0, 0),
        ("cli", addr_of!(user_exc_cli) as u64, 0, 13, 0, 0),
        ("non-canonical read", addr_of!(user_exc_noncanon) as u64, 0, 13, 0, 10),
        ("int3", addr_of!(user_exc_int3) as u64, 0, 3, 0, 1),
        ("ud2", addr_of!(user_exc_ud2) as u64, 0, 6, 0, 0),
        ("int $0x1b", addr_of!(user_exc_sysret) as u64, 0, 13, sysret_gp, 0),
        ("div by 0", addr_of!(user_exc_div) as u64, 0, 0, 0, 2),
        ("jump to kernel code", addr_of!(user_exc_exec_kernel) as u64, kernel_fn, 14, 0x15, u64::MAX),
    ];
    for (name, at, rdi, vector, error, rip_off) in cases {
        let va = USER_CODE + (lguest_guest::virt_to_phys(at as *const u8) - start);
        let mut regs = UserRegs::new(va, USER_STACK_TOP);
        regs.rdi = rdi;
        let got = user::run(&regs);
        let want_rip = if rip_off == u64::MAX { rdi } else { va + rip_off };
        let ok = matches!(got, Exit::Killed { vector: v, error: e, rip, .. } if v == vector && e == error && rip == want_rip);
        if !ok {
            fail(format_args!(
                "{name} in user mode: {got:x?}, expected vector {vector} error {error:#x} at rip {want_rip:#x}"
            ));
        }
    }
    println!("user: {} exceptions in user mode (hlt, cli, non-canonical, int3, ud2, int $0x1b, #DE, fetch of kernel code) as hardware reports them", cases.len());
    let n = bad_returns(start);
    println!("user: {n} returns to user mode that a CPU refuses or that fault (RIP, RSP, CS, SS): the fault hardware gives, in user mode");
    // Without an entry, `syscall` is #UD at the instruction (EFER.SCE clear).
    user::set_syscall_entry(false);
    let va = USER_CODE + (lguest_guest::virt_to_phys(addr_of!(user_exc_syscall)) - start);
    let got = user::run(&UserRegs::new(va, USER_STACK_TOP));
    set_entry();
    if !matches!(got, Exit::Killed { vector: 6, error: 0, rip, .. } if rip == va) {
        fail(format_args!("syscall without an entry: {got:x?}, expected #UD at {va:#x}"));
    }
    println!("user: syscall with no entry registered: #UD at the instruction");

    let done = format_args!(
        "user: done: {syscalls} syscalls (1 write, {COUNTER_CALLS} getcounter), hypercall -> #GP error \
         {HCALL_GP_ERROR:#x}, killed by #PF error {error:#x} at {cr2:#x}"
    );
    println!("{done}");
    poweroff_fmt(done)
}
