/* SPDX-License-Identifier: GPL-2.0 WITH Linux-syscall-note */
/*
 * lguest: the /dev/lguest ioctl ABI and the guest ABI, for C users.
 *
 * The definition is abi/src/uapi.rs; `cargo test -p lguest-abi` compiles
 * this header and checks every number and layout here against it.
 */
#ifndef _UAPI_LINUX_LGUEST_H
#define _UAPI_LINUX_LGUEST_H

#include <linux/ioctl.h>
#include <linux/types.h>

#define LGUEST_IOC_MAGIC	0xAF
#define LGUEST_API_VERSION	1

/* Returns LGUEST_API_VERSION. */
#define LGUEST_GET_API_VERSION	_IO(LGUEST_IOC_MAGIC, 0x40)

/* The guest ABI: hypercalls are made with `int $LGUEST_TRAP_ENTRY`. */
#define LGUEST_TRAP_ENTRY	0x1F

#define LHCALL_FLUSH_ASYNC	0
#define LHCALL_LGUEST_INIT	1
#define LHCALL_SHUTDOWN		2
#define LHCALL_NEW_PGTABLE	4
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

#endif /* _UAPI_LINUX_LGUEST_H */
