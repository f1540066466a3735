// SPDX-License-Identifier: GPL-2.0
//! The privileged instructions a kernel executes without a paravirt hook,
//! emulated for guest kernel mode: in ring 3 each raises #GP(0), and
//! [`privileged`] decodes the instruction at RIP and, for the few below,
//! does what the guest's virtual CPU would and skips it:
//!
//! - `in` and `out` with an immediate or DX port: reads give all ones (no
//!   device answers), writes are dropped. A guest's devices are on the
//!   lguest bus; port I/O is what a kernel does before it knows that (an
//!   8259 mask, a CMOS read, a POST port delay).
//! - `mov` from CR0, CR2 and CR4: virtual values ([`VIRT_CR0`]; CR2 the
//!   last page fault's address, `lguest_data.cr2`; CR4 from [`virt_cr4`]).
//! - `wbinvd`: nothing (the guest owns no cache-incoherent device).
//! - `xsetbv` of XCR0: a value the host's FPU mask allows, kept as the
//!   vCPU's XCR0; anything else is the #GP hardware gives. The CPU goes on
//!   with the host's XCR0 (see `guest-abi.rst`, "The FPU").
//!
//! Everything else, and all of these in guest user mode, stays the guest's
//! #GP.
//!
//! CPUID is not privileged, and is emulated in both guest modes ([`cpuid`]):
//! from the launcher's table (`LGUEST_SET_CPUID`) if it set one, else the
//! host CPU's values. It reaches the host two ways: as the #GP(0) of a plain
//! `cpuid` when the launcher made CPUID fault for its vCPU thread
//! (`arch_prctl(ARCH_SET_CPUID, 0)`; hosts with CPUID faulting), and as the
//! #UD of the forced-emulation prefix ([`forced`]) on any host.
//!
//! The instruction bytes are read once from guest memory into a local
//! buffer, then decoded; nothing is read twice.

use kernel::prelude::*;

use crate::{
    gmem::PAGE_SIZE,
    helpers,
    kill::Kill,
    switcher::Switcher,
    uapi::{
        self,
        LguestCpuidEntry,
        LguestRegs, //
    },
    vcpu::Ctx,
};

/// The guest's CR0 as `mov` from CR0 reads it: PE, MP, ET, NE, WP, AM, PG
/// (a native Linux kernel's value; TS is never set, the FPU is always the
/// guest's).
pub(crate) const VIRT_CR0: u64 = 0x8005_0033;

/// CR4 bits a guest sees: PAE, OSFXSR and OSXMMEXCPT always (the guest's
/// tables are 4-level long-mode tables, and SSE and its exceptions work),
/// and OSXSAVE and FSGSBASE as the host has them (the guest runs under the
/// host's CR4, so those instructions work exactly when the host enabled
/// them).
const CR4_PAE: u64 = 1 << 5;
const CR4_OSFXSR: u64 = 1 << 9;
const CR4_OSXMMEXCPT: u64 = 1 << 10;
const CR4_FSGSBASE: u64 = 1 << 16;
const CR4_OSXSAVE: u64 = 1 << 18;

/// The guest's CR4 as `mov` from CR4 reads it.
pub(crate) fn virt_cr4() -> u64 {
    CR4_PAE | CR4_OSFXSR | CR4_OSXMMEXCPT | (helpers::read_cr4() & (CR4_FSGSBASE | CR4_OSXSAVE))
}

/// XCR0 components: x87, SSE, AVX, and AVX-512's three.
const XCR0_X87: u64 = 1;
const XCR0_SSE: u64 = 2;
const XCR0_AVX: u64 = 4;
const XCR0_AVX512: u64 = 0xe0;

/// Whether `v` is an XCR0 value hardware would take, within `allowed`
/// (the components of a guest's FPU state).
pub(crate) fn xcr0_valid(v: u64, allowed: u64) -> bool {
    v & XCR0_X87 != 0
        && v & !allowed == 0
        && (v & XCR0_AVX == 0 || v & XCR0_SSE != 0)
        && (v & XCR0_AVX512 == 0 || (v & XCR0_AVX512 == XCR0_AVX512 && v & XCR0_AVX != 0))
}

/// One decoded instruction we emulate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Insn {
    /// `in` into AL, AX or EAX (`bytes` 1, 2 or 4).
    In {
        bytes: u8,
    },
    /// `out`.
    Out,
    /// `mov` from control register `cr` into general register `gpr`.
    MovFromCr {
        cr: u8,
        gpr: u8,
    },
    Wbinvd,
    Xsetbv,
    Cpuid,
}

/// Decodes the instruction in `code`: what it is and its length, or
/// `None` for anything not emulated.
fn decode(code: &[u8]) -> Option<(Insn, usize)> {
    let mut i = 0;
    let mut opsize16 = false;
    while code.get(i) == Some(&0x66) {
        opsize16 = true;
        i += 1;
    }
    let mut rex = 0u8;
    if let Some(&b @ 0x40..=0x4f) = code.get(i) {
        rex = b;
        i += 1;
    }
    let wide = if opsize16 { 2 } else { 4 };
    let insn = match *code.get(i)? {
        0xe4 => (Insn::In { bytes: 1 }, i + 2),
        0xe5 => (Insn::In { bytes: wide }, i + 2),
        0xec => (Insn::In { bytes: 1 }, i + 1),
        0xed => (Insn::In { bytes: wide }, i + 1),
        0xe6 | 0xe7 => (Insn::Out, i + 2),
        0xee | 0xef => (Insn::Out, i + 1),
        0x0f => match *code.get(i + 1)? {
            0x09 => (Insn::Wbinvd, i + 2),
            0xa2 => (Insn::Cpuid, i + 2),
            0x20 => {
                // mov r64, CRn: the r/m field is always a register.
                let modrm = *code.get(i + 2)?;
                let cr = ((modrm >> 3) & 7) | ((rex & 4) << 1);
                let gpr = (modrm & 7) | ((rex & 1) << 3);
                (Insn::MovFromCr { cr, gpr }, i + 3)
            }
            0x01 if *code.get(i + 2)? == 0xd1 => (Insn::Xsetbv, i + 3),
            _ => return None,
        },
        _ => return None,
    };
    (insn.1 <= code.len()).then_some(insn)
}

/// Reads up to 15 instruction bytes at `rip` into `code`: how many.
/// An instruction that ran to a fault was fetched whole, so its bytes are
/// mapped; if the 15 bytes reach an unmapped page, those to the end of
/// this one are enough for every instruction here. `None`: unreadable.
fn fetch(cx: &Ctx<'_>, rip: u64, code: &mut [u8; 15]) -> Option<usize> {
    if cx.read_va(rip, code).is_ok() {
        return Some(code.len());
    }
    let n = core::cmp::min(code.len(), (PAGE_SIZE - rip % PAGE_SIZE) as usize);
    cx.read_va(rip, &mut code[..n]).ok().map(|_| n)
}

/// CPUID for the guest, with EAX and ECX in `r` its leaf and subleaf: the
/// four results from `table`, or from the host CPU if it is empty. As on
/// hardware, the upper halves of the four registers are cleared, and leaf
/// 0xD's EBX is the XSAVE size for the vCPU's XCR0 `xcr0` (not the host's).
fn cpuid(r: &mut LguestRegs, table: &[LguestCpuidEntry], xcr0: u64) {
    let (leaf, subleaf) = (r.rax as u32, r.rcx as u32);
    let lookup = |leaf, subleaf| {
        if table.is_empty() {
            helpers::cpuid(leaf, subleaf)
        } else {
            uapi::cpuid_lookup(table, leaf, subleaf)
        }
    };
    let mut v = lookup(leaf, subleaf);
    if leaf == 0xd && subleaf == 0 {
        v[1] = uapi::xsave_size(xcr0, |i| lookup(0xd, i));
    }
    r.rax = v[0].into();
    r.rbx = v[1].into();
    r.rcx = v[2].into();
    r.rdx = v[3].into();
}

/// The #UD the vCPU took (in either mode): if the bytes at RIP are a
/// forced-emulation prefix (lguest's or KVM's) and `cpuid`, emulates it and
/// moves RIP past both. `false`: the #UD stands.
pub(crate) fn forced(cx: &mut Ctx<'_>) -> bool {
    const P: usize = uapi::LGUEST_EMULATE_PREFIX_LEN;
    let rip = cx.vcpu.cpu.regs.rip;
    let mut code = [0u8; 15];
    let Some(n) = fetch(cx, rip, &mut code) else {
        return false;
    };
    if n < P
        || (code[..P] != uapi::LGUEST_EMULATE_PREFIX
            && code[..P] != uapi::LGUEST_KVM_EMULATE_PREFIX)
    {
        return false;
    }
    match decode(&code[P..n]) {
        Some((Insn::Cpuid, len)) => {
            let xcr0 = cx.vcpu.xcr0;
            let r = &mut cx.vcpu.cpu.regs;
            cpuid(r, cx.cpuid, xcr0);
            r.rip = rip + (P + len) as u64;
            true
        }
        _ => false,
    }
}

/// The #GP(0) the vCPU took: emulates the instruction at RIP if it is one
/// of ours (in guest user mode, only CPUID). `Ok(true)`: done, RIP is past
/// it; `Ok(false)`: the #GP stands.
pub(crate) fn privileged(cx: &mut Ctx<'_>) -> Result<bool, Kill> {
    let rip = cx.vcpu.cpu.regs.rip;
    let mut code = [0u8; 15];
    let Some(n) = fetch(cx, rip, &mut code) else {
        return Ok(false);
    };
    let Some((insn, len)) = decode(&code[..n]) else {
        return Ok(false);
    };
    if cx.vcpu.cpu.user_mode && insn != Insn::Cpuid {
        return Ok(false);
    }
    let allowed = Switcher::get().map(|s| s.xsave_mask()).unwrap_or(0);
    let cr2 = match (insn, cx.vcpu.lguest_data) {
        (Insn::MovFromCr { cr: 2, .. }, Some(ld)) => ld.cr2(cx.mem)?,
        _ => 0,
    };
    let v = &mut *cx.vcpu;
    let r = &mut v.cpu.regs;
    match insn {
        Insn::In { bytes: 1 } => r.rax |= 0xff,
        Insn::In { bytes: 2 } => r.rax |= 0xffff,
        // A 32-bit destination clears the upper half, as for any 32-bit
        // operation.
        Insn::In { .. } => r.rax = 0xffff_ffff,
        Insn::Out | Insn::Wbinvd => {}
        Insn::MovFromCr { cr, gpr } => {
            let value = match cr {
                0 => VIRT_CR0,
                2 => cr2,
                4 => virt_cr4(),
                _ => return Ok(false),
            };
            let slot = match gpr {
                0 => &mut r.rax,
                1 => &mut r.rcx,
                2 => &mut r.rdx,
                3 => &mut r.rbx,
                4 => &mut r.rsp,
                5 => &mut r.rbp,
                6 => &mut r.rsi,
                7 => &mut r.rdi,
                8 => &mut r.r8,
                9 => &mut r.r9,
                10 => &mut r.r10,
                11 => &mut r.r11,
                12 => &mut r.r12,
                13 => &mut r.r13,
                14 => &mut r.r14,
                _ => &mut r.r15,
            };
            *slot = value;
        }
        Insn::Cpuid => cpuid(r, cx.cpuid, v.xcr0),
        Insn::Xsetbv => {
            let value = (r.rdx << 32) | (r.rax & 0xffff_ffff);
            if r.rcx & 0xffff_ffff != 0 || !xcr0_valid(value, allowed) {
                return Ok(false);
            }
            v.xcr0 = value;
        }
    }
    v.cpu.regs.rip = rip + len as u64;
    Ok(true)
}
