// SPDX-License-Identifier: GPL-2.0
//! [`hcall`]: the one place the guest traps into the host.
//!
//! The convention (`LGUEST_TRAP_ENTRY` in the ABI): `int $0x1f` with the
//! `LHCALL_*` number in RAX and arguments 1 to 4 in RDI, RSI, RDX and R10;
//! the result comes back in RAX and every other register is preserved.
//!
//! `LHCALL_HALT` and `LHCALL_SEND_INTERRUPTS` (and any hypercall, once
//! interrupts are on) may return through an interrupt: the host delivers it
//! with RIP just after the `int $0x1f`, the handler runs on our stack, below
//! RSP, and returns here with every register as the host left it.

use core::arch::asm;

/// Makes hypercall `nr` with arguments `a1`..`a4` and returns RAX.
///
/// It is never inlined, so `objdump -d` shows exactly one `int $0x1f` in a
/// function named `hcall`, and the cost of a call is noise next to a world
/// switch.
///
/// # Safety
///
/// The host reads and writes guest memory on the guest's behalf: every
/// argument that is an address must satisfy the contract of hypercall `nr`
/// (for example: point to a NUL-terminated string, or to memory the host may
/// write for as long as it keeps the address).
#[inline(never)]
pub unsafe fn hcall(nr: u64, a1: u64, a2: u64, a3: u64, a4: u64) -> u64 {
    let ret: u64;
    // SAFETY: `int $0x1f` enters the host, which follows the convention above:
    // only RAX changes. The host may deliver an interrupt on the way back,
    // which pushes a frame below our RSP (so no `nostack`: there must be
    // nothing there, and the target has no red zone) and runs a handler that
    // preserves every register. The host and the handler may read or write
    // memory, which is why `nomem`/`readonly` are absent: the compiler must
    // assume memory changed. The caller vouches for any addresses passed.
    unsafe {
        asm!(
            "int 0x1f",
            inlateout("rax") nr => ret,
            in("rdi") a1,
            in("rsi") a2,
            in("rdx") a3,
            in("r10") a4,
        );
    }
    ret
}
