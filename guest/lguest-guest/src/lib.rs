// SPDX-License-Identifier: GPL-2.0
//! `lguest-guest`: everything a freestanding lguest guest needs to boot,
//! talk to the host and stop; a sample guest only supplies `main`.
//!
//! The boot protocol (see `abi/src/uapi.rs` and `guest/README.md`): the
//! launcher loads the ELF image at its physical addresses and starts it at
//! `_start` in ring 3, with virtual = physical for all of RAM, RDI = the
//! guest-physical address of the NUL-terminated command line and RSI = the
//! size of RAM. The FPU, SSE and AVX are usable (the host loads the guest's
//! state at its first FPU instruction), but this library, built soft-float,
//! never uses them itself; virtual interrupts
//! are off and every interrupt line is blocked until the guest installs
//! handlers ([`interrupts`]) and enables them ([`paravirt`]).
//!
//! Boot order: [`start`] sets up a stack and calls `lguest_start`, which
//! registers [`data`]'s `struct lguest_data` with the host (with
//! `noirq_iret` already filled in), reads the [`cmdline`], then calls the
//! guest's `main` (named with [`entry!`]); when `main` returns the guest
//! powers off ([`shutdown`]). A panic crashes the guest with its message
//! ([`panic`](mod@panic)).
//!
//! Traps and interrupts: [`interrupts`] has the entry stubs, the handler
//! table and the paravirt `iret`; [`clock`] the timer (IRQ 0), a
//! nanosecond clock and `sleep_ns`.
//!
//! ```ignore
//! #![no_std]
//! #![no_main]
//! use lguest_guest::{entry, println, Args};
//!
//! entry!(main);
//!
//! fn main(args: Args) {
//!     println!("Hello from the lguest guest: {}", args.as_str());
//! }
//! ```
#![no_std]

#[cfg(feature = "alloc")]
extern crate alloc;

#[cfg(feature = "virtio")]
pub mod bus;
pub mod cell;
pub mod clock;
pub mod cmdline;
pub mod console;
pub mod cstr;
pub mod data;
pub mod entry;
pub mod frames;
pub mod hcall;
#[cfg(feature = "alloc")]
pub mod heap;
pub mod interrupts;
#[cfg(feature = "net")]
pub mod net;
pub mod paging;
pub mod panic;
pub mod paravirt;
pub mod shutdown;
pub mod start;
pub mod user;
#[cfg(feature = "virtio")]
pub mod virtio;

pub use cmdline::Args;
pub use hcall::hcall;
pub use interrupts::TrapFrame;
pub use paravirt::{Lguest, Paravirt};
pub use shutdown::{crash, crash_fmt, poweroff, poweroff_fmt, restart};

/// The ABI crate, re-exported so a guest needs only one dependency.
pub use lguest_abi as abi;
/// virtio-net feature bits, for [`net::VirtioNet::open_with`].
#[cfg(feature = "net")]
pub use lguest_virtio::net_features;
/// smoltcp, as the `net` driver is built against it (feature `net`).
#[cfg(feature = "net")]
pub use smoltcp;
/// virtio-drivers, as the bus transport is built against it (feature
/// `virtio`).
#[cfg(feature = "virtio")]
pub use virtio_drivers;

/// The guest-physical address of a guest-virtual one: of a static, the
/// stack or anything else in the image, or of RAM, which every mode maps
/// with virtual = physical too.
///
/// An image linked where it is loaded (2 MiB, the default) runs at
/// virtual = physical. One linked in the top 2 GiB (a sample whose build
/// script sets `LGUEST_KERNEL_BASE`, see `lguest-guest.ld`) has every
/// static at [`kernel_base`] plus its physical address, as Linux has its
/// image at `__START_KERNEL_map` plus its physical address.
#[inline]
pub fn virt_to_phys<T>(p: *const T) -> u64 {
    let va = p as u64;
    let base = kernel_base();
    if base != 0 && va >= base {
        va - base
    } else {
        va
    }
}

/// Where the image is linked minus where it is loaded: 0, or
/// `0xffffffff80000000` for an image linked in the top 2 GiB.
#[inline]
pub fn kernel_base() -> u64 {
    extern "C" {
        /// An absolute symbol of lguest-guest.ld.
        static __kernel_base: u8;
    }
    core::ptr::addr_of!(__kernel_base) as u64
}
