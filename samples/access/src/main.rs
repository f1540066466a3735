// SPDX-License-Identifier: GPL-2.0
//! `access`: page-table permission bits against x86 semantics, in the
//! spirit of kvm-unit-tests' x86/access.c.
//!
//! For a 4 KiB page (bits varied in its page-table entry and in the
//! page-directory entry above it) and a 2 MiB page (bits varied in its
//! page-directory entry and in the page-directory-pointer entry above it),
//! every combination of P, RW, US and NX at both levels (16 x 16) is set,
//! with A and D clear in each entry whose other bits change (and the host
//! told: `SET_PTE` for a 4 KiB leaf, `SET_PMD` for a directory entry,
//! `SET_PGD` above; an entry that does not change is neither written nor
//! reported, so the host keeps its shadow and an upper-level change must
//! reach it through that level's report alone), then one access is
//! made, a read, a write or an instruction fetch, from the guest kernel
//! ([`paging::probe`]) or from guest user mode ([`user::run`] of a
//! three-instruction stub). The outcome is compared with what an x86 CPU
//! with CR0.WP=1, EFER.NXE=1 and no SMEP/SMAP does:
//!
//! - not present at either level: #PF with P=0;
//! - user mode needs US at every level (the kernel may read, write and
//!   execute user pages);
//! - a write needs RW at every level, in both modes (WP=1);
//! - a fetch faults if NX is set at any level;
//! - the error code is P (protection) | W (write) | U (user mode) | I
//!   (fetch), and CR2 (`lguest_data.cr2`) the address;
//! - after a successful access the leaf and the entry above have A set, the
//!   leaf has D set after a write (and clear after a read or fetch if it
//!   was clear before); a read sees the
//!   frame's contents, a write lands in the frame, a fetch runs the code
//!   there.
//!
//! `access: N cases, M mismatches` at the end (3072 cases), the first
//! mismatches in detail; powers off with `access: done` when there are
//! none, crashes otherwise. `access quick` runs only the 4 KiB half.
#![no_std]
#![no_main]

use core::arch::global_asm;
use core::ptr::{self, addr_of};

use lguest_guest::paging::{self, pte, Access, AddressSpace, PageSize, PAGE_SIZE, USER_START};
use lguest_guest::user::{self, Exit, UserRegs};
use lguest_guest::{crash_fmt, entry, frames, poweroff_fmt, println, Args};

entry!(main);

/// The user stubs.
const USER_CODE: u64 = USER_START;
/// The user stack (one page below it).
const USER_STACK_TOP: u64 = USER_START + 0x40_0000;
/// The 4 KiB test page: its own page directory entry (PDPT entry 1).
const VA_4K: u64 = USER_START + (1 << 30) + 0x5000;
/// The 2 MiB test page: its own page-directory-pointer entry (2).
const VA_2M: u64 = USER_START + (2 << 30);
/// Where in a test page the accesses go: the fetch targets are at
/// `OFF_CODE` (kernel) and `OFF_CODE + 16` (user), data at `OFF_DATA`.
const OFF_CODE_4K: u64 = 0x340;
const OFF_CODE_2M: u64 = 0x1a_3340;
const OFF_USER_CODE: u64 = 16;
const OFF_DATA: u64 = 64;
/// What a user fetch target passes to `exit`.
const EXEC_MAGIC: u32 = 0x600d;
/// PF error code bits.
const PF_P: u64 = 1;
const PF_W: u64 = 2;
const PF_U: u64 = 4;
const PF_I: u64 = 16;

// User stubs, each ending in `exit` (system call 0) with its result in
// RDI: read [rdi]; write rsi to [rdi]; jump to rdi (the target exits).
global_asm!(
    ".pushsection .text.access_user, \"ax\", @progbits",
    ".balign 4096",
    ".globl access_user_start",
    "access_user_start:",
    "    mov rax, qword ptr [rdi]",
    "    mov rdi, rax",
    "    xor eax, eax",
    "    int 0x80",
    "    ud2",
    ".balign 16",
    "access_user_write:",
    "    mov qword ptr [rdi], rsi",
    "    xor edi, edi",
    "    xor eax, eax",
    "    int 0x80",
    "    ud2",
    ".balign 16",
    "access_user_exec:",
    "    jmp rdi",
    ".balign 4096",
    ".globl access_user_end",
    "access_user_end:",
    ".popsection",
);

extern "C" {
    static access_user_start: u8;
    static access_user_end: u8;
}

/// Offsets of the stubs in their page.
const STUB_READ: u64 = 0;
const STUB_WRITE: u64 = 16;
const STUB_EXEC: u64 = 32;

/// The bits varied at one level: bit 0 P, 1 RW, 2 US, 3 NX.
fn bits(combo: u64) -> u64 {
    let mut b = 0;
    if combo & 1 != 0 {
        b |= pte::P;
    }
    if combo & 2 != 0 {
        b |= pte::RW;
    }
    if combo & 4 != 0 {
        b |= pte::US;
    }
    if combo & 8 != 0 {
        b |= pte::NX;
    }
    b
}

/// A short description of entry bits.
struct Flags(u64);

impl core::fmt::Display for Flags {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let e = self.0;
        let names = [(pte::P, "P"), (pte::RW, "W"), (pte::US, "U"), (pte::NX, "X")];
        for (bit, name) in names {
            f.write_str(if e & bit != 0 { name } else { "-" })?;
        }
        Ok(())
    }
}

/// What the hardware would do: `None` (success) or the error code.
fn expected(upper: u64, leaf: u64, access: Access, user_mode: bool) -> Option<u64> {
    let base = match access {
        Access::Read => 0,
        Access::Write => PF_W,
        Access::Exec => PF_I,
    } | if user_mode { PF_U } else { 0 };
    if upper & pte::P == 0 || leaf & pte::P == 0 {
        return Some(base);
    }
    let writable = upper & leaf & pte::RW != 0;
    let user = upper & leaf & pte::US != 0;
    let nx = (upper | leaf) & pte::NX != 0;
    let violation = (user_mode && !user) || (access == Access::Write && !writable) || (access == Access::Exec && nx);
    violation.then_some(base | PF_P)
}

/// The test state.
struct Test {
    space: AddressSpace,
    /// The two test frames (4 KiB, 2 MiB).
    frame_4k: u64,
    frame_2m: u64,
    /// The tables that hold the varied entries: (upper, leaf) per size.
    tables_4k: (u64, u64),
    tables_2m: (u64, u64),
    cases: u64,
    mismatches: u64,
    faults: u64,
}

fn fail(what: core::fmt::Arguments<'_>) -> ! {
    crash_fmt(format_args!("access: FAIL: {what}"))
}

/// Writes the code and data of a test page at `pa + off`.
fn fill(pa: u64, off: u64) {
    let user_exit: [u8; 11] = {
        let m = EXEC_MAGIC.to_le_bytes();
        // mov edi, imm32; xor eax, eax; int 0x80; ud2
        [0xbf, m[0], m[1], m[2], m[3], 0x31, 0xc0, 0xcd, 0x80, 0x0f, 0x0b]
    };
    // SAFETY: `pa + off ..+ 72` is inside a test frame this guest owns,
    // identity mapped for the kernel.
    unsafe {
        ptr::copy_nonoverlapping(paging::EXEC_RETURN.as_ptr(), (pa + off) as *mut u8, 2);
        ptr::copy_nonoverlapping(user_exit.as_ptr(), (pa + off + OFF_USER_CODE) as *mut u8, user_exit.len());
        ptr::write_volatile((pa + off + OFF_DATA) as *mut u64, pattern(pa));
    }
}

/// The data word of a test frame.
fn pattern(pa: u64) -> u64 {
    0x5a5a_0000_0000_0000 ^ pa
}

fn phys_read(pa: u64) -> u64 {
    // SAFETY: `pa` is the data word of a test frame, identity mapped.
    unsafe { ptr::read_volatile(pa as *const u64) }
}

impl Test {
    /// One case: sets the entries, accesses, compares.
    fn case(&mut self, size: PageSize, upper_combo: u64, leaf_combo: u64, access: Access, user_mode: bool) {
        let (va, frame, off, (upper_t, leaf_t)) = match size {
            PageSize::Small => (VA_4K, self.frame_4k, OFF_CODE_4K, self.tables_4k),
            PageSize::Large => (VA_2M, self.frame_2m, OFF_CODE_2M, self.tables_2m),
        };
        let upper_level = size.level() + 1;
        let upper = bits(upper_combo);
        let leaf = bits(leaf_combo);
        // The entry above points at the leaf's table; the leaf at the frame.
        let leaf_e = frame | leaf | if size == PageSize::Large { pte::PS } else { 0 };
        let upper_e = leaf_t | upper;
        fill(frame, off);
        // Only entries that change are written (and reported), and A/D
        // bits the host set are left alone when the other bits stay: the
        // host then keeps its shadow of the page, and when a case differs
        // from the last one only above the leaf, the report of that entry
        // alone (`SET_PMD`/`SET_PGD`) must make the host see the change.
        let keep = |old: u64, new: u64| old & !(pte::A | pte::D) == new;
        let leaf_before = self.space.table_entry(leaf_t, va, size.level());
        if !keep(leaf_before, leaf_e) {
            self.space.set_table_entry(leaf_t, va, size.level(), leaf_e);
        }
        if !keep(self.space.table_entry(upper_t, va, upper_level), upper_e) {
            self.space.set_table_entry(upper_t, va, upper_level, upper_e);
        }
        let dirty_before = self.space.table_entry(leaf_t, va, size.level()) & pte::D != 0;
        let target = va + off;
        let data_va = target + OFF_DATA;
        let value = 0xc0de_0000_0000_0000 | self.cases;
        let result: Result<u64, (u64, u64, u64)> = if user_mode {
            let (stub, rdi) = match access {
                Access::Read => (STUB_READ, data_va),
                Access::Write => (STUB_WRITE, data_va),
                Access::Exec => (STUB_EXEC, target + OFF_USER_CODE),
            };
            let mut regs = UserRegs::new(USER_CODE + stub, USER_STACK_TOP);
            regs.rdi = rdi;
            regs.rsi = value;
            match user::run(&regs) {
                Exit::Exited(v) => Ok(v),
                Exit::Killed { vector, error, cr2, .. } => Err((vector, error, cr2)),
            }
        } else {
            let at = if access == Access::Exec { target } else { data_va };
            paging::probe(access, at, value).map_err(|f| (f.vector, f.error, f.cr2))
        };
        self.cases += 1;

        let want = expected(upper, leaf, access, user_mode);
        let addr = match access {
            Access::Exec if user_mode => target + OFF_USER_CODE,
            Access::Exec => target,
            _ => data_va,
        };
        let problem: Option<&str>;
        let after_leaf = self.space.table_entry(leaf_t, va, size.level());
        let after_upper = self.space.table_entry(upper_t, va, upper_level);
        let data_now = phys_read(frame + off + OFF_DATA);
        let mut scratch = [0u64; 4];
        match (result, want) {
            (Err((14, error, cr2)), Some(w)) if error == w && cr2 == addr => {
                self.faults += 1;
                problem = None;
            }
            (Err((vector, error, cr2)), w) => {
                scratch = [vector, error, cr2, w.map_or(u64::MAX, |w| w)];
                problem = Some("faulted");
            }
            (Ok(_), Some(w)) => {
                scratch[3] = w;
                problem = Some("did not fault");
            }
            (Ok(got), None) => {
                let ok_value = match access {
                    Access::Read => got == pattern(frame),
                    Access::Write => data_now == value,
                    Access::Exec => !user_mode || got == u64::from(EXEC_MAGIC),
                };
                let want_d = access == Access::Write || dirty_before;
                let ad_ok =
                    after_leaf & pte::A != 0 && after_upper & pte::A != 0 && (after_leaf & pte::D != 0) == want_d;
                scratch[0] = got;
                problem = if !ok_value {
                    Some("wrong value")
                } else if !ad_ok {
                    Some("wrong A/D bits")
                } else {
                    None
                };
            }
        }
        if let Some(p) = problem {
            self.mismatches += 1;
            if self.mismatches <= 20 {
                let size_s = if size == PageSize::Small { "4K" } else { "2M" };
                let mode = if user_mode { "user" } else { "kernel" };
                println!(
                    "access: MISMATCH {size_s} upper {} leaf {} {mode} {access:?} of {addr:#x}: {p} \
                     (vector {} error {:#x} cr2 {:#x} / got {:#x}; expected error {:#x} (MAX: none)); \
                     entries after: upper {after_upper:#x} leaf {after_leaf:#x}",
                    Flags(upper),
                    Flags(leaf),
                    scratch[0],
                    scratch[1],
                    scratch[2],
                    scratch[0],
                    scratch[3]
                );
            }
        }
    }
}

fn main(args: Args) -> ! {
    let quick = args.iter().any(|w| w == "quick");
    frames::init_free_ram();
    if let Err(e) = paging::init_kernel() {
        fail(format_args!("kernel map: {e}"));
    }
    let mut space = AddressSpace::new().unwrap_or_else(|e| fail(format_args!("address space: {e}")));
    space.activate();
    if let Err(e) = user::init() {
        fail(format_args!("user::init: {e}"));
    }
    let start = lguest_guest::virt_to_phys(addr_of!(access_user_start));
    let end = lguest_guest::virt_to_phys(addr_of!(access_user_end));
    for pa in (start..end).step_by(PAGE_SIZE as usize) {
        if let Err(e) = space.map(USER_CODE + (pa - start), pa, PageSize::Small, pte::US) {
            fail(format_args!("mapping the stubs: {e}"));
        }
    }
    let stack = frames::alloc().unwrap_or_else(|| fail(format_args!("out of frames")));
    if let Err(e) = space.map(USER_STACK_TOP - PAGE_SIZE, stack, PageSize::Small, pte::US | pte::RW | pte::NX) {
        fail(format_args!("mapping the stack: {e}"));
    }
    let frame_4k = frames::alloc().unwrap_or_else(|| fail(format_args!("out of frames")));
    let frame_2m = frames::alloc_large().unwrap_or_else(|| fail(format_args!("no 2 MiB frame")));
    // Build the paths once (mapping creates the tables), then find the
    // tables whose entries the cases rewrite.
    let map = |space: &mut AddressSpace, va, pa, size| {
        if let Err(e) = space.map(va, pa, size, pte::US | pte::RW) {
            fail(format_args!("mapping {va:#x}: {e}"));
        }
    };
    map(&mut space, VA_4K, frame_4k, PageSize::Small);
    map(&mut space, VA_2M, frame_2m, PageSize::Large);
    let table = |space: &AddressSpace, va, level| {
        space.table_of(va, level).unwrap_or_else(|| fail(format_args!("no table for {va:#x} level {level}")))
    };
    let tables_4k = (table(&space, VA_4K, 2), table(&space, VA_4K, 1));
    let tables_2m = (table(&space, VA_2M, 3), table(&space, VA_2M, 2));
    let mut t = Test { space, frame_4k, frame_2m, tables_4k, tables_2m, cases: 0, mismatches: 0, faults: 0 };

    let t0 = lguest_guest::clock::now_ns();
    let sizes: &[PageSize] = if quick { &[PageSize::Small] } else { &[PageSize::Small, PageSize::Large] };
    for &size in sizes {
        for leaf in 0..16 {
            for upper in 0..16 {
                for user_mode in [false, true] {
                    for access in [Access::Read, Access::Write, Access::Exec] {
                        t.case(size, upper, leaf, access, user_mode);
                    }
                }
            }
        }
    }
    let ms = (lguest_guest::clock::now_ns() - t0) / 1_000_000;
    let (ptes, flushes, _) = paging::stats();
    println!(
        "access: {} cases, {} mismatches ({} faults as expected; {ptes} SET_PTE, {flushes} SET_PMD/SET_PGD; {ms} ms)",
        t.cases, t.mismatches, t.faults
    );
    if t.mismatches != 0 {
        crash_fmt(format_args!("access: {} of {} cases differ from x86", t.mismatches, t.cases));
    }
    println!("access: done");
    poweroff_fmt(format_args!("access: done: {} cases, 0 mismatches", t.cases))
}
