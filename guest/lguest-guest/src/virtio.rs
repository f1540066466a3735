// SPDX-License-Identifier: GPL-2.0
//! virtio drivers on the lguest bus (feature `virtio`): the
//! [`Hal`](virtio_drivers::Hal) of this guest and helpers that open each
//! kind of device on [`crate::bus`].
//!
//! - [`LguestHal`]: the guest runs on the identity map, so a buffer's
//!   guest-physical address is its address; DMA memory comes from the heap
//!   ([`crate::heap`]), page aligned and zeroed.
//! - [`console`], [`rng`]: virtio-drivers' `VirtIOConsole` and `VirtIORng`;
//!   [`Rng`]: an entropy driver of our own that halts while it waits.
//! - [`Blk`]: `VirtIOBlk`, with reads and writes that halt until the
//!   device's interrupt instead of spinning.
//! - [`net`](crate::net) (feature `net`): a driver of our own.
//!
//! virtio-drivers' console output, `VirtIORng` requests and the block
//! device's flush still wait for the device by spinning (their helpers
//! do); they are short.

use alloc::alloc::{alloc_zeroed, dealloc, Layout};
use alloc::boxed::Box;
use core::ptr::NonNull;

use virtio_drivers::device::blk::{BlkReq, BlkResp, VirtIOBlk, SECTOR_SIZE};
use virtio_drivers::device::console::VirtIOConsole;
use virtio_drivers::device::rng::VirtIORng;
use virtio_drivers::queue::VirtQueue;
use virtio_drivers::transport::{DeviceStatus, Transport};
use virtio_drivers::{BufferDirection, Hal, PhysAddr, PAGE_SIZE};

use crate::bus::{self, BusError, LguestTransport, SlotInfo};
use crate::virt_to_phys;

/// The [`Hal`] of an lguest guest on its initial identity map.
#[derive(Clone, Copy, Debug, Default)]
pub struct LguestHal;

/// The layout of `pages` DMA pages.
fn dma_layout(pages: usize) -> Option<Layout> {
    Layout::from_size_align(pages.checked_mul(PAGE_SIZE)?, PAGE_SIZE).ok()
}

// SAFETY: `dma_alloc` returns zeroed, page-aligned memory of the size asked
// for, which nothing else uses until `dma_dealloc`; physical = virtual for
// all of RAM, so the addresses handed to the device are the buffers' own;
// the device window needs no mapping (`mmio_phys_to_virt` is the identity).
unsafe impl Hal for LguestHal {
    fn dma_alloc(pages: usize, _direction: BufferDirection) -> (PhysAddr, NonNull<u8>) {
        let Some(layout) = dma_layout(pages).filter(|l| l.size() != 0) else {
            return (0, NonNull::dangling());
        };
        // SAFETY: the layout has a non-zero size.
        let p = unsafe { alloc_zeroed(layout) };
        match NonNull::new(p) {
            Some(p) => (virt_to_phys(p.as_ptr()), p),
            None => (0, NonNull::dangling()),
        }
    }

    unsafe fn dma_dealloc(_paddr: PhysAddr, vaddr: NonNull<u8>, pages: usize) -> i32 {
        let Some(layout) = dma_layout(pages) else { return -1 };
        // SAFETY: the caller passes back what `dma_alloc` returned for
        // `pages` pages, and no longer uses it.
        unsafe { dealloc(vaddr.as_ptr(), layout) };
        0
    }

    unsafe fn mmio_phys_to_virt(paddr: PhysAddr, _size: usize) -> NonNull<u8> {
        NonNull::new(paddr as *mut u8).expect("lguest: MMIO at physical 0")
    }

    unsafe fn share(buffer: NonNull<[u8]>, _direction: BufferDirection) -> PhysAddr {
        virt_to_phys(buffer.as_ptr().cast::<u8>())
    }

    unsafe fn unshare(_paddr: PhysAddr, _buffer: NonNull<[u8]>, _direction: BufferDirection) {}
}

/// The transport of the first usable device of type `device_type`, with
/// its interrupt line hooked up.
pub fn open(device_type: u32) -> Result<Option<LguestTransport>, BusError> {
    let Some(info) = bus::find(device_type) else { return Ok(None) };
    open_slot(info).map(Some)
}

/// The transport of device `info`, with its interrupt line hooked up
/// (after [`bus::init`], which this calls: without the interrupt table the
/// line would stay blocked).
pub fn open_slot(info: SlotInfo) -> Result<LguestTransport, BusError> {
    bus::init()?;
    let t = LguestTransport::new(info)?;
    t.enable_irq()?;
    Ok(t)
}

/// The virtio console, if there is one.
pub fn console() -> Result<Option<VirtIOConsole<LguestHal, LguestTransport>>, BusError> {
    match open(bus::VIRTIO_ID_CONSOLE)? {
        Some(t) => Ok(Some(VirtIOConsole::new(t)?)),
        None => Ok(None),
    }
}

/// The entropy source as virtio-drivers' `VirtIORng`, if there is one
/// (whose requests spin until the device answers; [`Rng`] halts instead).
pub fn rng() -> Result<Option<VirtIORng<LguestHal, LguestTransport>>, BusError> {
    match open(bus::VIRTIO_ID_RNG)? {
        Some(t) => Ok(Some(VirtIORng::new(t)?)),
        None => Ok(None),
    }
}

/// `VIRTIO_RING_F_EVENT_IDX`.
pub const F_RING_EVENT_IDX: u64 = 1 << 29;
/// `VIRTIO_F_VERSION_1`.
pub const F_VERSION_1: u64 = 1 << 32;

/// Feature negotiation (virtio 1.2 §3.1.1 steps 1-6): reset, ACKNOWLEDGE
/// and DRIVER, the offered features that are also in `wanted`,
/// FEATURES_OK, and a check that the device kept it. Returns the features
/// taken; the driver then sets up its queues and calls `finish_init`.
pub fn negotiate(t: &mut LguestTransport, wanted: u64) -> Result<u64, BusError> {
    t.set_status(DeviceStatus::empty());
    t.set_status(DeviceStatus::ACKNOWLEDGE | DeviceStatus::DRIVER);
    let features = t.read_device_features() & wanted;
    t.write_driver_features(features);
    t.set_status(DeviceStatus::ACKNOWLEDGE | DeviceStatus::DRIVER | DeviceStatus::FEATURES_OK);
    if !t.features_ok() {
        t.set_status(DeviceStatus::FAILED);
        return Err(BusError::FeaturesRefused);
    }
    Ok(features)
}

/// An entropy source whose requests halt until the device's interrupt
/// (a driver of our own on [`VirtQueue`]: virtio-drivers' `VirtIORng`
/// spins).
pub struct Rng {
    transport: LguestTransport,
    q: Box<VirtQueue<LguestHal, 8>>,
}

impl Rng {
    /// The first entropy source, if there is one.
    pub fn open() -> Result<Option<Self>, BusError> {
        let Some(mut t) = open(bus::VIRTIO_ID_RNG)? else { return Ok(None) };
        let features = negotiate(&mut t, F_RING_EVENT_IDX | F_VERSION_1)?;
        let q = Box::new(VirtQueue::new(&mut t, 0, false, features & F_RING_EVENT_IDX != 0)?);
        t.finish_init();
        Ok(Some(Self { transport: t, q }))
    }

    /// Fills (part of) `buf` with random bytes; returns how many.
    pub fn fill(&mut self, buf: &mut [u8]) -> Result<usize, virtio_drivers::Error> {
        if buf.is_empty() {
            return Ok(0);
        }
        // SAFETY: `buf` stays borrowed, untouched, until `pop_used` below
        // returns it: we wait for the device in between.
        let token = unsafe { self.q.add(&[], &mut [&mut *buf])? };
        if self.q.should_notify() {
            self.transport.notify(0);
        }
        let q = &self.q;
        bus::wait_until(|| q.can_pop());
        self.transport.ack_interrupt();
        // SAFETY: the same buffer as was added under `token`.
        let len = unsafe { self.q.pop_used(token, &[], &mut [buf])? };
        Ok(len as usize)
    }

    /// The transport (for its counters).
    pub fn transport(&self) -> &LguestTransport {
        &self.transport
    }
}

/// A block device: virtio-drivers' `VirtIOBlk` with reads and writes that
/// wait for the device's interrupt (halting) rather than spinning.
pub struct Blk {
    dev: VirtIOBlk<LguestHal, LguestTransport>,
    slot: usize,
}

impl Blk {
    /// The first block device, if there is one.
    pub fn open() -> Result<Option<Self>, BusError> {
        let Some(t) = open(bus::VIRTIO_ID_BLOCK)? else { return Ok(None) };
        let slot = t.info().index;
        Ok(Some(Self { dev: VirtIOBlk::new(t)?, slot }))
    }

    /// Bytes per sector.
    pub const SECTOR: usize = SECTOR_SIZE;

    /// Sectors of the disk.
    pub fn capacity(&self) -> u64 {
        self.dev.capacity()
    }

    /// Whether the device is read-only (`VIRTIO_BLK_F_RO`).
    pub fn readonly(&self) -> bool {
        self.dev.readonly()
    }

    /// The device's slot on the bus.
    pub fn slot(&self) -> usize {
        self.slot
    }

    /// The driver underneath.
    pub fn inner(&mut self) -> &mut VirtIOBlk<LguestHal, LguestTransport> {
        &mut self.dev
    }

    /// Waits (halting) until request `token` is used.
    fn wait(&mut self, token: u16) {
        let dev = &mut self.dev;
        bus::wait_until(|| dev.peek_used() == Some(token));
        // The interrupt (if any) only said "used"; clear what it left.
        dev.ack_interrupt();
    }

    /// Reads sectors from `sector` into `buf` (a multiple of 512 bytes).
    pub fn read(&mut self, sector: u64, buf: &mut [u8]) -> Result<(), virtio_drivers::Error> {
        let mut req = BlkReq::default();
        let mut resp = BlkResp::default();
        // SAFETY: `req`, `buf` and `resp` stay borrowed here, untouched,
        // until the request is complete (`wait`), and are then passed to
        // `complete_read_blocks` unchanged.
        unsafe {
            let token = self.dev.read_blocks_nb(sector as usize, &mut req, buf, &mut resp)?;
            self.wait(token);
            self.dev.complete_read_blocks(token, &req, buf, &mut resp)
        }
    }

    /// Writes `buf` (a multiple of 512 bytes) to the sectors from `sector`.
    /// A read-only device answers with an error.
    pub fn write(&mut self, sector: u64, buf: &[u8]) -> Result<(), virtio_drivers::Error> {
        let mut req = BlkReq::default();
        let mut resp = BlkResp::default();
        // SAFETY: as in `read`.
        unsafe {
            let token = self.dev.write_blocks_nb(sector as usize, &mut req, buf, &mut resp)?;
            self.wait(token);
            self.dev.complete_write_blocks(token, &req, buf, &mut resp)
        }
    }

    /// Flushes the device's write cache (if it has `VIRTIO_BLK_F_FLUSH`;
    /// otherwise there is nothing to do).
    pub fn flush(&mut self) -> Result<(), virtio_drivers::Error> {
        self.dev.flush()
    }
}
