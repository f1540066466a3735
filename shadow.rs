// SPDX-License-Identifier: GPL-2.0
//! The shadow page tables the guest really runs on, and their policy: one
//! pair of tables per guest root, a few roots kept, and a bound on them all.
//!
//! A [`ShadowTable`] owns every table page it allocated (its `pages` list)
//! and frees them with it. Guest kernel and guest user mode both run in
//! ring 3, so each guest root has a [`ShadowPair`]: the kernel's view and
//! user mode's view (see `paging.rs`). [`Shadows`] is the VM's set: the
//! current pair, up to [`ROOT_CACHE`] pairs of other guest roots (so a
//! guest context switch does not start from an empty table), and the
//! budget of table pages over all of them ([`budget_for`]: it scales with
//! guest memory). `paging.rs`
//! decides what to map; this file only holds and bounds the tables. Used
//! with the VM's lock held.

use kernel::prelude::*;

use crate::{
    gmem::{
        HostPage,
        PTE_ADDR,
        PTE_P,
        PTE_RW,
        PTE_US, //
    },
    helpers,
    switcher::Switcher,
};

/// Software bits of our 4 KiB leaf entries (bits 9-11 are the OS's, the
/// CPU ignores them): the entry was made from a guest 2 MiB page, or from
/// a 1 GiB one. An `INVLPG` of any address in a large page drops the whole
/// page, as the TLB entry it would be on hardware goes whole
/// ([`Shadows::invlpg`]), whichever of its 4 KiB pieces are shadowed.
pub(crate) const SHADOW_FROM_2M: u64 = 1 << 9;
/// See [`SHADOW_FROM_2M`].
pub(crate) const SHADOW_FROM_1G: u64 = 1 << 10;

/// A shadow page-table tree: 4 or 5 levels, as the host uses.
pub(crate) struct ShadowTable {
    levels: u32,
    root: HostPage,
    pages: KVec<HostPage>,
    /// The CPU whose view of the switcher's alias this table's slot
    /// points at, if any (switcher.rs).
    pub(crate) mapped_cpu: Option<u32>,
    /// Some entry came from a guest 2 MiB page ([`SHADOW_FROM_2M`]).
    from_2m: bool,
    /// The 1 GiB regions holding entries from guest 1 GiB pages
    /// ([`SHADOW_FROM_1G`]), and whether there were more than it holds.
    from_1g: [u64; 4],
    from_1g_count: usize,
}

/// A 1 GiB page.
const GIB: u64 = 1 << 30;

/// Reads entry `i` of the page table at physical address `table` (ours, or
/// the host's top-level table of the current address space).
pub(crate) fn read_entry(table: u64, i: usize) -> u64 {
    let va = (helpers::page_offset_base() + table) as *const u64;
    // SAFETY: Every page table is a whole page of the direct map; `i < 512`.
    unsafe { va.add(i & 511).read_volatile() }
}

impl ShadowTable {
    /// An empty tree with `levels` levels (4 or 5).
    pub(crate) fn new(levels: u32) -> Result<Self> {
        Ok(Self {
            levels,
            root: HostPage::new()?,
            pages: KVec::new(),
            mapped_cpu: None,
            from_2m: false,
            from_1g: [0; 4],
            from_1g_count: 0,
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

    /// Table pages made for the guest's own mappings: what counts against
    /// its budget (the root is not).
    pub(crate) fn guest_pages(&self) -> usize {
        self.pages.len()
    }

    /// Top-level entry `i`.
    pub(crate) fn top(&self, i: usize) -> u64 {
        Self::entry(self.root.phys(), i)
    }

    /// Sets top-level entry `i` (to a table this tree does not own: the
    /// switcher's slot).
    pub(crate) fn set_top(&mut self, i: usize, v: u64) {
        Self::set_entry(self.root.phys(), i, v);
    }

    fn index(va: u64, level: u32) -> usize {
        ((va >> (12 + 9 * (level - 1))) & 511) as usize
    }

    /// Reads entry `i` of our table at physical address `table`.
    fn entry(table: u64, i: usize) -> u64 {
        read_entry(table, i)
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
            self.pages
                .push(new, kernel::alloc::flags::GFP_KERNEL_ACCOUNT)?;
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
        self.from_2m |= pte & SHADOW_FROM_2M != 0;
        if pte & SHADOW_FROM_1G != 0 && !self.has_1g(va) {
            if let Some(slot) = self.from_1g.get_mut(self.from_1g_count) {
                *slot = va & !(GIB - 1);
            }
            self.from_1g_count += 1;
        }
        Ok(())
    }

    /// Whether entries from a guest 1 GiB page may be in `va`'s 1 GiB
    /// region.
    fn has_1g(&self, va: u64) -> bool {
        let n = self.from_1g_count;
        n > self.from_1g.len() || self.from_1g[..n].contains(&(va & !(GIB - 1)))
    }

    /// `INVLPG` of `va` in this tree: its entry goes, and with it every
    /// entry of its 2 MiB region that came from a guest 2 MiB page (the one
    /// `va` is, or was, in). Guest 1 GiB pages are the caller's
    /// ([`Self::has_1g`]).
    fn invlpg(&mut self, va: u64) {
        let Ok(t) = self.leaf_table(va, 0, false) else {
            return;
        };
        if self.from_2m {
            for i in 0..512 {
                if Self::entry(t, i) & SHADOW_FROM_2M != 0 {
                    Self::set_entry(t, i, 0);
                }
            }
        }
        Self::set_entry(t, Self::index(va, 1), 0);
    }

    /// Rewrites the entry for `va` whose tables already exist (no allocation:
    /// usable with interrupts off).
    pub(crate) fn set_existing(&mut self, va: u64, pte: u64) -> Result {
        let t = self.leaf_table(va, 0, false)?;
        Self::set_entry(t, Self::index(va, 1), pte);
        Ok(())
    }
}

/// The least shadow budget: table pages (all roots together) beyond which
/// the cached roots are dropped, then the current pair refilled.
pub(crate) const MAX_SHADOW_PAGES: usize = 4096;

/// A VM's shadow budget: [`MAX_SHADOW_PAGES`], plus 4
/// table pages for every 2 MiB of guest memory (RAM and device window),
/// which is what mapping all of it 4 KiB by 4 KiB costs, in leaf tables,
/// in both views of two roots (a guest kernel's direct map, say, touched
/// from two address spaces). A 4 GiB guest gets 12288 pages (48 MiB, 1.2%
/// of its memory); the tables are charged to the launcher's memory cgroup.
pub(crate) fn budget_for(mem_bytes: u64) -> usize {
    let two_mib = mem_bytes.div_ceil(2 << 20) as usize;
    MAX_SHADOW_PAGES + 4 * two_mib
}

/// The shadow tables of one guest root: the guest kernel's view (every
/// mapping of the guest's tables) and guest user mode's view (only pages
/// with the U/S bit set at every level), as Xen PV and PVM split them. Both
/// map the switcher's alias, through their slot (switcher.rs).
pub(crate) struct ShadowPair {
    kernel: ShadowTable,
    user: ShadowTable,
}

impl ShadowPair {
    /// Two empty tables (the switcher's slot is filled at entry).
    fn new() -> Result<Self> {
        let sw = Switcher::get()?;
        let kernel = ShadowTable::new(sw.levels())?;
        let user = ShadowTable::new(sw.levels())?;
        Ok(Self { kernel, user })
    }

    /// Table pages in both.
    fn pages(&self) -> usize {
        self.kernel.table_pages() + self.user.table_pages()
    }

    /// Table pages in both that the guest's mappings made (its budget).
    fn guest_pages(&self) -> usize {
        self.kernel.guest_pages() + self.user.guest_pages()
    }

    /// Forgets guest-virtual page `va` in both.
    fn unmap(&mut self, va: u64) {
        // Not mapped (no table on the way) is fine: nothing to forget.
        let _ = self.kernel.set_existing(va, 0);
        let _ = self.user.set_existing(va, 0);
    }
}

/// Shadow roots kept for guest roots that are not current, so that
/// switching back (a guest context switch) does not start from nothing.
pub(crate) const ROOT_CACHE: usize = 4;

/// Under TLB semantics with PCIDs: the pairs kept for PCIDs that are not
/// current. The Linux guest tags up to 32 address spaces per CPU (its
/// `TLB_NR_DYN_ASIDS`, 6 natively, raised for lguest by
/// guest/linux/patches/0004): a switch to an untagged one costs a shadow
/// rebuilt page by page, an exit each, so 7 runnable processes would
/// thrash with 6 (a Debian boot's 12 parallel systemd generators took 6 s
/// of CPU each instead of 0.5 s). Each kept pair costs its table pages,
/// within the VM's budget ([`budget_for`]).
pub(crate) const PCID_CACHE: usize = 32;

/// A cached shadow pair and the guest root it shadows.
struct CachedRoot {
    root: u64,
    /// The PCID it is tagged with (TLB semantics; 0 otherwise).
    pcid: u16,
    pair: ShadowPair,
    /// When it was last current (for least-recently-used eviction).
    stamp: u64,
}

/// A VM's shadow tables: the current pair and the cached ones.
pub(crate) struct Shadows {
    /// The shadow pair of the current guest root (or of the linear map).
    current: ShadowPair,
    /// Other guest roots' shadow pairs, at most [`ROOT_CACHE`]; under TLB
    /// semantics, other PCIDs' pairs, at most [`PCID_CACHE`].
    roots: KVec<CachedRoot>,
    /// Under TLB semantics, the current pair's PCID (0: untagged, never
    /// kept past a switch).
    pcid: u16,
    /// Switches that found the next root's shadow kept (run page's
    /// `stat_shadow_reuses`).
    reuses: u64,
    /// Counts root switches (the clock of `CachedRoot::stamp`).
    switches: u64,
    /// Table pages all shadows together may hold ([`budget_for`]).
    budget: usize,
    /// The guest's own top-level page table (guest-physical), once it gave
    /// one with `LHCALL_NEW_PGTABLE`; until then the linear map.
    guest_root: Option<u64>,
    /// Whether the guest ever had an upper-half page mapped (from then on
    /// every entry flushes the host's global TLB entries).
    upper: bool,
    /// With TLB semantics (`LGUEST_INIT_TLB_SHADOWS`): the kernel view's
    /// upper half, shared by every root.
    tlb: Option<SharedUpper>,
}

/// The upper half of the kernel view under TLB semantics: one tree whose
/// top-level entries every root's kernel table copies, so that guest
/// global pages survive root switches as global TLB entries do. Every
/// kernel-view upper-half mapping lives here (a root's own table never has
/// tables below these entries, so dropping a root frees none of them); the
/// non-global ones are listed, and dropped at the next switch or flush.
struct SharedUpper {
    table: ShadowTable,
    /// Non-global pages mapped since the last switch or flush.
    nonglobal: KVec<u64>,
    /// More than [`NONGLOBAL_MAX`] of them: the whole tree goes instead.
    overflow: bool,
}

/// Non-global upper-half pages listed before a switch drops the whole
/// shared tree rather than each of them.
const NONGLOBAL_MAX: usize = 4096;

/// The top-level entries of the upper half a 4-level guest may map (from
/// `uapi::GUEST_UPPER_START`): slots 272 to 511 of a 4-level shadow, past
/// the guard hole and the switcher's slot 256 in it, or slot 511 of a
/// 5-level one (whose table below holds all of them; the switcher's slot
/// is 256 of the top level there).
fn upper_slots(levels: u32) -> core::ops::Range<usize> {
    if levels == 5 {
        511..512
    } else {
        ((crate::uapi::GUEST_UPPER_START >> 39) & 511) as usize..512
    }
}

impl SharedUpper {
    fn new() -> Result<Self> {
        Ok(Self {
            table: ShadowTable::new(Switcher::get()?.levels())?,
            nonglobal: KVec::new(),
            overflow: false,
        })
    }

    /// Makes `kernel`'s upper-half top-level entries this tree's.
    fn link(&self, kernel: &mut ShadowTable) {
        for i in upper_slots(self.table.levels) {
            // Never the switcher's: replacing it would run the next entry
            // without the alias (`map_block` would still think it mapped).
            debug_assert!(i != crate::switcher::SWITCHER_SLOT);
            let e = self.table.top(i);
            if e != 0 {
                kernel.set_top(i, e);
            }
        }
    }
}

impl Shadows {
    /// An empty current pair, on the linear map, with a budget of
    /// `budget` table pages.
    pub(crate) fn new(budget: usize) -> Result<Self> {
        Ok(Self {
            current: ShadowPair::new()?,
            roots: KVec::new(),
            pcid: 0,
            reuses: 0,
            switches: 0,
            budget,
            guest_root: None,
            upper: false,
            tlb: None,
        })
    }

    /// Turns on TLB semantics (`LGUEST_INIT_TLB_SHADOWS`), before the guest
    /// has upper-half mappings (at LGUEST_INIT).
    pub(crate) fn set_tlb_mode(&mut self) -> Result {
        self.tlb = Some(SharedUpper::new()?);
        Ok(())
    }

    /// Whether the shadows follow TLB semantics.
    pub(crate) fn tlb_mode(&self) -> bool {
        self.tlb.is_some()
    }

    /// TLB semantics: drops every non-global mapping of the current PCID,
    /// as a CR3 write does (a fresh current pair, linked to the shared
    /// upper half, whose listed non-global pages go too); with `global`,
    /// the shared upper half and every other PCID's pair too (a CR4.PGE
    /// toggle flushes all PCIDs).
    pub(crate) fn tlb_flush(&mut self, global: bool) -> Result {
        let mut fresh = ShadowPair::new()?;
        if self.flush_upper(global)? || global {
            self.roots.clear();
        }
        if let Some(t) = self.tlb.as_ref() {
            t.link(&mut fresh.kernel);
        }
        self.current = fresh;
        Ok(())
    }

    /// TLB semantics: the shared upper half's non-global pages go, or all
    /// of it with `global` or when too many were listed to drop one by
    /// one. True if the tree was replaced: every pair still linked to the
    /// old one (the current and the cached) must then go, before the old
    /// tree's pages are reused.
    fn flush_upper(&mut self, global: bool) -> Result<bool> {
        let Some(t) = self.tlb.as_mut() else {
            return Ok(false);
        };
        if global || t.overflow {
            // Both allocated before anything changes, so that a failure
            // leaves every pair linked to a live tree.
            let fresh = SharedUpper::new()?;
            let pair = ShadowPair::new()?;
            let old = core::mem::replace(t, fresh);
            // The pairs go first: their top-level entries point into `old`.
            self.roots.clear();
            self.current = pair;
            drop(old);
            return Ok(true);
        }
        for &va in t.nonglobal.iter() {
            let _ = t.table.set_existing(va, 0);
        }
        t.nonglobal.clear();
        Ok(false)
    }

    /// TLB semantics: makes guest root `root` current, with PCID `pcid`
    /// (0: untagged) and, from a CR3 write with bit 63 set, `noflush`. As
    /// on hardware, a tagged PCID's translations survive the switch: the
    /// current pair is kept under its PCID (the least recently used of
    /// [`PCID_CACHE`] goes), and `pcid`'s pair comes back if the guest
    /// asked not to flush. The host drops more than hardware would (always
    /// allowed of a TLB): a pair kept for another root than `root`, the
    /// untagged PCID's at every switch, and the upper half's non-global
    /// pages at every switch, as without PCIDs.
    pub(crate) fn switch_root_tlb(&mut self, root: u64, pcid: u16, noflush: bool) -> Result {
        let replaced = self.flush_upper(false)?;
        self.switches += 1;
        let old_root = self.guest_root.replace(root);
        let old_pcid = core::mem::replace(&mut self.pcid, pcid);
        let mut next = if pcid != 0 && pcid == old_pcid {
            // The same PCID: its translations are the current pair's.
            if noflush && old_root == Some(root) && !replaced {
                self.reuses += 1;
                return Ok(());
            }
            ShadowPair::new()?
        } else {
            let kept = match self.roots.iter().position(|c| c.pcid == pcid) {
                Some(i) if pcid != 0 => Some(self.roots.remove(i).map_err(|_| EINVAL)?),
                _ => None,
            };
            match kept {
                Some(c) if noflush && c.root == root => {
                    self.reuses += 1;
                    c.pair
                }
                _ => ShadowPair::new()?,
            }
        };
        if let Some(t) = self.tlb.as_ref() {
            t.link(&mut next.kernel);
        }
        let old = core::mem::replace(&mut self.current, next);
        if let (Some(old_root), false) = (old_root, old_pcid == 0 || old_pcid == pcid || replaced) {
            self.keep(old_root, old_pcid, old, PCID_CACHE);
        }
        Ok(())
    }

    /// Keeps `pair` (guest root `root`, PCID `pcid`) in the cache of at
    /// most `max`, evicting the least recently used; with no memory to keep
    /// it, it is simply dropped.
    fn keep(&mut self, root: u64, pcid: u16, pair: ShadowPair, max: usize) {
        if self.roots.len() >= max {
            let lru = (0..self.roots.len())
                .min_by_key(|&i| self.roots[i].stamp)
                .unwrap_or(0);
            drop(self.roots.remove(lru));
        }
        let cached = CachedRoot {
            root,
            pcid,
            pair,
            stamp: self.switches,
        };
        let _ = self.roots.push(cached, GFP_KERNEL);
    }

    /// Switches that found the next root's shadow kept.
    pub(crate) fn reuses(&self) -> u64 {
        self.reuses
    }

    /// TLB semantics: `LHCALL_INVLPG(va)`: the page's shadow goes from the
    /// current pair and from the shared upper half. If the page is part of
    /// a guest large page, all of that page goes, as its TLB entry would:
    /// the entries of a 2 MiB page (marked [`SHADOW_FROM_2M`]) in its 2
    /// MiB region; for a 1 GiB page, every shadow (a global flush: dropping
    /// more than asked is always allowed, and a guest that wants cheap
    /// `INVLPG`s uses 2 MiB pages; `--cpuid filtered` hides 1 GiB pages).
    pub(crate) fn invlpg(&mut self, va: u64) -> Result {
        let huge = self.current.kernel.has_1g(va)
            || self.current.user.has_1g(va)
            || self.tlb.as_ref().is_some_and(|t| t.table.has_1g(va));
        if huge {
            return self.tlb_flush(true);
        }
        self.current.kernel.invlpg(va);
        self.current.user.invlpg(va);
        if let Some(t) = self.tlb.as_mut() {
            t.table.invlpg(va);
        }
        Ok(())
    }

    /// Whether the guest has had upper-half mappings.
    pub(crate) fn upper(&self) -> bool {
        self.upper
    }

    /// The guest root being shadowed; `None`: the linear map.
    pub(crate) fn guest_root(&self) -> Option<u64> {
        self.guest_root
    }

    /// The table the guest runs on next: user mode's view or the kernel's.
    pub(crate) fn table(&mut self, user_mode: bool) -> &mut ShadowTable {
        if user_mode {
            &mut self.current.user
        } else {
            &mut self.current.kernel
        }
    }

    /// Both tables of the current pair: the kernel view and the user view.
    pub(crate) fn tables(&mut self) -> (&mut ShadowTable, &mut ShadowTable) {
        (&mut self.current.kernel, &mut self.current.user)
    }

    /// Maps the linear map's page `va` (guest-virtual = guest-physical) in
    /// the kernel view of the current pair, outside the budget (the linear
    /// map is built once, at creation).
    pub(crate) fn map_linear(&mut self, va: u64, pte: u64) -> Result {
        let user = PTE_P | PTE_RW | PTE_US;
        self.current.kernel.map(va, pte, user)
    }

    /// Drops every shadow: the cached roots, and the current pair is
    /// replaced by empty tables (plus the switcher). The guest's mappings
    /// are refilled on demand.
    pub(crate) fn reset(&mut self) -> Result {
        if self.tlb.is_some() {
            return self.tlb_flush(true);
        }
        let fresh = ShadowPair::new()?;
        self.roots.clear();
        self.current = fresh;
        Ok(())
    }

    /// Makes guest root `root` current (it is not the current one): the
    /// current pair goes to the cache (evicting the least recently used),
    /// and `root`'s cached pair, if any, comes back.
    pub(crate) fn switch_root(&mut self, root: u64) -> Result {
        if self.tlb.is_some() {
            // Untagged: a CR3 write without PCIDs flushes.
            return self.switch_root_tlb(root, 0, false);
        }
        let next = match self.roots.iter().position(|c| c.root == root) {
            Some(i) => {
                self.reuses += 1;
                self.roots.remove(i).map_err(|_| EINVAL)?.pair
            }
            None => ShadowPair::new()?,
        };
        let old = core::mem::replace(&mut self.current, next);
        self.switches += 1;
        // The linear map is never switched back to: it is not kept.
        if let Some(old_root) = self.guest_root.replace(root) {
            self.keep(old_root, 0, old, ROOT_CACHE);
        }
        Ok(())
    }

    /// Maps guest-virtual page `va` in the current pair, in the user table
    /// (guest user mode's view) or the kernel table. All shadows together
    /// stay below the budget: past it the cached roots go, then the current
    /// pair starts over.
    /// `global`: the guest's entry has the global bit (kept across root
    /// switches under TLB semantics, for the upper half).
    pub(crate) fn map(&mut self, va: u64, pte: u64, user_view: bool, global: bool) -> Result {
        let cached: usize = self.roots.iter().map(|c| c.pair.guest_pages()).sum();
        let shared = self.tlb.as_ref().map_or(0, |t| t.table.guest_pages());
        if cached + shared + self.current.guest_pages() >= self.budget {
            self.roots.clear();
            if shared + self.current.guest_pages() >= self.budget {
                self.reset()?;
            }
        }
        let user = PTE_P | PTE_RW | PTE_US;
        self.upper |= va >> 63 != 0;
        if let (Some(t), false, true) = (self.tlb.as_mut(), user_view, va >> 63 != 0) {
            t.table.map(va, pte, user)?;
            if !global {
                if t.nonglobal.len() >= NONGLOBAL_MAX || t.nonglobal.push(va, GFP_KERNEL).is_err() {
                    t.overflow = true;
                }
            }
            t.link(&mut self.current.kernel);
            return Ok(());
        }
        self.table(user_view).map(va, pte, user)
    }

    /// Forgets guest-virtual page `va` in every shadow, current and cached
    /// (a guest table may be shared between roots).
    pub(crate) fn unmap(&mut self, va: u64) {
        self.current.unmap(va);
        for c in self.roots.iter_mut() {
            c.pair.unmap(va);
        }
        if let Some(t) = self.tlb.as_mut() {
            let _ = t.table.set_existing(va, 0);
        }
    }

    /// Table pages in all shadows (reported in the run page when RUN
    /// returns).
    pub(crate) fn pages(&self) -> usize {
        self.current.pages()
            + self.roots.iter().map(|c| c.pair.pages()).sum::<usize>()
            + self.tlb.as_ref().map_or(0, |t| t.table.table_pages())
    }
}
