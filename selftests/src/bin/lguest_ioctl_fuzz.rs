// SPDX-License-Identifier: GPL-2.0
//! A seeded, reproducible fuzzer of the `/dev/lguest` API (KTAP).
//!
//! - `single_thread`: random sequences of open, close and dup of
//!   `/dev/lguest`; every lguest ioctl with random and edge-case arguments
//!   (null, tiny, unaligned, read-only, kernel, non-canonical and
//!   half-mapped pointers; configs with unaligned or huge sizes, entries
//!   outside RAM, reserved words set); random unknown commands; mmap,
//!   munmap, mprotect and mremap of the run page with random lengths,
//!   offsets, protections and flags (also MAP_FIXED into guest RAM);
//!   read and write; eventfds, irqfds and ioeventfds (bound before and
//!   after CREATE_VM, to addresses in the device window, MSG, 0, 2^47 - 1,
//!   2^47 and beyond); guest RAM holding random code and random
//!   hypercalls, unmapped, replaced or made read-only under live VMs;
//!   fork, with a child that creates a VM on an inherited file and exits.
//!   RUN is kicked out of a guest that spins by a watchdog thread.
//!   Every result is checked against a model of the documented ABI
//!   (Documentation/api.rst): an errno outside the set documented for the
//!   call, or other than the one the model predicts, fails the test.
//! - `four_threads_one_vm`: six rounds in which four threads share one VM,
//!   each through its own `dup` of the file (the original is closed): A
//!   loops RUN, B GET/SET_REGS (and CREATE_VM/CREATE_VCPU, refused; now and
//!   then RIP back at the guest's NOTIFY of MSG), C raises interrupts,
//!   binds, unbinds and signals irqfds and binds and unbinds ioeventfds (MSG
//!   among them, so that B's NOTIFYs race the binding), D kicks A with
//!   SIGUSR1 every ~0.2 ms (half the rounds through immediate_exit too) and
//!   maps and unmaps the run page. While A runs, B unmaps guest RAM (the
//!   guest must not die of it: the host reaches its lguest_data through the
//!   pinned pages) or replaces it, or points RIP at zeroes; C may replace A's
//!   and B's descriptors with an eventfd (`dup2`, so that no number
//!   dangles), so that the file's last references go away inside a RUN; and
//!   the threads close their descriptors in whatever order they finish, so
//!   that any of them may destroy the VM.
//! - `ioeventfd_notify`: LGUEST_IOEVENTFD's errors one by one; then the
//!   guest's NOTIFY of MSG with MSG bound (no exit, RUN only ends at the
//!   watchdog's signal, the eventfd counts 1), unbound (the NOTIFY exit,
//!   the eventfd stays at 0), bound by another thread during RUN, and bound
//!   to an eventfd whose descriptor was then closed.
//! - `host_alive`: the device still answers, a fresh tiny guest still runs,
//!   the kernel's taint flags gained no oops/warning/lockup bit, and the
//!   program made at least 100000 calls.
//!
//! `LGUEST_FUZZ_SEED=N` (decimal or 0x-hex, or `random`) chooses the seed,
//! printed as `# seed N`; in the QEMU harness pass it as a kernel argument,
//! `KARGS=LGUEST_FUZZ_SEED=N`, which the kernel hands to /init's
//! environment. `LGUEST_FUZZ_SCALE=X` multiplies the number of operations.
//! `LGUEST_SMOKE=1` (the short run every `make test` makes) means a tenth
//! of the operations and, unless a seed is given, a random one.
//! `LGUEST_FUZZ_TRACE=1` writes every single-thread operation to /dev/kmsg
//! (at KERN_NOTICE, so that the console shows it) before making it, so that
//! a kernel report in the console log comes with the operations that led to
//! it; add `printk.devkmsg=on` to the kernel arguments, or printk's rate
//! limit drops most lines: `KARGS="printk.devkmsg=on LGUEST_FUZZ_TRACE=1"`.

use std::collections::{BTreeMap, VecDeque};
use std::ffi::CStr;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, Ordering::SeqCst};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use lguest_abi as abi;
use lguest_selftests::{self as t, check, check_eq, fail, Mapping, TestResult};
use libc::{
    E2BIG, EACCES, EAGAIN, EBADF, EBUSY, EEXIST, EFAULT, EINTR, EINVAL, ENOENT, ENOMEM, ENOSPC, ENOTTY, EOPNOTSUPP,
    EOVERFLOW, EPERM,
};

const PAGE: u64 = 4096;
const MIB: u64 = 1 << 20;
/// The top of the lower half: RIP, RSP and guest RAM must stay below it.
const TOP: u64 = 1 << 47;
const CODE: u64 = 0x10_0000;
const DATA: u64 = 0x18_0000;
const MSG: u64 = 0x18_1000;
const DEFAULT_SEED: u64 = 0x6c67_7565_7374_2d72; // "lguest-r"

/// Addresses no user pointer may reach: the direct map (4- and 5-level),
/// kernel text, the vsyscall page, the top, non-canonical ones.
const KERNEL_ADDRS: [u64; 7] = [
    0xffff_8880_0000_0000,
    0xff11_0000_0000_0000,
    0xffff_ffff_8100_0000,
    0xffff_ffff_ff60_0000,
    u64::MAX - 7,
    0x8000_0000_0000_0000,
    0x0000_8000_0000_0000,
];

/// The lguest ioctls.
const LGUEST_CMDS: [u32; 10] = [
    abi::LGUEST_GET_API_VERSION,
    abi::LGUEST_CREATE_VM,
    abi::LGUEST_CREATE_VCPU,
    abi::LGUEST_RUN,
    abi::LGUEST_GET_REGS,
    abi::LGUEST_SET_REGS,
    abi::LGUEST_IRQ,
    abi::LGUEST_IRQFD,
    abi::LGUEST_IOEVENTFD,
    abi::LGUEST_SET_CPUID,
];

/// ioctl type bytes that the VFS answers itself for every file (FIGETBSZ,
/// the FS_IOC_GETFSUUID family, FIONBIO and friends, FIFREEZE, the 'f'
/// flags ioctls, FICLONE): never sent as "unknown" commands.
const VFS_TYPES: [u32; 6] = [0x00, 0x15, 0x54, 0x58, 0x66, 0x94];

use lguest_selftests::GUEST_OK;

/// INIT(DATA); NOTIFY(MSG, 0); jmp . (at CODE + 26): after its first RUN
/// (which returns the NOTIFY) a guest that spins without exits of its own,
/// with its lguest_data registered.
const GUEST_SPIN: &[u8] = &[
    0xb8, 0x01, 0x00, 0x00, 0x00, // mov $1, %eax        LGUEST_INIT
    0xbf, 0x00, 0x00, 0x18, 0x00, // mov $0x180000, %edi
    0xcd, 0x1f, //                   int $0x1f
    0xb8, 0x11, 0x00, 0x00, 0x00, // mov $17, %eax       NOTIFY
    0xbf, 0x00, 0x10, 0x18, 0x00, // mov $0x181000, %edi
    0x31, 0xf6, //                   xor %esi, %esi
    0xcd, 0x1f, //                   int $0x1f
    0xeb, 0xfe, //                   jmp .
];
const SPIN_JMP: u64 = CODE + 26;
/// GUEST_SPIN's NOTIFY(MSG, 0), then its `jmp .`.
const SPIN_NOTIFY: u64 = CODE + 12;

// ---------------------------------------------------------------------------
// Seeds, the PRNG, statistics.
// ---------------------------------------------------------------------------

/// splitmix64: small, fast, and every seed gives a good stream.
#[derive(Clone)]
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        lguest_splitmix::next(&mut self.0)
    }

    /// Uniform in `[0, n)` (0 when `n` is 0).
    fn below(&mut self, n: u64) -> u64 {
        lguest_splitmix::below(self.next(), n)
    }

    /// Uniform in `[lo, hi)`; `lo` if the range is empty.
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi.saturating_sub(lo))
    }

    fn one_in(&mut self, n: u64) -> bool {
        self.below(n) == 0
    }

    fn pick<T: Copy>(&mut self, xs: &[T]) -> T {
        xs[self.below(xs.len() as u64) as usize]
    }

    /// A 64-bit value that is often an edge case.
    fn edge(&mut self) -> u64 {
        match self.below(16) {
            0 => 0,
            1 => 1,
            2 => u64::MAX,
            3 => TOP,
            4 => TOP - 1,
            5 => 1 << 63,
            6 => u32::MAX as u64,
            7 => 1 << 32,
            8 => self.pick(&KERNEL_ADDRS),
            9 => self.below(64),
            10 => CODE + self.below(4 * MIB),
            11 => self.next() & !(PAGE - 1),
            _ => self.next(),
        }
    }

    /// One of `xs`, or now and then an edge value.
    fn pick_or_edge(&mut self, xs: &[u64]) -> u64 {
        let i = self.below(xs.len() as u64 + 1) as usize;
        if i == xs.len() {
            self.edge()
        } else {
            xs[i]
        }
    }

    fn fill(&mut self, buf: &mut [u8]) {
        for chunk in buf.chunks_mut(8) {
            let v = self.next().to_le_bytes();
            chunk.copy_from_slice(&v[..chunk.len()]);
        }
    }
}

/// The base seed: `$LGUEST_FUZZ_SEED` or the fixed default.
fn base_seed() -> u64 {
    static SEED: AtomicU64 = AtomicU64::new(0);
    static SET: AtomicBool = AtomicBool::new(false);
    if SET.load(SeqCst) {
        return SEED.load(SeqCst);
    }
    // The short run of every `make test` (LGUEST_SMOKE=1) takes a new seed
    // each time (printed), so that CI meets new streams.
    let var = std::env::var("LGUEST_FUZZ_SEED").or_else(|e| if smoke() { Ok("random".into()) } else { Err(e) });
    let s = match var {
        Ok(v) if v == "random" => {
            let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
            // SAFETY: `ts` is a valid timespec to fill in.
            unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut ts) };
            Rng(ts.tv_sec as u64 ^ ((ts.tv_nsec as u64) << 20)).next()
        }
        Ok(v) => {
            let v = v.trim();
            let parsed = match v.strip_prefix("0x") {
                Some(h) => u64::from_str_radix(h, 16).ok(),
                None => v.parse().ok(),
            };
            parsed.unwrap_or(DEFAULT_SEED)
        }
        Err(_) => DEFAULT_SEED,
    };
    SEED.store(s, SeqCst);
    SET.store(true, SeqCst);
    s
}

/// The seed of one test (or thread): the base seed mixed with a name, so
/// that a test run alone sees the same stream as in the whole program.
fn seed_for(name: &str, n: u64) -> u64 {
    let mut h = base_seed() ^ n.wrapping_mul(0x2545_f491_4f6c_dd1d);
    for b in name.bytes() {
        h = Rng(h ^ b as u64).next();
    }
    h
}

/// The short run of `make test` (`LGUEST_SMOKE=1`): a tenth of the work.
fn smoke() -> bool {
    std::env::var("LGUEST_SMOKE").is_ok_and(|v| v == "1")
}

/// `$LGUEST_FUZZ_SCALE` (default 1, or 0.1 in the short run).
fn scale() -> f64 {
    std::env::var("LGUEST_FUZZ_SCALE")
        .ok()
        .and_then(|v| v.parse::<f64>().ok())
        .filter(|s| *s > 0.0)
        .unwrap_or(if smoke() { 0.1 } else { 1.0 })
}

fn scaled(n: u64) -> u64 {
    ((n as f64) * scale()).max(1.0) as u64
}

/// Outcome of a call: 0 for success, else the errno.
type Code = i32;

/// A set of outcomes: bit 0 success, bit e errno e (127: any errno >= 127).
type Ex = u128;

const fn b(code: Code) -> Ex {
    let c = if code < 0 || code > 127 { 127 } else { code };
    1u128 << c
}
const OK: Ex = 1;
const ANY: Ex = u128::MAX;

fn code_of<T>(r: &Result<T, i32>) -> Code {
    match r {
        Ok(_) => 0,
        Err(e) => *e,
    }
}

fn ename(code: Code) -> String {
    let s = match code {
        0 => "ok",
        EPERM => "EPERM",
        E2BIG => "E2BIG",
        ENOENT => "ENOENT",
        libc::ESRCH => "ESRCH",
        EINTR => "EINTR",
        EBADF => "EBADF",
        EAGAIN => "EAGAIN",
        ENOMEM => "ENOMEM",
        EACCES => "EACCES",
        EFAULT => "EFAULT",
        EBUSY => "EBUSY",
        EEXIST => "EEXIST",
        libc::ENODEV => "ENODEV",
        EINVAL => "EINVAL",
        ENOTTY => "ENOTTY",
        ENOSPC => "ENOSPC",
        EOVERFLOW => "EOVERFLOW",
        EOPNOTSUPP => "EOPNOTSUPP",
        _ => return format!("errno {code}"),
    };
    s.to_string()
}

fn describe(ex: Ex) -> String {
    if ex == ANY {
        return "anything".into();
    }
    (0..128).filter(|i| ex & (1u128 << i) != 0).map(ename).collect::<Vec<_>>().join("|")
}

/// What a call was, for statistics and the documented error sets.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Call {
    Version,
    CreateVm,
    CreateVcpu,
    Run,
    GetRegs,
    SetRegs,
    Irq,
    Irqfd,
    Ioeventfd,
    SetCpuid,
    Unknown,
    Open,
    Close,
    Dup,
    Mmap,
    Munmap,
    Mprotect,
    Mremap,
    Read,
    Write,
    Eventfd,
    EfdSignal,
    EfdRead,
    Memory,
    Fork,
    Yank,
    Signal,
}

impl Call {
    fn name(self) -> &'static str {
        match self {
            Call::Version => "GET_API_VERSION",
            Call::CreateVm => "CREATE_VM",
            Call::CreateVcpu => "CREATE_VCPU",
            Call::Run => "RUN",
            Call::GetRegs => "GET_REGS",
            Call::SetRegs => "SET_REGS",
            Call::Irq => "IRQ",
            Call::Irqfd => "IRQFD",
            Call::Ioeventfd => "IOEVENTFD",
            Call::SetCpuid => "SET_CPUID",
            Call::Unknown => "unknown ioctl",
            Call::Open => "open",
            Call::Close => "close",
            Call::Dup => "dup",
            Call::Mmap => "mmap",
            Call::Munmap => "munmap",
            Call::Mprotect => "mprotect",
            Call::Mremap => "mremap",
            Call::Read => "read",
            Call::Write => "write",
            Call::Eventfd => "eventfd",
            Call::EfdSignal => "eventfd write",
            Call::EfdRead => "eventfd read",
            Call::Memory => "guest memory (mmap/munmap/mprotect/madvise)",
            Call::Fork => "fork/wait",
            Call::Yank => "dup2 over another thread's fd",
            Call::Signal => "SIGUSR1 kick",
        }
    }

    fn is_ioctl(self) -> bool {
        self <= Call::Unknown
    }

    /// The outcomes Documentation/api.rst allows (for the lguest calls).
    fn documented(self) -> Ex {
        match self {
            Call::Version => OK,
            // (other): whatever pin_user_pages_fast() reports.
            Call::CreateVm => OK | b(EFAULT) | b(EEXIST) | b(EINVAL) | b(ENOMEM) | b(EAGAIN) | b(EBUSY),
            Call::CreateVcpu => OK | b(ENOENT) | b(EBUSY) | b(ENOMEM),
            Call::Run => OK | b(ENOENT) | b(EINVAL) | b(EPERM) | b(EINTR) | b(ENOMEM) | b(EBUSY),
            // EBUSY: a RUN on another thread had the guest running.
            Call::GetRegs | Call::SetRegs => OK | b(EFAULT) | b(EINVAL) | b(ENOENT) | b(EBUSY),
            Call::Irq => OK | b(EINVAL),
            Call::Irqfd | Call::Ioeventfd => {
                OK | b(EFAULT) | b(EINVAL) | b(EBADF) | b(EEXIST) | b(ENOSPC) | b(ENOENT) | b(ENOMEM)
            }
            Call::SetCpuid => OK | b(EFAULT) | b(E2BIG) | b(EINVAL) | b(ENOENT) | b(EBUSY) | b(ENOMEM),
            Call::Unknown => b(ENOTTY),
            Call::Mmap => OK | b(EINVAL) | b(ENOENT) | b(ENOMEM) | b(EPERM) | b(EACCES) | b(EOVERFLOW) | b(EOPNOTSUPP),
            Call::Read | Call::Write => b(EINVAL),
            _ => ANY,
        }
    }
}

/// Counts of calls and outcomes.
#[derive(Default)]
struct Stats {
    calls: u64,
    ioctls: u64,
    outcomes: BTreeMap<(Call, Code), u64>,
}

impl Stats {
    fn note(&mut self, call: Call, code: Code) {
        self.calls += 1;
        if call.is_ioctl() {
            self.ioctls += 1;
        }
        *self.outcomes.entry((call, code)).or_default() += 1;
    }

    fn merge(&mut self, o: &Stats) {
        self.calls += o.calls;
        self.ioctls += o.ioctls;
        for (k, v) in &o.outcomes {
            *self.outcomes.entry(*k).or_default() += v;
        }
    }

    fn print(&self) {
        let mut by: BTreeMap<Call, Vec<String>> = BTreeMap::new();
        for ((c, code), n) in &self.outcomes {
            by.entry(*c).or_default().push(format!("{} {n}", ename(*code)));
        }
        for (c, v) in by {
            println!("# {}: {}", c.name(), v.join(", "));
        }
    }
}

static TOTAL_CALLS: AtomicU64 = AtomicU64::new(0);
static TOTAL_IOCTLS: AtomicU64 = AtomicU64::new(0);
static RAN_SINGLE: AtomicBool = AtomicBool::new(false);
static RAN_FOUR: AtomicBool = AtomicBool::new(false);
static TAINT_AT_START: AtomicU64 = AtomicU64::new(0);
static MEMFREE_AT_START: AtomicU64 = AtomicU64::new(0);

fn account(st: &Stats) {
    TOTAL_CALLS.fetch_add(st.calls, SeqCst);
    TOTAL_IOCTLS.fetch_add(st.ioctls, SeqCst);
}

// ---------------------------------------------------------------------------
// Raw system calls: the fuzzer passes arbitrary values, so it uses libc
// directly and gets `Ok(value)` or `Err(errno)`.
// ---------------------------------------------------------------------------

fn sysret(r: i64) -> Result<i64, i32> {
    if r < 0 {
        Err(t::errno())
    } else {
        Ok(r)
    }
}

fn ioctl_raw(fd: i32, cmd: u32, arg: u64) -> Result<i64, i32> {
    // SAFETY: Pointer arguments either point into memory this program owns
    // and sized for the command, or are meant to be invalid (kernel,
    // non-canonical, unmapped, PROT_NONE, read-only), which the kernel must
    // refuse; never at memory Rust uses for anything else.
    sysret(unsafe { libc::ioctl(fd, cmd as _, arg as usize) } as i64)
}

fn mmap_raw(addr: u64, len: u64, prot: i32, flags: i32, fd: i32, off: u64) -> Result<u64, i32> {
    // SAFETY: MAP_FIXED is only used on ranges this program mapped for the
    // fuzzer's own use (guest RAM), which no Rust reference points into.
    let p = unsafe { libc::mmap(addr as *mut libc::c_void, len as usize, prot, flags, fd, off as i64) };
    if p == libc::MAP_FAILED {
        Err(t::errno())
    } else {
        Ok(p as u64)
    }
}

fn munmap_raw(addr: u64, len: u64) -> Result<i64, i32> {
    // SAFETY: Only ranges the fuzzer mapped itself are unmapped.
    sysret(unsafe { libc::munmap(addr as *mut libc::c_void, len as usize) } as i64)
}

fn mprotect_raw(addr: u64, len: u64, prot: i32) -> Result<i64, i32> {
    // SAFETY: Only ranges the fuzzer mapped itself, which Rust does not use.
    sysret(unsafe { libc::mprotect(addr as *mut libc::c_void, len as usize, prot) } as i64)
}

fn close_raw(fd: i32) -> Result<i64, i32> {
    // SAFETY: Closing a descriptor this program opened and no longer uses.
    sysret(unsafe { libc::close(fd) } as i64)
}

fn dup_raw(fd: i32) -> Result<i64, i32> {
    // SAFETY: dup has no memory effects.
    sysret(unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) } as i64)
}

fn eventfd_raw() -> Result<i64, i32> {
    // SAFETY: Creates a new descriptor; no memory effects.
    sysret(unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) } as i64)
}

fn efd_write(fd: i32, v: u64) -> Result<i64, i32> {
    let buf = v.to_ne_bytes();
    // SAFETY: Writes 8 bytes from a valid buffer.
    sysret(unsafe { libc::write(fd, buf.as_ptr().cast(), 8) } as i64)
}

fn efd_read(fd: i32) -> Result<i64, i32> {
    let mut buf = [0u8; 8];
    // SAFETY: Reads at most 8 bytes into a valid buffer.
    sysret(unsafe { libc::read(fd, buf.as_mut_ptr().cast(), 8) } as i64)
}

fn open_lguest() -> Result<i64, i32> {
    let path: &CStr = c"/dev/lguest";
    // SAFETY: A NUL-terminated path.
    sysret(unsafe { libc::open(path.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) } as i64)
}

fn pthread_self_u64() -> u64 {
    // SAFETY: No preconditions.
    unsafe { libc::pthread_self() as u64 }
}

fn kick(thread: u64) -> Result<i64, i32> {
    // SAFETY: `thread` is a live (not yet joined) thread of this process.
    let r = unsafe { libc::pthread_kill(thread as libc::pthread_t, libc::SIGUSR1) };
    if r == 0 {
        Ok(0)
    } else {
        Err(r)
    }
}

/// Copies `data` to address `addr` of memory the fuzzer mapped read-write.
fn poke(addr: u64, data: &[u8]) {
    // SAFETY: Callers only pass ranges of guest RAM they mapped read-write
    // and have not unmapped or protected since (a "clean" slot).
    unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), addr as *mut u8, data.len()) };
}

// ---------------------------------------------------------------------------
// SIGUSR1: the kick. The handler only sets immediate_exit when a run page
// is registered (four_threads_one_vm); otherwise its only effect is that a
// RUN in progress returns EINTR (no SA_RESTART).
// ---------------------------------------------------------------------------

static KICK_BYTE: AtomicPtr<u8> = AtomicPtr::new(std::ptr::null_mut());
static SIGNALS_TAKEN: AtomicU64 = AtomicU64::new(0);

extern "C" fn on_sigusr1(_sig: i32) {
    SIGNALS_TAKEN.fetch_add(1, SeqCst);
    let p = KICK_BYTE.load(SeqCst);
    if !p.is_null() {
        // SAFETY: `p` is the immediate_exit byte of a run page that stays
        // mapped until KICK_BYTE is cleared, after the kicking threads have
        // been joined; a volatile byte store is async-signal-safe.
        unsafe { p.write_volatile(1) };
    }
}

extern "C" fn on_sigalrm(_sig: i32) {}

fn install(sig: i32, handler: extern "C" fn(i32)) {
    // SAFETY: Installs a handler that is async-signal-safe; no SA_RESTART,
    // so that RUN returns EINTR.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = handler as *const () as usize;
        sa.sa_flags = 0;
        libc::sigaction(sig, &sa, std::ptr::null_mut());
    }
}

// ---------------------------------------------------------------------------
// Guest code: random hypercalls with edge-case arguments, then junk.
// ---------------------------------------------------------------------------

/// `movabs $imm, %reg` for rax, rcx, rdx, rbx, rsp, rbp, rsi, rdi, and r10
/// (reg 10).
fn movabs(code: &mut Vec<u8>, reg: u8, imm: u64) {
    if reg >= 8 {
        code.extend_from_slice(&[0x49, 0xb8 + (reg - 8)]);
    } else {
        code.extend_from_slice(&[0x48, 0xb8 + reg]);
    }
    code.extend_from_slice(&imm.to_le_bytes());
}

/// A hypercall argument: often an address in or at the edge of guest RAM.
fn guest_arg(rng: &mut Rng, mem: u64) -> u64 {
    match rng.below(10) {
        0 => 0,
        1 => DATA,
        2 => MSG,
        3 => rng.range(CODE, mem),
        4 => mem - rng.below(16),
        5 => rng.below(300),
        6 => CODE + rng.below(0x200),
        _ => rng.edge(),
    }
}

/// The device window of the fuzzer's usual 4 MiB guests.
const DEV_WINDOW: u64 = 4 * MIB;

/// An LGUEST_IOEVENTFD address: often MSG (the address the fuzzer's guests
/// notify) or one of 40 in the device window (more than
/// LGUEST_MAX_IOEVENTFDS, few enough to hit EEXIST and ENOSPC), sometimes
/// at or beyond the 2^47 limit.
fn notify_addr(rng: &mut Rng) -> u64 {
    match rng.below(100) {
        0..=14 => MSG,
        15..=19 => 0,
        20..=24 => DATA,
        25..=74 => DEV_WINDOW + PAGE * rng.below(4) + 0x40 * rng.below(10),
        75..=79 => TOP,
        80..=84 => TOP - 1,
        85..=87 => u64::MAX,
        88..=89 => 1 << 63,
        _ => rng.edge(),
    }
}

/// Random code for a guest with `mem` bytes of RAM: usually LGUEST_INIT,
/// then a few hypercalls with random arguments, maybe a stack switch, then
/// random bytes (which fault: the guest dies) or, rarely, a spin.
fn guest_code(rng: &mut Rng, mem: u64) -> Vec<u8> {
    let mut code = Vec::with_capacity(256);
    if rng.one_in(3) {
        let e = rng.edge();
        movabs(&mut code, 4, rng.pick(&[DATA + PAGE, mem - 8, e]));
    }
    if !rng.one_in(5) {
        movabs(&mut code, 0, abi::LHCALL_LGUEST_INIT);
        movabs(&mut code, 7, if rng.one_in(6) { guest_arg(rng, mem) } else { DATA });
        code.extend_from_slice(&[0xcd, 0x1f]);
    }
    for _ in 0..rng.below(6) {
        let nr = match rng.below(20) {
            0..=2 => abi::LHCALL_NOTIFY,
            3 => abi::LHCALL_SHUTDOWN,
            4..=5 => abi::LHCALL_HALT,
            6..=8 => abi::LHCALL_LOAD_IDT_ENTRY,
            9..=10 => abi::LHCALL_SET_CLOCKEVENT,
            11 => abi::LHCALL_FLUSH_ASYNC,
            12 => abi::LHCALL_SEND_INTERRUPTS,
            13 => abi::LHCALL_LGUEST_INIT,
            14..=16 => rng.pick(&[4, 5, 7, 8, 13, 14, 15, 16, 18]),
            _ => rng.edge(),
        };
        movabs(&mut code, 0, nr);
        let (a1, a2, a3) = match nr {
            abi::LHCALL_LOAD_IDT_ENTRY => (
                if rng.one_in(4) { rng.edge() } else { rng.below(64) },
                if rng.one_in(4) { rng.edge() } else { CODE + rng.below(0x400) },
                if rng.one_in(4) { rng.edge() } else { rng.pick(&[0xe, 0xf]) },
            ),
            abi::LHCALL_SHUTDOWN => (guest_arg(rng, mem), rng.pick_or_edge(&[1, 2, 3, 0, 4]), 0),
            abi::LHCALL_SET_CLOCKEVENT => (rng.pick_or_edge(&[0, 1, 1000, 100_000]), 0, 0),
            _ => (guest_arg(rng, mem), guest_arg(rng, mem), guest_arg(rng, mem)),
        };
        movabs(&mut code, 7, a1);
        movabs(&mut code, 6, a2);
        movabs(&mut code, 2, a3);
        if rng.one_in(3) {
            movabs(&mut code, 10, guest_arg(rng, mem));
        }
        code.extend_from_slice(&[0xcd, 0x1f]);
    }
    match rng.below(20) {
        0 => code.extend_from_slice(&[0xeb, 0xfe]), // jmp . (the watchdog kicks)
        1 => code.extend_from_slice(&[0x0f, 0x0b]), // ud2
        2 => code.extend_from_slice(&[0xf4]),       // hlt (#GP in ring 3)
        3 => code.extend_from_slice(&[0x48, 0x89, 0x07, 0x50]), // mov %rax,(%rdi); push %rax
        4 => code.extend_from_slice(&[0xff, 0xe7]), // jmp *%rdi
        _ => {
            let mut junk = vec![0u8; rng.range(8, 64) as usize];
            rng.fill(&mut junk);
            code.extend_from_slice(&junk);
        }
    }
    code
}

// ---------------------------------------------------------------------------
// single_thread: the model-checked fuzzer.
// ---------------------------------------------------------------------------

const MAX_FILES: usize = 4;
const MAX_SLOTS: usize = 3;
const MAX_EFDS: usize = 4;
const MAX_MAPS: usize = 12;
/// A RUN older than this gets SIGUSR1 from the watchdog (and again after as
/// long again, until it returns).
const KICK_AFTER: Duration = Duration::from_millis(25);

/// An open lguest descriptor and the open file (description) it refers to.
#[derive(Clone, Copy)]
struct FileSlot {
    fd: i32,
    ofd: usize,
}

/// What the model knows about an open file.
#[derive(Default)]
struct Ofd {
    vm: bool,
    vcpu: bool,
    /// The VM was created by this process (not a forked child).
    ours: bool,
    /// The guest was killed: Some(true) known dead, Some(false) known
    /// alive, None unknown (RUN returned 0 with no run page to read).
    dead: Option<bool>,
    /// immediate_exit as last written.
    imm: bool,
    /// irqfd bindings: (eventfd identity, irq).
    binds: Vec<(u64, u32)>,
    /// ioeventfd bindings: (notification address, eventfd identity). They
    /// belong to the file, not to its VM: made before CREATE_VM too, kept
    /// by a VM a forked child creates, dropped with the file.
    notifiers: Vec<(u64, u64)>,
}

/// A mapping of a run page (or an attempt the kernel accepted).
#[derive(Clone, Copy)]
struct RunMap {
    addr: u64,
    len: u64,
    ofd: usize,
    prot: i32,
    /// Mapped (MAP_FIXED) over guest RAM: released by mapping PROT_NONE
    /// memory over it, never by munmap (see `reserve`).
    in_slot: bool,
}

/// Guest RAM the fuzzer mapped: anonymous, read-write while `clean`.
struct Slot {
    addr: u64,
    len: u64,
    /// Wholly mapped read-write by us, nothing mapped over it: writable by
    /// the fuzzer, and CREATE_VM over it must succeed.
    clean: bool,
    /// Offsets where guest code was written.
    entries: Vec<u64>,
}

#[derive(Clone, Copy)]
struct Efd {
    fd: i32,
    /// Identity of the eventfd (the kernel's eventfd_ctx), shared by dups.
    ctx: u64,
}

/// A pointer argument.
#[derive(Clone, Copy, Debug)]
enum Ptr {
    /// Into the read-write scratch page, at this offset.
    Valid(u64),
    /// The read-only page (all zeros): readable, not writable.
    ReadOnly,
    /// Not (wholly) readable: null, tiny, kernel, non-canonical, beyond the
    /// user range, PROT_NONE, or straddling into PROT_NONE.
    Bad(u64),
}

/// One step, remembered for reports.
#[derive(Clone, Copy)]
struct Rec {
    n: u64,
    call: Call,
    fd: i32,
    a: u64,
    b: u64,
    code: Code,
}

/// How the file of an IRQFD or IOEVENTFD `fd` field looks to the model.
enum FdKind {
    Efd(u64),
    NotEventfd,
    Closed,
    Unsure,
}

static RUN_SEQ: AtomicU64 = AtomicU64::new(0);

struct Fuzz {
    rng: Rng,
    n: u64,
    stats: Stats,
    files: [Option<FileSlot>; MAX_FILES],
    ofds: Vec<Ofd>,
    maps: Vec<RunMap>,
    slots: [Option<Slot>; MAX_SLOTS],
    efds: [Option<Efd>; MAX_EFDS],
    next_ctx: u64,
    /// A descriptor number the fuzzer closed (it may have been reused).
    closed_fd: i32,
    /// Four pages: scratch (rw), zeros (read-only), rw, PROT_NONE.
    arena: u64,
    /// 2 MiB read-only and 2 MiB PROT_NONE, for guest RAM that cannot be
    /// pinned.
    ro_region: u64,
    none_region: u64,
    recent: VecDeque<Rec>,
    violations: Vec<String>,
    kmsg: i32,
    child_calls: u64,
    forks: u64,
}

impl Fuzz {
    fn new(seed: u64) -> Result<Self, String> {
        let anon = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS;
        let rw = libc::PROT_READ | libc::PROT_WRITE;
        let arena = mmap_raw(0, 4 * PAGE, rw, anon, -1, 0).map_err(|e| format!("mmap arena: {}", t::errname(e)))?;
        mprotect_raw(arena + PAGE, PAGE, libc::PROT_READ).map_err(|e| format!("mprotect: {}", t::errname(e)))?;
        mprotect_raw(arena + 3 * PAGE, PAGE, libc::PROT_NONE).map_err(|e| format!("mprotect: {}", t::errname(e)))?;
        let ro_region =
            mmap_raw(0, 2 * MIB, libc::PROT_READ, anon, -1, 0).map_err(|e| format!("mmap: {}", t::errname(e)))?;
        let none_region =
            mmap_raw(0, 2 * MIB, libc::PROT_NONE, anon, -1, 0).map_err(|e| format!("mmap: {}", t::errname(e)))?;
        let kmsg = if std::env::var("LGUEST_FUZZ_TRACE").is_ok_and(|v| v == "1") {
            // SAFETY: A NUL-terminated path.
            unsafe { libc::open(c"/dev/kmsg".as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC) }
        } else {
            -1
        };
        let mut fz = Fuzz {
            rng: Rng(seed),
            n: 0,
            stats: Stats::default(),
            files: [None; MAX_FILES],
            ofds: Vec::new(),
            maps: Vec::new(),
            slots: [None, None, None],
            efds: [None; MAX_EFDS],
            next_ctx: 1,
            closed_fd: 100_000,
            arena,
            ro_region,
            none_region,
            recent: VecDeque::new(),
            violations: Vec::new(),
            kmsg,
            child_calls: 0,
            forks: 0,
        };
        for s in 0..MAX_SLOTS {
            fz.slot_remap(s);
        }
        Ok(fz)
    }

    // -- bookkeeping ------------------------------------------------------

    fn trace(&self, call: Call, fd: i32, a: u64, b: u64) {
        if self.kmsg >= 0 {
            let line = format!("<5>lguest-fuzz: op {} {} fd {fd} {a:#x} {b:#x}\n", self.n, call.name());
            // SAFETY: Writes a valid buffer to /dev/kmsg.
            unsafe { libc::write(self.kmsg, line.as_ptr().cast(), line.len()) };
        }
    }

    /// Records an outcome and checks it against the documented set and
    /// the model's expectation.
    fn done(&mut self, call: Call, fd: i32, a: u64, b: u64, code: Code, expect: Ex) {
        self.stats.note(call, code);
        if self.recent.len() == 12 {
            self.recent.pop_front();
        }
        self.recent.push_back(Rec { n: self.n, call, fd, a, b, code });
        let doc = call.documented();
        let why = if doc & crate::b(code) == 0 {
            Some("outside the documented set")
        } else if expect & crate::b(code) == 0 {
            Some("not what the model expects")
        } else {
            None
        };
        if let Some(why) = why {
            self.violate(format!(
                "{} (fd {fd}, {a:#x}, {b:#x}) gave {}: {why} ({}; documented {})",
                call.name(),
                ename(code),
                describe(expect),
                describe(doc)
            ));
        }
    }

    fn violate(&mut self, what: String) {
        if self.kmsg >= 0 {
            let line = format!("<5>lguest-fuzz: op {} unexpected: {what}\n", self.n);
            // SAFETY: Writes a valid buffer to /dev/kmsg.
            unsafe { libc::write(self.kmsg, line.as_ptr().cast(), line.len()) };
        }
        if self.violations.len() < 20 {
            let mut s = format!("op {}: {what}", self.n);
            if self.violations.is_empty() {
                s.push_str("\n  the operations before it:");
                for r in &self.recent {
                    s.push_str(&format!(
                        "\n    op {} {} (fd {}, {:#x}, {:#x}) -> {}",
                        r.n,
                        r.call.name(),
                        r.fd,
                        r.a,
                        r.b,
                        ename(r.code)
                    ));
                }
            }
            self.violations.push(s);
        }
    }

    /// A syscall: trace it, make it, record and check the outcome.
    fn call(
        &mut self,
        call: Call,
        fd: i32,
        a: u64,
        b: u64,
        expect: Ex,
        f: impl FnOnce() -> Result<i64, i32>,
    ) -> Result<i64, i32> {
        self.trace(call, fd, a, b);
        let r = f();
        self.done(call, fd, a, b, code_of(&r), expect);
        r
    }

    fn gen_ptr(&mut self, size: u64) -> Ptr {
        let none = self.arena + 3 * PAGE;
        match self.rng.below(100) {
            0..=77 => Ptr::Valid(if self.rng.one_in(4) { self.rng.range(1, PAGE - size) } else { 0 }),
            78..=82 => Ptr::ReadOnly,
            83..=86 => Ptr::Bad(none - self.rng.range(1, size)),
            87..=88 => Ptr::Bad(none + self.rng.below(PAGE - size)),
            89..=91 => Ptr::Bad(self.rng.pick(&[0, 1, 8, 0xff8])),
            92..=95 => Ptr::Bad(self.rng.pick(&KERNEL_ADDRS)),
            _ => Ptr::Bad(self.rng.pick(&[TOP - 8, TOP - PAGE, TOP + PAGE, TOP - size / 2])),
        }
    }

    /// Puts `v` where `p` points (if it can) and returns the address and
    /// what the kernel will read there, if it can read it.
    fn place<T: Copy>(&mut self, p: Ptr, v: T, zero: T) -> (u64, Option<T>) {
        match p {
            Ptr::Valid(off) => {
                let a = self.arena + off;
                // SAFETY: `off + size_of::<T>()` is within the scratch page
                // (gen_ptr), which is mapped read-write for the whole test.
                unsafe { std::ptr::write_unaligned(a as *mut T, v) };
                (a, Some(v))
            }
            Ptr::ReadOnly => (self.arena + PAGE, Some(zero)),
            Ptr::Bad(a) => (a, None),
        }
    }

    fn fetch<T: Copy>(&self, p: Ptr) -> Option<T> {
        match p {
            // SAFETY: As in `place`.
            Ptr::Valid(off) => Some(unsafe { std::ptr::read_unaligned((self.arena + off) as *const T) }),
            _ => None,
        }
    }

    fn new_ofd(&mut self) -> usize {
        self.ofds.push(Ofd::default());
        self.ofds.len() - 1
    }

    /// The file in slot `i`, opening one there if it is empty.
    fn file(&mut self, i: usize) -> Option<FileSlot> {
        if self.files[i].is_none() {
            self.op_open(i);
        }
        self.files[i]
    }

    fn readable_map(&self, ofd: usize) -> Option<RunMap> {
        self.maps.iter().copied().find(|m| m.ofd == ofd && m.prot & libc::PROT_READ != 0 && m.len == PAGE)
    }

    fn clean_slot(&mut self) -> Option<usize> {
        let i = self.rng.below(MAX_SLOTS as u64) as usize;
        self.slots[i].as_ref().filter(|s| s.clean).map(|_| i)
    }

    // -- files --------------------------------------------------------------

    fn op_open(&mut self, i: usize) {
        let r = self.call(Call::Open, -1, i as u64, 0, OK, open_lguest);
        if let Ok(fd) = r {
            if let Some(old) = self.files[i].take() {
                self.close_slot_fd(old);
            }
            let ofd = self.new_ofd();
            self.files[i] = Some(FileSlot { fd: fd as i32, ofd });
        }
    }

    fn close_slot_fd(&mut self, f: FileSlot) {
        let _ = self.call(Call::Close, f.fd, 0, 0, OK, || close_raw(f.fd));
        self.closed_fd = f.fd;
    }

    fn op_close(&mut self) {
        let i = self.rng.below(MAX_FILES as u64) as usize;
        if let Some(f) = self.files[i].take() {
            self.close_slot_fd(f);
        }
    }

    fn op_dup(&mut self) {
        let from = self.rng.below(MAX_FILES as u64) as usize;
        let to = self.rng.below(MAX_FILES as u64) as usize;
        let Some(f) = self.file(from) else { return };
        if from == to {
            return;
        }
        if let Some(old) = self.files[to].take() {
            self.close_slot_fd(old);
        }
        if let Ok(fd) = self.call(Call::Dup, f.fd, 0, 0, OK, || dup_raw(f.fd)) {
            self.files[to] = Some(FileSlot { fd: fd as i32, ofd: f.ofd });
        }
    }

    // -- ioctls -------------------------------------------------------------

    fn op_version(&mut self, f: FileSlot) {
        let arg = self.rng.edge();
        let r = self.call(Call::Version, f.fd, arg, 0, OK, || ioctl_raw(f.fd, abi::LGUEST_GET_API_VERSION, arg));
        if let Ok(v) = r {
            if v != abi::LGUEST_API_VERSION as i64 {
                self.violate(format!("GET_API_VERSION returned {v}"));
            }
        }
    }

    fn gen_config(&mut self) -> abi::LguestVmConfig {
        let si = self.rng.below(MAX_SLOTS as u64) as usize;
        let (sbase, slen, entries) = match &self.slots[si] {
            Some(s) => (s.addr, s.len, s.entries.clone()),
            None => (self.ro_region, 2 * MIB, vec![CODE]),
        };
        let r = &mut self.rng;
        let mem_base = match r.below(100) {
            0..=69 => sbase,
            70..=73 => sbase + PAGE * r.range(1, 8),
            74..=76 => sbase + r.range(1, PAGE),
            77..=79 => self.ro_region,
            80..=82 => self.none_region,
            83..=84 => self.arena,
            85..=86 => r.pick(&[0, PAGE, 0x10000]),
            87..=90 => r.below(TOP) & !(PAGE - 1),
            91..=94 => TOP - r.pick(&[PAGE, 2 * MIB, 4 * MIB, slen]),
            _ => r.pick(&KERNEL_ADDRS) & !(PAGE - 1),
        };
        let mem_size = match r.below(100) {
            0..=64 => slen,
            65..=69 => 2 * MIB,
            70..=72 => MIB + PAGE,
            73..=74 => MIB,
            75..=76 => 0,
            77..=78 => r.pick(&[PAGE - 1, 3 * MIB + 1, MIB + 8]),
            79..=81 => slen + PAGE,
            82..=83 => abi::LGUEST_MAX_MEM,
            84..=85 => abi::LGUEST_MAX_MEM + PAGE,
            86..=87 => !(PAGE - 1),
            88..=93 => r.range(1, 16 * 256) * PAGE,
            _ => r.edge(),
        };
        let entry = match r.below(100) {
            0..=74 => {
                let e = r.pick(&entries);
                if e < mem_size {
                    e
                } else {
                    CODE
                }
            }
            75..=84 => r.range(MIB, mem_size.max(MIB + 1)),
            _ => r.pick_or_edge(&[0, MIB - 1, mem_size, mem_size.wrapping_sub(1), u64::MAX]),
        };
        let device_pages = if r.below(100) < 80 { 0 } else { r.pick_or_edge(&[1, 255, 256, 257, u64::MAX, 1 << 52]) };
        let mut c =
            abi::LguestVmConfig { mem_base, mem_size, device_pages, entry, flags: 0, reserved0: 0, reserved: [0; 4] };
        if r.one_in(12) {
            let v = r.next() | 1;
            match r.below(3) {
                0 => c.flags = v as u32 | 1,
                1 => c.reserved0 = v as u32 | 1,
                _ => c.reserved[r.below(4) as usize] = v,
            }
        }
        c
    }

    /// Rules 1-5 of LGUEST_CREATE_VM (api.rst 4.2).
    fn config_valid(c: &abi::LguestVmConfig) -> bool {
        c.flags == 0
            && c.reserved0 == 0
            && c.reserved.iter().all(|&r| r == 0)
            && c.mem_base.is_multiple_of(PAGE)
            && c.mem_size.is_multiple_of(PAGE)
            && c.mem_size != 0
            && c.mem_size <= abi::LGUEST_MAX_MEM
            && c.device_pages <= abi::LGUEST_MAX_DEVICE_PAGES
            && c.mem_size > abi::LGUEST_LOAD_MIN
            && c.entry >= abi::LGUEST_LOAD_MIN
            && c.entry < c.mem_size
            && c.mem_size
                .checked_add(c.device_pages * PAGE)
                .and_then(|t| c.mem_base.checked_add(t))
                .is_some_and(|end| end <= TOP)
    }

    /// What pinning RAM and the device window, `[mem_base, mem_base +
    /// mem_size + device_pages * 4096)`, can give.
    fn pin_expect(&self, c: &abi::LguestVmConfig) -> Ex {
        let (base, end) = (c.mem_base, c.mem_base + c.mem_size + c.device_pages * PAGE);
        for s in self.slots.iter().flatten() {
            if s.clean && s.addr <= base && end <= s.addr + s.len {
                return OK | b(ENOMEM);
            }
        }
        let within = |start: u64, len: u64| base >= start && base < start + len;
        // Unpinnable first page (read-only, PROT_NONE, never mapped), or a
        // scratch page followed by the read-only one.
        if within(self.ro_region, 2 * MIB)
            || within(self.none_region, 2 * MIB)
            || within(self.arena, 4 * PAGE)
            || !(0x10000..TOP - 4 * MIB).contains(&base)
        {
            return b(EFAULT);
        }
        OK | b(EFAULT) | b(ENOMEM)
    }

    fn op_create_vm(&mut self, f: FileSlot) {
        let cfg = self.gen_config();
        let p = self.gen_ptr(std::mem::size_of::<abi::LguestVmConfig>() as u64);
        let zero = abi::LguestVmConfig {
            mem_base: 0,
            mem_size: 0,
            device_pages: 0,
            entry: 0,
            flags: 0,
            reserved0: 0,
            reserved: [0; 4],
        };
        let (addr, seen) = self.place(p, cfg, zero);
        let expect = match seen {
            None => b(EFAULT),
            Some(_) if self.ofds[f.ofd].vm => b(EEXIST),
            Some(c) if !Self::config_valid(&c) => b(EINVAL),
            Some(c) => self.pin_expect(&c),
        };
        let r = self.call(Call::CreateVm, f.fd, cfg.mem_base, cfg.mem_size, expect, || {
            ioctl_raw(f.fd, abi::LGUEST_CREATE_VM, addr)
        });
        if r.is_ok() {
            let o = &mut self.ofds[f.ofd];
            o.vm = true;
            o.ours = true;
            o.vcpu = false;
            o.dead = None;
        }
    }

    fn op_create_vcpu(&mut self, f: FileSlot) {
        let arg = if self.rng.one_in(2) { 0 } else { self.rng.edge() };
        let o = &self.ofds[f.ofd];
        let expect = if !o.vm {
            b(ENOENT)
        } else if o.vcpu {
            b(EBUSY)
        } else {
            OK | b(ENOMEM)
        };
        let r = self.call(Call::CreateVcpu, f.fd, arg, 0, expect, || ioctl_raw(f.fd, abi::LGUEST_CREATE_VCPU, arg));
        if let Ok(v) = r {
            if v != 0 {
                self.violate(format!("CREATE_VCPU returned index {v}"));
            }
            let o = &mut self.ofds[f.ofd];
            o.vcpu = true;
            o.dead = Some(false);
            o.imm = false;
        }
    }

    fn run_expect(o: &Ofd, index: u64) -> Ex {
        if !o.vm {
            b(ENOENT)
        } else if index != 0 || !o.vcpu {
            b(EINVAL)
        } else if !o.ours {
            b(EPERM)
        } else if o.imm {
            b(EINTR)
        } else if o.dead == Some(true) {
            OK
        } else {
            OK | b(EINTR) | b(ENOMEM)
        }
    }

    fn op_run(&mut self, f: FileSlot) {
        let index = if self.rng.below(10) < 9 { 0 } else { self.rng.pick_or_edge(&[1, 2, u64::MAX, 1 << 32]) };
        let expect = Self::run_expect(&self.ofds[f.ofd], index);
        let seq = self.n + 1;
        let r = self.call(Call::Run, f.fd, index, 0, expect, || {
            RUN_SEQ.store(seq, SeqCst);
            let r = ioctl_raw(f.fd, abi::LGUEST_RUN, index);
            RUN_SEQ.store(0, SeqCst);
            r
        });
        if r.is_err() {
            return;
        }
        match self.readable_map(f.ofd) {
            Some(m) => {
                // SAFETY: A readable mapping of the run page (tracked).
                let reason = unsafe { ((m.addr + 4) as *const u32).read_volatile() };
                // SAFETY: As above; the message is at offset 128.
                let msg = unsafe { std::slice::from_raw_parts((m.addr + 128) as *const u8, abi::LGUEST_MESSAGE_LEN) };
                if !msg.contains(&0) {
                    self.violate("RUN: the run page's message is not NUL-terminated".into());
                }
                if !(abi::LGUEST_EXIT_NOTIFY..=abi::LGUEST_EXIT_HALT).contains(&reason) {
                    self.violate(format!("RUN returned 0 with exit_reason {reason}"));
                }
                let o = &mut self.ofds[f.ofd];
                if o.dead == Some(true) && reason != abi::LGUEST_EXIT_KILLED {
                    self.violate(format!("RUN of a killed guest gave exit_reason {reason}"));
                } else {
                    o.dead = Some(reason == abi::LGUEST_EXIT_KILLED);
                }
            }
            None => {
                let o = &mut self.ofds[f.ofd];
                if o.dead != Some(true) {
                    o.dead = None;
                }
            }
        }
    }

    fn gen_regs_header(&mut self) -> (u32, u32) {
        let vcpu = if self.rng.below(10) < 9 { 0 } else { self.rng.pick_or_edge(&[1, 2, u32::MAX as u64]) as u32 };
        let pad = if self.rng.below(16) < 15 { 0 } else { self.rng.next() as u32 | 1 };
        (vcpu, pad)
    }

    fn regs_expect(&self, f: FileSlot, seen: Option<abi::LguestVcpuRegs>) -> Ex {
        let o = &self.ofds[f.ofd];
        match seen {
            None => b(EFAULT),
            Some(r) if r.pad != 0 => b(EINVAL),
            Some(_) if !o.vm => b(ENOENT),
            Some(r) if r.vcpu != 0 || !o.vcpu => b(EINVAL),
            Some(_) => OK,
        }
    }

    fn op_get_regs(&mut self, f: FileSlot) {
        let (vcpu, pad) = self.gen_regs_header();
        let mut req = abi::LguestVcpuRegs { vcpu, pad, ..Default::default() };
        req.regs.rip = self.rng.next();
        req.regs.rflags = self.rng.next();
        let p = self.gen_ptr(std::mem::size_of::<abi::LguestVcpuRegs>() as u64);
        let (addr, seen) = self.place(p, req, abi::LguestVcpuRegs::default());
        let mut expect = self.regs_expect(f, seen);
        if expect == OK && !matches!(p, Ptr::Valid(_)) {
            expect = b(EFAULT); // read fine, the write back fails
        }
        let r = self
            .call(Call::GetRegs, f.fd, vcpu as u64, pad as u64, expect, || ioctl_raw(f.fd, abi::LGUEST_GET_REGS, addr));
        if r.is_ok() {
            if let Some(back) = self.fetch::<abi::LguestVcpuRegs>(p) {
                self.check_flags(back.regs.rflags);
            }
        }
    }

    /// RFLAGS the vCPU can have: IF and bit 1 on, IOPL 0, not VM86.
    fn check_flags(&mut self, rf: u64) {
        if rf & 0x202 != 0x202 || rf & 0x3000 != 0 || rf & 0x2_0000 != 0 {
            self.violate(format!("GET_REGS: rflags {rf:#x} (IF off, IOPL or VM set)"));
        }
    }

    fn gen_regs(&mut self) -> abi::LguestRegs {
        let r = &mut self.rng;
        let mut regs = abi::LguestRegs {
            rax: r.edge(),
            rbx: r.edge(),
            rcx: r.edge(),
            rdx: r.edge(),
            rsi: r.edge(),
            rdi: r.edge(),
            rbp: r.edge(),
            r8: r.edge(),
            r9: r.edge(),
            r10: r.edge(),
            r11: r.edge(),
            r12: r.edge(),
            r13: r.edge(),
            r14: r.edge(),
            r15: r.edge(),
            rip: 0,
            rsp: 0,
            rflags: if r.one_in(2) { r.next() } else { r.edge() },
        };
        regs.rip = match r.below(20) {
            0..=11 => CODE + r.below(0x400),
            12..=16 => r.below(TOP),
            _ => r.edge(),
        };
        regs.rsp = match r.below(20) {
            0..=11 => r.range(MIB, 4 * MIB),
            12..=16 => r.below(TOP),
            _ => r.edge(),
        };
        regs
    }

    fn op_set_regs(&mut self, f: FileSlot) {
        let (vcpu, pad) = self.gen_regs_header();
        let regs = self.gen_regs();
        let req = abi::LguestVcpuRegs { vcpu, pad, regs };
        let p = self.gen_ptr(std::mem::size_of::<abi::LguestVcpuRegs>() as u64);
        let (addr, seen) = self.place(p, req, abi::LguestVcpuRegs::default());
        let mut expect = self.regs_expect(f, seen);
        if expect == OK {
            let s = seen.map(|s| s.regs).unwrap_or_default();
            if !abi::guest_va_ok(s.rip) || !abi::guest_sp_ok(s.rsp) {
                expect = b(EINVAL);
            }
        }
        let r =
            self.call(Call::SetRegs, f.fd, regs.rip, regs.rsp, expect, || ioctl_raw(f.fd, abi::LGUEST_SET_REGS, addr));
        if r.is_err() || !self.rng.one_in(2) {
            return;
        }
        // Read them back: everything as written, RFLAGS clamped (api.rst 4.6).
        let written = seen.map(|s| s.regs).unwrap_or_default();
        let mut back = abi::LguestVcpuRegs::default();
        let ptr = &mut back as *mut abi::LguestVcpuRegs as u64;
        let r = self.call(Call::GetRegs, f.fd, 0, 0, OK, || ioctl_raw(f.fd, abi::LGUEST_GET_REGS, ptr));
        if r.is_ok() {
            let mut want = written;
            want.rflags = (written.rflags & 0x4_4dd5) | 0x202;
            if back.regs != want {
                self.violate(format!("SET_REGS then GET_REGS: wrote {written:x?}, read {:x?}", back.regs));
            }
        }
    }

    fn op_irq(&mut self, f: FileSlot) {
        let irq = if self.rng.below(10) < 7 {
            self.rng.below(abi::LGUEST_IRQS as u64)
        } else {
            self.rng.pick_or_edge(&[64, 65, 255, u32::MAX as u64, 1 << 32, u64::MAX])
        };
        let expect = if irq < abi::LGUEST_IRQS as u64 { OK } else { b(EINVAL) };
        let _ = self.call(Call::Irq, f.fd, irq, 0, expect, || ioctl_raw(f.fd, abi::LGUEST_IRQ, irq));
    }

    fn fd_kind(&self, fd: i32) -> FdKind {
        if let Some(e) = self.efds.iter().flatten().find(|e| e.fd == fd) {
            return FdKind::Efd(e.ctx);
        }
        if self.files.iter().flatten().any(|f| f.fd == fd) || fd == self.kmsg {
            return FdKind::NotEventfd;
        }
        if fd >= 65536 {
            return FdKind::Closed;
        }
        FdKind::Unsure
    }

    fn op_irqfd(&mut self, f: FileSlot) {
        let fd = match self.rng.below(20) {
            0..=12 => match self.efds[self.rng.below(MAX_EFDS as u64) as usize] {
                Some(e) => e.fd,
                None => self.closed_fd,
            },
            13 => f.fd,
            14 => self.rng.pick(&[-1, i32::MIN, -100]),
            15 => self.rng.pick(&[0, 1, 2]),
            16 => self.rng.pick(&[65536, 1 << 20, i32::MAX]),
            17 => self.rng.next() as i32,
            _ => self.closed_fd,
        };
        let irq = if self.rng.below(10) < 9 {
            self.rng.below(abi::LGUEST_IRQS as u64) as u32
        } else {
            self.rng.pick_or_edge(&[64, 65, u32::MAX as u64]) as u32
        };
        let flags = match self.rng.below(20) {
            0..=9 => 0,
            10..=18 => abi::LGUEST_IRQFD_DEASSIGN,
            _ => self.rng.pick_or_edge(&[2, 3, u32::MAX as u64]) as u32 | 2,
        };
        let pad = if self.rng.below(20) < 19 { 0 } else { self.rng.next() as u32 | 1 };
        let req = abi::LguestIrqfd { fd, irq, flags, pad };
        let p = self.gen_ptr(std::mem::size_of::<abi::LguestIrqfd>() as u64);
        let (addr, seen) = self.place(p, req, abi::LguestIrqfd::default());
        let mut add = None;
        let mut remove = None;
        let expect = match seen {
            None => b(EFAULT),
            Some(r) if r.pad != 0 || r.irq as usize >= abi::LGUEST_IRQS || r.fd < 0 => b(EINVAL),
            Some(r) => {
                let binds = &self.ofds[f.ofd].binds;
                let kind = self.fd_kind(r.fd);
                let bound = |ctx: u64| binds.iter().position(|&(c, i)| c == ctx && i == r.irq);
                match r.flags {
                    0 if binds.len() >= abi::LGUEST_MAX_IRQFDS => b(ENOSPC),
                    0 => match kind {
                        FdKind::Efd(ctx) if bound(ctx).is_some() => b(EEXIST),
                        FdKind::Efd(ctx) => {
                            add = Some((ctx, r.irq));
                            OK | b(ENOMEM)
                        }
                        FdKind::NotEventfd => b(EINVAL),
                        FdKind::Closed => b(EBADF),
                        FdKind::Unsure => b(EINVAL) | b(EBADF),
                    },
                    abi::LGUEST_IRQFD_DEASSIGN => match kind {
                        FdKind::Efd(ctx) => match bound(ctx) {
                            Some(i) => {
                                remove = Some(i);
                                OK
                            }
                            None => b(ENOENT),
                        },
                        _ => b(ENOENT),
                    },
                    _ => b(EINVAL),
                }
            }
        };
        let r = self.call(Call::Irqfd, f.fd, fd as u64, ((irq as u64) << 32) | flags as u64, expect, || {
            ioctl_raw(f.fd, abi::LGUEST_IRQFD, addr)
        });
        if r.is_ok() {
            let binds = &mut self.ofds[f.ofd].binds;
            if let Some(x) = add {
                binds.push(x);
            }
            if let Some(i) = remove {
                binds.remove(i);
            }
        }
    }

    fn op_ioeventfd(&mut self, f: FileSlot) {
        if !self.rng.one_in(15) {
            return self.ioeventfd_one(f, false);
        }
        // A burst of bindings to an eventfd we hold: towards a full table
        // (ENOSPC), which the file's release then has to empty.
        for _ in 0..self.rng.range(8, 40) {
            self.ioeventfd_one(f, true);
        }
    }

    fn ioeventfd_one(&mut self, f: FileSlot, burst: bool) {
        let addr = if burst { DEV_WINDOW + 8 * self.rng.below(48) } else { notify_addr(&mut self.rng) };
        let efd = self.efds[self.rng.below(MAX_EFDS as u64) as usize].map(|e| e.fd);
        let fd = match self.rng.below(20) {
            _ if burst && efd.is_some() => efd.unwrap_or(-1),
            0..=12 => efd.unwrap_or(self.closed_fd),
            13 => f.fd,
            14 => self.rng.pick(&[-1, i32::MIN, -100]),
            15 => self.rng.pick(&[0, 1, 2]),
            16 => self.rng.pick(&[65536, 1 << 20, i32::MAX]),
            17 => self.rng.next() as i32,
            _ => self.closed_fd,
        };
        let flags = match self.rng.below(20) {
            _ if burst => 0,
            0..=11 => 0,
            12..=18 => abi::LGUEST_IOEVENTFD_DEASSIGN,
            _ => self.rng.pick_or_edge(&[2, 3, u32::MAX as u64]) as u32 | 2,
        };
        let req = abi::LguestIoeventfd { addr, fd, flags };
        let p = if burst { Ptr::Valid(0) } else { self.gen_ptr(std::mem::size_of::<abi::LguestIoeventfd>() as u64) };
        let (uaddr, seen) = self.place(p, req, abi::LguestIoeventfd::default());
        let mut add = None;
        let mut remove = None;
        // api.rst 4.9, in the order notify.rs checks.
        let expect = match seen {
            None => b(EFAULT),
            Some(r) if r.addr >= TOP => b(EINVAL),
            Some(r) => {
                let nots = &self.ofds[f.ofd].notifiers;
                let bound = nots.iter().position(|&(a, _)| a == r.addr);
                match r.flags {
                    0 if r.fd < 0 => b(EINVAL),
                    0 if nots.len() >= abi::LGUEST_MAX_IOEVENTFDS => b(ENOSPC),
                    0 if bound.is_some() => b(EEXIST),
                    0 => match self.fd_kind(r.fd) {
                        FdKind::Efd(ctx) => {
                            add = Some((r.addr, ctx));
                            OK | b(ENOMEM)
                        }
                        FdKind::NotEventfd => b(EINVAL),
                        FdKind::Closed => b(EBADF),
                        FdKind::Unsure => b(EINVAL) | b(EBADF),
                    },
                    abi::LGUEST_IOEVENTFD_DEASSIGN => match bound {
                        Some(i) => {
                            remove = Some(i);
                            OK
                        }
                        None => b(ENOENT),
                    },
                    _ => b(EINVAL),
                }
            }
        };
        let r = self.call(Call::Ioeventfd, f.fd, addr, ((fd as u32 as u64) << 32) | flags as u64, expect, || {
            ioctl_raw(f.fd, abi::LGUEST_IOEVENTFD, uaddr)
        });
        if r.is_ok() {
            let nots = &mut self.ofds[f.ofd].notifiers;
            if let Some(x) = add {
                nots.push(x);
            }
            if let Some(i) = remove {
                nots.remove(i);
            }
        }
    }

    /// LGUEST_SET_CPUID: a header and up to four entries, well-formed or
    /// not, in the arena, at an unreadable address, or with its header
    /// readable and its entries not; the expected error follows the
    /// module's order of checks (api.rst 4.10).
    fn op_set_cpuid(&mut self, f: FileSlot) {
        let nent = match self.rng.below(20) {
            0 => self.rng.pick(&[257u64, 1000, 1 << 31, u32::MAX as u64]) as u32,
            1..=3 => 0,
            _ => 1 + self.rng.below(4) as u32,
        };
        let padding = if self.rng.one_in(15) { 1 + self.rng.below(u32::MAX as u64) as u32 } else { 0 };
        let mut entries = Vec::new();
        for _ in 0..nent.min(4) {
            let mut e = abi::LguestCpuidEntry {
                function: self.rng.pick(&[0u64, 1, 7, 0xd, 0x4000_0000, 0x8000_0001]) as u32,
                index: self.rng.below(3) as u32,
                flags: self.rng.pick(&[0u64, 1, 1, 2, 4]) as u32,
                eax: self.rng.next() as u32,
                ebx: self.rng.next() as u32,
                ecx: self.rng.next() as u32,
                edx: self.rng.next() as u32,
                padding: [0; 3],
            };
            if self.rng.one_in(20) {
                e.padding[self.rng.below(3) as usize] = 1;
            }
            entries.push(e);
        }
        let mut bytes = Vec::new();
        bytes.extend(nent.to_ne_bytes());
        bytes.extend(padding.to_ne_bytes());
        for w in entries.iter().flat_map(abi::LguestCpuidEntry::words) {
            bytes.extend(w.to_ne_bytes());
        }
        let o = &self.ofds[f.ofd];
        let after_header = if padding != 0 {
            b(EINVAL)
        } else if nent > abi::LGUEST_MAX_CPUID_ENTRIES {
            b(E2BIG)
        } else {
            OK
        };
        let table_expect = if !abi::cpuid_table_valid(&entries) {
            b(EINVAL)
        } else if !o.vm {
            b(ENOENT)
        } else {
            OK | b(ENOMEM)
        };
        let (addr, expect) = match self.rng.below(10) {
            // In the arena: all of it readable.
            0..=6 => {
                let a = self.arena;
                // SAFETY: at most 8 + 4 * 40 bytes at the start of the
                // arena's first page, mapped read-write for the whole test.
                unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), a as *mut u8, bytes.len()) };
                let e = match after_header {
                    OK => table_expect,
                    e => e,
                };
                (a, e)
            }
            // The header at the end of page 2, the entries in page 3
            // (no access).
            7 => {
                let a = self.arena + 3 * PAGE - 8;
                // SAFETY: the last 8 bytes of the arena's third page,
                // mapped read-write.
                unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), a as *mut u8, 8) };
                let e = match after_header {
                    OK if nent == 0 => table_expect,
                    OK => b(EFAULT),
                    e => e,
                };
                (a, e)
            }
            // The read-only page: all zeros, an empty table.
            8 => (self.arena + PAGE, if o.vm { OK | b(ENOMEM) } else { b(ENOENT) }),
            _ => (self.rng.pick(&[0, 1, 8, 0xff8, self.arena + 3 * PAGE]), b(EFAULT)),
        };
        let _ = self
            .call(Call::SetCpuid, f.fd, u64::from(nent), addr, expect, || ioctl_raw(f.fd, abi::LGUEST_SET_CPUID, addr));
    }

    fn gen_unknown_cmd(&mut self) -> u32 {
        loop {
            let cmd = match self.rng.below(3) {
                0 => self.rng.next() as u32,
                1 => abi::ioc(
                    self.rng.below(4) as u32,
                    abi::LGUEST_IOC_MAGIC,
                    if self.rng.one_in(2) { self.rng.range(0x38, 0x50) as u32 } else { self.rng.below(256) as u32 },
                    self.rng.pick(&[0, 1, 8, 16, 71, 72, 73, 144, 151, 152, 153, 0x3fff]),
                ),
                _ => self.rng.pick(&LGUEST_CMDS) ^ (1 << self.rng.below(32)),
            };
            if !VFS_TYPES.contains(&((cmd >> 8) & 0xff)) && !LGUEST_CMDS.contains(&cmd) {
                return cmd;
            }
        }
    }

    fn op_unknown(&mut self, f: FileSlot) {
        let cmd = self.gen_unknown_cmd();
        let arg = if self.rng.one_in(2) { self.arena } else { self.rng.edge() };
        let _ = self.call(Call::Unknown, f.fd, cmd as u64, arg, b(ENOTTY), || ioctl_raw(f.fd, cmd, arg));
    }

    // -- mmap and friends ---------------------------------------------------

    fn forget_maps_in(&mut self, start: u64, len: u64) {
        self.maps.retain(|m| m.addr + m.len <= start || m.addr >= start + len);
    }

    fn op_mmap(&mut self, f: FileSlot) {
        if self.maps.len() >= MAX_MAPS {
            self.op_munmap();
        }
        let r = &mut self.rng;
        let len = match r.below(20) {
            0..=13 => PAGE,
            14 => r.range(1, PAGE),
            15 => 0,
            16 => 2 * PAGE,
            17 => PAGE + 1,
            _ => r.range(1, 64) * PAGE,
        };
        let off = match r.below(20) {
            0..=13 => 0,
            14 => PAGE,
            15 => r.range(2, 1 << 20) * PAGE,
            16 => r.pick(&[1, PAGE - 1, PAGE + 8]),
            17 => 1 << 44,
            18 => r.pick(&[!(PAGE - 1), 1 << 63, (1 << 62) - PAGE]),
            _ => r.next() & !(PAGE - 1),
        };
        let rw = libc::PROT_READ | libc::PROT_WRITE;
        let prot = match r.below(20) {
            0..=12 => rw,
            13..=14 => libc::PROT_READ,
            15 => libc::PROT_WRITE,
            16 => libc::PROT_NONE,
            17 => rw | libc::PROT_EXEC,
            _ => libc::PROT_READ | libc::PROT_EXEC,
        };
        let mut extra_ok = false;
        let mut flags = match r.below(20) {
            0..=13 => libc::MAP_SHARED,
            14..=15 => libc::MAP_PRIVATE,
            16 => libc::MAP_SHARED_VALIDATE,
            17 => libc::MAP_SHARED | libc::MAP_POPULATE,
            18 => {
                extra_ok = true;
                libc::MAP_SHARED
                    | r.pick(&[
                        libc::MAP_NORESERVE,
                        libc::MAP_NONBLOCK,
                        libc::MAP_STACK,
                        libc::MAP_32BIT,
                        libc::MAP_LOCKED,
                        libc::MAP_HUGETLB,
                        libc::MAP_POPULATE | libc::MAP_LOCKED,
                    ])
            }
            _ => {
                extra_ok = true;
                libc::MAP_SHARED_VALIDATE | r.pick(&[libc::MAP_SYNC, 0x0800_0000, libc::MAP_HUGETLB])
            }
        };
        // Sometimes right over guest RAM (MAP_FIXED), pages permitting.
        let mut at = 0;
        let mut in_slot = None;
        let len_r = len.div_ceil(PAGE) * PAGE;
        if r.one_in(12) && len > 0 {
            let si = r.below(MAX_SLOTS as u64) as usize;
            if let Some(s) = &self.slots[si] {
                if len_r <= s.len {
                    let pages = (s.len - len_r) / PAGE;
                    at = s.addr + PAGE * self.rng.below(pages + 1);
                    flags |= libc::MAP_FIXED;
                    in_slot = Some(si);
                }
            }
        }
        // The model: the VFS's checks first (which the lguest module never
        // sees), then dev.rs's.
        let o = &self.ofds[f.ofd];
        // MAP_SHARED is 1, MAP_PRIVATE 2, MAP_SHARED_VALIDATE 3.
        let shared = matches!(flags & 3, libc::MAP_SHARED | libc::MAP_SHARED_VALIDATE);
        let vfs_clean = len > 0 && off % PAGE == 0 && off < (1 << 62) && !extra_ok;
        let expect = if !vfs_clean {
            Call::Mmap.documented()
        } else if len_r != PAGE || !shared {
            b(EINVAL)
        } else if prot & libc::PROT_EXEC != 0 {
            b(EINVAL) | b(EPERM)
        } else if !o.vm {
            b(ENOENT)
        } else if off / PAGE >= o.vcpu as u64 {
            b(EINVAL)
        } else {
            OK | b(ENOMEM)
        };
        if let Some(si) = in_slot {
            // Whatever happens, this part of the slot is no longer ours to
            // write, and a run page mapped there before is gone.
            self.forget_maps_in(at, len_r);
            if let Some(s) = self.slots[si].as_mut() {
                s.clean = false;
            }
        }
        let fd = f.fd;
        let r =
            self.call(Call::Mmap, fd, len, off, expect, || mmap_raw(at, len, prot, flags, fd, off).map(|a| a as i64));
        if r.is_err() && in_slot.is_some() {
            // A failed MAP_FIXED may leave a gap: fill it.
            self.reserve(at, len_r);
        }
        if let Ok(addr) = r {
            if len_r != PAGE || !shared || prot & libc::PROT_EXEC != 0 {
                self.violate(format!("mmap of {len} bytes, prot {prot:#x}, flags {flags:#x} was accepted"));
                self.release(addr as u64, len_r, in_slot.is_some());
                return;
            }
            self.maps.push(RunMap { addr: addr as u64, len: len_r, ofd: f.ofd, prot, in_slot: in_slot.is_some() });
        }
    }

    /// Maps PROT_NONE memory over `[addr, addr + len)` of a slot: the
    /// range stays ours (a plain munmap would leave a hole that a later
    /// mapping, even malloc's, could fill, and that the slot's own munmap
    /// would then destroy), and pinning it fails as on a hole.
    fn reserve(&mut self, addr: u64, len: u64) {
        let fl = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED;
        let _ = self.call(Call::Memory, -1, addr, len, OK, || {
            mmap_raw(addr, len, libc::PROT_NONE, fl, -1, 0).map(|a| a as i64)
        });
    }

    /// Unmaps a run page: with munmap, or `reserve` inside a slot.
    fn release(&mut self, addr: u64, len: u64, in_slot: bool) {
        if in_slot {
            self.reserve(addr, len);
        } else {
            let _ = self.call(Call::Munmap, -1, addr, len, OK, || munmap_raw(addr, len));
        }
    }

    fn op_munmap(&mut self) {
        if self.maps.is_empty() {
            return;
        }
        let i = self.rng.below(self.maps.len() as u64) as usize;
        let m = self.maps.swap_remove(i);
        self.release(m.addr, m.len, m.in_slot);
    }

    fn op_mprotect(&mut self) {
        if self.maps.is_empty() {
            return;
        }
        let i = self.rng.below(self.maps.len() as u64) as usize;
        let rw = libc::PROT_READ | libc::PROT_WRITE;
        let prot = self.rng.pick(&[
            libc::PROT_READ,
            rw,
            libc::PROT_NONE,
            libc::PROT_WRITE,
            libc::PROT_READ | libc::PROT_EXEC,
            rw | libc::PROT_EXEC,
        ]);
        let m = self.maps[i];
        // The run page can never become executable (api.rst 4.9).
        let expect = if prot & libc::PROT_EXEC != 0 { b(EACCES) } else { OK };
        let r = self.call(Call::Mprotect, -1, m.addr, prot as u64, expect, || mprotect_raw(m.addr, m.len, prot));
        if r.is_ok() {
            self.maps[i].prot = prot;
        }
    }

    fn op_mremap(&mut self) {
        if self.maps.is_empty() {
            return;
        }
        let i = self.rng.below(self.maps.len() as u64) as usize;
        let m = self.maps[i];
        let grow = self.rng.below(3) != 0;
        let new_len = if grow { m.len + PAGE * self.rng.range(1, 4) } else { m.len };
        let flags = if self.rng.one_in(2) { libc::MREMAP_MAYMOVE } else { 0 };
        // The run page cannot be grown (VM_DONTEXPAND): EFAULT.
        let expect = if grow { b(EFAULT) } else { OK };
        let r = self.call(Call::Mremap, -1, m.addr, new_len, expect, || {
            // SAFETY: Remaps a run page the fuzzer mapped; Rust holds no
            // reference to it.
            let p = unsafe { libc::mremap(m.addr as *mut libc::c_void, m.len as usize, new_len as usize, flags) };
            if p == libc::MAP_FAILED {
                Err(t::errno())
            } else {
                Ok(p as i64)
            }
        });
        if let Ok(p) = r {
            self.maps[i].addr = p as u64;
            self.maps[i].len = new_len;
            if p as u64 != m.addr || new_len != m.len {
                self.violate(format!("mremap of a run page to {new_len} bytes moved or grew it"));
                self.maps.swap_remove(i);
                if p as u64 == m.addr {
                    self.release(m.addr, new_len, m.in_slot);
                } else {
                    let _ = munmap_raw(p as u64, new_len);
                    if m.in_slot {
                        self.reserve(m.addr, m.len);
                    }
                }
            }
        }
    }

    fn op_immediate_exit(&mut self) {
        let cands: Vec<usize> = (0..self.maps.len()).filter(|&i| self.maps[i].prot & libc::PROT_WRITE != 0).collect();
        if cands.is_empty() {
            return;
        }
        let m = self.maps[self.rng.pick(&cands)];
        let v = self.rng.one_in(2);
        // SAFETY: A writable mapping of a run page (tracked).
        unsafe { (m.addr as *mut u8).write_volatile(v as u8) };
        self.ofds[m.ofd].imm = v;
    }

    fn op_read_write(&mut self, f: FileSlot, write: bool) {
        let k = self.rng.pick(&KERNEL_ADDRS);
        let buf = self.rng.pick(&[self.arena, 0, k]);
        let small = self.rng.below(PAGE);
        let len = self.rng.pick(&[0, 1, 8, PAGE, u64::MAX >> 1, small]);
        let fd = f.fd;
        if write {
            let _ = self.call(Call::Write, fd, buf, len, b(EINVAL), || {
                // SAFETY: The kernel refuses the write before reading the
                // buffer (the file has no write method): EINVAL.
                sysret(unsafe { libc::write(fd, buf as *const libc::c_void, len as usize) } as i64)
            });
        } else {
            let _ = self.call(Call::Read, fd, buf, len, b(EINVAL), || {
                // SAFETY: As above: EINVAL before the buffer is touched; a
                // valid buffer is the scratch page.
                sysret(unsafe { libc::read(fd, buf as *mut libc::c_void, len.min(PAGE) as usize) } as i64)
            });
        }
    }

    // -- eventfds -----------------------------------------------------------

    fn op_eventfd(&mut self) {
        let i = self.rng.below(MAX_EFDS as u64) as usize;
        match self.rng.below(10) {
            0..=3 => {
                let e = self.efds[i];
                match e {
                    Some(e) => {
                        let v = self.rng.range(1, 4);
                        let _ = self.call(Call::EfdSignal, e.fd, v, 0, OK, || efd_write(e.fd, v));
                    }
                    None => {
                        if let Ok(fd) = self.call(Call::Eventfd, -1, 0, 0, OK, eventfd_raw) {
                            self.efds[i] = Some(Efd { fd: fd as i32, ctx: self.next_ctx });
                            self.next_ctx += 1;
                        }
                    }
                }
            }
            4..=5 => {
                if let Some(e) = self.efds[i] {
                    let _ = self.call(Call::EfdRead, e.fd, 0, 0, OK | b(EAGAIN), || efd_read(e.fd));
                }
            }
            6..=7 => {
                if let Some(e) = self.efds[i].take() {
                    let _ = self.call(Call::Close, e.fd, 0, 0, OK, || close_raw(e.fd));
                    self.closed_fd = e.fd;
                }
            }
            _ => {
                let j = self.rng.below(MAX_EFDS as u64) as usize;
                if let (Some(e), true) = (self.efds[i], self.efds[j].is_none()) {
                    if let Ok(fd) = self.call(Call::Dup, e.fd, 0, 0, OK, || dup_raw(e.fd)) {
                        self.efds[j] = Some(Efd { fd: fd as i32, ctx: e.ctx });
                    }
                }
            }
        }
    }

    // -- guest memory -------------------------------------------------------

    /// Unmaps slot `i` (if mapped) and maps fresh guest RAM with code in it.
    fn slot_remap(&mut self, i: usize) {
        if let Some(s) = self.slots[i].take() {
            self.forget_maps_in(s.addr, s.len);
            let _ = self.call(Call::Memory, -1, s.addr, s.len, OK, || munmap_raw(s.addr, s.len));
        }
        let odd = 2 * MIB + PAGE * self.rng.range(1, 64);
        let len = self.rng.pick(&[2 * MIB, 4 * MIB, odd, MIB + 16 * PAGE]);
        let rw = libc::PROT_READ | libc::PROT_WRITE;
        let anon = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS;
        if let Ok(addr) =
            self.call(Call::Memory, -1, 0, len, OK, || mmap_raw(0, len, rw, anon, -1, 0).map(|a| a as i64))
        {
            self.slots[i] = Some(Slot { addr: addr as u64, len, clean: true, entries: vec![] });
            self.slot_code(i, CODE);
            self.slot_fill(i);
        }
    }

    fn slot_code(&mut self, i: usize, off: u64) {
        let Some(s) = &self.slots[i] else { return };
        let (addr, len) = (s.addr, s.len);
        let code = guest_code(&mut self.rng, len);
        if off + code.len() as u64 > len {
            return;
        }
        poke(addr + off, &code);
        let s = self.slots[i].as_mut().expect("checked above");
        if s.entries.len() >= 4 {
            s.entries.remove(0);
        }
        s.entries.push(off);
    }

    /// Random bytes somewhere, often over lguest_data (so the async ring
    /// and blocked_interrupts are random too) or the code.
    fn slot_fill(&mut self, i: usize) {
        let Some(s) = &self.slots[i] else { return };
        let (addr, len) = (s.addr, s.len);
        let start = match self.rng.below(4) {
            0 => DATA,
            1 => CODE + self.rng.below(0x400),
            _ => self.rng.below(len),
        };
        let n = self.rng.range(1, 4 * PAGE).min(len - start.min(len));
        let mut junk = vec![0u8; n as usize];
        if !self.rng.one_in(4) {
            self.rng.fill(&mut junk);
        }
        poke(addr + start, &junk);
    }

    fn op_memory(&mut self) {
        let i = self.rng.below(MAX_SLOTS as u64) as usize;
        let what = self.rng.below(100);
        if self.slots[i].is_none() || what < 12 {
            self.slot_remap(i);
            return;
        }
        let Some(i) = self.slots[i].as_ref().filter(|s| s.clean).map(|_| i) else {
            return;
        };
        let (addr, len) = {
            let s = self.slots[i].as_ref().expect("checked above");
            (s.addr, s.len)
        };
        match what {
            12..=44 => {
                let off = if self.rng.one_in(2) { CODE } else { CODE + self.rng.below(len - CODE - 0x400) };
                self.slot_code(i, off);
            }
            45..=84 => self.slot_fill(i),
            85..=89 => {
                // A hole in guest RAM.
                let page = addr + PAGE * self.rng.below(len / PAGE);
                self.reserve(page, PAGE);
                self.slots[i].as_mut().expect("checked above").clean = false;
            }
            90..=94 => {
                let prot = self.rng.pick(&[libc::PROT_READ, libc::PROT_NONE]);
                let _ = self.call(Call::Memory, -1, addr, prot as u64, OK, || mprotect_raw(addr, len, prot));
                self.slots[i].as_mut().expect("checked above").clean = false;
            }
            _ => {
                // Fresh zero pages under pinned ones: the guest keeps its
                // pages, the host's copies go to the new ones.
                let _ =
                    self.call(Call::Memory, -1, addr, len, OK, || {
                        // SAFETY: Guest RAM the fuzzer mapped; Rust holds no
                        // reference to it.
                        sysret(unsafe { libc::madvise(addr as *mut libc::c_void, len as usize, libc::MADV_DONTNEED) }
                            as i64)
                    });
                self.slot_code(i, CODE);
            }
        }
    }

    // -- fork ---------------------------------------------------------------

    /// A child inherits the open files: it tries CREATE_VM (from its copy of
    /// guest RAM), CREATE_VCPU, RUN, GET_REGS and IRQ on each, and exits;
    /// VMs it created outlive it (their owner is gone: RUN gives EPERM).
    fn op_fork(&mut self) {
        let Some(si) = self.clean_slot() else { return };
        let s = self.slots[si].as_ref().expect("clean_slot");
        let entry = *s.entries.last().unwrap_or(&CODE);
        let cfg = abi::LguestVmConfig {
            mem_base: s.addr,
            mem_size: s.len,
            device_pages: 0,
            entry: if entry < s.len { entry } else { CODE },
            flags: 0,
            reserved0: 0,
            reserved: [0; 4],
        };
        let files: Vec<FileSlot> = self.files.iter().flatten().copied().collect();
        if files.is_empty() {
            return;
        }
        let irq = if self.rng.one_in(4) { 64 } else { self.rng.below(64) };
        let mut fds = [-1i32; MAX_FILES];
        for (k, f) in files.iter().enumerate() {
            fds[k] = f.fd;
        }
        let nf = files.len();
        let mut pipe = [0i32; 2];
        // SAFETY: `pipe` has room for two descriptors.
        if unsafe { libc::pipe2(pipe.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            self.violate(format!("pipe2: {}", t::errname(t::errno())));
            return;
        }
        self.forks += 1;
        self.trace(Call::Fork, -1, nf as u64, 0);
        // SAFETY: The child only makes raw system calls on data prepared
        // above (no allocation, no locks) and leaves with _exit.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            child(&fds[..nf], &cfg, irq, pipe[1]);
        }
        close_raw(pipe[1]).ok();
        let mut res = [0i32; 5 * MAX_FILES];
        let want = 5 * nf * 4;
        let mut got = 0usize;
        while got < want {
            // SAFETY: Reads into the rest of `res`.
            let r = unsafe { libc::read(pipe[0], (res.as_mut_ptr() as *mut u8).add(got).cast(), want - got) };
            if r > 0 {
                got += r as usize;
            } else if r == 0 || t::errno() != EINTR {
                break;
            }
        }
        close_raw(pipe[0]).ok();
        let mut status = 0;
        loop {
            // SAFETY: Waits for our own child.
            let w = unsafe { libc::waitpid(pid, &mut status, 0) };
            if w == pid || t::errno() != EINTR {
                break;
            }
        }
        self.done(Call::Fork, -1, nf as u64, 0, 0, ANY);
        if pid < 0 || got < want || !libc::WIFEXITED(status) || libc::WEXITSTATUS(status) != 0 {
            self.violate(format!("fork child: pid {pid}, {got} of {want} result bytes, status {status:#x}"));
            return;
        }
        self.child_calls += 5 * nf as u64;
        let mut created_here = vec![false; self.ofds.len()];
        for (k, f) in files.iter().enumerate() {
            let r = &res[5 * k..5 * k + 5];
            let o = &self.ofds[f.ofd];
            let e = if o.vm { b(EEXIST) } else { OK | b(ENOMEM) };
            self.done(Call::CreateVm, f.fd, cfg.mem_base, cfg.mem_size, r[0], e);
            if r[0] == 0 {
                let o = &mut self.ofds[f.ofd];
                *o = Ofd {
                    vm: true,
                    ours: false,
                    binds: std::mem::take(&mut o.binds),
                    notifiers: std::mem::take(&mut o.notifiers),
                    ..Default::default()
                };
                created_here[f.ofd] = true;
            }
            let o = &self.ofds[f.ofd];
            let e = if !o.vm {
                b(ENOENT)
            } else if o.vcpu {
                b(EBUSY)
            } else {
                OK | b(ENOMEM)
            };
            self.done(Call::CreateVcpu, f.fd, 0, 0, r[1], e);
            if r[1] == 0 {
                let o = &mut self.ofds[f.ofd];
                o.vcpu = true;
                o.imm = false;
                o.dead = Some(false);
            }
            let o = &self.ofds[f.ofd];
            let e = if !o.vm {
                b(ENOENT)
            } else if !o.vcpu {
                b(EINVAL)
            } else if !created_here[f.ofd] {
                b(EPERM) // not the child's VM
            } else if o.imm {
                b(EINTR)
            } else {
                OK | b(EINTR) | b(ENOMEM)
            };
            self.done(Call::Run, f.fd, 0, 1, r[2], e);
            if r[2] == 0 {
                self.ofds[f.ofd].dead = None;
            }
            let o = &self.ofds[f.ofd];
            let e = if !o.vm {
                b(ENOENT)
            } else if !o.vcpu {
                b(EINVAL)
            } else {
                OK
            };
            self.done(Call::GetRegs, f.fd, 0, 1, r[3], e);
            self.done(Call::Irq, f.fd, irq, 1, r[4], if irq < 64 { OK } else { b(EINVAL) });
        }
    }

    // -- the loop -----------------------------------------------------------

    fn step(&mut self) {
        self.n += 1;
        let fi = self.rng.below(MAX_FILES as u64) as usize;
        let w = self.rng.below(1000);
        // Operations that need no lguest file.
        match w {
            0..=9 => return self.op_open(fi),
            10..=17 => return self.op_close(),
            18..=23 => return self.op_dup(),
            24..=53 => return self.op_munmap(),
            54..=68 => return self.op_mprotect(),
            69..=78 => return self.op_mremap(),
            79..=103 => return self.op_immediate_exit(),
            104..=168 => return self.op_eventfd(),
            169..=238 => return self.op_memory(),
            239..=240 => return self.op_fork(),
            _ => {}
        }
        let Some(f) = self.file(fi) else { return };
        match w {
            241..=255 => self.op_version(f),
            256..=345 => self.op_create_vm(f),
            346..=395 => self.op_create_vcpu(f),
            396..=535 => self.op_run(f),
            536..=595 => self.op_get_regs(f),
            596..=655 => self.op_set_regs(f),
            656..=695 => self.op_irq(f),
            696..=745 => self.op_irqfd(f),
            746..=805 => self.op_ioeventfd(f),
            806..=820 => self.op_unknown(f),
            821..=835 => self.op_set_cpuid(f),
            836..=925 => self.op_mmap(f),
            926..=962 => self.op_read_write(f, false),
            _ => self.op_read_write(f, true),
        }
    }

    fn cleanup(&mut self) {
        for m in std::mem::take(&mut self.maps) {
            let _ = munmap_raw(m.addr, m.len);
        }
        for f in self.files.iter_mut().filter_map(|f| f.take()) {
            let _ = close_raw(f.fd);
        }
        for e in self.efds.iter_mut().filter_map(|e| e.take()) {
            let _ = close_raw(e.fd);
        }
        for s in self.slots.iter_mut().filter_map(|s| s.take()) {
            let _ = munmap_raw(s.addr, s.len);
        }
        let _ = munmap_raw(self.arena, 4 * PAGE);
        let _ = munmap_raw(self.ro_region, 2 * MIB);
        let _ = munmap_raw(self.none_region, 2 * MIB);
        if self.kmsg >= 0 {
            let _ = close_raw(self.kmsg);
        }
    }
}

/// The forked child of `op_fork`: raw system calls only, results through
/// the pipe, then _exit.
fn child(fds: &[i32], cfg: &abi::LguestVmConfig, irq: u64, out: i32) -> ! {
    install(libc::SIGALRM, on_sigalrm);
    let tick = libc::timeval { tv_sec: 0, tv_usec: 20_000 };
    let it = libc::itimerval { it_interval: tick, it_value: tick };
    // SAFETY: Arms a periodic SIGALRM (handled) that kicks RUN out of a
    // guest that spins.
    unsafe { libc::setitimer(libc::ITIMER_REAL, &it, std::ptr::null_mut()) };
    let mut res = [0i32; 5 * MAX_FILES];
    let mut regs = abi::LguestVcpuRegs::default();
    for (k, &fd) in fds.iter().enumerate() {
        res[5 * k] = code_of(&ioctl_raw(fd, abi::LGUEST_CREATE_VM, cfg as *const _ as u64));
        res[5 * k + 1] = code_of(&ioctl_raw(fd, abi::LGUEST_CREATE_VCPU, 0));
        res[5 * k + 2] = code_of(&ioctl_raw(fd, abi::LGUEST_RUN, 0));
        res[5 * k + 3] = code_of(&ioctl_raw(fd, abi::LGUEST_GET_REGS, &mut regs as *mut _ as u64));
        res[5 * k + 4] = code_of(&ioctl_raw(fd, abi::LGUEST_IRQ, irq));
    }
    // SAFETY: Writes the results from a valid buffer, then ends the child
    // without running any destructor or atexit handler.
    unsafe {
        libc::write(out, res.as_ptr().cast(), 5 * fds.len() * 4);
        libc::_exit(0)
    }
}

/// Kicks the main thread with SIGUSR1 while one RUN lasts longer than
/// KICK_AFTER (again every KICK_AFTER until it returns).
fn watchdog(target: u64, stop: &AtomicBool, kicks: &AtomicU64) {
    let (mut seen, mut since) = (0u64, Instant::now());
    while !stop.load(SeqCst) {
        let s = RUN_SEQ.load(SeqCst);
        if s == 0 {
            seen = 0;
        } else if s != seen {
            (seen, since) = (s, Instant::now());
        } else if since.elapsed() >= KICK_AFTER {
            let _ = kick(target);
            kicks.fetch_add(1, SeqCst);
            since = Instant::now();
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

fn single_thread() -> TestResult {
    let seed = seed_for("single_thread", 0);
    println!("# seed {} (single_thread stream {seed:#x})", base_seed());
    let ops = scaled(100_000);
    let budget = Duration::from_secs(80);
    let mut fz = Fuzz::new(seed).map_err(t::NotPassed::Fail)?;
    let stop = AtomicBool::new(false);
    let kicks = AtomicU64::new(0);
    let me = pthread_self_u64();
    let start = Instant::now();
    let mut stopped_early = false;
    std::thread::scope(|s| {
        s.spawn(|| watchdog(me, &stop, &kicks));
        while fz.n < ops {
            if fz.n % 512 == 0 && start.elapsed() > budget {
                stopped_early = true;
                break;
            }
            fz.step();
        }
        stop.store(true, SeqCst);
    });
    fz.cleanup();
    let secs = start.elapsed().as_secs_f64();
    fz.stats.calls += fz.child_calls;
    account(&fz.stats);
    RAN_SINGLE.store(true, SeqCst);
    println!(
        "# single_thread: {} operations, {} calls ({} ioctls, {} in {} forked children) in {secs:.1} s; \
         {} watchdog kicks",
        fz.n,
        fz.stats.calls,
        fz.stats.ioctls,
        fz.child_calls,
        fz.forks,
        kicks.load(SeqCst)
    );
    fz.stats.print();
    if stopped_early {
        println!("# single_thread: stopped after {} of {ops} operations (time budget)", fz.n);
    }
    if !fz.violations.is_empty() {
        fail!("seed {}: {} unexpected results:\n{}", base_seed(), fz.violations.len(), fz.violations.join("\n"));
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// four_threads_one_vm
// ---------------------------------------------------------------------------

/// State shared by the four threads of a round.
struct Round {
    /// Each thread's own descriptor (a dup of the file); `closed` guards
    /// the number against reuse between C's dup2 and the owner's close.
    fds: [i32; 4],
    closed: [Mutex<bool>; 4],
    stop: AtomicBool,
    a_thread: AtomicU64,
    a_done: AtomicBool,
    yanked: AtomicBool,
    /// Operations done, per thread.
    progress: [AtomicU64; 4],
    /// A's RUN that first reported the guest killed (0: none seen).
    killed_at: AtomicU64,
    kill_message: Mutex<String>,
    /// A's RUNs when B unmapped guest RAM (0: not yet).
    unmapped_at: AtomicU64,
    /// Where guest RAM was.
    guest_addr: u64,
    guest: Mutex<Option<Mapping>>,
    /// The run page for immediate_exit (only in rounds that use it).
    run_page: Option<Mapping>,
    violations: Mutex<Vec<String>>,
}

impl Round {
    fn check(&self, st: &mut Stats, who: &str, call: Call, code: Code, expect: Ex) {
        st.note(call, code);
        let doc = call.documented();
        if doc & b(code) == 0 || expect & b(code) == 0 {
            let mut v = self.violations.lock().unwrap_or_else(|e| e.into_inner());
            if v.len() < 20 {
                v.push(format!(
                    "thread {who}, op {}: {} gave {}, expected {} (documented {})",
                    st.calls,
                    call.name(),
                    ename(code),
                    describe(expect),
                    describe(doc)
                ));
            }
        }
    }

    /// An ioctl result of thread A or B: ENOTTY is fine once C replaced
    /// their descriptors (read after the call: C sets the flag first).
    fn check_yankable(&self, st: &mut Stats, who: &str, call: Call, code: Code, mut expect: Ex) {
        if self.yanked.load(SeqCst) {
            expect |= b(ENOTTY);
        }
        self.check(st, who, if code == ENOTTY { Call::Unknown } else { call }, code, expect);
    }

    /// Closes thread `i`'s descriptor (whatever it refers to now).
    fn close_own(&self, st: &mut Stats, i: usize) {
        let mut closed = self.closed[i].lock().unwrap_or_else(|e| e.into_inner());
        if !*closed {
            let r = close_raw(self.fds[i]);
            self.check(st, "?", Call::Close, code_of(&r), OK);
            *closed = true;
        }
    }

    /// Whether B, C and D should stop: A is done, or time is up.
    fn over(&self) -> bool {
        self.a_done.load(SeqCst) || self.stop.load(SeqCst)
    }
}

struct RoundPlan {
    /// RUNs for A; the others go on while A runs.
    qa: u64,
    /// B unmaps (or, with `remap`, replaces) guest RAM when A has made this
    /// many RUNs.
    munmap_at: Option<u64>,
    remap: bool,
    /// C replaces A's and B's descriptors when A has made this many RUNs.
    yank_at: Option<u64>,
    /// B points RIP at zeroed RAM (the guest dies) when A has made this
    /// many RUNs.
    kill_at: Option<u64>,
    imm: bool,
}

/// Most operations B or C make per RUN of A (beyond a head start): C is
/// much faster than A, whose RUNs last until D's next signal.
const PER_RUN: u64 = 5;
/// A cap on B's and C's operations in a round, in case A is stuck.
const CAP: u64 = 100_000;
/// After this long a round stops (A after its current RUN, then the
/// others), so that the test stays within its time on slow hosts.
const ROUND_TIME: Duration = Duration::from_secs(15);

/// A: RUN, kicked out by D's signals.
fn thread_a(r: &Round, plan: &RoundPlan) -> Stats {
    let mut st = Stats::default();
    r.a_thread.store(pthread_self_u64(), SeqCst);
    let fd = r.fds[0];
    let mut after_unmap = [0u64; 2];
    for i in 0..plan.qa {
        if r.stop.load(SeqCst) {
            break;
        }
        let res = ioctl_raw(fd, abi::LGUEST_RUN, 0);
        let code = code_of(&res);
        r.check_yankable(&mut st, "A", Call::Run, code, OK | b(EINTR) | b(ENOMEM));
        if let Some(p) = &r.run_page {
            if code == 0 && p.read::<u32>(4) == abi::LGUEST_EXIT_KILLED && r.killed_at.load(SeqCst) == 0 {
                r.killed_at.store(i + 1, SeqCst);
                let msg: [u8; abi::LGUEST_MESSAGE_LEN] = p.read(128);
                let end = msg.iter().position(|&c| c == 0).unwrap_or(msg.len());
                *r.kill_message.lock().unwrap_or_else(|e| e.into_inner()) =
                    String::from_utf8_lossy(&msg[..end]).into_owned();
            }
            p.put::<u8>(0, 0);
        }
        r.progress[0].fetch_add(1, SeqCst);
        if code == ENOTTY {
            break; // C replaced our descriptor with an eventfd
        }
        // Interrupts are pending (C and D raise them, the guest never
        // enables them), so every entry reads lguest_data. Once B unmapped
        // guest RAM, the host still reads it, through the pages pinned at
        // CREATE_VM (api.rst: one memory for host and guest): the guest must
        // not die of it.
        let unmapped = r.unmapped_at.load(SeqCst);
        if unmapped != 0 {
            after_unmap[if code == 0 { 0 } else { 1 }] += 1;
            let msg = r.kill_message.lock().unwrap_or_else(|e| e.into_inner()).clone();
            if msg.contains("no longer") {
                let mut v = r.violations.lock().unwrap_or_else(|e| e.into_inner());
                v.push(format!(
                    "thread A: guest RAM ({:#x}) was unmapped at RUN {unmapped} and the guest was killed for it at RUN \
                     {} ({msg}): the host must use the pinned pages (RUNs since: {} returned 0, {} EINTR)",
                    r.guest_addr,
                    i + 1,
                    after_unmap[0],
                    after_unmap[1],
                ));
                break;
            }
        }
    }
    r.a_done.store(true, SeqCst);
    r.close_own(&mut st, 0);
    st
}

/// Waits while `who` is more than PER_RUN operations per RUN ahead of A.
fn pace(r: &Round, who: usize) {
    while !r.over() && r.progress[who].load(SeqCst) > PER_RUN * r.progress[0].load(SeqCst) + 500 {
        std::thread::sleep(Duration::from_micros(100));
    }
}

/// B: GET/SET_REGS (clamped by the host), refused CREATE_VCPU/CREATE_VM;
/// at `munmap_at`, unmaps (or replaces) guest RAM under the running guest.
fn thread_b(r: &Round, plan: &RoundPlan, mut rng: Rng) -> Stats {
    let mut st = Stats::default();
    let fd = r.fds[1];
    let mut buf = abi::LguestVcpuRegs::default();
    let mut munmapped = false;
    let mut killed = false;
    for _ in 0..CAP {
        pace(r, 1);
        if r.over() {
            break;
        }
        if !munmapped && plan.munmap_at.is_some_and(|m| r.progress[0].load(SeqCst) >= m) {
            munmapped = true;
            let mut g = r.guest.lock().unwrap_or_else(|e| e.into_inner());
            if plan.remap {
                if let Some(m) = g.as_ref() {
                    let rw = libc::PROT_READ | libc::PROT_WRITE;
                    let fl = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED;
                    let res = mmap_raw(m.addr as u64, m.len as u64, rw, fl, -1, 0);
                    r.check(&mut st, "B", Call::Memory, code_of(&res), OK);
                }
            } else {
                drop(g.take());
                st.note(Call::Memory, 0);
                // An interrupt pending makes the next entry read lguest_data.
                let res = ioctl_raw(fd, abi::LGUEST_IRQ, 5);
                r.check_yankable(&mut st, "B", Call::Irq, code_of(&res), OK);
                r.unmapped_at.store(r.progress[0].load(SeqCst).max(1), SeqCst);
            }
        }
        let (call, res, expect) = match rng.below(100) {
            0..=44 => {
                let bad = rng.one_in(30);
                let vcpu = if rng.one_in(30) { rng.pick(&[1, u32::MAX]) } else { 0 };
                buf.vcpu = vcpu;
                buf.pad = 0;
                let p = if bad { rng.pick(&KERNEL_ADDRS) } else { &mut buf as *mut abi::LguestVcpuRegs as u64 };
                let e = if bad {
                    b(EFAULT)
                } else if vcpu != 0 {
                    b(EINVAL)
                } else {
                    OK
                };
                (Call::GetRegs, ioctl_raw(fd, abi::LGUEST_GET_REGS, p), e | b(EBUSY))
            }
            45..=89 => {
                let mut regs = abi::LguestRegs {
                    rax: rng.next(),
                    rbx: rng.edge(),
                    rcx: rng.next(),
                    rdx: rng.edge(),
                    rsi: rng.next(),
                    rdi: rng.edge(),
                    rbp: rng.next(),
                    r8: rng.edge(),
                    r9: rng.next(),
                    r10: rng.edge(),
                    r11: rng.next(),
                    r12: rng.edge(),
                    r13: rng.next(),
                    r14: rng.edge(),
                    r15: rng.next(),
                    rip: SPIN_JMP,
                    rsp: rng.range(MIB, 4 * MIB),
                    // No TF: a single-step trap would kill the guest.
                    rflags: rng.next() & !0x100,
                };
                if rng.one_in(16) {
                    // Through the NOTIFY of MSG again: a NOTIFY exit, or
                    // (bound by C) a signal and no exit.
                    regs.rip = SPIN_NOTIFY;
                }
                let mut e = OK;
                if killed || plan.kill_at.is_some_and(|k| r.progress[0].load(SeqCst) >= k) {
                    // From now on: zeroes, `add %al,(%rax)` faults.
                    killed = true;
                    regs.rip = 0x30_0000;
                }
                match rng.below(1000) {
                    1..=30 => {
                        regs.rip = rng.pick(&[TOP, abi::GUEST_VA_END, 1 << 47, abi::GUEST_UPPER_START - 1]);
                        e = b(EINVAL);
                    }
                    31..=60 => {
                        regs.rsp = rng.pick(&[TOP, abi::GUEST_VA_END + 8, 1 << 47, 0xffff_8000_0000_1000]);
                        e = b(EINVAL);
                    }
                    _ => {}
                }
                buf = abi::LguestVcpuRegs { vcpu: 0, pad: 0, regs };
                if rng.one_in(40) {
                    buf.pad = 1;
                    e = b(EINVAL);
                }
                let p = &mut buf as *mut abi::LguestVcpuRegs as u64;
                (Call::SetRegs, ioctl_raw(fd, abi::LGUEST_SET_REGS, p), e | b(EBUSY))
            }
            90..=94 => (Call::CreateVcpu, ioctl_raw(fd, abi::LGUEST_CREATE_VCPU, 0), b(EBUSY)),
            _ => {
                // Readable (the regs buffer: any bytes) gives EEXIST: the
                // file has its VM; unreadable gives EFAULT.
                let bad = rng.one_in(3);
                let p = if bad { rng.pick(&KERNEL_ADDRS) } else { &mut buf as *mut abi::LguestVcpuRegs as u64 };
                // EBUSY: A's RUN holds the VM (the check for an existing VM
                // needs the VM's lock too).
                let e = if bad { b(EFAULT) } else { b(EEXIST) | b(EBUSY) };
                (Call::CreateVm, ioctl_raw(fd, abi::LGUEST_CREATE_VM, p), e)
            }
        };
        let code = code_of(&res);
        r.check_yankable(&mut st, "B", call, code, expect);
        if call == Call::GetRegs && code == 0 && (buf.regs.rflags & 0x3202) != 0x202 {
            r.check(&mut st, "B (rflags after GET_REGS)", Call::GetRegs, EINVAL, OK);
        }
        r.progress[1].fetch_add(1, SeqCst);
        if code == ENOTTY {
            break;
        }
    }
    r.close_own(&mut st, 1);
    st
}

/// C: LGUEST_IRQ, irqfd bind/unbind (modelled exactly: C is the only one
/// binding), eventfd signals; at `yank_at`, dup2()s an eventfd over A's and
/// B's descriptors, so that the file's last references go away under them.
fn thread_c(r: &Round, plan: &RoundPlan, mut rng: Rng) -> Stats {
    let mut st = Stats::default();
    let fd = r.fds[2];
    let mut efds = [-1i32; 4];
    for e in efds.iter_mut() {
        let res = eventfd_raw();
        r.check(&mut st, "C", Call::Eventfd, code_of(&res), OK);
        *e = res.unwrap_or(-1) as i32;
    }
    let mut binds: Vec<(usize, u32)> = Vec::new();
    // ioeventfd bindings: (address, index in `efds`).
    let mut nots: Vec<(u64, usize)> = Vec::new();
    let mut yanked = false;
    for _ in 0..CAP {
        pace(r, 2);
        if r.over() {
            break;
        }
        if !yanked && plan.yank_at.is_some_and(|y| r.progress[0].load(SeqCst) >= y) {
            yanked = true;
            if let Ok(tmp) = eventfd_raw() {
                r.yanked.store(true, SeqCst);
                for victim in [0usize, 1] {
                    let closed = r.closed[victim].lock().unwrap_or_else(|e| e.into_inner());
                    if !*closed {
                        // SAFETY: Replaces a descriptor this program owns and
                        // keeps open (the lock): no number dangles.
                        let res = sysret(unsafe { libc::dup2(tmp as i32, r.fds[victim]) } as i64);
                        r.check(&mut st, "C", Call::Yank, code_of(&res), OK);
                    }
                }
                let _ = close_raw(tmp as i32);
            }
        }
        match rng.below(100) {
            0..=39 => {
                let irq = if rng.below(10) < 9 { rng.below(64) } else { rng.pick(&[64, u64::MAX, 1 << 32]) };
                let res = ioctl_raw(fd, abi::LGUEST_IRQ, irq);
                r.check(&mut st, "C", Call::Irq, code_of(&res), if irq < 64 { OK } else { b(EINVAL) });
            }
            40..=64 => {
                let k = rng.below(4) as usize;
                let irq = if rng.below(20) < 19 { rng.below(64) as u32 } else { 64 };
                let deassign = rng.one_in(2);
                let mut req = abi::LguestIrqfd {
                    fd: efds[k],
                    irq,
                    flags: if deassign { abi::LGUEST_IRQFD_DEASSIGN } else { 0 },
                    pad: 0,
                };
                let pos = binds.iter().position(|&x| x == (k, irq));
                let expect = if irq >= 64 {
                    b(EINVAL)
                } else if deassign {
                    if pos.is_some() {
                        OK
                    } else {
                        b(ENOENT)
                    }
                } else if binds.len() >= abi::LGUEST_MAX_IRQFDS {
                    b(ENOSPC)
                } else if pos.is_some() {
                    b(EEXIST)
                } else {
                    OK | b(ENOMEM)
                };
                let res = ioctl_raw(fd, abi::LGUEST_IRQFD, &mut req as *mut _ as u64);
                r.check(&mut st, "C", Call::Irqfd, code_of(&res), expect);
                if res.is_ok() {
                    match (deassign, pos) {
                        (true, Some(p)) => {
                            binds.remove(p);
                        }
                        (false, None) => binds.push((k, irq)),
                        _ => {}
                    }
                }
            }
            65..=84 => {
                // While A runs: bind and unbind notification addresses,
                // MSG among them (B now and then sends the guest through
                // its NOTIFY of MSG: an exit to A, or a signal of an
                // eventfd of ours, whichever the binding says as the
                // hypercall runs).
                let k = rng.below(4) as usize;
                let addr = notify_addr(&mut rng);
                let (nfd, kind) = match rng.below(20) {
                    0..=16 => (efds[k], 0),
                    17 => (fd, 1),     // not an eventfd: EINVAL
                    18 => (-1, 1),     // negative: EINVAL
                    _ => (1 << 20, 2), // not open: EBADF
                };
                let flags = match rng.below(40) {
                    0..=21 => 0,
                    22..=38 => abi::LGUEST_IOEVENTFD_DEASSIGN,
                    _ => rng.pick(&[2, 3, u32::MAX]),
                };
                let bad = rng.one_in(40);
                let mut req = abi::LguestIoeventfd { addr, fd: nfd, flags };
                let pos = nots.iter().position(|&(a, _)| a == addr);
                let expect = if bad {
                    b(EFAULT)
                } else if addr >= TOP {
                    b(EINVAL)
                } else if flags == abi::LGUEST_IOEVENTFD_DEASSIGN {
                    if pos.is_some() {
                        OK
                    } else {
                        b(ENOENT)
                    }
                } else if flags != 0 || nfd < 0 {
                    b(EINVAL)
                } else if nots.len() >= abi::LGUEST_MAX_IOEVENTFDS {
                    b(ENOSPC)
                } else if pos.is_some() {
                    b(EEXIST)
                } else if kind == 1 {
                    b(EINVAL)
                } else if kind == 2 {
                    b(EBADF)
                } else {
                    OK | b(ENOMEM)
                };
                let ptr = if bad { rng.pick(&KERNEL_ADDRS) } else { &mut req as *mut _ as u64 };
                let res = ioctl_raw(fd, abi::LGUEST_IOEVENTFD, ptr);
                r.check(&mut st, "C", Call::Ioeventfd, code_of(&res), expect);
                if res.is_ok() {
                    match (flags, pos) {
                        (abi::LGUEST_IOEVENTFD_DEASSIGN, Some(p)) => {
                            nots.remove(p);
                        }
                        (0, None) => nots.push((addr, k)),
                        _ => {}
                    }
                }
            }
            85..=91 => {
                let k = rng.below(4) as usize;
                let res = efd_write(efds[k], 1);
                r.check(&mut st, "C", Call::EfdSignal, code_of(&res), OK);
            }
            92..=94 => {
                let k = rng.below(4) as usize;
                let res = efd_read(efds[k]);
                r.check(&mut st, "C", Call::EfdRead, code_of(&res), OK | b(EAGAIN));
            }
            _ => {
                let res = ioctl_raw(fd, abi::LGUEST_GET_API_VERSION, 0);
                r.check(&mut st, "C", Call::Version, code_of(&res), OK);
            }
        }
        r.progress[2].fetch_add(1, SeqCst);
    }
    r.close_own(&mut st, 2);
    for e in efds {
        let _ = close_raw(e);
    }
    st
}

/// D: SIGUSR1 to A every ~0.2 ms until A is done; meanwhile maps and unmaps
/// the run page, and makes calls that take no VM lock (so that it never
/// waits for A's RUN, which only its signals end).
fn thread_d(r: &Round, mut rng: Rng) -> Stats {
    let mut st = Stats::default();
    let fd = r.fds[3];
    while r.a_thread.load(SeqCst) == 0 && !r.a_done.load(SeqCst) {
        std::thread::yield_now();
    }
    let a = r.a_thread.load(SeqCst);
    let mut maps: Vec<u64> = Vec::new();
    let rw = libc::PROT_READ | libc::PROT_WRITE;
    // Until A is done, even after `stop`: only these signals end its RUNs.
    while !r.a_done.load(SeqCst) {
        let res = kick(a);
        st.note(Call::Signal, code_of(&res));
        if !r.stop.load(SeqCst) {
            match rng.below(100) {
                0..=29 => {
                    if maps.len() >= 2 {
                        let m = maps.remove(0);
                        r.check(&mut st, "D", Call::Munmap, code_of(&munmap_raw(m, PAGE)), OK);
                    }
                    let res = mmap_raw(0, PAGE, rw, libc::MAP_SHARED, fd, 0);
                    r.check(&mut st, "D", Call::Mmap, code_of(&res), OK | b(ENOMEM));
                    if let Ok(m) = res {
                        maps.push(m);
                    }
                }
                30..=44 => {
                    if let Some(m) = maps.pop() {
                        r.check(&mut st, "D", Call::Munmap, code_of(&munmap_raw(m, PAGE)), OK);
                    }
                }
                45..=54 => {
                    let res = mmap_raw(0, PAGE, rw, libc::MAP_SHARED, fd, PAGE);
                    r.check(&mut st, "D", Call::Mmap, code_of(&res), b(EINVAL));
                    if let Ok(m) = res {
                        let _ = munmap_raw(m, PAGE);
                    }
                }
                55..=74 => {
                    let res = ioctl_raw(fd, abi::LGUEST_GET_API_VERSION, 0);
                    r.check(&mut st, "D", Call::Version, code_of(&res), OK);
                }
                75..=84 => {
                    let mut byte = [0u8; 8];
                    // SAFETY: An 8-byte buffer; the kernel refuses anyway.
                    let res = sysret(unsafe { libc::read(fd, byte.as_mut_ptr().cast(), 8) } as i64);
                    r.check(&mut st, "D", Call::Read, code_of(&res), b(EINVAL));
                }
                _ => {
                    let res = ioctl_raw(fd, abi::LGUEST_IRQ, rng.below(64));
                    r.check(&mut st, "D", Call::Irq, code_of(&res), OK);
                }
            }
        }
        r.progress[3].fetch_add(1, SeqCst);
        std::thread::sleep(Duration::from_micros(200));
    }
    for m in maps {
        r.check(&mut st, "D", Call::Munmap, code_of(&munmap_raw(m, PAGE)), OK);
    }
    r.close_own(&mut st, 3);
    st
}

fn run_round(k: u64, rng: &mut Rng, total: &mut Stats) -> Result<String, String> {
    const MEM: usize = 4 << 20;
    let f = t::open_dev().map_err(|e| format!("open: {e}"))?;
    let mem = Mapping::anon(MEM).map_err(|e| format!("mmap: {e}"))?;
    mem.write(CODE as usize, GUEST_SPIN);
    let mut cfg = abi::LguestVmConfig {
        mem_base: mem.addr as u64,
        mem_size: MEM as u64,
        device_pages: 0,
        entry: CODE,
        flags: 0,
        reserved0: 0,
        reserved: [0; 4],
    };
    t::ioctl_ptr(&f, abi::LGUEST_CREATE_VM, &mut cfg).map_err(|e| format!("CREATE_VM: {}", t::errname(e)))?;
    t::ioctl(&f, abi::LGUEST_CREATE_VCPU, 0).map_err(|e| format!("CREATE_VCPU: {}", t::errname(e)))?;
    let qa = scaled(3000);
    // Rounds 0, 1, 3, 4 unmap guest RAM (1 and 4 replace it instead), 2
    // and 5 kill the guest late; odd rounds replace A's and B's
    // descriptors; even ones use immediate_exit.
    let plan = RoundPlan {
        qa,
        munmap_at: (k % 3 != 2).then(|| rng.range(qa / 2, qa)),
        remap: k % 3 == 1,
        yank_at: (k % 2 == 1).then(|| rng.range(qa / 2, qa)),
        kill_at: (k % 3 == 2).then(|| qa * 9 / 10),
        imm: k.is_multiple_of(2),
    };
    // The first RUN registers lguest_data and stops at the NOTIFY, before
    // B's registers can skip that: from then on every entry with an
    // interrupt pending reads lguest_data through guest RAM.
    let page = Mapping::shared(&f, PAGE as usize, 0).map_err(|e| format!("mmap run page: {}", t::errname(e)))?;
    t::ioctl(&f, abi::LGUEST_RUN, 0).map_err(|e| format!("first RUN: {}", t::errname(e)))?;
    if page.read::<u32>(4) != abi::LGUEST_EXIT_NOTIFY {
        return Err(format!("first RUN: exit reason {}, expected NOTIFY", page.read::<u32>(4)));
    }
    let run_page = if plan.imm { Some(page) } else { None };
    let mut fds = [-1i32; 4];
    for fd in fds.iter_mut() {
        *fd = dup_raw(std::os::fd::AsRawFd::as_raw_fd(&f)).map_err(|e| format!("dup: {}", t::errname(e)))? as i32;
    }
    drop(f); // from now on the file lives through the threads' dups
    let round = Round {
        fds,
        closed: Default::default(),
        stop: AtomicBool::new(false),
        a_thread: AtomicU64::new(0),
        a_done: AtomicBool::new(false),
        yanked: AtomicBool::new(false),
        progress: Default::default(),
        killed_at: AtomicU64::new(0),
        kill_message: Mutex::new(String::new()),
        unmapped_at: AtomicU64::new(0),
        guest_addr: mem.addr as u64,
        guest: Mutex::new(Some(mem)),
        run_page,
        violations: Mutex::new(Vec::new()),
    };
    if let Some(p) = &round.run_page {
        KICK_BYTE.store(p.addr, SeqCst);
    }
    let (rb, rc, rd) = (Rng(rng.next()), Rng(rng.next()), Rng(rng.next()));
    let start = Instant::now();
    let stats: Vec<Stats> = std::thread::scope(|s| {
        let hs = [
            s.spawn(|| thread_a(&round, &plan)),
            s.spawn(|| thread_b(&round, &plan, rb)),
            s.spawn(|| thread_c(&round, &plan, rc)),
            s.spawn(|| thread_d(&round, rd)),
        ];
        let (mut last, mut since) = (u64::MAX, Instant::now());
        while hs.iter().any(|h| !h.is_finished()) {
            std::thread::sleep(Duration::from_millis(50));
            let now: u64 = round.progress.iter().map(|p| p.load(SeqCst)).sum();
            if now != last {
                (last, since) = (now, Instant::now());
            }
            if start.elapsed() > ROUND_TIME {
                round.stop.store(true, SeqCst);
            }
            if since.elapsed() > Duration::from_secs(30) {
                // A thread is stuck in the kernel: report and leave, since
                // it cannot be joined.
                let p: Vec<u64> = round.progress.iter().map(|p| p.load(SeqCst)).collect();
                let f: Vec<bool> = hs.iter().map(|h| h.is_finished()).collect();
                println!("# four_threads_one_vm: round {k}: no progress for 30 s: operations {p:?}, finished {f:?}");
                std::process::exit(1);
            }
        }
        hs.into_iter().map(|h| h.join().unwrap_or_default()).collect()
    });
    KICK_BYTE.store(std::ptr::null_mut(), SeqCst);
    let secs = start.elapsed().as_secs_f64();
    let mut st = Stats::default();
    for s in &stats {
        st.merge(s);
    }
    total.merge(&st);
    let v = round.violations.into_inner().unwrap_or_else(|e| e.into_inner());
    if !v.is_empty() {
        return Err(format!("round {k}:\n{}", v.join("\n")));
    }
    let killed = match round.killed_at.load(SeqCst) {
        0 => String::new(),
        n => format!(", guest killed at RUN {n} ({})", round.kill_message.lock().unwrap_or_else(|e| e.into_inner())),
    };
    Ok(format!(
        "round {k}: {} calls in {secs:.1} s (A {} B {} C {} D {}){}{}{}{killed}",
        st.calls,
        stats[0].calls,
        stats[1].calls,
        stats[2].calls,
        stats[3].calls,
        if plan.imm { ", immediate_exit" } else { "" },
        match (plan.munmap_at, plan.remap) {
            (Some(_), false) => format!(", guest RAM unmapped at RUN {}", round.unmapped_at.load(SeqCst)),
            (Some(i), true) => format!(", guest RAM replaced at RUN {i}"),
            _ => String::new(),
        },
        plan.yank_at.map(|i| format!(", A's and B's fds replaced at RUN {i}")).unwrap_or_default()
            + &plan.kill_at.map(|i| format!(", bad RIP set at RUN {i}")).unwrap_or_default()
    ))
}

fn four_threads_one_vm() -> TestResult {
    let seed = seed_for("four_threads_one_vm", 0);
    println!("# seed {} (four_threads_one_vm stream {seed:#x})", base_seed());
    let mut rng = Rng(seed);
    let mut total = Stats::default();
    let start = Instant::now();
    let taken0 = SIGNALS_TAKEN.load(SeqCst);
    let mut errors = Vec::new();
    for k in 0..6 {
        match run_round(k, &mut rng, &mut total) {
            Ok(line) => println!("# {line}"),
            Err(e) => errors.push(e),
        }
    }
    let secs = start.elapsed().as_secs_f64();
    account(&total);
    RAN_FOUR.store(true, SeqCst);
    println!(
        "# four_threads_one_vm: {} calls ({} ioctls) in {secs:.1} s; {} signals taken",
        total.calls,
        total.ioctls,
        SIGNALS_TAKEN.load(SeqCst) - taken0
    );
    total.print();
    if !errors.is_empty() {
        fail!("seed {}: unexpected results:\n{}", base_seed(), errors.join("\n"));
    }
    let want = scaled(60_000);
    check!(total.calls >= want, "only {} calls across the four threads (want {want})", total.calls);
    Ok(())
}

// ---------------------------------------------------------------------------
// ioeventfd_notify
// ---------------------------------------------------------------------------

/// LGUEST_IOEVENTFD of `addr` to `fd` with `flags`, the argument read from
/// `arg` (a pointer to a request when None).
fn ioeventfd(lg: i32, addr: u64, fd: i32, flags: u32, arg: Option<u64>) -> Code {
    let mut req = abi::LguestIoeventfd { addr, fd, flags };
    let p = arg.unwrap_or(&mut req as *mut _ as u64);
    code_of(&ioctl_raw(lg, abi::LGUEST_IOEVENTFD, p))
}

/// One RUN of `lg`, kicked by the watchdog (SIGUSR1) when it lasts.
fn run_kicked(lg: i32) -> Code {
    static SEQ: AtomicU64 = AtomicU64::new(1 << 62);
    RUN_SEQ.store(SEQ.fetch_add(1, SeqCst), SeqCst);
    let r = ioctl_raw(lg, abi::LGUEST_RUN, 0);
    RUN_SEQ.store(0, SeqCst);
    code_of(&r)
}

/// The eventfd's count (read, so reset to 0), or the errno.
fn efd_count(fd: i32) -> Result<u64, i32> {
    let mut buf = [0u8; 8];
    // SAFETY: Reads at most 8 bytes into a valid buffer.
    sysret(unsafe { libc::read(fd, buf.as_mut_ptr().cast(), 8) } as i64).map(|_| u64::from_ne_bytes(buf))
}

/// The documented errors of LGUEST_IOEVENTFD one by one, on a file without
/// a VM; then the guest that notifies MSG: with MSG bound, RUN does not
/// return at the NOTIFY (the guest goes on to spin until the watchdog's
/// signal), the eventfd counts 1, RIP is past the hypercall; unbound, RUN
/// returns the NOTIFY exit and the eventfd stays at 0; bound again by
/// another thread while RUN runs, the next NOTIFY signals again.
fn ioeventfd_notify() -> TestResult {
    let f = t::open_dev().map_err(|e| t::NotPassed::Fail(format!("open {}: {e}", t::DEV)))?;
    let efd = eventfd_raw().map_err(|e| t::NotPassed::Fail(format!("eventfd: {}", t::errname(e))))? as i32;
    let efd2 = eventfd_raw().map_err(|e| t::NotPassed::Fail(format!("eventfd: {}", t::errname(e))))? as i32;
    let closed = dup_raw(efd2).map_err(|e| t::NotPassed::Fail(format!("dup: {}", t::errname(e))))? as i32;
    let _ = close_raw(closed);
    let (stop, kicks, me) = (AtomicBool::new(false), AtomicU64::new(0), pthread_self_u64());
    let res = std::thread::scope(|s| {
        s.spawn(|| watchdog(me, &stop, &kicks));
        let r = ioeventfd_notify_body(&f, efd, efd2, closed);
        stop.store(true, SeqCst);
        r
    });
    drop(f); // drops the binding of MSG (and the VM)
    let _ = close_raw(efd);
    let _ = close_raw(efd2);
    println!("# ioeventfd_notify: {} watchdog kicks", kicks.load(SeqCst));
    res
}

fn ioeventfd_notify_body(f: &std::fs::File, efd: i32, efd2: i32, closed: i32) -> TestResult {
    use std::os::fd::AsRawFd;
    let lg = f.as_raw_fd();
    let n = ename;
    // Before CREATE_VM.
    check_eq!(n(ioeventfd(lg, MSG, efd, 0, None)), "ok", "binding MSG before CREATE_VM");
    check_eq!(n(ioeventfd(lg, MSG, efd2, 0, None)), "EEXIST", "binding MSG again");
    check_eq!(n(ioeventfd(lg, MSG, efd, 0, None)), "EEXIST", "binding MSG again, same eventfd");
    check_eq!(n(ioeventfd(lg, DEV_WINDOW, efd, 1, None)), "ENOENT", "unbinding an unbound address");
    check_eq!(n(ioeventfd(lg, TOP, efd, 0, None)), "EINVAL", "address 2^47");
    check_eq!(n(ioeventfd(lg, u64::MAX, efd, 1, None)), "EINVAL", "unbinding address u64::MAX");
    check_eq!(n(ioeventfd(lg, DEV_WINDOW, efd, 2, None)), "EINVAL", "flags 2");
    check_eq!(n(ioeventfd(lg, DEV_WINDOW, efd, u32::MAX, None)), "EINVAL", "flags u32::MAX");
    check_eq!(n(ioeventfd(lg, DEV_WINDOW, -1, 0, None)), "EINVAL", "fd -1");
    check_eq!(n(ioeventfd(lg, DEV_WINDOW, lg, 0, None)), "EINVAL", "fd of /dev/lguest (not an eventfd)");
    check_eq!(n(ioeventfd(lg, DEV_WINDOW, closed, 0, None)), "EBADF", "a closed fd");
    for k in KERNEL_ADDRS {
        check_eq!(n(ioeventfd(lg, DEV_WINDOW, efd, 0, Some(k))), "EFAULT", format!("argument at {k:#x}"));
    }
    // TOP - 1 is an address like any other; 32 bindings at most.
    check_eq!(n(ioeventfd(lg, TOP - 1, efd2, 0, None)), "ok", "binding 2^47 - 1");
    for i in 0..abi::LGUEST_MAX_IOEVENTFDS as u64 - 2 {
        check_eq!(n(ioeventfd(lg, DEV_WINDOW + 8 * i, efd2, 0, None)), "ok", format!("binding {i}"));
    }
    check_eq!(n(ioeventfd(lg, 0, efd2, 0, None)), "ENOSPC", "a 33rd binding");
    check_eq!(n(ioeventfd(lg, 0, -1, 1, None)), "ENOENT", "unbinding 0 (fd ignored)");
    check_eq!(n(ioeventfd(lg, TOP - 1, -1, 1, None)), "ok", "unbinding 2^47 - 1 (fd ignored)");
    check_eq!(n(ioeventfd(lg, 0, efd2, 0, None)), "ok", "binding 0 after an unbinding");
    check_eq!(n(ioeventfd(lg, 0, efd2, 1, None)), "ok", "unbinding 0");
    for i in 0..abi::LGUEST_MAX_IOEVENTFDS as u64 - 2 {
        check_eq!(n(ioeventfd(lg, DEV_WINDOW + 8 * i, efd2, 1, None)), "ok", format!("unbinding {i}"));
    }

    // The guest: INIT, NOTIFY(MSG), spin.
    let mem = Mapping::anon(4 << 20).map_err(|e| t::NotPassed::Fail(format!("mmap: {e}")))?;
    mem.write(CODE as usize, GUEST_SPIN);
    let mut cfg = abi::LguestVmConfig {
        mem_base: mem.addr as u64,
        mem_size: mem.len as u64,
        device_pages: 0,
        entry: CODE,
        flags: 0,
        reserved0: 0,
        reserved: [0; 4],
    };
    check_eq!(t::ioctl_ptr(f, abi::LGUEST_CREATE_VM, &mut cfg), Ok(0), "CREATE_VM");
    check_eq!(t::ioctl(f, abi::LGUEST_CREATE_VCPU, 0), Ok(0), "CREATE_VCPU");
    let run = Mapping::shared(f, PAGE as usize, 0)
        .map_err(|e| t::NotPassed::Fail(format!("mmap run page: {}", t::errname(e))))?;
    let regs = |what: &str| -> Result<abi::LguestVcpuRegs, t::NotPassed> {
        let mut r = abi::LguestVcpuRegs::default();
        t::ioctl_ptr(f, abi::LGUEST_GET_REGS, &mut r)
            .map_err(|e| t::NotPassed::Fail(format!("GET_REGS {what}: {}", t::errname(e))))?;
        Ok(r)
    };
    let renotify = || -> TestResult {
        let mut r = regs("before the NOTIFY again")?;
        r.regs.rip = SPIN_NOTIFY;
        check_eq!(t::ioctl_ptr(f, abi::LGUEST_SET_REGS, &mut r), Ok(0), "SET_REGS (RIP at the NOTIFY)");
        Ok(())
    };

    // Bound (before CREATE_VM): no NOTIFY exit; the eventfd counts 1.
    for round in 0..3 {
        run.put::<u32>(4, 0);
        check_eq!(n(run_kicked(lg)), "EINTR", format!("RUN {round} with MSG bound (the guest spins)"));
        check_eq!(efd_count(efd), Ok(1), format!("the eventfd's count after RUN {round}"));
        check_eq!(efd_count(efd2).map_err(ename), Err("EAGAIN".to_string()), "the other eventfd's count");
        check_eq!(regs("after the NOTIFY")?.regs.rip, SPIN_JMP, "RIP after a bound NOTIFY");
        renotify()?;
    }
    // Spinning: no more signals.
    renotify()?;
    check_eq!(n(run_kicked(lg)), "EINTR", "RUN with MSG bound");
    check_eq!(n(run_kicked(lg)), "EINTR", "RUN of the spinning guest");
    check_eq!(efd_count(efd), Ok(1), "the eventfd's count after one NOTIFY and a spin");

    // Unbound: the NOTIFY exits to us again.
    check_eq!(n(ioeventfd(lg, MSG, -1, 1, None)), "ok", "unbinding MSG under a VM");
    check_eq!(n(ioeventfd(lg, MSG, -1, 1, None)), "ENOENT", "unbinding MSG again");
    renotify()?;
    check_eq!(n(run_kicked(lg)), "ok", "RUN with MSG unbound");
    check_eq!(run.read::<u32>(4), abi::LGUEST_EXIT_NOTIFY, "exit reason with MSG unbound");
    check_eq!(run.read::<u64>(8), MSG, "notify address");
    check_eq!(run.read::<u64>(16), 0, "notify argument");
    check_eq!(efd_count(efd).map_err(ename), Err("EAGAIN".to_string()), "the eventfd after an unbound NOTIFY");

    // Bound by another thread while RUN runs (the guest spins): the
    // ioctl does not wait for RUN.
    let mut rebind: Result<(Code, Duration), String> = Err("not made".into());
    std::thread::scope(|s| {
        let h = s.spawn(|| {
            let t0 = Instant::now();
            while RUN_SEQ.load(SeqCst) == 0 && t0.elapsed() < Duration::from_secs(5) {
                std::thread::yield_now();
            }
            std::thread::sleep(Duration::from_millis(5));
            let t1 = Instant::now();
            let c = ioeventfd(lg, MSG, efd2, 0, None);
            (c, t1.elapsed(), RUN_SEQ.load(SeqCst) != 0)
        });
        let c = run_kicked(lg);
        match h.join() {
            Ok((b, took, during)) if c == EINTR => {
                rebind = Ok((b, took));
                if !during {
                    println!("# ioeventfd_notify: the binding came after RUN returned ({took:?})");
                }
            }
            Ok(_) => rebind = Err(format!("RUN of the spinning guest gave {}", ename(c))),
            Err(_) => rebind = Err("the binding thread panicked".into()),
        }
    });
    let (code, took) = rebind.map_err(t::NotPassed::Fail)?;
    check_eq!(n(code), "ok", "binding MSG from another thread during RUN");
    println!("# ioeventfd_notify: the binding during RUN took {took:?}");
    renotify()?;
    check_eq!(n(run_kicked(lg)), "EINTR", "RUN with MSG bound again");
    check_eq!(efd_count(efd2), Ok(1), "the new eventfd's count");
    check_eq!(efd_count(efd).map_err(ename), Err("EAGAIN".to_string()), "the old eventfd's count");
    check_eq!(regs("after the NOTIFY")?.regs.rip, SPIN_JMP, "RIP after a bound NOTIFY");

    // An eventfd closed by us stays bound (the binding holds it).
    check_eq!(n(ioeventfd(lg, MSG, -1, 1, None)), "ok", "unbinding MSG");
    let tmp = eventfd_raw().map_err(|e| t::NotPassed::Fail(format!("eventfd: {}", t::errname(e))))? as i32;
    let keep = dup_raw(tmp).map_err(|e| t::NotPassed::Fail(format!("dup: {}", t::errname(e))))? as i32;
    check_eq!(n(ioeventfd(lg, MSG, tmp, 0, None)), "ok", "binding MSG to a fresh eventfd");
    let _ = close_raw(tmp);
    renotify()?;
    check_eq!(n(run_kicked(lg)), "EINTR", "RUN with MSG bound to an eventfd whose fd was closed");
    let c = efd_count(keep);
    let _ = close_raw(keep);
    check_eq!(c, Ok(1), "the count of the eventfd (through a dup) whose bound fd was closed");
    drop(run);
    drop(mem);
    Ok(())
}

// ---------------------------------------------------------------------------
// host_alive
// ---------------------------------------------------------------------------

fn tainted() -> u64 {
    std::fs::read_to_string("/proc/sys/kernel/tainted").ok().and_then(|s| s.trim().parse().ok()).unwrap_or(0)
}

fn host_alive() -> TestResult {
    let f = t::open_dev().map_err(|e| t::NotPassed::Fail(format!("open {}: {e}", t::DEV)))?;
    check_eq!(t::ioctl(&f, abi::LGUEST_GET_API_VERSION, 0), Ok(abi::LGUEST_API_VERSION as i32), "api version");
    let mem = Mapping::anon(4 << 20).map_err(|e| t::NotPassed::Fail(format!("mmap: {e}")))?;
    mem.write(CODE as usize, GUEST_OK);
    mem.write(MSG as usize, b"bye\0");
    let mut cfg = abi::LguestVmConfig {
        mem_base: mem.addr as u64,
        mem_size: mem.len as u64,
        device_pages: 0,
        entry: CODE,
        flags: 0,
        reserved0: 0,
        reserved: [0; 4],
    };
    check_eq!(t::ioctl_ptr(&f, abi::LGUEST_CREATE_VM, &mut cfg), Ok(0), "CREATE_VM");
    check_eq!(t::ioctl(&f, abi::LGUEST_CREATE_VCPU, 0), Ok(0), "CREATE_VCPU");
    let run = Mapping::shared(&f, PAGE as usize, 0)
        .map_err(|e| t::NotPassed::Fail(format!("mmap run page: {}", t::errname(e))))?;
    check_eq!(t::ioctl(&f, abi::LGUEST_RUN, 0), Ok(0), "first RUN");
    check_eq!(run.read::<u32>(4), abi::LGUEST_EXIT_NOTIFY, "exit reason");
    check_eq!(run.read::<u64>(8), MSG, "notify address");
    check_eq!(run.read::<u64>(16), 0x42, "notify argument");
    check_eq!(t::ioctl(&f, abi::LGUEST_RUN, 0), Ok(0), "second RUN");
    check_eq!(run.read::<u32>(4), abi::LGUEST_EXIT_SHUTDOWN, "exit reason");
    check_eq!(run.read::<u64>(24), abi::LGUEST_SHUTDOWN_POWEROFF, "shutdown reason");
    check_eq!(run.read::<[u8; 4]>(128), *b"bye\0", "shutdown message");
    drop(run);
    drop(f);

    // Taint bits a kernel report sets: M (machine check), B (bad page),
    // D (oops), W (warning), L (soft lockup).
    let bits: [(u32, char); 5] = [(4, 'M'), (5, 'B'), (7, 'D'), (9, 'W'), (14, 'L')];
    let (t0, t1) = (TAINT_AT_START.load(SeqCst), tainted());
    let new: String =
        bits.iter().filter(|(bit, _)| t1 & (1 << bit) != 0 && t0 & (1 << bit) == 0).map(|x| x.1).collect();
    check!(new.is_empty(), "the kernel became tainted during the fuzzing: {new} (taint {t0:#x} -> {t1:#x})");

    std::thread::sleep(Duration::from_millis(300));
    let (free0, free1) = (MEMFREE_AT_START.load(SeqCst), t::meminfo("MemFree"));
    println!("# MemFree {free0} -> {free1} KiB");
    if !t::debug_kernel() && RAN_SINGLE.load(SeqCst) {
        // Leaked pins of guest RAM would show here (tens of MiB).
        check!(free1 + 64 * 1024 >= free0, "MemFree fell by {} KiB over the fuzzing", free0.saturating_sub(free1));
    }

    let (calls, ioctls) = (TOTAL_CALLS.load(SeqCst), TOTAL_IOCTLS.load(SeqCst));
    println!("# total calls {calls} ({ioctls} ioctls)");
    if RAN_SINGLE.load(SeqCst) && RAN_FOUR.load(SeqCst) && scale() >= 1.0 {
        check!(calls >= 100_000, "only {calls} calls in all (want at least 100000)");
    }
    Ok(())
}

fn main() -> ExitCode {
    TAINT_AT_START.store(tainted(), SeqCst);
    MEMFREE_AT_START.store(t::meminfo("MemFree"), SeqCst);
    install(libc::SIGUSR1, on_sigusr1);
    base_seed();
    t::run(&[
        ("single_thread", single_thread),
        ("four_threads_one_vm", four_threads_one_vm),
        ("ioeventfd_notify", ioeventfd_notify),
        ("host_alive", host_alive),
    ])
}
