// SPDX-License-Identifier: GPL-2.0
//! The guest's own page tables, and random updates to them.
//!
//! [`Paging::build`] writes a 4-level table in free RAM above the image:
//! RAM from 1 MiB to its end mapped at virtual = physical (2 MiB pages where
//! a whole one fits, 4 KiB pages in the first and last 2 MiB), nothing
//! below 1 MiB or above RAM, so the fuzzer's traps fault where they did on
//! the host's linear map; and a scratch window at [`SCRATCH`] (top-level
//! entry 1): [`SLOTS`] 4 KiB pages through one page table, and
//! [`LARGE`] - 1 2 MiB pages above them. Both scratch kinds point into a
//! 2 MiB pool of RAM nothing else uses (filled with a pattern, so that two
//! frames never read alike), or, read-only, at a page of this guest's code.
//! Two top-level pages with the same entries make two roots to switch
//! between.
//!
//! Once switched to (`LHCALL_NEW_PGTABLE`), the fuzzer changes scratch
//! entries at random (present or not, writable or not, random A/D, PCD,
//! global, NX and ignored bits), tells the host (`SET_PTE` for the page,
//! directly or in the async ring, or a full flush: `FLUSH_TLB`, `SET_PMD`,
//! `SET_PGD`, `NEW_PGTABLE` of the current root), and accesses the page: a read
//! must see the frame's content (read through the identity map), a write
//! must land in the frame, a missing page or a write to a read-only one
//! must fault with the right error code and address, and the host must
//! have set the accessed (and for a write the dirty) bit in the entry.

use core::ptr;

use lguest_guest::abi::{
    LHCALL_FLUSH_ASYNC, LHCALL_FLUSH_TLB, LHCALL_NEW_PGTABLE, LHCALL_SET_PGD, LHCALL_SET_PMD, LHCALL_SET_PTE,
};

use crate::rng::Rng;
use crate::{announce, fail, hc, ring::Ring, traps, LOAD_MIN, PAGE};

/// Where the scratch window starts: top-level entry 1.
pub const SCRATCH: u64 = 1 << 39;
/// 4 KiB scratch pages in use (of the 512 of the page table).
pub const SLOTS: u64 = 64;
/// Scratch 2 MiB pages: page-directory entries 1 to LARGE - 1.
pub const LARGE: u64 = 8;
/// One top-level entry's worth of address space.
const TOP: u64 = 1 << 39;
const MB2: u64 = 2 << 20;
const GB1: u64 = 1 << 30;

/// Entry bits.
const P: u64 = 1;
const RW: u64 = 1 << 1;
const US: u64 = 1 << 2;
const PWT: u64 = 1 << 3;
const PCD: u64 = 1 << 4;
const A: u64 = 1 << 5;
const D: u64 = 1 << 6;
const PS: u64 = 1 << 7;
const G: u64 = 1 << 8;
const AVAIL: u64 = 0x7 << 9;
const HIGH: u64 = 0x7ff << 52;
const NX: u64 = 1 << 63;
/// The frame bits of an entry.
const FRAME: u64 = 0x000f_ffff_ffff_f000;
/// Bits that may be anything in a present entry without changing what the
/// host must do (it ignores them, or emulates them: A, D).
const NOISE: u64 = US | PWT | PCD | A | D | G | AVAIL | HIGH | NX;

/// #PF error code bits.
const PF_P: u64 = 1;
const PF_W: u64 = 2;

/// Whether `addr` is in the part of the address space the scratch window
/// (or the fatal operations' experiments) may map.
pub fn in_scratch(addr: u64) -> bool {
    (SCRATCH..3 * TOP).contains(&addr)
}

fn entry(table: u64, i: u64) -> *mut u64 {
    (table + 8 * i) as *mut u64
}

/// Reads entry `i` of the table at guest-physical (= virtual) `table`.
fn get(table: u64, i: u64) -> u64 {
    // SAFETY: every table is a page this module allocated in free RAM,
    // which the identity map covers; `i` < 512. The host may write A/D bits
    // in it while the guest is stopped: volatile.
    unsafe { ptr::read_volatile(entry(table, i)) }
}

fn set(table: u64, i: u64, v: u64) {
    // SAFETY: as in `get`.
    unsafe { ptr::write_volatile(entry(table, i), v) }
}

/// Reads the u64 at `pa` through the identity map.
fn phys_read(pa: u64) -> u64 {
    // SAFETY: `pa` is in the pool or the code page, both in RAM under the
    // identity map, 8-byte aligned; nothing else writes the pool.
    unsafe { ptr::read_volatile(pa as *const u64) }
}

/// The guest's page tables and the scratch window.
pub struct Paging {
    /// Two top-level pages with the same entries.
    roots: [u64; 2],
    /// The root the host walks, once switched.
    pub active: Option<usize>,
    pdpt_s: u64,
    pd_s: u64,
    pt_s: u64,
    /// The 2 MiB pool the scratch pages point into.
    pool: u64,
    /// A page of code, for read-only mappings.
    code: u64,
    /// What was done, for the summary.
    pub updates: u64,
    pub accesses: u64,
    pub faults: u64,
}

impl Paging {
    /// Builds the tables in free RAM (`mem` bytes of it in all), or `None`
    /// if there is not enough.
    pub fn build(mem: u64) -> Option<Self> {
        let mut next = lguest_guest::start::image().end;
        // Tables: 2 roots, the PDPT, up to 4 PDs, 2 PTs, 3 scratch tables.
        let pool = (next + 16 * PAGE).next_multiple_of(MB2);
        if pool + MB2 > mem - PAGE || mem > 4 * GB1 {
            return None;
        }
        let mut alloc = || {
            let page = next;
            next += PAGE;
            // SAFETY: `page` is a free page of RAM above the image (checked
            // against the pool below, which is below the last page), under
            // the linear map.
            unsafe { ptr::write_bytes(page as *mut u8, 0, PAGE as usize) };
            page
        };
        let roots = [alloc(), alloc()];
        let pdpt = alloc();
        for g in 0..mem.div_ceil(GB1) {
            let pd = alloc();
            set(pdpt, g, pd | P | RW);
            for r in 0..512 {
                let base = g * GB1 + r * MB2;
                if base >= mem {
                    break;
                }
                if base != 0 && base + MB2 <= mem {
                    set(pd, r, base | P | RW | PS);
                    continue;
                }
                let pt = alloc();
                set(pd, r, pt | P | RW);
                for p in 0..512 {
                    let pa = base + p * PAGE;
                    if pa >= LOAD_MIN && pa < mem {
                        set(pt, p, pa | P | RW);
                    }
                }
            }
        }
        let (pdpt_s, pd_s, pt_s) = (alloc(), alloc(), alloc());
        set(pdpt_s, 0, pd_s | P | RW);
        set(pd_s, 0, pt_s | P | RW);
        for root in roots {
            set(root, 0, pdpt | P | RW);
            set(root, 1, pdpt_s | P | RW);
        }
        if next > pool {
            return None;
        }
        for off in (0..MB2).step_by(8) {
            // SAFETY: the pool is free RAM (checked above), under the linear
            // map; nothing else uses it.
            unsafe { ptr::write_volatile((pool + off) as *mut u64, (pool + off) ^ 0x5a5a_0000_0000_5a5a) };
        }
        let code = (Self::build as fn(u64) -> Option<Self> as usize as u64) & !(PAGE - 1);
        Some(Self { roots, active: None, pdpt_s, pd_s, pt_s, pool, code, updates: 0, accesses: 0, faults: 0 })
    }

    /// Switches the host to root `which` (`LHCALL_NEW_PGTABLE`).
    pub fn switch(&mut self, rng: &mut Rng, which: usize) {
        let a = [self.roots[which], rng.arg(), rng.arg(), rng.arg()];
        hc::hcall(rng, LHCALL_NEW_PGTABLE, a);
        self.active = Some(which);
    }

    /// The active root (switching to the first if there is none yet).
    fn root(&mut self, rng: &mut Rng) -> u64 {
        match self.active {
            Some(i) => self.roots[i],
            None => {
                self.switch(rng, 0);
                self.roots[0]
            }
        }
    }

    /// A random frame of the pool.
    fn pool_frame(&self, rng: &mut Rng) -> u64 {
        self.pool + rng.below(MB2 / PAGE) * PAGE
    }

    /// A random scratch entry: not present, read-only (pool or code) or
    /// writable (pool), with random noise bits.
    fn random_pte(&self, rng: &mut Rng) -> u64 {
        let noise = rng.next() & NOISE;
        match rng.below(8) {
            0 => rng.next() & !P,
            1 | 2 => {
                let frame = if rng.chance(300) { self.code } else { self.pool_frame(rng) };
                frame | P | (noise & !RW)
            }
            _ => self.pool_frame(rng) | P | RW | noise,
        }
    }

    /// Tells the host that the entry of scratch page `va` changed: one of
    /// the ways that must drop its shadow.
    fn notify_page(&mut self, rng: &mut Rng, ring: &mut Ring, va: u64, pte: u64) {
        let root = self.root(rng);
        match rng.below(6) {
            0 | 1 => {
                let extra = rng.arg();
                hc::hcall(rng, LHCALL_SET_PTE, [root, va, pte, extra]);
            }
            2 => {
                ring.queue([LHCALL_SET_PTE, root, va, pte, rng.arg()]);
                let a = [rng.arg(), rng.arg(), rng.arg(), rng.arg()];
                hc::hcall(rng, LHCALL_FLUSH_ASYNC, a);
                ring.check_ran();
            }
            _ => self.flush(rng, ring),
        }
    }

    /// Drops the whole shadow: `FLUSH_TLB`, `SET_PMD`, `SET_PGD` (directly
    /// or in the ring) or `NEW_PGTABLE` of the current root (then perhaps
    /// a switch to the other one: the host keeps both roots' shadows).
    fn flush(&mut self, rng: &mut Rng, ring: &mut Ring) {
        let nr = rng.pick(&[LHCALL_FLUSH_TLB, LHCALL_SET_PMD, LHCALL_SET_PGD]);
        let a = [rng.arg(), rng.arg(), rng.arg(), rng.arg()];
        match rng.below(5) {
            0 => {
                // NEW_PGTABLE of the current root drops every shadow; a
                // switch to the other root then finds its cached shadow
                // (if any) just as fresh.
                let which = self.active.unwrap_or(0);
                if rng.chance(500) {
                    self.switch(rng, which);
                } else {
                    ring.queue([LHCALL_NEW_PGTABLE, self.roots[which], a[1], a[2], a[3]]);
                    hc::hcall(rng, LHCALL_FLUSH_ASYNC, a);
                    ring.check_ran();
                    self.active = Some(which);
                }
                if rng.chance(500) {
                    self.switch(rng, 1 - which);
                }
            }
            1 => {
                ring.queue([nr, a[0], a[1], a[2], a[3]]);
                hc::hcall(rng, LHCALL_FLUSH_ASYNC, a);
                ring.check_ran();
            }
            _ => hc::hcall(rng, nr, a),
        }
    }

    /// One random page-table operation (switching to our tables first if
    /// the host still runs us on its linear map).
    pub fn op(&mut self, rng: &mut Rng, ring: &mut Ring) {
        if self.active.is_none() {
            self.switch(rng, 0);
        }
        match rng.below(10) {
            0..=4 => {
                let i = rng.below(SLOTS);
                let va = SCRATCH + i * PAGE;
                let pte = self.random_pte(rng);
                set(self.pt_s, i, pte);
                self.notify_page(rng, ring, va, pte);
                self.updates += 1;
                if rng.chance(800) {
                    self.access_small(rng, i);
                }
            }
            5 | 6 => {
                let i = rng.below(SLOTS);
                self.access_small(rng, i);
            }
            7 => {
                let k = rng.range(1, LARGE - 1);
                let noise = rng.next() & NOISE;
                let e = match rng.below(4) {
                    0 => rng.next() & !P,
                    1 => self.pool | P | PS | (noise & !RW),
                    _ => self.pool | P | PS | RW | noise,
                };
                set(self.pd_s, k, e);
                self.flush(rng, ring);
                self.updates += 1;
                self.access_large(rng, k);
            }
            8 => {
                let k = rng.range(1, LARGE - 1);
                self.access_large(rng, k);
            }
            _ => self.flush(rng, ring),
        }
    }

    /// Accesses scratch page `i` and checks the outcome against its entry.
    fn access_small(&mut self, rng: &mut Rng, i: u64) {
        let off = rng.below(PAGE) & !7;
        let va = SCRATCH + i * PAGE + off;
        self.access(rng, va, self.pt_s, i, off);
    }

    /// Accesses scratch 2 MiB page `k` and checks it.
    fn access_large(&mut self, rng: &mut Rng, k: u64) {
        let off = rng.below(MB2) & !7;
        let va = SCRATCH + k * MB2 + off;
        self.access(rng, va, self.pd_s, k, off);
    }

    /// Reads or writes `va`, mapped by entry `i` of `table` (a leaf) at
    /// `off` into its page, and checks what happened against the entry.
    fn access(&mut self, rng: &mut Rng, va: u64, table: u64, i: u64, off: u64) {
        let e = get(table, i);
        let frame = e & FRAME & if table == self.pd_s { !(MB2 - 1) } else { !0 };
        let writable = e & RW != 0 && (table == self.pd_s || frame != self.code);
        let write = rng.chance(400) && (writable || e & P == 0 || rng.chance(500));
        let value = rng.next();
        let result = if write { traps::try_write(va, value).map(|()| value) } else { traps::try_read(va) };
        self.accesses += 1;
        let what = if write { "write" } else { "read" };
        let want_fault = if e & P == 0 {
            Some(if write { PF_W } else { 0 })
        } else if write && e & RW == 0 {
            Some(PF_P | PF_W)
        } else {
            None
        };
        match (result, want_fault) {
            (Err((14, error, cr2)), Some(want)) if cr2 == va && error & 0x1f == want => self.faults += 1,
            (Err((vector, error, cr2)), _) => fail(format_args!(
                "paging: {what} of {va:#x} (entry {e:#x}) trapped: vector {vector} error {error:#x} cr2 {cr2:#x}, \
                 expected {want_fault:#x?}"
            )),
            (Ok(_), Some(want)) => {
                fail(format_args!("paging: {what} of {va:#x} (entry {e:#x}) did not fault (expected error {want:#x})"))
            }
            (Ok(got), None) => {
                let pa = frame + off;
                let phys = phys_read(pa);
                if got != phys {
                    fail(format_args!(
                        "paging: {what} of {va:#x} (entry {e:#x}): {got:#x} through the scratch page, {phys:#x} at \
                         {pa:#x}"
                    ));
                }
                let after = get(table, i);
                let want = A | if write { D } else { 0 };
                if after & want != want {
                    fail(format_args!("paging: after a {what} of {va:#x} the entry is {after:#x} (was {e:#x})"));
                }
            }
        }
    }

    /// One page-table operation the host must kill the guest for.
    pub fn fatal(&mut self, rng: &mut Rng, mem: u64) -> ! {
        let root = self.root(rng);
        // A frame outside RAM, below the 52-bit limit of an entry.
        let outside = |rng: &mut Rng, align: u64| {
            let pa = match rng.below(3) {
                0 => mem,
                1 => mem + rng.below(1 << 30),
                _ => rng.range(mem, FRAME),
            };
            pa.next_multiple_of(align) & FRAME
        };
        match rng.below(4) {
            0 => {
                let i = rng.below(SLOTS);
                let va = SCRATCH + i * PAGE;
                let e = outside(rng, PAGE) | P | (rng.next() & (NOISE | RW));
                set(self.pt_s, i, e);
                hc::hcall(rng, LHCALL_SET_PTE, [root, va, e, 0]);
                announce(
                    format_args!("read of {va:#x} through entry {e:#x}"),
                    format_args!("guest page entry {e:#x} for {va:#x} points outside guest memory"),
                );
                traps::try_read(va).ok();
                fail(format_args!("survived: read of {va:#x} through entry {e:#x}"))
            }
            1 => {
                let k = rng.range(1, LARGE - 1);
                let va = SCRATCH + k * MB2;
                let e = outside(rng, PAGE) | P | RW;
                set(self.pd_s, k, e);
                hc::hcall(rng, LHCALL_FLUSH_TLB, [0; 4]);
                announce(
                    format_args!("read of {va:#x} through a page table at {:#x}", e & FRAME),
                    format_args!("guest table entry {e:#x} for {va:#x} points outside guest memory"),
                );
                traps::try_read(va).ok();
                fail(format_args!("survived: read of {va:#x} through table entry {e:#x}"))
            }
            2 if mem < GB1 => {
                let va = SCRATCH + GB1;
                let e = (rng.below(4) * GB1) | P | PS | (rng.next() & (NOISE | RW));
                set(self.pdpt_s, 1, e);
                hc::hcall(rng, LHCALL_SET_PGD, [0; 4]);
                announce(
                    format_args!("read of {va:#x} through a 1 GiB page {e:#x}"),
                    format_args!("guest page entry {e:#x} for {va:#x} points outside guest memory"),
                );
                traps::try_read(va).ok();
                fail(format_args!("survived: read of {va:#x} through 1 GiB entry {e:#x}"))
            }
            _ => {
                let va = 2 * TOP + (rng.below(TOP) & !7);
                let e = self.pdpt_s | P | RW | PS;
                set(root, 2, e);
                hc::hcall(rng, LHCALL_FLUSH_TLB, [0; 4]);
                announce(
                    format_args!("read of {va:#x} through top-level entry {e:#x}"),
                    format_args!("guest top-level entry {e:#x} for {va:#x} has the page-size bit"),
                );
                traps::try_read(va).ok();
                fail(format_args!("survived: read of {va:#x} through top-level entry {e:#x}"))
            }
        }
    }
}
