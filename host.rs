// SPDX-License-Identifier: GPL-2.0
//! What lguest requires of the host, checked once when the module loads.
//!
//! The switcher saves and restores a known set of CPU state. A host whose
//! control registers are in a state it does not handle (FRED), or whose
//! memory or CPU state the switcher cannot manage (encrypted memory, TDX,
//! Xen PV), makes `insmod` fail with a message in the kernel log that says
//! why, instead of a crash the first time a guest runs. What is merely
//! weaker (no UMIP, Meltdown without PTI) is reported.

use kernel::prelude::*;

use crate::helpers;

/// CR4 bits the switcher cares about.
const CR4_UMIP: u64 = 1 << 11;
const CR4_LA57: u64 = 1 << 12;
const CR4_PCIDE: u64 = 1 << 17;
const CR4_SMEP: u64 = 1 << 20;
const CR4_SMAP: u64 = 1 << 21;
const CR4_PKE: u64 = 1 << 22;
const CR4_CET: u64 = 1 << 23;
/// CR4.FRED (bit 32): flexible return and event delivery replaces the IDT
/// entry path the switcher relies on.
const CR4_FRED: u64 = 1 << 32;
/// EFER bits.
const EFER_LMA: u64 = 1 << 10;
const EFER_NXE: u64 = 1 << 11;

/// What `simulate_refusal` (a module parameter, for the tests of these
/// messages) makes the checks believe.
const SIMULATE_FRED: u32 = 1;
const SIMULATE_MEM_ENCRYPT: u32 = 2;
const SIMULATE_TDX: u32 = 4;
const SIMULATE_XEN_PV: u32 = 8;

/// Refuses hosts that lguest cannot run on, saying why in the kernel log.
/// `simulate` pretends the host has the features its bits name.
pub(crate) fn check_host(simulate: u32) -> Result {
    let cr4 = helpers::read_cr4()
        | if simulate & SIMULATE_FRED != 0 {
            CR4_FRED
        } else {
            0
        };
    let efer = helpers::read_efer();
    if cr4 & CR4_FRED != 0 {
        pr_err!("FRED is active on this host (CR4.FRED); the switcher needs IDT event delivery: boot with fred=off\n");
        return Err(ENODEV);
    }
    if efer & EFER_LMA == 0 || efer & EFER_NXE == 0 {
        pr_err!("needs long mode with no-execute pages (EFER {:#x})\n", efer);
        return Err(ENODEV);
    }
    let simulated = match simulate {
        s if s & SIMULATE_MEM_ENCRYPT != 0 => {
            helpers::host_refusal_text(helpers::Refusal::MemEncrypt)
        }
        s if s & SIMULATE_TDX != 0 => helpers::host_refusal_text(helpers::Refusal::Tdx),
        s if s & SIMULATE_XEN_PV != 0 => helpers::host_refusal_text(helpers::Refusal::XenPv),
        _ => None,
    };
    if let Some(why) = simulated.or_else(helpers::host_refusal) {
        pr_err!(
            "cannot run on this host: {}\n",
            why.to_str().unwrap_or("(unprintable)")
        );
        return Err(ENODEV);
    }
    let on = |bit: u64| if cr4 & bit != 0 { "on" } else { "off" };
    let levels = if cr4 & CR4_LA57 != 0 { 5 } else { 4 };
    pr_info!(
        "host CR4 {:#x}: {}-level paging, PCID {}, SMEP {}, SMAP {}, PKE {}, CET {}, UMIP {}; ABI version {}\n",
        cr4,
        levels,
        on(CR4_PCIDE),
        on(CR4_SMEP),
        on(CR4_SMAP),
        on(CR4_PKE),
        on(CR4_CET),
        on(CR4_UMIP),
        crate::uapi::LGUEST_API_VERSION
    );
    if helpers::cpu_meltdown() {
        // The host's PTI does not change the guests' tables: page 0 is
        // mapped (supervisor) in each, with the direct system call's state.
        pr_warn!("this CPU is affected by Meltdown: a guest's processes could read this CPU's switcher page 0 in their own tables (the guest kernel's GS base and entry, the shadow roots' physical addresses), whatever the host's page-table isolation\n");
    }
    if helpers::meltdown_without_pti() {
        pr_warn!("this CPU is affected by Meltdown and page-table isolation is off: a guest could read the kernel memory its page tables map (the switcher's pages; see Documentation/switcher.rst)\n");
    }
    if cr4 & CR4_UMIP == 0 {
        pr_warn!("UMIP is off: guests can read the addresses of the switcher's GDT and IDT with sgdt/sidt\n");
    }
    Ok(())
}
