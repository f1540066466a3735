// SPDX-License-Identifier: GPL-2.0
//! Shadow paging: the guest's own page tables, and the shadow tables the
//! hardware really walks.
//!
//! A guest boots on the linear map `Vm::create` builds. With
//! `LHCALL_NEW_PGTABLE` it hands over its own 4-level page table (in its
//! RAM); from then on the lower half of the shadow table starts empty and is
//! filled on demand: a page fault in the guest makes [`demand_page`] walk the
//! guest's tables (reading each entry once, checking it), and either install
//! a shadow entry for that one 4 KiB page or reflect the fault to the guest.
//! Accessed and dirty bits are emulated: the host sets them in the guest's
//! entries, and maps a clean writable page read-only until it is written.
//! Large guest pages (2 MiB, 1 GiB) are split into 4 KiB shadow entries.
//!
//! Guest kernel and guest user mode both run in ring 3, so the hardware
//! cannot tell them apart: each guest root has two shadow tables
//! (`ShadowPair` in `shadow.rs`). The kernel table maps every page the guest's
//! tables map; the user table only pages whose entries have the U/S bit at
//! every level, so guest user code cannot reach guest kernel memory. A
//! fault in user mode on a supervisor page is reflected to the guest kernel
//! as a protection fault with the U bit in the error code, as hardware
//! would report it.
//!
//! A few roots' shadows are kept (`ROOT_CACHE`), so a guest switching
//! between address spaces with `LHCALL_NEW_PGTABLE` does not start from an
//! empty shadow each time. The price is the paravirtual contract lguest
//! had: the guest tells the host about every change to any of its tables,
//! current or not. `LHCALL_SET_PTE` drops that page's shadow entries in
//! every root (a table may be shared), `LHCALL_SET_PMD`, `LHCALL_SET_PGD`,
//! `LHCALL_FLUSH_TLB` and `LHCALL_NEW_PGTABLE` of the current root drop
//! every shadow. The number of shadow table pages is bounded: past
//! `shadow::budget_for` (all roots together) the cached roots are dropped,
//! then the current one, so a guest cannot make the host allocate without
//! bound.
//!
//! Guest page tables live in guest RAM and are read through the launcher's
//! mapping, as every host access to guest memory is. A guest entry that
//! points outside guest RAM kills the guest. Called from the run loop and
//! the hypercalls, with the VM's mutex held.

use kernel::prelude::*;

use crate::{
    gmem::{
        GuestMemory,
        PAGE_SIZE,
        PTE_A,
        PTE_ADDR,
        PTE_D,
        PTE_NX,
        PTE_P,
        PTE_RW,
        PTE_US, //
    },
    kill::{
        kill,
        Kill, //
    },
    shadow::{
        SHADOW_FROM_1G,
        SHADOW_FROM_2M, //
    },
    switcher::Switcher,
    uapi,
    vcpu::Ctx,
};

/// Page-size bit of PDPT and PD entries.
const PTE_PS: u64 = 1 << 7;
/// Global bit of a leaf entry.
const PTE_G: u64 = 1 << 8;
/// Page-fault error code bits.
const PF_PRESENT: u64 = 1;
const PF_WRITE: u64 = 2;
const PF_USER: u64 = 4;
const PF_INSTR: u64 = 16;

/// What to do with a guest page fault.
pub(crate) enum Fault {
    /// The shadow now maps the page: run the guest again.
    Fixed,
    /// A genuine guest fault: reflect it with this error code.
    Reflect(u64),
}

/// Reads one guest page-table entry (8 bytes at guest-physical `gpa`).
fn read_entry(mem: &GuestMemory, gpa: u64) -> Result<u64, Kill> {
    match mem.read_u64(gpa) {
        Ok(e) => Ok(e),
        Err(_) => kill!("guest page table entry at {gpa:#x} is not in guest memory"),
    }
}

/// Writes back a guest entry whose A/D bits we set.
fn write_entry(mem: &GuestMemory, gpa: u64, v: u64) -> Result<(), Kill> {
    if mem.write_u64(gpa, v).is_err() {
        return kill!("guest page table entry at {gpa:#x} is not writable");
    }
    Ok(())
}

/// Checks that a guest entry's frame lies in guest RAM.
fn frame_in_ram(
    mem: &GuestMemory,
    entry: u64,
    size: u64,
    what: &str,
    va: u64,
) -> Result<u64, Kill> {
    let base = entry & PTE_ADDR & !(size - 1);
    if base.checked_add(size).map_or(true, |end| end > mem.size()) {
        return kill!("guest {what} entry {entry:#x} for {va:#x} points outside guest memory");
    }
    Ok(base)
}

/// `LHCALL_NEW_PGTABLE(gpa, tag)`: the guest's top-level table is now at
/// `gpa`. Another root's cached shadow is reused; the current root again
/// means a flush (as reloading CR3 flushes the TLB). Under TLB semantics
/// `tag` is what a CR3 write carries besides the address: a PCID in bits
/// 0-11 and [`uapi::LGUEST_PGTABLE_NOFLUSH`] (before `LGUEST_INIT`, and
/// without TLB semantics, it is ignored).
pub(crate) fn new_pgtable(cx: &mut Ctx<'_>, gpa: u64, tag: u64) -> Result<(), Kill> {
    if gpa % PAGE_SIZE != 0
        || gpa
            .checked_add(PAGE_SIZE)
            .map_or(true, |e| e > cx.mem.size())
    {
        return kill!("NEW_PGTABLE: bad page table address {gpa:#x}");
    }
    if cx.shadows.tlb_mode() {
        if tag & !(uapi::LGUEST_PGTABLE_PCID_MASK | uapi::LGUEST_PGTABLE_NOFLUSH) != 0 {
            return kill!("NEW_PGTABLE: bad PCID and flags {tag:#x}");
        }
        let pcid = (tag & uapi::LGUEST_PGTABLE_PCID_MASK) as u16;
        let noflush = tag & uapi::LGUEST_PGTABLE_NOFLUSH != 0;
        if cx.shadows.switch_root_tlb(gpa, pcid, noflush).is_err() {
            return kill!("out of memory for a new shadow page table");
        }
        return Ok(());
    }
    if cx.shadows.guest_root() == Some(gpa) {
        // The current root again: a flush, of non-global pages only under
        // TLB semantics (as a CR3 write without PCIDs).
        if cx.shadows.tlb_mode() {
            return tlb_flush(cx, false);
        }
        return flush(cx);
    }
    if cx.shadows.switch_root(gpa).is_err() {
        return kill!("out of memory for a new shadow page table");
    }
    Ok(())
}

/// Drops every shadow, current and cached (refilled on demand).
pub(crate) fn flush(cx: &mut Ctx<'_>) -> Result<(), Kill> {
    if cx.shadows.guest_root().is_none() {
        // Still on the linear map, which never changes.
        return Ok(());
    }
    if cx.shadows.reset().is_err() {
        return kill!("out of memory for a new shadow page table");
    }
    Ok(())
}

/// Under TLB semantics, `LHCALL_FLUSH_TLB(global)`: every non-global
/// mapping goes, and with `global` the shared upper half too.
pub(crate) fn tlb_flush(cx: &mut Ctx<'_>, global: bool) -> Result<(), Kill> {
    if cx.shadows.guest_root().is_none() {
        return Ok(());
    }
    if cx.shadows.tlb_flush(global).is_err() {
        return kill!("out of memory for a new shadow page table");
    }
    Ok(())
}

/// `LHCALL_INVLPG(va)`: under TLB semantics the page's shadow goes from
/// the current root and the shared upper half; otherwise as `SET_PTE`.
pub(crate) fn invlpg(cx: &mut Ctx<'_>, va: u64) -> Result<(), Kill> {
    if !cx.shadows.tlb_mode() {
        return set_pte(cx, va);
    }
    if cx.shadows.guest_root().is_some()
        && uapi::guest_va_ok(va)
        && cx.shadows.invlpg(va & !(PAGE_SIZE - 1)).is_err()
    {
        return kill!("out of memory for a new shadow page table");
    }
    Ok(())
}

/// `LHCALL_SET_PTE(pgdir, va, pte)`: one entry changed: forget its page.
pub(crate) fn set_pte(cx: &mut Ctx<'_>, va: u64) -> Result<(), Kill> {
    if cx.shadows.guest_root().is_none() || !uapi::guest_va_ok(va) {
        return Ok(());
    }
    cx.shadows.unmap(va & !(PAGE_SIZE - 1));
    Ok(())
}

/// What a walk of the guest's tables found for one page.
pub(crate) struct Walk {
    /// (guest-physical address, value) of the entry read at each level, top
    /// first; `entries[..=last]` are valid.
    entries: [(u64, u64); 4],
    last: usize,
    /// Guest-physical address of the 4 KiB page that `va` lies in.
    pub(crate) gpa: u64,
    /// Writable, no-execute and user-accessible, over all levels.
    writable: bool,
    nx: bool,
    user: bool,
}

/// Walks the guest's 4-level tables at `root` for address `va` (bits 47 to
/// 12 index them; the upper half is slots 256-511 of the top level).
/// `Ok(None)`: not present. Entries are read once each and checked; an
/// entry that points outside guest RAM kills the guest.
pub(crate) fn walk(mem: &GuestMemory, root: u64, va: u64) -> Result<Option<Walk>, Kill> {
    let mut table = root;
    let mut writable = true;
    let mut nx = false;
    let mut user = true;
    let mut entries: [(u64, u64); 4] = [(0, 0); 4];
    for (i, level) in (1..=4u32).rev().enumerate() {
        let shift = 12 + 9 * (level - 1);
        let at = table + 8 * ((va >> shift) & 511);
        let e = read_entry(mem, at)?;
        if e & PTE_P == 0 {
            return Ok(None);
        }
        entries[i] = (at, e);
        writable &= e & PTE_RW != 0;
        nx |= e & PTE_NX != 0;
        user &= e & PTE_US != 0;
        if level == 1 || (e & PTE_PS != 0 && level <= 3) {
            let size = 1u64 << shift;
            let base = frame_in_ram(mem, e, size, "page", va)?;
            let gpa = base + (va & (size - 1) & !(PAGE_SIZE - 1));
            return Ok(Some(Walk {
                entries,
                last: i,
                gpa,
                writable,
                nx,
                user,
            }));
        }
        if level == 4 && e & PTE_PS != 0 {
            return kill!("guest top-level entry {e:#x} for {va:#x} has the page-size bit");
        }
        table = frame_in_ram(mem, e, PAGE_SIZE, "table", va)?;
    }
    kill!("guest page walk for {va:#x} found no page")
}

/// Handles a page fault of the vCPU at `va` with hardware error code
/// `error` (always a ring-3 fault): walks the guest's tables and maps the
/// page, or says to reflect the fault with the error code the guest's own
/// hardware would give (the U bit says whether it was in user mode).
pub(crate) fn demand_page(cx: &mut Ctx<'_>, va: u64, error: u64) -> Result<Fault, Kill> {
    let user_mode = cx.vcpu.cpu.user_mode;
    let write = error & PF_WRITE != 0;
    let fetch = error & PF_INSTR != 0;
    // The guest sees its own view: present only if its tables map the page.
    let guest_error = |present: bool| {
        (error & (PF_WRITE | PF_INSTR))
            | if user_mode { PF_USER } else { 0 }
            | if present { PF_PRESENT } else { 0 }
    };
    let Some(root) = cx.shadows.guest_root() else {
        // The linear map never changes: this is the guest's own fault.
        return Ok(Fault::Reflect(guest_error(error & PF_PRESENT != 0)));
    };
    // The last lower-half page and the guard hole are never mapped (see
    // `uapi::GUEST_VA_END` and `uapi::GUEST_UPPER_START`).
    if !uapi::guest_va_ok(va) {
        return Ok(Fault::Reflect(guest_error(false)));
    }

    let Some(Walk {
        entries,
        last,
        gpa,
        writable,
        nx,
        user,
    }) = walk(cx.mem, root, va)?
    else {
        return Ok(Fault::Reflect(guest_error(false)));
    };
    if va >> 63 != 0 && !Switcher::get().is_ok_and(|s| s.upper_half_ok()) {
        return kill!(
            "the guest maps {va:#x}: this host has LASS on, and no upper half for guests"
        );
    }
    // CR0.WP=1: writes need RW at every level in kernel mode too. There is
    // no SMEP or SMAP: the guest kernel may touch user pages.
    if (write && !writable) || (fetch && nx) || (user_mode && !user) {
        return Ok(Fault::Reflect(guest_error(true)));
    }

    // Accessed bits on the way, dirty on the page if this is a write.
    for (i, &(at, e)) in entries[..=last].iter().enumerate() {
        let mut v = e | PTE_A;
        if i == last && write {
            v |= PTE_D;
        }
        if v != e {
            write_entry(cx.mem, at, v)?;
        }
    }
    let dirty = write || entries[last].1 & PTE_D != 0;
    if last == 3 {
        // First, so that the faulting page, mapped last, is surely there
        // if one of them makes the shadows start over at their budget.
        fault_around(cx, va, &entries, user_mode)?;
    }
    let Some(phys) = cx.mem.host_phys(gpa / PAGE_SIZE) else {
        return kill!("guest page {gpa:#x} for {va:#x} is not in guest memory");
    };
    let mut pte = phys | PTE_P | PTE_US | PTE_A;
    if writable && dirty {
        pte |= PTE_RW | PTE_D;
    }
    if nx {
        pte |= PTE_NX;
    }
    // Which guest page size it came from: entries[3] is a 4 KiB leaf,
    // entries[2] a 2 MiB one, entries[1] 1 GiB (see `Shadows::invlpg`).
    pte |= match last {
        2 => SHADOW_FROM_2M,
        1 => SHADOW_FROM_1G,
        _ => 0,
    };
    if cx
        .shadows
        .map(
            va & !(PAGE_SIZE - 1),
            pte,
            user_mode,
            entries[last].1 & PTE_G != 0,
        )
        .is_err()
    {
        return kill!("out of memory for shadow page tables");
    }
    Ok(Fault::Fixed)
}

/// Pages [`fault_around`] maps with a faulting one: the aligned group of
/// leaf entries around it (64 KiB, as Linux's own `fault_around_bytes`).
const FAULT_AROUND: u64 = 16;

/// Maps, with the 4 KiB page at `va` that faulted, its neighbours in the
/// same guest leaf table (`entries`: the walk that found `va`) that the
/// guest has already used: present with the accessed bit set (writable
/// only if dirty too), so that no guest entry is written, and so that a
/// working set refills after a root switch or a flush in one exit per
/// group rather than one per page. A TLB may cache any present
/// translation at any time, so this is allowed under TLB semantics; under
/// the report-every-change contract every change drops the page anyway.
/// An entry that cannot be mapped as it is (outside RAM, not user in a
/// user fault, a page never mapped to guests) is left to fault itself.
fn fault_around(
    cx: &mut Ctx<'_>,
    va: u64,
    entries: &[(u64, u64); 4],
    user_mode: bool,
) -> Result<(), Kill> {
    let upper_rw = entries[..3].iter().all(|&(_, e)| e & PTE_RW != 0);
    let upper_nx = entries[..3].iter().any(|&(_, e)| e & PTE_NX != 0);
    let upper_us = entries[..3].iter().all(|&(_, e)| e & PTE_US != 0);
    let table = entries[3].0 & !(PAGE_SIZE - 1);
    let first = (va >> 12) & 511 & !(FAULT_AROUND - 1);
    for i in first..first + FAULT_AROUND {
        let nva = (va & !(512 * PAGE_SIZE - 1)) | i << 12;
        if nva == va & !(PAGE_SIZE - 1) || !uapi::guest_va_ok(nva) {
            continue;
        }
        let e = read_entry(cx.mem, table + 8 * i)?;
        if e & (PTE_P | PTE_A) != PTE_P | PTE_A || (user_mode && !(upper_us && e & PTE_US != 0)) {
            continue;
        }
        let Some(phys) = cx.mem.host_phys((e & PTE_ADDR) / PAGE_SIZE) else {
            continue;
        };
        let mut pte = phys | PTE_P | PTE_US | PTE_A;
        if upper_rw && e & (PTE_RW | PTE_D) == PTE_RW | PTE_D {
            pte |= PTE_RW | PTE_D;
        }
        if upper_nx || e & PTE_NX != 0 {
            pte |= PTE_NX;
        }
        if cx.shadows.map(nva, pte, user_mode, e & PTE_G != 0).is_err() {
            return kill!("out of memory for shadow page tables");
        }
    }
    Ok(())
}

/// The guest-physical address of guest-virtual `[va, va + len)`, if it is
/// mapped: on the linear map (`root` is `None`) RAM above 1 MiB, virtual
/// equal to physical; with the guest's own tables at `root`, by walking
/// them (the range must not cross a page).
pub(crate) fn va_to_gpa(mem: &GuestMemory, root: Option<u64>, va: u64, len: usize) -> Option<u64> {
    let end = va.checked_add(len as u64)?;
    let Some(root) = root else {
        return (va >= uapi::LGUEST_LOAD_MIN && end <= mem.size()).then_some(va);
    };
    if !uapi::guest_va_ok(va) || (va / PAGE_SIZE) != ((end - 1) / PAGE_SIZE) {
        return None;
    }
    let page = walk(mem, root, va).ok().flatten()?.gpa;
    Some(page + va % PAGE_SIZE)
}

/// Copies guest-virtual memory at `va` into `buf`, page by page.
pub(crate) fn read_va(mem: &GuestMemory, root: Option<u64>, va: u64, buf: &mut [u8]) -> Result {
    let mut done = 0;
    while done < buf.len() {
        let at = va.checked_add(done as u64).ok_or(EFAULT)?;
        let n = core::cmp::min(buf.len() - done, (PAGE_SIZE - at % PAGE_SIZE) as usize);
        let gpa = va_to_gpa(mem, root, at, n).ok_or(EFAULT)?;
        mem.read(gpa, &mut buf[done..done + n])?;
        done += n;
    }
    Ok(())
}

/// Copies `data` to guest-virtual memory at `va`, page by page.
pub(crate) fn write_va(mem: &GuestMemory, root: Option<u64>, va: u64, data: &[u8]) -> Result {
    let mut done = 0;
    while done < data.len() {
        let at = va.checked_add(done as u64).ok_or(EFAULT)?;
        let n = core::cmp::min(data.len() - done, (PAGE_SIZE - at % PAGE_SIZE) as usize);
        let gpa = va_to_gpa(mem, root, at, n).ok_or(EFAULT)?;
        mem.write(gpa, &data[done..done + n])?;
        done += n;
    }
    Ok(())
}
