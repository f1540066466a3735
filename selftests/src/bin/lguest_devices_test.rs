// SPDX-License-Identifier: GPL-2.0
//! Tests of the virtio devices on the lguest bus, end to end: the launcher's
//! device models (`launcher/src/virtio`) driven by the guest's drivers
//! (`guest/lguest-guest`, samples `devices` and `blk`), with the host
//! module moving kicks (`LGUEST_IOEVENTFD`) and interrupts (`LGUEST_IRQFD`).
//! The network has its own program, `lguest_net_test`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use lguest_selftests::{self as t, check, check_eq, fail, guest, strings, Outcome, Proc, TestResult};

const TIMEOUT: Duration = Duration::from_secs(120);
const SECTOR: usize = 512;

/// Runs `lguest run [OPTS] GUEST ARGS`.
fn run(opts: &[&str], guest_name: &str, args: &[&str]) -> Result<Outcome, t::NotPassed> {
    let mut a = strings(&["run"]);
    a.extend(strings(opts));
    a.push(guest(guest_name));
    a.extend(strings(args));
    Proc::launcher(&a, None)?.wait(TIMEOUT)
}

/// A scratch disk image of `sectors` sectors filled with `fill`, removed
/// when dropped.
struct Disk(PathBuf);

impl Disk {
    fn new(name: &str, sectors: usize, fill: u8) -> Result<Self, t::NotPassed> {
        let path = std::env::temp_dir().join(format!("lguest-{name}-{}.img", std::process::id()));
        std::fs::write(&path, vec![fill; sectors * SECTOR])
            .map_err(|e| t::NotPassed::Fail(format!("{}: {e}", path.display())))?;
        Ok(Self(path))
    }

    fn path(&self) -> String {
        self.0.display().to_string()
    }

    fn read(&self) -> Vec<u8> {
        std::fs::read(&self.0).unwrap_or_default()
    }
}

impl Drop for Disk {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Byte `i` of sector `sector` as `samples/blk` writes it.
fn blk_pattern(sector: u64, i: usize) -> u8 {
    let x = sector.wrapping_mul(0x9e37_79b9).wrapping_add(i as u64 * 131 + 7);
    // CAST: the low byte is the point.
    (x ^ (x >> 8) ^ (x >> 16)) as u8
}

/// The 16 entropy bytes `devices` prints.
fn rng_bytes(o: &Outcome) -> Option<Vec<u8>> {
    let line = o.stdout.lines().find_map(|l| l.strip_prefix("devices: rng: 16 bytes: "))?;
    line.split_whitespace().map(|h| u8::from_str_radix(h, 16).ok()).collect()
}

/// The demo guest finds a console, an entropy source and a disk on the bus,
/// talks over the console, gets 16 random bytes (different in a second
/// run, not all zero), writes and reads back the disk's last sector, and
/// powers off.
fn bus_demo() -> TestResult {
    let disk = Disk::new("demo", 2048, 0)?;
    let o = run(&["--disk", &disk.path()], "devices", &[])?;
    check_eq!(o.code, 0, format!("exit status ({})", o.describe()));
    for want in [
        "devices: 3 on the lguest bus",
        "console (type 3)",
        "rng (type 4)",
        "block (type 2)",
        "devices: hello from the lguest guest over the virtio console",
        "devices: blk: 2048 sectors; wrote, flushed and read back sector 2047: OK",
        "devices: done",
    ] {
        check!(o.stdout.contains(want), "no {want:?} in the output: {}", o.describe());
    }
    let Some(first) = rng_bytes(&o) else { fail!("no entropy line: {}", o.describe()) };
    check_eq!(first.len(), 16, "entropy bytes");
    check!(first.iter().any(|&b| b != 0), "16 zero bytes of entropy: {}", o.describe());
    let again = run(&[], "devices", &[])?;
    check_eq!(again.code, 0, format!("second run ({})", again.describe()));
    let Some(second) = rng_bytes(&again) else { fail!("no entropy line: {}", again.describe()) };
    check!(first != second, "the same 16 bytes twice: {first:02x?}");
    // The demo's write landed in the file.
    let data = disk.read();
    check!(data[2047 * SECTOR..].iter().any(|&b| b != 0), "sector 2047 of the image is still zero");
    Ok(())
}

/// A console round trip: a line on the launcher's stdin reaches the guest
/// through the virtio console's receive queue and comes back on stdout
/// through its transmit queue.
fn console_roundtrip() -> TestResult {
    let line = "the quick brown fox jumps over the lazy guest 0123456789";
    let a = strings(&["run", &guest("devices"), "echo"]);
    let o = Proc::launcher(&a, Some(format!("{line}\n").into_bytes()))?.wait(TIMEOUT)?;
    check_eq!(o.code, 0, format!("exit status ({})", o.describe()));
    check!(o.stdout.contains(&format!("devices: echo: {line}")), "no echo: {}", o.describe());
    Ok(())
}

/// Without `--disk` and with `--no-rng` / `--no-console` the bus holds
/// exactly what was asked for.
fn bus_only_what_was_asked() -> TestResult {
    let o = run(&["--no-rng"], "devices", &[])?;
    check_eq!(o.code, 0, format!("exit status ({})", o.describe()));
    check!(o.stdout.contains("devices: 1 on the lguest bus"), "{}", o.describe());
    check!(o.stdout.contains("devices: blk: none"), "{}", o.describe());
    let o = run(&["--no-rng", "--no-console"], "devices", &[])?;
    check_eq!(o.code, 0, format!("exit status ({})", o.describe()));
    check!(o.stdout.contains("devices: 0 on the lguest bus"), "{}", o.describe());
    Ok(())
}

/// `samples/blk` writes a pattern over 1024 sectors in 32-sector requests,
/// flushes, reads back and checks; the host then finds exactly that pattern
/// in the image file, and nothing outside the range touched (that the
/// flush made it durable is not visible from here; see
/// `blk_flush_survives_kill`). The same
/// through the vCPU thread (`--no-ioeventfd`).
fn blk_write_flush_verify() -> TestResult {
    for opts in [&[][..], &["--no-ioeventfd"][..]] {
        let disk = Disk::new("blk", 4096, 0xee)?;
        let path = disk.path();
        let mut o_args = vec!["--stats", "--disk", path.as_str()];
        o_args.extend_from_slice(opts);
        let o = run(&o_args, "blk", &["sectors=1024", "start=100", "chunk=32"])?;
        check_eq!(o.code, 0, format!("exit status ({})", o.describe()));
        check!(o.stdout.contains("blk: wrote 1024 sectors, flushed, verified OK"), "{}", o.describe());
        let data = disk.read();
        check_eq!(data.len(), 4096 * SECTOR, "image size");
        for sector in 0..4096u64 {
            let s = &data[sector as usize * SECTOR..(sector as usize + 1) * SECTOR];
            let written = (100..1124).contains(&sector);
            let bad = if written {
                (0..SECTOR).find(|&i| s[i] != blk_pattern(sector, i))
            } else {
                (0..SECTOR).find(|&i| s[i] != 0xee)
            };
            if let Some(i) = bad {
                fail!("{opts:?}: sector {sector} byte {i} is {:#x} (written: {written}): {}", s[i], o.describe());
            }
        }
        check!(o.stderr.contains("0 requests failed"), "{opts:?}: stats: {}", o.describe());
    }
    Ok(())
}

/// What the guest wrote and flushed is in the image after the launcher's
/// death: `blk hold` writes, flushes and verifies 512 sectors, then sleeps;
/// the launcher is killed with SIGKILL (no chance to write anything back at
/// exit), and the image holds every sector the guest wrote.
///
/// What this cannot see: SIGKILL keeps the page cache, so a missing or
/// no-op fdatasync passes too. The order of writes, fdatasync and
/// completion (writeback with FLUSH, writethrough without) is checked by
/// the launcher's unit tests with a recording disk (`block_writeback_*`,
/// `block_writethrough_*`, `block_sync_failure_*` in
/// `launcher/src/virtio/tests.rs`).
fn blk_flush_survives_kill() -> TestResult {
    let disk = Disk::new("kill", 1024, 0)?;
    let a = strings(&["run", "--disk", &disk.path(), &guest("blk"), "sectors=512", "hold"]);
    let mut p = Proc::launcher(&a, None)?;
    // Wait for the guest to say it flushed (its output goes to a pipe the
    // Proc drains; poll the image instead, with a deadline).
    let start = std::time::Instant::now();
    let written = |d: &[u8]| (0..512u64).all(|s| d[s as usize * SECTOR] == blk_pattern(s, 0));
    while start.elapsed() < TIMEOUT && p.running() && !written(&disk.read()) {
        std::thread::sleep(Duration::from_millis(100));
    }
    // Give the guest time to finish flushing and verifying, then kill.
    std::thread::sleep(Duration::from_millis(1500));
    p.signal(libc::SIGKILL);
    let o = p.wait(TIMEOUT)?;
    check_eq!(o.code, 128 + libc::SIGKILL, format!("the launcher's end ({})", o.describe()));
    check!(o.stdout.contains("blk: holding"), "the guest did not reach its hold: {}", o.describe());
    let data = disk.read();
    for sector in 0..512u64 {
        let s = &data[sector as usize * SECTOR..(sector as usize + 1) * SECTOR];
        if let Some(i) = (0..SECTOR).find(|&i| s[i] != blk_pattern(sector, i)) {
            fail!("sector {sector} byte {i} lost after the kill: {:#x}", s[i]);
        }
    }
    Ok(())
}

/// A read-only disk: the guest's write fails with an error status, reads
/// work, and the image is untouched.
fn blk_read_only() -> TestResult {
    let disk = Disk::new("ro", 256, 0x5a)?;
    let ro = format!("{},ro", disk.path());
    let o = run(&["--disk", &ro], "blk", &["sectors=64"])?;
    check_eq!(o.code, 0, format!("exit status ({})", o.describe()));
    check!(o.stdout.contains("blk: disk of 256 sectors, read-only"), "{}", o.describe());
    check!(o.stdout.contains("blk: read-only: write refused"), "{}", o.describe());
    check!(o.stdout.contains("read 64 sectors OK"), "{}", o.describe());
    check!(disk.read().iter().all(|&b| b == 0x5a), "the read-only image changed");
    Ok(())
}

/// A hostile driver (`samples/badvq`) feeds the entropy device malformed
/// queues: a buffer outside guest memory, a looping chain, a read-only
/// buffer to fill, a 4 GiB buffer, a head index beyond the ring, an
/// available index far ahead, an indirect table outside memory. Each time
/// the device sets DEVICE_NEEDS_RESET instead of touching anything; the
/// launcher lives on, and after a reset a good request works.
fn malformed_virtqueues() -> TestResult {
    let o = run(&[], "badvq", &[])?;
    check_eq!(o.code, 0, format!("exit status ({})", o.describe()));
    let resets = o.stdout.lines().filter(|l| l.ends_with(": device needs reset")).count();
    check_eq!(resets, 7, format!("cases the device refused ({})", o.describe()));
    check!(o.stdout.contains("badvq: good request after the resets: 16 bytes"), "{}", o.describe());
    check!(!o.stderr.contains("panicked"), "the launcher panicked: {}", o.describe());
    Ok(())
}

/// Bad device options are clear launcher errors, before any guest runs.
fn bad_device_options() -> TestResult {
    let cases: [(&[&str], &str); 3] = [
        (&["--disk", "/nonexistent/disk.img"], "/nonexistent/disk.img"),
        (&["--disk", "/dev/null,bogus"], "bogus"),
        (&["--net", "nonsense"], "nonsense"),
    ];
    for (opts, want) in cases {
        let o = run(opts, "hello", &[])?;
        check!(o.code != 0, "{opts:?} was accepted: {}", o.describe());
        check!(o.stderr.contains(want), "{opts:?}: the error does not name {want:?}: {}", o.describe());
        check!(!o.stdout.contains("Hello from the lguest guest"), "{opts:?}: the guest ran: {}", o.describe());
    }
    Ok(())
}

/// Whether some process holds an exclusive flock on `path` (the launcher's
/// on a read-write disk), from /proc/locks, so that looking does not take
/// a lock that could itself get in the launcher's way.
fn locked(path: &str) -> bool {
    use std::os::unix::fs::MetadataExt;
    let Ok(ino) = std::fs::metadata(path).map(|m| m.ino()) else { return false };
    let locks = std::fs::read_to_string("/proc/locks").unwrap_or_default();
    locks.lines().any(|l| {
        let w: Vec<&str> = l.split_whitespace().collect();
        w.len() > 5 && w[1] == "FLOCK" && w[3] == "WRITE" && w[5].rsplit(':').next() == Some(&ino.to_string())
    })
}

/// Two launchers on one image: while the first runs a guest on it
/// read-write, a second one fails (status 1) saying the image is in use,
/// before any guest runs, with a read-write and a read-only disk alike;
/// `lock=off` overrides it. After the first has gone, the image is free.
fn blk_image_locked() -> TestResult {
    let disk = Disk::new("lock", 1024, 0)?;
    let a =
        strings(&["run", "--disk", &format!("path={},readonly=off", disk.path()), &guest("blk"), "sectors=64", "hold"]);
    let mut first = Proc::launcher(&a, None)?;
    let held = t::wait_for(TIMEOUT, || locked(&disk.path()) || !first.running());
    check!(held && first.running(), "the first launcher did not lock the image");
    for opt in [disk.path(), format!("{},ro", disk.path()), format!("path={},readonly=on", disk.path())] {
        let o = run(&["--disk", &opt], "hello", &[])?;
        check_eq!(o.code, 1, format!("a second launcher with --disk {opt} ({})", o.describe()));
        check!(o.stderr.contains("is in use") && o.stderr.contains(&disk.path()), "{opt}: {}", o.describe());
        check!(!o.stdout.contains("Hello from the lguest guest"), "{opt}: the guest ran: {}", o.describe());
    }
    let o = run(&["--disk", &format!("path={},readonly=on,lock=off", disk.path())], "hello", &[])?;
    check_eq!(o.code, 0, format!("lock=off ({})", o.describe()));
    first.signal(libc::SIGTERM);
    let o = first.wait(TIMEOUT)?;
    check_eq!(o.code, 143, format!("the first launcher after SIGTERM ({})", o.describe()));
    check!(!locked(&disk.path()), "the image is still locked after the launcher went");
    Ok(())
}

/// A block device as a disk: a loop device over a 2048-sector image has
/// 2048 sectors for the guest (its stat size is 0; the launcher seeks to
/// its end), and `samples/blk` writes and verifies it through O_DIRECT
/// (`direct=on`), with the pattern landing in the image.
fn blk_block_device() -> TestResult {
    let disk = Disk::new("loop", 2048, 0)?;
    if !std::fs::read_to_string("/proc/devices").unwrap_or_default().lines().any(|l| l.ends_with(" loop")) {
        t::skip!(
            "no loop devices in this kernel (CONFIG_BLK_DEV_LOOP); the launcher's unit tests size a real block device"
        );
    }
    // busybox's losetup has no --show: ask for a free device, then attach.
    let losetup = |args: &[&str]| std::process::Command::new("losetup").args(args).output();
    let dev = match losetup(&["-f"]) {
        Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout).trim().to_string(),
        Ok(o) => t::skip!("losetup -f: {}", String::from_utf8_lossy(&o.stderr).trim()),
        Err(e) => t::skip!("no losetup: {e}"),
    };
    match losetup(&[&dev, &disk.path()]) {
        Ok(o) if o.status.success() => {}
        Ok(o) => fail!("losetup {dev}: {}", String::from_utf8_lossy(&o.stderr).trim()),
        Err(e) => fail!("losetup {dev}: {e}"),
    }
    let result = (|| -> TestResult {
        let o = run(&["--disk", &dev], "devices", &[])?;
        check_eq!(o.code, 0, format!("devices on {dev} ({})", o.describe()));
        check!(
            o.stdout.contains("devices: blk: 2048 sectors; wrote, flushed and read back sector 2047: OK"),
            "{dev}: {}",
            o.describe()
        );
        let o = run(&["--disk", &format!("path={dev},direct=on")], "blk", &["sectors=256", "start=8", "chunk=32"])?;
        check_eq!(o.code, 0, format!("blk on {dev} with direct=on ({})", o.describe()));
        check!(o.stdout.contains("blk: wrote 256 sectors, flushed, verified OK"), "{}", o.describe());
        Ok(())
    })();
    let _ = std::process::Command::new("losetup").args(["-d", &dev]).status();
    result?;
    let data = disk.read();
    for sector in 8..264u64 {
        let s = &data[sector as usize * SECTOR..(sector as usize + 1) * SECTOR];
        if let Some(i) = (0..SECTOR).find(|&i| s[i] != blk_pattern(sector, i)) {
            fail!("sector {sector} byte {i} of the image is {:#x} after the O_DIRECT run", s[i]);
        }
    }
    Ok(())
}

/// `--console file=F --serial file=G`: the virtio console's output is in
/// F, the hypercall console's (the device list the guest prints first) in
/// G, and neither is on stdout; `--serial off` drops the early output.
fn console_and_serial_files() -> TestResult {
    let dir = std::env::temp_dir();
    let (con, ser) = (
        dir.join(format!("lguest-con-{}.log", std::process::id())),
        dir.join(format!("lguest-ser-{}.log", std::process::id())),
    );
    let _ = (std::fs::remove_file(&con), std::fs::remove_file(&ser));
    let (c, s) = (format!("file={}", con.display()), format!("file={}", ser.display()));
    let o = run(&["--console", &c, "--serial", &s], "devices", &[])?;
    let (ctext, stext) =
        (std::fs::read_to_string(&con).unwrap_or_default(), std::fs::read_to_string(&ser).unwrap_or_default());
    let _ = (std::fs::remove_file(&con), std::fs::remove_file(&ser));
    check_eq!(o.code, 0, format!("exit status ({})", o.describe()));
    check!(ctext.contains("devices: hello from the lguest guest over the virtio console"), "console file: {ctext:?}");
    check!(stext.contains("on the lguest bus"), "serial file: {stext:?}");
    check!(!ctext.contains("on the lguest bus") && !stext.contains("devices: hello"), "mixed: {ctext:?} / {stext:?}");
    check!(o.stdout.is_empty(), "stdout is not empty: {}", o.describe());
    let o = run(&["--serial", "off"], "devices", &[])?;
    check_eq!(o.code, 0, format!("--serial off ({})", o.describe()));
    check!(!o.stdout.contains("on the lguest bus") && o.stdout.contains("devices: hello"), "{}", o.describe());
    Ok(())
}

/// A pty pair: the master and the slave, opened.
fn pty() -> Result<(std::fs::File, std::fs::File), t::NotPassed> {
    use std::os::fd::FromRawFd;
    // SAFETY: posix_openpt takes flags and returns a new descriptor.
    let mut fd = unsafe { libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY) };
    if fd < 0 && t::errno() == libc::ENOENT {
        // The QEMU host's /init mounts no devpts: mount one, as a login
        // system would have.
        let _ = std::fs::create_dir_all("/dev/pts");
        // SAFETY: mount(2) with NUL-terminated literals and no data.
        let ret = unsafe {
            libc::mount(
                c"devpts".as_ptr(),
                c"/dev/pts".as_ptr(),
                c"devpts".as_ptr(),
                0,
                c"ptmxmode=0666".as_ptr().cast(),
            )
        };
        if ret != 0 {
            t::skip!("no devpts, and mounting one failed: {}", t::errname(t::errno()));
        }
        // SAFETY: as above.
        fd = unsafe { libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY) };
        if fd < 0 {
            // /dev/ptmx may be the old node; the new instance has its own.
            let p = std::fs::OpenOptions::new().read(true).write(true).open("/dev/pts/ptmx");
            match p {
                Ok(f) => fd = std::os::fd::IntoRawFd::into_raw_fd(f),
                Err(e) => fail!("posix_openpt after mounting devpts: {e}"),
            }
        }
    }
    check!(fd >= 0, "posix_openpt: {}", t::errname(t::errno()));
    // SAFETY: a new descriptor nothing else owns.
    let master = unsafe { std::fs::File::from_raw_fd(fd) };
    // SAFETY: grantpt/unlockpt take the descriptor; ptsname returns a
    // static string valid until the next call, copied at once.
    let name = unsafe {
        check!(libc::grantpt(fd) == 0 && libc::unlockpt(fd) == 0, "grantpt: {}", t::errname(t::errno()));
        let p = libc::ptsname(fd);
        check!(!p.is_null(), "ptsname: {}", t::errname(t::errno()));
        std::ffi::CStr::from_ptr(p).to_string_lossy().into_owned()
    };
    let slave = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&name)
        .map_err(|e| t::NotPassed::Fail(format!("{name}: {e}")))?;
    Ok((master, slave))
}

/// Whether terminal `fd` is in canonical (cooked) mode.
fn cooked(fd: i32) -> bool {
    // SAFETY: termios is plain data; tcgetattr fills it in.
    let mut tio: libc::termios = unsafe { std::mem::zeroed() };
    // SAFETY: a live termios and descriptor.
    unsafe { libc::tcgetattr(fd, &mut tio) == 0 && tio.c_lflag & libc::ICANON != 0 }
}

/// The state letter of process `pid` (R, S, T, ...).
fn state(pid: i32) -> char {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    stat.rsplit(')').next().and_then(|r| r.trim().chars().next()).unwrap_or('?')
}

/// With stdin a terminal the launcher puts it in raw mode, and gives it
/// back on every way out: Ctrl-Z (SIGTSTP) stops the launcher with the
/// terminal cooked, SIGCONT makes it raw again, and Ctrl-\ (SIGQUIT) ends
/// it (status 131) with the terminal cooked.
fn raw_terminal_restored() -> TestResult {
    use std::os::fd::AsRawFd;
    use std::process::{Command, Stdio};
    if !std::path::Path::new("/dev/ptmx").exists() {
        t::skip!("no /dev/ptmx (devpts) in this host; the launcher's unit tests check raw mode on a pty");
    }
    let (master, slave) = pty()?;
    let fd = slave.as_raw_fd();
    let stdin = slave.try_clone().map_err(|e| t::NotPassed::Fail(e.to_string()))?;
    let mut child = Command::new(t::launcher())
        .args(["run", &guest("guest-ops"), "sleep", "100000"])
        .stdin(Stdio::from(stdin))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| t::NotPassed::Fail(format!("cannot start the launcher: {e}")))?;
    let pid = child.id() as i32;
    let result = (|| -> TestResult {
        check!(t::wait_for(TIMEOUT, || !cooked(fd)), "the launcher never made the terminal raw");
        // SAFETY: kill(2) on our own child, not yet waited for.
        unsafe { libc::kill(pid, libc::SIGTSTP) };
        check!(t::wait_for(TIMEOUT, || state(pid) == 'T'), "SIGTSTP did not stop it (state {})", state(pid));
        check!(cooked(fd), "the terminal stayed raw while the launcher was stopped");
        // SAFETY: as above.
        unsafe { libc::kill(pid, libc::SIGCONT) };
        check!(t::wait_for(TIMEOUT, || !cooked(fd)), "not raw again after SIGCONT");
        // SAFETY: as above.
        unsafe { libc::kill(pid, libc::SIGQUIT) };
        let st = child.wait().map_err(|e| t::NotPassed::Fail(e.to_string()))?;
        check_eq!(st.code(), Some(131), format!("status after SIGQUIT ({st:?})"));
        check!(cooked(fd), "the terminal stayed raw after SIGQUIT");
        Ok(())
    })();
    if result.is_err() {
        let _ = child.kill();
        let _ = child.wait();
    }
    drop(master);
    result
}

/// The sandbox: a device thread that makes a system call its seccomp
/// filter does not list (the launcher's test hook
/// `LGUEST_SECCOMP_SELFTEST`: the first device thread calls `uname`) ends
/// the launcher at once, status 159 (128 + SIGSYS), with a message naming
/// the thread and the call; with `--seccomp=log` the call is allowed (and
/// logged by the kernel) and the guest finishes, as with `--seccomp=off`.
fn seccomp_forbidden_call() -> TestResult {
    if !seccomp_filters() {
        t::skip!(
            "this kernel has no seccomp filters (CONFIG_SECCOMP_FILTER); the launcher's unit tests check its filters"
        );
    }
    let cases: [(&[&str], i32); 3] = [(&[], 159), (&["--seccomp=log"], 0), (&["--seccomp=off"], 0)];
    for (opts, code) in cases {
        let o = std::process::Command::new(t::launcher())
            .env("LGUEST_SECCOMP_SELFTEST", "1")
            .arg("run")
            .args(opts)
            .arg(guest("devices"))
            .stdin(std::process::Stdio::null())
            .output()
            .map_err(|e| t::NotPassed::Fail(format!("cannot run the launcher: {e}")))?;
        let (stdout, stderr) = (String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
        check_eq!(o.status.code(), Some(code), format!("{opts:?}: status ({stdout:?} / {stderr:?})"));
        let msg = "lguest: seccomp: the device thread made system call 63 (uname), which its filter forbids";
        if code == 159 {
            check!(stderr.contains(msg), "{opts:?}: no message {msg:?}: {stderr:?}");
            check!(!stdout.contains("devices: done"), "{opts:?}: the guest finished: {stdout:?}");
        } else {
            check!(stdout.contains("devices: done"), "{opts:?}: the guest did not finish: {stdout:?} / {stderr:?}");
        }
    }
    Ok(())
}

/// Whether this kernel has seccomp (the Seccomp line in /proc/self/status
/// comes with CONFIG_SECCOMP).
fn seccomp_filters() -> bool {
    std::fs::read_to_string("/proc/self/status").is_ok_and(|s| s.lines().any(|l| l.starts_with("Seccomp:")))
}

/// What /proc says of each thread of `pid`: (name, Seccomp mode, CapEff).
fn threads(pid: i32) -> Vec<(String, String, String)> {
    let mut v = Vec::new();
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return v };
    for e in dir.flatten() {
        let status = std::fs::read_to_string(e.path().join("status")).unwrap_or_default();
        let field = |k: &str| status.lines().find_map(|l| l.strip_prefix(k)).unwrap_or("").trim().to_string();
        v.push((field("Name:"), field("Seccomp:"), field("CapEff:")));
    }
    v
}

/// While a guest runs (with a console, an entropy source and a disk), every
/// thread of the launcher (root when started) has no capability left and
/// a seccomp filter (mode 2; where the kernel has seccomp): the vCPU
/// thread, each device thread, the console's writer and the watchdog.
fn sandboxed_threads() -> TestResult {
    let filtered = seccomp_filters();
    if !filtered {
        println!("# no seccomp in this kernel: only the capabilities are checked");
    }
    let disk = Disk::new("sandbox", 64, 0)?;
    let a = strings(&["run", "--disk", &disk.path(), &guest("guest-ops"), "sleep", "60000"]);
    let mut p = Proc::launcher(&a, None)?;
    // The vCPU thread, three device threads, the writer and the watchdog.
    let confined = |v: &[(String, String, String)]| {
        v.len() >= 6
            && v.iter().all(|(_, sec, cap)| (!filtered || sec == "2") && cap.trim_start_matches('0').is_empty())
    };
    let ok = t::wait_for(TIMEOUT, || !p.running() || confined(&threads(p.pid())));
    let seen = threads(p.pid());
    p.signal(libc::SIGTERM);
    let o = p.wait(TIMEOUT)?;
    check!(ok && confined(&seen), "threads (name, seccomp, CapEff): {seen:?}; {}", o.describe());
    check_eq!(o.code, 143, format!("after SIGTERM ({})", o.describe()));
    Ok(())
}

/// `--stats=json`: at exit, one JSON object on stderr with the VM's exits,
/// hypercalls and device interrupts (all above zero after the demo) and
/// each device's counters (the disk served requests); and SIGUSR1 prints
/// the counters while the guest runs, which goes on until SIGTERM.
fn stats_json_and_sigusr1() -> TestResult {
    let disk = Disk::new("stats", 2048, 0)?;
    let o = run(&["--stats=json", "--disk", &disk.path()], "devices", &[])?;
    check_eq!(o.code, 0, format!("exit status ({})", o.describe()));
    let line = o.stderr.lines().rev().find(|l| l.starts_with('{')).unwrap_or_default();
    let v: serde_json::Value = match serde_json::from_str(line) {
        Ok(v) => v,
        Err(e) => fail!("no JSON report ({e}): {}", o.describe()),
    };
    for key in ["exits", "hypercalls", "device_interrupts"] {
        check!(v["vm"][key].as_u64().is_some_and(|n| n > 0), "vm.{key} in {line}");
    }
    let devices = v["devices"].as_array().cloned().unwrap_or_default();
    let names: Vec<&str> = devices.iter().filter_map(|d| d["name"].as_str()).collect();
    check_eq!(names.len(), 3, format!("devices in {line}"));
    check!(names[0] == "console" && names[1] == "rng" && names[2].starts_with("blk0 "), "names {names:?}");
    check!(devices[2]["queues"][0]["chains"].as_u64().is_some_and(|n| n >= 3), "disk requests in {line}");

    // SIGUSR1 while a guest sleeps.
    use std::io::BufRead;
    use std::process::{Command, Stdio};
    let mut child = Command::new(t::launcher())
        .args(["run", &guest("guest-ops"), "sleep", "100000"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| t::NotPassed::Fail(format!("cannot start the launcher: {e}")))?;
    let pid = child.id() as i32;
    let (tx, rx) = std::sync::mpsc::channel();
    let err = child.stderr.take();
    std::thread::spawn(move || {
        if let Some(err) = err {
            for line in std::io::BufReader::new(err).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        }
    });
    let result = (|| -> TestResult {
        let caught = || {
            let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
            let mask = status.lines().find_map(|l| l.strip_prefix("SigCgt:")).map(str::trim).unwrap_or("0");
            u64::from_str_radix(mask, 16).is_ok_and(|m| m & (1 << (libc::SIGUSR1 - 1)) != 0)
        };
        check!(t::wait_for(TIMEOUT, caught), "the launcher never took SIGUSR1");
        // SAFETY: kill(2) on our own child, not yet waited for.
        unsafe { libc::kill(pid, libc::SIGUSR1) };
        let mut lines = Vec::new();
        let start = std::time::Instant::now();
        while start.elapsed() < TIMEOUT && !lines.iter().any(|l: &String| l.starts_with("vcpu 0: ")) {
            if let Ok(l) = rx.recv_timeout(Duration::from_millis(100)) {
                lines.push(l);
            }
        }
        check!(
            lines.iter().any(|l| l.starts_with("vm: ") && l.contains(" exits, ")),
            "no dump after SIGUSR1: {lines:?}"
        );
        // And where the vCPU stood: its registers, RIP a guest address.
        check!(
            lines.iter().any(|l| l
                .strip_prefix("vcpu 0: rip 0x")
                .is_some_and(|r| !r.starts_with("0 ") && r.contains(" rsp 0x"))),
            "no registers after SIGUSR1: {lines:?}"
        );
        check!(matches!(child.try_wait(), Ok(None)), "the launcher ended after SIGUSR1");
        // SAFETY: as above.
        unsafe { libc::kill(pid, libc::SIGTERM) };
        let st = child.wait().map_err(|e| t::NotPassed::Fail(e.to_string()))?;
        check_eq!(st.code(), Some(143), format!("after SIGTERM ({st:?})"));
        Ok(())
    })();
    if result.is_err() {
        let _ = child.kill();
        let _ = child.wait();
    }
    result
}

/// Bytes waiting in the pipe `fd` and its capacity.
fn pipe_fill(fd: i32) -> (i32, i32) {
    let mut n: libc::c_int = 0;
    // SAFETY: FIONREAD writes one int at the pointer, a live local.
    unsafe { libc::ioctl(fd, libc::FIONREAD, &mut n as *mut libc::c_int) };
    // SAFETY: F_GETPIPE_SZ takes no argument and touches no memory.
    let size = unsafe { libc::fcntl(fd, libc::F_GETPIPE_SZ) };
    (n, size)
}

/// The launcher stops promptly whatever the guest does: a guest flooding
/// the virtio console (`devices flood`) or the hypercall console
/// (`devices floodhc`) into a stdout pipe that nobody reads, so that the
/// launcher's writes block, ends within 1 s of SIGTERM with status 143
/// (and of SIGINT with 130), with the terminal-style message.
fn stop_with_stdout_blocked() -> TestResult {
    use std::os::fd::AsRawFd;
    use std::process::{Command, Stdio};
    for (mode, sig, code) in
        [("flood", libc::SIGTERM, 143), ("floodhc", libc::SIGTERM, 143), ("flood", libc::SIGINT, 130)]
    {
        let mut child = Command::new(t::launcher())
            .args(["run", &guest("devices"), mode])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| t::NotPassed::Fail(format!("cannot start the launcher: {e}")))?;
        let out = child.stdout.take();
        let fd = out.as_ref().map_or(-1, |o| o.as_raw_fd());
        // Wait until the pipe is full: the launcher's writes now block. A
        // pipe is full for a writer before its last page is: a write of
        // up to a page needs a page-sized slot of its own (61388 of 65536
        // bytes was a full pipe in one run), so "full" is a pipe more than
        // half full whose content has stopped growing for 500 ms.
        let mut last = (-1, std::time::Instant::now());
        let full = t::wait_for(TIMEOUT, || {
            let (n, size) = pipe_fill(fd);
            if n != last.0 {
                last = (n, std::time::Instant::now());
            }
            n >= size / 2 && last.1.elapsed() >= Duration::from_millis(500)
        });
        if !full {
            let _ = child.kill();
            let _ = child.wait();
            fail!("{mode}: the guest did not fill the pipe ({:?})", pipe_fill(fd));
        }
        std::thread::sleep(Duration::from_millis(500));
        // SAFETY: kill(2) on our own child, which has not been waited for.
        unsafe { libc::kill(child.id() as i32, sig) };
        let sent = std::time::Instant::now();
        let mut status = None;
        while sent.elapsed() < Duration::from_secs(10) {
            if let Ok(Some(st)) = child.try_wait() {
                status = Some(st);
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        let took = sent.elapsed();
        let Some(st) = status else {
            let _ = child.kill();
            let _ = child.wait();
            fail!("{mode}: the launcher was still running 10 s after signal {sig}");
        };
        drop(out);
        check_eq!(st.code(), Some(code), format!("{mode}: exit status after signal {sig} ({st:?})"));
        println!("# {mode}: stopped {:.0} ms after signal {sig}", took.as_secs_f64() * 1000.0);
        // The promise is 1 s; on the debug kernel (KASAN, lockdep:
        // kmemleak's file says which) everything is several times slower,
        // and 1.43 s was seen there with a second QEMU host beside it.
        let debug = t::debug_kernel();
        let bound = Duration::from_secs(if debug { 3 } else { 1 });
        check!(took < bound, "{mode}: the launcher took {took:?} to stop (bound {bound:?})");
    }
    Ok(())
}

fn main() -> ExitCode {
    t::run(&[
        ("bus_demo", bus_demo),
        ("bus_only_what_was_asked", bus_only_what_was_asked),
        ("console_roundtrip", console_roundtrip),
        ("blk_write_flush_verify", blk_write_flush_verify),
        ("blk_read_only", blk_read_only),
        ("blk_flush_survives_kill", blk_flush_survives_kill),
        ("malformed_virtqueues", malformed_virtqueues),
        ("bad_device_options", bad_device_options),
        ("stop_with_stdout_blocked", stop_with_stdout_blocked),
        ("blk_image_locked", blk_image_locked),
        ("blk_block_device", blk_block_device),
        ("console_and_serial_files", console_and_serial_files),
        ("raw_terminal_restored", raw_terminal_restored),
        ("seccomp_forbidden_call", seccomp_forbidden_call),
        ("sandboxed_threads", sandboxed_threads),
        ("stats_json_and_sigusr1", stats_json_and_sigusr1),
    ])
}
