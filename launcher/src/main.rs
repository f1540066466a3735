// SPDX-License-Identifier: GPL-2.0
//! `lguest`: the launcher. It opens `/dev/lguest`, shows the module's ABI
//! version (`lguest version`) and creates and runs guests (`lguest run`).
//!
//! Exit status (`exit::EXIT_TABLE`, printed by `--help`): 0 the guest
//! powered off, 1 the launcher failed, 2 a usage error, 10-12 the guest
//! crashed, was killed or halted for good, 128 + N a fatal signal N.

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use clap::{ArgAction, Parser, Subcommand};

mod boot;
mod cpuid;
mod dev;
mod exit;
mod linux;
mod loader;
mod memory;
mod ratelimit;
mod run;
mod sandbox;
mod signals;
mod virtio;

/// The lguest launcher.
#[derive(Debug, Parser)]
#[command(name = "lguest", version, about = "Run paravirtual guests on /dev/lguest", after_help = exit::EXIT_TABLE)]
struct Cli {
    /// The lguest device node.
    // `--device` is its older name, kept as a hidden alias: it read like
    // QEMU's -device (add a device).
    #[arg(long = "dev-path", alias = "device", value_name = "PATH", default_value = "/dev/lguest", global = true)]
    dev_path: PathBuf,
    /// More messages on stderr (-v: info and exit statistics, -vv: debug,
    /// -vvv: trace). RUST_LOG overrides it.
    #[arg(short, long, action = ArgAction::Count, global = true)]
    verbose: u8,
    #[command(subcommand)]
    command: Command,
}

/// Parses `MS:IRQ` for `--irq-every`.
fn parse_irq_every(s: &str) -> Result<(u64, u32), String> {
    let (ms, irq) = s.split_once(':').ok_or("expected MS:IRQ, e.g. 5:1")?;
    let ms: u64 = ms.parse().map_err(|_| format!("bad period {ms:?}"))?;
    let irq: u32 = irq.parse().map_err(|_| format!("bad IRQ {irq:?}"))?;
    if ms == 0 || irq as usize >= lguest_abi::LGUEST_IRQS {
        return Err(format!("period must be > 0 and IRQ below {}", lguest_abi::LGUEST_IRQS));
    }
    Ok((ms, irq))
}

/// Parses `--serial`: a console mode other than pty.
fn parse_serial(s: &str) -> Result<virtio::console::ConsoleMode, String> {
    match s.parse()? {
        virtio::console::ConsoleMode::Pty => Err("pty is for --console only".into()),
        mode => Ok(mode),
    }
}

// Parsed once, at start: the size of `Run`'s options costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
enum Command {
    /// Show the module's ABI version and check that it matches this launcher.
    Version,
    /// Run a guest: a static x86-64 ELF executable, or the vmlinux of a
    /// Linux kernel built with CONFIG_LGUEST_GUEST (guest/linux).
    ///
    /// Launcher options go before GUEST; everything after it is the guest's
    /// command line.
    #[command(after_help = exit::EXIT_TABLE)]
    Run {
        /// Guest RAM: bytes, or a number with K, M or G (binary units); at
        /// least 2M, at most 4G, a multiple of 4K.
        #[arg(short, long, value_name = "SIZE", default_value = boot::DEFAULT_MEM, value_parser = boot::parse_mem_size)]
        memory: u64,
        /// Raise guest interrupt IRQ every MS milliseconds from another
        /// thread (for testing interrupt delivery).
        #[arg(long, value_name = "MS:IRQ", value_parser = parse_irq_every)]
        irq_every: Option<(u64, u32)>,
        /// The virtio console: tty (the default: stdin and stdout, in raw
        /// mode when stdin is a terminal), off, file=PATH (output appended
        /// to PATH, no input), or pty (a new pseudo-terminal, whose name
        /// is printed on stderr).
        #[arg(long, value_name = "off|tty|file=PATH|pty", default_value = "tty")]
        console: virtio::console::ConsoleMode,
        /// The same as --console off.
        #[arg(long)]
        no_console: bool,
        /// The virtio console's escape key when stdin is a terminal: a
        /// control character in caret form (^] is Ctrl-]), or none. The key
        /// then x stops the guest (status 13), the key twice sends it, the
        /// key then ? lists the commands.
        #[arg(long, value_name = "^X|none", default_value = "^]", value_parser = virtio::console::parse_escape)]
        escape: virtio::console::EscapeKey,
        /// The hypercall console (the guest's early output, LHCALL_NOTIFY):
        /// tty (the default: stdout), off (dropped), or file=PATH.
        #[arg(long, value_name = "off|tty|file=PATH", default_value = "tty", value_parser = parse_serial)]
        serial: virtio::console::ConsoleMode,
        /// No virtio entropy device (there is one by default).
        #[arg(long)]
        no_rng: bool,
        /// A virtio block device on a file or block device. Keys:
        /// path=FILE; readonly=on|off (default off); direct=on|off (O_DIRECT,
        /// default off); id=NAME (the ID the guest reads, at most 20
        /// characters); lock=on|off (default on: an exclusive lock, shared
        /// when read-only, so that two launchers cannot write one image).
        /// The short forms FILE and FILE,ro still work. A comma in FILE is
        /// written ",," (as in QEMU): path=a,,b.img is the file a,b.img.
        /// Writeback when the driver negotiates FLUSH, writethrough
        /// otherwise. May be repeated.
        #[arg(long, value_name = "path=FILE[,readonly=on][,direct=on][,id=NAME][,lock=off]")]
        disk: Vec<virtio::block::DiskOptions>,
        /// A virtio network device. Keys: tap=NAME (the TAP device, created
        /// if missing) or fd=N (a tap that another process opened with
        /// IFF_TAP|IFF_NO_PI|IFF_VNET_HDR and passed down, so no
        /// CAP_NET_ADMIN is needed); mac=XX:XX:XX:XX:XX:XX (default:
        /// 52:54:00 and three bytes of a hash of the tap's name, stable from
        /// run to run and different between taps); batch=on|off (one
        /// receive interrupt per batch, default on); offload=on|off
        /// (checksum and segmentation offload, default on). May be repeated.
        #[arg(long, value_name = "tap=NAME|fd=N[,mac=MAC][,batch=off][,offload=off]")]
        net: Vec<virtio::net::NetOptions>,
        /// Do not bind queue kicks with LGUEST_IOEVENTFD: every kick exits to
        /// the vCPU thread (for comparison).
        #[arg(long)]
        no_ioeventfd: bool,
        /// Serve every queue kick on the vCPU thread, with the device's
        /// host input polled and its interrupts raised before the guest
        /// goes on (the 2009 launcher's structure; implies --no-ioeventfd),
        /// for comparison.
        #[arg(long)]
        sync_kicks: bool,
        /// The seccomp filters, installed per thread type once set-up is
        /// done (after the capabilities are dropped): on (a forbidden
        /// system call ends the launcher, status 159, naming the thread and
        /// the call), log (allowed, and logged by the kernel), or off.
        /// Default: on, or off with a warning on a kernel without seccomp
        /// filters (where on and log are errors).
        #[arg(long, value_name = "off|log|on")]
        seccomp: Option<sandbox::SeccompMode>,
        /// What the guest's CPUID says: host (the host CPU) or filtered (the
        /// host CPU less what a guest cannot use, with the hypervisor bit
        /// and leaf 0x40000000 "LguestLguest"; given to the module as the
        /// VM's table, and to a plain cpuid where the host can make CPUID
        /// fault). Default: filtered for a Linux guest, host otherwise.
        #[arg(long, value_name = "host|filtered")]
        cpuid: Option<cpuid::CpuidMode>,
        /// An initramfs for a Linux guest (a vmlinux built with
        /// CONFIG_LGUEST_GUEST), placed at the top of guest RAM and named in
        /// its boot_params.
        #[arg(long, value_name = "FILE")]
        initrd: Option<PathBuf>,
        /// Print the counters on stderr at exit: the vCPU's exits and
        /// hypercalls, the device interrupts, the guest's stray
        /// notifications, and per device its kicks, interrupts, packets or
        /// requests, bytes, drops and driver errors (resets needed,
        /// unoffered features; their warnings are rate-limited to a few a
        /// second, and the counts say how many were held back); as text (the
        /// default) or --stats=json (one JSON object). SIGUSR1 prints the
        /// same while the guest runs, and the vCPU's registers.
        #[arg(long, value_name = "text|json", num_args = 0..=1, require_equals = true, default_missing_value = "text")]
        stats: Option<run::StatsFormat>,
        /// The guest ELF image.
        #[arg(value_name = "GUEST.elf")]
        guest: PathBuf,
        /// The guest's command line, joined with spaces.
        #[arg(value_name = "ARGS", trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<OsString>,
    },
}

fn version(cli: &Cli) -> Result<()> {
    let lg = dev::Lguest::open(&cli.dev_path)?;
    let v = lg.api_version().context("querying the module")?;
    println!("launcher {} (ABI {})", env!("CARGO_PKG_VERSION"), lguest_abi::LGUEST_API_VERSION);
    println!("module ABI {v} at {}", cli.dev_path.display());
    if v != lguest_abi::LGUEST_API_VERSION {
        bail!("ABI mismatch: module speaks {v}, launcher {}", lguest_abi::LGUEST_API_VERSION);
    }
    Ok(())
}

/// The log filter for a `-v` count.
fn log_level(verbose: u8) -> &'static str {
    match verbose {
        0 => "warn",
        1 => "info",
        2 => "debug",
        _ => "trace",
    }
}

fn main() -> ExitCode {
    // Usage errors exit 2 (exit::EXIT_USAGE, clap's own), help and
    // version 0.
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            // Nothing useful is left to do if stderr is gone.
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() { exit::EXIT_USAGE } else { exit::EXIT_OK });
        }
    };
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or(log_level(cli.verbose))).init();
    let res = match &cli.command {
        Command::Version => version(&cli).map(|()| 0),
        Command::Run {
            memory,
            irq_every,
            console,
            no_console,
            escape,
            serial,
            no_rng,
            disk,
            net,
            no_ioeventfd,
            sync_kicks,
            seccomp,
            cpuid,
            initrd,
            stats,
            guest,
            args,
        } => run::run(&run::RunOptions {
            device: cli.dev_path.clone(),
            mem_size: *memory,
            guest: guest.clone(),
            args: args.clone(),
            irq_every: *irq_every,
            seccomp: *seccomp,
            cpuid: *cpuid,
            initrd: initrd.clone(),
            devices: run::DeviceOptions {
                console: if *no_console { virtio::console::ConsoleMode::Off } else { console.clone() },
                serial: serial.clone(),
                escape: escape.0,
                rng: !no_rng,
                disks: disk.clone(),
                nets: net.clone(),
                ioeventfd: !no_ioeventfd,
                sync_kicks: *sync_kicks,
                stats: *stats,
            },
        }),
    };
    match res {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("lguest: {e:#}");
            ExitCode::from(exit::EXIT_LAUNCHER)
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("lguest").chain(args.iter().copied()))
    }

    #[test]
    fn cli_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn run_defaults() {
        let cli = parse(&["run", "guest.elf"]).expect("parse");
        let Command::Run { memory, guest, args, .. } = cli.command else { panic!("not run") };
        assert_eq!(memory, 64 << 20);
        assert_eq!(guest, PathBuf::from("guest.elf"));
        assert!(args.is_empty());
        assert_eq!(cli.verbose, 0);
        assert_eq!(cli.dev_path, PathBuf::from("/dev/lguest"));
    }

    /// `--dev-path` names the device node; `--device`, its old name, still
    /// works (before or after the subcommand) but is not in the help.
    #[test]
    fn dev_path_and_its_hidden_alias() {
        for args in [
            &["--dev-path", "/tmp/lg", "run", "g.elf"][..],
            &["run", "--dev-path=/tmp/lg", "g.elf"],
            &["--device", "/tmp/lg", "version"],
            &["run", "--device", "/tmp/lg", "g.elf"],
        ] {
            assert_eq!(parse(args).expect("parse").dev_path, PathBuf::from("/tmp/lg"), "{args:?}");
        }
        let help = Cli::command().render_long_help().to_string();
        assert!(help.contains("--dev-path <PATH>"), "{help}");
        assert!(!help.contains("--device"), "{help}");
    }

    /// `--help` tells how to put a comma in a disk's path.
    #[test]
    fn help_shows_the_disk_comma_escape() {
        let help = Cli::command().find_subcommand_mut("run").expect("run").render_long_help().to_string();
        assert!(help.contains("A comma in FILE is written \",,\""), "{help}");
        let cli = parse(&["run", "--disk", "path=a,,b.img,readonly=on", "g.elf"]).expect("parse");
        let Command::Run { disk, .. } = cli.command else { panic!("not run") };
        assert_eq!((disk[0].path.clone(), disk[0].read_only), (PathBuf::from("a,b.img"), true));
    }

    #[test]
    fn run_with_options_and_guest_args() {
        let cli = parse(&["-vv", "run", "--memory", "128M", "g.elf", "console", "-v", "--x=1"]).expect("parse");
        assert_eq!(cli.verbose, 2);
        let Command::Run { memory, args, .. } = cli.command else { panic!("not run") };
        assert_eq!(memory, 128 << 20);
        assert_eq!(args, ["console", "-v", "--x=1"].map(OsString::from));
        let cli = parse(&["run", "-m", "16M", "-v", "g.elf"]).expect("parse");
        assert_eq!(cli.verbose, 1);
    }

    #[test]
    fn bad_memory_sizes_are_refused() {
        for (size, why) in
            [("1M", "too little"), ("8G", "too much"), ("2097153", "not a multiple"), ("lots", "not a size")]
        {
            let err = parse(&["run", "--memory", size, "g.elf"]).expect_err(size);
            assert!(err.to_string().contains(why), "{size}: {err}");
        }
    }

    #[test]
    fn version_still_parses() {
        assert!(matches!(parse(&["version"]).expect("parse").command, Command::Version));
        assert!(parse(&["run"]).is_err(), "GUEST is required");
    }

    #[test]
    fn help_shows_the_exit_statuses() {
        let help = Cli::command().find_subcommand_mut("run").expect("run").render_long_help().to_string();
        assert!(help.contains("Exit status:") && help.contains("143 SIGTERM"), "{help}");
        let err = parse(&["run", "--bogus", "g.elf"]).expect_err("unknown option");
        assert_eq!(err.exit_code(), i32::from(exit::EXIT_USAGE));
    }

    #[test]
    fn stats_formats() {
        let stats = |args: &[&str]| match parse(args).expect("parse").command {
            Command::Run { stats, guest, .. } => (stats, guest),
            Command::Version => panic!("not run"),
        };
        assert_eq!(stats(&["run", "g.elf"]), (None, PathBuf::from("g.elf")));
        assert_eq!(stats(&["run", "--stats", "g.elf"]), (Some(run::StatsFormat::Text), PathBuf::from("g.elf")));
        assert_eq!(stats(&["run", "--stats=json", "g.elf"]), (Some(run::StatsFormat::Json), PathBuf::from("g.elf")));
        assert!(parse(&["run", "--stats=xml", "g.elf"]).is_err());
    }

    #[test]
    fn console_modes() {
        use virtio::console::ConsoleMode;
        let cli = parse(&["run", "--console", "file=/tmp/c.log", "--serial", "off", "g.elf"]).expect("parse");
        let Command::Run { console, serial, .. } = cli.command else { panic!("not run") };
        assert_eq!(console, ConsoleMode::File("/tmp/c.log".into()));
        assert_eq!(serial, ConsoleMode::Off);
        let cli = parse(&["run", "g.elf"]).expect("parse");
        let Command::Run { console, serial, .. } = cli.command else { panic!("not run") };
        assert_eq!((console, serial), (ConsoleMode::Tty, ConsoleMode::Tty));
        assert_eq!("pty".parse::<ConsoleMode>(), Ok(ConsoleMode::Pty));
        assert!(parse(&["run", "--serial", "pty", "g.elf"]).is_err());
        for bad in ["file=", "stdio", ""] {
            assert!(bad.parse::<ConsoleMode>().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn verbosity_levels() {
        assert_eq!(log_level(0), "warn");
        assert_eq!(log_level(1), "info");
        assert_eq!(log_level(2), "debug");
        assert_eq!(log_level(9), "trace");
    }
}
