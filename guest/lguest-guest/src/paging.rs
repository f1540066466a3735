// SPDX-License-Identifier: GPL-2.0
//! The guest's own page tables: a kernel map shared by every address space,
//! per-space user mappings, and the hypercalls that keep the host's shadow
//! tables in step.
//!
//! # Layout
//!
//! Four-level x86-64 tables in frames from [`crate::frames`]. Top-level
//! entry 0 (the first 512 GiB) is the **kernel map**: guest RAM from
//! `LGUEST_LOAD_MIN` to its end at virtual = physical (2 MiB pages where a
//! whole one fits, 4 KiB pages around them), present and writable but not
//! user-accessible, so the guest kernel keeps running where it was linked
//! and user mode cannot touch it. Every address space shares the one
//! kernel page-directory-pointer table behind that entry. Entries 1 to 255
//! ([`USER_START`]..[`USER_END`]) are **user** space, private to each
//! [`AddressSpace`]: its intermediate tables are created present, writable
//! and user (`P|RW|US`), so the leaf entry alone says what an access may do
//! (unless [`AddressSpace::set_entry`] says otherwise, as the access test
//! does). The upper half is unused, except for an image linked in the top
//! 2 GiB ([`crate::kernel_base`]): there top-level entry 511 maps RAM's first
//! 2 GiB again at that base, through the kernel map's own page
//! directories, in every address space.
//!
//! # Telling the host
//!
//! The host shadows the guest's tables and caches the shadows of the last
//! few roots, so **every** change to any table, current or not, is
//! reported, as lguest's paravirt MMU contract says:
//!
//! - a 4 KiB leaf: `LHCALL_SET_PTE(root, va, entry)` (drops that page's
//!   shadow in every cached root),
//! - a page-directory entry (a 2 MiB page or a page table):
//!   `LHCALL_SET_PMD`, and a higher entry: `LHCALL_SET_PGD` (both drop every
//!   shadow),
//! - an entry that goes from not present to a new table: nothing needs
//!   dropping (no shadow can derive from a missing entry), so only the leaf
//!   below it is reported.
//!
//! The calls go straight to the host, or, between [`begin_batch`] and
//! [`end_batch`], through the async hypercall ring (64 entries; a full ring
//! is flushed with `LHCALL_FLUSH_ASYNC`), which turns a burst of mappings
//! into one exit. Nothing may be accessed through a changed mapping before
//! the batch ends. No other part of the library uses the ring.
//!
//! # Switching and teardown
//!
//! [`AddressSpace::activate`] is `LHCALL_NEW_PGTABLE(root)`; the host
//! reuses the root's cached shadow. [`AddressSpace::destroy`] frees the
//! user tables (not the pages they map, which belong to the caller),
//! clears the root's user entries and reports it with `LHCALL_SET_PGD`, so
//! that no cached shadow outlives the tables; the active space cannot be
//! destroyed.
//!
//! # Probing
//!
//! [`probe`] reads, writes or executes one guest-virtual address in kernel
//! mode and reports a page fault instead of dying of it; it needs the trap
//! handlers of [`crate::user::init`].

use core::ptr;
use core::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use lguest_abi::{
    HcallArgs, LguestData, LGUEST_LOAD_MIN, LHCALL_FLUSH_ASYNC, LHCALL_FLUSH_TLB, LHCALL_NEW_PGTABLE, LHCALL_RING_SIZE,
    LHCALL_SET_PGD, LHCALL_SET_PMD, LHCALL_SET_PTE, LHCALL_STATUS_DONE,
};

use crate::hcall::hcall;
use crate::{data, frames, start};

/// Bytes of a small page.
pub const PAGE_SIZE: u64 = 4096;
/// Bytes of a large page.
pub const LARGE_PAGE_SIZE: u64 = 2 << 20;
/// The first user address: top-level entry 1 (512 GiB).
pub const USER_START: u64 = 1 << 39;
/// The end of user space: the host's [`GUEST_VA_END`](crate::abi::GUEST_VA_END), one page below
/// the end of the lower half (that last page is never the guest's).
pub const USER_END: u64 = crate::abi::GUEST_VA_END;

/// Entry bits.
pub mod pte {
    /// Present.
    pub const P: u64 = 1;
    /// Writable.
    pub const RW: u64 = 1 << 1;
    /// User-accessible.
    pub const US: u64 = 1 << 2;
    /// Write-through.
    pub const PWT: u64 = 1 << 3;
    /// Cache disable.
    pub const PCD: u64 = 1 << 4;
    /// Accessed (set by the host's emulation).
    pub const A: u64 = 1 << 5;
    /// Dirty (set by the host's emulation).
    pub const D: u64 = 1 << 6;
    /// Page size (a 2 MiB or 1 GiB leaf above level 1).
    pub const PS: u64 = 1 << 7;
    /// Global.
    pub const G: u64 = 1 << 8;
    /// No-execute.
    pub const NX: u64 = 1 << 63;
    /// The frame bits.
    pub const ADDR: u64 = 0x000f_ffff_ffff_f000;
}
use pte::*;

/// The size of a leaf mapping.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PageSize {
    /// 4 KiB, mapped by a page-table entry (level 1).
    Small,
    /// 2 MiB, mapped by a page-directory entry (level 2) with PS.
    Large,
}

impl PageSize {
    /// Bytes.
    pub const fn bytes(self) -> u64 {
        match self {
            PageSize::Small => PAGE_SIZE,
            PageSize::Large => LARGE_PAGE_SIZE,
        }
    }

    /// The level of the leaf entry.
    pub const fn level(self) -> u32 {
        match self {
            PageSize::Small => 1,
            PageSize::Large => 2,
        }
    }
}

/// Why a page-table operation failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Error {
    /// The frame pool is exhausted.
    OutOfFrames,
    /// The address is not in user space ([`USER_START`]..[`USER_END`]).
    NotUser(u64),
    /// The address (or frame) is not aligned to the page size.
    Misaligned(u64),
    /// A leaf is already there.
    AlreadyMapped(u64),
    /// Nothing is mapped there (at that size).
    NotMapped(u64),
    /// A large page is in the way of a table, or the reverse.
    Conflict(u64),
    /// No such level (1..4).
    BadLevel(u32),
    /// The space is the active one (it cannot be destroyed).
    Active,
}

impl core::fmt::Display for Error {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match *self {
            Error::OutOfFrames => write!(f, "out of page frames"),
            Error::NotUser(va) => write!(f, "{va:#x} is not a user address"),
            Error::Misaligned(a) => write!(f, "{a:#x} is misaligned"),
            Error::AlreadyMapped(va) => write!(f, "{va:#x} is already mapped"),
            Error::NotMapped(va) => write!(f, "{va:#x} is not mapped"),
            Error::Conflict(va) => write!(f, "a page of another size is in the way at {va:#x}"),
            Error::BadLevel(l) => write!(f, "no page-table level {l}"),
            Error::Active => write!(f, "the active address space cannot be destroyed"),
        }
    }
}

/// The kernel's page-directory-pointer table (0: not built yet).
static KERNEL_PDPT: AtomicU64 = AtomicU64::new(0);
/// For an image linked in the top 2 GiB: the table behind top-level entry
/// 511, mapping RAM's first 2 GiB again at [`crate::kernel_base`] (the
/// kernel map's own page directories); 0 otherwise.
static KERNEL_PDPT_HIGH: AtomicU64 = AtomicU64::new(0);
/// The root the host runs us on (0: the launcher's linear map).
static ACTIVE_ROOT: AtomicU64 = AtomicU64::new(0);
/// Hypercalls made by this module, by kind, for the statistics.
static NOTIFY_PTE: AtomicU64 = AtomicU64::new(0);
static NOTIFY_FLUSH: AtomicU64 = AtomicU64::new(0);
static SWITCHES: AtomicU64 = AtomicU64::new(0);

/// The entry of `table` (a guest-physical table page) at index `i`.
fn entry_ptr(table: u64, i: u64) -> *mut u64 {
    (table + 8 * (i & 511)) as *mut u64
}

/// Reads entry `i` of `table`.
fn get(table: u64, i: u64) -> u64 {
    // SAFETY: every table is a frame from `frames` (or a kernel table built
    // here), identity mapped, 8-byte aligned; `i & 511` stays inside it.
    // The host writes A/D bits while we are stopped: volatile.
    unsafe { ptr::read_volatile(entry_ptr(table, i)) }
}

/// Writes entry `i` of `table`.
fn set(table: u64, i: u64, v: u64) {
    // SAFETY: as in `get`.
    unsafe { ptr::write_volatile(entry_ptr(table, i), v) }
}

/// The index of `va` in a table of `level` (1: page table .. 4: root).
const fn index(va: u64, level: u32) -> u64 {
    (va >> (12 + 9 * (level - 1))) & 511
}

/// A zeroed table frame.
fn new_table() -> Result<u64, Error> {
    frames::alloc().ok_or(Error::OutOfFrames)
}

/// Builds the kernel map (see the module documentation) from frames of
/// [`crate::frames`], which must be initialised. Called once; later calls
/// do nothing. Nothing switches to it yet: that is [`AddressSpace::activate`].
pub fn init_kernel() -> Result<(), Error> {
    if KERNEL_PDPT.load(Ordering::Acquire) != 0 {
        return Ok(());
    }
    let mem = start::ram_size();
    const GB: u64 = 1 << 30;
    let pdpt = new_table()?;
    for g in 0..mem.div_ceil(GB) {
        let pd = new_table()?;
        set(pdpt, g, pd | P | RW);
        for r in 0..512 {
            let base = g * GB + r * LARGE_PAGE_SIZE;
            if base >= mem {
                break;
            }
            if base >= LGUEST_LOAD_MIN && base + LARGE_PAGE_SIZE <= mem {
                set(pd, r, base | P | RW | PS);
                continue;
            }
            let pt = new_table()?;
            set(pd, r, pt | P | RW);
            for i in 0..512 {
                let pa = base + i * PAGE_SIZE;
                if pa >= LGUEST_LOAD_MIN && pa < mem {
                    set(pt, i, pa | P | RW);
                }
            }
        }
    }
    let base = crate::kernel_base();
    if base != 0 {
        // The image runs at base + its physical address: entries 510 and
        // 511 of the top 512 GiB are the first two GiB of RAM.
        let high = new_table()?;
        set(high, index(base, 3), get(pdpt, 0));
        set(high, index(base, 3) + 1, get(pdpt, 1));
        KERNEL_PDPT_HIGH.store(high, Ordering::Release);
    }
    KERNEL_PDPT.store(pdpt, Ordering::Release);
    Ok(())
}

/// The root the host runs the guest on, or 0 while it is still on the
/// launcher's linear map.
pub fn active_root() -> u64 {
    ACTIVE_ROOT.load(Ordering::Relaxed)
}

/// Hypercalls made so far: (SET_PTE, whole-shadow flushes, NEW_PGTABLE).
pub fn stats() -> (u64, u64, u64) {
    (NOTIFY_PTE.load(Ordering::Relaxed), NOTIFY_FLUSH.load(Ordering::Relaxed), SWITCHES.load(Ordering::Relaxed))
}

// ---------------------------------------------------------------------------
// Notifications, direct or through the async ring.
// ---------------------------------------------------------------------------

/// Whether notifications are queued in the ring ([`begin_batch`]).
static BATCHING: AtomicBool = AtomicBool::new(false);
/// The ring entry the host looks at next (it starts at 0 and advances by
/// one per entry it runs; only this module queues entries).
static RING_NEXT: AtomicUsize = AtomicUsize::new(0);
/// Entries queued and not yet run.
static RING_QUEUED: AtomicUsize = AtomicUsize::new(0);

/// The shared page.
fn ld() -> *mut LguestData {
    data::address() as *mut LguestData
}

/// Queues one hypercall in the async ring, flushing first if it is full.
fn queue(args: HcallArgs) {
    if RING_QUEUED.load(Ordering::Relaxed) == LHCALL_RING_SIZE {
        flush_ring();
    }
    let slot = (RING_NEXT.load(Ordering::Relaxed) + RING_QUEUED.load(Ordering::Relaxed)) % LHCALL_RING_SIZE;
    // SAFETY: `slot` < LHCALL_RING_SIZE; the shared page is a live static
    // the host reads only while we are stopped; volatile accesses. The slot
    // is free: every entry queued before was run by the last flush, and at
    // most LHCALL_RING_SIZE are outstanding.
    unsafe {
        ptr::addr_of_mut!((*ld()).hcalls[slot]).write_volatile(args);
        ptr::addr_of_mut!((*ld()).hcall_status[slot]).write_volatile(0);
    }
    RING_QUEUED.fetch_add(1, Ordering::Relaxed);
}

/// Makes the host run every queued entry (`LHCALL_FLUSH_ASYNC`; it runs the
/// ring before any hypercall).
fn flush_ring() {
    let n = RING_QUEUED.swap(0, Ordering::Relaxed);
    if n == 0 {
        return;
    }
    // SAFETY: FLUSH_ASYNC takes no arguments and touches only the ring.
    unsafe { hcall(LHCALL_FLUSH_ASYNC, 0, 0, 0, 0) };
    let next = RING_NEXT.load(Ordering::Relaxed);
    for i in 0..n {
        let slot = (next + i) % LHCALL_RING_SIZE;
        // SAFETY: as in `queue`.
        let st = unsafe { ptr::addr_of!((*ld()).hcall_status[slot]).read_volatile() };
        if st != LHCALL_STATUS_DONE {
            crate::crash_fmt(format_args!("paging: async ring entry {slot} not run (status {st:#x})"));
        }
    }
    RING_NEXT.store((next + n) % LHCALL_RING_SIZE, Ordering::Relaxed);
}

/// From now on, notifications go through the async ring until
/// [`end_batch`]. Nothing may be accessed through a mapping changed in
/// between before `end_batch`.
pub fn begin_batch() {
    BATCHING.store(true, Ordering::Relaxed);
}

/// Runs the queued notifications and goes back to direct hypercalls.
pub fn end_batch() {
    BATCHING.store(false, Ordering::Relaxed);
    flush_ring();
}

/// Sends hypercall `nr` now or queues it.
fn notify(nr: u64, a1: u64, a2: u64, a3: u64) {
    if nr == LHCALL_SET_PTE || nr == lguest_abi::LHCALL_INVLPG {
        NOTIFY_PTE.fetch_add(1, Ordering::Relaxed);
    } else {
        NOTIFY_FLUSH.fetch_add(1, Ordering::Relaxed);
    }
    if BATCHING.load(Ordering::Relaxed) {
        queue(HcallArgs { arg0: nr, arg1: a1, arg2: a2, arg3: a3, arg4: 0 });
    } else {
        // SAFETY: the page-table hypercalls take a root, an address and an
        // entry by value; the host reads our tables (guest RAM) later.
        unsafe { hcall(nr, a1, a2, a3, 0) };
    }
}

/// Whether table changes are reported ([`set_reporting`]).
static REPORTING: AtomicBool = AtomicBool::new(true);

/// Turns the reports of table changes off (or on again). Only for a guest
/// with TLB-semantics shadows ([`crate::data::tlb_shadows`]), which then
/// invalidates as a kernel does on hardware: [`invlpg`] after changing a
/// page of the current address space, [`flush_all`], or a switch
/// ([`AddressSpace::activate`], which drops every non-global shadow). The
/// host keeps using a changed entry's old value until then. Without TLB
/// semantics the host would use old values for ever: refused (`false`).
pub fn set_reporting(on: bool) -> bool {
    if !on && !crate::data::tlb_shadows() {
        return false;
    }
    REPORTING.store(on, Ordering::Relaxed);
    true
}

/// Reports that the entry of `level` for `va` in `root`'s tables became
/// `value` (unless reports are off).
fn report(root: u64, va: u64, level: u32, value: u64) {
    if !REPORTING.load(Ordering::Relaxed) {
        return;
    }
    match level {
        1 => notify(LHCALL_SET_PTE, root, va, value),
        2 => notify(LHCALL_SET_PMD, root, va, value),
        _ => notify(LHCALL_SET_PGD, root, va, value),
    }
}

/// Drops every shadow the host has of our tables (`LHCALL_FLUSH_TLB`; with
/// TLB-semantics shadows, global pages included).
pub fn flush_all() {
    notify(LHCALL_FLUSH_TLB, 1, 0, 0);
}

/// Drops the host's shadow of the page at `va` (`LHCALL_INVLPG`), as
/// `invlpg` drops a TLB entry: what a change needs with TLB-semantics
/// shadows ([`crate::data::tlb_shadows`]); otherwise the same as a
/// `SET_PTE` report of the page.
pub fn invlpg(va: u64) {
    notify(lguest_abi::LHCALL_INVLPG, va, 0, 0);
}

// ---------------------------------------------------------------------------
// Address spaces.
// ---------------------------------------------------------------------------

/// What a software walk found for one address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Translation {
    /// The guest-physical address.
    pub pa: u64,
    /// The leaf entry.
    pub entry: u64,
    /// The leaf's size.
    pub size: PageSize,
    /// RW at every level.
    pub writable: bool,
    /// US at every level.
    pub user: bool,
    /// NX at some level.
    pub nx: bool,
}

/// An address space: a root table whose entry 0 is the shared kernel map
/// and whose user entries are its own.
#[derive(Debug)]
pub struct AddressSpace {
    root: u64,
}

impl AddressSpace {
    /// A new space with the kernel map and no user mappings. [`init_kernel`]
    /// must have run.
    pub fn new() -> Result<Self, Error> {
        let kernel = KERNEL_PDPT.load(Ordering::Acquire);
        let root = new_table()?;
        if kernel != 0 {
            set(root, 0, kernel | P | RW);
        }
        let high = KERNEL_PDPT_HIGH.load(Ordering::Acquire);
        if high != 0 {
            set(root, 511, high | P | RW);
        }
        Ok(Self { root })
    }

    /// The guest-physical address of the root table (CR3).
    pub fn root(&self) -> u64 {
        self.root
    }

    /// Whether the host runs the guest on this space.
    pub fn is_active(&self) -> bool {
        active_root() == self.root
    }

    /// Switches to this space (`LHCALL_NEW_PGTABLE`). Switching to the
    /// active space again flushes every shadow, as reloading CR3 would.
    pub fn activate(&self) {
        if BATCHING.load(Ordering::Relaxed) {
            flush_ring();
        }
        SWITCHES.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the root is a table page in guest RAM whose entry 0 maps
        // the kernel (code, stack, statics) where it runs now, so the guest
        // carries on after the switch.
        unsafe { hcall(LHCALL_NEW_PGTABLE, self.root, 0, 0, 0) };
        ACTIVE_ROOT.store(self.root, Ordering::Relaxed);
    }

    /// The table of `level` (1..3) that holds `va`'s entry, creating the
    /// missing ones above it if `create` (`P|RW|US`). `Ok(None)`: missing.
    fn table(&mut self, va: u64, level: u32, create: bool) -> Result<Option<u64>, Error> {
        let mut table = self.root;
        for l in (level + 1..=4).rev() {
            let i = index(va, l);
            let e = get(table, i);
            if e & P == 0 {
                if !create {
                    return Ok(None);
                }
                let t = new_table()?;
                set(table, i, t | P | RW | US);
                table = t;
                continue;
            }
            if e & PS != 0 {
                return Err(Error::Conflict(va));
            }
            table = e & ADDR;
        }
        Ok(Some(table))
    }

    /// Checks that `va` is a user address aligned for `size`.
    fn check(va: u64, size: PageSize) -> Result<(), Error> {
        if !(USER_START..USER_END).contains(&va) {
            return Err(Error::NotUser(va));
        }
        if !va.is_multiple_of(size.bytes()) {
            return Err(Error::Misaligned(va));
        }
        Ok(())
    }

    /// Maps user page `va` to frame `pa` with leaf bits `flags` (P is
    /// added; so is PS for a large page) and tells the host.
    pub fn map(&mut self, va: u64, pa: u64, size: PageSize, flags: u64) -> Result<(), Error> {
        Self::check(va, size)?;
        if !pa.is_multiple_of(size.bytes()) {
            return Err(Error::Misaligned(pa));
        }
        let level = size.level();
        let table = self.table(va, level, true)?.ok_or(Error::NotMapped(va))?;
        let i = index(va, level);
        let old = get(table, i);
        if old & P != 0 {
            return Err(if level == 2 && old & PS == 0 { Error::Conflict(va) } else { Error::AlreadyMapped(va) });
        }
        let e = (pa & ADDR) | flags | P | if level == 2 { PS } else { 0 };
        set(table, i, e);
        report(self.root, va, level, e);
        Ok(())
    }

    /// The leaf entry for `va` of `size`, with its table: `Err` if there is
    /// none.
    fn leaf(&mut self, va: u64, size: PageSize) -> Result<(u64, u64), Error> {
        Self::check(va, size)?;
        let level = size.level();
        let table = self.table(va, level, false)?.ok_or(Error::NotMapped(va))?;
        let e = get(table, index(va, level));
        let leaf = e & P != 0 && (level == 1 || e & PS != 0);
        if !leaf {
            return Err(Error::NotMapped(va));
        }
        Ok((table, e))
    }

    /// Unmaps user page `va` of `size`; returns the old entry (with the A
    /// and D bits the host set). The frame is the caller's again.
    pub fn unmap(&mut self, va: u64, size: PageSize) -> Result<u64, Error> {
        let (table, old) = self.leaf(va, size)?;
        let level = size.level();
        set(table, index(va, level), 0);
        report(self.root, va, level, 0);
        Ok(old)
    }

    /// Replaces the leaf bits of user page `va` of `size` with `flags` (P
    /// added, A and D cleared: the host sets them again on the next
    /// access); returns the old entry.
    pub fn protect(&mut self, va: u64, size: PageSize, flags: u64) -> Result<u64, Error> {
        let (table, old) = self.leaf(va, size)?;
        let level = size.level();
        let e = (old & ADDR) | flags | P | if level == 2 { PS } else { 0 };
        set(table, index(va, level), e);
        report(self.root, va, level, e);
        Ok(old)
    }

    /// The raw entry of `level` (1..4) for `va`, if the tables above exist.
    pub fn entry(&self, va: u64, level: u32) -> Option<u64> {
        self.table_of(va, level).map(|t| get(t, index(va, level)))
    }

    /// Writes the raw entry of `level` (1..4) for user address `va`,
    /// creating the tables above it, and tells the host; returns the old
    /// value. For tests that want odd bits on intermediate entries: the
    /// caller keeps the tables consistent (an entry that should point at a
    /// table must keep pointing at it).
    pub fn set_entry(&mut self, va: u64, level: u32, value: u64) -> Result<u64, Error> {
        if !(1..=4).contains(&level) {
            return Err(Error::BadLevel(level));
        }
        if !(USER_START..USER_END).contains(&va) {
            return Err(Error::NotUser(va));
        }
        let table = if level == 4 { self.root } else { self.table(va, level, true)?.ok_or(Error::NotMapped(va))? };
        let i = index(va, level);
        let old = get(table, i);
        set(table, i, value);
        report(self.root, va, level, value);
        Ok(old)
    }

    /// The table page that holds the entry of `level` (1..4) for `va`, if
    /// the tables above it exist (they are not created).
    pub fn table_of(&self, va: u64, level: u32) -> Option<u64> {
        if !(1..=4).contains(&level) {
            return None;
        }
        let mut table = self.root;
        for l in (level + 1..=4).rev() {
            let e = get(table, index(va, l));
            if e & P == 0 || e & PS != 0 {
                return None;
            }
            table = e & ADDR;
        }
        Some(table)
    }

    /// Writes `value` into the entry of `level` for `va` in `table` (which
    /// [`AddressSpace::table_of`] gave, and which may be unreachable right
    /// now because an entry above it is not present) and tells the host;
    /// returns the old value. Tables above are neither created nor checked.
    pub fn set_table_entry(&mut self, table: u64, va: u64, level: u32, value: u64) -> u64 {
        let i = index(va, level);
        let old = get(table, i);
        set(table, i, value);
        report(self.root, va, level, value);
        old
    }

    /// Reads the entry of `level` for `va` in `table` (see
    /// [`AddressSpace::set_table_entry`]).
    pub fn table_entry(&self, table: u64, va: u64, level: u32) -> u64 {
        get(table, index(va, level))
    }

    /// Walks the tables for `va` as the hardware would.
    pub fn translate(&self, va: u64) -> Option<Translation> {
        translate(self.root, va)
    }

    /// Frees the user tables of this space (not the frames they map),
    /// clears its user entries and tells the host (`LHCALL_SET_PGD`), then
    /// frees the root. The active space cannot be destroyed.
    pub fn destroy(self) -> Result<(), Self> {
        if self.is_active() {
            return Err(self);
        }
        fn free_table(table: u64, level: u32) {
            if level > 1 {
                for i in 0..512 {
                    let e = get(table, i);
                    if e & P != 0 && e & PS == 0 {
                        free_table(e & ADDR, level - 1);
                    }
                }
            }
            frames::free(table);
        }
        for i in 1..256 {
            let e = get(self.root, i);
            if e & P != 0 && e & PS == 0 {
                set(self.root, i, 0);
                free_table(e & ADDR, 3);
            }
        }
        report(self.root, USER_START, 4, 0);
        frames::free(self.root);
        Ok(())
    }
}

/// Walks the tables at `root` (0: none) for lower-half `va` as the
/// hardware would.
pub fn translate(root: u64, va: u64) -> Option<Translation> {
    if va >= USER_END || root == 0 {
        return None;
    }
    let (mut table, mut writable, mut user, mut nx) = (root, true, true, false);
    for level in (1..=4).rev() {
        let e = get(table, index(va, level));
        if e & P == 0 {
            return None;
        }
        writable &= e & RW != 0;
        user &= e & US != 0;
        nx |= e & NX != 0;
        let size = match level {
            1 => Some(PageSize::Small),
            2 if e & PS != 0 => Some(PageSize::Large),
            3 if e & PS != 0 => return None,
            _ => None,
        };
        if let Some(size) = size {
            let pa = (e & ADDR & !(size.bytes() - 1)) + (va & (size.bytes() - 1));
            return Some(Translation { pa, entry: e, size, writable, user, nx });
        }
        table = e & ADDR;
    }
    None
}

// ---------------------------------------------------------------------------
// Kernel-mode probes.
// ---------------------------------------------------------------------------

/// A kind of access.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// A load of 8 bytes.
    Read,
    /// A store of 8 bytes.
    Write,
    /// An instruction fetch: a jump to the address, where [`EXEC_RETURN`]
    /// must be (it jumps back through RAX).
    Exec,
}

/// The code an [`Access::Exec`] probe target holds: `jmp *%rax`.
pub const EXEC_RETURN: [u8; 2] = [0xff, 0xe0];

/// A fault a probe caught.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fault {
    /// The vector (14 for a page fault).
    pub vector: u64,
    /// The error code.
    pub error: u64,
    /// `lguest_data.cr2` at the fault.
    pub cr2: u64,
}

/// Whether a probe runs: the trap handlers send a kernel-mode fault to
/// [`lguest_probe_fault`] instead of crashing.
static PROBE_ARMED: AtomicBool = AtomicBool::new(false);
/// What the last caught fault was: vector + 1 (0: none), error, cr2.
static PROBE_VECTOR: AtomicU64 = AtomicU64::new(0);
static PROBE_ERROR: AtomicU64 = AtomicU64::new(0);
static PROBE_CR2: AtomicU64 = AtomicU64::new(0);

// `lguest_probe(kind, va, value)`: kind 0 reads (returns the value), 1
// writes `value`, 2 jumps to `va` with the way back in RAX. A fault while
// armed resumes at `lguest_probe_fault` with the stack as it was at the
// faulting instruction, which in all three cases has our return address on
// top (nothing is pushed in between), so `ret` goes back to the caller.
core::arch::global_asm!(
    ".pushsection .text.lguest_probe, \"ax\", @progbits",
    ".globl lguest_probe",
    ".type lguest_probe, @function",
    "lguest_probe:",
    "    cmp rdi, 1",
    "    je 2f",
    "    cmp rdi, 2",
    "    je 3f",
    "    mov rax, qword ptr [rsi]",
    "    ret",
    "2:  mov qword ptr [rsi], rdx",
    "    xor eax, eax",
    "    ret",
    "3:  lea rax, [rip + 4f]",
    "    jmp rsi",
    "4:  xor eax, eax",
    "    ret",
    ".globl lguest_probe_fault",
    "lguest_probe_fault:",
    "    xor eax, eax",
    "    ret",
    ".size lguest_probe, . - lguest_probe",
    ".popsection",
);

extern "C" {
    fn lguest_probe(kind: u64, va: u64, value: u64) -> u64;
    static lguest_probe_fault: u8;
}

/// Called by the trap handlers of [`crate::user`] for a kernel-mode
/// exception: if a probe is running, records the fault, points the frame
/// at the probe's way out and returns true.
pub(crate) fn probe_fixup(frame: &mut crate::TrapFrame, cr2: u64) -> bool {
    if !PROBE_ARMED.swap(false, Ordering::AcqRel) {
        return false;
    }
    PROBE_ERROR.store(frame.error, Ordering::Relaxed);
    PROBE_CR2.store(cr2, Ordering::Relaxed);
    PROBE_VECTOR.store(frame.vector + 1, Ordering::Release);
    frame.rip = ptr::addr_of!(lguest_probe_fault) as u64;
    true
}

/// Performs `access` of `va` in kernel mode (a write stores `value`) and
/// returns what a read saw (0 otherwise), or the fault it took. Needs
/// [`crate::user::init`] (its handlers catch the fault).
pub fn probe(access: Access, va: u64, value: u64) -> Result<u64, Fault> {
    let kind = match access {
        Access::Read => 0,
        Access::Write => 1,
        Access::Exec => 2,
    };
    PROBE_VECTOR.store(0, Ordering::Relaxed);
    PROBE_ARMED.store(true, Ordering::Release);
    // SAFETY: the probe touches only `va`, which may fault (the handlers
    // then resume at its way out, with the stack as the probe left it);
    // an executed target must hold EXEC_RETURN, which jumps straight back.
    // Writing through an arbitrary mapping is the caller's business: a
    // test maps `va` to a frame it owns.
    let got = unsafe { lguest_probe(kind, va, value) };
    PROBE_ARMED.store(false, Ordering::Release);
    match PROBE_VECTOR.load(Ordering::Acquire) {
        0 => Ok(got),
        v => Err(Fault {
            vector: v - 1,
            error: PROBE_ERROR.load(Ordering::Relaxed),
            cr2: PROBE_CR2.load(Ordering::Relaxed),
        }),
    }
}
