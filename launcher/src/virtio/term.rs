// SPDX-License-Identifier: GPL-2.0
//! The launcher's terminal while the console device runs: when stdin is a
//! terminal it is put in raw-ish mode (no line editing, no echo, one byte
//! at a time; signals such as Ctrl-C still reach the launcher, which stops
//! the guest), and restored when the [`RawTerminal`] guard is dropped, on a
//! panic (release builds abort, so Drop would not run) by
//! a panic hook. The saved settings live in a global so that the panic
//! hook and the signal watchdog can reach them. The stopping signals
//! (SIGINT, SIGTERM, SIGHUP, SIGQUIT) end the run loop, which drops the
//! guard, or the watchdog restores the terminal before it ends the process
//! (`signals.rs`); Ctrl-Z (SIGTSTP) restores it for the stop and re-enters
//! raw mode when the launcher is continued.

use std::io;
use std::sync::Mutex;

/// The terminal, the settings to put back and the raw ones, while a guard
/// lives.
static SAVED: Mutex<Option<(libc::c_int, libc::termios, libc::termios)>> = Mutex::new(None);

/// The same three, for the SIGTSTP handler, which can take no lock: set
/// (a leaked box, for the rest of the process) when raw mode is entered,
/// null once the terminal is restored.
static FOR_SIGNALS: std::sync::atomic::AtomicPtr<(libc::c_int, libc::termios, libc::termios)> =
    std::sync::atomic::AtomicPtr::new(std::ptr::null_mut());

/// Raw mode on stdin while this lives.
#[derive(Debug)]
pub struct RawTerminal(());

fn tcgetattr(fd: libc::c_int) -> io::Result<libc::termios> {
    // SAFETY: termios is a plain C struct for which all-zero bytes are valid.
    let mut t: libc::termios = unsafe { std::mem::zeroed() };
    // SAFETY: `t` is a valid, exclusively borrowed termios for the call.
    if unsafe { libc::tcgetattr(fd, &mut t) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(t)
}

fn tcsetattr(fd: libc::c_int, t: &libc::termios) -> io::Result<()> {
    // SAFETY: `t` points to a valid termios for the whole call.
    if unsafe { libc::tcsetattr(fd, libc::TCSANOW, t) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The window size of terminal `fd` as (columns, rows), if it is a
/// terminal that has one.
pub fn window_size(fd: libc::c_int) -> Option<(u16, u16)> {
    // SAFETY: winsize is a plain C struct for which all-zero bytes are valid.
    let mut w: libc::winsize = unsafe { std::mem::zeroed() };
    // SAFETY: TIOCGWINSZ writes one winsize into the live, exclusively
    // borrowed `w`; `fd` is only inspected.
    if unsafe { libc::ioctl(fd, libc::TIOCGWINSZ, &mut w) } != 0 {
        return None;
    }
    Some((w.ws_col, w.ws_row))
}

/// Sets terminal `fd`'s window size (tests stand in for a terminal
/// emulator with it).
#[cfg(test)]
pub fn set_window_size(fd: libc::c_int, cols: u16, rows: u16) -> io::Result<()> {
    let w = libc::winsize { ws_row: rows, ws_col: cols, ws_xpixel: 0, ws_ypixel: 0 };
    // SAFETY: TIOCSWINSZ reads one winsize from the live `w`.
    if unsafe { libc::ioctl(fd, libc::TIOCSWINSZ, &w) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Whether `fd` is a terminal.
pub fn is_terminal(fd: libc::c_int) -> bool {
    // SAFETY: isatty only inspects the descriptor number.
    unsafe { libc::isatty(fd) == 1 }
}

/// Puts the saved settings back, if any (idempotent).
pub fn restore_now() {
    FOR_SIGNALS.store(std::ptr::null_mut(), std::sync::atomic::Ordering::SeqCst);
    let saved = SAVED.lock().map(|mut s| s.take()).unwrap_or(None);
    if let Some((fd, t, _)) = saved {
        let _ = tcsetattr(fd, &t);
    }
}

/// Ctrl-Z, from the SIGTSTP handler: puts the saved settings back, stops
/// the process (SIGSTOP), and once it is continued makes the terminal raw
/// again. Only async-signal-safe calls (tcsetattr, kill) and atomics.
pub fn stop_from_signal() {
    cook_for_stop();
    // SAFETY: stops this process; no memory is involved.
    unsafe { libc::kill(libc::getpid(), libc::SIGSTOP) };
    raw_after_stop();
}

/// The terminal's saved settings back, for a stop; async-signal-safe.
fn cook_for_stop() {
    let p = FOR_SIGNALS.load(std::sync::atomic::Ordering::SeqCst);
    if !p.is_null() {
        // SAFETY: a non-null FOR_SIGNALS points to a leaked box that is never
        // freed, written before the pointer was published.
        let (fd, old, _) = unsafe { *p };
        let _ = tcsetattr(fd, &old);
    }
}

/// Raw mode again after a stop, unless the terminal was restored for good
/// meanwhile; async-signal-safe.
fn raw_after_stop() {
    let p = FOR_SIGNALS.load(std::sync::atomic::Ordering::SeqCst);
    if !p.is_null() {
        // SAFETY: as in cook_for_stop.
        let (fd, _, raw) = unsafe { *p };
        let _ = tcsetattr(fd, &raw);
    }
}

impl RawTerminal {
    /// Raw mode on stdin if it is a terminal; `None` if it is not.
    pub fn enter() -> io::Result<Option<Self>> {
        Self::enter_fd(libc::STDIN_FILENO)
    }

    /// Raw mode on terminal `fd` (stdin, or a pty in tests); `None` if it
    /// is not a terminal.
    pub fn enter_fd(fd: libc::c_int) -> io::Result<Option<Self>> {
        // SAFETY: isatty only inspects the descriptor number.
        if unsafe { libc::isatty(fd) } != 1 {
            return Ok(None);
        }
        let old = tcgetattr(fd)?;
        let mut raw = old;
        raw.c_lflag &= !(libc::ICANON | libc::ECHO | libc::ECHONL | libc::IEXTEN);
        raw.c_iflag &= !(libc::ICRNL | libc::IXON);
        raw.c_cc[libc::VMIN] = 1;
        raw.c_cc[libc::VTIME] = 0;
        *SAVED.lock().map_err(|_| io::Error::other("terminal state lock poisoned"))? = Some((fd, old, raw));
        FOR_SIGNALS.store(Box::into_raw(Box::new((fd, old, raw))), std::sync::atomic::Ordering::SeqCst);
        let hook = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            restore_now();
            hook(info);
        }));
        tcsetattr(fd, &raw)?;
        Ok(Some(Self(())))
    }
}

impl Drop for RawTerminal {
    fn drop(&mut self) {
        restore_now();
    }
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsRawFd;

    use super::*;

    fn canonical(fd: libc::c_int) -> bool {
        tcgetattr(fd).expect("tcgetattr").c_lflag & libc::ICANON != 0
    }

    /// On a pty: raw while the guard lives, cooked for a Ctrl-Z stop
    /// (suspend) and raw again after it (resume), and restored when the
    /// guard goes (or by restore_now, as the watchdog does).
    #[test]
    fn raw_mode_is_restored_on_every_path() {
        let (master, path) = crate::virtio::console::open_pty().expect("pty");
        let slave = std::fs::OpenOptions::new().read(true).write(true).open(&path).expect("slave");
        let fd = slave.as_raw_fd();
        // The launcher's pty starts raw (console::open_pty): cook it, as a
        // user's terminal is.
        let mut t = tcgetattr(fd).expect("tcgetattr");
        t.c_lflag |= libc::ICANON | libc::ECHO | libc::ISIG;
        tcsetattr(fd, &t).expect("tcsetattr");
        assert!(canonical(fd), "the pty is cooked");
        let guard = RawTerminal::enter_fd(fd).expect("enter").expect("a terminal");
        assert!(!canonical(fd), "raw");
        cook_for_stop();
        assert!(canonical(fd), "cooked while stopped");
        raw_after_stop();
        assert!(!canonical(fd), "raw again after SIGCONT");
        drop(guard);
        assert!(canonical(fd), "restored by the guard");
        let _guard = RawTerminal::enter_fd(fd).expect("enter").expect("a terminal");
        restore_now();
        assert!(canonical(fd), "restored by restore_now");
        raw_after_stop();
        assert!(canonical(fd), "a stop after the restore leaves it cooked");
        drop(master);
    }
}
