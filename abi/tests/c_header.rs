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
    ])
}

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
    let mut prog = String::from("#include <stdio.h>\n#include <linux/lguest.h>\nint main(void) {\n");
    for n in &names {
        prog += &format!("\tprintf(\"{n} %llu\\n\", (unsigned long long)({n}));\n");
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
            let (n, v) = l.split_once(' ').unwrap();
            (n.to_string(), v.parse().unwrap())
        })
        .collect();

    let rust = rust_side();
    for (name, value) in &c_side {
        match rust.get(name.as_str()) {
            Some(v) => assert_eq!(v, value, "{name}: Rust {v:#x}, C {value:#x}"),
            None => panic!("{name} is in the C header but not in rust_side()"),
        }
    }
    for name in rust.keys() {
        assert!(c_side.contains_key(*name), "{name} is in Rust but not in the C header");
    }
}

#[test]
fn ioctl_numbers_are_distinct_and_in_range() {
    let nr = abi::LGUEST_GET_API_VERSION & 0xff;
    assert!((0x40..0x80).contains(&nr));
    assert_eq!((abi::LGUEST_GET_API_VERSION >> 8) & 0xff, abi::LGUEST_IOC_MAGIC);
}
