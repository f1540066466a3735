// SPDX-License-Identifier: GPL-2.0
//! SIGINT and SIGTERM while a guest runs.
//!
//! The handlers (installed with `sigaction`, without `SA_RESTART`) set a flag
//! and the run page's `immediate_exit` byte. A signal that arrives while the
//! vCPU runs makes RUN return `EINTR`; one that arrives just before RUN is
//! caught by `immediate_exit`, which the host checks at the start of RUN. So
//! no signal is masked around RUN and none can be lost. When RUN returns
//! `EINTR` the run loop asks [`interrupted`]: if set, it stops; if not (some
//! other signal), it runs again. Device threads block both signals
//! ([`block_in_this_thread`]), so the kernel always gives them to the vCPU
//! thread, whose RUN they must interrupt.
//!
//! The handler reaches the run page through a global pointer, which
//! [`install`] sets and the returned [`SignalGuard`] clears when dropped; the
//! guard borrows the [`RunPage`], so the page cannot be unmapped while the
//! handler may still use it. Only one guard can exist at a time.

use std::io;
use std::marker::PhantomData;
use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU8, Ordering};

use crate::dev::RunPage;

/// The signals that stop the guest.
const SIGNALS: [libc::c_int; 2] = [libc::SIGINT, libc::SIGTERM];

/// Set by the handler: a stopping signal arrived.
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

/// The `immediate_exit` byte of the running vCPU's run page, or null.
static IMMEDIATE_EXIT: AtomicPtr<u8> = AtomicPtr::new(ptr::null_mut());

/// The exit status after SIGINT or SIGTERM (128 + SIGINT, as shells use).
pub const EXIT_INTERRUPTED: u8 = 130;

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
}

/// The handler: only async-signal-safe work (lock-free atomics).
extern "C" fn on_signal(_signal: libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
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

/// Whether SIGINT or SIGTERM arrived since the process started.
pub fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::SeqCst)
}

/// Blocks SIGINT and SIGTERM in the calling thread, so that the kernel
/// hands them to the vCPU thread, whose RUN they must interrupt. Device
/// threads call it first thing.
pub fn block_in_this_thread() {
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
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, ptr::null_mut())
    };
    if ret != 0 {
        log::warn!("cannot block SIGINT and SIGTERM in a device thread: {}", io::Error::from_raw_os_error(ret));
    }
}

/// The handlers are installed while this lives; dropping it restores the
/// previous ones and detaches the run page.
#[derive(Debug)]
pub struct SignalGuard<'page> {
    old: Vec<(libc::c_int, libc::sigaction)>,
    _page: PhantomData<&'page RunPage>,
}

/// Installs the SIGINT and SIGTERM handlers for the vCPU whose run page is
/// `page`.
pub fn install(page: &RunPage) -> Result<SignalGuard<'_>, SignalError> {
    IMMEDIATE_EXIT
        .compare_exchange(ptr::null_mut(), page.immediate_exit_ptr(), Ordering::SeqCst, Ordering::SeqCst)
        .map_err(|_| SignalError::Busy)?;
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
            assert!(interrupted(), "the handler set the flag");
            assert!(!other.immediate_exit());
        }
        // The guard is gone: the pointer is free for the next vCPU.
        let guard = install(&other).expect("install again");
        drop(guard);
        assert!(IMMEDIATE_EXIT.load(Ordering::SeqCst).is_null());
    }
}
