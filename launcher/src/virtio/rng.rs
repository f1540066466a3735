// SPDX-License-Identifier: GPL-2.0
//! virtio-rng (device ID 4): one queue of device-writable buffers, filled
//! from the host's `getrandom(2)`.

use std::sync::atomic::Ordering;

use super::{DeviceError, Events, Queues, VirtioDevice, VIRTIO_ID_RNG};

/// The most bytes given for one request: a driver asking for a gigabyte
/// gets this much, and asks again.
pub const MAX_REQUEST: usize = 64 * 1024;

/// The entropy device.
#[derive(Debug, Default)]
pub struct Rng;

/// Fills `buf` from `getrandom(2)`.
fn fill(buf: &mut [u8]) -> std::io::Result<()> {
    let mut done = 0;
    while done < buf.len() {
        let rest = &mut buf[done..];
        // SAFETY: `rest` is a valid, exclusively borrowed buffer of
        // `rest.len()` bytes, which getrandom only writes.
        let n = unsafe { libc::getrandom(rest.as_mut_ptr().cast(), rest.len(), 0) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        // CAST: non-negative and at most rest.len().
        done += n as usize;
    }
    Ok(())
}

impl VirtioDevice for Rng {
    fn device_type(&self) -> u32 {
        VIRTIO_ID_RNG
    }

    fn name(&self) -> String {
        "rng".into()
    }

    fn features(&self) -> u64 {
        0
    }

    fn queue_max(&self) -> Vec<u16> {
        vec![64]
    }

    fn config(&self) -> Vec<u8> {
        Vec::new()
    }

    fn process(&mut self, qs: &mut Queues<'_>, events: &Events) -> Result<(), DeviceError> {
        if !events.queue(0) {
            return Ok(());
        }
        let mut buf = vec![0u8; MAX_REQUEST];
        loop {
            qs.disable_notification(0)?;
            while let Some(chain) = qs.pop(0)? {
                if qs.stopping() {
                    qs.unpop(0);
                    break;
                }
                if !chain.readable.is_empty() {
                    return Err(DeviceError::Request { queue: 0, why: "a device-readable buffer in a request".into() });
                }
                // CAST: min with a usize fits usize.
                let n = chain.writable_len().min(MAX_REQUEST as u64) as usize;
                fill(&mut buf[..n]).map_err(|source| DeviceError::Host { what: "getrandom", source })?;
                let mut w = chain.writer();
                let written = w.write(qs.mem(), &buf[..n]);
                // CAST: at most MAX_REQUEST.
                qs.add_used(0, chain.head, written as u32)?;
                qs.stats().queues[0].count(written as u64);
            }
            if qs.stopping() || !qs.enable_notification(0)? {
                break;
            }
        }
        qs.notify(0)?;
        Ok(())
    }

    fn stats(&self, s: &super::DeviceStats) -> String {
        format!("  {} bytes of entropy\n", s.queues[0].bytes.load(Ordering::Relaxed))
    }
}
