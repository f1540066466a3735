// SPDX-License-Identifier: GPL-2.0
//! A Linux TAP device for virtio-net: `/dev/net/tun` with `IFF_TAP |
//! IFF_NO_PI | IFF_VNET_HDR`, so every frame read or written carries a
//! virtio-net header, the guest's own. Opened non-blocking: the receive side
//! reads until `EAGAIN`. Or a tap that someone else opened and passed as
//! a file descriptor (`--net fd=N`): it is checked to be such a tap
//! (`TUNGETIFF`) and made non-blocking. The only `unsafe` here is the
//! ioctls and taking the descriptor.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, RawFd};
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

    /// Takes over descriptor `fd`, a tap opened by someone else (with
    /// `IFF_TAP | IFF_NO_PI | IFF_VNET_HDR`); returns it and the
    /// interface's name.
    pub fn from_fd(fd: RawFd) -> io::Result<(Self, String)> {
        let bad = |why: String| io::Error::new(io::ErrorKind::InvalidInput, format!("descriptor {fd}: {why}"));
        // SAFETY: F_GETFD only inspects the descriptor number.
        if fd < 0 || unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
            return Err(bad("not open".into()));
        }
        // SAFETY: the descriptor is open (checked above) and nothing else in
        // the launcher owns it: the command line handed it over, and from
        // here the File closes it.
        let file = unsafe { File::from_raw_fd(fd) };
        let mut req = IfReq { name: [0; libc::IFNAMSIZ], flags: 0, pad: [0; 22] };
        // SAFETY: TUNGETIFF writes one struct ifreq at the pointer, a live,
        // exclusively borrowed IfReq of ifreq's size.
        if unsafe { libc::ioctl(file.as_raw_fd(), libc::TUNGETIFF, &mut req as *mut IfReq) } < 0 {
            return Err(bad(format!("not a tap device ({})", io::Error::last_os_error())));
        }
        let flags = libc::c_int::from(req.flags);
        let want = libc::IFF_TAP | libc::IFF_NO_PI | libc::IFF_VNET_HDR;
        if flags & want != want || flags & libc::IFF_TUN != 0 {
            return Err(bad(format!(
                "a tun/tap device with flags {flags:#x}; IFF_TAP | IFF_NO_PI | IFF_VNET_HDR needed"
            )));
        }
        let len = req.name.iter().position(|&b| b == 0).unwrap_or(req.name.len());
        let name = String::from_utf8_lossy(&req.name[..len]).into_owned();
        // SAFETY: F_GETFL/F_SETFL/F_SETFD on a live descriptor, with integer
        // arguments only.
        unsafe {
            let fl = libc::fcntl(file.as_raw_fd(), libc::F_GETFL);
            if fl < 0 || libc::fcntl(file.as_raw_fd(), libc::F_SETFL, fl | libc::O_NONBLOCK) < 0 {
                return Err(io::Error::last_os_error());
            }
            libc::fcntl(file.as_raw_fd(), libc::F_SETFD, libc::FD_CLOEXEC);
        }
        let tap = Self { file };
        tap.set_vnet_hdr_size(12)?;
        Ok((tap, name))
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
