// SPDX-License-Identifier: GPL-2.0
//! `lguest run`: sets a guest up through `/dev/lguest` and runs its vCPU
//! until it stops.
//!
//! The steps: map guest memory, load the ELF image, write the command line
//! (so a bad guest or command line is reported even without the module),
//! open the device and check its ABI version, `LGUEST_CREATE_VM`,
//! `LGUEST_CREATE_VCPU`, map the run page, set the boot registers (GET_REGS,
//! then SET_REGS with RIP, RDI and RSI changed), install the signal handlers,
//! and loop on `LGUEST_RUN`, handing each exit to [`exit::handle_exit`].
//!
//! Devices: the models are built from [`DeviceOptions`] before the VM (so a
//! missing disk or tap is reported early), put on the lguest bus right
//! after `LGUEST_CREATE_VM` (which writes the device table into the device
//! window), their kicks bound with `LGUEST_IOEVENTFD` (if the module lacks
//! it, `ENOTTY`, the vCPU thread passes kicks on itself) and their
//! interrupts with `LGUEST_IRQFD` (else `LGUEST_IRQ`). Each device gets a
//! thread in the same scope as the vCPU loop; when the loop ends, the bus
//! is shut down and the scope joins them.

use std::ffi::OsString;
use std::fs::File;
use std::io::{self, Write};
use std::os::fd::{AsFd, AsRawFd};
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use lguest_abi as abi;

use crate::boot;
use crate::cpuid::{self, CpuidMode};
use crate::dev::{DevError, ExitData, Lguest, RunPage};
use crate::exit::{self, Action};
use crate::linux;
use crate::loader;
use crate::memory::{GuestMemory, Size};
use crate::sandbox::{self, Role, SeccompMode};
use crate::signals;
use crate::virtio::block::{Block, DiskOptions};
use crate::virtio::bus::{Bus, EventFdIrq, IoctlIrq, IrqLine};
use crate::virtio::console::{Console, ConsoleMode};
use crate::virtio::net::{Net, NetOptions, TapSource};
use crate::virtio::rng::Rng;
use crate::virtio::tap::Tap;
use crate::virtio::term::RawTerminal;
use crate::virtio::VirtioDevice;

/// Pages of the device window above guest RAM.
pub const DEVICE_PAGES: u64 = 1;

/// What `lguest run` was asked to do.
#[derive(Debug)]
pub struct RunOptions {
    /// The lguest device node.
    pub device: PathBuf,
    /// Bytes of guest RAM (already checked by `boot::parse_mem_size`).
    pub mem_size: u64,
    /// The guest ELF image.
    pub guest: PathBuf,
    /// The guest's arguments, joined with spaces into its command line.
    pub args: Vec<OsString>,
    /// Raise an interrupt periodically from another thread: (period in
    /// milliseconds, IRQ). For testing interrupt delivery.
    pub irq_every: Option<(u64, u32)>,
    /// The seccomp filters' mode (`None`: on where the kernel has them).
    pub seccomp: Option<SeccompMode>,
    /// What the guest's CPUID says (`None`: filtered for a Linux guest,
    /// the host's otherwise).
    pub cpuid: Option<CpuidMode>,
    /// A Linux guest's initramfs.
    pub initrd: Option<PathBuf>,
    /// The devices on the lguest bus.
    pub devices: DeviceOptions,
}

/// `--stats`: how the counters are printed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StatsFormat {
    /// Lines for people.
    Text,
    /// One JSON object per report.
    Json,
}

impl std::str::FromStr for StatsFormat {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "text" => Ok(Self::Text),
            "json" => Ok(Self::Json),
            _ => Err(format!("{s:?}: expected text or json")),
        }
    }
}

/// Which devices the guest gets, and how they run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceOptions {
    /// The virtio console.
    pub console: ConsoleMode,
    /// The hypercall console (the guest's early output).
    pub serial: ConsoleMode,
    /// The virtio console's escape key on a terminal (`--escape`).
    pub escape: Option<u8>,
    /// A virtio entropy device.
    pub rng: bool,
    /// Block devices.
    pub disks: Vec<DiskOptions>,
    /// Network devices.
    pub nets: Vec<NetOptions>,
    /// Bind kicks with `LGUEST_IOEVENTFD` (off: every kick exits to the
    /// vCPU thread, for comparison).
    pub ioeventfd: bool,
    /// Serve kicks on the vCPU thread before the guest goes on (implies no
    /// ioeventfds): lguest's structure in 2009, for the benchmarks.
    pub sync_kicks: bool,
    /// Print the counters at exit, in this format.
    pub stats: Option<StatsFormat>,
}

/// `path` opened for appending (created if missing).
fn append(path: &std::path::Path) -> io::Result<File> {
    std::fs::OpenOptions::new().create(true).append(true).open(path)
}

/// How long the console's input waits after the driver is ready for the
/// driver's first output (`Console::with_input_hold`): far longer than
/// virtio_console takes from giving the receive queue buffers to listing
/// its port, short enough that a guest that reads before it writes is not
/// kept waiting.
const INPUT_HOLD: std::time::Duration = std::time::Duration::from_millis(500);

/// The device models `opts` asks for, in bus order.
fn models(opts: &DeviceOptions) -> Result<Vec<Box<dyn VirtioDevice>>> {
    let mut v: Vec<Box<dyn VirtioDevice>> = Vec::new();
    match &opts.console {
        ConsoleMode::Off => {}
        ConsoleMode::Tty => {
            let input = io::stdin().as_fd().try_clone_to_owned().map(File::from).context("duplicating stdin")?;
            let terminal = crate::virtio::term::is_terminal(input.as_raw_fd());
            let mut c = Console::with_writer_thread(Some(input), Box::new(io::stdout()))
                .context("starting the console's writer")?
                .with_input_hold(INPUT_HOLD);
            if terminal {
                c = c.with_window_size().context("the console's SIGWINCH eventfd")?;
                if let Some(key) = opts.escape {
                    eprintln!(
                        "lguest: the escape key is {k}: {k} x stops the guest, {k} ? shows the commands",
                        k = crate::virtio::console::describe_key(key)
                    );
                    c = c.with_escape(key);
                }
            }
            v.push(Box::new(c));
        }
        ConsoleMode::File(path) => {
            let out = append(path).with_context(|| format!("opening the console file {}", path.display()))?;
            v.push(Box::new(
                Console::with_writer_thread(None, Box::new(out)).context("starting the console's writer")?,
            ));
        }
        ConsoleMode::Pty => {
            let (master, path) = crate::virtio::console::open_pty().context("opening a pseudo-terminal")?;
            let out = master.try_clone().context("duplicating the pty")?;
            eprintln!("lguest: virtio console on {path}");
            v.push(Box::new(
                Console::with_writer_thread(Some(master), Box::new(out))
                    .context("starting the console's writer")?
                    .with_input_hold(INPUT_HOLD),
            ));
        }
    }
    if opts.rng {
        v.push(Box::new(Rng));
    }
    for (n, disk) in opts.disks.iter().enumerate() {
        let blk = Block::open(disk, n).with_context(|| format!("opening disk {}", disk.path.display()))?;
        v.push(Box::new(blk));
    }
    for (n, net) in opts.nets.iter().enumerate() {
        let (tap, name) = match &net.tap {
            TapSource::Name(name) => {
                (Tap::open(name).with_context(|| format!("opening tap device {name}"))?, name.clone())
            }
            TapSource::Fd(fd) => Tap::from_fd(*fd).with_context(|| format!("taking the tap of --net fd={fd}"))?,
        };
        let io = tap.try_clone_file().context("duplicating the tap fd")?;
        let mac = net.mac.unwrap_or_else(|| crate::virtio::net::default_mac(&name));
        log::info!("net{n}: tap {name}, MAC {}", crate::virtio::net::mac_text(&mac));
        v.push(Box::new(Net::new(io, Box::new(tap), &name, net.batch, n).with_mac(mac).with_offload(net.offload)));
    }
    Ok(v)
}

/// Device `irq`'s interrupt line: an eventfd bound with `LGUEST_IRQFD`, or
/// `LGUEST_IRQ` if that fails.
fn irq_line(lg: &Lguest, irq: u32) -> Box<dyn IrqLine + '_> {
    let bound = vmm_sys_util::eventfd::EventFd::new(vmm_sys_util::eventfd::EFD_NONBLOCK)
        .map_err(|e| e.to_string())
        .and_then(|fd| {
            use std::os::fd::AsRawFd;
            lg.irqfd(fd.as_raw_fd(), irq).map(|()| fd).map_err(|e| format!("{:#}", anyhow::Error::new(e)))
        });
    match bound {
        Ok(fd) => Box::new(EventFdIrq(fd)),
        Err(e) => {
            log::info!("irq {irq}: no irqfd ({e}); using LGUEST_IRQ");
            Box::new(IoctlIrq { lg, irq })
        }
    }
}

/// Binds every queue's kick eventfd to its address. A module without
/// `LGUEST_IOEVENTFD` (`ENOTTY`) is not an error: the kicks then exit to
/// the vCPU thread, which passes them on (`Bus::notify`), so nothing else
/// changes and the caller needs no answer.
fn bind_kicks(lg: &Lguest, bus: &Bus<'_>) -> Result<()> {
    for (addr, fd) in bus.kick_fds() {
        match lg.ioeventfd(addr, fd) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::ENOTTY) => {
                log::info!("the module has no LGUEST_IOEVENTFD: queue kicks go through the vCPU thread");
                return Ok(());
            }
            Err(e) => {
                return Err(DevError::Ioctl { what: "LGUEST_IOEVENTFD", source: e })
                    .with_context(|| format!("binding notification address {addr:#x}"));
            }
        }
    }
    Ok(())
}

/// Runs the guest and returns the launcher's exit status.
pub fn run(opts: &RunOptions) -> Result<u8> {
    // Every thread from here on (device models start some: the console's
    // writer) starts with the signals blocked; only the vCPU thread
    // unblocks them (signals.rs).
    signals::block();
    sandbox::prepare(opts.seccomp)?;
    // The test hook of lguest_devices_test's seccomp test: the first device
    // thread makes a forbidden system call.
    let selftest = std::env::var_os("LGUEST_SECCOMP_SELFTEST").is_some();
    let mem = GuestMemory::new(opts.mem_size, DEVICE_PAGES)?;
    let image = loader::load_file(&opts.guest, &mem)?;
    for seg in &image.segments {
        log::debug!("segment {} {} ({:#x} bytes from the file)", seg.index, seg.range(), seg.filesz);
    }
    let line = boot::join_args(&opts.args)?;
    let cmdline = boot::write_cmdline(&mem, &line)?;
    // RSI: a Linux guest's boot_params, another guest's RAM size.
    let rsi = if image.linux {
        let layout = linux::setup(&mem, &image, line.len(), opts.initrd.as_deref())?;
        log::info!("Linux boot_params at {:#x}, initramfs {:?}", layout.boot_params, layout.initrd);
        layout.boot_params
    } else if opts.initrd.is_some() {
        return Err(linux::LinuxError::NotLinux(opts.guest.display().to_string()).into());
    } else {
        mem.mem_size()
    };
    let cpuid_mode = opts.cpuid.unwrap_or(if image.linux { CpuidMode::Filtered } else { CpuidMode::Host });
    log::info!(
        "{}: entry {:#x}, {} of RAM, command line {:?}",
        opts.guest.display(),
        image.entry,
        Size(mem.mem_size()),
        String::from_utf8_lossy(&line)
    );

    let models = models(&opts.devices)?;
    let lg = Lguest::open(&opts.device)?;
    let version = lg.api_version()?;
    if version != abi::LGUEST_API_VERSION {
        bail!("ABI mismatch: the module speaks {version}, this launcher {}", abi::LGUEST_API_VERSION);
    }
    let config = abi::LguestVmConfig {
        mem_base: mem.host_base()?,
        mem_size: mem.mem_size(),
        device_pages: mem.device_pages(),
        entry: image.entry,
        flags: 0,
        reserved0: 0,
        reserved: [0; 4],
    };
    lg.create_vm(&config)?;
    if cpuid_mode == CpuidMode::Filtered {
        let table = cpuid::filter(cpuid::host_table());
        log::debug!("CPUID table: {} entries", table.len());
        lg.set_cpuid(&table).context("setting the guest's CPUID (--cpuid filtered)")?;
    }
    let bus = Bus::new(&mem, models, |irq| irq_line(&lg, irq)).context("setting up the lguest bus")?;
    bus.set_vcpu_kick(Box::new(signals::kick_vcpu));
    if opts.devices.sync_kicks {
        bus.set_sync_kicks(true);
    } else if opts.devices.ioeventfd && !bus.is_empty() {
        bind_kicks(&lg, &bus)?;
    }
    let vcpu = lg.create_vcpu()?;
    let page = lg.map_run_page(vcpu)?;
    let regs = lg.get_regs(vcpu)?;
    lg.set_regs(vcpu, &boot::boot_regs(regs, image.entry, cmdline, rsi))?;

    // A fresh page has it clear; say so rather than rely on it.
    page.set_immediate_exit(false);
    // Everything is open and the VM exists: no capability is needed any
    // more. The threads started from here inherit the empty sets.
    sandbox::drop_capabilities()?;
    let _watchdog =
        signals::Watchdog::start(signals::GRACE, signals::WatchdogHooks { on_exit: crate::virtio::term::restore_now })?;
    let guard = signals::install(&page)?;
    let term = if opts.devices.console == ConsoleMode::Tty {
        match RawTerminal::enter() {
            Ok(t) => t,
            Err(e) => {
                log::warn!("cannot put the terminal in raw mode: {e}");
                None
            }
        }
    } else {
        None
    };
    let mut stdout: Box<dyn Write> = match &opts.devices.serial {
        ConsoleMode::Off => Box::new(io::sink()),
        ConsoleMode::File(path) => {
            Box::new(append(path).with_context(|| format!("opening the serial file {}", path.display()))?)
        }
        ConsoleMode::Tty | ConsoleMode::Pty => Box::new(StopAwareStdout),
    };
    let stop = std::sync::atomic::AtomicBool::new(false);
    let result = std::thread::scope(|scope| {
        for index in 0..bus.len() {
            let bus = &bus;
            scope.spawn(move || {
                enter_or_exit(Role::Device);
                if selftest && index == 0 {
                    sandbox::forbidden_syscall();
                }
                bus.run_device(index)
            });
        }
        if let Some((ms, irq)) = opts.irq_every {
            let (lg, stop) = (&lg, &stop);
            scope.spawn(move || {
                enter_or_exit(Role::Device);
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    std::thread::sleep(std::time::Duration::from_millis(ms));
                    if let Err(e) = lg.irq(irq) {
                        log::warn!("raising IRQ {irq}: {e}");
                        break;
                    }
                }
            });
        }
        signals::unblock();
        // The table also answers the guest's plain cpuid where this
        // thread can make CPUID fault.
        let faulting = cpuid_mode == CpuidMode::Filtered
            && match cpuid::fault_on_this_thread() {
                Ok(on) => {
                    if !on {
                        log::info!("this host cannot make CPUID fault: the table answers the emulation prefix only");
                    }
                    on
                }
                Err(e) => {
                    log::warn!("arch_prctl(ARCH_SET_CPUID): {e}: the table answers the emulation prefix only");
                    false
                }
            };
        enter_or_exit(Role::Vcpu);
        let index = vcpu;
        let vcpu = DevVcpu { lg: &lg, index, page: &page };
        let format = opts.devices.stats.unwrap_or(StatsFormat::Text);
        let dump = || {
            if !signals::take_dump_request() {
                return false;
            }
            eprint!("{}", report(format, &page, &bus));
            // Where the vCPU stood when the signal brought it back: what a
            // guest that runs on without output is doing.
            match lg.get_regs(index) {
                Ok(r) => eprintln!("vcpu {index}: {}", describe_regs(&r)),
                Err(e) => eprintln!("vcpu {index}: no registers: {e}"),
            }
            page.set_immediate_exit(false);
            true
        };
        let hooks = Hooks {
            stop_signal: &signals::stop_signal,
            fatal: &|| bus.fatal(),
            dump: &dump,
            escaped: &signals::escaped,
        };
        let r = run_loop(&vcpu, &mem, Some(&bus), &mut *stdout, &hooks);
        if faulting {
            if let Err(e) = cpuid::no_fault_on_this_thread() {
                log::warn!("arch_prctl(ARCH_SET_CPUID, 1): {e}");
            }
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        bus.shutdown();
        r
    });
    drop(term);
    drop(guard);
    if let Some(format) = opts.devices.stats {
        eprint!("{}", report(format, &page, &bus));
    }

    let stats = page.stats();
    log::info!("vCPU {vcpu}: {} exits, {} hypercalls", stats.exits, stats.hypercalls);
    result
}

/// Installs `role`'s seccomp filter on the calling thread; a thread that
/// cannot be confined ends the launcher (status 1).
pub fn enter_or_exit(role: Role) {
    if let Err(e) = sandbox::enter(role) {
        eprintln!("lguest: {e}");
        std::process::exit(i32::from(exit::EXIT_LAUNCHER));
    }
}

/// What the run loop needs of a vCPU: a fake stands in for it in tests.
trait Vcpu {
    /// `LGUEST_RUN`, with the raw error so `EINTR` can be told apart.
    fn run(&self) -> io::Result<()>;
    /// The exit data after `run` returned.
    fn exit(&self) -> ExitData;
}

/// A vCPU of `/dev/lguest`.
struct DevVcpu<'a> {
    lg: &'a Lguest,
    index: u32,
    page: &'a RunPage,
}

impl Vcpu for DevVcpu<'_> {
    fn run(&self) -> io::Result<()> {
        self.lg.run(self.index)
    }

    fn exit(&self) -> ExitData {
        self.page.exit()
    }
}

/// The hypercall console's output: stdout, written directly (no buffer)
/// so that a write blocked on a full pipe or a stopped terminal comes back
/// with `EINTR` when a stopping signal arrives, instead of being retried.
struct StopAwareStdout;

impl Write for StopAwareStdout {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        loop {
            // SAFETY: writes from a live slice of `buf.len()` bytes.
            let n = unsafe { libc::write(libc::STDOUT_FILENO, buf.as_ptr().cast(), buf.len()) };
            if n >= 0 {
                // CAST: non-negative and at most buf.len().
                return Ok(n as usize);
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
            if signals::stop_signal().is_some() {
                return Err(io::Error::other("interrupted by a stopping signal"));
            }
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// What the run loop asks between exits; the defaults ([`Hooks::none`])
/// say nothing ever happens (tests).
struct Hooks<'h> {
    /// The first stopping signal, if one came.
    stop_signal: &'h dyn Fn() -> Option<libc::c_int>,
    /// Why the launcher must stop: a device's host side is gone.
    fatal: &'h dyn Fn() -> Option<String>,
    /// SIGUSR1 asked for a statistics dump: print it, clear
    /// `immediate_exit`; true if one was asked for.
    dump: &'h dyn Fn() -> bool,
    /// The user typed the console's escape key to stop.
    escaped: &'h dyn Fn() -> bool,
}

impl Hooks<'static> {
    #[cfg(test)]
    fn none() -> Self {
        Hooks { stop_signal: &|| None, fatal: &|| None, dump: &|| false, escaped: &|| false }
    }
}

/// Runs `vcpu` until an exit stops it, RUN fails, or it returns `EINTR`
/// while `stop_signal()` says a stopping signal N came (the status is then
/// 128 + N), or `fatal()` says a device's host side is gone (an error).
/// Console output goes to `out`; launcher messages to stderr.
fn run_loop(
    vcpu: &dyn Vcpu,
    mem: &GuestMemory,
    bus: Option<&Bus<'_>>,
    out: &mut dyn Write,
    hooks: &Hooks<'_>,
) -> Result<u8> {
    let stopped = |sig: libc::c_int| {
        eprintln!("lguest: interrupted by {}", signals::name(sig));
        Ok(signals::exit_status(sig))
    };
    loop {
        if let Some(why) = (hooks.fatal)() {
            bail!("{why}");
        }
        if (hooks.escaped)() {
            eprintln!("lguest: stopped by the console's escape key");
            return Ok(exit::EXIT_ESCAPE);
        }
        // After a dump, a stopping signal may have come too: look.
        if (hooks.dump)() {
            if let Some(sig) = (hooks.stop_signal)() {
                return stopped(sig);
            }
        }
        if let Err(e) = vcpu.run() {
            if e.raw_os_error() == Some(libc::EINTR) {
                if let Some(sig) = (hooks.stop_signal)() {
                    return stopped(sig);
                }
                // Some other signal (a dump, a kick): run again.
                continue;
            }
            return Err(DevError::Ioctl { what: "LGUEST_RUN", source: e }.into());
        }
        let action = match exit::handle_exit(&vcpu.exit(), mem, bus, out) {
            Ok(action) => action,
            // A console write that a signal cut short.
            Err(_) if (hooks.stop_signal)().is_some() => {
                return stopped((hooks.stop_signal)().unwrap_or(libc::SIGTERM))
            }
            Err(e) => return Err(anyhow::Error::new(e).context("handling a guest exit")),
        };
        match action {
            Action::Continue => {}
            Action::Exit { code, message } => {
                if let Some(message) = message {
                    eprintln!("{message}");
                }
                return Ok(code);
            }
        }
    }
}

/// One line of a vCPU's registers for the SIGUSR1 dump: the instruction
/// and stack pointers and the flags first, then the rest.
fn describe_regs(r: &abi::LguestRegs) -> String {
    format!(
        "rip {:#x} rsp {:#x} rflags {:#x} rax {:#x} rbx {:#x} rcx {:#x} rdx {:#x} rsi {:#x} rdi {:#x} rbp {:#x} \
         r8 {:#x} r9 {:#x} r10 {:#x} r11 {:#x} r12 {:#x} r13 {:#x} r14 {:#x} r15 {:#x}",
        r.rip,
        r.rsp,
        r.rflags,
        r.rax,
        r.rbx,
        r.rcx,
        r.rdx,
        r.rsi,
        r.rdi,
        r.rbp,
        r.r8,
        r.r9,
        r.r10,
        r.r11,
        r.r12,
        r.r13,
        r.r14,
        r.r15
    )
}

/// The `--stats` report of the whole VM: the vCPU's exits and hypercalls
/// (from the run page), the interrupts the devices raised, and each
/// device's counters; as text or as one line of JSON.
fn report(format: StatsFormat, page: &RunPage, bus: &Bus<'_>) -> String {
    let run = page.stats();
    match format {
        StatsFormat::Text => format!(
            "vm: {} exits, {} hypercalls, {} direct syscalls, {} direct sysrets, {} IBPBs, {} shadow reuses, {} device interrupts, {} stray notifications ({} warnings suppressed)\n{}",
            run.exits,
            run.hypercalls,
            run.direct_syscalls,
            run.direct_sysrets,
            run.ibpbs,
            run.shadow_reuses,
            bus.interrupts(),
            exit::STRAY_NOTIFY.count(),
            exit::STRAY_NOTIFY.suppressed(),
            bus.stats()
        ),
        StatsFormat::Json => {
            let v = serde_json::json!({
                "vm": {
                    "exits": run.exits,
                    "hypercalls": run.hypercalls,
                    "direct_syscalls": run.direct_syscalls,
                    "direct_sysrets": run.direct_sysrets,
                    "ibpbs": run.ibpbs,
                    "shadow_reuses": run.shadow_reuses,
                    "device_interrupts": bus.interrupts(),
                    "stray_notifications": exit::STRAY_NOTIFY.count(),
                    "stray_notifications_suppressed": exit::STRAY_NOTIFY.suppressed(),
                },
                "devices": bus.stats_json(),
            });
            format!("{v}\n")
        }
    }
}

#[cfg(test)]
mod tests {
    use std::cell::{Cell, RefCell};
    use std::collections::VecDeque;

    use super::*;
    use crate::virtio::rng::Rng;

    /// A vCPU that replays scripted RUN results.
    struct FakeVcpu {
        script: RefCell<VecDeque<Result<ExitData, i32>>>,
        last: Cell<Option<ExitData>>,
        runs: Cell<usize>,
    }

    impl FakeVcpu {
        fn new(script: Vec<Result<ExitData, i32>>) -> Self {
            Self { script: RefCell::new(script.into()), last: Cell::new(None), runs: Cell::new(0) }
        }
    }

    impl Vcpu for FakeVcpu {
        fn run(&self) -> io::Result<()> {
            self.runs.set(self.runs.get() + 1);
            match self.script.borrow_mut().pop_front() {
                Some(Ok(exit)) => {
                    self.last.set(Some(exit));
                    Ok(())
                }
                Some(Err(errno)) => Err(io::Error::from_raw_os_error(errno)),
                None => panic!("the loop ran past the end of the script"),
            }
        }

        fn exit(&self) -> ExitData {
            self.last.get().expect("exit() before a successful run()")
        }
    }

    fn memory() -> GuestMemory {
        GuestMemory::new(2 << 20, DEVICE_PAGES).expect("memory")
    }

    fn notify(addr: u64) -> ExitData {
        ExitData { notify_addr: addr, ..ExitData::new(abi::LGUEST_EXIT_NOTIFY) }
    }

    fn poweroff() -> ExitData {
        ExitData { shutdown_reason: abi::LGUEST_SHUTDOWN_POWEROFF, ..ExitData::new(abi::LGUEST_EXIT_SHUTDOWN) }
    }

    #[test]
    fn console_then_poweroff() {
        let mem = memory();
        mem.write(0x10_0000, b"Hello\n\0").expect("write");
        mem.write(0x10_1000, b"world\0").expect("write");
        let vcpu = FakeVcpu::new(vec![Ok(notify(0x10_0000)), Ok(notify(0x10_1000)), Ok(poweroff())]);
        let mut out = Vec::new();
        let code = run_loop(&vcpu, &mem, None, &mut out, &Hooks::none()).expect("run");
        assert_eq!(code, 0);
        assert_eq!(out, b"Hello\nworld");
        assert_eq!(vcpu.runs.get(), 3);
    }

    #[test]
    fn eintr_without_a_stopping_signal_runs_again() {
        let mem = memory();
        let vcpu = FakeVcpu::new(vec![Err(libc::EINTR), Err(libc::EINTR), Ok(ExitData::new(abi::LGUEST_EXIT_HALT))]);
        let code = run_loop(&vcpu, &mem, None, &mut Vec::new(), &Hooks::none()).expect("run");
        assert_eq!(code, exit::EXIT_HALT);
        assert_eq!(vcpu.runs.get(), 3);
    }

    #[test]
    fn eintr_after_a_stopping_signal_stops_with_128_plus_n() {
        let mem = memory();
        for (sig, code) in [(libc::SIGINT, 130), (libc::SIGTERM, 143), (libc::SIGHUP, 129), (libc::SIGQUIT, 131)] {
            let vcpu = FakeVcpu::new(vec![Ok(notify(0x10_0000)), Err(libc::EINTR)]);
            let got =
                run_loop(&vcpu, &mem, None, &mut Vec::new(), &Hooks { stop_signal: &|| Some(sig), ..Hooks::none() })
                    .expect("run");
            assert_eq!(got, code, "signal {sig}");
            assert_eq!(vcpu.runs.get(), 2);
        }
    }

    /// A console write cut short by a stopping signal ends the run with
    /// the signal's status, not as a launcher error.
    #[test]
    fn console_write_cut_by_a_signal_is_the_signal() {
        struct Cut;
        impl Write for Cut {
            fn write(&mut self, _: &[u8]) -> io::Result<usize> {
                Err(io::Error::other("interrupted by a stopping signal"))
            }
            fn flush(&mut self) -> io::Result<()> {
                Ok(())
            }
        }
        let mem = memory();
        mem.write(0x10_0000, b"x\0").expect("write");
        let vcpu = FakeVcpu::new(vec![Ok(notify(0x10_0000))]);
        assert_eq!(
            run_loop(&vcpu, &mem, None, &mut Cut, &Hooks { stop_signal: &|| Some(libc::SIGTERM), ..Hooks::none() })
                .expect("run"),
            143
        );
        let vcpu = FakeVcpu::new(vec![Ok(notify(0x10_0000))]);
        assert!(run_loop(&vcpu, &mem, None, &mut Cut, &Hooks::none()).is_err(), "without a signal it is an error");
    }

    /// A device whose host side went away (Bus::fatal) stops the run with
    /// that message as a launcher error, at the next return from RUN.
    #[test]
    fn a_gone_device_stops_the_run() {
        let mem = memory();
        let vcpu = FakeVcpu::new(vec![Ok(notify(0x10_0000)), Err(libc::EINTR)]);
        let gone = std::cell::Cell::new(false);
        let fatal = || {
            let was = gone.replace(true);
            was.then(|| "net0 (lgtap0): reading the tap: gone".to_string())
        };
        let err =
            run_loop(&vcpu, &mem, None, &mut Vec::new(), &Hooks { fatal: &fatal, ..Hooks::none() }).expect_err("stops");
        assert!(format!("{err:#}").contains("net0 (lgtap0)"), "{err:#}");
        assert_eq!(vcpu.runs.get(), 1, "stopped at the next return from RUN");
    }

    /// `--stats=json`: one JSON object with the VM's counters and one
    /// entry per device; the text form has the same figures.
    #[test]
    fn stats_report() {
        struct NoIrq;
        impl crate::virtio::bus::IrqLine for NoIrq {
            fn raise(&self) -> io::Result<()> {
                Ok(())
            }
        }
        let mem = memory();
        let models: Vec<Box<dyn VirtioDevice>> = vec![Box::new(Rng)];
        let bus = Bus::new(&mem, models, |_| Box::new(NoIrq)).expect("bus");
        let page = RunPage::anonymous().expect("page");
        let json = report(StatsFormat::Json, &page, &bus);
        let v: serde_json::Value = serde_json::from_str(json.trim()).expect("valid JSON");
        assert_eq!(v["vm"]["exits"], 0);
        assert_eq!(v["vm"]["hypercalls"], 0);
        assert_eq!(v["vm"]["direct_syscalls"], 0);
        assert_eq!(v["vm"]["direct_sysrets"], 0);
        assert_eq!(v["vm"]["ibpbs"], 0);
        assert_eq!(v["vm"]["shadow_reuses"], 0);
        assert_eq!(v["vm"]["device_interrupts"], 0);
        // A global count (other tests may add to it): present and a number.
        assert!(v["vm"]["stray_notifications"].as_u64() >= v["vm"]["stray_notifications_suppressed"].as_u64());
        assert_eq!(v["devices"][0]["needed_reset"], 0);
        assert_eq!(v["devices"][0]["unoffered_features"], 0);
        assert_eq!(v["devices"][0]["warnings_suppressed"], 0);
        assert_eq!(v["devices"][0]["name"], "rng");
        assert_eq!(v["devices"][0]["queues"].as_array().map(Vec::len), Some(1));
        assert_eq!(v["devices"][0]["queues"][0]["kicks"], 0);
        let text = report(StatsFormat::Text, &page, &bus);
        assert!(
            text.starts_with(
                "vm: 0 exits, 0 hypercalls, 0 direct syscalls, 0 direct sysrets, 0 IBPBs, 0 shadow reuses, 0 device interrupts, "
            ) && text.lines().next().is_some_and(|l| l.contains(" stray notifications ("))
                && text.contains("rng (irq 1)")
                && text
                    .contains("  driver errors: 0 resets needed, 0 unoffered feature sets (0 warnings suppressed)\n"),
            "{text}"
        );
    }

    /// SIGUSR1's dump happens at the loop's next turn, and the run goes on.
    #[test]
    fn a_dump_request_is_served_and_the_run_goes_on() {
        let mem = memory();
        let vcpu = FakeVcpu::new(vec![Err(libc::EINTR), Ok(poweroff())]);
        let asked = Cell::new(1);
        let dumps = Cell::new(0);
        let dump = || {
            if asked.get() == 0 {
                return false;
            }
            asked.set(0);
            dumps.set(dumps.get() + 1);
            true
        };
        let code = run_loop(&vcpu, &mem, None, &mut Vec::new(), &Hooks { dump: &dump, ..Hooks::none() }).expect("run");
        assert_eq!((code, dumps.get(), vcpu.runs.get()), (0, 1, 2));
    }

    #[test]
    fn run_failures_are_errors() {
        let mem = memory();
        let vcpu = FakeVcpu::new(vec![Err(libc::EFAULT)]);
        let err = run_loop(&vcpu, &mem, None, &mut Vec::new(), &Hooks::none()).expect_err("EFAULT");
        assert!(format!("{err:#}").starts_with("LGUEST_RUN failed: Bad address"), "{err:#}");
    }

    #[test]
    fn exit_codes_come_from_the_exit() {
        let mem = memory();
        let mut killed = ExitData::new(abi::LGUEST_EXIT_KILLED);
        killed.message[..3].copy_from_slice(b"no\0");
        let vcpu = FakeVcpu::new(vec![Ok(killed)]);
        assert_eq!(run_loop(&vcpu, &mem, None, &mut Vec::new(), &Hooks::none()).expect("run"), exit::EXIT_KILLED);
        let vcpu = FakeVcpu::new(vec![Ok(ExitData::new(77))]);
        assert_eq!(run_loop(&vcpu, &mem, None, &mut Vec::new(), &Hooks::none()).expect("run"), exit::EXIT_KILLED);
    }
}
