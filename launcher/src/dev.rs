// SPDX-License-Identifier: GPL-2.0
//! The launcher's handle on `/dev/lguest`: the only place it makes ioctls or
//! maps a vCPU's run page.
//!
//! Everything above this module is safe code; each ioctl wrapper here states
//! why its `unsafe` call is sound. The argument conventions are the ones
//! `uapi.rs` documents: `LGUEST_CREATE_VM` takes a pointer to an
//! [`abi::LguestVmConfig`], `LGUEST_CREATE_VCPU` takes no argument (0 is
//! passed) and returns the new index, `LGUEST_RUN` takes the vCPU index as the
//! plain integer argument, and `LGUEST_GET_REGS`/`LGUEST_SET_REGS` take a
//! pointer to an [`abi::LguestVcpuRegs`] whose `vcpu` field names the vCPU.
//!
//! The run page ([`RunPage`]) is shared with the host, which writes it while
//! RUN is in progress, so no reference to the [`abi::LguestRun`] in it is ever
//! handed out: the exit fields are copied out with volatile reads after RUN
//! returns ([`RunPage::exit`]), and `immediate_exit` is only touched as an
//! [`AtomicU8`], so a signal handler may set it at any time.
//!
//! Errors keep their cause as `source()` and leave it out of their message;
//! print them with anyhow's `{:#}` to see the whole chain.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::path::Path;
use std::ptr::{self, NonNull};
use std::sync::atomic::{AtomicU8, Ordering};

use lguest_abi as abi;

/// The size of a run page, and of the stride between two vCPUs' pages in the
/// device's mmap offsets.
pub const RUN_PAGE_SIZE: usize = 4096;

// The run page mapping must hold a whole LguestRun for the raw accesses below.
const _: () = assert!(std::mem::size_of::<abi::LguestRun>() <= RUN_PAGE_SIZE);

/// Errors from opening or talking to `/dev/lguest`.
#[derive(Debug, thiserror::Error)]
pub enum DevError {
    /// The device node is missing: the module is not loaded.
    #[error("{path}: no such device node; is lguest.ko loaded? (insmod lguest.ko)")]
    NoDevice {
        /// The path that was tried.
        path: String,
    },
    /// Opening the device failed for another reason (permissions, ...).
    #[error("cannot open {path}")]
    Open {
        /// The path that was tried.
        path: String,
        /// The error from `open(2)`.
        source: io::Error,
    },
    /// An ioctl failed.
    #[error("{what} failed")]
    Ioctl {
        /// The ioctl's name.
        what: &'static str,
        /// The error it returned.
        source: io::Error,
    },
    /// Mapping a vCPU's run page failed.
    #[error("cannot map the run page of vCPU {vcpu}")]
    MapRunPage {
        /// The vCPU index.
        vcpu: u32,
        /// The error from `mmap(2)`.
        source: io::Error,
    },
}

/// An open `/dev/lguest`.
#[derive(Debug)]
pub struct Lguest {
    file: File,
}

/// Turns an ioctl's return value into its result, naming the ioctl on error.
fn check(what: &'static str, ret: libc::c_int) -> Result<libc::c_int, DevError> {
    if ret < 0 {
        Err(DevError::Ioctl { what, source: io::Error::last_os_error() })
    } else {
        Ok(ret)
    }
}

impl Lguest {
    /// Opens the lguest device at `path` (normally `/dev/lguest`).
    pub fn open(path: &Path) -> Result<Self, DevError> {
        let shown = path.display().to_string();
        match OpenOptions::new().read(true).write(true).open(path) {
            Ok(file) => Ok(Self { file }),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Err(DevError::NoDevice { path: shown }),
            Err(source) => Err(DevError::Open { path: shown, source }),
        }
    }

    /// Asks the module for its ABI version (`LGUEST_GET_API_VERSION`).
    pub fn api_version(&self) -> Result<u32, DevError> {
        // SAFETY: LGUEST_GET_API_VERSION takes no argument and touches no
        // memory of ours; the fd is open for the lifetime of `self`.
        let ret = unsafe { libc::ioctl(self.file.as_raw_fd(), abi::LGUEST_GET_API_VERSION as _, 0) };
        let ret = check("LGUEST_GET_API_VERSION", ret)?;
        // CAST: a non-negative c_int always fits in u32.
        Ok(ret as u32)
    }

    /// Gives this file its guest (`LGUEST_CREATE_VM`).
    ///
    /// The memory `config` describes must stay mapped for as long as the VM
    /// runs; the caller owns it (see `memory::GuestMemory`).
    pub fn create_vm(&self, config: &abi::LguestVmConfig) -> Result<(), DevError> {
        let arg: *const abi::LguestVmConfig = config;
        // SAFETY: LGUEST_CREATE_VM reads one LguestVmConfig (its size is
        // encoded in the ioctl number) from `arg`, which points to a live,
        // initialised one for the whole call; the kernel does not keep the
        // pointer. The memory the config names is the kernel's to validate.
        let ret = unsafe { libc::ioctl(self.file.as_raw_fd(), abi::LGUEST_CREATE_VM as _, arg) };
        check("LGUEST_CREATE_VM", ret).map(drop)
    }

    /// Creates the next vCPU (`LGUEST_CREATE_VCPU`) and returns its index.
    pub fn create_vcpu(&self) -> Result<u32, DevError> {
        // SAFETY: LGUEST_CREATE_VCPU takes no argument and touches no memory
        // of ours; the fd is open for the lifetime of `self`.
        let ret = unsafe { libc::ioctl(self.file.as_raw_fd(), abi::LGUEST_CREATE_VCPU as _, 0) };
        let ret = check("LGUEST_CREATE_VCPU", ret)?;
        // CAST: a non-negative c_int always fits in u32.
        Ok(ret as u32)
    }

    /// Runs vCPU `vcpu` until it needs the launcher (`LGUEST_RUN`); the
    /// reason is then in its run page.
    ///
    /// The raw `io::Error` is returned so the caller can tell `EINTR` (a
    /// signal or `immediate_exit`: `e.raw_os_error() == Some(libc::EINTR)`)
    /// from a real failure.
    pub fn run(&self, vcpu: u32) -> Result<(), io::Error> {
        // SAFETY: LGUEST_RUN takes the vCPU index as a plain integer and
        // touches no memory of ours except the run page, which the kernel
        // owns the mapping of and writes only with the ordinary user-copy
        // rules; we hold no reference into that page (see RunPage).
        let ret = unsafe { libc::ioctl(self.file.as_raw_fd(), abi::LGUEST_RUN as _, libc::c_ulong::from(vcpu)) };
        if ret < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(())
        }
    }

    /// Raises guest interrupt `irq` (`LGUEST_IRQ`); safe from any thread,
    /// also while another thread is inside RUN.
    pub fn irq(&self, irq: u32) -> Result<(), DevError> {
        // SAFETY: LGUEST_IRQ takes the interrupt number as a plain integer
        // and touches no memory of ours.
        let ret = unsafe { libc::ioctl(self.file.as_raw_fd(), abi::LGUEST_IRQ as _, libc::c_ulong::from(irq)) };
        if ret < 0 {
            return Err(DevError::Ioctl { what: "LGUEST_IRQ", source: io::Error::last_os_error() });
        }
        Ok(())
    }

    /// Binds eventfd `fd` to guest interrupt `irq` (`LGUEST_IRQFD`): each
    /// signal of it then raises the interrupt without the launcher.
    pub fn irqfd(&self, fd: RawFd, irq: u32) -> Result<(), DevError> {
        let arg = abi::LguestIrqfd { fd, irq, flags: 0, pad: 0 };
        let ptr: *const abi::LguestIrqfd = &arg;
        // SAFETY: LGUEST_IRQFD only reads one LguestIrqfd (its size is in the
        // ioctl number) from `ptr`, which points to a live, initialised one
        // for the whole call; the kernel takes its own reference to the fd.
        let ret = unsafe { libc::ioctl(self.file.as_raw_fd(), abi::LGUEST_IRQFD as _, ptr) };
        check("LGUEST_IRQFD", ret).map(drop)
    }

    /// Binds eventfd `fd` to notification address `addr`
    /// (`LGUEST_IOEVENTFD`): a guest `LHCALL_NOTIFY(addr)` then signals it
    /// without an exit. The raw error is returned so that `ENOTTY` (a module
    /// without the ioctl) can be told apart.
    pub fn ioeventfd(&self, addr: u64, fd: RawFd) -> Result<(), io::Error> {
        let arg = abi::LguestIoeventfd { addr, fd, flags: 0 };
        let ptr: *const abi::LguestIoeventfd = &arg;
        // SAFETY: LGUEST_IOEVENTFD only reads one LguestIoeventfd (its size
        // is in the ioctl number) from `ptr`, which points to a live,
        // initialised one for the whole call.
        let ret = unsafe { libc::ioctl(self.file.as_raw_fd(), abi::LGUEST_IOEVENTFD as _, ptr) };
        if ret < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(())
        }
    }

    /// Gives the VM its CPUID table (`LGUEST_SET_CPUID`; empty: none).
    pub fn set_cpuid(&self, table: &[abi::LguestCpuidEntry]) -> Result<(), DevError> {
        let nent = u32::try_from(table.len()).unwrap_or(u32::MAX);
        let mut buf: Vec<u32> = Vec::with_capacity(2 + table.len() * 10);
        buf.extend([nent, 0]);
        buf.extend(table.iter().flat_map(abi::LguestCpuidEntry::words));
        // SAFETY: LGUEST_SET_CPUID reads a struct lguest_cpuid header and
        // the `nent` 40-byte entries right after it from `buf`, which holds
        // exactly those (2 + 10 * nent u32s, in the C layout) for the
        // whole call.
        let ret = unsafe { libc::ioctl(self.file.as_raw_fd(), abi::LGUEST_SET_CPUID as _, buf.as_ptr()) };
        check("LGUEST_SET_CPUID", ret).map(drop)
    }

    /// Reads vCPU `vcpu`'s registers (`LGUEST_GET_REGS`).
    pub fn get_regs(&self, vcpu: u32) -> Result<abi::LguestRegs, DevError> {
        let mut arg = abi::LguestVcpuRegs { vcpu, pad: 0, regs: abi::LguestRegs::default() };
        let ptr: *mut abi::LguestVcpuRegs = &mut arg;
        // SAFETY: LGUEST_GET_REGS reads and writes one LguestVcpuRegs (its
        // size is in the ioctl number) at `ptr`, which points to a live,
        // initialised, exclusively borrowed one for the whole call; every bit
        // pattern is a valid LguestVcpuRegs (plain integers).
        let ret = unsafe { libc::ioctl(self.file.as_raw_fd(), abi::LGUEST_GET_REGS as _, ptr) };
        check("LGUEST_GET_REGS", ret)?;
        Ok(arg.regs)
    }

    /// Writes vCPU `vcpu`'s registers (`LGUEST_SET_REGS`).
    pub fn set_regs(&self, vcpu: u32, regs: &abi::LguestRegs) -> Result<(), DevError> {
        let arg = abi::LguestVcpuRegs { vcpu, pad: 0, regs: *regs };
        let ptr: *const abi::LguestVcpuRegs = &arg;
        // SAFETY: LGUEST_SET_REGS only reads one LguestVcpuRegs (its size is
        // in the ioctl number) from `ptr`, which points to a live, initialised
        // one for the whole call.
        let ret = unsafe { libc::ioctl(self.file.as_raw_fd(), abi::LGUEST_SET_REGS as _, ptr) };
        check("LGUEST_SET_REGS", ret).map(drop)
    }

    /// Maps vCPU `vcpu`'s run page: 4096 bytes of the device at offset
    /// `vcpu * 4096`, shared and writable.
    pub fn map_run_page(&self, vcpu: u32) -> Result<RunPage, DevError> {
        let offset = u64::from(vcpu) * RUN_PAGE_SIZE as u64;
        let offset = libc::off_t::try_from(offset)
            .map_err(|_| DevError::MapRunPage { vcpu, source: io::Error::from_raw_os_error(libc::EOVERFLOW) })?;
        // SAFETY: a fresh mapping (no MAP_FIXED) cannot alias any Rust
        // object; the fd is valid for the call, and the mapping keeps its own
        // reference to the file, so it outlives `self` safely.
        let addr = unsafe {
            libc::mmap(
                ptr::null_mut(),
                RUN_PAGE_SIZE,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                self.file.as_raw_fd(),
                offset,
            )
        };
        if addr == libc::MAP_FAILED {
            return Err(DevError::MapRunPage { vcpu, source: io::Error::last_os_error() });
        }
        // mmap without MAP_FIXED never places a mapping at 0; be safe anyway.
        let addr = NonNull::new(addr)
            .ok_or(DevError::MapRunPage { vcpu, source: io::Error::from_raw_os_error(libc::EFAULT) })?;
        // SAFETY: `addr` is a fresh, page-aligned, readable and writable
        // mapping of RUN_PAGE_SIZE bytes that nothing else owns.
        Ok(unsafe { RunPage::from_mapping(addr) })
    }
}

/// A copy of the exit data of a run page, taken after RUN returned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExitData {
    /// `LGUEST_EXIT_*`.
    pub exit_reason: u32,
    /// For `LGUEST_EXIT_NOTIFY`: the guest-physical address argument.
    pub notify_addr: u64,
    /// For `LGUEST_EXIT_NOTIFY`: the second argument.
    pub notify_arg: u64,
    /// For `LGUEST_EXIT_SHUTDOWN`: `LGUEST_SHUTDOWN_*`.
    pub shutdown_reason: u64,
    /// For `LGUEST_EXIT_SHUTDOWN` and `LGUEST_EXIT_KILLED`: a message that
    /// should be NUL-terminated (nothing makes sure it is).
    pub message: [u8; abi::LGUEST_MESSAGE_LEN],
}

impl ExitData {
    /// An exit of `reason` with every other field zero (for tests that
    /// fabricate exits).
    #[cfg(test)]
    pub const fn new(exit_reason: u32) -> Self {
        Self { exit_reason, notify_addr: 0, notify_arg: 0, shutdown_reason: 0, message: [0; abi::LGUEST_MESSAGE_LEN] }
    }
}

/// A vCPU's counters from its run page.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RunStats {
    /// Exits of every kind since the vCPU was created.
    pub exits: u64,
    /// Hypercalls since the vCPU was created.
    pub hypercalls: u64,
    /// User-mode `syscall`s the switcher took to the guest kernel without
    /// an exit, and returns to user mode it made so
    /// ([`abi::LGUEST_SYSCALL_DIRECT`]).
    pub direct_syscalls: u64,
    pub direct_sysrets: u64,
    /// Indirect branch prediction barriers made for the guest
    /// ([`abi::LHCALL_IBPB`]).
    pub ibpbs: u64,
    /// Root switches that found the next root's shadow kept.
    pub shadow_reuses: u64,
}

/// A mapped run page ([`abi::LguestRun`]) of one vCPU; unmapped on drop.
///
/// It is neither `Send` nor `Sync` (it holds a raw pointer): the vCPU thread
/// owns it, and only the `immediate_exit` byte is meant for others (a
/// signal handler), through [`RunPage::immediate_exit_ptr`].
#[derive(Debug)]
pub struct RunPage {
    page: NonNull<abi::LguestRun>,
}

impl RunPage {
    /// Takes ownership of a mapping of [`RUN_PAGE_SIZE`] bytes at `addr`.
    ///
    /// # Safety
    ///
    /// `addr` must be the start of a page-aligned, readable and writable
    /// mapping of at least [`RUN_PAGE_SIZE`] bytes made with `mmap(2)`, which
    /// nothing else uses as Rust memory, and which the returned value may
    /// `munmap` when it is dropped.
    unsafe fn from_mapping(addr: NonNull<libc::c_void>) -> Self {
        Self { page: addr.cast() }
    }

    /// An anonymous shared page standing in for a device run page,
    /// so that the type can be tested without `/dev/lguest`.
    #[cfg(test)]
    pub fn anonymous() -> io::Result<Self> {
        // SAFETY: a fresh anonymous mapping (no MAP_FIXED) aliases nothing.
        let addr = unsafe {
            libc::mmap(
                ptr::null_mut(),
                RUN_PAGE_SIZE,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if addr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let addr = NonNull::new(addr).ok_or(io::Error::from_raw_os_error(libc::EFAULT))?;
        // SAFETY: `addr` is a fresh, page-aligned, readable and writable
        // mapping of RUN_PAGE_SIZE bytes that nothing else owns.
        Ok(unsafe { Self::from_mapping(addr) })
    }

    /// A raw pointer to the page, for field projections.
    fn raw(&self) -> *mut abi::LguestRun {
        self.page.as_ptr()
    }

    /// Copies the exit fields out of the page. Call it only after RUN has
    /// returned (the host writes them during RUN); `immediate_exit` is not
    /// read.
    pub fn exit(&self) -> ExitData {
        let p = self.raw();
        // SAFETY: `p` points to a live mapping of RUN_PAGE_SIZE bytes (the
        // type's invariant) holding an LguestRun, whose fields are plain
        // integers valid for any bit pattern; each field is read through a
        // raw projection (no reference is formed) with a volatile read, as
        // the host may have written it behind the compiler's back.
        unsafe {
            ExitData {
                exit_reason: ptr::read_volatile(&raw const (*p).exit_reason),
                notify_addr: ptr::read_volatile(&raw const (*p).notify_addr),
                notify_arg: ptr::read_volatile(&raw const (*p).notify_arg),
                shutdown_reason: ptr::read_volatile(&raw const (*p).shutdown_reason),
                message: ptr::read_volatile(&raw const (*p).message),
            }
        }
    }

    /// Reads the vCPU's counters.
    pub fn stats(&self) -> RunStats {
        let p = self.raw();
        // SAFETY: as in `exit`: live mapping, integer fields, raw projections
        // and volatile reads only.
        unsafe {
            RunStats {
                exits: ptr::read_volatile(&raw const (*p).stat_exits),
                hypercalls: ptr::read_volatile(&raw const (*p).stat_hypercalls),
                direct_syscalls: ptr::read_volatile(&raw const (*p).stat_direct_syscalls),
                direct_sysrets: ptr::read_volatile(&raw const (*p).stat_direct_sysrets),
                ibpbs: ptr::read_volatile(&raw const (*p).stat_ibpbs),
                shadow_reuses: ptr::read_volatile(&raw const (*p).stat_shadow_reuses),
            }
        }
    }

    /// The address of the `immediate_exit` byte, for a signal handler.
    ///
    /// It stays valid while `self` lives. Every access to it must be atomic
    /// (`AtomicU8::from_ptr`), as [`Self::set_immediate_exit`] is.
    pub fn immediate_exit_ptr(&self) -> *mut u8 {
        let p = self.raw();
        // SAFETY: a raw field projection inside the live mapping; nothing is
        // read or written here.
        unsafe { &raw mut (*p).immediate_exit }
    }

    /// The `immediate_exit` byte as an atomic.
    fn immediate_exit_atomic(&self) -> &AtomicU8 {
        // SAFETY: the pointer is valid for reads and writes for the lifetime
        // of `&self` (the mapping lives as long as `self`), u8 and AtomicU8
        // have the same size and alignment, and every launcher access to the
        // byte is atomic (this function, and the signal handler through
        // `immediate_exit_ptr`), so there are no mixed non-atomic accesses.
        // The kernel reading it is outside the Rust memory model.
        unsafe { AtomicU8::from_ptr(self.immediate_exit_ptr()) }
    }

    /// Sets or clears `immediate_exit`: while it is set, RUN returns `EINTR`
    /// at once.
    pub fn set_immediate_exit(&self, value: bool) {
        self.immediate_exit_atomic().store(u8::from(value), Ordering::SeqCst);
    }

    /// Reads `immediate_exit`.
    #[cfg(test)]
    pub fn immediate_exit(&self) -> bool {
        self.immediate_exit_atomic().load(Ordering::SeqCst) != 0
    }

    /// Writes the exit fields as the host would (tests only).
    #[cfg(test)]
    pub fn fake_exit(&self, exit: &ExitData, stats: RunStats) {
        let p = self.raw();
        // SAFETY: live mapping, integer fields, raw projections and volatile
        // writes only; no reference into the page is formed.
        unsafe {
            ptr::write_volatile(&raw mut (*p).exit_reason, exit.exit_reason);
            ptr::write_volatile(&raw mut (*p).notify_addr, exit.notify_addr);
            ptr::write_volatile(&raw mut (*p).notify_arg, exit.notify_arg);
            ptr::write_volatile(&raw mut (*p).shutdown_reason, exit.shutdown_reason);
            ptr::write_volatile(&raw mut (*p).message, exit.message);
            ptr::write_volatile(&raw mut (*p).stat_exits, stats.exits);
            ptr::write_volatile(&raw mut (*p).stat_hypercalls, stats.hypercalls);
            ptr::write_volatile(&raw mut (*p).stat_direct_syscalls, stats.direct_syscalls);
            ptr::write_volatile(&raw mut (*p).stat_direct_sysrets, stats.direct_sysrets);
            ptr::write_volatile(&raw mut (*p).stat_ibpbs, stats.ibpbs);
            ptr::write_volatile(&raw mut (*p).stat_shadow_reuses, stats.shadow_reuses);
        }
    }
}

impl Drop for RunPage {
    fn drop(&mut self) {
        // SAFETY: the mapping was made by mmap with RUN_PAGE_SIZE bytes and is
        // owned by `self`; no reference into it outlives `self` (the signal
        // guard borrows `self`, so it is gone by now).
        let ret = unsafe { libc::munmap(self.page.as_ptr().cast(), RUN_PAGE_SIZE) };
        if ret != 0 {
            log::warn!("munmap of a run page failed: {}", io::Error::last_os_error());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_fields_round_trip() {
        let page = RunPage::anonymous().expect("anonymous page");
        assert_eq!(page.exit(), ExitData::new(0));
        let mut exit = ExitData::new(abi::LGUEST_EXIT_SHUTDOWN);
        exit.notify_addr = 0x1234;
        exit.notify_arg = 7;
        exit.shutdown_reason = abi::LGUEST_SHUTDOWN_CRASH;
        exit.message[..5].copy_from_slice(b"oops\0");
        let stats =
            RunStats { exits: 3, hypercalls: 2, direct_syscalls: 5, direct_sysrets: 4, ibpbs: 6, shadow_reuses: 8 };
        page.fake_exit(&exit, stats);
        assert_eq!(page.exit(), exit);
        assert_eq!(page.stats(), stats);
    }

    #[test]
    fn immediate_exit_is_the_first_byte() {
        let page = RunPage::anonymous().expect("anonymous page");
        assert!(!page.immediate_exit());
        page.set_immediate_exit(true);
        assert!(page.immediate_exit());
        // It is byte 0 of the page, where the host looks for it.
        assert_eq!(page.immediate_exit_ptr().cast::<abi::LguestRun>(), page.raw());
        // Setting it leaves the exit data alone.
        assert_eq!(page.exit(), ExitData::new(0));
        page.set_immediate_exit(false);
        assert!(!page.immediate_exit());
    }

    #[test]
    fn missing_device_is_reported() {
        let err = Lguest::open(Path::new("/nonexistent/lguest")).expect_err("no such node");
        assert!(matches!(err, DevError::NoDevice { .. }), "{err}");
        assert!(err.to_string().contains("insmod"), "{err}");
    }
}
