// SPDX-License-Identifier: GPL-2.0
//! `--cpuid`: what the guest's CPUID says.
//!
//! - `host` (the default): the launcher sets no table and the guest sees
//!   the host CPU, as a plain `cpuid` in ring 3 does.
//! - `filtered`: the launcher reads the host's CPUID, hides what a guest of
//!   lguest cannot use ([`filter`]: the hypervisor features, the APIC, the
//!   machine-check, performance-monitoring, power and speculation-control
//!   interfaces, supervisor-only protections, PCID, LA57, XSAVES, CET,
//!   FRED, LASS, LAM, 1 GiB pages, RDTSCP and RDPID), sets the hypervisor bit and a
//!   hypervisor leaf 0x40000000 ("LguestLguest", [`SIGNATURE`]), and gives
//!   the table to the module (`LGUEST_SET_CPUID`). The guest gets it through
//!   the forced-emulation prefix on any host, and from a plain `cpuid` too
//!   where the host can make CPUID fault: the vCPU thread then asks for
//!   that (`arch_prctl(ARCH_SET_CPUID, 0)`, [`fault_on_this_thread`]).
//!
//! The table is what `linux-guest.md`'s CPUID filtering lists, so that a
//! guest kernel sees a CPU it can drive from ring 3.

use std::arch::x86_64::__cpuid_count;

use lguest_abi::{self as abi, LguestCpuidEntry};

/// The hypervisor leaf's vendor string (EBX, ECX, EDX of 0x40000000).
pub const SIGNATURE: &[u8; 12] = b"LguestLguest";

/// `--cpuid`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CpuidMode {
    /// No table: the host's CPUID.
    #[default]
    Host,
    /// The host's CPUID, filtered, with the hypervisor leaf.
    Filtered,
}

impl std::str::FromStr for CpuidMode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "host" => Ok(Self::Host),
            "filtered" => Ok(Self::Filtered),
            _ => Err(format!("{s:?}: expected host or filtered")),
        }
    }
}

/// Leaves whose subleaves differ, and how many to read at most.
fn subleaves(leaf: u32, first: [u32; 4]) -> u32 {
    match leaf {
        // Cache parameters: until the type field is 0 (the null one
        // included, so the guest sees the end).
        4 => 16,
        // Structured features: EAX of subleaf 0 is the last subleaf.
        7 | 0x14 | 0x17 | 0x18 | 0x1d | 0x20 | 0x24 => first[0].min(15) + 1,
        // Topology: until the level type is 0.
        0xb | 0x1f => 8,
        // XSAVE components: 0 to 63 (most are empty and left out).
        0xd => 64,
        // Resource monitoring and allocation, SGX.
        0xf | 0x10 | 0x12 => 4,
        _ => 0,
    }
}

/// Whether subleaf `sub` of `leaf` (values `v`) ends the enumeration.
fn last_subleaf(leaf: u32, v: [u32; 4]) -> bool {
    match leaf {
        4 => v[0] & 0x1f == 0,
        0xb | 0x1f => (v[2] >> 8) & 0xff == 0,
        _ => false,
    }
}

/// The host CPU's CPUID, every basic and extended leaf, with the subleaves
/// of the leaves that have them, as a table (at most
/// [`abi::LGUEST_MAX_CPUID_ENTRIES`] entries).
pub fn host_table() -> Vec<LguestCpuidEntry> {
    let read = |leaf: u32, sub: u32| {
        let r = __cpuid_count(leaf, sub);
        [r.eax, r.ebx, r.ecx, r.edx]
    };
    let entry = |leaf: u32, sub: u32, flags: u32, v: [u32; 4]| LguestCpuidEntry {
        function: leaf,
        index: sub,
        flags,
        eax: v[0],
        ebx: v[1],
        ecx: v[2],
        edx: v[3],
        padding: [0; 3],
    };
    let mut out = Vec::new();
    for base in [0u32, 0x8000_0000] {
        let max = read(base, 0)[0];
        // A bogus maximum (a leaf number of the other range) ends it.
        let last = if max < base || max - base > 0xff { base } else { max };
        for leaf in base..=last {
            let first = read(leaf, 0);
            let n = subleaves(leaf, first);
            if n == 0 {
                out.push(entry(leaf, 0, 0, first));
                continue;
            }
            for sub in 0..n {
                let mut v = if sub == 0 { first } else { read(leaf, sub) };
                // FSGSBASE as the host kernel enabled it: the guest runs
                // under the host's CR4, so where the host left CR4.FSGSBASE
                // off (`nofsgsbase`, or a kernel that does not use it) the
                // instructions raise #UD in the guest, whatever the CPU has.
                if (leaf, sub) == (7, 0) && !host_fsgsbase() {
                    v[1] &= !1;
                }
                // XSAVE: the empty components are left out (they read as
                // zeros from the table anyway).
                if leaf == 0xd && sub > 1 && v == [0; 4] {
                    continue;
                }
                out.push(entry(leaf, sub, abi::LGUEST_CPUID_FLAG_SIGNIFICANT_INDEX, v));
                if last_subleaf(leaf, v) {
                    break;
                }
            }
        }
    }
    out.truncate(abi::LGUEST_MAX_CPUID_ENTRIES as usize - 1);
    out
}

/// `HWCAP2_FSGSBASE` (`asm/hwcap2.h`): the kernel enabled FSGSBASE.
const HWCAP2_FSGSBASE: libc::c_ulong = 1 << 1;

/// Whether the host kernel enabled FSGSBASE (CR4.FSGSBASE), which it says
/// in `AT_HWCAP2`.
fn host_fsgsbase() -> bool {
    // SAFETY: getauxval only reads the auxiliary vector.
    unsafe { libc::getauxval(libc::AT_HWCAP2) & HWCAP2_FSGSBASE != 0 }
}

/// Bits hidden from the guest: (leaf, subleaf, register 0-3 for EAX-EDX,
/// mask). The subleaf is ignored for leaves without subleaves.
const HIDDEN: &[(u32, u32, usize, u32)] = &[
    // Leaf 1 ECX: DTES64, MONITOR, DS-CPL, VMX, SMX, EST, TM2, PDCM, PCID,
    // x2APIC, TSC-deadline.
    (1, 0, 2, 1 << 2 | 1 << 3 | 1 << 4 | 1 << 5 | 1 << 6 | 1 << 7 | 1 << 8 | 1 << 15 | 1 << 17 | 1 << 21 | 1 << 24),
    // Leaf 1 EDX: MCE, APIC, MTRR, MCA, PAT, DS, ACPI, TM, PBE.
    (1, 0, 3, 1 << 7 | 1 << 9 | 1 << 12 | 1 << 14 | 1 << 16 | 1 << 21 | 1 << 22 | 1 << 29 | 1 << 31),
    // Leaf 7.0 EBX: SMEP, INVPCID, RDT-M, RDT-A, SMAP, Processor Trace.
    (7, 0, 1, 1 << 7 | 1 << 10 | 1 << 12 | 1 << 15 | 1 << 20 | 1 << 25),
    // Leaf 7.0 ECX: UMIP, PKU, OSPKE, CET shadow stacks, LA57, RDPID.
    (7, 0, 2, 1 << 2 | 1 << 3 | 1 << 4 | 1 << 7 | 1 << 16 | 1 << 22),
    // Leaf 7.0 EDX: CET IBT, IBRS/IBPB, STIBP, L1D_FLUSH,
    // ARCH_CAPABILITIES, CORE_CAPABILITIES, SSBD.
    (7, 0, 3, 1 << 20 | 1 << 26 | 1 << 27 | 1 << 28 | 1 << 29 | 1 << 30 | 1 << 31),
    // Leaf 7.1 EAX: LASS, FRED, LKGS, LAM.
    (7, 1, 0, 1 << 6 | 1 << 17 | 1 << 18 | 1 << 26),
    // Leaf 0xd.1 EAX: XSAVES (privileged); ECX: the supervisor states.
    (0xd, 1, 0, 1 << 3),
    (0xd, 1, 2, !0),
    // Extended leaf 1 ECX: SVM; EDX: 1 GiB pages (an INVLPG in one drops
    // every shadow under TLB semantics), RDTSCP.
    (0x8000_0001, 0, 2, 1 << 2),
    (0x8000_0001, 0, 3, 1 << 26 | 1 << 27),
    // Extended leaf 8 EBX: AMD's IBPB, IBRS, STIBP, SSBD, VIRT_SSBD.
    (0x8000_0008, 0, 1, 1 << 12 | 1 << 14 | 1 << 15 | 1 << 24 | 1 << 25),
];

/// Leaves the guest sees as zeros: thermal and power (6), performance
/// monitoring (0xa), RDT monitoring and allocation (0xf, 0x10), SGX
/// (0x12), Processor Trace (0x14), the extended leaves' SVM (0x8000000a).
const ZEROED: &[u32] = &[6, 0xa, 0xf, 0x10, 0x12, 0x14, 0x8000_000a];

/// Leaf 1 ECX: the hypervisor bit.
const HYPERVISOR: u32 = 1 << 31;

/// The guest's table from the host's: [`HIDDEN`] and [`ZEROED`] applied,
/// the hypervisor bit set, and the hypervisor leaf added.
pub fn filter(mut table: Vec<LguestCpuidEntry>) -> Vec<LguestCpuidEntry> {
    table.retain(|e| !(0x4000_0000..0x4001_0000).contains(&e.function));
    for e in &mut table {
        if ZEROED.contains(&e.function) {
            (e.eax, e.ebx, e.ecx, e.edx) = (0, 0, 0, 0);
            continue;
        }
        for &(leaf, sub, reg, mask) in HIDDEN {
            let sub_matches = e.flags & abi::LGUEST_CPUID_FLAG_SIGNIFICANT_INDEX == 0 || e.index == sub;
            if e.function == leaf && sub_matches {
                let r = match reg {
                    0 => &mut e.eax,
                    1 => &mut e.ebx,
                    2 => &mut e.ecx,
                    _ => &mut e.edx,
                };
                *r &= !mask;
            }
        }
        if e.function == 1 {
            e.ecx |= HYPERVISOR;
        }
    }
    let word = |i: usize| u32::from_le_bytes([SIGNATURE[i], SIGNATURE[i + 1], SIGNATURE[i + 2], SIGNATURE[i + 3]]);
    table.push(LguestCpuidEntry {
        function: 0x4000_0000,
        index: 0,
        flags: 0,
        eax: 0x4000_0000,
        ebx: word(0),
        ecx: word(4),
        edx: word(8),
        padding: [0; 3],
    });
    table
}

/// `arch_prctl`'s `ARCH_SET_CPUID` (`asm/prctl.h`).
pub const ARCH_SET_CPUID: libc::c_int = 0x1012;

/// Makes CPUID fault on the calling thread (the vCPU thread), so that the
/// module emulates the guest's plain `cpuid` from the table. `Ok(false)`:
/// this host cannot (`ENODEV`: no CPUID faulting in the CPU). From here on
/// the calling thread must not run CPUID itself: the standard library's
/// feature detection is done first, so that it answers from its cache.
pub fn fault_on_this_thread() -> std::io::Result<bool> {
    // Fill std's feature cache while CPUID still works.
    let _ = std::arch::is_x86_feature_detected!("sse2");
    // SAFETY: ARCH_SET_CPUID takes an integer (0: fault) and changes only
    // whether this thread's CPUID faults.
    let r = unsafe { libc::syscall(libc::SYS_arch_prctl, ARCH_SET_CPUID, 0 as libc::c_ulong) };
    if r == 0 {
        return Ok(true);
    }
    let e = std::io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::ENODEV) {
        Ok(false)
    } else {
        Err(e)
    }
}

/// Lets CPUID run again on the calling thread (after
/// [`fault_on_this_thread`]).
pub fn no_fault_on_this_thread() -> std::io::Result<()> {
    // SAFETY: as in `fault_on_this_thread` (1: CPUID runs).
    let r = unsafe { libc::syscall(libc::SYS_arch_prctl, ARCH_SET_CPUID, 1 as libc::c_ulong) };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(function: u32, index: u32, flags: u32, v: [u32; 4]) -> LguestCpuidEntry {
        LguestCpuidEntry { function, index, flags, eax: v[0], ebx: v[1], ecx: v[2], edx: v[3], padding: [0; 3] }
    }

    const SIG: u32 = abi::LGUEST_CPUID_FLAG_SIGNIFICANT_INDEX;

    #[test]
    fn filter_hides_sets_and_adds() {
        let host = vec![
            e(1, 0, 0, [0x906ea, 0x0080_0800, !HYPERVISOR, !0]),
            e(6, 0, 0, [7, 7, 7, 7]),
            e(7, 0, SIG, [1, !0, !0, !0]),
            e(7, 1, SIG, [!0, 0, 0, 0]),
            e(0x4000_0000, 0, 0, [0x4000_0001, 1, 2, 3]),
            e(0x8000_0001, 0, 0, [0, 0, !0, !0]),
        ];
        let t = filter(host);
        assert!(abi::cpuid_table_valid(&t));
        let l1 = abi::cpuid_lookup(&t, 1, 0);
        assert_eq!(l1[0], 0x906ea);
        // VMX and x2APIC hidden, hypervisor set, SSE3 kept.
        assert_eq!(l1[2] & (1 << 5 | 1 << 21), 0);
        assert_ne!(l1[2] & HYPERVISOR, 0);
        assert_ne!(l1[2] & 1, 0);
        // APIC hidden, FPU and SSE2 kept.
        assert_eq!(l1[3] & (1 << 9), 0);
        assert_ne!(l1[3] & (1 | 1 << 26), 0);
        assert_eq!(abi::cpuid_lookup(&t, 6, 0), [0; 4]);
        // 7.0: SMEP and LA57 hidden, AVX2 (EBX bit 5) kept; 7.1: FRED hidden.
        let l7 = abi::cpuid_lookup(&t, 7, 0);
        assert_eq!(l7[1] & (1 << 7), 0);
        assert_ne!(l7[1] & (1 << 5), 0);
        assert_eq!(l7[2] & (1 << 16), 0);
        assert_eq!(abi::cpuid_lookup(&t, 7, 1)[0] & (1 << 17), 0);
        // The host's hypervisor leaf is replaced by ours.
        let hv = abi::cpuid_lookup(&t, 0x4000_0000, 0);
        let mut sig = Vec::new();
        for w in &hv[1..] {
            sig.extend(w.to_le_bytes());
        }
        assert_eq!(hv[0], 0x4000_0000);
        assert_eq!(&sig[..], SIGNATURE);
        // RDTSCP hidden.
        assert_eq!(abi::cpuid_lookup(&t, 0x8000_0001, 0)[3] & (1 << 27), 0);
    }

    #[test]
    fn host_table_is_a_valid_table() {
        let t = host_table();
        assert!(!t.is_empty());
        assert!(t.len() < abi::LGUEST_MAX_CPUID_ENTRIES as usize);
        assert!(abi::cpuid_table_valid(&t));
        let f = filter(t);
        assert!(f.len() <= abi::LGUEST_MAX_CPUID_ENTRIES as usize);
        assert!(abi::cpuid_table_valid(&f));
        // Leaf 0 is the host's.
        let r = __cpuid_count(0, 0);
        assert_eq!(abi::cpuid_lookup(&f, 0, 0), [r.eax, r.ebx, r.ecx, r.edx]);
    }

    #[test]
    fn modes_parse() {
        assert_eq!("host".parse::<CpuidMode>(), Ok(CpuidMode::Host));
        assert_eq!("filtered".parse::<CpuidMode>(), Ok(CpuidMode::Filtered));
        assert!("native".parse::<CpuidMode>().is_err());
    }
}
