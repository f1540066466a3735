// SPDX-License-Identifier: GPL-2.0
//! The async hypercall ring in `lguest_data`: queueing entries, and
//! checking that the host ran exactly the queued ones.
//!
//! The host walks the ring from where it stopped (`next_hcall`, which starts
//! at 0 and advances by one for each entry it runs) and stops at the first
//! status that is not 0. Nothing else in this guest queues entries, so
//! [`Ring::next`] is always the host's position.

use core::ptr::addr_of_mut;

use lguest_guest::abi::{HcallArgs, LguestData, LHCALL_RING_SIZE, LHCALL_STATUS_DONE};
use lguest_guest::data;

use crate::fail;

/// The guest's view of the ring.
pub struct Ring {
    /// The entry the host looks at next.
    next: usize,
    /// Entries queued since the last [`Ring::check_ran`].
    queued: usize,
    /// Entries queued since boot.
    pub total: u64,
}

/// The shared page.
fn page() -> *mut LguestData {
    data::address() as *mut LguestData
}

fn status(slot: usize) -> u8 {
    // SAFETY: `slot` < LHCALL_RING_SIZE (callers reduce it); the shared page
    // is a live static, and only volatile accesses touch it.
    unsafe { addr_of_mut!((*page()).hcall_status[slot]).read_volatile() }
}

fn set_status(slot: usize, value: u8) {
    // SAFETY: as in `status`.
    unsafe { addr_of_mut!((*page()).hcall_status[slot]).write_volatile(value) }
}

fn set_args(slot: usize, args: HcallArgs) {
    // SAFETY: as in `status`.
    unsafe { addr_of_mut!((*page()).hcalls[slot]).write_volatile(args) }
}

impl Ring {
    /// The ring at boot: empty, the host at entry 0.
    pub const fn new() -> Self {
        Self { next: 0, queued: 0, total: 0 }
    }

    /// Queues one entry: arguments first, then the status 0. Room is
    /// checked: the entry must be free (the host ran it).
    pub fn queue(&mut self, args: [u64; 5]) {
        if self.queued >= LHCALL_RING_SIZE {
            fail(format_args!("ring: more than {LHCALL_RING_SIZE} entries queued"));
        }
        let slot = (self.next + self.queued) % LHCALL_RING_SIZE;
        let st = status(slot);
        if st != LHCALL_STATUS_DONE {
            fail(format_args!("ring: entry {slot} is not free (status {st:#x})"));
        }
        set_args(slot, to_args(args));
        set_status(slot, 0);
        self.queued += 1;
        self.total += 1;
    }

    /// After a hypercall: every queued entry must have been run (status
    /// `LHCALL_STATUS_DONE`), the ring is empty again.
    pub fn check_ran(&mut self) {
        for i in 0..self.queued {
            let slot = (self.next + i) % LHCALL_RING_SIZE;
            let st = status(slot);
            if st != LHCALL_STATUS_DONE {
                fail(format_args!(
                    "ring: entry {slot} ({} of {} queued) has status {st:#x} after a hypercall",
                    i + 1,
                    self.queued
                ));
            }
        }
        self.next = (self.next + self.queued) % LHCALL_RING_SIZE;
        self.queued = 0;
    }

    /// Puts junk in the next entry with a status that is neither 0 nor
    /// DONE, and, if given, a queued entry (status 0) right behind it: the
    /// host must stop at the junk and run neither.
    pub fn put_junk(&mut self, junk: [u64; 5], junk_status: u8, behind: Option<[u64; 5]>) {
        let slot = self.next;
        set_args(slot, to_args(junk));
        set_status(slot, junk_status);
        if let Some(b) = behind {
            let slot = (slot + 1) % LHCALL_RING_SIZE;
            set_args(slot, to_args(b));
            set_status(slot, 0);
        }
    }

    /// After a hypercall: the junk entry, and the one behind it if there
    /// was one, must be untouched; then both are freed again.
    pub fn check_junk(&mut self, junk_status: u8, behind: bool) {
        let st = status(self.next);
        if st != junk_status {
            fail(format_args!("ring: entry {} with status {junk_status:#x} became {st:#x}", self.next));
        }
        set_status(self.next, LHCALL_STATUS_DONE);
        if behind {
            let slot = (self.next + 1) % LHCALL_RING_SIZE;
            let st = status(slot);
            if st != 0 {
                fail(format_args!("ring: entry {slot}, queued behind a junk entry, was run (status {st:#x})"));
            }
            set_status(slot, LHCALL_STATUS_DONE);
        }
    }
}

fn to_args(a: [u64; 5]) -> HcallArgs {
    HcallArgs { arg0: a[0], arg1: a[1], arg2: a[2], arg3: a[3], arg4: a[4] }
}
