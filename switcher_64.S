/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The Switcher: moves this CPU from the host into a guest running in ring 3,
 * and back.
 *
 * Everything here runs with interrupts disabled, called from switcher.rs,
 * which prepared this CPU's block (struct CpuBlock in switcher.rs: its
 * field offsets are checked against the LG_* defines below when the module
 * is compiled, so the two cannot drift apart). The block is five pages,
 * of which the first four are mapped into the guest's tables while this
 * CPU runs it:
 *
 *   page 0  the exit page: a pointer to the block, the host CR3, the NMI,
 *           #MC, abort and ring-0 fault records, and the guest register
 *           frame at the very top; TSS.RSP0 points at the end of the page,
 *           so a trap from the guest pushes its frame right there.
 *   page 1  the guest IDT: 256 gates, one stub each (lguest_idt_stubs).
 *   page 2  the guest GDT (same selectors as the host's, and the host's
 *           per-CPU segment) and the guest TSS.
 *   page 3  our IST stacks: #DB (IST5), NMI (IST6), #MC and #DF (IST7);
 *           IST1-4 are the host's own stacks, copied from its TSS at each
 *           entry, for the host handlers that may run on our TSS (an NMI or
 *           #MC between ltr and lidt on entry, lidt and ltr on exit).
 *   page 4  the host state saved at entry: never in the guest's tables.
 *           Only page 0's host CR3 is read before CR3 is the host's again.
 *
 * The code lives in its own page-aligned section, which the module maps a
 * second time, at the same offsets, in the x86 guard hole (the top-level
 * slot 256: 0xffff800000000000 with 4-level paging, 0xff00000000000000
 * with 5-level), with every CPU's block after it: the alias. The host sees
 * it through that slot of the launcher's address space, the guest through
 * the same slot of its shadow tables, where it finds only its CPU's block
 * (pages 0-3) and nothing else of the host. The CR3 writes run in the
 * alias; so does everything that runs with the guest's CR3. A guest kernel
 * may then live anywhere else, the top 2 GiB included: no guest address
 * is the host's. The alias may not reach outside the section (rel32
 * calls and jumps, RET's return thunk) since it is not where the linker
 * put it; the parts that call into the kernel run at the module's own
 * address (Documentation/switcher.rst, "The alias").
 *
 * What is live where (CR3, GDT, TSS, IDT; GS base), and where it runs:
 *
 *   lguest_switch_to_guest .. its call       host all           module
 *   lguest_guest_entry .. lgdt              host all           alias
 *   lgdt .. ltr                             host CR3/TSS/IDT, our GDT
 *   ltr .. lidt                             host CR3/IDT, our GDT/TSS
 *   lidt .. mov cr3                         host CR3, ours otherwise
 *   mov cr3 .. iretq                        all ours (guest GS base)
 *   guest                                   all ours           guest
 *   stub .. lguest_restore_host's cr3       all ours           alias
 *   cr3 .. GS base                          host CR3, ours otherwise
 *   lguest_host_resume .. lidt              host CR3/GDT/GS, our TSS/IDT  module
 *   lidt .. ltr                             host CR3/GDT/IDT, our TSS
 *   ltr ..                                  host all
 *
 * Two tricks are worth knowing before reading on. Between loading the
 * guest IDT and the iretq into the guest, an NMI lands on our IDT while we
 * are still in ring 0: the NMI stub then rewrites the interrupted RIP to
 * lguest_entry_abort, which unwinds as if the guest had not run at all; the
 * host handles the NMI and simply tries again. And every exception the
 * switcher itself takes in ring 0 (a #GP of the iretq, say) is told apart
 * from a guest exit by the CS it interrupted, recorded in the exit page and
 * ends the trip without a word of it read as guest state.
 */
#include <linux/linkage.h>
#include <linux/objtool.h>
#include <linux/stringify.h>
#include <asm/asm.h>
#include <asm/alternative.h>
#include <asm/cpufeatures.h>
#include <asm/msr-index.h>
#include <asm/processor-flags.h>
#include <asm/segment.h>
#include <asm/nospec-branch.h>
#include <asm/unwind_hints.h>
#include <asm/ibt.h>
#include <asm/page_types.h>
#include <asm/smap.h>

/*
 * Offsets into the block. Plain decimal numbers: switcher.rs reads these
 * lines at compile time and checks each against its struct.
 */
/* Page 0, the exit page (mapped in the guest's tables too). */
#define LG_SELF			0	/* the block's address (also page 3's first word) */
#define LG_HOST_CR3		8
#define LG_NMI_PENDING		16
#define LG_MC_PENDING		24
#define LG_ABORTED		32
#define LG_R0_FAULT		40	/* nonzero: an exception hit the switcher in ring 0 */
#define LG_R0_VECTOR		48
#define LG_R0_ERROR		56
#define LG_R0_RIP		64
#define LG_R0_CR2		72
#define LG_DB_DR6		80	/* DR6 of the last #DB taken in ring 0 */
#define LG_DB_COUNT		88
#define LG_VERW_SEL		96	/* a data selector for VERW (CPU buffer clearing) */
#define LG_FLUSH_GLOBAL		100	/* 1: INVPCID, 2: CR4.PGE toggle, after the guest's CR3 */
#define LG_INVPCID_DESC		104	/* 16 zero bytes: INVPCID's descriptor */
#define LG_FSGSBASE		120	/* 1: FS/GS bases by RD/WR*BASE, not MSRs */
#define LG_SYSENTER		124	/* 1: SYSENTER exists in long mode (SYSENTER_CS to switch) */
/* The direct system call (lguest_syscall, lguest_sysret). */
#define LG_DIRECT		128	/* 1: armed: LSTAR is lguest_syscall while the guest runs */
#define LG_USER_MODE		132	/* 1: the guest is in user mode */
#define LG_SYSCALL_ENTRY	136	/* the guest kernel's system-call entry */
#define LG_KERNEL_ROOT		144	/* the kernel-mode shadow root (a CR3 value) */
#define LG_USER_ROOT		152	/* the user-mode shadow root */
#define LG_GS_OTHER		160	/* the GS base of the mode the guest is not in */
#define LG_SCRATCH_RSP		168	/* the guest's RSP at its SYSCALL */
#define LG_SCRATCH_RAX		176
#define LG_SCRATCH_RDX		184
#define LG_DIRECT_SYSCALLS	192	/* switches made, counted for the host */
#define LG_DIRECT_SYSRETS	200
#define LG_IRQ_WAITING		208	/* 1: an interrupt waits for the guest to enable them */
#define LG_DIRECT_IBPB		212	/* 1: IBPB at each direct user-to-kernel switch; 2: counted only */
#define LG_DIRECT_IBPBS		216	/* those barriers, counted for the host */
/* The guest frame: 22 quadwords ending at the top of page 0. */
#define LG_FRAME		3920
#define LG_FRAME_SIZE		(22 * 8)

/* Page 2: our GDT, with the TSS descriptor where the host has it. */
#define LG_GDT			8192
#define LG_TSS_SEL		(GDT_ENTRY_TSS * 8)

/* Page 3: the IST stacks; the block is found from any of them by masking. */
#define LG_IST_PAGE		12288

/* Page 4: the host's state (never mapped in the guest). */
#define LG_HOST_RSP		16384
#define LG_HOST_CR0		16392
#define LG_HOST_EFER		16400
#define LG_HOST_FS_BASE		16408
#define LG_HOST_GS_BASE		16416
#define LG_HOST_SYSENTER_CS	16424
#define LG_HOST_GDTR		16432	/* 10 bytes: limit, base (read-only alias) */
#define LG_HOST_GDTR_RW		16448	/* 10 bytes: the writable alias */
#define LG_HOST_IDTR		16464	/* 10 bytes */
#define LG_HOST_TR		16480
#define LG_HOST_LDT		16482
#define LG_HOST_DS		16484
#define LG_HOST_ES		16486
#define LG_HOST_FS		16488
#define LG_HOST_GS		16490
#define LG_GUEST_GDTR		16496
#define LG_GUEST_IDTR		16512
#define LG_GUEST_CR3		16528
#define LG_GUEST_FS_BASE	16536
#define LG_GUEST_GS_BASE	16544
#define LG_GUEST_CR2		16552
#define LG_HOST_PKRU		16560
#define LG_PKRU_ON		16564
#define LG_CET_ON		16568
#define LG_GUEST_FPU		16572
#define LG_HOST_U_CET		16576
#define LG_HOST_PL3_SSP		16584
#define LG_GUEST_ENTRY		16592	/* lguest_guest_entry in the alias */
#define LG_HOST_RESUME		16600	/* lguest_host_resume in the module's text */
#define LG_HOST_LSTAR		16608	/* MSR_LSTAR as the entry found it */
#define LG_DIRECT_LSTAR		16616	/* lguest_syscall in the alias */
#define LG_HOST_STAR		16624	/* MSR_STAR as the entry found it */
#define LG_HOST_SFMASK		16632	/* MSR_SYSCALL_MASK as the entry found it */
#define LG_DIRECT_STAR		16640	/* the host kernel's STAR (syscall_init's) */
#define LG_DIRECT_SFMASK	16648	/* the host kernel's SYSCALL_MASK */

/*
 * Where the alias maps this CPU's page 0 a second time, from the alias's
 * start (lguest_switcher_start there), in every CPU's guest view: SYSCALL
 * finds its block there, RIP-relative, with neither a stack nor GS.
 */
#define LG_ALIAS_PAGE0		2093056
/* The vector of the direct return to user mode (uapi LGUEST_SYSRET_VECTOR). */
#define LG_SYSRET_VECTOR	27
/* The frame's vector of an exit with nothing to report: the host resumes. */
#define LG_VECTOR_NONE		256
/* RFLAGS bits a guest keeps (switcher.rs RFLAGS_GUEST_MASK): CF PF AF ZF SF TF DF OF NT AC. */
#define LG_RFLAGS_GUEST_MASK	282069
#define LG_GUEST_CS		51
#define LG_GUEST_SS		43
#define LG_HCALL_VECTOR		31

/* Page 0 at its fixed alias address (RIP-relative, from the alias's text). */
#define P0_FIXED(field)		(lguest_switcher_start + LG_ALIAS_PAGE0 + (field))(%rip)
/* Page 0's fields while RSP is the frame's vector slot (LG_FRAME + 15 * 8). */
#define P0_V(field)		((field) - LG_FRAME - 15 * 8)(%rsp)
/* ... and while RSP is the frame's RIP slot, ready for the iretq. */
#define P0_R(field)		((field) - LG_FRAME - 17 * 8)(%rsp)

/* INVPCID's type 2: every PCID, global entries included (asm/invpcid.h). */
#define LG_INVPCID_ALL		2

/* DR6 with nothing recorded. */
#define DR6_RESERVED		0xffff0ff0

/* Loads MSR \msr from the 64-bit slot at \off(%rdi). Clobbers eax, ecx, edx. */
.macro WRMSR_FROM msr, off
	mov	$\msr, %ecx
	mov	\off(%rdi), %eax
	mov	\off+4(%rdi), %edx
	wrmsr
.endm

/*
 * Loads the FS and GS bases from the slots at \fs(%rdi) and \gs(%rdi): by
 * WRFSBASE/WRGSBASE where the host has FSGSBASE on, by the MSRs otherwise.
 * Clobbers rax, ecx, edx.
 */
.macro WRITE_BASES fs, gs
	cmpl	$0, LG_FSGSBASE(%rdi)
	je	.Lbases_msr\@
	mov	\fs(%rdi), %rax
	wrfsbase %rax
	mov	\gs(%rdi), %rax
	wrgsbase %rax
	jmp	.Lbases_done\@
.Lbases_msr\@:
	WRMSR_FROM MSR_FS_BASE, \fs
	WRMSR_FROM MSR_GS_BASE, \gs
.Lbases_done\@:
.endm

/* Saves MSR \msr into the 64-bit slot at \off(%rdi). Clobbers eax, ecx, edx. */
/*
 * Writes MSR \msr from \new(%rdi) unless \now(%rdi), what it holds, is the
 * same value already (a write is serializing). Clobbers rax, ecx, edx.
 */
.macro SET_IF_OTHER msr, now, new
	mov	\now(%rdi), %rax
	cmp	\new(%rdi), %rax
	je	.Lsame_\@
	WRMSR_FROM \msr, \new
.Lsame_\@:
.endm

.macro RDMSR_TO msr, off
	mov	$\msr, %ecx
	rdmsr
	mov	%eax, \off(%rdi)
	mov	%edx, \off+4(%rdi)
.endm

/* Reads MSR \msr into \reg. Clobbers eax, ecx, edx. */
.macro RDMSR_REG msr, reg
	mov	$\msr, %ecx
	rdmsr
	shl	$32, %rdx
	or	%rdx, %rax
	mov	%rax, \reg
.endm

/*
 * Loads the null selector (EAX, zero) into \seg where the host's, saved at
 * \off(%rdi), is not null already.
 */
.macro NULL_SEL seg, off
	cmpw	$0, \off(%rdi)
	je	.Lnull_\seg\@
	mov	%eax, %\seg
.Lnull_\seg\@:
.endm

/*
 * Loads the host's selector saved at \off(%rdi) into \seg where the
 * current one (the guest may have loaded its own) differs. Clobbers eax.
 */
.macro HOST_SEL seg, off
	mov	%\seg, %eax
	cmpw	\off(%rdi), %ax
	je	.Lhost_\seg\@
	mov	\off(%rdi), %\seg
.Lhost_\seg\@:
.endm

/* \reg := the block, from a stack pointer anywhere in page 0 or page 3. */
.macro BLOCK_FROM_RSP reg
	mov	%rsp, \reg
	and	$PAGE_MASK, \reg
	mov	LG_SELF(\reg), \reg
.endm

	/*
	 * Alignment gaps are filled with int3, not NOPs: GNU as (the GCC-built
	 * kernels', Debian's among them) opens a long NOP fill with a jmp over
	 * it, and a jmp to the section's end is a jump to nowhere for objtool.
	 */
	.pushsection .text.lguest_switcher, "ax"
	.balign PAGE_SIZE, 0xcc
SYM_INNER_LABEL(lguest_switcher_start, SYM_L_GLOBAL)
	/*
	 * The start is an address the module takes as data (to map the
	 * switcher and to tell its RIPs), not a call target: where function
	 * padding precedes lguest_switch_to_guest's ENDBR, IBT's objtool
	 * check must not want one here.
	 */
	ANNOTATE_NOENDBR

/*
 * void lguest_switch_to_guest(struct CpuBlock *block)
 *
 * Enters the guest whose registers are in the block's frame and whose shadow
 * page table root is block->host.guest_cr3, and returns when the guest
 * traps, is interrupted, an NMI aborted the entry, or the switcher faulted.
 * Interrupts must be off.
 */
SYM_FUNC_START(lguest_switch_to_guest)
	ENDBR
	push	%rbp
	mov	%rsp, %rbp
	push	%rbx
	push	%r12
	push	%r13
	push	%r14
	push	%r15
	pushf
	/* From here on the block is used at its alias address (its own). */
	mov	LG_SELF(%rdi), %rdi
	mov	%rsp, LG_HOST_RSP(%rdi)
	movq	$0, LG_ABORTED(%rdi)

	/* Everything of the host we are about to change. */
	sgdt	LG_HOST_GDTR(%rdi)
	movw	LG_HOST_GDTR(%rdi), %ax		/* the writable alias: same limit */
	movw	%ax, LG_HOST_GDTR_RW(%rdi)
	sidt	LG_HOST_IDTR(%rdi)
	str	LG_HOST_TR(%rdi)
	sldt	LG_HOST_LDT(%rdi)
	mov	%ds, LG_HOST_DS(%rdi)
	mov	%es, LG_HOST_ES(%rdi)
	mov	%fs, LG_HOST_FS(%rdi)
	mov	%gs, LG_HOST_GS(%rdi)
	mov	%cr0, %rax
	mov	%rax, LG_HOST_CR0(%rdi)
	/* The FS and GS bases: by instruction where the host has FSGSBASE. */
	cmpl	$0, LG_FSGSBASE(%rdi)
	je	1f
	rdfsbase %rax
	mov	%rax, LG_HOST_FS_BASE(%rdi)
	rdgsbase %rax
	mov	%rax, LG_HOST_GS_BASE(%rdi)
	jmp	2f
1:	RDMSR_TO MSR_FS_BASE, LG_HOST_FS_BASE
	RDMSR_TO MSR_GS_BASE, LG_HOST_GS_BASE
2:
	/*
	 * EFER every time it is switched (not with the direct system call,
	 * which leaves SCE on): it is not constant (kvm_amd sets EFER.SVME
	 * while it has virtualization enabled on a CPU). With the direct
	 * system call, the three SYSCALL MSRs as they are: not always the
	 * host kernel's, since KVM on Intel leaves its guest's STAR, LSTAR
	 * and SYSCALL_MASK loaded until a task on this CPU returns to user
	 * mode (a user-return notifier), which the RUN thread, in the kernel,
	 * need not have done. The exit puts back exactly these.
	 */
	cmpl	$0, LG_DIRECT(%rdi)
	jne	1f
	RDMSR_TO MSR_EFER, LG_HOST_EFER
	jmp	2f
1:	RDMSR_TO MSR_LSTAR, LG_HOST_LSTAR
	RDMSR_TO MSR_STAR, LG_HOST_STAR
	RDMSR_TO MSR_SYSCALL_MASK, LG_HOST_SFMASK
2:
	cmpl	$0, LG_SYSENTER(%rdi)
	je	1f
	RDMSR_TO MSR_IA32_SYSENTER_CS, LG_HOST_SYSENTER_CS
1:
	cmpl	$0, LG_PKRU_ON(%rdi)
	je	1f
	xor	%ecx, %ecx
	rdpkru
	mov	%eax, LG_HOST_PKRU(%rdi)
1:
	/* User shadow stacks: the launcher's (or the last task's) CET state. */
	cmpl	$0, LG_CET_ON(%rdi)
	je	1f
	RDMSR_TO MSR_IA32_U_CET, LG_HOST_U_CET
	RDMSR_TO MSR_IA32_PL3_SSP, LG_HOST_PL3_SSP
1:
	/*
	 * The rest of the entry runs from the switcher's alias in the guard
	 * hole, which the host's tables (the top-level slot this address
	 * space gives the switcher) and the guest's map at the same address:
	 * the guest's CR3 is loaded there. The exit path comes back to this
	 * text at lguest_host_resume, and returns at lguest_host_return below
	 * with RSP as it is before this call (the call's return address is
	 * never used).
	 */
	mov	LG_GUEST_ENTRY(%rdi), %rax
	UNWIND_HINT_SAVE
	CALL_NOSPEC rax

	/* lguest_host_resume comes back here, on the host stack again. */
SYM_INNER_LABEL(lguest_host_return, SYM_L_LOCAL)
	UNWIND_HINT_RESTORE
	ANNOTATE_NOENDBR
	popf
	pop	%r15
	pop	%r14
	pop	%r13
	pop	%r12
	pop	%rbx
	pop	%rbp
	RET
SYM_FUNC_END(lguest_switch_to_guest)
_ASM_NOKPROBE(lguest_switch_to_guest)

/*
 * The entry, from the alias (called from lguest_switch_to_guest, in the
 * host's CR3): from here on RSP is the guest frame, which the stub of an
 * NMI can find, and every step up to the iretq can be undone by
 * lguest_restore_host. Nothing here may reach outside this section: a
 * call or jump to the kernel's text (a RET, under return thunks, is one)
 * would land off by the alias's distance.
 */
SYM_CODE_START(lguest_guest_entry)
	UNWIND_HINT_UNDEFINED
	ENDBR
SYM_INNER_LABEL(lguest_entry_window, SYM_L_GLOBAL)
	ANNOTATE_NOENDBR
	lea	LG_FRAME(%rdi), %rsp
	/*
	 * GDT, then TSS, then IDT: whenever our IDT is live, so is our TSS,
	 * so our NMI and #MC stubs always land on our IST stacks. A host NMI
	 * between lgdt and lidt runs on our GDT (which carries the host's
	 * per-CPU segment) and on the host's own IST stacks (IST1-4 of our
	 * TSS are copies of the host's).
	 */
	lgdt	LG_GUEST_GDTR(%rdi)
	/* Our TSS may be marked busy from the last entry: ltr needs it free. */
	andb	$~0x02, (LG_GDT + LG_TSS_SEL + 5)(%rdi)
	mov	$LG_TSS_SEL, %eax
	ltr	%ax
	lidt	LG_GUEST_IDTR(%rdi)
	/*
	 * A null LDT and null data selectors, each loaded only where the
	 * host's is not null already (a launcher has no LDT, and 64-bit
	 * processes run with null FS and GS); then the FS/GS bases (a null
	 * load may clear them).
	 */
	xor	%eax, %eax
	cmpw	$0, LG_HOST_LDT(%rdi)
	je	1f
	lldt	%ax
1:	NULL_SEL ds, LG_HOST_DS
	NULL_SEL es, LG_HOST_ES
	NULL_SEL fs, LG_HOST_FS
	NULL_SEL gs, LG_HOST_GS
	WRITE_BASES LG_GUEST_FS_BASE, LG_GUEST_GS_BASE
	/*
	 * SYSCALL would enter the host's entry code: point it at ours (the
	 * direct system call), or turn it off (#UD). Not CSTAR: no 32-bit
	 * code segment is in our GDT, so a guest never runs in compat mode.
	 */
	cmpl	$0, LG_DIRECT(%rdi)
	je	1f
	WRMSR_FROM MSR_LSTAR, LG_DIRECT_LSTAR
	/*
	 * lguest_syscall relies on the host kernel's STAR (CS 0x10 and SS
	 * 0x18 in ring 0, selectors our GDT has) and SYSCALL_MASK (IF, TF,
	 * DF, AC and NT clear: no interrupt before RSP is page 0's, nothing
	 * for the iretq to trip on): each written where another's is live.
	 */
	SET_IF_OTHER MSR_STAR, LG_HOST_STAR, LG_DIRECT_STAR
	SET_IF_OTHER MSR_SYSCALL_MASK, LG_HOST_SFMASK, LG_DIRECT_SFMASK
	jmp	2f
1:	mov	$MSR_EFER, %ecx
	mov	LG_HOST_EFER(%rdi), %eax
	mov	LG_HOST_EFER+4(%rdi), %edx
	and	$~EFER_SCE, %eax
	wrmsr
2:
	/*
	 * SYSENTER with a null SYSENTER_CS raises #GP (where SYSENTER exists
	 * in long mode at all: not on AMD or Hygon, where it raises #UD).
	 */
	cmpl	$0, LG_SYSENTER(%rdi)
	je	2f
	mov	$MSR_IA32_SYSENTER_CS, %ecx
	xor	%eax, %eax
	xor	%edx, %edx
	wrmsr
2:
	/* All protection keys open for the guest (it may change PKRU itself). */
	cmpl	$0, LG_PKRU_ON(%rdi)
	je	2f
	xor	%eax, %eax
	xor	%ecx, %ecx
	xor	%edx, %edx
	wrpkru
2:
	/* No user shadow stack (nor user IBT) for the guest. */
	cmpl	$0, LG_CET_ON(%rdi)
	je	2f
	mov	$MSR_IA32_U_CET, %ecx
	xor	%eax, %eax
	xor	%edx, %edx
	wrmsr
2:
	/*
	 * A guest whose FPU state is not loaded (it has not used the FPU
	 * yet) runs with CR0.TS set: its first x87, SSE or AVX instruction
	 * raises #NM, and the host loads its state from then on. With the
	 * state loaded (by run_once, inside kernel_fpu_begin) TS stays clear,
	 * as the host has it.
	 */
	cmpl	$0, LG_GUEST_FPU(%rdi)
	jne	3f
	mov	%cr0, %rax
	or	$X86_CR0_TS, %rax
	mov	%rax, %cr0
3:
	/* Last, the guest's address space. Only this text and pages 0-3 remain. */
	mov	LG_GUEST_CR3(%rdi), %rax
	mov	%rax, %cr3
	/*
	 * A guest with upper-half mappings must not meet the host's global
	 * TLB entries (a CR3 write keeps them): flush them, now that no host
	 * address is touched any more until the guest exits (an NMI or #MC
	 * from here to the iretq aborts the entry, and a toggle of CR4.PGE
	 * cut in two is completed by lguest_entry_abort).
	 */
	cmpl	$0, LG_FLUSH_GLOBAL(%rdi)
	je	5f
	cmpl	$1, LG_FLUSH_GLOBAL(%rdi)
	jne	4f
	mov	$LG_INVPCID_ALL, %eax
	invpcid	LG_INVPCID_DESC(%rdi), %rax
	jmp	5f
4:	mov	%cr4, %rax
	xor	$X86_CR4_PGE, %rax
	mov	%rax, %cr4
	xor	$X86_CR4_PGE, %rax
	mov	%rax, %cr4
5:

	pop	%r15
	pop	%r14
	pop	%r13
	pop	%r12
	pop	%r11
	pop	%r10
	pop	%r9
	pop	%r8
	pop	%rbp
	pop	%rdi
	pop	%rsi
	pop	%rdx
	pop	%rcx
	pop	%rbx
	pop	%rax
	add	$16, %rsp		/* vector and error code */
	/*
	 * The kernel's exit-to-user CPU buffer clearing (MDS, TAA, MMIO stale
	 * data, RFDS, TSA), as the last thing before ring 3. RSP is fixed here
	 * (the frame's RIP slot), so the selector in the exit page is found
	 * from it. VERW clobbers ZF; the iretq reloads RFLAGS.
	 */
	ALTERNATIVE "", __stringify(verw (LG_VERW_SEL - LG_FRAME - 17 * 8)(%rsp)), X86_FEATURE_CLEAR_CPU_BUF
SYM_INNER_LABEL(lguest_iretq, SYM_L_GLOBAL)
	iretq
SYM_INNER_LABEL(lguest_entry_window_end, SYM_L_GLOBAL)
	ANNOTATE_NOENDBR
SYM_CODE_END(lguest_guest_entry)
_ASM_NOKPROBE(lguest_guest_entry)

/*
 * Every way out of the guest ends here, on the guest frame (RSP0 stack) with
 * the vector and the error code already pushed:
 * 0(%rsp) vector, 8 error, 16 RIP, 24 CS, 32 RFLAGS, 40 RSP, 48 SS.
 * An exception the switcher itself took in ring 0 (its CS is the kernel's)
 * is not a guest exit: lguest_switcher_fault records it.
 */
SYM_CODE_START_LOCAL(lguest_exit_common)
	UNWIND_HINT_UNDEFINED
	testb	$3, 24(%rsp)
	jz	lguest_switcher_fault
	push	%rax
	push	%rbx
	push	%rcx
	push	%rdx
	push	%rsi
	push	%rdi
	push	%rbp
	push	%r8
	push	%r9
	push	%r10
	push	%r11
	push	%r12
	push	%r13
	push	%r14
	push	%r15
	ASM_CLAC				/* the guest may run with AC set */
	BLOCK_FROM_RSP %rdi
	/*
	 * CR2 before anything else could fault, and the guest's FS/GS bases,
	 * in registers: the host page that keeps them is not mapped yet.
	 */
	mov	%cr2, %r12
	cmpl	$0, LG_FSGSBASE(%rdi)
	je	1f
	rdfsbase %r13
	rdgsbase %r14
	jmp	2f
1:	RDMSR_REG MSR_FS_BASE, %r13
	RDMSR_REG MSR_GS_BASE, %r14
2:	mov	$1, %r15d
	jmp	lguest_restore_host
SYM_CODE_END(lguest_exit_common)
_ASM_NOKPROBE(lguest_exit_common)

/*
 * An exception in ring 0 on our IDT: a bug in the switcher, or something a
 * guest arranged (an iretq to a bad frame). The frame the CPU pushed sits
 * on whatever stack was current (page 0 or page 3, found by masking); its
 * vector, error code, RIP and CR2 are recorded and the host comes back.
 * Nothing of the guest frame is trusted afterwards.
 */
SYM_CODE_START_LOCAL(lguest_switcher_fault)
	UNWIND_HINT_UNDEFINED
	ASM_CLAC
	BLOCK_FROM_RSP %rdi
	mov	(%rsp), %rax
	mov	%rax, LG_R0_VECTOR(%rdi)
	mov	8(%rsp), %rax
	mov	%rax, LG_R0_ERROR(%rdi)
	mov	16(%rsp), %rax
	mov	%rax, LG_R0_RIP(%rdi)
	mov	%cr2, %rax
	mov	%rax, LG_R0_CR2(%rdi)
	movq	$1, LG_R0_FAULT(%rdi)
	lea	LG_FRAME(%rdi), %rsp
	xor	%r15d, %r15d
	jmp	lguest_restore_host
SYM_CODE_END(lguest_switcher_fault)
_ASM_NOKPROBE(lguest_switcher_fault)

/*
 * An NMI interrupted the entry: give up on it. The frame still holds the
 * registers switcher.rs wrote, untouched, so the guest has not run at all.
 */
SYM_CODE_START_LOCAL(lguest_entry_abort)
	UNWIND_HINT_UNDEFINED
	ENDBR
	BLOCK_FROM_RSP %rdi
	lea	LG_FRAME(%rdi), %rsp
	movq	$1, LG_ABORTED(%rdi)
	/* A CR4.PGE toggle the NMI cut in two: PGE back on (the host's). */
	cmpl	$2, LG_FLUSH_GLOBAL(%rdi)
	jne	1f
	mov	%cr4, %rax
	or	$X86_CR4_PGE, %rax
	mov	%rax, %cr4
1:
	xor	%r15d, %r15d
	jmp	lguest_restore_host
SYM_CODE_END(lguest_entry_abort)
_ASM_NOKPROBE(lguest_entry_abort)

/*
 * The direct switch's change of mode, RSP the frame's vector slot: the GS
 * bases swapped, CR3 the shadow root at \root, the mode \user. Clobbers
 * %rax and %rdx.
 */
.macro SWITCH_MODE root, user
	rdgsbase %rdx
	movq	P0_V(LG_GS_OTHER), %rax
	movq	%rdx, P0_V(LG_GS_OTHER)
	wrgsbase %rax
	movq	P0_V(\root), %rax
	movq	%rax, %cr3
	movl	$\user, P0_V(LG_USER_MODE)
.endm

/*
 * The direct system call (Documentation/switcher.rst, "The direct system
 * call"): LSTAR is this entry while a guest with a direct entry runs
 * (LG_DIRECT). SYSCALL brings the CPU here in ring 0 with the guest's CR3
 * and GS base, RSP still the guest's (nothing may be pushed on it), RCX
 * the guest's next RIP, R11 its RFLAGS, and IF, TF, DF and AC clear (the
 * host's MSR_SYSCALL_MASK). The first three instructions find this CPU's
 * page 0 at its fixed alias address, RIP-relative (no register, stack or
 * GS needed: nothing can fault), and move to the frame at its top, where
 * a trap from the guest would have put its RIP, CS, RFLAGS, RSP and SS.
 *
 * From guest kernel mode SYSCALL is a hypercall: an exit like int $0x1f's.
 * From guest user mode it is the switch to the guest kernel's entry, made
 * here: the GS bases swapped, the kernel shadow's CR3, RIP the entry,
 * RCX, R11 and RSP as SYSCALL left them, RFLAGS IF alone; back into the
 * guest by lguest_direct_return's iretq. Where the guest asked for one
 * (LGUEST_IBPB_USER_ENTRY), an IBPB separates what its user mode trained
 * from its kernel: open-coded, as nothing can be called from the alias.
 */
SYM_CODE_START(lguest_syscall)
	UNWIND_HINT_UNDEFINED
	ENDBR
	movq	%rsp, P0_FIXED(LG_SCRATCH_RSP)
	movq	P0_FIXED(LG_SELF), %rsp
	leaq	(LG_FRAME + LG_FRAME_SIZE)(%rsp), %rsp
	pushq	$LG_GUEST_SS
	pushq	P0_FIXED(LG_SCRATCH_RSP)
	pushq	%r11
	pushq	$LG_GUEST_CS
	pushq	%rcx
	pushq	$0
	pushq	$LG_HCALL_VECTOR
	cmpl	$0, P0_V(LG_USER_MODE)
	je	lguest_exit_common
	movq	%rax, P0_V(LG_SCRATCH_RAX)
	movq	%rdx, P0_V(LG_SCRATCH_RDX)
	SWITCH_MODE LG_KERNEL_ROOT, 0
	cmpl	$0, P0_V(LG_DIRECT_IBPB)
	je	1f
	incq	P0_V(LG_DIRECT_IBPBS)
	cmpl	$1, P0_V(LG_DIRECT_IBPB)
	jne	1f
	movl	$MSR_IA32_PRED_CMD, %ecx
	movl	$PRED_CMD_IBPB, %eax
	xorl	%edx, %edx
	wrmsr
	movq	16(%rsp), %rcx			/* the user RIP again */
1:
	movq	P0_V(LG_SYSCALL_ENTRY), %rax
	movq	%rax, 16(%rsp)			/* RIP */
	movq	$(X86_EFLAGS_IF | X86_EFLAGS_FIXED), 32(%rsp)	/* RFLAGS */
	incq	P0_V(LG_DIRECT_SYSCALLS)
	jmp	lguest_direct_return
SYM_CODE_END(lguest_syscall)
_ASM_NOKPROBE(lguest_syscall)

/*
 * int $LG_SYSRET_VECTOR (a DPL-3 gate): the guest kernel's return to user
 * mode with sysretq's registers, RCX the user RIP, R11 the user RFLAGS, RSP
 * (in the frame the CPU pushed on page 0) the user RSP. Switched here,
 * where the direct system call is armed, the guest is in kernel mode, no
 * interrupt waits for it and RCX is a lower-half guest address; the host
 * does it (or turns it into a #GP, or kills the guest) otherwise.
 */
SYM_CODE_START_LOCAL(lguest_sysret)
	UNWIND_HINT_UNDEFINED
	testb	$3, 24(%rsp)
	jz	lguest_switcher_fault
	cmpl	$0, P0_V(LG_DIRECT)
	je	lguest_exit_common
	cmpl	$0, P0_V(LG_USER_MODE)
	jne	lguest_exit_common
	/*
	 * An interrupt the kernel held back (virtual IF off) is taken at
	 * the return to user mode, which always takes them: the host
	 * delivers it there.
	 */
	cmpl	$0, P0_V(LG_IRQ_WAITING)
	jne	lguest_exit_common
	movq	%rax, P0_V(LG_SCRATCH_RAX)
	/* RCX < GUEST_VA_END ((1 << 47) - 4096), with no 64-bit immediate. */
	movq	%rcx, %rax
	shrq	$PAGE_SHIFT, %rax
	incq	%rax
	shrq	$(47 - PAGE_SHIFT), %rax
	jnz	.Lsysret_host
	movq	%rdx, P0_V(LG_SCRATCH_RDX)
	movq	%rcx, 16(%rsp)			/* RIP */
	movl	%r11d, %eax
	andl	$LG_RFLAGS_GUEST_MASK, %eax
	orl	$(X86_EFLAGS_IF | X86_EFLAGS_FIXED), %eax
	movq	%rax, 32(%rsp)			/* RFLAGS */
	SWITCH_MODE LG_USER_ROOT, 1
	incq	P0_V(LG_DIRECT_SYSRETS)
	jmp	lguest_direct_return
.Lsysret_host:
	movq	P0_V(LG_SCRATCH_RAX), %rax
	jmp	lguest_exit_common
SYM_CODE_END(lguest_sysret)
_ASM_NOKPROBE(lguest_sysret)

/*
 * The direct switch's way back into the guest, RSP the frame's vector
 * slot, RAX and RDX in their scratch slots. The window, from the check of
 * the NMI and #MC records to the iretq, is the entry window's counterpart:
 * an NMI or #MC in it is recorded and moves the interrupted RIP to
 * lguest_direct_abort, which exits instead (the frame is the guest's new
 * state, complete), so that neither waits in the guest for its next exit.
 */
SYM_CODE_START_LOCAL(lguest_direct_return)
	UNWIND_HINT_UNDEFINED
	movq	P0_V(LG_SCRATCH_RAX), %rax
	movq	P0_V(LG_SCRATCH_RDX), %rdx
	addq	$16, %rsp			/* vector and error code */
SYM_INNER_LABEL(lguest_direct_window, SYM_L_GLOBAL)
	ANNOTATE_NOENDBR
	cmpq	$0, P0_R(LG_NMI_PENDING)
	jne	lguest_direct_abort
	cmpq	$0, P0_R(LG_MC_PENDING)
	jne	lguest_direct_abort
	/* The exit to ring 3's CPU buffer clearing, as at the entry's iretq. */
	ALTERNATIVE "", __stringify(verw P0_R(LG_VERW_SEL)), X86_FEATURE_CLEAR_CPU_BUF
	iretq
SYM_INNER_LABEL(lguest_direct_window_end, SYM_L_GLOBAL)
	ANNOTATE_NOENDBR
SYM_CODE_END(lguest_direct_return)
_ASM_NOKPROBE(lguest_direct_return)

/*
 * An NMI or #MC was recorded before the direct switch's iretq: exit with
 * the frame as it is (the guest's state after the switch) and nothing else
 * to report; the host handles what was recorded and enters again.
 */
SYM_CODE_START_LOCAL(lguest_direct_abort)
	UNWIND_HINT_UNDEFINED
	ENDBR
	subq	$16, %rsp
	movq	$LG_VECTOR_NONE, (%rsp)
	movq	$0, 8(%rsp)
	jmp	lguest_exit_common
SYM_CODE_END(lguest_direct_abort)
_ASM_NOKPROBE(lguest_direct_abort)

/*
 * Puts the host back, CR3 first; %rdi is the block, RSP in page 0. With
 * %r15 set, %r12-%r14 hold the guest's CR2, FS base and GS base.
 */
SYM_CODE_START_LOCAL(lguest_restore_host)
	UNWIND_HINT_UNDEFINED
	mov	LG_HOST_CR3(%rdi), %rax
	mov	%rax, %cr3
	test	%r15d, %r15d
	jz	1f
	mov	%r12, LG_GUEST_CR2(%rdi)
	mov	%r13, LG_GUEST_FS_BASE(%rdi)
	mov	%r14, LG_GUEST_GS_BASE(%rdi)
1:
	/*
	 * The host's GDT (its writable alias), its selectors and its FS/GS
	 * bases come back while our IDT is still live: from the host's lidt
	 * on, a host NMI handler may run and must find the host's GS base.
	 * No call and no RET before the GS base is the host's: with call-depth
	 * tracking the return thunk counts in a per-CPU variable through GS,
	 * which is the guest's until here.
	 */
	lgdt	LG_HOST_GDTR_RW(%rdi)
	/* The LDT and selectors where they differ from the host's. */
	cmpw	$0, LG_HOST_LDT(%rdi)
	je	1f
	lldt	LG_HOST_LDT(%rdi)
1:	HOST_SEL ds, LG_HOST_DS
	HOST_SEL es, LG_HOST_ES
	HOST_SEL fs, LG_HOST_FS
	HOST_SEL gs, LG_HOST_GS
	WRITE_BASES LG_HOST_FS_BASE, LG_HOST_GS_BASE
	/*
	 * Back to the module's own text, where calls into the kernel reach:
	 * an indirect jump that cannot be steered, the retpoline sequence
	 * written out (the kernel's thunks are out of reach from here). Its
	 * RET is predicted from the return stack entry the call just made,
	 * the speculation trap.
	 */
	mov	LG_HOST_RESUME(%rdi), %rax
	ANNOTATE_INTRA_FUNCTION_CALL
	call	7f
6:	UNWIND_HINT_UNDEFINED
	pause
	lfence
	jmp	6b
7:	mov	%rax, (%rsp)
	ANNOTATE_UNRET_SAFE
	ret
	int3
SYM_CODE_END(lguest_restore_host)
_ASM_NOKPROBE(lguest_restore_host)

/*
 * The exit, in the module's text, host CR3, GDT, segments and GS base
 * back; our IDT and TSS still live. %rdi is the block (in the alias).
 */
SYM_CODE_START(lguest_host_resume)
	UNWIND_HINT_UNDEFINED
	ANNOTATE_NOENDBR
	/*
	 * Speculation: this is the kernel's entry from user mode, so it does
	 * what entry_64.S does there, before the first RET (UNTRAIN_RET):
	 * return-stack untraining (Retbleed, SRSO), the IBPB of ibpb-on-entry
	 * or the call-depth reset, and the branch-history clearing (BHI). IBRS
	 * needs nothing: SPEC_CTRL keeps the kernel's value while the guest
	 * runs.
	 */
	VALIDATE_UNRET_END
	CALL_UNTRAIN_RET
	ALTERNATIVE_2 "", "call lguest_ibpb", X86_FEATURE_ENTRY_IBPB, \
		__stringify(RESET_CALL_DEPTH), X86_FEATURE_CALL_DEPTH
	ALTERNATIVE_2 "", "call lguest_clear_bhb_loop", X86_FEATURE_CLEAR_BHB_LOOP, \
		"call lguest_clear_bhb_loop", X86_FEATURE_CLEAR_BHB_VMEXIT
	cmpl	$0, LG_CET_ON(%rdi)
	je	2f
	WRMSR_FROM MSR_IA32_U_CET, LG_HOST_U_CET
	WRMSR_FROM MSR_IA32_PL3_SSP, LG_HOST_PL3_SSP
2:
	/*
	 * CR0 (TS) before a host handler can run on the host IDT: only if the
	 * entry set TS (a guest cannot write CR0, so with its FPU state loaded
	 * CR0 is still the host's).
	 */
	cmpl	$0, LG_GUEST_FPU(%rdi)
	jne	1f
	mov	LG_HOST_CR0(%rdi), %rax
	mov	%rax, %cr0
1:
	lidt	LG_HOST_IDTR(%rdi)
	/*
	 * The host's TSS descriptor is busy (it was current when we left), and
	 * ltr sets the busy bit again: do it on the writable alias, loaded.
	 */
	movzwl	LG_HOST_TR(%rdi), %eax
	and	$~7, %eax
	add	LG_HOST_GDTR_RW+2(%rdi), %rax
	andb	$~0x02, 5(%rax)
	ltr	LG_HOST_TR(%rdi)
	lgdt	LG_HOST_GDTR(%rdi)
	cmpl	$0, LG_DIRECT(%rdi)
	jne	4f
	WRMSR_FROM MSR_EFER, LG_HOST_EFER
	jmp	5f
4:	WRMSR_FROM MSR_LSTAR, LG_HOST_LSTAR
	SET_IF_OTHER MSR_STAR, LG_DIRECT_STAR, LG_HOST_STAR
	SET_IF_OTHER MSR_SYSCALL_MASK, LG_DIRECT_SFMASK, LG_HOST_SFMASK
5:
	cmpl	$0, LG_SYSENTER(%rdi)
	je	1f
	WRMSR_FROM MSR_IA32_SYSENTER_CS, LG_HOST_SYSENTER_CS
1:
	cmpl	$0, LG_PKRU_ON(%rdi)
	je	3f
	mov	LG_HOST_PKRU(%rdi), %eax
	xor	%ecx, %ecx
	xor	%edx, %edx
	wrpkru
3:
	mov	LG_HOST_RSP(%rdi), %rsp
	jmp	lguest_host_return
SYM_CODE_END(lguest_host_resume)
_ASM_NOKPROBE(lguest_host_resume)

/*
 * IBPB, as the kernel's write_ibpb (which is exported to KVM only): an
 * indirect branch prediction barrier, and the return stack stuffed where
 * IBPB leaves return predictions alone. Clobbers eax, ecx, edx.
 */
SYM_FUNC_START(lguest_ibpb)
	ANNOTATE_NOENDBR
	mov	$MSR_IA32_PRED_CMD, %ecx
	mov	$PRED_CMD_IBPB, %eax
	xor	%edx, %edx
	wrmsr
	FILL_RETURN_BUFFER %rax, RSB_CLEAR_LOOPS, X86_BUG_IBPB_NO_RET
	RET
SYM_FUNC_END(lguest_ibpb)
_ASM_NOKPROBE(lguest_ibpb)

/*
 * The kernel's clear_bhb_loop (entry_64.S, exported to KVM only), the same
 * sequence: branches that push the guest's branch history out of the
 * predictor. Clobbers eax, ecx.
 */
SYM_FUNC_START_LOCAL(lguest_clear_bhb_loop)
	ANNOTATE_NOENDBR
	push	%rbp
	mov	%rsp, %rbp
	movl	$5, %ecx
	ANNOTATE_INTRA_FUNCTION_CALL
	call	1f
	jmp	5f
	.align 64, 0xcc
	.skip 32 - (.Llg_ret1 - 1f), 0xcc
	ANNOTATE_INTRA_FUNCTION_CALL
1:	call	2f
.Llg_ret1:	RET
	.align 64, 0xcc
	.skip 32 - 18, 0xcc
2:	movl	$5, %eax
3:	jmp	4f
	nop
4:	sub	$1, %eax
	jnz	3b
	sub	$1, %ecx
	jnz	1b
.Llg_ret2:	RET
5:	lfence
	pop	%rbp
	RET
SYM_FUNC_END(lguest_clear_bhb_loop)
STACK_FRAME_NON_STANDARD(lguest_clear_bhb_loop)
_ASM_NOKPROBE(lguest_clear_bhb_loop)

/*
 * #DB (IST5), NMI (IST6) and #MC (IST7) arrive on their own stacks. From
 * the guest, the hardware frame is copied to where a normal trap would have
 * put it and we leave like any other exit. From ring 0 (inside the
 * switcher), \ring0 deals with it and returns to where it hit.
 *
 * On entry the stub has pushed the error code (0) and the vector:
 * 0(%rsp) vector, 8 error, 16 RIP, 24 CS, 32 RFLAGS, 40 RSP, 48 SS.
 */
.macro IST_EVENT name, ring0
SYM_CODE_START_LOCAL(\name)
	UNWIND_HINT_UNDEFINED
	testb	$3, 24(%rsp)
	jz	.L\name\()_ring0
	/* From the guest: move the 7-quadword frame to the top of page 0. */
	push	%rax
	push	%rdi
	BLOCK_FROM_RSP %rax
	add	$(LG_FRAME + 15 * 8), %rax
	.irp i, 0, 1, 2, 3, 4, 5, 6
	mov	(16 + \i * 8)(%rsp), %rdi
	mov	%rdi, (\i * 8)(%rax)
	.endr
	mov	%rsp, %rdi
	mov	%rax, %rsp
	mov	8(%rdi), %rax
	mov	(%rdi), %rdi
	jmp	lguest_exit_common
.L\name\()_ring0:
	push	%rax
	push	%rdi
	BLOCK_FROM_RSP %rdi
	/* Now 0(%rsp) rdi, 8 rax, 16 vector, 24 error, 32 RIP, 40 CS, 48 RFLAGS. */
	\ring0
	pop	%rdi
	pop	%rax
	add	$16, %rsp
	iretq
SYM_CODE_END(\name)
_ASM_NOKPROBE(\name)
.endm

/*
 * If the interrupted RIP (in %rax) is in [\start, \end), makes it \target
 * and jumps to \done; goes on otherwise. Clobbers %rdi (and %rax).
 */
.macro WINDOW_TO start, end, target, done
	lea	\start(%rip), %rdi
	cmp	%rdi, %rax
	jb	.Lnot\@
	lea	\end(%rip), %rdi
	cmp	%rdi, %rax
	jae	.Lnot\@
	lea	\target(%rip), %rax
	mov	%rax, 32(%rsp)
	jmp	\done
.Lnot\@:
.endm

/*
 * An NMI or #MC in ring 0 is recorded for the host to handle once home; if
 * it hit the entry window, the entry is aborted, and if it hit the direct
 * switch's, the switch exits.
 */
.macro RING0_PENDING pending
	movq	$1, \pending(%rdi)
	mov	32(%rsp), %rax			/* interrupted RIP */
	WINDOW_TO lguest_entry_window, lguest_entry_window_end, lguest_entry_abort, .Lout\@
	/* The direct switch's last steps: it exits instead of the iretq. */
	WINDOW_TO lguest_direct_window, lguest_direct_window_end, lguest_direct_abort, .Lout\@
.Lout\@:
.endm

/*
 * A #DB in ring 0 comes from a data breakpoint the launcher armed on its
 * own thread, deferred past a guest's `mov ss` to the first instruction of
 * a stub (CVE-2018-8897), or from a kernel breakpoint: as Linux does for a
 * kernel-mode #DB on a user address, record DR6, clear it, and go on with
 * TF clear. The guest's exit then proceeds as if nothing had happened.
 */
.macro RING0_DEBUG
	mov	%dr6, %rax
	mov	%rax, LG_DB_DR6(%rdi)
	incq	LG_DB_COUNT(%rdi)
	/*
	 * An instruction breakpoint (B0-B3) on the alias faults again at the
	 * same instruction unless RF is set for the return, as Linux's own
	 * handler sets it: without, the CPU would hang there.
	 */
	test	$0xf, %al
	jz	.Lno_rf_\@
	orq	$X86_EFLAGS_RF, 48(%rsp)
.Lno_rf_\@:
	mov	$DR6_RESERVED, %eax
	mov	%rax, %dr6
	andq	$~X86_EFLAGS_TF, 48(%rsp)
.endm

IST_EVENT lguest_db, RING0_DEBUG
.macro RING0_NMI
	RING0_PENDING LG_NMI_PENDING
.endm

.macro RING0_MC
	RING0_PENDING LG_MC_PENDING
.endm

IST_EVENT lguest_nmi, RING0_NMI
IST_EVENT lguest_mc, RING0_MC

/*
 * One 32-byte stub per vector: push a zero error code where the CPU does not
 * push one, push the vector, and leave. A double fault (IST7) can only be
 * the switcher's own, wherever it came from.
 */
#define LG_STUB_SIZE 32
	.balign LG_STUB_SIZE
SYM_CODE_START(lguest_idt_stubs)
	vector = 0
	.rept 256
	.balign LG_STUB_SIZE
	UNWIND_HINT_UNDEFINED
	ENDBR
	.if !(vector == 8 || (vector >= 10 && vector <= 14) || vector == 17 || vector == 21 || vector == 29 || vector == 30)
	pushq	$0
	.endif
	pushq	$vector
	.if vector == 1
	jmp	lguest_db
	.elseif vector == 2
	jmp	lguest_nmi
	.elseif vector == 18
	jmp	lguest_mc
	.elseif vector == 8
	jmp	lguest_switcher_fault
	.elseif vector == LG_SYSRET_VECTOR
	jmp	lguest_sysret
	.else
	jmp	lguest_exit_common
	.endif
	vector = vector + 1
	.endr
SYM_CODE_END(lguest_idt_stubs)
_ASM_NOKPROBE(lguest_idt_stubs)

	.balign PAGE_SIZE, 0xcc
SYM_INNER_LABEL(lguest_switcher_end, SYM_L_GLOBAL)
	.popsection

/*
 * void lguest_deliver_to_host(unsigned long handler)
 *
 * Runs the host's handler for an interrupt that arrived while the guest ran,
 * with the frame the CPU would have built had it arrived here (like the
 * kernel's IDT_DO_EVENT_IRQOFF for KVM, which a module cannot call). The
 * handler's iretq brings us back.
 *
 * The frame says interrupts were on, as they were in the guest: the
 * interrupt exit path only does its deferred work for such a context, and
 * since Linux 7.x that includes re-arming the hrtimer interrupt
 * (CONFIG_HRTIMER_REARM_DEFERRED). With interrupts off in the frame, the
 * timer of this CPU stayed unprogrammed after each tick taken in a guest.
 * So the handler returns with interrupts on; the caller expects that.
 */
	.pushsection .text, "ax"
SYM_FUNC_START(lguest_deliver_to_host)
	push	%rbp
	mov	%rsp, %rbp
	and	$-16, %rsp
	push	$__KERNEL_DS
	push	%rbp
	pushf
	orq	$X86_EFLAGS_IF, (%rsp)
	push	$__KERNEL_CS
	CALL_NOSPEC rdi
	leave
	RET
SYM_FUNC_END(lguest_deliver_to_host)
	.popsection
