// SPDX-License-Identifier: GPL-2.0
//! Hypercalls: what the guest asks of the host with `int $0x1f`.
//!
//! RAX holds the call, RDI, RSI, RDX and R10 its arguments (`uapi.rs`).
//! Before each synchronous call the async ring in `lguest_data` is run, as
//! lguest did: the guest queues calls there while batching and flushes them
//! with any hypercall. Grossly invalid calls kill the guest with a reason;
//! nothing a guest passes here can reach the host unchecked: every address
//! is checked against guest RAM and every value is read once.
//!
//! Called by the run loop in `vm.rs` with the file's lock held, on the
//! [`Ctx`] of the vCPU that made the call.

use kernel::prelude::*;

use crate::{
    interrupts,
    kill::{
        kill,
        Kill, //
    },
    lguest_data::LguestData,
    paging,
    switcher::{
        GuestCpu,
        Switcher, //
    },
    uapi::{
        self,
        HcallArgs, //
    },
    vcpu::{
        Ctx,
        UserExit, //
    },
};

/// The name of a hypercall, for messages.
fn name(nr: u64) -> &'static str {
    match nr {
        uapi::LHCALL_FLUSH_ASYNC => "FLUSH_ASYNC",
        uapi::LHCALL_LGUEST_INIT => "LGUEST_INIT",
        uapi::LHCALL_SHUTDOWN => "SHUTDOWN",
        uapi::LHCALL_NEW_PGTABLE => "NEW_PGTABLE",
        uapi::LHCALL_FLUSH_TLB => "FLUSH_TLB",
        uapi::LHCALL_LOAD_IDT_ENTRY => "LOAD_IDT_ENTRY",
        uapi::LHCALL_SET_STACK => "SET_STACK",
        uapi::LHCALL_TS => "TS",
        uapi::LHCALL_SET_CLOCKEVENT => "SET_CLOCKEVENT",
        uapi::LHCALL_HALT => "HALT",
        uapi::LHCALL_SET_PMD => "SET_PMD",
        uapi::LHCALL_SET_PTE => "SET_PTE",
        uapi::LHCALL_SET_PGD => "SET_PGD",
        uapi::LHCALL_LOAD_TLS => "LOAD_TLS",
        uapi::LHCALL_NOTIFY => "NOTIFY",
        uapi::LHCALL_LOAD_GDT_ENTRY => "LOAD_GDT_ENTRY",
        uapi::LHCALL_SEND_INTERRUPTS => "SEND_INTERRUPTS",
        uapi::LHCALL_IRET_USER => "IRET_USER",
        uapi::LHCALL_SET_SYSCALL => "SET_SYSCALL",
        uapi::LHCALL_SET_SEGMENT_BASE => "SET_SEGMENT_BASE",
        uapi::LHCALL_IRET => "IRET",
        uapi::LHCALL_INVLPG => "INVLPG",
        uapi::LHCALL_GET_SEGMENT_BASE => "GET_SEGMENT_BASE",
        uapi::LHCALL_IBPB => "IBPB",
        uapi::LHCALL_SET_DEBUGREGS => "SET_DEBUGREGS",
        _ => "unknown",
    }
}

/// Handles the hypercall the vCPU just made: first the async ring, then
/// the call in its registers. `Ok(Some(..))` means the launcher must act.
pub(crate) fn do_hypercalls(cx: &mut Ctx<'_>) -> Result<Option<UserExit>, Kill> {
    let regs = cx.vcpu.cpu.regs;
    cx.vcpu.stat_hypercalls += 1;
    run_async_ring(cx)?;
    let args = HcallArgs {
        arg0: regs.rax,
        arg1: regs.rdi,
        arg2: regs.rsi,
        arg3: regs.rdx,
        arg4: regs.r10,
    };
    let exit = dispatch(cx, &args, false)?;
    // IRET_USER and IRET loaded the RAX to return with, GET_SEGMENT_BASE,
    // IBPB and SET_DEBUGREGS their result: leave it.
    if !matches!(
        args.arg0,
        uapi::LHCALL_IRET_USER
            | uapi::LHCALL_IRET
            | uapi::LHCALL_GET_SEGMENT_BASE
            | uapi::LHCALL_IBPB
            | uapi::LHCALL_SET_DEBUGREGS
    ) {
        cx.vcpu.cpu.regs.rax = 0;
    }
    Ok(exit)
}

/// Runs the queued entries of the async ring, in order, from where the last
/// run stopped.
fn run_async_ring(cx: &mut Ctx<'_>) -> Result<(), Kill> {
    let Some(ld) = cx.vcpu.lguest_data else {
        return Ok(());
    };
    for _ in 0..uapi::LHCALL_RING_SIZE {
        let n = cx.vcpu.next_hcall;
        let Some(args) = ld.queued(cx.mem, n)? else {
            break;
        };
        dispatch(cx, &args, true)?;
        ld.done(cx.mem, n)?;
        cx.vcpu.next_hcall = (n + 1) % uapi::LHCALL_RING_SIZE;
    }
    Ok(())
}

/// Performs one hypercall. `in_ring`: it came from the async ring, where
/// calls that end the run loop's turn (SHUTDOWN and NOTIFY go to the
/// launcher, HALT sleeps) are not allowed.
fn dispatch(cx: &mut Ctx<'_>, a: &HcallArgs, in_ring: bool) -> Result<Option<UserExit>, Kill> {
    let nr = a.arg0;
    // NEW_PGTABLE needs nothing of lguest_data: a guest's first
    // instructions, at their load address, may switch to tables that map
    // the image where it is linked before the code that registers it runs.
    if cx.vcpu.lguest_data.is_none()
        && nr != uapi::LHCALL_LGUEST_INIT
        && !(nr == uapi::LHCALL_NEW_PGTABLE && !in_ring)
    {
        return kill!("hypercall {nr} ({}) before LGUEST_INIT", name(nr));
    }
    // Calls that end the turn or change the vCPU's mode and registers.
    let needs_launcher = matches!(
        nr,
        uapi::LHCALL_SHUTDOWN
            | uapi::LHCALL_NOTIFY
            | uapi::LHCALL_HALT
            | uapi::LHCALL_IRET_USER
            | uapi::LHCALL_IRET
            | uapi::LHCALL_GET_SEGMENT_BASE
            | uapi::LHCALL_IBPB
            | uapi::LHCALL_SET_DEBUGREGS
    );
    if in_ring && needs_launcher {
        return kill!("hypercall {} is not allowed in the async ring", name(nr));
    }
    match nr {
        uapi::LHCALL_FLUSH_ASYNC | uapi::LHCALL_SEND_INTERRUPTS => Ok(None),
        uapi::LHCALL_LGUEST_INIT => init(cx, a.arg1, a.arg2).map(|()| None),
        uapi::LHCALL_SHUTDOWN => shutdown(cx, a.arg1, a.arg2).map(Some),
        // A bound address wakes its device thread; the guest goes on.
        uapi::LHCALL_NOTIFY if cx.notifiers.signal(a.arg1) => Ok(None),
        uapi::LHCALL_NOTIFY => Ok(Some(UserExit::Notify {
            addr: a.arg1,
            arg: a.arg2,
        })),
        uapi::LHCALL_HALT => interrupts::halt(cx).map(|()| None),
        uapi::LHCALL_LOAD_IDT_ENTRY => {
            interrupts::load_idt_entry(cx, a.arg1, a.arg2, a.arg3).map(|()| None)
        }
        uapi::LHCALL_SET_CLOCKEVENT => {
            let v = &mut *cx.vcpu;
            // Dropping the old event cancels it.
            v.clock = None;
            if a.arg1 != 0 {
                v.clock = Some(v.irq.arm(a.arg1));
            }
            Ok(None)
        }
        uapi::LHCALL_NEW_PGTABLE => paging::new_pgtable(cx, a.arg1, a.arg2).map(|()| None),
        uapi::LHCALL_SET_PTE => paging::set_pte(cx, a.arg2).map(|()| None),
        uapi::LHCALL_FLUSH_TLB if cx.shadows.tlb_mode() => {
            paging::tlb_flush(cx, a.arg1 & 1 != 0).map(|()| None)
        }
        uapi::LHCALL_FLUSH_TLB | uapi::LHCALL_SET_PMD | uapi::LHCALL_SET_PGD => {
            paging::flush(cx).map(|()| None)
        }
        uapi::LHCALL_INVLPG => paging::invlpg(cx, a.arg1).map(|()| None),
        uapi::LHCALL_SET_STACK => {
            if a.arg1 == 0 || !uapi::guest_sp_ok(a.arg1) {
                return kill!("SET_STACK: bad kernel stack {:#x}", a.arg1);
            }
            cx.vcpu.kernel_stack = a.arg1;
            Ok(None)
        }
        uapi::LHCALL_IRET_USER => iret_user(cx).map(|()| None),
        uapi::LHCALL_IRET => iret(cx).map(|()| None),
        uapi::LHCALL_SET_SYSCALL => {
            if !uapi::guest_va_ok(a.arg1) {
                return kill!("SET_SYSCALL: entry {:#x} is not a guest address", a.arg1);
            }
            if a.arg2 & !uapi::LGUEST_SYSCALL_DIRECT != 0 {
                return kill!("SET_SYSCALL: unknown flags {:#x}", a.arg2);
            }
            cx.vcpu.syscall_entry = a.arg1;
            cx.vcpu.syscall_direct = a.arg1 != 0 && a.arg2 & uapi::LGUEST_SYSCALL_DIRECT != 0;
            Ok(None)
        }
        uapi::LHCALL_SET_SEGMENT_BASE => set_segment_base(cx, a.arg1, a.arg2).map(|()| None),
        uapi::LHCALL_GET_SEGMENT_BASE => get_segment_base(cx, a.arg1).map(|()| None),
        uapi::LHCALL_IBPB => ibpb(cx, a.arg1).map(|()| None),
        uapi::LHCALL_SET_DEBUGREGS => set_debugregs(cx, a.arg1).map(|()| None),
        uapi::LHCALL_TS | uapi::LHCALL_LOAD_TLS | uapi::LHCALL_LOAD_GDT_ENTRY => {
            kill!("hypercall {} is not supported by this host yet", name(nr))
        }
        _ => kill!("bad hypercall {nr}"),
    }
}

/// Whether guest user mode may be entered: the guest's own tables, and a
/// kernel stack for the way back, from `SET_STACK` or `lguest_data`'s
/// `kernel_sp0` (`what` names the call for the reason).
fn user_mode_ready(cx: &Ctx<'_>, what: &str) -> Result<(), Kill> {
    if cx.shadows.guest_root().is_none() {
        return kill!("{what} before NEW_PGTABLE: user mode needs the guest's own page tables");
    }
    // Guest memory is read only when SET_STACK gave no stack.
    let sp0 = match cx.vcpu.lguest_data {
        Some(ld) if cx.vcpu.kernel_stack == 0 => ld.kernel_sp0(cx.mem)?,
        _ => 0,
    };
    if cx.vcpu.kernel_stack == 0 && sp0 == 0 {
        return kill!("{what} before SET_STACK: user mode needs a kernel stack");
    }
    Ok(())
}

/// Enters guest user mode at `rip` with `rsp`, RAX `rax` and `rflags`,
/// as a return to user mode does: the user GS base, the user shadow table
/// from the next entry on. User mode always takes interrupts, whatever
/// `irq_enabled` says; it is left 0, so that a direct system-call entry
/// finds virtual interrupts off, as SYSCALL's mask leaves them.
///
/// Any RSP is taken, as an `iretq` to ring 3 takes it. A RIP that is not
/// canonical for the guest (a 4-level machine, [`uapi::guest_canonical`])
/// is the #GP(0) that the CPU's own `iretq` raises, and `selectors` the
/// frame's CS and SS where the return names them: the pair of a 64-bit
/// user segment is the only one a guest's user mode may have, and any
/// other CS, then SS, is the #GP(selector) of a descriptor the `iretq`
/// refuses. Such a fault goes to the guest kernel as if it were taken in
/// user mode at the return's state (Linux's `fixup_bad_iret` makes the
/// same frame of a native one), never kills the guest: a process can ask
/// for any of these with `sigreturn`.
fn enter_user(
    cx: &mut Ctx<'_>,
    rax: u64,
    rip: u64,
    rflags: u64,
    rsp: u64,
    selectors: Option<(u64, u64)>,
) -> Result<(), Kill> {
    let Some(ld) = cx.vcpu.lguest_data else {
        return kill!("user mode before LGUEST_INIT");
    };
    ld.set_irq_enabled(cx.mem, false)?;
    let user = cx.vcpu.frame_selectors(true);
    let v = &mut *cx.vcpu;
    v.cpu.regs.rax = rax;
    v.cpu.regs.rip = rip;
    v.cpu.regs.rsp = rsp;
    v.cpu.regs.rflags = GuestCpu::iret_flags(rflags);
    v.cpu.set_mode(true);
    let (cs, ss) = selectors.unwrap_or(user);
    let error = if cs != user.0 {
        Some(cs & SELECTOR_ERROR)
    } else if ss != user.1 {
        Some(ss & SELECTOR_ERROR)
    } else if !uapi::guest_canonical(rip) {
        Some(0)
    } else {
        None
    };
    match error {
        Some(error) => interrupts::bad_user_return(cx, error, cs, ss),
        None => Ok(()),
    }
}

/// The bits of a selector that a #GP's error code shows (index and table;
/// the RPL is not part of it).
const SELECTOR_ERROR: u64 = 0xfffc;

/// `int $LGUEST_SYSRET_VECTOR` in guest kernel mode, where the switcher
/// did not switch by itself (the direct system call not armed on this
/// host, or a RIP it leaves to the host): the return to user mode with
/// `sysretq`'s registers, RCX the user RIP, R11 the user RFLAGS, RSP the
/// user RSP, every register unchanged; `irq_enabled` untouched. A RIP that
/// is not canonical is a #GP(0) in user mode at it ([`enter_user`]).
pub(crate) fn direct_sysret(cx: &mut Ctx<'_>) -> Result<(), Kill> {
    // As the switcher's own switch: the guest's tables, and no look at a
    // kernel stack until an event in user mode needs one.
    if cx.shadows.guest_root().is_none() {
        return kill!("the return to user mode before NEW_PGTABLE: user mode needs the guest's own page tables");
    }
    let r = cx.vcpu.cpu.regs;
    let cpu = &mut cx.vcpu.cpu;
    cpu.regs.rip = r.rcx;
    cpu.regs.rflags = GuestCpu::sanitize_flags(r.r11);
    cpu.set_mode(true);
    if !uapi::guest_canonical(r.rcx) {
        let (cs, ss) = cx.vcpu.frame_selectors(true);
        return interrupts::bad_user_return(cx, 0, cs, ss);
    }
    Ok(())
}

/// `LHCALL_IRET`: the guest's `iretq` through the [`uapi::LguestIret`]
/// frame at its RSP, to kernel or user mode as its selectors say. Only
/// with Linux frames, whose kernel pair has RPL 0: a user mode's
/// `sigreturn` or `ptrace` cannot forge it (without them the kernel pair
/// has RPL 3 and could be).
fn iret(cx: &mut Ctx<'_>) -> Result<(), Kill> {
    if !cx.vcpu.linux_frames {
        return kill!("IRET without LGUEST_INIT_LINUX_FRAMES");
    }
    let rsp = cx.vcpu.cpu.regs.rsp;
    let mut b = [0u8; core::mem::size_of::<uapi::LguestIret>()];
    if cx.read_va(rsp, &mut b).is_err() {
        return kill!("IRET: the frame at {rsp:#x} is not mapped");
    }
    let w = |i: usize| u64::from_le_bytes(b[8 * i..8 * i + 8].try_into().unwrap_or([0; 8]));
    let (rax, rip, cs, rflags, new_rsp, ss) = (w(0), w(1), w(2), w(3), w(4), w(5));
    // As the CPU's iretq: CS's RPL says where to return.
    if cs & 3 == 3 {
        user_mode_ready(cx, "IRET to user mode")?;
        return enter_user(cx, rax, rip, rflags, new_rsp, Some((cs, ss)));
    }
    // A return to the kernel: only its own mistakes get here.
    if (cs, ss) != cx.vcpu.frame_selectors(false) {
        return kill!("IRET: bad selectors cs {cs:#x} ss {ss:#x}");
    }
    if !GuestCpu::enterable(rip, new_rsp) {
        return kill!("IRET: bad rip {rip:#x} or rsp {new_rsp:#x}");
    }
    let Some(ld) = cx.vcpu.lguest_data else {
        return kill!("IRET before LGUEST_INIT");
    };
    // The frame's IF is the virtual IF to return with, set at once: a
    // pending interrupt is delivered before the guest runs again.
    ld.set_irq_enabled(cx.mem, rflags & uapi::X86_EFLAGS_IF != 0)?;
    let r = &mut cx.vcpu.cpu.regs;
    r.rax = rax;
    r.rip = rip;
    r.rsp = new_rsp;
    r.rflags = GuestCpu::sanitize_flags(rflags);
    Ok(())
}

/// `LHCALL_IRET_USER`: the guest kernel returns to user mode through the
/// [`uapi::LguestIretUser`] frame at its RSP.
fn iret_user(cx: &mut Ctx<'_>) -> Result<(), Kill> {
    user_mode_ready(cx, "IRET_USER")?;
    let rsp = cx.vcpu.cpu.regs.rsp;
    let mut b = [0u8; core::mem::size_of::<uapi::LguestIretUser>()];
    if cx.read_va(rsp, &mut b).is_err() {
        return kill!("IRET_USER: the frame at {rsp:#x} is not mapped");
    }
    let w = |i: usize| {
        let mut v = [0u8; 8];
        v.copy_from_slice(&b[8 * i..8 * i + 8]);
        u64::from_le_bytes(v)
    };
    let (rax, rip, rflags, user_rsp) = (w(0), w(1), w(2), w(3));
    enter_user(cx, rax, rip, rflags, user_rsp, None)
}

/// `LHCALL_SET_SEGMENT_BASE(which, base)`: the FS base, the guest kernel's
/// GS base or guest user mode's (the hypercall comes from kernel mode).
fn set_segment_base(cx: &mut Ctx<'_>, which: u64, base: u64) -> Result<(), Kill> {
    let canonical = Switcher::get().map(|s| s.canonical(base)).unwrap_or(false);
    if !canonical {
        return kill!("SET_SEGMENT_BASE: base {base:#x} is not a canonical address");
    }
    let cpu = &mut cx.vcpu.cpu;
    match which {
        uapi::LGUEST_BASE_FS => cpu.fs_base = base,
        uapi::LGUEST_BASE_GS => cpu.gs_base = base,
        uapi::LGUEST_BASE_USER_GS => cpu.gs_other = base,
        _ => return kill!("SET_SEGMENT_BASE: no segment base {which}"),
    }
    Ok(())
}

/// `LHCALL_GET_SEGMENT_BASE(which)`: a base as it is now, in RAX (the call
/// comes from kernel mode, so the user GS base is the other mode's).
fn get_segment_base(cx: &mut Ctx<'_>, which: u64) -> Result<(), Kill> {
    let cpu = &mut cx.vcpu.cpu;
    cpu.regs.rax = match which {
        uapi::LGUEST_BASE_FS => cpu.fs_base,
        uapi::LGUEST_BASE_GS => cpu.gs_base,
        uapi::LGUEST_BASE_USER_GS => cpu.gs_other,
        _ => return kill!("GET_SEGMENT_BASE: no segment base {which}"),
    };
    Ok(())
}

/// `LHCALL_IBPB(flags)`: an indirect branch prediction barrier now, and
/// one at each entry to the guest kernel from user mode from now on (or
/// none), where the host's CPU can; the result in RAX.
fn ibpb(cx: &mut Ctx<'_>, flags: u64) -> Result<(), Kill> {
    if flags & !(uapi::LGUEST_IBPB_NOW | uapi::LGUEST_IBPB_USER_ENTRY) != 0 {
        return kill!("IBPB: unknown flags {flags:#x}");
    }
    let cpu = &mut cx.vcpu.cpu;
    let Ok(sw) = Switcher::get() else {
        return kill!("IBPB: no switcher");
    };
    if sw.ibpb_kind() == 0 {
        cpu.ibpb_user_entry = false;
        cpu.regs.rax = uapi::LGUEST_IBPB_UNAVAILABLE;
        return Ok(());
    }
    cpu.ibpb_user_entry = flags & uapi::LGUEST_IBPB_USER_ENTRY != 0;
    if flags & uapi::LGUEST_IBPB_NOW != 0 {
        sw.ibpb_for(cpu);
    }
    cpu.regs.rax = uapi::LGUEST_IBPB_DONE;
    Ok(())
}

/// `LHCALL_SET_DEBUGREGS(dr7)`: the guest's hardware breakpoints, DR0-DR3
/// read once from `lguest_data`, armed from the next entry as
/// [`uapi::debugreg_dr7`] accepts them; that DR7 is the result.
fn set_debugregs(cx: &mut Ctx<'_>, dr7: u64) -> Result<(), Kill> {
    if dr7 >> 32 != 0 {
        return kill!("SET_DEBUGREGS: DR7 {dr7:#x} sets reserved bits");
    }
    let Some(ld) = cx.vcpu.lguest_data else {
        return kill!("SET_DEBUGREGS before LGUEST_INIT");
    };
    let addrs = ld.debugregs(cx.mem)?;
    let cpu = &mut cx.vcpu.cpu;
    cpu.dr7 = uapi::debugreg_dr7(dr7, &addrs);
    cpu.debugregs = addrs;
    cpu.regs.rax = cpu.dr7;
    Ok(())
}

/// `LHCALL_LGUEST_INIT(gpa, flags)`: the guest registers its
/// `lguest_data` and says how its frames look.
fn init(cx: &mut Ctx<'_>, gpa: u64, flags: u64) -> Result<(), Kill> {
    if cx.vcpu.lguest_data.is_some() {
        return kill!("LGUEST_INIT called twice");
    }
    if flags & !(uapi::LGUEST_INIT_LINUX_FRAMES | uapi::LGUEST_INIT_TLB_SHADOWS) != 0 {
        return kill!("LGUEST_INIT: unknown flags {flags:#x}");
    }
    cx.vcpu.lguest_data = Some(LguestData::register(cx.mem, gpa)?);
    cx.vcpu.linux_frames = flags & uapi::LGUEST_INIT_LINUX_FRAMES != 0;
    if flags & uapi::LGUEST_INIT_TLB_SHADOWS != 0 && cx.shadows.set_tlb_mode().is_err() {
        return kill!("out of memory for the shared shadow");
    }
    Ok(())
}

/// `LHCALL_SHUTDOWN(message gpa, reason)`.
fn shutdown(cx: &Ctx<'_>, msg: u64, reason: u64) -> Result<UserExit, Kill> {
    if !matches!(
        reason,
        uapi::LGUEST_SHUTDOWN_POWEROFF
            | uapi::LGUEST_SHUTDOWN_RESTART
            | uapi::LGUEST_SHUTDOWN_CRASH
    ) {
        return kill!("bad shutdown reason {reason}");
    }
    let size = cx.mem.size();
    if msg >= size {
        return kill!("shutdown message address {msg:#x} is outside guest memory");
    }
    let len = core::cmp::min(uapi::LGUEST_MESSAGE_LEN as u64 - 1, size - msg) as usize;
    let mut buf = [0u8; uapi::LGUEST_MESSAGE_LEN];
    if cx.mem.read(msg, &mut buf[..len]).is_err() {
        return kill!("cannot read the shutdown message at {msg:#x}");
    }
    let end = buf[..len].iter().position(|&b| b == 0).unwrap_or(len);
    let mut message = KVec::new();
    if message.extend_from_slice(&buf[..end], GFP_KERNEL).is_err() {
        return kill!("out of memory");
    }
    Ok(UserExit::Shutdown { reason, message })
}
