/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The lguest-rs guest's asm: its boot and system-call entries, its iret,
 * and the paravirt hooks that must keep every register but RAX (the
 * callee-save convention of pv_ops.irq and of mmu.read_cr2) and may run in
 * noinstr code. Everything else is lguest.rs.
 *
 * The hypercall convention is lguest-rs's (include/uapi/linux/lguest.h
 * there): int $0x1f, RAX the number, RDI, RSI, RDX and R10 the arguments;
 * every other register comes back unchanged.
 */
#include <linux/elfnote.h>
#include <linux/init.h>
#include <linux/linkage.h>
#include <asm/asm-offsets.h>
#include <asm/ibt.h>
#include <asm/nospec-branch.h>
#include <asm/percpu.h>
#include <asm/page_types.h>
#include <asm/pgtable_types.h>
#include <asm/pgtable_64_types.h>
#include <asm/processor-flags.h>
#include <asm/segment.h>
#include <asm/unwind_hints.h>
#include <../entry/calling.h>

#define LGUEST_TRAP_ENTRY		0x1f
#define LGUEST_SYSRET_VECTOR		0x1b
#define LHCALL_LGUEST_INIT		1
#define LHCALL_NEW_PGTABLE		4
#define LHCALL_SEND_INTERRUPTS		19
#define LHCALL_IRET			23
#define LGUEST_INIT_LINUX_FRAMES	1
#define LGUEST_INIT_TLB_SHADOWS		2
#define LGUEST_ELFNOTE_ENTRY		1

/* struct lguest_data (lguest.rs checks these against its definition) */
#define LGUEST_DATA_irq_enabled		0
#define LGUEST_DATA_cr2			16
#define LGUEST_DATA_irq_pending		40

/*
 * The entry. The launcher starts the vCPU here, in ring 3, at the entry's
 * physical address on the host's initial linear map (guest-virtual =
 * guest-physical for RAM above 1 MiB), with RSI the guest-physical
 * address of boot_params. So until the jump below only RIP-relative
 * addresses work, and they give physical addresses.
 *
 * It registers lguest_data (physical, as the host wants it), choosing
 * Linux-shaped frames and TLB semantics for the shadow page tables, then
 * loads lguest_boot_pgt, which maps the 2 MiB page this code is in at its
 * physical address (where it runs now: the host refuses a guest page that
 * reaches past RAM, so no bigger identity map that would need RAM's size
 * here) and the kernel image where it is linked (the image's own
 * level3_kernel_pgt), jumps to the linked address,
 * takes the init task's stack and calls lguest_start_kernel(), which finds
 * boot_params copied to lguest_boot_params.
 * GS base is 0, as the boot CPU of a uniprocessor kernel wants it: the
 * launcher starts every base at 0.
 */
	__INIT
SYM_CODE_START(lguest_entry)
	UNWIND_HINT_END_OF_STACK
	ANNOTATE_NOENDBR
	cld
	/*
	 * boot_params, while the host's linear map still reaches it (the BSS,
	 * where the kernel's copy lives, is cleared later).
	 */
	leaq	lguest_boot_params(%rip), %rdi
	movl	$PAGE_SIZE, %ecx
	rep movsb
	leaq	lguest_data(%rip), %rdi
	movl	$(LGUEST_INIT_LINUX_FRAMES | LGUEST_INIT_TLB_SHADOWS), %esi
	movl	$LHCALL_LGUEST_INIT, %eax
	int	$LGUEST_TRAP_ENTRY
	/* lguest_ident_pmd[entry >> 21] = the entry's 2 MiB page */
	leaq	lguest_entry(%rip), %rax
	shrq	$PMD_SHIFT, %rax
	movl	%eax, %ecx
	andl	$(PTRS_PER_PMD - 1), %ecx
	shlq	$PMD_SHIFT, %rax
	orq	$(_KERNPG_TABLE_NOENC + _PAGE_PSE), %rax
	leaq	lguest_ident_pmd(%rip), %rdx
	movq	%rax, (%rdx, %rcx, 8)
	leaq	lguest_boot_pgt(%rip), %rdi
	movl	$LHCALL_NEW_PGTABLE, %eax
	int	$LGUEST_TRAP_ENTRY
	movabsq	$lguest_entry_high, %rax
	ANNOTATE_RETPOLINE_SAFE
	jmp	*%rax
SYM_CODE_END(lguest_entry)

/* The same code, now at its linked address. */
SYM_CODE_START_LOCAL(lguest_entry_high)
	UNWIND_HINT_END_OF_STACK
	ANNOTATE_NOENDBR
	leaq	__top_init_kernel_stack(%rip), %rsp
	/*
	 * lguest_start_kernel() never returns: jump to it with a null return
	 * address, as a call would leave the stack (objtool wants a noreturn
	 * callee listed in its own table; a jump needs no entry there).
	 */
	pushq	$0
	jmp	lguest_start_kernel
SYM_CODE_END(lguest_entry_high)
	__FINIT

	__INITDATA
	.balign	PAGE_SIZE
SYM_DATA_START_LOCAL(lguest_boot_pgt)
	.quad	lguest_ident_pud - __START_KERNEL_map + _KERNPG_TABLE_NOENC
	.fill	510, 8, 0
	.quad	level3_kernel_pgt - __START_KERNEL_map + _PAGE_TABLE_NOENC
SYM_DATA_END(lguest_boot_pgt)
/* The first GiB of physical memory, where the launcher loads the kernel. */
SYM_DATA_START_LOCAL(lguest_ident_pud)
	.quad	lguest_ident_pmd - __START_KERNEL_map + _KERNPG_TABLE_NOENC
	.fill	511, 8, 0
SYM_DATA_END(lguest_ident_pud)
SYM_DATA_START_LOCAL(lguest_ident_pmd)
	.fill	512, 8, 0
SYM_DATA_END(lguest_ident_pmd)
SYM_DATA_START(lguest_boot_params)
	.skip	PAGE_SIZE
SYM_DATA_END(lguest_boot_params)
	__FINITDATA

/*
 * pv_ops.irq: the virtual IF is lguest_data.irq_enabled (X86_EFLAGS_IF or
 * 0), which the host reads before it delivers an interrupt. irq_enable is
 * the point of the 2009 change lguest-rs started from: there is no
 * patchable stub, so after it turns interrupts on it asks the host
 * (irq_pending) whether one is waiting, and if so makes the exit that
 * delivers it, until none is.
 *
 * pv_ops calls them through pointers, so each starts with ENDBR (a
 * no-op: a ring-3 kernel never turns IBT on, but objtool checks).
 */
	.pushsection .noinstr.text, "ax"
SYM_FUNC_START(lguest_save_fl)
	ENDBR
	movq	lguest_data+LGUEST_DATA_irq_enabled(%rip), %rax
	RET
SYM_FUNC_END(lguest_save_fl)

SYM_FUNC_START(lguest_irq_disable)
	ENDBR
	movq	$0, lguest_data+LGUEST_DATA_irq_enabled(%rip)
	RET
SYM_FUNC_END(lguest_irq_disable)

SYM_FUNC_START(lguest_irq_enable)
	ENDBR
	movq	$X86_EFLAGS_IF, lguest_data+LGUEST_DATA_irq_enabled(%rip)
.Lcheck:
	cmpq	$0, lguest_data+LGUEST_DATA_irq_pending(%rip)
	jne	.Lsend
	RET
.Lsend:
	movl	$LHCALL_SEND_INTERRUPTS, %eax
	int	$LGUEST_TRAP_ENTRY
	jmp	.Lcheck
SYM_FUNC_END(lguest_irq_enable)

/*
 * The kernel's iretq. Every frame the host builds is Linux-shaped (CS
 * 0x10 for an event in kernel mode), which ring 3 cannot load with an
 * iretq: the guest leaves every frame with LHCALL_IRET, which takes RAX
 * pushed below the frame and restores the rest in one step, the frame's
 * IF becoming irq_enabled. lguest_start_kernel() points the kernel's
 * early_pv_iret_patch (restore_regs_and_return_to_kernel) here, as Xen
 * points it at xen_iret; the return to user mode comes through
 * lguest_restore_regs_and_return_to_usermode.
 */
SYM_CODE_START(lguest_iret)
	UNWIND_HINT_UNDEFINED
	ANNOTATE_NOENDBR
	pushq	%rax
	movl	$LHCALL_IRET, %eax
	int	$LGUEST_TRAP_ENTRY
	ud2			/* LHCALL_IRET does not come back */
SYM_CODE_END(lguest_iret)

/*
 * The return to user mode (the X86_FEATURE_LGUEST alternative in
 * swapgs_restore_regs_and_return_to_usermode): no swapgs and no stack
 * switch, as for Xen PV (xenpv_restore_regs_and_return_to_usermode); the
 * host switches the GS base with the mode.
 */
SYM_CODE_START(lguest_restore_regs_and_return_to_usermode)
	UNWIND_HINT_REGS
	ANNOTATE_NOENDBR
	POP_REGS
	STACKLEAK_ERASE_NOCLOBBER
	addq	$8, %rsp	/* regs->orig_ax */
	jmp	lguest_iret
SYM_CODE_END(lguest_restore_regs_and_return_to_usermode)

/*
 * The system-call entry (LHCALL_SET_SYSCALL with LGUEST_SYSCALL_DIRECT;
 * lguest.rs registers it when the kernel writes entry_SYSCALL_64 to
 * MSR_LSTAR). The host's switcher enters it for a user-mode syscall
 * without an exit, with RSP still the user's, RCX and R11 as the
 * instruction leaves them, the kernel's GS base already in place (the host
 * swaps the two modes' bases) and the virtual IF off: entry_SYSCALL_64
 * after its swapgs. Its stack switch runs here as there (the guest has no
 * PTI, so no CR3 switch), and the rest is entry_SYSCALL_64's own.
 */
SYM_CODE_START(lguest_entry_SYSCALL_64)
	UNWIND_HINT_ENTRY
	ENDBR
	movq	%rsp, PER_CPU_VAR(cpu_tss_rw + TSS_sp2)
	movq	PER_CPU_VAR(cpu_current_top_of_stack), %rsp
	jmp	entry_SYSCALL_64_safe_stack
SYM_CODE_END(lguest_entry_SYSCALL_64)

/*
 * The system call's return where do_syscall_64 allows sysretq (RCX == RIP
 * and R11 == RFLAGS in pt_regs, a user RIP below TASK_SIZE_MAX, no TF or
 * RF): the X86_FEATURE_LGUEST alternative at syscall_return_via_sysret.
 * The host's direct return takes sysretq's registers, RCX the user RIP,
 * R11 the user RFLAGS and RSP the user's, every other register the user's:
 * all come back from pt_regs, RSP last, and int $LGUEST_SYSRET_VECTOR
 * switches to user mode without an exit. The virtual IF is off, as the
 * exit to user mode leaves it, which the next entry needs.
 */
SYM_CODE_START(lguest_sysret_to_usermode)
	UNWIND_HINT_REGS
	ANNOTATE_NOENDBR
	POP_REGS
	STACKLEAK_ERASE_NOCLOBBER
	movq	4*8(%rsp), %rsp		/* pt_regs->sp, past orig_ax, ip, cs, flags */
	UNWIND_HINT_END_OF_STACK
	int	$LGUEST_SYSRET_VECTOR
	ud2			/* the direct return does not come back */
SYM_CODE_END(lguest_sysret_to_usermode)

/* pv_ops.mmu.read_cr2: the host writes the fault address before it delivers a #PF. */
SYM_FUNC_START(lguest_read_cr2)
	ENDBR
	movq	lguest_data+LGUEST_DATA_cr2(%rip), %rax
	RET
SYM_FUNC_END(lguest_read_cr2)
	.popsection

	ELFNOTE(lguest, LGUEST_ELFNOTE_ENTRY, .quad lguest_entry)
