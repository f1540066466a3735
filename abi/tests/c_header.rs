// SPDX-License-Identifier: GPL-2.0
//! Checks `include/uapi/linux/lguest.h` against the Rust definition.
//!
//! The test compiles a C program that includes the header and prints every
//! macro it defines, then compares each value with the Rust constant of the
//! same name. A name on one side only is an error too, so the two cannot
//! drift apart silently.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;

use lguest_abi as abi;

/// Every constant of the ABI, by its C name.
fn rust_side() -> BTreeMap<&'static str, u64> {
    BTreeMap::from([
        ("LGUEST_IOC_MAGIC", abi::LGUEST_IOC_MAGIC as u64),
        ("LGUEST_API_VERSION", abi::LGUEST_API_VERSION as u64),
        ("LGUEST_GET_API_VERSION", abi::LGUEST_GET_API_VERSION as u64),
        ("LGUEST_CREATE_VM", abi::LGUEST_CREATE_VM as u64),
        ("LGUEST_CREATE_VCPU", abi::LGUEST_CREATE_VCPU as u64),
        ("LGUEST_RUN", abi::LGUEST_RUN as u64),
        ("LGUEST_GET_REGS", abi::LGUEST_GET_REGS as u64),
        ("LGUEST_SET_REGS", abi::LGUEST_SET_REGS as u64),
        ("LGUEST_IRQ", abi::LGUEST_IRQ as u64),
        ("LGUEST_IRQFD", abi::LGUEST_IRQFD as u64),
        ("LGUEST_IRQFD_DEASSIGN", abi::LGUEST_IRQFD_DEASSIGN as u64),
        ("LGUEST_MAX_IRQFDS", abi::LGUEST_MAX_IRQFDS as u64),
        ("LGUEST_IOEVENTFD", abi::LGUEST_IOEVENTFD as u64),
        (
            "LGUEST_IOEVENTFD_DEASSIGN",
            abi::LGUEST_IOEVENTFD_DEASSIGN as u64,
        ),
        ("LGUEST_MAX_IOEVENTFDS", abi::LGUEST_MAX_IOEVENTFDS as u64),
        ("LGUEST_SET_CPUID", abi::LGUEST_SET_CPUID as u64),
        (
            "LGUEST_MAX_CPUID_ENTRIES",
            abi::LGUEST_MAX_CPUID_ENTRIES as u64,
        ),
        (
            "LGUEST_CPUID_FLAG_SIGNIFICANT_INDEX",
            abi::LGUEST_CPUID_FLAG_SIGNIFICANT_INDEX as u64,
        ),
        ("LGUEST_EMULATE_PREFIX", {
            let mut b = [0u8; 8];
            b[..abi::LGUEST_EMULATE_PREFIX_LEN].copy_from_slice(&abi::LGUEST_EMULATE_PREFIX);
            u64::from_le_bytes(b)
        }),
        ("LGUEST_KVM_EMULATE_PREFIX", {
            let mut b = [0u8; 8];
            b[..abi::LGUEST_EMULATE_PREFIX_LEN].copy_from_slice(&abi::LGUEST_KVM_EMULATE_PREFIX);
            u64::from_le_bytes(b)
        }),
        (
            "LGUEST_EMULATE_PREFIX_LEN",
            abi::LGUEST_EMULATE_PREFIX_LEN as u64,
        ),
        ("LGUEST_MAX_MEM", abi::LGUEST_MAX_MEM),
        ("LGUEST_MAX_DEVICE_PAGES", abi::LGUEST_MAX_DEVICE_PAGES),
        ("LGUEST_MAX_VCPUS", abi::LGUEST_MAX_VCPUS as u64),
        ("LGUEST_RUN_PAGE_SIZE", abi::LGUEST_RUN_PAGE_SIZE as u64),
        ("LGUEST_MESSAGE_LEN", abi::LGUEST_MESSAGE_LEN as u64),
        ("LGUEST_IRQS", abi::LGUEST_IRQS as u64),
        ("LGUEST_EXIT_NOTIFY", abi::LGUEST_EXIT_NOTIFY as u64),
        ("LGUEST_EXIT_SHUTDOWN", abi::LGUEST_EXIT_SHUTDOWN as u64),
        ("LGUEST_EXIT_KILLED", abi::LGUEST_EXIT_KILLED as u64),
        ("LGUEST_EXIT_HALT", abi::LGUEST_EXIT_HALT as u64),
        ("LGUEST_SHUTDOWN_POWEROFF", abi::LGUEST_SHUTDOWN_POWEROFF),
        ("LGUEST_SHUTDOWN_RESTART", abi::LGUEST_SHUTDOWN_RESTART),
        ("LGUEST_SHUTDOWN_CRASH", abi::LGUEST_SHUTDOWN_CRASH),
        ("LGUEST_CMDLINE_MAX", abi::LGUEST_CMDLINE_MAX as u64),
        ("LGUEST_LOAD_MIN", abi::LGUEST_LOAD_MIN),
        ("LGUEST_GUEST_VA_END", abi::GUEST_VA_END),
        ("LGUEST_GUEST_UPPER_START", abi::GUEST_UPPER_START),
        ("LGUEST_GUEST_CS", abi::LGUEST_GUEST_CS),
        ("LGUEST_GUEST_SS", abi::LGUEST_GUEST_SS),
        ("LGUEST_USER_CS", abi::LGUEST_USER_CS),
        ("LGUEST_KERNEL_CS", abi::LGUEST_KERNEL_CS),
        ("LGUEST_KERNEL_SS", abi::LGUEST_KERNEL_SS),
        ("LGUEST_INIT_LINUX_FRAMES", abi::LGUEST_INIT_LINUX_FRAMES),
        ("LGUEST_INIT_TLB_SHADOWS", abi::LGUEST_INIT_TLB_SHADOWS),
        ("LGUEST_PGTABLE_PCID_MASK", abi::LGUEST_PGTABLE_PCID_MASK),
        ("LGUEST_PGTABLE_NOFLUSH", abi::LGUEST_PGTABLE_NOFLUSH),
        ("LGUEST_SYSCALL_VECTOR", abi::LGUEST_SYSCALL_VECTOR as u64),
        ("LGUEST_SYSRET_VECTOR", abi::LGUEST_SYSRET_VECTOR as u64),
        ("LGUEST_SYSCALL_DIRECT", abi::LGUEST_SYSCALL_DIRECT),
        ("LHCALL_RING_SIZE", abi::LHCALL_RING_SIZE as u64),
        ("LHCALL_STATUS_DONE", abi::LHCALL_STATUS_DONE as u64),
        ("X86_EFLAGS_IF", abi::X86_EFLAGS_IF),
        ("LGUEST_TRAP_ENTRY", abi::LGUEST_TRAP_ENTRY as u64),
        ("LHCALL_FLUSH_ASYNC", abi::LHCALL_FLUSH_ASYNC),
        ("LHCALL_LGUEST_INIT", abi::LHCALL_LGUEST_INIT),
        ("LHCALL_SHUTDOWN", abi::LHCALL_SHUTDOWN),
        ("LHCALL_NEW_PGTABLE", abi::LHCALL_NEW_PGTABLE),
        ("LHCALL_FLUSH_TLB", abi::LHCALL_FLUSH_TLB),
        ("LHCALL_LOAD_IDT_ENTRY", abi::LHCALL_LOAD_IDT_ENTRY),
        ("LHCALL_SET_STACK", abi::LHCALL_SET_STACK),
        ("LHCALL_TS", abi::LHCALL_TS),
        ("LHCALL_SET_CLOCKEVENT", abi::LHCALL_SET_CLOCKEVENT),
        ("LHCALL_HALT", abi::LHCALL_HALT),
        ("LHCALL_SET_PMD", abi::LHCALL_SET_PMD),
        ("LHCALL_SET_PTE", abi::LHCALL_SET_PTE),
        ("LHCALL_SET_PGD", abi::LHCALL_SET_PGD),
        ("LHCALL_LOAD_TLS", abi::LHCALL_LOAD_TLS),
        ("LHCALL_NOTIFY", abi::LHCALL_NOTIFY),
        ("LHCALL_LOAD_GDT_ENTRY", abi::LHCALL_LOAD_GDT_ENTRY),
        ("LHCALL_SEND_INTERRUPTS", abi::LHCALL_SEND_INTERRUPTS),
        ("LHCALL_IRET_USER", abi::LHCALL_IRET_USER),
        ("LHCALL_IRET", abi::LHCALL_IRET),
        ("LHCALL_INVLPG", abi::LHCALL_INVLPG),
        ("LHCALL_GET_SEGMENT_BASE", abi::LHCALL_GET_SEGMENT_BASE),
        ("LHCALL_SET_SYSCALL", abi::LHCALL_SET_SYSCALL),
        ("LHCALL_SET_SEGMENT_BASE", abi::LHCALL_SET_SEGMENT_BASE),
        ("LGUEST_BASE_FS", abi::LGUEST_BASE_FS),
        ("LGUEST_BASE_GS", abi::LGUEST_BASE_GS),
        ("LGUEST_BASE_USER_GS", abi::LGUEST_BASE_USER_GS),
        ("LHCALL_IBPB", abi::LHCALL_IBPB),
        ("LGUEST_IBPB_NOW", abi::LGUEST_IBPB_NOW),
        ("LGUEST_IBPB_USER_ENTRY", abi::LGUEST_IBPB_USER_ENTRY),
        ("LGUEST_IBPB_DONE", abi::LGUEST_IBPB_DONE),
        ("LGUEST_IBPB_UNAVAILABLE", abi::LGUEST_IBPB_UNAVAILABLE),
        ("LHCALL_SET_DEBUGREGS", abi::LHCALL_SET_DEBUGREGS),
    ])
}

/// Sizes and field offsets of the shared structs, as C expressions...
fn layout_exprs() -> Vec<(String, String)> {
    let mut v = Vec::new();
    for (c, fields) in STRUCTS {
        v.push((format!("sizeof {c}"), format!("sizeof(struct {c})")));
        for f in *fields {
            v.push((
                format!("offsetof {c}.{f}"),
                format!("__builtin_offsetof(struct {c}, {f})"),
            ));
        }
    }
    v
}

/// ...and the same from Rust.
fn rust_layout() -> BTreeMap<String, u64> {
    use core::mem::{offset_of, size_of};
    macro_rules! layout {
        ($c:literal, $t:ty, [$($f:ident),*]) => {{
            let mut m = vec![(format!("sizeof {}", $c), size_of::<$t>() as u64)];
            $( m.push((format!("offsetof {}.{}", $c, stringify!($f)), offset_of!($t, $f) as u64)); )*
            m
        }};
    }
    let mut all = Vec::new();
    all.extend(layout!(
        "lguest_vm_config",
        abi::LguestVmConfig,
        [
            mem_base,
            mem_size,
            device_pages,
            entry,
            flags,
            reserved0,
            reserved
        ]
    ));
    all.extend(layout!(
        "lguest_regs",
        abi::LguestRegs,
        [rax, r15, rip, rsp, rflags]
    ));
    all.extend(layout!(
        "lguest_vcpu_regs",
        abi::LguestVcpuRegs,
        [vcpu, pad, regs]
    ));
    all.extend(layout!(
        "lguest_run",
        abi::LguestRun,
        [
            immediate_exit,
            exit_reason,
            notify_addr,
            notify_arg,
            shutdown_reason,
            stat_exits,
            stat_hypercalls,
            stat_shadow_pages,
            stat_fpu_entries,
            stat_global_flushes,
            stat_direct_syscalls,
            stat_direct_sysrets,
            stat_ibpbs,
            stat_shadow_reuses,
            reserved,
            message
        ]
    ));
    all.extend(layout!(
        "lguest_irqfd",
        abi::LguestIrqfd,
        [fd, irq, flags, pad]
    ));
    all.extend(layout!(
        "lguest_ioeventfd",
        abi::LguestIoeventfd,
        [addr, fd, flags]
    ));
    all.extend(layout!("lguest_cpuid", abi::LguestCpuid, [nent, padding]));
    all.extend(layout!(
        "lguest_cpuid_entry",
        abi::LguestCpuidEntry,
        [function, index, flags, eax, ebx, ecx, edx, padding]
    ));
    all.extend(layout!(
        "lguest_iret_user",
        abi::LguestIretUser,
        [rax, rip, rflags, rsp]
    ));
    all.extend(layout!(
        "lguest_iret",
        abi::LguestIret,
        [rax, rip, cs, rflags, rsp, ss]
    ));
    all.extend(layout!("hcall_args", abi::HcallArgs, [arg0, arg4]));
    all.extend(layout!(
        "lguest_data",
        abi::LguestData,
        [
            irq_enabled,
            blocked_interrupts,
            cr2,
            time,
            irq_pending,
            hcall_status,
            hcalls,
            reserve_mem,
            tsc_khz,
            noirq_iret,
            kernel_address,
            syscall_vec,
            kernel_sp0,
            dr6,
            debugreg
        ]
    ));
    all.into_iter().collect()
}

/// The structs checked, with the fields whose offsets are compared.
const STRUCTS: &[(&str, &[&str])] = &[
    (
        "lguest_vm_config",
        &[
            "mem_base",
            "mem_size",
            "device_pages",
            "entry",
            "flags",
            "reserved0",
            "reserved",
        ],
    ),
    ("lguest_regs", &["rax", "r15", "rip", "rsp", "rflags"]),
    ("lguest_vcpu_regs", &["vcpu", "pad", "regs"]),
    (
        "lguest_run",
        &[
            "immediate_exit",
            "exit_reason",
            "notify_addr",
            "notify_arg",
            "shutdown_reason",
            "stat_exits",
            "stat_hypercalls",
            "stat_shadow_pages",
            "stat_fpu_entries",
            "stat_global_flushes",
            "stat_direct_syscalls",
            "stat_direct_sysrets",
            "stat_ibpbs",
            "stat_shadow_reuses",
            "reserved",
            "message",
        ],
    ),
    ("lguest_irqfd", &["fd", "irq", "flags", "pad"]),
    ("lguest_ioeventfd", &["addr", "fd", "flags"]),
    ("lguest_cpuid", &["nent", "padding"]),
    (
        "lguest_cpuid_entry",
        &[
            "function", "index", "flags", "eax", "ebx", "ecx", "edx", "padding",
        ],
    ),
    ("lguest_iret_user", &["rax", "rip", "rflags", "rsp"]),
    ("lguest_iret", &["rax", "rip", "cs", "rflags", "rsp", "ss"]),
    ("hcall_args", &["arg0", "arg4"]),
    (
        "lguest_data",
        &[
            "irq_enabled",
            "blocked_interrupts",
            "cr2",
            "time",
            "irq_pending",
            "hcall_status",
            "hcalls",
            "reserve_mem",
            "tsc_khz",
            "noirq_iret",
            "kernel_address",
            "syscall_vec",
            "kernel_sp0",
            "dr6",
            "debugreg",
        ],
    ),
];

#[test]
fn c_header_matches_rust() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let header = root.join("include/uapi/linux/lguest.h");
    let text = std::fs::read_to_string(&header).expect("read the C header");
    // Every object-like macro except the include guard.
    let names: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("#define"))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| !n.starts_with('_') && !n.contains('('))
        .collect();

    let out_dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let src = out_dir.join("lguest_h_check.c");
    let exe = out_dir.join("lguest_h_check");
    let mut prog =
        String::from("#include <stdio.h>\n#include <linux/lguest.h>\nint main(void) {\n");
    for n in &names {
        prog += &format!("\tprintf(\"{n} %llu\\n\", (unsigned long long)({n}));\n");
    }
    for (key, expr) in layout_exprs() {
        prog += &format!("\tprintf(\"{key} %llu\\n\", (unsigned long long)({expr}));\n");
    }
    prog += "\treturn 0;\n}\n";
    std::fs::write(&src, prog).unwrap();
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let st = Command::new(&cc)
        .args(["-Wall", "-Werror", "-I"])
        .arg(root.join("include/uapi"))
        .arg(&src)
        .arg("-o")
        .arg(&exe)
        .status()
        .expect("run the C compiler");
    assert!(st.success(), "the C header does not compile");
    let out = Command::new(&exe).output().expect("run the header check");
    let c_side: BTreeMap<String, u64> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| {
            let (n, v) = l.rsplit_once(' ').unwrap();
            (n.to_string(), v.parse().unwrap())
        })
        .collect();

    let mut rust = rust_side()
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect::<BTreeMap<String, u64>>();
    rust.extend(rust_layout());
    for (name, value) in &c_side {
        match rust.get(name) {
            Some(v) => assert_eq!(v, value, "{name}: Rust {v:#x}, C {value:#x}"),
            None => panic!("{name} is in the C header but not in rust_side()"),
        }
    }
    for name in rust.keys() {
        assert!(
            c_side.contains_key(name),
            "{name} is in Rust but not in the C header"
        );
    }
}

#[test]
fn ioctl_numbers_are_distinct_and_in_range() {
    let nr = abi::LGUEST_GET_API_VERSION & 0xff;
    assert!((0x40..0x80).contains(&nr));
    assert_eq!(
        (abi::LGUEST_GET_API_VERSION >> 8) & 0xff,
        abi::LGUEST_IOC_MAGIC
    );
}
