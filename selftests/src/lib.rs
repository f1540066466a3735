// SPDX-License-Identifier: GPL-2.0
//! The lguest selftests' small harness: KTAP output and helpers to reach
//! `/dev/lguest` and the module loader.
//!
//! Each test program lists its tests as `(name, fn)` pairs and calls [`run`],
//! which prints KTAP (`TAP version 13`, `1..N`, `ok N name`, `# SKIP`) and
//! returns the kselftest exit code: 0 all passed, 1 a test failed, 4 all
//! skipped. A program given test names on its command line runs only those.

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// Why a test did not pass.
#[derive(Debug)]
pub enum NotPassed {
    /// The test failed; the message says what was expected and what happened.
    Fail(String),
    /// The test could not run here; the message says why.
    Skip(String),
}

/// What a test returns.
pub type TestResult = Result<(), NotPassed>;

/// A test: its KTAP name and its body.
pub type Test = (&'static str, fn() -> TestResult);

/// Fails the current test with a formatted message.
#[macro_export]
macro_rules! fail {
    ($($arg:tt)*) => { return Err($crate::NotPassed::Fail(format!($($arg)*))) };
}

/// Fails the current test unless `cond` holds.
#[macro_export]
macro_rules! check {
    ($cond:expr, $($arg:tt)*) => { if !$cond { $crate::fail!($($arg)*); } };
}

/// Fails the current test unless `left == right`, printing both.
#[macro_export]
macro_rules! check_eq {
    ($left:expr, $right:expr, $what:expr) => {{
        let (l, r) = (&$left, &$right);
        if l != r {
            $crate::fail!("{}: got {:?}, expected {:?}", $what, l, r);
        }
    }};
}

/// Skips the current test with a formatted reason.
#[macro_export]
macro_rules! skip {
    ($($arg:tt)*) => { return Err($crate::NotPassed::Skip(format!($($arg)*))) };
}

/// Runs the tests named on the command line (all when none are named) and
/// prints KTAP. Returns the kselftest exit code.
pub fn run(tests: &[Test]) -> ExitCode {
    let wanted: Vec<String> = std::env::args().skip(1).collect();
    for w in &wanted {
        if !tests.iter().any(|(n, _)| n == w) {
            eprintln!("no test named {w}; tests: {}", tests.iter().map(|t| t.0).collect::<Vec<_>>().join(" "));
            return ExitCode::from(2);
        }
    }
    let chosen: Vec<&Test> = tests.iter().filter(|(n, _)| wanted.is_empty() || wanted.iter().any(|w| w == n)).collect();
    println!("TAP version 13");
    println!("1..{}", chosen.len());
    // Without the module there is nothing to test: kselftest's convention is
    // to skip. The project's harness sets LGUEST_REQUIRE=1, where a missing
    // device is a failure (the module did not load).
    if !Path::new(DEV).exists() && std::env::var_os("LGUEST_REQUIRE").is_none() {
        for (i, (name, _)) in chosen.iter().enumerate() {
            println!("ok {} {name} # SKIP {DEV} missing: lguest.ko is not loaded", i + 1);
        }
        println!("# Totals: pass:0 fail:0 skip:{}", chosen.len());
        return ExitCode::from(4);
    }
    let (mut failed, mut skipped) = (0, 0);
    for (i, (name, f)) in chosen.iter().enumerate() {
        match f() {
            Ok(()) => println!("ok {} {name}", i + 1),
            Err(NotPassed::Fail(msg)) => {
                failed += 1;
                for line in msg.lines() {
                    println!("# {name}: {line}");
                }
                println!("not ok {} {name}", i + 1);
            }
            Err(NotPassed::Skip(why)) => {
                skipped += 1;
                println!("ok {} {name} # SKIP {why}", i + 1);
            }
        }
    }
    println!("# Totals: pass:{} fail:{failed} skip:{skipped}", chosen.len() - failed - skipped);
    if failed > 0 {
        ExitCode::FAILURE
    } else if skipped == chosen.len() && skipped > 0 {
        ExitCode::from(4)
    } else {
        ExitCode::SUCCESS
    }
}

/// The test bed the project's harness booted, from `lgtest.bed=` on the
/// kernel command line (`scripts/bochs.sh` passes `lgtest.bed=bochs`; the
/// QEMU runs pass nothing).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bed {
    /// QEMU's TCG emulator, or anything that does not say otherwise.
    Qemu,
    /// Bochs (`scripts/bochs.sh`): faithful where TCG is not for a ring-0
    /// #GP on `iretq` to a non-canonical RIP, CET/IBT, and global TLB
    /// entries across CR3 writes (Documentation/dev/testing.rst, "make bochs-test").
    Bochs,
}

/// The value of `key=` on a kernel command line, if given.
pub fn cmdline_value<'a>(cmdline: &'a str, key: &str) -> Option<&'a str> {
    cmdline.split_whitespace().filter_map(|w| w.strip_prefix(key)?.strip_prefix('=')).next_back()
}

/// The bed named by a kernel command line (see [`Bed`]); an unknown name is
/// not Bochs.
pub fn bed_of(cmdline: &str) -> Bed {
    match cmdline_value(cmdline, "lgtest.bed") {
        Some("bochs") => Bed::Bochs,
        _ => Bed::Qemu,
    }
}

/// The bed this test runs on, from `/proc/cmdline`.
pub fn bed() -> Bed {
    bed_of(&std::fs::read_to_string("/proc/cmdline").unwrap_or_default())
}

/// Whether the host runs the debug kernel (KASAN, lockdep, kmemleak:
/// kmemleak's file says which), where everything is several times slower.
pub fn debug_kernel() -> bool {
    std::path::Path::new("/sys/kernel/debug/kmemleak").exists()
}

/// For a test that only means something under Bochs: skips elsewhere,
/// saying why (`why`: what the other bed does not model).
pub fn require_bochs(why: &str) -> TestResult {
    if bed() != Bed::Bochs {
        skip!("only meaningful under Bochs (lgtest.bed=bochs, `make bochs-test`): {why}");
    }
    Ok(())
}

/// The lguest device node.
pub const DEV: &str = "/dev/lguest";

/// Opens `/dev/lguest` read-write.
pub fn open_dev() -> io::Result<File> {
    std::fs::OpenOptions::new().read(true).write(true).open(DEV)
}

/// Makes an ioctl with an integer argument; returns the result or the errno.
pub fn ioctl(f: &File, cmd: u32, arg: usize) -> Result<i32, i32> {
    // SAFETY: The commands the tests send take no pointer or take a pointer
    // the caller made valid for the command's size; a wrong command number
    // is exactly what some tests check, and the kernel must refuse it.
    let ret = unsafe { libc::ioctl(f.as_raw_fd(), cmd as _, arg) };
    if ret < 0 {
        Err(errno())
    } else {
        Ok(ret)
    }
}

/// `arch_prctl`'s `ARCH_SET_CPUID` (`asm/prctl.h`).
const ARCH_SET_CPUID: libc::c_int = 0x1012;

/// Turns CPUID faulting on (`on`) or off for the calling thread
/// (`arch_prctl(ARCH_SET_CPUID, !on)`); `Err(ENODEV)` where the CPU cannot.
/// While it is on, the thread must not run CPUID itself.
pub fn cpuid_faulting(on: bool) -> Result<(), i32> {
    // SAFETY: ARCH_SET_CPUID takes an integer and changes only whether
    // this thread's CPUID faults.
    let r = unsafe { libc::syscall(libc::SYS_arch_prctl, ARCH_SET_CPUID, libc::c_ulong::from(!on)) };
    if r < 0 {
        Err(errno())
    } else {
        Ok(())
    }
}

/// The calling thread's errno.
pub fn errno() -> i32 {
    io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// The address of `sym` from /proc/kallsyms (root sees real addresses).
pub fn kallsyms(sym: &str) -> Option<u64> {
    let text = std::fs::read_to_string("/proc/kallsyms").ok()?;
    let line = text.lines().find(|l| l.split_whitespace().nth(2) == Some(sym))?;
    u64::from_str_radix(line.split_whitespace().next()?, 16).ok().filter(|&a| a != 0)
}

/// The path of `lguest.ko` for the load tests (`$LGUEST_KO`, else
/// `/lib/modules/lguest.ko`), if it exists.
pub fn module_path() -> Option<String> {
    let p = std::env::var("LGUEST_KO").unwrap_or_else(|_| "/lib/modules/lguest.ko".into());
    Path::new(&p).exists().then_some(p)
}

/// Loads a module from a file with `finit_module(2)`.
pub fn load_module(path: &str) -> Result<(), i32> {
    load_module_with(path, "")
}

/// Loads a module from a file with `finit_module(2)` and parameters
/// (`name=value ...`).
pub fn load_module_with(path: &str, params: &str) -> Result<(), i32> {
    let f = File::open(path).map_err(|e| e.raw_os_error().unwrap_or(libc::EIO))?;
    let params = CString::new(params).map_err(|_| libc::EINVAL)?;
    // SAFETY: `f` is an open file and `params` a NUL-terminated string, both
    // alive across the call; finit_module reads nothing else of ours.
    let ret = unsafe { libc::syscall(libc::SYS_finit_module, f.as_raw_fd(), params.as_ptr(), 0) };
    if ret < 0 {
        Err(errno())
    } else {
        Ok(())
    }
}

/// Unloads a module with `delete_module(2)` and `O_NONBLOCK`, as rmmod does.
pub fn unload_module(name: &str) -> Result<(), i32> {
    let name = CString::new(name).map_err(|_| libc::EINVAL)?;
    // SAFETY: `name` is a NUL-terminated string alive across the call.
    let ret = unsafe { libc::syscall(libc::SYS_delete_module, name.as_ptr(), libc::O_NONBLOCK) };
    if ret < 0 {
        Err(errno())
    } else {
        Ok(())
    }
}

/// Whether module `name` is loaded (listed in /proc/modules).
pub fn module_loaded(name: &str) -> bool {
    std::fs::read_to_string("/proc/modules")
        .map(|s| s.lines().any(|l| l.split(' ').next() == Some(name)))
        .unwrap_or(false)
}

/// Polls `cond` every millisecond until it holds or `timeout` passes.
pub fn wait_for(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    loop {
        if cond() {
            return true;
        }
        if start.elapsed() > timeout {
            return false;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// The name of an errno value, for messages.
pub fn errname(e: i32) -> String {
    format!("{} ({e})", io::Error::from_raw_os_error(e))
}

/// Anonymous memory mapped for a test guest; unmapped on drop.
pub struct Mapping {
    /// Start address.
    pub addr: *mut u8,
    /// Length in bytes.
    pub len: usize,
}

// SAFETY: The mapping is plain memory owned by this value; all accesses go
// through volatile reads and writes, as with memory shared with the kernel.
unsafe impl Send for Mapping {}
// SAFETY: As above.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Maps `len` bytes of private anonymous memory, read-write.
    pub fn anon(len: usize) -> io::Result<Self> {
        // SAFETY: A fresh anonymous mapping; no existing memory is affected.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Self { addr: p.cast(), len })
    }

    /// Maps `len` bytes of `f` at `offset`, shared, read-write.
    pub fn shared(f: &File, len: usize, offset: i64) -> Result<Self, i32> {
        Self::file(f, len, offset, libc::MAP_SHARED)
    }

    /// Maps `len` bytes of `f` at `offset` with `flags`.
    pub fn file(f: &File, len: usize, offset: i64, flags: i32) -> Result<Self, i32> {
        // SAFETY: A new mapping of a file we hold open; the kernel checks
        // everything else.
        let p = unsafe {
            libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, flags, f.as_raw_fd(), offset)
        };
        if p == libc::MAP_FAILED {
            return Err(errno());
        }
        Ok(Self { addr: p.cast(), len })
    }

    /// Copies `data` to offset `off`.
    pub fn write(&self, off: usize, data: &[u8]) {
        assert!(off + data.len() <= self.len);
        // SAFETY: In bounds of our mapping (checked above).
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.addr.add(off), data.len()) };
    }

    /// Reads a value of type `T` at offset `off` (volatile: the kernel or a
    /// guest may write it).
    pub fn read<T: Copy>(&self, off: usize) -> T {
        assert!(off + std::mem::size_of::<T>() <= self.len);
        // SAFETY: In bounds; T is plain data in every use.
        unsafe { self.addr.add(off).cast::<T>().read_volatile() }
    }

    /// Writes a value of type `T` at offset `off`.
    pub fn put<T: Copy>(&self, off: usize, v: T) {
        assert!(off + std::mem::size_of::<T>() <= self.len);
        // SAFETY: In bounds; T is plain data in every use.
        unsafe { self.addr.add(off).cast::<T>().write_volatile(v) }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: We mapped exactly this range.
        unsafe { libc::munmap(self.addr.cast(), self.len) };
    }
}

/// Makes an ioctl whose argument is a pointer to `arg`.
pub fn ioctl_ptr<T>(f: &File, cmd: u32, arg: &mut T) -> Result<i32, i32> {
    ioctl(f, cmd, arg as *mut T as usize)
}

/// A value from /proc/meminfo, in KiB.
pub fn meminfo(key: &str) -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(&format!("{key}:")))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

/// A memory cgroup (cgroup v2) holding this whole process while it lives:
/// the module allocates its shadow tables and run pages with
/// `GFP_KERNEL_ACCOUNT`, so they are charged to it and `kernel()` counts
/// exactly the kernel memory this process holds, unlike MemFree, which the
/// rest of the system moves by megabytes between two readings. Dropping it
/// moves the process back to the root cgroup and removes the group.
pub struct MemCgroup {
    path: String,
}

impl MemCgroup {
    /// Creates `/sys/fs/cgroup/<name>` with the memory controller and moves
    /// this process into it. `Err` says why it cannot (no cgroup v2, no
    /// memory controller): a reason to skip.
    pub fn enter(name: &str) -> Result<Self, String> {
        let root = "/sys/fs/cgroup";
        let controllers = std::fs::read_to_string(format!("{root}/cgroup.controllers"))
            .map_err(|e| format!("cgroup v2 is not mounted at {root}: {e}"))?;
        if !controllers.split_whitespace().any(|c| c == "memory") {
            return Err(format!("no memory controller in {root}/cgroup.controllers (CONFIG_MEMCG)"));
        }
        std::fs::write(format!("{root}/cgroup.subtree_control"), "+memory")
            .map_err(|e| format!("enabling the memory controller: {e}"))?;
        let path = format!("{root}/{name}");
        if let Err(e) = std::fs::create_dir(&path) {
            if e.kind() != io::ErrorKind::AlreadyExists {
                return Err(format!("mkdir {path}: {e}"));
            }
        }
        let cg = MemCgroup { path };
        std::fs::write(format!("{}/cgroup.procs", cg.path), std::process::id().to_string())
            .map_err(|e| format!("moving into {}: {e}", cg.path))?;
        Ok(cg)
    }

    /// A field of the group's `memory.stat`, in bytes.
    pub fn stat(&self, key: &str) -> u64 {
        std::fs::read_to_string(format!("{}/memory.stat", self.path))
            .ok()
            .and_then(|s| s.lines().find_map(|l| l.strip_prefix(key)?.strip_prefix(' ')?.trim().parse().ok()))
            .unwrap_or(0)
    }

    /// The kernel memory charged to the group (`memory.stat` "kernel"), in
    /// KiB.
    pub fn kernel(&self) -> u64 {
        self.stat("kernel") / 1024
    }
}

impl Drop for MemCgroup {
    fn drop(&mut self) {
        let _ = std::fs::write("/sys/fs/cgroup/cgroup.procs", std::process::id().to_string());
        let _ = std::fs::remove_dir(&self.path);
    }
}

/// The launcher (`$LGUEST_BIN`, default /usr/bin/lguest).
pub fn launcher() -> String {
    std::env::var("LGUEST_BIN").unwrap_or_else(|_| "/usr/bin/lguest".into())
}

/// The path of sample guest `name` (`$LGUEST_GUESTS`, default
/// /usr/share/lguest/guests).
pub fn guest(name: &str) -> String {
    let dir = std::env::var("LGUEST_GUESTS").unwrap_or_else(|_| "/usr/share/lguest/guests".into());
    format!("{dir}/{name}")
}

/// A tiny hand-assembled guest, loaded at 1 MiB with `lguest_data` at
/// 0x180000 and a message at 0x181000:
/// INIT(0x180000); NOTIFY(0x181000, 0x42); SHUTDOWN(0x181000, POWEROFF); jmp .
pub const GUEST_OK: &[u8] = &[
    0xb8, 0x01, 0x00, 0x00, 0x00, // mov $1, %eax        LGUEST_INIT
    0xbf, 0x00, 0x00, 0x18, 0x00, // mov $0x180000, %edi
    0xcd, 0x1f, //                   int $0x1f
    0xb8, 0x11, 0x00, 0x00, 0x00, // mov $17, %eax       NOTIFY
    0xbf, 0x00, 0x10, 0x18, 0x00, // mov $0x181000, %edi
    0xbe, 0x42, 0x00, 0x00, 0x00, // mov $0x42, %esi
    0xcd, 0x1f, //                   int $0x1f
    0xb8, 0x02, 0x00, 0x00, 0x00, // mov $2, %eax        SHUTDOWN
    0xbf, 0x00, 0x10, 0x18, 0x00, // mov $0x181000, %edi
    0xbe, 0x01, 0x00, 0x00, 0x00, // mov $1, %esi        POWEROFF
    0xcd, 0x1f, //                   int $0x1f
    0xeb, 0xfe, //                   jmp .
];

/// A child process (the launcher, a helper tool) whose output threads
/// collect, so that a chatty child never blocks on a full pipe.
pub struct Proc {
    cmd: String,
    child: std::process::Child,
    out: std::thread::JoinHandle<String>,
    err: std::thread::JoinHandle<String>,
    start: Instant,
}

/// How a [`Proc`] ended.
pub struct Outcome {
    /// The command line, for messages.
    pub cmd: String,
    /// The exit status, or 128 + the signal that ended it.
    pub code: i32,
    /// Everything it wrote to stdout.
    pub stdout: String,
    /// Everything it wrote to stderr.
    pub stderr: String,
    /// How long it ran.
    pub took: Duration,
}

/// `text`, or its last lines when it is long.
fn tail(text: &str) -> String {
    if text.len() <= 2000 {
        return format!("{text:?}");
    }
    let lines: Vec<&str> = text.lines().collect();
    format!("(last lines) {:?}", lines[lines.len().saturating_sub(12)..].join("\n"))
}

impl Outcome {
    /// The outcome (long outputs cut to their end), for a failure message.
    pub fn describe(&self) -> String {
        format!(
            "`{}`: exit {} after {:.1} s; stdout {}; stderr {}",
            self.cmd,
            self.code,
            self.took.as_secs_f64(),
            tail(&self.stdout),
            tail(&self.stderr)
        )
    }
}

fn drain(pipe: Option<impl io::Read + Send + 'static>) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut bytes = Vec::new();
        if let Some(mut p) = pipe {
            let _ = p.read_to_end(&mut bytes);
        }
        String::from_utf8_lossy(&bytes).into_owned()
    })
}

impl Proc {
    /// Starts `program` with `args`; `input` (if any) is written to its
    /// stdin, which is then closed; otherwise stdin is /dev/null.
    pub fn spawn(program: &str, args: &[String], input: Option<Vec<u8>>) -> Result<Self, NotPassed> {
        use std::process::{Command, Stdio};
        let cmd = format!("{program} {}", args.join(" "));
        let mut child = Command::new(program)
            .args(args)
            .stdin(if input.is_some() { Stdio::piped() } else { Stdio::null() })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| NotPassed::Fail(format!("cannot start {program}: {e}")))?;
        if let (Some(data), Some(mut stdin)) = (input, child.stdin.take()) {
            std::thread::spawn(move || {
                use std::io::Write;
                let _ = stdin.write_all(&data);
            });
        }
        let out = drain(child.stdout.take());
        let err = drain(child.stderr.take());
        Ok(Self { cmd, child, out, err, start: Instant::now() })
    }

    /// Starts the launcher with `args`.
    pub fn launcher(args: &[String], input: Option<Vec<u8>>) -> Result<Self, NotPassed> {
        Self::spawn(&launcher(), args, input)
    }

    /// The child's process ID.
    pub fn pid(&self) -> i32 {
        // CAST: Linux process IDs fit in an i32.
        self.child.id() as i32
    }

    /// Whether it is still running. It is not reaped when it has ended
    /// (`waitid` with `WNOWAIT`), so its pid stays its own and
    /// [`Proc::signal`] cannot reach another process that reused it.
    pub fn running(&mut self) -> bool {
        // SAFETY: siginfo_t is a plain C struct for which all-zero bytes
        // are valid.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // CAST: Linux process IDs fit in an id_t.
        let pid = self.pid() as libc::id_t;
        // SAFETY: waitid writes one siginfo_t at the pointer, a live local;
        // WNOWAIT leaves the child waitable.
        let ret = unsafe { libc::waitid(libc::P_PID, pid, &mut info, libc::WEXITED | libc::WNOHANG | libc::WNOWAIT) };
        // SAFETY: reading the pid field of the siginfo waitid filled in.
        ret == 0 && unsafe { info.si_pid() } == 0
    }

    /// Waits for the end, killing it (SIGKILL) after `timeout`; a child
    /// that had to be killed is a failure.
    pub fn wait(mut self, timeout: Duration) -> Result<Outcome, NotPassed> {
        use std::os::unix::process::ExitStatusExt;
        let status = loop {
            match self.child.try_wait() {
                Ok(Some(st)) => break st,
                Ok(None) if self.start.elapsed() > timeout => {
                    let _ = self.child.kill();
                    let _ = self.child.wait();
                    let out = self.out.join().unwrap_or_default();
                    let err = self.err.join().unwrap_or_default();
                    return Err(NotPassed::Fail(format!(
                        "`{}` did not finish within {timeout:?} (hung?); stdout {}; stderr {}",
                        self.cmd,
                        tail(&out),
                        tail(&err)
                    )));
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(5)),
                Err(e) => return Err(NotPassed::Fail(format!("wait for `{}`: {e}", self.cmd))),
            }
        };
        let took = self.start.elapsed();
        let code = status.code().unwrap_or(128 + status.signal().unwrap_or(0));
        let stdout = self.out.join().unwrap_or_default();
        let stderr = self.err.join().unwrap_or_default();
        Ok(Outcome { cmd: self.cmd, code, stdout, stderr, took })
    }

    /// Sends `sig` to the child.
    pub fn signal(&self, sig: i32) {
        // SAFETY: kill(2) on our own child's pid; no memory is involved.
        unsafe { libc::kill(self.pid(), sig) };
    }
}

/// The number just before `word` in a line of counters
/// (`"... 261 packets, 12 interrupts"`, `"packets"` -> 261), words being
/// separated by white space and `,;()`.
pub fn number_before<T: std::str::FromStr>(line: &str, word: &str) -> Option<T> {
    let words: Vec<&str> = line.split(|c: char| c.is_whitespace() || ",;()".contains(c)).collect();
    let i = words.iter().position(|w| *w == word)?;
    words.get(i.checked_sub(1)?)?.parse().ok()
}

/// `args` as owned strings.
pub fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|s| s.to_string()).collect()
}

const TUNSETIFF: libc::Ioctl = libc::TUNSETIFF;
const TUNSETPERSIST: libc::Ioctl = libc::TUNSETPERSIST;
// CAST (the three below): the flags fit the ifreq's short.
const IFF_TAP: i16 = libc::IFF_TAP as i16;
const IFF_NO_PI: i16 = libc::IFF_NO_PI as i16;
const IFF_VNET_HDR: i16 = libc::IFF_VNET_HDR as i16;

/// `struct ifreq` as TUNSETIFF reads it: the name, then the flags.
#[repr(C)]
struct IfReq {
    name: [u8; 16],
    flags: i16,
    pad: [u8; 22],
}

/// Runs `ip ARGS` (iproute2 or busybox).
pub fn ip(args: &[&str]) -> TestResult {
    let o = std::process::Command::new("ip").args(args).output().map_err(|e| NotPassed::Fail(format!("ip: {e}")))?;
    crate::check!(o.status.success(), "ip {}: {}", args.join(" "), String::from_utf8_lossy(&o.stderr));
    Ok(())
}

/// Opens (or creates) tap `tap` as the launcher would, with virtio-net
/// headers (`IFF_TAP | IFF_NO_PI | IFF_VNET_HDR`): what a privileged
/// helper does before it passes the descriptor to `lguest run --net fd=N`.
pub fn open_tap(tap: &str) -> Result<File, NotPassed> {
    let tun = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/net/tun")
        .map_err(|e| NotPassed::Fail(format!("/dev/net/tun: {e}")))?;
    let mut req = IfReq { name: [0; 16], flags: IFF_TAP | IFF_NO_PI | IFF_VNET_HDR, pad: [0; 22] };
    crate::check!(tap.len() < 16, "tap name {tap:?} too long");
    req.name[..tap.len()].copy_from_slice(tap.as_bytes());
    // SAFETY: TUNSETIFF reads a `struct ifreq`, which `req` is (40 bytes).
    if unsafe { libc::ioctl(tun.as_raw_fd(), TUNSETIFF, &mut req as *mut IfReq) } != 0 {
        crate::fail!("TUNSETIFF {tap}: {}", errname(errno()));
    }
    Ok(tun)
}

/// Moves this process into a fresh network namespace with loopback up and
/// a persistent tap `tap` (with virtio-net headers, as the launcher opens
/// it) up at `cidr`. Nothing outside sees the addresses; the namespace
/// and the tap go when the process moves on or exits. Skips without
/// CAP_SYS_ADMIN.
pub fn private_netns(tap: &str, cidr: &str) -> TestResult {
    // SAFETY: unshare(2) with a flag only; this test program is single
    // threaded here (no thread of ours runs while it switches).
    if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
        let e = errno();
        if e == libc::EPERM {
            crate::skip!("unshare(CLONE_NEWNET): not permitted (run as root)");
        }
        crate::fail!("unshare(CLONE_NEWNET): {}", errname(e));
    }
    ip(&["link", "set", "lo", "up"])?;
    let tun = open_tap(tap)?;
    // SAFETY: TUNSETPERSIST takes an integer argument.
    if unsafe { libc::ioctl(tun.as_raw_fd(), TUNSETPERSIST, 1 as libc::c_ulong) } != 0 {
        crate::fail!("TUNSETPERSIST {tap}: {}", errname(errno()));
    }
    drop(tun);
    ip(&["addr", "add", cidr, "dev", tap])?;
    ip(&["link", "set", tap, "up"])?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bed_from_cmdline() {
        assert_eq!(bed_of("console=ttyS0 lgtest.mode=test lgtest.bed=bochs nopku"), Bed::Bochs);
        assert_eq!(bed_of("console=ttyS0 lgtest.mode=test"), Bed::Qemu);
        assert_eq!(bed_of("lgtest.bed=qemu"), Bed::Qemu);
        assert_eq!(bed_of("xlgtest.bed=bochs lgtest.bedx=bochs"), Bed::Qemu);
        assert_eq!(bed_of("lgtest.bed=bochs lgtest.bed=qemu"), Bed::Qemu, "the last one counts, as for the kernel");
        assert_eq!(cmdline_value("a=1 b=2 a=3", "a"), Some("3"));
        assert_eq!(cmdline_value("ab=1", "a"), None);
    }
}
