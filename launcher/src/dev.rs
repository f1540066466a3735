// SPDX-License-Identifier: GPL-2.0
//! The launcher's handle on `/dev/lguest`: the only place it makes ioctls.
//!
//! Everything above this module is safe code; each ioctl wrapper here states
//! why its `unsafe` call is sound.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::path::Path;

use lguest_abi as abi;

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
    #[error("cannot open {path}: {source}")]
    Open {
        /// The path that was tried.
        path: String,
        /// The error from `open(2)`.
        source: io::Error,
    },
    /// An ioctl failed.
    #[error("{what}: {source}")]
    Ioctl {
        /// The ioctl's name.
        what: &'static str,
        /// The error it returned.
        source: io::Error,
    },
}

/// An open `/dev/lguest`.
#[derive(Debug)]
pub struct Lguest {
    file: File,
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
        if ret < 0 {
            return Err(DevError::Ioctl { what: "LGUEST_GET_API_VERSION", source: io::Error::last_os_error() });
        }
        // CAST: a non-negative c_int always fits in u32.
        Ok(ret as u32)
    }
}
