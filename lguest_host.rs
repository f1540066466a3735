// SPDX-License-Identifier: GPL-2.0
//! lguest: a hypervisor that needs no VMX/SVM and no host patches.
//!
//! This is the crate root of `lguest.ko`. It only lists the module's parts and
//! defines the module type, which owns the `/dev/lguest` registration:
//!
//! - [`host`]: what the module requires of the host CPU, checked at load;
//! - [`dev`]: the `/dev/lguest` misc device and its ioctls;
//! - [`vm`]: a guest and its run loop; [`vcpu`]: a vCPU, its run page,
//!   and the context the exit handlers get;
//! - [`hcall`]: hypercalls; [`emulate`]: privileged instructions;
//! - [`kill`]: the reasons a guest is killed for;
//! - [`interrupts`]: the guest's IDT, delivery, `irq_pending`, HALT;
//! - [`irq`]: interrupt sources: pending bits, the clock-event timer;
//! - [`lguest_data`]: typed access to the page the guest shares;
//! - [`gmem`]: pinned guest memory and host pages;
//! - [`shadow`]: the shadow page tables, their root cache and budget;
//! - [`paging`]: the guest's own page tables, shadowed on demand;
//! - [`notify`]: guest notifications bound to eventfds (`LGUEST_IOEVENTFD`);
//! - [`switcher`] (with `switcher_64.S`): the trip into the guest and back;
//! - [`helpers`] (with `lg_helpers.c`): the few raw kernel calls;
//! - [`uapi`]: the ABI shared with the launcher, the guest and the tests.
//!
//! The guided tour of the code is `Documentation/tour.rst`.

use kernel::{
    miscdevice::{
        MiscDeviceOptions,
        MiscDeviceRegistration, //
    },
    prelude::*, //
};

mod dev;
mod emulate;
mod gmem;
mod hcall;
mod helpers;
mod host;
mod interrupts;
mod irq;
mod kill;
mod lguest_data;
mod notify;
mod paging;
mod shadow;
mod switcher;
mod vcpu;
mod vm;

// The ABI is one file shared with userspace; the module uses part of it and
// does not re-export it, hence the two lint exceptions.
#[path = "abi/src/uapi.rs"]
#[allow(unreachable_pub, dead_code)]
mod uapi;

module! {
    type: LguestModule,
    name: "lguest",
    authors: ["The lguest-rs developers"],
    description: "lguest: a paravirtual hypervisor without VMX/SVM",
    license: "GPL",
    params: {
        simulate_refusal: u32 {
            default: 0,
            description: "For tests only: refuse to load as on a host that has (1) FRED, (2) encrypted memory, (4) TDX, (8) Xen PV",
        },
        entry_window_delay_us: u32 {
            default: 0,
            description: "For tests only: busy-wait this many microseconds (at most 10000) between the run loop's look for interrupts and the entry, so an interrupt lands in that window",
        },
        ibpb_test: u32 {
            default: 0,
            description: "For tests only: on a host without IBPB, grant a guest's LHCALL_IBPB and count the barriers it asks for (at its entries from user mode too) without making them",
        },
        syscall_msr_test: u32 {
            default: 0,
            description: "For tests only: before each entry with the direct system call, load LSTAR, STAR and SYSCALL_MASK with foreign values (SYSCALL_MASK 0, as a hostile KVM guest's), and kill the guest if its exit does not put back exactly those",
        },
    },
}

/// The module: the misc device registration, and the switcher (global, in
/// `switcher.rs`), set up first and freed last; a failed registration frees
/// it too, as pin-init drops the fields already made.
#[pin_data]
struct LguestModule {
    #[pin]
    _miscdev: MiscDeviceRegistration<dev::LguestFile>,
    _switcher: switcher::SwitcherGuard,
}

impl kernel::InPlaceModule for LguestModule {
    fn init(_module: &'static ThisModule) -> impl PinInit<Self, Error> {
        try_pin_init!(Self {
            _switcher: host::check_host(module_parameters::simulate_refusal.value())
                .and_then(|()| switcher::SwitcherGuard::new())?,
            _miscdev <- MiscDeviceRegistration::register(MiscDeviceOptions { name: c"lguest" }),
        })
    }
}
