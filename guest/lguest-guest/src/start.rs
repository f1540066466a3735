// SPDX-License-Identifier: GPL-2.0
//! The first instructions of the guest, `_start`, and the Rust side of boot.
//!
//! The launcher enters `_start` in ring 3 with RDI = guest-physical address
//! of the command line, RSI = RAM size, and a stack pointer it promises
//! nothing about. `_start` clears the direction flag, zeroes .bss (the
//! launcher already zero-fills it; doing it here makes the guest independent
//! of that), switches to a 64 KiB stack in .bss and calls `lguest_start`,
//! which [`entry!`](macro@crate::entry) defines in the guest binary as a call of
//! [`boot`] with the guest's `main`. Nothing here uses the incoming stack.
//!
//! An image linked in the top 2 GiB ([`crate::kernel_base`] not 0) is
//! entered at its physical address too, on the launcher's linear map, which
//! has no upper half. Before anything that needs its link address, `_start`
//! builds boot page tables in .bss (`lguest_boot_tables`: RAM from 2 MiB up
//! at virtual = physical, and its first 2 GiB again at the kernel base; 2 MiB
//! pages, the last partial one in 4 KiB pages), switches to them with
//! `LHCALL_NEW_PGTABLE` (the one hypercall the host takes before
//! `LHCALL_LGUEST_INIT`), and jumps to where it is linked, as Linux's
//! `startup_64` does. [`crate::paging`] keeps the same upper mapping in
//! every address space it makes.

use core::arch::global_asm;
use core::sync::atomic::{AtomicU64, Ordering};

use crate::entry::Main;
use crate::{cmdline, data};

/// Bytes of the boot stack.
pub const STACK_SIZE: usize = 64 * 1024;

// `__bss_start` and `__bss_end` come from lguest-guest.ld; the stack is in
// .bss, which is fine: nothing is on it until RSP points there. RDI and RSI
// are parked in R12 and R13 across `rep stosb` (which uses RDI, RCX, RAX).
// The `call` leaves RSP 8 below a 16-byte boundary, as the ABI wants at a
// function's entry. `ud2` marks the impossible return.
global_asm!(
    ".pushsection .bss.lguest_boot_tables, \"aw\", @nobits",
    ".balign 4096",
    "lguest_boot_tables:",
    ".skip 8 * 4096",
    ".popsection",
    "",
    ".pushsection .bss.lguest_stack, \"aw\", @nobits",
    ".balign 16",
    "lguest_stack_bottom:",
    ".skip {stack_size}",
    "lguest_stack_top:",
    ".popsection",
    "",
    ".pushsection .text._start, \"ax\", @progbits",
    ".globl _start",
    ".type _start, @function",
    "_start:",
    "    cld",
    "    mov r12, rdi",
    "    mov r13, rsi",
    "    lea rdi, [rip + __bss_start]",
    "    lea rcx, [rip + __bss_end]",
    "    sub rcx, rdi",
    "    xor eax, eax",
    "    rep stosb",
    // Where we run minus where we are linked: 0, or the kernel base.
    "    lea rax, [rip + _start]",
    "    movabs rcx, offset _start",
    "    sub rcx, rax",
    "    jz 3f",
    // r8: 8 pages: PML4, PDPT low, PDPT high, the tail's page table, 4 PDs.
    "    lea r8, [rip + lguest_boot_tables]",
    "    lea rax, [r8 + 0x1003]",
    "    mov [r8], rax",
    "    lea rax, [r8 + 0x2003]",
    "    mov [r8 + 8 * 511], rax",
    "    lea rax, [r8 + 0x4003]",
    "    mov [r8 + 0x1000], rax",
    "    mov [r8 + 0x2000 + 8 * 510], rax",
    "    add rax, 0x1000",
    "    mov [r8 + 0x1008], rax",
    "    mov [r8 + 0x2000 + 8 * 511], rax",
    "    add rax, 0x1000",
    "    mov [r8 + 0x1010], rax",
    "    add rax, 0x1000",
    "    mov [r8 + 0x1018], rax",
    // r9: the end of what is mapped, RAM's (at most 4 GiB).
    "    mov r9, r13",
    "    mov r10, 0x100000000",
    "    cmp r9, r10",
    "    cmova r9, r10",
    // 2 MiB pages from 2 MiB while a whole one fits (P, RW, PS).
    "    mov r10, 0x200000",
    "1:  lea rax, [r10 + 0x200000]",
    "    cmp rax, r9",
    "    ja 2f",
    "    mov rax, r10",
    "    shr rax, 21",
    "    lea rdx, [r10 + 0x83]",
    "    mov [r8 + 0x4000 + rax * 8], rdx",
    "    add r10, 0x200000",
    "    jmp 1b",
    // The rest, in 4 KiB pages of one page table.
    "2:  cmp r10, r9",
    "    jae 4f",
    "    mov rax, r10",
    "    shr rax, 21",
    "    lea rdx, [r8 + 0x3003]",
    "    mov [r8 + 0x4000 + rax * 8], rdx",
    "5:  mov rax, r10",
    "    shr rax, 12",
    "    and eax, 511",
    "    lea rdx, [r10 + 3]",
    "    mov [r8 + 0x3000 + rax * 8], rdx",
    "    add r10, 0x1000",
    "    cmp r10, r9",
    "    jb 5b",
    "4:  mov eax, {new_pgtable}",
    "    mov rdi, r8",
    "    int 0x1f",
    "    lea rax, [rip + 3f]",
    "    add rax, rcx",
    "    jmp rax",
    "3:  lea rsp, [rip + lguest_stack_top]",
    "    xor ebp, ebp",
    "    mov rdi, r12",
    "    mov rsi, r13",
    "    call lguest_start",
    "    ud2",
    ".size _start, . - _start",
    ".popsection",
    stack_size = const STACK_SIZE,
    new_pgtable = const lguest_abi::LHCALL_NEW_PGTABLE,
);

/// The Rust side of boot, called from the guest's `lguest_start` (see
/// [`entry!`](macro@crate::entry)): reads the command line (its library
/// words say how to register), registers `lguest_data` with the host before
/// anything else talks to it, and runs `main`.
pub fn boot<M: Main>(cmdline_pa: u64, mem_size: u64, main: M) -> ! {
    // The command line first: its library words choose how LGUEST_INIT
    // is made.
    let args = cmdline::init(cmdline_pa, mem_size);
    data::init();
    RAM_SIZE.store(mem_size, Ordering::Relaxed);
    main.run(args)
}

/// Bytes of guest RAM, from RSI at entry (0 before [`boot`]).
static RAM_SIZE: AtomicU64 = AtomicU64::new(0);

/// Bytes of guest RAM, as the launcher gave them at entry: RAM is
/// guest-physical `[0, ram_size())`, and the lguest bus's device window
/// starts right above it.
pub fn ram_size() -> u64 {
    RAM_SIZE.load(Ordering::Relaxed)
}

extern "C" {
    /// First byte of the image (lguest-guest.ld).
    static __image_start: u8;
    /// First byte past the image, .bss and boot stack included, page
    /// aligned (lguest-guest.ld).
    static __image_end: u8;
}

/// The guest-physical range the loaded image occupies: every static and
/// the boot stack live in it.
pub fn image() -> core::ops::Range<u64> {
    let start = crate::virt_to_phys(core::ptr::addr_of!(__image_start));
    let end = crate::virt_to_phys(core::ptr::addr_of!(__image_end));
    start..end
}
