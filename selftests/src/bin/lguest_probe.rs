// SPDX-License-Identifier: GPL-2.0
//! The differential probes: small user programs whose result a process can
//! observe, run natively on the QEMU host and inside the Linux guest
//! (`guest/linux/init`, `lginit=probe`), by the same static binary;
//! `lguest_run_test:linux_differential` compares the two lists. Each probe
//! runs in a child of its own, so that what kills a process kills only
//! that child, and prints one line, `probe <name>: <result>`, where the
//! result is what the child saw: the fault a handler caught (signal, code,
//! address, trap number, error code, RIP, CS and SS of the faulting
//! context), its exit status, or the signal that ended it.
//!
//! Addresses in a result are printed as numbers only where they are fixed
//! (the probes' own constants: the top of user space, non-canonical and
//! kernel addresses); the program's own code is named (`landing`,
//! `probe+N`), since a static PIE moves with ASLR.
//!
//! The probes are the returns to user mode of review N2 (a non-canonical
//! or top-of-user-space RSP, a `syscall` ending at the top of user space,
//! `sigreturn` to every kind of bad CS, SS, RIP and RSP, a SIGSEGV handler
//! that returns to a fault at the top, jumps to the guard hole and to a
//! non-canonical address), single-stepping across `syscall`, the NT flag
//! across `syscall`, and the FS and GS bases written with `wrfsbase` and
//! `wrgsbase` across system calls and context switches.

use std::arch::global_asm;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

// The probes' code: none of it uses the stack after it changes RSP.
global_asm!(
    ".pushsection .text.probe, \"ax\", @progbits",
    ".balign 16",
    ".globl probe_code_start",
    "probe_code_start:",
    // exit(42) with no stack: where a return with a bad RSP lands.
    ".globl probe_landing",
    "probe_landing:",
    "    mov edi, 42",
    "    mov eax, 60",
    "    syscall",
    "    ud2",
    // RSP = RDI, then spin forever.
    ".balign 16",
    ".globl probe_rsp_spin",
    "probe_rsp_spin:",
    "    mov rsp, rdi",
    "1:  jmp 1b",
    // Jump to RDI.
    ".balign 16",
    ".globl probe_jump",
    "probe_jump:",
    "    jmp rdi",
    // Single-step (TF) across a `syscall` (getpid): the handler records
    // each trap's RIP and clears TF at probe_tf_end.
    ".balign 16",
    ".globl probe_tf",
    "probe_tf:",
    "    pushfq",
    "    or qword ptr [rsp], 0x100",
    "    popfq",
    "    mov eax, 39",
    "    syscall",
    "    nop",
    "    nop",
    ".globl probe_tf_end",
    "probe_tf_end:",
    "    xor edi, edi",
    "    mov eax, 60",
    "    syscall",
    "    ud2",
    // NT set across a `syscall`: exits with bit 0 = NT after the
    // instruction, bit 1 = NT before it (as popf left it).
    ".balign 16",
    ".globl probe_nt",
    "probe_nt:",
    "    pushfq",
    "    or qword ptr [rsp], 0x4000",
    "    popfq",
    "    pushfq",
    "    pop rbx",
    "    mov eax, 39",
    "    syscall",
    "    pushfq",
    "    pop rdi",
    "    shr rdi, 14",
    "    and edi, 1",
    "    shr rbx, 13",
    "    and ebx, 2",
    "    or edi, ebx",
    "    push 0x202",
    "    popfq",
    "    mov eax, 60",
    "    syscall",
    "    ud2",
    // wrfsbase/wrgsbase RDI, then RSI x (getpid, sched_yield), then read
    // both back: exit 0 if both kept RDI, bit 0 FS lost, bit 1 GS lost.
    // The FS base (Rust's TLS) is put back before the exit.
    ".balign 16",
    ".globl probe_bases",
    "probe_bases:",
    "    rdfsbase r12",
    "    rdgsbase r13",
    "    wrfsbase rdi",
    "    wrgsbase rdi",
    "    mov r14, rdi",
    "    mov r15, rsi",
    "2:  mov eax, 39",
    "    syscall",
    "    mov eax, 24",
    "    syscall",
    "    dec r15",
    "    jnz 2b",
    "    xor edi, edi",
    "    rdfsbase rax",
    "    cmp rax, r14",
    "    je 3f",
    "    or edi, 1",
    "3:  rdgsbase rax",
    "    cmp rax, r14",
    "    je 4f",
    "    or edi, 2",
    "4:  wrfsbase r12",
    "    wrgsbase r13",
    "    mov eax, 60",
    "    syscall",
    "    ud2",
    ".globl probe_code_end",
    "probe_code_end:",
    ".popsection",
);

extern "C" {
    static probe_code_start: u8;
    static probe_code_end: u8;
    static probe_landing: u8;
    static probe_rsp_spin: u8;
    static probe_jump: u8;
    static probe_tf: u8;
    static probe_tf_end: u8;
    static probe_nt: u8;
    static probe_bases: u8;
}

/// The address of a symbol of the probe section.
fn addr(sym: *const u8) -> u64 {
    sym as u64
}

/// What the fault handler found, in a page the parent shares.
#[repr(C)]
struct Report {
    done: u64,
    sig: u64,
    code: u64,
    addr: u64,
    trapno: u64,
    err: u64,
    rip: u64,
    csgsfs: u64,
    /// Single-step traps seen (probe_tf), and their RIPs.
    steps: u64,
    step_rip: [u64; 16],
}

static REPORT: AtomicU64 = AtomicU64::new(0);

/// What the SIGUSR1 handler does to the context it returns to: RIP, RSP,
/// CS, SS (0: leave), and whether to ask for SS as it is
/// (UC_STRICT_RESTORE_SS).
static SET: [AtomicU64; 5] = [const { AtomicU64::new(0) }; 5];
/// Fault handler modes (0: report the fault and exit).
static MODE: AtomicU64 = AtomicU64::new(0);
/// Return to the faulting context 3 times, then land.
const MODE_RETURN: u64 = 1;
/// Record single-step traps until probe_tf_end.
const MODE_STEP: u64 = 2;
static RETURNS: AtomicU64 = AtomicU64::new(0);

const UC_STRICT_RESTORE_SS: u64 = 4;

fn report() -> *mut Report {
    REPORT.load(Ordering::Relaxed) as *mut Report
}

fn raw_exit(code: i32) -> ! {
    // SAFETY: exit_group ends the process; nothing runs after it.
    unsafe {
        libc::syscall(libc::SYS_exit_group, code);
    }
    unreachable!()
}

extern "C" fn on_fault(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo and ucontext to an
    // SA_SIGINFO handler, live while it runs; the report page is mapped
    // shared for the child's whole life, and only this handler writes it.
    unsafe {
        let uc = &mut *(ctx as *mut libc::ucontext_t);
        let g = &mut uc.uc_mcontext.gregs;
        let rip = g[libc::REG_RIP as usize] as u64;
        match MODE.load(Ordering::Relaxed) {
            MODE_RETURN if sig == libc::SIGSEGV => {
                if RETURNS.fetch_add(1, Ordering::Relaxed) < 3 {
                    return;
                }
                g[libc::REG_RIP as usize] = landing() as i64;
                return;
            }
            MODE_STEP if sig == libc::SIGTRAP => {
                let r = &mut *report();
                if (r.steps as usize) < r.step_rip.len() {
                    r.step_rip[r.steps as usize] = rip;
                }
                r.steps += 1;
                if rip >= addr(&raw const probe_tf_end) || r.steps > 64 {
                    g[libc::REG_EFL as usize] &= !0x100;
                }
                return;
            }
            _ => {}
        }
        let r = &mut *report();
        r.sig = sig as u64;
        r.code = (*info).si_code as u64;
        r.addr = (*info).si_addr() as u64;
        r.trapno = g[libc::REG_TRAPNO as usize] as u64;
        r.err = g[libc::REG_ERR as usize] as u64;
        r.rip = rip;
        r.csgsfs = g[libc::REG_CSGSFS as usize] as u64;
        r.done = 1;
    }
    raw_exit(100);
}

extern "C" fn on_usr1(_sig: libc::c_int, _info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: as in on_fault: the ucontext the kernel will restore from.
    unsafe {
        let uc = &mut *(ctx as *mut libc::ucontext_t);
        let [rip, rsp, cs, ss, strict] = SET.each_ref().map(|a| a.load(Ordering::Relaxed));
        let g = &mut uc.uc_mcontext.gregs;
        if rip != 0 {
            g[libc::REG_RIP as usize] = rip as i64;
        }
        if rsp != 0 {
            g[libc::REG_RSP as usize] = rsp as i64;
        }
        let mut v = g[libc::REG_CSGSFS as usize] as u64;
        if cs != 0 {
            v = (v & !0xffff) | cs;
        }
        if ss != 0 {
            v = (v & !(0xffff << 48)) | (ss << 48);
        }
        g[libc::REG_CSGSFS as usize] = v as i64;
        if strict != 0 {
            uc.uc_flags |= UC_STRICT_RESTORE_SS;
        }
    }
}

fn handle(sig: libc::c_int, f: usize, onstack: bool) {
    // SAFETY: a zeroed sigaction is valid; the handler is an extern "C"
    // SA_SIGINFO function of this program.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = f;
        sa.sa_flags = libc::SA_SIGINFO | libc::SA_NODEFER | if onstack { libc::SA_ONSTACK } else { 0 };
        libc::sigaction(sig, &sa, std::ptr::null_mut());
    }
}

/// In the child: an alternate stack and the fault handlers on it.
fn child_setup() {
    const ALT: usize = 64 * 1024;
    // SAFETY: a fresh anonymous mapping, given to the kernel as the
    // alternate signal stack and never freed (the child exits).
    unsafe {
        let p = libc::mmap(
            std::ptr::null_mut(),
            ALT,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        let ss = libc::stack_t { ss_sp: p, ss_flags: 0, ss_size: ALT };
        libc::sigaltstack(&ss, std::ptr::null_mut());
    }
    for sig in [libc::SIGSEGV, libc::SIGBUS, libc::SIGILL, libc::SIGTRAP, libc::SIGFPE] {
        handle(sig, on_fault as *const () as usize, true);
    }
    handle(libc::SIGUSR1, on_usr1 as *const () as usize, false);
}

/// Calls `f(rdi, rsi)`, a probe routine (or code a probe mapped) that
/// never returns.
fn call(f: *const u8, rdi: u64, rsi: u64) -> ! {
    // SAFETY: the routines of the probe section take RDI and RSI and end
    // the process themselves or fault into the handlers; so does the code
    // the probes map.
    unsafe {
        let f: extern "C" fn(u64, u64) -> ! = std::mem::transmute(f);
        f(rdi, rsi)
    }
}

/// What the parent does while the child runs.
#[derive(Clone, Copy)]
enum Then {
    Wait,
    /// SIGKILL after this long (the child should still be spinning).
    Kill(u64),
    /// SIGUSR1 after this long, then wait.
    Usr1(u64),
}

/// A name for an address in a result.
fn name(v: u64) -> String {
    let (start, end) = (addr(&raw const probe_code_start), addr(&raw const probe_code_end));
    if v == 0 {
        "0".into()
    } else if v == landing() {
        "landing".into()
    } else if (start..end).contains(&v) {
        format!("probe+{:#x}", v - start)
    } else if v >= 0x7fff_ffff_0000 {
        format!("{v:#x}")
    } else {
        "user".into()
    }
}

fn run(probe: &str, then: Then, body: impl FnOnce()) {
    // SAFETY: a fresh shared anonymous page for the report.
    let page = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            4096,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if page == libc::MAP_FAILED {
        println!("probe {probe}: no report page");
        return;
    }
    REPORT.store(page as u64, Ordering::Relaxed);
    // SAFETY: the program is single-threaded here; the child only runs
    // the probe and exits.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        child_setup();
        body();
        raw_exit(0);
    }
    match then {
        Then::Wait => {}
        Then::Kill(ms) => {
            std::thread::sleep(Duration::from_millis(ms));
            // SAFETY: signals our own child.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        Then::Usr1(ms) => {
            std::thread::sleep(Duration::from_millis(ms));
            // SAFETY: signals our own child.
            unsafe { libc::kill(pid, libc::SIGUSR1) };
        }
    }
    let mut status = 0;
    // SAFETY: waits for our own child.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    // SAFETY: the child has exited; the page is ours alone now.
    let r = unsafe { &*(page as *const Report) };
    let mut out = String::new();
    if r.steps != 0 {
        let rips: Vec<String> = r.step_rip[..(r.steps as usize).min(16)].iter().map(|&v| name(v)).collect();
        out += &format!("steps {} [{}] ", r.steps, rips.join(" "));
    }
    if r.done != 0 {
        let (cs, ss) = (r.csgsfs & 0xffff, r.csgsfs >> 48);
        out += &format!(
            "sig {} code {} addr {} trap {} err {:#x} rip {} cs {cs:#x} ss {ss:#x}",
            r.sig,
            r.code,
            name(r.addr),
            r.trapno,
            r.err,
            name(r.rip)
        );
    } else if libc::WIFEXITED(status) {
        out += &format!("exit {}", libc::WEXITSTATUS(status));
    } else if libc::WIFSIGNALED(status) {
        out += &format!("signal {}", libc::WTERMSIG(status));
    } else {
        out += &format!("status {status:#x}");
    }
    println!("probe {probe}: {out}");
    // SAFETY: unmaps the page mapped above.
    unsafe { libc::munmap(page, 4096) };
}

/// Maps one page at `va` with `code` at offset `off` (RWX).
fn map_code(va: u64, off: usize, code: &[u8]) -> bool {
    // SAFETY: a fixed mapping only where nothing is mapped
    // (MAP_FIXED_NOREPLACE); written below within its 4096 bytes.
    unsafe {
        let p = libc::mmap(
            va as *mut libc::c_void,
            4096,
            libc::PROT_READ | libc::PROT_WRITE | libc::PROT_EXEC,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE,
            -1,
            0,
        );
        if p as u64 != va {
            return false;
        }
        std::ptr::copy_nonoverlapping(code.as_ptr(), (va as *mut u8).add(off), code.len());
    }
    true
}

/// In the child: sigreturn to what [`SET`] says (through SIGUSR1).
fn sigreturn_to(rip: u64, rsp: u64, cs: u64, ss: u64, strict: bool) {
    for (a, v) in SET.iter().zip([rip, rsp, cs, ss, strict as u64]) {
        a.store(v, Ordering::Relaxed);
    }
    // SAFETY: raises a signal at ourselves; the handler is installed.
    unsafe { libc::raise(libc::SIGUSR1) };
}

fn landing() -> u64 {
    addr(&raw const probe_landing)
}

fn main() {
    let (rsp_spin, jump, tf, nt, bases) = (
        &raw const probe_rsp_spin,
        &raw const probe_jump,
        &raw const probe_tf,
        &raw const probe_nt,
        &raw const probe_bases,
    );
    // A non-canonical RSP, and the top of user space, while the timer
    // ticks: natively the loop spins until killed.
    run("rsp-noncanonical-spin", Then::Kill(300), || call(rsp_spin, 0x8000_0000_0000, 0));
    run("rsp-top-spin", Then::Kill(300), || call(rsp_spin, 0x7fff_ffff_f800, 0));
    // A signal to it: the kernel cannot write the frame: SIGSEGV.
    run("rsp-noncanonical-signal", Then::Usr1(200), || call(rsp_spin, 0x8000_0000_0000, 0));
    // `getpid` by `syscall` ending at the top of user space: the return
    // RIP is the first address no process may have.
    run("syscall-at-top", Then::Wait, || {
        let code = [0xb8, 39, 0, 0, 0, 0x0f, 0x05];
        if !map_code(0x7fff_ffff_e000, 4096 - code.len(), &code) {
            raw_exit(77);
        }
        call((0x7fff_ffff_f000 - code.len() as u64) as *const u8, 0, 0)
    });
    // sigreturn to selectors, RIPs and RSPs a CPU refuses or that fault.
    run("sigreturn-cs-0x23", Then::Wait, || {
        // Compat mode where native has it: int3 at a low address.
        if !map_code(0x20_0000, 0, &[0xcc, 0xcc]) {
            raw_exit(77);
        }
        sigreturn_to(0x20_0000, 0, 0x23, 0, false)
    });
    run("sigreturn-cs-0x13", Then::Wait, || sigreturn_to(landing(), 0, 0x13, 0, false));
    run("sigreturn-cs-0x3b", Then::Wait, || sigreturn_to(landing(), 0, 0x3b, 0, false));
    run("sigreturn-cs-0x2b", Then::Wait, || sigreturn_to(landing(), 0, 0x2b, 0, false));
    run("sigreturn-ss-0x3b", Then::Wait, || sigreturn_to(landing(), 0, 0, 0x3b, false));
    run("sigreturn-ss-0x3b-strict", Then::Wait, || sigreturn_to(landing(), 0, 0, 0x3b, true));
    run("sigreturn-ss-0x23-strict", Then::Wait, || sigreturn_to(landing(), 0, 0, 0x23, true));
    run("sigreturn-ss-0x18-strict", Then::Wait, || sigreturn_to(landing(), 0, 0, 0x18, true));
    run("sigreturn-rip-0x800000000000", Then::Wait, || sigreturn_to(0x8000_0000_0000, 0, 0, 0, false));
    run("sigreturn-rip-0x7ffffffff000", Then::Wait, || sigreturn_to(0x7fff_ffff_f000, 0, 0, 0, false));
    run("sigreturn-rip-0xffff800000001000", Then::Wait, || sigreturn_to(0xffff_8000_0000_1000, 0, 0, 0, false));
    run("sigreturn-rsp-0x800000000000", Then::Wait, || sigreturn_to(landing(), 0x8000_0000_0000, 0, 0, false));
    run("sigreturn-rsp-0x7ffffffff800", Then::Wait, || sigreturn_to(landing(), 0x7fff_ffff_f800, 0, 0, false));
    // A SIGSEGV handler that returns to a fetch fault at the top of user
    // space, 3 times, then lands (exit 42).
    run("segv-handler-returns-at-top", Then::Wait, || {
        MODE.store(MODE_RETURN, Ordering::Relaxed);
        call(jump, 0x7fff_ffff_f000, 0)
    });
    run("jump-guard-hole", Then::Wait, || call(jump, 0xffff_8000_0000_1000, 0));
    run("jump-noncanonical", Then::Wait, || call(jump, 0x8000_0000_0000, 0));
    // Single-stepping across `syscall`.
    run("tf-across-syscall", Then::Wait, || {
        MODE.store(MODE_STEP, Ordering::Relaxed);
        call(tf, 0, 0)
    });
    run("nt-across-syscall", Then::Wait, || call(nt, 0, 0));
    // The FS and GS bases by wrfsbase/wrgsbase, kept across 1000 system
    // calls and yields (where the CPU and the kernel allow the instructions).
    // SAFETY: getauxval has no preconditions.
    let hwcap2 = unsafe { libc::getauxval(libc::AT_HWCAP2) };
    if hwcap2 & 2 != 0 {
        run("fsgsbase-kept", Then::Wait, || call(bases, 0x1234_5000, 1000));
    } else {
        println!("probe fsgsbase-kept: no FSGSBASE (AT_HWCAP2)");
    }
    println!("probe done");
}
