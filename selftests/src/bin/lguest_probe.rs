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
//! `wrgsbase` across system calls and context switches; then what the
//! rest of a process's ABI shows (review item 2 of issue 35):
//! single-stepping across a page fault and `int $0x80`, ptrace's
//! single-step, hardware breakpoints and watchpoints, the clock calls the
//! vDSO answers without a system call, the clocks' order and resolution,
//! CPU time, the CPU number, the auxiliary vector and CPUID, the AVX state
//! in a signal frame and across system calls and sleeps, the vsyscall
//! page, `iopl`, `ioperm` and `modify_ldt`. Each is this program's own;
//! none is taken from elsewhere.

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
    // Single-step (TF) across a store to an untouched page (RDI), a page
    // fault the kernel resolves without a signal.
    ".balign 16",
    ".globl probe_tf_pf",
    "probe_tf_pf:",
    "    pushfq",
    "    or qword ptr [rsp], 0x100",
    "    popfq",
    "    mov byte ptr [rdi], 1",
    "    nop",
    ".globl probe_tf_pf_end",
    "probe_tf_pf_end:",
    "    xor edi, edi",
    "    mov eax, 60",
    "    syscall",
    "    ud2",
    // Single-step across `int $0x80` (the 32-bit getpid, 20).
    ".balign 16",
    ".globl probe_tf_int80",
    "probe_tf_int80:",
    "    pushfq",
    "    or qword ptr [rsp], 0x100",
    "    popfq",
    "    mov eax, 20",
    "    int 0x80",
    "    nop",
    ".globl probe_tf_int80_end",
    "probe_tf_int80_end:",
    "    xor edi, edi",
    "    mov eax, 60",
    "    syscall",
    "    ud2",
    // What a tracer single-steps (PTRACE_SINGLESTEP): getpid by
    // `syscall`, then exit(0).
    ".balign 16",
    ".globl probe_plain",
    "probe_plain:",
    "    mov eax, 39",
    "    syscall",
    "    nop",
    "    nop",
    "    xor edi, edi",
    "    mov eax, 60",
    "    syscall",
    "    ud2",
    // A function: YMM0 and YMM1 from [RDI] and [RDI+32], SIGUSR2 to this
    // process (getpid, kill), then both to [RDI+64] and [RDI+96].
    ".balign 16",
    ".globl probe_avx_signal",
    "probe_avx_signal:",
    "    push r12",
    "    mov r12, rdi",
    "    vmovdqu ymm0, [r12]",
    "    vmovdqu ymm1, [r12 + 32]",
    "    mov eax, 39",
    "    syscall",
    "    mov edi, eax",
    "    mov esi, 12",
    "    mov eax, 62",
    "    syscall",
    "    vmovdqu [r12 + 64], ymm0",
    "    vmovdqu [r12 + 96], ymm1",
    "    vzeroupper",
    "    pop r12",
    "    ret",
    // A function: YMM2..YMM15 from [RDI], then RSI x (getpid,
    // sched_yield) and 3 x nanosleep(1 ms, the timespec at [RDI+32]),
    // then YMM2..YMM15 to [RDI+64+32*(N-2)].
    ".balign 16",
    ".globl probe_avx_kept",
    "probe_avx_kept:",
    "    push r12",
    "    push r13",
    "    mov r12, rdi",
    "    mov r13, rsi",
    "    vmovdqu ymm2, [r12]",
    "    vpaddq ymm3, ymm2, ymm2",
    "    vpaddq ymm4, ymm3, ymm2",
    "    vpaddq ymm5, ymm4, ymm2",
    "    vpaddq ymm6, ymm5, ymm2",
    "    vpaddq ymm7, ymm6, ymm2",
    "    vpaddq ymm8, ymm7, ymm2",
    "    vpaddq ymm9, ymm8, ymm2",
    "    vpaddq ymm10, ymm9, ymm2",
    "    vpaddq ymm11, ymm10, ymm2",
    "    vpaddq ymm12, ymm11, ymm2",
    "    vpaddq ymm13, ymm12, ymm2",
    "    vpaddq ymm14, ymm13, ymm2",
    "    vpaddq ymm15, ymm14, ymm2",
    "5:  mov eax, 39",
    "    syscall",
    "    mov eax, 24",
    "    syscall",
    "    dec r13",
    "    jnz 5b",
    "    mov r13, 3",
    "6:  lea rdi, [r12 + 32]",
    "    xor esi, esi",
    "    mov eax, 35",
    "    syscall",
    "    dec r13",
    "    jnz 6b",
    "    vmovdqu [r12 + 64], ymm2",
    "    vmovdqu [r12 + 96], ymm3",
    "    vmovdqu [r12 + 128], ymm4",
    "    vmovdqu [r12 + 160], ymm5",
    "    vmovdqu [r12 + 192], ymm6",
    "    vmovdqu [r12 + 224], ymm7",
    "    vmovdqu [r12 + 256], ymm8",
    "    vmovdqu [r12 + 288], ymm9",
    "    vmovdqu [r12 + 320], ymm10",
    "    vmovdqu [r12 + 352], ymm11",
    "    vmovdqu [r12 + 384], ymm12",
    "    vmovdqu [r12 + 416], ymm13",
    "    vmovdqu [r12 + 448], ymm14",
    "    vmovdqu [r12 + 480], ymm15",
    "    vzeroupper",
    "    pop r13",
    "    pop r12",
    "    ret",
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
    static probe_tf_pf: u8;
    static probe_tf_pf_end: u8;
    static probe_tf_int80: u8;
    static probe_tf_int80_end: u8;
    static probe_plain: u8;
    fn probe_avx_signal(buf: *mut u8);
    fn probe_avx_kept(buf: *mut u8, rounds: u64);
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
    /// What the probe itself says (`note`), NUL-terminated.
    note: [u8; 256],
    /// Set by the child once its handlers are in place: the parent's
    /// timers (`Then::Kill`, `Then::Usr1`) start from there.
    ready: u64,
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
/// Record single-step traps until [`STEP_END`].
const MODE_STEP: u64 = 2;
/// Where MODE_STEP clears TF: the first RIP at or past it.
static STEP_END: AtomicU64 = AtomicU64::new(0);
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
                if rip >= STEP_END.load(Ordering::Relaxed) || r.steps > 64 {
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
    let p = anon(ALT, libc::MAP_PRIVATE);
    // SAFETY: a fresh mapping, given to the kernel as the alternate signal
    // stack and never freed (the child exits).
    unsafe {
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

/// A fresh anonymous read-write mapping of `len` bytes (`flags`:
/// MAP_SHARED or MAP_PRIVATE), or MAP_FAILED.
fn anon(len: usize, flags: libc::c_int) -> *mut libc::c_void {
    // SAFETY: a new mapping where the kernel chooses; nothing else is
    // touched.
    unsafe {
        libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, flags | libc::MAP_ANONYMOUS, -1, 0)
    }
}

fn run(probe: &str, then: Then, body: impl FnOnce()) {
    // The report page, shared with the child.
    let page = anon(4096, libc::MAP_SHARED);
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
        // SAFETY: the report page, shared with the parent, written by the
        // child alone.
        unsafe { (*report()).ready = 1 };
        body();
        raw_exit(0);
    }
    // On a slow host a signal sent too soon would find the child's
    // default actions (signal 10 where SIGSEGV was meant).
    for _ in 0..30_000 {
        // SAFETY: the page is mapped; the child writes the word once.
        if unsafe { std::ptr::read_volatile(&(*(page as *const Report)).ready) } != 0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(1));
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
    let note = r.note.split(|&b| b == 0).next().unwrap_or(&[]);
    if !note.is_empty() {
        out += &format!("{} ", String::from_utf8_lossy(note));
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

/// In the child: single-steps the routine `f(rdi)`, which sets TF itself,
/// recording each trap's RIP until `end`.
fn step(f: *const u8, end: *const u8, rdi: u64) -> ! {
    STEP_END.store(addr(end), Ordering::Relaxed);
    MODE.store(MODE_STEP, Ordering::Relaxed);
    call(f, rdi, 0)
}

fn ptrace(req: libc::c_uint, pid: libc::pid_t, data: *mut libc::c_void) -> libc::c_long {
    // SAFETY: the requests used here read or write only the tracee and,
    // for GETREGS/SETREGS, the user_regs_struct `data` points to.
    unsafe { libc::ptrace(req, pid, std::ptr::null_mut::<libc::c_void>(), data) }
}

fn regs(pid: libc::pid_t) -> libc::user_regs_struct {
    // SAFETY: all-zero is a valid user_regs_struct.
    let mut r: libc::user_regs_struct = unsafe { std::mem::zeroed() };
    ptrace(libc::PTRACE_GETREGS, pid, (&raw mut r).cast());
    r
}

/// Resumes the tracee with `req`; Ok(the stop signal, with 0x80 for a
/// system-call stop) or Err(how it ended).
fn resume(pid: libc::pid_t, req: libc::c_uint) -> Result<i32, String> {
    ptrace(req, pid, std::ptr::null_mut());
    let mut status = 0;
    // SAFETY: waits for our own child.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    if libc::WIFEXITED(status) {
        Err(format!("exit {}", libc::WEXITSTATUS(status)))
    } else if libc::WIFSIGNALED(status) {
        Err(format!("signal {}", libc::WTERMSIG(status)))
    } else if libc::WIFSTOPPED(status) {
        Ok(libc::WSTOPSIG(status))
    } else {
        Err(format!("status {status:#x}"))
    }
}

/// Runs `body` in a child this process traces (PTRACE_TRACEME, then a
/// SIGSTOP); from that stop `tracer` runs it and says what it saw.
fn traced(probe: &str, body: impl FnOnce(), tracer: impl FnOnce(libc::pid_t) -> String) {
    // SAFETY: the program is single-threaded here; the child only runs
    // the probe and exits.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        ptrace(libc::PTRACE_TRACEME, 0, std::ptr::null_mut());
        // SAFETY: stops this process for its tracer.
        unsafe { libc::raise(libc::SIGSTOP) };
        body();
        raw_exit(0);
    }
    let mut status = 0;
    // SAFETY: waits for our own child.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    let out = if libc::WIFSTOPPED(status) && libc::WSTOPSIG(status) == libc::SIGSTOP {
        tracer(pid)
    } else {
        format!("no stop: status {status:#x}")
    };
    // SAFETY: ends and reaps our own child if the tracer left it.
    unsafe {
        libc::kill(pid, libc::SIGKILL);
        libc::waitpid(pid, &mut status, 0);
    }
    println!("probe {probe}: {out}");
}

/// From the tracee's SIGSTOP: RIP to probe_plain.
fn start_at_plain(pid: libc::pid_t) {
    let mut r = regs(pid);
    r.rip = addr(&raw const probe_plain);
    ptrace(libc::PTRACE_SETREGS, pid, (&raw mut r).cast());
}

/// The tracer of `ptrace-singlestep-syscall`: from the SIGSTOP, RIP to
/// probe_plain, then PTRACE_SINGLESTEP until the tracee ends.
fn singlestep_plain(pid: libc::pid_t) -> String {
    start_at_plain(pid);
    let mut rips = Vec::new();
    let end = loop {
        match resume(pid, libc::PTRACE_SINGLESTEP) {
            Err(end) => break end,
            Ok(libc::SIGTRAP) if rips.len() < 32 => rips.push(name(regs(pid).rip)),
            Ok(sig) => break format!("stop {sig}"),
        }
    };
    format!("steps {} [{}] {end}", rips.len(), rips.join(" "))
}

/// `offsetof(struct user, u_debugreg)` on x86-64: where PTRACE_POKEUSER
/// and PTRACE_PEEKUSER reach DR0..DR7.
const U_DEBUGREG: usize = 848;

/// A word the traced child of `ptrace-hw-watchpoint` writes.
static WATCHED: AtomicU64 = AtomicU64::new(0);

/// The tracers of `ptrace-hw-breakpoint` and `ptrace-hw-watchpoint`: from
/// the SIGSTOP, a breakpoint in DR0 enabled by `dr7`, at `target` (for an
/// execution breakpoint RIP moves to probe_plain first, whose `nop` after
/// the `syscall` is the target), then PTRACE_CONT: where the tracee stops,
/// DR6's B0..B3 as the tracer reads them, and how it ends when continued
/// again with the breakpoint still armed (an execution breakpoint must
/// not fire again: the kernel returns with RF set).
fn hw_breakpoint(pid: libc::pid_t, dr7: u64, target: u64, exec: bool) -> String {
    if exec {
        start_at_plain(pid);
    }
    let poke = |reg: usize, v: u64| {
        // SAFETY: writes one debug register of the tracee's.
        unsafe { libc::ptrace(libc::PTRACE_POKEUSER, pid, U_DEBUGREG + 8 * reg, v as usize) }
    };
    if poke(0, target) != 0 || poke(7, dr7) != 0 {
        return format!("refused errno {}", std::io::Error::last_os_error().raw_os_error().unwrap_or(0));
    }
    let mut out = String::new();
    for _ in 0..3 {
        match resume(pid, libc::PTRACE_CONT) {
            Err(end) => return out + &end,
            Ok(sig) => {
                // SAFETY: reads DR6 of the tracee's.
                let dr6 = unsafe {
                    libc::ptrace(libc::PTRACE_PEEKUSER, pid, U_DEBUGREG + 8 * 6, std::ptr::null_mut::<libc::c_void>())
                };
                out += &format!("stop {sig} rip {} dr6 {:#x}; ", name(regs(pid).rip), dr6 & 0xf);
            }
        }
    }
    out + "still stopping"
}

/// The tracer of `vdso-clock-syscalls`: PTRACE_SYSCALL to the end,
/// counting the entries to the clock system calls the vDSO serves.
fn count_clock_syscalls(pid: libc::pid_t) -> String {
    ptrace(libc::PTRACE_SETOPTIONS, pid, libc::PTRACE_O_TRACESYSGOOD as usize as *mut libc::c_void);
    let nrs = [libc::SYS_clock_gettime, libc::SYS_gettimeofday, libc::SYS_time, libc::SYS_getcpu];
    let mut stops = [0u64; 4];
    let end = loop {
        match resume(pid, libc::PTRACE_SYSCALL) {
            Err(end) => break end,
            Ok(0x85) => {
                let nr = regs(pid).orig_rax as i64;
                if let Some(i) = nrs.iter().position(|&n| n == nr) {
                    stops[i] += 1;
                }
            }
            Ok(sig) => break format!("stop {sig}"),
        }
    };
    // An entry and an exit stop for each call.
    format!(
        "clock_gettime {} gettimeofday {} time {} getcpu {} {end}",
        stops[0] / 2,
        stops[1] / 2,
        stops[2] / 2,
        stops[3] / 2
    )
}

fn clock_ns(clock: libc::clockid_t) -> i128 {
    let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: writes the timespec.
    unsafe { libc::clock_gettime(clock, &mut t) };
    t.tv_sec as i128 * 1_000_000_000 + t.tv_nsec as i128
}

/// In the child: spins for 200 ms of CLOCK_MONOTONIC; exit 0 if `clock`
/// (a CPU-time clock) advanced by at least a quarter of that (the rest
/// may be time the QEMU host gave to others), 1 if it did not advance,
/// 2 if it advanced less.
fn cputime(clock: libc::clockid_t) -> ! {
    let (t0, c0) = (clock_ns(libc::CLOCK_MONOTONIC), clock_ns(clock));
    while clock_ns(libc::CLOCK_MONOTONIC) - t0 < 200_000_000 {}
    let (t, c) = (clock_ns(libc::CLOCK_MONOTONIC) - t0, clock_ns(clock) - c0);
    raw_exit(if c >= t / 4 {
        0
    } else if c <= 0 {
        1
    } else {
        2
    })
}

/// In the child: CLOCK_MONOTONIC and the TSC never go back over 10000
/// reads each, and CLOCK_REALTIME, CLOCK_BOOTTIME and CLOCK_MONOTONIC
/// advance together (within 10 ms) over 50 ms: exit 0, else a bit for
/// each that failed (1 monotonic, 2 TSC, 4 together).
fn clocks_order() -> ! {
    let mut bad = 0;
    let mut last = clock_ns(libc::CLOCK_MONOTONIC);
    for _ in 0..10_000 {
        let t = clock_ns(libc::CLOCK_MONOTONIC);
        if t < last {
            bad |= 1;
        }
        last = t;
    }
    // SAFETY: rdtsc reads the time-stamp counter.
    let mut tsc = unsafe { core::arch::x86_64::_rdtsc() };
    for _ in 0..10_000 {
        // SAFETY: as above.
        let t = unsafe { core::arch::x86_64::_rdtsc() };
        if t < tsc {
            bad |= 2;
        }
        tsc = t;
    }
    let read = || [libc::CLOCK_MONOTONIC, libc::CLOCK_REALTIME, libc::CLOCK_BOOTTIME].map(clock_ns);
    let a = read();
    std::thread::sleep(Duration::from_millis(50));
    let b = read();
    let d: Vec<i128> = a.iter().zip(&b).map(|(x, y)| y - x).collect();
    if d.iter().any(|&x| x < 50_000_000 || (x - d[0]).abs() > 10_000_000) {
        bad |= 4;
    }
    raw_exit(bad)
}

/// In the child: says `text` in the probe's line.
fn note(text: &str) {
    // SAFETY: the report page is mapped shared for the child's life, and
    // only the child writes it.
    let r = unsafe { &mut *report() };
    let n = text.len().min(r.note.len() - 1);
    r.note[..n].copy_from_slice(&text.as_bytes()[..n]);
}

/// In the child, pinned to CPU 0: the CPU number by getcpu(2) and by
/// sched_getcpu(3) (glibc's, from rseq), and whether LSL of the per-CPU
/// segment the vDSO's getcpu reads where the CPU has no RDPID
/// (`__CPUNODE_SEG`, GDT entry 15) works. Its value is not shown: in the
/// guest it is the host CPU's number (Documentation/switcher.rst, "Host
/// CPU number"), which is not the guest's.
fn getcpu_pinned() {
    // SAFETY: a zeroed cpu_set_t is empty; CPU_SET and the system calls
    // only touch it and this process.
    let (sys, lib) = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(0, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
        libc::sched_yield();
        let mut cpu = 0u32;
        libc::syscall(libc::SYS_getcpu, &mut cpu, std::ptr::null_mut::<u32>(), 0usize);
        (cpu, libc::sched_getcpu())
    };
    let ok: u8;
    // SAFETY: LSL reads a descriptor's limit, or clears ZF; no memory.
    unsafe {
        core::arch::asm!("lsl {0:e}, {1:e}", "setz {2}", out(reg) _, in(reg) 0x7bu32, out(reg_byte) ok,
            options(nomem, nostack));
    }
    let lsl = if ok != 0 { "ok" } else { "refused" };
    note(&format!("syscall {sys} sched_getcpu {lib} lsl {lsl}"));
}

/// In the child: the AVX state across a signal. Exit 0, or a bit for each
/// that failed: 1 the frame has no extended state (FP_XSTATE_MAGIC1),
/// 2 its xfeatures lack x87, SSE or AVX, 4 YMM0's upper half is not in
/// the frame, 8 YMM0 changed across the handler, 16 YMM1's upper half is
/// not what the handler wrote into the frame, 32 no AVX.
fn avx_signal() -> ! {
    if !std::arch::is_x86_feature_detected!("avx") {
        raw_exit(32);
    }
    handle(libc::SIGUSR2, on_usr2 as *const () as usize, false);
    let mut buf = [0u8; 128];
    for (i, b) in buf[..64].iter_mut().enumerate() {
        *b = i as u8 + 1;
    }
    // SAFETY: the routine reads 64 bytes and writes 64 more of `buf`.
    unsafe { probe_avx_signal(buf.as_mut_ptr()) };
    let mut bad = AVX_FRAME.load(Ordering::Relaxed);
    if buf[64..96] != buf[..32] {
        bad |= 8;
    }
    let want: Vec<u8> = buf[32..48].iter().copied().chain((0..16).map(|i| 0xa0 + i)).collect();
    if buf[96..128] != want[..] {
        bad |= 16;
    }
    raw_exit(bad as i32)
}

/// What `on_usr2` found in the frame (avx_signal's bits 1, 2 and 4).
static AVX_FRAME: AtomicU64 = AtomicU64::new(0);

extern "C" fn on_usr2(_sig: libc::c_int, _info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // The user-space XSAVE layout: the software bytes at 464 of the
    // legacy area (magic1, extended_size, xfeatures), the header's
    // XSTATE_BV at 512, and the AVX upper halves at CPUID(0xd, 2).EBX
    // (576 on every CPU so far).
    let ymm = core::arch::x86_64::__cpuid_count(0xd, 2).ebx as usize;
    // SAFETY: the kernel passes a ucontext whose fpregs points to the
    // frame's XSAVE area, extended_size bytes long when magic1 is there;
    // only offsets below 576 + 32 are read or written, and only after
    // magic1 and an AVX bit in xfeatures say the area holds them.
    unsafe {
        let uc = &mut *(ctx as *mut libc::ucontext_t);
        let x = uc.uc_mcontext.fpregs as *mut u8;
        let mut bad = 0;
        let magic = (x.add(464) as *const u32).read_unaligned();
        let xfeatures = (x.add(472) as *const u64).read_unaligned();
        if magic != 0x4650_5853 {
            bad |= 1;
        } else if xfeatures & 7 != 7 || ymm < 576 {
            bad |= 2;
        } else {
            let bv = x.add(512) as *mut u64;
            let hi = std::slice::from_raw_parts_mut(x.add(ymm), 32);
            let want: Vec<u8> = (17..33).collect();
            if bv.read_unaligned() & 4 == 0 || hi[..16] != want[..] {
                bad |= 4;
            }
            for (i, b) in hi[16..].iter_mut().enumerate() {
                *b = 0xa0 + i as u8;
            }
            bv.write_unaligned(bv.read_unaligned() | 4);
        }
        AVX_FRAME.store(bad, Ordering::Relaxed);
    }
}

/// In the child: YMM2..YMM15 kept across 1000 system calls and yields and
/// 3 sleeps: exit 0, or N - 1 for the first register lost (YMMN), 0xff
/// without AVX.
fn avx_kept() -> ! {
    if !std::arch::is_x86_feature_detected!("avx") {
        raw_exit(0xff);
    }
    let mut buf = [0u8; 512];
    for (i, b) in buf[..32].iter_mut().enumerate() {
        *b = (i as u8).wrapping_mul(37).wrapping_add(11);
    }
    let ts = libc::timespec { tv_sec: 0, tv_nsec: 1_000_000 };
    // SAFETY: a timespec is plain data; the 16 bytes fit at 32..48.
    unsafe { std::ptr::write_unaligned(buf.as_mut_ptr().add(32) as *mut libc::timespec, ts) };
    // SAFETY: the routine reads buf[..48] and writes buf[64..512].
    unsafe { probe_avx_kept(buf.as_mut_ptr(), 1000) };
    let lane = |k: u64| -> [u8; 32] {
        let mut v = [0u8; 32];
        for q in 0..4 {
            let base = u64::from_le_bytes(buf[q * 8..q * 8 + 8].try_into().unwrap());
            v[q * 8..q * 8 + 8].copy_from_slice(&base.wrapping_mul(k).to_le_bytes());
        }
        v
    };
    let mut lost = 0u32;
    for r in 0..14 {
        if buf[64 + 32 * r..96 + 32 * r] != lane(r as u64 + 1) {
            lost |= 1 << r;
        }
    }
    raw_exit(if lost == 0 { 0 } else { 1 + (lost.trailing_zeros() as i32) })
}

/// In the child: a system call's result as the exit status: 0, or its
/// errno; then, if it worked, `then` (which may fault into the handlers).
fn syscall_then(r: libc::c_long, then: impl FnOnce()) -> ! {
    if r < 0 {
        raw_exit(std::io::Error::last_os_error().raw_os_error().unwrap_or(255));
    }
    then();
    raw_exit(0)
}

/// `inb` from port 0x80 (the POST port: reads nothing anywhere).
fn inb_80() {
    // SAFETY: a read of the POST port, allowed by iopl/ioperm first; a
    // #GP otherwise, which the handlers report.
    unsafe { core::arch::asm!("in al, 0x80", out("al") _, options(nomem, nostack)) };
}

/// In the traced child: 100 of each clock call the vDSO serves.
fn clock_calls() {
    for _ in 0..100 {
        let mut tv = libc::timeval { tv_sec: 0, tv_usec: 0 };
        // SAFETY: each writes only its argument.
        unsafe {
            clock_ns(libc::CLOCK_MONOTONIC);
            clock_ns(libc::CLOCK_REALTIME);
            libc::gettimeofday(&mut tv, std::ptr::null_mut());
            libc::time(std::ptr::null_mut());
            libc::sched_getcpu();
        }
    }
}

/// In the child: the auxiliary vector's CPU facts. AT_HWCAP is the
/// kernel's CPUID.1:EDX, less the bits the guest kernel hides by design
/// (MCE, APIC, MTRR, MCA, PAT, DS, ACPI, TM, PBE: a ring-3 kernel cannot
/// use them; `mask_cpuid` in guest/linux/arch/x86/lguest/lguest.rs),
/// which this leaves out on both sides.
fn auxv() {
    let hidden: u64 = [7, 9, 12, 14, 16, 21, 22, 29, 31].iter().fold(0, |m, b| m | 1 << b);
    // SAFETY: getauxval has no preconditions.
    let v = |t| unsafe { libc::getauxval(t) };
    note(&format!(
        "hwcap {:#x} hwcap2 {:#x} clktck {} pagesz {} vdso {}",
        v(libc::AT_HWCAP) & !hidden,
        v(libc::AT_HWCAP2),
        v(libc::AT_CLKTCK),
        v(libc::AT_PAGESZ),
        if v(libc::AT_SYSINFO_EHDR) != 0 { "mapped" } else { "none" }
    ));
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
    run("tf-across-syscall", Then::Wait, || step(tf, &raw const probe_tf_end, 0));
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
    // Single-stepping across a page fault the kernel resolves, and across
    // `int $0x80` (the 32-bit system call, where the kernel has it).
    run("tf-across-pagefault", Then::Wait, || {
        // A fresh page, not touched before the probe.
        let page = anon(4096, libc::MAP_PRIVATE);
        step(&raw const probe_tf_pf, &raw const probe_tf_pf_end, page as u64)
    });
    run("tf-across-int80", Then::Wait, || step(&raw const probe_tf_int80, &raw const probe_tf_int80_end, 0));
    // A tracer's view: PTRACE_SINGLESTEP across `syscall`, and which clock
    // calls reach the kernel (none where the vDSO answers them).
    traced("ptrace-singlestep-syscall", || {}, singlestep_plain);
    traced("vdso-clock-syscalls", clock_calls, count_clock_syscalls);
    // Hardware breakpoints by ptrace: on the instruction after a
    // `syscall`, and a watch of writes to an 8-byte word.
    traced("ptrace-hw-breakpoint", || {}, |pid| hw_breakpoint(pid, 1, addr(&raw const probe_plain) + 7, true));
    traced(
        "ptrace-hw-watchpoint",
        || WATCHED.store(7, Ordering::Relaxed),
        |pid| hw_breakpoint(pid, 1 | 1 << 16 | 2 << 18, (&raw const WATCHED) as u64, false),
    );
    // The clocks: order, resolution, CPU time, the CPU number.
    run("clocks-order", Then::Wait, || clocks_order());
    // (Not the coarse clocks': theirs is the tick, 1/HZ, a build option of
    // each kernel, 4 ms in the guest and on Debian's, 1 ms on the QEMU
    // host's small kernels.)
    run("clock-res", Then::Wait, || {
        let res = [libc::CLOCK_MONOTONIC, libc::CLOCK_REALTIME, libc::CLOCK_BOOTTIME].map(|c| {
            let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
            // SAFETY: writes the timespec.
            unsafe { libc::clock_getres(c, &mut t) };
            t.tv_sec * 1_000_000_000 + t.tv_nsec
        });
        note(&format!("monotonic {} realtime {} boottime {}", res[0], res[1], res[2]));
    });
    run("cputime-process", Then::Wait, || cputime(libc::CLOCK_PROCESS_CPUTIME_ID));
    run("cputime-thread", Then::Wait, || cputime(libc::CLOCK_THREAD_CPUTIME_ID));
    run("getcpu-pinned", Then::Wait, getcpu_pinned);
    // What the kernel tells a program about the CPU, and what CPUID says
    // in user mode.
    run("auxv", Then::Wait, auxv);
    // The signal frame's size as the kernel gives it (AT_MINSIGSTKSZ): its
    // XSAVE features' size, plus the rest of the frame.
    run("minsigstksz", Then::Wait, || {
        // SAFETY: getauxval has no preconditions.
        note(&format!("{}", unsafe { libc::getauxval(51) }))
    });
    run("cpuid", Then::Wait, || {
        let (l1, l7) = (core::arch::x86_64::__cpuid(1), core::arch::x86_64::__cpuid_count(7, 0));
        note(&format!(
            "1: {:#x} {:#x} {:#x} {:#x} 7: {:#x} {:#x} {:#x}",
            l1.eax,
            l1.ebx & 0x00ff_ffff,
            l1.ecx,
            l1.edx,
            l7.ebx,
            l7.ecx,
            l7.edx
        ));
    });
    // The AVX state in a signal frame and across system calls, yields and
    // sleeps.
    run("avx-signal-frame", Then::Wait, || avx_signal());
    run("avx-kept", Then::Wait, || avx_kept());
    // The vsyscall page: execute-only emulation where the kernel has it.
    run("vsyscall-time", Then::Wait, || {
        // SAFETY: the legacy vsyscall time(NULL) entry; where the kernel
        // does not emulate it the fetch faults into the handlers.
        let t = unsafe {
            let f: extern "C" fn(*mut i64) -> i64 = std::mem::transmute(0xffff_ffff_ff60_0400usize);
            f(std::ptr::null_mut())
        };
        raw_exit(if t > 1_600_000_000 { 0 } else { 1 })
    });
    run("vsyscall-read", Then::Wait, || {
        // SAFETY: a read of the vsyscall page: a fault where it is not
        // readable, which the handlers report.
        let b = unsafe { std::ptr::read_volatile(0xffff_ffff_ff60_0000usize as *const u8) };
        raw_exit(i32::from(b != 0))
    });
    // Port I/O and the LDT, as root.
    run("iopl-3", Then::Wait, || {
        // SAFETY: changes only this process's I/O privilege.
        let r = unsafe { libc::syscall(libc::SYS_iopl, 3) };
        syscall_then(r, inb_80)
    });
    run("ioperm-0x80", Then::Wait, || {
        // SAFETY: changes only this process's I/O permissions.
        let r = unsafe { libc::ioperm(0x80, 1, 1) };
        syscall_then(r.into(), inb_80)
    });
    run("modify-ldt-read", Then::Wait, || {
        let mut buf = [0u8; 64];
        // SAFETY: reads at most 64 bytes of the LDT into buf.
        let n = unsafe { libc::syscall(libc::SYS_modify_ldt, 0, buf.as_mut_ptr(), buf.len()) };
        syscall_then(n, || note(&format!("read {n}")))
    });
    run("modify-ldt-load", Then::Wait, || {
        // struct user_desc: entry 0, base 0, limit 0xfffff pages, a 32-bit
        // writable data segment (seg_32bit, limit_in_pages, useable).
        let desc: [u32; 4] = [0, 0, 0xfffff, 0x51];
        // SAFETY: writes one LDT entry of this process from `desc`.
        let r = unsafe { libc::syscall(libc::SYS_modify_ldt, 0x11, desc.as_ptr(), 16) };
        syscall_then(r, || {
            let sel: u16;
            // SAFETY: GS (whose base no Rust code here uses) takes the LDT
            // selector 0x7, or the load faults into the handlers.
            unsafe {
                core::arch::asm!("mov ax, 7", "mov gs, ax", "mov ax, gs", out("ax") sel, options(nomem, nostack))
            };
            note(&format!("gs {sel:#x}"));
        })
    });
    println!("probe done");
}
