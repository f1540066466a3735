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
//!   trap vectors and (later) the layout of `struct lguest_data`. lguest's
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
    // CAST: every ABI struct is far smaller than the 14-bit size field;
    // `abi_sizes_fit_ioctl` in the tests checks it.
    (dir << IOC_DIRSHIFT) | (ty << IOC_TYPESHIFT) | (nr << IOC_NRSHIFT) | ((size as u32) << IOC_SIZESHIFT)
}

/// `LGUEST_GET_API_VERSION`: returns [`LGUEST_API_VERSION`]. No argument.
pub const LGUEST_GET_API_VERSION: u32 = ioc(IOC_NONE, LGUEST_IOC_MAGIC, 0x40, 0);

// ---------------------------------------------------------------------------
// The guest ABI.
// ---------------------------------------------------------------------------

/// The software interrupt vector a guest uses for hypercalls (`int $0x1f`).
pub const LGUEST_TRAP_ENTRY: u8 = 0x1F;

/// Hypercall: run the queued hypercalls in the async ring.
pub const LHCALL_FLUSH_ASYNC: u64 = 0;
/// Hypercall: register `struct lguest_data` (argument: its guest address).
pub const LHCALL_LGUEST_INIT: u64 = 1;
/// Hypercall: power off, restart or crash (argument: reason, message).
pub const LHCALL_SHUTDOWN: u64 = 2;
/// Hypercall: switch to a new top-level page table.
pub const LHCALL_NEW_PGTABLE: u64 = 4;
/// Hypercall: flush the TLB (argument: all roots or only the current one).
pub const LHCALL_FLUSH_TLB: u64 = 5;
/// Hypercall: set one entry of the guest's interrupt descriptor table.
pub const LHCALL_LOAD_IDT_ENTRY: u64 = 6;
/// Hypercall: set the stack used when the guest kernel is entered.
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
