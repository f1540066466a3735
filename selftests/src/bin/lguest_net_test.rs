// SPDX-License-Identifier: GPL-2.0
//! Tests of the virtio network device, end to end: the guest's smoltcp
//! stack (`samples/tcpblast`) over its virtio-net driver, the launcher's
//! tap device, and the host's own TCP/IP stack, with the project's
//! `lguest-tcpsink` timing and checking the stream on the host side.
//!
//! Each test makes its own network namespace (`unshare(CLONE_NEWNET)`, so
//! nothing outside the test sees the addresses) with a persistent tap,
//! `lgtap0`, at 192.168.2.1/24; the guest is 192.168.2.2. The namespace
//! and the tap go when the test moves to the next namespace or exits.

use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

use lguest_selftests::{self as t, check, check_eq, guest, strings, Outcome, Proc, TestResult};

const TAP: &str = "lgtap0";
const HOST: &str = "192.168.2.1";
const GUEST_IP: &str = "ip=192.168.2.2/24";
const PORT: u16 = 9999;
/// Bytes each way: 64 MiB.
const BULK: u64 = 64 << 20;
const TIMEOUT: Duration = Duration::from_secs(300);

/// Starts `lguest run --stats FLAGS --net tap=lgtap0[,OPT] tcpblast ARGS`.
fn guest_run(flags: &[&str], net_opt: &str, args: &[&str]) -> Result<Proc, t::NotPassed> {
    let mut a = strings(&["run", "--memory", "128M", "--stats"]);
    a.extend(strings(flags));
    a.push("--net".into());
    a.push(format!("tap={TAP}{net_opt}"));
    a.push(guest("tcpblast"));
    a.push(GUEST_IP.into());
    a.extend(strings(args));
    Proc::launcher(&a, None)
}

/// Starts `lguest-tcpsink ARGS`.
fn sink(args: &[&str]) -> Result<Proc, t::NotPassed> {
    Proc::spawn("lguest-tcpsink", &strings(args), None)
}

/// Both ends finished cleanly; the sink's line.
fn both_ok(g: &Outcome, s: &Outcome) -> Result<String, t::NotPassed> {
    check_eq!(s.code, 0, format!("tcpsink ({}) with the guest {}", s.describe(), g.describe()));
    check_eq!(g.code, 0, format!("the guest ({}) with tcpsink {}", g.describe(), s.describe()));
    check!(!g.stderr.contains("panicked"), "the launcher panicked: {}", g.describe());
    let line = s.stdout.lines().find(|l| l.starts_with("tcpsink: ")).unwrap_or_default();
    Ok(line.to_string())
}

/// Pings both ways: the host pings the guest (smoltcp answers), 5 of 5
/// replies; the guest pings the host (an ICMP socket), 5 of 5 replies.
fn ping_both_ways() -> TestResult {
    t::private_netns(TAP, &format!("{HOST}/24"))?;
    let g = guest_run(&[], "", &["ping=12", &format!("pinghost={HOST}")])?;
    // Let the guest come up; ping retries anyway.
    let start = Instant::now();
    let mut last = String::new();
    let mut ok = false;
    while start.elapsed() < Duration::from_secs(15) && !ok {
        let o = Command::new("ping")
            .args(["-c", "5", "-W", "2", "192.168.2.2"])
            .output()
            .map_err(|e| t::NotPassed::Fail(format!("ping: {e}")))?;
        last = String::from_utf8_lossy(&o.stdout).into_owned();
        ok = o.status.success() && last.contains("5 packets received");
    }
    let o = g.wait(Duration::from_secs(60))?;
    check!(ok, "no 5 of 5 ping replies: {last:?}; guest: {}", o.describe());
    println!("# host -> guest: {}", last.lines().find(|l| l.contains("round-trip")).unwrap_or("(no round-trip line)"));
    check_eq!(o.code, 0, format!("the guest ({})", o.describe()));
    let want = format!("tcpblast: ping host {HOST}: 5 sent, 5 replies");
    check!(o.stdout.contains(&want), "guest -> host: no {want:?}: {}", o.describe());
    Ok(())
}

/// 64 MiB guest to host over TCP; the sink checks every byte and the count.
fn tcp_guest_to_host() -> TestResult {
    t::private_netns(TAP, &format!("{HOST}/24"))?;
    let addr = format!("{HOST}:{PORT}");
    let s = sink(&[&addr, "--expect", &BULK.to_string(), "--timeout", "280"])?;
    std::thread::sleep(Duration::from_millis(300));
    let g = guest_run(&[], "", &[&format!("peer={addr}"), &format!("send={BULK}"), "timeout=280"])?;
    let (g, s) = (g.wait(TIMEOUT)?, s.wait(TIMEOUT)?);
    let line = both_ok(&g, &s)?;
    check!(line.contains(&format!("tcpsink: {BULK} bytes")), "sink: {}", s.describe());
    println!("# guest -> host: {line}");
    Ok(())
}

/// 64 MiB host to guest over TCP; the guest checks every byte.
fn tcp_host_to_guest() -> TestResult {
    t::private_netns(TAP, &format!("{HOST}/24"))?;
    let addr = format!("{HOST}:{PORT}");
    let s = sink(&[&addr, "--send", &BULK.to_string(), "--timeout", "280"])?;
    std::thread::sleep(Duration::from_millis(300));
    let g = guest_run(&[], "", &[&format!("peer={addr}"), &format!("recv={BULK}"), "timeout=280"])?;
    let (g, s) = (g.wait(TIMEOUT)?, s.wait(TIMEOUT)?);
    let line = both_ok(&g, &s)?;
    check!(g.stdout.contains(&format!("{BULK} bytes")), "the guest did not report {BULK} bytes: {}", g.describe());
    println!("# host -> guest: {line}");
    Ok(())
}

/// The benchmark's loaded Linux-like guest (`irqdriven busy=50/5`, a
/// background job with interrupts off 50 us of every 55) with the 2009
/// launcher structure (`--sync-kicks`): 8 MiB guest to host, checked by
/// the sink, with the `irq_pending` check and without. Without it, the
/// guest must report interrupts held back in its critical sections and
/// waits that began with one held back (what the check is for); with it,
/// the transfer is as correct.
fn tcp_loaded_guest() -> TestResult {
    const N: u64 = 8 << 20;
    for check in [true, false] {
        t::private_netns(TAP, &format!("{HOST}/24"))?;
        let addr = format!("{HOST}:{PORT}");
        let s = sink(&[&addr, "--expect", &N.to_string(), "--timeout", "120"])?;
        std::thread::sleep(Duration::from_millis(300));
        let (peer, send) = (format!("peer={addr}"), format!("send={N}"));
        let mut args = vec![peer.as_str(), &send, "timeout=120", "irqdriven", "busy=50/5"];
        if !check {
            args.push("noirqcheck");
        }
        let g = guest_run(&["--sync-kicks"], "", &args)?;
        let (g, s) = (g.wait(TIMEOUT)?, s.wait(TIMEOUT)?);
        let line = both_ok(&g, &s)?;
        check!(line.contains(&format!("tcpsink: {N} bytes")), "sink: {}", s.describe());
        let want = format!("irq_pending check {}", if check { "on" } else { "off" });
        check!(g.stdout.contains(&want), "the guest does not say {want:?}: {}", g.describe());
        let find = |p: &str| g.stdout.lines().find(|l| l.contains(p)).unwrap_or_default().to_string();
        let (waits, job) = (find("waits began with one held back"), find("background job"));
        let held_waits: Option<u64> = t::number_before(&waits, "waits");
        let held_in_job: Option<u64> = t::number_before(&job, "of");
        println!("# irq_pending check {}: {line}; {waits}; {job}", if check { "on" } else { "off" });
        check!(held_waits.is_some() && held_in_job.is_some(), "no interrupt-driven counters: {}", g.describe());
        if !check {
            check!(held_in_job > Some(0), "no interrupt held back in the background job: {job}");
            check!(held_waits > Some(0), "no wait began with an interrupt held back: {waits}");
        }
    }
    Ok(())
}

/// Deleting the tap while the guest sends: the launcher itself stops with
/// an error naming the device and the tap (status 1, a launcher error: not
/// the guest's own timeout, which would be a crash, 10), no panic, no
/// signal; and the host goes on (a guest still runs).
fn tap_deleted_under_traffic() -> TestResult {
    t::private_netns(TAP, &format!("{HOST}/24"))?;
    let addr = format!("{HOST}:{PORT}");
    let s = sink(&[&addr, "--timeout", "60"])?;
    std::thread::sleep(Duration::from_millis(300));
    let mut g = guest_run(&[], "", &[&format!("peer={addr}"), "send=1073741824", "timeout=60"])?;
    // Under traffic: a megabyte has gone through the tap (from /proc/net/dev,
    // which is this network namespace's; /sys/class/net is the one sysfs
    // was mounted in).
    let flowing = || {
        let dev = std::fs::read_to_string("/proc/net/dev").unwrap_or_default();
        let line = dev.lines().find_map(|l| l.trim_start().strip_prefix(&format!("{TAP}:"))).unwrap_or("");
        let n: Vec<u64> = line.split_whitespace().filter_map(|w| w.parse().ok()).collect();
        n.first().copied().unwrap_or(0) + n.get(8).copied().unwrap_or(0) > 1 << 20
    };
    let started = t::wait_for(Duration::from_secs(120), || flowing() || !g.running());
    check!(started && g.running(), "no traffic before the tap was to go");
    t::ip(&["link", "del", TAP])?;
    let g = g.wait(Duration::from_secs(90))?;
    let _ = s.wait(Duration::from_secs(90));
    println!("# after the tap went: exit {}; {}", g.code, g.stderr.lines().last().unwrap_or(""));
    check_eq!(g.code, 1, format!("the launcher's status ({})", g.describe()));
    check!(!g.stderr.contains("panicked"), "the launcher panicked: {}", g.describe());
    let want = format!("net0 ({TAP})");
    check!(
        g.stderr.lines().any(|l| l.starts_with("lguest: ") && l.contains(&want) && l.contains("host side (its tap")),
        "no launcher error naming {want} and its tap: {}",
        g.describe()
    );
    let hello = Proc::launcher(&strings(&["run", &guest("hello")]), None)?.wait(Duration::from_secs(60))?;
    check_eq!(hello.code, 0, format!("a guest after that ({})", hello.describe()));
    Ok(())
}

/// A tap opened by someone else (this test, as a privileged helper would)
/// and passed down as `--net fd=N`: the guest gets the MAC that `mac=`
/// chose (the `devices` guest shows it, and the host learns it from the
/// guest's own packets in its ARP table), and pings across it work both
/// ways. Without `mac=`, the MAC derived from the tap's name is the same
/// on every run and not the old fixed 52:54:00:12:34:56.
fn tap_fd_and_mac() -> TestResult {
    use std::os::fd::AsRawFd;
    t::private_netns(TAP, &format!("{HOST}/24"))?;
    let tap = t::open_tap(TAP)?;
    let fd = tap.as_raw_fd();
    // Let the launcher inherit it.
    // SAFETY: F_SETFD with an integer argument on a live descriptor.
    check!(unsafe { libc::fcntl(fd, libc::F_SETFD, 0) } == 0, "cannot clear FD_CLOEXEC");
    let mac = "02:12:34:56:78:9a";
    let net = format!("fd={fd},mac={mac}");
    let o = Proc::launcher(&strings(&["run", "--net", &net, &guest("devices")]), None)?.wait(TIMEOUT)?;
    check_eq!(o.code, 0, format!("devices on fd={fd} ({})", o.describe()));
    check!(o.stdout.contains(&format!("devices: net: MAC {mac}, link up")), "no MAC {mac}: {}", o.describe());
    let a = strings(&[
        "run",
        "--memory",
        "128M",
        "--net",
        &net,
        &guest("tcpblast"),
        GUEST_IP,
        "ping=6",
        &format!("pinghost={HOST}"),
    ]);
    let o = Proc::launcher(&a, None)?.wait(TIMEOUT)?;
    check_eq!(o.code, 0, format!("tcpblast on fd={fd} ({})", o.describe()));
    let want = format!("tcpblast: ping host {HOST}: 5 sent, 5 replies");
    check!(o.stdout.contains(&want), "no {want:?}: {}", o.describe());
    let arp = std::fs::read_to_string("/proc/net/arp").unwrap_or_default();
    check!(
        arp.lines().any(|l| l.starts_with("192.168.2.2 ") && l.contains(mac)),
        "the host did not learn {mac} for the guest: {arp:?}"
    );
    drop(tap);
    // The default MAC: the same twice, and not the old fixed one.
    let mut seen = Vec::new();
    for _ in 0..2 {
        let o = Proc::launcher(&strings(&["run", "--net", &format!("tap={TAP}"), &guest("devices")]), None)?
            .wait(TIMEOUT)?;
        check_eq!(o.code, 0, format!("devices on tap={TAP} ({})", o.describe()));
        let line = o.stdout.lines().find(|l| l.starts_with("devices: net: MAC ")).unwrap_or_default().to_string();
        check!(!line.is_empty() && !line.contains("52:54:00:12:34:56"), "default MAC: {}", o.describe());
        seen.push(line);
    }
    check_eq!(seen[0], seen[1], "the default MAC changed between runs");
    Ok(())
}

/// `lguest run` as an unprivileged user (nobody), with a tap that root
/// made and opened and passed down (`--net fd=N`): the guest pings the
/// host. Access to /dev/lguest is given for the test (it is root's, 0600,
/// by default; the mode is put back afterwards), and the locked-memory
/// limit raised, as an administrator granting it would.
fn unprivileged_with_passed_tap() -> TestResult {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    t::private_netns(TAP, &format!("{HOST}/24"))?;
    let tap = t::open_tap(TAP)?;
    let fd = tap.as_raw_fd();
    // SAFETY: F_SETFD with an integer argument on a live descriptor.
    check!(unsafe { libc::fcntl(fd, libc::F_SETFD, 0) } == 0, "cannot clear FD_CLOEXEC");
    let lim = libc::rlimit { rlim_cur: libc::RLIM_INFINITY, rlim_max: libc::RLIM_INFINITY };
    // SAFETY: setrlimit reads one live rlimit; the child inherits it.
    check!(unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &lim) } == 0, "cannot raise RLIMIT_MEMLOCK");
    let node = "/dev/lguest";
    let old = std::fs::metadata(node).map_err(|e| t::NotPassed::Fail(format!("{node}: {e}")))?.permissions();
    std::fs::set_permissions(node, std::fs::Permissions::from_mode(0o666))
        .map_err(|e| t::NotPassed::Fail(format!("chmod {node}: {e}")))?;
    let out = std::process::Command::new(t::launcher())
        .args(["run", "--memory", "128M", "--net", &format!("fd={fd}"), &guest("tcpblast"), GUEST_IP, "ping=6"])
        .arg(format!("pinghost={HOST}"))
        .uid(65534)
        .gid(65534)
        .stdin(std::process::Stdio::null())
        .output();
    let _ = std::fs::set_permissions(node, old);
    let o = out.map_err(|e| t::NotPassed::Fail(format!("cannot run the launcher as nobody: {e}")))?;
    let (stdout, stderr) = (String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    check_eq!(o.status.code(), Some(0), format!("the launcher as nobody ({stdout:?} / {stderr:?})"));
    let want = format!("tcpblast: ping host {HOST}: 5 sent, 5 replies");
    check!(stdout.contains(&want), "no {want:?}: {stdout:?} / {stderr:?}");
    drop(tap);
    Ok(())
}

/// The Linux guest's network device: Linux's own virtio_net driver on the
/// lguest bus, over the launcher's virtio-net and the tap. Its /init
/// (`lginit=net`) brings eth0 up at 192.168.2.2/24 and gets 3 of 3 ping
/// replies from the host, then 8 MiB go out by Linux's TCP to the host's
/// sink, which checks every byte and the count, and 8 MiB come in from
/// the host's, which the guest's `lguest-tcpsink --expect` checks.
fn linux_net() -> TestResult {
    const N: u64 = 8 << 20;
    t::private_netns(TAP, &format!("{HOST}/24"))?;
    let out = sink(&[&format!("{HOST}:{PORT}"), "--expect", &N.to_string(), "--timeout", "280"])?;
    let inn = sink(&[&format!("{HOST}:{}", PORT - 1), "--send", &N.to_string(), "--timeout", "280"])?;
    std::thread::sleep(Duration::from_millis(300));
    let a = strings(&[
        "run",
        "--memory",
        "128M",
        "--net",
        &format!("tap={TAP}"),
        "--initrd",
        &guest("linux-initramfs.gz"),
        &guest("vmlinux"),
        "--",
        "lginit=net",
        &format!("lgnet=192.168.2.2/24,{HOST},{N}"),
    ]);
    let g = Proc::launcher(&a, None)?.wait(TIMEOUT)?;
    let (out, inn) = (out.wait(TIMEOUT)?, inn.wait(TIMEOUT)?);
    check_eq!(g.code, 0, format!("the Linux guest ({})", g.describe()));
    let lines: Vec<&str> = g.stdout.lines().filter_map(|l| l.trim_end().strip_prefix("lginit: ")).collect();
    let Some(eth0) = lines.iter().find_map(|l| l.strip_prefix("eth0 ")) else {
        t::fail!("no eth0 line: {}", g.describe());
    };
    println!("# eth0 {eth0}");
    // The network device is virtio device 1 (its ID among the guest's).
    check!(eth0.split_whitespace().skip(1).any(|id| id == "0x0001"), "no virtio network device: {eth0}");
    check!(lines.contains(&"ping 3"), "not 3 of 3 ping replies: {lines:?}");
    let want = format!("tcpsink: {N} bytes");
    check!(out.code == 0 && out.stdout.contains(&want), "out: the host's sink: {}", out.describe());
    check!(lines.contains(&format!("sent {N}").as_str()), "out: the guest's side: {lines:?}");
    check!(inn.code == 0, "in: the host's sender: {}", inn.describe());
    check!(lines.contains(&format!("received {N}").as_str()), "in: the guest's check: {lines:?}");
    for (dir, o) in [("out", &out), ("in", &inn)] {
        println!("# {dir}: {}", o.stdout.lines().find(|l| l.starts_with("tcpsink: ")).unwrap_or_default());
    }
    Ok(())
}

fn main() -> ExitCode {
    t::run(&[
        ("ping_both_ways", ping_both_ways),
        ("tcp_guest_to_host", tcp_guest_to_host),
        ("tcp_host_to_guest", tcp_host_to_guest),
        ("tcp_loaded_guest", tcp_loaded_guest),
        ("tap_deleted_under_traffic", tap_deleted_under_traffic),
        ("tap_fd_and_mac", tap_fd_and_mac),
        ("unprivileged_with_passed_tap", unprivileged_with_passed_tap),
        ("linux_net", linux_net),
    ])
}
