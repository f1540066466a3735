// SPDX-License-Identifier: GPL-2.0
//! `/dev/lguest`: one open file is one launcher's handle on the hypervisor.
//!
//! The file's private data is a [`LguestFile`]. Its ioctls follow the ABI in
//! `abi/src/uapi.rs`; unknown commands get `ENOTTY`. While a file is open the
//! module cannot be unloaded: the misc device's `fops.owner` is this module,
//! so every open file holds a module reference.

use kernel::{
    fs::File,
    miscdevice::{
        MiscDevice,
        MiscDeviceRegistration, //
    },
    prelude::*, //
};

use crate::uapi;

/// The state behind one open `/dev/lguest` file.
pub(crate) struct LguestFile;

#[vtable]
impl MiscDevice for LguestFile {
    type Ptr = KBox<Self>;

    fn open(_file: &File, _misc: &MiscDeviceRegistration<Self>) -> Result<KBox<Self>> {
        KBox::new(LguestFile, GFP_KERNEL).map_err(Into::into)
    }

    fn ioctl(_this: &LguestFile, _file: &File, cmd: u32, _arg: usize) -> Result<isize> {
        match cmd {
            uapi::LGUEST_GET_API_VERSION => Ok(uapi::LGUEST_API_VERSION as isize),
            _ => Err(ENOTTY),
        }
    }
}
