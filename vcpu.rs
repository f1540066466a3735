// SPDX-License-Identifier: GPL-2.0
//! One vCPU's state, its run page, and [`Ctx`]: what the exit handlers
//! (`hcall.rs`, `interrupts.rs`, `paging.rs`, `emulate.rs`) are given.
//!
//! A `Ctx` borrows one vCPU mutably and, beside it, the VM's memory, its
//! shadow tables and its notifier table: split borrows of the [`Vm`]
//! (`vm.rs`), so a handler reaches exactly what it may change and no
//! vCPU index is threaded through the calls. Everything here is used by
//! the run loop with the VM's lock held.
//!
//! [`Vm`]: crate::vm::Vm

use kernel::{
    prelude::*,
    sync::Arc, //
};

use crate::{
    gmem::{
        GuestMemory,
        HostPage,
        RunExit,
        RunStats, //
    },
    interrupts::GuestGate,
    irq::{
        ClockEvent,
        VcpuIrq, //
    },
    lguest_data::LguestData,
    notify::Notifiers,
    paging,
    shadow::Shadows,
    switcher::{
        GuestCpu,
        GuestFpu, //
    },
    uapi::{
        self,
        LguestCpuidEntry, //
    },
};

/// Why a run ended in the launcher.
pub(crate) enum UserExit {
    /// `LHCALL_NOTIFY(addr, arg)`.
    Notify { addr: u64, arg: u64 },
    /// `LHCALL_SHUTDOWN`: reason and the guest's message.
    Shutdown { reason: u64, message: KVec<u8> },
    /// `LHCALL_HALT` with nothing that could wake the guest.
    Halt,
}

/// One vCPU.
pub(crate) struct Vcpu {
    /// Registers and what the switcher needs.
    pub(crate) cpu: GuestCpu,
    /// The guest's FPU, SSE and AVX state.
    pub(crate) fpu: GuestFpu,
    /// The guest's interrupt descriptor table (`LHCALL_LOAD_IDT_ENTRY`).
    pub(crate) idt: KBox<[GuestGate; 256]>,
    /// Interrupt sources, shared with the timer and other threads.
    pub(crate) irq: Arc<VcpuIrq>,
    /// The armed clock event, if any (dropping it cancels the timer).
    pub(crate) clock: Option<ClockEvent>,
    /// The guest made `LHCALL_HALT` and waits for an interrupt.
    pub(crate) halted: bool,
    /// What we last wrote to `lguest_data.irq_pending`.
    pub(crate) irq_pending_set: bool,
    /// The run page shared with the launcher (mmap at `index * 4096`).
    run: Arc<HostPage>,
    /// The guest's `lguest_data`, once registered.
    pub(crate) lguest_data: Option<LguestData>,
    /// Frames carry Linux's selectors and are left with `LHCALL_IRET`
    /// (`LGUEST_INIT_LINUX_FRAMES`).
    pub(crate) linux_frames: bool,
    /// Next async ring entry to look at.
    pub(crate) next_hcall: usize,
    /// The guest kernel's stack for entries from user mode
    /// (`LHCALL_SET_STACK`); 0 until set.
    pub(crate) kernel_stack: u64,
    /// The guest kernel's entry for user-mode `syscall`
    /// (`LHCALL_SET_SYSCALL`); 0: none, `syscall` is #UD.
    pub(crate) syscall_entry: u64,
    /// The entry takes the direct contract (`LGUEST_SYSCALL_DIRECT`): the
    /// switcher's fast paths are armed while the guest has its own tables.
    pub(crate) syscall_direct: bool,
    /// The guest's XCR0 as its emulated `xsetbv` set it (the host's FPU
    /// mask until then); the CPU keeps the host's.
    pub(crate) xcr0: u64,
    pub(crate) stat_exits: u64,
    pub(crate) stat_hypercalls: u64,
    /// Shadow page-table pages of the VM, as of the last exit.
    pub(crate) stat_shadow_pages: u64,
    /// Root switches that found the next root's shadow kept.
    pub(crate) stat_shadow_reuses: u64,
    /// Entries with the FPU state loaded.
    pub(crate) stat_fpu_entries: u64,
    pub(crate) stat_global_flushes: u64,
}

impl Vcpu {
    /// The CS and SS of a frame for an event in user mode (`user`) or
    /// kernel mode, as the guest chose at `LHCALL_LGUEST_INIT`.
    pub(crate) fn frame_selectors(&self, user: bool) -> (u64, u64) {
        match (self.linux_frames, user) {
            (true, false) => (uapi::LGUEST_KERNEL_CS, uapi::LGUEST_KERNEL_SS),
            (true, true) => (uapi::LGUEST_GUEST_CS, uapi::LGUEST_GUEST_SS),
            (false, false) => (uapi::LGUEST_GUEST_CS, uapi::LGUEST_GUEST_SS),
            (false, true) => (uapi::LGUEST_USER_CS, uapi::LGUEST_GUEST_SS),
        }
    }

    /// A vCPU about to run at `entry`, with interrupt state `irq`, the run
    /// page `run` and XCR0 `xcr0` (the host's FPU mask).
    pub(crate) fn new(
        entry: u64,
        irq: Arc<VcpuIrq>,
        run: Arc<HostPage>,
        xcr0: u64,
    ) -> Result<Self> {
        let mut cpu = GuestCpu::default();
        cpu.regs.rip = entry;
        cpu.regs.rflags = GuestCpu::sanitize_flags(0);
        Ok(Self {
            cpu,
            fpu: GuestFpu::new()?,
            idt: KBox::new([GuestGate::default(); 256], GFP_KERNEL)?,
            irq,
            clock: None,
            halted: false,
            irq_pending_set: false,
            run,
            lguest_data: None,
            linux_frames: false,
            next_hcall: 0,
            kernel_stack: 0,
            syscall_entry: 0,
            syscall_direct: false,
            xcr0,
            stat_exits: 0,
            stat_hypercalls: 0,
            stat_shadow_pages: 0,
            stat_shadow_reuses: 0,
            stat_fpu_entries: 0,
            stat_global_flushes: 0,
        })
    }

    /// Reads `immediate_exit` once.
    pub(crate) fn immediate_exit(&self) -> bool {
        self.run.run_immediate_exit()
    }

    /// Fills the run page for an exit to the launcher, with the vCPU's
    /// counters.
    pub(crate) fn write_exit(
        &self,
        reason: u32,
        addr: u64,
        arg: u64,
        shutdown: u64,
        message: &[u8],
    ) {
        self.run.run_write_exit(&RunExit {
            reason,
            notify_addr: addr,
            notify_arg: arg,
            shutdown_reason: shutdown,
            stats: self.stats(),
            message,
        });
    }

    /// The counters, as the run page shows them.
    fn stats(&self) -> RunStats {
        RunStats {
            exits: self.stat_exits,
            hypercalls: self.stat_hypercalls,
            shadow_pages: self.stat_shadow_pages,
            fpu_entries: self.stat_fpu_entries,
            global_flushes: self.stat_global_flushes,
            direct_syscalls: self.cpu.direct_syscalls,
            direct_sysrets: self.cpu.direct_sysrets,
            ibpbs: self.cpu.ibpbs,
            shadow_reuses: self.stat_shadow_reuses,
        }
    }

    /// Copies the counters into the run page (RUN returns for a signal).
    pub(crate) fn write_stats(&self) {
        self.run.run_write_stats(&self.stats());
    }

    /// Fills the run page for `exit`.
    pub(crate) fn report(&self, exit: UserExit) {
        match exit {
            UserExit::Notify { addr, arg } => {
                self.write_exit(uapi::LGUEST_EXIT_NOTIFY, addr, arg, 0, b"")
            }
            UserExit::Shutdown { reason, message } => {
                self.write_exit(uapi::LGUEST_EXIT_SHUTDOWN, 0, 0, reason, &message)
            }
            UserExit::Halt => self.write_exit(uapi::LGUEST_EXIT_HALT, 0, 0, 0, b""),
        }
    }
}

/// What an exit handler works on: one vCPU, and the VM's memory, shadow
/// tables and notification table beside it.
pub(crate) struct Ctx<'a> {
    pub(crate) vcpu: &'a mut Vcpu,
    pub(crate) mem: &'a GuestMemory,
    pub(crate) shadows: &'a mut Shadows,
    pub(crate) notifiers: &'a Notifiers,
    /// The VM's CPUID table (`LGUEST_SET_CPUID`).
    pub(crate) cpuid: &'a [LguestCpuidEntry],
}

impl Ctx<'_> {
    /// Copies guest-virtual memory at `va` into `buf`, through the guest's
    /// tables (or the linear map).
    pub(crate) fn read_va(&self, va: u64, buf: &mut [u8]) -> Result {
        paging::read_va(self.mem, self.shadows.guest_root(), va, buf)
    }

    /// Copies `data` to guest-virtual memory at `va`.
    pub(crate) fn write_va(&self, va: u64, data: &[u8]) -> Result {
        paging::write_va(self.mem, self.shadows.guest_root(), va, data)
    }
}
