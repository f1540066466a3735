// SPDX-License-Identifier: GPL-2.0
//! Typed access to a vCPU's `struct lguest_data`, the page of guest RAM
//! the guest registers with `LHCALL_LGUEST_INIT` and shares with the host
//! (`uapi::LguestData`, described in `guest-abi.rst`).
//!
//! The guest may write any field at any time, so every accessor reads or
//! writes its field once, through the pinned pages, and hands the caller
//! a plain value to check; the offsets come from the ABI struct. A field
//! that is no longer guest memory kills the guest. Nothing here keeps
//! state: an [`LguestData`] is only the registered address.

use core::mem::offset_of;
use kernel::prelude::*;

use crate::{
    gmem::GuestMemory,
    helpers,
    kill::{
        kill,
        Kill, //
    },
    uapi::{
        self,
        HcallArgs,
        LguestData as Raw, //
    },
};

/// A registered `lguest_data`: its guest-physical address.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct LguestData {
    gpa: u64,
}

impl LguestData {
    /// Checks `gpa` as LGUEST_INIT must (8-byte aligned, the whole struct
    /// in guest memory) and fills in what the host provides:
    /// the end of guest addresses, the TSC's frequency, the time.
    pub(crate) fn register(mem: &GuestMemory, gpa: u64) -> Result<Self, Kill> {
        let size = core::mem::size_of::<Raw>() as u64;
        if gpa % 8 != 0 || gpa.checked_add(size).map_or(true, |end| end > mem.size()) {
            return kill!("bad lguest_data address {gpa:#x}");
        }
        let ld = Self { gpa };
        let put = |off: usize, bytes: &[u8]| mem.write(gpa + off as u64, bytes).is_ok();
        // The guest's addresses end below the last lower-half page.
        let ok = put(
            offset_of!(Raw, reserve_mem),
            &uapi::GUEST_VA_END.to_le_bytes(),
        ) && put(
            offset_of!(Raw, tsc_khz),
            &helpers::tsc_khz_if_stable().to_le_bytes(),
        ) && ld.write_time(mem).is_ok();
        if !ok {
            return kill!("cannot write lguest_data at {gpa:#x}");
        }
        Ok(ld)
    }

    fn read(&self, mem: &GuestMemory, off: usize) -> Result<u64, Kill> {
        match mem.read_u64(self.gpa + off as u64) {
            Ok(v) => Ok(v),
            Err(_) => kill!("lguest_data at {:#x} is no longer readable", self.gpa),
        }
    }

    fn write(&self, mem: &GuestMemory, off: usize, v: u64) -> Result<(), Kill> {
        if mem.write_u64(self.gpa + off as u64, v).is_err() {
            return kill!("lguest_data at {:#x} is no longer writable", self.gpa);
        }
        Ok(())
    }

    /// `irq_enabled`: the guest kernel's virtual IF, as it wrote it.
    pub(crate) fn irq_enabled(&self, mem: &GuestMemory) -> Result<u64, Kill> {
        self.read(mem, offset_of!(Raw, irq_enabled))
    }

    /// Sets virtual interrupts on (`true`) or off.
    pub(crate) fn set_irq_enabled(&self, mem: &GuestMemory, on: bool) -> Result<(), Kill> {
        let v = if on { uapi::X86_EFLAGS_IF } else { 0 };
        self.write(mem, offset_of!(Raw, irq_enabled), v)
    }

    /// `blocked_interrupts`: interrupts the guest does not want now.
    pub(crate) fn blocked(&self, mem: &GuestMemory) -> Result<u64, Kill> {
        self.read(mem, offset_of!(Raw, blocked_interrupts))
    }

    /// Writes `irq_pending`.
    pub(crate) fn set_irq_pending(&self, mem: &GuestMemory, on: bool) -> Result<(), Kill> {
        let v = if on { uapi::X86_EFLAGS_IF } else { 0 };
        self.write(mem, offset_of!(Raw, irq_pending), v)
    }

    /// `noirq_iret`: the address of the guest's `iretq`.
    pub(crate) fn noirq_iret(&self, mem: &GuestMemory) -> Result<u64, Kill> {
        self.read(mem, offset_of!(Raw, noirq_iret))
    }

    /// `kernel_sp0`: the guest kernel's stack for entries from user mode,
    /// 0 if it keeps none here.
    pub(crate) fn kernel_sp0(&self, mem: &GuestMemory) -> Result<u64, Kill> {
        self.read(mem, offset_of!(Raw, kernel_sp0))
    }

    /// The guest's virtual CR2: the last page fault's address, as the host
    /// wrote it (or the guest's own `write_cr2`).
    pub(crate) fn cr2(&self, mem: &GuestMemory) -> Result<u64, Kill> {
        self.read(mem, offset_of!(Raw, cr2))
    }

    /// `debugreg`: DR0-DR3 as the guest wrote them, each read once.
    pub(crate) fn debugregs(&self, mem: &GuestMemory) -> Result<[u64; 4], Kill> {
        let mut v = [0u64; 4];
        for (i, r) in v.iter_mut().enumerate() {
            *r = self.read(mem, offset_of!(Raw, debugreg) + 8 * i)?;
        }
        Ok(v)
    }

    /// Writes `dr6` (before a debug exception is delivered).
    pub(crate) fn set_dr6(&self, mem: &GuestMemory, dr6: u64) -> Result<(), Kill> {
        self.write(mem, offset_of!(Raw, dr6), dr6)
    }

    /// Writes `cr2` (before a page fault is delivered).
    pub(crate) fn set_cr2(&self, mem: &GuestMemory, cr2: u64) -> Result<(), Kill> {
        self.write(mem, offset_of!(Raw, cr2), cr2)
    }

    /// Writes the wall-clock time into `time`.
    pub(crate) fn write_time(&self, mem: &GuestMemory) -> Result<(), Kill> {
        let (sec, nsec) = helpers::real_time();
        let mut t = [0u8; 16];
        t[..8].copy_from_slice(&sec.to_le_bytes());
        t[8..].copy_from_slice(&nsec.to_le_bytes());
        if mem
            .write(self.gpa + offset_of!(Raw, time) as u64, &t)
            .is_err()
        {
            return kill!("lguest_data at {:#x} is no longer writable", self.gpa);
        }
        Ok(())
    }

    fn status_at(&self, n: usize) -> u64 {
        self.gpa + (offset_of!(Raw, hcall_status) + n % uapi::LHCALL_RING_SIZE) as u64
    }

    /// Async ring entry `n` if the guest queued it (its status is 0): the
    /// call and its arguments, read once.
    pub(crate) fn queued(&self, mem: &GuestMemory, n: usize) -> Result<Option<HcallArgs>, Kill> {
        let mut status = [0u8; 1];
        if mem.read(self.status_at(n), &mut status).is_err() {
            return kill!("lguest_data at {:#x} is no longer readable", self.gpa);
        }
        if status[0] != 0 {
            return Ok(None);
        }
        let mut raw = [0u8; core::mem::size_of::<HcallArgs>()];
        let n = n % uapi::LHCALL_RING_SIZE;
        let args_at = self.gpa + (offset_of!(Raw, hcalls) + n * raw.len()) as u64;
        if mem.read(args_at, &mut raw).is_err() {
            return kill!("lguest_data at {:#x} is no longer readable", self.gpa);
        }
        let word =
            |i: usize| u64::from_le_bytes(raw[8 * i..8 * i + 8].try_into().unwrap_or([0; 8]));
        Ok(Some(HcallArgs {
            arg0: word(0),
            arg1: word(1),
            arg2: word(2),
            arg3: word(3),
            arg4: word(4),
        }))
    }

    /// Marks async ring entry `n` done.
    pub(crate) fn done(&self, mem: &GuestMemory, n: usize) -> Result<(), Kill> {
        if mem
            .write(self.status_at(n), &[uapi::LHCALL_STATUS_DONE])
            .is_err()
        {
            return kill!("lguest_data at {:#x} is no longer writable", self.gpa);
        }
        Ok(())
    }
}
