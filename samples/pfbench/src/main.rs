// SPDX-License-Identifier: GPL-2.0
//! `pfbench [pages=N] [forkpages=K] [iterations=R]`: page-fault and
//! address-space costs, in TSC cycles (`rdtsc` works in ring 3: the host
//! does not set CR4.TSD).
//!
//! - `fault_roundtrip_cycles`: guest demand paging. A user program writes
//!   one word to each of N pages that are not mapped; each write faults to
//!   the guest kernel (#PF, error U|W), whose handler maps a fresh frame
//!   (`SET_PTE`) and returns to user mode (`LHCALL_IRET_USER`), where the
//!   write is retried and the host fills its shadow entry. The user program
//!   times its loop with `rdtsc` and reports cycles per page.
//! - `shadow_fault_cycles`: the host's part alone. N pages mapped beforehand
//!   (A/D clear, one batch of `SET_PTE`s) are written once each from the
//!   guest kernel: each first touch is a shadow fault the host fixes
//!   without the guest noticing.
//! - `fork_cycles`: a fork-like workload, R times: create an address space,
//!   map K fresh frames and fill them (one word per page; the mappings go
//!   through the async ring), switch to it, read every page through the new
//!   mapping, switch back and tear it down (`SET_PGD`), free the frames.
//!   Cycles per iteration.
//!
//! Machine-readable lines `pfbench: NAME=VALUE ...`, then poweroff with
//! `pfbench: done`.
#![no_std]
#![no_main]

use core::arch::global_asm;
use core::ptr::{self, addr_of};
use core::sync::atomic::{AtomicU64, Ordering};

use lguest_guest::cell::GuestCell;
use lguest_guest::paging::{self, pte, AddressSpace, PageSize, PAGE_SIZE, USER_START};
use lguest_guest::user::{self, Exit, UserRegs};
use lguest_guest::{crash_fmt, entry, frames, poweroff, println, Args, TrapFrame};

entry!(main);

const USER_CODE: u64 = USER_START;
const USER_STACK_TOP: u64 = USER_START + 0x40_0000;
/// Where the demand-paged region starts.
const DEMAND_BASE: u64 = USER_START + (1 << 30);
/// Where the kernel-touched region and the fork pages go.
const SHADOW_BASE: u64 = USER_START + (2 << 30);
const FORK_BASE: u64 = USER_START + (3 << 30);

// The user program: rdi = first page, rsi = pages. Writes one word per
// page, then exits with the TSC cycles of the loop.
global_asm!(
    ".pushsection .text.pfbench_user, \"ax\", @progbits",
    ".balign 4096",
    ".globl pfbench_user_start",
    "pfbench_user_start:",
    "    mov rcx, rsi",
    "    rdtsc",
    "    shl rdx, 32",
    "    or rax, rdx",
    "    mov r8, rax",
    "2:  mov qword ptr [rdi], rcx",
    "    add rdi, 4096",
    "    dec rcx",
    "    jnz 2b",
    "    rdtsc",
    "    shl rdx, 32",
    "    or rax, rdx",
    "    sub rax, r8",
    "    mov rdi, rax",
    "    xor eax, eax",
    "    int 0x80",
    "    ud2",
    ".balign 4096",
    ".globl pfbench_user_end",
    "pfbench_user_end:",
    ".popsection",
);

extern "C" {
    static pfbench_user_start: u8;
    static pfbench_user_end: u8;
}

/// The address space the demand-paging hook maps into (only the hook
/// touches it while the user program runs; `main` only before and after).
static SPACE: GuestCell<Option<AddressSpace>> = GuestCell::new(None);
/// The demand region's end, and the faults the hook served.
static DEMAND_END: AtomicU64 = AtomicU64::new(0);
static DEMAND_FAULTS: AtomicU64 = AtomicU64::new(0);

fn space() -> &'static mut AddressSpace {
    // SAFETY: set once before any use; `main` and the hook never use it at
    // the same time (the hook runs only while `user::run` waits).
    unsafe { (*SPACE.get()).as_mut().unwrap_or_else(|| crash_fmt(format_args!("pfbench: no space"))) }
}

/// Demand paging: a not-present user fault in the demand region gets a
/// fresh frame; anything else kills the program.
fn demand(frame: &mut TrapFrame, cr2: u64) -> bool {
    if frame.vector != 14 || frame.error & 1 != 0 || !(DEMAND_BASE..DEMAND_END.load(Ordering::Relaxed)).contains(&cr2) {
        return false;
    }
    let Some(pa) = frames::alloc() else { return false };
    if space().map(cr2 & !(PAGE_SIZE - 1), pa, PageSize::Small, pte::US | pte::RW | pte::NX).is_err() {
        return false;
    }
    DEMAND_FAULTS.fetch_add(1, Ordering::Relaxed);
    true
}

fn rdtsc() -> u64 {
    let (lo, hi): (u32, u32);
    // SAFETY: rdtsc reads the time-stamp counter; no memory, no flags.
    unsafe { core::arch::asm!("rdtsc", out("eax") lo, out("edx") hi, options(nomem, nostack, preserves_flags)) };
    (u64::from(hi) << 32) | u64::from(lo)
}

fn fail(what: core::fmt::Arguments<'_>) -> ! {
    crash_fmt(format_args!("pfbench: FAIL: {what}"))
}

/// Unmaps `n` small pages from `base` and frees their frames.
fn release(space: &mut AddressSpace, base: u64, n: u64) {
    paging::begin_batch();
    for i in 0..n {
        let va = base + i * PAGE_SIZE;
        match space.unmap(va, PageSize::Small) {
            Ok(e) => frames::free(e & pte::ADDR),
            Err(e) => fail(format_args!("unmap {va:#x}: {e}")),
        }
    }
    paging::end_batch();
}

fn main(args: Args) -> ! {
    let (mut pages, mut fork_pages, mut iterations) = (512u64, 64u64, 100u64);
    for word in args {
        let parsed = word.split_once('=').and_then(|(k, v)| Some((k, v.parse::<u64>().ok()?)));
        match parsed {
            Some(("pages", v)) if v > 0 => pages = v,
            Some(("forkpages", v)) if v > 0 => fork_pages = v,
            Some(("iterations", v)) if v > 0 => iterations = v,
            _ => fail(format_args!("usage: pfbench [pages=N] [forkpages=K] [iterations=R]")),
        }
    }
    frames::init_free_ram();
    if let Err(e) = paging::init_kernel() {
        fail(format_args!("kernel map: {e}"));
    }
    let mut base = AddressSpace::new().unwrap_or_else(|e| fail(format_args!("address space: {e}")));
    let start = lguest_guest::virt_to_phys(addr_of!(pfbench_user_start));
    let end = lguest_guest::virt_to_phys(addr_of!(pfbench_user_end));
    for pa in (start..end).step_by(PAGE_SIZE as usize) {
        if let Err(e) = base.map(USER_CODE + (pa - start), pa, PageSize::Small, pte::US) {
            fail(format_args!("mapping the program: {e}"));
        }
    }
    let stack = frames::alloc().unwrap_or_else(|| fail(format_args!("out of frames")));
    if let Err(e) = base.map(USER_STACK_TOP - PAGE_SIZE, stack, PageSize::Small, pte::US | pte::RW | pte::NX) {
        fail(format_args!("mapping the stack: {e}"));
    }
    base.activate();
    if let Err(e) = user::init() {
        fail(format_args!("user::init: {e}"));
    }
    println!("pfbench: pages {pages}, fork pages {fork_pages}, iterations {iterations}, tsc_khz {}", {
        lguest_guest::data::tsc_khz()
    });

    // (a) Demand paging from user mode.
    // SAFETY: nothing uses SPACE yet.
    unsafe { *SPACE.get() = Some(base) };
    DEMAND_END.store(DEMAND_BASE + pages * PAGE_SIZE, Ordering::Relaxed);
    user::set_fault_hook(Some(demand));
    let mut regs = UserRegs::new(USER_CODE, USER_STACK_TOP);
    regs.rdi = DEMAND_BASE;
    regs.rsi = pages;
    let exit = user::run(&regs);
    user::set_fault_hook(None);
    let Exit::Exited(cycles) = exit else { fail(format_args!("the user program died: {exit:x?}")) };
    let served = DEMAND_FAULTS.load(Ordering::Relaxed);
    if served != pages {
        fail(format_args!("{served} demand faults for {pages} pages"));
    }
    // SAFETY: the user program is gone; only main uses SPACE from now on.
    let mut base = unsafe { (*SPACE.get()).take() }.unwrap_or_else(|| fail(format_args!("no space")));
    release(&mut base, DEMAND_BASE, pages);
    println!("pfbench: fault_roundtrip_cycles={} pages={pages}", cycles / pages);

    // (b) Shadow faults alone: first touches of mapped pages, kernel mode.
    paging::begin_batch();
    for i in 0..pages {
        let pa = frames::alloc().unwrap_or_else(|| fail(format_args!("out of frames")));
        if let Err(e) = base.map(SHADOW_BASE + i * PAGE_SIZE, pa, PageSize::Small, pte::US | pte::RW | pte::NX) {
            fail(format_args!("map: {e}"));
        }
    }
    paging::end_batch();
    let t0 = rdtsc();
    for i in 0..pages {
        // SAFETY: the page is mapped writable to a frame we own.
        unsafe { ptr::write_volatile((SHADOW_BASE + i * PAGE_SIZE) as *mut u64, i) };
    }
    let shadow = (rdtsc() - t0) / pages;
    let t0 = rdtsc();
    for i in 0..pages {
        // SAFETY: as above; now the shadow entry exists.
        unsafe { ptr::write_volatile((SHADOW_BASE + i * PAGE_SIZE + 8) as *mut u64, i) };
    }
    let warm = (rdtsc() - t0) / pages;
    release(&mut base, SHADOW_BASE, pages);
    println!("pfbench: shadow_fault_cycles={shadow} warm_touch_cycles={warm} pages={pages}");

    // (c) Fork-like: build, fill, switch, touch, switch back, tear down.
    let t0 = rdtsc();
    let mut sum = 0u64;
    for r in 0..iterations {
        let mut child = AddressSpace::new().unwrap_or_else(|e| fail(format_args!("address space: {e}")));
        paging::begin_batch();
        for i in 0..fork_pages {
            let pa = frames::alloc().unwrap_or_else(|| fail(format_args!("out of frames")));
            // SAFETY: a fresh frame we own, identity mapped for the kernel.
            unsafe { ptr::write_volatile(pa as *mut u64, r ^ i) };
            if let Err(e) = child.map(FORK_BASE + i * PAGE_SIZE, pa, PageSize::Small, pte::US | pte::RW | pte::NX) {
                fail(format_args!("map: {e}"));
            }
        }
        paging::end_batch();
        child.activate();
        for i in 0..fork_pages {
            // SAFETY: mapped just above, to a frame holding `r ^ i`.
            sum += unsafe { ptr::read_volatile((FORK_BASE + i * PAGE_SIZE) as *const u64) } ^ r ^ i;
        }
        base.activate();
        for i in 0..fork_pages {
            let e = child.entry(FORK_BASE + i * PAGE_SIZE, 1).unwrap_or(0);
            if e & pte::A == 0 {
                fail(format_args!("fork page {i} was read but its entry {e:#x} has no A bit"));
            }
            frames::free(e & pte::ADDR);
        }
        if child.destroy().is_err() {
            fail(format_args!("could not tear the child down"));
        }
    }
    let fork = (rdtsc() - t0) / iterations;
    if sum != 0 {
        fail(format_args!("the child read wrong values (xor sum {sum:#x})"));
    }
    println!("pfbench: fork_cycles={fork} pages={fork_pages} iterations={iterations}");
    let (ptes, flushes, switches) = paging::stats();
    println!("pfbench: hypercalls: {ptes} SET_PTE, {flushes} flushes, {switches} NEW_PGTABLE");
    println!("pfbench: done");
    poweroff("pfbench: done")
}
