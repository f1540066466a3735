// SPDX-License-Identifier: GPL-2.0
//! Interrupts and traps for the guest: its IDT, delivery of interrupts and
//! reflected exceptions onto its stack, the `irq_pending` flag, and HALT.
//!
//! The guest runs with the hardware's interrupt flag always on; its own,
//! virtual, IF is `lguest_data.irq_enabled`. Before every entry the run
//! loop calls [`maybe_deliver`]: with an interrupt pending and not blocked,
//! it is delivered if the guest has interrupts on, and otherwise
//! `irq_pending` is set so that the guest, on re-enabling, asks for it at
//! once with `LHCALL_SEND_INTERRUPTS` (the 2009 fix that made lguest's
//! network 4.5 times faster). The flag is cleared only when nothing
//! deliverable remains.
//!
//! Delivery builds the frame 64-bit hardware would build, on the guest's
//! current stack, and jumps to the handler the guest registered with
//! `LHCALL_LOAD_IDT_ENTRY`. Never at the guest's `iretq` (`noirq_iret`):
//! there the guest has already restored its virtual IF for the frame it is
//! returning through. Everything here runs in the run loop, with the VM
//! mutex held, on the [`Ctx`] of the vCPU concerned (lguest's
//! `interrupts_and_traps.c`).

use kernel::prelude::*;

use crate::{
    kill::{
        kill,
        trap_name,
        Kill, //
    },
    lguest_data::LguestData,
    switcher::GuestCpu,
    uapi,
    vcpu::Ctx,
};

/// The first guest vector of IRQ 0 (as on PCs, after the 32 exceptions).
pub(crate) const FIRST_IRQ_VECTOR: u64 = 32;
/// Gate types of `LHCALL_LOAD_IDT_ENTRY`.
const GATE_INTERRUPT: u64 = 0xE;
const GATE_TRAP: u64 = 0xF;
/// RFLAGS.TF and NT, which delivery through a gate clears.
const X86_EFLAGS_TF: u64 = 0x100;
const X86_EFLAGS_NT: u64 = 0x4000;

/// One entry of the guest's IDT.
#[derive(Clone, Copy, Default)]
pub(crate) struct GuestGate {
    /// Handler address (guest-virtual); 0: none.
    handler: u64,
    /// Interrupt gate: delivery turns virtual interrupts off.
    interrupt: bool,
}

/// Whether exception `vector` pushes an error code.
fn has_error_code(vector: u64) -> bool {
    matches!(vector, 8 | 10..=14 | 17 | 21 | 29 | 30)
}

/// `LHCALL_LOAD_IDT_ENTRY(vector, handler, type)`.
pub(crate) fn load_idt_entry(
    cx: &mut Ctx<'_>,
    vector: u64,
    handler: u64,
    kind: u64,
) -> Result<(), Kill> {
    if vector > 255 {
        return kill!("LOAD_IDT_ENTRY: bad vector {vector}");
    }
    if matches!(vector, 2 | 8 | 18) || vector == uapi::LGUEST_TRAP_ENTRY as u64 {
        return kill!("LOAD_IDT_ENTRY: vector {vector} belongs to the host");
    }
    if !uapi::guest_va_ok(handler) {
        return kill!(
            "LOAD_IDT_ENTRY: handler {handler:#x} for vector {vector} is not a guest address"
        );
    }
    let interrupt = match kind {
        GATE_INTERRUPT => true,
        GATE_TRAP => false,
        _ => return kill!("LOAD_IDT_ENTRY: bad gate type {kind:#x} for vector {vector}"),
    };
    cx.vcpu.idt[vector as usize] = GuestGate { handler, interrupt };
    Ok(())
}

/// Sets `irq_pending` as given, writing guest memory only on a change.
fn set_irq_pending(cx: &mut Ctx<'_>, ld: LguestData, on: bool) -> Result<(), Kill> {
    if cx.vcpu.irq_pending_set != on {
        ld.set_irq_pending(cx.mem, on)?;
        cx.vcpu.irq_pending_set = on;
    }
    Ok(())
}

/// Delivers `vector` to the guest's handler, with `error` pushed if the
/// vector has one. `Ok(false)`: the guest has no handler for it.
///
/// From guest kernel mode the frame goes on the current stack. From guest
/// user mode it goes on the kernel stack (`LHCALL_SET_STACK`), its CS and
/// SS are the user ones (`Vcpu::frame_selectors`), and the guest is in
/// kernel mode afterwards
/// (the kernel shadow table is used from the next entry on).
pub(crate) fn deliver(cx: &mut Ctx<'_>, vector: u64, error: u64) -> Result<bool, Kill> {
    let gate = cx.vcpu.idt[(vector & 255) as usize];
    if gate.handler == 0 {
        return Ok(false);
    }
    let error = has_error_code(vector).then_some(error);
    enter_kernel(cx, vector, error, gate.handler, gate.interrupt, None)
}

/// A return to user mode that the CPU's `iretq` would refuse, the guest
/// already in user mode at the return's state: the #GP(`error`) goes to
/// the guest kernel as taken there, its frame with the return's own `cs`
/// and `ss` (RPL 3, so a Linux guest's `user_mode(regs)` holds), as
/// native Linux's `fixup_bad_iret` builds it; the process then gets its
/// SIGSEGV. Without a #GP handler the guest is killed.
pub(crate) fn bad_user_return(cx: &mut Ctx<'_>, error: u64, cs: u64, ss: u64) -> Result<(), Kill> {
    let gate = cx.vcpu.idt[13];
    if gate.handler != 0
        && enter_kernel(
            cx,
            13,
            Some(error),
            gate.handler,
            gate.interrupt,
            Some((cs, ss)),
        )?
    {
        return Ok(());
    }
    let rip = cx.vcpu.cpu.regs.rip;
    kill!("a return to user mode at rip {rip:#x} raised #GP({error:#x}), and the guest has no #GP handler")
}

/// A user-mode `syscall` at RIP (the host saw its #UD): enters the guest
/// kernel at its `LHCALL_SET_SYSCALL` entry as described there.
/// `Ok(false)`: no entry, or not `syscall` at RIP (the #UD stands).
fn deliver_syscall(cx: &mut Ctx<'_>) -> Result<bool, Kill> {
    let v = &*cx.vcpu;
    let (entry, rip) = (v.syscall_entry, v.cpu.regs.rip);
    if entry == 0 || !v.cpu.user_mode || !syscall_at_rip(cx) {
        return Ok(false);
    }
    let user_flags = GuestCpu::sanitize_flags(cx.vcpu.cpu.regs.rflags) | uapi::X86_EFLAGS_IF;
    if cx.vcpu.syscall_direct {
        // The native contract, as the switcher's direct switch makes it
        // where it can: RSP untouched, nothing pushed, the kernel's GS
        // base, no flag but IF.
        let Some(ld) = cx.vcpu.lguest_data else {
            return Ok(false);
        };
        ld.set_irq_enabled(cx.mem, false)?;
        let cpu = &mut cx.vcpu.cpu;
        cpu.set_mode(false);
        cpu.regs.rip = entry;
        cpu.regs.rcx = rip + 2;
        cpu.regs.r11 = user_flags;
        cpu.regs.rflags = GuestCpu::sanitize_flags(0);
        return Ok(true);
    }
    cx.vcpu.cpu.regs.rip = rip + 2;
    if !enter_kernel(cx, SYSCALL_EVENT, None, entry, true, None)? {
        return Ok(false);
    }
    let r = &mut cx.vcpu.cpu.regs;
    r.rcx = rip + 2;
    r.r11 = user_flags;
    Ok(true)
}

/// A guest-kernel `syscall` at RIP (the host saw its #UD) of a kernel with
/// a direct entry: a hypercall, as the switcher makes it where the direct
/// system call is armed. RIP moves past it, RCX and R11 as the instruction
/// leaves them. `Ok(false)`: not that (the #UD stands).
pub(crate) fn syscall_hypercall(cx: &mut Ctx<'_>) -> Result<bool, Kill> {
    if !cx.vcpu.syscall_direct || cx.vcpu.cpu.user_mode || !syscall_at_rip(cx) {
        return Ok(false);
    }
    let rip = cx.vcpu.cpu.regs.rip;
    let r = &mut cx.vcpu.cpu.regs;
    r.rip = rip + 2;
    r.rcx = rip + 2;
    r.r11 = GuestCpu::sanitize_flags(r.rflags);
    Ok(true)
}

/// Whether the guest's instruction at RIP is `syscall` (`0f 05`).
fn syscall_at_rip(cx: &Ctx<'_>) -> bool {
    let mut insn = [0u8; 2];
    cx.read_va(cx.vcpu.cpu.regs.rip, &mut insn).is_ok() && insn == [0x0f, 0x05]
}

/// The pseudo-vector of a `syscall` event, for messages.
const SYSCALL_EVENT: u64 = 0x100;

/// Enters the guest kernel at `handler` for event `vector` (pushing `error`
/// if there is one), as [`deliver`] describes; `interrupt`: virtual
/// interrupts off (an interrupt gate, or `syscall`); `selectors`: the CS
/// and SS of the frame, if not those of the mode the event came from.
fn enter_kernel(
    cx: &mut Ctx<'_>,
    vector: u64,
    error: Option<u64>,
    handler: u64,
    interrupt: bool,
    selectors: Option<(u64, u64)>,
) -> Result<bool, Kill> {
    let Some(ld) = cx.vcpu.lguest_data else {
        return Ok(false);
    };
    let user_mode = cx.vcpu.cpu.user_mode;
    let regs = cx.vcpu.cpu.regs;
    let (stack, flags) = if user_mode {
        // The guest's own sp0 if it keeps one in lguest_data (read once),
        // else the SET_STACK value.
        let sp0 = ld.kernel_sp0(cx.mem)?;
        if !uapi::guest_sp_ok(sp0) {
            return kill!("lguest_data.kernel_sp0 {sp0:#x} is not a guest address");
        }
        let stack = if sp0 != 0 { sp0 } else { cx.vcpu.kernel_stack };
        if stack == 0 {
            return kill!("vector {vector} in user mode, but no kernel stack (SET_STACK)");
        }
        // User mode always runs with virtual interrupts on.
        (stack, regs.rflags | uapi::X86_EFLAGS_IF)
    } else {
        let irq_enabled = ld.irq_enabled(cx.mem)?;
        let flags = (regs.rflags & !uapi::X86_EFLAGS_IF) | (irq_enabled & uapi::X86_EFLAGS_IF);
        (regs.rsp, flags)
    };
    let (cs, ss) = selectors.unwrap_or(cx.vcpu.frame_selectors(user_mode));
    let mut frame = [0u64; 6];
    let mut n = 0;
    if let Some(error) = error {
        frame[n] = error;
        n += 1;
    }
    for v in [regs.rip, cs, flags, regs.rsp, ss] {
        frame[n] = v;
        n += 1;
    }
    let new_rsp = (stack & !0xf).wrapping_sub(8 * n as u64);
    let mut bytes = [0u8; 48];
    for (i, v) in frame[..n].iter().enumerate() {
        bytes[8 * i..8 * i + 8].copy_from_slice(&v.to_le_bytes());
    }
    if cx.write_va(new_rsp, &bytes[..8 * n]).is_err() {
        return kill!(
            "cannot deliver vector {vector}: the guest stack at {stack:#x} is not mapped in guest memory"
        );
    }
    cx.vcpu.cpu.set_mode(false);
    let r = &mut cx.vcpu.cpu.regs;
    r.rsp = new_rsp;
    r.rip = handler;
    r.rflags &= !(X86_EFLAGS_TF | X86_EFLAGS_NT);
    if interrupt {
        ld.set_irq_enabled(cx.mem, false)?;
    } else if user_mode {
        // A trap gate from user mode: on, as user mode was (whatever
        // irq_enabled said there).
        ld.set_irq_enabled(cx.mem, true)?;
    }
    ld.write_time(cx.mem)?;
    Ok(true)
}

/// Does what the guest's `iretq` (at `noirq_iret`, or any in guest kernel
/// mode) was doing: pops RIP, CS, RFLAGS, RSP and SS from its stack.
///
/// Needed under QEMU's software emulator before 8.x, which reads the
/// IRET frame with supervisor rights: with SMAP on, an `iretq` in ring 3
/// then takes a page fault (error code: present, read, supervisor) on its
/// own user stack. Real CPUs read it as ring 3 and never get here.
fn emulate_iret(cx: &mut Ctx<'_>) -> Result<bool, Kill> {
    let rsp = cx.vcpu.cpu.regs.rsp;
    let mut b = [0u8; 40];
    if cx.read_va(rsp, &mut b).is_err() {
        return Ok(false);
    }
    let w = |i: usize| u64::from_le_bytes(b[8 * i..8 * i + 8].try_into().unwrap_or([0; 8]));
    let (rip, cs, flags, new_rsp, ss) = (w(0), w(1), w(2), w(3), w(4));
    if cs != uapi::LGUEST_GUEST_CS
        || ss != uapi::LGUEST_GUEST_SS
        || !GuestCpu::enterable(rip, new_rsp)
    {
        return Ok(false);
    }
    let r = &mut cx.vcpu.cpu.regs;
    r.rip = rip;
    r.rsp = new_rsp;
    r.rflags = GuestCpu::sanitize_flags(flags);
    Ok(true)
}

/// Handles a trap the hardware reported for the guest that is not a guest
/// page fault or a hypercall: works around QEMU's IRET under SMAP (a
/// supervisor-mode page fault at the guest's `noirq_iret`), turns `int
/// $0x80` into the guest's system call, reflects the rest.
///
/// The host's gate for vector 0x80 has DPL 0, as the host may use that
/// vector for a device interrupt: a device interrupt then reaches the host
/// as usual, while `int $0x80` in ring 3 raises #GP with the IDT error code
/// of vector 0x80 (bit 1 set; QEMU reports 0x802 where hardware says
/// 0x402). If the guest has a handler for 0x80 and the instruction at RIP
/// is `int $0x80`, the guest gets vector 0x80 with RIP after it; without a
/// handler it gets the #GP, as its own hardware would give it.
pub(crate) fn hardware_trap(
    cx: &mut Ctx<'_>,
    vector: u64,
    error: u64,
    cr2: u64,
) -> Result<(), Kill> {
    const PF_USER: u64 = 4;
    if vector == 14 && error & PF_USER == 0 && !cx.vcpu.cpu.user_mode {
        if let Some(ld) = cx.vcpu.lguest_data {
            let rip = cx.vcpu.cpu.regs.rip;
            if rip == ld.noirq_iret(cx.mem)? && emulate_iret(cx)? {
                return Ok(());
            }
        }
        // The same for any `iretq` of the guest kernel (a Linux guest's
        // sync_core() returns to itself with one), when the fault is on
        // its frame.
        let (rip, rsp) = (cx.vcpu.cpu.regs.rip, cx.vcpu.cpu.regs.rsp);
        let mut insn = [0u8; 2];
        if cr2.wrapping_sub(rsp) < 40
            && cx.read_va(rip, &mut insn).is_ok()
            && insn == [0x48, 0xcf]
            && emulate_iret(cx)?
        {
            return Ok(());
        }
    }
    // SYSCALL is off while a guest runs (it would enter the host) unless
    // it enters the switcher's direct system call: its #UD in user mode
    // is the guest's system call.
    if vector == 6 && deliver_syscall(cx)? {
        return Ok(());
    }
    // The direct return to user mode, where the switcher left it to the
    // host; a gate of DPL 0 to anyone else (#GP at the instruction).
    let sysret = uapi::LGUEST_SYSRET_VECTOR as u64;
    if vector == sysret {
        if cx.vcpu.syscall_direct && !cx.vcpu.cpu.user_mode {
            return crate::hcall::direct_sysret(cx);
        }
        let rip = &mut cx.vcpu.cpu.regs.rip;
        *rip = rip.wrapping_sub(2);
        return reflect_trap(cx, 13, (sysret << 3) | 2, 0);
    }
    // The forced-emulation prefix: `cpuid` from the launcher's table.
    if vector == 6 && crate::emulate::forced(cx) {
        return Ok(());
    }
    // Privileged instructions a kernel runs without a hook (port I/O,
    // mov from CR0/CR4, wbinvd, xsetbv): emulated in guest kernel mode;
    // a faulting CPUID in either mode.
    if vector == 13 && error == 0 && crate::emulate::privileged(cx)? {
        return Ok(());
    }
    let syscall = uapi::LGUEST_SYSCALL_VECTOR as u64;
    if vector == 13
        && (error == (syscall << 3) | 2 || error == (syscall << 4) | 2)
        && cx.vcpu.idt[syscall as usize].handler != 0
    {
        let rip = cx.vcpu.cpu.regs.rip;
        let mut insn = [0u8; 2];
        if cx.read_va(rip, &mut insn).is_ok() && insn == [0xcd, syscall as u8] {
            cx.vcpu.cpu.regs.rip = rip + 2;
            if deliver(cx, syscall, 0)? {
                return Ok(());
            }
        }
    }
    reflect_trap(cx, vector, error, cr2)
}

/// Reflects exception `vector` to the guest, or kills it if it has no
/// handler for it.
pub(crate) fn reflect_trap(
    cx: &mut Ctx<'_>,
    vector: u64,
    error: u64,
    cr2: u64,
) -> Result<(), Kill> {
    // The page fault's address, and a debug exception's status (DR6, as
    // the CPU reported it: `cr2` carries it for vector 1), in lguest_data
    // for the guest kernel's `read_cr2` and `get_debugreg(6)`.
    if let Some(ld) = cx.vcpu.lguest_data {
        match vector {
            14 => ld.set_cr2(cx.mem, cr2)?,
            1 => ld.set_dr6(cx.mem, cr2)?,
            _ => {}
        }
    }
    if deliver(cx, vector, error)? {
        return Ok(());
    }
    let rip = cx.vcpu.cpu.regs.rip;
    if vector == 14 {
        kill!("page fault at {cr2:#x} (error {error:#x}) at rip {rip:#x}")
    } else {
        kill!(
            "unhandled trap: {} (vector {vector}, error {error:#x}) at rip {rip:#x}",
            trap_name(vector)
        )
    }
}

/// Interrupts pending and not blocked by the guest.
fn deliverable(cx: &Ctx<'_>, ld: LguestData) -> Result<u64, Kill> {
    let pending = cx.vcpu.irq.pending();
    if pending == 0 {
        return Ok(0);
    }
    let blocked = ld.blocked(cx.mem)?;
    Ok(pending & !blocked)
}

/// Delivers one pending interrupt if the guest can take it now; otherwise
/// sets `irq_pending`. Called before every entry into the guest.
pub(crate) fn maybe_deliver(cx: &mut Ctx<'_>) -> Result<(), Kill> {
    let Some(ld) = cx.vcpu.lguest_data else {
        return Ok(());
    };
    let ready = deliverable(cx, ld)?;
    if ready == 0 {
        return set_irq_pending(cx, ld, false);
    }
    // Guest user mode always takes interrupts; the kernel's virtual IF
    // and iret window are the kernel's.
    if !cx.vcpu.cpu.user_mode {
        if cx.vcpu.cpu.regs.rip == ld.noirq_iret(cx.mem)? {
            return Ok(());
        }
        if ld.irq_enabled(cx.mem)? & uapi::X86_EFLAGS_IF == 0 {
            return set_irq_pending(cx, ld, true);
        }
    }
    let irq = ready.trailing_zeros();
    cx.vcpu.irq.clear(irq);
    if !deliver(cx, FIRST_IRQ_VECTOR + irq as u64, 0)? {
        return kill!(
            "interrupt {irq} is not blocked but the guest has no handler for vector {}",
            FIRST_IRQ_VECTOR + irq as u64
        );
    }
    // Virtual IF is now off (interrupt gates): if more are waiting, say so.
    let more = deliverable(cx, ld)? != 0;
    set_irq_pending(cx, ld, more)
}

/// `LHCALL_HALT`: interrupts on, and sleep until one is deliverable.
pub(crate) fn halt(cx: &mut Ctx<'_>) -> Result<(), Kill> {
    if let Some(ld) = cx.vcpu.lguest_data {
        ld.set_irq_enabled(cx.mem, true)?;
    }
    cx.vcpu.halted = true;
    Ok(())
}

/// What a halted vCPU does next.
pub(crate) enum Halted {
    /// An interrupt can be delivered: run again.
    Wake,
    /// Every interrupt is blocked: nothing can ever wake the guest.
    Never,
    /// Nothing deliverable yet: sleep until an interrupt not in `blocked`
    /// is raised.
    Sleep { blocked: u64 },
}

/// Looks at a halted vCPU: can it wake now, may it ever?
pub(crate) fn halted(cx: &mut Ctx<'_>) -> Result<Halted, Kill> {
    let Some(ld) = cx.vcpu.lguest_data else {
        return Ok(Halted::Never);
    };
    let blocked = ld.blocked(cx.mem)?;
    if blocked == u64::MAX {
        return Ok(Halted::Never);
    }
    if cx.vcpu.irq.pending() & !blocked != 0 {
        cx.vcpu.halted = false;
        return Ok(Halted::Wake);
    }
    Ok(Halted::Sleep { blocked })
}
