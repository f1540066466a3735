// SPDX-License-Identifier: GPL-2.0
//! `/dev/lguest`: one open file is one launcher's VM.
//!
//! The file's private data is a [`LguestFile`]: a mutex around the VM, which
//! `LGUEST_CREATE_VM` fills in and RUN holds while the guest runs (not
//! while a halted vCPU sleeps), and a flag saying a RUN is in progress.
//! Other ioctls that need the VM never wait for it: while RUN holds it they
//! get `EBUSY`, so no thread sits in an uninterruptible sleep behind a
//! running guest (nor behind the freezer). Holding the mutex, the module
//! pins the launcher's memory, which takes the mm's `mmap_lock`; mmap runs
//! with `mmap_lock` held, so it must not take the VM mutex. It uses `runs`,
//! the run pages, a leaf lock. Lock order: `vm` -> `mmap_lock` -> `runs`,
//! and `vm` -> `runs`, and `vm` -> the notifier table (`notify.rs`);
//! `irqfds` is never held with another of ours. Unknown commands get
//! `ENOTTY`, malformed arguments `EINVAL`, unreadable ones `EFAULT`.
//!
//! While a file is open the module cannot be unloaded: the misc device's
//! `fops.owner` is this module, so every open file holds a module reference.

use core::sync::atomic::{
    AtomicBool,
    Ordering, //
};
use kernel::{
    alloc::flags::GFP_KERNEL_ACCOUNT,
    current,
    fs::File,
    miscdevice::{
        MiscDevice,
        MiscDeviceRegistration, //
    },
    mm::virt::{
        flags as vmflags,
        VmaNew, //
    },
    new_mutex,
    prelude::*,
    sync::{
        aref::ARef,
        Arc,
        Mutex,
        MutexGuard, //
    },
    transmute::{
        AsBytes,
        FromBytes, //
    },
    uaccess::{
        UserPtr,
        UserSlice, //
    },
};

use crate::{
    gmem::HostPage,
    irq::{
        IrqFd,
        VcpuIrq, //
    },
    notify::Notifiers,
    uapi::{
        self,
        LguestCpuid,
        LguestCpuidEntry,
        LguestIoeventfd,
        LguestIrqfd,
        LguestVcpuRegs,
        LguestVmConfig, //
    },
    vm::{
        RunStep,
        Vm, //
    },
};

// SAFETY: `LguestIrqfd` is `repr(C)`, four 32-bit integers, no padding.
unsafe impl FromBytes for LguestIrqfd {}
// SAFETY: `LguestIoeventfd` is `repr(C)`: a u64 then two 32-bit integers,
// 16 bytes (asserted in uapi.rs), no padding.
unsafe impl FromBytes for LguestIoeventfd {}
// SAFETY: `LguestCpuid` is `repr(C)`, two u32s, no padding.
unsafe impl FromBytes for LguestCpuid {}
// SAFETY: `LguestCpuidEntry` is `repr(C)`, ten u32s (40 bytes, asserted in
// uapi.rs), no padding: any bytes are a valid value.
unsafe impl FromBytes for LguestCpuidEntry {}
// SAFETY: `LguestVmConfig` is `repr(C)` with only integer fields and no
// padding (its size is asserted in uapi.rs), so any bytes are a valid value.
unsafe impl FromBytes for LguestVmConfig {}
// SAFETY: As above, for `LguestVcpuRegs` (u32, u32, then u64s).
unsafe impl FromBytes for LguestVcpuRegs {}
// SAFETY: As above: no padding, so every byte is initialised.
unsafe impl AsBytes for LguestVcpuRegs {}

/// The state behind one open `/dev/lguest` file.
#[pin_data]
pub(crate) struct LguestFile {
    #[pin]
    vm: Mutex<Option<Vm>>,
    /// The vCPUs' run pages, by index; `None` until CREATE_VM.
    #[pin]
    runs: Mutex<Option<KVec<Arc<HostPage>>>>,
    /// The (single) vCPU's interrupt state: `LGUEST_IRQ` reaches it without
    /// the VM mutex, which RUN holds.
    irq: Arc<VcpuIrq>,
    /// Eventfds bound to interrupts. Never held with `vm`.
    #[pin]
    irqfds: Mutex<KVec<IrqFd>>,
    /// Notification addresses bound to eventfds; shared with the VM.
    notifiers: Arc<Notifiers>,
    /// A RUN is in progress (there is one vCPU): a second one gets `EBUSY`.
    running: AtomicBool,
}

/// Clears the `running` flag when RUN returns, however it returns.
struct Running<'a>(&'a AtomicBool, &'a VcpuIrq);

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.1.set_task(None);
        self.0.store(false, Ordering::Release);
    }
}

impl LguestFile {
    /// The VM's lock, unless RUN (or another ioctl) holds it: `EBUSY`.
    fn vm_now(&self) -> Result<MutexGuard<'_, Option<Vm>>> {
        self.vm.try_lock().ok_or(EBUSY)
    }

    fn create_vm(&self, arg: usize) -> Result<isize> {
        let cfg: LguestVmConfig = UserSlice::new(
            UserPtr::from_addr(arg),
            core::mem::size_of::<LguestVmConfig>(),
        )
        .reader()
        .read()?;
        if self.vm_now()?.is_some() {
            return Err(EEXIST);
        }
        // Pinning may take long (or wait on the launcher's own page-fault
        // handling): not with the lock held, which RUN waits for.
        let new = Vm::create(&cfg, self.notifiers.clone())?;
        let mut vm = self.vm_now()?;
        if vm.is_some() {
            // Another thread's CREATE_VM won the race.
            return Err(EEXIST);
        }
        *vm = Some(new);
        *self.runs.lock() = Some(KVec::new());
        Ok(0)
    }

    fn create_vcpu(&self) -> Result<isize> {
        let mut guard = self.vm_now()?;
        let vm = Option::as_mut(&mut *guard).ok_or(ENOENT)?;
        // Room for the run page first, so that a vCPU never exists without
        // one the launcher can map.
        let mut runs = self.runs.lock();
        let runs = Option::as_mut(&mut *runs).ok_or(ENOENT)?;
        runs.reserve(1, GFP_KERNEL)?;
        let (index, page) = vm.create_vcpu(self.irq.clone())?;
        runs.push(page, GFP_KERNEL)?;
        Ok(index as isize)
    }

    fn run(&self, vcpu: usize) -> Result<isize> {
        if self.running.swap(true, Ordering::AcqRel) {
            return Err(EBUSY);
        }
        // While we are in here, interrupt sources wake and kick this thread.
        self.irq.set_task(Some(ARef::from(&**current!())));
        let _running = Running(&self.running, &self.irq);
        loop {
            // Other holders of the lock are ioctls that never sleep or
            // touch the launcher's memory with it, so this wait is short.
            let step = {
                let mut guard = self.vm.lock();
                Option::as_mut(&mut *guard).ok_or(ENOENT)?.run(vcpu)?
            };
            match step {
                RunStep::Exit(r) => return Ok(r),
                RunStep::Sleep { blocked } => self.irq.sleep_unless(blocked),
            }
        }
    }

    fn get_regs(&self, arg: usize) -> Result<isize> {
        let (mut r, mut w) = UserSlice::new(
            UserPtr::from_addr(arg),
            core::mem::size_of::<LguestVcpuRegs>(),
        )
        .reader_writer();
        let mut req: LguestVcpuRegs = r.read()?;
        if req.pad != 0 {
            return Err(EINVAL);
        }
        req.regs = self
            .vm_now()?
            .as_ref()
            .ok_or(ENOENT)?
            .get_regs(req.vcpu as usize)?;
        // Written back without the lock (the launcher's memory may fault).
        w.write(&req)?;
        Ok(0)
    }

    fn irqfd(&self, arg: usize) -> Result<isize> {
        let req: LguestIrqfd =
            UserSlice::new(UserPtr::from_addr(arg), core::mem::size_of::<LguestIrqfd>())
                .reader()
                .read()?;
        if req.pad != 0 || req.irq as usize >= uapi::LGUEST_IRQS || req.fd < 0 {
            return Err(EINVAL);
        }
        let mut fds = self.irqfds.lock();
        match req.flags {
            0 => {
                if fds.len() >= uapi::LGUEST_MAX_IRQFDS {
                    return Err(ENOSPC);
                }
                if fds.iter().any(|f| f.is(req.fd, req.irq)) {
                    return Err(EEXIST);
                }
                fds.push(IrqFd::attach(&self.irq, req.fd, req.irq)?, GFP_KERNEL)?;
            }
            uapi::LGUEST_IRQFD_DEASSIGN => {
                let i = fds
                    .iter()
                    .position(|f| f.is(req.fd, req.irq))
                    .ok_or(ENOENT)?;
                drop(fds.remove(i)?);
            }
            _ => return Err(EINVAL),
        }
        Ok(0)
    }

    fn ioeventfd(&self, arg: usize) -> Result<isize> {
        let req: LguestIoeventfd = UserSlice::new(
            UserPtr::from_addr(arg),
            core::mem::size_of::<LguestIoeventfd>(),
        )
        .reader()
        .read()?;
        self.notifiers.ioctl(&req)?;
        Ok(0)
    }

    /// `LGUEST_SET_CPUID`: the header, then `nent` entries right after it.
    /// Read whole and checked before the VM's lock is taken.
    fn set_cpuid(&self, arg: usize) -> Result<isize> {
        let head = core::mem::size_of::<LguestCpuid>();
        let hdr: LguestCpuid = UserSlice::new(UserPtr::from_addr(arg), head)
            .reader()
            .read()?;
        if hdr.padding != 0 {
            return Err(EINVAL);
        }
        if hdr.nent > uapi::LGUEST_MAX_CPUID_ENTRIES {
            return Err(E2BIG);
        }
        let n = hdr.nent as usize;
        let size = core::mem::size_of::<LguestCpuidEntry>();
        let mut r = UserSlice::new(
            UserPtr::from_addr(arg.checked_add(head).ok_or(EFAULT)?),
            n * size,
        )
        .reader();
        let mut table = KVec::with_capacity(n, GFP_KERNEL_ACCOUNT)?;
        for _ in 0..n {
            table.push(r.read::<LguestCpuidEntry>()?, GFP_KERNEL_ACCOUNT)?;
        }
        if !uapi::cpuid_table_valid(&table) {
            return Err(EINVAL);
        }
        Option::as_mut(&mut *self.vm_now()?)
            .ok_or(ENOENT)?
            .set_cpuid(table);
        Ok(0)
    }

    fn set_regs(&self, arg: usize) -> Result<isize> {
        let req: LguestVcpuRegs = UserSlice::new(
            UserPtr::from_addr(arg),
            core::mem::size_of::<LguestVcpuRegs>(),
        )
        .reader()
        .read()?;
        if req.pad != 0 {
            return Err(EINVAL);
        }
        let mut guard = self.vm_now()?;
        Option::as_mut(&mut *guard)
            .ok_or(ENOENT)?
            .set_regs(req.vcpu as usize, req.regs)?;
        Ok(0)
    }
}

#[vtable]
impl MiscDevice for LguestFile {
    type Ptr = Pin<KBox<Self>>;

    fn open(_file: &File, _misc: &MiscDeviceRegistration<Self>) -> Result<Pin<KBox<Self>>> {
        let irq = VcpuIrq::new()?;
        let notifiers = Notifiers::new()?;
        KBox::try_pin_init(
            try_pin_init!(LguestFile {
                vm <- new_mutex!(None, "LguestFile::vm"),
                runs <- new_mutex!(None, "LguestFile::runs"),
                irq,
                irqfds <- new_mutex!(KVec::new(), "LguestFile::irqfds"),
                notifiers,
                running: AtomicBool::new(false),
            }),
            GFP_KERNEL,
        )
    }

    fn ioctl(this: Pin<&LguestFile>, _file: &File, cmd: u32, arg: usize) -> Result<isize> {
        // The argument size is part of the command number: a struct of the
        // wrong size is a different, unknown, command.
        match cmd {
            uapi::LGUEST_GET_API_VERSION => Ok(uapi::LGUEST_API_VERSION as isize),
            uapi::LGUEST_CREATE_VM => this.create_vm(arg),
            uapi::LGUEST_CREATE_VCPU => this.create_vcpu(),
            uapi::LGUEST_RUN => this.run(arg),
            uapi::LGUEST_GET_REGS => this.get_regs(arg),
            uapi::LGUEST_SET_REGS => this.set_regs(arg),
            uapi::LGUEST_IRQFD => this.irqfd(arg),
            uapi::LGUEST_IOEVENTFD => this.ioeventfd(arg),
            uapi::LGUEST_SET_CPUID => this.set_cpuid(arg),
            uapi::LGUEST_IRQ => {
                if arg >= uapi::LGUEST_IRQS {
                    return Err(EINVAL);
                }
                this.irq.raise(arg as u32);
                Ok(0)
            }
            _ => Err(ENOTTY),
        }
    }

    /// Maps vCPU `pgoff`'s run page. The mapping must be shared (the
    /// launcher writes `immediate_exit` into the kernel's page) and one page.
    fn mmap(this: Pin<&LguestFile>, _file: &File, vma: &VmaNew) -> Result {
        if vma.end() - vma.start() != uapi::LGUEST_RUN_PAGE_SIZE
            || vma.flags() & vmflags::SHARED == 0
        {
            return Err(EINVAL);
        }
        // SAFETY: The vma is valid for this call; vm_pgoff is plain data.
        let pgoff = unsafe { (*vma.as_ptr()).vm_pgoff } as usize;
        vma.try_clear_mayexec()?;
        vma.set_dontexpand();
        vma.set_dontcopy();
        let runs = this.runs.lock();
        let page = runs.as_ref().ok_or(ENOENT)?.get(pgoff).ok_or(EINVAL)?;
        vma.set_mixedmap().vm_insert_page(vma.start(), page.page())
    }
}
