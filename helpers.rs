// SPDX-License-Identifier: GPL-2.0
//! Thin wrappers around the C helpers (`lg_helpers.c`) and the switcher's
//! entry points (`switcher_64.S`).
//!
//! The C side mostly exposes kernel static inlines and macros; each Rust
//! wrapper here is safe where the operation is safe in any context, and
//! `unsafe` with a `# Safety` section where it is not.

use kernel::bindings;

mod ffi {
    extern "C" {
        pub(super) fn lg_irq_save() -> usize;
        pub(super) fn lg_irq_restore(flags: usize);
        pub(super) fn lg_page_to_phys(page: *mut core::ffi::c_void) -> usize;
        pub(super) fn lg_page_address(page: *mut core::ffi::c_void) -> *mut u8;
        pub(super) fn lg_gdt_rw(cpu: u32) -> usize;
        pub(super) fn lg_signal_pending() -> i32;
        pub(super) fn lg_cond_resched();
        pub(super) fn lg_current_mm_grab() -> *mut core::ffi::c_void;
        pub(super) fn lg_current_mm_is(mm: *mut core::ffi::c_void) -> bool;
        pub(super) fn lg_mm_drop(mm: *mut core::ffi::c_void);
        pub(super) fn lg_account_locked_vm(
            mm: *mut core::ffi::c_void,
            pages: usize,
            inc: bool,
        ) -> i32;
        pub(super) fn lg_set_current_interruptible();
        pub(super) fn lg_set_current_running();
        pub(super) fn lg_schedule();
        pub(super) fn lg_read_cr4() -> usize;
        pub(super) fn lg_read_cr3() -> usize;
        pub(super) fn lg_read_efer() -> usize;
        pub(super) fn lg_read_syscall_msrs(out: *mut u64);
        pub(super) fn lg_write_syscall_msrs(v: *const u64);
        pub(super) fn lg_cpuid(leaf: u32, subleaf: u32, out: *mut u32);
        pub(super) fn lg_cpu_id() -> u32;
        pub(super) fn lg_page_offset_base() -> usize;
        pub(super) fn lg_irqfd_attach(
            fd: i32,
            data: *mut core::ffi::c_void,
            irq: u32,
            err: *mut i32,
        ) -> *mut core::ffi::c_void;
        pub(super) fn lg_irqfd_detach(irqfd: *mut core::ffi::c_void);
        pub(super) fn lg_irqfd_matches(irqfd: *mut core::ffi::c_void, fd: i32) -> bool;
        pub(super) fn lg_self_nmi();
        pub(super) fn lg_vmap(pages: *mut *mut core::ffi::c_void, count: u32) -> *mut u8;
        pub(super) fn lg_vunmap(addr: *mut u8);
        pub(super) fn lg_host_ist(out: *mut u64);
        pub(super) fn lg_machine_check_user(ip: usize);
        pub(super) fn lg_notify_resume_pending() -> bool;
        pub(super) fn lg_host_refusal() -> *const core::ffi::c_char;
        pub(super) fn lg_refusal_text(n: u32) -> *const core::ffi::c_char;
        pub(super) fn lg_user_shstk() -> bool;
        pub(super) fn lg_meltdown_without_pti() -> bool;
        pub(super) fn lg_cpu_meltdown() -> bool;
        pub(super) fn lg_fpu_xsave_mask() -> u64;
        pub(super) fn lg_fpu_begin();
        pub(super) fn lg_fpu_end();
        pub(super) fn lg_clear_xfd_err();
        pub(super) fn lg_xfd_arm() -> u64;
        pub(super) fn lg_has_ibpb() -> bool;
        pub(super) fn lguest_ibpb();
        pub(super) fn lg_xfd_restore(old: u64);
        pub(super) fn lg_debugregs_load(addrs: *const u64, dr7: u64, saved: *mut u64);
        pub(super) fn lg_debugregs_restore(saved: *const u64);
        pub(super) fn lg_eventfd_get(fd: i32, err: *mut i32) -> *mut core::ffi::c_void;
        pub(super) fn lg_eventfd_signal(ctx: *mut core::ffi::c_void);
        pub(super) fn lg_eventfd_put(ctx: *mut core::ffi::c_void);
        pub(super) fn lg_mm_pgd(mm: *mut core::ffi::c_void) -> *mut u64;
        pub(super) fn lg_has_invpcid() -> bool;
        pub(super) fn lg_sysenter_in_long_mode() -> bool;
        pub(super) fn lg_flush_tlb_all_cpus();
        pub(super) fn lguest_switch_to_guest(block: *mut u8);
        pub(super) fn lguest_deliver_to_host(handler: usize);
        pub(super) static lguest_switcher_start: u8;
        pub(super) static lguest_switcher_end: u8;
        pub(super) static lguest_idt_stubs: u8;
        pub(super) static lguest_guest_entry: u8;
        pub(super) static lguest_host_resume: u8;
        pub(super) static lguest_syscall: u8;
    }
}

/// Local interrupts disabled; restored to their previous state on drop.
pub(crate) struct IrqGuard(usize);

impl IrqGuard {
    /// Disables local interrupts (and so preemption) until the guard drops.
    pub(crate) fn new() -> Self {
        // SAFETY: local_irq_save() may be called in any context.
        IrqGuard(unsafe { ffi::lg_irq_save() })
    }
}

impl Drop for IrqGuard {
    fn drop(&mut self) {
        // SAFETY: The flags come from the matching lg_irq_save().
        unsafe { ffi::lg_irq_restore(self.0) };
    }
}

/// Physical address of `page`.
///
/// # Safety
///
/// `page` must point to a valid `struct page`.
pub(crate) unsafe fn page_to_phys(page: *mut bindings::page) -> u64 {
    // SAFETY: The caller guarantees `page` is valid; page_to_phys only does
    // arithmetic on it.
    unsafe { ffi::lg_page_to_phys(page.cast()) as u64 }
}

/// Kernel (direct map) address of `page`; x86-64 has no highmem.
///
/// # Safety
///
/// `page` must point to a valid `struct page`.
pub(crate) unsafe fn page_address(page: *mut bindings::page) -> *mut u8 {
    // SAFETY: As above.
    unsafe { ffi::lg_page_address(page.cast()) }
}

/// Address of the writable alias of `cpu`'s GDT.
pub(crate) fn gdt_rw(cpu: u32) -> usize {
    // SAFETY: get_cpu_gdt_rw() is per-cpu address arithmetic, valid for any
    // possible CPU; callers pass CPU ids below nr_cpu_ids.
    unsafe { ffi::lg_gdt_rw(cpu) }
}

/// Whether the current task has a signal pending.
pub(crate) fn signal_pending() -> bool {
    // SAFETY: signal_pending(current) may be called from process context.
    unsafe { ffi::lg_signal_pending() != 0 }
}

/// Gives the scheduler a chance to run something else.
pub(crate) fn cond_resched() {
    // SAFETY: Called from process context with no locks held by the caller
    // that would forbid sleeping (the run loop's callers guarantee it).
    unsafe { ffi::lg_cond_resched() }
}

/// Nanoseconds of the monotonic clock.
pub(crate) fn monotonic_ns() -> u64 {
    // SAFETY: ktime_get() may be called in any context once timekeeping
    // is up, long before modules load.
    unsafe { bindings::ktime_get() as u64 }
}

/// Busy-waits `us` microseconds, interrupts as they are.
pub(crate) fn udelay(us: u32) {
    // SAFETY: __udelay only spins on the TSC; any context.
    unsafe { bindings::__udelay(us as usize) }
}

/// The wall-clock time: seconds and nanoseconds since the epoch.
pub(crate) fn real_time() -> (u64, u64) {
    let mut ts = bindings::timespec64 {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec64 to fill in; any context.
    unsafe { bindings::ktime_get_real_ts64(&mut ts) };
    (ts.tv_sec as u64, ts.tv_nsec as u64)
}

/// The TSC's frequency in kHz if the TSC is stable, else 0.
pub(crate) fn tsc_khz_if_stable() -> u32 {
    // SAFETY: check_tsc_unstable() may be called from any context, and
    // tsc_khz is a plain variable, read once here (it may be refined after
    // boot, so the caller gets the value of the moment).
    unsafe {
        if bindings::check_tsc_unstable() == 0 {
            bindings::tsc_khz
        } else {
            0
        }
    }
}

/// Whether work is queued for the current task's return to user mode
/// (`TIF_NOTIFY_RESUME`: a memory-failure kill after a machine check, say).
pub(crate) fn notify_resume_pending() -> bool {
    // SAFETY: Tests a flag of the current task; any context.
    unsafe { ffi::lg_notify_resume_pending() }
}

/// Maps `pages` contiguously in the vmalloc area (`PAGE_KERNEL`: read-write,
/// no-execute); null on failure.
///
/// # Safety
///
/// Every entry of `pages` must be a page the caller owns and keeps until
/// [`vunmap`].
pub(crate) unsafe fn vmap(pages: &mut [*mut bindings::page]) -> *mut u8 {
    // SAFETY: The caller guarantees the pages; the slice gives the count.
    unsafe { ffi::lg_vmap(pages.as_mut_ptr().cast(), pages.len() as u32) }
}

/// Undoes [`vmap`].
///
/// # Safety
///
/// `addr` must come from [`vmap`] and not be used afterwards.
pub(crate) unsafe fn vunmap(addr: *mut u8) {
    // SAFETY: Guaranteed by the caller.
    unsafe { ffi::lg_vunmap(addr) }
}

/// This CPU's IST1-4 stack tops (the host's double-fault, NMI, #DB and #MC
/// stacks). Call with interrupts off, so the CPU stays the same.
pub(crate) fn host_ist() -> [u64; 4] {
    let mut ist = [0u64; 4];
    // SAFETY: `ist` has room for the four values written.
    unsafe { ffi::lg_host_ist(ist.as_mut_ptr()) };
    ist
}

/// Runs the host's machine-check handler for an #MC that hit the guest at
/// `ip`, as a user-mode event.
pub(crate) fn machine_check_user(ip: u64) {
    // SAFETY: do_machine_check() may be called from process context with a
    // frame that says user mode, as KVM does after a VM exit.
    unsafe { ffi::lg_machine_check_user(ip as usize) }
}

/// Why lguest cannot run on this host, if the kernel knows a reason
/// (memory encryption, TDX, Xen PV).
pub(crate) fn host_refusal() -> Option<&'static core::ffi::CStr> {
    // SAFETY: Returns null or a static string.
    let p = unsafe { ffi::lg_host_refusal() };
    // SAFETY: A non-null result is a NUL-terminated static string.
    (!p.is_null()).then(|| unsafe { core::ffi::CStr::from_ptr(p) })
}

/// The host refusals `lg_helpers.c` words, by kind (for simulating them).
#[derive(Clone, Copy)]
pub(crate) enum Refusal {
    MemEncrypt = 1,
    Tdx = 2,
    XenPv = 3,
}

/// The message `host_refusal` gives for `kind`.
pub(crate) fn host_refusal_text(kind: Refusal) -> Option<&'static core::ffi::CStr> {
    // SAFETY: Returns null or a static string.
    let p = unsafe { ffi::lg_refusal_text(kind as u32) };
    // SAFETY: A non-null result is a NUL-terminated static string.
    (!p.is_null()).then(|| unsafe { core::ffi::CStr::from_ptr(p) })
}

/// User-mode shadow stacks are enabled on this host.
pub(crate) fn user_shstk() -> bool {
    // SAFETY: Reads the boot CPU's feature bits.
    unsafe { ffi::lg_user_shstk() }
}

/// The XSAVE components a guest's FPU state holds (0: no XSAVE, FXSAVE is
/// used); see `lg_fpu_xsave_mask`.
pub(crate) fn fpu_xsave_mask() -> u64 {
    // SAFETY: Reads XCR0 and CPUID leaf 0xd; no side effects.
    unsafe { ffi::lg_fpu_xsave_mask() }
}

/// Clears XFD_ERR (where the CPU has XFD), as the host's #NM handler would.
pub(crate) fn clear_xfd_err() {
    // SAFETY: XFD_ERR only reports the last XFD fault; zero is its idle
    // value, and nothing but the #NM handler reads it.
    unsafe { ffi::lg_clear_xfd_err() }
}

/// Arms XFD for every dynamic XSAVE component (AMX's tile data), where the
/// CPU has XFD, for a guest's run: its AMX instructions raise #NM instead
/// of reaching the tile registers the last FPU owner left. Returns the
/// value [`xfd_restore`] puts back.
///
/// # Safety
///
/// Interrupts must be off, and stay off until [`xfd_restore`] of the value
/// returned has run on this CPU: the kernel keeps a per-CPU copy of XFD
/// that must be true whenever its own code can run.
pub(crate) unsafe fn xfd_arm() -> u64 {
    // SAFETY: With XFD armed only AMX instructions change behaviour (they
    // raise #NM), and nothing of the kernel's runs until the restore.
    unsafe { ffi::lg_xfd_arm() }
}

/// Puts back the XFD value [`xfd_arm`] returned.
///
/// # Safety
///
/// `old` is what [`xfd_arm`] returned on this CPU, interrupts off since.
pub(crate) unsafe fn xfd_restore(old: u64) {
    // SAFETY: The exact value the kernel had, as the caller promises.
    unsafe { ffi::lg_xfd_restore(old) }
}

/// The host's debug registers as [`debugregs_load`] found them.
pub(crate) struct HostDebugregs([u64; 5]);

/// Loads a guest's breakpoints: the live DR7 saved and off (and DR0-DR3
/// saved where it armed any), DR0-DR3 = `addrs`, then DR7 = `dr7`.
/// Returns what [`debugregs_restore`] puts back.
///
/// # Safety
///
/// Interrupts must be off, and stay off until [`debugregs_restore`] has
/// run on this CPU; `dr7` arms only breakpoints on user addresses
/// (`uapi::debugreg_dr7`), which the host's code in between does not
/// touch but for an NMI handler's copy of the launcher's user stack (a
/// stray #DB the host's handler ignores, Documentation/switcher.rst).
pub(crate) unsafe fn debugregs_load(addrs: &[u64; 4], dr7: u64) -> HostDebugregs {
    let mut saved = HostDebugregs([0; 5]);
    // SAFETY: `addrs` is 4 u64s and `saved` 5; the caller's promise
    // covers the rest.
    unsafe { ffi::lg_debugregs_load(addrs.as_ptr(), dr7, saved.0.as_mut_ptr()) };
    saved
}

/// Puts back the host's breakpoints after [`debugregs_load`].
///
/// # Safety
///
/// `saved` is what [`debugregs_load`] returned on this CPU, interrupts
/// off since.
pub(crate) unsafe fn debugregs_restore(saved: &HostDebugregs) {
    // SAFETY: The values the CPU had, as the caller promises.
    unsafe { ffi::lg_debugregs_restore(saved.0.as_ptr()) }
}

/// The CPU has IBPB (an indirect branch prediction barrier by a write of
/// MSR_IA32_PRED_CMD).
pub(crate) fn has_ibpb() -> bool {
    // SAFETY: Reads the boot CPU's feature bits; no side effects.
    unsafe { ffi::lg_has_ibpb() }
}

/// An indirect branch prediction barrier, and the return stack stuffed
/// where IBPB leaves return predictions alone (`lguest_ibpb`, the
/// kernel's `write_ibpb`).
///
/// # Safety
///
/// The CPU has IBPB ([`has_ibpb`]): elsewhere the write of PRED_CMD is a
/// #GP in the kernel.
pub(crate) unsafe fn ibpb() {
    // SAFETY: A write of PRED_CMD.IBPB, legal where the CPU has it (as the
    // caller promises), changes only predictor state; `lguest_ibpb`
    // clobbers only RAX, RCX and RDX, which the C calling convention
    // leaves to the callee.
    unsafe { ffi::lguest_ibpb() }
}

/// `kernel_fpu_begin`, for a guest's FPU state.
///
/// # Safety
///
/// Interrupts must be off, and stay off until the matching [`fpu_end`],
/// which must come on this CPU before they go back on; no other kernel FPU
/// section may be open.
pub(crate) unsafe fn fpu_begin() {
    // SAFETY: The caller keeps interrupts off for the whole section.
    unsafe { ffi::lg_fpu_begin() }
}

/// `kernel_fpu_end`.
///
/// # Safety
///
/// Closes the section [`fpu_begin`] opened, interrupts still off.
pub(crate) unsafe fn fpu_end() {
    // SAFETY: As the caller promises.
    unsafe { ffi::lg_fpu_end() }
}

/// The CPU is affected by Meltdown (page-table isolation on or off).
pub(crate) fn cpu_meltdown() -> bool {
    // SAFETY: Reads the boot CPU's bug bits.
    unsafe { ffi::lg_cpu_meltdown() }
}

/// The CPU is affected by Meltdown and page-table isolation is off.
pub(crate) fn meltdown_without_pti() -> bool {
    // SAFETY: Reads the boot CPU's feature and bug bits.
    unsafe { ffi::lg_meltdown_without_pti() }
}

/// A counted reference to an address space (`mmgrab`): it keeps the
/// `mm_struct` (not the memory) alive, so comparing with it is reliable.
///
/// # Invariants
///
/// `0` is a non-null `mm_struct` this value holds a reference to.
pub(crate) struct MmRef(*mut core::ffi::c_void);

// SAFETY: mmgrab references may be dropped from any thread.
unsafe impl Send for MmRef {}
// SAFETY: `&MmRef` only compares the pointer.
unsafe impl Sync for MmRef {}

impl MmRef {
    /// The current task's address space, if it has one.
    pub(crate) fn current() -> Option<Self> {
        // SAFETY: Reads current->mm and takes a reference; process context.
        let p = unsafe { ffi::lg_current_mm_grab() };
        // INVARIANT: non-null, and we hold the reference taken above.
        (!p.is_null()).then_some(MmRef(p))
    }

    /// Charges `pages` pinned pages to this address space's locked memory
    /// (RLIMIT_MEMLOCK, unless the caller has CAP_IPC_LOCK), or refunds them.
    pub(crate) fn account_locked(&self, pages: usize, inc: bool) -> kernel::error::Result {
        // SAFETY: By the type invariant the mm_struct is alive.
        let ret = unsafe { ffi::lg_account_locked_vm(self.0, pages, inc) };
        if ret < 0 {
            return Err(kernel::error::Error::from_errno(ret));
        }
        Ok(())
    }

    /// The address space's top-level page table (its kernel half under
    /// PTI), for the switcher's slot.
    pub(crate) fn pgd(&self) -> *mut u64 {
        // SAFETY: By the type invariant the mm_struct is alive; its pgd
        // lives as long as it (it is freed by the last mmdrop).
        unsafe { ffi::lg_mm_pgd(self.0) }
    }

    /// Entry `i` of the address space's top-level table.
    pub(crate) fn top_entry(&self, i: usize) -> u64 {
        // SAFETY: The table is a live page (see `pgd`), `i < 512`.
        unsafe { self.pgd().add(i & 511).read_volatile() }
    }

    /// Sets entry `i` of the address space's top-level table. Only for a
    /// slot no part of the kernel uses (the switcher's: the guard hole).
    pub(crate) fn set_top_entry(&self, i: usize, v: u64) {
        // SAFETY: As in `top_entry`; a whole-word store, as the CPU may
        // walk the table at the same time. The kernel never reads or
        // writes the guard hole's slots of a process's table.
        unsafe { self.pgd().add(i & 511).write_volatile(v) }
    }

    /// The `mm_struct`'s address, as an identity.
    pub(crate) fn id(&self) -> usize {
        self.0 as usize
    }

    /// Whether the current task runs in this address space.
    pub(crate) fn is_current(&self) -> bool {
        // SAFETY: Only compares current->mm with our pointer.
        unsafe { ffi::lg_current_mm_is(self.0) }
    }
}

impl Drop for MmRef {
    fn drop(&mut self) {
        // SAFETY: By the type invariant we hold one reference.
        unsafe { ffi::lg_mm_drop(self.0) }
    }
}

/// Marks the current task as about to sleep (interruptible, freezable).
/// Between this and [`set_current_running`] nothing may sleep.
pub(crate) fn set_current_interruptible() {
    // SAFETY: set_current_state() only changes the current task's state.
    unsafe { ffi::lg_set_current_interruptible() }
}

/// Marks the current task as running again.
pub(crate) fn set_current_running() {
    // SAFETY: As above.
    unsafe { ffi::lg_set_current_running() }
}

/// Sleeps until woken (after [`set_current_interruptible`]).
pub(crate) fn schedule() {
    // SAFETY: Process context, no spinlock held (the run loop holds only
    // the VM mutex, which may be held across sleeps).
    unsafe { ffi::lg_schedule() }
}

/// Binds eventfd `fd` so that each signal calls `lguest_irqfd_fire(data,
/// irq)`. Returns the binding or the error.
///
/// # Safety
///
/// `data` must stay valid until [`irqfd_detach`] returns.
pub(crate) unsafe fn irqfd_attach(
    fd: i32,
    data: *mut core::ffi::c_void,
    irq: u32,
) -> kernel::error::Result<*mut core::ffi::c_void> {
    let mut err = 0i32;
    // SAFETY: `err` is a valid out-parameter; the caller keeps `data` alive.
    let p = unsafe { ffi::lg_irqfd_attach(fd, data, irq, &mut err) };
    if p.is_null() {
        return Err(kernel::error::Error::from_errno(err));
    }
    Ok(p)
}

/// Unbinds an irqfd; after this no callback runs for it.
///
/// # Safety
///
/// `irqfd` must come from [`irqfd_attach`] and not be detached yet.
pub(crate) unsafe fn irqfd_detach(irqfd: *mut core::ffi::c_void) {
    // SAFETY: Guaranteed by the caller.
    unsafe { ffi::lg_irqfd_detach(irqfd) }
}

/// Whether `irqfd` is bound to the eventfd behind `fd`.
///
/// # Safety
///
/// `irqfd` must be a live binding from [`irqfd_attach`].
pub(crate) unsafe fn irqfd_matches(irqfd: *mut core::ffi::c_void, fd: i32) -> bool {
    // SAFETY: Guaranteed by the caller.
    unsafe { ffi::lg_irqfd_matches(irqfd, fd) }
}

/// Sends an NMI to the current CPU through its local APIC (a real NMI,
/// handled with NMIs blocked by the hardware), to be taken as soon as
/// NMIs are not blocked. Call with interrupts off, so the CPU stays the same.
pub(crate) fn self_nmi() {
    // SAFETY: Sending an IPI to ourselves has no memory-safety
    // preconditions; the APIC driver is set up long before modules load.
    unsafe { ffi::lg_self_nmi() }
}

/// A reference to an eventfd (`struct eventfd_ctx`), dropped with the value.
pub(crate) struct EventFd(*mut core::ffi::c_void);

// SAFETY: An eventfd context is reference counted and `eventfd_signal` may
// be called from any thread; the pointer is never dereferenced in Rust.
unsafe impl Send for EventFd {}
// SAFETY: As above: `&EventFd` only allows signalling, which is thread-safe.
unsafe impl Sync for EventFd {}

impl EventFd {
    /// Takes a reference to the eventfd behind file descriptor `fd` of the
    /// current process (`EBADF`, or `EINVAL` when it is not an eventfd).
    pub(crate) fn get(fd: i32) -> kernel::error::Result<Self> {
        let mut err = 0i32;
        // SAFETY: `err` is a valid out-parameter; `fd` is any integer (the
        // C side looks it up in the current task's file table).
        let p = unsafe { ffi::lg_eventfd_get(fd, &mut err) };
        if p.is_null() {
            return Err(kernel::error::Error::from_errno(err));
        }
        Ok(Self(p))
    }

    /// Adds one to the eventfd's count and wakes its readers.
    pub(crate) fn signal(&self) {
        // SAFETY: `self.0` is a live reference taken by `get`.
        unsafe { ffi::lg_eventfd_signal(self.0) }
    }
}

impl Drop for EventFd {
    fn drop(&mut self) {
        // SAFETY: `self.0` is the reference `get` took; it is put once.
        unsafe { ffi::lg_eventfd_put(self.0) }
    }
}

/// The current CPU's CR4.
pub(crate) fn read_cr4() -> u64 {
    // SAFETY: Reading CR4 has no side effects.
    unsafe { ffi::lg_read_cr4() as u64 }
}

/// The current CPU's CR3.
pub(crate) fn read_cr3() -> u64 {
    // SAFETY: Reading CR3 has no side effects.
    unsafe { ffi::lg_read_cr3() as u64 }
}

/// CPUID of this CPU, leaf `leaf` and subleaf `subleaf`: EAX, EBX, ECX,
/// EDX.
pub(crate) fn cpuid(leaf: u32, subleaf: u32) -> [u32; 4] {
    let mut out = [0u32; 4];
    // SAFETY: `out` is four writable u32s, all `lg_cpuid` writes; CPUID
    // has no effect but its four outputs.
    unsafe { ffi::lg_cpuid(leaf, subleaf, out.as_mut_ptr()) };
    out
}

/// The current CPU's EFER.
pub(crate) fn read_efer() -> u64 {
    // SAFETY: EFER exists on every x86-64 CPU; reading it has no effects.
    unsafe { ffi::lg_read_efer() as u64 }
}

/// The id of the CPU we run on (stable only with interrupts off).
pub(crate) fn cpu_id() -> u32 {
    // SAFETY: raw_smp_processor_id() may be called in any context.
    unsafe { ffi::lg_cpu_id() }
}

/// Start of the kernel's direct map of physical memory.
pub(crate) fn page_offset_base() -> u64 {
    // SAFETY: Reads a variable set once at boot.
    unsafe { ffi::lg_page_offset_base() as u64 }
}

/// Runs the guest prepared in `block` until it exits.
///
/// # Safety
///
/// Interrupts must be off; `block` must be this CPU's switcher block, fully
/// set up, with a guest CR3 that maps the switcher text and this block at
/// their host addresses.
pub(crate) unsafe fn switch_to_guest(block: *mut u8) {
    // SAFETY: The caller guarantees the preconditions of the switcher.
    unsafe { ffi::lguest_switch_to_guest(block) }
}

/// Runs the host interrupt handler at `handler` as if the interrupt had just
/// arrived in a context with interrupts on. It returns with interrupts on
/// (and may have scheduled).
///
/// # Safety
///
/// Interrupts must be off and `handler` must be the host IDT's handler for
/// an interrupt that this CPU received and has not yet handled; the caller
/// must not rely on interrupts staying off or on the CPU afterwards.
pub(crate) unsafe fn deliver_to_host(handler: usize) {
    // SAFETY: The caller guarantees the preconditions.
    unsafe { ffi::lguest_deliver_to_host(handler) }
}

/// The switcher's text: `(start, end)` host addresses, page aligned.
pub(crate) fn switcher_text() -> (usize, usize) {
    (
        core::ptr::addr_of!(ffi::lguest_switcher_start) as usize,
        core::ptr::addr_of!(ffi::lguest_switcher_end) as usize,
    )
}

/// The module-text addresses of the switcher's `lguest_guest_entry` (the
/// entry's part that runs in the alias) and `lguest_host_resume` (where
/// the exit comes back to the module's text).
pub(crate) fn switcher_entry_points() -> (usize, usize) {
    (
        core::ptr::addr_of!(ffi::lguest_guest_entry) as usize,
        core::ptr::addr_of!(ffi::lguest_host_resume) as usize,
    )
}

/// The module-text address of the switcher's SYSCALL entry
/// (`lguest_syscall`, run from the alias).
pub(crate) fn syscall_entry() -> usize {
    core::ptr::addr_of!(ffi::lguest_syscall) as usize
}

/// This CPU's MSR_LSTAR, MSR_STAR and MSR_SYSCALL_MASK.
pub(crate) fn syscall_msrs() -> [u64; 3] {
    let mut v = [0u64; 3];
    // SAFETY: The three MSRs exist on every x86-64 CPU; reading them has no
    // effects; `v` has room for the three values.
    unsafe { ffi::lg_read_syscall_msrs(v.as_mut_ptr()) };
    v
}

/// Loads this CPU's MSR_LSTAR, MSR_STAR and MSR_SYSCALL_MASK with `v` (the
/// `syscall_msr_test` knob).
///
/// # Safety
///
/// Interrupts must be off, and the caller must put the values it read
/// with [`syscall_msrs`] back before they come on: until then no `syscall`
/// can run on this CPU (only the host kernel runs, which makes none, and
/// the guest, for which the switcher loads its own).
pub(crate) unsafe fn set_syscall_msrs(v: [u64; 3]) {
    // SAFETY: As the caller promises; the values are any a `wrmsr` to
    // these MSRs accepts (the caller's are canonical addresses and masks).
    unsafe { ffi::lg_write_syscall_msrs(v.as_ptr()) };
}

/// Whether SYSENTER exists in long mode on this CPU: it does on Intel
/// (and Centaur, Zhaoxin); AMD and Hygon CPUs raise #UD for it there.
pub(crate) fn sysenter_in_long_mode() -> bool {
    // SAFETY: Reads the boot CPU's vendor.
    unsafe { ffi::lg_sysenter_in_long_mode() }
}

/// Whether the CPU has INVPCID (and the kernel lets it be used).
pub(crate) fn has_invpcid() -> bool {
    // SAFETY: Reads the boot CPU's feature bits.
    unsafe { ffi::lg_has_invpcid() }
}

/// Flushes every CPU's TLB and paging-structure caches, for every PCID,
/// global entries included. Process context, interrupts on.
pub(crate) fn flush_tlb_all_cpus() {
    // SAFETY: on_each_cpu from process context; the flush has no other
    // effect.
    unsafe { ffi::lg_flush_tlb_all_cpus() }
}

/// Host address of the IDT stub for vector 0 (stubs are 32 bytes apart).
pub(crate) fn idt_stubs() -> usize {
    core::ptr::addr_of!(ffi::lguest_idt_stubs) as usize
}
