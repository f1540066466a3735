// SPDX-License-Identifier: GPL-2.0
//! Tests of the `/dev/lguest` device itself: the node, the version ioctl,
//! unknown ioctls, and module unload/load with and without open files.
//!
//! Must run as root in the QEMU host with `lguest.ko` loaded; the load tests
//! also need the module file (`$LGUEST_KO`, default `/lib/modules/lguest.ko`).

use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use lguest_abi as abi;
use lguest_selftests::{self as t, check, check_eq, fail, skip, TestResult};

/// The node exists, is a character device, root-owned, mode 0600, and can be
/// opened and closed many times.
fn open_close() -> TestResult {
    let md = std::fs::metadata(t::DEV).map_err(|e| t::NotPassed::Fail(format!("stat {}: {e}", t::DEV)))?;
    check!(md.file_type().is_char_device(), "{} is not a character device", t::DEV);
    check_eq!(md.mode() & 0o7777, 0o600, "mode of /dev/lguest");
    check_eq!(md.uid(), 0, "owner of /dev/lguest");
    for i in 0..1000 {
        if let Err(e) = t::open_dev() {
            fail!("open #{i} failed: {e}");
        }
    }
    Ok(())
}

/// An unprivileged user cannot open the device (mode 0600).
fn open_unprivileged() -> TestResult {
    // SAFETY: fork() in a single-threaded test program; the child only makes
    // async-signal-safe calls (setuid, open, _exit).
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        fail!("fork: {}", t::errname(t::errno()));
    }
    if pid == 0 {
        // SAFETY: plain syscalls in the child; `_exit` never returns.
        unsafe {
            if libc::setuid(65534) != 0 {
                libc::_exit(3);
            }
            let fd = libc::open(c"/dev/lguest".as_ptr(), libc::O_RDWR);
            let code = if fd >= 0 {
                0
            } else if *libc::__errno_location() == libc::EACCES {
                1
            } else {
                2
            };
            libc::_exit(code);
        }
    }
    let mut status = 0;
    // SAFETY: waiting for our own child with a valid status pointer.
    if unsafe { libc::waitpid(pid, &mut status, 0) } != pid {
        fail!("waitpid: {}", t::errname(t::errno()));
    }
    match libc::WEXITSTATUS(status) {
        1 => Ok(()),
        0 => fail!("uid 65534 could open /dev/lguest"),
        3 => fail!("setuid(65534) failed in the child"),
        c => fail!("unprivileged open failed with an error other than EACCES (child status {c})"),
    }
}

/// LGUEST_GET_API_VERSION returns the ABI version this suite was built with.
fn api_version() -> TestResult {
    let f = t::open_dev().map_err(|e| t::NotPassed::Fail(format!("open: {e}")))?;
    check_eq!(t::ioctl(&f, abi::LGUEST_GET_API_VERSION, 0), Ok(abi::LGUEST_API_VERSION as i32), "api version");
    Ok(())
}

/// Unknown commands, in lguest's range and outside it, get ENOTTY.
fn unknown_ioctl() -> TestResult {
    let f = t::open_dev().map_err(|e| t::NotPassed::Fail(format!("open: {e}")))?;
    let unknown = [
        abi::ioc(abi::IOC_NONE, abi::LGUEST_IOC_MAGIC, 0x7f, 0),
        abi::ioc(abi::IOC_READ, abi::LGUEST_IOC_MAGIC, 0x40, 8), // right nr, wrong dir/size
        abi::ioc(abi::IOC_NONE, 0xAE, 0x00, 0),                  // KVM_GET_API_VERSION
        libc::TCGETS as u32,
        0,
        u32::MAX,
    ];
    for cmd in unknown {
        check_eq!(t::ioctl(&f, cmd, 0), Err(libc::ENOTTY), format!("ioctl {cmd:#x}"));
    }
    // The device still answers afterwards.
    check_eq!(t::ioctl(&f, abi::LGUEST_GET_API_VERSION, 0), Ok(abi::LGUEST_API_VERSION as i32), "api version");
    Ok(())
}

fn need_module_file() -> Result<String, t::NotPassed> {
    match t::module_path() {
        Some(p) => Ok(p),
        None => skip!("lguest.ko not found (set LGUEST_KO)"),
    }
}

fn reload(path: &str) -> TestResult {
    if !t::module_loaded("lguest") {
        if let Err(e) = t::load_module(path) {
            fail!("loading {path}: {}", t::errname(e));
        }
    }
    check!(t::wait_for(Duration::from_secs(5), || Path::new(t::DEV).exists()), "{} did not reappear", t::DEV);
    Ok(())
}

/// While a file is open the module cannot be unloaded and keeps working;
/// once closed, it unloads, the node goes, and a reload brings it back.
fn unload_while_open() -> TestResult {
    let path = need_module_file()?;
    let f = t::open_dev().map_err(|e| t::NotPassed::Fail(format!("open: {e}")))?;
    let r = t::unload_module("lguest");
    if r.is_ok() {
        // The host survived an unload under an open file only by luck; make
        // sure the next tests have a module again.
        let _ = reload(&path);
        fail!("delete_module succeeded while /dev/lguest was open");
    }
    check_eq!(r, Err(libc::EWOULDBLOCK), "delete_module with an open file");
    check_eq!(
        t::ioctl(&f, abi::LGUEST_GET_API_VERSION, 0),
        Ok(abi::LGUEST_API_VERSION as i32),
        "api version after refused unload"
    );
    drop(f);
    if let Err(e) = t::unload_module("lguest") {
        fail!("delete_module after close: {}", t::errname(e));
    }
    check!(!t::module_loaded("lguest"), "lguest still in /proc/modules after unload");
    check!(t::wait_for(Duration::from_secs(5), || !Path::new(t::DEV).exists()), "{} still exists after unload", t::DEV);
    reload(&path)?;
    api_version()
}

/// 50 unload/load cycles, using the device in each.
fn load_unload_loop() -> TestResult {
    let path = need_module_file()?;
    for i in 0..50 {
        if let Err(e) = t::unload_module("lguest") {
            fail!("cycle {i}: unload: {}", t::errname(e));
        }
        if let Err(e) = t::load_module(&path) {
            fail!("cycle {i}: load: {}", t::errname(e));
        }
        check!(t::wait_for(Duration::from_secs(5), || Path::new(t::DEV).exists()), "cycle {i}: no {}", t::DEV);
        api_version()?;
    }
    // Loading it twice is refused, and the loaded copy keeps working.
    check_eq!(t::load_module(&path), Err(libc::EEXIST), "second load");
    api_version()
}

/// The last lines of the kernel log.
fn dmesg_tail(n: usize) -> String {
    let out = std::process::Command::new("dmesg").output().map(|o| o.stdout).unwrap_or_default();
    let s = String::from_utf8_lossy(&out).into_owned();
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// The hosts the module refuses (simulated with its `simulate_refusal`
/// parameter, since the CPU and the platform cannot be changed here): the
/// load fails with ENODEV and the kernel log says why; then it loads.
fn refused_hosts() -> TestResult {
    let path = need_module_file()?;
    if let Err(e) = t::unload_module("lguest") {
        fail!("unload: {}", t::errname(e));
    }
    let cases = [
        (1, "FRED is active on this host"),
        (2, "this host's memory is encrypted"),
        (4, "this host is a TDX guest"),
        (8, "this host is a Xen PV guest"),
    ];
    let mut res = Ok(());
    for (bit, want) in cases {
        let r = t::load_module_with(&path, &format!("simulate_refusal={bit}"));
        let log = dmesg_tail(5);
        if r != Err(libc::ENODEV) {
            res = Err(t::NotPassed::Fail(format!("simulate_refusal={bit}: load gave {r:?}, expected ENODEV")));
        } else if !log.contains(want) {
            res = Err(t::NotPassed::Fail(format!("simulate_refusal={bit}: no {want:?} in the log: {log}")));
        }
        if t::module_loaded("lguest") {
            let _ = t::unload_module("lguest");
        }
        if res.is_err() {
            break;
        }
    }
    reload(&path)?;
    res
}

fn main() -> ExitCode {
    t::run(&[
        ("open_close", open_close),
        ("open_unprivileged", open_unprivileged),
        ("api_version", api_version),
        ("unknown_ioctl", unknown_ioctl),
        ("unload_while_open", unload_while_open),
        ("load_unload_loop", load_unload_loop),
        ("refused_hosts", refused_hosts),
    ])
}
