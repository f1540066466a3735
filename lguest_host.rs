// SPDX-License-Identifier: GPL-2.0
//! lguest: a hypervisor that needs no VMX/SVM and no host patches.
//!
//! This is the crate root of `lguest.ko`. It only lists the module's parts and
//! defines the module type, which owns the `/dev/lguest` registration:
//!
//! - [`host`]: what the module requires of the host CPU, checked at load;
//! - [`dev`]: the `/dev/lguest` misc device and its ioctls;
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
mod host;

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
}

/// The module: its only state is the misc device registration.
#[pin_data]
struct LguestModule {
    #[pin]
    _miscdev: MiscDeviceRegistration<dev::LguestFile>,
}

impl kernel::InPlaceModule for LguestModule {
    fn init(_module: &'static ThisModule) -> impl PinInit<Self, Error> {
        let checked = host::check_host();
        try_pin_init!(Self {
            _miscdev <- {
                checked?;
                MiscDeviceRegistration::register(MiscDeviceOptions { name: c"lguest" })
            },
        })
    }
}
