// SPDX-License-Identifier: GPL-2.0
//! The launcher's sandbox, entered once set-up is done: no capabilities,
//! and a seccomp filter per thread type, as Firecracker and Cloud
//! Hypervisor do (with rust-vmm's `seccompiler`).
//!
//! Every file the launcher needs (`/dev/lguest`, the disks, the taps, the
//! console's pty) is open and the VM is created before any guest code
//! runs, so after that no thread needs a capability: [`drop_capabilities`]
//! empties the calling thread's sets (`capset`; the threads started after
//! it inherit the empty sets, the helpers started earlier call it
//! themselves). Then each thread installs the filter of its [`Role`]
//! ([`enter`]): the list of the system calls that thread type makes, and
//! for the vCPU thread only lguest's own ioctls, the terminal's and the tap's
//! two of the status protocol (TUNSETVNETHDRSZ, TUNSETOFFLOAD).
//!
//! `--seccomp=on`: a system call outside the list raises SIGSYS, whose
//! handler prints which thread made which call and ends the launcher with
//! 128 + SIGSYS = 159; a kernel without seccomp filters is then an error.
//! Without `--seccomp` it is the same, except that on a kernel without
//! them (`CONFIG_SECCOMP_FILTER` off) the launcher says so once and runs
//! unfiltered. `--seccomp=log`: a forbidden call is allowed and the kernel
//! logs it (to find what a new code path needs). `--seccomp=off`: no
//! filter.

use std::cell::Cell;
use std::collections::BTreeMap;
use std::io;
use std::sync::OnceLock;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter, SeccompRule,
};

/// `--seccomp`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SeccompMode {
    /// No filter.
    Off,
    /// Forbidden calls are allowed and logged by the kernel.
    Log,
    /// Forbidden calls end the launcher (SIGSYS, status 159).
    On,
}

impl std::str::FromStr for SeccompMode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "off" => Ok(Self::Off),
            "log" => Ok(Self::Log),
            "on" => Ok(Self::On),
            _ => Err(format!("{s:?}: expected off, log or on")),
        }
    }
}

/// What a thread does, and so which system calls it may make.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// The vCPU thread: LGUEST_RUN and the exits, the hypercall console,
    /// the status protocol, and at the end the teardown.
    Vcpu,
    /// A device thread: poll, the device's host I/O, interrupts.
    Device,
    /// The console's writer and the signal watchdog.
    Helper,
}

impl Role {
    fn name(self) -> &'static str {
        match self {
            Self::Vcpu => "vCPU",
            Self::Device => "device",
            Self::Helper => "helper",
        }
    }
}

/// The mode for the whole run, set once by `run.rs` before any thread
/// starts; threads that start with no mode set (unit tests) get no filter.
static MODE: OnceLock<SeccompMode> = OnceLock::new();

thread_local! {
    /// The calling thread's role, for the SIGSYS message.
    static ROLE: Cell<&'static str> = const { Cell::new("launcher") };
}

/// Errors entering the sandbox.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    /// The filter could not be built.
    #[error("cannot build the seccomp filter for the {0} thread: {1}")]
    Build(&'static str, String),
    /// The filter could not be installed.
    #[error("cannot install the seccomp filter for the {0} thread: {1}")]
    Install(&'static str, String),
    /// capset failed.
    #[error("cannot drop capabilities")]
    Capabilities(#[source] io::Error),
    /// `--seccomp=on` or `log` on a kernel without seccomp filters.
    #[error("this kernel has no seccomp filters (CONFIG_SECCOMP_FILTER); --seccomp=off runs without them")]
    Unavailable,
    /// The SIGSYS handler could not be installed.
    #[error("cannot install the SIGSYS handler")]
    Sigaction(#[source] io::Error),
}

/// The system calls every thread makes: memory, locks, signals, time,
/// reads and writes on descriptors it already has, and its end.
const COMMON: &[i64] = &[
    libc::SYS_read,
    libc::SYS_write,
    libc::SYS_writev,
    libc::SYS_close,
    libc::SYS_poll,
    libc::SYS_ppoll,
    libc::SYS_futex,
    libc::SYS_mmap,
    libc::SYS_munmap,
    libc::SYS_mremap,
    libc::SYS_mprotect,
    libc::SYS_madvise,
    libc::SYS_brk,
    libc::SYS_rt_sigreturn,
    libc::SYS_rt_sigprocmask,
    libc::SYS_rt_sigaction,
    libc::SYS_sigaltstack,
    libc::SYS_restart_syscall,
    libc::SYS_clock_gettime,
    libc::SYS_clock_nanosleep,
    libc::SYS_nanosleep,
    libc::SYS_sched_yield,
    libc::SYS_getpid,
    libc::SYS_gettid,
    libc::SYS_tgkill,
    libc::SYS_getrandom,
    libc::SYS_exit,
    libc::SYS_exit_group,
    // Allowed here, refused with EACCES by the filter of `no_opens`: the C
    // library opens files on its own (glibc's malloc reads
    // /proc/sys/vm/overcommit_memory when it trims a thread's arena at the
    // thread's exit) and copes with a refusal.
    libc::SYS_open,
    libc::SYS_openat,
];

/// The filter every sandboxed thread gets first: `open` and `openat` fail
/// with EACCES. With the role's filter (which lets them through) the
/// kernel takes the stricter answer, EACCES, so no sandboxed thread opens
/// a file, and none is killed for trying.
fn no_opens() -> Result<BpfProgram, SandboxError> {
    let err = |e: &dyn std::fmt::Display| SandboxError::Build("any", e.to_string());
    let rules: BTreeMap<i64, Vec<SeccompRule>> =
        [libc::SYS_open, libc::SYS_openat].into_iter().map(|nr| (nr, Vec::new())).collect();
    let arch = std::env::consts::ARCH.try_into().map_err(|e| err(&e))?;
    let filter = SeccompFilter::new(rules, SeccompAction::Allow, SeccompAction::Errno(libc::EACCES as u32), arch)
        .map_err(|e| err(&e))?;
    filter.try_into().map_err(|e: seccompiler::BackendError| err(&e))
}

/// What each role adds.
fn extra(role: Role) -> &'static [i64] {
    match role {
        // ioctl is filtered by command below; fdatasync for the disks'
        // last sync when the bus goes.
        Role::Vcpu => &[libc::SYS_ioctl, libc::SYS_fdatasync],
        Role::Device => &[libc::SYS_ioctl, libc::SYS_pread64, libc::SYS_pwrite64, libc::SYS_fdatasync],
        // The watchdog's SIGSTOP and terminal restore.
        Role::Helper => &[libc::SYS_ioctl, libc::SYS_kill],
    }
}

/// The filter of `role` with `mismatch` for anything not listed.
fn program(role: Role, mismatch: SeccompAction) -> Result<BpfProgram, SandboxError> {
    let err = |e: &dyn std::fmt::Display| SandboxError::Build(role.name(), e.to_string());
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    for &nr in COMMON.iter().chain(extra(role)) {
        rules.insert(nr, Vec::new());
    }
    if role == Role::Vcpu {
        // lguest's ioctls (type byte 0xAF), the terminal's (raw mode
        // restored at the end): TCGETS, TCSETS, and the tap's that the
        // status protocol makes on this thread (a net device's activation
        // at DRIVER_OK and its reset): TUNSETVNETHDRSZ, TUNSETOFFLOAD.
        let cmd =
            |op: SeccompCmpOp, v: u64| SeccompCondition::new(1, SeccompCmpArgLen::Dword, op, v).map_err(|e| err(&e));
        let lguest = SeccompRule::new(vec![cmd(SeccompCmpOp::MaskedEq(0xff00), 0xaf00)?]).map_err(|e| err(&e))?;
        let mut v = vec![lguest];
        for request in [libc::TCGETS, libc::TCSETS, libc::TUNSETVNETHDRSZ, libc::TUNSETOFFLOAD] {
            v.push(SeccompRule::new(vec![cmd(SeccompCmpOp::Eq, request)?]).map_err(|e| err(&e))?);
        }
        rules.insert(libc::SYS_ioctl, v);
        // Ctrl-Z: the SIGTSTP handler, which runs on this thread (the only
        // one with the signals unblocked), stops the process with
        // kill(getpid(), SIGSTOP), and nothing else.
        let arg =
            |n: u8, v: u64| SeccompCondition::new(n, SeccompCmpArgLen::Dword, SeccompCmpOp::Eq, v).map_err(|e| err(&e));
        // SAFETY: getpid has no preconditions.
        let pid = unsafe { libc::getpid() } as u64;
        let stop = SeccompRule::new(vec![arg(0, pid)?, arg(1, libc::SIGSTOP as u64)?]).map_err(|e| err(&e))?;
        rules.insert(libc::SYS_kill, vec![stop]);
        // `--cpuid filtered` on a host with CPUID faulting: the fault is
        // turned off again when the guest is done (cpuid.rs).
        let cpuid_on =
            SeccompRule::new(vec![arg(0, crate::cpuid::ARCH_SET_CPUID as u64)?, arg(1, 1)?]).map_err(|e| err(&e))?;
        rules.insert(libc::SYS_arch_prctl, vec![cpuid_on]);
    }
    let arch = std::env::consts::ARCH.try_into().map_err(|e| err(&e))?;
    let filter = SeccompFilter::new(rules, mismatch, SeccompAction::Allow, arch).map_err(|e| err(&e))?;
    filter.try_into().map_err(|e: seccompiler::BackendError| err(&e))
}

/// Whether the kernel has seccomp filters (`SECCOMP_GET_ACTION_AVAIL`).
pub fn available() -> bool {
    let action: u32 = libc::SECCOMP_RET_TRAP;
    // SAFETY: SECCOMP_GET_ACTION_AVAIL reads one u32 at the pointer, a live
    // local; it changes nothing.
    let ret = unsafe { libc::syscall(libc::SYS_seccomp, libc::SECCOMP_GET_ACTION_AVAIL, 0, &action as *const u32) };
    ret == 0
}

/// Sets the mode for the run (`None`: `on` where the kernel has seccomp
/// filters, else off with a warning) and installs the SIGSYS handler;
/// `run.rs` calls it before it starts any thread.
pub fn prepare(mode: Option<SeccompMode>) -> Result<(), SandboxError> {
    let mode = match mode {
        Some(SeccompMode::Off) => SeccompMode::Off,
        Some(m) if available() => m,
        Some(_) => return Err(SandboxError::Unavailable),
        None if available() => SeccompMode::On,
        None => {
            log::warn!("this kernel has no seccomp filters (CONFIG_SECCOMP_FILTER): running without them");
            SeccompMode::Off
        }
    };
    let _ = MODE.set(mode);
    if mode != SeccompMode::On {
        return Ok(());
    }
    // SAFETY: sigaction is a plain C struct for which all-zero bytes are
    // valid; the fields are set below.
    let mut action: libc::sigaction = unsafe { std::mem::zeroed() };
    action.sa_sigaction =
        on_sigsys as extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) as libc::sighandler_t;
    action.sa_flags = libc::SA_SIGINFO;
    // SAFETY: a valid sigaction and a valid signal; the handler only makes
    // async-signal-safe calls (write, _exit).
    if unsafe { libc::sigaction(libc::SIGSYS, &action, std::ptr::null_mut()) } != 0 {
        return Err(SandboxError::Sigaction(io::Error::last_os_error()));
    }
    Ok(())
}

/// Installs the filter of `role` on the calling thread, as the run's mode
/// says (nothing before [`prepare`], or with `off`).
pub fn enter(role: Role) -> Result<(), SandboxError> {
    ROLE.with(|r| r.set(role.name()));
    let mismatch = match MODE.get() {
        None | Some(SeccompMode::Off) => return Ok(()),
        Some(SeccompMode::Log) => SeccompAction::Log,
        Some(SeccompMode::On) => SeccompAction::Trap,
    };
    let opens = no_opens()?;
    let prog = program(role, mismatch)?;
    let install =
        |p: &BpfProgram| seccompiler::apply_filter(p).map_err(|e| SandboxError::Install(role.name(), e.to_string()));
    install(&opens)?;
    install(&prog)
}

/// Empties the calling thread's capability sets (effective, permitted,
/// inheritable). Threads it starts afterwards inherit the empty sets.
pub fn drop_capabilities() -> Result<(), SandboxError> {
    #[repr(C)]
    struct Header {
        version: u32,
        pid: libc::c_int,
    }
    #[repr(C)]
    #[derive(Clone, Copy)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    // _LINUX_CAPABILITY_VERSION_3: two Data structs (64 capabilities).
    let header = Header { version: 0x2008_0522, pid: 0 };
    let data = [Data { effective: 0, permitted: 0, inheritable: 0 }; 2];
    // SAFETY: capset reads the header and two data structs, which are live
    // locals with the kernel's layout (linux/capability.h).
    let ret = unsafe { libc::syscall(libc::SYS_capset, &header as *const Header, data.as_ptr()) };
    if ret != 0 {
        return Err(SandboxError::Capabilities(io::Error::last_os_error()));
    }
    Ok(())
}

/// The name of a few system calls, for the SIGSYS message.
fn syscall_name(nr: libc::c_int) -> &'static str {
    match i64::from(nr) {
        libc::SYS_open => "open",
        libc::SYS_openat => "openat",
        libc::SYS_socket => "socket",
        libc::SYS_connect => "connect",
        libc::SYS_execve => "execve",
        libc::SYS_fork => "fork",
        libc::SYS_clone => "clone",
        libc::SYS_clone3 => "clone3",
        libc::SYS_uname => "uname",
        libc::SYS_ioctl => "ioctl",
        libc::SYS_ptrace => "ptrace",
        libc::SYS_kill => "kill",
        libc::SYS_statx => "statx",
        libc::SYS_newfstatat => "newfstatat",
        libc::SYS_prctl => "prctl",
        _ => "?",
    }
}

/// SIGSYS from the filter: say which thread made which call, and end the
/// launcher. Only async-signal-safe work: formatting into a stack buffer,
/// write(2) and _exit(2), both allowed by every filter.
extern "C" fn on_sigsys(_signal: libc::c_int, info: *mut libc::siginfo_t, _ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo for SA_SIGINFO handlers. For
    // SIGSYS its union holds struct { void *call_addr; int syscall; ...}
    // after the three int header fields and their padding, at byte 24.
    let nr = unsafe { info.cast::<u8>().add(24).cast::<libc::c_int>().read_unaligned() };
    let role = ROLE.with(Cell::get);
    let mut buf = [0u8; 256];
    let mut w = Buf { buf: &mut buf, len: 0 };
    let _ = std::fmt::Write::write_fmt(
        &mut w,
        format_args!(
            "lguest: seccomp: the {role} thread made system call {nr} ({}), which its filter forbids; exiting (--seccomp=log allows and logs it)\n",
            syscall_name(nr)
        ),
    );
    let len = w.len;
    // SAFETY: writes `len` bytes of the live stack buffer to stderr, then
    // ends the process at once.
    unsafe {
        libc::write(libc::STDERR_FILENO, buf.as_ptr().cast(), len);
        libc::_exit(128 + libc::SIGSYS);
    }
}

/// A fixed buffer for formatting without allocating.
struct Buf<'a> {
    buf: &'a mut [u8],
    len: usize,
}

impl std::fmt::Write for Buf<'_> {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        let n = s.len().min(self.buf.len() - self.len);
        self.buf[self.len..self.len + n].copy_from_slice(&s.as_bytes()[..n]);
        self.len += n;
        Ok(())
    }
}

/// The test hook behind `LGUEST_SECCOMP_SELFTEST=1` (the selftests use it):
/// a device thread makes a system call that no filter allows (`uname`).
pub fn forbidden_syscall() {
    // SAFETY: utsname is plain data for which all-zero bytes are valid; uname
    // fills in the live local.
    let mut u: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    unsafe { libc::uname(&mut u) };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_parse() {
        assert_eq!("on".parse::<SeccompMode>(), Ok(SeccompMode::On));
        assert_eq!("log".parse::<SeccompMode>(), Ok(SeccompMode::Log));
        assert_eq!("off".parse::<SeccompMode>(), Ok(SeccompMode::Off));
        assert!("yes".parse::<SeccompMode>().is_err());
    }

    /// Each role's filter builds, and a forbidden call from a thread with
    /// the device filter (in Errno form here, so that the test lives) is
    /// refused while the allowed ones work; another thread is not affected.
    #[test]
    fn the_device_filter_refuses_what_it_does_not_list() {
        for role in [Role::Vcpu, Role::Device, Role::Helper] {
            program(role, SeccompAction::Trap).expect("the filter builds");
        }
        let prog = program(Role::Device, SeccompAction::Errno(libc::EPERM as u32)).expect("filter");
        let (uname_ret, errno, getpid_ok) = std::thread::spawn(move || {
            seccompiler::apply_filter(&prog).expect("install");
            // SAFETY: as in forbidden_syscall.
            let mut u: libc::utsname = unsafe { std::mem::zeroed() };
            // SAFETY: as above.
            let ret = unsafe { libc::uname(&mut u) };
            let errno = io::Error::last_os_error().raw_os_error();
            // SAFETY: getpid has no preconditions.
            let pid = unsafe { libc::getpid() };
            (ret, errno, pid > 0)
        })
        .join()
        .expect("thread");
        assert_eq!((uname_ret, errno), (-1, Some(libc::EPERM)), "uname was allowed");
        assert!(getpid_ok);
        // SAFETY: as above, on this (unfiltered) thread.
        let mut u: libc::utsname = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        assert_eq!(unsafe { libc::uname(&mut u) }, 0, "the filter leaked to another thread");
    }

    /// A sandboxed thread's open fails with EACCES instead of ending the
    /// launcher, and its other calls work: glibc's malloc opens
    /// /proc/sys/vm/overcommit_memory when a thread's arena is trimmed at
    /// its exit, which `--seccomp=on` once turned into status 159.
    #[test]
    fn opens_are_refused_not_fatal() {
        let opens = no_opens().expect("filter");
        let prog = program(Role::Device, SeccompAction::Trap).expect("filter");
        let (open, pid) = std::thread::spawn(move || {
            seccompiler::apply_filter(&opens).expect("install");
            seccompiler::apply_filter(&prog).expect("install");
            let open = std::fs::File::open("/proc/sys/vm/overcommit_memory").map(drop).map_err(|e| e.raw_os_error());
            // SAFETY: getpid has no preconditions.
            (open, unsafe { libc::getpid() })
        })
        .join()
        .expect("thread");
        assert_eq!(open, Err(Some(libc::EACCES)));
        assert!(pid > 0);
    }

    /// The vCPU thread's filter lets the SIGTSTP handler (which runs there)
    /// stop the process, and refuses any other kill: a child process with
    /// the filter stops itself with SIGSTOP (the parent sees it stopped,
    /// not killed by SIGSYS), and its kill(getpid(), SIGCONT) is refused.
    #[test]
    fn the_vcpu_filter_lets_ctrl_z_stop_the_process() {
        // SAFETY: the child builds its filter (it names the child's own pid,
        // so it must be built there; glibc's malloc is fork-safe, its fork
        // takes the arena locks), makes system calls and _exits.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork");
        if pid == 0 {
            let prog = program(Role::Vcpu, SeccompAction::Errno(libc::EPERM as u32));
            let code = match prog.map(|p| seccompiler::apply_filter(&p)) {
                Ok(Ok(())) => {
                    // SAFETY: signals to this very process.
                    let cont = unsafe { libc::kill(libc::getpid(), libc::SIGCONT) };
                    // SAFETY: as above; the parent continues us.
                    let stop = unsafe { libc::kill(libc::getpid(), libc::SIGSTOP) };
                    if cont == -1 && stop == 0 {
                        0
                    } else {
                        1
                    }
                }
                _ => 2,
            };
            // SAFETY: ends the child at once.
            unsafe { libc::_exit(code) };
        }
        let mut status = 0;
        // SAFETY: waits for our own child, into a live local.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, libc::WUNTRACED) }, pid);
        assert!(libc::WIFSTOPPED(status), "the child was not stopped (status {status:#x})");
        // SAFETY: continues and reaps our own child.
        unsafe {
            libc::kill(pid, libc::SIGCONT);
            assert_eq!(libc::waitpid(pid, &mut status, 0), pid);
        }
        assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "child status {status:#x}");
    }

    /// The vCPU thread's filter lets through the tap ioctls of a net
    /// device's activation and reset (which the status protocol runs on
    /// that thread), and still refuses other ioctls.
    #[test]
    fn the_vcpu_filter_allows_the_tap_offload_ioctls() {
        let prog = program(Role::Vcpu, SeccompAction::Errno(libc::EPERM as u32)).expect("filter");
        let errnos = std::thread::spawn(move || {
            let file = std::fs::File::open("/dev/null").expect("/dev/null");
            let fd = std::os::fd::AsRawFd::as_raw_fd(&file);
            seccompiler::apply_filter(&prog).expect("install");
            let size: libc::c_int = 12;
            let mut n: libc::c_int = 0;
            // SAFETY: ioctls on /dev/null, which refuses them (ENOTTY)
            // without touching memory; the pointers are to live locals.
            unsafe {
                let hdr = libc::ioctl(fd, libc::TUNSETVNETHDRSZ, &size as *const libc::c_int);
                let hdr = (hdr, io::Error::last_os_error().raw_os_error());
                let off = libc::ioctl(fd, libc::TUNSETOFFLOAD, 0 as libc::c_ulong);
                let off = (off, io::Error::last_os_error().raw_os_error());
                let other = libc::ioctl(fd, libc::FIONREAD, &mut n as *mut libc::c_int);
                (hdr, off, (other, io::Error::last_os_error().raw_os_error()))
            }
        })
        .join()
        .expect("thread");
        assert_eq!(errnos.0, (-1, Some(libc::ENOTTY)), "TUNSETVNETHDRSZ reached the kernel");
        assert_eq!(errnos.1, (-1, Some(libc::ENOTTY)), "TUNSETOFFLOAD reached the kernel");
        assert_eq!(errnos.2, (-1, Some(libc::EPERM)), "FIONREAD was refused by the filter");
    }
}
