// SPDX-License-Identifier: GPL-2.0
//! Benchmarks (not tests: they assert nothing and print numbers).
//!
//! - hypercall round trip: a guest makes N no-op hypercalls and times them
//!   with the TSC; the same run times N `getpid` system calls on the host.
//!   The ratio is what TCG cannot distort much; under `-icount shift=0` the
//!   TSC advances with instructions, so both are instruction counts.
//!
//! - a guest user-mode system call round trip (`syscall`, and `int $0x80`)
//!   in the same run, relative to the host's getpid.
//!
//! - interrupt delivery latency after the guest re-enables interrupts, with
//!   the `irq_pending` check (delivery at the SEND_INTERRUPTS hypercall)
//!   and without it (`noirqcheck`: delivery waits for the next exit).
//!
//! - page faults and address spaces (`pfbench`): a guest demand-paging
//!   round trip from guest user mode, the host's shadow fault alone, and a
//!   fork-like cycle (build, fill, switch, touch, tear down 64 pages).
//!
//! - the Linux guest (`lginit=bench`): a getpid and a fork+exec+exit of
//!   `/bin/true` in its user space against the host's, and its boot to
//!   `/init` by the host's wall clock beside the `hello` sample's run.
//!
//! - `lguest_bench debian` (its own QEMU host boot, `scripts/bench.sh`):
//!   the Debian root filesystem of `make rootfs` booted from a virtio disk,
//!   to systemd's first line and to the login prompt, systemd's own
//!   account (`systemd-analyze`), the launcher's resident memory and the
//!   guest's `MemAvailable` once booted; beside the busybox initramfs's
//!   boot to `/init` in the same QEMU host.
//!
//! Every figure is measured [`samples`] times (`LGUEST_BENCH_SAMPLES`,
//! default 5) and reported as its median with the spread:
//! `bench: name MEDIAN unit (median of K, min A, max B)`; ratios are of
//! medians. A figure that fails in any sample is reported as failed, and
//! the program then exits 1 (after printing everything else), so that a
//! partial failure is not a pass.

use std::process::Command;

fn rdtsc() -> u64 {
    // SAFETY: rdtsc only reads the time-stamp counter.
    unsafe { core::arch::x86_64::_rdtsc() }
}

/// Where the guest images are (`LGUEST_GUESTS`).
fn guests() -> String {
    std::env::var("LGUEST_GUESTS").unwrap_or_else(|_| "/usr/share/lguest/guests".into())
}

/// The launcher (`LGUEST_BIN`).
fn launcher() -> Command {
    Command::new(std::env::var("LGUEST_BIN").unwrap_or_else(|_| "/usr/bin/lguest".into()))
}

fn getpid_cycles(n: u64) -> f64 {
    let start = rdtsc();
    for _ in 0..n {
        // SAFETY: getpid has no preconditions.
        unsafe { libc::syscall(libc::SYS_getpid) };
    }
    (rdtsc() - start) as f64 / n as f64
}

fn hypercall_cycles(n: u64) -> Option<f64> {
    let guests = guests();
    let out = launcher()
        .args(["run", "--memory", "16M", &format!("{guests}/guest-ops"), "hcalls", &n.to_string()])
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().find(|l| l.contains("TSC cycles"))?;
    let cycles: f64 = line.split_whitespace().find_map(|w| w.parse().ok())?;
    Some(cycles / n as f64)
}

/// A guest user-mode system call round trip in TSC cycles, by `what`:
/// `syscall` (through the host's #UD bounce) and `int80` from `user bench
/// N`; `direct syscall` (the switcher's direct system call) and `syscall
/// hypercall` (a kernel-mode `syscall`) from `user bench N direct`.
fn guest_syscall_cycles(n: u64, what: &str) -> Option<f64> {
    let guests = guests();
    let mut args = vec!["run".to_string(), "--memory".into(), "16M".into(), format!("{guests}/user")];
    args.extend(["bench".to_string(), n.to_string()]);
    if what == "direct syscall" || what == "syscall hypercall" {
        args.push("direct".into());
    }
    let out = launcher().args(&args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().find(|l| l.contains(&format!(": {n} {what} round trips in ")))?;
    let c: f64 = line.split_whitespace().rev().nth(2)?.parse().ok()?;
    Some(c / n as f64)
}

/// Median interrupt delivery latency after re-enabling, in TSC cycles,
/// from `guest-ops latency [noirqcheck]`.
fn latency(noirqcheck: bool) -> Option<u64> {
    let guests = guests();
    let mut args =
        vec!["run".to_string(), "--memory".into(), "16M".into(), format!("{guests}/guest-ops"), "latency".into()];
    if noirqcheck {
        args.push("noirqcheck".into());
    }
    let out = launcher().args(&args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().find(|l| l.contains("median"))?;
    let mut words = line.split_whitespace();
    words.find(|w| *w == "median")?;
    words.next()?.parse().ok()
}

/// The `NAME=VALUE` figures of `pfbench` (page-fault round trips and a
/// fork-like address-space cycle, in TSC cycles).
fn pfbench() -> Option<Vec<(String, u64)>> {
    let guests = guests();
    let out = launcher().args(["run", "--memory", "32M", &format!("{guests}/pfbench")]).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let figures: Vec<(String, u64)> = text
        .lines()
        .filter_map(|l| l.strip_prefix("pfbench: "))
        .filter_map(|l| l.split_whitespace().next()?.split_once('='))
        .filter(|(k, _)| k.ends_with("_cycles"))
        .filter_map(|(k, v)| Some((k.to_string(), v.parse().ok()?)))
        .collect();
    (!figures.is_empty()).then_some(figures)
}

/// The host's own demand-zero page fault: TSC cycles per first touch of
/// `pages` fresh anonymous pages (what `pf_fault_roundtrip` is for the
/// guest).
fn host_fault_cycles(pages: usize) -> Option<u64> {
    let m = lguest_selftests::Mapping::anon(pages * 4096).ok()?;
    let start = rdtsc();
    for i in 0..pages {
        m.put(i * 4096, 1u8);
    }
    Some((rdtsc() - start) / pages as u64)
}

/// The host's fork-like cycle: fork a child that writes to `pages` pages
/// of the parent's (copy-on-write faults) and exits; the parent waits.
/// TSC cycles per iteration (what `pf_fork` is for the guest).
fn host_fork_cycles(pages: usize, iterations: u64) -> Option<u64> {
    let mut buf = vec![0u8; pages * 4096];
    for i in 0..pages {
        buf[i * 4096] = 1;
    }
    let start = rdtsc();
    for _ in 0..iterations {
        // SAFETY: fork(2); the child only writes to its copy of `buf` and
        // calls _exit(2), both async-signal-safe.
        match unsafe { libc::fork() } {
            -1 => return None,
            0 => {
                for i in 0..pages {
                    // SAFETY: inside the child's copy of `buf`.
                    unsafe { buf.as_mut_ptr().add(i * 4096).write_volatile(2) };
                }
                // SAFETY: ends the child without running the parent's exit code.
                unsafe { libc::_exit(0) };
            }
            pid => {
                let mut status = 0;
                // SAFETY: waits for our own child.
                unsafe { libc::waitpid(pid, &mut status, 0) };
            }
        }
    }
    Some((rdtsc() - start) / iterations)
}

/// Samples per figure.
fn samples() -> usize {
    std::env::var("LGUEST_BENCH_SAMPLES").ok().and_then(|v| v.parse().ok()).filter(|&k| k > 0).unwrap_or(5)
}

/// Median, min and max of `v` (not empty).
fn spread(v: &mut [f64]) -> (f64, f64, f64) {
    v.sort_by(f64::total_cmp);
    let mid = v.len() / 2;
    let median = if v.len() % 2 == 1 { v[mid] } else { (v[mid - 1] + v[mid]) / 2.0 };
    (median, v[0], v[v.len() - 1])
}

/// The figures, each a list of samples, and whether any sample failed.
struct Report {
    failed: Vec<String>,
}

impl Report {
    /// Takes `k` samples of `f`; prints the median and spread, or the
    /// failure. Returns the median.
    fn figure(
        &mut self,
        name: &str,
        unit: &str,
        note: &str,
        k: usize,
        mut f: impl FnMut() -> Option<f64>,
    ) -> Option<f64> {
        let mut v = Vec::with_capacity(k);
        for i in 0..k {
            match f() {
                Some(x) => v.push(x),
                None => {
                    println!("bench: {name} failed (sample {} of {k})", i + 1);
                    self.failed.push(name.to_string());
                    return None;
                }
            }
        }
        let (median, min, max) = spread(&mut v);
        println!("bench: {name} {median:.0} {unit} (median of {k}, min {min:.0}, max {max:.0}){note}");
        Some(median)
    }
}

/// The Linux guest with `lginit=bench`: its getpid and its fork+exec+exit
/// of `/bin/true` in TSC cycles (`lguest-linux-user bench`), and the host
/// time from the launcher's start to `/init`'s first line, in ms.
fn linux_guest(n: u64) -> Option<(f64, f64, f64)> {
    let guests = guests();
    let out = std::env::temp_dir().join(format!("lguest-bench-linux-{}.out", std::process::id()));
    let file = std::fs::File::create(&out).ok()?;
    let mut child = launcher()
        .args([
            "run",
            "--memory",
            "128M",
            "--initrd",
            &format!("{guests}/linux-initramfs.gz"),
            &format!("{guests}/vmlinux"),
            "--",
            "lginit=bench",
            &format!("lgbench={n}"),
        ])
        .stdout(file)
        .stderr(std::process::Stdio::null())
        .spawn()
        .ok()?;
    let start = std::time::Instant::now();
    let mut boot = None;
    let status = loop {
        if boot.is_none() && std::fs::read_to_string(&out).is_ok_and(|t| t.contains("lginit: /init is running")) {
            boot = Some(start.elapsed().as_secs_f64() * 1000.0);
        }
        if let Ok(Some(st)) = child.try_wait() {
            break st;
        }
        if start.elapsed() > std::time::Duration::from_secs(600) {
            let _ = child.kill();
            break child.wait().ok()?;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    };
    let text = std::fs::read_to_string(&out).unwrap_or_default();
    let _ = std::fs::remove_file(&out);
    if !status.success() {
        return None;
    }
    let line =
        text.lines().find_map(|l| l.trim_end().split_once("lginit: bench getpid ").map(|(_, r)| r.to_owned()))?;
    let mut w = line.split_whitespace();
    let getpid: f64 = w.next()?.parse().ok()?;
    let spawn: f64 = w.nth(1)?.parse().ok()?;
    Some((getpid, spawn, boot?))
}

/// TSC cycles per fork+exec+exit+wait of `/bin/true` on the host.
fn host_spawn_cycles(n: u64) -> Option<f64> {
    let start = rdtsc();
    for _ in 0..n {
        if !Command::new("/bin/true").status().ok()?.success() {
            return None;
        }
    }
    Some((rdtsc() - start) as f64 / n as f64)
}

/// One Debian boot (see [`debian`]): (ms to systemd's first line, ms to
/// the login prompt, the launcher's VmRSS in KiB there, the guest's
/// MemAvailable in KiB once logged in, systemd-analyze's lines).
fn debian_boot() -> Option<(f64, f64, f64, f64, Vec<String>)> {
    use std::io::Write;
    let guests = guests();
    let out = std::env::temp_dir().join(format!("lguest-bench-debian-{}.out", std::process::id()));
    let file = std::fs::File::create(&out).ok()?;
    let mut child = launcher()
        .args(["run", "--memory", "512M", "--disk", "path=/dev/nvme0n1", &format!("{guests}/vmlinux")])
        .args(["--", "root=/dev/vda", "rw"])
        .stdin(std::process::Stdio::piped())
        .stdout(file)
        .stderr(std::process::Stdio::null())
        .spawn()
        .ok()?;
    let mut stdin = child.stdin.take()?;
    let start = std::time::Instant::now();
    let (mut welcome, mut login, mut rss, mut logged_in) = (None, None, None, false);
    let mut typed_commands = false;
    let status = loop {
        let text = std::fs::read_to_string(&out).unwrap_or_default();
        let ms = start.elapsed().as_secs_f64() * 1000.0;
        if welcome.is_none() && text.contains("Welcome to ") {
            welcome = Some(ms);
        }
        if login.is_none() && text.contains("lguest-debian login: ") {
            login = Some(ms);
            rss = std::fs::read_to_string(format!("/proc/{}/status", child.id())).ok().and_then(|s| {
                s.lines().find_map(|l| l.strip_prefix("VmRSS:")?.trim().strip_suffix("kB")?.trim().parse::<f64>().ok())
            });
            stdin.write_all(b"root\n").ok()?;
        }
        if login.is_some() && !logged_in && text.contains("root@lguest-debian:~# ") {
            logged_in = true;
        }
        if logged_in && !typed_commands {
            typed_commands = true;
            let script = concat!(
                "systemctl is-system-running --wait >/dev/null; ",
                "systemd-analyze | sed 's/^/lgbench: /'; ",
                "grep MemAvailable /proc/meminfo | sed 's/^/lgbench: /'; poweroff\n"
            );
            stdin.write_all(script.as_bytes()).ok()?;
        }
        if let Ok(Some(st)) = child.try_wait() {
            break st;
        }
        if start.elapsed() > std::time::Duration::from_secs(1800) {
            let _ = child.kill();
            break child.wait().ok()?;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let text = std::fs::read_to_string(&out).unwrap_or_default();
    let _ = std::fs::remove_file(&out);
    if !status.success() {
        return None;
    }
    let lines: Vec<String> = text
        .lines()
        .filter_map(|l| l.trim_end().rsplit('\r').next()?.strip_prefix("lgbench: "))
        .map(String::from)
        .collect();
    let avail =
        lines.iter().find_map(|l| l.strip_prefix("MemAvailable:")?.trim().strip_suffix("kB")?.trim().parse().ok());
    Some((welcome?, login?, rss?, avail?, lines.into_iter().filter(|l| !l.starts_with("MemAvailable")).collect()))
}

/// `lguest_bench debian`: the Debian boot's figures beside the busybox
/// initramfs's boot to /init, in one QEMU host boot (with `-icount`, the
/// host's wall clock counts the QEMU host's instructions: 1 ms is 10^6).
fn debian() {
    let k = samples().min(3);
    let mut r = Report { failed: Vec::new() };
    let runs: Vec<_> = (0..k).map(|_| debian_boot()).collect();
    if runs.iter().any(Option::is_none) {
        println!("bench: debian failed (a boot did not reach the login and power off; is /dev/nvme0n1 the image of make rootfs?)");
        std::process::exit(1);
    }
    let runs: Vec<_> = runs.into_iter().flatten().collect();
    let pick = |i: usize| {
        let mut it = runs.iter().map(move |r| [r.0, r.1, r.2, r.3][i]);
        move || it.next()
    };
    let first = r.figure(
        "debian_boot_to_systemd",
        "ms",
        " (host wall clock, launcher start to systemd's Welcome line)",
        k,
        pick(0),
    );
    let login =
        r.figure("debian_boot_to_login", "ms", " (host wall clock, launcher start to the login prompt)", k, pick(1));
    r.figure("debian_launcher_rss", "KiB", " (the launcher's VmRSS at the login prompt, 512 MiB guest)", k, pick(2));
    r.figure("debian_mem_available", "KiB", " (the guest's MemAvailable once logged in, of 512 MiB)", k, pick(3));
    for l in &runs[runs.len() - 1].4 {
        println!("bench: debian_systemd_analyze {l}");
    }
    let linux_n = 1000;
    let busybox = r.figure(
        "busybox_boot_to_init",
        "ms",
        " (host wall clock, the initramfs guest to /init's first line)",
        k,
        || linux_guest(linux_n).map(|r| r.2),
    );
    if let (Some(l), Some(f), Some(b)) = (login, first, busybox) {
        println!("bench: debian_login_vs_busybox_init {:.1} ratio; debian_systemd_vs_busybox_init {:.1} ratio (of the medians)", l / b, f / b);
    }
    if !r.failed.is_empty() {
        println!("bench: FAILED: {}", r.failed.join(", "));
        std::process::exit(1);
    }
}

fn main() {
    if std::env::args().nth(1).as_deref() == Some("debian") {
        return debian();
    }
    let k = samples();
    let n = 200_000;
    let mut r = Report { failed: Vec::new() };
    let getpid = r.figure("getpid", "cycles", "", k, || Some(getpid_cycles(n)));
    let hcall = r.figure("hypercall_round_trip", "cycles", "", k, || hypercall_cycles(n));
    if let (Some(h), Some(g)) = (hcall, getpid) {
        println!("bench: hypercall_vs_getpid {:.2} ratio (of the medians)", h / g);
    }
    // A guest user program's system call, to its guest kernel and back: the
    // syscall instruction (a #UD exit the host turns into the guest
    // kernel's entry, then LHCALL_IRET_USER) and int $0x80 (a #GP exit).
    let sys_n = 20_000;
    let sys = r.figure("guest_syscall_round_trip", "cycles", " (syscall in guest user mode)", k, || {
        guest_syscall_cycles(sys_n, "syscall")
    });
    let int80 = r.figure("guest_int80_round_trip", "cycles", " (int $0x80 in guest user mode)", k, || {
        guest_syscall_cycles(sys_n, "int80")
    });
    if let (Some(s), Some(i), Some(g)) = (sys, int80, getpid) {
        println!("bench: guest_syscall_vs_getpid {:.2} ratio (of the medians; int $0x80 {:.2})", s / g, i / g);
    }
    // The same with the direct system call (no exit either way), and a
    // kernel's hypercall by `syscall` against `int $0x1f`'s.
    let direct = r.figure(
        "guest_direct_syscall_round_trip",
        "cycles",
        " (syscall in guest user mode, the switcher's direct system call)",
        k,
        || guest_syscall_cycles(sys_n, "direct syscall"),
    );
    if let (Some(d), Some(g)) = (direct, getpid) {
        println!("bench: guest_direct_syscall_vs_getpid {:.2} ratio (of the medians)", d / g);
    }
    let hsys = r.figure(
        "hypercall_syscall_round_trip",
        "cycles",
        " (a hypercall by syscall from guest kernel mode)",
        k,
        || guest_syscall_cycles(sys_n, "syscall hypercall"),
    );
    if let (Some(h), Some(g)) = (hsys, getpid) {
        println!("bench: hypercall_syscall_vs_getpid {:.2} ratio (of the medians)", h / g);
    }
    let on = r.figure("irq_latency_with_check", "cycles", " (each sample a median of 20)", k, || {
        latency(false).map(|c| c as f64)
    });
    let off = r.figure("irq_latency_without_check", "cycles", " (each sample a median of 20, noirqcheck)", k, || {
        latency(true).map(|c| c as f64)
    });
    if let (Some(on), Some(off)) = (on, off) {
        println!("bench: irq_latency_ratio {:.1} ratio (without / with, of the medians)", off / on.max(1.0));
    }
    let host_fault = r.figure("host_fault_cycles", "cycles", " (first touch of a fresh anonymous page)", k, || {
        host_fault_cycles(512).map(|c| c as f64)
    });
    let host_fork =
        r.figure("host_fork_cycles", "cycles", " (fork, 64 copy-on-write pages written, exit, wait)", k, || {
            host_fork_cycles(64, 100).map(|c| c as f64)
        });
    // pfbench gives several figures per run: k runs, each figure's samples.
    let mut runs = Vec::new();
    for i in 0..k {
        match pfbench() {
            Some(figures) => runs.push(figures),
            None => {
                println!("bench: pfbench failed (sample {} of {k})", i + 1);
                r.failed.push("pfbench".into());
                break;
            }
        }
    }
    if runs.len() == k {
        let names: Vec<String> = runs[0].iter().map(|(n, _)| n.clone()).collect();
        let mut medians = Vec::new();
        for name in &names {
            let mut it = runs.iter().map(|f| f.iter().find(|(n, _)| n == name).map(|(_, v)| *v as f64));
            let med = r.figure(&format!("pf_{name}"), "cycles", "", k, || it.next().flatten());
            medians.push((name.clone(), med));
        }
        let get = |n: &str| medians.iter().find(|(k, _)| k == n).and_then(|(_, v)| *v);
        if let (Some(g), Some(h)) = (get("fault_roundtrip_cycles"), host_fault) {
            println!(
                "bench: pf_fault_vs_host {:.1} ratio (guest demand paging / host demand-zero fault, of the medians)",
                g / h
            );
        }
        if let (Some(g), Some(h)) = (get("fork_cycles"), host_fork) {
            println!(
                "bench: pf_fork_vs_host {:.2} ratio (guest address-space cycle / host fork, of the medians)",
                g / h
            );
        }
    }
    // The Linux guest: its system call and fork+exec against the host's,
    // and its boot to /init, beside a Rust guest's whole run for scale.
    let linux_n = 20_000;
    let mut linux_runs = Vec::new();
    for _ in 0..k {
        match linux_guest(linux_n) {
            Some(run) => linux_runs.push(run),
            None => break,
        }
    }
    let mut runs = linux_runs.iter();
    let lgetpid =
        r.figure("linux_guest_getpid", "cycles", " (in the Linux guest's user space)", k, || runs.next().map(|r| r.0));
    let mut runs = linux_runs.iter();
    let lspawn =
        r.figure("linux_guest_spawn", "cycles", " (fork+exec+exit+wait of /bin/true)", k, || runs.next().map(|r| r.1));
    let mut runs = linux_runs.iter();
    let lboot = r.figure(
        "linux_guest_boot_to_init",
        "ms",
        " (host wall clock, launcher start to /init's first line)",
        k,
        || runs.next().map(|r| r.2),
    );
    let hspawn =
        r.figure("host_spawn", "cycles", " (fork+exec+exit+wait of /bin/true)", k, || host_spawn_cycles(linux_n / 100));
    let hello = r.figure("rust_guest_hello_run", "ms", " (host wall clock, the hello sample's whole run)", k, || {
        let guests = guests();
        let start = std::time::Instant::now();
        let st = launcher().args(["run", "--memory", "16M", &format!("{guests}/hello")]).output().ok()?;
        st.status.success().then(|| start.elapsed().as_secs_f64() * 1000.0)
    });
    if let (Some(l), Some(g)) = (lgetpid, getpid) {
        println!("bench: linux_getpid_vs_host {:.2} ratio (of the medians)", l / g);
    }
    if let (Some(l), Some(h)) = (lspawn, hspawn) {
        println!("bench: linux_spawn_vs_host {:.2} ratio (of the medians)", l / h);
    }
    if let (Some(l), Some(h)) = (lboot, hello) {
        println!("bench: linux_boot_vs_hello {:.1} ratio (of the medians)", l / h);
    }
    if !r.failed.is_empty() {
        println!("bench: FAILED: {}", r.failed.join(", "));
        std::process::exit(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_and_spread() {
        assert_eq!(spread(&mut [3.0, 1.0, 2.0]), (2.0, 1.0, 3.0));
        assert_eq!(spread(&mut [4.0, 1.0, 2.0, 3.0]), (2.5, 1.0, 4.0));
        assert_eq!(spread(&mut [7.0]), (7.0, 7.0, 7.0));
    }

    /// A figure with one failed sample is a failure, recorded for the exit
    /// status, and gives no median.
    #[test]
    fn one_failed_sample_fails_the_figure() {
        let mut r = Report { failed: Vec::new() };
        let mut i = 0;
        let got = r.figure("x", "cycles", "", 3, || {
            i += 1;
            (i != 2).then_some(1.0)
        });
        assert_eq!(got, None);
        assert_eq!(r.failed, ["x"]);
        assert_eq!(r.figure("y", "cycles", "", 3, || Some(5.0)), Some(5.0));
        assert_eq!(r.failed, ["x"]);
    }
}
