// SPDX-License-Identifier: GPL-2.0
//! What lguest requires of the host, checked once when the module loads.
//!
//! The switcher will depend on the host's control registers being in a state
//! it knows how to save and restore. Anything it does not support yet makes
//! `insmod` fail with a message in the kernel log that says why, instead of
//! a crash the first time a guest runs.

use kernel::prelude::*;

/// CR4.FRED (bit 32): flexible return and event delivery replaces the IDT
/// entry path the switcher relies on.
const X86_CR4_FRED: u64 = 1 << 32;

/// Reads the current CPU's CR4.
fn read_cr4() -> u64 {
    let cr4: u64;
    // SAFETY: Reading CR4 has no side effects; the module runs in ring 0, and
    // the instruction touches neither memory nor the stack.
    unsafe {
        core::arch::asm!("mov {}, cr4", out(reg) cr4, options(nomem, nostack, preserves_flags));
    }
    cr4
}

/// Refuses hosts that lguest cannot run on, saying why in the kernel log.
pub(crate) fn check_host() -> Result {
    let cr4 = read_cr4();
    if cr4 & X86_CR4_FRED != 0 {
        pr_err!("lguest: FRED is active on this host (CR4.FRED); boot with fred=off to use lguest\n");
        return Err(ENODEV);
    }
    pr_info!("lguest: host CR4 {:#x}, ABI version {}\n", cr4, crate::uapi::LGUEST_API_VERSION);
    Ok(())
}
