// SPDX-License-Identifier: GPL-2.0
//! Stopping signals while a guest runs: SIGINT, SIGTERM, SIGHUP and
//! SIGQUIT; and SIGTSTP (Ctrl-Z), which suspends the launcher with the
//! terminal restored.
//!
//! The handlers (installed with `sigaction`, without `SA_RESTART`) note the
//! first stopping signal and set the run page's `immediate_exit` byte. A
//! signal that arrives while the vCPU runs makes RUN return `EINTR`; one
//! that arrives just before RUN is caught by `immediate_exit`, which the
//! host checks at the start of RUN. So no signal is masked around RUN and
//! none can be lost. When RUN returns `EINTR` the run loop asks
//! [`stop_signal`]: if set, it stops with 128 + N; if not (some other
//! signal), it runs again. `run.rs` blocks the signals ([`block`]) before
//! it starts any thread and unblocks them ([`unblock`]) only on the vCPU
//! thread, so the kernel always gives them to the thread whose RUN (or
//! blocking console write) they must interrupt.
//!
//! **The stop bound.** A handler also writes the signal's number to the
//! pipe of the [`Watchdog`] thread, if one runs. For a stopping signal the
//! watchdog gives the orderly exit [`GRACE`]; if the launcher is still
//! there after that (a device thread stuck in a host write, say), or a
//! second stopping signal comes, it restores the terminal and leaves with
//! `_exit(128 + N)`. So SIGINT and SIGTERM end the launcher within a second
//! whatever the guest does. SIGTSTP's handler itself puts the terminal
//! back, stops the process (SIGSTOP), and re-enters raw mode when it is
//! continued (`term::stop_from_signal`, async-signal-safe calls only).
//!
//! The handler reaches the run page through a global pointer, which
//! [`install`] sets and the returned [`SignalGuard`] clears when dropped; the
//! guard borrows the [`RunPage`], so the page cannot be unmapped while the
//! handler may still use it. Only one guard can exist at a time.

use std::io;
use std::marker::PhantomData;
use std::ptr;
use std::sync::atomic::{AtomicI32, AtomicPtr, AtomicU8, Ordering};
use std::time::{Duration, Instant};

use crate::dev::RunPage;
use crate::exit::EXIT_SIGNAL_BASE;

/// Every signal the handler takes: the stopping ones, SIGTSTP, SIGUSR2,
/// with which a device thread kicks the vCPU thread out of RUN
/// ([`kick_vcpu`]), SIGUSR1 (a statistics dump) and SIGWINCH (the
/// terminal's new size, for the console: [`set_winch_fd`]).
const SIGNALS: [libc::c_int; 8] = [
    libc::SIGINT,
    libc::SIGTERM,
    libc::SIGHUP,
    libc::SIGQUIT,
    libc::SIGTSTP,
    libc::SIGUSR2,
    libc::SIGUSR1,
    libc::SIGWINCH,
];

/// The eventfd SIGWINCH's handler writes to (the console's), or -1.
static WINCH_FD: AtomicI32 = AtomicI32::new(-1);

/// Set by [`escape`]: the user typed the console's escape key to stop.
static ESCAPED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Set by SIGUSR1: print the statistics ([`take_dump_request`]).
static DUMP: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// The signal of [`kick_vcpu`].
const KICK: libc::c_int = libc::SIGUSR2;

/// The vCPU thread (the one that installed the handlers), for [`kick_vcpu`].
static VCPU_THREAD: std::sync::OnceLock<libc::pthread_t> = std::sync::OnceLock::new();

/// How long the orderly exit may take after a stopping signal before the
/// watchdog ends the process.
pub const GRACE: Duration = Duration::from_millis(500);

/// The first stopping signal, or 0.
static STOP_SIGNAL: AtomicI32 = AtomicI32::new(0);

/// The write end of the watchdog's pipe, or -1.
static WATCHDOG_FD: AtomicI32 = AtomicI32::new(-1);

/// The `immediate_exit` byte of the running vCPU's run page, or null.
static IMMEDIATE_EXIT: AtomicPtr<u8> = AtomicPtr::new(ptr::null_mut());

/// The exit status for stopping signal `signal`: 128 + N.
pub fn exit_status(signal: libc::c_int) -> u8 {
    // CAST: signal numbers are below 65, so this fits a u8.
    EXIT_SIGNAL_BASE + (signal & 0x7f) as u8
}

/// The signal's name for messages.
pub fn name(signal: libc::c_int) -> &'static str {
    match signal {
        libc::SIGINT => "SIGINT",
        libc::SIGTERM => "SIGTERM",
        libc::SIGHUP => "SIGHUP",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGTSTP => "SIGTSTP",
        libc::SIGSYS => "SIGSYS",
        _ => "a signal",
    }
}

/// Errors from installing the handlers.
#[derive(Debug, thiserror::Error)]
pub enum SignalError {
    /// Another guard is alive.
    #[error("signal handlers are already installed for another vCPU")]
    Busy,
    /// `sigaction` failed.
    #[error("cannot install the handler for signal {signal}")]
    Sigaction {
        /// The signal number.
        signal: libc::c_int,
        /// The error.
        source: io::Error,
    },
    /// The watchdog's pipe or thread could not be made.
    #[error("cannot start the signal watchdog")]
    Watchdog(#[source] io::Error),
}

/// The handler: only async-signal-safe work (lock-free atomics, write(2)).
extern "C" fn on_signal(signal: libc::c_int) {
    if signal == KICK {
        // Only to make RUN return EINTR; kick_vcpu set immediate_exit.
        return;
    }
    if signal == libc::SIGWINCH {
        let fd = WINCH_FD.load(Ordering::SeqCst);
        if fd >= 0 {
            let one = 1u64.to_ne_bytes();
            // SAFETY: write(2) is async-signal-safe; it reads the 8 live
            // bytes of `one`. The eventfd is non-blocking and its counter
            // far from overflow, so nothing is lost that matters.
            unsafe { libc::write(fd, one.as_ptr().cast(), one.len()) };
        }
        return;
    }
    if signal == libc::SIGUSR1 {
        // A statistics dump: RUN must come back (it returns EINTR when the
        // signal came during it; immediate_exit catches one just before),
        // and the run loop clears immediate_exit again after the dump.
        DUMP.store(true, Ordering::SeqCst);
        let byte = IMMEDIATE_EXIT.load(Ordering::SeqCst);
        if !byte.is_null() {
            // SAFETY: as below.
            unsafe { AtomicU8::from_ptr(byte) }.store(1, Ordering::SeqCst);
        }
        return;
    }
    if signal != libc::SIGTSTP {
        let _ = STOP_SIGNAL.compare_exchange(0, signal, Ordering::SeqCst, Ordering::SeqCst);
        let byte = IMMEDIATE_EXIT.load(Ordering::SeqCst);
        if !byte.is_null() {
            // SAFETY: a non-null IMMEDIATE_EXIT is the `immediate_exit` byte of a
            // RunPage that a live SignalGuard borrows: the guard nulls the pointer
            // (after restoring the old handlers) before the borrow ends, so the
            // page is still mapped here. The launcher only ever accesses that byte
            // atomically (RunPage::set_immediate_exit uses AtomicU8 too), and u8
            // and AtomicU8 have the same size and alignment.
            unsafe { AtomicU8::from_ptr(byte) }.store(1, Ordering::SeqCst);
        }
    }
    if signal == libc::SIGTSTP {
        // Ctrl-Z: the terminal goes back to cooked for the stop, raw after.
        crate::virtio::term::stop_from_signal();
        return;
    }
    let fd = WATCHDOG_FD.load(Ordering::SeqCst);
    if fd >= 0 {
        // CAST: signal numbers fit a byte.
        let b = signal as u8;
        // SAFETY: write(2) is async-signal-safe; `b` is a live local byte.
        // The pipe is non-blocking, so a full pipe drops the byte, which is
        // fine: the watchdog already has one to act on.
        unsafe { libc::write(fd, (&b as *const u8).cast(), 1) };
    }
}

/// Makes the vCPU thread come back from RUN (or from a blocking write) with
/// `EINTR`: sets `immediate_exit` (for a RUN about to start) and sends it
/// SIGUSR2 (for one under way). From any thread; a no-op before
/// [`install`].
pub fn kick_vcpu() {
    let byte = IMMEDIATE_EXIT.load(Ordering::SeqCst);
    if !byte.is_null() {
        // SAFETY: as in on_signal: a non-null pointer is the live run page's
        // immediate_exit byte, only ever accessed atomically.
        unsafe { AtomicU8::from_ptr(byte) }.store(1, Ordering::SeqCst);
    }
    if let Some(&thread) = VCPU_THREAD.get() {
        // SAFETY: pthread_kill on the vCPU thread, which lives as long as
        // the process runs guests (it is the main thread); the signal has a
        // handler that does nothing.
        unsafe { libc::pthread_kill(thread, KICK) };
    }
}

/// Makes SIGWINCH write to eventfd `fd` (-1: to nothing). The owner keeps
/// `fd` open until it sets -1 again.
pub fn set_winch_fd(fd: libc::c_int) {
    WINCH_FD.store(fd, Ordering::SeqCst);
}

/// The console's escape key asked to stop the guest: notes it and brings
/// the vCPU thread back from RUN ([`kick_vcpu`]); the run loop then ends
/// with [`crate::exit::EXIT_ESCAPE`].
pub fn escape() {
    ESCAPED.store(true, Ordering::SeqCst);
    kick_vcpu();
}

/// Whether [`escape`] was called.
pub fn escaped() -> bool {
    ESCAPED.load(Ordering::SeqCst)
}

/// Whether SIGUSR1 asked for a statistics dump since the last call; the
/// caller then clears `immediate_exit` (unless a stopping signal came,
/// which [`stop_signal`] shows: check it after this).
pub fn take_dump_request() -> bool {
    DUMP.swap(false, Ordering::SeqCst)
}

/// The first stopping signal that arrived, if any.
pub fn stop_signal() -> Option<libc::c_int> {
    match STOP_SIGNAL.load(Ordering::SeqCst) {
        0 => None,
        s => Some(s),
    }
}

fn sigmask(how: libc::c_int) {
    // SAFETY: sigset_t is a plain C type for which all-zero bytes are valid;
    // sigemptyset then initialises it properly.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid, writable sigset_t for each call, and
    // pthread_sigmask only reads it (the old mask is not asked for).
    let ret = unsafe {
        libc::sigemptyset(&mut set);
        for signal in SIGNALS {
            libc::sigaddset(&mut set, signal);
        }
        libc::pthread_sigmask(how, &set, ptr::null_mut())
    };
    if ret != 0 {
        log::warn!("cannot change the signal mask: {}", io::Error::from_raw_os_error(ret));
    }
}

/// Blocks the launcher's signals in the calling thread (and so in every
/// thread it starts afterwards): `run.rs` calls it before it starts any
/// thread, so that only the vCPU thread, which calls [`unblock`], takes
/// them.
pub fn block() {
    sigmask(libc::SIG_BLOCK);
}

/// Unblocks the launcher's signals in the calling thread (the vCPU thread).
pub fn unblock() {
    sigmask(libc::SIG_UNBLOCK);
}

/// What the watchdog does before it ends the process: restore the
/// terminal.
#[derive(Clone, Copy, Debug)]
pub struct WatchdogHooks {
    /// Just before the process ends.
    pub on_exit: fn(),
}

/// The watchdog thread (see the module's documentation). It lives until
/// the process ends.
#[derive(Debug)]
pub struct Watchdog(());

impl Watchdog {
    /// Starts the watchdog, which gives the orderly exit `grace` after a
    /// stopping signal.
    pub fn start(grace: Duration, hooks: WatchdogHooks) -> Result<Self, SignalError> {
        let mut fds = [0 as libc::c_int; 2];
        // SAFETY: pipe2 writes two descriptors into the live array.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) } != 0 {
            return Err(SignalError::Watchdog(io::Error::last_os_error()));
        }
        let [rd, wr] = fds;
        std::thread::Builder::new()
            .name("lguest-watchdog".into())
            .spawn(move || watch(rd, grace, hooks))
            .map_err(SignalError::Watchdog)?;
        WATCHDOG_FD.store(wr, Ordering::SeqCst);
        Ok(Self(()))
    }
}

/// The watchdog's loop on the read end `rd` of its pipe.
fn watch(rd: libc::c_int, grace: Duration, hooks: WatchdogHooks) {
    block();
    if let Err(e) = crate::sandbox::drop_capabilities() {
        log::warn!("watchdog: {e}");
    }
    crate::run::enter_or_exit(crate::sandbox::Role::Helper);
    let mut deadline: Option<Instant> = None;
    loop {
        // CAST: at most `grace` (half a second) in milliseconds.
        let ms = deadline.map_or(-1, |d| d.saturating_duration_since(Instant::now()).as_millis() as i32);
        let mut pfd = libc::pollfd { fd: rd, events: libc::POLLIN, revents: 0 };
        // SAFETY: one live pollfd.
        let n = unsafe { libc::poll(&mut pfd, 1, ms) };
        if n == 0 {
            leave(stop_signal().unwrap_or(libc::SIGTERM), "still not stopped", hooks.on_exit);
        }
        let mut b = 0u8;
        // SAFETY: reads at most one byte into a live local.
        if n < 0 || unsafe { libc::read(rd, (&mut b as *mut u8).cast(), 1) } != 1 {
            continue;
        }
        let sig = libc::c_int::from(b);
        if deadline.is_some() {
            leave(sig, "a second stopping signal", hooks.on_exit);
        } else {
            deadline = Some(Instant::now() + grace);
        }
    }
}

/// Ends the process at once with 128 + `sig`, after `on_exit`.
fn leave(sig: libc::c_int, why: &str, on_exit: fn()) -> ! {
    on_exit();
    let msg = format!("lguest: {why} {} ms after {}; exiting now\n", GRACE.as_millis(), name(sig));
    // SAFETY: writes the bytes of a live String to stderr.
    unsafe { libc::write(libc::STDERR_FILENO, msg.as_ptr().cast(), msg.len()) };
    // SAFETY: _exit ends the process without running anything else, which
    // is the point: some thread is stuck.
    unsafe { libc::_exit(i32::from(exit_status(sig))) }
}

/// The handlers are installed while this lives; dropping it restores the
/// previous ones and detaches the run page.
#[derive(Debug)]
pub struct SignalGuard<'page> {
    old: Vec<(libc::c_int, libc::sigaction)>,
    _page: PhantomData<&'page RunPage>,
}

/// Installs the signal handlers for the vCPU whose run page is
/// `page`.
pub fn install(page: &RunPage) -> Result<SignalGuard<'_>, SignalError> {
    IMMEDIATE_EXIT
        .compare_exchange(ptr::null_mut(), page.immediate_exit_ptr(), Ordering::SeqCst, Ordering::SeqCst)
        .map_err(|_| SignalError::Busy)?;
    // SAFETY: pthread_self has no preconditions.
    let _ = VCPU_THREAD.set(unsafe { libc::pthread_self() });
    // From here on, dropping `guard` undoes whatever was done.
    let mut guard = SignalGuard { old: Vec::new(), _page: PhantomData };

    // SAFETY: `libc::sigaction` is a plain C struct (integers, a signal set
    // and an optional function pointer) for which all-zero bytes are valid.
    let mut action: libc::sigaction = unsafe { std::mem::zeroed() };
    action.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
    // No SA_RESTART: RUN must come back with EINTR. No SA_SIGINFO: the
    // handler takes one argument.
    action.sa_flags = 0;
    // SAFETY: `action.sa_mask` is a valid, writable sigset_t.
    unsafe { libc::sigemptyset(&mut action.sa_mask) };

    for signal in SIGNALS {
        // SAFETY: see above; all-zero is a valid sigaction to be overwritten.
        let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
        // SAFETY: both pointers are to valid sigaction structs for the whole
        // call; the handler it installs is async-signal-safe (atomics only).
        let ret = unsafe { libc::sigaction(signal, &action, &mut old) };
        if ret != 0 {
            return Err(SignalError::Sigaction { signal, source: io::Error::last_os_error() });
        }
        guard.old.push((signal, old));
    }
    Ok(guard)
}

impl Drop for SignalGuard<'_> {
    fn drop(&mut self) {
        for (signal, old) in self.old.drain(..).rev() {
            // SAFETY: `old` is the sigaction the kernel gave back when ours
            // was installed, so it is valid to reinstate.
            let ret = unsafe { libc::sigaction(signal, &old, ptr::null_mut()) };
            if ret != 0 {
                log::warn!("cannot restore the handler of signal {signal}: {}", io::Error::last_os_error());
            }
        }
        // Only after the handlers are gone may the page pointer go.
        IMMEDIATE_EXIT.store(ptr::null_mut(), Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signal_statuses_are_128_plus_n() {
        assert_eq!(exit_status(libc::SIGINT), 130);
        assert_eq!(exit_status(libc::SIGTERM), 143);
        assert_eq!(exit_status(libc::SIGHUP), 129);
        assert_eq!(exit_status(libc::SIGQUIT), 131);
        assert_eq!(exit_status(libc::SIGSYS), 159);
    }

    /// The one test that raises a signal (it affects the whole process).
    #[test]
    fn sigint_sets_immediate_exit_and_the_flag() {
        let page = RunPage::anonymous().expect("page");
        let other = RunPage::anonymous().expect("page");
        {
            let _guard = install(&page).expect("install");
            assert!(matches!(install(&other), Err(SignalError::Busy)));
            assert!(!page.immediate_exit());
            // SAFETY: raise() only delivers SIGINT to this thread, where our
            // handler runs before raise() returns.
            let ret = unsafe { libc::raise(libc::SIGINT) };
            assert_eq!(ret, 0);
            assert!(page.immediate_exit(), "the handler set immediate_exit");
            assert_eq!(stop_signal(), Some(libc::SIGINT), "the handler noted the signal");
            assert!(!other.immediate_exit());
        }
        // The guard is gone: the pointer is free for the next vCPU.
        let guard = install(&other).expect("install again");
        drop(guard);
        assert!(IMMEDIATE_EXIT.load(Ordering::SeqCst).is_null());
    }
}
