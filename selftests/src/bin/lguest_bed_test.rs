// SPDX-License-Identifier: GPL-2.0
//! Checks of the test bed itself: the properties of Bochs that the targeted
//! set of `make bochs-test` relies on (Documentation/dev/testing.rst,
//! "make bochs-test"). If one of them did not hold, the other tests would pass there
//! without having checked what they were chosen for. Under QEMU TCG, which
//! models neither, they skip with the reason.

use std::process::ExitCode;

use lguest_selftests::{self as t, check, fail, TestResult};

/// The kernel log (what `dmesg` prints).
fn kernel_log() -> Result<String, t::NotPassed> {
    let mut buf = vec![0u8; 1 << 20];
    // SAFETY: SYSLOG_ACTION_READ_ALL (3) writes at most `buf.len()` bytes
    // into `buf`, which lives across the call.
    let n = unsafe { libc::klogctl(3, buf.as_mut_ptr().cast(), buf.len() as i32) };
    if n < 0 {
        fail!("klogctl(SYSLOG_ACTION_READ_ALL): {}", t::errname(t::errno()));
    }
    buf.truncate(n as usize);
    Ok(String::from_utf8_lossy(&buf).into_owned())
}

/// The flags of the first CPU in /proc/cpuinfo.
fn cpu_flags() -> Vec<String> {
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    info.lines()
        .find_map(|l| l.strip_prefix("flags")?.split_once(':').map(|(_, f)| f.to_string()))
        .map(|f| f.split_whitespace().map(str::to_string).collect())
        .unwrap_or_default()
}

/// Kernel IBT is on: the CPU has it, the host kernel was built with it and
/// its boot self-test (an indirect jump to a spot without ENDBR must raise
/// #CP) passed. Every test of the set then runs with ENDBR checked on each
/// indirect branch and on each interrupt and exception delivered in ring 0,
/// so a switcher stub or a host handler the switcher calls without ENDBR
/// would stop the host with "Missing ENDBR".
fn ibt_enforced() -> TestResult {
    t::require_bochs("QEMU TCG does not model CET, so ENDBR is never checked there")?;
    let flags = cpu_flags();
    check!(
        flags.iter().any(|f| f == "ibt"),
        "no \"ibt\" in /proc/cpuinfo's flags (Bochs's tigerlake model has it; the kernel clears it when its self-test fails or with ibt=off): {}",
        flags.join(" ")
    );
    let log = kernel_log()?;
    check!(!log.contains("IBT selftest: Failed"), "the kernel's IBT self-test failed");
    check!(
        log.contains("CET detected: Indirect Branch Tracking enabled"),
        "the kernel did not turn IBT on (built without CONFIG_X86_KERNEL_IBT?): no \"CET detected: Indirect Branch Tracking enabled\" in the kernel log"
    );
    Ok(())
}

/// The distro flavour's host (kernel/distro.config, booted with `pti=on`)
/// really runs as Debian's would: page-table isolation on (`pti` in
/// /proc/cpuinfo's flags: QEMU's CPU models may not be Meltdown-affected,
/// hence `pti=on`), and KASLR on, seen as a kernel text or a direct map
/// that is not at its unrandomized address (`_text` in /proc/kallsyms,
/// read as root; the direct map from lguest's load message). Either may
/// land at its default by chance (1 in about 500 for the text), both
/// together practically never. So the suite's distro boot cannot silently
/// lose them.
fn distro_hardening() -> TestResult {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    if !release.trim_end().ends_with("-lguest-distro") {
        t::skip!("not the distro flavour's kernel ({})", release.trim_end());
    }
    let flags = cpu_flags();
    check!(
        flags.iter().any(|f| f == "pti"),
        "page-table isolation is off: no \"pti\" in the flags: {}",
        flags.join(" ")
    );
    let cmdline = std::fs::read_to_string("/proc/cmdline").unwrap_or_default();
    check!(!cmdline.split_whitespace().any(|w| w == "nokaslr"), "booted with nokaslr: {cmdline}");
    let text = t::kallsyms("_text");
    check!(text.is_some(), "no _text in /proc/kallsyms (not root?)");
    let log = kernel_log()?;
    let dmap = log
        .lines()
        .rev()
        .filter(|l| l.contains("lguest: switcher at "))
        .filter_map(|l| l.split(", ").find_map(|f| f.strip_prefix("direct map 0x")))
        .find_map(|h| u64::from_str_radix(h, 16).ok());
    check!(dmap.is_some(), "no direct map in lguest's load message");
    let (text, dmap) = (text.unwrap_or(0), dmap.unwrap_or(0));
    println!("# pti on; kernel text at {text:#x}, direct map at {dmap:#x}");
    check!(
        text >> 31 == 0x1_ffff_ffff && dmap >> 56 == 0xff,
        "not kernel addresses: text {text:#x}, direct map {dmap:#x}"
    );
    check!(
        text != 0xffff_ffff_8100_0000 || dmap != 0xffff_8880_0000_0000,
        "KASLR is off: the kernel text and the direct map are at their default addresses"
    );
    Ok(())
}

/// The first non-canonical address of 4-level paging.
const NON_CANONICAL: u64 = 0x0000_8000_0000_0000;

/// Where, in a forked child, an `iretq` to [`NON_CANONICAL`] faulted:
/// (the RIP the #GP reported, the address of the `iretq`).
fn iretq_fault_site() -> Result<(u64, u64), t::NotPassed> {
    let mut fds = [0i32; 2];
    // SAFETY: pipe(2) writes two descriptors into `fds`.
    if unsafe { libc::pipe(fds.as_mut_ptr()) } != 0 {
        fail!("pipe: {}", t::errname(t::errno()));
    }
    // SAFETY: fork() from the test's only thread; the child makes only
    // async-signal-safe calls (sigaction, write, _exit) and never returns.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        fail!("fork: {}", t::errname(t::errno()));
    }
    if pid == 0 {
        // SAFETY: in the child: see `iretq_child`.
        unsafe { iretq_child(fds[1]) }
    }
    // SAFETY: closing our copy of the write end.
    unsafe { libc::close(fds[1]) };
    let mut got = [0u8; 16];
    let mut n = 0;
    while n < got.len() {
        // SAFETY: reads into the rest of `got`.
        let r = unsafe { libc::read(fds[0], got[n..].as_mut_ptr().cast(), got.len() - n) };
        if r <= 0 {
            break;
        }
        n += r as usize;
    }
    let mut status = 0;
    // SAFETY: reaping our own child; closing our read end.
    unsafe {
        libc::waitpid(pid, &mut status, 0);
        libc::close(fds[0]);
    }
    check!(n == 16, "the child reported no fault ({n} bytes; wait status {status:#x})");
    let rip = u64::from_ne_bytes(got[..8].try_into().unwrap());
    let at = u64::from_ne_bytes(got[8..].try_into().unwrap());
    Ok((rip, at))
}

/// The write end of the pipe and the `iretq`'s address, for the handler.
static REPORT_FD: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(-1);
static IRETQ_AT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

extern "C" fn on_segv(_sig: i32, _info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    use std::sync::atomic::Ordering::SeqCst;
    // SAFETY: the kernel passes a ucontext_t to an SA_SIGINFO handler.
    let rip = unsafe { (*ctx.cast::<libc::ucontext_t>()).uc_mcontext.gregs[libc::REG_RIP as usize] } as u64;
    let mut msg = [0u8; 16];
    msg[..8].copy_from_slice(&rip.to_ne_bytes());
    msg[8..].copy_from_slice(&IRETQ_AT.load(SeqCst).to_ne_bytes());
    // SAFETY: write(2) and _exit(2) are async-signal-safe.
    unsafe {
        libc::write(REPORT_FD.load(SeqCst), msg.as_ptr().cast(), msg.len());
        libc::_exit(0);
    }
}

/// The child: catches SIGSEGV and SIGBUS, then `iretq`s (ring 3 to ring 3)
/// to a non-canonical RIP.
///
/// # Safety
///
/// Only in a freshly forked child; never returns.
unsafe fn iretq_child(fd: i32) -> ! {
    use std::sync::atomic::Ordering::SeqCst;
    REPORT_FD.store(fd, SeqCst);
    // SAFETY: a zeroed sigaction is valid; the handler is async-signal-safe.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_segv as *const () as usize;
        sa.sa_flags = libc::SA_SIGINFO;
        libc::sigaction(libc::SIGSEGV, &sa, std::ptr::null_mut());
        libc::sigaction(libc::SIGBUS, &sa, std::ptr::null_mut());
    }
    let at: u64;
    // SAFETY: only computes an address in this function.
    unsafe { std::arch::asm!("lea {}, [rip + 2f]", "jmp 3f", "2: iretq", "3:", out(reg) at) };
    IRETQ_AT.store(at, SeqCst);
    // SAFETY: builds an iretq frame (SS, RSP, RFLAGS, CS, RIP) of this
    // process's own selectors, flags and stack, with RIP non-canonical,
    // and jumps to the iretq above; the fault ends in `on_segv`, which exits.
    unsafe {
        std::arch::asm!(
            "mov eax, ss",
            "push rax",
            "push rsp",
            "pushfq",
            "mov eax, cs",
            "push rax",
            "push {rip}",
            "jmp {at}",
            rip = in(reg) NON_CANONICAL,
            at = in(reg) at,
            in("rax") 0u64,
            options(noreturn)
        )
    }
}

/// `iretq` to a non-canonical RIP raises #GP at the `iretq` itself, before
/// anything of the return happens, as on hardware (SDM: IRET, "IF new RIP
/// is not canonical THEN #GP(0)"). The switcher's own `iretq` into a guest
/// runs in ring 0, where that #GP would be the host's: the switch-hardening
/// tests rely on Bochs showing it. Checked here from ring 3, where the
/// instruction makes the same check.
fn iretq_noncanonical_faults() -> TestResult {
    // Not even tried elsewhere: QEMU 7.2's TCG reads the frame of a ring-3
    // iretq with supervisor rights, which with SMAP is a page fault the
    // host kernel cannot handle (an Oops), before any RIP check.
    t::require_bochs(
        "QEMU TCG does not check RIP on iretq, and its ring-3 iretq reads the frame with supervisor rights (an Oops with SMAP)",
    )?;
    let (rip, at) = iretq_fault_site()?;
    println!("# iretq at {at:#x} to {NON_CANONICAL:#x}: the fault reported RIP {rip:#x}");
    check!(
        rip == at,
        "the #GP should be at the iretq ({at:#x}), it came at {rip:#x}: the bed does not check RIP on iretq"
    );
    Ok(())
}

fn main() -> ExitCode {
    t::run(&[
        ("ibt_enforced", ibt_enforced),
        ("iretq_noncanonical_faults", iretq_noncanonical_faults),
        ("distro_hardening", distro_hardening),
    ])
}
