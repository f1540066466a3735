/* SPDX-License-Identifier: GPL-2.0 WITH Linux-syscall-note */
/*
 * lguest: the /dev/lguest ioctl ABI and the guest ABI, for C users.
 *
 * The definition is abi/src/uapi.rs (documented there and in
 * Documentation/api.rst); `cargo test -p lguest-abi` compiles this header
 * and checks every number, struct size and field offset here against it.
 */
#ifndef _UAPI_LINUX_LGUEST_H
#define _UAPI_LINUX_LGUEST_H

#include <linux/ioctl.h>
#include <linux/types.h>

#define LGUEST_IOC_MAGIC	0xAF
#define LGUEST_API_VERSION	1

#define LGUEST_MAX_MEM		(4ULL << 30)
#define LGUEST_MAX_DEVICE_PAGES	256
#define LGUEST_MAX_VCPUS	1
#define LGUEST_RUN_PAGE_SIZE	4096
#define LGUEST_MESSAGE_LEN	256
#define LGUEST_IRQS		64

struct lguest_vm_config {
	__u64 mem_base;		/* launcher address of guest-physical 0 */
	__u64 mem_size;		/* bytes of RAM, page multiple */
	__u64 device_pages;	/* pages of the device window above RAM */
	__u64 entry;		/* first instruction */
	__u32 flags;		/* must be 0 */
	__u32 reserved0;	/* must be 0 */
	__u64 reserved[4];	/* must be 0 */
};

struct lguest_regs {
	__u64 rax, rbx, rcx, rdx, rsi, rdi, rbp;
	__u64 r8, r9, r10, r11, r12, r13, r14, r15;
	__u64 rip, rsp, rflags;
};

struct lguest_vcpu_regs {
	__u32 vcpu;
	__u32 pad;		/* must be 0 */
	struct lguest_regs regs;
};

#define LGUEST_EXIT_NOTIFY	1
#define LGUEST_EXIT_SHUTDOWN	2
#define LGUEST_EXIT_KILLED	3
#define LGUEST_EXIT_HALT	4

#define LGUEST_SHUTDOWN_POWEROFF 1
#define LGUEST_SHUTDOWN_RESTART	2
#define LGUEST_SHUTDOWN_CRASH	3

/* The run page: mmap(MAP_SHARED) of the file at vcpu * 4096. */
struct lguest_run {
	__u8 immediate_exit;	/* set by the launcher; RUN returns -EINTR */
	__u8 pad0[3];
	__u32 exit_reason;	/* LGUEST_EXIT_* */
	__u64 notify_addr;
	__u64 notify_arg;
	__u64 shutdown_reason;	/* LGUEST_SHUTDOWN_* */
	__u64 stat_exits;
	__u64 stat_hypercalls;
	__u64 stat_shadow_pages;
	__u64 stat_fpu_entries;	/* entries with the guest's FPU state loaded */
	__u64 stat_global_flushes;	/* entries that flushed the host's global TLB entries */
	__u64 stat_direct_syscalls;	/* user syscalls switched to the kernel without an exit */
	__u64 stat_direct_sysrets;	/* LGUEST_SYSRET_VECTOR returns without an exit */
	__u64 stat_ibpbs;		/* barriers made for LHCALL_IBPB */
	__u64 stat_shadow_reuses;	/* root switches that kept the next root's shadow */
	__u64 reserved[3];
	__u8 message[LGUEST_MESSAGE_LEN];	/* NUL-terminated */
};

#define LGUEST_IRQFD_DEASSIGN	1
#define LGUEST_MAX_IRQFDS	16

struct lguest_irqfd {
	__s32 fd;		/* an eventfd */
	__u32 irq;		/* guest interrupt, below LGUEST_IRQS */
	__u32 flags;		/* 0 or LGUEST_IRQFD_DEASSIGN */
	__u32 pad;		/* must be 0 */
};

#define LGUEST_IOEVENTFD_DEASSIGN	1
#define LGUEST_MAX_IOEVENTFDS	32

struct lguest_ioeventfd {
	__u64 addr;		/* guest-physical notification address */
	__s32 fd;		/* an eventfd */
	__u32 flags;		/* 0 or LGUEST_IOEVENTFD_DEASSIGN */
};

#define LGUEST_MAX_CPUID_ENTRIES	256
#define LGUEST_CPUID_FLAG_SIGNIFICANT_INDEX	1

/* LGUEST_SET_CPUID's argument: the header, then nent entries (KVM's shape). */
struct lguest_cpuid_entry {
	__u32 function;		/* the leaf (EAX) */
	__u32 index;		/* the subleaf (ECX), with SIGNIFICANT_INDEX */
	__u32 flags;		/* 0 or LGUEST_CPUID_FLAG_SIGNIFICANT_INDEX */
	__u32 eax;
	__u32 ebx;
	__u32 ecx;
	__u32 edx;
	__u32 padding[3];	/* must be 0 */
};

struct lguest_cpuid {
	__u32 nent;		/* at most LGUEST_MAX_CPUID_ENTRIES; 0 removes the table */
	__u32 padding;		/* must be 0 */
	struct lguest_cpuid_entry entries[];
};

#define LGUEST_GET_API_VERSION	_IO(LGUEST_IOC_MAGIC, 0x40)
#define LGUEST_CREATE_VM	_IOW(LGUEST_IOC_MAGIC, 0x41, struct lguest_vm_config)
#define LGUEST_CREATE_VCPU	_IO(LGUEST_IOC_MAGIC, 0x42)
#define LGUEST_RUN		_IO(LGUEST_IOC_MAGIC, 0x43)
#define LGUEST_GET_REGS		_IOWR(LGUEST_IOC_MAGIC, 0x44, struct lguest_vcpu_regs)
#define LGUEST_SET_REGS		_IOW(LGUEST_IOC_MAGIC, 0x45, struct lguest_vcpu_regs)
#define LGUEST_IRQ		_IO(LGUEST_IOC_MAGIC, 0x46)
#define LGUEST_IRQFD		_IOW(LGUEST_IOC_MAGIC, 0x47, struct lguest_irqfd)
#define LGUEST_IOEVENTFD	_IOW(LGUEST_IOC_MAGIC, 0x48, struct lguest_ioeventfd)
#define LGUEST_SET_CPUID	_IOW(LGUEST_IOC_MAGIC, 0x49, struct lguest_cpuid)

/* The guest ABI: hypercalls are made with `int $LGUEST_TRAP_ENTRY`. */
#define LGUEST_TRAP_ENTRY	0x1F
/*
 * The forced-emulation prefix: ud2, then "lgu". A cpuid right after it is
 * emulated by the host from the LGUEST_SET_CPUID table: the bytes
 * 0f 0b 6c 67 75, here as a little-endian number.
 */
#define LGUEST_EMULATE_PREFIX	0x75676c0b0fULL
#define LGUEST_EMULATE_PREFIX_LEN	5
#define LGUEST_KVM_EMULATE_PREFIX	0x6d766b0b0fULL	/* KVM's, taken the same way */
#define LGUEST_CMDLINE_MAX	4096
#define LGUEST_LOAD_MIN		0x100000
/* The end of the guest-virtual addresses a guest may map and run at. */
#define LGUEST_GUEST_VA_END	0x7ffffffff000ULL
#define LGUEST_GUEST_UPPER_START	0xffff880000000000ULL
#define LGUEST_GUEST_CS		0x33
#define LGUEST_GUEST_SS		0x2b
#define LGUEST_USER_CS		0x3b	/* marks frames from guest user mode */
#define LGUEST_KERNEL_CS	0x10	/* kernel-mode frames, LINUX_FRAMES */
#define LGUEST_KERNEL_SS	0x18
#define LGUEST_INIT_LINUX_FRAMES	1	/* LHCALL_LGUEST_INIT flag */
#define LGUEST_INIT_TLB_SHADOWS		2	/* LHCALL_LGUEST_INIT flag */
#define LGUEST_SYSCALL_VECTOR	0x80
#define LGUEST_SYSRET_VECTOR	0x1b	/* direct return to user mode (sysretq's registers) */
#define LGUEST_SYSCALL_DIRECT	1	/* LHCALL_SET_SYSCALL arg 2 */

#define LHCALL_FLUSH_ASYNC	0
#define LHCALL_LGUEST_INIT	1
#define LHCALL_SHUTDOWN		2
#define LHCALL_NEW_PGTABLE	4
/* LHCALL_NEW_PGTABLE argument 2 under LGUEST_INIT_TLB_SHADOWS: CR3's tag */
#define LGUEST_PGTABLE_PCID_MASK	0xfffULL	/* 0: untagged, always flushed */
#define LGUEST_PGTABLE_NOFLUSH		(1ULL << 63)	/* keep the PCID's shadow */
#define LHCALL_FLUSH_TLB	5
#define LHCALL_LOAD_IDT_ENTRY	6
#define LHCALL_SET_STACK	7
#define LHCALL_TS		8
#define LHCALL_SET_CLOCKEVENT	9
#define LHCALL_HALT		10
#define LHCALL_SET_PMD		13
#define LHCALL_SET_PTE		14
#define LHCALL_SET_PGD		15
#define LHCALL_LOAD_TLS		16
#define LHCALL_NOTIFY		17
#define LHCALL_LOAD_GDT_ENTRY	18
#define LHCALL_SEND_INTERRUPTS	19
#define LHCALL_IRET_USER	20
#define LHCALL_SET_SYSCALL	21	/* entry of user-mode syscall (0: none) */
#define LHCALL_SET_SEGMENT_BASE	22	/* LGUEST_BASE_*, a canonical base */
#define LHCALL_IRET		23	/* frame at RSP: struct lguest_iret */
#define LHCALL_INVLPG		24	/* guest-virtual address */
#define LHCALL_GET_SEGMENT_BASE	25	/* LGUEST_BASE_*; the base in RAX */
#define LGUEST_BASE_FS		0
#define LGUEST_BASE_GS		1	/* guest kernel mode's */
#define LGUEST_BASE_USER_GS	2	/* guest user mode's */
#define LHCALL_IBPB		26	/* LGUEST_IBPB_* flags; the result in RAX */
#define LGUEST_IBPB_NOW		1	/* a barrier now */
#define LGUEST_IBPB_USER_ENTRY	2	/* one at each entry from user mode */
#define LGUEST_IBPB_DONE	0
#define LGUEST_IBPB_UNAVAILABLE	1	/* the host's CPU has no IBPB */
#define LHCALL_SET_DEBUGREGS	27	/* DR7; DR0-3 in lguest_data; armed DR7 in RAX */

/* The frame of LHCALL_IRET_USER, at the guest kernel's RSP. */
struct lguest_iret_user {
	__u64 rax;
	__u64 rip;
	__u64 rflags;
	__u64 rsp;
};

/* The frame of LHCALL_IRET: RAX, then a standard iretq frame. */
struct lguest_iret {
	__u64 rax;
	__u64 rip;
	__u64 cs;
	__u64 rflags;
	__u64 rsp;
	__u64 ss;
};

#define LHCALL_RING_SIZE	64
#define LHCALL_STATUS_DONE	0xFF
#define X86_EFLAGS_IF		0x200

struct hcall_args {
	__u64 arg0, arg1, arg2, arg3, arg4;
};

struct lguest_time {
	__u64 sec, nsec;
};

struct lguest_data {
	__u64 irq_enabled;
	__u64 blocked_interrupts[LGUEST_IRQS / 64];
	__u64 cr2;
	struct lguest_time time;
	__u64 irq_pending;
	__u8 hcall_status[LHCALL_RING_SIZE];
	struct hcall_args hcalls[LHCALL_RING_SIZE];
	__u64 reserve_mem;
	__u32 tsc_khz;
	__u32 pad0;
	__u64 noirq_iret;
	__u64 kernel_address;
	__u32 syscall_vec;
	__u32 pad1;
	__u64 kernel_sp0;	/* next entry from user mode (0: SET_STACK's) */
	__u64 dr6;		/* the last #DB's DR6, written by the host */
	__u64 debugreg[4];	/* DR0-DR3 for LHCALL_SET_DEBUGREGS */
};

#endif /* _UAPI_LINUX_LGUEST_H */
