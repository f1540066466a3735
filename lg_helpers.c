// SPDX-License-Identifier: GPL-2.0
/*
 * C helpers for lguest.ko; see lg_helpers.h. No logic lives here: each
 * function only exposes a static inline or a macro to Rust.
 */
#include <linux/irqflags.h>
#include <linux/mm.h>
#include <linux/sched.h>
#include <linux/sched/signal.h>
#include <linux/freezer.h>
#include <linux/smp.h>
#include <asm/desc.h>
#include <asm/msr.h>
#include <asm/special_insns.h>
#include <asm/tlbflush.h>
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

bool lg_try_to_freeze(void)
{
	return try_to_freeze();
}

void lg_set_current_interruptible(void)
{
	set_current_state(TASK_INTERRUPTIBLE | TASK_FREEZABLE);
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

unsigned long lg_read_cr0(void)
{
	return read_cr0();
}

unsigned long lg_read_efer(void)
{
	u64 efer;

	rdmsrq(MSR_EFER, efer);
	return efer;
}

unsigned int lg_cpu_id(void)
{
	return raw_smp_processor_id();
}

unsigned long lg_page_offset_base(void)
{
	return PAGE_OFFSET;
}
