/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The Switcher: moves this CPU from the host into a guest running in ring 3,
 * and back.
 *
 * Everything here runs with interrupts disabled, called from switcher.rs,
 * which prepared a per-CPU block of eight pages (CpuBlock in switcher.rs,
 * whose offset constants must match the #defines below):
 *
 *   page 0  host state saved at entry, then the guest register frame at the
 *           very top; TSS.RSP0 points at the end of the page, so a trap from
 *           the guest pushes its frame right there.
 *   page 1  the guest IDT: 256 gates, one stub each (lguest_idt_stubs).
 *   page 2  the guest GDT (same selectors as the host's, and the host's
 *           per-CPU segment) and the guest TSS.
 *   page 3  our two IST stacks: NMI (IST6), #MC and #DF (IST7).
 *   pages 4-7  the stack for IST1-5, which only host handlers use: an NMI
 *           or #MC in the few instructions where the host's IDT is loaded
 *           while our TSS is current (between ltr and lidt on entry, lidt
 *           and ltr on exit).
 *
 * The code lives in its own page-aligned section so that it can be mapped,
 * alone, into every guest's shadow page tables at the address it has in the
 * host. The block is mapped at its host address too, only while this CPU
 * runs that guest. Nothing else of the host is reachable from the guest's
 * address space.
 *
 * The one trick worth knowing before reading on: between loading the guest
 * IDT and the iretq into the guest, an NMI lands on our IDT while we are still
 * in ring 0. The NMI stub then rewrites the interrupted RIP to
 * lguest_entry_abort, which unwinds as if the guest had taken an NMI at its
 * first instruction. The host handles the NMI and simply tries again. An NMI
 * on the way out is remembered in the block and handled once home.
 */
#include <linux/linkage.h>
#include <asm/asm.h>
#include <asm/msr-index.h>
#include <asm/processor-flags.h>
#include <asm/segment.h>
#include <asm/nospec-branch.h>
#include <asm/unwind_hints.h>
#include <asm/ibt.h>
#include <asm/page_types.h>
#include <asm/smap.h>

/* Offsets into page 0 (struct LgHostState in switcher.rs). */
#define LG_HOST_RSP		0
#define LG_HOST_CR3		8
#define LG_HOST_CR0		16
#define LG_HOST_EFER		24
#define LG_HOST_FS_BASE		32
#define LG_HOST_GS_BASE		40
#define LG_HOST_SYSENTER_CS	48
#define LG_HOST_GDTR		56	/* 10 bytes: limit, base (read-only alias) */
#define LG_HOST_GDTR_RW		72	/* 10 bytes: the writable alias */
#define LG_HOST_IDTR		88	/* 10 bytes */
#define LG_HOST_TR		104
#define LG_HOST_LDT		106
#define LG_HOST_DS		108
#define LG_HOST_ES		110
#define LG_HOST_FS		112
#define LG_HOST_GS		114
#define LG_GUEST_GDTR		120
#define LG_GUEST_IDTR		136
#define LG_GUEST_CR3		152
#define LG_NMI_PENDING		160
#define LG_MC_PENDING		168
#define LG_GUEST_FS_BASE	176
#define LG_GUEST_GS_BASE	184
#define LG_HOST_PKRU		192
#define LG_PKRU_ON		196
#define LG_GUEST_CR2		200
#define LG_ABORTED		208

/* The guest frame: 22 quadwords ending at the top of page 0. */
#define LG_FRAME_SIZE		(22 * 8)
#define LG_FRAME		(PAGE_SIZE - LG_FRAME_SIZE)
#define LG_FRAME_VECTOR		(LG_FRAME + 15 * 8)

/* Page 2: our GDT, with the TSS descriptor where the host has it. */
#define LG_GDT			(2 * PAGE_SIZE)
#define LG_TSS_SEL		(GDT_ENTRY_TSS * 8)

/* Page 3: the IST stacks; the block is found from either by masking. */
#define LG_IST_PAGE		(3 * PAGE_SIZE)

/* Loads MSR \msr from the 64-bit slot at \off(%rdi). Clobbers eax, ecx, edx. */
.macro WRMSR_FROM msr, off
	mov	$\msr, %ecx
	mov	\off(%rdi), %eax
	mov	\off+4(%rdi), %edx
	wrmsr
.endm

/* Saves MSR \msr into the 64-bit slot at \off(%rdi). Clobbers eax, ecx, edx. */
.macro RDMSR_TO msr, off
	mov	$\msr, %ecx
	rdmsr
	mov	%eax, \off(%rdi)
	mov	%edx, \off+4(%rdi)
.endm

	.pushsection .text.lguest_switcher, "ax"
	.balign PAGE_SIZE
SYM_INNER_LABEL(lguest_switcher_start, SYM_L_GLOBAL)

/*
 * void lguest_switch_to_guest(struct lg_cpu_block *block)
 *
 * Enters the guest whose registers are in the block's frame and whose shadow
 * page table root is block->guest_cr3, and returns when the guest traps, is
 * interrupted, or an NMI aborted the entry. Interrupts must be off.
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
	RDMSR_TO MSR_FS_BASE, LG_HOST_FS_BASE
	RDMSR_TO MSR_GS_BASE, LG_HOST_GS_BASE
	RDMSR_TO MSR_EFER, LG_HOST_EFER
	RDMSR_TO MSR_IA32_SYSENTER_CS, LG_HOST_SYSENTER_CS
	cmpl	$0, LG_PKRU_ON(%rdi)
	je	1f
	xor	%ecx, %ecx
	rdpkru
	mov	%eax, LG_HOST_PKRU(%rdi)
1:
	/*
	 * From here on RSP is the guest frame, which the stub of an NMI can
	 * find, and every step up to the iretq can be undone by
	 * lguest_restore_host.
	 */
	UNWIND_HINT_SAVE
	lea	LG_FRAME(%rdi), %rsp
SYM_INNER_LABEL(lguest_entry_window, SYM_L_GLOBAL)
	ANNOTATE_NOENDBR
	/*
	 * GDT, then TSS, then IDT: whenever our IDT is live, so is our TSS,
	 * so our NMI and #MC stubs always land on our IST stacks. A host NMI
	 * between lgdt and lidt runs on our GDT (which carries the host's
	 * per-CPU segment) and on our TSS's spare IST stacks.
	 */
	lgdt	LG_GUEST_GDTR(%rdi)
	/* Our TSS may be marked busy from the last entry: ltr needs it free. */
	andb	$~0x02, (LG_GDT + LG_TSS_SEL + 5)(%rdi)
	mov	$LG_TSS_SEL, %eax
	ltr	%ax
	lidt	LG_GUEST_IDTR(%rdi)
	xor	%eax, %eax
	lldt	%ax
	/* Null data selectors; then the FS/GS bases (a null load may clear them). */
	mov	%eax, %ds
	mov	%eax, %es
	mov	%eax, %fs
	mov	%eax, %gs
	WRMSR_FROM MSR_FS_BASE, LG_GUEST_FS_BASE
	WRMSR_FROM MSR_GS_BASE, LG_GUEST_GS_BASE
	/* SYSCALL would enter the host's entry code: turn it off (#UD). */
	mov	$MSR_EFER, %ecx
	mov	LG_HOST_EFER(%rdi), %eax
	mov	LG_HOST_EFER+4(%rdi), %edx
	and	$~EFER_SCE, %eax
	wrmsr
	/* SYSENTER with a null SYSENTER_CS raises #GP. */
	mov	$MSR_IA32_SYSENTER_CS, %ecx
	xor	%eax, %eax
	xor	%edx, %edx
	wrmsr
	/* All protection keys open for the guest (it may change PKRU itself). */
	cmpl	$0, LG_PKRU_ON(%rdi)
	je	2f
	xor	%eax, %eax
	xor	%ecx, %ecx
	xor	%edx, %edx
	wrpkru
2:
	/* The guest has no FPU: any x87/SSE instruction raises #NM. */
	mov	%cr0, %rax
	or	$X86_CR0_TS, %rax
	mov	%rax, %cr0
	/* Last, the guest's address space. Only this page and the block remain. */
	mov	LG_GUEST_CR3(%rdi), %rax
	mov	%rax, %cr3

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
SYM_INNER_LABEL(lguest_iretq, SYM_L_GLOBAL)
	iretq
SYM_INNER_LABEL(lguest_entry_window_end, SYM_L_GLOBAL)
	ANNOTATE_NOENDBR

	/* lguest_restore_host comes back here, on the host stack again. */
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

/*
 * Every way out of the guest ends here, on the guest frame (RSP0 stack) with
 * the vector and the error code already pushed.
 */
SYM_CODE_START_LOCAL(lguest_exit_common)
	UNWIND_HINT_UNDEFINED
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
	mov	%rsp, %rdi
	and	$PAGE_MASK, %rdi		/* the block */
	/* CR2 before anything else could fault. */
	mov	%cr2, %rax
	mov	%rax, LG_GUEST_CR2(%rdi)
	RDMSR_TO MSR_FS_BASE, LG_GUEST_FS_BASE
	RDMSR_TO MSR_GS_BASE, LG_GUEST_GS_BASE
	jmp	lguest_restore_host
SYM_CODE_END(lguest_exit_common)

/*
 * An NMI interrupted the entry: give up on it. The frame still holds the
 * registers switcher.rs wrote, untouched, so the guest has not run at all.
 */
SYM_CODE_START_LOCAL(lguest_entry_abort)
	UNWIND_HINT_UNDEFINED
	ENDBR
	mov	%rsp, %rdi
	and	$PAGE_MASK, %rdi
	lea	LG_FRAME(%rdi), %rsp
	movq	$1, LG_ABORTED(%rdi)
	jmp	lguest_restore_host
SYM_CODE_END(lguest_entry_abort)

/* Puts the host back, CR3 first; %rdi is the block. */
SYM_CODE_START_LOCAL(lguest_restore_host)
	UNWIND_HINT_UNDEFINED
	mov	LG_HOST_CR3(%rdi), %rax
	mov	%rax, %cr3
	/*
	 * The host's GDT (its writable alias), its selectors and its FS/GS
	 * bases come back while our IDT is still live: from the host's lidt
	 * on, a host NMI handler may run and must find the host's GS base.
	 */
	lgdt	LG_HOST_GDTR_RW(%rdi)
	lldt	LG_HOST_LDT(%rdi)
	mov	LG_HOST_DS(%rdi), %ds
	mov	LG_HOST_ES(%rdi), %es
	mov	LG_HOST_FS(%rdi), %fs
	mov	LG_HOST_GS(%rdi), %gs
	WRMSR_FROM MSR_FS_BASE, LG_HOST_FS_BASE
	WRMSR_FROM MSR_GS_BASE, LG_HOST_GS_BASE
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
	WRMSR_FROM MSR_EFER, LG_HOST_EFER
	WRMSR_FROM MSR_IA32_SYSENTER_CS, LG_HOST_SYSENTER_CS
	cmpl	$0, LG_PKRU_ON(%rdi)
	je	3f
	mov	LG_HOST_PKRU(%rdi), %eax
	xor	%ecx, %ecx
	xor	%edx, %edx
	wrpkru
3:
	mov	LG_HOST_CR0(%rdi), %rax
	mov	%rax, %cr0
	mov	LG_HOST_RSP(%rdi), %rsp
	jmp	lguest_host_return
SYM_CODE_END(lguest_restore_host)

/*
 * NMI (IST6) and #MC (IST7) arrive on their own stacks. From the guest, the
 * hardware frame is copied to where a normal trap would have put it and we
 * leave like any other exit. From ring 0 (inside the switcher), the event is
 * recorded in the block for the host to handle once home, and if it hit the
 * entry window the entry is aborted.
 *
 * On entry the stub has pushed the error code (0) and the vector:
 * 0(%rsp) vector, 8 error, 16 RIP, 24 CS, 32 RFLAGS, 40 RSP, 48 SS.
 */
.macro IST_EVENT name, pending
SYM_CODE_START_LOCAL(\name)
	UNWIND_HINT_UNDEFINED
	testb	$3, 24(%rsp)
	jz	.L\name\()_ring0
	/* From the guest: move the 7-quadword frame to the top of page 0. */
	push	%rax
	push	%rdi
	mov	%rsp, %rax
	and	$PAGE_MASK, %rax
	sub	$(LG_IST_PAGE - PAGE_SIZE + 7 * 8), %rax
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
	mov	%rsp, %rdi
	and	$PAGE_MASK, %rdi
	sub	$LG_IST_PAGE, %rdi
	movq	$1, \pending(%rdi)
	mov	32(%rsp), %rax			/* interrupted RIP */
	lea	lguest_entry_window(%rip), %rdi
	cmp	%rdi, %rax
	jb	.L\name\()_out
	lea	lguest_entry_window_end(%rip), %rdi
	cmp	%rdi, %rax
	jae	.L\name\()_out
	lea	lguest_entry_abort(%rip), %rax
	mov	%rax, 32(%rsp)
.L\name\()_out:
	pop	%rdi
	pop	%rax
	add	$16, %rsp
	iretq
SYM_CODE_END(\name)
.endm

IST_EVENT lguest_nmi, LG_NMI_PENDING
IST_EVENT lguest_mc, LG_MC_PENDING

/* A double fault inside the switcher is a bug we cannot recover from. */
SYM_CODE_START_LOCAL(lguest_df)
	UNWIND_HINT_UNDEFINED
1:	hlt
	jmp	1b
SYM_CODE_END(lguest_df)

/*
 * One 32-byte stub per vector: push a zero error code where the CPU does not
 * push one, push the vector, and leave.
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
	.if vector == 2
	jmp	lguest_nmi
	.elseif vector == 18
	jmp	lguest_mc
	.elseif vector == 8
	jmp	lguest_df
	.else
	jmp	lguest_exit_common
	.endif
	vector = vector + 1
	.endr
SYM_CODE_END(lguest_idt_stubs)

	.balign PAGE_SIZE
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
