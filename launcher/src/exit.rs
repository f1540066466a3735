// SPDX-License-Identifier: GPL-2.0
//! What the launcher does with each vCPU exit.
//!
//! [`handle_exit`] is a function of the exit data (copied out of the run
//! page), guest memory and an output sink for the guest's console, and
//! returns whether to run the guest again or to stop with an exit status and
//! a message for stderr. It makes no ioctl, so every exit can be tested with
//! fabricated data.
//!
//! Exit statuses (the whole table is [`EXIT_TABLE`], shown by `--help`):
//! guest outcomes have their own range, 0 and 10-12, so that a supervisor
//! can tell them from a launcher error (1), a usage error (2) and a fatal
//! signal (128 + N).

use std::io::{self, Write};

use lguest_abi as abi;

use crate::dev::ExitData;
use crate::memory::GuestMemory;
use crate::ratelimit::GuestWarnings;
use crate::virtio::bus::Bus;

/// Notifications outside RAM and the device window: counted for
/// `--stats`, and rate-limited on stderr (a guest can make them in a loop).
pub static STRAY_NOTIFY: GuestWarnings = GuestWarnings::new();

/// The most bytes one console notification prints.
pub const CONSOLE_MAX: usize = 4096;

/// Exit status: the guest powered off, or asked to restart.
pub const EXIT_OK: u8 = 0;
/// Exit status: the launcher itself failed (set-up, a device, an ioctl).
pub const EXIT_LAUNCHER: u8 = 1;
/// Exit status: the command line was wrong (clap's own code).
pub const EXIT_USAGE: u8 = 2;
/// Exit status: the guest crashed (or shut down for an unknown reason).
pub const EXIT_CRASH: u8 = 10;
/// Exit status: the host killed the guest, or the exit was not understood.
pub const EXIT_KILLED: u8 = 11;
/// Exit status: the guest halted with nothing to wake it.
pub const EXIT_HALT: u8 = 12;
/// Exit status: the user stopped the guest with the console's escape key.
pub const EXIT_ESCAPE: u8 = 13;
/// Exit status base for a fatal signal N: 128 + N, as shells report it.
pub const EXIT_SIGNAL_BASE: u8 = 128;

/// The exit statuses of `lguest run`, for `--help` and the documentation.
pub const EXIT_TABLE: &str = "\
Exit status:
    0        the guest powered off (or asked to restart, which is not supported)
    1        the launcher failed (a missing disk, a tap it cannot open, an ioctl error)
    2        usage error: the command line is wrong
    10       the guest crashed (it reported a panic, or shut down for an unknown reason)
    11       the host killed the guest (a fault it had no handler for, a bad hypercall)
    12       the guest halted with interrupts off and nothing to wake it
    13       the user stopped the guest with the console's escape key (Ctrl-] x)
    128+N    the launcher ended on fatal signal N (130 SIGINT, 143 SIGTERM, 129 SIGHUP,
             131 SIGQUIT, 159 SIGSYS from the seccomp filter)";

/// What to do after an exit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Run the guest again.
    Continue,
    /// Stop with this exit status, printing `message` (if any) on stderr.
    Exit {
        /// The launcher's exit status.
        code: u8,
        /// A line for stderr, without its newline.
        message: Option<String>,
    },
}

impl Action {
    fn exit(code: u8, message: impl Into<Option<String>>) -> Self {
        Self::Exit { code, message: message.into() }
    }
}

/// A failure while handling an exit.
#[derive(Debug, thiserror::Error)]
pub enum ExitError {
    /// The guest's console output could not be written.
    #[error("writing the guest's console output")]
    Console(#[source] io::Error),
}

/// The text of a run page message: up to the first NUL, or all of it if
/// there is none; invalid UTF-8 is replaced and control characters are
/// escaped, so that it stays one line on the terminal.
pub fn message_text(message: &[u8]) -> String {
    let end = message.iter().position(|&b| b == 0).unwrap_or(message.len());
    let mut text = String::new();
    for c in String::from_utf8_lossy(&message[..end]).chars() {
        if c.is_control() {
            text.extend(c.escape_default());
        } else {
            text.push(c);
        }
    }
    text
}

/// Handles a console notification: the string at `addr` goes to `out`.
fn console(addr: u64, mem: &GuestMemory, out: &mut dyn Write) -> Result<(), ExitError> {
    let text = match mem.read_cstr(addr, CONSOLE_MAX) {
        Ok(text) => text,
        Err(e) => {
            // Cannot happen for an address inside RAM; keep the guest going.
            log::warn!("guest console string at {addr:#x}: {:#}", anyhow::Error::new(e));
            return Ok(());
        }
    };
    if !text.terminated {
        log::debug!("guest console string at {addr:#x} has no NUL in {} bytes", text.bytes.len());
    }
    out.write_all(&text.bytes).map_err(ExitError::Console)?;
    out.flush().map_err(ExitError::Console)
}

/// Decides what an exit means. Console output goes to `out`; a
/// notification in the device window goes to `bus` (status changes, and
/// queue kicks that no `LGUEST_IOEVENTFD` caught); launcher messages come
/// back in [`Action::Exit`].
pub fn handle_exit(
    exit: &ExitData,
    mem: &GuestMemory,
    bus: Option<&Bus<'_>>,
    out: &mut dyn Write,
) -> Result<Action, ExitError> {
    match exit.exit_reason {
        abi::LGUEST_EXIT_NOTIFY => {
            let addr = exit.notify_addr;
            if mem.in_ram(addr) {
                console(addr, mem, out)?;
            } else if mem.in_device_window(addr) {
                if !bus.is_some_and(|bus| bus.notify(addr)) {
                    log::debug!("device notification at {addr:#x} (argument {:#x}) means nothing", exit.notify_arg);
                }
            } else {
                STRAY_NOTIFY.warn(|| {
                    format!(
                        "guest notified {addr:#x}, outside RAM and the device window [{:#x}-{:#x}); ignored",
                        mem.mem_size(),
                        mem.total_size()
                    )
                });
            }
            Ok(Action::Continue)
        }
        abi::LGUEST_EXIT_SHUTDOWN => {
            let text = message_text(&exit.message);
            Ok(match exit.shutdown_reason {
                abi::LGUEST_SHUTDOWN_POWEROFF => {
                    log::info!("guest powered off: {text}");
                    Action::exit(EXIT_OK, None)
                }
                abi::LGUEST_SHUTDOWN_RESTART => {
                    log::info!("guest restart message: {text}");
                    Action::exit(EXIT_OK, "lguest: the guest asked to restart (not supported); stopping".to_owned())
                }
                abi::LGUEST_SHUTDOWN_CRASH => Action::exit(EXIT_CRASH, format!("lguest: guest crashed: {text}")),
                other => {
                    Action::exit(EXIT_CRASH, format!("lguest: guest shut down for unknown reason {other}: {text}"))
                }
            })
        }
        abi::LGUEST_EXIT_KILLED => {
            Ok(Action::exit(EXIT_KILLED, format!("lguest: guest killed by the host: {}", message_text(&exit.message))))
        }
        abi::LGUEST_EXIT_HALT => Ok(Action::exit(EXIT_HALT, "lguest: guest halted with nothing to wake it".to_owned())),
        other => Ok(Action::exit(EXIT_KILLED, format!("lguest: unknown exit reason {other} from the module"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MEM: u64 = 2 << 20;

    fn memory() -> GuestMemory {
        GuestMemory::new(MEM, 1).expect("memory")
    }

    fn notify(addr: u64) -> ExitData {
        ExitData { notify_addr: addr, ..ExitData::new(abi::LGUEST_EXIT_NOTIFY) }
    }

    fn with_message(reason: u32, shutdown: u64, message: &[u8]) -> ExitData {
        let mut exit = ExitData { shutdown_reason: shutdown, ..ExitData::new(reason) };
        exit.message[..message.len()].copy_from_slice(message);
        exit
    }

    fn run(exit: &ExitData, mem: &GuestMemory) -> (Action, Vec<u8>) {
        let mut out = Vec::new();
        let action = handle_exit(exit, mem, None, &mut out).expect("handled");
        (action, out)
    }

    #[test]
    fn console_string_is_printed_exactly() {
        let mem = memory();
        mem.write(0x10_0000, b"Hello, lguest!\n\0rest").expect("write");
        let (action, out) = run(&notify(0x10_0000), &mem);
        assert_eq!(action, Action::Continue);
        assert_eq!(out, b"Hello, lguest!\n");
        // No newline is added.
        mem.write(0x10_0000, b"no newline\0").expect("write");
        assert_eq!(run(&notify(0x10_0000), &mem).1, b"no newline");
        // An empty string prints nothing.
        assert_eq!(run(&notify(0x20_0000), &mem).1, b"");
    }

    #[test]
    fn console_string_limits() {
        let mem = memory();
        // Without a NUL, at most 4096 bytes.
        mem.write(0x10_0000, &[b'a'; 5000]).expect("write");
        let (action, out) = run(&notify(0x10_0000), &mem);
        assert_eq!(action, Action::Continue);
        assert_eq!(out, vec![b'a'; CONSOLE_MAX]);
        // Never past the end of RAM, even when the device page follows.
        mem.write(MEM - 2, b"xy").expect("write");
        mem.write(MEM, b"zz\0").expect("write");
        assert_eq!(run(&notify(MEM - 2), &mem).1, b"xy");
    }

    #[test]
    fn device_and_stray_notifications_continue() {
        let mem = memory();
        let (action, out) = run(&notify(MEM), &mem);
        assert_eq!((action, out.len()), (Action::Continue, 0));
        let (action, out) = run(&notify(MEM + 4096), &mem);
        assert_eq!((action, out.len()), (Action::Continue, 0));
        let (action, out) = run(&notify(u64::MAX), &mem);
        assert_eq!((action, out.len()), (Action::Continue, 0));
    }

    /// Stray notifications are counted (for --stats) and rate-limited:
    /// a loop of them logs at most a burst per second.
    #[test]
    fn stray_notifications_are_counted_and_rate_limited() {
        let mem = memory();
        let (count, suppressed) = (STRAY_NOTIFY.count(), STRAY_NOTIFY.suppressed());
        for _ in 0..100 {
            assert_eq!(run(&notify(MEM + (64 << 20)), &mem).0, Action::Continue);
        }
        // Other tests may notify stray addresses at the same time.
        assert!(STRAY_NOTIFY.count() >= count + 100);
        assert!(STRAY_NOTIFY.suppressed() >= suppressed + 100 - u64::from(crate::ratelimit::BURST) * 2);
        // Console strings and device notifications are not stray.
        let before = STRAY_NOTIFY.count();
        run(&notify(0x10_0000), &mem);
        run(&notify(MEM), &mem);
        assert!(STRAY_NOTIFY.count() - before < 2, "not counted");
    }

    #[test]
    fn poweroff() {
        let exit = with_message(abi::LGUEST_EXIT_SHUTDOWN, abi::LGUEST_SHUTDOWN_POWEROFF, b"bye\0");
        assert_eq!(run(&exit, &memory()).0, Action::Exit { code: 0, message: None });
    }

    #[test]
    fn restart() {
        let exit = with_message(abi::LGUEST_EXIT_SHUTDOWN, abi::LGUEST_SHUTDOWN_RESTART, b"reboot\0");
        let expected = "lguest: the guest asked to restart (not supported); stopping";
        assert_eq!(run(&exit, &memory()).0, Action::Exit { code: 0, message: Some(expected.into()) });
    }

    #[test]
    fn crash() {
        let exit = with_message(abi::LGUEST_EXIT_SHUTDOWN, abi::LGUEST_SHUTDOWN_CRASH, b"panicked at main.rs:3\0xx");
        let expected = "lguest: guest crashed: panicked at main.rs:3";
        assert_eq!(run(&exit, &memory()).0, Action::Exit { code: EXIT_CRASH, message: Some(expected.into()) });
        let exit = with_message(abi::LGUEST_EXIT_SHUTDOWN, 99, b"what\0");
        let (action, _) = run(&exit, &memory());
        assert!(
            matches!(action, Action::Exit { code: EXIT_CRASH, message: Some(m) } if m.contains("unknown reason 99"))
        );
    }

    #[test]
    fn killed() {
        let exit = with_message(abi::LGUEST_EXIT_KILLED, 0, b"bad hypercall 99\0");
        let expected = "lguest: guest killed by the host: bad hypercall 99";
        assert_eq!(run(&exit, &memory()).0, Action::Exit { code: EXIT_KILLED, message: Some(expected.into()) });
    }

    #[test]
    fn halt() {
        let expected = "lguest: guest halted with nothing to wake it";
        let exit = ExitData::new(abi::LGUEST_EXIT_HALT);
        assert_eq!(run(&exit, &memory()).0, Action::Exit { code: EXIT_HALT, message: Some(expected.into()) });
    }

    #[test]
    fn unknown_exit_reason() {
        for reason in [0, 5, u32::MAX] {
            let (action, _) = run(&ExitData::new(reason), &memory());
            assert!(
                matches!(action, Action::Exit { code: EXIT_KILLED, message: Some(m) } if m.contains("unknown exit reason"))
            );
        }
    }

    /// Every outcome has its own status, none is a launcher or usage error
    /// or in the signal range, and the table in `--help` names each.
    #[test]
    fn exit_statuses_are_distinct_and_documented() {
        let codes = [EXIT_OK, EXIT_LAUNCHER, EXIT_USAGE, EXIT_CRASH, EXIT_KILLED, EXIT_HALT, EXIT_ESCAPE];
        for (i, a) in codes.iter().enumerate() {
            assert!(codes[i + 1..].iter().all(|b| b != a), "status {a} used twice");
            assert!(*a < EXIT_SIGNAL_BASE);
            assert!(EXIT_TABLE.contains(&format!("\n    {a} ")), "status {a} missing from the table");
        }
        assert!(EXIT_TABLE.contains("143 SIGTERM") && EXIT_TABLE.contains("130 SIGINT"));
    }

    #[test]
    fn messages() {
        // A message filling all 256 bytes without a NUL is taken whole.
        let exit = with_message(abi::LGUEST_EXIT_KILLED, 0, &[b'k'; abi::LGUEST_MESSAGE_LEN]);
        let (action, _) = run(&exit, &memory());
        let Action::Exit { message: Some(m), .. } = action else { panic!("no message") };
        assert!(m.ends_with(&"k".repeat(abi::LGUEST_MESSAGE_LEN)), "{m}");
        // Control characters and bad UTF-8 cannot mess up the terminal.
        assert_eq!(message_text(b"a\nb\x1b[2J\xff\0"), "a\\nb\\u{1b}[2J\u{fffd}");
        assert_eq!(message_text(b""), "");
        assert_eq!(message_text(b"\0abc"), "");
    }

    #[test]
    fn console_write_errors_stop_the_launcher() {
        struct Broken;
        impl Write for Broken {
            fn write(&mut self, _: &[u8]) -> io::Result<usize> {
                Err(io::Error::from(io::ErrorKind::BrokenPipe))
            }
            fn flush(&mut self) -> io::Result<()> {
                Ok(())
            }
        }
        let mem = memory();
        mem.write(0x10_0000, b"x\0").expect("write");
        let err = handle_exit(&notify(0x10_0000), &mem, None, &mut Broken).expect_err("broken pipe");
        assert!(matches!(err, ExitError::Console(_)));
    }
}
