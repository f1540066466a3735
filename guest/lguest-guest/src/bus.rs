// SPDX-License-Identifier: GPL-2.0
//! The lguest bus (feature `virtio`): the device table the launcher puts
//! right above RAM, and a virtio-drivers [`Transport`] for each device on it.
//!
//! The ABI is `abi/src/bus.rs`. In short: the device window starts at
//! guest-physical = RAM size; its first page holds up to eight 512-byte
//! descriptors ([`LguestDeviceDesc`]), ended by one whose `device_type` is
//! 0. The guest runs on the host's initial linear map, where
//! guest-virtual = guest-physical for RAM and for the device window, so a
//! descriptor is read and written in place (volatile: the device changes
//! it) and every DMA address is the buffer's own address.
//!
//! - Status, feature and queue changes are written into the descriptor,
//!   then `LHCALL_NOTIFY(descriptor address)`; the launcher handles that
//!   before the hypercall returns, so reading the descriptor again shows
//!   its answer. [`LguestTransport`] notifies on every status write (the
//!   device acts on features at `FEATURES_OK` and on queues at
//!   `DRIVER_OK`, so those need no notification of their own).
//! - A kick of queue `q` is `LHCALL_NOTIFY(address of its LguestVqConfig)`.
//! - Each device has one interrupt line. [`LguestTransport::enable_irq`]
//!   puts the bus's handler on it: the handler swaps `isr` to 0 (the device
//!   sets bits in it atomically before raising the line) and keeps the bits
//!   for [`Transport::ack_interrupt`], which returns them together with
//!   whatever is in `isr` by then. Interrupts taken are counted per device.
//! - [`wait_until`] halts (`LHCALL_HALT`, no CPU used) until a condition
//!   holds, so a driver waits for its device's interrupt instead of
//!   spinning.
//!
//! ```ignore
//! bus::init()?;
//! let info = bus::find(bus::VIRTIO_ID_BLOCK).ok_or("no disk")?;
//! let transport = LguestTransport::new(info)?;
//! transport.enable_irq()?;
//! let blk = VirtIOBlk::<LguestHal, _>::new(transport)?;
//! ```

use alloc::vec::Vec;
use core::fmt;
use core::ptr::addr_of_mut;
use core::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, Ordering};

use lguest_abi::bus::{
    LguestBus, LguestDeviceDesc, LGUEST_BUS_CONFIG_SIZE, LGUEST_BUS_DESC_SIZE, LGUEST_BUS_MAX_DEVICES,
    LGUEST_BUS_MAX_QUEUES,
};
use lguest_abi::{LGUEST_IRQS, LHCALL_NOTIFY};
pub use lguest_virtio::SlotInfo;
use virtio_drivers::transport::{DeviceStatus, DeviceType, InterruptStatus, Transport};
use virtio_drivers::{Error as VirtioError, PhysAddr};
use zerocopy::{FromBytes, Immutable, IntoBytes};

use crate::hcall::hcall;
use crate::interrupts::{self, TrapFrame};
use crate::{clock, paravirt, start};

/// virtio device ID of a network card.
pub const VIRTIO_ID_NET: u32 = 1;
/// virtio device ID of a block device.
pub const VIRTIO_ID_BLOCK: u32 = 2;
/// virtio device ID of a console.
pub const VIRTIO_ID_CONSOLE: u32 = 3;
/// virtio device ID of an entropy source.
pub const VIRTIO_ID_RNG: u32 = 4;

/// The bus of this guest: its device table is at guest-physical RAM size.
pub fn bus() -> LguestBus {
    LguestBus::new(start::ram_size())
}

/// The descriptor of slot `index`, where the initial linear map has it.
fn desc_ptr(index: usize) -> *mut LguestDeviceDesc {
    bus().desc_addr(index) as *mut LguestDeviceDesc
}

/// Sets up what the bus's waiting needs: the clock's IRQ 0 handler (see
/// [`wait_until`]) and the interrupt table ([`interrupts::install`]).
/// Interrupts stay as they are.
pub fn init() -> Result<(), interrupts::Error> {
    clock::init()
}

/// The devices on the bus, in slot order, read from a copy of the device
/// table (volatile, byte by byte: the launcher owns the page).
pub fn devices() -> Vec<SlotInfo> {
    let mut page = [0u8; LGUEST_BUS_DESC_SIZE * LGUEST_BUS_MAX_DEVICES];
    let base = bus().base;
    for (i, b) in page.iter_mut().enumerate() {
        // SAFETY: the device table is the first page of the device window,
        // at guest-physical (= virtual) `ram_size`, mapped readable by the
        // host's initial linear map; reading it has no side effects.
        *b = unsafe { ((base + i as u64) as *const u8).read_volatile() };
    }
    lguest_virtio::parse_table(&page).collect()
}

/// The first device of type `device_type` (a `VIRTIO_ID_*`) that keeps to
/// the ABI.
pub fn find(device_type: u32) -> Option<SlotInfo> {
    devices().into_iter().find(|d| d.device_type == device_type && d.problem.is_none())
}

/// The name of a virtio device ID.
pub fn device_name(device_type: u32) -> &'static str {
    match device_type {
        VIRTIO_ID_NET => "net",
        VIRTIO_ID_BLOCK => "block",
        VIRTIO_ID_CONSOLE => "console",
        VIRTIO_ID_RNG => "rng",
        _ => "unknown",
    }
}

/// Why a device cannot be driven.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BusError {
    /// The slot breaks the ABI (the reason).
    Invalid(&'static str),
    /// A device ID virtio-drivers does not know.
    UnknownType(u32),
    /// Its interrupt handler could not be installed.
    Irq(interrupts::Error),
    /// The device refused the features the driver took (`FEATURES_OK`
    /// read back clear).
    FeaturesRefused,
    /// The driver failed (virtio-drivers' error).
    Virtio(VirtioError),
}

impl fmt::Display for BusError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BusError::Invalid(why) => write!(f, "invalid device slot: {why}"),
            BusError::UnknownType(t) => write!(f, "unknown virtio device type {t}"),
            BusError::Irq(e) => write!(f, "interrupt: {e}"),
            BusError::FeaturesRefused => write!(f, "the device refused the driver's features"),
            BusError::Virtio(e) => write!(f, "virtio: {e}"),
        }
    }
}

impl From<VirtioError> for BusError {
    fn from(e: VirtioError) -> Self {
        BusError::Virtio(e)
    }
}

impl From<interrupts::Error> for BusError {
    fn from(e: interrupts::Error) -> Self {
        BusError::Irq(e)
    }
}

/// For each IRQ line, the slots (bit `i` = slot `i`) whose handler is on it.
static IRQ_SLOTS: [AtomicU8; LGUEST_IRQS] = [const { AtomicU8::new(0) }; LGUEST_IRQS];
/// Per slot: `isr` bits the handler took and [`Transport::ack_interrupt`]
/// has not returned yet.
static PENDING: [AtomicU32; LGUEST_BUS_MAX_DEVICES] = [const { AtomicU32::new(0) }; LGUEST_BUS_MAX_DEVICES];
/// Per slot: interrupts taken.
static SLOT_IRQS: [AtomicU64; LGUEST_BUS_MAX_DEVICES] = [const { AtomicU64::new(0) }; LGUEST_BUS_MAX_DEVICES];
/// Per slot: queue kicks (`LHCALL_NOTIFY` of a queue).
static SLOT_KICKS: [AtomicU64; LGUEST_BUS_MAX_DEVICES] = [const { AtomicU64::new(0) }; LGUEST_BUS_MAX_DEVICES];

/// Device interrupts taken by slot `index` since boot.
pub fn interrupts_taken(index: usize) -> u64 {
    SLOT_IRQS.get(index).map_or(0, |c| c.load(Ordering::Relaxed))
}

/// Queue kicks of slot `index` since boot.
pub fn kicks(index: usize) -> u64 {
    SLOT_KICKS.get(index).map_or(0, |c| c.load(Ordering::Relaxed))
}

/// `isr` of slot `index`, as an atomic (the device sets bits in it with
/// atomic operations too).
fn isr(index: usize) -> &'static AtomicU32 {
    // SAFETY: the descriptor is in the device window, mapped for the
    // guest's whole life; `isr` is a naturally aligned u32 (offset 32 of a
    // 512-byte aligned slot) that the device and the guest only access
    // atomically, so sharing it as an `AtomicU32` is sound.
    unsafe { AtomicU32::from_ptr(addr_of_mut!((*desc_ptr(index)).isr)) }
}

/// The bus's handler of every device interrupt line.
fn bus_irq(frame: &mut TrapFrame) {
    let Some(irq) = frame.irq() else { return };
    let mut slots = IRQ_SLOTS[usize::from(irq)].load(Ordering::Acquire);
    while slots != 0 {
        let index = slots.trailing_zeros() as usize;
        slots &= slots - 1;
        let bits = isr(index).swap(0, Ordering::AcqRel);
        PENDING[index].fetch_or(bits, Ordering::AcqRel);
        SLOT_IRQS[index].fetch_add(1, Ordering::Relaxed);
    }
}

/// Halts until `cond()` holds: loop { interrupts off; check; `halt()` },
/// so an interrupt between the check and the halt is not lost (the host
/// sees it pending and does not sleep); the caller's interrupt flag comes
/// back at the end. Each halt also arms the clock event 100 ms ahead, as a
/// safety net should a device's interrupt never come (this replaces any
/// event the caller armed). `cond` runs with interrupts off.
pub fn wait_until(mut cond: impl FnMut() -> bool) {
    let flags = paravirt::save_fl();
    loop {
        paravirt::irq_disable();
        if cond() {
            break;
        }
        clock::set_event(100_000_000);
        paravirt::halt();
    }
    paravirt::restore_fl(flags);
}

/// The addresses a driver gave for one queue ([`Transport::queue_set`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QueueAreas {
    /// Its size.
    pub size: u16,
    /// Guest-physical address of the descriptor table.
    pub desc: u64,
    /// Guest-physical address of the available ring.
    pub driver: u64,
    /// Guest-physical address of the used ring.
    pub device: u64,
}

/// Kicks one queue; `Copy`, so that the parts of a driver can each hold one.
#[derive(Clone, Copy, Debug)]
pub struct Kicker {
    index: usize,
    addr: u64,
}

impl Kicker {
    /// `LHCALL_NOTIFY(address of the queue's LguestVqConfig)`.
    pub fn kick(&self) {
        SLOT_KICKS[self.index].fetch_add(1, Ordering::Relaxed);
        // SAFETY: the address is the queue's configuration in the device
        // window: the launcher (or the eventfd it bound) takes it as a kick
        // and writes no guest memory because of it.
        unsafe {
            hcall(LHCALL_NOTIFY, self.addr, 0, 0, 0);
        }
    }
}

/// A device on the lguest bus, as a virtio-drivers [`Transport`].
#[derive(Debug)]
pub struct LguestTransport {
    info: SlotInfo,
    device_type: DeviceType,
    desc: *mut LguestDeviceDesc,
    queues: [QueueAreas; LGUEST_BUS_MAX_QUEUES],
}

// SAFETY: the descriptor pointer refers to the device window, which is
// mapped for the guest's whole life; the transport is its only user on the
// guest's one vCPU (besides the interrupt handler, which only touches `isr`
// atomically).
unsafe impl Send for LguestTransport {}
// SAFETY: as above; `&LguestTransport` only reads the descriptor.
unsafe impl Sync for LguestTransport {}

/// Volatile read of a descriptor field.
macro_rules! rd {
    ($self:ident . $field:ident) => {
        // SAFETY: `desc` points at this device's slot in the device window,
        // mapped for the guest's whole life; the field is aligned.
        unsafe { addr_of_mut!((*$self.desc).$field).read_volatile() }
    };
}

/// Volatile write of a descriptor field.
macro_rules! wr {
    ($self:ident . $field:ident, $value:expr) => {
        // SAFETY: as in `rd!`; the driver owns the fields it writes.
        unsafe { addr_of_mut!((*$self.desc).$field).write_volatile($value) }
    };
}

impl LguestTransport {
    /// The transport of the device `info` (from [`devices`] or [`find`]).
    pub fn new(info: SlotInfo) -> Result<Self, BusError> {
        if let Some(why) = info.problem {
            return Err(BusError::Invalid(why));
        }
        if info.index >= LGUEST_BUS_MAX_DEVICES {
            return Err(BusError::Invalid("no such slot"));
        }
        let device_type =
            DeviceType::try_from(info.device_type).map_err(|_| BusError::UnknownType(info.device_type))?;
        Ok(Self {
            info,
            device_type,
            desc: desc_ptr(info.index),
            queues: [QueueAreas::default(); LGUEST_BUS_MAX_QUEUES],
        })
    }

    /// What the device table said about the device.
    pub fn info(&self) -> &SlotInfo {
        &self.info
    }

    /// The device's interrupt line.
    pub fn irq(&self) -> u8 {
        self.info.irq as u8
    }

    /// Puts the bus's interrupt handler on the device's line and unblocks
    /// it (the interrupt table must be installed: [`init`]).
    pub fn enable_irq(&self) -> Result<(), interrupts::Error> {
        IRQ_SLOTS[usize::from(self.irq())].fetch_or(1 << self.info.index, Ordering::AcqRel);
        interrupts::set_irq_handler(self.irq(), bus_irq)
    }

    /// Device interrupts taken so far.
    pub fn interrupts_taken(&self) -> u64 {
        interrupts_taken(self.info.index)
    }

    /// Queue kicks so far.
    pub fn kicks(&self) -> u64 {
        kicks(self.info.index)
    }

    /// Where queue `queue` is, once set up.
    pub fn queue_areas(&self, queue: u16) -> Option<QueueAreas> {
        self.queues.get(usize::from(queue)).copied().filter(|q| q.size != 0)
    }

    /// A kicker for queue `queue`.
    pub fn kicker(&self, queue: u16) -> Kicker {
        Kicker { index: self.info.index, addr: bus().vq_addr(self.info.index, usize::from(queue)) }
    }

    /// Whether the device still has `FEATURES_OK` (it clears it when the
    /// driver took a feature it did not offer).
    pub fn features_ok(&self) -> bool {
        self.get_status().contains(DeviceStatus::FEATURES_OK)
    }

    /// Whether the device wants a reset (`DEVICE_NEEDS_RESET`).
    pub fn needs_reset(&self) -> bool {
        self.get_status().contains(DeviceStatus::DEVICE_NEEDS_RESET)
    }

    /// `LHCALL_NOTIFY(descriptor address)`: the device looks at what changed.
    fn notify_desc(&self) {
        // SAFETY: the address is this device's descriptor in the device
        // window; the launcher reads it and answers in it, writing no other
        // guest memory.
        unsafe {
            hcall(LHCALL_NOTIFY, bus().desc_addr(self.info.index), 0, 0, 0);
        }
    }

    /// Checks that `offset..offset + len` is inside the configuration space.
    fn config_range(&self, offset: usize, len: usize) -> Result<(), VirtioError> {
        let config_len = (rd!(self.config_len) as usize).min(LGUEST_BUS_CONFIG_SIZE);
        if config_len == 0 {
            return Err(VirtioError::ConfigSpaceMissing);
        }
        match offset.checked_add(len) {
            Some(end) if end <= config_len => Ok(()),
            _ => Err(VirtioError::ConfigSpaceTooSmall),
        }
    }

    /// Address of byte `i` of the configuration space.
    fn config_byte(&self, i: usize) -> *mut u8 {
        // SAFETY: `config` is inside the descriptor; only the address is
        // computed here.
        unsafe { addr_of_mut!((*self.desc).config).cast::<u8>().add(i) }
    }
}

impl Transport for LguestTransport {
    fn device_type(&self) -> DeviceType {
        self.device_type
    }

    fn read_device_features(&mut self) -> u64 {
        rd!(self.device_features)
    }

    fn write_driver_features(&mut self, driver_features: u64) {
        wr!(self.driver_features, driver_features);
    }

    fn max_queue_size(&mut self, queue: u16) -> u32 {
        if u32::from(queue) >= rd!(self.num_queues) || usize::from(queue) >= LGUEST_BUS_MAX_QUEUES {
            return 0;
        }
        // SAFETY: `queue` is below LGUEST_BUS_MAX_QUEUES, so the element is
        // inside the descriptor (see `rd!`).
        u32::from(unsafe { addr_of_mut!((*self.desc).queues[usize::from(queue)].num_max).read_volatile() })
    }

    fn notify(&mut self, queue: u16) {
        self.kicker(queue).kick();
    }

    fn get_status(&self) -> DeviceStatus {
        DeviceStatus::from_bits_truncate(rd!(self.status))
    }

    fn set_status(&mut self, status: DeviceStatus) {
        wr!(self.status, status.bits());
        self.notify_desc();
    }

    fn set_guest_page_size(&mut self, _guest_page_size: u32) {}

    fn requires_legacy_layout(&self) -> bool {
        false
    }

    fn queue_set(
        &mut self,
        queue: u16,
        size: u32,
        descriptors: PhysAddr,
        driver_area: PhysAddr,
        device_area: PhysAddr,
    ) {
        let q = usize::from(queue);
        assert!(q < LGUEST_BUS_MAX_QUEUES, "lguest bus: no queue {q}");
        let size = size as u16;
        // SAFETY: `q` is a valid queue index, so every field is inside the
        // descriptor (see `wr!`); the device reads them at DRIVER_OK.
        unsafe {
            let vq = addr_of_mut!((*self.desc).queues[q]);
            addr_of_mut!((*vq).num).write_volatile(size);
            addr_of_mut!((*vq).desc).write_volatile(descriptors);
            addr_of_mut!((*vq).driver).write_volatile(driver_area);
            addr_of_mut!((*vq).device).write_volatile(device_area);
            addr_of_mut!((*vq).ready).write_volatile(1);
        }
        self.queues[q] = QueueAreas { size, desc: descriptors, driver: driver_area, device: device_area };
    }

    fn queue_unset(&mut self, queue: u16) {
        let q = usize::from(queue);
        if q >= LGUEST_BUS_MAX_QUEUES {
            return;
        }
        // SAFETY: as in `queue_set`.
        unsafe {
            let vq = addr_of_mut!((*self.desc).queues[q]);
            addr_of_mut!((*vq).ready).write_volatile(0);
            addr_of_mut!((*vq).num).write_volatile(0);
            addr_of_mut!((*vq).desc).write_volatile(0);
            addr_of_mut!((*vq).driver).write_volatile(0);
            addr_of_mut!((*vq).device).write_volatile(0);
        }
        self.queues[q] = QueueAreas::default();
    }

    fn queue_used(&mut self, queue: u16) -> bool {
        let q = usize::from(queue);
        // SAFETY: as in `queue_set`, for a valid `q`.
        q < LGUEST_BUS_MAX_QUEUES && unsafe { addr_of_mut!((*self.desc).queues[q].ready).read_volatile() } != 0
    }

    fn ack_interrupt(&mut self) -> InterruptStatus {
        let bits = isr(self.info.index).swap(0, Ordering::AcqRel) | PENDING[self.info.index].swap(0, Ordering::AcqRel);
        InterruptStatus::from_bits_truncate(bits)
    }

    fn read_config_generation(&self) -> u32 {
        rd!(self.config_generation)
    }

    fn read_config_space<T: FromBytes + IntoBytes>(&self, offset: usize) -> Result<T, VirtioError> {
        let mut value = T::new_zeroed();
        let bytes = value.as_mut_bytes();
        self.config_range(offset, bytes.len())?;
        for (i, b) in bytes.iter_mut().enumerate() {
            // SAFETY: `config_range` checked that the byte is inside the
            // configuration space of the descriptor (see `rd!`).
            *b = unsafe { self.config_byte(offset + i).read_volatile() };
        }
        Ok(value)
    }

    fn write_config_space<T: IntoBytes + Immutable>(&mut self, offset: usize, value: T) -> Result<(), VirtioError> {
        let bytes = value.as_bytes();
        self.config_range(offset, bytes.len())?;
        for (i, &b) in bytes.iter().enumerate() {
            // SAFETY: as in `read_config_space`.
            unsafe { self.config_byte(offset + i).write_volatile(b) };
        }
        Ok(())
    }
}

impl Drop for LguestTransport {
    /// Resets the device, so that it stops using memory the driver is
    /// about to free.
    fn drop(&mut self) {
        self.set_status(DeviceStatus::empty());
        IRQ_SLOTS[usize::from(self.irq())].fetch_and(!(1 << self.info.index), Ordering::AcqRel);
    }
}
