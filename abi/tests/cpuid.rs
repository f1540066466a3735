// SPDX-License-Identifier: GPL-2.0
//! The CPUID table rules `LGUEST_SET_CPUID` enforces and the lookup the
//! host's emulated CPUID makes: the same functions the module runs.

use lguest_abi::{self as abi, LguestCpuidEntry as Entry};

fn entry(function: u32, index: u32, flags: u32, eax: u32) -> Entry {
    Entry {
        function,
        index,
        flags,
        eax,
        ebx: eax + 1,
        ecx: eax + 2,
        edx: eax + 3,
        padding: [0; 3],
    }
}

const SIG: u32 = abi::LGUEST_CPUID_FLAG_SIGNIFICANT_INDEX;

#[test]
fn lookup_honours_the_index_flag() {
    let t = [
        entry(0, 0, 0, 0x10),
        entry(7, 0, SIG, 0x70),
        entry(7, 1, SIG, 0x71),
        entry(0x4000_0000, 0, 0, 0x40),
    ];
    assert!(abi::cpuid_table_valid(&t));
    // Without the flag, ECX does not matter.
    assert_eq!(abi::cpuid_lookup(&t, 0, 0), [0x10, 0x11, 0x12, 0x13]);
    assert_eq!(abi::cpuid_lookup(&t, 0, 99), [0x10, 0x11, 0x12, 0x13]);
    assert_eq!(
        abi::cpuid_lookup(&t, 0x4000_0000, 5),
        [0x40, 0x41, 0x42, 0x43]
    );
    // With it, each subleaf has its own entry, and a missing one is zeros.
    assert_eq!(abi::cpuid_lookup(&t, 7, 0), [0x70, 0x71, 0x72, 0x73]);
    assert_eq!(abi::cpuid_lookup(&t, 7, 1), [0x71, 0x72, 0x73, 0x74]);
    assert_eq!(abi::cpuid_lookup(&t, 7, 2), [0; 4]);
    // A leaf with no entry, and the empty table.
    assert_eq!(abi::cpuid_lookup(&t, 0x8000_0000, 0), [0; 4]);
    assert_eq!(abi::cpuid_lookup(&[], 0, 0), [0; 4]);
}

#[test]
fn invalid_tables_are_refused() {
    assert!(abi::cpuid_table_valid(&[]));
    // Unknown flags (KVM's obsolete STATEFUL_FUNC, 2, included).
    assert!(!abi::cpuid_table_valid(&[entry(1, 0, 2, 0)]));
    assert!(!abi::cpuid_table_valid(&[entry(1, 0, SIG | 4, 0)]));
    // Padding.
    for i in 0..3 {
        let mut e = entry(1, 0, 0, 0);
        e.padding[i] = 1;
        assert!(!abi::cpuid_table_valid(&[e]), "padding[{i}]");
    }
    // Two answers for one CPUID: the same leaf twice, a leaf-wide entry
    // beside a subleaf one (either order), the same subleaf twice.
    assert!(!abi::cpuid_table_valid(&[
        entry(1, 0, 0, 0),
        entry(1, 3, 0, 0)
    ]));
    assert!(!abi::cpuid_table_valid(&[
        entry(7, 0, 0, 0),
        entry(7, 1, SIG, 0)
    ]));
    assert!(!abi::cpuid_table_valid(&[
        entry(7, 1, SIG, 0),
        entry(7, 0, 0, 0)
    ]));
    assert!(!abi::cpuid_table_valid(&[
        entry(7, 1, SIG, 0),
        entry(2, 0, 0, 0),
        entry(7, 1, SIG, 5)
    ]));
    // Distinct subleaves, and the same index under different leaves, are fine.
    assert!(abi::cpuid_table_valid(&[
        entry(7, 0, SIG, 0),
        entry(7, 1, SIG, 0),
        entry(4, 1, SIG, 0)
    ]));
}

#[test]
fn prefix_is_ud2_and_lgu() {
    assert_eq!(abi::LGUEST_EMULATE_PREFIX, [0x0f, 0x0b, b'l', b'g', b'u']);
    // Linux's __KVM_EMULATE_PREFIX (arch/x86/include/asm/emulate_prefix.h).
    assert_eq!(
        abi::LGUEST_KVM_EMULATE_PREFIX,
        [0x0f, 0x0b, 0x6b, 0x76, 0x6d]
    );
    assert_eq!(
        abi::LGUEST_EMULATE_PREFIX.len(),
        abi::LGUEST_EMULATE_PREFIX_LEN
    );
}

/// Leaf 0xD's EBX follows XCR0: the legacy area and header alone, then the
/// end of the furthest enabled component (the layout of a CPU with AVX at
/// 576, MPX at 960 and 1024, PKRU at 2688, as QEMU's "max" CPU has it).
#[test]
fn xsave_size_follows_xcr0() {
    let leaf_d = |i: u32| match i {
        2 => [256, 576, 0, 0],
        3 => [64, 960, 0, 0],
        4 => [64, 1024, 0, 0],
        9 => [8, 2688, 0, 0],
        _ => [0; 4],
    };
    assert_eq!(abi::xsave_size(0x3, leaf_d), 576);
    assert_eq!(abi::xsave_size(0x7, leaf_d), 832);
    assert_eq!(abi::xsave_size(0x21f, leaf_d), 2696);
    assert_eq!(abi::xsave_size(0x207, leaf_d), 2696);
}
