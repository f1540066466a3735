// SPDX-License-Identifier: GPL-2.0
//! The one definition of the lguest ABI.
//!
//! This file is compiled three ways: into `lguest.ko` (with `#[path]` from
//! the module's crate root), into the `lguest-abi` crate that the launcher,
//! the guest and the selftests use, and it is checked field by field against
//! the C header `include/uapi/linux/lguest.h` by `cargo test -p lguest-abi`.
//! It must therefore stay plain `core` Rust: constants, `#[repr(C)]` structs
//! and `const fn`s, with no dependency on the kernel crate or on `std`.
//!
//! There are two ABIs here:
//!
//! - the **ioctl ABI** between a launcher and `/dev/lguest`, numbered with
//!   the `_IO*` scheme under the magic [`LGUEST_IOC_MAGIC`];
//! - the **guest ABI** between a guest and the host: hypercall numbers,
//!   trap vectors and the layout of `struct lguest_data`. lguest's
//!   numbers and names are kept wherever the meaning is the same.

/// The ioctl "type" byte of `/dev/lguest`. 0xAF 0x00-0x1F belongs to
/// `linux/fsl_hypervisor.h`; lguest uses 0x40-0x7F.
pub const LGUEST_IOC_MAGIC: u32 = 0xAF;

/// The version [`LGUEST_GET_API_VERSION`] returns. It changes only when an
/// existing ioctl changes incompatibly; new ioctls are found by trying them.
pub const LGUEST_API_VERSION: u32 = 1;

const IOC_NRBITS: u32 = 8;
const IOC_TYPEBITS: u32 = 8;
const IOC_SIZEBITS: u32 = 14;
const IOC_NRSHIFT: u32 = 0;
const IOC_TYPESHIFT: u32 = IOC_NRSHIFT + IOC_NRBITS;
const IOC_SIZESHIFT: u32 = IOC_TYPESHIFT + IOC_TYPEBITS;
const IOC_DIRSHIFT: u32 = IOC_SIZESHIFT + IOC_SIZEBITS;

/// `_IOC_NONE`: the ioctl moves no data.
pub const IOC_NONE: u32 = 0;
/// `_IOC_WRITE`: userspace writes data to the kernel.
pub const IOC_WRITE: u32 = 1;
/// `_IOC_READ`: userspace reads data from the kernel.
pub const IOC_READ: u32 = 2;

/// Builds an ioctl number the way `<asm-generic/ioctl.h>`'s `_IOC` does.
pub const fn ioc(dir: u32, ty: u32, nr: u32, size: usize) -> u32 {
    // CAST: every ABI struct is far smaller than the 14-bit size field
    // (the layout assertions at the end of this file bound them to a page).
    (dir << IOC_DIRSHIFT)
        | (ty << IOC_TYPESHIFT)
        | (nr << IOC_NRSHIFT)
        | ((size as u32) << IOC_SIZESHIFT)
}

/// `LGUEST_GET_API_VERSION`: returns [`LGUEST_API_VERSION`]. No argument.
pub const LGUEST_GET_API_VERSION: u32 = ioc(IOC_NONE, LGUEST_IOC_MAGIC, 0x40, 0);

/// `LGUEST_CREATE_VM`: give the file its guest (argument: [`LguestVmConfig`]).
/// One VM per open file; a second call gets `EEXIST`.
pub const LGUEST_CREATE_VM: u32 = ioc(
    IOC_WRITE,
    LGUEST_IOC_MAGIC,
    0x41,
    core::mem::size_of::<LguestVmConfig>(),
);
/// `LGUEST_CREATE_VCPU`: create the next vCPU; returns its index, which is
/// also its run page's mmap offset in pages. No argument.
pub const LGUEST_CREATE_VCPU: u32 = ioc(IOC_NONE, LGUEST_IOC_MAGIC, 0x42, 0);
/// `LGUEST_RUN`: run vCPU `arg` until it needs the launcher; the reason is in
/// its [`LguestRun`] page. `EINTR` on a signal or `immediate_exit`.
pub const LGUEST_RUN: u32 = ioc(IOC_NONE, LGUEST_IOC_MAGIC, 0x43, 0);
/// `LGUEST_GET_REGS`: read a vCPU's registers ([`LguestVcpuRegs`], in/out).
pub const LGUEST_GET_REGS: u32 = ioc(
    IOC_READ | IOC_WRITE,
    LGUEST_IOC_MAGIC,
    0x44,
    core::mem::size_of::<LguestVcpuRegs>(),
);
/// `LGUEST_SET_REGS`: write a vCPU's registers ([`LguestVcpuRegs`]).
pub const LGUEST_SET_REGS: u32 = ioc(
    IOC_WRITE,
    LGUEST_IOC_MAGIC,
    0x45,
    core::mem::size_of::<LguestVcpuRegs>(),
);

/// `LGUEST_IRQ`: raise guest interrupt `arg` (0..[`LGUEST_IRQS`]) from any
/// thread; a halted vCPU wakes, a running one is kicked out of the guest.
pub const LGUEST_IRQ: u32 = ioc(IOC_NONE, LGUEST_IOC_MAGIC, 0x46, 0);

/// `LGUEST_IRQFD`: bind an eventfd to a guest interrupt, or unbind it
/// (argument: [`LguestIrqfd`]). Each signal of the eventfd then raises the
/// interrupt, as `LGUEST_IRQ` does, without the launcher's help.
pub const LGUEST_IRQFD: u32 = ioc(
    IOC_WRITE,
    LGUEST_IOC_MAGIC,
    0x47,
    core::mem::size_of::<LguestIrqfd>(),
);
/// [`LguestIrqfd::flags`]: remove the binding of `fd` to `irq`.
pub const LGUEST_IRQFD_DEASSIGN: u32 = 1;
/// The most eventfds bound per open file (that is, per VM).
pub const LGUEST_MAX_IRQFDS: usize = 16;

/// The argument of [`LGUEST_IRQFD`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LguestIrqfd {
    /// The eventfd.
    pub fd: i32,
    /// The guest interrupt (below [`LGUEST_IRQS`]).
    pub irq: u32,
    /// 0 to bind, [`LGUEST_IRQFD_DEASSIGN`] to unbind.
    pub flags: u32,
    /// Must be 0.
    pub pad: u32,
}

/// `LGUEST_IOEVENTFD`: bind an eventfd to a notification address, or
/// unbind it (argument: [`LguestIoeventfd`]). A guest `LHCALL_NOTIFY` whose
/// first argument is exactly `addr` then signals the eventfd and the guest
/// continues, without an exit to the launcher (lguest's `LHREQ_EVENTFD`).
/// Binding an address twice gets `EEXIST`; unbinding one that is not bound
/// gets `ENOENT`.
pub const LGUEST_IOEVENTFD: u32 = ioc(
    IOC_WRITE,
    LGUEST_IOC_MAGIC,
    0x48,
    core::mem::size_of::<LguestIoeventfd>(),
);
/// [`LguestIoeventfd::flags`]: remove the binding of `addr`.
pub const LGUEST_IOEVENTFD_DEASSIGN: u32 = 1;
/// The most notification addresses bound per VM.
pub const LGUEST_MAX_IOEVENTFDS: usize = 32;

/// The argument of [`LGUEST_IOEVENTFD`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LguestIoeventfd {
    /// The guest-physical notification address (inside the device window).
    pub addr: u64,
    /// The eventfd (ignored when unbinding).
    pub fd: i32,
    /// 0 to bind, [`LGUEST_IOEVENTFD_DEASSIGN`] to unbind.
    pub flags: u32,
}

/// `LGUEST_SET_CPUID`: the VM's CPUID table (argument: [`LguestCpuid`],
/// immediately followed by its `nent` [`LguestCpuidEntry`]s: the shape of
/// KVM's `KVM_SET_CPUID2`). The table replaces the previous one; `nent` 0
/// removes it. More than [`LGUEST_MAX_CPUID_ENTRIES`] entries get `E2BIG`;
/// a non-zero padding, an unknown flag or two entries for the same leaf
/// and subleaf get `EINVAL`; `EBUSY` while the vCPU runs, `ENOENT` before
/// `LGUEST_CREATE_VM`.
///
/// The guest gets the table's values from a CPUID the host emulates: one
/// behind [`LGUEST_EMULATE_PREFIX`] (any host), and a plain `cpuid` where
/// the launcher thread that runs the vCPU made CPUID fault
/// (`arch_prctl(ARCH_SET_CPUID, 0)`, hosts with CPUID faulting). A leaf
/// and subleaf with no entry reads as four zeros. Without a table, the
/// emulated CPUID gives the host CPU's values, as a plain one does.
pub const LGUEST_SET_CPUID: u32 = ioc(
    IOC_WRITE,
    LGUEST_IOC_MAGIC,
    0x49,
    core::mem::size_of::<LguestCpuid>(),
);
/// The most entries of a CPUID table (KVM's `KVM_MAX_CPUID_ENTRIES`).
pub const LGUEST_MAX_CPUID_ENTRIES: u32 = 256;
/// [`LguestCpuidEntry::flags`]: the entry is for one subleaf (ECX equal to
/// `index`); without it the entry answers every ECX. KVM's
/// `KVM_CPUID_FLAG_SIGNIFCANT_INDEX`.
pub const LGUEST_CPUID_FLAG_SIGNIFICANT_INDEX: u32 = 1;

/// The header of [`LGUEST_SET_CPUID`]'s argument (`struct kvm_cpuid2`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LguestCpuid {
    /// How many entries follow.
    pub nent: u32,
    /// Must be 0.
    pub padding: u32,
}

/// One leaf (or subleaf) of a CPUID table (`struct kvm_cpuid_entry2`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LguestCpuidEntry {
    /// The leaf: EAX at the CPUID.
    pub function: u32,
    /// The subleaf: ECX, with [`LGUEST_CPUID_FLAG_SIGNIFICANT_INDEX`].
    pub index: u32,
    /// 0 or [`LGUEST_CPUID_FLAG_SIGNIFICANT_INDEX`].
    pub flags: u32,
    /// What CPUID returns in EAX.
    pub eax: u32,
    /// What CPUID returns in EBX.
    pub ebx: u32,
    /// What CPUID returns in ECX.
    pub ecx: u32,
    /// What CPUID returns in EDX.
    pub edx: u32,
    /// Must be 0.
    pub padding: [u32; 3],
}

impl LguestCpuidEntry {
    /// The entry as the ten 32-bit words of its C layout (what follows the
    /// header in [`LGUEST_SET_CPUID`]'s argument).
    pub const fn words(&self) -> [u32; 10] {
        let p = self.padding;
        [
            self.function,
            self.index,
            self.flags,
            self.eax,
            self.ebx,
            self.ecx,
            self.edx,
            p[0],
            p[1],
            p[2],
        ]
    }

    /// Whether this entry answers CPUID leaf `leaf`, subleaf `subleaf`.
    pub const fn answers(&self, leaf: u32, subleaf: u32) -> bool {
        self.function == leaf
            && (self.flags & LGUEST_CPUID_FLAG_SIGNIFICANT_INDEX == 0 || self.index == subleaf)
    }

    /// Whether this entry and `other` could answer the same CPUID.
    const fn overlaps(&self, other: &Self) -> bool {
        self.function == other.function
            && (self.flags & LGUEST_CPUID_FLAG_SIGNIFICANT_INDEX == 0
                || other.flags & LGUEST_CPUID_FLAG_SIGNIFICANT_INDEX == 0
                || self.index == other.index)
    }
}

/// Whether `table` is one [`LGUEST_SET_CPUID`] takes (apart from its
/// size): known flags, zero padding, at most one entry for any leaf and
/// subleaf.
pub const fn cpuid_table_valid(table: &[LguestCpuidEntry]) -> bool {
    let mut i = 0;
    while i < table.len() {
        let e = &table[i];
        if e.flags & !LGUEST_CPUID_FLAG_SIGNIFICANT_INDEX != 0
            || e.padding[0] != 0
            || e.padding[1] != 0
            || e.padding[2] != 0
        {
            return false;
        }
        let mut j = 0;
        while j < i {
            if e.overlaps(&table[j]) {
                return false;
            }
            j += 1;
        }
        i += 1;
    }
    true
}

/// What an emulated CPUID of leaf `leaf`, subleaf `subleaf` returns from
/// `table`: EAX, EBX, ECX, EDX of its entry, or zeros.
pub const fn cpuid_lookup(table: &[LguestCpuidEntry], leaf: u32, subleaf: u32) -> [u32; 4] {
    let mut i = 0;
    while i < table.len() {
        let e = &table[i];
        if e.answers(leaf, subleaf) {
            return [e.eax, e.ebx, e.ecx, e.edx];
        }
        i += 1;
    }
    [0; 4]
}

/// CPUID leaf 0xD, subleaf 0, EBX as hardware computes it: the bytes an
/// XSAVE area needs for the state components enabled in `xcr0` (the legacy
/// area and the header, 576 bytes, and every enabled component from 2 up,
/// at the offset and size `leaf_d` gives for its subleaf). A table's EBX is
/// the host's value for the host's XCR0; a guest kernel that enables fewer
/// components (Linux: those it supports) checks the size it computes
/// against this one and turns XSAVE off if they differ.
pub fn xsave_size(xcr0: u64, leaf_d: impl Fn(u32) -> [u32; 4]) -> u32 {
    let mut size = 576;
    for i in 2..63 {
        if xcr0 & (1 << i) != 0 {
            let [len, offset, _, _] = leaf_d(i);
            size = size.max(offset.saturating_add(len));
        }
    }
    size
}

/// The most memory a guest may have (4 GiB): guest-physical addresses stay
/// far below the switcher, and the initial linear map stays small.
pub const LGUEST_MAX_MEM: u64 = 4 << 30;
/// The most device pages above guest RAM.
pub const LGUEST_MAX_DEVICE_PAGES: u64 = 256;
/// The most vCPUs per VM (guests are uniprocessor for now).
pub const LGUEST_MAX_VCPUS: u32 = 1;

/// The argument of [`LGUEST_CREATE_VM`].
///
/// Guest-physical address `P` is launcher address `mem_base + P` for RAM,
/// `[0, mem_size)`, and for the device window above it,
/// `[mem_size, mem_size + device_pages * 4096)`. RAM must be mapped and
/// writable in the launcher when the VM is created; both are pinned and
/// both count against `RLIMIT_MEMLOCK`. The device window holds the lguest
/// bus (`bus.rs`); the guest starts with both mapped linearly.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LguestVmConfig {
    /// Launcher address of guest-physical 0; page aligned.
    pub mem_base: u64,
    /// Bytes of guest RAM; a non-zero multiple of 4096, at most [`LGUEST_MAX_MEM`].
    pub mem_size: u64,
    /// Pages of the device window right above RAM; at most [`LGUEST_MAX_DEVICE_PAGES`].
    pub device_pages: u64,
    /// Where the first vCPU starts (guest-virtual = guest-physical at boot).
    pub entry: u64,
    /// No flags are defined yet: must be 0.
    pub flags: u32,
    /// Must be 0.
    pub reserved0: u32,
    /// Must be 0.
    pub reserved: [u64; 4],
}

/// A vCPU's registers as the launcher sees them.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LguestRegs {
    /// General purpose registers.
    pub rax: u64,
    /// General purpose registers.
    pub rbx: u64,
    /// General purpose registers.
    pub rcx: u64,
    /// General purpose registers.
    pub rdx: u64,
    /// General purpose registers.
    pub rsi: u64,
    /// General purpose registers.
    pub rdi: u64,
    /// General purpose registers.
    pub rbp: u64,
    /// General purpose registers.
    pub r8: u64,
    /// General purpose registers.
    pub r9: u64,
    /// General purpose registers.
    pub r10: u64,
    /// General purpose registers.
    pub r11: u64,
    /// General purpose registers.
    pub r12: u64,
    /// General purpose registers.
    pub r13: u64,
    /// General purpose registers.
    pub r14: u64,
    /// General purpose registers.
    pub r15: u64,
    /// Instruction pointer (guest-virtual).
    pub rip: u64,
    /// Stack pointer (guest-virtual).
    pub rsp: u64,
    /// Flags. On SET_REGS only the arithmetic flags, DF, TF and AC are taken;
    /// the host keeps IF=1, IOPL=0 and the reserved bits.
    pub rflags: u64,
}

/// The argument of [`LGUEST_GET_REGS`] and [`LGUEST_SET_REGS`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LguestVcpuRegs {
    /// The vCPU index.
    pub vcpu: u32,
    /// Must be 0.
    pub pad: u32,
    /// The registers.
    pub regs: LguestRegs,
}

/// [`LguestRun::exit_reason`]: the guest made `LHCALL_NOTIFY` (an early
/// console string or a device kick); see [`LguestRun::notify_addr`].
pub const LGUEST_EXIT_NOTIFY: u32 = 1;
/// The guest called `LHCALL_SHUTDOWN`; see `shutdown_reason` and `message`.
pub const LGUEST_EXIT_SHUTDOWN: u32 = 2;
/// The host killed the guest for breaking the rules; see `message`. The VM
/// cannot run again: a later RUN returns the same exit.
pub const LGUEST_EXIT_KILLED: u32 = 3;
/// The guest halted (`LHCALL_HALT`) with every interrupt blocked in
/// `blocked_interrupts`: nothing can ever wake it. (A halt with an
/// interrupt open sleeps in the host until one arrives.)
pub const LGUEST_EXIT_HALT: u32 = 4;

/// `LHCALL_SHUTDOWN` argument 2: power off.
pub const LGUEST_SHUTDOWN_POWEROFF: u64 = 1;
/// `LHCALL_SHUTDOWN` argument 2: restart.
pub const LGUEST_SHUTDOWN_RESTART: u64 = 2;
/// `LHCALL_SHUTDOWN` argument 2: the guest crashed (a panic).
pub const LGUEST_SHUTDOWN_CRASH: u64 = 3;

/// Bytes of the mmap of one run page.
pub const LGUEST_RUN_PAGE_SIZE: usize = 4096;

/// Bytes of `LguestRun::message`.
pub const LGUEST_MESSAGE_LEN: usize = 256;

/// The run page of a vCPU: mmap the VM's file at offset `vcpu * 4096`.
///
/// The launcher writes only `immediate_exit`; everything else is written by
/// the host when RUN returns.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct LguestRun {
    /// Set to non-zero (for example from a signal handler) to make the next
    /// RUN return `EINTR` at once. Read once at the start of RUN; the host
    /// never clears it.
    pub immediate_exit: u8,
    /// Padding.
    pub pad0: [u8; 3],
    /// Why RUN returned: `LGUEST_EXIT_*`.
    pub exit_reason: u32,
    /// For `LGUEST_EXIT_NOTIFY`: the guest-physical address argument.
    pub notify_addr: u64,
    /// For `LGUEST_EXIT_NOTIFY`: the second argument.
    pub notify_arg: u64,
    /// For `LGUEST_EXIT_SHUTDOWN`: `LGUEST_SHUTDOWN_*`.
    pub shutdown_reason: u64,
    /// Number of exits of every kind since the vCPU was created.
    pub stat_exits: u64,
    /// Number of hypercalls since the vCPU was created.
    pub stat_hypercalls: u64,
    /// Shadow page-table pages the VM holds (all roots, kernel and user
    /// tables), as of this exit.
    pub stat_shadow_pages: u64,
    /// Number of entries with the guest's FPU state loaded (one XRSTOR and
    /// one XSAVE each): 0 for a guest that never used x87, SSE or AVX.
    pub stat_fpu_entries: u64,
    /// Number of entries that flushed the host's global TLB entries (the
    /// guest had upper-half mappings; Documentation/switcher.rst, "Global
    /// pages").
    pub stat_global_flushes: u64,
    /// Number of user-mode `syscall`s the switcher took straight to the
    /// guest kernel's direct entry, without an exit
    /// ([`LGUEST_SYSCALL_DIRECT`]).
    pub stat_direct_syscalls: u64,
    /// Number of returns to user mode by [`LGUEST_SYSRET_VECTOR`] the
    /// switcher made without an exit.
    pub stat_direct_sysrets: u64,
    /// Number of indirect branch prediction barriers the guest asked for
    /// ([`LHCALL_IBPB`]) that were made: its own, and one at each entry
    /// to its kernel from user mode while [`LGUEST_IBPB_USER_ENTRY`] is on.
    pub stat_ibpbs: u64,
    /// Number of switches of the guest's top-level table that found the
    /// next root's shadow kept (its cached root, or under TLB semantics its
    /// PCID's, [`LGUEST_PGTABLE_NOFLUSH`]), rather than starting empty.
    pub stat_shadow_reuses: u64,
    /// Reserved for later exit data.
    pub reserved: [u64; 3],
    /// For `LGUEST_EXIT_SHUTDOWN` and `LGUEST_EXIT_KILLED`: a NUL-terminated
    /// message (the guest's, or the host's reason for the kill).
    pub message: [u8; LGUEST_MESSAGE_LEN],
}

/// Code segment selector of the guest (ring 3, 64-bit).
pub const LGUEST_GUEST_CS: u64 = 0x33;
/// Stack and data segment selector of the guest (ring 3).
pub const LGUEST_GUEST_SS: u64 = 0x2b;

// ---------------------------------------------------------------------------
// The guest ABI.
// ---------------------------------------------------------------------------

/// The software interrupt vector a guest uses for hypercalls (`int $0x1f`).
///
/// Register convention (the Linux system-call one, so that a later SYSCALL
/// fast path needs no shuffling): RAX holds the `LHCALL_*` number, RDI, RSI,
/// RDX and R10 hold arguments 1 to 4; the result, if any, comes back in RAX.
/// Every other register is preserved.
pub const LGUEST_TRAP_ENTRY: u8 = 0x1F;

/// The forced-emulation prefix: `ud2` and the letters "lgu". A `cpuid`
/// right after it is emulated by the host (from the launcher's
/// [`LGUEST_SET_CPUID`] table, if any), in guest kernel or user mode, on
/// any host: a guest kernel's CPUID hook uses it (Xen PV's
/// `XEN_EMULATE_PREFIX`). RIP moves past both; anything else after the
/// prefix is the `ud2`'s #UD.
pub const LGUEST_EMULATE_PREFIX: [u8; LGUEST_EMULATE_PREFIX_LEN] = *b"\x0f\x0blgu";
/// The length of [`LGUEST_EMULATE_PREFIX`].
pub const LGUEST_EMULATE_PREFIX_LEN: usize = 5;
/// KVM's forced-emulation prefix, `ud2` and "kvm", which the host takes
/// exactly as [`LGUEST_EMULATE_PREFIX`]: Linux's instruction decoder (and
/// so objtool, which checks every instruction of a kernel) knows it and
/// Xen's as prefixes, and would read "lgu" as instructions, so the Linux
/// guest's CPUID hook uses this one.
pub const LGUEST_KVM_EMULATE_PREFIX: [u8; LGUEST_EMULATE_PREFIX_LEN] = *b"\x0f\x0bkvm";

/// Where a guest starts: the ELF entry point, in ring 3, with CS
/// [`LGUEST_GUEST_CS`], SS [`LGUEST_GUEST_SS`], hardware IF set, virtual
/// interrupts off, on the initial linear map (virtual = guest-physical for all
/// of RAM). RDI holds the guest-physical address of the NUL-terminated
/// command line, which the launcher puts in the last page of RAM
/// ([`LGUEST_CMDLINE_MAX`] bytes at most); RSI holds the size of RAM.
pub const LGUEST_CMDLINE_MAX: usize = 4096;

/// The end of the guest-virtual addresses a guest may map and run at:
/// `(1 << 47) - 4096`. The last page below the canonical limit is never
/// mappable (as `TASK_SIZE_MAX` keeps it from every Linux process): code
/// there could leave a non-canonical RIP, `1 << 47`, for the switcher's
/// iretq, which would fault in ring 0; and executing from that page
/// misbehaves on some AMD CPUs. Every check of a guest address (page
/// faults, IDT handlers, kernel stack, user-mode entry, registers set by
/// the launcher) is against this one value.
pub const GUEST_VA_END: u64 = (1 << 47) - 4096;

/// The lowest upper-half address a guest may map and run at. Below it, from
/// `0xffff800000000000`, lies the x86 guard hole (slots 256 to 271 of a
/// 4-level top-level table), which is never the guest's: the host's
/// switcher lives there. From here to the top of the address space, the
/// top 2 GiB where kernels are linked included, every address is the
/// guest's.
pub const GUEST_UPPER_START: u64 = 0xffff_8800_0000_0000;

/// Whether a guest may map and run at `va`: below [`GUEST_VA_END`] or from
/// [`GUEST_UPPER_START`] on.
pub const fn guest_va_ok(va: u64) -> bool {
    va < GUEST_VA_END || va >= GUEST_UPPER_START
}

/// Whether `sp` may be a guest stack pointer: a [`guest_va_ok`] address, or
/// the end of the last lower-half page a guest may use (an empty stack).
pub const fn guest_sp_ok(sp: u64) -> bool {
    sp <= GUEST_VA_END || sp >= GUEST_UPPER_START
}

/// Whether `va` is canonical for the guest: a 4-level machine (48-bit
/// virtual addresses, bits 63 to 47 all equal) on every host, 5-level
/// ones included. A return to user mode at a RIP that is not gets the #GP
/// a 4-level CPU's `iretq` raises (Documentation/guest-abi.rst, "Returns
/// to user mode").
pub const fn guest_canonical(va: u64) -> bool {
    let top = (va as i64) >> 47;
    top == 0 || top == -1
}

/// The lowest address a guest image may be loaded at: the first 1 MiB is left
/// unmapped, so that a null pointer in the guest faults.
pub const LGUEST_LOAD_MIN: u64 = 0x10_0000;

/// Hypercall: run the queued hypercalls in the async ring.
pub const LHCALL_FLUSH_ASYNC: u64 = 0;
/// Hypercall: register `struct lguest_data` (argument 1: its guest
/// address; argument 2: `LGUEST_INIT_*` flags, 0 for none).
pub const LHCALL_LGUEST_INIT: u64 = 1;
/// [`LHCALL_LGUEST_INIT`] flag: the frames the host builds carry the
/// selectors a Linux kernel expects, [`LGUEST_KERNEL_CS`] and
/// [`LGUEST_KERNEL_SS`] for events in guest kernel mode, [`LGUEST_GUEST_CS`]
/// and [`LGUEST_GUEST_SS`] for events in guest user mode (so `cs & 3` tells
/// them apart, as `user_mode(regs)` does), and every frame is left with
/// [`LHCALL_IRET`], never with `iretq`. Without it, kernel-mode frames
/// carry [`LGUEST_GUEST_CS`] and user-mode ones [`LGUEST_USER_CS`].
pub const LGUEST_INIT_LINUX_FRAMES: u64 = 1;
/// [`LHCALL_LGUEST_INIT`] flag: the shadow page tables follow TLB
/// semantics instead of the report-every-change contract. A guest may
/// change its tables without telling the host, and sees the change once
/// it has flushed as hardware wants: [`LHCALL_INVLPG`] for one page,
/// [`LHCALL_FLUSH_TLB`] (argument 1: 0 everything of the current PCID but
/// global pages, as a CR3 reload; 1 everything, every PCID's and global
/// pages included), and [`LHCALL_NEW_PGTABLE`], which drops every
/// non-global mapping unless a PCID keeps them (see
/// [`LGUEST_PGTABLE_PCID_MASK`]). Upper-half pages whose guest entry has
/// the global bit (bit 8) are kept across root switches in a kernel-half
/// shadow that every root shares, until a global flush or an
/// [`LHCALL_INVLPG`] of that page.
pub const LGUEST_INIT_TLB_SHADOWS: u64 = 2;
/// The CS of a frame from guest kernel mode under
/// [`LGUEST_INIT_LINUX_FRAMES`] (Linux's `__KERNEL_CS`). A marker in the
/// frame only: the guest kernel really runs with [`LGUEST_GUEST_CS`].
pub const LGUEST_KERNEL_CS: u64 = 0x10;
/// The SS of such a frame (Linux's `__KERNEL_DS`).
pub const LGUEST_KERNEL_SS: u64 = 0x18;
/// Hypercall: power off, restart or crash. Argument 1: guest-physical
/// address of a NUL-terminated message (at most 255 bytes are read);
/// argument 2: `LGUEST_SHUTDOWN_*`.
pub const LHCALL_SHUTDOWN: u64 = 2;
/// Hypercall: switch to a new top-level page table (argument 1: its
/// guest-physical address; argument 2, under [`LGUEST_INIT_TLB_SHADOWS`]
/// only: a PCID in [`LGUEST_PGTABLE_PCID_MASK`] and
/// [`LGUEST_PGTABLE_NOFLUSH`], as a CR3 value carries them). The one
/// hypercall allowed before [`LHCALL_LGUEST_INIT`].
pub const LHCALL_NEW_PGTABLE: u64 = 4;
/// [`LHCALL_NEW_PGTABLE`] argument 2: the PCID (1-4095; 0 is untagged and
/// always flushed). A tagged PCID's shadow is kept when another becomes
/// current, as its TLB entries would be.
pub const LGUEST_PGTABLE_PCID_MASK: u64 = 0xfff;
/// [`LHCALL_NEW_PGTABLE`] argument 2: keep what the PCID has (CR3 bit 63):
/// its shadow comes back if it was kept for the same root.
pub const LGUEST_PGTABLE_NOFLUSH: u64 = 1 << 63;
/// Hypercall: flush the TLB (argument: all roots or only the current one).
pub const LHCALL_FLUSH_TLB: u64 = 5;
/// Hypercall: set one entry of the guest's interrupt descriptor table.
/// Argument 1: the vector (0-255; not 2, 8, 18 or 0x1F); argument 2: the
/// handler's guest-virtual address (0 removes the entry); argument 3: the
/// gate type, 0xE (interrupt gate: delivery turns virtual interrupts off)
/// or 0xF (trap gate).
pub const LHCALL_LOAD_IDT_ENTRY: u64 = 6;
/// Hypercall: set the guest kernel's stack (argument: its top, a
/// guest-virtual address): where the host puts the frame of an interrupt,
/// exception or system call that arrives while the guest is in user mode
/// (what `TSS.RSP0` is on hardware).
pub const LHCALL_SET_STACK: u64 = 7;
/// Hypercall: set or clear the virtual CR0.TS bit.
pub const LHCALL_TS: u64 = 8;
/// Hypercall: arm the guest's clock event (argument: nanoseconds from now).
pub const LHCALL_SET_CLOCKEVENT: u64 = 9;
/// Hypercall: halt until an interrupt is pending.
pub const LHCALL_HALT: u64 = 10;
/// Hypercall: a page middle directory entry changed.
pub const LHCALL_SET_PMD: u64 = 13;
/// Hypercall: a page table entry changed.
pub const LHCALL_SET_PTE: u64 = 14;
/// Hypercall: a top-level page table entry changed.
pub const LHCALL_SET_PGD: u64 = 15;
/// Hypercall: load the thread-local storage descriptors.
pub const LHCALL_LOAD_TLS: u64 = 16;
/// Hypercall: a device notification (virtqueue kick).
pub const LHCALL_NOTIFY: u64 = 17;
/// Hypercall: set one entry of the guest's global descriptor table.
pub const LHCALL_LOAD_GDT_ENTRY: u64 = 18;
/// Hypercall: do nothing but exit, so pending interrupts are delivered now.
pub const LHCALL_SEND_INTERRUPTS: u64 = 19;
/// Hypercall: return from the guest kernel to guest user mode (the guest's
/// `iretq`/`sysretq` to user space). Takes no register arguments: the
/// guest kernel restores every user register except RAX, pushes
/// [`LguestIretUser`] on its stack and makes the call with RSP pointing at
/// it. The host loads RAX, RIP, RFLAGS and RSP from the frame, switches to
/// the guest's user address space (only guest pages with the U/S bit set at
/// every level are reachable there) and turns virtual interrupts on (user
/// mode always runs with them on). Needs the guest's own page tables
/// (`LHCALL_NEW_PGTABLE`) and a kernel stack (`LHCALL_SET_STACK`).
pub const LHCALL_IRET_USER: u64 = 20;
/// Hypercall: the guest kernel's entry for the `syscall` instruction of
/// guest user mode (arg 1; 0 removes it), like writing `MSR_LSTAR`, and
/// how it is entered (arg 2: 0 or [`LGUEST_SYSCALL_DIRECT`]). A user-mode
/// `syscall` (`0f 05`) then enters the guest kernel as hardware would: RIP
/// = the entry, RCX = the address after the instruction, R11 = the user
/// RFLAGS, every other register as user mode left it; virtual interrupts
/// off (as `MSR_SYSCALL_MASK` has IF) and TF clear.
///
/// With arg 2 = 0 (through the host): the host also switches to the
/// kernel stack (`LHCALL_SET_STACK`) and pushes the user frame there, as
/// for an interrupt from user mode (RIP after the instruction, CS
/// [`LGUEST_USER_CS`], RFLAGS, RSP, SS), so the entry needs no `swapgs`
/// nor a stack of its own, and returns with [`LHCALL_IRET_USER`] like any
/// other event. Without an entry, and from guest kernel mode always,
/// `syscall` is #UD (the host leaves EFER.SCE clear while a guest runs).
///
/// With [`LGUEST_SYSCALL_DIRECT`], see there. The entry must be below
/// [`GUEST_VA_END`], and arg 2 a known flag, or the guest is killed.
pub const LHCALL_SET_SYSCALL: u64 = 21;
/// Hypercall: set a segment base (arg 1 says which: [`LGUEST_BASE_FS`],
/// [`LGUEST_BASE_GS`], [`LGUEST_BASE_USER_GS`]; arg 2 the base, which
/// must be a canonical address or the guest is killed). For hosts where
/// the guest cannot use `wrfsbase`/`wrgsbase` (no FSGSBASE), and for guest
/// user mode's GS base, which only the host holds while the guest kernel
/// runs: the host keeps one GS base per mode and swaps them at every
/// switch between guest kernel and guest user mode (no `swapgs`, which
/// ring 3 cannot run). The FS base is the same in both modes, as on
/// hardware.
pub const LHCALL_SET_SEGMENT_BASE: u64 = 22;
/// Hypercall: the guest's `iretq`, to guest kernel or guest user mode.
/// Takes no register arguments: the guest restores every register except
/// RAX, pushes that below a standard interrupt frame (so RSP points at
/// [`LguestIret`]: RAX, RIP, CS, RFLAGS, RSP, SS) and makes the call. CS
/// and SS say where to return, as the host's frames say where an event
/// came from: [`LGUEST_KERNEL_CS`]/[`LGUEST_KERNEL_SS`] (with
/// [`LGUEST_INIT_LINUX_FRAMES`]; [`LGUEST_GUEST_CS`]/[`LGUEST_GUEST_SS`]
/// without) return to kernel mode, with virtual interrupts as the frame's
/// RFLAGS.IF says, atomically (a pending interrupt is delivered before the
/// next instruction if IF is set); [`LGUEST_GUEST_CS`]/[`LGUEST_GUEST_SS`]
/// (with the flag; [`LGUEST_USER_CS`]/[`LGUEST_GUEST_SS`] without) return
/// to user mode as [`LHCALL_IRET_USER`] does, with its requirements. As
/// the CPU's `iretq`, CS's RPL decides: RPL 3 is a return to user mode,
/// where any RSP is taken and a CS other than [`LGUEST_GUEST_CS`], then
/// an SS other than [`LGUEST_GUEST_SS`], then a RIP that is not
/// [`guest_canonical`], is the #GP (error: the selector without its RPL,
/// or 0 for the RIP) that a native `iretq` raises, delivered to the guest
/// kernel as taken in user mode at the frame's state, the frame's own CS
/// and SS in it (as Linux's `fixup_bad_iret` makes it). A return to the
/// kernel with another pair, or a RIP or RSP the guest may not run at,
/// kills the guest. Only with [`LGUEST_INIT_LINUX_FRAMES`] (without, the
/// guest is killed: the kernel pair would have RPL 3, which a user
/// `sigreturn` can forge). Not allowed in the async ring.
pub const LHCALL_IRET: u64 = 23;
/// Hypercall: invalidate the shadow of the page at guest-virtual argument
/// 1, in the current root and, for an upper-half page, in the shared
/// kernel half (as `invlpg` drops a global entry too). Without
/// [`LGUEST_INIT_TLB_SHADOWS`] it is [`LHCALL_SET_PTE`] of that page:
/// dropped in every root.
pub const LHCALL_INVLPG: u64 = 24;
/// Hypercall: read a segment base (argument 1: `LGUEST_BASE_*`), the
/// result in RAX (the one hypercall that returns a value; not allowed in
/// the async ring). What a kernel reads with `rdmsr`, `rdfsbase` or
/// `swapgs; rdgsbase` natively: the bases as they are now, guest user
/// mode's GS base as user mode last left it (it may have written it with
/// `wrgsbase`, which the host sees only at its next switch), where
/// [`LHCALL_SET_SEGMENT_BASE`] only writes them.
pub const LHCALL_GET_SEGMENT_BASE: u64 = 25;
/// Hypercall: an indirect branch prediction barrier (Documentation/switcher.rst,
/// "Speculation"). Argument 1: flags, [`LGUEST_IBPB_NOW`] for one barrier
/// before the guest goes on (a kernel's process switch), and
/// [`LGUEST_IBPB_USER_ENTRY`] for one at every switch from guest user mode
/// to guest kernel mode from now on, the direct system call's included
/// (without it, that stops). The result in RAX: [`LGUEST_IBPB_DONE`], or
/// [`LGUEST_IBPB_UNAVAILABLE`] where the host's CPU has no IBPB (nothing
/// is done or armed). Not allowed in the async ring; other flags kill.
pub const LHCALL_IBPB: u64 = 26;
/// [`LHCALL_IBPB`] flag: a barrier now.
pub const LGUEST_IBPB_NOW: u64 = 1;
/// [`LHCALL_IBPB`] flag: a barrier at every entry to guest kernel mode
/// from guest user mode.
pub const LGUEST_IBPB_USER_ENTRY: u64 = 2;
/// [`LHCALL_IBPB`] result: done (and armed, with [`LGUEST_IBPB_USER_ENTRY`]).
pub const LGUEST_IBPB_DONE: u64 = 0;
/// [`LHCALL_IBPB`] result: the host's CPU has no IBPB.
pub const LGUEST_IBPB_UNAVAILABLE: u64 = 1;
/// Hypercall: the guest's hardware breakpoints (Documentation/guest-abi.rst,
/// "Debug registers"). Argument 1: DR7 as the guest kernel wrote it; the
/// host reads DR0-DR3 once from `lguest_data.debugreg` and arms, in the
/// CPU, from the next entry on and in both guest modes, the breakpoints
/// [`debugreg_dr7`] accepts. The result in RAX: that DR7 (0: none armed).
/// Bits 32-63 of DR7 set kill, as their `mov` to DR7 would #GP natively.
/// Not allowed in the async ring (the addresses are read at the call).
pub const LHCALL_SET_DEBUGREGS: u64 = 27;

/// DR7's bits the host keeps of a guest's: L0-L3 and G0-G3 (bits 0-7),
/// LE and GE (8, 9) and each breakpoint's RW and LEN (16-31). GD (13) and
/// RTM (11), which would change how the host's own code runs, are dropped.
const DR7_GUEST_BITS: u64 = 0xffff_03ff;
/// DR7's bit 10, which always reads as 1.
const DR7_FIXED: u64 = 0x400;

/// The DR7 the host arms for a guest that asks for `dr7` with DR0-DR3 =
/// `addrs` ([`LHCALL_SET_DEBUGREGS`]): each breakpoint `dr7` enables (L or
/// G) whose kind and range the host accepts, with its RW and LEN fields,
/// and LE and GE as asked, bit 10 set; 0 when none is accepted. Accepted:
/// data breakpoints (RW 1, writes; RW 3, reads and writes) of 1, 2, 4 or 8
/// bytes, and execution breakpoints (RW 0, LEN 0), whose whole range as
/// the CPU aligns it (down to its length) is below [`GUEST_VA_END`]: user
/// addresses, as native Linux allows a process's breakpoints. Refused: I/O
/// breakpoints (RW 2, undefined without CR4.DE), execution breakpoints
/// with a length, and any address at or above `GUEST_VA_END`, the guest's
/// kernel and the host's switcher among them, since a breakpoint there
/// would fire in the host's own code (a refused breakpoint never fires).
pub const fn debugreg_dr7(dr7: u64, addrs: &[u64; 4]) -> u64 {
    let mut armed = 0;
    let mut i = 0;
    while i < 4 {
        let enable = (dr7 >> (2 * i)) & 3;
        let rw = (dr7 >> (16 + 4 * i)) & 3;
        let len = (dr7 >> (18 + 4 * i)) & 3;
        let size = match len {
            0 => 1,
            1 => 2,
            2 => 8,
            _ => 4,
        };
        let start = addrs[i] & !(size - 1);
        let kind_ok = rw == 1 || rw == 3 || (rw == 0 && len == 0);
        if enable != 0 && kind_ok && start < GUEST_VA_END && GUEST_VA_END - start >= size {
            armed |= (enable << (2 * i)) | (0xf << (16 + 4 * i));
        }
        i += 1;
    }
    if armed == 0 {
        return 0;
    }
    (dr7 & DR7_GUEST_BITS & (armed | 0x300)) | DR7_FIXED
}
/// [`LHCALL_SET_SYSCALL`] arg 2: the direct system call, the native
/// contract, switched by the switcher without the host's run loop where it
/// can (Documentation/switcher.rst, "The direct system call").
///
/// A user-mode `syscall` enters the entry with RSP still the user's and
/// nothing pushed (the entry switches stacks itself, as a native kernel's
/// does after `swapgs`), the kernel's GS base already in place (the host
/// swaps the two modes' GS bases), RFLAGS with no flag but IF set, and
/// `lguest_data.irq_enabled` as the kernel left it when it returned to
/// user mode: a kernel must return to user mode with virtual interrupts
/// off (the host treats user mode as interrupts-on whatever
/// `irq_enabled` says, and [`LHCALL_IRET`], [`LHCALL_IRET_USER`] and a
/// delivery to user mode leave it 0), so that its entry finds them off.
/// The wall clock in `lguest_data` is not updated on the way.
///
/// The kernel returns with `int $`[`LGUEST_SYSRET_VECTOR`], and in guest
/// kernel mode `syscall` is a hypercall: RAX the number, RDI, RSI, RDX,
/// R10 the arguments, as with `int $0x1f`, except that RCX and R11 come
/// back clobbered, as the instruction leaves them. The fast paths need a
/// host with FSGSBASE (the GS bases move by `rdgsbase`/`wrgsbase`);
/// elsewhere the host does the same through an exit, with the same
/// result.
pub const LGUEST_SYSCALL_DIRECT: u64 = 1;

/// The vector of the return to user mode of a kernel that uses
/// [`LGUEST_SYSCALL_DIRECT`]: `int $0x1b` in guest kernel mode, with
/// `sysretq`'s register contract. RCX holds the user RIP, R11 the user
/// RFLAGS (clamped as for `LGUEST_SET_REGS`; IF implied), RSP the user
/// RSP, every other register the user's; they all arrive in user mode
/// unchanged (RCX and R11 too, as `sysretq` leaves them). The switch is
/// the switcher's, without an exit: the user shadow table and the user GS
/// base, `irq_enabled` untouched. Needs what [`LHCALL_IRET_USER`] needs; a
/// RIP the guest may not run at kills it. From guest user mode the vector
/// is the #GP (error `0x1b << 3 | 2`) of a gate it may not use, as is any
/// use from a kernel that did not register a direct entry.
pub const LGUEST_SYSRET_VECTOR: u8 = 0x1B;

/// [`LHCALL_SET_SEGMENT_BASE`]: the FS base (both modes).
pub const LGUEST_BASE_FS: u64 = 0;
/// [`LHCALL_SET_SEGMENT_BASE`]: the GS base of guest kernel mode (the one
/// in effect when the call is made).
pub const LGUEST_BASE_GS: u64 = 1;
/// [`LHCALL_SET_SEGMENT_BASE`]: the GS base guest user mode gets at the
/// next `LHCALL_IRET_USER` (what `MSR_KERNEL_GS_BASE` holds for a native
/// kernel).
pub const LGUEST_BASE_USER_GS: u64 = 2;

/// The frame of [`LHCALL_IRET_USER`], at the guest kernel's RSP.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LguestIretUser {
    /// User RAX.
    pub rax: u64,
    /// User RIP: one that is not [`guest_canonical`] is a #GP(0) in user
    /// mode at it, delivered to the guest kernel, as a native `iretq` to it
    /// faults (the last lower-half page and the guard hole, never mapped
    /// for a guest, fault when fetched).
    pub rip: u64,
    /// User RFLAGS (clamped as for `LGUEST_SET_REGS`; IF is implied).
    pub rflags: u64,
    /// User RSP: any value, as an `iretq` to ring 3 loads any.
    pub rsp: u64,
}

/// The frame of [`LHCALL_IRET`], at the guest's RSP: RAX, then a standard
/// `iretq` frame.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LguestIret {
    /// RAX to return with (the call itself needs RAX).
    pub rax: u64,
    /// Where to return (for kernel mode a [`guest_va_ok`] address; for user
    /// mode see [`LHCALL_IRET`]).
    pub rip: u64,
    /// Kernel or user, by the selectors of [`LHCALL_IRET`].
    pub cs: u64,
    /// RFLAGS (clamped as for `LGUEST_SET_REGS`; IF is the virtual IF).
    pub rflags: u64,
    /// RSP (for kernel mode a [`guest_sp_ok`] value; any for user mode).
    pub rsp: u64,
    /// The SS matching `cs`.
    pub ss: u64,
}

/// The CS value in an interrupt or exception frame that the host pushes
/// on the guest kernel's stack when the guest was in **user** mode (frames
/// from kernel mode carry [`LGUEST_GUEST_CS`]). It is a marker, not a
/// usable selector: such a frame is returned through with
/// [`LHCALL_IRET_USER`], never with `iretq`.
pub const LGUEST_USER_CS: u64 = 0x3b;
/// The system-call vector of guest user mode: `int $0x80` (encoded `cd 80`)
/// enters the guest kernel through its IDT entry 0x80, with the return
/// address after the instruction, like any other interrupt from user mode.
/// Without such an entry the guest gets the #GP (error 0x402) of a gate it
/// may not use.
pub const LGUEST_SYSCALL_VECTOR: u8 = 0x80;

/// Number of entries in the async hypercall ring.
pub const LHCALL_RING_SIZE: usize = 64;
/// Number of guest interrupt lines.
pub const LGUEST_IRQS: usize = 64;
/// `hcall_status` value: the entry is free (the host ran it).
pub const LHCALL_STATUS_DONE: u8 = 0xFF;
/// Virtual IF: the value of `irq_enabled` when interrupts are on.
pub const X86_EFLAGS_IF: u64 = 0x200;

/// The arguments of one queued hypercall.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HcallArgs {
    /// The hypercall number (`LHCALL_*`).
    pub arg0: u64,
    /// First argument.
    pub arg1: u64,
    /// Second argument.
    pub arg2: u64,
    /// Third argument.
    pub arg3: u64,
    /// Fourth argument.
    pub arg4: u64,
}

/// Guest wall-clock time.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LguestTime {
    /// Seconds.
    pub sec: u64,
    /// Nanoseconds.
    pub nsec: u64,
}

/// `struct lguest_data`: the page the guest shares with the host; the guest
/// gives its guest-physical address with `LHCALL_LGUEST_INIT`.
///
/// The host never trusts it: each field is read once, then checked.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct LguestData {
    /// Virtual IF: [`X86_EFLAGS_IF`] when the guest takes interrupts, else 0.
    pub irq_enabled: u64,
    /// Interrupts the guest does not want (one bit per line).
    pub blocked_interrupts: [u64; LGUEST_IRQS / 64],
    /// The faulting address of the last page fault reflected to the guest.
    pub cr2: u64,
    /// Wall-clock time, written by the host at INIT and on each delivery.
    pub time: LguestTime,
    /// Set by the host when an interrupt waits for the guest to enable
    /// interrupts; the guest then makes `LHCALL_SEND_INTERRUPTS`.
    pub irq_pending: u64,
    /// Async ring status: [`LHCALL_STATUS_DONE`] or 0 (queued by the guest).
    pub hcall_status: [u8; LHCALL_RING_SIZE],
    /// Async ring entries.
    pub hcalls: [HcallArgs; LHCALL_RING_SIZE],
    /// Written by the host: the guest must not use virtual addresses at or
    /// above this (where the switcher lives in its address space).
    pub reserve_mem: u64,
    /// Written by the host: the TSC frequency when it is stable, else 0.
    pub tsc_khz: u32,
    /// Padding.
    pub pad0: u32,
    /// Written by the guest: the address of the `iretq` in its iret window.
    pub noirq_iret: u64,
    /// Written by the guest: where its kernel mappings start.
    pub kernel_address: u64,
    /// Written by the guest: its system-call vector.
    pub syscall_vec: u32,
    /// Padding.
    pub pad1: u32,
    /// Written by the guest: the kernel stack for the next entry from user
    /// mode (a native kernel's TSS `sp0`), so a context switch needs no
    /// hypercall. Read at each such entry; 0 means the `LHCALL_SET_STACK`
    /// value. Above [`GUEST_VA_END`] the guest is killed.
    pub kernel_sp0: u64,
    /// Written by the host: DR6 of the last debug exception (#DB: a
    /// single-step, `int1`) delivered to the guest, as the CPU reported it
    /// (negative polarity, the reserved bits set, as the register reads):
    /// what a native kernel's #DB handler reads from DR6.
    pub dr6: u64,
    /// Written by the guest: DR0-DR3, which [`LHCALL_SET_DEBUGREGS`] reads.
    pub debugreg: [u64; 4],
}

/// Compile-time layout checks: the structs are an ABI.
const _: () = {
    use core::mem::{offset_of, size_of};
    assert!(size_of::<LguestVmConfig>() == 72);
    assert!(size_of::<LguestIrqfd>() == 16);
    assert!(size_of::<LguestIoeventfd>() == 16);
    assert!(size_of::<LguestCpuid>() == 8);
    assert!(size_of::<LguestCpuidEntry>() == 40);
    assert!(size_of::<LguestIretUser>() == 32);
    assert!(size_of::<LguestIret>() == 48);
    assert!(size_of::<LguestRegs>() == 18 * 8);
    assert!(size_of::<LguestVcpuRegs>() == 8 + 18 * 8);
    assert!(offset_of!(LguestRun, exit_reason) == 4);
    assert!(offset_of!(LguestRun, notify_addr) == 8);
    assert!(offset_of!(LguestRun, message) == 128);
    assert!(size_of::<LguestRun>() == 128 + LGUEST_MESSAGE_LEN);
    assert!(size_of::<LguestRun>() <= 4096);
    assert!(offset_of!(LguestData, cr2) == 16);
    assert!(offset_of!(LguestData, time) == 24);
    assert!(offset_of!(LguestData, irq_pending) == 40);
    assert!(offset_of!(LguestData, hcall_status) == 48);
    assert!(offset_of!(LguestData, hcalls) == 112);
    assert!(offset_of!(LguestData, reserve_mem) == 112 + 40 * LHCALL_RING_SIZE);
    assert!(offset_of!(LguestData, kernel_sp0) == 2712);
    assert!(offset_of!(LguestData, dr6) == 2720);
    assert!(offset_of!(LguestData, debugreg) == 2728);
    assert!(size_of::<LguestData>() == 2760);
    assert!(size_of::<LguestData>() <= 4096);
};
