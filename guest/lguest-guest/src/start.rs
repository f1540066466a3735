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
    "    lea rsp, [rip + lguest_stack_top]",
    "    xor ebp, ebp",
    "    mov rdi, r12",
    "    mov rsi, r13",
    "    call lguest_start",
    "    ud2",
    ".size _start, . - _start",
    ".popsection",
    stack_size = const STACK_SIZE,
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
