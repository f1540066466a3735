// SPDX-License-Identifier: GPL-2.0

//! The lguest bus as a virtio transport: what `drivers/lguest/lguest_device.c`
//! was for the original lguest, for lguest-rs's bus (its `abi/src/bus.rs`
//! and `Documentation/guest-abi.rst`).
//!
//! The launcher describes its devices in the device table, the first page
//! of the device window right above RAM: up to eight 512-byte slots, the
//! first with `device_type` 0 ending it. Each slot holds the device's
//! status, its feature words, its queues' sizes and ring addresses, an
//! interrupt status word (`isr`) and its configuration space. The driver
//! writes a field and then notifies the slot's address (`LHCALL_NOTIFY`),
//! which the launcher answers before the hypercall returns, as a virtio-mmio
//! register write would be; a queue's kick notifies the address of the
//! queue's entry in the slot. Each device has its own interrupt line, whose
//! handler takes `isr` with one atomic exchange.
//!
//! [`lguest_virtio_init`] (a device initcall) maps the table and registers
//! a `virtio_device` per slot; the virtio core then matches drivers
//! (virtio_console's `hvc1`, for one) and calls [`OPS`]. The rings are the
//! virtio core's (`vring_create_virtqueue`), in guest RAM, by physical
//! address: the devices do not offer `VIRTIO_F_ACCESS_PLATFORM`, so the
//! ring code does not use the DMA API.

use core::ptr;
use core::sync::atomic::{AtomicU32, Ordering};
use kernel::alloc::{flags::GFP_KERNEL, KBox};
use kernel::ffi::{c_char, c_int, c_uint, c_ulong, c_void};

use kernel::bindings;

use super::{hcall, lhcall, setup_irq, TIMER_IRQ};

/// Bytes of one slot of the device table.
const DESC_SIZE: usize = 512;
/// Slots in the table (one page).
const MAX_DEVICES: usize = 4096 / DESC_SIZE;
/// Queues a slot describes.
const MAX_QUEUES: u32 = 4;

// Offsets in a slot (`struct LguestDeviceDesc`).
const OFF_TYPE: usize = 0;
const OFF_NUM_QUEUES: usize = 4;
const OFF_IRQ: usize = 8;
const OFF_STATUS: usize = 12;
const OFF_DEVICE_FEATURES: usize = 16;
const OFF_DRIVER_FEATURES: usize = 24;
const OFF_ISR: usize = 32;
const OFF_GENERATION: usize = 36;
const OFF_CONFIG_LEN: usize = 40;
const OFF_QUEUES: usize = 48;
const OFF_CONFIG: usize = OFF_QUEUES + VQ_SIZE * MAX_QUEUES as usize;
/// The most configuration space a slot has.
const CONFIG_MAX: usize = DESC_SIZE - OFF_CONFIG;

// A queue's entry (`struct LguestVqConfig`) and its offsets.
const VQ_SIZE: usize = 32;
const VQ_NUM_MAX: usize = 0;
const VQ_NUM: usize = 2;
const VQ_READY: usize = 4;
const VQ_DESC: usize = 8;
const VQ_DRIVER: usize = 16;
const VQ_DEVICE: usize = 24;

/// `isr` bits: used buffers, a configuration change.
const ISR_QUEUE: u32 = 1;
const ISR_CONFIG: u32 = 2;

/// `VIRTIO_F_VERSION_1`: the bus is virtio 1.x only (little-endian
/// configuration, the driver/device ring split).
const VIRTIO_F_VERSION_1: u64 = 1 << 32;

/// Interrupt lines a device may have: those of `blocked_interrupts`' one
/// word, but the timer's.
const MAX_IRQ: u32 = 63;

/// The ring alignment: as virtio-mmio's, a page.
const VRING_ALIGN: c_uint = 4096;

/// One device of the bus. `vdev` comes first: the virtio core's pointer to
/// it is a pointer to the whole.
#[repr(C)]
struct LguestDevice {
    vdev: bindings::virtio_device,
    /// The slot, in the mapped device table.
    desc: *mut u8,
    /// The slot's guest-physical address: its status notifications'.
    desc_pa: u64,
    /// Its interrupt line.
    irq: u32,
    /// Whether `find_vqs` requested the line (and `del_vqs` must free it).
    irq_requested: bool,
}

/// The device behind `vdev`, which is always an [`LguestDevice`]'s.
fn dev_of(vdev: *mut bindings::virtio_device) -> *mut LguestDevice {
    vdev.cast()
}

impl LguestDevice {
    fn read32(&self, off: usize) -> u32 {
        // SAFETY: `desc` maps the whole slot for as long as the device
        // lives, every offset used is within it and 4-aligned; the launcher
        // writes it too, so the read is volatile.
        unsafe { ptr::read_volatile(self.desc.add(off).cast::<u32>()) }
    }

    fn write32(&self, off: usize, v: u32) {
        // SAFETY: as for `read32`.
        unsafe { ptr::write_volatile(self.desc.add(off).cast::<u32>(), v) }
    }

    fn read64(&self, off: usize) -> u64 {
        // SAFETY: as for `read32`, 8-aligned.
        unsafe { ptr::read_volatile(self.desc.add(off).cast::<u64>()) }
    }

    fn write64(&self, off: usize, v: u64) {
        // SAFETY: as for `read64`.
        unsafe { ptr::write_volatile(self.desc.add(off).cast::<u64>(), v) }
    }

    fn write16(&self, off: usize, v: u16) {
        // SAFETY: as for `read32`, 2-aligned.
        unsafe { ptr::write_volatile(self.desc.add(off).cast::<u16>(), v) }
    }

    fn read16(&self, off: usize) -> u16 {
        // SAFETY: as for `write16`.
        unsafe { ptr::read_volatile(self.desc.add(off).cast::<u16>()) }
    }

    /// Tells the launcher the slot changed; it has answered on return.
    fn notify_status(&self) {
        hcall(lhcall::NOTIFY, self.desc_pa, 0, 0);
    }

    /// The bytes of configuration space the device has.
    fn config_len(&self) -> usize {
        (self.read32(OFF_CONFIG_LEN) as usize).min(CONFIG_MAX)
    }

    /// How many of the `len` bytes at `offset` of the configuration space
    /// lie inside it (the rest is beyond the device's `config_len`).
    fn config_in_bounds(&self, offset: usize, len: usize) -> usize {
        len.min(self.config_len().saturating_sub(offset))
    }

    /// Queue `index`'s entry's offset in the slot.
    fn vq_off(index: u32) -> usize {
        OFF_QUEUES + VQ_SIZE * index as usize
    }
}

// ---- virtio_config_ops -----------------------------------------------------

/// `get`: `len` bytes of configuration space at `offset`; what lies beyond
/// the device's reads as zero.
unsafe extern "C" fn lg_get(
    vdev: *mut bindings::virtio_device,
    offset: c_uint,
    buf: *mut c_void,
    len: c_uint,
) {
    // SAFETY: the virtio core passes one of our devices.
    let dev = unsafe { &*dev_of(vdev) };
    let (offset, len) = (offset as usize, len as usize);
    let inside = dev.config_in_bounds(offset, len);
    let buf = buf.cast::<u8>();
    for i in 0..len {
        let b = if i < inside {
            // SAFETY: within the slot's configuration space (`config_len`
            // is at most CONFIG_MAX).
            unsafe { ptr::read_volatile(dev.desc.add(OFF_CONFIG + offset + i)) }
        } else {
            0
        };
        // SAFETY: the caller's buffer holds `len` bytes.
        unsafe { *buf.add(i) = b };
    }
}

/// `set`: writes what falls inside the device's configuration space.
unsafe extern "C" fn lg_set(
    vdev: *mut bindings::virtio_device,
    offset: c_uint,
    buf: *const c_void,
    len: c_uint,
) {
    // SAFETY: as for `lg_get`.
    let dev = unsafe { &*dev_of(vdev) };
    let offset = offset as usize;
    let buf = buf.cast::<u8>();
    for i in 0..dev.config_in_bounds(offset, len as usize) {
        // SAFETY: as for `lg_get`, in both directions.
        unsafe { ptr::write_volatile(dev.desc.add(OFF_CONFIG + offset + i), *buf.add(i)) };
    }
}

unsafe extern "C" fn lg_generation(vdev: *mut bindings::virtio_device) -> u32 {
    // SAFETY: as for `lg_get`.
    unsafe { &*dev_of(vdev) }.read32(OFF_GENERATION)
}

unsafe extern "C" fn lg_get_status(vdev: *mut bindings::virtio_device) -> u8 {
    // SAFETY: as for `lg_get`.
    unsafe { &*dev_of(vdev) }.read32(OFF_STATUS) as u8
}

/// `set_status`: the core passes the status it read with the new bit added,
/// so a sticky DEVICE_NEEDS_RESET stays.
unsafe extern "C" fn lg_set_status(vdev: *mut bindings::virtio_device, status: u8) {
    // SAFETY: as for `lg_get`.
    let dev = unsafe { &*dev_of(vdev) };
    dev.write32(OFF_STATUS, u32::from(status));
    dev.notify_status();
}

/// `reset`: status 0; the launcher has stopped the queues, cleared `isr`
/// and every queue's `ready` when the notification returns.
unsafe extern "C" fn lg_reset(vdev: *mut bindings::virtio_device) {
    // SAFETY: as for `lg_get`.
    let dev = unsafe { &*dev_of(vdev) };
    dev.write32(OFF_STATUS, 0);
    dev.notify_status();
}

unsafe extern "C" fn lg_get_features(vdev: *mut bindings::virtio_device) -> u64 {
    // SAFETY: as for `lg_get`.
    unsafe { &*dev_of(vdev) }.read64(OFF_DEVICE_FEATURES)
}

/// `finalize_features`: the ring code keeps the transport features it
/// knows; the driver's choice goes to `driver_features`, which the launcher
/// checks when FEATURES_OK is set.
unsafe extern "C" fn lg_finalize_features(vdev: *mut bindings::virtio_device) -> c_int {
    // SAFETY: the virtio core's device; `features` is the first word of the
    // feature union, which it filled from `get_features`.
    unsafe {
        bindings::vring_transport_features(vdev);
        let features = (*vdev).__bindgen_anon_1.features;
        if features & VIRTIO_F_VERSION_1 == 0 {
            return -(bindings::EINVAL as c_int);
        }
        (*dev_of(vdev)).write64(OFF_DRIVER_FEATURES, features);
    }
    0
}

unsafe extern "C" fn lg_bus_name(_vdev: *mut bindings::virtio_device) -> *const c_char {
    c"lguest".as_ptr().cast()
}

/// A queue's kick: its entry's guest-physical address (an eventfd in the
/// launcher, through `LGUEST_IOEVENTFD`).
unsafe extern "C" fn lg_notify(vq: *mut bindings::virtqueue) -> bool {
    // SAFETY: the ring code passes one of our queues, whose device is ours.
    let (dev, index) = unsafe { (&*dev_of((*vq).vdev), (*vq).index) };
    hcall(
        lhcall::NOTIFY,
        dev.desc_pa + LguestDevice::vq_off(index) as u64,
        0,
        0,
    );
    true
}

/// The device's interrupt: takes `isr` and passes it on.
unsafe extern "C" fn lg_interrupt(_irq: c_int, data: *mut c_void) -> bindings::irqreturn_t {
    let dev = data.cast::<LguestDevice>();
    // SAFETY: `data` is the device `find_vqs` requested the line for, which
    // lives until `del_vqs` frees the line; `isr` is a 4-aligned u32 of its
    // slot that the launcher changes atomically too.
    let isr =
        unsafe { AtomicU32::from_ptr((*dev).desc.add(OFF_ISR).cast()) }.swap(0, Ordering::SeqCst);
    let vdev = dev.cast::<bindings::virtio_device>();
    let mut ret = bindings::irqreturn::IRQ_NONE;
    if isr & ISR_CONFIG != 0 {
        // SAFETY: a registered device.
        unsafe { bindings::virtio_config_changed(vdev) };
        ret = bindings::irqreturn::IRQ_HANDLED;
    }
    if isr & ISR_QUEUE != 0 {
        for_each_vq(vdev, |vq| {
            // SAFETY: one of the device's queues, alive while on its list.
            if unsafe { bindings::vring_interrupt(0, vq.cast()) }
                == bindings::irqreturn::IRQ_HANDLED
            {
                ret = bindings::irqreturn::IRQ_HANDLED;
            }
        });
    }
    ret
}

/// Calls `f` on each queue of `vdev` (`virtio_device_for_each_vq`); `f` may
/// free the queue it is given.
fn for_each_vq(vdev: *mut bindings::virtio_device, mut f: impl FnMut(*mut bindings::virtqueue)) {
    // SAFETY: `vqs` is the device's list of queues, linked through their
    // first field (`struct virtqueue.list`), so an entry's address is its
    // queue's; the next entry is read before `f` runs.
    unsafe {
        let head = &raw mut (*vdev).vqs;
        let mut at = (*head).next;
        while at != head {
            let next = (*at).next;
            f(at.cast());
            at = next;
        }
    }
}

/// Sets up queue `index` of `dev` with the ring code's rings.
///
/// # Safety
///
/// `dev` is a registered device of ours; `name` and `callback` are the
/// driver's, which outlive the queue.
unsafe fn setup_vq(
    dev: &LguestDevice,
    index: u32,
    callback: bindings::vq_callback_t,
    name: *const c_char,
    ctx: bool,
) -> Result<*mut bindings::virtqueue, c_int> {
    if index >= MAX_QUEUES.min(dev.read32(OFF_NUM_QUEUES)) {
        return Err(-(bindings::ENOENT as c_int));
    }
    let vq_off = LguestDevice::vq_off(index);
    if dev.read16(vq_off + VQ_READY) != 0 {
        return Err(-(bindings::ENOENT as c_int));
    }
    let num = u32::from(dev.read16(vq_off + VQ_NUM_MAX));
    if num == 0 {
        return Err(-(bindings::ENOENT as c_int));
    }
    let vdev = (&raw const dev.vdev).cast_mut();
    // SAFETY: the caller's promises; weak barriers (the launcher is a
    // process on the same machine), a smaller ring if memory is short.
    let vq = unsafe {
        bindings::vring_create_virtqueue(
            index,
            num,
            VRING_ALIGN,
            vdev,
            true,
            true,
            ctx,
            Some(lg_notify),
            callback,
            name,
        )
    };
    if vq.is_null() {
        return Err(-(bindings::ENOMEM as c_int));
    }
    // SAFETY: the queue just made.
    unsafe {
        (*vq).num_max = num;
        dev.write16(
            vq_off + VQ_NUM,
            bindings::virtqueue_get_vring_size(vq) as u16,
        );
        dev.write64(vq_off + VQ_DESC, bindings::virtqueue_get_desc_addr(vq));
        dev.write64(vq_off + VQ_DRIVER, bindings::virtqueue_get_avail_addr(vq));
        dev.write64(vq_off + VQ_DEVICE, bindings::virtqueue_get_used_addr(vq));
    }
    // The launcher reads the entry when DRIVER_OK is set.
    dev.write16(vq_off + VQ_READY, 1);
    Ok(vq)
}

/// `del_vqs`: every queue's rings, and the interrupt line.
unsafe extern "C" fn lg_del_vqs(vdev: *mut bindings::virtio_device) {
    let dev = dev_of(vdev);
    for_each_vq(vdev, |vq| {
        // SAFETY: one of the device's queues; deleting unlinks it (the
        // walk has the next entry already).
        unsafe {
            (*dev).write16(LguestDevice::vq_off((*vq).index) + VQ_READY, 0);
            bindings::vring_del_virtqueue(vq);
        }
    });
    // SAFETY: our device; the line was requested with it as the cookie.
    unsafe {
        if (*dev).irq_requested {
            bindings::free_irq((*dev).irq, dev.cast());
            (*dev).irq_requested = false;
        }
    }
}

/// `find_vqs`: the interrupt line, then a queue per named entry of
/// `vqs_info` (unnamed ones get none and use no queue number).
unsafe extern "C" fn lg_find_vqs(
    vdev: *mut bindings::virtio_device,
    nvqs: c_uint,
    vqs: *mut *mut bindings::virtqueue,
    vqs_info: *mut bindings::virtqueue_info,
    _desc: *mut bindings::irq_affinity,
) -> c_int {
    let dev = dev_of(vdev);
    // SAFETY: our device, registered; its name is the core's ("virtioN"),
    // which lives as long as the device, which outlives the line.
    let r = unsafe {
        setup_irq((*dev).irq, Some(bindings::handle_simple_irq));
        bindings::request_threaded_irq(
            (*dev).irq,
            Some(lg_interrupt),
            None,
            0,
            (*vdev).dev.kobj.name,
            dev.cast(),
        )
    };
    if r != 0 {
        return r;
    }
    // SAFETY: as above.
    unsafe { (*dev).irq_requested = true };
    let mut queue = 0;
    for i in 0..nvqs as usize {
        // SAFETY: the core passes `nvqs` entries in each array.
        let (info, slot) = unsafe { (&*vqs_info.add(i), vqs.add(i)) };
        if info.name.is_null() {
            // SAFETY: as above.
            unsafe { *slot = ptr::null_mut() };
            continue;
        }
        // SAFETY: our device; the driver's name and callback.
        match unsafe { setup_vq(&*dev, queue, info.callback, info.name, info.ctx) } {
            Ok(vq) => {
                // SAFETY: as above.
                unsafe { *slot = vq };
                queue += 1;
            }
            Err(e) => {
                // SAFETY: our device.
                unsafe { lg_del_vqs(vdev) };
                return e;
            }
        }
    }
    0
}

/// The transport's operations (the ones left out are optional).
static OPS: bindings::virtio_config_ops = bindings::virtio_config_ops {
    get: Some(lg_get),
    set: Some(lg_set),
    generation: Some(lg_generation),
    get_status: Some(lg_get_status),
    set_status: Some(lg_set_status),
    reset: Some(lg_reset),
    find_vqs: Some(lg_find_vqs),
    del_vqs: Some(lg_del_vqs),
    synchronize_cbs: None,
    get_features: Some(lg_get_features),
    get_extended_features: None,
    finalize_features: Some(lg_finalize_features),
    bus_name: Some(lg_bus_name),
    set_vq_affinity: None,
    get_vq_affinity: None,
    get_shm_region: None,
    disable_vq_and_reset: None,
    enable_vq_after_reset: None,
};

/// The device's `release`, when its last reference goes: the memory
/// [`lguest_virtio_init`] gave it.
unsafe extern "C" fn lg_release(d: *mut bindings::device) {
    // SAFETY: `d` is the `dev` of one of our devices, which
    // `lguest_virtio_init` made with `KBox::into_raw`; this is the last
    // reference to it.
    unsafe {
        let vdev = d
            .byte_sub(core::mem::offset_of!(bindings::virtio_device, dev))
            .cast::<bindings::virtio_device>();
        drop(KBox::from_raw(dev_of(vdev)));
    }
}

/// Registers the device in slot `index` of the table at `table` (the
/// guest-physical `table_pa`), a child of `root`.
fn register(
    table: *mut u8,
    table_pa: u64,
    index: usize,
    root: *mut bindings::device,
) -> Result<(), c_int> {
    // SAFETY: all-zero is a valid `struct virtio_device` (a device that is
    // not initialized yet, no callbacks); the slot is in the mapped table.
    let dev = unsafe {
        LguestDevice {
            vdev: core::mem::zeroed(),
            desc: table.add(index * DESC_SIZE),
            desc_pa: table_pa + (index * DESC_SIZE) as u64,
            irq: 0,
            irq_requested: false,
        }
    };
    let device_type = dev.read32(OFF_TYPE);
    let irq = dev.read32(OFF_IRQ);
    if irq == TIMER_IRQ || irq > MAX_IRQ {
        // SAFETY: a format with two unsigned arguments.
        unsafe {
            bindings::_printk(
                c"\x013lguest: bus slot %u: interrupt %u is not a device's\n"
                    .as_ptr()
                    .cast(),
                index as c_uint,
                irq,
            )
        };
        return Err(-(bindings::EINVAL as c_int));
    }
    let dev = KBox::new(LguestDevice { irq, ..dev }, GFP_KERNEL)
        .map_err(|_| -(bindings::ENOMEM as c_int))?;
    let dev = KBox::into_raw(dev);
    // SAFETY: the device is ours until registered; from then on the driver
    // core owns it and frees it through `release` (also when registering
    // fails, after `put_device`).
    unsafe {
        (*dev).vdev.id.device = device_type;
        (*dev).vdev.id.vendor = 0;
        (*dev).vdev.config = &OPS;
        (*dev).vdev.dev.release = Some(lg_release);
        (*dev).vdev.dev.parent = root;
        let vdev = &raw mut (*dev).vdev;
        let r = bindings::register_virtio_device(vdev);
        if r != 0 {
            bindings::put_device(&raw mut (*vdev).dev);
            return Err(r);
        }
    }
    Ok(())
}

/// A device initcall: the bus's devices (the virtio core is up since
/// `core_initcall`; the drivers bind when they register, before or after).
#[link_section = ".init.text"]
unsafe extern "C" fn lguest_virtio_init() -> c_int {
    let table_pa = super::RAM_END.get();
    // SAFETY: the device window's first page, above RAM, which the host
    // maps for the guest; write-back like the rest of its memory.
    let table = unsafe { bindings::memremap(table_pa, 4096, bindings::MEMREMAP_WB as c_ulong) }
        .cast::<u8>();
    if table.is_null() {
        return -(bindings::ENOMEM as c_int);
    }
    // The devices' parent, /sys/devices/lguest, as the original lguest's
    // `lguest_root`: the virtio core follows a device's parent (its
    // `num_vf`, which rtnetlink calls for a link dump that asks for VF
    // information, as iproute2's `ip link` and `ip addr` do), and a device
    // without one is a NULL dereference there.
    // SAFETY: a NUL-terminated name that lives forever; no owning module
    // (built in).
    let root = unsafe { bindings::__root_device_register(c"lguest".as_ptr().cast(), ptr::null_mut()) };
    // An ERR_PTR: the top MAX_ERRNO addresses.
    if root.is_null() || root as usize > usize::MAX - bindings::MAX_ERRNO as usize {
        return -(bindings::ENOMEM as c_int);
    }
    for index in 0..MAX_DEVICES {
        // SAFETY: the slot's first word, in the mapped table.
        if unsafe { ptr::read_volatile(table.add(index * DESC_SIZE).cast::<u32>()) } == 0 {
            break;
        }
        if let Err(e) = register(table, table_pa, index, root) {
            // SAFETY: a format with two int arguments.
            unsafe {
                bindings::_printk(
                    c"\x013lguest: bus slot %u: not registered (%d)\n"
                        .as_ptr()
                        .cast(),
                    index as c_uint,
                    e,
                )
            };
        }
    }
    // The table stays mapped: the devices use it for as long as they live.
    0
}

core::arch::global_asm!(
    ".pushsection .initcall6.init, \"a\"",
    ".long {init} - .",
    ".popsection",
    init = sym lguest_virtio_init,
);
