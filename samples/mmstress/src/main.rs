// SPDX-License-Identifier: GPL-2.0
//! `mmstress seed=N [ops=N] [tlb]`: seeded random page-table operations on
//! three address spaces, each access checked against a model.
//!
//! The model knows, for every address space, which user slots are mapped
//! (96 4 KiB slots that straddle a page-table boundary, and 4 2 MiB slots),
//! to which frame (a pool of 48 4 KiB frames and 3 2 MiB frames, so pages
//! alias within and across spaces) and with which bits (RW, US, NX), and the
//! value of four words in every 4 KiB page of the pool. The operations, from
//! a splitmix64 generator seeded by `seed=`:
//!
//! - map a free slot, unmap, or change the bits (protect) of a mapped one,
//!   in any of the three spaces (not only the active one: the host caches
//!   the shadows of several roots, so every change must reach them), told
//!   to the host directly or, in bursts of 1 to 8, through the async ring;
//! - switch to another space (`NEW_PGTABLE`), flush (`FLUSH_TLB` or
//!   `NEW_PGTABLE` of the active root);
//! - destroy an inactive space and build a new one (its root frame is
//!   usually the one just freed, so the host must not reuse a stale
//!   shadow);
//! - access a slot of the active space: a read or a write of one of the
//!   four words, from the guest kernel or from guest user mode. The model
//!   says what must happen: the value read, or a page fault with which
//!   error code (P, W, U) at which address; after a success the entry must
//!   have A set (and D after a write).
//!
//! With the word `tlb` (and the library's `tlbshadows`: TLB-semantics
//! shadows) the guest reports nothing ([`paging::set_reporting`]) and
//! relies on TLB semantics instead, as a kernel on hardware does: after a
//! change in the active space it makes `LHCALL_INVLPG` of the page (of any
//! 4 KiB page inside a 2 MiB one) 6 times in 10, or when the page already
//! has [`STALE`] old translations the host may still use; switches and
//! flushes drop them all. The model keeps, per slot of the active space,
//! the old mappings the host may still use: an access may then succeed
//! through any of them (a read gives that mapping's page's word, a write
//! lands in exactly one of their pages), and a fault must be the one the
//! current entry gives (the host walks the guest's tables on a fault).
//!
//! Every 10000 operations, and at the end, every model word is compared
//! with memory. The first difference crashes the guest with the operation
//! number; the end is `mmstress: seed S: N ops (...), A accesses, F faults
//! expected, F seen` and `mmstress: seed S: done`.
#![no_std]
#![no_main]

use core::arch::global_asm;
use core::ptr::{self, addr_of};

use lguest_guest::cell::GuestCell;
use lguest_guest::paging::{self, pte, Access, AddressSpace, PageSize, LARGE_PAGE_SIZE, PAGE_SIZE, USER_START};
use lguest_guest::user::{self, Exit, UserRegs};
use lguest_guest::{crash_fmt, entry, frames, poweroff_fmt, println, Args};

entry!(main);

const SPACES: usize = 3;
const SMALL_SLOTS: usize = 96;
/// The hot small slots: 8 around the page-table boundary.
const HOT_BASE: usize = SMALL_SLOTS / 2 - 4;
const HOT_SLOTS: usize = 8;
const LARGE_SLOTS: usize = 4;
const SMALL_FRAMES: usize = 48;
const LARGE_FRAMES: usize = 3;
/// Words tracked per 4 KiB page, at these offsets.
const OFFSETS: [u64; 4] = [0, 8, 0x800, 0xff8];
const WORDS_PER_PAGE: usize = OFFSETS.len();
/// 4 KiB pages in the pool: the small frames, then the large ones' pages.
const PAGES: usize = SMALL_FRAMES + LARGE_FRAMES * 512;

/// The user stubs, and the user stack below `USER_STACK_TOP`.
const USER_CODE: u64 = USER_START;
const USER_STACK_TOP: u64 = USER_START + 0x40_0000;
/// The slots: small ones straddle the page-table boundary at 4 MiB + 2 MiB.
const SMALL_BASE: u64 = USER_START + 0x60_0000 - (SMALL_SLOTS as u64 / 2) * PAGE_SIZE;
const LARGE_BASE: u64 = USER_START + (1 << 30);

/// Old translations of one slot the model tracks at most (TLB mode).
const STALE: usize = 3;

const PF_P: u64 = 1;
const PF_W: u64 = 2;
const PF_U: u64 = 4;

// User stubs: read [rdi] / write rsi to [rdi], then exit with the value.
global_asm!(
    ".pushsection .text.mmstress_user, \"ax\", @progbits",
    ".balign 4096",
    ".globl mmstress_user_start",
    "mmstress_user_start:",
    "    mov rax, qword ptr [rdi]",
    "    mov rdi, rax",
    "    xor eax, eax",
    "    int 0x80",
    "    ud2",
    ".balign 16",
    "    mov qword ptr [rdi], rsi",
    "    xor edi, edi",
    "    xor eax, eax",
    "    int 0x80",
    "    ud2",
    ".balign 4096",
    ".globl mmstress_user_end",
    "mmstress_user_end:",
    ".popsection",
);

extern "C" {
    static mmstress_user_start: u8;
    static mmstress_user_end: u8;
}

/// splitmix64 (the shared copy in `lguest-splitmix`).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        lguest_splitmix::next(&mut self.0)
    }

    fn below(&mut self, n: u64) -> u64 {
        lguest_splitmix::below(self.next(), n)
    }

    fn chance(&mut self, permille: u64) -> bool {
        self.below(1000) < permille
    }
}

/// One mapping in the model: frame index and leaf bits (RW, US, NX).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Map {
    frame: usize,
    flags: u64,
}

/// One address space and its model.
struct Space {
    space: AddressSpace,
    small: [Option<Map>; SMALL_SLOTS],
    large: [Option<Map>; LARGE_SLOTS],
}

/// The model's words, by 4 KiB pool page and offset.
static WORDS: GuestCell<[[u64; WORDS_PER_PAGE]; PAGES]> = GuestCell::new([[0; WORDS_PER_PAGE]; PAGES]);

/// Counts for the summary.
#[derive(Default)]
struct Stats {
    maps: u64,
    unmaps: u64,
    protects: u64,
    switches: u64,
    flushes: u64,
    invlpgs: u64,
    stale_hits: u64,
    recreates: u64,
    batches: u64,
    accesses: u64,
    user_accesses: u64,
    faults_expected: u64,
    faults_seen: u64,
}

struct Stress {
    rng: Rng,
    seed: u64,
    op: u64,
    spaces: [Space; SPACES],
    active: usize,
    small_frames: [u64; SMALL_FRAMES],
    large_frames: [u64; LARGE_FRAMES],
    user_pages: (u64, u64),
    stack: u64,
    stats: Stats,
    /// TLB mode: no reports, `INVLPG` and the model's old translations.
    tlb: bool,
    /// TLB mode: per slot of the active space, old mappings the host may
    /// still translate with (small slots, then large ones).
    stale: [[Option<Map>; STALE]; SMALL_SLOTS + LARGE_SLOTS],
}

fn words() -> &'static mut [[u64; WORDS_PER_PAGE]; PAGES] {
    // SAFETY: only the main loop touches the model, never from a handler,
    // and it never holds two references at once.
    unsafe { &mut *WORDS.get() }
}

fn phys_read(pa: u64) -> u64 {
    // SAFETY: `pa` is a tracked word of a pool frame, identity mapped.
    unsafe { ptr::read_volatile(pa as *const u64) }
}

fn phys_write(pa: u64, v: u64) {
    // SAFETY: as in `phys_read`; the pool belongs to this guest.
    unsafe { ptr::write_volatile(pa as *mut u64, v) }
}

/// Random leaf bits: RW, US and NX each half the time.
fn random_flags(rng: &mut Rng) -> u64 {
    let r = rng.next();
    let mut f = 0;
    if r & 1 != 0 {
        f |= pte::RW;
    }
    if r & 2 != 0 {
        f |= pte::US;
    }
    if r & 4 != 0 {
        f |= pte::NX;
    }
    f
}

impl Stress {
    fn fail(&self, what: core::fmt::Arguments<'_>) -> ! {
        crash_fmt(format_args!("mmstress: seed {} op {}: FAIL: {what}", self.seed, self.op))
    }

    /// The guest-physical address of pool page `page`.
    fn page_pa(&self, page: usize) -> u64 {
        if page < SMALL_FRAMES {
            self.small_frames[page]
        } else {
            let l = (page - SMALL_FRAMES) / 512;
            self.large_frames[l] + ((page - SMALL_FRAMES) % 512) as u64 * PAGE_SIZE
        }
    }

    /// Picks a slot: (large?, index).
    ///
    /// Large pages are picked 1 time in 20 for an update (each large
    /// update is a `SET_PMD`, which drops every shadow and so hides stale
    /// ones) and 1 in 5 for an access; 2 picks in 3 go to 8 hot small
    /// slots, so that the host has shadows (current and cached) that a
    /// missed report would leave stale.
    fn slot(&mut self, update: bool) -> (bool, usize) {
        if self.rng.chance(if update { 50 } else { 200 }) {
            (true, self.rng.below(LARGE_SLOTS as u64) as usize)
        } else if self.rng.chance(667) {
            (false, HOT_BASE + self.rng.below(HOT_SLOTS as u64) as usize)
        } else {
            (false, self.rng.below(SMALL_SLOTS as u64) as usize)
        }
    }

    fn slot_va(large: bool, i: usize) -> u64 {
        if large {
            LARGE_BASE + i as u64 * LARGE_PAGE_SIZE
        } else {
            SMALL_BASE + i as u64 * PAGE_SIZE
        }
    }

    /// One map, unmap or protect in a random space.
    fn update(&mut self) {
        let s = self.rng.below(SPACES as u64) as usize;
        let (large, i) = self.slot(true);
        let va = Self::slot_va(large, i);
        let size = if large { PageSize::Large } else { PageSize::Small };
        let cur = if large { self.spaces[s].large[i] } else { self.spaces[s].small[i] };
        let flags = random_flags(&mut self.rng);
        let new = match cur {
            None => {
                let frame = if large {
                    self.rng.below(LARGE_FRAMES as u64) as usize
                } else {
                    self.rng.below(SMALL_FRAMES as u64) as usize
                };
                let pa = if large { self.large_frames[frame] } else { self.small_frames[frame] };
                if let Err(e) = self.spaces[s].space.map(va, pa, size, flags) {
                    self.fail(format_args!("map {va:#x} in space {s}: {e}"));
                }
                self.stats.maps += 1;
                Some(Map { frame, flags })
            }
            Some(m) if self.rng.chance(400) => {
                if let Err(e) = self.spaces[s].space.unmap(va, size) {
                    self.fail(format_args!("unmap {va:#x} in space {s} ({m:?}): {e}"));
                }
                self.stats.unmaps += 1;
                None
            }
            Some(m) => {
                if let Err(e) = self.spaces[s].space.protect(va, size, flags) {
                    self.fail(format_args!("protect {va:#x} in space {s} ({m:?}): {e}"));
                }
                self.stats.protects += 1;
                Some(Map { frame: m.frame, flags })
            }
        };
        if large {
            self.spaces[s].large[i] = new;
        } else {
            self.spaces[s].small[i] = new;
        }
        if self.tlb && s == self.active {
            let k = Self::stale_index(large, i);
            // No room for one more old translation: invalidate this change.
            let mut full = false;
            if let Some(old) = cur {
                let list = &mut self.stale[k];
                if !list.contains(&Some(old)) {
                    match list.iter_mut().find(|m| m.is_none()) {
                        Some(free) => *free = Some(old),
                        None => full = true,
                    }
                }
            }
            if full || self.rng.chance(600) {
                // Any 4 KiB page of a large one names all of it.
                let sub = if large { self.rng.below(512) * PAGE_SIZE } else { 0 };
                paging::invlpg(va + sub);
                self.stale[k] = [None; STALE];
                self.stats.invlpgs += 1;
            }
        }
    }

    fn stale_index(large: bool, i: usize) -> usize {
        if large {
            SMALL_SLOTS + i
        } else {
            i
        }
    }

    /// Whether `m` lets this access through.
    fn permits(m: &Map, write: bool, user_mode: bool) -> bool {
        (!user_mode || m.flags & pte::US != 0) && (!write || m.flags & pte::RW != 0)
    }

    /// One access in the active space, checked against the model.
    fn access(&mut self) {
        let (large, i) = self.slot(false);
        // Large pages: three hot 4 KiB pages of the 512 most of the time,
        // so their shadow entries get reused.
        let sub = match (large, self.rng.below(4)) {
            (false, _) => 0,
            (true, 0) => self.rng.below(512),
            (true, k) => [0, 1, 511][k as usize - 1],
        };
        let w = self.rng.below(WORDS_PER_PAGE as u64) as usize;
        let va = Self::slot_va(large, i) + sub * PAGE_SIZE + OFFSETS[w];
        let write = self.rng.chance(400);
        let user_mode = self.rng.chance(300);
        let value = self.rng.next();
        let space = &self.spaces[self.active];
        let map = if large { space.large[i] } else { space.small[i] };
        let page = map.map(|m| if large { SMALL_FRAMES + m.frame * 512 + sub as usize } else { m.frame });
        let expect_fault = match map {
            None => Some(0),
            Some(m) if user_mode && m.flags & pte::US == 0 => Some(PF_P),
            Some(m) if write && m.flags & pte::RW == 0 => Some(PF_P),
            Some(_) => None,
        }
        .map(|e| e | if write { PF_W } else { 0 } | if user_mode { PF_U } else { 0 });

        let result: Result<u64, (u64, u64, u64)> = if user_mode {
            let stub = if write { 16 } else { 0 };
            let mut regs = UserRegs::new(USER_CODE + stub, USER_STACK_TOP);
            regs.rdi = va;
            regs.rsi = value;
            self.stats.user_accesses += 1;
            match user::run(&regs) {
                Exit::Exited(v) => Ok(v),
                Exit::Killed { vector, error, cr2, .. } => Err((vector, error, cr2)),
            }
        } else {
            let access = if write { Access::Write } else { Access::Read };
            paging::probe(access, va, value).map_err(|f| (f.vector, f.error, f.cr2))
        };
        self.stats.accesses += 1;
        self.stats.faults_expected += u64::from(expect_fault.is_some());
        self.stats.faults_seen += u64::from(matches!(result, Err((14, _, _))));
        let what = if write { "write" } else { "read" };
        let mode = if user_mode { "user" } else { "kernel" };
        // The pages an access may reach: through the current mapping if it
        // permits the access, or through an old one the host may still use
        // (TLB mode).
        let pool_page = |m: &Map| if large { SMALL_FRAMES + m.frame * 512 + sub as usize } else { m.frame };
        let mut reach: [Option<usize>; STALE + 1] = [None; STALE + 1];
        if expect_fault.is_none() {
            reach[0] = page;
        }
        let stale = if self.tlb { self.stale[Self::stale_index(large, i)] } else { [None; STALE] };
        for (r, m) in reach[1..].iter_mut().zip(stale.iter()) {
            if let Some(m) = m.filter(|m| Self::permits(m, write, user_mode)) {
                *r = Some(pool_page(&m));
            }
        }
        let has_stale = stale.iter().any(|m| m.is_some());
        match (result, expect_fault) {
            (Err((14, error, cr2)), Some(want)) if error == want && cr2 == va => {}
            (Err((vector, error, cr2)), want) => self.fail(format_args!(
                "{mode} {what} of {va:#x} in space {} ({map:x?}, old {stale:x?}): vector {vector} error {error:#x} \
                 cr2 {cr2:#x}, expected {want:#x?}",
                self.active
            )),
            (Ok(got), _) if reach.iter().all(|r| r.is_none()) => self.fail(format_args!(
                "{mode} {what} of {va:#x} in space {} ({map:x?}, old {stale:x?}) did not fault (got {got:#x}), \
                 expected error {expect_fault:#x?}",
                self.active
            )),
            (Ok(got), _) => {
                if expect_fault.is_some() {
                    self.stats.stale_hits += 1;
                }
                if write {
                    // The value is random: the page that holds it now is
                    // the one the write went to.
                    let Some(p) =
                        reach.iter().flatten().copied().find(|&p| phys_read(self.page_pa(p) + OFFSETS[w]) == value)
                    else {
                        self.fail(format_args!(
                            "{mode} write of {va:#x} in space {} ({map:x?}, old {stale:x?}) reached none of the \
                             pages {reach:?}",
                            self.active
                        ))
                    };
                    words()[p][w] = value;
                } else if !reach.iter().flatten().any(|&p| words()[p][w] == got) {
                    let p = reach.iter().flatten().copied().next().unwrap_or(0);
                    let (m, pa) = (words()[p][w], self.page_pa(p) + OFFSETS[w]);
                    self.fail(format_args!(
                        "{mode} read of {va:#x} in space {} ({map:x?}, old {stale:x?}): {got:#x}, model {m:#x}, \
                         memory at {pa:#x} {:#x}",
                        self.active,
                        phys_read(pa)
                    ));
                }
                // The accessed and dirty bits are the current entry's when
                // the host filled the shadow from it; an old translation
                // sets nothing.
                if !has_stale {
                    let level = if large { 2 } else { 1 };
                    let e = self.spaces[self.active].space.entry(va, level).unwrap_or(0);
                    let want = pte::A | if write { pte::D } else { 0 };
                    if e & want != want {
                        self.fail(format_args!("after a {mode} {what} of {va:#x} the entry is {e:#x}"));
                    }
                }
            }
        }
    }

    /// Compares every model word with memory.
    fn verify(&self) {
        for page in 0..PAGES {
            for (w, &off) in OFFSETS.iter().enumerate() {
                let pa = self.page_pa(page) + off;
                let (m, v) = (words()[page][w], phys_read(pa));
                if m != v {
                    self.fail(format_args!("memory at {pa:#x} is {v:#x}, model {m:#x}"));
                }
            }
        }
    }

    /// One random operation.
    fn step(&mut self) {
        match self.rng.below(1000) {
            0..=349 => self.update(),
            350..=389 => {
                self.stats.batches += 1;
                paging::begin_batch();
                for _ in 0..1 + self.rng.below(8) {
                    self.update();
                }
                paging::end_batch();
            }
            390..=429 => {
                self.active = (self.active + 1 + self.rng.below(SPACES as u64 - 1) as usize) % SPACES;
                self.spaces[self.active].space.activate();
                self.stale = [[None; STALE]; SMALL_SLOTS + LARGE_SLOTS];
                self.stats.switches += 1;
            }
            430..=434 => {
                if self.rng.chance(500) {
                    paging::flush_all();
                } else {
                    self.spaces[self.active].space.activate();
                }
                self.stale = [[None; STALE]; SMALL_SLOTS + LARGE_SLOTS];
                self.stats.flushes += 1;
            }
            435..=436 => {
                // The new space takes frames first; the old one's root and
                // tables go back to the pool and are reused by the next
                // recreate (the allocator is LIFO), so the host must not
                // keep a stale shadow of a root.
                let s = (self.active + 1 + self.rng.below(SPACES as u64 - 1) as usize) % SPACES;
                let fresh = new_space(self.user_pages, self.stack);
                let old = core::mem::replace(&mut self.spaces[s], fresh);
                if old.space.destroy().is_err() {
                    self.fail(format_args!("could not destroy space {s}"));
                }
                self.stats.recreates += 1;
            }
            _ => self.access(),
        }
    }
}

/// A fresh space with the user stubs (the pages `user_pages`) and stack.
fn new_space(user_pages: (u64, u64), stack: u64) -> Space {
    let fail = |what: core::fmt::Arguments<'_>| -> ! { crash_fmt(format_args!("mmstress: FAIL: {what}")) };
    let mut space = AddressSpace::new().unwrap_or_else(|e| fail(format_args!("new space: {e}")));
    let (start, end) = user_pages;
    for pa in (start..end).step_by(PAGE_SIZE as usize) {
        if let Err(e) = space.map(USER_CODE + (pa - start), pa, PageSize::Small, pte::US) {
            fail(format_args!("mapping the stubs: {e}"));
        }
    }
    if let Err(e) = space.map(USER_STACK_TOP - PAGE_SIZE, stack, PageSize::Small, pte::US | pte::RW | pte::NX) {
        fail(format_args!("mapping the stack: {e}"));
    }
    Space { space, small: [None; SMALL_SLOTS], large: [None; LARGE_SLOTS] }
}

fn usage() -> ! {
    println!("mmstress: usage: mmstress seed=N [ops=N] [tlb] (tlb needs the word tlbshadows too)");
    crash_fmt(format_args!("mmstress: bad command line"))
}

fn main(args: Args) -> ! {
    let (mut seed, mut ops, mut tlb) = (None, 100_000u64, false);
    for word in args {
        if word == "tlb" {
            tlb = true;
            continue;
        }
        let Some((key, value)) = word.split_once('=') else { usage() };
        let Ok(value) = value.parse::<u64>() else { usage() };
        match key {
            "seed" => seed = Some(value),
            "ops" => ops = value,
            _ => usage(),
        }
    }
    let Some(seed) = seed else { usage() };

    if tlb && !paging::set_reporting(false) {
        usage();
    }
    frames::init_free_ram();
    if let Err(e) = paging::init_kernel() {
        crash_fmt(format_args!("mmstress: kernel map: {e}"));
    }
    if let Err(e) = user::init() {
        crash_fmt(format_args!("mmstress: user::init: {e}"));
    }
    let oom = || -> ! { crash_fmt(format_args!("mmstress: out of frames (give the guest more memory)")) };
    let mut small_frames = [0; SMALL_FRAMES];
    for f in &mut small_frames {
        *f = frames::alloc().unwrap_or_else(|| oom());
    }
    let mut large_frames = [0; LARGE_FRAMES];
    for f in &mut large_frames {
        *f = frames::alloc_large().unwrap_or_else(|| oom());
    }
    let stack = frames::alloc().unwrap_or_else(|| oom());
    let user_pages = (
        lguest_guest::virt_to_phys(addr_of!(mmstress_user_start)),
        lguest_guest::virt_to_phys(addr_of!(mmstress_user_end)),
    );
    let mut st = Stress {
        rng: Rng(seed),
        seed,
        op: 0,
        spaces: core::array::from_fn(|_| new_space(user_pages, stack)),
        active: 0,
        small_frames,
        large_frames,
        user_pages,
        stack,
        stats: Stats::default(),
        tlb,
        stale: [[None; STALE]; SMALL_SLOTS + LARGE_SLOTS],
    };
    for page in 0..PAGES {
        for (w, &off) in OFFSETS.iter().enumerate() {
            let v = st.rng.next();
            words()[page][w] = v;
            phys_write(st.page_pa(page) + off, v);
        }
    }
    st.spaces[0].space.activate();
    println!(
        "mmstress: seed {seed}: {ops} ops on {SPACES} spaces, {SMALL_SLOTS}+{LARGE_SLOTS} slots, \
         {SMALL_FRAMES} 4 KiB + {LARGE_FRAMES} 2 MiB frames"
    );
    let t0 = lguest_guest::clock::now_ns();
    while st.op < ops {
        st.step();
        st.op += 1;
        if st.op.is_multiple_of(10_000) {
            st.verify();
        }
    }
    st.verify();
    let ms = (lguest_guest::clock::now_ns() - t0) / 1_000_000;
    let s = &st.stats;
    let (ptes, flushes, switches) = paging::stats();
    println!(
        "mmstress: seed {seed}: {ops} ops ({} map, {} unmap, {} protect, {} batches, {} switch, {} flush, {} recreate), \
         {} accesses ({} from user mode), faults expected {} seen {}; {ptes} SET_PTE or INVLPG, {flushes} flushes, \
         {switches} NEW_PGTABLE; {} INVLPG, {} accesses through old translations; {ms} ms",
        s.maps,
        s.unmaps,
        s.protects,
        s.batches,
        s.switches,
        s.flushes,
        s.recreates,
        s.accesses,
        s.user_accesses,
        s.faults_expected,
        s.faults_seen,
        s.invlpgs,
        s.stale_hits
    );
    println!("mmstress: seed {seed}: done");
    poweroff_fmt(format_args!("mmstress: seed {seed}: done"))
}
