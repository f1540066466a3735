// SPDX-License-Identifier: GPL-2.0
//! The lguest bus: how the launcher describes virtio devices to a guest.
//!
//! This is an agreement between the launcher and the guest only; the host
//! module never reads it (it only moves notifications, see
//! `LHCALL_NOTIFY` and `LGUEST_IOEVENTFD` in `uapi.rs`). It follows lguest
//! 2.6.24-4.0 in spirit (a device page above RAM, kicks by hypercall) with
//! the virtio 1.x driver/device split: the guest allocates its rings and
//! tells the device where they are, as with virtio-mmio.
//!
//! # Layout
//!
//! The device window starts right above guest RAM: guest-physical
//! `ram_size` (the guest gets `ram_size` in RSI at entry). Its first page is
//! the **device table**: [`LGUEST_BUS_MAX_DEVICES`] slots of
//! [`LguestDeviceDesc`], [`LGUEST_BUS_DESC_SIZE`] bytes each. The table ends
//! at the first slot whose `device_type` is 0 (or after the last slot).
//!
//! # Protocol
//!
//! - **Status, features and queue setup** are written by the driver into
//!   the descriptor, followed by `LHCALL_NOTIFY(desc_addr, 0)`, where
//!   `desc_addr` is the guest-physical address of the descriptor
//!   ([`LguestBus::desc_addr`]). That notification always reaches the
//!   launcher's vCPU thread and is handled before the hypercall returns, so
//!   the driver sees the device's answer when it reads the descriptor
//!   again (as it would after an MMIO write):
//!   - `status == 0`: the device resets (queues stop, `status` reads 0).
//!   - `FEATURES_OK` newly set: the device checks `driver_features` against
//!     `device_features` and clears `FEATURES_OK` if the driver took a
//!     feature that was not offered (virtio 1.2 §3.1.1 step 6).
//!   - `DRIVER_OK` newly set: each queue with `ready == 1` starts, with the
//!     ring addresses and size in its [`LguestVqConfig`].
//!   - `FAILED`: the device stops.
//!
//!   The device sets `DEVICE_NEEDS_RESET` (and stops) when the driver breaks
//!   the rules, for example with a malformed descriptor chain. The bit is
//!   sticky: a driver writing `status` must keep it (the device puts it back
//!   at the next status notification if a plain store lost it), and only a
//!   reset clears it. A reset also clears every queue's `ready`.
//! - **Queue kicks** are `LHCALL_NOTIFY(vq_addr, 0)`, where `vq_addr` is the
//!   guest-physical address of the queue's [`LguestVqConfig`]
//!   ([`LguestBus::vq_addr`]). The launcher binds each of these addresses to
//!   an eventfd with `LGUEST_IOEVENTFD`, so a kick wakes the device's thread
//!   without a trip through the vCPU thread.
//! - **Interrupts**: each device has one guest interrupt line, `irq`. Before
//!   raising it the device sets bits in `isr` (atomically: [`LGUEST_ISR_QUEUE`]
//!   for used buffers, [`LGUEST_ISR_CONFIG`] for a configuration change);
//!   the driver reads and clears `isr` with one atomic exchange.
//! - **Configuration space**: `config[..config_len]`, device-specific
//!   (virtio 1.2 §5), little-endian. The device bumps `config_generation`
//!   around changes.

/// Bytes of one device descriptor.
pub const LGUEST_BUS_DESC_SIZE: usize = 512;
/// Device descriptors in the device table (the first device page).
pub const LGUEST_BUS_MAX_DEVICES: usize = 4096 / LGUEST_BUS_DESC_SIZE;
/// Queues a device may have.
pub const LGUEST_BUS_MAX_QUEUES: usize = 4;
/// Bytes of configuration space in a descriptor.
pub const LGUEST_BUS_CONFIG_SIZE: usize = LGUEST_BUS_DESC_SIZE - 48 - 32 * LGUEST_BUS_MAX_QUEUES;

/// `isr` bit: the device used buffers in one of its queues.
pub const LGUEST_ISR_QUEUE: u32 = 1;
/// `isr` bit: the device's configuration changed.
pub const LGUEST_ISR_CONFIG: u32 = 2;

/// virtio device status bits (virtio 1.2 §2.1).
pub const VIRTIO_STATUS_ACKNOWLEDGE: u32 = 1;
/// The driver knows how to drive the device.
pub const VIRTIO_STATUS_DRIVER: u32 = 2;
/// The driver is set up and ready to drive the device.
pub const VIRTIO_STATUS_DRIVER_OK: u32 = 4;
/// The driver has acknowledged the features it understands.
pub const VIRTIO_STATUS_FEATURES_OK: u32 = 8;
/// The device has an error the driver must reset to clear.
pub const VIRTIO_STATUS_DEVICE_NEEDS_RESET: u32 = 64;
/// The driver gave up on the device.
pub const VIRTIO_STATUS_FAILED: u32 = 128;

/// One queue's configuration, inside a [`LguestDeviceDesc`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LguestVqConfig {
    /// Written by the launcher: the largest queue size it accepts (a power
    /// of two); 0 means the queue does not exist.
    pub num_max: u16,
    /// Written by the driver: the queue size it chose (a power of two, at
    /// most `num_max`).
    pub num: u16,
    /// Written by the driver: 1 when the addresses below are valid.
    pub ready: u16,
    /// Must be 0.
    pub pad: u16,
    /// Written by the driver: guest-physical address of the descriptor table.
    pub desc: u64,
    /// Written by the driver: guest-physical address of the available
    /// (driver) ring.
    pub driver: u64,
    /// Written by the driver: guest-physical address of the used (device)
    /// ring.
    pub device: u64,
}

/// One device on the lguest bus: a slot of the device table.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct LguestDeviceDesc {
    /// The virtio device ID (1 net, 2 block, 3 console, 4 rng, ...); 0 ends
    /// the table.
    pub device_type: u32,
    /// Queues in `queues` (at most [`LGUEST_BUS_MAX_QUEUES`]).
    pub num_queues: u32,
    /// The guest interrupt line of this device.
    pub irq: u32,
    /// The virtio device status (`VIRTIO_STATUS_*`): written by the driver,
    /// then `LHCALL_NOTIFY(desc_addr)`; the device may clear `FEATURES_OK`
    /// or set `DEVICE_NEEDS_RESET`.
    pub status: u32,
    /// Written by the launcher: the features the device offers.
    pub device_features: u64,
    /// Written by the driver: the features it accepted.
    pub driver_features: u64,
    /// Interrupt status (`LGUEST_ISR_*`): set by the device, read and
    /// cleared by the driver, both atomically.
    pub isr: u32,
    /// Bumped by the device around configuration changes.
    pub config_generation: u32,
    /// Bytes of `config` that are valid.
    pub config_len: u32,
    /// Must be 0.
    pub pad: u32,
    /// The queues.
    pub queues: [LguestVqConfig; LGUEST_BUS_MAX_QUEUES],
    /// The device-specific configuration space.
    pub config: [u8; LGUEST_BUS_CONFIG_SIZE],
}

impl Default for LguestDeviceDesc {
    fn default() -> Self {
        Self {
            device_type: 0,
            num_queues: 0,
            irq: 0,
            status: 0,
            device_features: 0,
            driver_features: 0,
            isr: 0,
            config_generation: 0,
            config_len: 0,
            pad: 0,
            queues: [LguestVqConfig::default(); LGUEST_BUS_MAX_QUEUES],
            config: [0; LGUEST_BUS_CONFIG_SIZE],
        }
    }
}

/// Address arithmetic of the bus, given the size of guest RAM.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LguestBus {
    /// Guest-physical address of the device table (= bytes of guest RAM).
    pub base: u64,
}

impl LguestBus {
    /// The bus of a guest with `ram_size` bytes of RAM.
    pub const fn new(ram_size: u64) -> Self {
        Self { base: ram_size }
    }

    /// Guest-physical address of device slot `index`.
    pub const fn desc_addr(&self, index: usize) -> u64 {
        self.base + (index * LGUEST_BUS_DESC_SIZE) as u64
    }

    /// Guest-physical address of queue `queue` of device slot `index`: the
    /// address its kicks notify.
    pub const fn vq_addr(&self, index: usize, queue: usize) -> u64 {
        self.desc_addr(index)
            + (core::mem::offset_of!(LguestDeviceDesc, queues)
                + queue * core::mem::size_of::<LguestVqConfig>()) as u64
    }

    /// What a notification of `addr` means on this bus, if anything.
    pub const fn decode(&self, addr: u64) -> Option<BusNotify> {
        if addr < self.base {
            return None;
        }
        let off = addr - self.base;
        if off >= 4096 {
            return None;
        }
        let index = (off / LGUEST_BUS_DESC_SIZE as u64) as usize;
        let within = (off % LGUEST_BUS_DESC_SIZE as u64) as usize;
        if within == 0 {
            return Some(BusNotify::Status { index });
        }
        let q0 = core::mem::offset_of!(LguestDeviceDesc, queues);
        let qsize = core::mem::size_of::<LguestVqConfig>();
        if within >= q0
            && within < q0 + qsize * LGUEST_BUS_MAX_QUEUES
            && (within - q0).is_multiple_of(qsize)
        {
            return Some(BusNotify::Queue {
                index,
                queue: (within - q0) / qsize,
            });
        }
        None
    }
}

/// A decoded bus notification.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BusNotify {
    /// The driver changed the status (or features, or queue setup) of
    /// device slot `index`.
    Status {
        /// The device slot.
        index: usize,
    },
    /// The driver kicked queue `queue` of device slot `index`.
    Queue {
        /// The device slot.
        index: usize,
        /// The queue.
        queue: usize,
    },
}

/// Compile-time layout checks: the structs are an ABI.
const _: () = {
    use core::mem::{offset_of, size_of};
    assert!(size_of::<LguestVqConfig>() == 32);
    assert!(offset_of!(LguestDeviceDesc, queues) == 48);
    assert!(offset_of!(LguestDeviceDesc, config) == 48 + 32 * LGUEST_BUS_MAX_QUEUES);
    assert!(size_of::<LguestDeviceDesc>() == LGUEST_BUS_DESC_SIZE);
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_decode_back() {
        let bus = LguestBus::new(64 << 20);
        for index in 0..LGUEST_BUS_MAX_DEVICES {
            assert_eq!(
                bus.decode(bus.desc_addr(index)),
                Some(BusNotify::Status { index })
            );
            for queue in 0..LGUEST_BUS_MAX_QUEUES {
                assert_eq!(
                    bus.decode(bus.vq_addr(index, queue)),
                    Some(BusNotify::Queue { index, queue })
                );
            }
        }
        assert_eq!(bus.decode(bus.base - 1), None);
        assert_eq!(bus.decode(bus.base + 4), None);
        assert_eq!(bus.decode(bus.vq_addr(0, 0) + 8), None);
        assert_eq!(bus.decode(bus.base + 4096), None);
    }
}
