// SPDX-License-Identifier: GPL-2.0
//! virtio-net (device ID 1) on a TAP device: `--net tap=NAME` (opened, or
//! created, by the launcher) or `--net fd=N` (a tap someone else opened and
//! passed down, so that the launcher needs no CAP_NET_ADMIN), with
//! `mac=XX:XX:XX:XX:XX:XX` (by default one derived from the tap's name, so
//! that guests on different taps differ and a guest keeps its MAC from run
//! to run) and `batch=on|off`, `offload=on|off`.
//!
//! Queue 0 receives (host to guest), queue 1 transmits. Frames pass through
//! with their virtio-net header untouched (12 bytes with VERSION_1: the
//! driver's checksum and segmentation offload requests go straight to the
//! host kernel, which is what makes offloads cheap), except `num_buffers`,
//! which the device sets to 1 on receive.
//!
//! **Receive interrupts are batched.** When the tap is readable the device
//! reads frames into receive chains until the tap says `EAGAIN` or the ring
//! has no buffers left, and only then asks `needs_notification` (EVENT_IDX)
//! once and raises at most one interrupt. With no buffers the tap is not
//! polled until the driver kicks the receive queue. A safety net: if a
//! batch ended with used buffers the driver was not interrupted for (it
//! asked not to be), an interrupt is forced after [`SAFETY_NET`] without
//! other activity. With `nobatch` the device asks after every frame
//! instead, for comparison.
//!
//! **Transmit** drains the ring (notifications off), writes each frame to
//! the tap, re-enables notifications, repeats if more came, then raises at
//! most one interrupt for the whole batch.

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::tap::TapControl;
use super::{DeviceError, DeviceStats, Events, Queues, VirtioDevice, VIRTIO_F_VERSION_1, VIRTIO_ID_NET};

use virtio_bindings::virtio_net as vn;

/// Feature bits (virtio 1.2 §5.1.3), as masks of virtio-bindings' bit
/// numbers.
pub const VIRTIO_NET_F_CSUM: u64 = 1 << vn::VIRTIO_NET_F_CSUM;
/// The driver takes frames with partial checksums.
pub const VIRTIO_NET_F_GUEST_CSUM: u64 = 1 << vn::VIRTIO_NET_F_GUEST_CSUM;
/// The device has a MAC address.
pub const VIRTIO_NET_F_MAC: u64 = 1 << vn::VIRTIO_NET_F_MAC;
/// The driver takes TSOv4 frames.
pub const VIRTIO_NET_F_GUEST_TSO4: u64 = 1 << vn::VIRTIO_NET_F_GUEST_TSO4;
/// The driver takes TSOv6 frames.
pub const VIRTIO_NET_F_GUEST_TSO6: u64 = 1 << vn::VIRTIO_NET_F_GUEST_TSO6;
/// The driver takes TSO frames with ECN.
pub const VIRTIO_NET_F_GUEST_ECN: u64 = 1 << vn::VIRTIO_NET_F_GUEST_ECN;
/// The device takes TSOv4 frames.
pub const VIRTIO_NET_F_HOST_TSO4: u64 = 1 << vn::VIRTIO_NET_F_HOST_TSO4;
/// The device takes TSOv6 frames.
pub const VIRTIO_NET_F_HOST_TSO6: u64 = 1 << vn::VIRTIO_NET_F_HOST_TSO6;
/// The device takes TSO frames with ECN.
pub const VIRTIO_NET_F_HOST_ECN: u64 = 1 << vn::VIRTIO_NET_F_HOST_ECN;
/// Mergeable receive buffers (not offered).
pub const VIRTIO_NET_F_MRG_RXBUF: u64 = 1 << vn::VIRTIO_NET_F_MRG_RXBUF;
/// The configuration has a link status.
pub const VIRTIO_NET_F_STATUS: u64 = 1 << vn::VIRTIO_NET_F_STATUS;

/// The features the device offers.
pub const NET_FEATURES: u64 = VIRTIO_NET_F_CSUM
    | VIRTIO_NET_F_GUEST_CSUM
    | VIRTIO_NET_F_MAC
    | VIRTIO_NET_F_GUEST_TSO4
    | VIRTIO_NET_F_GUEST_TSO6
    | VIRTIO_NET_F_GUEST_ECN
    | VIRTIO_NET_F_HOST_TSO4
    | VIRTIO_NET_F_HOST_TSO6
    | VIRTIO_NET_F_HOST_ECN
    | VIRTIO_NET_F_STATUS;

// `TUN_F_*` offload flags, from libc.
const TUN_F_CSUM: u32 = libc::TUN_F_CSUM;
const TUN_F_TSO4: u32 = libc::TUN_F_TSO4;
const TUN_F_TSO6: u32 = libc::TUN_F_TSO6;
const TUN_F_TSO_ECN: u32 = libc::TUN_F_TSO_ECN;

/// How long a batch's unsignalled used buffers may wait for an interrupt.
pub const SAFETY_NET: Duration = Duration::from_millis(1);

/// The largest frame plus header: a 64 KiB TSO frame, its Ethernet header
/// and VLAN tag, and the virtio-net header.
pub const MAX_FRAME: usize = 65536 + 18 + 12;

const RX: usize = 0;
const TX: usize = 1;

/// Where the tap comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TapSource {
    /// Open (or create) the interface of this name.
    Name(String),
    /// Take over this inherited descriptor.
    Fd(i32),
}

/// What `--net` asked for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NetOptions {
    /// The TAP interface.
    pub tap: TapSource,
    /// The guest's MAC address; by default [`default_mac`] of the tap's name.
    pub mac: Option<[u8; 6]>,
    /// Batch receive interrupts (the default; `batch=off` turns it off).
    pub batch: bool,
    /// Offer checksum and segmentation offload (the default; `offload=off`
    /// offers neither, for comparison).
    pub offload: bool,
}

/// Parses `52:54:00:12:34:56`: six hex bytes, a unicast address.
pub fn parse_mac(s: &str) -> Result<[u8; 6], String> {
    let mut mac = [0u8; 6];
    let parts: Vec<&str> = s.split(':').collect();
    if parts.len() != 6 {
        return Err(format!("mac={s:?}: expected six hex bytes, e.g. 52:54:00:12:34:56"));
    }
    for (b, p) in mac.iter_mut().zip(&parts) {
        if p.len() != 2 {
            return Err(format!("mac={s:?}: expected six hex bytes, e.g. 52:54:00:12:34:56"));
        }
        *b = u8::from_str_radix(p, 16).map_err(|_| format!("mac={s:?}: {p:?} is not a hex byte"))?;
    }
    if mac[0] & 1 != 0 {
        return Err(format!("mac={s}: a multicast address (the first byte is odd)"));
    }
    Ok(mac)
}

/// The default MAC for tap `name`: QEMU's locally administered prefix
/// 52:54:00 and three bytes of an FNV-1a hash of the name, so that it is
/// the same every run and differs between taps.
pub fn default_mac(name: &str) -> [u8; 6] {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in name.bytes() {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    let b = h.to_le_bytes();
    [0x52, 0x54, 0x00, b[0], b[1], b[2]]
}

/// `aa:bb:cc:dd:ee:ff`.
pub fn mac_text(mac: &[u8; 6]) -> String {
    mac.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(":")
}

impl std::str::FromStr for NetOptions {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        const USAGE: &str = "expected tap=NAME or fd=N, then [,mac=MAC][,batch=on|off][,offload=on|off]";
        let mut tap = None;
        let mut mac = None;
        let mut batch = true;
        let mut offload = true;
        for part in s.split(',') {
            let source = match part.split_once('=') {
                Some(("tap", name)) if !name.is_empty() && name.len() < libc::IFNAMSIZ => {
                    Some(TapSource::Name(name.to_owned()))
                }
                Some(("fd", n)) => Some(TapSource::Fd(
                    n.parse().ok().filter(|&n: &i32| n >= 0).ok_or_else(|| format!("fd={n:?}: not a descriptor"))?,
                )),
                Some(("mac", m)) => {
                    mac = Some(parse_mac(m)?);
                    None
                }
                Some(("batch", v)) => {
                    batch = super::block::on_off("batch", v)?;
                    None
                }
                Some(("offload", v)) => {
                    offload = super::block::on_off("offload", v)?;
                    None
                }
                // The older bare words.
                None if part == "nobatch" || part == "batch" => {
                    batch = part == "batch";
                    None
                }
                None if part == "nooffload" || part == "offload" => {
                    offload = part == "offload";
                    None
                }
                _ => return Err(format!("bad net option {part:?} ({USAGE})")),
            };
            if let Some(source) = source {
                if tap.replace(source).is_some() {
                    return Err(format!("more than one tap=/fd= ({USAGE})"));
                }
            }
        }
        let tap = tap.ok_or_else(|| format!("no tap ({USAGE})"))?;
        Ok(Self { tap, mac, batch, offload })
    }
}

/// The network device.
pub struct Net {
    io: File,
    ctl: Box<dyn TapControl>,
    name: String,
    mac: [u8; 6],
    batch: bool,
    /// Offer the offload features.
    offload: bool,
    hdr_len: usize,
    /// No receive buffers: do not poll the tap until queue 0 is kicked.
    rx_wait: bool,
    /// Receive buffers used since the driver was last interrupted.
    unsignalled: u64,
    /// A transmit error was logged (once per device).
    tx_error_told: bool,
    /// The tap offloads (`TUN_F_*`) the last activation set, cleared at
    /// reset.
    offloads_set: u32,
    buf: Vec<u8>,
}

impl std::fmt::Debug for Net {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Net").field("name", &self.name).field("batch", &self.batch).finish_non_exhaustive()
    }
}

impl Net {
    /// A device moving frames through `io` (the tap, non-blocking), with
    /// `ctl` for its offload settings, as device number `n`, with the
    /// default MAC for `tap` ([`Net::with_mac`] sets another).
    pub fn new(io: File, ctl: Box<dyn TapControl>, tap: &str, batch: bool, n: usize) -> Self {
        let mac = default_mac(tap);
        Self {
            io,
            ctl,
            name: format!("net{n} ({tap}{})", if batch { "" } else { ", nobatch" }),
            mac,
            batch,
            offload: true,
            hdr_len: 12,
            rx_wait: false,
            unsignalled: 0,
            tx_error_told: false,
            offloads_set: 0,
            buf: vec![0; MAX_FRAME],
        }
    }

    /// The guest's MAC address.
    pub fn with_mac(mut self, mac: [u8; 6]) -> Self {
        self.mac = mac;
        self
    }

    /// Offers checksum and segmentation offload, or (`false`) neither:
    /// the guest then checksums and segments every frame itself.
    pub fn with_offload(mut self, offload: bool) -> Self {
        self.offload = offload;
        if !offload {
            self.name = format!("{}, nooffload)", self.name.trim_end_matches(')'));
        }
        self
    }

    fn signalled(&mut self, qs: &mut Queues<'_>) -> Result<(), DeviceError> {
        if qs.notify(RX)? {
            self.unsignalled = 0;
        }
        Ok(())
    }

    fn receive(&mut self, qs: &mut Queues<'_>) -> Result<(), DeviceError> {
        let mut delivered = 0u64;
        while !qs.stopping() {
            let chain = match qs.pop(RX)? {
                Some(chain) => chain,
                None => {
                    if qs.enable_notification(RX)? {
                        continue;
                    }
                    self.rx_wait = true;
                    break;
                }
            };
            if !chain.readable.is_empty() {
                return Err(DeviceError::Request { queue: RX, why: "a device-readable buffer for receiving".into() });
            }
            let n = match self.io.read(&mut self.buf) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    qs.unpop(RX);
                    break;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {
                    qs.unpop(RX);
                    continue;
                }
                Err(source) => return Err(DeviceError::host("reading the tap", source)),
            };
            if n < self.hdr_len || n as u64 > chain.writable_len() {
                // A runt, or a frame the driver's buffers cannot hold:
                // drop it, keep the buffer for the next one.
                qs.stats().dropped.fetch_add(1, Ordering::Relaxed);
                qs.unpop(RX);
                continue;
            }
            if self.hdr_len == 12 {
                // num_buffers: the frame is in one chain.
                self.buf[10..12].copy_from_slice(&1u16.to_le_bytes());
            }
            let written = chain.writer().write(qs.mem(), &self.buf[..n]);
            // CAST: at most MAX_FRAME.
            qs.add_used(RX, chain.head, written as u32)?;
            qs.stats().queues[RX].count((n - self.hdr_len) as u64);
            self.unsignalled += 1;
            delivered += 1;
            if !self.batch {
                self.signalled(qs)?;
            }
        }
        if self.batch && delivered > 0 {
            self.signalled(qs)?;
        }
        Ok(())
    }

    fn transmit(&mut self, qs: &mut Queues<'_>) -> Result<(), DeviceError> {
        loop {
            qs.disable_notification(TX)?;
            while let Some(chain) = qs.pop(TX)? {
                if qs.stopping() {
                    qs.unpop(TX);
                    break;
                }
                if !chain.writable.is_empty() {
                    return Err(DeviceError::Request { queue: TX, why: "a device-writable buffer in a frame".into() });
                }
                let len = chain.readable_len();
                // CAST: MAX_FRAME fits u64.
                if len < self.hdr_len as u64 || len > MAX_FRAME as u64 {
                    qs.stats().dropped.fetch_add(1, Ordering::Relaxed);
                } else {
                    let frame = chain.reader().read_to_vec(qs.mem(), MAX_FRAME);
                    match self.io.write(&frame) {
                        Ok(n) if n == frame.len() => qs.stats().queues[TX].count((n - self.hdr_len) as u64),
                        Ok(n) => {
                            log::debug!("{}: tap took {n} of {} bytes", self.name, frame.len());
                            qs.stats().dropped.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(e) if matches!(e.raw_os_error(), Some(libc::EBADFD | libc::ENODEV | libc::ENXIO)) => {
                            qs.add_used(TX, chain.head, 0)?;
                            return Err(DeviceError::host("writing the tap", e));
                        }
                        Err(e) => {
                            if !self.tx_error_told {
                                log::warn!("{}: tap write: {e}; frames are dropped (counted in --stats)", self.name);
                                self.tx_error_told = true;
                            }
                            qs.stats().dropped.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
                qs.add_used(TX, chain.head, 0)?;
            }
            if qs.stopping() || !qs.enable_notification(TX)? {
                break;
            }
        }
        qs.notify(TX)?;
        Ok(())
    }
}

/// The tap offloads for the features the driver accepted.
pub fn offloads(features: u64) -> u32 {
    if features & VIRTIO_NET_F_GUEST_CSUM == 0 {
        return 0;
    }
    let mut flags = TUN_F_CSUM;
    if features & VIRTIO_NET_F_GUEST_TSO4 != 0 {
        flags |= TUN_F_TSO4;
    }
    if features & VIRTIO_NET_F_GUEST_TSO6 != 0 {
        flags |= TUN_F_TSO6;
    }
    if features & VIRTIO_NET_F_GUEST_ECN != 0 && flags & (TUN_F_TSO4 | TUN_F_TSO6) != 0 {
        flags |= TUN_F_TSO_ECN;
    }
    flags
}

fn per(a: u64, b: u64) -> f64 {
    if b == 0 {
        0.0
    } else {
        a as f64 / b as f64
    }
}

impl VirtioDevice for Net {
    fn device_type(&self) -> u32 {
        VIRTIO_ID_NET
    }

    fn name(&self) -> String {
        self.name.clone()
    }

    fn features(&self) -> u64 {
        if self.offload {
            NET_FEATURES
        } else {
            NET_FEATURES & (VIRTIO_NET_F_MAC | VIRTIO_NET_F_STATUS)
        }
    }

    fn queue_max(&self) -> Vec<u16> {
        vec![256, 256]
    }

    fn config(&self) -> Vec<u8> {
        // struct virtio_net_config: mac[6], status (VIRTIO_NET_S_LINK_UP).
        let mut c = self.mac.to_vec();
        c.extend_from_slice(&1u16.to_le_bytes());
        c
    }

    fn activate(&mut self, features: u64) -> Result<(), DeviceError> {
        self.hdr_len = if features & (VIRTIO_F_VERSION_1 | VIRTIO_NET_F_MRG_RXBUF) != 0 { 12 } else { 10 };
        self.ctl.set_vnet_hdr_size(self.hdr_len).map_err(|source| DeviceError::host("TUNSETVNETHDRSZ", source))?;
        let flags = offloads(features);
        self.ctl.set_offload(flags).map_err(|source| DeviceError::host("TUNSETOFFLOAD", source))?;
        self.offloads_set = flags;
        Ok(())
    }

    fn reset(&mut self) {
        self.rx_wait = false;
        self.unsignalled = 0;
        // The offloads the old driver accepted must not outlive it: until
        // the next DRIVER_OK the host would still hand the tap partial
        // checksums and TSO frames that a new driver may not take.
        if self.offloads_set != 0 {
            match self.ctl.set_offload(0) {
                Ok(()) => self.offloads_set = 0,
                Err(e) => log::debug!("{}: clearing the tap's offloads at reset: {e}", self.name),
            }
        }
    }

    fn input_fds(&self) -> Vec<RawFd> {
        if self.rx_wait {
            Vec::new()
        } else {
            vec![self.io.as_raw_fd()]
        }
    }

    fn timeout(&self) -> Option<Duration> {
        (self.unsignalled > 0).then_some(SAFETY_NET)
    }

    fn process(&mut self, qs: &mut Queues<'_>, events: &Events) -> Result<(), DeviceError> {
        if events.queue(TX) {
            self.transmit(qs)?;
        }
        if events.queue(RX) {
            self.rx_wait = false;
        }
        if events.timeout && self.unsignalled > 0 {
            qs.stats().timer_irqs.fetch_add(1, Ordering::Relaxed);
            qs.raise_irq(RX);
            self.unsignalled = 0;
        }
        if !self.rx_wait && (events.input & 1 != 0 || events.queue(RX)) {
            self.receive(qs)?;
        }
        Ok(())
    }

    fn stats(&self, s: &DeviceStats) -> String {
        let rx = &s.queues[RX];
        let tx = &s.queues[TX];
        let (rxp, rxb, rxi) =
            (rx.chains.load(Ordering::Relaxed), rx.bytes.load(Ordering::Relaxed), rx.irqs.load(Ordering::Relaxed));
        let (txp, txb, txi) =
            (tx.chains.load(Ordering::Relaxed), tx.bytes.load(Ordering::Relaxed), tx.irqs.load(Ordering::Relaxed));
        let per_mb = |i: u64, b: u64| if b == 0 { 0.0 } else { i as f64 * 1e6 / b as f64 };
        format!(
            "  rx: {rxp} packets, {rxb} bytes, {rxi} interrupts ({:.1} packets/interrupt, {:.1} interrupts/MB, {} by the safety net)\n  tx: {txp} packets, {txb} bytes, {txi} interrupts ({:.1} packets/interrupt, {:.1} interrupts/MB), {} kicks\n  dropped: {}\n",
            per(rxp, rxi),
            per_mb(rxi, rxb),
            s.timer_irqs.load(Ordering::Relaxed),
            per(txp, txi),
            per_mb(txi, txb),
            tx.kicks.load(Ordering::Relaxed),
            s.dropped.load(Ordering::Relaxed),
        )
    }
}
