// SPDX-License-Identifier: GPL-2.0
//! virtio-console (device ID 3), one port without the multiport feature:
//! queue 0 (receiveq) carries host input to the guest, queue 1 (transmitq)
//! the guest's output to the host.
//!
//! Output is written as it comes. Input is read from the host fd (stdin)
//! only while the driver has posted receive buffers: with none, the fd is
//! not polled until the driver kicks queue 0, so a guest that never reads
//! its console never takes the launcher's stdin away from anyone.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::Ordering;

use super::{DeviceError, Events, Queues, VirtioDevice, VIRTIO_ID_CONSOLE};

/// Queue numbers.
const RX: usize = 0;
const TX: usize = 1;

/// The most bytes read from the host per receive buffer.
const INPUT_CHUNK: usize = 4096;
/// Bytes of output copied per step.
const OUTPUT_CHUNK: usize = 16 * 1024;

/// The console device.
pub struct Console {
    input: Option<File>,
    output: Box<dyn Write + Send>,
    /// No receive buffer: wait for a kick of queue 0 before reading input.
    rx_wait: bool,
    /// The input reached its end.
    eof: bool,
    /// Output failed once (reported once).
    output_broken: bool,
}

impl std::fmt::Debug for Console {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Console").field("input", &self.input).field("eof", &self.eof).finish_non_exhaustive()
    }
}

impl Console {
    /// A console reading `input` (if any) and writing `output`.
    pub fn new(input: Option<File>, output: Box<dyn Write + Send>) -> Self {
        Self { input, output, rx_wait: false, eof: false, output_broken: false }
    }

    fn transmit(&mut self, qs: &mut Queues<'_>) -> Result<(), DeviceError> {
        loop {
            qs.disable_notification(TX)?;
            while let Some(chain) = qs.pop(TX)? {
                if !chain.writable.is_empty() {
                    return Err(DeviceError::Request { queue: TX, why: "a device-writable buffer in output".into() });
                }
                // In bounded pieces: a chain may be up to 4 GiB long.
                let mut reader = chain.reader();
                let mut buf = [0u8; OUTPUT_CHUNK];
                loop {
                    let n = reader.read(qs.mem(), &mut buf);
                    if n == 0 {
                        break;
                    }
                    if !self.output_broken {
                        if let Err(e) = self.output.write_all(&buf[..n]) {
                            log::warn!("console output: {e}; further output is dropped");
                            self.output_broken = true;
                        }
                    }
                }
                if !self.output_broken {
                    let _ = self.output.flush();
                }
                qs.add_used(TX, chain.head, 0)?;
                qs.stats().queues[TX].count(chain.readable_len());
            }
            if !qs.enable_notification(TX)? {
                break;
            }
        }
        qs.notify(TX)?;
        Ok(())
    }

    fn receive(&mut self, qs: &mut Queues<'_>) -> Result<(), DeviceError> {
        let Some(input) = self.input.as_mut() else { return Ok(()) };
        let chain = match qs.pop(RX)? {
            Some(chain) => chain,
            None => {
                // Ask for a kick when buffers come; they may have come already.
                if !qs.enable_notification(RX)? {
                    self.rx_wait = true;
                    return Ok(());
                }
                match qs.pop(RX)? {
                    Some(chain) => chain,
                    None => {
                        self.rx_wait = true;
                        return Ok(());
                    }
                }
            }
        };
        if !chain.readable.is_empty() {
            return Err(DeviceError::Request { queue: RX, why: "a device-readable buffer for input".into() });
        }
        // CAST: min with a usize fits usize.
        let room = chain.writable_len().min(INPUT_CHUNK as u64) as usize;
        if room == 0 {
            qs.add_used(RX, chain.head, 0)?;
            return Ok(());
        }
        let mut buf = [0u8; INPUT_CHUNK];
        let n = match input.read(&mut buf[..room]) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock || e.kind() == std::io::ErrorKind::Interrupted => {
                qs.unpop(RX);
                return Ok(());
            }
            Err(e) => {
                log::warn!("console input: {e}; no more input");
                0
            }
        };
        if n == 0 {
            self.eof = true;
            qs.unpop(RX);
            return Ok(());
        }
        let written = chain.writer().write(qs.mem(), &buf[..n]);
        // CAST: at most INPUT_CHUNK.
        qs.add_used(RX, chain.head, written as u32)?;
        qs.stats().queues[RX].count(written as u64);
        qs.notify(RX)?;
        Ok(())
    }
}

impl VirtioDevice for Console {
    fn device_type(&self) -> u32 {
        VIRTIO_ID_CONSOLE
    }

    fn name(&self) -> String {
        "console".into()
    }

    fn features(&self) -> u64 {
        0
    }

    fn queue_max(&self) -> Vec<u16> {
        vec![64, 64]
    }

    fn config(&self) -> Vec<u8> {
        Vec::new()
    }

    fn reset(&mut self) {
        self.rx_wait = false;
    }

    fn input_fds(&self) -> Vec<RawFd> {
        match &self.input {
            Some(f) if !self.eof && !self.rx_wait => vec![f.as_raw_fd()],
            _ => Vec::new(),
        }
    }

    fn process(&mut self, qs: &mut Queues<'_>, events: &Events) -> Result<(), DeviceError> {
        if events.queue(RX) {
            self.rx_wait = false;
        }
        if events.queue(TX) {
            self.transmit(qs)?;
        }
        if events.input & 1 != 0 && !self.eof && !self.rx_wait {
            self.receive(qs)?;
        }
        Ok(())
    }

    fn stats(&self, s: &super::DeviceStats) -> String {
        format!(
            "  {} bytes out, {} bytes in\n",
            s.queues[TX].bytes.load(Ordering::Relaxed),
            s.queues[RX].bytes.load(Ordering::Relaxed)
        )
    }
}
