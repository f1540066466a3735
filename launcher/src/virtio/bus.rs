// SPDX-License-Identifier: GPL-2.0
//! The lguest bus as the launcher implements it: the device table in the
//! first page of the device window, the status protocol, and one thread
//! per device.
//!
//! Who calls what:
//!
//! - `run.rs` builds the [`Bus`] (which writes the table), binds each queue's
//!   kick eventfd to its notification address (`LGUEST_IOEVENTFD`) and each
//!   device's interrupt eventfd to its line (`LGUEST_IRQFD`), and spawns
//!   [`Bus::run_device`] for every device.
//! - The vCPU thread calls [`Bus::notify`] for a `LHCALL_NOTIFY` in the
//!   device window: a status change is handled there and then (so the driver
//!   reads the answer right after its hypercall), a queue kick that reached
//!   the vCPU thread (no `LGUEST_IOEVENTFD`, or `--no-ioeventfd`) is passed
//!   on by signalling the queue's eventfd, as the kernel would.
//! - A device thread sleeps in `poll(2)` on its kick eventfds, its wake
//!   eventfd and the model's host fds, then runs the model.
//!
//! Locking: each device's [`Inner`] (the model, its running queues and the
//! status the device last acknowledged) is behind one mutex, held by the
//! device thread while the model works and by the vCPU thread while it
//! handles a status change. So once a reset returns, the device thread is
//! not in the middle of a ring and will not touch it again. The shared
//! descriptor fields the device writes at any time, `isr` and the
//! `DEVICE_NEEDS_RESET` bit of `status`, are changed with atomic `fetch_or`
//! on guest memory; everything else is read once per notification into a
//! local copy and validated there.

use std::io;
use std::mem::offset_of;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use lguest_abi::bus::{
    BusNotify, LguestBus, LguestDeviceDesc, LguestVqConfig, LGUEST_BUS_CONFIG_SIZE, LGUEST_BUS_DESC_SIZE,
    LGUEST_BUS_MAX_DEVICES, LGUEST_BUS_MAX_QUEUES, LGUEST_ISR_CONFIG, LGUEST_ISR_QUEUE,
    VIRTIO_STATUS_DEVICE_NEEDS_RESET, VIRTIO_STATUS_DRIVER_OK, VIRTIO_STATUS_FAILED, VIRTIO_STATUS_FEATURES_OK,
};
use virtio_queue::{Queue, QueueT};
use vm_memory::{GuestAddress, GuestMemoryBackend, VolatileMemory};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use super::{DeviceStats, Events, Queues, VirtioDevice, TRANSPORT_FEATURES, VIRTIO_F_RING_EVENT_IDX};
use crate::memory::GuestMemory;
use crate::ratelimit::GuestWarnings;

/// Something that raises one guest interrupt line.
pub trait IrqLine: Send + Sync {
    /// Raises it.
    fn raise(&self) -> io::Result<()>;
}

/// An interrupt line through an eventfd bound with `LGUEST_IRQFD`.
#[derive(Debug)]
pub struct EventFdIrq(pub EventFd);

impl IrqLine for EventFdIrq {
    fn raise(&self) -> io::Result<()> {
        self.0.write(1)
    }
}

/// An interrupt line through `LGUEST_IRQ` (when `LGUEST_IRQFD` failed).
#[derive(Debug)]
pub struct IoctlIrq<'a> {
    /// The VM.
    pub lg: &'a crate::dev::Lguest,
    /// The line.
    pub irq: u32,
}

impl IrqLine for IoctlIrq<'_> {
    fn raise(&self) -> io::Result<()> {
        self.lg.irq(self.irq).map_err(io::Error::other)
    }
}

/// Errors setting the bus up.
#[derive(Debug, thiserror::Error)]
pub enum BusError {
    /// More devices than table slots.
    #[error("{0} devices do not fit the device table ({LGUEST_BUS_MAX_DEVICES} slots)")]
    TooManyDevices(usize),
    /// A model with too many queues or too much configuration.
    #[error("device {0} does not fit a descriptor")]
    TooBig(String),
    /// No device window.
    #[error("the device window is empty")]
    NoWindow,
    /// An eventfd could not be made.
    #[error("cannot create an eventfd")]
    EventFd(#[source] io::Error),
    /// Writing the table failed.
    #[error("cannot write the device table: {0}")]
    Memory(String),
}

/// The part of a device both threads use, behind its mutex.
struct Inner {
    model: Box<dyn VirtioDevice>,
    /// Running queues; `None` when not started.
    queues: Vec<Option<Queue>>,
    /// The status the device last acknowledged.
    status: u32,
    /// The features accepted at FEATURES_OK.
    features: u64,
    /// Queues run (between DRIVER_OK and a reset or failure).
    running: bool,
    /// DRIVER_OK came: the device thread should look at every queue.
    start_pending: bool,
}

/// One device on the bus.
struct Device<'a> {
    index: usize,
    irq: u32,
    name: String,
    offered: u64,
    queue_max: Vec<u16>,
    kicks: Vec<EventFd>,
    wake: EventFd,
    line: Box<dyn IrqLine + 'a>,
    inner: Mutex<Inner>,
    stats: DeviceStats,
    /// The device needed a reset (the driver broke a rule): counted and
    /// rate-limited, since a driver can break it in a loop.
    failures: GuestWarnings,
    /// The driver took features that were not offered: likewise.
    bad_features: GuestWarnings,
}

impl Device<'_> {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic in a model cannot leave `Inner` half-changed in a way
        // that matters more than the panic; keep going.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Offsets of descriptor fields.
const OFF_STATUS: usize = offset_of!(LguestDeviceDesc, status);
const OFF_DRIVER_FEATURES: usize = offset_of!(LguestDeviceDesc, driver_features);
const OFF_ISR: usize = offset_of!(LguestDeviceDesc, isr);
const OFF_QUEUES: usize = offset_of!(LguestDeviceDesc, queues);
const OFF_GENERATION: usize = offset_of!(LguestDeviceDesc, config_generation);
const OFF_CONFIG: usize = offset_of!(LguestDeviceDesc, config);
const VQ_SIZE: usize = std::mem::size_of::<LguestVqConfig>();

/// The bus: the device table and its devices.
pub struct Bus<'a> {
    mem: &'a GuestMemory,
    bus: LguestBus,
    devices: Vec<Device<'a>>,
    stop: AtomicBool,
    /// Serve queue kicks that reach the vCPU thread on that thread, before
    /// the guest runs again (`--sync-kicks`), instead of waking the device
    /// thread.
    sync_kicks: AtomicBool,
    /// A device whose host side is gone for good: the message the launcher
    /// stops with.
    fatal: Mutex<Option<String>>,
    /// Makes the vCPU thread come back from RUN (to see `fatal`).
    kick_vcpu: std::sync::OnceLock<Box<dyn Fn() + Send + Sync + 'a>>,
}

/// Bytes of one descriptor as the launcher first writes it.
fn encode(desc: &LguestDeviceDesc) -> [u8; LGUEST_BUS_DESC_SIZE] {
    let mut b = [0u8; LGUEST_BUS_DESC_SIZE];
    let mut put = |off: usize, bytes: &[u8]| b[off..off + bytes.len()].copy_from_slice(bytes);
    put(offset_of!(LguestDeviceDesc, device_type), &desc.device_type.to_le_bytes());
    put(offset_of!(LguestDeviceDesc, num_queues), &desc.num_queues.to_le_bytes());
    put(offset_of!(LguestDeviceDesc, irq), &desc.irq.to_le_bytes());
    put(offset_of!(LguestDeviceDesc, device_features), &desc.device_features.to_le_bytes());
    put(offset_of!(LguestDeviceDesc, config_len), &desc.config_len.to_le_bytes());
    for (q, vq) in desc.queues.iter().enumerate() {
        put(OFF_QUEUES + q * VQ_SIZE + offset_of!(LguestVqConfig, num_max), &vq.num_max.to_le_bytes());
    }
    put(offset_of!(LguestDeviceDesc, config), &desc.config);
    b
}

fn u16_at(raw: &[u8], off: usize) -> u16 {
    u16::from_le_bytes([raw[off], raw[off + 1]])
}

fn u32_at(raw: &[u8], off: usize) -> u32 {
    u32::from_le_bytes([raw[off], raw[off + 1], raw[off + 2], raw[off + 3]])
}

fn u64_at(raw: &[u8], off: usize) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&raw[off..off + 8]);
    u64::from_le_bytes(b)
}

/// One queue's configuration as the driver wrote it.
fn vq_config(raw: &[u8], q: usize) -> LguestVqConfig {
    let base = OFF_QUEUES + q * VQ_SIZE;
    LguestVqConfig {
        num_max: u16_at(raw, base + offset_of!(LguestVqConfig, num_max)),
        num: u16_at(raw, base + offset_of!(LguestVqConfig, num)),
        ready: u16_at(raw, base + offset_of!(LguestVqConfig, ready)),
        pad: 0,
        desc: u64_at(raw, base + offset_of!(LguestVqConfig, desc)),
        driver: u64_at(raw, base + offset_of!(LguestVqConfig, driver)),
        device: u64_at(raw, base + offset_of!(LguestVqConfig, device)),
    }
}

impl<'a> Bus<'a> {
    /// Puts `models` on the bus, in slot order, and writes the device table.
    /// Device `i` gets interrupt line `i + 1` (line 0 is the clock), raised
    /// through what `line(irq)` returns.
    pub fn new(
        mem: &'a GuestMemory,
        models: Vec<Box<dyn VirtioDevice>>,
        mut line: impl FnMut(u32) -> Box<dyn IrqLine + 'a>,
    ) -> Result<Self, BusError> {
        if mem.device_pages() == 0 {
            return Err(BusError::NoWindow);
        }
        if models.len() > LGUEST_BUS_MAX_DEVICES {
            return Err(BusError::TooManyDevices(models.len()));
        }
        let bus = LguestBus::new(mem.mem_size());
        mem.zero(bus.base, 4096).map_err(|e| BusError::Memory(e.to_string()))?;
        let mut devices = Vec::new();
        for (index, model) in models.into_iter().enumerate() {
            let name = model.name();
            let queue_max = model.queue_max();
            let config = model.config();
            if queue_max.len() > LGUEST_BUS_MAX_QUEUES || config.len() > LGUEST_BUS_CONFIG_SIZE {
                return Err(BusError::TooBig(name));
            }
            // CAST: index < LGUEST_BUS_MAX_DEVICES (8), far below LGUEST_IRQS.
            let irq = index as u32 + 1;
            let offered = model.features() | TRANSPORT_FEATURES;
            let mut desc = LguestDeviceDesc {
                device_type: model.device_type(),
                // CAST: at most LGUEST_BUS_MAX_QUEUES, checked above.
                num_queues: queue_max.len() as u32,
                irq,
                device_features: offered,
                // CAST: at most LGUEST_BUS_CONFIG_SIZE, checked above.
                config_len: config.len() as u32,
                ..LguestDeviceDesc::default()
            };
            for (vq, &max) in desc.queues.iter_mut().zip(&queue_max) {
                vq.num_max = max;
            }
            desc.config[..config.len()].copy_from_slice(&config);
            mem.write(bus.desc_addr(index), &encode(&desc)).map_err(|e| BusError::Memory(e.to_string()))?;
            let kicks = queue_max
                .iter()
                .map(|_| EventFd::new(EFD_NONBLOCK))
                .collect::<io::Result<Vec<_>>>()
                .map_err(BusError::EventFd)?;
            let wake = EventFd::new(EFD_NONBLOCK).map_err(BusError::EventFd)?;
            log::info!("bus slot {index}: {name}, type {}, irq {irq}, features {offered:#x}", desc.device_type);
            devices.push(Device {
                index,
                irq,
                name,
                offered,
                queue_max: queue_max.clone(),
                kicks,
                wake,
                line: line(irq),
                inner: Mutex::new(Inner {
                    model,
                    queues: queue_max.iter().map(|_| None).collect(),
                    status: 0,
                    features: 0,
                    running: false,
                    start_pending: false,
                }),
                stats: DeviceStats::default(),
                failures: GuestWarnings::new(),
                bad_features: GuestWarnings::new(),
            });
        }
        Ok(Self {
            mem,
            bus,
            devices,
            stop: AtomicBool::new(false),
            sync_kicks: AtomicBool::new(false),
            fatal: Mutex::new(None),
            kick_vcpu: std::sync::OnceLock::new(),
        })
    }

    /// Devices on the bus.
    pub fn len(&self) -> usize {
        self.devices.len()
    }

    /// Whether the bus has no device.
    pub fn is_empty(&self) -> bool {
        self.devices.is_empty()
    }

    /// Serves kicks that reach the vCPU thread on that thread (see
    /// `sync_kicks`).
    pub fn set_sync_kicks(&self, on: bool) {
        self.sync_kicks.store(on, Ordering::Relaxed);
    }

    /// The kick eventfds and the addresses they stand for, to bind with
    /// `LGUEST_IOEVENTFD`.
    pub fn kick_fds(&self) -> Vec<(u64, RawFd)> {
        let mut v = Vec::new();
        for d in &self.devices {
            for (q, k) in d.kicks.iter().enumerate() {
                v.push((self.bus.vq_addr(d.index, q), k.as_raw_fd()));
            }
        }
        v
    }

    /// Handles a `LHCALL_NOTIFY(addr)` that reached the vCPU thread; false
    /// if `addr` means nothing on this bus.
    pub fn notify(&self, addr: u64) -> bool {
        match self.bus.decode(addr) {
            Some(BusNotify::Status { index }) if index < self.devices.len() => {
                self.status(&self.devices[index]);
                true
            }
            Some(BusNotify::Queue { index, queue }) => {
                let Some(kick) = self.devices.get(index).and_then(|d| d.kicks.get(queue)) else { return false };
                if self.sync_kicks.load(Ordering::Relaxed) {
                    self.serve_kick_here(&self.devices[index], queue);
                } else if let Err(e) = kick.write(1) {
                    log::warn!("kicking queue {queue} of device {index}: {e}");
                }
                true
            }
            _ => false,
        }
    }

    /// `--sync-kicks`, as lguest's launcher did in 2009: serves a kick of
    /// `queue` on the calling (vCPU) thread, with the device's host input
    /// polled without waiting (for a tap: the ACKs the host's TCP sent while
    /// taking those packets) and the interrupts raised, before the guest
    /// goes on.
    fn serve_kick_here(&self, dev: &Device<'_>, queue: usize) {
        dev.stats.queues[queue].kicks.fetch_add(1, Ordering::Relaxed);
        let fds = {
            let inner = dev.lock();
            if inner.running {
                inner.model.input_fds()
            } else {
                Vec::new()
            }
        };
        let mut pfds: Vec<libc::pollfd> =
            fds.iter().take(32).map(|&fd| libc::pollfd { fd, events: libc::POLLIN, revents: 0 }).collect();
        let input = match poll(&mut pfds, Some(Duration::ZERO)) {
            Ok(0) | Err(_) => 0,
            Ok(_) => pfds.iter().enumerate().filter(|(_, p)| p.revents != 0).fold(0, |m, (i, _)| m | 1 << i),
        };
        self.service(dev.index, Events { kicked: 1 << queue, input, ..Events::default() });
        // The device thread sleeps on the host fds the model wanted before;
        // if serving changed them (a net device given receive buffers wants
        // its tap again), it must look again.
        if dev.lock().model.input_fds() != fds {
            if let Err(e) = dev.wake.write(1) {
                log::warn!("{}: waking its thread: {e}", dev.name);
            }
        }
    }

    fn desc_addr(&self, dev: &Device<'_>) -> u64 {
        self.bus.desc_addr(dev.index)
    }

    /// Runs `f` on the shared u32 at `offset` of a descriptor, as an atomic
    /// in guest memory.
    fn with_atomic<R>(&self, dev: &Device<'_>, offset: usize, f: impl FnOnce(&AtomicU32) -> R) -> Option<R> {
        let addr = GuestAddress(self.desc_addr(dev) + offset as u64);
        let slice = self.mem.all().get_slice(addr, 4).ok()?;
        let atomic = slice.get_atomic_ref::<AtomicU32>(0).ok()?;
        Some(f(atomic))
    }

    fn store_status(&self, dev: &Device<'_>, status: u32) {
        self.with_atomic(dev, OFF_STATUS, |a| a.store(status, Ordering::SeqCst));
    }

    /// Sets `bits` in the device's `isr` and raises its interrupt.
    fn raise(&self, dev: &Device<'_>, bits: u32) {
        self.with_atomic(dev, OFF_ISR, |isr| isr.fetch_or(bits, Ordering::SeqCst));
        if let Err(e) = dev.line.raise() {
            log::warn!("{}: raising interrupt {}: {e}", dev.name, dev.irq);
        }
    }

    /// Sets what makes the vCPU thread come back from RUN when a device's
    /// host side is gone (see [`Bus::fatal`]).
    pub fn set_vcpu_kick(&self, kick: Box<dyn Fn() + Send + Sync + 'a>) {
        let _ = self.kick_vcpu.set(kick);
    }

    /// Why the launcher must stop: a device whose host side is gone for
    /// good (a deleted tap), with its name and the error.
    pub fn fatal(&self) -> Option<String> {
        self.fatal.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// A device error: [`DeviceError::Gone`] stops the launcher (through
    /// [`Bus::fatal`]); any other needs a reset.
    fn device_error(&self, dev: &Device<'_>, inner: &mut Inner, e: &super::DeviceError) {
        if let super::DeviceError::Gone { what, source } = e {
            let msg =
                format!("{}: {what}: {source}; the device's host side (its tap or file) is gone, stopping", dev.name);
            log::debug!("{msg}");
            self.fatal.lock().unwrap_or_else(|e| e.into_inner()).get_or_insert(msg);
            Self::stop_queues(inner);
            if let Some(kick) = self.kick_vcpu.get() {
                kick();
            }
            return;
        }
        self.fail(dev, inner, e);
    }

    /// Stops a device whose driver broke the rules: DEVICE_NEEDS_RESET and
    /// a configuration interrupt.
    fn fail(&self, dev: &Device<'_>, inner: &mut Inner, why: &dyn std::fmt::Display) {
        dev.failures.warn(|| format!("{}: {why}; the device needs a reset", dev.name));
        Self::stop_queues(inner);
        inner.status |= VIRTIO_STATUS_DEVICE_NEEDS_RESET;
        self.with_atomic(dev, OFF_STATUS, |a| a.fetch_or(VIRTIO_STATUS_DEVICE_NEEDS_RESET, Ordering::SeqCst));
        self.raise(dev, LGUEST_ISR_CONFIG);
    }

    fn stop_queues(inner: &mut Inner) {
        if inner.running {
            inner.model.reset();
        }
        inner.running = false;
        inner.start_pending = false;
        for q in &mut inner.queues {
            *q = None;
        }
    }

    /// The driver wrote the descriptor and notified its address.
    fn status(&self, dev: &Device<'_>) {
        let base = self.desc_addr(dev);
        let mut raw = [0u8; LGUEST_BUS_DESC_SIZE];
        if let Err(e) = self.mem.read(base, &mut raw) {
            log::warn!("{}: reading its descriptor: {e}", dev.name);
            return;
        }
        let mut status = u32_at(&raw, OFF_STATUS);
        let driver_features = u64_at(&raw, OFF_DRIVER_FEATURES);
        let mut inner = dev.lock();
        log::debug!("{}: status {status:#x} (was {:#x})", dev.name, inner.status);
        if status == 0 {
            Self::stop_queues(&mut inner);
            inner.status = 0;
            inner.features = 0;
            self.with_atomic(dev, OFF_ISR, |isr| isr.store(0, Ordering::SeqCst));
            for q in 0..dev.queue_max.len() {
                let ready = base + (OFF_QUEUES + q * VQ_SIZE + offset_of!(LguestVqConfig, ready)) as u64;
                if let Err(e) = self.mem.write(ready, &[0, 0]) {
                    log::warn!("{}: {e}", dev.name);
                }
            }
            return;
        }
        if inner.status & VIRTIO_STATUS_DEVICE_NEEDS_RESET != 0 {
            // Nothing but a reset helps; keep the bit visible.
            self.store_status(dev, status | VIRTIO_STATUS_DEVICE_NEEDS_RESET);
            return;
        }
        if status & VIRTIO_STATUS_FAILED != 0 {
            Self::stop_queues(&mut inner);
            inner.status = status;
            return;
        }
        let newly = status & !inner.status;
        if newly & VIRTIO_STATUS_FEATURES_OK != 0 {
            let unoffered = driver_features & !dev.offered;
            if unoffered != 0 {
                dev.bad_features
                    .warn(|| format!("{}: the driver took features {unoffered:#x} that were not offered", dev.name));
                status &= !VIRTIO_STATUS_FEATURES_OK;
                self.store_status(dev, status);
            } else {
                inner.features = driver_features;
            }
        }
        inner.status = status;
        if newly & VIRTIO_STATUS_DRIVER_OK != 0 {
            if status & VIRTIO_STATUS_FEATURES_OK == 0 {
                self.fail(dev, &mut inner, &"DRIVER_OK without FEATURES_OK");
                return;
            }
            let features = inner.features;
            match self.start_queues(dev, &raw, features) {
                Ok(queues) => {
                    inner.queues = queues;
                    if let Err(e) = inner.model.activate(features) {
                        self.device_error(dev, &mut inner, &e);
                        return;
                    }
                    inner.running = true;
                    inner.start_pending = true;
                    log::info!("{}: driver ready, features {features:#x}", dev.name);
                    if let Err(e) = dev.wake.write(1) {
                        log::warn!("{}: waking its thread: {e}", dev.name);
                    }
                }
                Err(why) => self.fail(dev, &mut inner, &why),
            }
        }
    }

    /// Checks the queue configurations in `raw` and builds the queues.
    fn start_queues(&self, dev: &Device<'_>, raw: &[u8], features: u64) -> Result<Vec<Option<Queue>>, String> {
        let ram = self.mem.ram();
        let mut queues = Vec::new();
        for q in 0..LGUEST_BUS_MAX_QUEUES {
            let vq = vq_config(raw, q);
            let max = dev.queue_max.get(q).copied().unwrap_or(0);
            match vq.ready {
                0 => {
                    if q < dev.queue_max.len() {
                        queues.push(None);
                    }
                    continue;
                }
                1 if max != 0 => {}
                1 => return Err(format!("queue {q} does not exist but is ready")),
                other => return Err(format!("queue {q}: ready is {other}, not 0 or 1")),
            }
            let num = vq.num;
            if num == 0 || !num.is_power_of_two() || num > max {
                return Err(format!("queue {q}: size {num} is not a power of two in [1, {max}]"));
            }
            let n = u64::from(num);
            for (what, addr, len, align) in [
                ("descriptor table", vq.desc, 16 * n, 16),
                ("driver ring", vq.driver, 6 + 2 * n, 2),
                ("device ring", vq.device, 6 + 8 * n, 4),
            ] {
                let inside = addr != 0
                    && addr.checked_add(len).is_some()
                    // CAST: len < 1 MiB.
                    && ram.check_range(GuestAddress(addr), len as usize);
                if !inside || addr % align != 0 {
                    return Err(format!("queue {q}: {what} [{addr:#x}, +{len:#x}) is not aligned inside guest RAM"));
                }
            }
            let mut queue = Queue::new(max).map_err(|e| format!("queue {q}: {e}"))?;
            queue.try_set_size(num).map_err(|e| format!("queue {q}: {e}"))?;
            queue.try_set_desc_table_address(GuestAddress(vq.desc)).map_err(|e| format!("queue {q}: {e}"))?;
            queue.try_set_avail_ring_address(GuestAddress(vq.driver)).map_err(|e| format!("queue {q}: {e}"))?;
            queue.try_set_used_ring_address(GuestAddress(vq.device)).map_err(|e| format!("queue {q}: {e}"))?;
            queue.set_event_idx(features & VIRTIO_F_RING_EVENT_IDX != 0);
            queue.set_ready(true);
            if !queue.is_valid(ram) {
                return Err(format!("queue {q}: rings are not valid"));
            }
            queues.push(Some(queue));
        }
        Ok(queues)
    }

    /// Runs the model of device `index` once after `events` (the body of
    /// the device thread, also called by tests).
    pub fn service(&self, index: usize, mut events: Events) {
        let Some(dev) = self.devices.get(index) else { return };
        let mut inner = dev.lock();
        if inner.start_pending {
            events.start = true;
            inner.start_pending = false;
        }
        if !inner.running {
            return;
        }
        let result = {
            let Inner { model, queues, .. } = &mut *inner;
            let raise = || self.raise(dev, LGUEST_ISR_QUEUE);
            let mut qs = Queues::new(self.mem.ram(), queues, &raise, &dev.stats).with_stop(&self.stop);
            model.process(&mut qs, &events)
        };
        if let Err(e) = result {
            self.device_error(dev, &mut inner, &e);
            return;
        }
        if let Some(config) = inner.model.config_update() {
            self.change_config(dev, &config);
        }
    }

    /// Writes a running device's new configuration space (at most as long
    /// as its first, whose length the descriptor keeps) with
    /// `config_generation` bumped before and after, so that a driver
    /// reading across the change sees two generations and reads again,
    /// and raises a configuration interrupt.
    fn change_config(&self, dev: &Device<'_>, config: &[u8]) {
        let base = self.desc_addr(dev);
        let mut len = [0u8; 4];
        if self.mem.read(base + offset_of!(LguestDeviceDesc, config_len) as u64, &mut len).is_err() {
            return;
        }
        // CAST: a u32 fits usize; at most LGUEST_BUS_CONFIG_SIZE when written.
        let n = config.len().min(u32::from_le_bytes(len) as usize).min(LGUEST_BUS_CONFIG_SIZE);
        self.with_atomic(dev, OFF_GENERATION, |g| g.fetch_add(1, Ordering::SeqCst));
        if let Err(e) = self.mem.write(base + OFF_CONFIG as u64, &config[..n]) {
            log::warn!("{}: writing its configuration: {e}", dev.name);
        }
        self.with_atomic(dev, OFF_GENERATION, |g| g.fetch_add(1, Ordering::SeqCst));
        self.raise(dev, LGUEST_ISR_CONFIG);
    }

    /// The thread of device `index`: sleeps until a kick, a host fd, a
    /// timeout or [`Bus::shutdown`], and runs the model.
    pub fn run_device(&self, index: usize) {
        let Some(dev) = self.devices.get(index) else { return };
        loop {
            let (fds, timeout) = {
                let inner = dev.lock();
                if inner.running || inner.start_pending {
                    (inner.model.input_fds(), inner.model.timeout())
                } else {
                    (Vec::new(), None)
                }
            };
            let mut pfds: Vec<libc::pollfd> = std::iter::once(dev.wake.as_raw_fd())
                .chain(dev.kicks.iter().map(AsRawFd::as_raw_fd))
                .chain(fds.iter().copied())
                .map(|fd| libc::pollfd { fd, events: libc::POLLIN, revents: 0 })
                .collect();
            let ready = poll(&mut pfds, timeout);
            if self.stop.load(Ordering::SeqCst) {
                break;
            }
            let ready = match ready {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    log::error!("{}: poll: {e}; the device thread stops", dev.name);
                    break;
                }
            };
            if pfds[0].revents != 0 {
                let _ = dev.wake.read();
            }
            let mut events = Events { timeout: ready == 0, ..Events::default() };
            for (q, (kick, p)) in dev.kicks.iter().zip(&pfds[1..]).enumerate() {
                if p.revents != 0 {
                    if let Ok(n) = kick.read() {
                        events.kicked |= 1 << q;
                        dev.stats.queues[q].kicks.fetch_add(n, Ordering::Relaxed);
                    }
                }
            }
            for (i, p) in pfds[1 + dev.kicks.len()..].iter().enumerate() {
                if p.revents != 0 {
                    events.input |= 1 << i;
                }
            }
            self.service(index, events);
        }
        let mut inner = dev.lock();
        Self::stop_queues(&mut inner);
    }

    /// Makes every device thread return.
    pub fn shutdown(&self) {
        self.stop.store(true, Ordering::SeqCst);
        for d in &self.devices {
            if let Err(e) = d.wake.write(1) {
                log::warn!("{}: waking its thread: {e}", d.name);
            }
        }
    }

    /// The `--stats` report: one block per device.
    pub fn stats(&self) -> String {
        let mut out = String::new();
        for d in &self.devices {
            let inner = d.lock();
            out.push_str(&format!("{} (irq {}):\n", d.name, d.irq));
            for (q, s) in d.stats.queues.iter().enumerate().take(d.queue_max.len()) {
                out.push_str(&format!(
                    "  queue {q}: {} kicks, {} interrupts, {} chains, {} bytes\n",
                    s.kicks.load(Ordering::Relaxed),
                    s.irqs.load(Ordering::Relaxed),
                    s.chains.load(Ordering::Relaxed),
                    s.bytes.load(Ordering::Relaxed)
                ));
            }
            out.push_str(&inner.model.stats(&d.stats));
            out.push_str(&format!(
                "  driver errors: {} resets needed, {} unoffered feature sets ({} warnings suppressed)\n",
                d.failures.count(),
                d.bad_features.count(),
                d.failures.suppressed() + d.bad_features.suppressed()
            ));
        }
        out
    }

    /// The devices' counters as JSON: one object per device, with its
    /// queues' kicks, interrupts, chains and bytes, and its dropped and
    /// safety-net counts.
    pub fn stats_json(&self) -> serde_json::Value {
        let devices: Vec<serde_json::Value> = self
            .devices
            .iter()
            .map(|d| {
                let queues: Vec<serde_json::Value> = d
                    .stats
                    .queues
                    .iter()
                    .take(d.queue_max.len())
                    .map(|q| {
                        serde_json::json!({
                            "kicks": q.kicks.load(Ordering::Relaxed),
                            "interrupts": q.irqs.load(Ordering::Relaxed),
                            "chains": q.chains.load(Ordering::Relaxed),
                            "bytes": q.bytes.load(Ordering::Relaxed),
                        })
                    })
                    .collect();
                serde_json::json!({
                    "name": d.name,
                    "irq": d.irq,
                    "queues": queues,
                    "dropped": d.stats.dropped.load(Ordering::Relaxed),
                    "safety_net_interrupts": d.stats.timer_irqs.load(Ordering::Relaxed),
                    "needed_reset": d.failures.count(),
                    "unoffered_features": d.bad_features.count(),
                    "warnings_suppressed": d.failures.suppressed() + d.bad_features.suppressed(),
                })
            })
            .collect();
        serde_json::Value::Array(devices)
    }

    /// Interrupts the devices raised, in all.
    pub fn interrupts(&self) -> u64 {
        self.devices.iter().flat_map(|d| d.stats.queues.iter()).map(|q| q.irqs.load(Ordering::Relaxed)).sum()
    }

    /// The status the device in slot `index` last acknowledged (tests).
    #[cfg(test)]
    pub fn acked_status(&self, index: usize) -> u32 {
        self.devices[index].lock().status
    }

    /// Device `index`'s counters (tests).
    #[cfg(test)]
    pub fn device_stats(&self, index: usize) -> &DeviceStats {
        &self.devices[index].stats
    }

    /// Device `index`'s driver errors: (needed a reset, unoffered
    /// features) (tests).
    #[cfg(test)]
    pub fn driver_errors(&self, index: usize) -> (&GuestWarnings, &GuestWarnings) {
        (&self.devices[index].failures, &self.devices[index].bad_features)
    }
}

/// `poll(2)` on `fds` for at most `timeout` (forever if `None`).
fn poll(fds: &mut [libc::pollfd], timeout: Option<Duration>) -> io::Result<usize> {
    // CAST: clamped to i32::MAX milliseconds.
    // A zero timeout polls; any other is at least a millisecond.
    let ms = timeout.map_or(-1, |t| if t.is_zero() { 0 } else { t.as_millis().clamp(1, i32::MAX as u128) as i32 });
    // SAFETY: `fds` is a valid, exclusively borrowed array of pollfd of the
    // length given; poll writes only their `revents`.
    let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    // CAST: non-negative.
    Ok(n as usize)
}
