// SPDX-License-Identifier: GPL-2.0
//! A VM: its pinned memory, its shadow tables, its vCPU, and the run loop
//! (`run_guest`), which reads as lguest's: deliver what is pending, switch
//! to the guest, and hand the exit to the hypercalls, the shadow paging or
//! the trap reflection until the launcher is needed.
//!
//! A [`Vm`] lives inside the open file's lock (see `dev.rs`); every method
//! here is called with that lock held, so the VM needs no lock of its own.
//! RUN holds the lock while the guest runs, but not while a halted vCPU
//! sleeps ([`RunStep::Sleep`]); the launcher kicks a running vCPU with a
//! signal (and `immediate_exit`), not with another ioctl. The exit
//! handlers get a [`Ctx`]: the running vCPU and, beside it, the memory and
//! shadow tables (split borrows of the `Vm`).

use core::sync::atomic::{
    AtomicU64,
    Ordering, //
};
use kernel::{
    prelude::*,
    sync::Arc, //
};

use crate::{
    gmem::{
        GuestMemory,
        HostPage,
        PAGE_SIZE,
        PTE_A,
        PTE_D,
        PTE_P,
        PTE_RW,
        PTE_US, //
    },
    hcall, helpers,
    interrupts::{
        self,
        Halted, //
    },
    irq::VcpuIrq,
    kill::{
        kill,
        trap_name,
        Kill, //
    },
    notify::Notifiers,
    paging::{
        self,
        Fault, //
    },
    shadow::Shadows,
    switcher::{
        Exit,
        GuestCpu,
        SlotRef,
        Switcher, //
    },
    uapi::{
        self,
        LguestCpuidEntry,
        LguestRegs,
        LguestVmConfig, //
    },
    vcpu::{
        Ctx,
        UserExit,
        Vcpu, //
    },
};

/// How a call of [`Vm::run`] ended.
pub(crate) enum RunStep {
    /// RUN returns this (0: the exit is in the run page).
    Exit(isize),
    /// The vCPU is halted and none of the interrupts not in `blocked` is
    /// pending: sleep until one is raised (or a signal comes), then run
    /// again.
    Sleep { blocked: u64 },
}

/// A guest.
pub(crate) struct Vm {
    mem: GuestMemory,
    /// The shadow tables, and the guest root they shadow.
    shadows: Shadows,
    entry: u64,
    vcpus: KVec<Vcpu>,
    /// Set when the host killed the guest: the reason.
    dead: Option<Kill>,
    /// The address space that created the VM: guest memory is its memory,
    /// so only it may run the guest (as lguest required).
    owner: helpers::MmRef,
    /// The switcher's slot in the owner's top-level table.
    _slot: SlotRef,
    /// Notification addresses bound to eventfds (`LGUEST_IOEVENTFD`).
    notifiers: Arc<Notifiers>,
    /// The launcher's CPUID table (`LGUEST_SET_CPUID`); empty: the host's.
    cpuid: KVec<LguestCpuidEntry>,
}

impl Vm {
    /// Validates `cfg` and builds the VM: pins RAM and the device window,
    /// builds the shadow table with the initial linear map and the switcher.
    pub(crate) fn create(cfg: &LguestVmConfig, notifiers: Arc<Notifiers>) -> Result<Self> {
        let page_mask = PAGE_SIZE - 1;
        if cfg.flags != 0 || cfg.reserved0 != 0 || cfg.reserved.iter().any(|&r| r != 0) {
            return Err(EINVAL);
        }
        if cfg.mem_base & page_mask != 0 || cfg.mem_size & page_mask != 0 || cfg.mem_size == 0 {
            return Err(EINVAL);
        }
        if cfg.mem_size > uapi::LGUEST_MAX_MEM || cfg.device_pages > uapi::LGUEST_MAX_DEVICE_PAGES {
            return Err(EINVAL);
        }
        if cfg.mem_size <= uapi::LGUEST_LOAD_MIN
            || cfg.entry < uapi::LGUEST_LOAD_MIN
            || cfg.entry >= cfg.mem_size
        {
            return Err(EINVAL);
        }
        let total = cfg
            .mem_size
            .checked_add(cfg.device_pages * PAGE_SIZE)
            .and_then(|t| cfg.mem_base.checked_add(t))
            .ok_or(EINVAL)?;
        // Userspace addresses only (the lower half).
        if total > (1u64 << 47) {
            return Err(EINVAL);
        }

        let owner = helpers::MmRef::current().ok_or(EINVAL)?;
        let slot = SlotRef::attach()?;
        // Guest memory is RAM and the device window above it (the lguest
        // bus: device table and whatever else the launcher shares there).
        // All of it is pinned and counts as the launcher's locked memory.
        let size = cfg.mem_size + cfg.device_pages * PAGE_SIZE;
        let npages = (size / PAGE_SIZE) as usize;
        owner.account_locked(npages, true)?;
        match Self::pin_and_map(cfg.mem_base, size) {
            Ok((mem, shadows)) => Ok(Vm {
                mem,
                shadows,
                entry: cfg.entry,
                vcpus: KVec::new(),
                dead: None,
                owner,
                _slot: slot,
                notifiers,
                cpuid: KVec::new(),
            }),
            Err(e) => {
                // No `Vm` to refund it on drop: refund the charge here.
                let _ = owner.account_locked(npages, false);
                Err(e)
            }
        }
    }

    /// Pins guest memory (`size` bytes at launcher address `base`) and
    /// builds the first shadow pair.
    fn pin_and_map(base: u64, size: u64) -> Result<(GuestMemory, Shadows)> {
        let mem = GuestMemory::pin(base, size)?;
        let mut shadows = Shadows::new(crate::shadow::budget_for(size))?;
        // The initial linear map: guest-virtual = guest-physical for RAM
        // above the first megabyte (so that null pointers fault) and the
        // device window.
        let user = PTE_P | PTE_RW | PTE_US;
        let mut gfn = uapi::LGUEST_LOAD_MIN / PAGE_SIZE;
        while gfn * PAGE_SIZE < size {
            let phys = mem.host_phys(gfn).ok_or(EFAULT)?;
            shadows.map_linear(gfn * PAGE_SIZE, phys | user | PTE_A | PTE_D)?;
            gfn += 1;
        }
        Ok((mem, shadows))
    }

    /// Creates the next vCPU, with its interrupt state `irq`; returns its
    /// index and its run page (for the launcher's mmap).
    pub(crate) fn create_vcpu(&mut self, irq: Arc<VcpuIrq>) -> Result<(u32, Arc<HostPage>)> {
        let index = self.vcpus.len() as u32;
        if index >= uapi::LGUEST_MAX_VCPUS {
            return Err(EBUSY);
        }
        let sw = Switcher::get()?;
        let run = Arc::new(HostPage::new()?, GFP_KERNEL)?;
        let vcpu = Vcpu::new(self.entry, irq, run.clone(), sw.xsave_mask())?;
        self.vcpus.push(vcpu, GFP_KERNEL)?;
        Ok((index, run))
    }

    /// Replaces the CPUID table with `table`, already validated
    /// (`uapi::cpuid_table_valid`).
    pub(crate) fn set_cpuid(&mut self, table: KVec<LguestCpuidEntry>) {
        self.cpuid = table;
    }

    /// Reads vCPU `index`'s registers.
    pub(crate) fn get_regs(&self, index: usize) -> Result<LguestRegs> {
        Ok(self.vcpus.get(index).ok_or(EINVAL)?.cpu.regs)
    }

    /// Writes vCPU `index`'s registers (flags are clamped; RIP and RSP must
    /// be addresses the guest may run at, `GuestCpu::enterable`).
    pub(crate) fn set_regs(&mut self, index: usize, mut regs: LguestRegs) -> Result {
        let v = self.vcpus.get_mut(index).ok_or(EINVAL)?;
        if !GuestCpu::enterable(regs.rip, regs.rsp) {
            return Err(EINVAL);
        }
        regs.rflags = GuestCpu::sanitize_flags(regs.rflags);
        v.cpu.regs = regs;
        Ok(())
    }

    /// `run_guest`: runs vCPU `index` until the launcher is needed
    /// (`RunStep::Exit(0)`, the exit in the run page) or the vCPU halts
    /// with nothing to deliver (`RunStep::Sleep`: the caller sleeps, without
    /// the VM's lock, and calls again). `EINTR` for a signal. The caller
    /// has made the current task the one interrupt sources wake and kick.
    pub(crate) fn run(&mut self, index: usize) -> Result<RunStep> {
        let sw = Switcher::get()?;
        if index >= self.vcpus.len() {
            return Err(EINVAL);
        }
        if !self.owner.is_current() {
            return Err(EPERM);
        }
        let Vm {
            mem,
            shadows,
            vcpus,
            dead,
            notifiers,
            cpuid,
            ..
        } = self;
        let mut cx = Ctx {
            vcpu: &mut vcpus[index],
            mem,
            shadows,
            notifiers,
            cpuid,
        };
        if cx.vcpu.immediate_exit() {
            return interrupted(&mut cx);
        }
        loop {
            if let Some(reason) = dead {
                cx.vcpu.stat_shadow_pages = cx.shadows.pages() as u64;
                cx.vcpu.stat_shadow_reuses = cx.shadows.reuses();
                let v = &*cx.vcpu;
                v.write_exit(uapi::LGUEST_EXIT_KILLED, 0, 0, 0, reason.bytes());
                return Ok(RunStep::Exit(0));
            }
            // A signal, or the freezer's fake one, ends RUN: the launcher's
            // thread meets it on its way back to user mode.
            if helpers::signal_pending() {
                return interrupted(&mut cx);
            }
            helpers::cond_resched();

            if cx.vcpu.halted {
                match interrupts::halted(&mut cx) {
                    Ok(Halted::Wake) => {}
                    Ok(Halted::Sleep { blocked }) => return Ok(RunStep::Sleep { blocked }),
                    Ok(Halted::Never) => {
                        cx.vcpu.halted = false;
                        return Ok(report(&mut cx, UserExit::Halt));
                    }
                    Err(k) => {
                        record_kill(dead, k);
                        continue;
                    }
                }
            }
            // Interrupts raised from here on make the entry abort (and this
            // loop look again), rather than wait in the guest for its next
            // exit: the pinned clock event fires on this very CPU.
            let seen = cx.vcpu.irq.raised();
            if let Err(k) = interrupts::maybe_deliver(&mut cx) {
                record_kill(dead, k);
                continue;
            }
            // The tests widen this window (`entry_window_delay_us`).
            let delay = crate::module_parameters::entry_window_delay_us.value();
            if delay != 0 {
                helpers::udelay(core::cmp::min(delay, 10_000));
            }

            let vcpu = &mut *cx.vcpu;
            // Upper-half mappings meet the host's global TLB entries: the
            // entry flushes them.
            let upper = cx.shadows.upper();
            let direct = if vcpu.syscall_direct {
                vcpu.syscall_entry
            } else {
                0
            };
            let fpu_loaded = vcpu.fpu.active();
            let exit = sw.run_once(
                cx.shadows,
                &mut vcpu.cpu,
                direct,
                vcpu.irq_pending_set,
                &mut vcpu.fpu,
                &vcpu.irq,
                seen,
            )?;
            vcpu.stat_exits += 1;
            if let Some((back, want)) = vcpu.cpu.msr_test_lost.take() {
                let lost: Result<(), Kill> =
                    kill!("syscall_msr_test: the exit left LSTAR, STAR, SYSCALL_MASK {back:#x?}, not {want:#x?}");
                if let Err(k) = lost {
                    record_kill(dead, k);
                }
                continue;
            }
            vcpu.stat_fpu_entries += fpu_loaded as u64;
            if upper
                && sw.flushes_global()
                && !matches!(exit, Exit::Aborted | Exit::BadState { .. })
            {
                vcpu.stat_global_flushes += 1;
            }
            let outcome = match exit {
                Exit::Trap { vector, error, cr2 } => handle_trap(&mut cx, vector, error, cr2),
                Exit::Aborted | Exit::HostEvent | Exit::FpuLoaded => continue,
                Exit::MachineCheck => {
                    // Work the handler queued (a memory-failure kill) runs on
                    // the return to user mode.
                    if helpers::notify_resume_pending() {
                        return interrupted(&mut cx);
                    }
                    continue;
                }
                Exit::BadState { rip } => {
                    kill!("the guest cannot run at rip {rip:#x}: not a canonical address")
                }
                Exit::SwitcherFault {
                    vector,
                    error,
                    offset,
                } => {
                    kernel::pr_err_once!(
                        "the switcher took exception {} (error {:#x}) in ring 0 at offset {:#x}; the guest was killed\n",
                        vector,
                        error,
                        offset
                    );
                    kill!(
                        "the switcher faulted in ring 0 ({}, error {error:#x}) entering or leaving the guest",
                        trap_name(vector)
                    )
                }
            };
            match outcome {
                Ok(None) => continue,
                Ok(Some(exit)) => return Ok(report(&mut cx, exit)),
                Err(reason) => record_kill(dead, reason),
            }
        }
    }
}

/// RUN returns `EINTR` (a signal, the launcher's kick): the run page's
/// counters are brought up to date, its exit left as it was.
fn interrupted(cx: &mut Ctx<'_>) -> Result<RunStep> {
    cx.vcpu.stat_shadow_pages = cx.shadows.pages() as u64;
    cx.vcpu.stat_shadow_reuses = cx.shadows.reuses();
    cx.vcpu.write_stats();
    Err(EINTR)
}

/// Fills the run page for `exit`, with the shadow table count of the
/// moment: RUN returns.
fn report(cx: &mut Ctx<'_>, exit: UserExit) -> RunStep {
    cx.vcpu.stat_shadow_pages = cx.shadows.pages() as u64;
    cx.vcpu.stat_shadow_reuses = cx.shadows.reuses();
    cx.vcpu.report(exit);
    RunStep::Exit(0)
}

/// The guest trapped to the host with `vector` (hardware `error`, and
/// `cr2` for a page fault): a hypercall, a shadow page-table miss, or
/// something for the guest's own handlers. `Ok(Some(..))`: the launcher
/// must act.
fn handle_trap(
    cx: &mut Ctx<'_>,
    vector: u64,
    error: u64,
    cr2: u64,
) -> Result<Option<UserExit>, Kill> {
    // `int $0x1f`, or a kernel's `syscall` with a direct entry on a host
    // where the switcher does not take it (no FSGSBASE).
    let hypercall = vector == uapi::LGUEST_TRAP_ENTRY as u64
        || (vector == 6 && interrupts::syscall_hypercall(cx)?);
    // A page fault the guest itself caused (the hardware says user mode:
    // the guest always runs in ring 3) may just be the shadow table
    // catching up.
    let guest_pf = vector == 14 && error & 4 != 0;
    if hypercall && cx.vcpu.cpu.user_mode {
        // Guest user mode may not make hypercalls: to the guest kernel this
        // is `int $0x1f` through a gate of DPL 0, a fault at the two-byte
        // instruction.
        let error = ((uapi::LGUEST_TRAP_ENTRY as u64) << 3) | 2;
        let rip = &mut cx.vcpu.cpu.regs.rip;
        *rip = rip.wrapping_sub(2);
        interrupts::reflect_trap(cx, 13, error, 0).map(|()| None)
    } else if hypercall {
        hcall::do_hypercalls(cx)
    } else if guest_pf {
        match paging::demand_page(cx, cr2, error)? {
            Fault::Fixed => Ok(None),
            Fault::Reflect(e) => interrupts::reflect_trap(cx, 14, e, cr2).map(|()| None),
        }
    } else {
        interrupts::hardware_trap(cx, vector, error, cr2).map(|()| None)
    }
}

/// Kills the guest: it will not run again, and RUN reports `reason` (the
/// first reason stands).
fn record_kill(dead: &mut Option<Kill>, reason: Kill) {
    if dead.is_none() {
        if kill_log_allowed() {
            let text = core::str::from_utf8(reason.bytes()).unwrap_or("(unprintable)");
            pr_info!("guest killed: {}\n", text);
        }
        *dead = Some(reason);
    }
}

/// Kill messages in the host's log: at most `KILL_LOG_BURST` every
/// `KILL_LOG_PERIOD_NS` (VMs are cheap: a user could flood the log). The
/// launcher always gets the reason in the run page.
const KILL_LOG_BURST: u64 = 10;
const KILL_LOG_PERIOD_NS: u64 = 5_000_000_000;
static KILL_LOG_WINDOW: AtomicU64 = AtomicU64::new(0);
static KILL_LOG_COUNT: AtomicU64 = AtomicU64::new(0);

fn kill_log_allowed() -> bool {
    let now = helpers::monotonic_ns();
    let start = KILL_LOG_WINDOW.load(Ordering::Relaxed);
    if now.wrapping_sub(start) > KILL_LOG_PERIOD_NS
        && KILL_LOG_WINDOW
            .compare_exchange(start, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
    {
        KILL_LOG_COUNT.store(0, Ordering::Relaxed);
    }
    KILL_LOG_COUNT.fetch_add(1, Ordering::Relaxed) < KILL_LOG_BURST
}

impl Drop for Vm {
    fn drop(&mut self) {
        // Refund the locked-memory charge taken in `create` (the pins go
        // when `mem` drops, right after this).
        let _ = self
            .owner
            .account_locked((self.mem.size() / PAGE_SIZE) as usize, false);
    }
}
