// SPDX-License-Identifier: GPL-2.0
//! A virtio-net driver of our own (feature `net`), on virtio-drivers'
//! public [`VirtQueue`], exposed to smoltcp as a [`phy::Device`].
//!
//! Why not `VirtIONet`: it negotiates no offloads and its `send` waits for
//! each packet. This one
//!
//! - negotiates `CSUM`, `GUEST_CSUM`, `HOST_TSO4`, `MAC`, `STATUS`,
//!   `RING_EVENT_IDX` and `VERSION_1` (whatever of them the device offers),
//!   with the 12-byte `virtio_net_hdr_v1` in front of every frame;
//! - keeps the whole receive ring full of buffers and as many transmit
//!   buffers in flight as the ring holds, each packet one descriptor;
//! - reclaims transmit buffers lazily, when it runs out; [`transmit`]
//!   returns `None` when the ring is full, so smoltcp holds back instead
//!   of dropping;
//! - batches kicks: queued buffers are announced by [`VirtioNet::flush`]
//!   (and every [`KICK_BATCH`] packets), with the wrap-safe event-index
//!   test ([`lguest_virtio::need_event`]) against the device's
//!   `avail_event`;
//! - keeps the device's interrupts off while the guest is busy, and arms
//!   them only before it halts ([`VirtioNet::arm`], NAPI-like): with
//!   `EVENT_IDX` that is one write of `used_event` per queue;
//! - or, after [`VirtioNet::set_irq_driven`], works as Linux's driver does:
//!   interrupts stay armed, frames are received and transmit buffers
//!   reclaimed only in a "NAPI poll" that the device's interrupt asked for
//!   ([`VirtioNet::napi_poll`], [`VirtioNet::napi_complete`]).
//!
//! Transmit offload: with `CSUM` smoltcp leaves TCP checksums alone
//! (`Checksum::Rx`) and the driver writes the pseudo-header sum and
//! `NEEDS_CSUM`; with `HOST_TSO4` smoltcp hands over TCP segments up to 64
//! KiB with their MSS in `PacketMeta`, which become `GSO_TCPV4` packets.
//! Receive: with `GUEST_CSUM` the device may pass a frame with a partial
//! checksum (`NEEDS_CSUM`), which the driver finishes before smoltcp
//! checks it.
//!
//! [`transmit`]: phy::Device::transmit

use alloc::boxed::Box;
use alloc::vec;
use alloc::vec::Vec;
use core::num::NonZeroUsize;
use core::sync::atomic::{fence, Ordering};

use lguest_virtio::checksum::{complete_partial, prepare_tcp_offload, TCP_CSUM_OFFSET};
use lguest_virtio::net_features as nf;
use lguest_virtio::{need_event, ring, NetHdr};
use smoltcp::phy::{self, Checksum, ChecksumCapabilities, DeviceCapabilities, Medium, PacketMeta};
use smoltcp::time::Instant;
use virtio_drivers::queue::VirtQueue;
use virtio_drivers::transport::Transport;

use crate::bus::{self, BusError, Kicker, LguestTransport, QueueAreas};
use crate::virtio::LguestHal;

/// The receive queue's index.
const RX: u16 = 0;
/// The transmit queue's index.
const TX: u16 = 1;
/// Bytes of the largest Ethernet frame without TSO (1500 + 14).
pub const ETH_FRAME_MAX: usize = 1514;
/// Bytes of the largest frame handed over with TSO: a 64 KiB IP packet and
/// its Ethernet header.
pub const TSO_FRAME_MAX: usize = 14 + 65535;
/// Bytes of a receive buffer: header and a full frame, rounded up.
const RX_BUF: usize = 1536;
/// Transmit buffers when segmentation is offloaded (each a 64 KiB frame).
const TSO_TX_BUFS: usize = 64;
/// Packets queued before the driver announces them without waiting for
/// [`VirtioNet::flush`].
pub const KICK_BATCH: u16 = 32;
/// Features the driver takes, of those offered.
pub const DRIVER_FEATURES: u64 =
    nf::CSUM | nf::GUEST_CSUM | nf::MAC | nf::HOST_TSO4 | nf::STATUS | nf::RING_EVENT_IDX | nf::VERSION_1;

/// Counters of the driver.
#[derive(Clone, Copy, Debug, Default)]
pub struct NetStats {
    /// Frames received.
    pub rx_packets: u64,
    /// Bytes received (frames, without the virtio header).
    pub rx_bytes: u64,
    /// Received frames whose partial checksum the driver finished.
    pub rx_csum_completed: u64,
    /// Packets handed to the device (a TSO packet counts once).
    pub tx_packets: u64,
    /// Bytes handed to the device (frames, without the virtio header).
    pub tx_bytes: u64,
    /// Of those, packets the device segments (TSO).
    pub tx_gso_packets: u64,
    /// Times `transmit` found the ring full.
    pub tx_ring_full: u64,
    /// Frames dropped (no buffer when the stack insisted on sending).
    pub tx_dropped: u64,
}

/// The ring arithmetic the driver does itself, beside virtio-drivers' own:
/// where `used_event` and `avail_event` are, and how far it has popped.
struct RingState {
    areas: QueueAreas,
    size: usize,
    event_idx: bool,
    /// Buffers added (our copy of `avail.idx`).
    added: u16,
    /// `added` when the device was last told (or found not to need it).
    announced: u16,
    /// Buffers popped (virtio-drivers' `last_used_idx`).
    popped: u16,
    kicker: Kicker,
    /// `DRIVER_OK` is set: the device may be notified.
    started: bool,
}

impl RingState {
    fn new(t: &LguestTransport, queue: u16, size: usize, event_idx: bool) -> Self {
        let areas = t.queue_areas(queue).unwrap_or_default();
        Self { areas, size, event_idx, added: 0, announced: 0, popped: 0, kicker: t.kicker(queue), started: false }
    }

    fn used_event(&self) -> *mut u16 {
        (self.areas.driver + ring::used_event_offset(self.size) as u64) as *mut u16
    }

    fn avail_event(&self) -> *const u16 {
        (self.areas.device + ring::avail_event_offset(self.size) as u64) as *const u16
    }

    fn used_idx(&self) -> u16 {
        // SAFETY: the used ring is DMA memory of the queue, which lives as
        // long as the driver; `idx` is an aligned u16 the device writes.
        unsafe { ((self.areas.device + ring::IDX_OFFSET as u64) as *const u16).read_volatile() }
    }

    fn used_flags(&self) -> u16 {
        // SAFETY: as in `used_idx`; `flags` is the first u16 of the ring.
        unsafe { (self.areas.device as *const u16).read_volatile() }
    }

    /// Used entries not popped yet.
    fn pending(&self) -> u16 {
        self.used_idx().wrapping_sub(self.popped)
    }

    /// Asks for an interrupt once `count` (>= 1) more buffers are used.
    fn arm(&self, count: u16) {
        if self.event_idx {
            let event = lguest_virtio::arm_used_event(self.popped, count);
            // SAFETY: `used_event` is in the available ring, DMA memory of
            // the queue that only the driver writes.
            unsafe { self.used_event().write_volatile(event) };
        } else {
            // SAFETY: as above; `flags` is the first u16 of the ring.
            unsafe { (self.areas.driver as *mut u16).write_volatile(0) };
        }
        fence(Ordering::SeqCst);
    }

    /// Asks for no interrupts (as far as the protocol allows).
    fn disarm(&self) {
        if self.event_idx {
            // One behind what we popped: the device only signals when its
            // index crosses this, some 65535 buffers away.
            // SAFETY: as in `arm`.
            unsafe { self.used_event().write_volatile(lguest_virtio::disarmed_used_event(self.popped)) };
        } else {
            // SAFETY: as in `arm`: VRING_AVAIL_F_NO_INTERRUPT.
            unsafe { (self.areas.driver as *mut u16).write_volatile(1) };
        }
    }

    /// Tells the device about buffers added since the last time, if it
    /// wants to hear (`avail_event`, or `VRING_USED_F_NO_NOTIFY`).
    fn flush(&mut self) {
        if !self.started || self.added == self.announced {
            return;
        }
        fence(Ordering::SeqCst);
        let kick = if self.event_idx {
            // SAFETY: `avail_event` is in the used ring (see `used_idx`).
            let event = unsafe { self.avail_event().read_volatile() };
            need_event(event, self.added, self.announced)
        } else {
            self.used_flags() & 1 == 0
        };
        self.announced = self.added;
        if kick {
            self.kicker.kick();
        }
    }
}

/// The receive half.
pub struct RxQueue<const QS: usize> {
    q: Box<VirtQueue<LguestHal, QS>>,
    ring: RingState,
    bufs: Vec<Option<Box<[u8]>>>,
    stats: NetStats,
}

impl<const QS: usize> RxQueue<QS> {
    /// Gives `buf` to the device.
    fn refill(&mut self, mut buf: Box<[u8]>) {
        // SAFETY: the buffer is kept in `bufs` under its token, untouched,
        // until `pop_used` returns it.
        match unsafe { self.q.add(&[], &mut [&mut buf[..]]) } {
            Ok(token) => {
                self.bufs[usize::from(token)] = Some(buf);
                self.ring.added = self.ring.added.wrapping_add(1);
                if self.ring.added.wrapping_sub(self.ring.announced) >= KICK_BATCH {
                    self.ring.flush();
                }
            }
            // Cannot happen: there are as many buffers as descriptors.
            Err(_) => drop(buf),
        }
    }

    /// Whether a received frame is waiting.
    fn rx_pending_quick(&self) -> bool {
        self.q.can_pop()
    }

    /// The next received buffer and the bytes the device wrote.
    fn pop(&mut self) -> Option<(Box<[u8]>, usize)> {
        let token = self.q.peek_used()?;
        let mut buf = self.bufs.get_mut(usize::from(token))?.take()?;
        // SAFETY: `buf` is the buffer added under `token`.
        match unsafe { self.q.pop_used(token, &[], &mut [&mut buf[..]]) } {
            Ok(len) => {
                self.ring.popped = self.ring.popped.wrapping_add(1);
                self.ring.disarm();
                let len = (len as usize).min(buf.len());
                Some((buf, len))
            }
            Err(_) => {
                // Not popped (cannot happen: the token came from
                // `peek_used`): the buffer stays with the device.
                self.bufs[usize::from(token)] = Some(buf);
                None
            }
        }
    }
}

/// The transmit half.
pub struct TxQueue<const QS: usize> {
    q: Box<VirtQueue<LguestHal, QS>>,
    ring: RingState,
    /// Buffers in flight, by token, with the bytes handed over.
    inflight: Vec<Option<(Box<[u8]>, usize)>>,
    /// Free buffers that hold any frame (64 KiB ones with TSO).
    free: Vec<Box<[u8]>>,
    /// Free buffers for frames up to the MTU (with TSO; for ACKs and the
    /// like, so that they do not take the big ones).
    free_small: Vec<Box<[u8]>>,
    /// Bytes of a big buffer.
    big_len: usize,
    csum: bool,
    tso: bool,
    stats: NetStats,
    /// `transmit` found no buffer since the last reclaim.
    blocked: bool,
    /// `receive` held frames back for want of a buffer for the replies,
    /// since the last reclaim.
    rx_blocked: bool,
    /// Whether `transmit` and `receive` may reclaim when they run out of
    /// buffers (not in interrupt-driven mode, where only the NAPI poll
    /// does).
    reclaim_lazily: bool,
}

impl<const QS: usize> TxQueue<QS> {
    /// Takes back the buffers the device is done with.
    fn reclaim(&mut self) {
        let mut any = false;
        while let Some(token) = self.q.peek_used() {
            let Some((buf, len)) = self.inflight.get_mut(usize::from(token)).and_then(Option::take) else { break };
            // SAFETY: `buf[..len]` is what was added under `token`.
            if unsafe { self.q.pop_used(token, &[&buf[..len]], &mut []) }.is_err() {
                // Not popped (cannot happen: the token came from
                // `peek_used`): the buffer stays with the device.
                self.inflight[usize::from(token)] = Some((buf, len));
                break;
            }
            self.ring.popped = self.ring.popped.wrapping_add(1);
            self.put(buf);
            any = true;
        }
        if any {
            self.ring.disarm();
            self.blocked = false;
            self.rx_blocked = false;
        }
    }

    /// Returns a buffer to its pool.
    fn put(&mut self, buf: Box<[u8]>) {
        if buf.len() >= self.big_len {
            self.free.push(buf);
        } else {
            self.free_small.push(buf);
        }
    }

    /// Whether a buffer for any frame is free (reclaiming if none is).
    fn has_room(&mut self) -> bool {
        if self.free.is_empty() && self.reclaim_lazily {
            self.reclaim();
        }
        !self.free.is_empty()
    }

    /// Whether any buffer is free (reclaiming if none is).
    fn has_any_room(&mut self) -> bool {
        if self.free.is_empty() && self.free_small.is_empty() && self.reclaim_lazily {
            self.reclaim();
        }
        !self.free.is_empty() || !self.free_small.is_empty()
    }

    /// A free buffer for `len` bytes (header included): a small one if
    /// that will do, else a big one; reclaims once if there is none (and
    /// reclaiming here is allowed).
    fn take(&mut self, len: usize) -> Option<Box<[u8]>> {
        for round in 0..2 {
            if round == 1 {
                if !self.reclaim_lazily {
                    break;
                }
                self.reclaim();
            }
            if let Some(i) = self.free_small.iter().rposition(|b| b.len() >= len) {
                return Some(self.free_small.swap_remove(i));
            }
            if let Some(b) = self.free.pop() {
                return Some(b);
            }
        }
        None
    }

    /// Sends `len` bytes that `f` writes into a frame.
    fn send<R>(&mut self, len: usize, meta: PacketMeta, f: impl FnOnce(&mut [u8]) -> R) -> R {
        let hl = NetHdr::SIZE;
        let Some(mut buf) = self.take(hl + len).filter(|b| b.len() >= hl + len) else {
            // No room: let the stack write the frame somewhere, and drop it.
            self.stats.tx_dropped += 1;
            let mut scratch = vec![0u8; len];
            return f(&mut scratch);
        };
        let r = f(&mut buf[hl..hl + len]);
        let mut hdr = NetHdr::default();
        if self.csum {
            if let Some(o) = prepare_tcp_offload(&mut buf[hl..hl + len]) {
                hdr.flags = NetHdr::F_NEEDS_CSUM;
                hdr.csum_start = o.csum_start as u16;
                hdr.csum_offset = TCP_CSUM_OFFSET as u16;
                if let Some(mss) = meta.segmentation_offload_size.filter(|_| self.tso && !o.ipv6) {
                    if len > o.hdr_len + usize::from(mss.get()) {
                        hdr.gso_type = NetHdr::GSO_TCPV4;
                        hdr.gso_size = mss.get();
                        hdr.hdr_len = o.hdr_len as u16;
                        self.stats.tx_gso_packets += 1;
                    }
                }
            }
        }
        buf[..hl].copy_from_slice(&hdr.to_bytes());
        // SAFETY: the buffer is kept in `inflight` under its token,
        // untouched, until `pop_used` returns it.
        match unsafe { self.q.add(&[&buf[..hl + len]], &mut []) } {
            Ok(token) => {
                self.inflight[usize::from(token)] = Some((buf, hl + len));
                self.stats.tx_packets += 1;
                self.stats.tx_bytes += len as u64;
                self.ring.added = self.ring.added.wrapping_add(1);
                if self.ring.added.wrapping_sub(self.ring.announced) >= KICK_BATCH {
                    self.ring.flush();
                }
            }
            Err(_) => {
                self.stats.tx_dropped += 1;
                self.put(buf);
            }
        }
        r
    }
}

/// A virtio-net device with `QS`-entry queues.
pub struct VirtioNet<const QS: usize = 256> {
    transport: LguestTransport,
    rx: RxQueue<QS>,
    tx: TxQueue<QS>,
    features: u64,
    mac: [u8; 6],
    /// Interrupt-driven mode ([`VirtioNet::set_irq_driven`]).
    irq_driven: bool,
    /// In interrupt-driven mode: a NAPI poll is under way, `receive` may
    /// take frames.
    napi_rx: bool,
    /// In interrupt-driven mode: re-arming found work already there (the
    /// device may have passed the new `used_event` without interrupting).
    napi_due: bool,
    /// In interrupt-driven mode: the transmit interrupt is armed for the
    /// buffers in flight.
    tx_armed: bool,
}

impl<const QS: usize> VirtioNet<QS> {
    /// The first network device on the bus, if there is one, set up and
    /// running (receive ring full).
    pub fn open() -> Result<Option<Self>, BusError> {
        Self::open_with(DRIVER_FEATURES)
    }

    /// [`VirtioNet::open`], taking only the features in `wanted` (a subset
    /// of [`DRIVER_FEATURES`]; for example without `HOST_TSO4`, to compare).
    pub fn open_with(wanted: u64) -> Result<Option<Self>, BusError> {
        match crate::virtio::open(bus::VIRTIO_ID_NET)? {
            Some(t) => Self::with_features(t, wanted).map(Some),
            None => Ok(None),
        }
    }

    /// Drives the device behind `transport` (virtio 1.2 §3.1.1).
    pub fn new(transport: LguestTransport) -> Result<Self, BusError> {
        Self::with_features(transport, DRIVER_FEATURES)
    }

    /// [`VirtioNet::new`], taking only the features in `wanted`.
    pub fn with_features(mut transport: LguestTransport, wanted: u64) -> Result<Self, BusError> {
        let mut wanted = wanted & DRIVER_FEATURES;
        if transport.read_device_features() & wanted & nf::CSUM == 0 {
            // Segmentation needs checksum offload (§5.1.3.1).
            wanted &= !nf::HOST_TSO4;
        }
        let features = crate::virtio::negotiate(&mut transport, wanted)?;
        let event_idx = features & nf::RING_EVENT_IDX != 0;
        let rxq = Box::new(VirtQueue::<LguestHal, QS>::new(&mut transport, RX, false, event_idx)?);
        let txq = Box::new(VirtQueue::<LguestHal, QS>::new(&mut transport, TX, false, event_idx)?);
        let mac = if features & nf::MAC != 0 { transport.read_config_space::<[u8; 6]>(0)? } else { [0; 6] };
        let csum = features & nf::CSUM != 0;
        let tso = features & nf::HOST_TSO4 != 0;
        // With TSO: some big buffers and small ones for the rest of the
        // ring; without: one size, as many as the ring holds.
        let small_len = NetHdr::SIZE + ETH_FRAME_MAX;
        let (big, big_len, small) = if tso {
            let big = TSO_TX_BUFS.min(QS / 2);
            (big, NetHdr::SIZE + TSO_FRAME_MAX, QS - big)
        } else {
            (QS, small_len, 0)
        };
        let mut rx = RxQueue {
            q: rxq,
            ring: RingState::new(&transport, RX, QS, event_idx),
            bufs: (0..QS).map(|_| None).collect(),
            stats: NetStats::default(),
        };
        let mut tx = TxQueue {
            q: txq,
            ring: RingState::new(&transport, TX, QS, event_idx),
            inflight: (0..QS).map(|_| None).collect(),
            free: (0..big).map(|_| vec![0u8; big_len].into_boxed_slice()).collect(),
            free_small: (0..small).map(|_| vec![0u8; small_len].into_boxed_slice()).collect(),
            big_len,
            csum,
            tso,
            stats: NetStats::default(),
            blocked: false,
            rx_blocked: false,
            reclaim_lazily: true,
        };
        for _ in 0..QS {
            rx.refill(vec![0u8; RX_BUF].into_boxed_slice());
        }
        rx.ring.disarm();
        tx.ring.disarm();
        transport.finish_init();
        // Announce the receive buffers now that the device runs.
        rx.ring.started = true;
        tx.ring.started = true;
        rx.ring.kicker.kick();
        rx.ring.announced = rx.ring.added;
        Ok(Self {
            transport,
            rx,
            tx,
            features,
            mac,
            irq_driven: false,
            napi_rx: false,
            napi_due: false,
            tx_armed: false,
        })
    }

    /// The MAC address (zero if the device has none).
    pub fn mac(&self) -> [u8; 6] {
        self.mac
    }

    /// The negotiated features (`lguest_virtio::net_features`).
    pub fn features(&self) -> u64 {
        self.features
    }

    /// Whether TCP segmentation is offloaded.
    pub fn tso(&self) -> bool {
        self.tx.tso
    }

    /// Whether transmit checksums are offloaded.
    pub fn csum(&self) -> bool {
        self.tx.csum
    }

    /// Whether the link is up (`STATUS`; up if the device does not say).
    pub fn link_up(&self) -> bool {
        if self.features & nf::STATUS == 0 {
            return true;
        }
        self.transport.read_config_space::<u16>(6).map_or(true, |s| s & 1 != 0)
    }

    /// The transport (for its counters).
    pub fn transport(&self) -> &LguestTransport {
        &self.transport
    }

    /// The driver's counters.
    pub fn stats(&self) -> NetStats {
        let mut s = self.tx.stats;
        s.rx_packets = self.rx.stats.rx_packets;
        s.rx_bytes = self.rx.stats.rx_bytes;
        s.rx_csum_completed = self.rx.stats.rx_csum_completed;
        s
    }

    /// Announces queued buffers to the device (call after each
    /// `Interface::poll`).
    pub fn flush(&mut self) {
        self.rx.ring.flush();
        self.tx.ring.flush();
        if self.irq_driven && !self.tx_armed {
            self.arm_tx();
        }
    }

    /// Switches to interrupt-driven operation, as a Linux guest's driver
    /// works (`on`), or back to the default (interrupts armed only by
    /// [`VirtioNet::arm`] before a halt). Interrupt-driven:
    ///
    /// - the receive interrupt stays armed, and the transmit interrupt is
    ///   armed whenever buffers are in flight (for half of them);
    /// - `receive` hands out frames only during a NAPI poll, between
    ///   [`VirtioNet::napi_poll`] and [`VirtioNet::napi_complete`], and
    ///   `transmit` never reclaims: only `napi_poll` does;
    /// - the caller runs a NAPI poll when the device's interrupt came
    ///   (`bus::interrupts_taken` moved) or [`VirtioNet::napi_due`] says so.
    ///
    /// Every call that touches the rings (this one, `napi_*`, `flush`, and
    /// `Interface::poll`) is meant to be made with interrupts off, as
    /// Linux's `spin_lock_irqsave` would have them.
    pub fn set_irq_driven(&mut self, on: bool) {
        self.irq_driven = on;
        self.tx.reclaim_lazily = !on;
        self.napi_rx = false;
        self.napi_due = false;
        self.tx_armed = false;
        if on {
            self.napi_complete();
        } else {
            self.rx.ring.disarm();
            self.tx.ring.disarm();
        }
    }

    /// Whether the driver is interrupt-driven.
    pub fn irq_driven(&self) -> bool {
        self.irq_driven
    }

    /// Interrupt-driven: whether a NAPI poll is due although no interrupt
    /// came (re-arming found used buffers the device may not signal).
    pub fn napi_due(&self) -> bool {
        self.napi_due
    }

    /// Interrupt-driven: starts a NAPI poll: takes back the transmit
    /// buffers the device is done with and lets `receive` hand out frames
    /// until [`VirtioNet::napi_complete`].
    pub fn napi_poll(&mut self) {
        self.napi_due = false;
        self.tx.reclaim();
        self.tx_armed = false;
        self.napi_rx = true;
    }

    /// Interrupt-driven: ends a NAPI poll: `receive` stops, and the
    /// interrupts are armed again (a received frame; half of the transmit
    /// buffers in flight coming back). Returns whether work is there
    /// already, as `virtqueue_enable_cb` does; [`VirtioNet::napi_due`]
    /// says so too until the next poll.
    pub fn napi_complete(&mut self) -> bool {
        self.napi_rx = false;
        self.rx.ring.arm(1);
        let rx_work = self.rx.ring.pending() != 0 && !self.tx.rx_blocked;
        let tx_work = self.arm_tx();
        self.napi_due |= rx_work || tx_work;
        self.napi_due
    }

    /// Interrupt-driven: arms the transmit interrupt for half of the
    /// buffers in flight, if any; returns whether the device used that
    /// many already (it may not interrupt for them then).
    fn arm_tx(&mut self) -> bool {
        let inflight = self.tx.ring.added.wrapping_sub(self.tx.ring.popped);
        if inflight == 0 {
            return false;
        }
        let count = (inflight / 2).max(1);
        self.tx.ring.arm(count);
        self.tx_armed = true;
        let work = self.tx.ring.pending() >= count;
        self.napi_due |= work;
        work
    }

    /// Whether `transmit` (or `receive`, which needs room for a reply) ran
    /// out of buffers and none came back since.
    pub fn tx_blocked(&self) -> bool {
        self.tx.blocked || self.tx.rx_blocked
    }

    /// Frames waiting in the receive ring.
    pub fn rx_pending(&self) -> bool {
        self.rx.ring.pending() != 0
    }

    /// Before halting, with interrupts off: flushes, arms the device's
    /// interrupts for what the guest waits for (a received frame; and
    /// transmit buffers coming back, if it is blocked on them) and returns
    /// whether there is work already, in which case the guest must not
    /// halt. Call [`VirtioNet::disarm`] after.
    pub fn arm(&mut self) -> bool {
        self.flush();
        self.rx.ring.arm(1);
        if self.tx.blocked || self.tx.rx_blocked {
            // Wake when half of what is in flight came back: early enough
            // that the device still has work while the guest refills (with
            // three quarters, 128 MiB without TSO took 2.4 times as long,
            // with 153 waits ended by the safety-net timer instead of 10).
            let inflight = self.tx.ring.added.wrapping_sub(self.tx.ring.popped);
            self.tx.ring.arm((inflight / 2).max(1));
        }
        let tx_waited = self.tx.blocked || self.tx.rx_blocked;
        (self.rx_pending() && !self.tx.rx_blocked) || (tx_waited && self.tx.ring.pending() != 0)
    }

    /// After a halt (or instead of one): interrupts off again, and the
    /// interrupt status cleared.
    pub fn disarm(&mut self) {
        self.rx.ring.disarm();
        self.tx.ring.disarm();
        self.transport.ack_interrupt();
    }
}

/// A received frame for smoltcp.
pub struct NetRxToken<'a, const QS: usize> {
    rx: &'a mut RxQueue<QS>,
    buf: Option<Box<[u8]>>,
    len: usize,
}

impl<const QS: usize> phy::RxToken for NetRxToken<'_, QS> {
    fn consume<R, F: FnOnce(&[u8]) -> R>(mut self, f: F) -> R {
        let mut buf = self.buf.take().unwrap_or_default();
        let len = self.len.max(NetHdr::SIZE).min(buf.len());
        let hdr = NetHdr::from_bytes(&buf).unwrap_or_default();
        let frame = &mut buf[NetHdr::SIZE..len];
        if hdr.flags & NetHdr::F_NEEDS_CSUM != 0
            && complete_partial(frame, usize::from(hdr.csum_start), usize::from(hdr.csum_offset))
        {
            self.rx.stats.rx_csum_completed += 1;
        }
        self.rx.stats.rx_packets += 1;
        self.rx.stats.rx_bytes += frame.len() as u64;
        let r = f(frame);
        if !buf.is_empty() {
            self.rx.refill(buf);
        }
        r
    }
}

impl<const QS: usize> Drop for NetRxToken<'_, QS> {
    fn drop(&mut self) {
        if let Some(buf) = self.buf.take() {
            self.rx.refill(buf);
        }
    }
}

/// Room for one frame to send, for smoltcp.
pub struct NetTxToken<'a, const QS: usize> {
    tx: &'a mut TxQueue<QS>,
    meta: PacketMeta,
}

impl<const QS: usize> phy::TxToken for NetTxToken<'_, QS> {
    fn consume<R, F: FnOnce(&mut [u8]) -> R>(self, len: usize, f: F) -> R {
        self.tx.send(len, self.meta, f)
    }

    fn set_meta(&mut self, meta: PacketMeta) {
        self.meta = meta;
    }
}

impl<const QS: usize> phy::Device for VirtioNet<QS> {
    type RxToken<'a> = NetRxToken<'a, QS>;
    type TxToken<'a> = NetTxToken<'a, QS>;

    fn receive(&mut self, _timestamp: Instant) -> Option<(Self::RxToken<'_>, Self::TxToken<'_>)> {
        if (self.irq_driven && !self.napi_rx) || !self.rx.rx_pending_quick() {
            return None;
        }
        // A frame may need a reply (an ACK): hold frames back rather than
        // drop the reply when no buffer is free.
        if !self.tx.has_any_room() {
            self.tx.stats.tx_ring_full += 1;
            self.tx.rx_blocked = true;
            return None;
        }
        let (buf, len) = self.rx.pop()?;
        Some((
            NetRxToken { rx: &mut self.rx, buf: Some(buf), len },
            NetTxToken { tx: &mut self.tx, meta: PacketMeta::default() },
        ))
    }

    fn transmit(&mut self, _timestamp: Instant) -> Option<Self::TxToken<'_>> {
        if !self.tx.has_room() {
            self.tx.stats.tx_ring_full += 1;
            self.tx.blocked = true;
            return None;
        }
        Some(NetTxToken { tx: &mut self.tx, meta: PacketMeta::default() })
    }

    fn capabilities(&self) -> DeviceCapabilities {
        let mut caps = DeviceCapabilities::default();
        caps.medium = Medium::Ethernet;
        caps.max_transmission_unit = ETH_FRAME_MAX;
        caps.max_burst_size = None;
        let mut csum = ChecksumCapabilities::default();
        if self.tx.csum {
            // Verify on receive, leave the TCP checksum to the device.
            csum.tcp = Checksum::Rx;
        }
        caps.checksum = csum;
        if self.tx.tso {
            caps.segmentation.tcpv4 = NonZeroUsize::new(TSO_FRAME_MAX);
        }
        caps
    }
}
