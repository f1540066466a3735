// SPDX-License-Identifier: GPL-2.0

//! lguest-rs's paravirt backend for Linux: what `arch/x86/lguest/boot.c`
//! was for the original lguest's i386 guests, written in Rust.
//!
//! The launcher starts the kernel at `lguest_entry` (`head_64.S`), which
//! registers [`LGUEST_DATA`] with the host, switches to a page table that
//! maps the image where it is linked and calls [`lguest_start_kernel`]. That
//! fills `pv_ops` and the `x86_init`/`x86_platform` hooks, gives the kernel
//! a direct map of its RAM and an early IDT, and enters the native boot at
//! `x86_64_start_reservations()`, as Xen's `xen_start_kernel()` does.
//!
//! The hooks that must keep every register (`pv_ops.irq`, `read_cr2`) are
//! `head_64.S`'s; everything else is here. The host's ABI is lguest-rs's
//! `Documentation/guest-abi.rst`; the numbers below are its
//! `include/uapi/linux/lguest.h`.

use core::cell::UnsafeCell;
use core::mem::offset_of;
use core::ptr;
use kernel::ffi::{c_char, c_int, c_uint, c_ulong, c_void};

use kernel::bindings;

mod virtio;

/// Hypercall numbers (`LHCALL_*`).
mod lhcall {
    pub(crate) const SHUTDOWN: u64 = 2;
    pub(crate) const NEW_PGTABLE: u64 = 4;
    pub(crate) const FLUSH_TLB: u64 = 5;
    pub(crate) const LOAD_IDT_ENTRY: u64 = 6;
    pub(crate) const SET_CLOCKEVENT: u64 = 9;
    pub(crate) const HALT: u64 = 10;
    pub(crate) const NOTIFY: u64 = 17;
    pub(crate) const SET_SYSCALL: u64 = 21;
    pub(crate) const SET_SEGMENT_BASE: u64 = 22;
    pub(crate) const INVLPG: u64 = 24;
    pub(crate) const GET_SEGMENT_BASE: u64 = 25;
    pub(crate) const IBPB: u64 = 26;
    pub(crate) const SET_DEBUGREGS: u64 = 27;
}

/// `LHCALL_IBPB` flags: a barrier now, and one at every entry to this
/// kernel from user mode; its result `LGUEST_IBPB_DONE`.
const IBPB_NOW: u64 = 1;
const IBPB_USER_ENTRY: u64 = 2;
const IBPB_DONE: u64 = 0;

/// `LHCALL_SHUTDOWN` reasons.
const SHUTDOWN_POWEROFF: u64 = 1;
const SHUTDOWN_RESTART: u64 = 2;
const SHUTDOWN_CRASH: u64 = 3;

/// `LHCALL_SET_SYSCALL` flag: the direct entry (the native contract, and
/// the return by `int $LGUEST_SYSRET_VECTOR`).
const SYSCALL_DIRECT: u64 = 1;

/// `LHCALL_SET_SEGMENT_BASE` selectors.
const BASE_FS: u64 = 0;
const BASE_GS: u64 = 1;
const BASE_USER_GS: u64 = 2;

/// The vectors the host keeps (NMI, #DF, #MC, its hypercall gate): never
/// given to `LHCALL_LOAD_IDT_ENTRY`.
const HOST_VECTORS: [c_int; 4] = [2, 8, 18, 0x1f];

/// `struct lguest_data`: the page the guest shares with the host.
#[repr(C, align(4096))]
struct LguestData {
    irq_enabled: u64,
    blocked_interrupts: [u64; 1],
    cr2: u64,
    time_sec: u64,
    time_nsec: u64,
    irq_pending: u64,
    hcall_status: [u8; 64],
    hcalls: [[u64; 5]; 64],
    reserve_mem: u64,
    tsc_khz: u32,
    pad0: u32,
    noirq_iret: u64,
    kernel_address: u64,
    syscall_vec: u32,
    pad1: u32,
    kernel_sp0: u64,
    dr6: u64,
    debugreg: [u64; 4],
}

// The offsets head_64.S uses, and the ABI's (guest-abi.rst).
const _: () = assert!(offset_of!(LguestData, irq_enabled) == 0);
const _: () = assert!(offset_of!(LguestData, cr2) == 16);
const _: () = assert!(offset_of!(LguestData, irq_pending) == 40);
const _: () = assert!(offset_of!(LguestData, reserve_mem) == 2672);
const _: () = assert!(offset_of!(LguestData, kernel_sp0) == 2712);
const _: () = assert!(offset_of!(LguestData, dr6) == 2720);
const _: () = assert!(offset_of!(LguestData, debugreg) == 2728);

/// [`LguestData`] as a static the host writes behind the compiler's back.
#[repr(transparent)]
struct Shared(UnsafeCell<LguestData>);

// SAFETY: the kernel is uniprocessor (LGUEST_GUEST depends on !SMP), and
// every access goes through volatile reads and writes of single fields.
unsafe impl Sync for Shared {}

/// The shared page. In `.data` rather than `.bss`: the entry registers it
/// before `clear_bss()` runs, and the host has written into it by then. The
/// async ring's status bytes start free (0xff), every interrupt blocked.
#[export_name = "lguest_data"]
#[link_section = ".data..page_aligned"]
static LGUEST_DATA: Shared = Shared(UnsafeCell::new(LguestData {
    irq_enabled: 0,
    // Every interrupt blocked until the kernel has a handler for it (the
    // host kills a guest it cannot deliver an unblocked interrupt to).
    blocked_interrupts: [u64::MAX; 1],
    cr2: 0,
    time_sec: 0,
    time_nsec: 0,
    irq_pending: 0,
    hcall_status: [0xff; 64],
    hcalls: [[0; 5]; 64],
    reserve_mem: 0,
    tsc_khz: 0,
    pad0: 0,
    noirq_iret: 0,
    kernel_address: 0,
    syscall_vec: 0,
    pad1: 0,
    kernel_sp0: 0,
    dr6: DR6_RESERVED,
    debugreg: [0; 4],
}));

/// Reads a field of the shared page.
macro_rules! ld_read {
    ($field:ident) => {
        // SAFETY: the field of a static, aligned; volatile because the host
        // writes it.
        unsafe { ptr::addr_of!((*LGUEST_DATA.0.get()).$field).read_volatile() }
    };
}

/// Writes a field of the shared page.
macro_rules! ld_write {
    ($field:ident, $value:expr) => {
        // SAFETY: as for `ld_read`; the guest owns the fields it writes.
        unsafe { ptr::addr_of_mut!((*LGUEST_DATA.0.get()).$field).write_volatile($value) }
    };
}

/// Makes hypercall `nr`.
/// A hypercall that returns a value in RAX (`LHCALL_GET_SEGMENT_BASE`).
fn hcall_value(nr: u64, a1: u64) -> u64 {
    let v;
    // SAFETY: as for `hcall`: the host changes only RAX, its result, and
    // touches no guest memory for this call.
    unsafe {
        core::arch::asm!(
            "int 0x1f",
            inout("rax") nr => v,
            in("rdi") a1,
            options(nostack)
        );
    }
    v
}

fn hcall(nr: u64, a1: u64, a2: u64, a3: u64) {
    // SAFETY: `int $0x1f` enters the host, which changes no register but
    // RAX and reads or writes only the guest memory the call names (every
    // caller passes memory it owns); it does not use the guest's stack.
    unsafe {
        core::arch::asm!(
            "int 0x1f",
            inout("rax") nr => _,
            in("rdi") a1,
            in("rsi") a2,
            in("rdx") a3,
            options(nostack)
        );
    }
}

/// Where the x86-64 kernel image is linked (`__START_KERNEL_map`).
const START_KERNEL_MAP: u64 = 0xffff_ffff_8000_0000;

/// The guest-physical address of something in the kernel image.
fn pa_symbol<T>(p: *const T) -> u64 {
    // SAFETY: `phys_base` is written only by the native boot, which does
    // not run here; reading it is reading a u64.
    let base = unsafe { ptr::addr_of!(bindings::phys_base).read() };
    p as u64 - START_KERNEL_MAP + base as u64
}

/// A value cell for the hooks' small state (CR3, MSRs).
struct Cell64(UnsafeCell<u64>);

// SAFETY: uniprocessor, and the hooks that use these run with the state
// they guard (a CR3 write, an MSR write) serialized by the kernel.
unsafe impl Sync for Cell64 {}

impl Cell64 {
    const fn new(v: u64) -> Self {
        Self(UnsafeCell::new(v))
    }
    fn get(&self) -> u64 {
        // SAFETY: see the Sync impl.
        unsafe { *self.0.get() }
    }
    fn set(&self, v: u64) {
        // SAFETY: see the Sync impl.
        unsafe { *self.0.get() = v }
    }
}

// ---- pv_ops.cpu ----------------------------------------------------------

/// CR0 as a native long-mode kernel has it (PE MP ET NE WP AM PG).
const VIRT_CR0: c_ulong = 0x8005_0033;

/// KVM's forced-emulation prefix (`ud2; "kvm"`, which objtool decodes as a
/// prefix; the host takes it as its own `"lgu"`): the host answers the `cpuid`
/// after it from the launcher's table, on any host.
unsafe extern "C" fn lguest_cpuid(
    eax: *mut c_uint,
    ebx: *mut c_uint,
    ecx: *mut c_uint,
    edx: *mut c_uint,
) {
    // SAFETY: the kernel passes four valid pointers.
    let (leaf, sub) = unsafe { (*eax, *ecx) };
    let (mut a, mut b, mut c, mut d): (u32, u32, u32, u32);
    // SAFETY: the prefix makes the host emulate the cpuid (it raises #UD,
    // which the host turns into the instruction's result and skips); RBX
    // is saved and restored around it as LLVM needs.
    unsafe {
        core::arch::asm!(
            "mov {t:r}, rbx",
            ".byte 0x0f, 0x0b, 0x6b, 0x76, 0x6d",
            "cpuid",
            "xchg {t:r}, rbx",
            t = out(reg) b,
            inout("eax") leaf => a,
            inout("ecx") sub => c,
            out("edx") d,
            options(nostack)
        );
    }
    mask_cpuid(leaf, sub, &mut a, &mut b, &mut c, &mut d);
    // SAFETY: as above.
    unsafe {
        *eax = a;
        *ebx = b;
        *ecx = c;
        *edx = d;
    }
}

/// What the guest kernel must not see, beyond the launcher's filter: the
/// features a ring-3 kernel cannot use (local APIC, MCE, MTRR, PAT, power
/// and performance monitoring, INVPCID, the speculation-control MSRs,
/// supervisor-only state), so that Linux never reaches for them. PCID is
/// always shown: the host implements it for the shadows, whatever the CPU
/// has (`lguest_write_cr3`).
fn mask_cpuid(leaf: u32, sub: u32, a: &mut u32, b: &mut u32, c: &mut u32, d: &mut u32) {
    let bits = |list: &[u32]| list.iter().fold(0u32, |m, &bit| m | 1 << bit);
    match leaf {
        1 => {
            // MONITOR VMX SMX EST TM2 PDCM DCA x2APIC TSC-deadline
            *c &= !bits(&[3, 5, 6, 7, 8, 15, 18, 21, 24]);
            // PCID, the hypervisor bit
            *c |= 1 << 17 | 1 << 31;
            // MCE APIC MTRR MCA PAT DS ACPI TM PBE
            *d &= !bits(&[7, 9, 12, 14, 16, 21, 22, 29, 31]);
        }
        6 | 0xa => (*a, *b, *c, *d) = (0, 0, 0, 0),
        7 if sub == 0 => {
            // HLE SMEP INVPCID RTM RDT-M MPX RDT-A SMAP PT
            *b &= !bits(&[4, 7, 10, 11, 12, 14, 15, 20, 25]);
            // UMIP PKU OSPKE WAITPKG CET-SS LA57 RDPID
            *c &= !bits(&[2, 3, 4, 5, 7, 16, 22]);
            // MD_CLEAR hybrid IBT SPEC_CTRL STIBP L1D_FLUSH ARCH_CAPS CORE_CAPS SSBD
            *d &= !bits(&[10, 15, 20, 26, 27, 28, 29, 30, 31]);
        }
        // FRED LKGS LAM
        7 if sub == 1 => *a &= !bits(&[17, 18, 26]),
        // XSAVES
        0xd if sub == 1 => *a &= !bits(&[3]),
        // SVM
        0x8000_0001 => {
            *c &= !bits(&[2]);
            // 1 GiB pages, RDTSCP
            *d &= !bits(&[26, 27]);
        }
        // IBPB IBRS STIBP SSBD VIRT_SSBD
        0x8000_0008 => *b &= !bits(&[12, 14, 15, 24, 25]),
        _ => {}
    }
}

const MSR_EFER: u32 = 0xc000_0080;
const MSR_STAR: u32 = 0xc000_0081;
const MSR_LSTAR: u32 = 0xc000_0082;
const MSR_CSTAR: u32 = 0xc000_0083;
const MSR_SYSCALL_MASK: u32 = 0xc000_0084;
const MSR_FS_BASE: u32 = 0xc000_0100;
const MSR_GS_BASE: u32 = 0xc000_0101;
const MSR_KERNEL_GS_BASE: u32 = 0xc000_0102;
const MSR_IA32_SYSENTER_CS: u32 = 0x174;
const MSR_IA32_SYSENTER_ESP: u32 = 0x175;
const MSR_IA32_SYSENTER_EIP: u32 = 0x176;
const MSR_IA32_CR_PAT: u32 = 0x277;

/// EFER as the guest's kernel runs: SCE, LME, LMA, NXE.
const VIRT_EFER: u64 = 0xd01;

/// The MSRs the guest may read and write: the segment bases (which go to
/// the host) and the ones a kernel sets at boot for a SYSCALL entry and a
/// PAT the host owns (kept, and ignored).
static FS_BASE: Cell64 = Cell64::new(0);
static GS_BASE: Cell64 = Cell64::new(0);
// MSR_KERNEL_GS_BASE (user mode's GS base) lives in the host only: user
// mode may change it with wrgsbase, so reads ask the host.
// MSR_LSTAR (index 1) is also the system-call entry (`write_msr`).
static KEPT: [Cell64; 8] = [const { Cell64::new(0) }; 8];
const KEPT_MSRS: [u32; 8] = [
    MSR_STAR,
    MSR_LSTAR,
    MSR_CSTAR,
    MSR_SYSCALL_MASK,
    MSR_IA32_SYSENTER_CS,
    MSR_IA32_SYSENTER_ESP,
    MSR_IA32_SYSENTER_EIP,
    MSR_IA32_CR_PAT,
];

/// The value of `msr`, or `None` for one the guest has not got.
fn read_msr(msr: u32) -> Option<u64> {
    match msr {
        MSR_EFER => Some(VIRT_EFER),
        MSR_FS_BASE => Some(FS_BASE.get()),
        MSR_GS_BASE => Some(GS_BASE.get()),
        // User mode's, as it left it: it may have run wrgsbase since.
        MSR_KERNEL_GS_BASE => Some(hcall_value(lhcall::GET_SEGMENT_BASE, BASE_USER_GS)),
        _ => KEPT_MSRS
            .iter()
            .position(|&m| m == msr)
            .map(|i| KEPT[i].get()),
    }
}

/// Writes `msr`; `false` for one the guest has not got.
fn write_msr(msr: u32, val: u64) -> bool {
    let base = |cell: Option<&Cell64>, which| {
        if let Some(cell) = cell {
            cell.set(val);
        }
        hcall(lhcall::SET_SEGMENT_BASE, which, val, 0);
        true
    };
    match msr {
        MSR_EFER => true,
        MSR_LSTAR => {
            KEPT[1].set(val);
            // The native entry cannot run in ring 3 (swapgs): the host's
            // switcher enters lguest_entry_SYSCALL_64 instead, directly
            // (LGUEST_SYSCALL_DIRECT), which joins it after its swapgs.
            // Any other entry: syscall is #UD.
            let (entry, flags) = if val == bindings::entry_SYSCALL_64 as *const () as u64 {
                (lguest_entry_SYSCALL_64 as *const () as u64, SYSCALL_DIRECT)
            } else {
                (0, 0)
            };
            hcall(lhcall::SET_SYSCALL, entry, flags, 0);
            true
        }
        MSR_FS_BASE => base(Some(&FS_BASE), BASE_FS),
        MSR_GS_BASE => base(Some(&GS_BASE), BASE_GS),
        MSR_KERNEL_GS_BASE => base(None, BASE_USER_GS),
        _ => match KEPT_MSRS.iter().position(|&m| m == msr) {
            Some(i) => {
                KEPT[i].set(val);
                true
            }
            None => false,
        },
    }
}

/// The kernel's -EIO, for the `_safe` MSR hooks.
const EIO: c_int = 5;

unsafe extern "C" fn lguest_read_msr(msr: u32) -> u64 {
    read_msr(msr).unwrap_or(0)
}

unsafe extern "C" fn lguest_write_msr(msr: u32, val: u64) {
    write_msr(msr, val);
}

unsafe extern "C" fn lguest_read_msr_safe(msr: u32, val: *mut u64) -> c_int {
    let (v, err) = match read_msr(msr) {
        Some(v) => (v, 0),
        None => (0, -EIO),
    };
    // SAFETY: the kernel passes a valid pointer.
    unsafe { *val = v };
    err
}

unsafe extern "C" fn lguest_write_msr_safe(msr: u32, val: u64) -> c_int {
    if write_msr(msr, val) {
        0
    } else {
        -EIO
    }
}

unsafe extern "C" fn lguest_read_pmc(_counter: c_int) -> u64 {
    0
}

/// DR6 with no condition reported (its reserved bits read as 1).
const DR6_RESERVED: u64 = 0xffff_0ff0;

/// The debug registers. DR6 is the one the host fills in, at each debug
/// exception it reflects (`lguest_data.dr6`), so that the #DB handler
/// sees a single-step or a breakpoint as the CPU reported it and signals
/// the process; the handler's write of the reset value clears it. DR0-DR3
/// go to `lguest_data.debugreg`, and DR7 to the host with them
/// (`LHCALL_SET_DEBUGREGS`) when it changes, or when an address it enables
/// does: the host arms the breakpoints on user addresses (a process's,
/// from `ptrace` and perf), in the CPU from the next entry on. A
/// breakpoint it refuses (a kernel address) never fires. DR4 and DR5 read
/// as 0.
static DR7: Cell64 = Cell64::new(0);

unsafe extern "C" fn lguest_get_debugreg(regno: c_int) -> c_ulong {
    match regno {
        // SAFETY: a field of the shared page, as `ld_read`.
        0..=3 => unsafe {
            ptr::addr_of!((*LGUEST_DATA.0.get()).debugreg[regno as usize]).read_volatile()
                as c_ulong
        },
        6 => ld_read!(dr6) as c_ulong,
        7 => DR7.get() as c_ulong,
        _ => 0,
    }
}

unsafe extern "C" fn lguest_set_debugreg(regno: c_int, value: c_ulong) {
    let value = value as u64;
    match regno {
        0..=3 => {
            // SAFETY: a field of the shared page, as `ld_write`.
            unsafe {
                ptr::addr_of_mut!((*LGUEST_DATA.0.get()).debugreg[regno as usize])
                    .write_volatile(value)
            };
            if DR7.get() & (3 << (2 * regno)) != 0 {
                hcall_value(lhcall::SET_DEBUGREGS, DR7.get());
            }
        }
        6 => ld_write!(dr6, value),
        7 if value != DR7.get() => {
            DR7.set(value);
            hcall_value(lhcall::SET_DEBUGREGS, value);
        }
        _ => {}
    }
}

unsafe extern "C" fn lguest_read_cr0() -> c_ulong {
    VIRT_CR0
}

unsafe extern "C" fn lguest_write_cr0(_value: c_ulong) {}

unsafe extern "C" fn lguest_write_cr4(_value: c_ulong) {}

unsafe extern "C" fn lguest_store_tr() -> c_ulong {
    // GDT_ENTRY_TSS * 8: the kernel's own selector; the host owns the TR.
    8 * 8
}

unsafe extern "C" fn lguest_load_sp0(sp0: c_ulong) {
    // The host reads it when an event arrives in guest user mode.
    ld_write!(kernel_sp0, sp0 as u64);
}

unsafe extern "C" fn lguest_write_gdt_entry(
    dt: *mut bindings::desc_struct,
    entry: c_int,
    desc: *const c_void,
    size: c_int,
) {
    // The host never loads the guest's GDT; keep it true for the kernel's
    // own readers. SAFETY: the kernel's descriptor table and a descriptor of
    // `size` bytes, as native_write_gdt_entry() copies.
    unsafe {
        ptr::copy_nonoverlapping(
            desc.cast::<u8>(),
            dt.add(entry as usize).cast::<u8>(),
            size as usize,
        )
    };
}

unsafe extern "C" fn lguest_write_idt_entry(
    dt: *mut bindings::gate_desc,
    entry: c_int,
    gate: *const bindings::gate_desc,
) {
    let mut raw = [0u8; 16];
    // SAFETY: `gate` is a 16-byte gate descriptor, `dt` the kernel's IDT of
    // 256 of them (the native hook copies the same way).
    unsafe {
        ptr::copy_nonoverlapping(gate.cast::<u8>(), raw.as_mut_ptr(), 16);
        ptr::copy_nonoverlapping(raw.as_ptr(), dt.add(entry as usize).cast::<u8>(), 16);
    }
    if HOST_VECTORS.contains(&entry) {
        return;
    }
    let word = |at: usize| u64::from(u16::from_le_bytes([raw[at], raw[at + 1]]));
    let high = u64::from(u32::from_le_bytes([raw[8], raw[9], raw[10], raw[11]]));
    let handler = word(0) | word(6) << 16 | high << 32;
    let bits = word(4);
    let (kind, present, dpl) = ((bits >> 8) & 0x1f, bits & 0x8000 != 0, (bits >> 13) & 3);
    // The host turns a user-mode `int $0x80` into vector 0x80 wherever the
    // guest has a handler there (the ABI's system-call vector). Linux's own
    // gate for it, with IA32 emulation, has DPL 3; without, vector 0x80 is
    // a device interrupt's, DPL 0, which a process's `int $0x80` must not
    // reach (natively it is a #GP). No lguest device uses that vector.
    let user_int80_refused = entry == 0x80 && dpl != 3;
    // Only 64-bit interrupt (0xe) and trap (0xf) gates mean anything here;
    // the IST index is the host's business (there are no stack switches).
    if !present || user_int80_refused {
        hcall(lhcall::LOAD_IDT_ENTRY, entry as u64, 0, 0xe);
    } else if kind == 0xe || kind == 0xf {
        hcall(lhcall::LOAD_IDT_ENTRY, entry as u64, handler, kind);
    }
}

unsafe extern "C" fn lguest_nop() {}

unsafe extern "C" fn lguest_load_table(_table: *const bindings::desc_ptr) {}

unsafe extern "C" fn lguest_set_ldt(_desc: *const c_void, _entries: c_uint) {}

/// No TLS descriptors: the guest is 64-bit only (no IA32 emulation).
unsafe extern "C" fn lguest_load_tls(_t: *mut bindings::thread_struct, _cpu: c_uint) {}

/// The guest's user GS is a base (`MSR_KERNEL_GS_BASE`), never a selector.
unsafe extern "C" fn lguest_load_gs_index(_index: c_uint) {}

/// No LDTs (MODIFY_LDT_SYSCALL is off).
unsafe extern "C" fn lguest_ldt(_ldt: *mut bindings::desc_struct, _entries: c_uint) {}

unsafe extern "C" fn lguest_write_ldt_entry(
    _ldt: *mut bindings::desc_struct,
    _entry: c_int,
    _desc: *const c_void,
) {
}

// ---- pv_ops.irq and pv_ops.mmu -------------------------------------------

extern "C" {
    fn lguest_entry_SYSCALL_64();
    fn lguest_save_fl();
    fn lguest_irq_disable();
    fn lguest_irq_enable();
    fn lguest_read_cr2();
}

/// `hlt` with interrupts on (the idle loop's): the host turns the virtual
/// IF on and sleeps until an interrupt can be delivered, the clock event's
/// at the latest when the tick is running.
unsafe extern "C" fn lguest_safe_halt() {
    hcall(lhcall::HALT, 0, 0, 0);
}

/// `hlt`: with interrupts off nothing could wake the CPU, so the guest is
/// over.
unsafe extern "C" fn lguest_halt() {
    if ld_read!(irq_enabled) == 0 {
        shutdown(c"lguest: halted with interrupts off", SHUTDOWN_CRASH);
    }
    hcall(lhcall::HALT, 0, 0, 0);
}

/// The guest's CR3 as the kernel last wrote it.
static CR3: Cell64 = Cell64::new(0);

/// The address bits of CR3.
const CR3_ADDR_MASK: u64 = 0x000f_ffff_ffff_f000;
/// CR3's PCID (with CR4.PCIDE) and its no-flush bit, which a read never
/// returns. The host takes both as they are
/// (`LGUEST_PGTABLE_PCID_MASK`, `LGUEST_PGTABLE_NOFLUSH`).
const CR3_PCID_MASK: u64 = 0xfff;
const CR3_NOFLUSH: u64 = 1 << 63;

unsafe extern "C" fn lguest_read_cr3() -> c_ulong {
    CR3.get() as c_ulong
}

/// A CR3 write: the host keeps each PCID's shadow while another is current,
/// and gives it back on a write with the no-flush bit, so that a context
/// switch Linux's ASID bookkeeping says needs no flush refaults nothing.
unsafe extern "C" fn lguest_write_cr3(value: c_ulong) {
    let v = value as u64;
    CR3.set(v & !CR3_NOFLUSH);
    hcall(lhcall::NEW_PGTABLE, v & CR3_ADDR_MASK, v & (CR3_PCID_MASK | CR3_NOFLUSH), 0);
}

unsafe extern "C" fn lguest_write_cr2(value: c_ulong) {
    ld_write!(cr2, value as u64);
}

unsafe extern "C" fn lguest_flush_tlb_user() {
    hcall(lhcall::FLUSH_TLB, 0, 0, 0);
}

unsafe extern "C" fn lguest_flush_tlb_kernel() {
    hcall(lhcall::FLUSH_TLB, 1, 0, 0);
}

unsafe extern "C" fn lguest_flush_tlb_one_user(addr: c_ulong) {
    hcall(lhcall::INVLPG, addr as u64, 0, 0);
}

// ---- interrupts and the clock event --------------------------------------

/// The host delivers its interrupt `n` at vector 32 + `n` (guest-abi.rst):
/// `FIRST_EXTERNAL_VECTOR`, whose gates `native_init_IRQ()` points at
/// `irq_entries_start`, so `common_interrupt()` finds the irq in
/// `vector_irq` and runs its flow handler.
const FIRST_EXTERNAL_VECTOR: usize = 0x20;
/// The host's clock event raises interrupt 0.
const TIMER_IRQ: u32 = 0;
/// The host arms no clock event sooner than this (`LHCALL_SET_CLOCKEVENT`).
const CLOCK_MIN_DELTA_NS: u64 = 1000;
/// `KTIME_MAX`: no limit on how far ahead the event may be set.
const CLOCK_MAX_DELTA_NS: u64 = i64::MAX as u64;

/// Blocks (`true`) or unblocks interrupt `irq` in `blocked_interrupts`,
/// which the host reads before it delivers one and never writes.
fn set_blocked(irq: u32, block: bool) {
    if irq >= 64 {
        return;
    }
    let bit = 1u64 << irq;
    // SAFETY: a field of the shared page (see `ld_read`); the irq core
    // calls the chip with the descriptor locked and interrupts off, and
    // the host only reads the word, so the read-modify-write is not torn.
    unsafe {
        let p = ptr::addr_of_mut!((*LGUEST_DATA.0.get()).blocked_interrupts).cast::<u64>();
        let v = p.read_volatile();
        p.write_volatile(if block { v | bit } else { v & !bit });
    }
}

/// `irq_chip.irq_mask`: the host holds the interrupt back.
unsafe extern "C" fn lguest_irq_mask(data: *mut bindings::irq_data) {
    // SAFETY: the irq core passes the descriptor's irq_data.
    set_blocked(unsafe { (*data).irq }, true);
}

/// `irq_chip.irq_unmask`: the host may deliver it again (at its next
/// entry into the guest).
unsafe extern "C" fn lguest_irq_unmask(data: *mut bindings::irq_data) {
    // SAFETY: as for `lguest_irq_mask`.
    set_blocked(unsafe { (*data).irq }, false);
}

/// A kernel structure the kernel takes a pointer to and then owns.
struct KernelOwned<T>(UnsafeCell<T>);

// SAFETY: each is filled once at boot, single-threaded, before its pointer
// is handed to the kernel, which serializes every later access itself.
unsafe impl<T> Sync for KernelOwned<T> {}

/// The interrupt chip: `blocked_interrupts` is its mask register.
// SAFETY: all-zero is a valid `struct irq_chip` (no name, no callbacks).
static IRQ_CHIP: KernelOwned<bindings::irq_chip> =
    KernelOwned(UnsafeCell::new(unsafe { core::mem::zeroed() }));

/// The host's one-shot timer as a clock event device.
// SAFETY: all-zero is a valid `struct clock_event_device` (detached, no
// callbacks).
static CLOCK_EVENT: KernelOwned<bindings::clock_event_device> =
    KernelOwned(UnsafeCell::new(unsafe { core::mem::zeroed() }));

/// `set_next_event`: `delta` nanoseconds from now (mult 1, shift 0).
unsafe extern "C" fn lguest_set_next_event(
    delta: c_ulong,
    _evt: *mut bindings::clock_event_device,
) -> c_int {
    hcall(
        lhcall::SET_CLOCKEVENT,
        (delta as u64).max(CLOCK_MIN_DELTA_NS),
        0,
        0,
    );
    0
}

/// `set_state_shutdown` and `set_state_oneshot_stopped`: no event.
unsafe extern "C" fn lguest_clock_shutdown(_evt: *mut bindings::clock_event_device) -> c_int {
    hcall(lhcall::SET_CLOCKEVENT, 0, 0, 0);
    0
}

/// The timer interrupt's action: the clock event's handler (the tick).
unsafe extern "C" fn lguest_timer_interrupt(
    _irq: c_int,
    _dev: *mut c_void,
) -> bindings::irqreturn_t {
    TIMER_IRQS.set(TIMER_IRQS.get() + 1);
    let evt = CLOCK_EVENT.0.get();
    // SAFETY: the device is registered (the irq was requested after it),
    // and the clockevents core set its handler.
    unsafe {
        if let Some(handler) = (*evt).event_handler {
            handler(evt);
        }
    }
    bindings::irqreturn::IRQ_HANDLED
}

/// The TSC.
fn rdtsc() -> u64 {
    let (lo, hi): (u32, u32);
    // SAFETY: rdtsc reads the time-stamp counter (CR4.TSD is clear for the
    // guest: the host lets it run natively) and changes nothing else.
    unsafe {
        core::arch::asm!("rdtsc", out("eax") lo, out("edx") hi, options(nomem, nostack));
    }
    u64::from(hi) << 32 | u64::from(lo)
}

/// Timer interrupts taken (for [`lguest_irq_selftest`]).
static TIMER_IRQS: Cell64 = Cell64::new(0);

/// Spins with interrupts off until the host has set `irq_pending`; false
/// if it did not within about a second of TSC cycles.
fn wait_irq_pending() -> bool {
    let start = rdtsc();
    let limit = u64::from(ld_read!(tsc_khz)) * 1000;
    while ld_read!(irq_pending) == 0 {
        if rdtsc() - start > limit {
            return false;
        }
        core::hint::spin_loop();
    }
    true
}

/// Whether the kernel command line has `word`, whole. Boot code only
/// (`boot_command_line` is init data).
#[link_section = ".init.text"]
fn cmdline_has(word: &[u8]) -> bool {
    // SAFETY: boot_command_line is a NUL-terminated string, written only
    // before start_kernel().
    let cmdline =
        unsafe { core::ffi::CStr::from_ptr((&raw const bindings::boot_command_line).cast()) };
    cmdline.to_bytes().split(|&b| b == b' ').any(|w| w == word)
}

/// A late initcall, with `lguest.ibpb=entry` on the command line: review
/// N4's barrier between this kernel and its processes. `LHCALL_IBPB` asks
/// the host for an IBPB now and at every entry to this kernel from user
/// mode (the direct system call makes its own, the host one at each
/// exit from user mode it delivers here), so that what a process trained
/// in the branch predictors does not steer this kernel's indirect
/// branches. Linux's own IBPB (`write_ibpb`, a `wrmsr` to PRED_CMD) is
/// not there: the CPU features that select it are hidden (`mask_cpuid`),
/// since a ring-3 kernel cannot write the MSR.
#[link_section = ".init.text"]
unsafe extern "C" fn lguest_ibpb_init() -> c_int {
    if !cmdline_has(b"lguest.ibpb=entry") {
        return 0;
    }
    let r = hcall_value(lhcall::IBPB, IBPB_NOW | IBPB_USER_ENTRY);
    // SAFETY: constant formats, one u64 argument for the second.
    unsafe {
        if r == IBPB_DONE {
            bindings::_printk(
                c"\x016lguest: IBPB at each entry from user mode\n"
                    .as_ptr()
                    .cast(),
            );
        } else {
            bindings::_printk(
                c"\x014lguest: IBPB unavailable on this host (%llu)\n"
                    .as_ptr()
                    .cast(),
                r,
            );
        }
    }
    0
}

/// A late initcall, with `lguest.irqtest` on the command line: the seed's
/// `irq_enable` at work in a Linux kernel. With interrupts off, the host's
/// timer is armed 100 us ahead and the kernel spins until the host has
/// set `irq_pending`; the interrupt count right after `irq_enable` (the
/// hook of `local_irq_enable()`) must be higher, the interrupt taken
/// before the next instruction. The same with a bare store to
/// `irq_enabled` (what `irq_enable` would be without its check) shows the
/// interrupt still held back until the host's next exit. The timer then
/// goes on from the tick handler, which the interrupt ran.
#[link_section = ".init.text"]
unsafe extern "C" fn lguest_irq_selftest() -> c_int {
    if !cmdline_has(b"lguest.irqtest") {
        return 0;
    }
    let mut counts = [0u64; 2];
    let mut pending = [0u64; 2];
    for (hook, (count, was)) in counts.iter_mut().zip(pending.iter_mut()).enumerate() {
        // SAFETY: the asm hooks keep every register.
        unsafe { lguest_irq_disable() };
        let before = TIMER_IRQS.get();
        hcall(lhcall::SET_CLOCKEVENT, 100_000, 0, 0);
        if !wait_irq_pending() {
            shutdown(c"lguest: irqtest: irq_pending never set", SHUTDOWN_CRASH);
        }
        *was = ld_read!(irq_pending);
        if hook == 0 {
            // SAFETY: as above.
            unsafe { lguest_irq_enable() };
            *count = TIMER_IRQS.get() - before;
        } else {
            ld_write!(irq_enabled, 1 << 9);
            *count = TIMER_IRQS.get() - before;
            // The next exit delivers it (a host tick at the latest).
            while TIMER_IRQS.get() == before {
                core::hint::spin_loop();
            }
        }
    }
    // SAFETY: a format with four u64 arguments.
    unsafe {
        bindings::_printk(
            c"\x016lguest: irqtest: irq_enable: +%llu (irq_pending %#llx); bare store: +%llu (irq_pending %#llx)\n"
                .as_ptr()
                .cast(),
            counts[0],
            pending[0],
            counts[1],
            pending[1],
        )
    };
    0
}

/// Gives `irq` a descriptor, the lguest chip and `flow`, and routes the
/// host's vector for it to that descriptor.
fn setup_irq(irq: u32, flow: bindings::irq_flow_handler_t) {
    // SAFETY: boot-time irq setup, single-threaded; `irq_alloc_desc_at()`
    // is a macro for this call; the chip is a static the kernel keeps; on
    // a uniprocessor kernel `vector_irq` is a plain array (no per-CPU
    // offset) and the vector is within it.
    unsafe {
        let r = bindings::__irq_alloc_descs(
            irq as c_int,
            irq,
            1,
            bindings::NUMA_NO_NODE,
            ptr::null_mut(),
            ptr::null(),
        );
        if r < 0 && r != -(bindings::EEXIST as c_int) {
            bindings::panic(
                c"lguest: no descriptor for interrupt %u".as_ptr().cast(),
                irq,
            );
        }
        bindings::irq_set_chip_and_handler_name(
            irq,
            IRQ_CHIP.0.get(),
            flow,
            c"level".as_ptr().cast(),
        );
        let desc = bindings::irq_to_desc(irq);
        let table = (&raw mut bindings::vector_irq).cast::<*mut bindings::irq_desc>();
        *table.add(FIRST_EXTERNAL_VECTOR + irq as usize) = desc;
    }
}

/// `x86_init.timers.timer_init`: the clock event on interrupt 0. The clock
/// source is the TSC, at the frequency the host gives (`calibrate_tsc`).
unsafe extern "C" fn lguest_time_init() {
    let chip = IRQ_CHIP.0.get();
    let evt = CLOCK_EVENT.0.get();
    // SAFETY: neither structure has been handed to the kernel yet; the
    // kernel keeps both for ever (they are statics).
    unsafe {
        (*chip).name = c"lguest".as_ptr().cast();
        (*chip).irq_mask = Some(lguest_irq_mask);
        (*chip).irq_unmask = Some(lguest_irq_unmask);

        (*evt).name = c"lguest".as_ptr().cast();
        (*evt).features = bindings::CLOCK_EVT_FEAT_ONESHOT;
        (*evt).set_next_event = Some(lguest_set_next_event);
        (*evt).set_state_shutdown = Some(lguest_clock_shutdown);
        (*evt).set_state_oneshot_stopped = Some(lguest_clock_shutdown);
        (*evt).mult = 1;
        (*evt).shift = 0;
        (*evt).min_delta_ns = CLOCK_MIN_DELTA_NS;
        (*evt).max_delta_ns = CLOCK_MAX_DELTA_NS;
        (*evt).min_delta_ticks = CLOCK_MIN_DELTA_NS as c_ulong;
        (*evt).max_delta_ticks = CLOCK_MAX_DELTA_NS as c_ulong;
        (*evt).rating = c_int::MAX;
        (*evt).irq = TIMER_IRQ as c_int;
        // The cpumask is left NULL: on a uniprocessor kernel the core sets
        // it to this CPU's.
        bindings::clockevents_register_device(evt);
    }
    setup_irq(TIMER_IRQ, Some(bindings::handle_simple_irq));
    // SAFETY: `request_irq()` is an inline wrapper of this call; the
    // descriptor exists and has the chip. Starting the irq unblocks it.
    let r = unsafe {
        bindings::request_threaded_irq(
            TIMER_IRQ,
            Some(lguest_timer_interrupt),
            None,
            (bindings::IRQF_TIMER | bindings::IRQF_NOBALANCING) as c_ulong,
            c"timer".as_ptr().cast(),
            ptr::null_mut(),
        )
    };
    if r != 0 {
        // SAFETY: a format with one int argument.
        unsafe { bindings::panic(c"lguest: request_irq(timer): %d".as_ptr().cast(), r) };
    }
}

// ---- platform ------------------------------------------------------------

unsafe extern "C" fn lguest_calibrate_tsc() -> c_ulong {
    ld_read!(tsc_khz) as c_ulong
}

unsafe extern "C" fn lguest_get_wallclock(ts: *mut bindings::timespec64) {
    let (sec, nsec) = (ld_read!(time_sec), ld_read!(time_nsec));
    // SAFETY: the kernel passes a valid pointer.
    unsafe {
        (*ts).tv_sec = sec as _;
        (*ts).tv_nsec = nsec as _;
    }
}

unsafe extern "C" fn lguest_set_legacy_features() {
    // No RTC, no i8042, no PnP BIOS: the guest's devices are on the lguest
    // bus. SAFETY: x86_platform is the kernel's; boot is single-threaded.
    unsafe {
        let p = &raw mut bindings::x86_platform;
        (*p).legacy.rtc = 0;
        (*p).legacy.i8042 = bindings::x86_legacy_i8042_state_X86_LEGACY_I8042_PLATFORM_ABSENT;
        (*p).legacy.devices.pnpbios = 0;
    }
}

/// Ends the guest with the NUL-terminated message at `msg`, in the kernel
/// image or the direct map (`LGUEST_SHUTDOWN_*` `reason`).
fn shutdown_at(msg: *const u8, reason: u64) -> ! {
    let pa = if msg as u64 >= START_KERNEL_MAP {
        pa_symbol(msg)
    } else {
        msg as u64 - PAGE_OFFSET
    };
    loop {
        hcall(lhcall::SHUTDOWN, pa, reason, 0);
    }
}

/// Ends the guest with `msg`.
fn shutdown(msg: &core::ffi::CStr, reason: u64) -> ! {
    shutdown_at(msg.as_ptr().cast(), reason)
}

// ---- power: machine_ops and the panic notifier ---------------------------

unsafe extern "C" fn lguest_power_off() {
    shutdown(c"Power down", SHUTDOWN_POWEROFF);
}

unsafe extern "C" fn lguest_restart(_cmd: *mut c_char) {
    shutdown(c"Restarting system", SHUTDOWN_RESTART);
}

unsafe extern "C" fn lguest_emergency_restart() {
    shutdown(c"Restarting system", SHUTDOWN_RESTART);
}

/// The panic notifier: the launcher prints the message and exits with the
/// crash status, instead of the kernel spinning in panic()'s loop.
unsafe extern "C" fn lguest_panic(
    _nb: *mut bindings::notifier_block,
    _action: c_ulong,
    data: *mut c_void,
) -> c_int {
    // `data` is panic()'s formatted message, NUL-terminated, in the image.
    shutdown_at(data.cast::<u8>(), SHUTDOWN_CRASH)
}

struct Notifier(UnsafeCell<bindings::notifier_block>);

// SAFETY: handed to the panic notifier chain once, at boot; the chain owns
// it from then on.
unsafe impl Sync for Notifier {}

static PANIC_NOTIFIER: Notifier = Notifier(UnsafeCell::new(bindings::notifier_block {
    notifier_call: Some(lguest_panic),
    next: ptr::null_mut(),
    priority: 0,
}));

// ---- the consoles ---------------------------------------------------------

/// Runs `f` with the virtual IF off (and puts it back): the consoles share
/// one line buffer, and a console write can be interrupted by a printk.
fn irqs_off<R>(f: impl FnOnce() -> R) -> R {
    let was = ld_read!(irq_enabled);
    ld_write!(irq_enabled, 0);
    let r = f();
    if was != 0 {
        // SAFETY: the asm irq_enable hook keeps every register, so it can be
        // called like any C function; IF was on when we came in.
        unsafe { lguest_irq_enable() };
    }
    r
}

/// A line buffer for `LHCALL_NOTIFY`, which takes a NUL-terminated string.
struct LineBuf(UnsafeCell<[u8; 256]>);

// SAFETY: used only in `notify_text`, with interrupts off on a uniprocessor.
unsafe impl Sync for LineBuf {}

static LINE: LineBuf = LineBuf(UnsafeCell::new([0; 256]));

/// Sends `text` to the launcher's "hypercall console" (it prints every
/// string sent with `LHCALL_NOTIFY`), in pieces of at most 255 bytes.
fn notify_text(text: &[u8]) {
    irqs_off(|| {
        let buf = LINE.0.get();
        for chunk in text.chunks(255) {
            // SAFETY: the buffer is ours with interrupts off; a chunk is at
            // most 255 bytes, so the NUL fits.
            let line = unsafe { &mut *buf };
            line[..chunk.len()].copy_from_slice(chunk);
            line[chunk.len()] = 0;
            hcall(lhcall::NOTIFY, pa_symbol(buf), 0, 0);
        }
    })
}

/// The boot console's `write`.
unsafe extern "C" fn lguest_console_write(
    _con: *mut bindings::console,
    s: *const c_char,
    count: c_uint,
) {
    // SAFETY: the kernel passes `count` bytes at `s`.
    notify_text(unsafe { core::slice::from_raw_parts(s.cast::<u8>(), count as usize) });
}

// SAFETY: all-zero is a valid `struct console` (no callbacks, no name).
static CONSOLE: KernelOwned<bindings::console> =
    KernelOwned(UnsafeCell::new(unsafe { core::mem::zeroed() }));

/// Registers the boot console, before start_kernel(): printk keeps
/// everything in its buffer from the first message on and replays it to a
/// console when one is registered, and this one needs nothing to work. It is
/// also the early console (`early_printk()`, which the early exception
/// handler uses). A boot console: `hvc0` replaces it once the hvc core
/// registers that.
fn register_boot_console() {
    let con = CONSOLE.0.get();
    // SAFETY: the console is not registered yet, so it is ours.
    unsafe {
        for (i, &b) in b"lguest".iter().enumerate() {
            (*con).name[i] = b;
        }
        (*con).write = Some(lguest_console_write);
        (*con).flags = (bindings::cons_flags_CON_PRINTBUFFER
            | bindings::cons_flags_CON_ANYTIME
            | bindings::cons_flags_CON_BOOT) as i16;
        (*con).index = -1;
        *(&raw mut bindings::early_console) = con;
        bindings::register_console(con);
    }
}

/// `hv_ops.put_chars` of `hvc0`, the kernel's console and user space's
/// tty from `console_init()` on: the hypercall console too.
unsafe extern "C" fn lguest_hvc_put_chars(_vtermno: u32, buf: *const u8, count: usize) -> isize {
    // SAFETY: the hvc core passes `count` bytes at `buf`.
    notify_text(unsafe { core::slice::from_raw_parts(buf, count) });
    count as isize
}

/// `hv_ops.get_chars`: the hypercall console has no input (the hvc core
/// polls, and finds none).
unsafe extern "C" fn lguest_hvc_get_chars(_vtermno: u32, _buf: *mut u8, _count: usize) -> isize {
    0
}

static HVC_OPS: bindings::hv_ops = bindings::hv_ops {
    get_chars: Some(lguest_hvc_get_chars),
    put_chars: Some(lguest_hvc_put_chars),
    flush: None,
    notifier_add: None,
    notifier_del: None,
    notifier_hangup: None,
    tiocmget: None,
    tiocmset: None,
    dtr_rts: None,
};

/// A console initcall: `hvc0`'s console output, before the hvc core
/// registers its console (in the same initcall level, later in link order).
#[link_section = ".init.text"]
unsafe extern "C" fn lguest_hvc_console_init() -> c_int {
    // SAFETY: vterm 0 at index 0, with ops the kernel keeps (a static).
    unsafe { bindings::hvc_instantiate(0, 0, &HVC_OPS) }
}

/// A device initcall: the `hvc0` tty (the tty layer is up by now).
#[link_section = ".init.text"]
unsafe extern "C" fn lguest_hvc_init() -> c_int {
    // SAFETY: as for `lguest_hvc_console_init`; 256 bytes of output buffer.
    let hp = unsafe { bindings::hvc_alloc(0, 0, &HVC_OPS, 256) };
    match kernel::error::from_err_ptr(hp) {
        Ok(_) => 0,
        Err(e) => e.to_errno(),
    }
}

// The two initcalls, as `console_initcall()` and `device_initcall()` make
// them: 32-bit offsets to the function (PREL32 relocations, which x86-64
// has; the `module!` macro emits its initcall the same way).
core::arch::global_asm!(
    ".pushsection .con_initcall.init, \"a\"",
    ".long {con} - .",
    ".popsection",
    ".pushsection .initcall6.init, \"a\"",
    ".long {dev} - .",
    ".popsection",
    con = sym lguest_hvc_console_init,
    dev = sym lguest_hvc_init,
);

core::arch::global_asm!(
    ".pushsection .initcall7.init, \"a\"",
    ".long {late} - .",
    ".long {ibpb} - .",
    ".popsection",
    late = sym lguest_irq_selftest,
    ibpb = sym lguest_ibpb_init,
);

// ---- the start -----------------------------------------------------------

/// The first page-table level: one entry per 512 GiB.
const PGD_SHIFT: u32 = 39;
/// Where the direct map starts (4-level paging, no KASLR).
const PAGE_OFFSET: u64 = 0xffff_8880_0000_0000;
/// Present, writable, accessed, dirty: an intermediate kernel entry.
const KERNPG_TABLE: u64 = 0x63;
/// A 4 KiB kernel data page: KERNPG_TABLE, global, no-execute.
const PAGE_KERNEL: u64 = 0x63 | 0x100 | 1 << 63;
/// A 2 MiB kernel data page: PAGE_KERNEL and large.
const PAGE_KERNEL_LARGE: u64 = PAGE_KERNEL | 0x80;
/// The most RAM a guest has (LGUEST_MAX_MEM).
const MAX_MEM: u64 = 4 << 30;
/// `COMMAND_LINE_SIZE` on x86.
const COMMAND_LINE_SIZE: usize = 2048;

extern "C" {
    /// `head_64.S`'s copy of the launcher's boot_params, made before the
    /// host's linear map went.
    static lguest_boot_params: [u8; 4096];
}

/// Page-table pages of the early direct map: a PUD page, a PMD page per
/// GiB, and a PTE page for the end of RAM when it is not on a 2 MiB
/// boundary (the host refuses a guest page that reaches past RAM).
#[repr(C, align(4096))]
struct Tables {
    pud: [u64; 512],
    pmd: [[u64; 512]; 4],
    pte: [u64; 512],
}

struct EarlyTables(UnsafeCell<Tables>);

// SAFETY: used once, at boot, before anything else runs.
unsafe impl Sync for EarlyTables {}

/// The early direct map. Init data: from `init_mem_mapping()` on, the
/// kernel's own tables are used.
#[link_section = ".init.data"]
static EARLY_DMAP: EarlyTables = EarlyTables(UnsafeCell::new(Tables {
    pud: [0; 512],
    pmd: [[0; 512]; 4],
    pte: [0; 512],
}));

/// Where RAM ends: where the lguest bus's device window starts.
static RAM_END: Cell64 = Cell64::new(0);

/// Where RAM ends, from boot_params' e820 table.
fn ram_end(page: &[u8; 4096]) -> u64 {
    let u64_at = |at: usize| u64::from_le_bytes(page[at..at + 8].try_into().unwrap_or([0; 8]));
    let entries = usize::from(page[0x1e8]).min(128);
    let mut end = 0;
    for i in 0..entries {
        let at = 0x2d0 + 20 * i;
        let ty = u32::from_le_bytes(page[at + 16..at + 20].try_into().unwrap_or([0; 4]));
        if ty == 1 {
            end = end.max(u64_at(at).saturating_add(u64_at(at + 8)));
        }
    }
    end.min(MAX_MEM) & !0xfff
}

/// Maps `[0, end)` at PAGE_OFFSET in `early_top_pgt`, as the native boot's
/// early page-fault handler would on demand (that handler reads CR2 with a
/// `mov`, which ring 3 cannot).
fn early_direct_map(end: u64) {
    const MB2: u64 = 2 << 20;
    let t = EARLY_DMAP.0.get();
    // SAFETY: the tables are ours until init_mem_mapping() replaces them;
    // early_top_pgt is the kernel's, not in use yet.
    unsafe {
        let tables = &mut *t;
        let pte_pa = pa_symbol(tables.pte.as_ptr());
        for gib in 0..4usize {
            let pmd_pa = pa_symbol(tables.pmd[gib].as_ptr());
            tables.pud[gib] = pmd_pa | KERNPG_TABLE;
            for j in 0..512usize {
                let pa = (gib as u64) << 30 | (j as u64) << 21;
                if pa + MB2 <= end {
                    tables.pmd[gib][j] = pa | PAGE_KERNEL_LARGE;
                } else if pa < end {
                    for k in 0..((end - pa) >> 12) as usize {
                        tables.pte[k] = (pa + ((k as u64) << 12)) | PAGE_KERNEL;
                    }
                    tables.pmd[gib][j] = pte_pa | KERNPG_TABLE;
                }
            }
        }
        let pgd = (&raw mut bindings::early_top_pgt).cast::<u64>();
        let slot = ((PAGE_OFFSET >> PGD_SHIFT) & 511) as usize;
        *pgd.add(slot) = pa_symbol(tables.pud.as_ptr()) | KERNPG_TABLE;
        // x86_64_start_kernel() does this for the native boot.
        let init = (&raw mut bindings::init_top_pgt).cast::<u64>();
        *init.add(511) = *pgd.add(511);
    }
}

/// Fills `pv_ops`, `pv_info` and the platform hooks.
fn install_hooks() {
    // SAFETY: boot is single-threaded and nothing has used these yet; every
    // function stored matches its hook's C signature (the compiler checks
    // the Rust ones against the bindings; the asm ones follow the
    // callee-save convention PV_CALLEE_SAVE expects).
    unsafe {
        let info = &raw mut bindings::pv_info;
        (*info).name = c"lguest".as_ptr().cast();
        (*info).extra_user_64bit_cs = 0x33;
        (*info).io_delay = false;

        let ops = &raw mut bindings::pv_ops;
        let cpu = &mut (*ops).cpu;
        cpu.cpuid = Some(lguest_cpuid);
        cpu.read_msr = Some(lguest_read_msr);
        cpu.write_msr = Some(lguest_write_msr);
        cpu.read_msr_safe = Some(lguest_read_msr_safe);
        cpu.write_msr_safe = Some(lguest_write_msr_safe);
        cpu.read_pmc = Some(lguest_read_pmc);
        cpu.get_debugreg = Some(lguest_get_debugreg);
        cpu.set_debugreg = Some(lguest_set_debugreg);
        cpu.read_cr0 = Some(lguest_read_cr0);
        cpu.write_cr0 = Some(lguest_write_cr0);
        cpu.write_cr4 = Some(lguest_write_cr4);
        cpu.store_tr = Some(lguest_store_tr);
        cpu.load_sp0 = Some(lguest_load_sp0);
        cpu.write_gdt_entry = Some(lguest_write_gdt_entry);
        cpu.write_idt_entry = Some(lguest_write_idt_entry);
        // The host owns the GDT, IDT, TR and LDT: loading them is nothing.
        cpu.load_tr_desc = Some(lguest_nop);
        cpu.load_gdt = Some(lguest_load_table);
        cpu.load_idt = Some(lguest_load_table);
        cpu.set_ldt = Some(lguest_set_ldt);
        cpu.load_tls = Some(lguest_load_tls);
        cpu.load_gs_index = Some(lguest_load_gs_index);
        cpu.alloc_ldt = Some(lguest_ldt);
        cpu.free_ldt = Some(lguest_ldt);
        cpu.write_ldt_entry = Some(lguest_write_ldt_entry);

        let irq = &mut (*ops).irq;
        irq.save_fl.func = lguest_save_fl as *mut c_void;
        irq.irq_disable.func = lguest_irq_disable as *mut c_void;
        irq.irq_enable.func = lguest_irq_enable as *mut c_void;
        irq.safe_halt = Some(lguest_safe_halt);
        irq.halt = Some(lguest_halt);

        let mmu = &mut (*ops).mmu;
        mmu.read_cr2.func = lguest_read_cr2 as *mut c_void;
        mmu.write_cr2 = Some(lguest_write_cr2);
        mmu.read_cr3 = Some(lguest_read_cr3);
        mmu.write_cr3 = Some(lguest_write_cr3);
        mmu.flush_tlb_user = Some(lguest_flush_tlb_user);
        mmu.flush_tlb_kernel = Some(lguest_flush_tlb_kernel);
        mmu.flush_tlb_one_user = Some(lguest_flush_tlb_one_user);

        // No PIC, IO-APIC or local APIC: the host's interrupts come on
        // their vectors (native_init_IRQ() sets every external vector's
        // gate), the lguest chip masks them, the host's timer ticks.
        *(&raw mut bindings::legacy_pic) = &raw mut bindings::null_legacy_pic;
        let init = &raw mut bindings::x86_init;
        (*init).irqs.intr_mode_select = Some(bindings::x86_init_noop);
        (*init).irqs.intr_mode_init = Some(bindings::x86_init_noop);
        (*init).irqs.pre_vector_init = Some(bindings::x86_init_noop);
        (*init).timers.timer_init = Some(lguest_time_init);
        (*init).timers.setup_percpu_clockev = Some(bindings::x86_init_noop);
        (*(&raw mut bindings::x86_cpuinit)).setup_percpu_clockev = Some(bindings::x86_init_noop);

        let platform = &raw mut bindings::x86_platform;
        (*platform).calibrate_tsc = Some(lguest_calibrate_tsc);
        (*platform).calibrate_cpu = Some(lguest_calibrate_tsc);
        (*platform).get_wallclock = Some(lguest_get_wallclock);
        (*platform).realmode_reserve = Some(bindings::x86_init_noop);
        (*platform).realmode_init = Some(bindings::x86_init_noop);
        (*platform).set_legacy_features = Some(lguest_set_legacy_features);

        let machine = &raw mut bindings::machine_ops;
        (*machine).power_off = Some(lguest_power_off);
        (*machine).halt = Some(lguest_power_off);
        (*machine).restart = Some(lguest_restart);
        (*machine).emergency_restart = Some(lguest_emergency_restart);
        *(&raw mut bindings::pm_power_off) = Some(lguest_power_off);
    }
}

/// The synthetic CPU features of the x86 core patch
/// (`patches/0003-x86-the-pv-ring3-feature.patch`, `cpufeatures.h`).
const X86_FEATURE_LGUEST: usize = 3 * 32 + 7;
const X86_FEATURE_PV_RING3: usize = 8 * 32 + 20;
/// The TSC's frequency is known (`calibrate_tsc`), and the TSC needs no
/// watchdog: what the host says by giving `tsc_khz`, which it does only
/// for a TSC its own kernel found stable. As VMware's and Hyper-V's guests
/// set them. Without RELIABLE the TSC clocksource waits for a watchdog
/// this machine has not got (no HPET, no ACPI PM timer) and is never valid
/// for high-resolution timers.
const X86_FEATURE_TSC_RELIABLE: usize = 3 * 32 + 23;
const X86_FEATURE_TSC_KNOWN_FREQ: usize = 3 * 32 + 31;

/// `setup_force_cpu_cap()` (a C macro): the feature in `boot_cpu_data` and
/// in the forced set that every later CPU identification applies again.
fn force_cpu_cap(bit: usize) {
    // SAFETY: kernel globals, as set_cpu_cap() writes them; boot is
    // single-threaded. Both arrays are u32 words of NCAPINTS, which the
    // bit is within (word 3 and 8); x86_capability, in an anonymous union,
    // is found by its asm-offsets offset.
    unsafe {
        let caps = (&raw mut bindings::boot_cpu_data)
            .cast::<u8>()
            .add(bindings::CPUINFO_x86_capability as usize)
            .cast::<u32>();
        *caps.add(bit / 32) |= 1 << (bit % 32);
        let set = (&raw mut bindings::cpu_caps_set).cast::<u32>();
        *set.add(bit / 32) |= 1 << (bit % 32);
    }
}

extern "C" {
    /// The 5-byte `jmp` at the end of `restore_regs_and_return_to_kernel`.
    static mut early_pv_iret_patch: [u8; 5];
    fn lguest_iret();
}

/// Points the kernel's return from an exception at [`lguest_iret`]: a
/// `jmp rel32`, written as Xen's `xen_start_kernel()` writes its own, before
/// any exception can be taken (the kernel text is still writable).
fn patch_iret() {
    let at = (&raw mut early_pv_iret_patch).cast::<u8>();
    let rel = (lguest_iret as *const () as i64 - (at as i64 + 5)) as i32;
    let mut insn = [0xe9u8; 5];
    insn[1..].copy_from_slice(&rel.to_le_bytes());
    // SAFETY: the five bytes of the kernel's own patch site, in the image
    // (mapped writable by the boot page table); nothing executes them yet.
    unsafe { ptr::copy_nonoverlapping(insn.as_ptr(), at, 5) };
}

/// Called by `lguest_entry` on the init task's stack, at the image's linked
/// address, once it has copied the launcher's boot_params to
/// `lguest_boot_params`.
#[no_mangle]
#[link_section = ".init.text"]
pub unsafe extern "C" fn lguest_start_kernel() -> ! {
    // SAFETY: nothing has used the BSS yet (LGUEST_DATA and the boot_params
    // copy are in .data).
    unsafe { bindings::clear_bss() };
    patch_iret();
    force_cpu_cap(X86_FEATURE_LGUEST);
    force_cpu_cap(X86_FEATURE_PV_RING3);
    if ld_read!(tsc_khz) != 0 {
        force_cpu_cap(X86_FEATURE_TSC_KNOWN_FREQ);
        force_cpu_cap(X86_FEATURE_TSC_RELIABLE);
    }
    install_hooks();
    // SAFETY: C globals of the kernel's (two bools, boot_params, of 4096
    // bytes); boot is single-threaded; the copy is head_64.S's.
    let bp = unsafe {
        *(&raw mut bindings::early_boot_irqs_disabled) = true;
        // What load_ucode_bsp(), which this entry skips, sets from CPUID's
        // hypervisor bit: the microcode loader keeps off (it would read
        // the AMD patch-level MSR with a native rdmsr).
        *(&raw mut bindings::x86_hypervisor_present) = true;
        let bp = &raw mut bindings::boot_params;
        ptr::copy_nonoverlapping(lguest_boot_params.as_ptr(), bp.cast::<u8>(), 4096);
        &*(bp.cast::<[u8; 4096]>())
    };
    let end = ram_end(bp);
    RAM_END.set(end);
    early_direct_map(end);
    // SAFETY: early_top_pgt now maps the kernel image (slot 511, as the
    // boot table did) and all RAM at PAGE_OFFSET; this code runs in the
    // image. The identity map of the boot table goes with this write.
    unsafe {
        lguest_write_cr3(pa_symbol((&raw const bindings::early_top_pgt).cast::<u8>()) as c_ulong)
    };
    // The command line, through the direct map (copy_bootdata() does this
    // in the native boot; x86_64_start_reservations() skips it as
    // boot_params is already filled in).
    let cmd_line = u64::from(u32::from_le_bytes([
        bp[0x228], bp[0x229], bp[0x22a], bp[0x22b],
    ]));
    if cmd_line != 0 {
        // SAFETY: the launcher's command line, NUL-terminated in RAM, which
        // the direct map now maps; boot_command_line holds COMMAND_LINE_SIZE.
        unsafe {
            let src = (PAGE_OFFSET + cmd_line) as *const u8;
            let dst = (&raw mut bindings::boot_command_line).cast::<u8>();
            let mut i = 0;
            while i < COMMAND_LINE_SIZE - 1 && *src.add(i) != 0 {
                *dst.add(i) = *src.add(i);
                i += 1;
            }
            *dst.add(i) = 0;
        }
    }
    register_boot_console();
    // SAFETY: the panic notifier, a static the chain keeps; the early
    // exception handlers, installed through the write_idt_entry hook; then
    // the native boot, which calls start_kernel().
    unsafe {
        bindings::atomic_notifier_chain_register(
            &raw mut bindings::panic_notifier_list,
            PANIC_NOTIFIER.0.get(),
        );
        bindings::idt_setup_early_handler();
        bindings::x86_64_start_reservations(pa_symbol(
            (&raw const bindings::boot_params).cast::<u8>(),
        ) as *mut c_char)
    }
}
