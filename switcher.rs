// SPDX-License-Identifier: GPL-2.0
//! The switcher's Rust half: the per-CPU blocks, the guest's GDT, IDT and
//! TSS, and [`Switcher::run_once`], which takes one trip into the guest.
//!
//! One [`Switcher`] exists while the module is loaded (created in module
//! init, freed at exit when no file is open). Each possible CPU has a block
//! of eight pages (layout in `switcher_64.S`); a block is only touched by its
//! own CPU with interrupts off, so it needs no lock. The switcher's code is
//! the page-aligned `.text.lguest_switcher` section of this module.

use core::sync::atomic::{
    AtomicPtr,
    Ordering, //
};
use kernel::{
    bindings,
    prelude::*, //
};

use crate::{
    helpers,
    mm::{
        ShadowTable,
        PAGE_SIZE,
        PTE_A,
        PTE_D,
        PTE_NX,
        PTE_P,
        PTE_RW, //
    },
    uapi::LguestRegs,
};

/// Pages per CPU block, and the allocation order.
const BLOCK_PAGES: u64 = 8;
const BLOCK_ORDER: u32 = 3;

/// Offsets in page 0 (see `switcher_64.S`).
const HOST_CR3: usize = 8;
const HOST_GDTR_RW: usize = 72;
const HOST_IDTR: usize = 88;
const GUEST_GDTR: usize = 120;
const GUEST_IDTR: usize = 136;
const GUEST_CR3: usize = 152;
const NMI_PENDING: usize = 160;
const MC_PENDING: usize = 168;
const GUEST_FS_BASE: usize = 176;
const GUEST_GS_BASE: usize = 184;
const PKRU_ON: usize = 196;
const GUEST_CR2: usize = 200;
const ABORTED: usize = 208;
/// The guest frame at the top of page 0: 22 quadwords.
const FRAME: usize = 4096 - 22 * 8;
/// Page 2: the GDT, then the TSS.
const GDT: usize = 2 * 4096;
const TSS: usize = GDT + 128;
const IDT: usize = 4096;

/// Kernel code and data selectors: the host's, so CS stays valid on return.
const KERNEL_CS: u16 = 0x10;
/// Host GDT entry of the TSS.
const GDT_ENTRY_TSS: usize = 8;
/// Host GDT entry of the per-CPU segment.
const GDT_ENTRY_CPUNODE: usize = 15;

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
/// DF, OF, AC. IF is always on, IOPL always 0.
const RFLAGS_GUEST_MASK: u64 = 0x1 | 0x4 | 0x10 | 0x40 | 0x80 | 0x100 | 0x400 | 0x800 | 0x4_0000;
const RFLAGS_FIXED: u64 = 0x2 | 0x200;

/// CR4 bits.
const CR4_PCIDE: u64 = 1 << 17;
const CR4_PKE: u64 = 1 << 22;
const CR4_LA57: u64 = 1 << 12;
/// EFER.NXE.
const EFER_NXE: u64 = 1 << 11;

/// Why a trip into the guest ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Exit {
    /// An NMI hit the entry: the guest did not run.
    Aborted,
    /// A host interrupt (or NMI, #MC) came; the host has handled it.
    HostEvent,
    /// The guest trapped: `vector`, `error` code, and CR2 for #PF.
    Trap { vector: u64, error: u64, cr2: u64 },
}

/// The per-vCPU state the switcher loads and saves.
#[derive(Clone, Copy, Default)]
pub(crate) struct GuestCpu {
    /// The general registers, RIP, RSP and RFLAGS.
    pub(crate) regs: LguestRegs,
    /// FS and GS bases (the guest may set them with wrfsbase/wrgsbase).
    pub(crate) fs_base: u64,
    pub(crate) gs_base: u64,
}

impl GuestCpu {
    /// Clamps RFLAGS to what a guest may have.
    pub(crate) fn sanitize_flags(flags: u64) -> u64 {
        (flags & RFLAGS_GUEST_MASK) | RFLAGS_FIXED
    }
}

/// One CPU's block: eight physically contiguous pages.
struct CpuBlock {
    page: *mut bindings::page,
    va: *mut u8,
    phys: u64,
}

impl CpuBlock {
    fn new(cpu: u32) -> Result<Self> {
        // SAFETY: alloc_pages may be called from process context.
        let page = unsafe {
            bindings::alloc_pages(bindings::GFP_KERNEL | bindings::__GFP_ZERO, BLOCK_ORDER)
        };
        if page.is_null() {
            return Err(ENOMEM);
        }
        // SAFETY: `page` heads a valid allocation of `BLOCK_PAGES` pages.
        let (va, phys) = unsafe { (helpers::page_address(page), helpers::page_to_phys(page)) };
        let b = CpuBlock { page, va, phys };
        b.init(cpu);
        Ok(b)
    }

    fn put_u64(&self, off: usize, v: u64) {
        debug_assert!(off + 8 <= (BLOCK_PAGES * PAGE_SIZE) as usize);
        // SAFETY: `off` is inside the block we own (all offsets used are
        // constants below 32 KiB); unaligned is fine on x86.
        unsafe { self.va.add(off).cast::<u64>().write_unaligned(v) }
    }

    fn get_u64(&self, off: usize) -> u64 {
        // SAFETY: As in `put_u64`.
        unsafe { self.va.add(off).cast::<u64>().read_unaligned() }
    }

    fn put_u16(&self, off: usize, v: u16) {
        // SAFETY: As in `put_u64`.
        unsafe { self.va.add(off).cast::<u16>().write_unaligned(v) }
    }

    fn put_u32(&self, off: usize, v: u32) {
        // SAFETY: As in `put_u64`.
        unsafe { self.va.add(off).cast::<u32>().write_unaligned(v) }
    }

    fn put_u8(&self, off: usize, v: u8) {
        // SAFETY: As in `put_u64`.
        unsafe { self.va.add(off).write(v) }
    }

    fn addr(&self, off: usize) -> u64 {
        self.va as u64 + off as u64
    }

    /// Builds the guest GDT, TSS and IDT; they never change afterwards.
    fn init(&self, cpu: u32) {
        // GDT: the host's selectors for kernel code/data and user data/code.
        self.put_u64(GDT + 2 * 8, 0x00af_9b00_0000_ffff); // 0x10 kernel CS64
        self.put_u64(GDT + 3 * 8, 0x00cf_9300_0000_ffff); // 0x18 kernel DS
        self.put_u64(GDT + 5 * 8, 0x00cf_f300_0000_ffff); // 0x2b user DS
        self.put_u64(GDT + 6 * 8, 0x00af_fb00_0000_ffff); // 0x33 user CS64
                                                          // The host's per-CPU segment (CPU and node in its limit): a host NMI
                                                          // handler running on our GDT reads it when the CPU lacks RDPID.
        let host_gdt = helpers::gdt_rw(cpu) as *const u64;
        // SAFETY: The host GDT of a possible CPU has GDT_ENTRIES (16)
        // entries; entry 15 is GDT_ENTRY_CPUNODE.
        self.put_u64(GDT + GDT_ENTRY_CPUNODE * 8, unsafe {
            host_gdt.add(GDT_ENTRY_CPUNODE).read()
        });
        let tss = self.addr(TSS);
        let limit: u64 = 104 - 1;
        let low = (limit & 0xffff)
            | ((tss & 0xff_ffff) << 16)
            | (0x89 << 40) // present, 64-bit TSS (available)
            | (((limit >> 16) & 0xf) << 48)
            | (((tss >> 24) & 0xff) << 56);
        self.put_u64(GDT + GDT_ENTRY_TSS * 8, low);
        self.put_u64(GDT + GDT_ENTRY_TSS * 8 + 8, tss >> 32);
        self.put_u16(GUEST_GDTR, 16 * 8 - 1);
        self.put_u64(GUEST_GDTR + 2, self.addr(GDT));

        // TSS: RSP0 at the top of page 0; IST6 (our NMI) in the middle of
        // page 3, IST7 (our #MC, #DF) at its top; IST1-5, which the host's
        // IDT uses, at the top of pages 4-7 (see switcher_64.S). No I/O
        // bitmap (its base is beyond the limit).
        self.put_u64(TSS + 4, self.addr(4096));
        for i in 0..5 {
            self.put_u64(TSS + 36 + 8 * i, self.addr(8 * 4096));
        }
        self.put_u64(TSS + 36 + 8 * 5, self.addr(3 * 4096 + 2048));
        self.put_u64(TSS + 36 + 8 * 6, self.addr(4 * 4096));
        self.put_u16(TSS + 102, 104);

        // IDT: every vector to its stub; int3, into and the hypercall vector
        // may be raised from ring 3. Not 0x80, the guest's system-call
        // vector: the host may use it for a device interrupt (without
        // IA32 emulation), so `int $0x80` comes as #GP (interrupts.rs).
        let stubs = helpers::idt_stubs() as u64;
        for v in 0..256usize {
            let handler = stubs + 32 * v as u64;
            let ist: u8 = match v {
                2 => 6,
                8 | 18 => 7,
                _ => 0,
            };
            let dpl3 = v == 3 || v == 4 || v == crate::uapi::LGUEST_TRAP_ENTRY as usize;
            let off = IDT + 16 * v;
            self.put_u16(off, handler as u16);
            self.put_u16(off + 2, KERNEL_CS);
            self.put_u8(off + 4, ist);
            self.put_u8(off + 5, if dpl3 { 0xee } else { 0x8e });
            self.put_u16(off + 6, (handler >> 16) as u16);
            self.put_u32(off + 8, (handler >> 32) as u32);
            self.put_u32(off + 12, 0);
        }
        self.put_u16(GUEST_IDTR, 256 * 16 - 1);
        self.put_u64(GUEST_IDTR + 2, self.addr(IDT));
    }
}

impl Drop for CpuBlock {
    fn drop(&mut self) {
        // SAFETY: `page` was allocated with this order in `new`.
        unsafe { bindings::__free_pages(self.page, BLOCK_ORDER) };
    }
}

/// The switcher: its text pages and one block per possible CPU.
pub(crate) struct Switcher {
    blocks: KVec<CpuBlock>,
    text: KVec<(u64, u64)>,
    pkru: bool,
    pcid: bool,
    levels: u32,
}

// SAFETY: Each block is used only by its own CPU with interrupts off; the
// rest is immutable after creation.
unsafe impl Send for Switcher {}
// SAFETY: As above.
unsafe impl Sync for Switcher {}

static SWITCHER: AtomicPtr<Switcher> = AtomicPtr::new(core::ptr::null_mut());

impl Switcher {
    /// Sets up the switcher at module load.
    pub(crate) fn init() -> Result {
        let cr4 = helpers::read_cr4();
        if helpers::read_efer() & EFER_NXE == 0 {
            pr_err!("EFER.NXE is off; the switcher needs no-execute pages\n");
            return Err(ENODEV);
        }
        let ncpus = kernel::cpu::nr_cpu_ids();
        let mut blocks = KVec::with_capacity(ncpus as usize, GFP_KERNEL)?;
        for cpu in 0..ncpus {
            blocks.push(CpuBlock::new(cpu)?, GFP_KERNEL)?;
        }
        let (start, end) = helpers::switcher_text();
        let mut text = KVec::new();
        let mut va = start as u64;
        while va < end as u64 {
            // SAFETY: `va` lies in this module's text, which is vmalloc-mapped.
            let pfn = unsafe { bindings::vmalloc_to_pfn(va as *const _) } as u64;
            text.push((va, pfn << 12), GFP_KERNEL)?;
            va += PAGE_SIZE;
        }
        let s = KBox::new(
            Switcher {
                blocks,
                text,
                pkru: cr4 & CR4_PKE != 0,
                pcid: cr4 & CR4_PCIDE != 0,
                levels: if cr4 & CR4_LA57 != 0 { 5 } else { 4 },
            },
            GFP_KERNEL,
        )?;
        pr_info!(
            "switcher at {:#x} ({} text pages), {} CPUs, {}-level paging{}\n",
            start,
            s.text.len(),
            ncpus,
            s.levels,
            if s.pcid { ", PCID" } else { "" }
        );
        SWITCHER.store(KBox::into_raw(s), Ordering::Release);
        Ok(())
    }

    /// Frees the switcher at module exit.
    pub(crate) fn exit() {
        let p = SWITCHER.swap(core::ptr::null_mut(), Ordering::AcqRel);
        if !p.is_null() {
            // SAFETY: `p` came from KBox::into_raw in `init`; no file is open
            // (each holds a module reference), so nobody uses it any more.
            drop(unsafe { KBox::from_raw(p) });
        }
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

    /// Maps the switcher text, and room for any CPU's block, into a new
    /// shadow table. The blocks stay not-present until a CPU runs the guest.
    pub(crate) fn map_into(&self, shadow: &mut ShadowTable) -> Result {
        let upper = PTE_P | PTE_RW;
        for &(va, phys) in self.text.iter() {
            shadow.map(va, phys | PTE_P | PTE_A, upper)?;
        }
        for b in self.blocks.iter() {
            for p in 0..BLOCK_PAGES {
                shadow.map(b.va as u64 + p * PAGE_SIZE, 0, upper)?;
            }
        }
        Ok(())
    }

    /// Makes `shadow` map `cpu`'s block and no other.
    fn map_block(&self, shadow: &mut ShadowTable, cpu: u32) -> Result {
        if shadow.mapped_cpu == Some(cpu) {
            return Ok(());
        }
        if let Some(old) = shadow.mapped_cpu.take() {
            let b = self.blocks.get(old as usize).ok_or(EINVAL)?;
            for p in 0..BLOCK_PAGES {
                shadow.set_existing(b.va as u64 + p * PAGE_SIZE, 0)?;
            }
        }
        let b = self.blocks.get(cpu as usize).ok_or(EINVAL)?;
        for p in 0..BLOCK_PAGES {
            let pte = (b.phys + p * PAGE_SIZE) | PTE_P | PTE_RW | PTE_A | PTE_D | PTE_NX;
            shadow.set_existing(b.va as u64 + p * PAGE_SIZE, pte)?;
        }
        shadow.mapped_cpu = Some(cpu);
        Ok(())
    }

    /// Takes one trip into the guest and back.
    pub(crate) fn run_once(&self, shadow: &mut ShadowTable, vcpu: &mut GuestCpu) -> Result<Exit> {
        let _irqs_off = helpers::IrqGuard::new();
        let cpu = helpers::cpu_id();
        self.map_block(shadow, cpu)?;
        let b = self.blocks.get(cpu as usize).ok_or(EINVAL)?;

        let noflush = if self.pcid { 1u64 << 63 } else { 0 };
        b.put_u64(HOST_CR3, helpers::read_cr3() | noflush);
        b.put_u64(HOST_GDTR_RW + 2, helpers::gdt_rw(cpu) as u64);
        b.put_u64(GUEST_CR3, shadow.root_phys());
        b.put_u32(PKRU_ON, self.pkru as u32);
        b.put_u64(GUEST_FS_BASE, vcpu.fs_base);
        b.put_u64(GUEST_GS_BASE, vcpu.gs_base);
        b.put_u64(NMI_PENDING, 0);
        b.put_u64(MC_PENDING, 0);
        let r = &vcpu.regs;
        let frame = |s: usize| FRAME + 8 * s;
        for (s, v) in [
            (slot::R15, r.r15),
            (slot::R14, r.r14),
            (slot::R13, r.r13),
            (slot::R12, r.r12),
            (slot::R11, r.r11),
            (slot::R10, r.r10),
            (slot::R9, r.r9),
            (slot::R8, r.r8),
            (slot::RBP, r.rbp),
            (slot::RDI, r.rdi),
            (slot::RSI, r.rsi),
            (slot::RDX, r.rdx),
            (slot::RCX, r.rcx),
            (slot::RBX, r.rbx),
            (slot::RAX, r.rax),
            (slot::VECTOR, 0),
            (slot::ERROR, 0),
            (slot::RIP, r.rip),
            (slot::CS, crate::uapi::LGUEST_GUEST_CS),
            (slot::RFLAGS, GuestCpu::sanitize_flags(r.rflags)),
            (slot::RSP, r.rsp),
            (slot::SS, crate::uapi::LGUEST_GUEST_SS),
        ] {
            b.put_u64(frame(s), v);
        }

        // SAFETY: Interrupts are off (`_irqs_off`), `b` is this CPU's block,
        // set up in `CpuBlock::init` and just now, and `shadow` maps the
        // switcher text (`map_into`) and this block (`map_block`).
        unsafe { helpers::switch_to_guest(b.va) };

        let aborted = b.get_u64(ABORTED) != 0;
        let vector = b.get_u64(frame(slot::VECTOR));
        if !aborted {
            let r = &mut vcpu.regs;
            r.r15 = b.get_u64(frame(slot::R15));
            r.r14 = b.get_u64(frame(slot::R14));
            r.r13 = b.get_u64(frame(slot::R13));
            r.r12 = b.get_u64(frame(slot::R12));
            r.r11 = b.get_u64(frame(slot::R11));
            r.r10 = b.get_u64(frame(slot::R10));
            r.r9 = b.get_u64(frame(slot::R9));
            r.r8 = b.get_u64(frame(slot::R8));
            r.rbp = b.get_u64(frame(slot::RBP));
            r.rdi = b.get_u64(frame(slot::RDI));
            r.rsi = b.get_u64(frame(slot::RSI));
            r.rdx = b.get_u64(frame(slot::RDX));
            r.rcx = b.get_u64(frame(slot::RCX));
            r.rbx = b.get_u64(frame(slot::RBX));
            r.rax = b.get_u64(frame(slot::RAX));
            r.rip = b.get_u64(frame(slot::RIP));
            r.rflags = b.get_u64(frame(slot::RFLAGS));
            r.rsp = b.get_u64(frame(slot::RSP));
            vcpu.fs_base = b.get_u64(GUEST_FS_BASE);
            vcpu.gs_base = b.get_u64(GUEST_GS_BASE);
        }

        // NMIs and machine checks are never dropped: whether they hit the
        // guest or the switcher, the host's own handler runs now.
        // An NMI that hit the guest came through our stub and no iretq
        // since: NMIs are still blocked, and `int 2` runs the host's
        // handler as the hardware would (its iretq unblocks them). One the
        // stub recorded in ring 0 was followed by the stub's iretq, so NMIs
        // are unblocked: `int 2` would run the handler open to a second NMI
        // in its first instructions, so a real NMI is sent instead.
        let guest_nmi = !aborted && vector == 2;
        let ring0_nmi = b.get_u64(NMI_PENDING) != 0;
        let nmi = guest_nmi || ring0_nmi;
        let mc = b.get_u64(MC_PENDING) != 0 || (!aborted && vector == 18);
        if guest_nmi {
            // SAFETY: Runs the host's NMI handler through the host IDT (now
            // loaded again), as the kernel did for KVM before FRED.
            unsafe { core::arch::asm!("int 2") };
        } else if ring0_nmi {
            helpers::self_nmi();
        }
        if mc {
            // SAFETY: As above, for the machine-check handler.
            unsafe { core::arch::asm!("int 18") };
        }
        if aborted {
            return Ok(Exit::Aborted);
        }
        if nmi || mc {
            return Ok(Exit::HostEvent);
        }
        if vector == 1 {
            // A guest single-step or breakpoint left its status in DR6:
            // clear it, as the host's own #DB handler would have.
            // SAFETY: Writing DR6's reset value has no other effect.
            unsafe {
                core::arch::asm!("mov dr6, {}", in(reg) 0xffff_0ff0u64, options(nomem, nostack))
            };
        }
        if vector >= 32 && vector != crate::uapi::LGUEST_TRAP_ENTRY as u64 {
            // Last: the handler returns with interrupts on (see
            // switcher_64.S), so nothing of this CPU's block is used after.
            self.deliver_to_host(b, vector);
            return Ok(Exit::HostEvent);
        }
        Ok(Exit::Trap {
            vector,
            error: b.get_u64(frame(slot::ERROR)),
            cr2: b.get_u64(GUEST_CR2),
        })
    }

    /// Runs the host's handler for external interrupt `vector`.
    fn deliver_to_host(&self, b: &CpuBlock, vector: u64) {
        let idt = b.get_u64(HOST_IDTR + 2);
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
            return; // Not present: nothing the host expects to run.
        }
        // SAFETY: Interrupts are still off and the interrupt arrived on this
        // CPU while the guest ran; the handler is the host's own gate. Our
        // caller returns right after, so interrupts coming back on (and a
        // possible preemption) in the handler's return path are fine.
        unsafe { helpers::deliver_to_host((lo | (mid << 16) | (hi << 32)) as usize) };
    }
}
