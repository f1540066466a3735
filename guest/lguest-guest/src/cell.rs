// SPDX-License-Identifier: GPL-2.0
//! [`GuestCell`]: the one way this crate keeps mutable state in a `static`.
//!
//! A guest has exactly one vCPU (`LGUEST_MAX_VCPUS` is 1) and, so far, no
//! interrupt handlers, so nothing runs concurrently with the code that owns a
//! static. What remains is re-entrancy (a `Display` impl that prints or
//! panics while the console is being written); every user of a `GuestCell`
//! guards against that with its own busy flag, documented where it is used.

use core::cell::UnsafeCell;

/// An `UnsafeCell` that may live in a `static` on a uniprocessor guest.
#[repr(transparent)]
pub struct GuestCell<T>(UnsafeCell<T>);

// SAFETY: the guest has one vCPU and no interrupt handlers, so no two threads
// of execution can touch the cell at once; sharing `&GuestCell` is therefore
// sound as long as each user keeps its own accesses from overlapping, which
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
