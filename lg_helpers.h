/* SPDX-License-Identifier: GPL-2.0 */
/*
 * C helpers for lguest.ko: the kernel's static inlines and macros that Rust
 * cannot call directly (bindgen sees no body), the irqfd, and the host
 * checks that need the kernel's feature macros. The Rust declarations are
 * in helpers.rs, the only caller.
 */
#ifndef LG_HELPERS_H
#define LG_HELPERS_H

#include <linux/types.h>

struct page;
struct mm_struct;

struct mm_struct *lg_current_mm_grab(void);
bool lg_current_mm_is(struct mm_struct *mm);
void lg_mm_drop(struct mm_struct *mm);
int lg_account_locked_vm(struct mm_struct *mm, unsigned long pages, bool inc);

unsigned long lg_irq_save(void);
void lg_irq_restore(unsigned long flags);
unsigned long lg_page_to_phys(struct page *page);
void *lg_page_address(struct page *page);
unsigned long lg_gdt_rw(unsigned int cpu);
int lg_signal_pending(void);
void lg_cond_resched(void);
void lg_set_current_interruptible(void);
void lg_set_current_running(void);
void lg_schedule(void);
unsigned long lg_read_cr4(void);
unsigned long lg_read_cr3(void);
unsigned long lg_read_efer(void);
void lg_read_syscall_msrs(u64 out[3]);
void lg_write_syscall_msrs(const u64 in[3]);
void lg_cpuid(unsigned int leaf, unsigned int subleaf, unsigned int out[4]);
unsigned int lg_cpu_id(void);
unsigned long lg_page_offset_base(void);

struct lg_irqfd;
struct lg_irqfd *lg_irqfd_attach(int fd, void *data, unsigned int irq, int *err);
void lg_irqfd_detach(struct lg_irqfd *irqfd);
bool lg_irqfd_matches(struct lg_irqfd *irqfd, int fd);
void lg_self_nmi(void);
void *lg_vmap(struct page **pages, unsigned int count);
void lg_vunmap(void *addr);
void lg_host_ist(u64 *out);
void lg_machine_check_user(unsigned long ip);
bool lg_notify_resume_pending(void);
const char *lg_host_refusal(void);
const char *lg_refusal_text(unsigned int n);
bool lg_user_shstk(void);
bool lg_meltdown_without_pti(void);
bool lg_cpu_meltdown(void);
u64 lg_fpu_xsave_mask(void);
void lg_fpu_begin(void);
void lg_fpu_end(void);
void lg_clear_xfd_err(void);
u64 lg_xfd_arm(void);
void lg_xfd_restore(u64 old);
void lg_debugregs_load(const u64 *addrs, u64 dr7, u64 *saved);
void lg_debugregs_restore(const u64 *saved);

struct eventfd_ctx;
struct eventfd_ctx *lg_eventfd_get(int fd, int *err);
void lg_eventfd_signal(struct eventfd_ctx *ctx);
void lg_eventfd_put(struct eventfd_ctx *ctx);

/* Implemented in irq.rs: raise `irq` on the VcpuIrq at `data`. */
void lguest_irqfd_fire(void *data, unsigned int irq);

u64 *lg_mm_pgd(struct mm_struct *mm);
bool lg_has_invpcid(void);
bool lg_sysenter_in_long_mode(void);
void lg_flush_tlb_all_cpus(void);

/* Implemented in switcher_64.S. */
void lguest_switch_to_guest(void *block);
void lguest_deliver_to_host(unsigned long handler);
void lguest_ibpb(void);
bool lg_has_ibpb(void);

#endif
