// SPDX-License-Identifier: GPL-2.0
//! `debugreg_dr7`: which of a guest's hardware breakpoints the host arms
//! (`LHCALL_SET_DEBUGREGS`).

use lguest_abi::{debugreg_dr7, GUEST_VA_END};

/// DR7 for breakpoint `i` enabled locally with `rw` and `len`.
fn bp(i: u64, rw: u64, len: u64) -> u64 {
    (1 << (2 * i)) | (rw << (16 + 4 * i)) | (len << (18 + 4 * i))
}

#[test]
fn user_breakpoints_are_armed_as_asked() {
    let addrs = [0x40_1000, 0x7fff_0000_0008, 0x1234, 0x5000];
    // An execution breakpoint, a write watch of 8, a read/write of 2 and
    // a write of 4, with GE as Linux sets it.
    let dr7 = bp(0, 0, 0) | bp(1, 1, 2) | bp(2, 3, 1) | bp(3, 1, 3) | 0x200;
    assert_eq!(debugreg_dr7(dr7, &addrs), dr7 | 0x400);
    // Global enables are kept as well.
    assert_eq!(debugreg_dr7(2, &addrs), 2 | 0x400);
    // Nothing enabled: 0, whatever the other fields say.
    assert_eq!(debugreg_dr7(0x000f_0300, &addrs), 0);
}

#[test]
fn host_addresses_and_bad_kinds_are_refused() {
    let top = GUEST_VA_END;
    let addrs = [top, top - 4, 0xffff_8000_0000_1000, 0x1000];
    // At the end of user space; a 8-byte watch that would cross it (the
    // CPU aligns top - 4 down to top - 8: accepted); the switcher's slot.
    assert_eq!(debugreg_dr7(bp(0, 1, 0), &addrs), 0);
    assert_eq!(debugreg_dr7(bp(1, 1, 2), &addrs), bp(1, 1, 2) | 0x400);
    assert_eq!(debugreg_dr7(bp(2, 0, 0), &addrs), 0);
    // The last byte below the end is a user address.
    assert_eq!(
        debugreg_dr7(bp(0, 1, 0), &[top - 1, 0, 0, 0]),
        bp(0, 1, 0) | 0x400
    );
    // A 4-byte watch at top - 2 is aligned down to top - 4: all below.
    assert_eq!(
        debugreg_dr7(bp(0, 1, 3), &[top - 2, 0, 0, 0]),
        bp(0, 1, 3) | 0x400
    );
    // I/O breakpoints, execution breakpoints with a length.
    assert_eq!(debugreg_dr7(bp(3, 2, 0), &addrs), 0);
    assert_eq!(debugreg_dr7(bp(3, 0, 1), &addrs), 0);
    // One refused, one armed: only the armed one's fields stay.
    let dr7 = bp(0, 1, 0) | bp(3, 3, 2);
    assert_eq!(debugreg_dr7(dr7, &addrs), bp(3, 3, 2) | 0x400);
    // GD and RTM are never armed.
    assert_eq!(
        debugreg_dr7(bp(3, 1, 0) | 1 << 13 | 1 << 11, &addrs),
        bp(3, 1, 0) | 0x400
    );
}
