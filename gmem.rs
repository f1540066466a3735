// SPDX-License-Identifier: GPL-2.0
//! Memory: host pages (for page tables and run pages) and the guest's
//! pinned RAM, with the host's reads and writes of guest-physical memory.
//!
//! Guest RAM is the launcher's memory. At VM creation every page of it is
//! pinned (`pin_user_pages_fast` with `FOLL_LONGTERM`), so the physical pages
//! the shadow tables point at cannot be freed or migrated while the guest can
//! reach them, whatever the launcher does to its mappings afterwards: the
//! guest keeps the pinned pages until the VM is destroyed, when the pins are
//! released (`Drop`). The host's own accesses to guest memory (hypercall
//! arguments, `lguest_data`, interrupt frames, page walks) go through the
//! same pinned pages ([`GuestMemory::read`], [`GuestMemory::write`]), so
//! host and guest always see one memory. A launcher that maps something
//! else over guest RAM (`mmap(MAP_FIXED)`, `mremap`, `munmap`) changes only
//! what its own threads see: the guest and the module go on with the pages
//! pinned at creation.
//!
//! Guest-virtual accesses walk the guest's tables first (`paging.rs`).
//! Nothing here is shared between threads without the VM's lock.

use kernel::{
    alloc::flags::{
        __GFP_ZERO, //
        GFP_KERNEL_ACCOUNT,
    },
    bindings,
    page::Page,
    prelude::*, //
};

use crate::{
    helpers,
    uapi::{
        self,
        LguestRun, //
    },
};

/// Page size.
pub(crate) const PAGE_SIZE: u64 = 4096;

/// PTE bits.
pub(crate) const PTE_P: u64 = 1 << 0;
pub(crate) const PTE_RW: u64 = 1 << 1;
pub(crate) const PTE_US: u64 = 1 << 2;
pub(crate) const PTE_A: u64 = 1 << 5;
pub(crate) const PTE_D: u64 = 1 << 6;
pub(crate) const PTE_NX: u64 = 1 << 63;
/// The physical address bits of an entry (52-bit physical addresses).
pub(crate) const PTE_ADDR: u64 = 0x000f_ffff_ffff_f000;

/// A zeroed page of host memory, with its physical and kernel addresses.
pub(crate) struct HostPage {
    page: Page,
    phys: u64,
    va: *mut u64,
}

// SAFETY: The page is owned by this value; `va` is only its direct-map
// address, valid on every CPU and in every thread.
unsafe impl Send for HostPage {}
// SAFETY: Shared references only read `phys`/`va`; writes through `va` need
// `&mut self` or the VM lock held by the caller.
unsafe impl Sync for HostPage {}

impl HostPage {
    /// Allocates a zeroed page.
    pub(crate) fn new() -> Result<Self> {
        // Charged to the memory cgroup of the task that asks (the launcher):
        // shadow tables and run pages are its VM's memory.
        let page = Page::alloc_page(GFP_KERNEL_ACCOUNT | __GFP_ZERO)?;
        // SAFETY: `page` owns a valid struct page.
        let phys = unsafe { helpers::page_to_phys(page.as_ptr()) };
        // SAFETY: As above; x86-64 has no highmem, so the address is valid
        // for as long as the page is allocated.
        let va = unsafe { helpers::page_address(page.as_ptr()) }.cast::<u64>();
        Ok(Self { page, phys, va })
    }

    /// Physical address.
    pub(crate) fn phys(&self) -> u64 {
        self.phys
    }

    /// Kernel address (direct map).
    pub(crate) fn va(&self) -> *mut u8 {
        self.va.cast()
    }

    /// The page, for mapping it into userspace.
    pub(crate) fn page(&self) -> &Page {
        &self.page
    }
}

/// What an exit writes into a vCPU's run page (`uapi::LguestRun`).
pub(crate) struct RunExit<'a> {
    pub(crate) reason: u32,
    pub(crate) notify_addr: u64,
    pub(crate) notify_arg: u64,
    pub(crate) shutdown_reason: u64,
    pub(crate) stats: RunStats,
    /// Cut to `LGUEST_MESSAGE_LEN - 1` bytes and NUL-terminated.
    pub(crate) message: &'a [u8],
}

/// A vCPU's counters, as the run page shows them (`uapi::LguestRun`).
pub(crate) struct RunStats {
    pub(crate) exits: u64,
    pub(crate) hypercalls: u64,
    pub(crate) shadow_pages: u64,
    pub(crate) fpu_entries: u64,
    pub(crate) global_flushes: u64,
    pub(crate) direct_syscalls: u64,
    pub(crate) direct_sysrets: u64,
    pub(crate) ibpbs: u64,
    pub(crate) shadow_reuses: u64,
}

/// A page used as a vCPU's run page, shared with the launcher (which may
/// write `immediate_exit` at any time and reads the rest after RUN).
impl HostPage {
    fn run_ptr(&self) -> *mut LguestRun {
        self.va.cast()
    }

    /// Reads the run page's `immediate_exit` once.
    pub(crate) fn run_immediate_exit(&self) -> bool {
        // SAFETY: The page is ours and a `LguestRun` fits in it (asserted
        // below); the launcher may write the byte at any time, hence the
        // volatile read.
        unsafe { core::ptr::addr_of!((*self.run_ptr()).immediate_exit).read_volatile() != 0 }
    }

    /// Fills the run page for an exit to the launcher.
    pub(crate) fn run_write_exit(&self, e: &RunExit<'_>) {
        let r = self.run_ptr();
        let n = core::cmp::min(e.message.len(), uapi::LGUEST_MESSAGE_LEN - 1);
        // SAFETY: `r` points to our page (see `run_immediate_exit`); each
        // field is written with a volatile store as the launcher may read it
        // concurrently (it only should after RUN returns); the message and
        // its NUL fit the `message` array (`n < LGUEST_MESSAGE_LEN`).
        unsafe {
            core::ptr::addr_of_mut!((*r).exit_reason).write_volatile(e.reason);
            core::ptr::addr_of_mut!((*r).notify_addr).write_volatile(e.notify_addr);
            core::ptr::addr_of_mut!((*r).notify_arg).write_volatile(e.notify_arg);
            core::ptr::addr_of_mut!((*r).shutdown_reason).write_volatile(e.shutdown_reason);
            let msg = core::ptr::addr_of_mut!((*r).message).cast::<u8>();
            for (i, &b) in e.message[..n].iter().enumerate() {
                msg.add(i).write_volatile(b);
            }
            msg.add(n).write_volatile(0);
        }
        self.run_write_stats(&e.stats);
    }

    /// Writes the counters into the run page: on every return from RUN,
    /// an exit's or a signal's (SIGUSR1's dump reads them while the guest
    /// runs on).
    pub(crate) fn run_write_stats(&self, s: &RunStats) {
        let r = self.run_ptr();
        // SAFETY: `r` points to our page (see `run_immediate_exit`); each
        // field is written with a volatile store as the launcher may read it
        // concurrently (it only should after RUN returns).
        unsafe {
            core::ptr::addr_of_mut!((*r).stat_exits).write_volatile(s.exits);
            core::ptr::addr_of_mut!((*r).stat_hypercalls).write_volatile(s.hypercalls);
            core::ptr::addr_of_mut!((*r).stat_shadow_pages).write_volatile(s.shadow_pages);
            core::ptr::addr_of_mut!((*r).stat_fpu_entries).write_volatile(s.fpu_entries);
            core::ptr::addr_of_mut!((*r).stat_global_flushes).write_volatile(s.global_flushes);
            core::ptr::addr_of_mut!((*r).stat_direct_syscalls).write_volatile(s.direct_syscalls);
            core::ptr::addr_of_mut!((*r).stat_direct_sysrets).write_volatile(s.direct_sysrets);
            core::ptr::addr_of_mut!((*r).stat_ibpbs).write_volatile(s.ibpbs);
            core::ptr::addr_of_mut!((*r).stat_shadow_reuses).write_volatile(s.shadow_reuses);
        }
    }
}

const _: () = assert!(core::mem::size_of::<LguestRun>() <= PAGE_SIZE as usize);

/// The guest's RAM: the launcher's pages, pinned.
///
/// # Invariants
///
/// `pages[i]` is a pinned page backing launcher address `base + i * 4096`
/// (at VM creation), held until `Drop`.
pub(crate) struct GuestMemory {
    pages: KVVec<usize>,
}

// SAFETY: The page pointers are only used to compute physical addresses and
// to unpin in Drop; struct pages are global kernel objects.
unsafe impl Send for GuestMemory {}
// SAFETY: As above; `&self` methods only read.
unsafe impl Sync for GuestMemory {}

impl GuestMemory {
    /// Pins `size` bytes of the current process's memory at `base`.
    pub(crate) fn pin(base: u64, size: u64) -> Result<Self> {
        let npages = (size / PAGE_SIZE) as usize;
        let mut mem = GuestMemory {
            pages: KVVec::with_capacity(npages, GFP_KERNEL_ACCOUNT)?,
        };
        while mem.pages.len() < npages {
            let done = mem.pages.len();
            let chunk = core::cmp::min(npages - done, 1 << 16);
            let start = base + (done as u64) * PAGE_SIZE;
            let room = mem.pages.spare_capacity_mut();
            // SAFETY: `room` holds `chunk` pointers (capacity `npages`), of
            // the layout of `*mut page`; pin_user_pages_fast checks the range
            // is user memory of the current process.
            let got = unsafe {
                bindings::pin_user_pages_fast(
                    start as _,
                    chunk as i32,
                    bindings::FOLL_WRITE | bindings::FOLL_LONGTERM,
                    room.as_mut_ptr().cast(),
                )
            };
            if got > 0 {
                // SAFETY: pin_user_pages_fast wrote `got` page pointers.
                unsafe { mem.pages.inc_len(got as usize) };
            }
            if got != chunk as i32 {
                // Dropping `mem` unpins what we got.
                return Err(if got < 0 {
                    Error::from_errno(got)
                } else {
                    EFAULT
                });
            }
        }
        Ok(mem)
    }

    /// The kernel address of guest-physical `gpa` and how many bytes of its
    /// page follow it (at most `len`), if `gpa` is guest memory.
    fn chunk(&self, gpa: u64, len: usize) -> Option<(*mut u8, usize)> {
        let p = *self.pages.get((gpa / PAGE_SIZE) as usize)?;
        let off = (gpa % PAGE_SIZE) as usize;
        let n = core::cmp::min(len, PAGE_SIZE as usize - off);
        // SAFETY: By the type invariant `p` is a pinned, valid struct page;
        // x86-64 has no highmem, so its direct-map address is valid.
        let va = unsafe { helpers::page_address(p as *mut bindings::page) };
        Some((va.wrapping_add(off), n))
    }

    /// Copies guest memory at `gpa` into `buf` (`EFAULT` if it is not all
    /// guest memory). The guest and the launcher may write it meanwhile:
    /// the copy is of whatever is there, read once.
    pub(crate) fn read(&self, gpa: u64, buf: &mut [u8]) -> Result {
        let mut done = 0;
        while done < buf.len() {
            let at = gpa.checked_add(done as u64).ok_or(EFAULT)?;
            let (va, n) = self.chunk(at, buf.len() - done).ok_or(EFAULT)?;
            // SAFETY: `va` is `n` bytes of a pinned page (`chunk`), `buf`
            // has `n` bytes from `done`. memcpy (not a Rust copy) because
            // other CPUs may write guest memory at any time.
            unsafe { bindings::memcpy(buf[done..].as_mut_ptr().cast(), va.cast(), n) };
            done += n;
        }
        Ok(())
    }

    /// Copies `data` into guest memory at `gpa` (`EFAULT` if it is not all
    /// guest memory).
    pub(crate) fn write(&self, gpa: u64, data: &[u8]) -> Result {
        let mut done = 0;
        while done < data.len() {
            let at = gpa.checked_add(done as u64).ok_or(EFAULT)?;
            let (va, n) = self.chunk(at, data.len() - done).ok_or(EFAULT)?;
            // SAFETY: As in `read`, the other way round; the page was pinned
            // for writing (FOLL_WRITE) and is released dirty.
            unsafe { bindings::memcpy(va.cast(), data[done..].as_ptr().cast(), n) };
            done += n;
        }
        Ok(())
    }

    /// Reads the u64 at guest-physical `gpa`.
    pub(crate) fn read_u64(&self, gpa: u64) -> Result<u64> {
        let mut b = [0u8; 8];
        self.read(gpa, &mut b)?;
        Ok(u64::from_le_bytes(b))
    }

    /// Writes the u64 `v` at guest-physical `gpa`.
    pub(crate) fn write_u64(&self, gpa: u64, v: u64) -> Result {
        self.write(gpa, &v.to_le_bytes())
    }

    /// Size in bytes.
    pub(crate) fn size(&self) -> u64 {
        self.pages.len() as u64 * PAGE_SIZE
    }

    /// Host physical address of guest page frame `gfn`, if it is RAM.
    pub(crate) fn host_phys(&self, gfn: u64) -> Option<u64> {
        let p = *self.pages.get(gfn as usize)?;
        // SAFETY: By the type invariant `p` is a pinned, valid struct page.
        Some(unsafe { helpers::page_to_phys(p as *mut bindings::page) })
    }
}

impl Drop for GuestMemory {
    fn drop(&mut self) {
        if self.pages.is_empty() {
            return;
        }
        // SAFETY: Every entry was pinned by `pin` and is unpinned exactly
        // once, here; `usize` and `*mut page` have the same layout.
        unsafe {
            bindings::unpin_user_pages_dirty_lock(
                self.pages.as_mut_ptr().cast(),
                self.pages.len() as _,
                true,
            )
        };
    }
}
