// SPDX-License-Identifier: GPL-2.0
//! Memory: host pages for page tables, the guest's pinned RAM, and the
//! shadow page tables the guest really runs on.
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
//! The shadow tables are owned by one [`ShadowTable`]: every table page it
//! allocated is in its `pages` list and freed with it. Nothing here is
//! shared between threads without the VM's lock.

use kernel::{
    alloc::flags::{
        __GFP_ZERO, //
        GFP_KERNEL_ACCOUNT,
    },
    bindings,
    page::Page,
    prelude::*, //
};

use crate::helpers;

/// Page size.
pub(crate) const PAGE_SIZE: u64 = 4096;

/// PTE bits.
pub(crate) const PTE_P: u64 = 1 << 0;
pub(crate) const PTE_RW: u64 = 1 << 1;
pub(crate) const PTE_US: u64 = 1 << 2;
pub(crate) const PTE_A: u64 = 1 << 5;
pub(crate) const PTE_D: u64 = 1 << 6;
pub(crate) const PTE_NX: u64 = 1 << 63;
/// The physical address bits of an entry.
const PTE_ADDR: u64 = 0x000f_ffff_ffff_f000;

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

/// A shadow page-table tree: 4 or 5 levels, as the host uses.
pub(crate) struct ShadowTable {
    levels: u32,
    root: HostPage,
    pages: KVec<HostPage>,
    /// The CPU whose switcher block this table maps, if any (switcher.rs).
    pub(crate) mapped_cpu: Option<u32>,
    /// Table pages the switcher's mappings took (not the guest's doing).
    switcher_pages: usize,
}

impl ShadowTable {
    /// An empty tree with `levels` levels (4 or 5).
    pub(crate) fn new(levels: u32) -> Result<Self> {
        Ok(Self {
            levels,
            root: HostPage::new()?,
            pages: KVec::new(),
            mapped_cpu: None,
            switcher_pages: 0,
        })
    }

    /// Physical address of the root, for CR3.
    pub(crate) fn root_phys(&self) -> u64 {
        self.root.phys()
    }

    /// Number of table pages, the root included.
    pub(crate) fn table_pages(&self) -> usize {
        self.pages.len() + 1
    }

    /// Records that every table page so far belongs to the switcher's
    /// mappings (called right after mapping it).
    pub(crate) fn mark_switcher_pages(&mut self) {
        self.switcher_pages = self.table_pages();
    }

    /// Table pages made for the guest's own mappings: what counts against
    /// its budget.
    pub(crate) fn guest_pages(&self) -> usize {
        self.table_pages() - self.switcher_pages
    }

    fn index(va: u64, level: u32) -> usize {
        ((va >> (12 + 9 * (level - 1))) & 511) as usize
    }

    /// Reads entry `i` of our table at physical address `table`.
    fn entry(table: u64, i: usize) -> u64 {
        let va = (helpers::page_offset_base() + table) as *const u64;
        // SAFETY: `table` is the root or a page in `self.pages` (only our
        // own entries lead to it), mapped in the direct map; `i < 512`.
        unsafe { va.add(i & 511).read_volatile() }
    }

    /// Writes entry `i` of our table at physical address `table`.
    fn set_entry(table: u64, i: usize, v: u64) {
        let va = (helpers::page_offset_base() + table) as *mut u64;
        // SAFETY: As in `entry`; a whole-word volatile store, since the
        // hardware may walk the table at the same time.
        unsafe { va.add(i & 511).write_volatile(v) }
    }

    /// Finds (allocating if `alloc`) the last-level table for `va`; upper
    /// entries get `upper` flags. Returns the table's physical address.
    fn leaf_table(&mut self, va: u64, upper: u64, alloc: bool) -> Result<u64> {
        let mut table = self.root.phys();
        for level in (2..=self.levels).rev() {
            let i = Self::index(va, level);
            let e = Self::entry(table, i);
            if e & PTE_P != 0 {
                table = e & PTE_ADDR;
                continue;
            }
            if !alloc {
                return Err(ENOENT);
            }
            let new = HostPage::new()?;
            let phys = new.phys();
            self.pages.push(new, GFP_KERNEL_ACCOUNT)?;
            Self::set_entry(table, i, phys | upper);
            table = phys;
        }
        Ok(table)
    }

    /// Maps the 4 KiB page at `va` to `pte` (physical address and flags),
    /// allocating tables on the way; upper entries get `upper` flags.
    pub(crate) fn map(&mut self, va: u64, pte: u64, upper: u64) -> Result {
        let t = self.leaf_table(va, upper, true)?;
        Self::set_entry(t, Self::index(va, 1), pte);
        Ok(())
    }

    /// Rewrites the entry for `va` whose tables already exist (no allocation:
    /// usable with interrupts off).
    pub(crate) fn set_existing(&mut self, va: u64, pte: u64) -> Result {
        let t = self.leaf_table(va, 0, false)?;
        Self::set_entry(t, Self::index(va, 1), pte);
        Ok(())
    }
}
