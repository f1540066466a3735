// SPDX-License-Identifier: GPL-2.0
//! A VM: its pinned memory, its shadow page table, its vCPU, and the run
//! loop (`run_guest`).
//!
//! A [`Vm`] lives inside the open file's lock (see `dev.rs`); every method
//! here is called with that lock held, so the VM needs no lock of its own.
//! RUN holds the lock while the guest runs, but not while a halted vCPU
//! sleeps ([`RunStep::Sleep`]); the launcher kicks a running vCPU with a
//! signal (and `immediate_exit`), not with another ioctl.

use core::sync::atomic::{
    AtomicU64,
    Ordering, //
};
use kernel::{
    prelude::*,
    sync::Arc, //
};

use crate::{
    hcall, helpers,
    interrupts::{
        self,
        GuestGate,
        Halted, //
    },
    irq::{
        ClockEvent,
        VcpuIrq, //
    },
    kill::{
        kill,
        trap_name,
        Kill, //
    },
    mm::{
        GuestMemory,
        HostPage,
        ShadowTable,
        PAGE_SIZE,
        PTE_A,
        PTE_D,
        PTE_P,
        PTE_RW,
        PTE_US, //
    },
    notify::Notifiers,
    paging::{
        self,
        Fault, //
    },
    switcher::{
        Exit,
        GuestCpu,
        GuestFpu,
        Switcher, //
    },
    uapi::{
        self,
        LguestRegs,
        LguestRun,
        LguestVmConfig, //
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

/// How a call of [`Vm::run`] ended.
pub(crate) enum RunStep {
    /// RUN returns this (0: the exit is in the run page).
    Exit(isize),
    /// The vCPU is halted and none of the interrupts not in `blocked` is
    /// pending: sleep until one is raised (or a signal comes), then run
    /// again.
    Sleep { blocked: u64 },
}

/// One vCPU.
pub(crate) struct Vcpu {
    /// Registers and what the switcher needs.
    pub(crate) cpu: GuestCpu,
    /// The guest's FPU, SSE and AVX state.
    fpu: GuestFpu,
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
    /// Guest-physical address of `struct lguest_data`, once registered.
    pub(crate) lguest_data: Option<u64>,
    /// Next async ring entry to look at.
    pub(crate) next_hcall: usize,
    /// The guest is in user mode: it runs on the user shadow table, and
    /// the next interrupt or exception enters its kernel on `kernel_stack`.
    pub(crate) user_mode: bool,
    /// The guest kernel's stack for entries from user mode
    /// (`LHCALL_SET_STACK`); 0 until set.
    pub(crate) kernel_stack: u64,
    /// The guest kernel's entry for user-mode `syscall`
    /// (`LHCALL_SET_SYSCALL`); 0: none, `syscall` is #UD.
    pub(crate) syscall_entry: u64,
    /// The guest's XCR0 as its emulated `xsetbv` set it (the host's FPU
    /// mask until then); the CPU keeps the host's.
    pub(crate) xcr0: u64,
    stat_exits: u64,
    pub(crate) stat_hypercalls: u64,
    /// Shadow page-table pages of the VM, as of the last exit.
    stat_shadow_pages: u64,
    /// Entries with the FPU state loaded.
    stat_fpu_entries: u64,
}

/// The shadow tables of one guest root: the guest kernel's view (every
/// mapping of the guest's tables) and guest user mode's view (only pages
/// with the U/S bit set at every level), as Xen PV and PVM split them. Both
/// map the switcher.
pub(crate) struct ShadowPair {
    kernel: ShadowTable,
    user: ShadowTable,
}

impl ShadowPair {
    /// Two empty tables, with the switcher mapped in each.
    fn new() -> Result<Self> {
        let sw = Switcher::get()?;
        let mut kernel = ShadowTable::new(sw.levels())?;
        sw.map_into(&mut kernel)?;
        kernel.mark_switcher_pages();
        let mut user = ShadowTable::new(sw.levels())?;
        sw.map_into(&mut user)?;
        user.mark_switcher_pages();
        Ok(Self { kernel, user })
    }

    /// Table pages in both.
    fn pages(&self) -> usize {
        self.kernel.table_pages() + self.user.table_pages()
    }

    /// Table pages in both that the guest's mappings made (its budget).
    fn guest_pages(&self) -> usize {
        self.kernel.guest_pages() + self.user.guest_pages()
    }

    /// Forgets guest-virtual page `va` in both.
    fn unmap(&mut self, va: u64) {
        // Not mapped (no table on the way) is fine: nothing to forget.
        let _ = self.kernel.set_existing(va, 0);
        let _ = self.user.set_existing(va, 0);
    }
}

/// Shadow roots kept for guest roots that are not current, so that
/// switching back (a guest context switch) does not start from nothing.
pub(crate) const ROOT_CACHE: usize = 4;

/// A cached shadow pair and the guest root it shadows.
struct CachedRoot {
    root: u64,
    pair: ShadowPair,
    /// When it was last current (for least-recently-used eviction).
    stamp: u64,
}

/// A guest.
pub(crate) struct Vm {
    pub(crate) mem: GuestMemory,
    /// The shadow pair of the current guest root (or of the linear map).
    shadow: ShadowPair,
    /// Other guest roots' shadow pairs, at most [`ROOT_CACHE`].
    roots: KVec<CachedRoot>,
    /// Counts root switches (the clock of `CachedRoot::stamp`).
    switches: u64,
    entry: u64,
    pub(crate) vcpus: KVec<Vcpu>,
    /// Set when the host killed the guest: the reason.
    dead: Option<Kill>,
    /// The guest's own top-level page table (guest-physical), once it gave
    /// one with `LHCALL_NEW_PGTABLE`; until then the linear map.
    pub(crate) guest_root: Option<u64>,
    /// The address space that created the VM: guest memory is its memory,
    /// so only it may run the guest (as lguest required).
    owner: helpers::MmRef,
    /// Notification addresses bound to eventfds (`LGUEST_IOEVENTFD`).
    pub(crate) notifiers: Arc<Notifiers>,
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
        // Guest memory is RAM and the device window above it (the lguest
        // bus: device table and whatever else the launcher shares there).
        // All of it is pinned and counts as the launcher's locked memory.
        let size = cfg.mem_size + cfg.device_pages * PAGE_SIZE;
        let npages = (size / PAGE_SIZE) as usize;
        owner.account_locked(npages, true)?;
        match Self::pin_and_map(cfg.mem_base, size) {
            Ok((mem, shadow)) => Ok(Vm {
                mem,
                shadow,
                roots: KVec::new(),
                switches: 0,
                entry: cfg.entry,
                vcpus: KVec::new(),
                dead: None,
                guest_root: None,
                owner,
                notifiers,
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
    fn pin_and_map(base: u64, size: u64) -> Result<(GuestMemory, ShadowPair)> {
        let mem = GuestMemory::pin(base, size)?;
        let mut shadow = ShadowPair::new()?;
        // The initial linear map: guest-virtual = guest-physical for RAM
        // above the first megabyte (so that null pointers fault) and the
        // device window.
        let user = PTE_P | PTE_RW | PTE_US;
        let mut gfn = uapi::LGUEST_LOAD_MIN / PAGE_SIZE;
        while gfn * PAGE_SIZE < size {
            let phys = mem.host_phys(gfn).ok_or(EFAULT)?;
            shadow
                .kernel
                .map(gfn * PAGE_SIZE, phys | user | PTE_A | PTE_D, user)?;
            gfn += 1;
        }
        Ok((mem, shadow))
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
        let mut cpu = GuestCpu::default();
        cpu.regs.rip = self.entry;
        cpu.regs.rflags = GuestCpu::sanitize_flags(0);
        self.vcpus.push(
            Vcpu {
                cpu,
                fpu: GuestFpu::new()?,
                idt: KBox::new([GuestGate::default(); 256], GFP_KERNEL)?,
                irq,
                clock: None,
                halted: false,
                irq_pending_set: false,
                run: run.clone(),
                lguest_data: None,
                next_hcall: 0,
                user_mode: false,
                kernel_stack: 0,
                syscall_entry: 0,
                xcr0: sw.xsave_mask(),
                stat_exits: 0,
                stat_hypercalls: 0,
                stat_shadow_pages: 0,
                stat_fpu_entries: 0,
            },
            GFP_KERNEL,
        )?;
        Ok((index, run))
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

    /// Kills the guest: it will not run again, and RUN reports `reason`.
    pub(crate) fn kill(&mut self, reason: Kill) {
        if self.dead.is_none() {
            if kill_log_allowed() {
                let text = core::str::from_utf8(reason.bytes()).unwrap_or("(unprintable)");
                pr_info!("guest killed: {}\n", text);
            }
            self.dead = Some(reason);
        }
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
        if self.vcpus[index].immediate_exit() {
            return Err(EINTR);
        }
        loop {
            if let Some(reason) = &self.dead {
                self.vcpus[index].stat_shadow_pages = self.shadow_pages() as u64;
                let v = &self.vcpus[index];
                v.write_exit(uapi::LGUEST_EXIT_KILLED, 0, 0, 0, reason.bytes());
                return Ok(RunStep::Exit(0));
            }
            // A signal, or the freezer's fake one, ends RUN: the launcher's
            // thread meets it on its way back to user mode.
            if helpers::signal_pending() {
                return Err(EINTR);
            }
            helpers::cond_resched();

            if self.vcpus[index].halted {
                match interrupts::halted(self, index) {
                    Ok(Halted::Wake) => {}
                    Ok(Halted::Sleep { blocked }) => return Ok(RunStep::Sleep { blocked }),
                    Ok(Halted::Never) => {
                        self.vcpus[index].halted = false;
                        self.vcpus[index].stat_shadow_pages = self.shadow_pages() as u64;
                        self.vcpus[index].report(UserExit::Halt);
                        return Ok(RunStep::Exit(0));
                    }
                    Err(k) => {
                        self.kill(k);
                        continue;
                    }
                }
            }
            // Interrupts raised from here on make the entry abort (and this
            // loop look again), rather than wait in the guest for its next
            // exit: the pinned clock event fires on this very CPU.
            let seen = self.vcpus[index].irq.raised();
            if let Err(k) = interrupts::maybe_deliver(self, index) {
                self.kill(k);
                continue;
            }

            let vcpu = &mut self.vcpus[index];
            let shadow = if vcpu.user_mode {
                &mut self.shadow.user
            } else {
                &mut self.shadow.kernel
            };
            let fpu_loaded = vcpu.fpu.active();
            let exit = sw.run_once(shadow, &mut vcpu.cpu, &mut vcpu.fpu, &vcpu.irq, seen)?;
            vcpu.stat_exits += 1;
            vcpu.stat_fpu_entries += fpu_loaded as u64;
            let user_mode = vcpu.user_mode;
            let (vector, error, cr2) = match exit {
                Exit::Trap { vector, error, cr2 } => (vector, error, cr2),
                Exit::Aborted | Exit::HostEvent | Exit::FpuLoaded => continue,
                Exit::MachineCheck => {
                    // Work the handler queued (a memory-failure kill) runs on
                    // the return to user mode.
                    if helpers::notify_resume_pending() {
                        return Err(EINTR);
                    }
                    continue;
                }
                Exit::BadState { rip } => {
                    let k: Result<(), Kill> =
                        kill!("the guest cannot run at rip {rip:#x}: beyond the last guest page");
                    if let Err(k) = k {
                        self.kill(k);
                    }
                    continue;
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
                    let k: Result<(), Kill> = kill!(
                        "the switcher faulted in ring 0 ({}, error {error:#x}) entering or leaving the guest",
                        trap_name(vector)
                    );
                    if let Err(k) = k {
                        self.kill(k);
                    }
                    continue;
                }
            };
            // A page fault the guest itself caused (the hardware says user
            // mode: the guest always runs in ring 3) may just be the shadow
            // table catching up.
            let guest_pf = vector == 14 && error & 4 != 0;
            let outcome = if vector == uapi::LGUEST_TRAP_ENTRY as u64 && user_mode {
                // Guest user mode may not make hypercalls: to the guest
                // kernel this is `int $0x1f` through a gate of DPL 0, a
                // fault at the two-byte instruction.
                let error = ((uapi::LGUEST_TRAP_ENTRY as u64) << 3) | 2;
                let rip = &mut self.vcpus[index].cpu.regs.rip;
                *rip = rip.wrapping_sub(2);
                interrupts::reflect_trap(self, index, 13, error, 0).map(|()| None)
            } else if vector == uapi::LGUEST_TRAP_ENTRY as u64 {
                hcall::do_hypercalls(self, index)
            } else if guest_pf {
                match paging::demand_page(self, index, cr2, error) {
                    Ok(Fault::Fixed) => Ok(None),
                    Ok(Fault::Reflect(e)) => {
                        interrupts::reflect_trap(self, index, 14, e, cr2).map(|()| None)
                    }
                    Err(k) => Err(k),
                }
            } else {
                interrupts::hardware_trap(self, index, vector, error, cr2).map(|()| None)
            };
            match outcome {
                Ok(None) => continue,
                Ok(Some(exit)) => {
                    self.vcpus[index].stat_shadow_pages = self.shadow_pages() as u64;
                    self.vcpus[index].report(exit);
                    return Ok(RunStep::Exit(0));
                }
                Err(reason) => self.kill(reason),
            }
        }
    }

    /// The guest-physical address of guest-virtual `[va, va + len)`, if it
    /// is mapped: on the linear map RAM above 1 MiB, virtual equal to
    /// physical; with the guest's own tables, by walking them (the range
    /// must not cross a page).
    pub(crate) fn guest_va_to_gpa(&self, va: u64, len: usize) -> Option<u64> {
        let end = va.checked_add(len as u64)?;
        let Some(root) = self.guest_root else {
            return (va >= uapi::LGUEST_LOAD_MIN && end <= self.mem.size()).then_some(va);
        };
        if end > uapi::GUEST_VA_END || (va / PAGE_SIZE) != ((end - 1) / PAGE_SIZE) {
            return None;
        }
        let page = paging::walk(self, root, va).ok().flatten()?.gpa;
        Some(page + va % PAGE_SIZE)
    }

    /// Copies guest-virtual memory at `va` into `buf`, page by page.
    pub(crate) fn read_guest_va(&self, va: u64, buf: &mut [u8]) -> Result {
        let mut done = 0;
        while done < buf.len() {
            let at = va.checked_add(done as u64).ok_or(EFAULT)?;
            let n = core::cmp::min(buf.len() - done, (PAGE_SIZE - at % PAGE_SIZE) as usize);
            let gpa = self.guest_va_to_gpa(at, n).ok_or(EFAULT)?;
            self.read_guest(gpa, &mut buf[done..done + n])?;
            done += n;
        }
        Ok(())
    }

    /// Copies `data` to guest-virtual memory at `va`, page by page.
    pub(crate) fn write_guest_va(&self, va: u64, data: &[u8]) -> Result {
        let mut done = 0;
        while done < data.len() {
            let at = va.checked_add(done as u64).ok_or(EFAULT)?;
            let n = core::cmp::min(data.len() - done, (PAGE_SIZE - at % PAGE_SIZE) as usize);
            let gpa = self.guest_va_to_gpa(at, n).ok_or(EFAULT)?;
            self.write_guest(gpa, &data[done..done + n])?;
            done += n;
        }
        Ok(())
    }

    /// Drops every shadow: the cached roots, and the current pair is
    /// replaced by empty tables (plus the switcher). The guest's mappings
    /// are refilled on demand.
    pub(crate) fn reset_shadow(&mut self) -> Result {
        let fresh = ShadowPair::new()?;
        self.roots.clear();
        self.shadow = fresh;
        Ok(())
    }

    /// Makes guest root `root` current (it is not the current one): the
    /// current pair goes to the cache (evicting the least recently used),
    /// and `root`'s cached pair, if any, comes back.
    pub(crate) fn switch_root(&mut self, root: u64) -> Result {
        let next = match self.roots.iter().position(|c| c.root == root) {
            Some(i) => self.roots.remove(i).map_err(|_| EINVAL)?.pair,
            None => ShadowPair::new()?,
        };
        let old = core::mem::replace(&mut self.shadow, next);
        self.switches += 1;
        // The linear map is never switched back to: it is not kept.
        if let Some(old_root) = self.guest_root.replace(root) {
            if self.roots.len() >= ROOT_CACHE {
                let lru = (0..self.roots.len())
                    .min_by_key(|&i| self.roots[i].stamp)
                    .unwrap_or(0);
                drop(self.roots.remove(lru));
            }
            let cached = CachedRoot {
                root: old_root,
                pair: old,
                stamp: self.switches,
            };
            // With no memory to keep it, the old pair is simply dropped.
            let _ = self.roots.push(cached, GFP_KERNEL);
        }
        Ok(())
    }

    /// Maps guest-virtual page `va` in the current shadow, in the user
    /// table (guest user mode's view) or the kernel table. All shadows
    /// together stay below `paging::MAX_SHADOW_PAGES` table pages: past it
    /// the cached roots go, then the current pair starts over.
    pub(crate) fn shadow_map(&mut self, va: u64, pte: u64, user_view: bool) -> Result {
        let cached: usize = self.roots.iter().map(|c| c.pair.guest_pages()).sum();
        if cached + self.shadow.guest_pages() >= paging::MAX_SHADOW_PAGES {
            self.roots.clear();
            if self.shadow.guest_pages() >= paging::MAX_SHADOW_PAGES {
                self.reset_shadow()?;
            }
        }
        let user = PTE_P | PTE_RW | PTE_US;
        let table = if user_view {
            &mut self.shadow.user
        } else {
            &mut self.shadow.kernel
        };
        table.map(va, pte, user)
    }

    /// Forgets guest-virtual page `va` in every shadow, current and cached
    /// (a guest table may be shared between roots).
    pub(crate) fn shadow_unmap(&mut self, va: u64) {
        self.shadow.unmap(va);
        for c in self.roots.iter_mut() {
            c.pair.unmap(va);
        }
    }

    /// Table pages in all shadows (reported in the run page when RUN
    /// returns).
    pub(crate) fn shadow_pages(&self) -> usize {
        self.shadow.pages() + self.roots.iter().map(|c| c.pair.pages()).sum::<usize>()
    }

    /// Copies `buf.len()` bytes of guest memory (RAM or the device window)
    /// at `gpa` into `buf`, through the pinned pages.
    pub(crate) fn read_guest(&self, gpa: u64, buf: &mut [u8]) -> Result {
        self.mem.read(gpa, buf)
    }

    /// Reads the u64 at guest-physical `gpa`.
    pub(crate) fn read_u64(&self, gpa: u64) -> Result<u64> {
        let mut b = [0u8; 8];
        self.read_guest(gpa, &mut b)?;
        Ok(u64::from_le_bytes(b))
    }

    /// Writes the u64 `v` at guest-physical `gpa`.
    pub(crate) fn write_u64(&self, gpa: u64, v: u64) -> Result {
        self.write_guest(gpa, &v.to_le_bytes())
    }

    /// Copies `data` to guest memory at `gpa`, through the pinned pages.
    pub(crate) fn write_guest(&self, gpa: u64, data: &[u8]) -> Result {
        self.mem.write(gpa, data)
    }
}

impl Vcpu {
    fn run_ptr(&self) -> *mut LguestRun {
        self.run.va().cast()
    }

    /// Reads `immediate_exit` once.
    fn immediate_exit(&self) -> bool {
        // SAFETY: The run page is ours and at least a `LguestRun` long; the
        // launcher may write the byte at any time, hence the volatile read.
        unsafe { core::ptr::addr_of!((*self.run_ptr()).immediate_exit).read_volatile() != 0 }
    }

    /// Fills the run page for an exit to the launcher.
    fn write_exit(&self, reason: u32, addr: u64, arg: u64, shutdown: u64, message: &[u8]) {
        let r = self.run_ptr();
        let n = core::cmp::min(message.len(), uapi::LGUEST_MESSAGE_LEN - 1);
        // SAFETY: `r` points to our run page (see `immediate_exit`); each
        // field is written with a volatile store as the launcher may read it
        // concurrently (it only should after RUN returns).
        unsafe {
            core::ptr::addr_of_mut!((*r).exit_reason).write_volatile(reason);
            core::ptr::addr_of_mut!((*r).notify_addr).write_volatile(addr);
            core::ptr::addr_of_mut!((*r).notify_arg).write_volatile(arg);
            core::ptr::addr_of_mut!((*r).shutdown_reason).write_volatile(shutdown);
            core::ptr::addr_of_mut!((*r).stat_exits).write_volatile(self.stat_exits);
            core::ptr::addr_of_mut!((*r).stat_hypercalls).write_volatile(self.stat_hypercalls);
            core::ptr::addr_of_mut!((*r).stat_shadow_pages).write_volatile(self.stat_shadow_pages);
            core::ptr::addr_of_mut!((*r).stat_fpu_entries).write_volatile(self.stat_fpu_entries);
            let msg = core::ptr::addr_of_mut!((*r).message).cast::<u8>();
            for (i, &b) in message[..n].iter().enumerate() {
                msg.add(i).write_volatile(b);
            }
            msg.add(n).write_volatile(0);
        }
    }

    fn report(&self, exit: UserExit) {
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
