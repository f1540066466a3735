// SPDX-License-Identifier: GPL-2.0
//! [`GuestCell`]: the one way this crate keeps mutable state in a `static`.
//!
//! A guest has exactly one vCPU (`LGUEST_MAX_VCPUS` is 1), so nothing runs
//! in parallel with the code that owns a static. What remains is
//! re-entrancy: an interrupt or trap handler ([`crate::interrupts`]) running
//! in the middle of any code, or a `Display` impl that prints or panics
//! while the console is being written. Every user of a `GuestCell` either
//! only writes it before interrupts can be on (the command line) or guards
//! it with its own busy flag, an atomic swap (one `xchg`, which no
//! interrupt can split), documented where it is used. State a handler shares
//! with other code is kept in atomics, not here.

use core::cell::UnsafeCell;

/// An `UnsafeCell` that may live in a `static` on a uniprocessor guest.
#[repr(transparent)]
pub struct GuestCell<T>(UnsafeCell<T>);

// SAFETY: the guest has one vCPU, so no two threads of execution run at
// once; an interrupt handler nests inside the code it interrupts, like a
// re-entrant call. Sharing `&GuestCell` is therefore sound as long as each
// user keeps its own accesses from overlapping, nested ones included, which
// `get` makes an `unsafe` obligation of the caller (dereferencing the raw
// pointer).
unsafe impl<T> Sync for GuestCell<T> {}

impl<T> GuestCell<T> {
    /// A cell holding `value`.
    pub const fn new(value: T) -> Self {
        Self(UnsafeCell::new(value))
    }

    /// A raw pointer to the contents. Dereferencing it is the caller's
    /// responsibility: no other reference to the contents may be live.
    pub const fn get(&self) -> *mut T {
        self.0.get()
    }
}
