// SPDX-License-Identifier: GPL-2.0
//! A Linux TAP device for virtio-net: `/dev/net/tun` with `IFF_TAP |
//! IFF_NO_PI | IFF_VNET_HDR`, so every frame read or written carries a
//! virtio-net header, the guest's own. Opened non-blocking: the receive side
//! reads until `EAGAIN`. The only `unsafe` here is the three ioctls.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;

/// What the net device needs to change on its host side once the driver
/// chose its features.
pub trait TapControl: Send {
    /// `TUNSETVNETHDRSZ`.
    fn set_vnet_hdr_size(&self, size: usize) -> io::Result<()>;
    /// `TUNSETOFFLOAD` (`TUN_F_*`).
    fn set_offload(&self, flags: u32) -> io::Result<()>;
}

/// `struct ifreq` as TUNSETIFF uses it.
#[repr(C)]
struct IfReq {
    name: [u8; libc::IFNAMSIZ],
    flags: libc::c_short,
    pad: [u8; 22],
}

/// An open TAP device.
#[derive(Debug)]
pub struct Tap {
    file: File,
}

impl Tap {
    /// Attaches to (or creates) TAP device `name`.
    pub fn open(name: &str) -> io::Result<Self> {
        if name.is_empty() || name.len() >= libc::IFNAMSIZ || name.contains('\0') {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("bad interface name {name:?}")));
        }
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open("/dev/net/tun")?;
        let mut req = IfReq { name: [0; libc::IFNAMSIZ], flags: 0, pad: [0; 22] };
        req.name[..name.len()].copy_from_slice(name.as_bytes());
        // CAST: the flags fit a c_short (0x5002).
        req.flags = (libc::IFF_TAP | libc::IFF_NO_PI | libc::IFF_VNET_HDR) as libc::c_short;
        // SAFETY: TUNSETIFF reads and writes one struct ifreq at the pointer,
        // which is a live, exclusively borrowed IfReq of ifreq's size (16
        // bytes of name, then the flags union padded to 24 bytes).
        let ret = unsafe { libc::ioctl(file.as_raw_fd(), libc::TUNSETIFF, &mut req as *mut IfReq) };
        if ret < 0 {
            return Err(io::Error::last_os_error());
        }
        let tap = Self { file };
        tap.set_vnet_hdr_size(12)?;
        Ok(tap)
    }

    /// A second handle on the same open file, for reading and writing.
    pub fn try_clone_file(&self) -> io::Result<File> {
        self.file.try_clone()
    }
}

impl TapControl for Tap {
    fn set_vnet_hdr_size(&self, size: usize) -> io::Result<()> {
        let size = libc::c_int::try_from(size).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        // SAFETY: TUNSETVNETHDRSZ reads one int at the pointer, a live local.
        let ret = unsafe { libc::ioctl(self.file.as_raw_fd(), libc::TUNSETVNETHDRSZ, &size as *const libc::c_int) };
        if ret < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    fn set_offload(&self, flags: u32) -> io::Result<()> {
        // SAFETY: TUNSETOFFLOAD takes its flags as the plain integer argument
        // and touches no memory of ours.
        let ret = unsafe { libc::ioctl(self.file.as_raw_fd(), libc::TUNSETOFFLOAD, libc::c_ulong::from(flags)) };
        if ret < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}
