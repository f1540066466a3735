// SPDX-License-Identifier: GPL-2.0
/*
 * C helpers for lguest.ko; see lg_helpers.h. Most only expose a static
 * inline or a macro to Rust. Two carry real logic: the irqfd (a wait-queue
 * entry on an eventfd, as KVM's irqfd, kept in C as KVM keeps it) and the
 * host checks that need the kernel's feature macros (lg_host_refusal).
 */
#include <linux/irqflags.h>
#include <linux/mm.h>
#include <linux/sched/mm.h>
#include <linux/sched.h>
#include <linux/sched/signal.h>
#include <linux/freezer.h>
#include <linux/smp.h>
#include <linux/eventfd.h>
#include <linux/file.h>
#include <linux/poll.h>
#include <asm/apic.h>
#include <linux/slab.h>
#include <linux/wait.h>
#include <asm/desc.h>
#include <asm/msr.h>
#include <asm/special_insns.h>
#include <asm/tlbflush.h>
#include <asm/invpcid.h>
#include <asm/processor.h>
#include <asm/cpufeature.h>
#include <asm/cpuid/api.h>
#include <asm/fpu/api.h>
#include <asm/fpu/xcr.h>
#include <asm/fpu/xstate.h>
#include <asm/mce.h>
#include <asm/ptrace.h>
#include <asm/debugreg.h>
#include <linux/cc_platform.h>
#include <linux/mem_encrypt.h>
#include <linux/vmalloc.h>
#include <linux/thread_info.h>
#include "lg_helpers.h"

unsigned long lg_irq_save(void)
{
	unsigned long flags;

	local_irq_save(flags);
	return flags;
}

void lg_irq_restore(unsigned long flags)
{
	local_irq_restore(flags);
}

unsigned long lg_page_to_phys(struct page *page)
{
	return page_to_phys(page);
}

void *lg_page_address(struct page *page)
{
	return page_address(page);
}

unsigned long lg_gdt_rw(unsigned int cpu)
{
	return (unsigned long)get_cpu_gdt_rw(cpu);
}

int lg_signal_pending(void)
{
	return signal_pending(current);
}

void lg_cond_resched(void)
{
	cond_resched();
}

void lg_set_current_interruptible(void)
{
	set_current_state(TASK_INTERRUPTIBLE);
}

void lg_set_current_running(void)
{
	__set_current_state(TASK_RUNNING);
}

void lg_schedule(void)
{
	schedule();
}

unsigned long lg_read_cr4(void)
{
	return __read_cr4();
}

unsigned long lg_read_cr3(void)
{
	return __read_cr3();
}

unsigned long lg_read_efer(void)
{
	u64 efer;

	rdmsrq(MSR_EFER, efer);
	return efer;
}

/* LSTAR, STAR and SYSCALL_MASK of this CPU (syscall_msr_test). */
void lg_read_syscall_msrs(u64 out[3])
{
	rdmsrq(MSR_LSTAR, out[0]);
	rdmsrq(MSR_STAR, out[1]);
	rdmsrq(MSR_SYSCALL_MASK, out[2]);
}

/* Interrupts off; the caller puts the host's values back before they come on. */
void lg_write_syscall_msrs(const u64 in[3])
{
	wrmsrq(MSR_LSTAR, in[0]);
	wrmsrq(MSR_STAR, in[1]);
	wrmsrq(MSR_SYSCALL_MASK, in[2]);
}

void lg_cpuid(unsigned int leaf, unsigned int subleaf, unsigned int out[4])
{
	cpuid_count(leaf, subleaf, &out[0], &out[1], &out[2], &out[3]);
}

unsigned int lg_cpu_id(void)
{
	return raw_smp_processor_id();
}

unsigned long lg_page_offset_base(void)
{
	return PAGE_OFFSET;
}

/*
 * irqfd: an eventfd whose signal raises a guest interrupt without a trip
 * through the launcher. Like KVM's irqfd, a wait-queue entry on the eventfd
 * consumes the count and calls back into Rust (irq.rs) from the waker's
 * context (any context, the eventfd's wait-queue lock held).
 */
struct lg_irqfd {
	wait_queue_entry_t wait;
	poll_table pt;
	wait_queue_head_t *wqh;
	struct eventfd_ctx *ctx;
	void *data;
	unsigned int irq;
};

static int lg_irqfd_wakeup(wait_queue_entry_t *wait, unsigned int mode, int sync, void *key)
{
	struct lg_irqfd *irqfd = container_of(wait, struct lg_irqfd, wait);
	__poll_t flags = key_to_poll(key);
	u64 cnt;

	if (flags & EPOLLIN) {
		eventfd_ctx_do_read(irqfd->ctx, &cnt);
		lguest_irqfd_fire(irqfd->data, irqfd->irq);
	}
	return 0;
}

static void lg_irqfd_queue(struct file *file, wait_queue_head_t *wqh, poll_table *pt)
{
	struct lg_irqfd *irqfd = container_of(pt, struct lg_irqfd, pt);

	irqfd->wqh = wqh;
	add_wait_queue(wqh, &irqfd->wait);
}

struct lg_irqfd *lg_irqfd_attach(int fd, void *data, unsigned int irq, int *err)
{
	struct lg_irqfd *irqfd;
	struct file *file;
	__poll_t events;
	u64 cnt;

	file = fget(fd);
	if (!file) {
		*err = -EBADF;
		return NULL;
	}
	irqfd = kzalloc(sizeof(*irqfd), GFP_KERNEL);
	if (!irqfd) {
		fput(file);
		*err = -ENOMEM;
		return NULL;
	}
	irqfd->ctx = eventfd_ctx_fileget(file);
	if (IS_ERR(irqfd->ctx)) {
		*err = PTR_ERR(irqfd->ctx);
		kfree(irqfd);
		fput(file);
		return NULL;
	}
	irqfd->data = data;
	irqfd->irq = irq;
	init_waitqueue_func_entry(&irqfd->wait, lg_irqfd_wakeup);
	init_poll_funcptr(&irqfd->pt, lg_irqfd_queue);
	events = vfs_poll(file, &irqfd->pt);
	fput(file);
	/*
	 * Signalled before we listened: deliver it now. The count is consumed
	 * under the eventfd's wait-queue lock, as a wake-up would do it.
	 */
	if ((events & EPOLLIN) && irqfd->wqh) {
		unsigned long flags;

		spin_lock_irqsave(&irqfd->wqh->lock, flags);
		eventfd_ctx_do_read(irqfd->ctx, &cnt);
		spin_unlock_irqrestore(&irqfd->wqh->lock, flags);
		lguest_irqfd_fire(data, irq);
	}
	*err = 0;
	return irqfd;
}

void lg_irqfd_detach(struct lg_irqfd *irqfd)
{
	u64 cnt;

	eventfd_ctx_remove_wait_queue(irqfd->ctx, &irqfd->wait, &cnt);
	eventfd_ctx_put(irqfd->ctx);
	kfree(irqfd);
}

bool lg_irqfd_matches(struct lg_irqfd *irqfd, int fd)
{
	struct eventfd_ctx *ctx = eventfd_ctx_fdget(fd);
	bool same;

	if (IS_ERR(ctx))
		return false;
	same = ctx == irqfd->ctx;
	eventfd_ctx_put(ctx);
	return same;
}

/*
 * ioeventfd: a reference to an eventfd that the run loop signals when the
 * guest notifies an address bound to it (notify.rs).
 */
struct eventfd_ctx *lg_eventfd_get(int fd, int *err)
{
	struct eventfd_ctx *ctx = eventfd_ctx_fdget(fd);

	if (IS_ERR(ctx)) {
		*err = PTR_ERR(ctx);
		return NULL;
	}
	*err = 0;
	return ctx;
}

void lg_eventfd_signal(struct eventfd_ctx *ctx)
{
	eventfd_signal(ctx);
}

void lg_eventfd_put(struct eventfd_ctx *ctx)
{
	eventfd_ctx_put(ctx);
}

/*
 * An NMI to this CPU through its local APIC: a real NMI, so the host's
 * handler runs with NMIs blocked by the hardware (switcher.rs).
 */
void lg_self_nmi(void)
{
	__apic_send_IPI_mask(cpumask_of(smp_processor_id()), NMI_VECTOR);
}

/* The current task's address space, with a reference (mmgrab). */
struct mm_struct *lg_current_mm_grab(void)
{
	struct mm_struct *mm = current->mm;

	if (mm)
		mmgrab(mm);
	return mm;
}

bool lg_current_mm_is(struct mm_struct *mm)
{
	return current->mm == mm;
}

void lg_mm_drop(struct mm_struct *mm)
{
	mmdrop(mm);
}

/* Charges (or refunds) pinned guest pages to the owner's RLIMIT_MEMLOCK. */
int lg_account_locked_vm(struct mm_struct *mm, unsigned long pages, bool inc)
{
	return account_locked_vm(mm, pages, inc);
}

/* Pages mapped contiguously in the kernel's vmalloc area (the switcher blocks). */
void *lg_vmap(struct page **pages, unsigned int count)
{
	return vmap(pages, count, VM_MAP, PAGE_KERNEL);
}

void lg_vunmap(void *addr)
{
	vunmap(addr);
}

/*
 * This CPU's IST1-4 stack tops (double fault, NMI, #DB, #MC): host handlers
 * that run while the switcher's TSS is current use the host's own stacks.
 */
void lg_host_ist(u64 *out)
{
	int i;

	for (i = 0; i < 4; i++)
		out[i] = this_cpu_read(cpu_tss_rw.x86_tss.ist[i]);
}

/*
 * A machine check that hit the guest: the host's handler, told it came from
 * user mode (as KVM tells it), so that an error in guest memory is the
 * launcher's, not a kernel-mode one that panics the host.
 */
void lg_machine_check_user(unsigned long ip)
{
#ifdef CONFIG_X86_MCE
	struct pt_regs regs = {
		.cs = 3,
		.flags = X86_EFLAGS_IF,
		.ip = ip,
	};

	do_machine_check(&regs);
#endif
}

/* Work is queued for the return to user mode (a memory-failure kill, say). */
bool lg_notify_resume_pending(void)
{
	return test_thread_flag(TIF_NOTIFY_RESUME);
}

/*
 * Hosts the switcher cannot run on, by what the kernel knows of itself:
 * returns why, or NULL. With encrypted memory every page-table entry and
 * CR3 need the encryption bit, which the shadow tables do not carry; TDX
 * and SEV-ES guests take #VE/#VC exceptions on the switcher's MSR writes;
 * under Xen PV lgdt, lidt and wrmsr fault.
 */
static const char *const lg_refusals[] = {
	"memory encryption is active (AMD SME): shadow page tables would need the encryption bit",
	"this host's memory is encrypted (an SEV, SEV-ES or SNP guest, or a confidential-computing host)",
	"this host is a TDX guest: the switcher's MSR and descriptor-table writes would raise #VE",
	"this host is a Xen PV guest: lgdt, lidt and wrmsr are not allowed",
};

/* The text of refusal `n` (0-3 as above), for the simulated refusals. */
const char *lg_refusal_text(unsigned int n)
{
	return n < ARRAY_SIZE(lg_refusals) ? lg_refusals[n] : NULL;
}

const char *lg_host_refusal(void)
{
	if (sme_me_mask)
		return lg_refusals[0];
	if (cc_platform_has(CC_ATTR_HOST_MEM_ENCRYPT) || cc_platform_has(CC_ATTR_GUEST_MEM_ENCRYPT))
		return lg_refusals[1];
	if (cpu_feature_enabled(X86_FEATURE_TDX_GUEST))
		return lg_refusals[2];
	if (cpu_feature_enabled(X86_FEATURE_XENPV))
		return lg_refusals[3];
	return NULL;
}

/* User shadow stacks are on: the switcher keeps U_CET and PL3_SSP apart. */
bool lg_user_shstk(void)
{
	return cpu_feature_enabled(X86_FEATURE_USER_SHSTK);
}

/* A Meltdown-affected CPU, whatever the page-table isolation. */
bool lg_cpu_meltdown(void)
{
	return boot_cpu_has_bug(X86_BUG_CPU_MELTDOWN);
}

/* A Meltdown-affected CPU without page-table isolation. */
bool lg_meltdown_without_pti(void)
{
	return boot_cpu_has_bug(X86_BUG_CPU_MELTDOWN) && !boot_cpu_has(X86_FEATURE_PTI);
}

/*
 * The guest's FPU. The XSAVE components a guest's state holds: the host's
 * XCR0 less PKRU (the switcher keeps PKRU apart), the AMX components (their
 * use is armed by XFD per task, and their 8 KiB do not fit) and any the
 * module does not know, each of which must lie within the one page that
 * holds a vCPU's state (standard format). 0 without XSAVE: FXSAVE then.
 */
u64 lg_fpu_xsave_mask(void)
{
	u64 known = XFEATURE_MASK_FPSSE | XFEATURE_MASK_YMM | XFEATURE_MASK_BNDREGS |
		    XFEATURE_MASK_BNDCSR | XFEATURE_MASK_AVX512 | XFEATURE_MASK_APX;
	u64 mask;
	int i;

	if (!cpu_feature_enabled(X86_FEATURE_OSXSAVE))
		return 0;
	mask = xgetbv(XCR_XFEATURE_ENABLED_MASK) & known;
	for (i = 2; i < 64; i++) {
		u32 size, offset, ecx, edx;

		if (!(mask & BIT_ULL(i)))
			continue;
		cpuid_count(CPUID_LEAF_XSTATE, i, &size, &offset, &ecx, &edx);
		if (!size || (u64)offset + size > PAGE_SIZE)
			mask &= ~BIT_ULL(i);
	}
	return mask;
}

/*
 * The bracket around a guest's run with its FPU state loaded, called with
 * interrupts off: kernel_fpu_begin saves the task's user state (once, until
 * it returns to user mode, which reloads it) and keeps any other kernel FPU
 * user off this CPU until kernel_fpu_end. With interrupts off neither
 * takes the bottom-half lock, and nothing can preempt the bracket.
 */
void lg_fpu_begin(void)
{
	kernel_fpu_begin_mask(0);
}

void lg_fpu_end(void)
{
	kernel_fpu_end();
}

/* DR7's L0-L3 and G0-G3. */
#define DR7_ENABLES 0xffUL

/* The CPU has an indirect branch prediction barrier (PRED_CMD.IBPB). */
bool lg_has_ibpb(void)
{
	return boot_cpu_has(X86_FEATURE_IBPB);
}

/*
 * XFD around a guest's run (Documentation/switcher.rst, "The FPU"): every
 * dynamic XSAVE component (AMX's tile data) armed, whatever the last FPU
 * owner on this CPU left, so that the guest's first AMX instruction or
 * XRSTOR of it raises #NM instead of reaching tile registers another task
 * or another VM left live, and XSAVE sees the component in its initial
 * state. Called with interrupts off; returns the value lg_xfd_restore puts
 * back, exactly, before they come on, so that the kernel's per-CPU copy of
 * XFD (xfd_state, which it compares before each write) stays true.
 */
u64 lg_xfd_arm(void)
{
	u64 old;

	if (!cpu_feature_enabled(X86_FEATURE_XFD))
		return XFEATURE_MASK_USER_DYNAMIC;
	rdmsrq(MSR_IA32_XFD, old);
	if ((old & XFEATURE_MASK_USER_DYNAMIC) != XFEATURE_MASK_USER_DYNAMIC)
		wrmsrq(MSR_IA32_XFD, old | XFEATURE_MASK_USER_DYNAMIC);
	return old;
}

void lg_xfd_restore(u64 old)
{
	if ((old & XFEATURE_MASK_USER_DYNAMIC) != XFEATURE_MASK_USER_DYNAMIC)
		wrmsrq(MSR_IA32_XFD, old);
}

/*
 * A guest's hardware breakpoints around its run (Documentation/switcher.rst,
 * "Debug registers"), switched as KVM switches them: the live DR7 saved and
 * turned off first, so that no half-written breakpoint fires, then DR0-DR3
 * and the guest's DR7. Where the host had breakpoints of its own armed
 * (perf's, a ptrace'd task's: any enable bit in DR7), DR0-DR3 are saved as
 * well and everything goes back exactly (the kernel's own
 * hw_breakpoint_restore() is exported to KVM only); where it had none,
 * DR0-DR3 keep the guest's values under a DR7 of 0, which arms nothing.
 * Called with interrupts off; saved[0..3] are DR0-DR3, saved[4] DR7.
 */
void lg_debugregs_load(const u64 *addrs, u64 dr7, u64 *saved)
{
	unsigned long v;

	get_debugreg(v, 7);
	saved[4] = v;
	if (v & DR7_ENABLES) {
		set_debugreg(0UL, 7);
		get_debugreg(v, 0);
		saved[0] = v;
		get_debugreg(v, 1);
		saved[1] = v;
		get_debugreg(v, 2);
		saved[2] = v;
		get_debugreg(v, 3);
		saved[3] = v;
	}
	set_debugreg(addrs[0], 0);
	set_debugreg(addrs[1], 1);
	set_debugreg(addrs[2], 2);
	set_debugreg(addrs[3], 3);
	set_debugreg(dr7, 7);
}

void lg_debugregs_restore(const u64 *saved)
{
	set_debugreg(0UL, 7);
	if (saved[4] & DR7_ENABLES) {
		set_debugreg(saved[0], 0);
		set_debugreg(saved[1], 1);
		set_debugreg(saved[2], 2);
		set_debugreg(saved[3], 3);
		set_debugreg(saved[4], 7);
	}
}

/*
 * A guest's #NM with its FPU live comes from XFD (a component the launcher's
 * task has not asked for, AMX): the hardware recorded it in XFD_ERR, which
 * the host's own #NM handler would have cleared.
 */
void lg_clear_xfd_err(void)
{
	if (cpu_feature_enabled(X86_FEATURE_XFD))
		wrmsrq(MSR_IA32_XFD_ERR, 0);
}

/*
 * The switcher's top-level slot (switcher.rs): the address space's own
 * top-level table (PML4, or PML5 with 5-level paging; under PTI the
 * kernel half of the pair, the one kernel mode runs on).
 */
u64 *lg_mm_pgd(struct mm_struct *mm)
{
	return (u64 *)mm->pgd;
}

bool lg_has_invpcid(void)
{
	return boot_cpu_has(X86_FEATURE_INVPCID);
}

/*
 * SYSENTER in long mode: #UD on AMD and Hygon CPUs, an entry to
 * SYSENTER_CS:SYSENTER_EIP on the others (Intel documents it for 64-bit
 * mode). Anything but the two vendors known to lack it counts as having it.
 */
bool lg_sysenter_in_long_mode(void)
{
	return boot_cpu_data.x86_vendor != X86_VENDOR_AMD &&
	       boot_cpu_data.x86_vendor != X86_VENDOR_HYGON;
}

/*
 * Drops every TLB entry and paging-structure cache entry on this CPU, for
 * every PCID, global ones included: what the kernel's __flush_tlb_all
 * does (exported to KVM only), by INVPCID or a CR4.PGE toggle.
 */
static void lg_flush_tlb_local(void *unused)
{
	unsigned long flags, cr4;

	if (boot_cpu_has(X86_FEATURE_INVPCID)) {
		invpcid_flush_all();
		return;
	}
	raw_local_irq_save(flags);
	asm volatile("mov %%cr4, %0" : "=r"(cr4));
	if (cr4 & X86_CR4_PGE) {
		asm volatile("mov %0, %%cr4" : : "r"(cr4 ^ X86_CR4_PGE) : "memory");
		asm volatile("mov %0, %%cr4" : : "r"(cr4) : "memory");
	} else {
		asm volatile("mov %%cr3, %0; mov %0, %%cr3" : "=r"(cr4) : : "memory");
	}
	raw_local_irq_restore(flags);
}

/* On every CPU, before the switcher's page tables are freed. */
void lg_flush_tlb_all_cpus(void)
{
	on_each_cpu(lg_flush_tlb_local, NULL, 1);
}
