// SPDX-License-Identifier: GPL-2.0
//! virtio devices on the lguest bus (`abi/src/bus.rs`).
//!
//! The split follows Firecracker and Cloud Hypervisor: [`bus`] owns the
//! device table, the status protocol and one thread per device; the device
//! models ([`console`], [`rng`], [`block`], [`net`]) only implement
//! [`VirtioDevice`], see their queues through [`Queues`] and never touch the
//! bus, an ioctl or a thread, so each is tested without a VM.
//!
//! Everything the guest wrote is untrusted: rings are `virtio-queue` 0.18
//! `Queue`s over the RAM-only `GuestMemoryMmap` (`memory.rs`), and every
//! descriptor chain is walked and checked once by [`chain::walk`]. A broken
//! rule becomes a [`DeviceError`], and the bus answers with
//! `DEVICE_NEEDS_RESET`.

use std::io;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use virtio_queue::{Queue, QueueOwnedT, QueueT};
use vm_memory::GuestMemoryMmap;

pub mod block;
pub mod bus;
pub mod chain;
pub mod console;
pub mod net;
#[cfg(test)]
mod proptests;
pub mod rng;
pub mod tap;
pub mod term;
#[cfg(test)]
pub mod testring;
#[cfg(test)]
mod tests;

pub use chain::{Chain, ChainError};

use virtio_bindings::virtio_config as config;
use virtio_bindings::virtio_ids as ids;
use virtio_bindings::virtio_ring as ring;

/// `VIRTIO_F_RING_INDIRECT_DESC` (virtio-bindings gives bit numbers).
pub const VIRTIO_F_RING_INDIRECT_DESC: u64 = 1 << ring::VIRTIO_RING_F_INDIRECT_DESC;
/// `VIRTIO_F_RING_EVENT_IDX`.
pub const VIRTIO_F_RING_EVENT_IDX: u64 = 1 << ring::VIRTIO_RING_F_EVENT_IDX;
/// `VIRTIO_F_VERSION_1`.
pub const VIRTIO_F_VERSION_1: u64 = 1 << config::VIRTIO_F_VERSION_1;
/// The transport features every device on the bus offers.
pub const TRANSPORT_FEATURES: u64 = VIRTIO_F_VERSION_1 | VIRTIO_F_RING_EVENT_IDX | VIRTIO_F_RING_INDIRECT_DESC;

/// virtio device ID of a network card.
pub const VIRTIO_ID_NET: u32 = ids::VIRTIO_ID_NET;
/// virtio device ID of a block device.
pub const VIRTIO_ID_BLOCK: u32 = ids::VIRTIO_ID_BLOCK;
/// virtio device ID of a console.
pub const VIRTIO_ID_CONSOLE: u32 = ids::VIRTIO_ID_CONSOLE;
/// virtio device ID of an entropy source.
pub const VIRTIO_ID_RNG: u32 = ids::VIRTIO_ID_RNG;

/// Why a device stopped and asks for a reset.
#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    /// A descriptor chain broke the rules.
    #[error("queue {queue}: descriptor chain at head {head}: {why}")]
    Chain {
        /// The queue.
        queue: usize,
        /// The chain's head.
        head: u16,
        /// What was wrong.
        why: ChainError,
    },
    /// The rings themselves are broken (for example, an available index
    /// more than the queue size ahead).
    #[error("queue {queue}: {source}")]
    Ring {
        /// The queue.
        queue: usize,
        /// What `virtio-queue` said.
        source: virtio_queue::Error,
    },
    /// A request broke a device-specific rule.
    #[error("queue {queue}: {why}")]
    Request {
        /// The queue.
        queue: usize,
        /// What was wrong.
        why: String,
    },
    /// The host side of the device failed (tap, file, terminal).
    #[error("{what}")]
    Host {
        /// What was being done.
        what: &'static str,
        /// The error.
        source: io::Error,
    },
    /// The host side is gone for good (a deleted tap): no reset can help,
    /// and the launcher stops with an error naming the device.
    #[error("{what}")]
    Gone {
        /// What was being done.
        what: &'static str,
        /// The error.
        source: io::Error,
    },
}

impl DeviceError {
    /// A host error: [`DeviceError::Gone`] if `source` says the host
    /// object has gone away (`EBADFD` from a detached tap, `ENODEV`,
    /// `ENXIO`), else [`DeviceError::Host`].
    pub fn host(what: &'static str, source: io::Error) -> Self {
        match source.raw_os_error() {
            Some(libc::EBADFD | libc::ENODEV | libc::ENXIO) => Self::Gone { what, source },
            _ => Self::Host { what, source },
        }
    }
}

/// Counters of one queue; atomics, so that `--stats` may read them from
/// another thread.
#[derive(Debug, Default)]
pub struct QueueStats {
    /// Kicks from the driver.
    pub kicks: AtomicU64,
    /// Interrupts raised for this queue.
    pub irqs: AtomicU64,
    /// Chains used (packets, requests).
    pub chains: AtomicU64,
    /// Payload bytes moved.
    pub bytes: AtomicU64,
}

impl QueueStats {
    /// Adds one used chain of `bytes` payload bytes.
    pub fn count(&self, bytes: u64) {
        self.chains.fetch_add(1, Ordering::Relaxed);
        self.bytes.fetch_add(bytes, Ordering::Relaxed);
    }
}

/// Counters of one device.
#[derive(Debug, Default)]
pub struct DeviceStats {
    /// Per queue.
    pub queues: [QueueStats; lguest_abi::bus::LGUEST_BUS_MAX_QUEUES],
    /// Interrupts raised by a safety-net timer rather than by a batch end.
    pub timer_irqs: AtomicU64,
    /// Packets or requests dropped (no room, host refused).
    pub dropped: AtomicU64,
}

/// What woke a device's thread.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Events {
    /// Queues kicked (bit per queue).
    pub kicked: u32,
    /// Input fds that are readable (bit per entry of `input_fds`).
    pub input: u32,
    /// The device's timeout ran out.
    pub timeout: bool,
    /// The driver just set DRIVER_OK: look at every queue.
    pub start: bool,
}

impl Events {
    /// Whether queue `q` should be looked at.
    pub fn queue(&self, q: usize) -> bool {
        self.start || self.kicked & (1 << q) != 0
    }
}

/// A virtio device model.
pub trait VirtioDevice: Send {
    /// The virtio device ID.
    fn device_type(&self) -> u32;
    /// A short name for messages and statistics ("net0 (tap0)").
    fn name(&self) -> String;
    /// Device-specific feature bits offered (the bus adds
    /// [`TRANSPORT_FEATURES`]).
    fn features(&self) -> u64;
    /// The largest size of each queue (powers of two).
    fn queue_max(&self) -> Vec<u16>;
    /// The configuration space.
    fn config(&self) -> Vec<u8>;
    /// The driver set DRIVER_OK having accepted `features`.
    fn activate(&mut self, _features: u64) -> Result<(), DeviceError> {
        Ok(())
    }
    /// The device was reset or stopped.
    fn reset(&mut self) {}
    /// Host fds to poll while the device runs (stdin, a tap).
    fn input_fds(&self) -> Vec<RawFd> {
        Vec::new()
    }
    /// How long to sleep at most while the device runs.
    fn timeout(&self) -> Option<Duration> {
        None
    }
    /// Does the device's work after `events`.
    fn process(&mut self, queues: &mut Queues<'_>, events: &Events) -> Result<(), DeviceError>;
    /// A new configuration space after `process` (the console's window
    /// size): the bus writes it, bumps the generation and raises a
    /// configuration interrupt.
    fn config_update(&mut self) -> Option<Vec<u8>> {
        None
    }
    /// Device-specific `--stats` text.
    fn stats(&self, _stats: &DeviceStats) -> String {
        String::new()
    }
}

/// The running queues of one device, as a device model sees them.
pub struct Queues<'a> {
    mem: &'a GuestMemoryMmap,
    queues: &'a mut [Option<Queue>],
    raise: &'a dyn Fn(),
    stats: &'a DeviceStats,
    /// Set when the launcher is stopping: device loops look at it between
    /// chains and inside long ones ([`Queues::stopping`]).
    stop: Option<&'a AtomicBool>,
    /// Queues with chains used since their last `notify` (bit per queue).
    added: u32,
}

impl<'a> Queues<'a> {
    /// The queues `queues` (`None`: not started) over RAM `mem`; `raise`
    /// sets the queue bit in `isr` and raises the device's interrupt.
    pub fn new(
        mem: &'a GuestMemoryMmap,
        queues: &'a mut [Option<Queue>],
        raise: &'a dyn Fn(),
        stats: &'a DeviceStats,
    ) -> Self {
        Self { mem, queues, raise, stats, stop: None, added: 0 }
    }

    /// The same, watching `stop` for [`Queues::stopping`].
    pub fn with_stop(mut self, stop: &'a AtomicBool) -> Self {
        self.stop = Some(stop);
        self
    }

    /// Whether the launcher is stopping: a device model then ends its work
    /// at the next chain (or chunk of a long chain) instead of draining
    /// the ring, so that a stop never waits on the guest's I/O.
    pub fn stopping(&self) -> bool {
        self.stop.is_some_and(|s| s.load(Ordering::Relaxed))
    }

    /// Guest RAM.
    pub fn mem(&self) -> &'a GuestMemoryMmap {
        self.mem
    }

    /// The device's counters.
    pub fn stats(&self) -> &'a DeviceStats {
        self.stats
    }

    fn queue(&mut self, q: usize) -> Option<&mut Queue> {
        self.queues.get_mut(q).and_then(Option::as_mut)
    }

    /// Takes the next available chain of queue `q`, checked; `None` when
    /// the ring is empty or the queue is not running.
    pub fn pop(&mut self, q: usize) -> Result<Option<Chain>, DeviceError> {
        let mem = self.mem;
        let Some(queue) = self.queue(q) else { return Ok(None) };
        let (table, size) = (queue.desc_table(), queue.size());
        let head = {
            let mut iter = queue.iter(mem).map_err(|source| DeviceError::Ring { queue: q, source })?;
            iter.next().map(|c| c.head_index())
        };
        match head {
            None => Ok(None),
            Some(head) => {
                chain::walk(mem, table, size, head).map(Some).map_err(|why| DeviceError::Chain { queue: q, head, why })
            }
        }
    }

    /// Puts the chain taken last back (it will be popped again).
    pub fn unpop(&mut self, q: usize) {
        if let Some(queue) = self.queue(q) {
            queue.go_to_previous_position();
        }
    }

    /// Returns chain `head` to the driver with `len` bytes written.
    pub fn add_used(&mut self, q: usize, head: u16, len: u32) -> Result<(), DeviceError> {
        let mem = self.mem;
        let Some(queue) = self.queue(q) else { return Ok(()) };
        queue.add_used(mem, head, len).map_err(|source| DeviceError::Ring { queue: q, source })?;
        self.added |= 1 << q;
        Ok(())
    }

    /// Asks the driver not to kick queue `q`.
    pub fn disable_notification(&mut self, q: usize) -> Result<(), DeviceError> {
        let mem = self.mem;
        let Some(queue) = self.queue(q) else { return Ok(()) };
        queue.disable_notification(mem).map_err(|source| DeviceError::Ring { queue: q, source })
    }

    /// Asks the driver to kick queue `q` again; true if chains arrived
    /// meanwhile (process them before sleeping).
    pub fn enable_notification(&mut self, q: usize) -> Result<bool, DeviceError> {
        let mem = self.mem;
        let Some(queue) = self.queue(q) else { return Ok(false) };
        queue.enable_notification(mem).map_err(|source| DeviceError::Ring { queue: q, source })
    }

    /// Ends a batch on queue `q`: raises the interrupt if chains were used
    /// since the last call and the driver wants one for them (EVENT_IDX).
    /// Returns whether it did.
    pub fn notify(&mut self, q: usize) -> Result<bool, DeviceError> {
        if self.added & (1 << q) == 0 {
            return Ok(false);
        }
        self.added &= !(1 << q);
        let mem = self.mem;
        let Some(queue) = self.queue(q) else { return Ok(false) };
        if queue.needs_notification(mem).map_err(|source| DeviceError::Ring { queue: q, source })? {
            self.raise_irq(q);
            return Ok(true);
        }
        Ok(false)
    }

    /// Raises queue `q`'s interrupt whatever the driver asked.
    pub fn raise_irq(&mut self, q: usize) {
        if let Some(s) = self.stats.queues.get(q) {
            s.irqs.fetch_add(1, Ordering::Relaxed);
        }
        (self.raise)();
    }
}
