// SPDX-License-Identifier: GPL-2.0
//! `lguest`: the launcher. It opens `/dev/lguest` and, from the world-switch
//! issue on, creates and runs guests through it.
//!
//! Exit status: 0 on success, 1 with a message on stderr otherwise.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};

mod dev;

/// The lguest launcher.
#[derive(Debug, Parser)]
#[command(name = "lguest", version, about = "Run paravirtual guests on /dev/lguest")]
struct Cli {
    /// The lguest device node.
    #[arg(long, default_value = "/dev/lguest", global = true)]
    device: PathBuf,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Show the module's ABI version and check that it matches this launcher.
    Version,
}

fn version(cli: &Cli) -> Result<()> {
    let lg = dev::Lguest::open(&cli.device)?;
    let v = lg.api_version().context("querying the module")?;
    println!("launcher {} (ABI {})", env!("CARGO_PKG_VERSION"), lguest_abi::LGUEST_API_VERSION);
    println!("module ABI {v} at {}", cli.device.display());
    if v != lguest_abi::LGUEST_API_VERSION {
        bail!("ABI mismatch: module speaks {v}, launcher {}", lguest_abi::LGUEST_API_VERSION);
    }
    Ok(())
}

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let cli = Cli::parse();
    let res = match cli.command {
        Command::Version => version(&cli),
    };
    match res {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("lguest: {e:#}");
            ExitCode::FAILURE
        }
    }
}
