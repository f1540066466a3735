// SPDX-License-Identifier: GPL-2.0
//! The network benchmark (tcpblast's modern form): bulk TCP guest -> host
//! and host -> guest through the virtio-net device, in a private network
//! namespace, for each combination of
//!
//! - receive-interrupt batching in the launcher (`--net tap=..,nobatch`),
//! - the guest's `irq_pending` check when it re-enables interrupts (the
//!   guest command-line word `noirqcheck` turns it off),
//! - checksum and segmentation offload (`--net tap=..,nooffload`),
//!
//! and prints one `bench:` line per run with the throughput (timed by the
//! host's `lguest-tcpsink`), packets per receive interrupt, interrupts per
//! MB and exits per MB (from the launcher's `--stats` and `-v` counters),
//! then the two effects the 2009 lguest changes were about.
//!
//! tcpblast's default main loop polls the device itself and arms its
//! interrupts only before it halts, and `LHCALL_HALT` delivers a pending
//! interrupt at once, so the `irq_pending` check is not on its hot path.
//! The rows tagged `mode=irqdriven` (batching and offloads on, the check on
//! and off, both directions) run tcpblast's `irqdriven` mode instead, which
//! works as a Linux guest does: ring work and kicks with interrupts off,
//! received frames and transmit completions handled only after the
//! device's interrupt, and a guest that spins instead of halting. Tags
//! add to it: `+sync-kicks` (the launcher serves a kick on the vCPU thread
//! and polls the tap before the guest goes on, as the 2009 launcher did)
//! and `+busy` (a loaded guest: while it waits it runs a background job,
//! mostly with interrupts off, see [`BUSY`]). A loaded guest is where the
//! check matters: without it, an interrupt that arrives in a critical
//! section waits until the guest happens to exit while its interrupts are
//! on.
//!
//! Usage: `lguest_netbench [MIB] [irqdriven | sync] [tohost] [reps=N]
//! [guest=W,..]` (default 256 MiB per run; `irqdriven` runs only those
//! rows, `sync` only the `+sync-kicks` ones, `tohost` only guest -> host;
//! each row runs N times, default 3, and the run with the median
//! throughput stands for it; `guest=` adds words to tcpblast's command
//! line, e.g. `guest=sndbuf=262144`). Every row moves the same MIB. Not a test: it asserts nothing but that
//! every transfer completes and checks out.

use std::process::ExitCode;
use std::time::Duration;

use lguest_selftests::{self as t, guest, number_before, strings, Outcome, Proc};

const TAP: &str = "lgbench0";
const HOST: &str = "192.168.2.1";
const PORT: u16 = 9999;

/// One configuration.
#[derive(Clone, Copy)]
struct Row {
    to_host: bool,
    batch: bool,
    irqcheck: bool,
    offload: bool,
    /// tcpblast's `irqdriven` mode.
    irqdriven: bool,
    /// The launcher's `--sync-kicks`: kicks served on the vCPU thread, the
    /// interrupt raised before the guest goes on (the 2009 structure).
    sync: bool,
    /// tcpblast's `busy=`: a loaded guest (see [`BUSY`]).
    busy: bool,
}

/// The loaded guest of the `+busy` rows: while it waits for the network
/// it runs a background job 50 us at a time with interrupts off, with
/// 5 us between those slices with interrupts on.
const BUSY: &str = "busy=50/5";

impl Row {
    /// The mode tag of the row's name and of the effect lines.
    fn mode(&self) -> String {
        if !self.irqdriven {
            return String::new();
        }
        let mut m = String::from(" mode=irqdriven");
        if self.sync {
            m.push_str("+sync-kicks");
        }
        if self.busy {
            m.push_str("+busy");
        }
        m
    }
}

/// What one run measured.
struct Result {
    mb_per_s: f64,
    pkts_per_rx_irq: f64,
    irqs_per_mb: f64,
    exits_per_mb: f64,
    /// The guest's counter lines (interrupt-driven modes).
    guest: Vec<String>,
}

fn on(b: bool) -> &'static str {
    if b {
        "on"
    } else {
        "off"
    }
}

/// Parses the launcher's counters and the sink's line.
fn measure(g: &Outcome, s: &Outcome, bytes: u64) -> Option<Result> {
    let sink = s.stdout.lines().find(|l| l.starts_with("tcpsink: ") && l.contains(" MB/s"))?;
    let mb_per_s = number_before(sink, "MB/s")?;
    let rx = g.stderr.lines().find(|l| l.trim_start().starts_with("rx: "))?;
    let tx = g.stderr.lines().find(|l| l.trim_start().starts_with("tx: "))?;
    let (rx_pkts, rx_irqs): (f64, f64) = (number_before(rx, "packets")?, number_before(rx, "interrupts")?);
    let tx_irqs: f64 = number_before(tx, "interrupts")?;
    let exits: f64 = g.stderr.lines().find(|l| l.contains(" exits, ")).and_then(|l| number_before(l, "exits"))?;
    let mb = bytes as f64 / 1e6;
    Some(Result {
        mb_per_s,
        pkts_per_rx_irq: if rx_irqs > 0.0 { rx_pkts / rx_irqs } else { 0.0 },
        irqs_per_mb: (rx_irqs + tx_irqs) / mb,
        exits_per_mb: exits / mb,
        guest: Vec::new(),
    })
}

fn run(row: Row, bytes: u64, extra: &[String]) -> std::result::Result<Result, String> {
    let addr = format!("{HOST}:{PORT}");
    let n = bytes.to_string();
    let sink_args = if row.to_host {
        strings(&[&addr, "--expect", &n, "--timeout", "1800"])
    } else {
        strings(&[&addr, "--send", &n, "--timeout", "1800"])
    };
    let s = Proc::spawn("lguest-tcpsink", &sink_args, None).map_err(|e| format!("{e:?}"))?;
    std::thread::sleep(Duration::from_millis(300));
    let mut net = format!("tap={TAP}");
    if !row.batch {
        net.push_str(",nobatch");
    }
    if !row.offload {
        net.push_str(",nooffload");
    }
    let mut a = strings(&["-v", "run", "--memory", "256M", "--stats", "--net", &net]);
    if row.sync {
        a.push("--sync-kicks".into());
    }
    a.push(guest("tcpblast"));
    a.push("ip=192.168.2.2/24".into());
    a.push(format!("peer={addr}"));
    a.push(format!("{}={bytes}", if row.to_host { "send" } else { "recv" }));
    a.push("timeout=1800".into());
    if !row.irqcheck {
        a.push("noirqcheck".into());
    }
    if row.irqdriven {
        a.push("irqdriven".into());
    }
    if row.busy {
        a.push(BUSY.into());
    }
    a.extend(extra.iter().cloned());
    let g = Proc::launcher(&a, None).map_err(|e| format!("{e:?}"))?;
    let limit = Duration::from_secs(1900);
    let g = g.wait(limit).map_err(|e| format!("{e:?}"))?;
    let s = s.wait(limit).map_err(|e| format!("{e:?}"))?;
    if g.code != 0 || s.code != 0 {
        return Err(format!("guest: {}; sink: {}", g.describe(), s.describe()));
    }
    let mut r = measure(&g, &s, bytes).ok_or_else(|| format!("no counters: {}; {}", g.describe(), s.describe()))?;
    if row.irqdriven {
        // The guest's own counters: interrupts, kicks, halts, NAPI polls
        // and how its waits ended.
        r.guest = g.stdout.lines().filter(|l| l.starts_with("tcpblast: interrupt")).map(String::from).collect();
    }
    Ok(r)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mib: u64 = args.iter().find_map(|a| a.parse().ok()).unwrap_or(256);
    let only_irqdriven = args.iter().any(|a| a == "irqdriven" || a == "sync");
    let only_sync = args.iter().any(|a| a == "sync");
    let only_to_host = args.iter().any(|a| a == "tohost");
    let reps: usize = args.iter().find_map(|a| a.strip_prefix("reps=")?.parse().ok()).unwrap_or(3).max(1);
    let extra: Vec<String> =
        args.iter().filter_map(|a| a.strip_prefix("guest=")).flat_map(|w| w.split(',').map(String::from)).collect();
    let bytes = mib << 20;
    if let Err(e) = t::private_netns(TAP, &format!("{HOST}/24")) {
        println!("bench: net: no network namespace: {e:?}");
        return ExitCode::FAILURE;
    }
    // Guest modes (irqdriven, sync, busy): the default loop and the loaded
    // Linux-like guest with the 2009 launcher get every combination; the
    // others only the check on and off.
    let modes = [
        (false, false, false, true),
        (true, false, false, false),
        (true, true, false, false),
        (true, false, true, false),
        (true, true, true, true),
    ];
    let mut rows = Vec::new();
    for to_host in [true, false] {
        if only_to_host && !to_host {
            continue;
        }
        for (irqdriven, sync, busy, every) in modes {
            if (only_irqdriven && !irqdriven) || (only_sync && !sync) {
                continue;
            }
            let both: &[bool] = if every { &[true, false] } else { &[true] };
            for &offload in both {
                for irqcheck in [true, false] {
                    for &batch in both {
                        rows.push(Row { to_host, batch, irqcheck, offload, irqdriven, sync, busy });
                    }
                }
            }
        }
    }
    let name = |row: &Row| {
        format!(
            "{} {mib} MiB batch={} irqcheck={} offload={}{}",
            if row.to_host { "guest->host" } else { "host->guest" },
            on(row.batch),
            on(row.irqcheck),
            on(row.offload),
            row.mode()
        )
    };
    // The reps run round-robin across the rows, so that drift (TCG
    // warm-up, the page cache) is spread over all rows instead of biasing
    // the ratios between them. Any failed run fails the benchmark.
    let mut runs: Vec<Vec<_>> = rows.iter().map(|_| Vec::new()).collect();
    for _ in 0..reps {
        for (i, row) in rows.iter().enumerate() {
            match run(*row, bytes, &extra) {
                Ok(r) => runs[i].push(r),
                Err(e) => {
                    println!("bench: net {}: failed: {e}", name(row));
                    return ExitCode::FAILURE;
                }
            }
        }
    }
    let mut results = Vec::new();
    for (row, mut runs) in rows.iter().copied().zip(runs) {
        // The run with the median throughput of `reps` stands for the row.
        let all: Vec<String> = runs.iter().map(|r| format!("{:.1}", r.mb_per_s)).collect();
        runs.sort_by(|a, b| a.mb_per_s.total_cmp(&b.mb_per_s));
        let (min, max) = (runs[0].mb_per_s, runs[runs.len() - 1].mb_per_s);
        let r = runs.swap_remove(runs.len() / 2);
        for l in &r.guest {
            println!("bench:   {l}");
        }
        println!(
            "bench: net {}: {:.1} MB/s, {:.1} packets/rx-interrupt, {:.0} interrupts/MB, {:.0} exits/MB (median of {reps}, min {min:.1}, max {max:.1}: {})",
            name(&row),
            r.mb_per_s,
            r.pkts_per_rx_irq,
            r.irqs_per_mb,
            r.exits_per_mb,
            all.join(", ")
        );
        results.push((row, r));
    }
    let find = |to_host, batch, irqcheck, offload| {
        results.iter().find(|(r, _)| {
            !r.irqdriven && r.to_host == to_host && r.batch == batch && r.irqcheck == irqcheck && r.offload == offload
        })
    };
    // The check's effect in each mode (batching on): the row with it
    // against the same row without.
    for (row, with) in results.iter().filter(|(r, _)| r.irqcheck && r.batch) {
        let twin = results.iter().find(|(r, _)| {
            !r.irqcheck
                && r.batch
                && r.to_host == row.to_host
                && r.offload == row.offload
                && r.irqdriven == row.irqdriven
                && r.sync == row.sync
                && r.busy == row.busy
        });
        if let Some((_, without)) = twin {
            println!(
                "bench: net irq_pending effect {} offload={}{}: {:.2}x throughput ({:.1} vs {:.1} MB/s, {:.0} vs {:.0} exits/MB)",
                if row.to_host { "guest->host" } else { "host->guest" },
                on(row.offload),
                row.mode(),
                with.mb_per_s / without.mb_per_s,
                with.mb_per_s,
                without.mb_per_s,
                with.exits_per_mb,
                without.exits_per_mb
            );
        }
    }
    if let (Some((_, with)), Some((_, without))) = (find(false, true, true, true), find(false, false, true, true)) {
        println!(
            "bench: net batching effect host->guest: {:.1} vs {:.1} packets/rx-interrupt, {:.2}x throughput",
            with.pkts_per_rx_irq,
            without.pkts_per_rx_irq,
            with.mb_per_s / without.mb_per_s
        );
    }
    ExitCode::SUCCESS
}
