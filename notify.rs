// SPDX-License-Identifier: GPL-2.0
//! ioeventfds: guest notifications that bypass the launcher's vCPU thread.
//!
//! A launcher binds a guest-physical notification address (a virtqueue's
//! address on the lguest bus) to an eventfd with `LGUEST_IOEVENTFD`. When
//! the guest then makes `LHCALL_NOTIFY` with exactly that address, the run
//! loop signals the eventfd and goes straight back into the guest: the
//! device thread waiting on the eventfd wakes up, and the vCPU thread never
//! leaves the kernel (lguest's `LHREQ_EVENTFD`, KVM's ioeventfd).
//!
//! The table is shared between the VM (the run loop, holding the VM mutex)
//! and the ioctl, which must work while RUN holds that mutex; its own mutex
//! is a leaf lock: `LguestFile::vm` -> `Notifiers::list`.

use kernel::{
    new_mutex,
    prelude::*,
    sync::{
        Arc,
        Mutex, //
    },
};

use crate::{
    helpers::EventFd,
    uapi, //
};

/// One binding.
struct IoEventFd {
    addr: u64,
    fd: EventFd,
}

/// The notification addresses of one VM that are bound to eventfds.
#[pin_data]
pub(crate) struct Notifiers {
    #[pin]
    list: Mutex<KVec<IoEventFd>>,
}

impl Notifiers {
    /// An empty table.
    pub(crate) fn new() -> Result<Arc<Self>> {
        Arc::pin_init(
            pin_init!(Notifiers {
                list <- new_mutex!(KVec::new(), "Notifiers::list"),
            }),
            GFP_KERNEL,
        )
    }

    /// Handles `LGUEST_IOEVENTFD`: binds `addr` to eventfd `fd`, or unbinds
    /// it when `flags` is `LGUEST_IOEVENTFD_DEASSIGN`.
    pub(crate) fn ioctl(&self, req: &uapi::LguestIoeventfd) -> Result {
        // Guest-physical addresses live far below the top of the lower half.
        if req.addr >= 1 << 47 {
            return Err(EINVAL);
        }
        let mut list = self.list.lock();
        match req.flags {
            0 => {
                if req.fd < 0 {
                    return Err(EINVAL);
                }
                if list.len() >= uapi::LGUEST_MAX_IOEVENTFDS {
                    return Err(ENOSPC);
                }
                if list.iter().any(|b| b.addr == req.addr) {
                    return Err(EEXIST);
                }
                let fd = EventFd::get(req.fd)?;
                list.push(IoEventFd { addr: req.addr, fd }, GFP_KERNEL)?;
            }
            uapi::LGUEST_IOEVENTFD_DEASSIGN => {
                let i = list.iter().position(|b| b.addr == req.addr).ok_or(ENOENT)?;
                // Dropping the binding puts the eventfd.
                drop(list.remove(i)?);
            }
            _ => return Err(EINVAL),
        }
        Ok(())
    }

    /// Signals the eventfd bound to `addr`, if there is one; returns whether
    /// there was (then the notification is handled).
    pub(crate) fn signal(&self, addr: u64) -> bool {
        let list = self.list.lock();
        match list.iter().find(|b| b.addr == addr) {
            Some(b) => {
                b.fd.signal();
                true
            }
            None => false,
        }
    }
}
