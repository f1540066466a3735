// SPDX-License-Identifier: GPL-2.0
//! The switcher's Rust half: the per-CPU blocks, the guest's GDT, IDT and
//! TSS, and [`Switcher::run_once`], which takes one trip into the guest.
//!
//! One [`Switcher`] exists while the module is loaded (created in module
//! init, freed at exit when no file is open). Each possible CPU has a
//! [`CpuBlock`] of five pages (its layout is described in `switcher_64.S`,
//! whose offsets are checked against the struct at compile time); a block
//! is only touched by its own CPU with interrupts off, so it needs no lock.
//! The switcher's code is the page-aligned `.text.lguest_switcher` section
//! of this module.

use core::{
    mem::offset_of,
    sync::atomic::{
        AtomicPtr,
        Ordering, //
    },
};
use kernel::{
    bindings,
    prelude::*, //
};

use crate::{
    gmem::{
        HostPage,
        PAGE_SIZE,
        PTE_A,
        PTE_ADDR,
        PTE_D,
        PTE_NX,
        PTE_P,
        PTE_RW, //
    },
    helpers,
    irq::VcpuIrq,
    shadow::{
        ShadowTable,
        Shadows, //
    },
    uapi::{
        self,
        LguestRegs, //
    },
};

/// Pages per CPU block; the first [`GUEST_BLOCK_PAGES`] are mapped in the
/// guest's tables while this CPU runs it, the last (the host's saved
/// state) never is.
const BLOCK_PAGES: usize = 5;
const GUEST_BLOCK_PAGES: usize = 4;
/// The guest frame at the top of page 0: 22 quadwords.
const FRAME: usize = 4096 - 22 * 8;

/// Kernel code and data selectors: the host's, so CS stays valid on return.
const KERNEL_CS: u16 = 0x10;
const KERNEL_DS: u16 = 0x18;
/// Host GDT entry of the TSS.
const GDT_ENTRY_TSS: usize = 8;
/// Host GDT entry of the per-CPU segment.
const GDT_ENTRY_CPUNODE: usize = 15;
/// IST slots of our TSS that our own stubs use (1-4 are the host's).
const IST_DB: u8 = 5;
const IST_NMI: u8 = 6;
const IST_MC: u8 = 7;
/// Tops of our IST stacks, as offsets in page 3 (its first word is the
/// block pointer).
const IST_DB_TOP: usize = 1024;
const IST_NMI_TOP: usize = 2560;
const IST_MC_TOP: usize = 4096;

/// Frame slots, in quadwords from `FRAME` (pushed by the exit path).
mod slot {
    pub(super) const R15: usize = 0;
    pub(super) const R14: usize = 1;
    pub(super) const R13: usize = 2;
    pub(super) const R12: usize = 3;
    pub(super) const R11: usize = 4;
    pub(super) const R10: usize = 5;
    pub(super) const R9: usize = 6;
    pub(super) const R8: usize = 7;
    pub(super) const RBP: usize = 8;
    pub(super) const RDI: usize = 9;
    pub(super) const RSI: usize = 10;
    pub(super) const RDX: usize = 11;
    pub(super) const RCX: usize = 12;
    pub(super) const RBX: usize = 13;
    pub(super) const RAX: usize = 14;
    pub(super) const VECTOR: usize = 15;
    pub(super) const ERROR: usize = 16;
    pub(super) const RIP: usize = 17;
    pub(super) const CS: usize = 18;
    pub(super) const RFLAGS: usize = 19;
    pub(super) const RSP: usize = 20;
    pub(super) const SS: usize = 21;
}

/// RFLAGS bits the guest (or the launcher) may set: CF, PF, AF, ZF, SF, TF,
/// DF, OF, NT, AC. IF is always on, IOPL always 0. NT is the guest's as
/// on hardware (a process may set it with popf and keeps it across system
/// calls): ring 0 never runs with it, since every event into the switcher
/// clears it (interrupt and exception delivery, and SYSCALL by its mask).
const RFLAGS_GUEST_MASK: u64 =
    0x1 | 0x4 | 0x10 | 0x40 | 0x80 | 0x100 | 0x400 | 0x800 | 0x4000 | 0x4_0000;
const RFLAGS_FIXED: u64 = 0x2 | 0x200;
/// RF, which an `iretq` (not a `sysretq`) may set: the guest kernel's
/// return to an instruction whose execution breakpoint has just fired
/// (Linux's #DB handler sets it), so that it runs instead of faulting
/// again. The CPU clears it after that instruction.
const RFLAGS_RF: u64 = 0x1_0000;

/// The top-level slot of the switcher's alias: the first of the x86 guard
/// hole ("guard hole, also reserved for hypervisor",
/// Documentation/arch/x86/x86_64/mm.rst), which no Linux host maps.
pub(crate) const SWITCHER_SLOT: usize = 256;
/// Where the first CPU block lies in the alias (the text, before it, is
/// smaller: checked at load).
const ALIAS_BLOCKS: u64 = 2 << 20;
/// From one CPU's block to the next in the alias: the pages between them
/// are never mapped.
const BLOCK_STRIDE: u64 = 8 * 4096;
/// Where each CPU's guest view maps that CPU's page 0 a second time, from
/// the alias's start: `lguest_syscall` finds its block there with
/// RIP-relative addressing alone. The text must end before it.
const ALIAS_PAGE0: u64 = ALIAS_BLOCKS - 4096;
/// The frame's vector of an exit the direct switch made only so that the
/// host handles an NMI or #MC it recorded: nothing else to do.
const VECTOR_NONE: u64 = 256;

/// The alias's address: slot [`SWITCHER_SLOT`] of the top level, for a host
/// with `levels`-level paging.
pub(crate) const fn alias_base(levels: u32) -> u64 {
    if levels == 5 {
        0xff00_0000_0000_0000
    } else {
        0xffff_8000_0000_0000
    }
}

/// CR4 bits.
const CR4_PCIDE: u64 = 1 << 17;
const CR4_PGE: u64 = 1 << 7;
const CR4_LASS: u64 = 1 << 27;
/// CR4.FSGSBASE.
const CR4_FSGSBASE: u64 = 1 << 16;
const CR4_PKE: u64 = 1 << 22;
const CR4_LA57: u64 = 1 << 12;
/// EFER.NXE.
const EFER_NXE: u64 = 1 << 11;
/// XSAVE component 19, APX's extended general registers.
const XFEATURE_MASK_APX: u64 = 1 << 19;

/// A descriptor-table pointer as `lgdt`/`sgdt` use it.
#[repr(C, packed)]
#[derive(Clone, Copy, Default)]
struct DescPtr {
    limit: u16,
    base: u64,
}

/// A 16-byte IDT gate.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct Gate {
    lo: u64,
    hi: u64,
}

impl Gate {
    /// An interrupt gate to `handler` in the kernel's code segment.
    fn interrupt(handler: u64, ist: u8, dpl: u8) -> Self {
        let attr = 0x8e | ((dpl as u64 & 3) << 5); // present, 64-bit interrupt gate
        Gate {
            lo: (handler & 0xffff)
                | ((KERNEL_CS as u64) << 16)
                | ((ist as u64 & 7) << 32)
                | (attr << 40)
                | (((handler >> 16) & 0xffff) << 48),
            hi: handler >> 32,
        }
    }
}

/// Segment descriptors of our GDT.
mod descriptor {
    /// A flat code (`code` true, 64-bit) or data segment at privilege `dpl`,
    /// marked accessed (as Linux's are: the CPU need not write it).
    pub(super) const fn flat(code: bool, dpl: u64) -> u64 {
        let access = 0x80 | (dpl << 5) | 0x10 | if code { 0x0b } else { 0x03 };
        let flags: u64 = if code { 0xa } else { 0xc }; // L (code) or D/B, and G
        0xffff | (access << 40) | (0xf << 48) | (flags << 52)
    }

    /// The two quadwords of an available 64-bit TSS descriptor.
    pub(super) const fn tss(base: u64, limit: u64) -> [u64; 2] {
        [
            (limit & 0xffff)
                | ((base & 0xff_ffff) << 16)
                | (0x89 << 40)
                | (((limit >> 16) & 0xf) << 48)
                | (((base >> 24) & 0xff) << 56),
            base >> 32,
        ]
    }
}

/// The 64-bit TSS.
#[repr(C, packed)]
#[derive(Clone, Copy, Default)]
struct Tss {
    reserved0: u32,
    rsp: [u64; 3],
    reserved1: u64,
    ist: [u64; 7],
    reserved2: u64,
    reserved3: u16,
    iomap_base: u16,
}

/// Page 0: what the switcher needs while the guest's CR3 is live, and the
/// guest register frame at its top.
#[repr(C)]
struct ExitPage {
    self_ptr: u64,
    host_cr3: u64,
    nmi_pending: u64,
    mc_pending: u64,
    aborted: u64,
    r0_fault: u64,
    r0_vector: u64,
    r0_error: u64,
    r0_rip: u64,
    r0_cr2: u64,
    db_dr6: u64,
    db_count: u64,
    verw_sel: u16,
    _p0: u16,
    /// The global TLB flush after the guest's CR3: 0 none, 1 by INVPCID,
    /// 2 by a CR4.PGE toggle.
    flush_global: u32,
    /// INVPCID's descriptor (zeros).
    invpcid_desc: [u64; 2],
    /// 1: the host has FSGSBASE on, the FS and GS bases move by
    /// RD/WR{FS,GS}BASE rather than by their MSRs.
    fsgsbase: u32,
    /// 1: the CPU has SYSENTER in long mode (every vendor but AMD and
    /// Hygon), and SYSENTER_CS must be 0 while the guest runs.
    sysenter: u32,
    /// 1: the direct system call is armed for this entry: LSTAR is
    /// `lguest_syscall` while the guest runs, and the fields below up to
    /// `gs_other` are valid.
    direct: u32,
    /// 1: the guest is in user mode (the switcher may change it).
    user_mode: u32,
    /// The guest kernel's system-call entry.
    syscall_entry: u64,
    /// The two modes' shadow roots, as CR3 values.
    kernel_root: u64,
    user_root: u64,
    /// The GS base of the mode the guest is not in.
    gs_other: u64,
    scratch_rsp: u64,
    scratch_rax: u64,
    scratch_rdx: u64,
    /// Direct switches made since run_once last looked (it clears them).
    direct_syscalls: u64,
    direct_sysrets: u64,
    /// 1: an interrupt waits for the guest kernel to turn virtual
    /// interrupts on: its direct return to user mode goes through the
    /// host, which delivers it there.
    irq_waiting: u32,
    /// The barrier at each direct switch from user to kernel mode
    /// (`LGUEST_IBPB_USER_ENTRY`): 0 none, 1 an IBPB, 2 counted only (the
    /// `ibpb_test` knob, on a host without IBPB).
    ibpb: u32,
    /// Those barriers, since run_once last looked (it clears them).
    direct_ibpbs: u64,
    _pad: [u8; FRAME - 224],
    frame: [u64; 22],
}

/// Page 2: our GDT and TSS.
#[repr(C)]
struct DescPage {
    gdt: [u64; 16],
    tss: Tss,
    _pad: [u8; 4096 - 128 - 104],
}

/// Page 3: the IST stacks, found from the stack pointer by masking.
#[repr(C)]
struct IstPage {
    self_ptr: u64,
    _stacks: [u8; 4088],
}

/// Page 4: the host state saved at entry (never mapped in a guest).
#[repr(C)]
struct HostState {
    rsp: u64,
    cr0: u64,
    efer: u64,
    fs_base: u64,
    gs_base: u64,
    sysenter_cs: u64,
    gdtr: DescPtr,
    _p0: [u8; 6],
    gdtr_rw: DescPtr,
    _p1: [u8; 6],
    idtr: DescPtr,
    _p2: [u8; 6],
    tr: u16,
    ldt: u16,
    ds: u16,
    es: u16,
    fs: u16,
    gs: u16,
    _p3: [u8; 4],
    guest_gdtr: DescPtr,
    _p4: [u8; 6],
    guest_idtr: DescPtr,
    _p5: [u8; 6],
    guest_cr3: u64,
    guest_fs_base: u64,
    guest_gs_base: u64,
    guest_cr2: u64,
    pkru: u32,
    pkru_on: u32,
    cet_on: u32,
    guest_fpu: u32,
    u_cet: u64,
    pl3_ssp: u64,
    /// `lguest_guest_entry` in the alias.
    guest_entry: u64,
    /// `lguest_host_resume` in the module's text.
    host_resume: u64,
    /// With the direct system call: MSR_LSTAR as the entry found it, and
    /// `lguest_syscall` in the alias.
    host_lstar: u64,
    direct_lstar: u64,
    /// MSR_STAR and MSR_SYSCALL_MASK as the entry found them, and the host
    /// kernel's own ([`DIRECT_STAR`], [`DIRECT_SFMASK`]).
    host_star: u64,
    host_sfmask: u64,
    direct_star: u64,
    direct_sfmask: u64,
    _pad: [u8; 4096 - 272],
}

/// One CPU's block, as `switcher_64.S` sees it.
#[repr(C, align(4096))]
pub(crate) struct CpuBlock {
    exit: ExitPage,
    idt: [Gate; 256],
    desc: DescPage,
    ist: IstPage,
    host: HostState,
}

const _: () = assert!(core::mem::size_of::<CpuBlock>() == BLOCK_PAGES * 4096);
const _: () = assert!(offset_of!(CpuBlock, exit.frame) == FRAME);

/// The switcher's source, whose `#define LG_*` lines give the offsets the
/// assembly uses.
const ASM: &[u8] = include_bytes!("switcher_64.S");

/// Whether `src[at..]` starts with `what`.
const fn starts_with(src: &[u8], at: usize, what: &[u8]) -> bool {
    if at + what.len() > src.len() {
        return false;
    }
    let mut i = 0;
    while i < what.len() {
        if src[at + i] != what[i] {
            return false;
        }
        i += 1;
    }
    true
}

/// The value of `#define NAME <decimal>` in the switcher's source; fails
/// the build if there is no such line.
const fn asm_define(name: &str) -> usize {
    let name = name.as_bytes();
    let key = b"#define ";
    let mut i = 0;
    while i < ASM.len() {
        if (i == 0 || ASM[i - 1] == b'\n')
            && starts_with(ASM, i, key)
            && starts_with(ASM, i + key.len(), name)
        {
            let mut j = i + key.len() + name.len();
            if j < ASM.len() && (ASM[j] == b' ' || ASM[j] == b'\t') {
                while j < ASM.len() && (ASM[j] == b' ' || ASM[j] == b'\t') {
                    j += 1;
                }
                let mut v = 0;
                let mut digits = 0;
                while j < ASM.len() && ASM[j].is_ascii_digit() {
                    v = v * 10 + (ASM[j] - b'0') as usize;
                    j += 1;
                    digits += 1;
                }
                assert!(
                    digits > 0,
                    "an LG_ define of switcher_64.S is not a decimal number"
                );
                return v;
            }
        }
        i += 1;
    }
    panic!("an LG_ offset is missing from switcher_64.S");
}

/// Fails the build unless `switcher_64.S` defines `$name` as the offset of
/// `$field` in [`CpuBlock`].
macro_rules! asm_offset {
    ($($name:literal => $($field:ident).+;)*) => {
        $(const _: () = assert!(
            asm_define($name) == offset_of!(CpuBlock, $($field).+),
            concat!("switcher_64.S and struct CpuBlock disagree on ", $name)
        );)*
    };
}

asm_offset! {
    "LG_SELF" => exit.self_ptr;
    "LG_HOST_CR3" => exit.host_cr3;
    "LG_NMI_PENDING" => exit.nmi_pending;
    "LG_MC_PENDING" => exit.mc_pending;
    "LG_ABORTED" => exit.aborted;
    "LG_R0_FAULT" => exit.r0_fault;
    "LG_R0_VECTOR" => exit.r0_vector;
    "LG_R0_ERROR" => exit.r0_error;
    "LG_R0_RIP" => exit.r0_rip;
    "LG_R0_CR2" => exit.r0_cr2;
    "LG_DB_DR6" => exit.db_dr6;
    "LG_DB_COUNT" => exit.db_count;
    "LG_VERW_SEL" => exit.verw_sel;
    "LG_FLUSH_GLOBAL" => exit.flush_global;
    "LG_INVPCID_DESC" => exit.invpcid_desc;
    "LG_FSGSBASE" => exit.fsgsbase;
    "LG_SYSENTER" => exit.sysenter;
    "LG_DIRECT" => exit.direct;
    "LG_USER_MODE" => exit.user_mode;
    "LG_SYSCALL_ENTRY" => exit.syscall_entry;
    "LG_KERNEL_ROOT" => exit.kernel_root;
    "LG_USER_ROOT" => exit.user_root;
    "LG_GS_OTHER" => exit.gs_other;
    "LG_SCRATCH_RSP" => exit.scratch_rsp;
    "LG_SCRATCH_RAX" => exit.scratch_rax;
    "LG_SCRATCH_RDX" => exit.scratch_rdx;
    "LG_DIRECT_SYSCALLS" => exit.direct_syscalls;
    "LG_DIRECT_SYSRETS" => exit.direct_sysrets;
    "LG_IRQ_WAITING" => exit.irq_waiting;
    "LG_DIRECT_IBPB" => exit.ibpb;
    "LG_DIRECT_IBPBS" => exit.direct_ibpbs;
    "LG_FRAME" => exit.frame;
    "LG_GDT" => desc.gdt;
    "LG_IST_PAGE" => ist;
    "LG_HOST_RSP" => host.rsp;
    "LG_HOST_CR0" => host.cr0;
    "LG_HOST_EFER" => host.efer;
    "LG_HOST_FS_BASE" => host.fs_base;
    "LG_HOST_GS_BASE" => host.gs_base;
    "LG_HOST_SYSENTER_CS" => host.sysenter_cs;
    "LG_HOST_GDTR" => host.gdtr;
    "LG_HOST_GDTR_RW" => host.gdtr_rw;
    "LG_HOST_IDTR" => host.idtr;
    "LG_HOST_TR" => host.tr;
    "LG_HOST_LDT" => host.ldt;
    "LG_HOST_DS" => host.ds;
    "LG_HOST_ES" => host.es;
    "LG_HOST_FS" => host.fs;
    "LG_HOST_GS" => host.gs;
    "LG_GUEST_GDTR" => host.guest_gdtr;
    "LG_GUEST_IDTR" => host.guest_idtr;
    "LG_GUEST_CR3" => host.guest_cr3;
    "LG_GUEST_FS_BASE" => host.guest_fs_base;
    "LG_GUEST_GS_BASE" => host.guest_gs_base;
    "LG_GUEST_CR2" => host.guest_cr2;
    "LG_HOST_PKRU" => host.pkru;
    "LG_PKRU_ON" => host.pkru_on;
    "LG_CET_ON" => host.cet_on;
    "LG_GUEST_FPU" => host.guest_fpu;
    "LG_HOST_U_CET" => host.u_cet;
    "LG_HOST_PL3_SSP" => host.pl3_ssp;
    "LG_GUEST_ENTRY" => host.guest_entry;
    "LG_HOST_RESUME" => host.host_resume;
    "LG_HOST_LSTAR" => host.host_lstar;
    "LG_DIRECT_LSTAR" => host.direct_lstar;
    "LG_HOST_STAR" => host.host_star;
    "LG_HOST_SFMASK" => host.host_sfmask;
    "LG_DIRECT_STAR" => host.direct_star;
    "LG_DIRECT_SFMASK" => host.direct_sfmask;
}

/// MSR_STAR as Linux's `syscall_init` writes it: SYSCALL's CS `__KERNEL_CS`
/// (0x10, so SS 0x18), SYSRET's base `__USER32_CS` (0x23). The direct
/// system call needs the first: our GDT's kernel code and data.
const DIRECT_STAR: u64 = (0x23 << 48) | (0x10 << 32);
/// MSR_SYSCALL_MASK as `syscall_init` writes it: CF PF AF ZF SF TF IF DF
/// OF IOPL NT RF AC ID. The direct system call needs IF, TF, DF, AC and NT
/// clear in `lguest_syscall` (Documentation/switcher.rst, "The direct
/// system call").
const DIRECT_SFMASK: u64 = 0x25_7fd5;
/// A STAR the `syscall_msr_test` knob loads: FreeBSD's (SYSCALL's CS 0x20).
const FOREIGN_STAR: u64 = (0x1b << 48) | (0x20 << 32);

const _: () = assert!(asm_define("LG_FRAME") + 22 * 8 == 4096);
// The other numbers the switcher shares with this file and the ABI.
const _: () = assert!(asm_define("LG_ALIAS_PAGE0") as u64 == ALIAS_PAGE0);
const _: () = assert!(asm_define("LG_SYSRET_VECTOR") == uapi::LGUEST_SYSRET_VECTOR as usize);
const _: () = assert!(asm_define("LG_VECTOR_NONE") as u64 == VECTOR_NONE);
const _: () = assert!(asm_define("LG_RFLAGS_GUEST_MASK") as u64 == RFLAGS_GUEST_MASK);
const _: () = assert!(asm_define("LG_GUEST_CS") as u64 == uapi::LGUEST_GUEST_CS);
const _: () = assert!(asm_define("LG_GUEST_SS") as u64 == uapi::LGUEST_GUEST_SS);
const _: () = assert!(asm_define("LG_HCALL_VECTOR") == uapi::LGUEST_TRAP_ENTRY as usize);

/// Why a trip into the guest ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Exit {
    /// An NMI hit the entry, or an interrupt was raised for the guest
    /// while the entry was being prepared: the guest did not run.
    Aborted,
    /// A host interrupt (or NMI, #MC) came; the host has handled it.
    HostEvent,
    /// The guest trapped: `vector`, `error` code, and `cr2`: CR2 for #PF,
    /// DR6 for #DB (what the guest kernel reads as its registers).
    Trap { vector: u64, error: u64, cr2: u64 },
    /// The guest's RIP is not an address it may run at: it was not
    /// entered.
    BadState { rip: u64 },
    /// A machine check hit the guest; the host's handler has run (as for a
    /// user-mode #MC) and may have queued work for the launcher's return to
    /// user mode (a memory-failure kill).
    MachineCheck,
    /// The switcher itself took exception `vector` in ring 0, at switcher
    /// offset `offset` (an iretq the guest arranged to fault, say). Nothing
    /// of the guest's registers is known any more.
    SwitcherFault {
        vector: u64,
        error: u64,
        offset: u64,
    },
    /// The guest's first x87, SSE or AVX instruction raised #NM (CR0.TS):
    /// its FPU state is loaded from now on, and the instruction runs again.
    FpuLoaded,
}

/// A vCPU's FPU state (x87, MXCSR, the XMM, YMM, ZMM and opmask registers:
/// the components of [`Switcher`]'s XSAVE mask), in one page in XSAVE's
/// standard format (FXSAVE's where the CPU has no XSAVE).
///
/// Until the guest first uses the FPU the state is not loaded and the guest
/// runs with CR0.TS set; from its first #NM on, [`Switcher::run_once`]
/// loads the state after `kernel_fpu_begin` (with interrupts off) and saves
/// it before `kernel_fpu_end`, around each entry: the guest's registers are
/// in the CPU only inside that section, so the launcher's own FPU state
/// (saved by `kernel_fpu_begin`, reloaded on its return to user mode) and
/// any other kernel FPU user never see them, whatever preemption, migration
/// or signals do between entries.
pub(crate) struct GuestFpu {
    area: HostPage,
    active: bool,
}

impl GuestFpu {
    /// The initial state: x87 and SSE as after `fninit` and reset (FCW
    /// 0x37f, MXCSR 0x1f80), every other component in its init state (the
    /// XSAVE header is zero).
    pub(crate) fn new() -> Result<Self> {
        let area = HostPage::new()?;
        // SAFETY: The page is ours and zeroed; FCW is the u16 at offset 0
        // and MXCSR the u32 at offset 24 of the legacy area.
        unsafe {
            area.va().cast::<u16>().write(0x37f);
            area.va().add(24).cast::<u32>().write(0x1f80);
        }
        Ok(Self {
            area,
            active: false,
        })
    }

    /// Whether the guest has used its FPU (its state is loaded for each
    /// entry).
    pub(crate) fn active(&self) -> bool {
        self.active
    }
}

/// The per-vCPU state the switcher loads and saves.
#[derive(Clone, Copy, Default)]
pub(crate) struct GuestCpu {
    /// The general registers, RIP, RSP and RFLAGS.
    pub(crate) regs: LguestRegs,
    /// FS and GS bases (the guest may set them with wrfsbase/wrgsbase, or
    /// with `LHCALL_SET_SEGMENT_BASE`).
    pub(crate) fs_base: u64,
    pub(crate) gs_base: u64,
    /// The GS base of the other mode: guest user mode's while the guest is
    /// in kernel mode, the kernel's while it is in user mode. The host
    /// swaps the two at every switch between the modes (as Xen's
    /// `toggle_guest_mode`), so a guest kernel needs no `swapgs`.
    pub(crate) gs_other: u64,
    /// The guest is in user mode: it runs on the user shadow table, and
    /// the next interrupt or exception enters its kernel on its kernel
    /// stack. The switcher's direct system call may change it.
    pub(crate) user_mode: bool,
    /// Switches the switcher made between the modes without an exit: user
    /// `syscall`s to the direct entry, `LGUEST_SYSRET_VECTOR` returns.
    pub(crate) direct_syscalls: u64,
    pub(crate) direct_sysrets: u64,
    /// The guest asked for a barrier at each entry to its kernel from user
    /// mode (`LGUEST_IBPB_USER_ENTRY`).
    pub(crate) ibpb_user_entry: bool,
    /// The guest was in user mode when it last exited: an entry in kernel
    /// mode now is an entry to its kernel from user mode the host made.
    pub(crate) exit_in_user: bool,
    /// The barriers made for it (`stat_ibpbs`).
    pub(crate) ibpbs: u64,
    /// The guest's hardware breakpoints as the host arms them
    /// (`LHCALL_SET_DEBUGREGS`): DR0-DR3, and DR7 as
    /// `uapi::debugreg_dr7` accepted it (0: none, the host's own
    /// breakpoints stay as they are).
    pub(crate) debugregs: [u64; 4],
    pub(crate) dr7: u64,
    /// The `syscall_msr_test` knob: an exit that did not put back the
    /// foreign LSTAR, STAR and SYSCALL_MASK loaded before the entry
    /// (what it left, what it should have).
    pub(crate) msr_test_lost: Option<([u64; 3], [u64; 3])>,
}

impl GuestCpu {
    /// Moves the guest to user mode (`user`) or kernel mode, swapping the
    /// two modes' GS bases if that is a change.
    pub(crate) fn set_mode(&mut self, user: bool) {
        if self.user_mode != user {
            core::mem::swap(&mut self.gs_base, &mut self.gs_other);
            self.user_mode = user;
        }
    }

    /// Clamps RFLAGS to what a guest may have.
    pub(crate) fn sanitize_flags(flags: u64) -> u64 {
        (flags & RFLAGS_GUEST_MASK) | RFLAGS_FIXED
    }

    /// Clamps RFLAGS to what an `iretq` to the guest may load: RF too.
    pub(crate) fn iret_flags(flags: u64) -> u64 {
        Self::sanitize_flags(flags) | (flags & RFLAGS_RF)
    }

    /// Whether RIP and RSP are what a launcher or a guest kernel may set
    /// for kernel mode: guest addresses ([`uapi::guest_va_ok`],
    /// [`uapi::guest_sp_ok`]). Returns to user mode take any RSP and any
    /// RIP (`hcall::enter_user`), as an `iretq` does.
    pub(crate) fn enterable(rip: u64, rsp: u64) -> bool {
        uapi::guest_va_ok(rip) && uapi::guest_sp_ok(rsp)
    }
}

impl CpuBlock {
    /// Fills in a zeroed block at `addr`: the guest GDT, TSS and IDT, which
    /// never change afterwards, and the fixed fields.
    fn init(&mut self, addr: u64, entry: &EntryPoints, host: &HostFeatures) {
        let at = |off: usize| addr + off as u64;
        self.host.guest_entry = entry.guest_entry;
        self.host.host_resume = entry.host_resume;
        self.host.direct_lstar = entry.syscall;
        self.host.direct_star = DIRECT_STAR;
        self.host.direct_sfmask = DIRECT_SFMASK;
        self.exit.self_ptr = addr;
        self.ist.self_ptr = addr;
        self.exit.verw_sel = KERNEL_DS;

        // GDT: the host's selectors for kernel code/data and user data/code,
        // and (copied at each entry) the host's per-CPU segment, which a
        // host NMI or #MC handler running on our GDT reads with `lsl`.
        let gdt = &mut self.desc.gdt;
        gdt[2] = descriptor::flat(true, 0); // 0x10 kernel CS64
        gdt[3] = descriptor::flat(false, 0); // 0x18 kernel DS
        gdt[5] = descriptor::flat(false, 3); // 0x2b user DS
        gdt[6] = descriptor::flat(true, 3); // 0x33 user CS64
        let tss_addr = at(offset_of!(CpuBlock, desc.tss));
        let [lo, hi] = descriptor::tss(tss_addr, core::mem::size_of::<Tss>() as u64 - 1);
        gdt[GDT_ENTRY_TSS] = lo;
        gdt[GDT_ENTRY_TSS + 1] = hi;
        self.host.guest_gdtr = DescPtr {
            limit: (16 * 8 - 1) as u16,
            base: at(offset_of!(CpuBlock, desc.gdt)),
        };

        // TSS: RSP0 at the top of page 0; our IST stacks in page 3; IST1-4
        // are the host's, copied at each entry. No I/O bitmap (its base is
        // beyond the limit).
        let ist_page = offset_of!(CpuBlock, ist);
        let mut ist = [0u64; 7];
        ist[IST_DB as usize - 1] = at(ist_page + IST_DB_TOP);
        ist[IST_NMI as usize - 1] = at(ist_page + IST_NMI_TOP);
        ist[IST_MC as usize - 1] = at(ist_page + IST_MC_TOP);
        self.desc.tss = Tss {
            rsp: [at(4096), 0, 0],
            ist,
            iomap_base: core::mem::size_of::<Tss>() as u16,
            ..Tss::default()
        };

        // IDT: every vector to its stub; int3, into, the hypercall vector
        // and the direct return to user mode (whose stub sends it back to
        // the host when it is not the guest kernel's to use) may be raised
        // from ring 3. Not 0x80, the guest's system-call
        // vector: the host may use it for a device interrupt (without
        // IA32 emulation), so `int $0x80` comes as #GP (interrupts.rs).
        let stubs = entry.stubs;
        for (v, gate) in self.idt.iter_mut().enumerate() {
            let ist = match v {
                1 => IST_DB,
                2 => IST_NMI,
                8 | 18 => IST_MC,
                _ => 0,
            };
            let dpl3 = v == 3
                || v == 4
                || v == uapi::LGUEST_TRAP_ENTRY as usize
                || v == uapi::LGUEST_SYSRET_VECTOR as usize;
            *gate = Gate::interrupt(stubs + 32 * v as u64, ist, if dpl3 { 3 } else { 0 });
        }
        self.host.guest_idtr = DescPtr {
            limit: (256 * 16 - 1) as u16,
            base: at(offset_of!(CpuBlock, idt)),
        };
        self.host.cet_on = host.cet as u32;
        self.host.pkru_on = host.pkru as u32;
        self.exit.fsgsbase = host.fsgsbase as u32;
        self.exit.sysenter = host.sysenter as u32;
    }
}

/// What the switcher does differently by what the host CPU has, the same
/// on every CPU.
struct HostFeatures {
    /// User shadow stacks (U_CET, PL3_SSP to switch).
    cet: bool,
    /// Protection keys (PKRU to switch).
    pkru: bool,
    /// CR4.FSGSBASE: the bases by instruction, not by MSR.
    fsgsbase: bool,
    /// SYSENTER exists in long mode: SYSENTER_CS to switch.
    sysenter: bool,
}

/// The addresses a block records: where the switcher's code is entered
/// (the alias's IDT stubs, entry and SYSCALL entry, and the module-text
/// resume point).
struct EntryPoints {
    stubs: u64,
    guest_entry: u64,
    host_resume: u64,
    syscall: u64,
}

/// The per-CPU blocks: `BLOCK_PAGES` pages per possible CPU, mapped
/// contiguously in the vmalloc area for this file's own use, and in the
/// alias (where the switcher and the guest see them) at
/// [`Blocks::alias_addr`].
struct Blocks {
    /// Every page, CPU by CPU.
    pages: KVec<*mut bindings::page>,
    /// The `vmap` of `pages`.
    base: *mut CpuBlock,
    /// The alias's address.
    alias: u64,
}

impl Blocks {
    fn new(ncpus: usize, alias: u64, entry: &EntryPoints, host: &HostFeatures) -> Result<Self> {
        let n = ncpus * BLOCK_PAGES;
        let mut b = Blocks {
            pages: KVec::with_capacity(n, GFP_KERNEL)?,
            base: core::ptr::null_mut(),
            alias,
        };
        for _ in 0..n {
            // SAFETY: alloc_pages may be called from process context.
            let page =
                unsafe { bindings::alloc_pages(bindings::GFP_KERNEL | bindings::__GFP_ZERO, 0) };
            if page.is_null() {
                return Err(ENOMEM);
            }
            // Room was reserved above.
            b.pages.push(page, GFP_KERNEL)?;
        }
        // SAFETY: The pages are ours and live as long as `b` (see `drop`).
        let base = unsafe { helpers::vmap(&mut b.pages) };
        if base.is_null() {
            return Err(ENOMEM);
        }
        b.base = base.cast();
        for cpu in 0..ncpus {
            let addr = b.alias_addr(cpu);
            // SAFETY: Block `cpu` lies in the mapping just made, zeroed (a
            // valid `CpuBlock`: integers only), and nothing else uses it yet.
            unsafe { &mut *b.base.add(cpu) }.init(addr, entry, host);
        }
        Ok(b)
    }

    /// The address of `cpu`'s block in the alias: the one the switcher
    /// uses, with the host's CR3 and the guest's alike.
    fn alias_addr(&self, cpu: usize) -> u64 {
        self.alias + ALIAS_BLOCKS + cpu as u64 * BLOCK_STRIDE
    }

    /// Physical address of page `p` of `cpu`'s block.
    fn phys(&self, cpu: usize, p: usize) -> Option<u64> {
        let page = *self.pages.get(cpu * BLOCK_PAGES + p)?;
        // SAFETY: `page` is one of our allocated pages.
        Some(unsafe { helpers::page_to_phys(page) })
    }
}

impl Drop for Blocks {
    fn drop(&mut self) {
        if !self.base.is_null() {
            // SAFETY: `base` came from `vmap` in `new`; nobody uses it now.
            unsafe { helpers::vunmap(self.base.cast()) };
        }
        for &page in self.pages.iter() {
            // SAFETY: Each page was allocated with order 0 in `new`.
            unsafe { bindings::__free_pages(page, 0) };
        }
    }
}

/// The switcher: its blocks and the page tables of its alias.
pub(crate) struct Switcher {
    blocks: Blocks,
    ncpus: usize,
    /// The alias's address ([`alias_base`]).
    alias: u64,
    /// The host's view of the alias: the text and every CPU's whole block.
    /// Its slot entry goes into the top-level table of each address space
    /// that owns a VM ([`SlotRef`]).
    _host_view: ShadowTable,
    /// The entry [`SlotRef`] writes into an owner's top-level table.
    host_slot: u64,
    /// Each CPU's guest view: the text and that CPU's pages 0-3, nothing
    /// else. A shadow table's slot points at its CPU's while it runs.
    guest_views: KVec<u64>,
    /// The tables behind `guest_views` (kept for their pages).
    _guest_view_tables: KVec<ShadowTable>,
    pcid: bool,
    levels: u32,
    /// The XSAVE components of a guest's FPU state; 0: FXSAVE.
    xsave_mask: u64,
    /// How a global TLB flush is done at entry, when one is needed (the
    /// block's `flush_global`); 0: the host has no global pages.
    flush_by: u32,
    /// CR4.LASS is on: every ring-3 access to the upper half faults, so
    /// guests may not use it (the switcher does not toggle LASS yet).
    lass: bool,
    /// CR4.FSGSBASE is on: the direct system call may be armed (it swaps
    /// the GS bases with `rdgsbase`/`wrgsbase`).
    fsgsbase: bool,
    /// The CPU has IBPB, for guests that ask for it (`LHCALL_IBPB`).
    ibpb: bool,
}

// SAFETY: Each block is used only by its own CPU with interrupts off; the
// rest is immutable after creation.
unsafe impl Send for Switcher {}
// SAFETY: As above.
unsafe impl Sync for Switcher {}

static SWITCHER: AtomicPtr<Switcher> = AtomicPtr::new(core::ptr::null_mut());

kernel::sync::global_lock! {
    // SAFETY: `Switcher::init` initializes it, at module load, before any
    // VM (its only user) can exist.
    unsafe(uninit) static SLOT_USERS: Mutex<KVec<(usize, usize)>> = KVec::new();
}

/// The switcher's lifetime, held by the module: made at load, freed when
/// dropped (at unload, when no file is open, or when a later part of the
/// module's init failed).
pub(crate) struct SwitcherGuard(());

impl SwitcherGuard {
    pub(crate) fn new() -> Result<Self> {
        Switcher::init()?;
        Ok(SwitcherGuard(()))
    }
}

impl Drop for SwitcherGuard {
    fn drop(&mut self) {
        Switcher::exit();
    }
}

/// The switcher's slot in a VM owner's address space: while one exists
/// for an address space (one per VM), slot [`SWITCHER_SLOT`] of its
/// top-level table maps the alias, which the switch needs to run on the
/// host's CR3. A forked child never has it (a new top-level table copies
/// the kernel's, where the slot is empty), and no part of the kernel
/// walks or frees that slot of a process's table.
pub(crate) struct SlotRef {
    mm: helpers::MmRef,
}

impl SlotRef {
    /// Gives the current task's address space the switcher's slot.
    pub(crate) fn attach() -> Result<Self> {
        let sw = Switcher::get()?;
        let mm = helpers::MmRef::current().ok_or(EINVAL)?;
        let mut users = SLOT_USERS.lock();
        if let Some(u) = users.iter_mut().find(|u| u.0 == mm.id()) {
            u.1 += 1;
        } else {
            let cur = mm.top_entry(SWITCHER_SLOT);
            if cur != 0 && !sw.is_host_slot(cur) {
                pr_err!(
                    "slot {} of this address space is in use: no VM\n",
                    SWITCHER_SLOT
                );
                return Err(EBUSY);
            }
            users.push((mm.id(), 1), GFP_KERNEL)?;
            mm.set_top_entry(SWITCHER_SLOT, sw.host_slot);
        }
        drop(users);
        Ok(SlotRef { mm })
    }
}

impl Drop for SlotRef {
    fn drop(&mut self) {
        let mut users = SLOT_USERS.lock();
        if let Some(i) = users.iter().position(|u| u.0 == self.mm.id()) {
            users[i].1 -= 1;
            if users[i].1 == 0 {
                // The tables stay (until the module goes, after a flush of
                // every CPU's TLB), so a CPU still caching the slot's
                // translations for this address space sees valid ones.
                self.mm.set_top_entry(SWITCHER_SLOT, 0);
                let _ = users.remove(i);
            }
        }
    }
}

impl Switcher {
    /// Sets up the switcher at module load.
    fn init() -> Result {
        // SAFETY: Called once per module load, before any VM exists.
        unsafe { SLOT_USERS.init() };
        let cr4 = helpers::read_cr4();
        if helpers::read_efer() & EFER_NXE == 0 {
            pr_err!("EFER.NXE is off; the switcher needs no-execute pages\n");
            return Err(ENODEV);
        }
        let levels = if cr4 & CR4_LA57 != 0 { 5 } else { 4 };
        let alias = alias_base(levels);
        let ncpus = kernel::cpu::nr_cpu_ids() as usize;
        let cet = helpers::user_shstk();
        let (start, end) = helpers::switcher_text();
        let (start, end) = (start as u64, end as u64);
        if end - start > ALIAS_PAGE0 {
            pr_err!("the switcher's text is larger than {:#x}\n", ALIAS_PAGE0);
            return Err(EINVAL);
        }
        let in_alias = |va: usize| alias + (va as u64 - start);
        let (guest_entry, host_resume) = helpers::switcher_entry_points();
        let entry = EntryPoints {
            stubs: in_alias(helpers::idt_stubs()),
            guest_entry: in_alias(guest_entry),
            host_resume: host_resume as u64,
            syscall: in_alias(helpers::syscall_entry()),
        };
        let features = HostFeatures {
            cet,
            pkru: cr4 & CR4_PKE != 0,
            fsgsbase: cr4 & CR4_FSGSBASE != 0,
            sysenter: helpers::sysenter_in_long_mode(),
        };
        let blocks = Blocks::new(ncpus, alias, &entry, &features)?;
        let mut text = KVec::new();
        let mut va = start;
        while va < end {
            // SAFETY: `va` lies in this module's text, which is vmalloc-mapped.
            let pfn = unsafe { bindings::vmalloc_to_pfn(va as *const _) } as u64;
            if pfn == 0 {
                pr_err!("the switcher's text at {:#x} has no page\n", va);
                return Err(EINVAL);
            }
            text.push(pfn << 12, GFP_KERNEL)?;
            va += PAGE_SIZE;
        }

        // The alias's tables: supervisor-only, never global; the text
        // read-only, the blocks not executable.
        let upper = PTE_P | PTE_RW;
        let block_pte = PTE_P | PTE_RW | PTE_A | PTE_D | PTE_NX;
        let map_text = |t: &mut ShadowTable| -> Result {
            for (i, &phys) in text.iter().enumerate() {
                t.map(alias + i as u64 * PAGE_SIZE, phys | PTE_P | PTE_A, upper)?;
            }
            Ok(())
        };
        let mut host_view = ShadowTable::new(levels)?;
        map_text(&mut host_view)?;
        let mut guest_view_tables = KVec::with_capacity(ncpus, GFP_KERNEL)?;
        let mut guest_views = KVec::with_capacity(ncpus, GFP_KERNEL)?;
        for cpu in 0..ncpus {
            let mut g = ShadowTable::new(levels)?;
            map_text(&mut g)?;
            let va = blocks.alias_addr(cpu);
            for p in 0..BLOCK_PAGES {
                let phys = blocks.phys(cpu, p).ok_or(EINVAL)?;
                let at = va + p as u64 * PAGE_SIZE;
                host_view.map(at, phys | block_pte, upper)?;
                if p < GUEST_BLOCK_PAGES {
                    g.map(at, phys | block_pte, upper)?;
                }
                if p == 0 {
                    g.map(alias + ALIAS_PAGE0, phys | block_pte, upper)?;
                }
            }
            guest_views.push(g.top(SWITCHER_SLOT), GFP_KERNEL)?;
            guest_view_tables.push(g, GFP_KERNEL)?;
        }
        let host_slot = host_view.top(SWITCHER_SLOT);
        let flush_by = if cr4 & CR4_PGE == 0 {
            0
        } else if helpers::has_invpcid() {
            1
        } else {
            2
        };
        let s = KBox::new(
            Switcher {
                blocks,
                ncpus,
                alias,
                _host_view: host_view,
                host_slot,
                guest_views,
                _guest_view_tables: guest_view_tables,
                pcid: cr4 & CR4_PCIDE != 0,
                levels,
                xsave_mask: helpers::fpu_xsave_mask(),
                flush_by,
                lass: cr4 & CR4_LASS != 0,
                fsgsbase: features.fsgsbase,
                ibpb: helpers::has_ibpb(),
            },
            GFP_KERNEL,
        )?;
        let fpu_by = if s.xsave_mask != 0 { "XSAVE" } else { "FXSAVE" };
        pr_info!(
            "switcher at {:#x}, alias {:#x} ({} text pages), direct map {:#x}, {} CPUs, {}-level paging{}{}{}{}, guest FPU by {} {:#x}, global flush by {}\n",
            start,
            alias,
            text.len(),
            helpers::page_offset_base(),
            ncpus,
            s.levels,
            if s.pcid { ", PCID" } else { "" },
            if cet { ", user shadow stacks" } else { "" },
            if features.fsgsbase { ", FSGSBASE" } else { "" },
            if features.sysenter { ", SYSENTER_CS switched" } else { "" },
            fpu_by,
            s.xsave_mask,
            ["none", "INVPCID", "CR4.PGE"][s.flush_by as usize]
        );
        SWITCHER.store(KBox::into_raw(s), Ordering::Release);
        Ok(())
    }

    /// Frees the switcher at module exit (or after a failed init).
    fn exit() {
        let p = SWITCHER.swap(core::ptr::null_mut(), Ordering::AcqRel);
        if !p.is_null() {
            // No address space has the slot any more (each VM held a
            // SlotRef, and no file is open), but a CPU may still cache
            // translations through the alias's tables: drop them first.
            helpers::flush_tlb_all_cpus();
            // SAFETY: `p` came from KBox::into_raw in `init`; no file is open
            // (each holds a module reference), so nobody uses it any more.
            drop(unsafe { KBox::from_raw(p) });
            // The registry is empty (every SlotRef went with its VM); its
            // buffer is freed here, as a static is never dropped.
            drop(core::mem::take(&mut *SLOT_USERS.lock()));
        }
    }

    /// The XSAVE components of a guest's FPU state (0 without XSAVE).
    pub(crate) fn xsave_mask(&self) -> u64 {
        self.xsave_mask
    }

    /// How a guest's barrier is made (`LHCALL_IBPB`): 1 an IBPB, 2 only
    /// counted (the `ibpb_test` knob, on a host without IBPB), 0 none
    /// (the host cannot).
    pub(crate) fn ibpb_kind(&self) -> u32 {
        if self.ibpb {
            1
        } else if crate::module_parameters::ibpb_test.value() != 0 {
            2
        } else {
            0
        }
    }

    /// One barrier for `vcpu`, as [`Self::ibpb_kind`] says, counted.
    pub(crate) fn ibpb_for(&self, vcpu: &mut GuestCpu) {
        match self.ibpb_kind() {
            0 => return,
            // SAFETY: Kind 1 only where the CPU has IBPB (`self.ibpb`,
            // from `has_ibpb` at load).
            1 => unsafe { helpers::ibpb() },
            _ => {}
        }
        vcpu.ibpbs += 1;
    }

    /// Whether a top-level entry is the host's view of the alias (the CPU
    /// sets the accessed bit in it as it walks).
    fn is_host_slot(&self, e: u64) -> bool {
        e & !PTE_A == self.host_slot & !PTE_A
    }

    /// Whether an entry with `upper` set flushes the host's global TLB
    /// entries (the host has some).
    pub(crate) fn flushes_global(&self) -> bool {
        self.flush_by != 0
    }

    /// Whether guests may use the upper half on this host (not with LASS).
    pub(crate) fn upper_half_ok(&self) -> bool {
        !self.lass
    }

    /// Whether `v` is a canonical address on this host (4- or 5-level
    /// paging): a base the switcher may write to MSR_FS_BASE or
    /// MSR_GS_BASE without a #GP in ring 0.
    pub(crate) fn canonical(&self, v: u64) -> bool {
        let bits = if self.levels == 5 { 57 } else { 48 };
        let top = (v as i64) >> (bits - 1);
        top == 0 || top == -1
    }

    /// The switcher, between init and exit.
    pub(crate) fn get() -> Result<&'static Switcher> {
        let p = SWITCHER.load(Ordering::Acquire);
        // SAFETY: Non-null only between init and exit, and exit runs only
        // when no file (the only users) is open.
        unsafe { p.as_ref() }.ok_or(ENODEV)
    }

    /// Page-table levels of the host (and so of every shadow table).
    pub(crate) fn levels(&self) -> u32 {
        self.levels
    }

    /// Makes `shadow`'s switcher slot map the alias as `cpu` needs it: the
    /// text and `cpu`'s block, no other block.
    fn map_block(&self, shadow: &mut ShadowTable, cpu: usize) -> Result {
        if shadow.mapped_cpu == Some(cpu as u32) {
            return Ok(());
        }
        let e = *self.guest_views.get(cpu).ok_or(EINVAL)?;
        shadow.set_top(SWITCHER_SLOT, e);
        shadow.mapped_cpu = Some(cpu as u32);
        Ok(())
    }

    /// Takes one trip into the guest and back, on `shadows`' table of the
    /// guest's mode. `irq` is the vCPU's
    /// interrupt state and `seen` its raise count when the run loop last
    /// looked for interrupts to deliver: if anything was raised since, the
    /// entry is abandoned (`Exit::Aborted`) so that the run loop looks again
    /// rather than leaving the interrupt waiting for the next exit. If the
    /// guest has upper-half mappings the host's global TLB
    /// entries are flushed once the guest's CR3 is loaded.
    ///
    /// `direct_entry`, if not 0, is the guest kernel's direct system-call
    /// entry (`LGUEST_SYSCALL_DIRECT`): where the host has FSGSBASE and the
    /// guest runs on its own tables, the switcher then moves the guest
    /// between its modes by itself, as many times as it likes before it
    /// exits, and `vcpu`'s mode and GS bases come back as it left them;
    /// except that with `irq_waiting` (an interrupt the guest kernel holds
    /// back) it leaves the return to user mode to the host, which delivers
    /// the interrupt there.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn run_once(
        &self,
        shadows: &mut Shadows,
        vcpu: &mut GuestCpu,
        direct_entry: u64,
        irq_waiting: bool,
        fpu: &mut GuestFpu,
        irq: &VcpuIrq,
        seen: u64,
    ) -> Result<Exit> {
        let r = vcpu.regs;
        // The iretq into the guest faults in ring 0 on a RIP that is not
        // canonical for this host: the only RIP the switcher refuses. Any
        // other (the last lower-half page, the guard hole) is a page fault
        // in ring 3, and RSP is loaded as it is, whatever it holds.
        if !self.canonical(r.rip) {
            return Ok(Exit::BadState { rip: r.rip });
        }
        let upper = shadows.upper();
        let direct = direct_entry != 0 && self.fsgsbase && shadows.guest_root().is_some();
        // APX's extended registers are in the guest's XSAVE mask when the
        // host has them on, but CR0.TS is not documented to cover them: on
        // such a host the guest's state is loaded from its first entry, so
        // that it never runs on the registers the last owner left.
        if self.xsave_mask & XFEATURE_MASK_APX != 0 {
            fpu.active = true;
        }
        let _irqs_off = helpers::IrqGuard::new();
        if irq.raised() != seen {
            return Ok(Exit::Aborted);
        }
        let cpu = helpers::cpu_id() as usize;
        if cpu >= self.ncpus {
            return Err(EINVAL);
        }
        // The switch runs on this CR3 through the alias: its slot must be
        // there (SlotRef, for the owner's address space, which RUN checked).
        let host_cr3 = helpers::read_cr3();
        let found = crate::shadow::read_entry(host_cr3 & PTE_ADDR, SWITCHER_SLOT);
        if !self.is_host_slot(found) {
            kernel::pr_warn_once!(
                "the launcher's address space lacks the switcher's slot (CR3 {:#x}: {:#x}, wanted {:#x})\n",
                host_cr3,
                found,
                self.host_slot
            );
            return Err(EIO);
        }
        // An entry to the guest kernel from user mode that the host made (a
        // trap, an interrupt or a system call from user mode delivered by
        // the run loop) has its barrier here, where the guest asked for
        // them; the direct switch makes its own.
        let ibpb = if vcpu.ibpb_user_entry {
            self.ibpb_kind()
        } else {
            0
        };
        if ibpb != 0 && vcpu.exit_in_user && !vcpu.user_mode {
            self.ibpb_for(vcpu);
        }
        // Both modes' tables map this CPU's block: the direct switch moves
        // between them.
        let (kernel, user) = shadows.tables();
        self.map_block(kernel, cpu)?;
        self.map_block(user, cpu)?;
        let (kernel_root, user_root) = (kernel.root_phys(), user.root_phys());
        let block = self.blocks.base.wrapping_add(cpu);
        {
            // SAFETY: `block` is this CPU's block (in the vmap made in
            // `Blocks::new`); with interrupts off only this code and the
            // switcher, which is not running, touch it.
            let b = unsafe { &mut *block };
            let noflush = if self.pcid { 1u64 << 63 } else { 0 };
            b.exit.host_cr3 = host_cr3 | noflush;
            b.exit.flush_global = if upper { self.flush_by } else { 0 };
            b.exit.nmi_pending = 0;
            b.exit.mc_pending = 0;
            b.exit.r0_fault = 0;
            b.host.gdtr_rw.base = helpers::gdt_rw(cpu as u32) as u64;
            b.host.guest_cr3 = if vcpu.user_mode {
                user_root
            } else {
                kernel_root
            };
            b.exit.direct = direct as u32;
            b.exit.user_mode = vcpu.user_mode as u32;
            b.exit.syscall_entry = direct_entry;
            b.exit.kernel_root = kernel_root;
            b.exit.user_root = user_root;
            b.exit.gs_other = vcpu.gs_other;
            b.exit.direct_syscalls = 0;
            b.exit.direct_sysrets = 0;
            b.exit.irq_waiting = irq_waiting as u32;
            b.exit.ibpb = ibpb;
            b.exit.direct_ibpbs = 0;
            b.host.guest_fs_base = vcpu.fs_base;
            b.host.guest_gs_base = vcpu.gs_base;
            b.host.guest_fpu = fpu.active as u32;
            // The host's per-CPU segment and IST1-4 stacks, as they are now
            // (a CPU brought up after the module loaded has them only now).
            let host_gdt = helpers::gdt_rw(cpu as u32) as *const u64;
            // SAFETY: The host GDT of a possible CPU has GDT_ENTRIES (16)
            // entries; entry 15 is GDT_ENTRY_CPUNODE.
            b.desc.gdt[GDT_ENTRY_CPUNODE] = unsafe { host_gdt.add(GDT_ENTRY_CPUNODE).read() };
            let mut ist = b.desc.tss.ist;
            ist[..4].copy_from_slice(&helpers::host_ist());
            b.desc.tss.ist = ist;
            let f = &mut b.exit.frame;
            f[slot::R15] = r.r15;
            f[slot::R14] = r.r14;
            f[slot::R13] = r.r13;
            f[slot::R12] = r.r12;
            f[slot::R11] = r.r11;
            f[slot::R10] = r.r10;
            f[slot::R9] = r.r9;
            f[slot::R8] = r.r8;
            f[slot::RBP] = r.rbp;
            f[slot::RDI] = r.rdi;
            f[slot::RSI] = r.rsi;
            f[slot::RDX] = r.rdx;
            f[slot::RCX] = r.rcx;
            f[slot::RBX] = r.rbx;
            f[slot::RAX] = r.rax;
            f[slot::VECTOR] = 0;
            f[slot::ERROR] = 0;
            f[slot::RIP] = r.rip;
            f[slot::CS] = uapi::LGUEST_GUEST_CS;
            f[slot::RFLAGS] = GuestCpu::iret_flags(r.rflags);
            f[slot::RSP] = r.rsp;
            f[slot::SS] = uapi::LGUEST_GUEST_SS;
        }

        // The guest's breakpoints, where it has any: in the CPU from here
        // to right after the switch, the host's own put back before
        // interrupts come on (Documentation/switcher.rst, "Debug
        // registers").
        let host_debugregs = (vcpu.dr7 != 0).then(|| {
            // SAFETY: Interrupts are off (`_irqs_off`); `debugregs_restore`
            // runs right after the switch, before they come on. The DR7 is
            // `uapi::debugreg_dr7`'s: breakpoints on user addresses only.
            unsafe { helpers::debugregs_load(&vcpu.debugregs, vcpu.dr7) }
        });
        // AMX's tiles are outside the guest's state: XFD armed for them
        // whatever the last FPU owner on this CPU left, loaded or not, so
        // that the guest neither reads nor writes tile registers another
        // task or VM left live (their AMX instruction raises #NM).
        // SAFETY: Interrupts are off (`_irqs_off`); the value goes back
        // right after the switch, before they come on.
        let xfd = unsafe { helpers::xfd_arm() };
        if fpu.active {
            // SAFETY: Interrupts are off (`_irqs_off`) and stay off until
            // the `fpu_end` right after the switch; no FPU section is open
            // in this (task) context.
            unsafe { helpers::fpu_begin() };
            self.fpu_load(fpu);
        }
        // The tests' foreign SYSCALL MSRs (`syscall_msr_test`), as a KVM
        // guest's can be live here: another LSTAR, a FreeBSD STAR (kernel
        // CS 0x20, null in our GDT) and a hostile SYSCALL_MASK of 0.
        let foreign =
            (direct && crate::module_parameters::syscall_msr_test.value() != 0).then(|| {
                let real = helpers::syscall_msrs();
                let foreign = [real[0] ^ 0x1000, FOREIGN_STAR, 0];
                // SAFETY: Interrupts are off (`_irqs_off`); `real` goes back
                // right after the switch, before they come on.
                unsafe { helpers::set_syscall_msrs(foreign) };
                (real, foreign)
            });
        // SAFETY: Interrupts are off (`_irqs_off`), `block` is this CPU's
        // block, set up in `CpuBlock::init` and just now; the host's CR3
        // maps the alias (checked above) and `shadow` maps the alias's text
        // and this block (`map_block`).
        unsafe { helpers::switch_to_guest(block.cast()) };
        if let Some((real, foreign)) = foreign {
            let back = helpers::syscall_msrs();
            // SAFETY: As above: the host's own values, interrupts still off.
            unsafe { helpers::set_syscall_msrs(real) };
            if back != foreign {
                vcpu.msr_test_lost = Some((back, foreign));
            }
        }
        if fpu.active {
            self.fpu_save(fpu);
            // SAFETY: Closes the section opened above, interrupts still off.
            unsafe { helpers::fpu_end() };
        }
        // SAFETY: `xfd` is what `xfd_arm` returned above, interrupts off
        // since.
        unsafe { helpers::xfd_restore(xfd) };
        if let Some(saved) = &host_debugregs {
            // SAFETY: Loaded above, interrupts off since.
            unsafe { helpers::debugregs_restore(saved) };
        }

        // SAFETY: As above: the switcher has returned, so this code is again
        // the only user of the block.
        let b = unsafe { &mut *block };
        let aborted = b.exit.aborted != 0;
        let fault = b.exit.r0_fault != 0;
        let f = &b.exit.frame;
        let vector = if aborted || fault { 0 } else { f[slot::VECTOR] };
        if !aborted && !fault {
            let r = &mut vcpu.regs;
            r.r15 = f[slot::R15];
            r.r14 = f[slot::R14];
            r.r13 = f[slot::R13];
            r.r12 = f[slot::R12];
            r.r11 = f[slot::R11];
            r.r10 = f[slot::R10];
            r.r9 = f[slot::R9];
            r.r8 = f[slot::R8];
            r.rbp = f[slot::RBP];
            r.rdi = f[slot::RDI];
            r.rsi = f[slot::RSI];
            r.rdx = f[slot::RDX];
            r.rcx = f[slot::RCX];
            r.rbx = f[slot::RBX];
            r.rax = f[slot::RAX];
            r.rip = f[slot::RIP];
            r.rflags = f[slot::RFLAGS];
            r.rsp = f[slot::RSP];
            vcpu.fs_base = b.host.guest_fs_base;
            vcpu.gs_base = b.host.guest_gs_base;
            if direct {
                vcpu.user_mode = b.exit.user_mode != 0;
                vcpu.gs_other = b.exit.gs_other;
            }
        }
        vcpu.direct_syscalls += b.exit.direct_syscalls;
        vcpu.direct_sysrets += b.exit.direct_sysrets;
        vcpu.ibpbs += b.exit.direct_ibpbs;
        vcpu.exit_in_user = vcpu.user_mode;
        // Page 0 is mapped in every guest's view of this CPU: leave nothing
        // of this guest's direct switch there for the next (review N5).
        b.exit.scratch_rsp = 0;
        b.exit.scratch_rax = 0;
        b.exit.scratch_rdx = 0;

        // NMIs and machine checks are never dropped: whether they hit the
        // guest or the switcher, the host's own handler runs now.
        // An NMI that hit the guest came through our stub and no iretq
        // since: NMIs are still blocked, and `int 2` runs the host's
        // handler as the hardware would (its iretq unblocks them). One the
        // stub recorded in ring 0 was followed by the stub's iretq, so NMIs
        // are unblocked: `int 2` would run the handler open to a second NMI
        // in its first instructions, so a real NMI is sent instead.
        let guest_nmi = vector == 2;
        let ring0_nmi = b.exit.nmi_pending != 0;
        let guest_mc = vector == 18;
        let ring0_mc = b.exit.mc_pending != 0;
        if guest_nmi {
            // SAFETY: Runs the host's NMI handler through the host IDT (now
            // loaded again), as the kernel did for KVM before FRED.
            unsafe { core::arch::asm!("int 2") };
        } else if ring0_nmi {
            helpers::self_nmi();
        }
        if ring0_mc {
            // SAFETY: As above, for the machine-check handler: the #MC hit
            // the switcher, kernel code.
            unsafe { core::arch::asm!("int 18") };
        }
        if guest_mc {
            // A machine check in the guest is the launcher's, as for any
            // user process: the handler may queue a kill for it.
            helpers::machine_check_user(vcpu.regs.rip);
        }
        if b.exit.db_count != 0 {
            b.exit.db_count = 0;
            kernel::pr_info_once!(
                "a #DB hit the switcher in ring 0 (DR6 {:#x}: a launcher's data breakpoint and a guest's mov ss?); ignored\n",
                b.exit.db_dr6
            );
        }
        if fault {
            // The fault's RIP is in the alias, or in the module's text for
            // the exit's last part (lguest_host_resume): an offset in the
            // section either way.
            let (start, end) = helpers::switcher_text();
            let rip = b.exit.r0_rip;
            let base = if rip >= self.alias && rip < self.alias + (end - start) as u64 {
                self.alias
            } else {
                start as u64
            };
            let exit = Exit::SwitcherFault {
                vector: b.exit.r0_vector,
                error: b.exit.r0_error,
                offset: rip.wrapping_sub(base),
            };
            // A host interrupt that hit the switcher in ring 0 has been
            // accepted by the local APIC: it still goes to its handler (and
            // EOI), or its priority class stays blocked on this CPU.
            if (32..256).contains(&b.exit.r0_vector) {
                Self::deliver_to_host(b.host.idtr.base, b.exit.r0_vector);
            }
            return Ok(exit);
        }
        if aborted {
            return Ok(Exit::Aborted);
        }
        if guest_mc {
            return Ok(Exit::MachineCheck);
        }
        if guest_nmi {
            return Ok(Exit::HostEvent);
        }
        // An NMI or #MC recorded in ring 0 (handled just now) does not
        // replace the exit that was under way. A host interrupt that made
        // the guest exit has been accepted by the local APIC and must still
        // reach its handler, and its EOI, or its priority class stays
        // blocked on this CPU for good (the timer with it); a hypercall or
        // trap must still be handled, or it is lost.
        let mut dr6 = 0;
        if vector == 1 {
            // A guest single-step or breakpoint left its status in DR6:
            // the guest kernel's to read (it goes with the trap), cleared
            // here, as the host's own #DB handler would have.
            // SAFETY: Reading DR6 and writing its reset value have no
            // other effect.
            unsafe {
                core::arch::asm!("mov {}, dr6", out(reg) dr6, options(nomem, nostack));
                core::arch::asm!("mov dr6, {}", in(reg) 0xffff_0ff0u64, options(nomem, nostack))
            };
        }
        if vector == VECTOR_NONE {
            // The direct switch exited only for what was recorded above.
            return Ok(Exit::HostEvent);
        }
        if vector >= 32 && vector != uapi::LGUEST_TRAP_ENTRY as u64 {
            let idt = b.host.idtr.base;
            // Last: the handler returns with interrupts on (see
            // switcher_64.S), so nothing of this CPU's block is used after.
            Self::deliver_to_host(idt, vector);
            return Ok(Exit::HostEvent);
        }
        if vector == 7 {
            if !fpu.active {
                // An AMX instruction under CR0.TS may have raised XFD's
                // #NM instead of TS's: its record goes as the host's #NM
                // handler would clear it (the instruction runs again).
                helpers::clear_xfd_err();
                fpu.active = true;
                return Ok(Exit::FpuLoaded);
            }
            // With the state loaded, a #NM is XFD's (a component the
            // launcher's task has not been given): the guest's trap.
            helpers::clear_xfd_err();
        }
        Ok(Exit::Trap {
            vector,
            error: f[slot::ERROR],
            cr2: if vector == 1 { dr6 } else { b.host.guest_cr2 },
        })
    }

    /// Loads `fpu`'s state into this CPU's FPU registers.
    fn fpu_load(&self, fpu: &GuestFpu) {
        let area = fpu.area.va();
        if self.xsave_mask != 0 {
            // SAFETY: `area` is a page-aligned page holding an XSAVE image
            // in the standard format: the initial one of `GuestFpu::new`
            // (a zero header, valid FCW and MXCSR) or one XSAVE wrote, with
            // the same mask, which only the CPU has written to since.
            // Called inside a kernel FPU section, so the registers are ours
            // to change. The kernel's Rust code uses no FPU or SIMD
            // registers.
            unsafe {
                core::arch::asm!(
                    "xrstor64 [{area}]",
                    area = in(reg) area,
                    in("eax") self.xsave_mask as u32,
                    in("edx") (self.xsave_mask >> 32) as u32,
                    options(nostack, readonly),
                )
            };
        } else {
            // SAFETY: As above, for an FXSAVE image (16-byte aligned).
            unsafe {
                core::arch::asm!("fxrstor64 [{area}]", area = in(reg) area, options(nostack, readonly))
            };
        }
    }

    /// Saves this CPU's FPU registers (the guest's) into `fpu`.
    fn fpu_save(&self, fpu: &mut GuestFpu) {
        let area = fpu.area.va();
        if self.xsave_mask != 0 {
            // SAFETY: `area` is a page-aligned page we own (the image of the
            // mask's components fits in it: `lg_fpu_xsave_mask`); called in
            // the kernel FPU section `fpu_load` began, so the registers
            // hold the guest's state.
            unsafe {
                core::arch::asm!(
                    "xsave64 [{area}]",
                    area = in(reg) area,
                    in("eax") self.xsave_mask as u32,
                    in("edx") (self.xsave_mask >> 32) as u32,
                    options(nostack),
                )
            };
        } else {
            // SAFETY: As above, with FXSAVE's 512 bytes.
            unsafe { core::arch::asm!("fxsave64 [{area}]", area = in(reg) area, options(nostack)) };
        }
    }

    /// Runs the host's handler for external interrupt `vector`, from the
    /// host IDT at `idt`.
    fn deliver_to_host(idt: u64, vector: u64) {
        let gate = (idt + 16 * vector) as *const u8;
        // SAFETY: `gate` is inside the host IDT (its base from sidt, vector
        // below 256), which is always mapped and readable.
        let (lo, mid, hi, attr) = unsafe {
            (
                gate.cast::<u16>().read_unaligned() as u64,
                gate.add(6).cast::<u16>().read_unaligned() as u64,
                gate.add(8).cast::<u32>().read_unaligned() as u64,
                gate.add(5).read(),
            )
        };
        if attr & 0x80 == 0 {
            // Linux fills every gate, so this cannot happen; if it did,
            // the interrupt would stay unacknowledged (a module cannot
            // reach the APIC's EOI): say so once.
            kernel::pr_warn_once!(
                "host IDT has no gate for vector {}: interrupt not acknowledged\n",
                vector
            );
            return;
        }
        // SAFETY: Interrupts are still off and the interrupt arrived on this
        // CPU while the guest ran; the handler is the host's own gate. Our
        // caller returns right after, so interrupts coming back on (and a
        // possible preemption) in the handler's return path are fine.
        unsafe { helpers::deliver_to_host((lo | (mid << 16) | (hi << 32)) as usize) };
    }
}
