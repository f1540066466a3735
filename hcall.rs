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
//! Called by the run loop in `vm.rs` with the file's lock held.

use core::mem::offset_of;
use kernel::{
    bindings,
    prelude::*, //
};

use crate::{
    interrupts,
    kill::{
        kill,
        Kill, //
    },
    paging,
    switcher::Switcher,
    uapi::{
        self,
        HcallArgs,
        LguestData, //
    },
    vm::{
        UserExit,
        Vm, //
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
        _ => "unknown",
    }
}

/// Handles the hypercall vCPU `index` just made: first the async ring, then
/// the call in its registers. `Ok(Some(..))` means the launcher must act.
pub(crate) fn do_hypercalls(vm: &mut Vm, index: usize) -> Result<Option<UserExit>, Kill> {
    let regs = vm.vcpus[index].cpu.regs;
    vm.vcpus[index].stat_hypercalls += 1;
    run_async_ring(vm, index)?;
    let args = HcallArgs {
        arg0: regs.rax,
        arg1: regs.rdi,
        arg2: regs.rsi,
        arg3: regs.rdx,
        arg4: regs.r10,
    };
    let exit = dispatch(vm, index, &args, false)?;
    // IRET_USER loaded the user's RAX: leave it.
    if !vm.vcpus[index].user_mode {
        vm.vcpus[index].cpu.regs.rax = 0;
    }
    Ok(exit)
}

/// Runs the queued entries of the async ring, in order, from where the last
/// run stopped.
fn run_async_ring(vm: &mut Vm, index: usize) -> Result<(), Kill> {
    let Some(ld) = vm.vcpus[index].lguest_data else {
        return Ok(());
    };
    for _ in 0..uapi::LHCALL_RING_SIZE {
        let n = vm.vcpus[index].next_hcall;
        let status_at = ld + (offset_of!(LguestData, hcall_status) + n) as u64;
        let mut status = [0u8; 1];
        if vm.read_guest(status_at, &mut status).is_err() {
            return kill!("lguest_data at {ld:#x} is no longer readable");
        }
        if status[0] != 0 {
            break;
        }
        let mut raw = [0u8; core::mem::size_of::<HcallArgs>()];
        let args_at = ld + (offset_of!(LguestData, hcalls) + n * raw.len()) as u64;
        if vm.read_guest(args_at, &mut raw).is_err() {
            return kill!("lguest_data at {ld:#x} is no longer readable");
        }
        let word =
            |i: usize| u64::from_le_bytes(raw[8 * i..8 * i + 8].try_into().unwrap_or([0; 8]));
        let args = HcallArgs {
            arg0: word(0),
            arg1: word(1),
            arg2: word(2),
            arg3: word(3),
            arg4: word(4),
        };
        dispatch(vm, index, &args, true)?;
        if vm
            .write_guest(status_at, &[uapi::LHCALL_STATUS_DONE])
            .is_err()
        {
            return kill!("lguest_data at {ld:#x} is no longer writable");
        }
        vm.vcpus[index].next_hcall = (n + 1) % uapi::LHCALL_RING_SIZE;
    }
    Ok(())
}

/// Performs one hypercall. `in_ring`: it came from the async ring, where
/// calls that end the run loop's turn (SHUTDOWN and NOTIFY go to the
/// launcher, HALT sleeps) are not allowed.
fn dispatch(
    vm: &mut Vm,
    index: usize,
    a: &HcallArgs,
    in_ring: bool,
) -> Result<Option<UserExit>, Kill> {
    let nr = a.arg0;
    if vm.vcpus[index].lguest_data.is_none() && nr != uapi::LHCALL_LGUEST_INIT {
        return kill!("hypercall {nr} ({}) before LGUEST_INIT", name(nr));
    }
    // Calls that end the turn or change the vCPU's mode and registers.
    let needs_launcher = matches!(
        nr,
        uapi::LHCALL_SHUTDOWN | uapi::LHCALL_NOTIFY | uapi::LHCALL_HALT | uapi::LHCALL_IRET_USER
    );
    if in_ring && needs_launcher {
        return kill!("hypercall {} is not allowed in the async ring", name(nr));
    }
    match nr {
        uapi::LHCALL_FLUSH_ASYNC | uapi::LHCALL_SEND_INTERRUPTS => Ok(None),
        uapi::LHCALL_LGUEST_INIT => init(vm, index, a.arg1).map(|()| None),
        uapi::LHCALL_SHUTDOWN => shutdown(vm, a.arg1, a.arg2).map(Some),
        // A bound address wakes its device thread; the guest goes on.
        uapi::LHCALL_NOTIFY if vm.notifiers.signal(a.arg1) => Ok(None),
        uapi::LHCALL_NOTIFY => Ok(Some(UserExit::Notify {
            addr: a.arg1,
            arg: a.arg2,
        })),
        uapi::LHCALL_HALT => interrupts::halt(vm, index).map(|()| None),
        uapi::LHCALL_LOAD_IDT_ENTRY => {
            interrupts::load_idt_entry(vm, index, a.arg1, a.arg2, a.arg3).map(|()| None)
        }
        uapi::LHCALL_SET_CLOCKEVENT => {
            let v = &mut vm.vcpus[index];
            // Dropping the old event cancels it.
            v.clock = None;
            if a.arg1 != 0 {
                v.clock = Some(v.irq.arm(a.arg1));
            }
            Ok(None)
        }
        uapi::LHCALL_NEW_PGTABLE => paging::new_pgtable(vm, a.arg1).map(|()| None),
        uapi::LHCALL_SET_PTE => paging::set_pte(vm, a.arg2).map(|()| None),
        uapi::LHCALL_FLUSH_TLB | uapi::LHCALL_SET_PMD | uapi::LHCALL_SET_PGD => {
            paging::flush(vm).map(|()| None)
        }
        uapi::LHCALL_SET_STACK => {
            if a.arg1 == 0 || a.arg1 > uapi::GUEST_VA_END {
                return kill!("SET_STACK: bad kernel stack {:#x}", a.arg1);
            }
            vm.vcpus[index].kernel_stack = a.arg1;
            Ok(None)
        }
        uapi::LHCALL_IRET_USER => iret_user(vm, index).map(|()| None),
        uapi::LHCALL_SET_SYSCALL => {
            if a.arg1 >= uapi::GUEST_VA_END {
                return kill!("SET_SYSCALL: entry {:#x} is not a guest address", a.arg1);
            }
            vm.vcpus[index].syscall_entry = a.arg1;
            Ok(None)
        }
        uapi::LHCALL_SET_SEGMENT_BASE => set_segment_base(vm, index, a.arg1, a.arg2).map(|()| None),
        uapi::LHCALL_TS | uapi::LHCALL_LOAD_TLS | uapi::LHCALL_LOAD_GDT_ENTRY => {
            kill!("hypercall {} is not supported by this host yet", name(nr))
        }
        _ => kill!("bad hypercall {nr}"),
    }
}

/// `LHCALL_IRET_USER`: the guest kernel returns to user mode through the
/// [`uapi::LguestIretUser`] frame at its RSP.
fn iret_user(vm: &mut Vm, index: usize) -> Result<(), Kill> {
    if vm.guest_root.is_none() {
        return kill!("IRET_USER before NEW_PGTABLE: user mode needs the guest's own page tables");
    }
    if vm.vcpus[index].kernel_stack == 0 {
        return kill!("IRET_USER before SET_STACK: user mode needs a kernel stack");
    }
    let rsp = vm.vcpus[index].cpu.regs.rsp;
    let mut b = [0u8; core::mem::size_of::<uapi::LguestIretUser>()];
    if vm.read_guest_va(rsp, &mut b).is_err() {
        return kill!("IRET_USER: the frame at {rsp:#x} is not mapped");
    }
    let w = |i: usize| {
        let mut v = [0u8; 8];
        v.copy_from_slice(&b[8 * i..8 * i + 8]);
        u64::from_le_bytes(v)
    };
    let (rax, rip, rflags, user_rsp) = (w(0), w(1), w(2), w(3));
    if !crate::switcher::GuestCpu::enterable(rip, user_rsp) {
        return kill!("IRET_USER: bad user rip {rip:#x} or rsp {user_rsp:#x}");
    }
    // User mode runs with virtual interrupts on.
    let Some(ld) = vm.vcpus[index].lguest_data else {
        return kill!("IRET_USER before LGUEST_INIT");
    };
    let at = ld + offset_of!(LguestData, irq_enabled) as u64;
    if vm.write_u64(at, uapi::X86_EFLAGS_IF).is_err() {
        return kill!("lguest_data at {ld:#x} is no longer writable");
    }
    let v = &mut vm.vcpus[index];
    v.cpu.regs.rax = rax;
    v.cpu.regs.rip = rip;
    v.cpu.regs.rsp = user_rsp;
    v.cpu.regs.rflags = crate::switcher::GuestCpu::sanitize_flags(rflags);
    v.cpu.toggle_gs();
    v.user_mode = true;
    Ok(())
}

/// `LHCALL_SET_SEGMENT_BASE(which, base)`: the FS base, the guest kernel's
/// GS base or guest user mode's (the hypercall comes from kernel mode).
fn set_segment_base(vm: &mut Vm, index: usize, which: u64, base: u64) -> Result<(), Kill> {
    let canonical = Switcher::get().map(|s| s.canonical(base)).unwrap_or(false);
    if !canonical {
        return kill!("SET_SEGMENT_BASE: base {base:#x} is not a canonical address");
    }
    let cpu = &mut vm.vcpus[index].cpu;
    match which {
        uapi::LGUEST_BASE_FS => cpu.fs_base = base,
        uapi::LGUEST_BASE_GS => cpu.gs_base = base,
        uapi::LGUEST_BASE_USER_GS => cpu.gs_other = base,
        _ => return kill!("SET_SEGMENT_BASE: no segment base {which}"),
    }
    Ok(())
}

/// `LHCALL_LGUEST_INIT(gpa)`: the guest registers its `lguest_data`.
fn init(vm: &mut Vm, index: usize, gpa: u64) -> Result<(), Kill> {
    if vm.vcpus[index].lguest_data.is_some() {
        return kill!("LGUEST_INIT called twice");
    }
    let size = core::mem::size_of::<LguestData>() as u64;
    if gpa % 8 != 0
        || gpa
            .checked_add(size)
            .map_or(true, |end| end > vm.mem.size())
    {
        return kill!("bad lguest_data address {gpa:#x}");
    }
    // The guest's addresses end below the last lower-half page.
    let reserve_mem: u64 = uapi::GUEST_VA_END;
    // SAFETY: check_tsc_unstable() may be called from any context, and
    // tsc_khz is a plain variable, read once here (it may be refined after
    // boot, so the guest gets the value of the moment).
    let tsc_khz = unsafe {
        if bindings::check_tsc_unstable() == 0 {
            bindings::tsc_khz
        } else {
            0
        }
    };
    let put = |off: usize, bytes: &[u8]| vm.write_guest(gpa + off as u64, bytes);
    let ok = put(
        offset_of!(LguestData, reserve_mem),
        &reserve_mem.to_le_bytes(),
    )
    .is_ok()
        && put(offset_of!(LguestData, tsc_khz), &tsc_khz.to_le_bytes()).is_ok()
        && write_time(vm, gpa).is_ok();
    if !ok {
        return kill!("cannot write lguest_data at {gpa:#x}");
    }
    vm.vcpus[index].lguest_data = Some(gpa);
    Ok(())
}

/// Writes the wall-clock time into `lguest_data` at `gpa`.
pub(crate) fn write_time(vm: &Vm, gpa: u64) -> Result {
    let mut ts = bindings::timespec64 {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec64 to fill in.
    unsafe { bindings::ktime_get_real_ts64(&mut ts) };
    let mut t = [0u8; 16];
    t[..8].copy_from_slice(&(ts.tv_sec as u64).to_le_bytes());
    t[8..].copy_from_slice(&(ts.tv_nsec as u64).to_le_bytes());
    vm.write_guest(gpa + offset_of!(LguestData, time) as u64, &t)
}

/// `LHCALL_SHUTDOWN(message gpa, reason)`.
fn shutdown(vm: &Vm, msg: u64, reason: u64) -> Result<UserExit, Kill> {
    if !matches!(
        reason,
        uapi::LGUEST_SHUTDOWN_POWEROFF
            | uapi::LGUEST_SHUTDOWN_RESTART
            | uapi::LGUEST_SHUTDOWN_CRASH
    ) {
        return kill!("bad shutdown reason {reason}");
    }
    if msg >= vm.mem.size() {
        return kill!("shutdown message address {msg:#x} is outside guest memory");
    }
    let len = core::cmp::min(uapi::LGUEST_MESSAGE_LEN as u64 - 1, vm.mem.size() - msg) as usize;
    let mut buf = [0u8; uapi::LGUEST_MESSAGE_LEN];
    if vm.read_guest(msg, &mut buf[..len]).is_err() {
        return kill!("cannot read the shutdown message at {msg:#x}");
    }
    let end = buf[..len].iter().position(|&b| b == 0).unwrap_or(len);
    let mut message = KVec::new();
    if message.extend_from_slice(&buf[..end], GFP_KERNEL).is_err() {
        return kill!("out of memory");
    }
    Ok(UserExit::Shutdown { reason, message })
}
