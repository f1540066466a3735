// SPDX-License-Identifier: GPL-2.0
//! Tests of the VM ioctls, driven directly (no launcher): argument
//! validation, ordering errors, registers, the run page and
//! `immediate_exit`, a tiny hand-assembled guest, kills that stick, and
//! 1000 create/run/destroy cycles without leaking memory.

use std::fs::File;
use std::process::ExitCode;

use lguest_abi as abi;
use lguest_selftests::{self as t, check, check_eq, fail, Mapping, TestResult};

const MEM: usize = 4 << 20;
const CODE: u64 = 0x10_0000;
const DATA: u64 = 0x18_0000;
const MSG: u64 = 0x18_1000;

use lguest_selftests::GUEST_OK;

/// INIT(DATA); hypercall 9999; jmp .
const GUEST_BADCALL: &[u8] = &[
    0xb8, 0x01, 0x00, 0x00, 0x00, 0xbf, 0x00, 0x00, 0x18, 0x00, 0xcd, 0x1f, //
    0xb8, 0x0f, 0x27, 0x00, 0x00, // mov $9999, %eax
    0xcd, 0x1f, 0xeb, 0xfe,
];

/// INIT(DATA); jmp . — a guest that spins forever without exits of its own.
const GUEST_SPIN: &[u8] = &[0xb8, 0x01, 0x00, 0x00, 0x00, 0xbf, 0x00, 0x00, 0x18, 0x00, 0xcd, 0x1f, 0xeb, 0xfe];

/// Stack at 0x170000; INIT(DATA); blocked_interrupts = ~(1 << 1);
/// LOAD_IDT_ENTRY(33, 0x100200, interrupt gate); HALT; jmp .
/// At 0x100200, the IRQ 1 handler: SHUTDOWN(MSG, POWEROFF).
fn guest_halt_irq1() -> Vec<u8> {
    let mut code = vec![
        0xbc, 0x00, 0x00, 0x17, 0x00, // mov $0x170000, %esp
        0xb8, 0x01, 0x00, 0x00, 0x00, 0xbf, 0x00, 0x00, 0x18, 0x00, 0xcd, 0x1f, // INIT
        0x48, 0xc7, 0x04, 0x25, 0x08, 0x00, 0x18, 0x00, 0xfd, 0xff, 0xff, 0xff, // movq $~2, 0x180008
        0xb8, 0x06, 0x00, 0x00, 0x00, // mov $6, %eax          LOAD_IDT_ENTRY
        0xbf, 0x21, 0x00, 0x00, 0x00, // mov $33, %edi
        0xbe, 0x00, 0x02, 0x10, 0x00, // mov $0x100200, %esi
        0xba, 0x0e, 0x00, 0x00, 0x00, // mov $0xe, %edx
        0xcd, 0x1f, //
        0xb8, 0x0a, 0x00, 0x00, 0x00, 0xcd, 0x1f, // HALT
        0xeb, 0xfe,
    ];
    code.resize(0x200, 0x90);
    code.extend_from_slice(&[
        0xb8, 0x02, 0x00, 0x00, 0x00, 0xbf, 0x00, 0x10, 0x18, 0x00, 0xbe, 0x01, 0x00, 0x00, 0x00, 0xcd,
        0x1f, // SHUTDOWN
        0xeb, 0xfe,
    ]);
    code
}

// A guest for the shadow-paging tests, assembled here and copied into guest
// memory at CODE (it is position independent: absolute addresses only).
// RBX picks the path after NEW_PGTABLE: 0 the main one, 1 a page outside
// RAM, 2 a write to a read-only page, 3 a page not present.
core::arch::global_asm!(
    ".pushsection .rodata.lguest_guest_paging, \"a\"",
    ".globl lguest_guest_paging_start",
    ".globl lguest_guest_paging_end",
    "lguest_guest_paging_start:",
    "mov esp, 0x1f0000",
    "mov eax, 1",
    "mov edi, 0x180000",
    "int 0x1f",
    "mov eax, 4",
    "mov edi, 0x300000",
    "int 0x1f",
    "cmp rbx, 1",
    "je 21f",
    "cmp rbx, 2",
    "je 22f",
    "cmp rbx, 3",
    "je 23f",
    // (a) read page A through its alias at 1 GiB
    "mov rax, [0x40000000]",
    "mov rsi, rax",
    "mov eax, 17",
    "mov edi, 0x181000",
    "int 0x1f",
    // (b) write page A through the alias
    "mov rcx, 0x5a5a",
    "mov [0x40000008], rcx",
    // (c) read page A through the 2 MiB identity page
    "mov rax, [0x200000]",
    "mov rsi, rax",
    "mov eax, 17",
    "mov edi, 0x181000",
    "int 0x1f",
    // (d) point the alias at page B, tell the host, read again
    "mov rdx, 0x201003",
    "mov [0x303000], rdx",
    "mov eax, 14",
    "mov edi, 0x300000",
    "mov esi, 0x40000000",
    "int 0x1f",
    "mov rax, [0x40000000]",
    "mov rsi, rax",
    "mov eax, 17",
    "mov edi, 0x181000",
    "int 0x1f",
    // (e) power off
    "mov eax, 2",
    "mov edi, 0x181000",
    "mov esi, 1",
    "int 0x1f",
    "20: jmp 20b",
    "21: mov rax, [0x40002000]",
    "jmp 20b",
    "22: mov [0x40001000], rax",
    "jmp 20b",
    "23: mov rax, [0x40003000]",
    "jmp 20b",
    "lguest_guest_paging_end:",
    ".popsection",
);

extern "C" {
    static lguest_guest_paging_start: u8;
    static lguest_guest_paging_end: u8;
}

/// The bytes of the shadow-paging guest.
fn guest_paging() -> Vec<u8> {
    // SAFETY: Both symbols delimit the bytes assembled above, in a
    // read-only section of this program.
    unsafe { blob(std::ptr::addr_of!(lguest_guest_paging_start), std::ptr::addr_of!(lguest_guest_paging_end)) }
}

/// The bytes between two symbols of this program's read-only data.
///
/// # Safety
///
/// `start` and `end` must delimit one blob assembled in this file.
unsafe fn blob(start: *const u8, end: *const u8) -> Vec<u8> {
    // SAFETY: guaranteed by the caller.
    unsafe { std::slice::from_raw_parts(start, end as usize - start as usize).to_vec() }
}

const PAGE_A: u64 = 0x20_0000;
const PAGE_B: u64 = 0x20_1000;
const VALUE_A: u64 = 0x1122_3344_5566_7788;
const VALUE_B: u64 = 0xaabb_ccdd_0000_1111;

/// Writes the guest's page tables for the shadow-paging tests:
/// VA 0x4000_0000 -> page A (RW), +0x1000 -> page B (read-only),
/// +0x2000 -> a frame outside RAM, +0x3000 not present; VA 0-2 MiB mapped
/// 4 KiB at a time from 1 MiB (code, data, stack) and 2-4 MiB as one
/// 2 MiB page (page A and B, and the tables themselves).
fn write_guest_tables(mem: &Mapping) {
    let (pml4, pdpt, pd, pt, pd2, pt2) =
        (0x30_0000u64, 0x30_1000u64, 0x30_2000u64, 0x30_3000u64, 0x30_4000u64, 0x30_5000u64);
    let e = |at: u64, v: u64| mem.put::<u64>(at as usize, v);
    const P: u64 = 1;
    const RW: u64 = 2;
    const PS: u64 = 0x80;
    e(pml4, pdpt | P | RW);
    e(pdpt, pd2 | P | RW);
    e(pdpt + 8, pd | P | RW);
    e(pd, pt | P | RW);
    e(pt, PAGE_A | P | RW);
    e(pt + 8, PAGE_B | P);
    e(pt + 16, (64 << 20) | P | RW);
    e(pd2, pt2 | P | RW);
    e(pd2 + 8, 0x20_0000 | P | RW | PS);
    for page in 0x100u64..0x200 {
        e(pt2 + 8 * page, (page << 12) | P | RW);
    }
    mem.put::<u64>(PAGE_A as usize, VALUE_A);
    mem.put::<u64>(PAGE_B as usize, VALUE_B);
}

/// NEW_PGTABLE switches the guest to its own page tables: reads and writes
/// through aliases and a 2 MiB page reach the right frames, accessed and
/// dirty bits show up in the guest's entries, and SET_PTE remaps a page.
fn shadow_paging() -> TestResult {
    let vm = TestVm::new(&guest_paging())?;
    write_guest_tables(&vm.mem);
    let mut notes = Vec::new();
    for _ in 0..4 {
        check_eq!(vm.run(), Ok(0), "RUN");
        if vm.exit_reason() != abi::LGUEST_EXIT_NOTIFY {
            break;
        }
        notes.push(vm.run_page().read::<u64>(16));
    }
    check_eq!(vm.exit_reason(), abi::LGUEST_EXIT_SHUTDOWN, format!("exit after {notes:x?} ({})", vm.message()));
    check_eq!(notes, vec![VALUE_A, VALUE_A, VALUE_B], "values read through the guest's mappings");
    check_eq!(vm.mem.read::<u64>(PAGE_A as usize + 8), 0x5a5a, "the write through the alias");
    let pd2_large: u64 = vm.mem.read(0x30_4008);
    check!(pd2_large & 0x20 != 0, "the 2 MiB entry's accessed bit is clear: {pd2_large:#x}");
    let pt_b: u64 = vm.mem.read(0x30_3000);
    check_eq!(pt_b & 0x60, 0x20, "page B's entry after a read: accessed, not dirty");
    Ok(())
}

/// The guest's page-table mistakes: a frame outside RAM kills it; a write to
/// a read-only page and a page that is not present are its own page faults
/// (reflected; with no handler, the guest dies naming the fault).
fn shadow_paging_faults() -> TestResult {
    let cases = [
        (1u64, "guest page entry"),
        (2, "page fault at 0x40001000 (error 0x3)"),
        (3, "page fault at 0x40003000 (error 0x0)"),
    ];
    for (path, want) in cases {
        let vm = TestVm::new(&guest_paging())?;
        write_guest_tables(&vm.mem);
        let mut r = abi::LguestVcpuRegs::default();
        check_eq!(t::ioctl_ptr(&vm.f, abi::LGUEST_GET_REGS, &mut r), Ok(0), "GET_REGS");
        r.regs.rbx = path;
        check_eq!(t::ioctl_ptr(&vm.f, abi::LGUEST_SET_REGS, &mut r), Ok(0), "SET_REGS");
        check_eq!(vm.run(), Ok(0), "RUN");
        check_eq!(vm.exit_reason(), abi::LGUEST_EXIT_KILLED, format!("path {path}: exit ({})", vm.message()));
        check!(vm.message().contains(want), "path {path}: kill message {:?}, wanted {want:?}", vm.message());
        if path == 1 {
            check!(vm.message().contains("outside guest memory"), "path 1: {:?}", vm.message());
        }
    }
    Ok(())
}

// A guest for the ioeventfd test: RBX holds the device window's address
// (guest-physical = guest-virtual on the initial linear map). It kicks the
// address RBX+48 (the bus's first queue of device 0) 100 times, writes a
// marker into the device window, notifies RBX itself, then powers off.
core::arch::global_asm!(
    ".pushsection .rodata.lguest_guest_notify, \"a\"",
    ".globl lguest_guest_notify_start",
    ".globl lguest_guest_notify_end",
    "lguest_guest_notify_start:",
    "mov esp, 0x170000",
    "mov eax, 1",
    "mov edi, 0x180000",
    "int 0x1f",
    "mov ecx, 100",
    "2: mov eax, 17",
    "lea rdi, [rbx + 48]",
    "int 0x1f",
    "dec ecx",
    "jnz 2b",
    "mov qword ptr [rbx + 8], 0x5eed",
    "mov eax, 17",
    "mov rdi, rbx",
    "int 0x1f",
    "mov eax, 2",
    "mov edi, 0x181000",
    "mov esi, 1",
    "int 0x1f",
    "3: jmp 3b",
    "lguest_guest_notify_end:",
    ".popsection",
);

extern "C" {
    static lguest_guest_notify_start: u8;
    static lguest_guest_notify_end: u8;
}

/// The bytes of the ioeventfd guest.
fn guest_notify() -> Vec<u8> {
    // SAFETY: Both symbols delimit the bytes assembled above, in a
    // read-only section of this program.
    unsafe { blob(std::ptr::addr_of!(lguest_guest_notify_start), std::ptr::addr_of!(lguest_guest_notify_end)) }
}

/// LGUEST_IOEVENTFD: 100 kicks of a bound address signal the eventfd 100
/// times without one exit to userspace (the first RUN returns for the
/// unbound address after them); the device window is guest memory, mapped
/// linearly; bad arguments get their errors and the table is bounded.
fn ioeventfd_kicks() -> TestResult {
    let vm = TestVm::with_window(&guest_notify(), 1)?;
    let window = MEM as u64;
    let mut r = abi::LguestVcpuRegs::default();
    check_eq!(t::ioctl_ptr(&vm.f, abi::LGUEST_GET_REGS, &mut r), Ok(0), "GET_REGS");
    r.regs.rbx = window;
    check_eq!(t::ioctl_ptr(&vm.f, abi::LGUEST_SET_REGS, &mut r), Ok(0), "SET_REGS");
    // SAFETY: creating an eventfd has no preconditions.
    let efd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
    check!(efd >= 0, "eventfd: {}", t::errname(t::errno()));
    let mut req = abi::LguestIoeventfd { addr: window + 48, fd: efd, flags: 0 };
    check_eq!(t::ioctl_ptr(&vm.f, abi::LGUEST_IOEVENTFD, &mut req), Ok(0), "bind");
    check_eq!(t::ioctl_ptr(&vm.f, abi::LGUEST_IOEVENTFD, &mut req), Err(libc::EEXIST), "binding twice");
    let bad = [
        (abi::LguestIoeventfd { addr: window + 56, flags: 2, ..req }, libc::EINVAL, "unknown flag"),
        (abi::LguestIoeventfd { addr: window + 56, fd: -1, ..req }, libc::EINVAL, "fd -1"),
        (abi::LguestIoeventfd { addr: window + 56, fd: 999, ..req }, libc::EBADF, "closed fd"),
        (abi::LguestIoeventfd { addr: window + 56, fd: 0, ..req }, libc::EINVAL, "not an eventfd"),
        (abi::LguestIoeventfd { addr: 1 << 47, ..req }, libc::EINVAL, "address in the upper half"),
        (
            abi::LguestIoeventfd { addr: window + 56, flags: abi::LGUEST_IOEVENTFD_DEASSIGN, ..req },
            libc::ENOENT,
            "unbinding what is not bound",
        ),
    ];
    for (mut b, want, what) in bad {
        check_eq!(t::ioctl_ptr(&vm.f, abi::LGUEST_IOEVENTFD, &mut b), Err(want), what);
    }
    check_eq!(vm.run(), Ok(0), "RUN");
    check_eq!(vm.exit_reason(), abi::LGUEST_EXIT_NOTIFY, format!("first exit ({})", vm.message()));
    check_eq!(vm.run_page().read::<u64>(8), window, "the first exit is the unbound notification");
    let hypercalls: u64 = vm.run_page().read(40);
    check!(hypercalls >= 102, "only {hypercalls} hypercalls counted");
    let mut count = [0u8; 8];
    // SAFETY: reading 8 bytes into a valid buffer from our eventfd.
    let n = unsafe { libc::read(efd, count.as_mut_ptr().cast(), 8) };
    check_eq!(n, 8, "eventfd read");
    check_eq!(u64::from_ne_bytes(count), 100, "eventfd count after 100 kicks");
    check_eq!(vm.mem.read::<u64>(MEM + 8), 0x5eed, "the guest's write into the device window");
    check_eq!(vm.run(), Ok(0), "RUN");
    check_eq!(vm.exit_reason(), abi::LGUEST_EXIT_SHUTDOWN, format!("second exit ({})", vm.message()));
    // The table is bounded.
    req.flags = abi::LGUEST_IOEVENTFD_DEASSIGN;
    check_eq!(t::ioctl_ptr(&vm.f, abi::LGUEST_IOEVENTFD, &mut req), Ok(0), "unbind");
    for i in 0..abi::LGUEST_MAX_IOEVENTFDS as u64 {
        let mut b = abi::LguestIoeventfd { addr: window + 8 * i, fd: efd, flags: 0 };
        check_eq!(t::ioctl_ptr(&vm.f, abi::LGUEST_IOEVENTFD, &mut b), Ok(0), format!("binding {i}"));
    }
    let mut b = abi::LguestIoeventfd { addr: window + 4000, fd: efd, flags: 0 };
    check_eq!(t::ioctl_ptr(&vm.f, abi::LGUEST_IOEVENTFD, &mut b), Err(libc::ENOSPC), "one binding too many");
    // SAFETY: closing our own fd (the bindings keep their own references).
    unsafe { libc::close(efd) };
    Ok(())
}

// A guest kernel and its user program for the user-mode test. The kernel
// (at CODE) installs handlers for int 0x80, #PF and #GP, switches to its own
// page tables (at 0x300000, built by the test), sets its kernel stack and
// enters user mode at 0x110000 with RAX 7. Each handler reports what it saw
// with NOTIFY(tag, value): 0x80/0x81 the system call's RAX and frame CS,
// 0x8e/0x8f/0x90 a page fault's error code, CS and CR2, 0x8d a #GP's error
// code and RIP (then it powers off). The user program: two system calls, a
// read of a kernel page, a hypercall attempt.
core::arch::global_asm!(
    ".pushsection .rodata.lguest_guest_user, \"a\"",
    ".globl lguest_guest_user_start",
    ".globl lguest_guest_user_end",
    ".globl lguest_user_prog_start",
    ".globl lguest_user_prog_end",
    "lguest_guest_user_start:",
    "mov esp, 0x170000",
    "mov eax, 1",
    "mov edi, 0x180000",
    "int 0x1f",
    "mov eax, 6",
    "mov edi, 0x80",
    "lea rsi, [rip + lg_user_h80]",
    "mov edx, 0xf",
    "int 0x1f",
    "mov eax, 6",
    "mov edi, 14",
    "lea rsi, [rip + lg_user_h14]",
    "mov edx, 0xe",
    "int 0x1f",
    "mov eax, 6",
    "mov edi, 13",
    "lea rsi, [rip + lg_user_h13]",
    "mov edx, 0xe",
    "int 0x1f",
    "mov eax, 4",
    "mov edi, 0x300000",
    "int 0x1f",
    "mov eax, 7",
    "mov edi, 0x160000",
    "int 0x1f",
    "sub rsp, 32",
    "mov qword ptr [rsp], 7",
    "mov qword ptr [rsp + 8], 0x110000",
    "mov qword ptr [rsp + 16], 0x202",
    "mov qword ptr [rsp + 24], 0x121000",
    "mov eax, 20",
    "int 0x1f",
    "ud2",
    // int 0x80: frame [rip, cs, rflags, rsp, ss]
    "lg_user_h80:",
    "mov rbx, rax",
    "mov eax, 17",
    "mov edi, 0x80",
    "mov rsi, rbx",
    "int 0x1f",
    "mov eax, 17",
    "mov edi, 0x81",
    "mov rsi, [rsp + 8]",
    "int 0x1f",
    "mov rcx, [rsp]",
    "mov rdx, [rsp + 16]",
    "mov r8, [rsp + 24]",
    "sub rsp, 32",
    "lea r9, [rbx + 1]",
    "mov [rsp], r9",
    "mov [rsp + 8], rcx",
    "mov [rsp + 16], rdx",
    "mov [rsp + 24], r8",
    "mov eax, 20",
    "int 0x1f",
    "ud2",
    // #PF: frame [error, rip, cs, rflags, rsp, ss]; resume after the
    // faulting 8-byte instruction.
    "lg_user_h14:",
    "mov eax, 17",
    "mov edi, 0x8e",
    "mov rsi, [rsp]",
    "int 0x1f",
    "mov eax, 17",
    "mov edi, 0x8f",
    "mov rsi, [rsp + 16]",
    "int 0x1f",
    "mov eax, 17",
    "mov edi, 0x90",
    "mov rsi, [0x180010]",
    "int 0x1f",
    "mov rcx, [rsp + 8]",
    "add rcx, 8",
    "mov rdx, [rsp + 24]",
    "mov r8, [rsp + 32]",
    "sub rsp, 32",
    "mov qword ptr [rsp], 0",
    "mov [rsp + 8], rcx",
    "mov [rsp + 16], rdx",
    "mov [rsp + 24], r8",
    "mov eax, 20",
    "int 0x1f",
    "ud2",
    // #GP: report the error code and power off.
    "lg_user_h13:",
    "mov eax, 17",
    "mov edi, 0x8d",
    "mov rsi, [rsp]",
    "int 0x1f",
    "mov eax, 17",
    "mov edi, 0x8c",
    "mov rsi, [rsp + 8]",
    "int 0x1f",
    "mov eax, 2",
    "mov edi, 0x181000",
    "mov esi, 1",
    "int 0x1f",
    "ud2",
    "lguest_guest_user_end:",
    // The user program (at 0x110000).
    "lguest_user_prog_start:",
    "lea rax, [rax + 34]",
    "int 0x80",
    "int 0x80",
    "mov rax, qword ptr [0x180000]",
    "int 0x1f",
    "ud2",
    "lguest_user_prog_end:",
    ".popsection",
);

extern "C" {
    static lguest_guest_user_start: u8;
    static lguest_guest_user_end: u8;
    static lguest_user_prog_start: u8;
    static lguest_user_prog_end: u8;
}

/// Guest user mode: the guest kernel enters its user program with
/// IRET_USER (RAX from the frame), system calls with `int $0x80` arrive on
/// the kernel stack with CS = LGUEST_USER_CS and return with the kernel's
/// RAX, a user read of a supervisor page is a page fault with error U|P
/// (0x5) in the guest kernel, and a hypercall attempt from user mode is the
/// guest kernel's #GP (error 0xfa), never a hypercall.
fn user_mode() -> TestResult {
    // SAFETY: the symbols delimit the blobs assembled above.
    let (kernel, user) = unsafe {
        (
            blob(std::ptr::addr_of!(lguest_guest_user_start), std::ptr::addr_of!(lguest_guest_user_end)),
            blob(std::ptr::addr_of!(lguest_user_prog_start), std::ptr::addr_of!(lguest_user_prog_end)),
        )
    };
    let vm = user_vm(&kernel, &user)?;
    let notes = notes_to_shutdown(&vm)?;
    let cs = abi::LGUEST_USER_CS;
    let want = vec![
        (0x80, 41),
        (0x81, cs),
        (0x80, 42),
        (0x81, cs),
        (0x8e, 0x5),
        (0x8f, cs),
        (0x90, 0x18_0000),
        (0x8d, 0xfa),
        (0x8c, 0x11_0010),
    ];
    check_eq!(notes, want, "what the guest kernel saw");
    let shadow: u64 = vm.run_page().read(48);
    check!(shadow > 2 && shadow < 64, "shadow pages: {shadow}");
    Ok(())
}

/// Runs `vm` to its power-off (at most 16 exits), collecting the
/// (address, argument) of each NOTIFY on the way.
fn notes_to_shutdown(vm: &TestVm) -> Result<Vec<(u64, u64)>, t::NotPassed> {
    let mut notes = Vec::new();
    for _ in 0..16 {
        check_eq!(vm.run(), Ok(0), "RUN");
        if vm.exit_reason() != abi::LGUEST_EXIT_NOTIFY {
            break;
        }
        notes.push((vm.run_page().read::<u64>(8), vm.run_page().read::<u64>(16)));
    }
    check_eq!(vm.exit_reason(), abi::LGUEST_EXIT_SHUTDOWN, format!("exit after {notes:x?} ({})", vm.message()));
    Ok(notes)
}

/// A VM for the user-mode guest kernel `kernel` (at CODE) and its user
/// program `user` (at 0x110000), with the tables the kernel switches to
/// (at 0x300000): 1-2 MiB identity-mapped, supervisor-only but for the
/// user program's page (read-only) and its stack page (0x120000).
fn user_vm(kernel: &[u8], user: &[u8]) -> Result<TestVm, t::NotPassed> {
    let vm = TestVm::new(kernel)?;
    vm.mem.write(0x11_0000, user);
    const P: u64 = 1;
    const RW: u64 = 2;
    const US: u64 = 4;
    let (pml4, pdpt, pd, pt) = (0x30_0000u64, 0x30_1000u64, 0x30_2000u64, 0x30_3000u64);
    let e = |at: u64, v: u64| vm.mem.put::<u64>(at as usize, v);
    e(pml4, pdpt | P | RW | US);
    e(pdpt, pd | P | RW | US);
    e(pd, pt | P | RW | US);
    for page in 0x100u64..0x200 {
        let flags = match page {
            0x110 => P | US,
            0x120 => P | RW | US,
            _ => P | RW,
        };
        e(pt + 8 * page, (page << 12) | flags);
    }
    Ok(vm)
}

// A guest for the shadow teardown test: on its own tables (at 0x300000,
// built by the test: 2 MiB pages), it reads one word in each of 3000
// distinct 2 MiB regions (each costs the host one shadow page table),
// reports with NOTIFY(1), reads 2000 more (past the host's bound), reports
// with NOTIFY(2) and powers off.
core::arch::global_asm!(
    ".pushsection .rodata.lguest_guest_many, \"a\"",
    ".globl lguest_guest_many_start",
    ".globl lguest_guest_many_end",
    "lguest_guest_many_start:",
    "mov esp, 0x170000",
    "mov eax, 1",
    "mov edi, 0x180000",
    "int 0x1f",
    "mov eax, 4",
    "mov edi, 0x300000",
    "int 0x1f",
    "mov ecx, 1",
    "lg_many_1:",
    "mov rdx, rcx",
    "shl rdx, 21",
    "mov rax, [rdx]",
    "inc ecx",
    "cmp ecx, 3001",
    "jne lg_many_1",
    "mov eax, 17",
    "mov edi, 1",
    "int 0x1f",
    "lg_many_2:",
    "mov rdx, rcx",
    "shl rdx, 21",
    "mov rax, [rdx]",
    "inc ecx",
    "cmp ecx, 5001",
    "jne lg_many_2",
    "mov eax, 17",
    "mov edi, 2",
    "int 0x1f",
    "mov eax, 2",
    "mov edi, 0x181000",
    "mov esi, 1",
    "int 0x1f",
    "ud2",
    "lguest_guest_many_end:",
    ".popsection",
);

extern "C" {
    static lguest_guest_many_start: u8;
    static lguest_guest_many_end: u8;
}

/// Thousands of shadow page tables: a guest whose own tables map 5000
/// distinct 2 MiB regions touches them; the host's shadow grows to one
/// table per region (3000 and more, reported in the run page), stays under
/// its bound (4096 pages plus 4 per 2 MiB of guest memory: 4104 for this
/// 4 MiB guest) when the guest goes past it, and closing the VM
/// frees every page. The count is exact: the test runs in a memory cgroup of
/// its own, and the module charges its tables to it (`GFP_KERNEL_ACCOUNT`),
/// so the group's kernel memory rises by the tables while a VM lives and is
/// back where it was after 5 such VMs (a leak of the shadow would be
/// ~16 MiB per VM).
fn shadow_teardown() -> TestResult {
    // SAFETY: the symbols delimit the blob assembled above.
    let code = unsafe { blob(std::ptr::addr_of!(lguest_guest_many_start), std::ptr::addr_of!(lguest_guest_many_end)) };
    // Runs one VM; `alive` is called while it holds its 3000 tables.
    let one = |round: usize, alive: &mut dyn FnMut()| -> Result<(u64, u64), t::NotPassed> {
        let vm = TestVm::new(&code)?;
        const P: u64 = 1;
        const RW: u64 = 2;
        const PS: u64 = 0x80;
        let (pml4, pdpt) = (0x30_0000u64, 0x30_1000u64);
        let e = |at: u64, v: u64| vm.mem.put::<u64>(at as usize, v);
        e(pml4, pdpt | P | RW);
        for i in 0..10u64 {
            let pd = 0x30_2000 + i * 0x1000;
            e(pdpt + 8 * i, pd | P | RW);
            for j in 0..512u64 {
                // Region 0 is the guest itself (code, stack, data); every
                // other region is the same 2 MiB of RAM at 2 MiB.
                let frame = if i == 0 && j == 0 { 0 } else { 0x20_0000 };
                e(pd + 8 * j, frame | P | RW | PS);
            }
        }
        let mut seen = Vec::new();
        for _ in 0..3 {
            check_eq!(vm.run(), Ok(0), format!("round {round}: RUN"));
            if vm.exit_reason() != abi::LGUEST_EXIT_NOTIFY {
                break;
            }
            seen.push(vm.run_page().read::<u64>(48));
            if seen.len() == 1 {
                alive();
            }
        }
        check_eq!(vm.exit_reason(), abi::LGUEST_EXIT_SHUTDOWN, format!("round {round}: exit ({})", vm.message()));
        check_eq!(seen.len(), 2, format!("round {round}: reports"));
        Ok((seen[0], seen[1]))
    };
    let cg = match t::MemCgroup::enter("lguest_shadow_teardown") {
        Ok(cg) => cg,
        Err(why) => t::skip!("{why}"),
    };
    // Warm up once (slab caches, the switcher, this process's page tables),
    // then measure.
    let (after3000, after5000) = one(0, &mut || {})?;
    let bound = 4096 + 4 * (MEM as u64).div_ceil(2 << 20);
    println!("# shadow table pages: {after3000} after 3000 regions, {after5000} after 5000 (bound {bound})");
    check!((3000..bound).contains(&after3000), "after 3000 regions: {after3000} shadow pages");
    check!(after5000 <= bound, "after 5000 regions: {after5000} shadow pages, past the bound");
    let k0 = cg.kernel();
    let mut live = Vec::new();
    for round in 1..=5 {
        one(round, &mut || live.push(cg.kernel()))?;
    }
    // The group's statistics are flushed lazily (at most a couple of
    // seconds late): wait for the last frees to show.
    let mut k1 = cg.kernel();
    t::wait_for(std::time::Duration::from_secs(10), || {
        k1 = cg.kernel();
        k1 <= k0 + 2048
    });
    println!("# kernel memory of the test's cgroup: {k0} KiB, {live:?} KiB with a VM holding ~3000 tables, {k1} KiB after 5 VMs");
    // The measure sees the tables: 3000 pages are 12000 KiB (the figure may
    // lag by the statistics' per-CPU batches: 11788 KiB was seen once).
    for (round, k) in live.iter().enumerate() {
        check!(
            *k >= k0 + 10_000,
            "round {}: only {} KiB more kernel memory with 3000 shadow tables alive",
            round + 1,
            k.saturating_sub(k0)
        );
    }
    // And they are gone: a leak of one VM's tables would be ~16000 KiB; the
    // bound leaves room for the statistics' per-CPU batches (a few hundred
    // KiB) and slab pages of this process.
    check!(k1 <= k0 + 2048, "kernel memory grew by {} KiB over 5 VMs", k1 - k0);
    Ok(())
}

// A guest for the FPU state test: NOTIFY(1) before any FPU use; then its
// first FPU instruction (stmxcsr) and NOTIFY(2, MXCSR), NOTIFY(3, XMM1);
// loads R12 (set by the test) into XMM0 and the x87 stack, NOTIFY(4); then
// NOTIFY(5, XMM0) and NOTIFY(6, the x87 value) and powers off.
core::arch::global_asm!(
    ".pushsection .rodata.lguest_guest_fpu, \"a\"",
    ".globl lguest_guest_fpu_start",
    ".globl lguest_guest_fpu_end",
    "lguest_guest_fpu_start:",
    "mov esp, 0x170000",
    "mov eax, 1",
    "mov edi, 0x180000",
    "int 0x1f",
    "mov eax, 17",
    "mov edi, 1",
    "xor esi, esi",
    "int 0x1f",
    "stmxcsr [rsp - 8]",
    "mov esi, [rsp - 8]",
    "mov eax, 17",
    "mov edi, 2",
    "int 0x1f",
    "movq rsi, xmm1",
    "mov eax, 17",
    "mov edi, 3",
    "int 0x1f",
    "movq xmm0, r12",
    "mov [rsp - 8], r12",
    "shr qword ptr [rsp - 8], 1",
    "fild qword ptr [rsp - 8]",
    "mov eax, 17",
    "mov edi, 4",
    "xor esi, esi",
    "int 0x1f",
    "movq rsi, xmm0",
    "mov eax, 17",
    "mov edi, 5",
    "int 0x1f",
    "fistp qword ptr [rsp - 8]",
    "mov rsi, [rsp - 8]",
    "mov eax, 17",
    "mov edi, 6",
    "int 0x1f",
    "mov eax, 2",
    "mov edi, 0x181000",
    "mov esi, 1",
    "int 0x1f",
    "ud2",
    "lguest_guest_fpu_end:",
    ".popsection",
);

extern "C" {
    static lguest_guest_fpu_start: u8;
    static lguest_guest_fpu_end: u8;
}

/// The guest's FPU state is its own and survives exits: no FPU entry
/// before its first FPU instruction (`stat_fpu_entries` 0), the reset
/// state after it (MXCSR 0x1f80, XMM1 zero), and an XMM and an x87 value
/// kept across a return to the launcher while a second VM, on the same
/// CPU, loads other values into the same registers and this process
/// uses its own.
fn fpu_state() -> TestResult {
    // SAFETY: the symbols delimit the blob assembled above.
    let code = unsafe { blob(std::ptr::addr_of!(lguest_guest_fpu_start), std::ptr::addr_of!(lguest_guest_fpu_end)) };
    // This thread's CPUs: CPU 0 only for the test, all of them after.
    let pin = |cpus: std::ops::Range<usize>| {
        // SAFETY: a zeroed cpu_set_t with the given bits set, for this thread.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            for cpu in cpus {
                libc::CPU_SET(cpu, &mut set);
            }
            libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set)
        }
    };
    // Counted before pinning: afterwards it would say 1.
    let all = std::thread::available_parallelism().map_or(1, |n| n.get());
    check_eq!(pin(0..1), 0, "sched_setaffinity");
    let res = (|| -> TestResult {
        let a = TestVm::new(&code)?;
        let b = TestVm::new(&code)?;
        let notify = |vm: &TestVm, what: &str| -> Result<(u64, u64, u64), t::NotPassed> {
            check_eq!(vm.run(), Ok(0), format!("{what}: RUN"));
            check_eq!(vm.exit_reason(), abi::LGUEST_EXIT_NOTIFY, format!("{what}: exit ({})", vm.message()));
            let p = vm.run_page();
            Ok((p.read::<u64>(8), p.read::<u64>(16), p.read::<u64>(56)))
        };
        for (vm, value) in [(&a, 0x1122_3344_5566_7788u64), (&b, 0x99aa_bbcc_ddee_ff00)] {
            let mut r = abi::LguestVcpuRegs::default();
            check_eq!(t::ioctl_ptr(&vm.f, abi::LGUEST_GET_REGS, &mut r), Ok(0), "GET_REGS");
            r.regs.r12 = value;
            check_eq!(t::ioctl_ptr(&vm.f, abi::LGUEST_SET_REGS, &mut r), Ok(0), "SET_REGS");
        }
        let (n, _, fpu) = notify(&a, "A 1")?;
        check_eq!((n, fpu), (1, 0), "A: first report, FPU entries before any FPU use");
        let (n, mxcsr, _) = notify(&a, "A 2")?;
        check_eq!((n, mxcsr), (2, 0x1f80), "A: MXCSR at the first FPU use");
        let (n, xmm1, fpu) = notify(&a, "A 3")?;
        check_eq!((n, xmm1), (3, 0), "A: XMM1 at reset");
        check!(fpu >= 1, "A: {fpu} FPU entries after its first FPU instruction");
        check_eq!(notify(&a, "A 4")?.0, 4, "A: values loaded");
        // B loads its own values into the same registers on this CPU.
        for n in 1..=4 {
            check_eq!(notify(&b, &format!("B {n}"))?.0, n, "B");
        }
        let (n, xmm0, _) = notify(&a, "A 5")?;
        check_eq!((n, xmm0), (5, 0x1122_3344_5566_7788), "A: XMM0 after B ran");
        let (n, x87, _) = notify(&a, "A 6")?;
        check_eq!((n, x87), (6, 0x1122_3344_5566_7788 >> 1), "A: the x87 value after B ran");
        let (n, xmm0, _) = notify(&b, "B 5")?;
        check_eq!((n, xmm0), (5, 0x99aa_bbcc_ddee_ff00), "B: XMM0");
        check_eq!(a.run(), Ok(0), "A: RUN");
        check_eq!(a.exit_reason(), abi::LGUEST_EXIT_SHUTDOWN, "A: exit");
        Ok(())
    })();
    pin(0..all);
    res
}

// A guest for the shadow root cache test. Roots A (0x300000) and B
// (0x310000), built by the test, both map the guest (1-2 MiB) and a test
// region of 100 pages at 2 MiB through tables of their own (and the tables
// at 3 MiB). The guest
// touches the region under A, under B, under A again (reporting after each
// with NOTIFY(n)), then, still on A, points B's entry for 2 MiB at the page
// at 0x280000, tells the host with SET_PTE(B, ...), switches to B and
// reports what it reads there with NOTIFY(4, value).
core::arch::global_asm!(
    ".pushsection .rodata.lguest_guest_roots, \"a\"",
    ".globl lguest_guest_roots_start",
    ".globl lguest_guest_roots_end",
    "lguest_guest_roots_start:",
    "mov esp, 0x170000",
    "mov eax, 1",
    "mov edi, 0x180000",
    "int 0x1f",
    "mov r12d, 0x300000",
    "mov r13d, 0x310000",
    "mov r14d, 1",
    "lg_roots_round:",
    "mov eax, 4",
    "mov rdi, r12",
    "int 0x1f",
    "mov ecx, 0",
    "lg_roots_touch:",
    "mov rdx, rcx",
    "shl rdx, 12",
    "mov rax, [rdx + 0x200000]",
    "inc ecx",
    "cmp ecx, 100",
    "jne lg_roots_touch",
    "mov eax, 17",
    "mov rdi, r14",
    "int 0x1f",
    "xchg r12, r13",
    "inc r14d",
    "cmp r14d, 4",
    "jne lg_roots_round",
    // Now on A (r13 = A, r12 = B). B's entry for 2 MiB: in B's second page
    // table at 0x314000.
    "mov rdx, 0x280007",
    "mov [0x314000], rdx",
    "mov eax, 14",
    "mov rdi, r12",
    "mov esi, 0x200000",
    "int 0x1f",
    "mov eax, 4",
    "mov rdi, r12",
    "int 0x1f",
    "mov rsi, [0x200000]",
    "mov eax, 17",
    "mov edi, 4",
    "int 0x1f",
    "mov eax, 2",
    "mov edi, 0x181000",
    "mov esi, 1",
    "int 0x1f",
    "ud2",
    "lguest_guest_roots_end:",
    ".popsection",
);

extern "C" {
    static lguest_guest_roots_start: u8;
    static lguest_guest_roots_end: u8;
}

/// The cache of shadow roots: touching 100 pages costs about 100 exits the
/// first time under each root, and nearly none when the guest switches
/// back to a root the host still has; `SET_PTE` naming a root that is not
/// current still reaches that root's cached shadow.
fn shadow_root_cache() -> TestResult {
    // SAFETY: the symbols delimit the blob assembled above.
    let code =
        unsafe { blob(std::ptr::addr_of!(lguest_guest_roots_start), std::ptr::addr_of!(lguest_guest_roots_end)) };
    let vm = TestVm::new(&code)?;
    const P: u64 = 1;
    const RW: u64 = 2;
    let e = |at: u64, v: u64| vm.mem.put::<u64>(at as usize, v);
    for base in [0x30_0000u64, 0x31_0000] {
        let (pml4, pdpt, pd, pt1, pt2) = (base, base + 0x1000, base + 0x2000, base + 0x3000, base + 0x4000);
        e(pml4, pdpt | P | RW);
        e(pdpt, pd | P | RW);
        e(pd, pt1 | P | RW);
        e(pd + 8, pt2 | P | RW);
        for page in 0x100u64..0x200 {
            e(pt1 + 8 * page, (page << 12) | P | RW);
        }
        // The test region, and the tables themselves (at 3 MiB).
        for i in (0..100u64).chain(0x100..0x120) {
            e(pt2 + 8 * i, (0x20_0000 + (i << 12)) | P | RW);
        }
    }
    const MARKER: u64 = 0x0bad_cafe_f00d_0001;
    vm.mem.put::<u64>(0x20_0000, 0x1111);
    vm.mem.put::<u64>(0x28_0000, MARKER);
    let mut exits = vec![vm.run_page().read::<u64>(32)];
    let mut notes = Vec::new();
    for _ in 0..5 {
        check_eq!(vm.run(), Ok(0), "RUN");
        if vm.exit_reason() != abi::LGUEST_EXIT_NOTIFY {
            break;
        }
        notes.push((vm.run_page().read::<u64>(8), vm.run_page().read::<u64>(16)));
        exits.push(vm.run_page().read::<u64>(32));
    }
    check_eq!(vm.exit_reason(), abi::LGUEST_EXIT_SHUTDOWN, format!("exit after {notes:x?} ({})", vm.message()));
    check_eq!(notes.len(), 4, "reports");
    let cost: Vec<u64> = exits.windows(2).map(|w| w[1] - w[0]).collect();
    println!("# exits per round: A first {}, B first {}, A again {}", cost[0], cost[1], cost[2]);
    check!(cost[0] >= 100 && cost[1] >= 100, "first touches under each root: {cost:?} exits");
    check!(cost[2] <= 10, "touching again under a cached root took {} exits", cost[2]);
    check_eq!(notes[3], (4, MARKER), "B's remapped page after SET_PTE(B) from A");
    Ok(())
}

/// A VM built from a code blob: the file, its memory and its run page.
struct TestVm {
    f: File,
    mem: Mapping,
    run: Option<Mapping>,
}

fn config(mem: &Mapping, entry: u64) -> abi::LguestVmConfig {
    abi::LguestVmConfig {
        mem_base: mem.addr as u64,
        mem_size: mem.len as u64,
        device_pages: 0,
        entry,
        flags: 0,
        reserved0: 0,
        reserved: [0; 4],
    }
}

fn open() -> Result<File, t::NotPassed> {
    t::open_dev().map_err(|e| t::NotPassed::Fail(format!("open {}: {e}", t::DEV)))
}

impl TestVm {
    fn new(code: &[u8]) -> Result<Self, t::NotPassed> {
        Self::with_window(code, 0)
    }

    /// A VM with `device_pages` pages of device window above its RAM.
    fn with_window(code: &[u8], device_pages: u64) -> Result<Self, t::NotPassed> {
        let f = open()?;
        let len = MEM + device_pages as usize * 4096;
        let mem = Mapping::anon(len).map_err(|e| t::NotPassed::Fail(format!("mmap: {e}")))?;
        mem.write(CODE as usize, code);
        mem.write(MSG as usize, b"bye\0");
        let mut cfg = config(&mem, CODE);
        cfg.mem_size = MEM as u64;
        cfg.device_pages = device_pages;
        if let Err(e) = t::ioctl_ptr(&f, abi::LGUEST_CREATE_VM, &mut cfg) {
            fail!("CREATE_VM: {}", t::errname(e));
        }
        check_eq!(t::ioctl(&f, abi::LGUEST_CREATE_VCPU, 0), Ok(0), "CREATE_VCPU");
        let run = Mapping::shared(&f, 4096, 0)
            .map_err(|e| t::NotPassed::Fail(format!("mmap run page: {}", t::errname(e))))?;
        Ok(Self { f, mem, run: Some(run) })
    }

    fn run_page(&self) -> &Mapping {
        self.run.as_ref().expect("run page mapped in new()")
    }

    fn run(&self) -> Result<i32, i32> {
        t::ioctl(&self.f, abi::LGUEST_RUN, 0)
    }

    fn exit_reason(&self) -> u32 {
        self.run_page().read::<u32>(4)
    }

    fn message(&self) -> String {
        let mut s = Vec::new();
        for i in 0..abi::LGUEST_MESSAGE_LEN {
            let b: u8 = self.run_page().read(128 + i);
            if b == 0 {
                break;
            }
            s.push(b);
        }
        String::from_utf8_lossy(&s).into_owned()
    }
}

/// A guest that makes INIT, NOTIFY and SHUTDOWN: each exit as designed.
fn tiny_guest_runs() -> TestResult {
    let vm = TestVm::new(GUEST_OK)?;
    check_eq!(vm.run(), Ok(0), "first RUN");
    check_eq!(vm.exit_reason(), abi::LGUEST_EXIT_NOTIFY, "exit reason");
    check_eq!(vm.run_page().read::<u64>(8), MSG, "notify address");
    check_eq!(vm.run_page().read::<u64>(16), 0x42, "notify argument");
    check_eq!(vm.run(), Ok(0), "second RUN");
    check_eq!(vm.exit_reason(), abi::LGUEST_EXIT_SHUTDOWN, "exit reason");
    check_eq!(vm.run_page().read::<u64>(24), abi::LGUEST_SHUTDOWN_POWEROFF, "shutdown reason");
    check_eq!(vm.message(), "bye", "shutdown message");
    let hcalls: u64 = vm.run_page().read(40);
    check_eq!(hcalls, 3, "hypercall count");
    // The host wrote lguest_data: reserve_mem is the end of guest addresses.
    let reserve: u64 = vm.mem.read(DATA as usize + 2672);
    check_eq!(reserve, abi::GUEST_VA_END, "lguest_data.reserve_mem");
    // RIP advanced past the last int $0x1f.
    let mut regs = abi::LguestVcpuRegs::default();
    check_eq!(t::ioctl_ptr(&vm.f, abi::LGUEST_GET_REGS, &mut regs), Ok(0), "GET_REGS");
    check_eq!(regs.regs.rip, CODE + GUEST_OK.len() as u64 - 2, "rip after SHUTDOWN");
    Ok(())
}

/// An invalid hypercall kills the guest, for good.
fn killed_stays_dead() -> TestResult {
    let vm = TestVm::new(GUEST_BADCALL)?;
    for i in 0..3 {
        check_eq!(vm.run(), Ok(0), format!("RUN #{i}"));
        check_eq!(vm.exit_reason(), abi::LGUEST_EXIT_KILLED, format!("exit reason #{i}"));
        check!(vm.message().contains("bad hypercall 9999"), "kill message: {:?}", vm.message());
    }
    Ok(())
}

/// `immediate_exit` makes RUN return EINTR before the guest runs; cleared,
/// the guest continues where it was.
fn immediate_exit() -> TestResult {
    let vm = TestVm::new(GUEST_OK)?;
    vm.run_page().put::<u8>(0, 1);
    for _ in 0..100 {
        check_eq!(vm.run(), Err(libc::EINTR), "RUN with immediate_exit");
    }
    vm.run_page().put::<u8>(0, 0);
    check_eq!(vm.run(), Ok(0), "RUN");
    check_eq!(vm.exit_reason(), abi::LGUEST_EXIT_NOTIFY, "first exit after the kicks");
    Ok(())
}

/// Every malformed CREATE_VM is refused with EINVAL or EFAULT.
fn create_vm_validation() -> TestResult {
    let f = open()?;
    let mem = Mapping::anon(MEM).map_err(|e| t::NotPassed::Fail(format!("mmap: {e}")))?;
    let good = config(&mem, CODE);
    let cases: Vec<(&str, abi::LguestVmConfig, i32)> = vec![
        ("unaligned base", abi::LguestVmConfig { mem_base: good.mem_base + 1, ..good }, libc::EINVAL),
        ("zero size", abi::LguestVmConfig { mem_size: 0, ..good }, libc::EINVAL),
        ("size not a page multiple", abi::LguestVmConfig { mem_size: good.mem_size - 1, ..good }, libc::EINVAL),
        ("too much memory", abi::LguestVmConfig { mem_size: abi::LGUEST_MAX_MEM + 4096, ..good }, libc::EINVAL),
        ("too many device pages", abi::LguestVmConfig { device_pages: 1 << 40, ..good }, libc::EINVAL),
        ("entry below 1 MiB", abi::LguestVmConfig { entry: 0x1000, ..good }, libc::EINVAL),
        ("entry past RAM", abi::LguestVmConfig { entry: good.mem_size, ..good }, libc::EINVAL),
        ("unknown flag", abi::LguestVmConfig { flags: 1, ..good }, libc::EINVAL),
        ("reserved field", abi::LguestVmConfig { reserved: [0, 0, 1, 0], ..good }, libc::EINVAL),
        ("kernel address", abi::LguestVmConfig { mem_base: 0xffff_8880_0000_0000, ..good }, libc::EINVAL),
        ("wrapping size", abi::LguestVmConfig { mem_base: !0xfff, ..good }, libc::EINVAL),
        ("unmapped memory", abi::LguestVmConfig { mem_base: 0x7000_0000_0000, ..good }, libc::EFAULT),
    ];
    for (what, mut cfg, want) in cases {
        check_eq!(t::ioctl_ptr(&f, abi::LGUEST_CREATE_VM, &mut cfg), Err(want), what);
    }
    check_eq!(t::ioctl(&f, abi::LGUEST_CREATE_VM, 16), Err(libc::EFAULT), "argument pointer 16");
    let mut cfg = good;
    check_eq!(t::ioctl_ptr(&f, abi::LGUEST_CREATE_VM, &mut cfg), Ok(0), "valid CREATE_VM after the bad ones");
    check_eq!(t::ioctl_ptr(&f, abi::LGUEST_CREATE_VM, &mut cfg), Err(libc::EEXIST), "second CREATE_VM");
    Ok(())
}

/// Calls in the wrong order get ENOENT/EINVAL/EBUSY, mmaps of the wrong
/// shape EINVAL.
fn ordering_errors() -> TestResult {
    let f = open()?;
    let mut regs = abi::LguestVcpuRegs::default();
    check_eq!(t::ioctl(&f, abi::LGUEST_RUN, 0), Err(libc::ENOENT), "RUN before CREATE_VM");
    check_eq!(t::ioctl(&f, abi::LGUEST_CREATE_VCPU, 0), Err(libc::ENOENT), "CREATE_VCPU before CREATE_VM");
    check_eq!(t::ioctl_ptr(&f, abi::LGUEST_GET_REGS, &mut regs), Err(libc::ENOENT), "GET_REGS before CREATE_VM");
    check_eq!(Mapping::shared(&f, 4096, 0).err(), Some(libc::ENOENT), "mmap before CREATE_VM");
    let mem = Mapping::anon(MEM).map_err(|e| t::NotPassed::Fail(format!("mmap: {e}")))?;
    let mut cfg = config(&mem, CODE);
    check_eq!(t::ioctl_ptr(&f, abi::LGUEST_CREATE_VM, &mut cfg), Ok(0), "CREATE_VM");
    check_eq!(t::ioctl(&f, abi::LGUEST_RUN, 0), Err(libc::EINVAL), "RUN before CREATE_VCPU");
    check_eq!(Mapping::shared(&f, 4096, 0).err(), Some(libc::EINVAL), "mmap before CREATE_VCPU");
    check_eq!(t::ioctl(&f, abi::LGUEST_CREATE_VCPU, 0), Ok(0), "CREATE_VCPU");
    check_eq!(t::ioctl(&f, abi::LGUEST_CREATE_VCPU, 0), Err(libc::EBUSY), "second CREATE_VCPU");
    check_eq!(t::ioctl(&f, abi::LGUEST_RUN, 1), Err(libc::EINVAL), "RUN of vCPU 1");
    check_eq!(t::ioctl(&f, abi::LGUEST_RUN, usize::MAX), Err(libc::EINVAL), "RUN of vCPU ~0");
    check_eq!(Mapping::shared(&f, 8192, 0).err(), Some(libc::EINVAL), "mmap of two pages");
    check_eq!(Mapping::shared(&f, 4096, 4096).err(), Some(libc::EINVAL), "mmap of vCPU 1's page");
    check_eq!(Mapping::file(&f, 4096, 0, libc::MAP_PRIVATE).err(), Some(libc::EINVAL), "private mmap");
    regs.vcpu = 1;
    check_eq!(t::ioctl_ptr(&f, abi::LGUEST_GET_REGS, &mut regs), Err(libc::EINVAL), "GET_REGS of vCPU 1");
    regs.vcpu = 0;
    regs.pad = 1;
    check_eq!(t::ioctl_ptr(&f, abi::LGUEST_SET_REGS, &mut regs), Err(libc::EINVAL), "SET_REGS with pad set");
    check_eq!(t::ioctl(&f, abi::LGUEST_GET_REGS, 8), Err(libc::EFAULT), "GET_REGS to address 8");
    Ok(())
}

/// SET_REGS then GET_REGS: registers round-trip; IF stays on, IOPL 0.
fn regs_roundtrip() -> TestResult {
    let vm = TestVm::new(GUEST_OK)?;
    let mut r = abi::LguestVcpuRegs::default();
    check_eq!(t::ioctl_ptr(&vm.f, abi::LGUEST_GET_REGS, &mut r), Ok(0), "GET_REGS");
    check_eq!(r.regs.rip, CODE, "initial rip");
    check_eq!(r.regs.rflags, 0x202, "initial rflags");
    let mut w = r;
    w.regs.rax = 0x1111;
    w.regs.r15 = 0xf00d;
    w.regs.rsp = 0x20_0000;
    // IOPL 3, NT, RF, VM, IF off, DF and CF on.
    w.regs.rflags = 0x3000 | 0x4000 | 0x1_0000 | 0x2_0000 | 0x400 | 0x1;
    check_eq!(t::ioctl_ptr(&vm.f, abi::LGUEST_SET_REGS, &mut w), Ok(0), "SET_REGS");
    let mut back = abi::LguestVcpuRegs::default();
    check_eq!(t::ioctl_ptr(&vm.f, abi::LGUEST_GET_REGS, &mut back), Ok(0), "GET_REGS");
    check_eq!(back.regs.rax, 0x1111, "rax");
    check_eq!(back.regs.r15, 0xf00d, "r15");
    check_eq!(back.regs.rsp, 0x20_0000, "rsp");
    check_eq!(back.regs.rflags, 0x202 | 0x4000 | 0x400 | 0x1, "rflags (clamped; NT kept)");
    // The upper half is the guest's from GUEST_UPPER_START on: a kernel
    // RIP there is taken (upper_half has the rest); the guard hole below it
    // and non-canonical values are not.
    let mut upper = back;
    upper.regs.rip = 0xffff_ffff_8100_0000;
    upper.regs.rsp = 0xffff_8880_0000_0000;
    check_eq!(t::ioctl_ptr(&vm.f, abi::LGUEST_SET_REGS, &mut upper), Ok(0), "upper-half rip and rsp");
    check_eq!(t::ioctl_ptr(&vm.f, abi::LGUEST_SET_REGS, &mut back), Ok(0), "SET_REGS back");
    for (what, rip, rsp) in [
        ("non-canonical rip", 0x8000_0000_0000u64, 0x20_0000u64),
        ("guard-hole rip", 0xffff_8000_0000_1000, 0x20_0000),
        ("guard-hole rsp", CODE, 0xffff_87ff_ffff_f000),
    ] {
        let mut bad = back;
        bad.regs.rip = rip;
        bad.regs.rsp = rsp;
        check_eq!(t::ioctl_ptr(&vm.f, abi::LGUEST_SET_REGS, &mut bad), Err(libc::EINVAL), what);
    }
    // The guest still runs from the restored state.
    check_eq!(vm.run(), Ok(0), "RUN");
    check_eq!(vm.exit_reason(), abi::LGUEST_EXIT_NOTIFY, "exit reason");
    Ok(())
}

/// Only the process that created the VM may run it: a child that inherited
/// the file descriptor gets EPERM (guest memory is the creator's memory).
fn run_from_other_process() -> TestResult {
    let vm = TestVm::new(GUEST_OK)?;
    // SAFETY: fork() in a test; the child only makes an ioctl and _exits.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        let code = match vm.run() {
            Err(libc::EPERM) => 0,
            Ok(_) => 1,
            Err(_) => 2,
        };
        // SAFETY: ends the child without running destructors.
        unsafe { libc::_exit(code) };
    }
    let mut status = 0;
    // SAFETY: waiting for our own child.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    check_eq!(libc::WEXITSTATUS(status), 0, "child's RUN (0: EPERM, 1: ran, 2: other error)");
    check_eq!(vm.run(), Ok(0), "the creator's RUN");
    check_eq!(vm.exit_reason(), abi::LGUEST_EXIT_NOTIFY, "exit reason");
    Ok(())
}

/// Drops CAP_IPC_LOCK from the calling process's effective set.
fn drop_ipc_lock() -> bool {
    #[repr(C)]
    struct Header {
        version: u32,
        pid: i32,
    }
    #[repr(C)]
    #[derive(Clone, Copy, Default)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    const CAP_IPC_LOCK: u32 = 14;
    let mut h = Header { version: 0x2008_0522, pid: 0 };
    let mut d = [Data::default(); 2];
    // SAFETY: capget/capset with a valid header and two data words, as the
    // _LINUX_CAPABILITY_VERSION_3 ABI wants.
    unsafe {
        if libc::syscall(libc::SYS_capget, &mut h as *mut Header, d.as_mut_ptr()) != 0 {
            return false;
        }
        d[0].effective &= !(1 << CAP_IPC_LOCK);
        libc::syscall(libc::SYS_capset, &mut h as *mut Header, d.as_ptr()) == 0
    }
}

/// Pinned guest RAM is charged to the launcher's RLIMIT_MEMLOCK (for a
/// launcher without CAP_IPC_LOCK): a VM that does not fit gets ENOMEM, one
/// that fits is created, and closing it gives the charge back.
fn memlock_limit() -> TestResult {
    // SAFETY: fork() in a test; the child only makes syscalls and _exits.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        let code = (|| -> i32 {
            if !drop_ipc_lock() {
                return 10;
            }
            let lim = libc::rlimit { rlim_cur: 6 << 20, rlim_max: 6 << 20 };
            // SAFETY: setting our own limit with a valid struct.
            if unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &lim) } != 0 {
                return 11;
            }
            let Ok(a) = t::open_dev() else { return 12 };
            let Ok(big) = Mapping::anon(8 << 20) else { return 13 };
            let mut cfg = config(&big, CODE);
            if t::ioctl_ptr(&a, abi::LGUEST_CREATE_VM, &mut cfg) != Err(libc::ENOMEM) {
                return 1; // 8 MiB over a 6 MiB limit was not refused
            }
            let Ok(small) = Mapping::anon(MEM) else { return 13 };
            let mut cfg = config(&small, CODE);
            if t::ioctl_ptr(&a, abi::LGUEST_CREATE_VM, &mut cfg) != Ok(0) {
                return 2; // 4 MiB under the limit was refused
            }
            let Ok(b) = t::open_dev() else { return 12 };
            let Ok(small2) = Mapping::anon(MEM) else { return 13 };
            let mut cfg2 = config(&small2, CODE);
            if t::ioctl_ptr(&b, abi::LGUEST_CREATE_VM, &mut cfg2) != Err(libc::ENOMEM) {
                return 3; // a second 4 MiB VM (8 MiB in all) was not refused
            }
            drop(a);
            if t::ioctl_ptr(&b, abi::LGUEST_CREATE_VM, &mut cfg2) != Ok(0) {
                return 4; // closing the first VM did not give its charge back
            }
            0
        })();
        // SAFETY: ends the child without running destructors.
        unsafe { libc::_exit(code) };
    }
    let mut status = 0;
    // SAFETY: waiting for our own child.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    match libc::WEXITSTATUS(status) {
        0 => Ok(()),
        1 => fail!("a VM over RLIMIT_MEMLOCK was created"),
        2 => fail!("a VM under RLIMIT_MEMLOCK was refused"),
        3 => fail!("two VMs over RLIMIT_MEMLOCK together were allowed"),
        4 => fail!("closing a VM did not refund its locked memory"),
        c => fail!("the child could not set up the test (code {c})"),
    }
}

/// The launcher unmapping guest memory under a live VM, and mapping fresh
/// memory in its place, cannot make host and guest disagree: both go on
/// with the pages pinned at CREATE_VM (the guest completes, the host reads
/// its message from them), and the launcher's new memory sees none of it.
fn munmap_under_guest() -> TestResult {
    let mut vm = TestVm::new(GUEST_OK)?;
    let addr = vm.mem.addr;
    let run = vm.run.take();
    drop(std::mem::replace(&mut vm.mem, Mapping::anon(4096).map_err(|e| t::NotPassed::Fail(e.to_string()))?));
    vm.run = run;
    // Fresh zeroed memory where guest RAM was mapped.
    // SAFETY: mapping anonymous memory at an address range this test just
    // unmapped; it is unmapped again below.
    let fresh = unsafe {
        libc::mmap(
            addr.cast(),
            MEM,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
            -1,
            0,
        )
    };
    check!(fresh == addr.cast(), "mmap MAP_FIXED: {}", t::errname(t::errno()));
    let res = (|| -> TestResult {
        check_eq!(vm.run(), Ok(0), "RUN after munmap");
        check_eq!(vm.exit_reason(), abi::LGUEST_EXIT_NOTIFY, format!("exit reason ({})", vm.message()));
        check_eq!(vm.run_page().read::<u64>(16), 0x42, "notify argument");
        check_eq!(vm.run(), Ok(0), "second RUN");
        check_eq!(vm.exit_reason(), abi::LGUEST_EXIT_SHUTDOWN, "exit reason");
        // The host read the message from the pinned page, not the new one.
        check_eq!(vm.message(), "bye", "shutdown message");
        // And wrote lguest_data there: the new mapping saw nothing of it.
        // SAFETY: `fresh` maps MEM bytes, readable.
        let reserve = unsafe { fresh.cast::<u8>().add(DATA as usize + 2672).cast::<u64>().read_volatile() };
        check_eq!(reserve, 0, "lguest_data.reserve_mem in the launcher's new memory");
        Ok(())
    })();
    // SAFETY: unmapping what was mapped above.
    unsafe { libc::munmap(fresh, MEM) };
    res
}

/// 1000 create/run/destroy cycles leave the kernel memory charged to the
/// test (its own memory cgroup: run pages and shadow tables are charged to
/// the VM's creator) where it was, and the slab about where it was.
fn create_destroy_1000() -> TestResult {
    let cycle = |i: usize| -> TestResult {
        let vm = TestVm::new(GUEST_OK)?;
        check_eq!(vm.run(), Ok(0), format!("cycle {i}: RUN"));
        check_eq!(vm.run(), Ok(0), format!("cycle {i}: RUN"));
        check_eq!(vm.exit_reason(), abi::LGUEST_EXIT_SHUTDOWN, format!("cycle {i}: exit"));
        Ok(())
    };
    let cg = match t::MemCgroup::enter("lguest_create_destroy") {
        Ok(cg) => cg,
        Err(why) => t::skip!("{why}"),
    };
    for i in 0..20 {
        cycle(i)?;
    }
    let settle = || std::thread::sleep(std::time::Duration::from_millis(300));
    settle();
    let (k0, slab0) = (cg.kernel(), t::meminfo("Slab"));
    for i in 0..1000 {
        cycle(i)?;
    }
    // One leaked run page per VM would be 4000 KiB; one shadow table as
    // much again. The bound covers the statistics' per-CPU batches.
    let mut k1 = cg.kernel();
    t::wait_for(std::time::Duration::from_secs(10), || {
        k1 = cg.kernel();
        k1 <= k0 + 1024
    });
    let slab1 = t::meminfo("Slab");
    println!("# kernel memory of the test's cgroup {k0} -> {k1} KiB, Slab {slab0} -> {slab1} KiB over 1000 VMs");
    check!(k1 <= k0 + 1024, "kernel memory grew by {} KiB over 1000 VMs", k1 - k0);
    if t::debug_kernel() {
        // The debug kernel: KASAN's quarantine holds freed objects back, so
        // the slab figure means nothing there; kmemleak's scan at the end of
        // the run (the harness) checks the unaccounted objects.
        println!("# debug kernel: slab leaks are checked by kmemleak");
        return Ok(());
    }
    check!(slab1 <= slab0 + 1024, "Slab grew by {} KiB over 1000 VMs", slab1 - slab0);
    Ok(())
}

/// CPU time (user + system, in clock ticks) of thread `tid` of this process.
fn thread_ticks(tid: i32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).unwrap_or_default();
    let after = stat.rsplit(')').next().unwrap_or("");
    let f: Vec<&str> = after.split_whitespace().collect();
    // Fields 14 and 15 of the file; `after` starts at field 3.
    f.get(11).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0)
        + f.get(12).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0)
}

/// A halted guest sleeps without using the CPU; LGUEST_IRQ from another
/// thread wakes it and the interrupt reaches its handler.
fn halt_sleeps_irq_wakes() -> TestResult {
    let vm = TestVm::new(&guest_halt_irq1())?;
    let tid = std::sync::atomic::AtomicI32::new(0);
    let outcome = std::thread::scope(|s| {
        let runner = s.spawn(|| {
            // SAFETY: gettid has no preconditions.
            tid.store(unsafe { libc::gettid() }, std::sync::atomic::Ordering::SeqCst);
            vm.run()
        });
        // Measure from when the RUN thread sleeps (a guessed delay would
        // measure the start on a slow machine).
        let asleep = t::wait_for(std::time::Duration::from_secs(30), || {
            let t = tid.load(std::sync::atomic::Ordering::SeqCst);
            t != 0 && thread_state(t) == 'S'
        });
        let t = tid.load(std::sync::atomic::Ordering::SeqCst);
        let before = thread_ticks(t);
        std::thread::sleep(std::time::Duration::from_millis(2000));
        let used = thread_ticks(t) - before;
        let still_running = !runner.is_finished();
        let raised = t::ioctl(&vm.f, abi::LGUEST_IRQ, 1);
        let r = runner.join();
        (used, still_running && asleep, raised, r)
    });
    let (used, still_running, raised, r) = outcome;
    check!(still_running, "RUN returned (or never slept) while the guest should be halted");
    println!("# halted for 2 s using {used} clock ticks of CPU");
    // 5% of 2 s is 10 ticks at USER_HZ 100.
    check!(used <= 10, "a halted guest used {used} ticks (over 5% of a CPU) in 2 s");
    check_eq!(raised, Ok(0), "LGUEST_IRQ 1");
    check_eq!(r.ok(), Some(Ok(0)), "RUN");
    check_eq!(vm.exit_reason(), abi::LGUEST_EXIT_SHUTDOWN, "exit after the interrupt");
    check_eq!(vm.message(), "bye", "the handler's shutdown message");
    check_eq!(t::ioctl(&vm.f, abi::LGUEST_IRQ, 64), Err(libc::EINVAL), "LGUEST_IRQ 64");
    Ok(())
}

/// An eventfd bound with LGUEST_IRQFD raises the interrupt when written:
/// the halted guest wakes without the launcher raising anything itself.
/// Binding errors: bad IRQ, bad fd, not an eventfd, duplicate, unknown.
fn irqfd_wakes_halted_guest() -> TestResult {
    let vm = TestVm::new(&guest_halt_irq1())?;
    // SAFETY: creating an eventfd has no preconditions.
    let efd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
    check!(efd >= 0, "eventfd: {}", t::errname(t::errno()));
    let mut req = abi::LguestIrqfd { fd: efd, irq: 1, flags: 0, pad: 0 };
    check_eq!(t::ioctl_ptr(&vm.f, abi::LGUEST_IRQFD, &mut req), Ok(0), "LGUEST_IRQFD bind");
    check_eq!(t::ioctl_ptr(&vm.f, abi::LGUEST_IRQFD, &mut req), Err(libc::EEXIST), "binding twice");
    let bad = [
        (abi::LguestIrqfd { irq: 64, ..req }, libc::EINVAL, "IRQ 64"),
        (abi::LguestIrqfd { flags: 2, ..req }, libc::EINVAL, "unknown flag"),
        (abi::LguestIrqfd { pad: 1, ..req }, libc::EINVAL, "pad"),
        (abi::LguestIrqfd { fd: 999, ..req }, libc::EBADF, "closed fd"),
        (abi::LguestIrqfd { fd: 0, irq: 2, ..req }, libc::EINVAL, "not an eventfd (stdin)"),
        (
            abi::LguestIrqfd { irq: 2, flags: abi::LGUEST_IRQFD_DEASSIGN, ..req },
            libc::ENOENT,
            "unbinding what is not bound",
        ),
    ];
    for (mut r, want, what) in bad {
        check_eq!(t::ioctl_ptr(&vm.f, abi::LGUEST_IRQFD, &mut r), Err(want), what);
    }
    let r = std::thread::scope(|s| {
        let runner = s.spawn(|| vm.run());
        std::thread::sleep(std::time::Duration::from_millis(500));
        let halted = !runner.is_finished();
        let one = 1u64.to_ne_bytes();
        // SAFETY: writing 8 bytes from a valid buffer to our eventfd.
        let w = unsafe { libc::write(efd, one.as_ptr().cast(), 8) };
        (halted, w, runner.join())
    });
    let (halted, w, run) = r;
    check!(halted, "the guest did not stay halted");
    check_eq!(w, 8, "eventfd write");
    check_eq!(run.ok(), Some(Ok(0)), "RUN");
    check_eq!(vm.exit_reason(), abi::LGUEST_EXIT_SHUTDOWN, "exit after the eventfd");
    req.flags = abi::LGUEST_IRQFD_DEASSIGN;
    check_eq!(t::ioctl_ptr(&vm.f, abi::LGUEST_IRQFD, &mut req), Ok(0), "unbind");
    check_eq!(t::ioctl_ptr(&vm.f, abi::LGUEST_IRQFD, &mut req), Err(libc::ENOENT), "unbind again");
    // SAFETY: closing our own fd.
    unsafe { libc::close(efd) };
    Ok(())
}

/// An eventfd signalled before it is bound raises its interrupt at bind
/// time (the count is consumed under the eventfd's lock: the debug kernel's
/// lockdep checks that): the guest's HALT returns at once.
fn irqfd_signalled_before_bind() -> TestResult {
    let vm = TestVm::new(&guest_halt_irq1())?;
    // SAFETY: creating an eventfd has no preconditions.
    let efd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
    check!(efd >= 0, "eventfd: {}", t::errname(t::errno()));
    let one = 1u64.to_ne_bytes();
    // SAFETY: writing 8 bytes from a valid buffer to our eventfd.
    check_eq!(unsafe { libc::write(efd, one.as_ptr().cast(), 8) }, 8, "eventfd write");
    let mut req = abi::LguestIrqfd { fd: efd, irq: 1, flags: 0, pad: 0 };
    check_eq!(t::ioctl_ptr(&vm.f, abi::LGUEST_IRQFD, &mut req), Ok(0), "LGUEST_IRQFD bind");
    check_eq!(vm.run(), Ok(0), "RUN");
    check_eq!(vm.exit_reason(), abi::LGUEST_EXIT_SHUTDOWN, "exit (the interrupt raised at bind)");
    // The count was consumed: a read would block.
    let mut buf = [0u8; 8];
    // SAFETY: non-blocking read into a valid buffer from our eventfd.
    let r = unsafe {
        libc::fcntl(efd, libc::F_SETFL, libc::O_NONBLOCK);
        libc::read(efd, buf.as_mut_ptr().cast(), 8)
    };
    check_eq!(r, -1, "reading the consumed eventfd");
    // SAFETY: closing our own fd.
    unsafe { libc::close(efd) };
    Ok(())
}

static KICK_BYTE: std::sync::atomic::AtomicPtr<u8> = std::sync::atomic::AtomicPtr::new(std::ptr::null_mut());

extern "C" fn kick_handler(_sig: i32) {
    let p = KICK_BYTE.load(std::sync::atomic::Ordering::SeqCst);
    if !p.is_null() {
        // SAFETY: `p` is the run page's immediate_exit byte, mapped for the
        // whole test; a volatile byte store is async-signal-safe.
        unsafe { p.write_volatile(1) };
    }
}

/// 100000 kicks from another thread: each ends exactly one RUN with EINTR
/// (none lost: RUN would spin forever; none spurious: every EINTR follows
/// its own kick). The kick is a signal whose handler sets immediate_exit;
/// no signal masks are touched.
fn kicks_100000() -> TestResult {
    use std::sync::atomic::{AtomicI32, AtomicU64, Ordering::SeqCst};
    const N: u64 = 100_000;
    let vm = TestVm::new(GUEST_SPIN)?;
    KICK_BYTE.store(vm.run_page().addr, SeqCst);
    // SAFETY: installing a handler that only does a volatile store.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = kick_handler as *const () as usize;
        sa.sa_flags = 0; // no SA_RESTART: RUN must return EINTR
        libc::sigaction(libc::SIGUSR1, &sa, std::ptr::null_mut());
    }
    let sent = AtomicU64::new(0);
    let done = AtomicU64::new(0);
    let runner_tid = AtomicI32::new(0);
    let pthread = std::sync::atomic::AtomicU64::new(0);
    let result: Result<(), String> = std::thread::scope(|s| {
        let runner = s.spawn(|| -> Result<(), String> {
            // SAFETY: gettid/pthread_self have no preconditions.
            unsafe {
                runner_tid.store(libc::gettid(), SeqCst);
                pthread.store(libc::pthread_self() as u64, SeqCst);
            }
            for i in 0..N {
                let r = vm.run();
                if r != Err(libc::EINTR) {
                    return Err(format!("RUN #{i} returned {r:?}, expected EINTR"));
                }
                if sent.load(SeqCst) != i + 1 {
                    return Err(format!("RUN #{i} ended with EINTR but kick #{i} was not sent yet (spurious)"));
                }
                vm.run_page().put::<u8>(0, 0);
                done.store(i + 1, SeqCst);
            }
            Ok(())
        });
        while pthread.load(SeqCst) == 0 {
            std::hint::spin_loop();
        }
        let th = pthread.load(SeqCst) as libc::pthread_t;
        let mut err = None;
        for i in 0..N {
            sent.store(i + 1, SeqCst);
            // SAFETY: signalling a live thread of ours.
            unsafe { libc::pthread_kill(th, libc::SIGUSR1) };
            let t0 = std::time::Instant::now();
            while done.load(SeqCst) < i + 1 && !runner.is_finished() {
                if t0.elapsed() > std::time::Duration::from_secs(10) {
                    err = Some(format!("kick #{i} was lost: RUN did not return within 10 s"));
                    break;
                }
                std::hint::spin_loop();
            }
            if err.is_some() || runner.is_finished() {
                break;
            }
        }
        if err.is_some() {
            // Free the runner: keep kicking until it gives up.
            while !runner.is_finished() {
                // SAFETY: as above.
                unsafe { libc::pthread_kill(th, libc::SIGUSR1) };
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        }
        let r = runner.join().map_err(|_| "runner panicked".to_string()).and_then(|r| r);
        match err {
            Some(e) => Err(e),
            None => r,
        }
    });
    KICK_BYTE.store(std::ptr::null_mut(), SeqCst);
    let _ = runner_tid;
    if let Err(e) = result {
        fail!("{e}");
    }
    check_eq!(done.load(SeqCst), N, "RUNs ended by kicks");
    println!("# {N} kicks, {N} RUNs ended with EINTR");
    Ok(())
}

// A guest for the tests of the last guest page. It registers lguest_data,
// switches to the page tables the test wrote at 0x300000, then by R12:
// 0 jumps to RBX, 1 makes LOAD_IDT_ENTRY(6, R13), 2 SET_STACK(R13).
core::arch::global_asm!(
    ".pushsection .rodata.lguest_guest_top, \"a\"",
    ".globl lguest_guest_top_start",
    ".globl lguest_guest_top_end",
    "lguest_guest_top_start:",
    "mov esp, 0x1f0000",
    "mov eax, 1",
    "mov edi, 0x180000",
    "int 0x1f",
    "mov eax, 4",
    "mov edi, 0x300000",
    "int 0x1f",
    "cmp r12, 1",
    "je 31f",
    "cmp r12, 2",
    "je 32f",
    "jmp rbx",
    "31: mov eax, 6",
    "mov edi, 6",
    "mov rsi, r13",
    "mov edx, 0xe",
    "int 0x1f",
    "jmp 39f",
    "32: mov eax, 7",
    "mov rdi, r13",
    "int 0x1f",
    "39: jmp 39b",
    "lguest_guest_top_end:",
    ".popsection",
);

extern "C" {
    static lguest_guest_top_start: u8;
    static lguest_guest_top_end: u8;
}

fn guest_top() -> Vec<u8> {
    // SAFETY: Both symbols delimit the bytes assembled above.
    unsafe { blob(std::ptr::addr_of!(lguest_guest_top_start), std::ptr::addr_of!(lguest_guest_top_end)) }
}

/// The last page a guest may use, and the one above it that it may not.
const LAST_PAGE: u64 = abi::GUEST_VA_END - 4096;
/// Guest frames behind them in the top-page tests.
const FRAME_LAST: u64 = 0x21_0000;
const FRAME_TOP: u64 = 0x21_1000;

/// The start of the page tables at 0x300000 that several tests build:
/// top level 0x300000, then 0x301000, 0x302000 and the page table 0x303000,
/// which maps 1-2 MiB (code, data, stack) at virtual = physical.
fn write_low_tables(mem: &Mapping) {
    let e = |at: u64, v: u64| mem.put::<u64>(at as usize, v);
    const P: u64 = 1;
    const RW: u64 = 2;
    let (pml4, pdpt, pd, pt) = (0x30_0000u64, 0x30_1000u64, 0x30_2000u64, 0x30_3000u64);
    e(pml4, pdpt | P | RW);
    e(pdpt, pd | P | RW);
    e(pd, pt | P | RW);
    for page in 0x100u64..0x200 {
        e(pt + 8 * page, (page << 12) | P | RW);
    }
}

/// Page tables at 0x300000: 1-2 MiB identity-mapped (code, data, stack),
/// and the two highest lower-half pages mapped to FRAME_LAST and FRAME_TOP
/// (the guest's own tables may say so; the host must not map the top one).
fn write_top_tables(mem: &Mapping) {
    let e = |at: u64, v: u64| mem.put::<u64>(at as usize, v);
    const P: u64 = 1;
    const RW: u64 = 2;
    let pml4 = 0x30_0000u64;
    let (pdpt_hi, pd_hi, pt_hi) = (0x30_4000u64, 0x30_5000u64, 0x30_6000u64);
    write_low_tables(mem);
    e(pml4 + 8 * 255, pdpt_hi | P | RW);
    e(pdpt_hi + 8 * 511, pd_hi | P | RW);
    e(pd_hi + 8 * 511, pt_hi | P | RW);
    e(pt_hi + 8 * 510, FRAME_LAST | P | RW);
    e(pt_hi + 8 * 511, FRAME_TOP | P | RW);
}

/// NOTIFY(MSG, 0x77) as bytes: mov $17, %eax; mov $MSG, %edi; mov $0x77,
/// %esi; int $0x1f.
const NOTIFY_77: &[u8] =
    &[0xb8, 0x11, 0x00, 0x00, 0x00, 0xbf, 0x00, 0x10, 0x18, 0x00, 0xbe, 0x77, 0x00, 0x00, 0x00, 0xcd, 0x1f];

/// No register the launcher can read holds a host kernel address.
fn no_host_address(vm: &TestVm, what: &str) -> TestResult {
    let mut r = abi::LguestVcpuRegs::default();
    check_eq!(t::ioctl_ptr(&vm.f, abi::LGUEST_GET_REGS, &mut r), Ok(0), format!("{what}: GET_REGS"));
    let g = r.regs;
    for (name, v) in [
        ("rax", g.rax),
        ("rbx", g.rbx),
        ("rcx", g.rcx),
        ("rdx", g.rdx),
        ("rsi", g.rsi),
        ("rdi", g.rdi),
        ("rbp", g.rbp),
        ("r8", g.r8),
        ("r9", g.r9),
        ("r10", g.r10),
        ("r11", g.r11),
        ("r12", g.r12),
        ("r13", g.r13),
        ("r14", g.r14),
        ("r15", g.r15),
        ("rip", g.rip),
        ("rsp", g.rsp),
    ] {
        check!(v < 1 << 47, "{what}: {name} = {v:#x}, not a guest value");
    }
    Ok(())
}

/// A top-page VM: the guest above, its tables, `code` placed so that it
/// ends at guest-virtual `end`, and R12/R13 set.
fn top_vm(code: &[u8], end: u64, r12: u64, r13: u64) -> Result<TestVm, t::NotPassed> {
    let vm = TestVm::new(&guest_top())?;
    write_top_tables(&vm.mem);
    let start = end - code.len() as u64;
    let frame = if start >= abi::GUEST_VA_END {
        FRAME_TOP + (start - abi::GUEST_VA_END)
    } else {
        FRAME_LAST + (start - LAST_PAGE)
    };
    vm.mem.write(frame as usize, code);
    let mut r = abi::LguestVcpuRegs::default();
    check_eq!(t::ioctl_ptr(&vm.f, abi::LGUEST_GET_REGS, &mut r), Ok(0), "GET_REGS");
    r.regs.rbx = start;
    r.regs.r12 = r12;
    r.regs.r13 = r13;
    check_eq!(t::ioctl_ptr(&vm.f, abi::LGUEST_SET_REGS, &mut r), Ok(0), "SET_REGS");
    Ok(vm)
}

/// Runs `vm` until it is killed (at most `runs` RUNs) and returns the kill
/// message and the NOTIFY arguments seen on the way.
fn run_to_kill(vm: &TestVm, runs: usize) -> Result<(String, Vec<u64>), t::NotPassed> {
    let mut notes = Vec::new();
    for _ in 0..runs {
        check_eq!(vm.run(), Ok(0), "RUN");
        match vm.exit_reason() {
            abi::LGUEST_EXIT_NOTIFY => notes.push(vm.run_page().read::<u64>(16)),
            abi::LGUEST_EXIT_KILLED => return Ok((vm.message(), notes)),
            r => fail!("exit reason {r} ({}), notes {notes:x?}", vm.message()),
        }
    }
    fail!("not killed after {runs} runs (notes {notes:x?})")
}

/// The last page below the canonical limit is never the guest's: code
/// there, a hypercall, a trap or a fault in the last bytes below
/// GUEST_VA_END, or a handler or stack beyond it, end with the guest killed
/// for a reason (here, a guest without handlers: the fetch at the end is
/// its page fault), never with the host entering it at a non-canonical
/// address (which on hardware faults in ring 0, in the switcher), and no
/// register the launcher reads holds a host address.
fn last_guest_page() -> TestResult {
    let end = abi::GUEST_VA_END;
    // (code, where it ends, r12, r13, the kill reason wanted, NOTIFYs wanted)
    type Case<'a> = (&'a [u8], u64, u64, u64, &'a str, &'a [u64]);
    let cases: [Case; 8] = [
        // A hypercall in the last two bytes: it is made, then RIP is the
        // end, never mapped: the fetch there faults in ring 3.
        (NOTIFY_77, end, 0, 0, "page fault at 0x7ffffffff000 (error 0x10)", &[0x77]),
        // The same code in the top page: that page is never mapped.
        (NOTIFY_77, 1 << 47, 0, 0, "page fault at 0x7fffffffffef (error 0x10)", &[]),
        // ud2, int3 and a faulting load in the last bytes.
        (&[0x0f, 0x0b], end, 0, 0, "#UD invalid opcode", &[]),
        (&[0xcc], end, 0, 0, "#BP breakpoint", &[]),
        (&[0x48, 0x8b, 0x04, 0x25, 0, 0, 0, 0], end, 0, 0, "page fault at 0x0 ", &[]),
        // Falling off the last page into the top one.
        (&[0x90; 64], end, 0, 0, "", &[]),
        // An IDT handler and a kernel stack beyond the last page.
        (&[], end, 1, end, "LOAD_IDT_ENTRY: handler 0x7ffffffff000", &[]),
        (&[], end, 2, end + 16, "SET_STACK: bad kernel stack", &[]),
    ];
    for (i, (code, at, r12, r13, want, notes_wanted)) in cases.iter().enumerate() {
        let vm = top_vm(code, *at, *r12, *r13)?;
        let (msg, notes) = run_to_kill(&vm, 4)?;
        println!("# case {i}: killed: {msg}");
        if want.is_empty() {
            // Falling off: the fetch at the end faults.
            check!(msg.contains("page fault at 0x7ffffffff000"), "case {i}: kill message {msg:?}");
        } else {
            check!(msg.contains(want), "case {i}: kill message {msg:?}, wanted {want:?}");
        }
        check_eq!(&notes[..], *notes_wanted, format!("case {i}: NOTIFY arguments"));
        no_host_address(&vm, &format!("case {i}"))?;
    }
    // SET_REGS never lets the launcher put the guest there either.
    let vm = TestVm::new(GUEST_OK)?;
    for (rip, rsp, ok) in [
        (end - 1, 0x17_0000, true),
        (end, 0x17_0000, false),
        (1 << 47, 0x17_0000, false),
        (0xffff_8000_0000_0000, 0x17_0000, false),
        (CODE, end, true),
        (CODE, end + 8, false),
        (CODE, 1 << 47, false),
    ] {
        let mut r = abi::LguestVcpuRegs::default();
        check_eq!(t::ioctl_ptr(&vm.f, abi::LGUEST_GET_REGS, &mut r), Ok(0), "GET_REGS");
        r.regs.rip = rip;
        r.regs.rsp = rsp;
        let got = t::ioctl_ptr(&vm.f, abi::LGUEST_SET_REGS, &mut r);
        check_eq!(got.is_ok(), ok, format!("SET_REGS rip {rip:#x} rsp {rsp:#x}: {got:?}"));
        if !ok {
            check_eq!(got, Err(libc::EINVAL), format!("SET_REGS rip {rip:#x} rsp {rsp:#x}"));
        }
    }
    Ok(())
}

// A guest for the upper-half test, on the tables `write_upper_tables`
// makes at 0x300000. It reports NOTIFY(1) at its low address, jumps to its
// alias in the top 2 GiB (stack too) and reports NOTIFY(its RIP there),
// writes a word through the top alias and reads it back through the low
// one (NOTIFY(it)), reads it through the lowest upper-half alias a guest
// may use, GUEST_UPPER_START (NOTIFY(it)), takes int3 into a handler at its
// top alias (NOTIFY(0x33)), and last reads through the guard hole, which
// its own tables map too: never for the guest, so it is killed for a
// not-present page fault there.
core::arch::global_asm!(
    ".pushsection .rodata.lguest_guest_upper, \"a\"",
    ".globl lguest_guest_upper_start",
    ".globl lguest_guest_upper_end",
    "lguest_guest_upper_start:",
    "mov esp, 0x1f0000",
    "mov eax, 1",
    "mov edi, 0x180000",
    "int 0x1f",
    "mov eax, 4",
    "mov edi, 0x300000",
    "int 0x1f",
    "mov eax, 17",
    "mov edi, 0x181000",
    "mov esi, 1",
    "int 0x1f",
    "movabs rcx, 0xffffffff80000000",
    "lea rax, [rip + 2f]",
    "add rax, rcx",
    "jmp rax",
    "2: add rsp, rcx",
    "lea rsi, [rip]",
    "mov eax, 17",
    "mov edi, 0x181000",
    "int 0x1f",
    "movabs rdx, 0xffffffff801c0000",
    "mov qword ptr [rdx], 0x5a5a",
    "mov rsi, qword ptr [0x1c0000]",
    "mov eax, 17",
    "mov edi, 0x181000",
    "int 0x1f",
    "movabs rdx, 0xffff8800001c0000",
    "mov rsi, qword ptr [rdx]",
    "mov eax, 17",
    "mov edi, 0x181000",
    "int 0x1f",
    "lea rsi, [rip + 5f]",
    "mov eax, 6",
    "mov edi, 3",
    "mov edx, 0xe",
    "int 0x1f",
    "int3",
    "3: jmp 3b",
    "5: mov eax, 17",
    "mov edi, 0x181000",
    "mov esi, 0x33",
    "int 0x1f",
    "movabs rdx, 0xffff8000001c0000",
    "mov rsi, qword ptr [rdx]",
    "4: jmp 4b",
    "lguest_guest_upper_end:",
    ".popsection",
);

extern "C" {
    static lguest_guest_upper_start: u8;
    static lguest_guest_upper_end: u8;
}

/// The top 2 GiB alias of the upper-half test: guest-virtual minus
/// guest-physical.
const UPPER_ALIAS: u64 = 0xffff_ffff_8000_0000;
/// The guard hole's first address, and the lowest upper-half one a guest
/// may use.
const GUARD_HOLE: u64 = 0xffff_8000_0000_0000;

/// Page tables at 0x300000: 1-2 MiB identity-mapped (code, data, stack),
/// and the same pages (one page table) at UPPER_ALIAS + their address, in
/// the guard hole (GUARD_HOLE + their address) and at GUEST_UPPER_START +
/// their address.
fn write_upper_tables(mem: &Mapping) {
    let e = |at: u64, v: u64| mem.put::<u64>(at as usize, v);
    const P: u64 = 1;
    const RW: u64 = 2;
    let (pml4, pdpt, pt) = (0x30_0000u64, 0x30_1000u64, 0x30_3000u64);
    let (pdpt_hi, pd_hi, pdpt_hole, pd_hole) = (0x30_4000u64, 0x30_5000u64, 0x30_6000u64, 0x30_7000u64);
    write_low_tables(mem);
    e(pml4 + 8 * 511, pdpt_hi | P | RW);
    e(pdpt_hi + 8 * 510, pd_hi | P | RW);
    e(pd_hi, pt | P | RW);
    e(pml4 + 8 * 256, pdpt_hole | P | RW);
    e(pdpt_hole, pd_hole | P | RW);
    e(pd_hole, pt | P | RW);
    e(pml4 + 8 * 272, pdpt | P | RW);
}

/// A guest kernel in the upper half: it runs, takes a trap into a handler
/// and reads and writes memory in the top 2 GiB, where every x86-64 kernel
/// is linked (and where the host's own kernel is: the switcher is not
/// there but in the guard hole), and at the lowest upper-half address it
/// may use; from its first upper-half mapping on, every entry flushes the
/// host's global TLB entries (counted in the run page); the guard hole is
/// never mapped for it, whatever its tables say, and neither a handler,
/// a kernel stack nor registers may point there.
fn upper_half() -> TestResult {
    // SAFETY: the symbols delimit the blob assembled above.
    let code =
        unsafe { blob(std::ptr::addr_of!(lguest_guest_upper_start), std::ptr::addr_of!(lguest_guest_upper_end)) };
    let vm = TestVm::new(&code)?;
    write_upper_tables(&vm.mem);
    let flushes = |vm: &TestVm| vm.run_page().read::<u64>(64);
    let note = |vm: &TestVm, what: &str| -> Result<u64, t::NotPassed> {
        check_eq!(vm.run(), Ok(0), format!("{what}: RUN"));
        check_eq!(vm.exit_reason(), abi::LGUEST_EXIT_NOTIFY, format!("{what}: exit ({})", vm.message()));
        Ok(vm.run_page().read::<u64>(16))
    };
    check_eq!(note(&vm, "low")?, 1, "NOTIFY at the low address");
    check_eq!(flushes(&vm), 0, "global flushes before any upper-half mapping");
    let rip = note(&vm, "top alias")?;
    check!(
        rip >= UPPER_ALIAS + CODE && rip < UPPER_ALIAS + CODE + code.len() as u64,
        "RIP {rip:#x} reported from the top alias"
    );
    let after_jump = flushes(&vm);
    check!(after_jump >= 1, "global flushes once the guest runs in the upper half: {after_jump}");
    check_eq!(note(&vm, "write")?, 0x5a5a, "word written through the top alias, read through the low one");
    check_eq!(note(&vm, "GUEST_UPPER_START")?, 0x5a5a, "word read at GUEST_UPPER_START + 0x1c0000");
    check_eq!(note(&vm, "int3")?, 0x33, "int3 handler in the top alias");
    let mut r = abi::LguestVcpuRegs::default();
    check_eq!(t::ioctl_ptr(&vm.f, abi::LGUEST_GET_REGS, &mut r), Ok(0), "GET_REGS");
    check!(r.regs.rip >= UPPER_ALIAS + CODE, "the handler's RIP {:#x} is in the top alias", r.regs.rip);
    check!(flushes(&vm) > after_jump, "global flushes go on: {} after {after_jump}", flushes(&vm));
    let (msg, notes) = run_to_kill(&vm, 4)?;
    println!("# killed: {msg}; {} global flushes in {} exits", flushes(&vm), vm.run_page().read::<u64>(32));
    check!(msg.contains("page fault at 0xffff8000001c0000 (error 0x0)"), "guard-hole read: {msg:?}");
    check!(notes.is_empty(), "NOTIFYs after the handler's: {notes:x?}");

    // A handler, a kernel stack or a RIP in the guard hole kills the guest
    // or is refused; at GUEST_UPPER_START and in the top 2 GiB they are
    // the guest's.
    let end = abi::GUEST_VA_END;
    for (r12, r13, want) in [
        (1, GUARD_HOLE + 0x1000, "LOAD_IDT_ENTRY: handler 0xffff800000001000"),
        (1, abi::GUEST_UPPER_START - 8, "LOAD_IDT_ENTRY: handler 0xffff87fffffffff8"),
        (2, GUARD_HOLE + 0x1000, "SET_STACK: bad kernel stack"),
    ] {
        let vm = top_vm(&[], end, r12, r13)?;
        let (msg, _) = run_to_kill(&vm, 4)?;
        check!(msg.contains(want), "kill message {msg:?}, wanted {want:?}");
    }
    let vm = TestVm::new(GUEST_OK)?;
    for (rip, rsp, ok) in [
        (GUARD_HOLE, 0x17_0000, false),
        (abi::GUEST_UPPER_START - 1, 0x17_0000, false),
        (abi::GUEST_UPPER_START, 0x17_0000, true),
        (UPPER_ALIAS + CODE, UPPER_ALIAS + 0x1f_0000, true),
        (CODE, GUARD_HOLE + 0x1000, false),
        (u64::MAX, 0, true),
    ] {
        let mut r = abi::LguestVcpuRegs::default();
        check_eq!(t::ioctl_ptr(&vm.f, abi::LGUEST_GET_REGS, &mut r), Ok(0), "GET_REGS");
        r.regs.rip = rip;
        r.regs.rsp = rsp;
        let got = t::ioctl_ptr(&vm.f, abi::LGUEST_SET_REGS, &mut r);
        check_eq!(got.is_ok(), ok, format!("SET_REGS rip {rip:#x} rsp {rsp:#x}: {got:?}"));
    }
    Ok(())
}

// A guest for the global-pages test, on the tables `write_global_tables`
// makes at 0x300000: R12 times it reads the word at R13 (a host kernel
// data address, which its tables map to its own page 0x1c0000) and counts
// the reads that are not RBX, with a hypercall (FLUSH_ASYNC, an exit and
// an entry) after each; then NOTIFY(the count).
core::arch::global_asm!(
    ".pushsection .rodata.lguest_guest_global, \"a\"",
    ".globl lguest_guest_global_start",
    ".globl lguest_guest_global_end",
    "lguest_guest_global_start:",
    "mov esp, 0x1f0000",
    "mov eax, 1",
    "mov edi, 0x180000",
    "int 0x1f",
    "mov eax, 4",
    "mov edi, 0x300000",
    "int 0x1f",
    "xor r14d, r14d",
    "mov r15, r12",
    "1: mov rax, qword ptr [r13]",
    "cmp rax, rbx",
    "je 2f",
    "inc r14",
    "2: xor eax, eax",
    "int 0x1f",
    "dec r15",
    "jnz 1b",
    "mov eax, 17",
    "mov edi, 0x181000",
    "mov rsi, r14",
    "int 0x1f",
    "3: jmp 3b",
    "lguest_guest_global_end:",
    ".popsection",
);

extern "C" {
    static lguest_guest_global_start: u8;
    static lguest_guest_global_end: u8;
}

/// Page tables at 0x300000: 1-2 MiB identity-mapped, and the page of
/// upper-half `va` mapped to the guest's page 0x1c0000.
fn write_global_tables(mem: &Mapping, va: u64) {
    let e = |at: u64, v: u64| mem.put::<u64>(at as usize, v);
    const P: u64 = 1;
    const RW: u64 = 2;
    let pml4 = 0x30_0000u64;
    let (pdpt_hi, pd_hi, pt_hi) = (0x30_4000u64, 0x30_5000u64, 0x30_6000u64);
    write_low_tables(mem);
    let i = |level: u32| (va >> (12 + 9 * (level - 1))) & 511;
    e(pml4 + 8 * i(4), pdpt_hi | P | RW);
    e(pdpt_hi + 8 * i(3), pd_hi | P | RW);
    e(pd_hi + 8 * i(2), pt_hi | P | RW);
    e(pt_hi + 8 * i(1), 0x1c_0000 | P | RW);
}

/// A guest mapping a page of its own where the host has code it runs at
/// every entry (the page of `lguest_switch_to_guest` in the module's text,
/// which the old layout mapped into every guest at that address) reads its
/// own value there every time, with no page fault per read. On hardware
/// this also needs the flush of the host's global TLB entries at each entry
/// (the host's translation of that page is in the TLB, global where PTI is
/// off, right before the guest runs): without it a read would meet the
/// host's supervisor entry and fault, and the host, finding the page
/// mapped, would enter again, one more exit per read. Neither emulator can
/// show that part: TCG flushes global entries at every CR3 write, and
/// Bochs treats a TLB hit that fails the access's permission check as a
/// miss and walks the current tables (both checked: with the flush taken
/// out, the test still passed under Bochs, 205 exits for 203 hypercalls).
/// So the test counts exits: at most a quarter more than the hypercalls
/// (host interrupts and the first faults).
fn host_global_pages() -> TestResult {
    let Some(va) = t::kallsyms("lguest_switch_to_guest") else {
        t::skip!("lguest_switch_to_guest not in /proc/kallsyms (not root?)");
    };
    const READS: u64 = 200;
    const MAGIC: u64 = 0x6c67_6c6f_6261_6c21;
    // SAFETY: the symbols delimit the blob assembled above.
    let code =
        unsafe { blob(std::ptr::addr_of!(lguest_guest_global_start), std::ptr::addr_of!(lguest_guest_global_end)) };
    let vm = TestVm::new(&code)?;
    write_global_tables(&vm.mem, va);
    vm.mem.put::<u64>(0x1c_0000 + (va & 0xff8) as usize, MAGIC);
    let mut r = abi::LguestVcpuRegs::default();
    check_eq!(t::ioctl_ptr(&vm.f, abi::LGUEST_GET_REGS, &mut r), Ok(0), "GET_REGS");
    r.regs.r12 = READS;
    r.regs.r13 = va & !7;
    r.regs.rbx = MAGIC;
    check_eq!(t::ioctl_ptr(&vm.f, abi::LGUEST_SET_REGS, &mut r), Ok(0), "SET_REGS");
    check_eq!(vm.run(), Ok(0), "RUN");
    check_eq!(vm.exit_reason(), abi::LGUEST_EXIT_NOTIFY, format!("exit ({})", vm.message()));
    let wrong = vm.run_page().read::<u64>(16);
    let exits = vm.run_page().read::<u64>(32);
    let hcalls = vm.run_page().read::<u64>(40);
    let flushes = vm.run_page().read::<u64>(64);
    println!(
        "# {READS} reads at {va:#x}: {wrong} wrong, {exits} exits for {hcalls} hypercalls, {flushes} global flushes"
    );
    check_eq!(wrong, 0, "reads that did not see the guest's own value");
    check_eq!(hcalls, READS + 3, "hypercalls");
    check!(exits <= hcalls + READS / 4, "{exits} exits for {hcalls} hypercalls: a fault per read?");
    Ok(())
}

// A guest for the TLB-semantics test, on the tables `write_tlb_tables`
// makes: root A at 0x1d0000 and root B at 0x1d8000, both mapping 1-2 MiB
// (code, data, stack, the tables themselves) and sharing one upper half,
// where 0xffffffff80000000 is a global page (0x1c3000) and the page after
// it a non-global one (0x1c5000); 0x200000 is 0x1c1000 in A and 0x1c2000 in
// B. Page 0x1cN000 holds N. It changes its tables without telling the
// host and reports what it reads (NOTIFY(value)) around INVLPG, root
// switches and both kinds of FLUSH_TLB.
core::arch::global_asm!(
    ".pushsection .rodata.lguest_guest_tlb, \"a\"",
    ".globl lguest_guest_tlb_start",
    ".globl lguest_guest_tlb_end",
    "lguest_guest_tlb_start:",
    "mov esp, 0x1f0000",
    "mov eax, 1",
    "mov edi, 0x180000",
    "mov esi, 2",
    "int 0x1f",
    "mov eax, 4",
    "mov edi, 0x1d0000",
    "int 0x1f",
    "mov rsi, qword ptr [0x200000]",
    "call 9f",
    "mov qword ptr [0x1d4000], 0x1c2003",
    "mov rsi, qword ptr [0x200000]",
    "call 9f",
    "mov eax, 24",
    "mov edi, 0x200000",
    "int 0x1f",
    "mov rsi, qword ptr [0x200000]",
    "call 9f",
    "movabs rbx, 0xffffffff80000000",
    "mov rsi, qword ptr [rbx]",
    "call 9f",
    "mov rsi, qword ptr [rbx + 0x1000]",
    "call 9f",
    "mov qword ptr [0x1d7000], 0x1c4103",
    "mov qword ptr [0x1d7008], 0x1c6003",
    "mov eax, 4",
    "mov edi, 0x1d8000",
    "int 0x1f",
    "mov rsi, qword ptr [rbx]",
    "call 9f",
    "mov rsi, qword ptr [rbx + 0x1000]",
    "call 9f",
    "mov rsi, qword ptr [0x200000]",
    "call 9f",
    "mov eax, 5",
    "mov edi, 1",
    "int 0x1f",
    "mov rsi, qword ptr [rbx]",
    "call 9f",
    "mov qword ptr [0x1d7000], 0x1c3103",
    "mov eax, 5",
    "xor edi, edi",
    "int 0x1f",
    "mov rsi, qword ptr [rbx]",
    "call 9f",
    "mov eax, 24",
    "mov rdi, rbx",
    "int 0x1f",
    "mov rsi, qword ptr [rbx]",
    "call 9f",
    "mov eax, 2",
    "mov edi, 0x181000",
    "mov esi, 1",
    "int 0x1f",
    "8: jmp 8b",
    "9: mov eax, 17",
    "mov edi, 0x181000",
    "int 0x1f",
    "ret",
    "lguest_guest_tlb_end:",
    ".popsection",
);

extern "C" {
    static lguest_guest_tlb_start: u8;
    static lguest_guest_tlb_end: u8;
}

/// The tables of the TLB-semantics guest (see its comment), and the values.
fn write_tlb_tables(mem: &Mapping) {
    let e = |at: u64, v: u64| mem.put::<u64>(at as usize, v);
    const P: u64 = 1;
    const RW: u64 = 2;
    const G: u64 = 0x100;
    for (root, pdpt, pd, ptx, frame) in [
        (0x1d_0000u64, 0x1d_1000u64, 0x1d_2000u64, 0x1d_4000u64, 0x1c_1000u64),
        (0x1d_8000, 0x1d_9000, 0x1d_a000, 0x1d_b000, 0x1c_2000),
    ] {
        e(root, pdpt | P | RW);
        e(root + 8 * 511, 0x1d_5000 | P | RW);
        e(pdpt, pd | P | RW);
        e(pd, 0x1d_3000 | P | RW);
        e(pd + 8, ptx | P | RW);
        e(ptx, frame | P | RW);
    }
    for page in 0x100u64..0x200 {
        e(0x1d_3000 + 8 * page, (page << 12) | P | RW);
    }
    e(0x1d_5000 + 8 * 510, 0x1d_6000 | P | RW);
    e(0x1d_6000, 0x1d_7000 | P | RW);
    e(0x1d_7000, 0x1c_3000 | P | RW | G);
    e(0x1d_7008, 0x1c_5000 | P | RW);
    for n in 1..=6u64 {
        e(0x1c_0000 + n * 0x1000, n);
    }
}

/// TLB-semantics shadows (`LGUEST_INIT_TLB_SHADOWS`), against the model of
/// a TLB that keeps what it has until told: a PTE changed without a report
/// reads stale until `LHCALL_INVLPG`; a root switch drops non-global pages
/// (the other root's own mapping, and the upper-half non-global page, read
/// fresh) but keeps the global one, stale, in the kernel half every root
/// shares, until `FLUSH_TLB(1)`; `FLUSH_TLB(0)` keeps it too, and `INVLPG`
/// of it drops it.
fn tlb_shadows() -> TestResult {
    // SAFETY: the symbols delimit the blob assembled above.
    let code = unsafe { blob(std::ptr::addr_of!(lguest_guest_tlb_start), std::ptr::addr_of!(lguest_guest_tlb_end)) };
    let vm = TestVm::new(&code)?;
    write_tlb_tables(&vm.mem);
    let mut notes = Vec::new();
    for _ in 0..20 {
        check_eq!(vm.run(), Ok(0), "RUN");
        match vm.exit_reason() {
            abi::LGUEST_EXIT_NOTIFY => notes.push(vm.run_page().read::<u64>(16)),
            abi::LGUEST_EXIT_SHUTDOWN => break,
            r => fail!("exit reason {r} ({}), notes {notes:?}", vm.message()),
        }
    }
    println!("# reads: {notes:?}");
    let want: &[u64] = &[
        1, // A's page
        1, // changed, not reported: stale
        2, // after INVLPG
        3, // the global upper page
        5, // the non-global one
        3, // both changed, root switch: the global page kept
        6, // the non-global one dropped
        2, // B's own page
        4, // after FLUSH_TLB(1)
        4, // changed back, FLUSH_TLB(0): the global page kept
        3, // after INVLPG of it
    ];
    check_eq!(&notes[..], want, "what the guest read");
    check_eq!(vm.exit_reason(), abi::LGUEST_EXIT_SHUTDOWN, "exit");
    Ok(())
}

// A guest for the PCID test, on the same tables: it tags its root switches
// with PCIDs (A is PCID 1, B PCID 2), changes A's mapping of 0x200000
// without telling the host, and reports what it reads around switches
// with and without LGUEST_PGTABLE_NOFLUSH and both kinds of FLUSH_TLB;
// last, a NEW_PGTABLE with a bit beyond the PCID and the flag.
core::arch::global_asm!(
    ".pushsection .rodata.lguest_guest_pcid, \"a\"",
    ".globl lguest_guest_pcid_start",
    ".globl lguest_guest_pcid_end",
    "lguest_guest_pcid_start:",
    "mov esp, 0x1f0000",
    "mov eax, 1",
    "mov edi, 0x180000",
    "mov esi, 2",
    "int 0x1f",
    // A, PCID 1: A's page.
    "mov edi, 0x1d0000",
    "mov esi, 1",
    "call 8f",
    // B, PCID 2: B's page.
    "mov edi, 0x1d8000",
    "mov esi, 2",
    "call 8f",
    // A changed, not reported; back to A with NOFLUSH: its kept shadow.
    "mov qword ptr [0x1d4000], 0x1c3003",
    "mov edi, 0x1d0000",
    "movabs rsi, 0x8000000000000001",
    "call 8f",
    // B with NOFLUSH (kept), A without: A fresh.
    "mov edi, 0x1d8000",
    "movabs rsi, 0x8000000000000002",
    "mov eax, 4",
    "int 0x1f",
    "mov edi, 0x1d0000",
    "mov esi, 1",
    "call 8f",
    // A changed back; A again with NOFLUSH: the same PCID keeps it.
    "mov qword ptr [0x1d4000], 0x1c1003",
    "mov edi, 0x1d0000",
    "movabs rsi, 0x8000000000000001",
    "call 8f",
    // FLUSH_TLB(0): the current PCID's go.
    "mov eax, 5",
    "xor edi, edi",
    "int 0x1f",
    "mov rsi, qword ptr [0x200000]",
    "call 9f",
    // A changed; B with NOFLUSH (kept); FLUSH_TLB(1); A with NOFLUSH:
    // a global flush dropped every PCID's.
    "mov qword ptr [0x1d4000], 0x1c4003",
    "mov edi, 0x1d8000",
    "movabs rsi, 0x8000000000000002",
    "call 8f",
    "mov eax, 5",
    "mov edi, 1",
    "int 0x1f",
    "mov edi, 0x1d0000",
    "movabs rsi, 0x8000000000000001",
    "call 8f",
    // A tag with bit 12 set: killed.
    "mov edi, 0x1d0000",
    "mov esi, 0x1001",
    "mov eax, 4",
    "int 0x1f",
    "7: jmp 7b",
    // NEW_PGTABLE(edi, rsi), then NOTIFY what 0x200000 holds.
    "8: mov eax, 4",
    "int 0x1f",
    "mov rsi, qword ptr [0x200000]",
    "9: mov eax, 17",
    "mov edi, 0x181000",
    "int 0x1f",
    "ret",
    "lguest_guest_pcid_end:",
    ".popsection",
);

extern "C" {
    static lguest_guest_pcid_start: u8;
    static lguest_guest_pcid_end: u8;
}

/// PCIDs under TLB semantics (`LHCALL_NEW_PGTABLE`'s tag), against the
/// model of a TLB with PCIDs: a switch back to a PCID with NOFLUSH finds
/// its translations (stale ones too), without it or after `FLUSH_TLB(1)`
/// they are gone, `FLUSH_TLB(0)` drops the current PCID's; the run page
/// counts the reuses exactly; a tag with other bits kills the guest.
fn tlb_pcids() -> TestResult {
    // SAFETY: the symbols delimit the blob assembled above.
    let code = unsafe { blob(std::ptr::addr_of!(lguest_guest_pcid_start), std::ptr::addr_of!(lguest_guest_pcid_end)) };
    let vm = TestVm::new(&code)?;
    write_tlb_tables(&vm.mem);
    let mut notes = Vec::new();
    let mut reuses = 0;
    for _ in 0..20 {
        check_eq!(vm.run(), Ok(0), "RUN");
        match vm.exit_reason() {
            abi::LGUEST_EXIT_NOTIFY => {
                notes.push(vm.run_page().read::<u64>(16));
                reuses = vm.run_page().read::<u64>(std::mem::offset_of!(abi::LguestRun, stat_shadow_reuses));
            }
            abi::LGUEST_EXIT_KILLED => break,
            r => fail!("exit reason {r} ({}), notes {notes:?}", vm.message()),
        }
    }
    println!("# reads: {notes:?}, {reuses} shadow reuses");
    let want: &[u64] = &[
        1, // A's page
        2, // B's page
        1, // A changed, back with NOFLUSH: kept, stale
        3, // B kept, A without NOFLUSH: fresh
        3, // A changed back, same PCID with NOFLUSH: kept, stale
        1, // after FLUSH_TLB(0)
        2, // B kept
        4, // after FLUSH_TLB(1), A with NOFLUSH: fresh
    ];
    check_eq!(&notes[..], want, "what the guest read");
    check_eq!(reuses, 4, "switches that found the PCID's shadow kept");
    check_eq!(vm.exit_reason(), abi::LGUEST_EXIT_KILLED, "exit");
    let msg = vm.message();
    check!(msg.contains("NEW_PGTABLE: bad PCID and flags 0x1001"), "kill message {msg:?}");
    Ok(())
}

// A guest for the PCID cache's size: three rounds over PCIDs 1 to 12 of
// root A, each switch with NOFLUSH and a read through the new shadow; then
// NOTIFY (the test reads the reuse count) and a bad tag (killed).
core::arch::global_asm!(
    ".pushsection .rodata.lguest_guest_pcids12, \"a\"",
    ".globl lguest_guest_pcids12_start",
    ".globl lguest_guest_pcids12_end",
    "lguest_guest_pcids12_start:",
    "mov esp, 0x1f0000",
    "mov eax, 1",
    "mov edi, 0x180000",
    "mov esi, 2",
    "int 0x1f",
    "mov ebx, 3",
    "2: mov r12d, 1",
    "3: mov edi, 0x1d0000",
    "mov rsi, r12",
    "bts rsi, 63",
    "mov eax, 4",
    "int 0x1f",
    "mov rsi, qword ptr [0x200000]",
    "inc r12d",
    "cmp r12d, 12",
    "jbe 3b",
    "dec ebx",
    "jnz 2b",
    "mov eax, 17",
    "mov edi, 0x181000",
    "int 0x1f",
    "mov edi, 0x1d0000",
    "mov esi, 0x1001",
    "mov eax, 4",
    "int 0x1f",
    "7: jmp 7b",
    "lguest_guest_pcids12_end:",
    ".popsection",
);

extern "C" {
    static lguest_guest_pcids12_start: u8;
    static lguest_guest_pcids12_end: u8;
}

/// The host keeps a shadow for each of more PCIDs than Linux's native 6
/// (`PCID_CACHE`, 32, as the Linux guest's `TLB_NR_DYN_ASIDS`): a guest
/// cycling through 12 PCIDs with NOFLUSH finds every one kept from its
/// second round on, 24 reuses in three rounds; with 6 kept, the least
/// recently used going first, round-robin over 12 would find none (each
/// switch would rebuild its shadow page by page, the thrash a Debian
/// boot's parallel generators showed).
fn tlb_twelve_pcids() -> TestResult {
    // SAFETY: the symbols delimit the blob assembled above.
    let code =
        unsafe { blob(std::ptr::addr_of!(lguest_guest_pcids12_start), std::ptr::addr_of!(lguest_guest_pcids12_end)) };
    let vm = TestVm::new(&code)?;
    write_tlb_tables(&vm.mem);
    check_eq!(vm.run(), Ok(0), "RUN");
    check_eq!(vm.exit_reason(), abi::LGUEST_EXIT_NOTIFY, format!("exit ({})", vm.message()));
    let reuses = vm.run_page().read::<u64>(std::mem::offset_of!(abi::LguestRun, stat_shadow_reuses));
    check_eq!(vm.run_page().read::<u64>(16), 1, "what the guest read through the last shadow");
    check_eq!(reuses, 24, "switches that found the PCID's shadow kept");
    check_eq!(vm.run(), Ok(0), "RUN");
    check_eq!(vm.exit_reason(), abi::LGUEST_EXIT_KILLED, "exit");
    Ok(())
}

/// The start of `struct perf_event_attr` (PERF_ATTR_SIZE_VER1), enough for
/// a hardware breakpoint.
#[repr(C)]
#[derive(Default)]
struct PerfBreakpoint {
    type_: u32,
    size: u32,
    config: u64,
    sample_period: u64,
    sample_type: u64,
    read_format: u64,
    flags: u64,
    wakeup_events: u32,
    bp_type: u32,
    bp_addr: u64,
    bp_len: u64,
}

/// The launcher's own thread has a data breakpoint (perf) on the address
/// the guest loads SS from, then makes a hypercall: `mov ss, [X]; int
/// $0x1f`. On hardware the #DB is held back past the MOV SS and taken at
/// the first instruction of the switcher's hypercall stub, in ring 0 (the
/// CVE-2018-8897 pattern): it must be handled there and the hypercall go
/// on. An emulator may deliver it to the guest after the MOV SS instead
/// (then the guest, with no #DB handler, is killed for it). Either way no
/// host address reaches a register. Also TF set by the guest before a
/// hypercall: the hypercall is made, and the single-step trap comes after
/// the next guest instruction, as a guest #DB.
fn mov_ss_and_tf() -> TestResult {
    const X: u64 = 0x18_0800;
    // mov $0x2b, %ax; mov %ax, X; mov X, %ss; NOTIFY(MSG, 0x77); SHUTDOWN.
    let mut code = vec![0x66, 0xb8, 0x2b, 0x00, 0x66, 0x89, 0x04, 0x25, 0x00, 0x08, 0x18, 0x00];
    code.extend_from_slice(&[0x8e, 0x14, 0x25, 0x00, 0x08, 0x18, 0x00]); // mov X, %ss
    code.extend_from_slice(NOTIFY_77);
    code.extend_from_slice(&GUEST_OK[GUEST_OK.len() - 19..]);
    let mut prog = GUEST_OK[..12].to_vec(); // INIT
    prog.extend_from_slice(&code);
    for armed in [false, true] {
        let vm = TestVm::new(&prog)?;
        let bp = if armed {
            let attr = PerfBreakpoint {
                type_: 5, // PERF_TYPE_BREAKPOINT
                size: std::mem::size_of::<PerfBreakpoint>() as u32,
                bp_type: 3, // HW_BREAKPOINT_RW
                bp_addr: X,
                bp_len: 2,
                ..PerfBreakpoint::default()
            };
            // SAFETY: perf_event_open with a valid attr (the first 72 bytes
            // of struct perf_event_attr, PERF_ATTR_SIZE_VER1), this thread,
            // any CPU, no group.
            let fd = unsafe { libc::syscall(libc::SYS_perf_event_open, &attr, 0, -1, -1, 0) };
            if fd < 0 {
                t::skip!("perf_event_open(PERF_TYPE_BREAKPOINT): {}", t::errname(t::errno()));
            }
            Some(fd as i32)
        } else {
            None
        };
        check_eq!(vm.run(), Ok(0), "RUN");
        let (reason, msg) = (vm.exit_reason(), vm.message());
        match reason {
            abi::LGUEST_EXIT_NOTIFY => {
                check_eq!(vm.run_page().read::<u64>(16), 0x77, "NOTIFY argument");
                check_eq!(vm.run(), Ok(0), "RUN");
                check_eq!(vm.exit_reason(), abi::LGUEST_EXIT_SHUTDOWN, format!("exit ({})", vm.message()));
                println!("# breakpoint {armed}: the hypercall went on");
            }
            abi::LGUEST_EXIT_KILLED if armed && msg.contains("#DB debug") => {
                println!("# breakpoint armed: the #DB reached the guest ({msg})");
            }
            r => fail!("breakpoint {armed}: exit {r} ({msg})"),
        }
        no_host_address(&vm, &format!("breakpoint {armed}"))?;
        if let Some(fd) = bp {
            // SAFETY: closing the perf fd we opened.
            unsafe { libc::close(fd) };
        }
    }
    // TF, then a hypercall: the hypercall is made (INT clears TF for its
    // handler), and the single-step trap comes after the next instruction.
    let pushf_tf_popf = [0x9c, 0x81, 0x0c, 0x24, 0x00, 0x01, 0x00, 0x00, 0x9d];
    const STACK: [u8; 5] = [0xbc, 0x00, 0x00, 0x17, 0x00]; // mov $0x170000, %esp
    let mut prog = STACK.to_vec();
    prog.extend_from_slice(&GUEST_OK[..12]);
    prog.extend_from_slice(&NOTIFY_77[..15]);
    prog.extend_from_slice(&pushf_tf_popf);
    prog.extend_from_slice(&[0xcd, 0x1f, 0x90, 0x90, 0xeb, 0xfe]);
    let vm = TestVm::new(&prog)?;
    let (msg, notes) = run_to_kill(&vm, 4)?;
    check!(msg.contains("#DB debug"), "TF: kill message {msg:?}");
    check_eq!(notes, vec![0x77u64], "TF: the hypercall before the single-step trap");
    no_host_address(&vm, "TF")?;
    // TF, then ud2: the fault comes before any single-step trap.
    let mut prog = STACK.to_vec();
    prog.extend_from_slice(&GUEST_OK[..12]);
    prog.extend_from_slice(&pushf_tf_popf);
    prog.extend_from_slice(&[0x0f, 0x0b]);
    let vm = TestVm::new(&prog)?;
    let (msg, _) = run_to_kill(&vm, 4)?;
    check!(msg.contains("#UD invalid opcode"), "TF then ud2: kill message {msg:?}");
    no_host_address(&vm, "TF then ud2")?;
    Ok(())
}

/// The state of thread `tid` ('R', 'S', ...) from /proc.
fn thread_state(tid: i32) -> char {
    let stat = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).unwrap_or_default();
    stat.rsplit(')').next().and_then(|s| s.trim_start().chars().next()).unwrap_or('?')
}

/// While one thread's RUN has the guest halted for 3 s, another thread's
/// GET_REGS answers at once (RUN holds no lock while it sleeps), and its
/// CREATE_VCPU and RUN get EBUSY; while the guest runs, GET_REGS gets
/// EBUSY instead of waiting. Nobody sleeps uninterruptibly behind RUN.
fn second_thread_during_run() -> TestResult {
    use std::sync::atomic::{AtomicBool, AtomicI32, Ordering::SeqCst};
    // INIT; blocked = ~1; LOAD_IDT_ENTRY(32, 0x100200); SET_CLOCKEVENT(3 s);
    // HALT; at 0x100200 SHUTDOWN.
    let mut code = guest_halt_irq1();
    code[35] = 0x20; // vector 32 (IRQ 0), not 33
    code[25] = 0xfe; // blocked_interrupts = ~1
                     // SET_CLOCKEVENT(3 s) before the HALT at 51; the handler stays at 0x200.
    let mut clock = vec![0xb8, 0x09, 0x00, 0x00, 0x00, 0x48, 0xbf];
    clock.extend_from_slice(&3_000_000_000u64.to_le_bytes());
    clock.extend_from_slice(&[0xcd, 0x1f]);
    let mut prog = code[..51].to_vec();
    prog.extend_from_slice(&clock);
    prog.extend_from_slice(&code[51..0x200 - clock.len()]);
    prog.extend_from_slice(&code[0x200..]);
    let vm = TestVm::new(&prog)?;
    let tid = AtomicI32::new(0);
    let finished = AtomicBool::new(false);
    let res: Result<(), String> = std::thread::scope(|s| {
        let runner = s.spawn(|| {
            // SAFETY: gettid has no preconditions.
            tid.store(unsafe { libc::gettid() }, SeqCst);
            let r = vm.run();
            finished.store(true, SeqCst);
            r
        });
        let asleep = t::wait_for(std::time::Duration::from_secs(30), || {
            let t = tid.load(SeqCst);
            t != 0 && thread_state(t) == 'S'
        });
        let mut regs = abi::LguestVcpuRegs::default();
        let got = t::ioctl_ptr(&vm.f, abi::LGUEST_GET_REGS, &mut regs);
        let during = !finished.load(SeqCst);
        let vcpu = t::ioctl(&vm.f, abi::LGUEST_CREATE_VCPU, 0);
        let run2 = vm.run();
        let still = !finished.load(SeqCst);
        let r = runner.join().map_err(|_| "runner panicked".to_string())?;
        if !asleep {
            return Err("the RUN thread never went to sleep".into());
        }
        if !(during && still) {
            return Err("RUN returned before the 3 s halt ended".into());
        }
        if got != Ok(0) {
            return Err(format!("GET_REGS during the halt: {got:?}"));
        }
        if vcpu != Err(libc::EBUSY) || run2 != Err(libc::EBUSY) {
            return Err(format!("CREATE_VCPU {vcpu:?} and a second RUN {run2:?} during the halt, wanted EBUSY"));
        }
        if r != Ok(0) || vm.exit_reason() != abi::LGUEST_EXIT_SHUTDOWN {
            return Err(format!("RUN {r:?}, exit {} ({})", vm.exit_reason(), vm.message()));
        }
        Ok(())
    });
    if let Err(e) = res {
        fail!("{e}");
    }
    // A spinning guest: GET_REGS from another thread gets EBUSY at once.
    let vm = TestVm::new(GUEST_SPIN)?;
    KICK_BYTE.store(vm.run_page().addr, SeqCst);
    // SAFETY: installing a handler that only does a volatile store.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = kick_handler as *const () as usize;
        libc::sigaction(libc::SIGUSR1, &sa, std::ptr::null_mut());
    }
    let pthread = std::sync::atomic::AtomicU64::new(0);
    let busy = std::thread::scope(|s| {
        let runner = s.spawn(|| {
            // SAFETY: pthread_self has no preconditions.
            pthread.store(unsafe { libc::pthread_self() } as u64, SeqCst);
            vm.run()
        });
        let busy = t::wait_for(std::time::Duration::from_secs(30), || {
            let mut regs = abi::LguestVcpuRegs::default();
            t::ioctl_ptr(&vm.f, abi::LGUEST_GET_REGS, &mut regs) == Err(libc::EBUSY)
        });
        while !runner.is_finished() {
            // SAFETY: signalling a live thread of ours.
            unsafe { libc::pthread_kill(pthread.load(SeqCst) as libc::pthread_t, libc::SIGUSR1) };
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        (busy, runner.join().ok())
    });
    KICK_BYTE.store(std::ptr::null_mut(), SeqCst);
    check!(busy.0, "GET_REGS never got EBUSY while the guest ran");
    check_eq!(busy.1, Some(Err(libc::EINTR)), "the kicked RUN");
    Ok(())
}

// Guests for the CPUID test. The kernel (at CODE) makes four CPUIDs and
// stores RAX, RBX, RCX and RDX of each (32 bytes) from 0x190000: with the
// forced-emulation prefix, leaf 0x40000000 (ECX 5, junk in the upper
// halves and in RBX and RDX), leaf 7 subleaf 1, leaf 7 subleaf 2; then a
// plain CPUID of leaf 0x40000000. Then it powers off. The user program
// (for the user-mode kernel above) makes the prefixed CPUID of leaf
// 0x40000000 and reports EAX, then EBX, with system calls. The last
// guest puts the prefix before a `nop`.
core::arch::global_asm!(
    ".pushsection .rodata.lguest_guest_cpuid, \"a\"",
    ".globl lguest_guest_cpuid_start",
    ".globl lguest_guest_cpuid_end",
    ".globl lguest_user_cpuid_start",
    ".globl lguest_user_cpuid_end",
    ".globl lguest_guest_badprefix_start",
    ".globl lguest_guest_badprefix_end",
    "lguest_guest_cpuid_start:",
    "mov esp, 0x170000",
    "mov eax, 1",
    "mov edi, 0x180000",
    "int 0x1f",
    "movabs rax, 0xdead000040000000",
    "movabs rcx, 0xdead000000000005",
    "mov rbx, -1",
    "mov rdx, -1",
    ".byte 0x0f, 0x0b, 0x6c, 0x67, 0x75",
    "cpuid",
    "mov qword ptr [0x190000], rax",
    "mov qword ptr [0x190008], rbx",
    "mov qword ptr [0x190010], rcx",
    "mov qword ptr [0x190018], rdx",
    "mov eax, 7",
    "mov ecx, 1",
    ".byte 0x0f, 0x0b, 0x6c, 0x67, 0x75",
    "cpuid",
    "mov qword ptr [0x190020], rax",
    "mov qword ptr [0x190028], rbx",
    "mov qword ptr [0x190030], rcx",
    "mov qword ptr [0x190038], rdx",
    "mov eax, 7",
    "mov ecx, 2",
    ".byte 0x0f, 0x0b, 0x6c, 0x67, 0x75",
    "cpuid",
    "mov qword ptr [0x190040], rax",
    "mov qword ptr [0x190048], rbx",
    "mov qword ptr [0x190050], rcx",
    "mov qword ptr [0x190058], rdx",
    "mov eax, 0x40000000",
    "xor ecx, ecx",
    "cpuid",
    "mov qword ptr [0x190060], rax",
    "mov qword ptr [0x190068], rbx",
    "mov qword ptr [0x190070], rcx",
    "mov qword ptr [0x190078], rdx",
    "mov eax, 2",
    "mov edi, 0x181000",
    "mov esi, 1",
    "int 0x1f",
    "ud2",
    "lguest_guest_cpuid_end:",
    "lguest_user_cpuid_start:",
    "mov eax, 0x40000000",
    "xor ecx, ecx",
    ".byte 0x0f, 0x0b, 0x6c, 0x67, 0x75",
    "cpuid",
    "mov r12, rbx",
    "int 0x80",
    "mov rax, r12",
    "int 0x80",
    "int 0x1f",
    "ud2",
    "lguest_user_cpuid_end:",
    "lguest_guest_badprefix_start:",
    "mov eax, 1",
    "mov edi, 0x180000",
    "int 0x1f",
    ".byte 0x0f, 0x0b, 0x6c, 0x67, 0x75",
    "nop",
    "lguest_guest_badprefix_end:",
    ".popsection",
);

extern "C" {
    static lguest_guest_cpuid_start: u8;
    static lguest_guest_cpuid_end: u8;
    static lguest_user_cpuid_start: u8;
    static lguest_user_cpuid_end: u8;
    static lguest_guest_badprefix_start: u8;
    static lguest_guest_badprefix_end: u8;
}

/// This CPU's CPUID of `leaf`, `subleaf`: EAX, EBX, ECX, EDX.
fn native_cpuid(leaf: u32, subleaf: u32) -> [u64; 4] {
    let r = core::arch::x86_64::__cpuid_count(leaf, subleaf);
    [r.eax, r.ebx, r.ecx, r.edx].map(u64::from)
}

/// `LGUEST_SET_CPUID` with header `nent`, `padding` and `entries` after it.
fn set_cpuid_raw(f: &File, nent: u32, padding: u32, entries: &[abi::LguestCpuidEntry]) -> Result<i32, i32> {
    let mut buf: Vec<u32> = vec![nent, padding];
    buf.extend(entries.iter().flat_map(abi::LguestCpuidEntry::words));
    t::ioctl(f, abi::LGUEST_SET_CPUID, buf.as_ptr() as usize)
}

fn set_cpuid(f: &File, entries: &[abi::LguestCpuidEntry]) -> Result<i32, i32> {
    set_cpuid_raw(f, entries.len() as u32, 0, entries)
}

fn cpuid_entry(function: u32, index: u32, flags: u32, v: [u32; 4]) -> abi::LguestCpuidEntry {
    abi::LguestCpuidEntry { function, index, flags, eax: v[0], ebx: v[1], ecx: v[2], edx: v[3], padding: [0; 3] }
}

/// Runs the CPUID guest of `vm` to its power-off; its four results.
fn cpuid_results(vm: &TestVm) -> Result<[[u64; 4]; 4], t::NotPassed> {
    check_eq!(vm.run(), Ok(0), "RUN");
    check_eq!(vm.exit_reason(), abi::LGUEST_EXIT_SHUTDOWN, format!("exit ({})", vm.message()));
    let mut out = [[0u64; 4]; 4];
    for (i, r) in out.iter_mut().enumerate() {
        for (j, v) in r.iter_mut().enumerate() {
            *v = vm.mem.read::<u64>(0x19_0000 + 32 * i + 8 * j);
        }
    }
    Ok(out)
}

/// The CPUID table (`LGUEST_SET_CPUID`): refused when malformed (E2BIG,
/// EINVAL, EFAULT, ENOENT without a VM); the forced-emulation prefix gives
/// the table's entry in guest kernel and user mode (a subleaf entry only
/// for its subleaf, zeros for what the table lacks, the upper halves
/// cleared) and the host's CPUID without a table or once it is removed;
/// the prefix before anything but `cpuid` is a #UD. A plain `cpuid` gives
/// the table's values where this thread can make CPUID fault
/// (`arch_prctl(ARCH_SET_CPUID, 0)`), the host's where it cannot (QEMU's
/// emulator and Bochs: ENODEV).
fn cpuid_table() -> TestResult {
    // SAFETY: the symbols delimit the blobs assembled above.
    let (kernel, user, badprefix, user_kernel) = unsafe {
        (
            blob(std::ptr::addr_of!(lguest_guest_cpuid_start), std::ptr::addr_of!(lguest_guest_cpuid_end)),
            blob(std::ptr::addr_of!(lguest_user_cpuid_start), std::ptr::addr_of!(lguest_user_cpuid_end)),
            blob(std::ptr::addr_of!(lguest_guest_badprefix_start), std::ptr::addr_of!(lguest_guest_badprefix_end)),
            blob(std::ptr::addr_of!(lguest_guest_user_start), std::ptr::addr_of!(lguest_guest_user_end)),
        )
    };
    const SIG: u32 = abi::LGUEST_CPUID_FLAG_SIGNIFICANT_INDEX;
    let word = |b: &[u8; 4]| u32::from_le_bytes(*b);
    let hv = [0x4000_0000, word(b"Lgue"), word(b"stLg"), word(b"uest")];
    let table = [
        cpuid_entry(0x4000_0000, 0, 0, hv),
        cpuid_entry(7, 0, SIG, [1, 2, 3, 4]),
        cpuid_entry(7, 1, SIG, [0x71, 0x72, 0x73, 0x74]),
    ];
    let hv64 = hv.map(u64::from);

    // No VM yet.
    let f = open()?;
    check_eq!(set_cpuid(&f, &table), Err(libc::ENOENT), "SET_CPUID before CREATE_VM");
    drop(f);

    // Malformed tables, on a VM.
    let vm = TestVm::new(&kernel)?;
    let many = vec![cpuid_entry(1, 0, 0, [0; 4]); 257];
    check_eq!(set_cpuid(&vm.f, &many), Err(libc::E2BIG), "257 entries");
    check_eq!(set_cpuid_raw(&vm.f, 1, 1, &table[..1]), Err(libc::EINVAL), "header padding");
    let mut bad = table;
    bad[1].flags = 2;
    check_eq!(set_cpuid(&vm.f, &bad), Err(libc::EINVAL), "unknown flag");
    let mut bad = table;
    bad[2].padding[2] = 1;
    check_eq!(set_cpuid(&vm.f, &bad), Err(libc::EINVAL), "entry padding");
    let mut bad = table;
    bad[2].index = 0;
    check_eq!(set_cpuid(&vm.f, &bad), Err(libc::EINVAL), "two entries for leaf 7 subleaf 0");
    check_eq!(t::ioctl(&vm.f, abi::LGUEST_SET_CPUID, 0), Err(libc::EFAULT), "NULL argument");
    // A header at the end of a page whose entries would be in the next,
    // unreadable, one.
    let two = Mapping::anon(8192).map_err(|e| t::NotPassed::Fail(format!("mmap: {e}")))?;
    // SAFETY: the second page of our own mapping becomes inaccessible; only
    // the kernel's copy below touches it, and must fail.
    let r = unsafe { libc::mprotect(two.addr.add(4096).cast(), 4096, libc::PROT_NONE) };
    check_eq!(r, 0, "mprotect");
    two.put::<u32>(4088, 1);
    two.put::<u32>(4092, 0);
    check_eq!(
        t::ioctl(&vm.f, abi::LGUEST_SET_CPUID, two.addr as usize + 4088),
        Err(libc::EFAULT),
        "entries in an unreadable page"
    );

    // A table set, then removed: the host's values, and the upper halves
    // of the registers cleared.
    check_eq!(set_cpuid(&vm.f, &table), Ok(0), "SET_CPUID");
    check_eq!(set_cpuid(&vm.f, &[]), Ok(0), "SET_CPUID with no entries");
    let got = cpuid_results(&vm)?;
    let want = [native_cpuid(0x4000_0000, 5), native_cpuid(7, 1), native_cpuid(7, 2), native_cpuid(0x4000_0000, 0)];
    check_eq!(got, want, "CPUIDs without a table");
    drop(vm);

    // With the table, and CPUID faulting where this host has it.
    let vm = TestVm::new(&kernel)?;
    check_eq!(set_cpuid(&vm.f, &table), Ok(0), "SET_CPUID");
    let faulting = match t::cpuid_faulting(true) {
        Ok(()) => true,
        Err(libc::ENODEV) => false,
        Err(e) => fail!("arch_prctl(ARCH_SET_CPUID, 0): {}", t::errname(e)),
    };
    let got = cpuid_results(&vm);
    if faulting {
        check_eq!(t::cpuid_faulting(false), Ok(()), "arch_prctl(ARCH_SET_CPUID, 1)");
    }
    let got = got?;
    let plain = if faulting { hv64 } else { native_cpuid(0x4000_0000, 0) };
    check_eq!(got, [hv64, [0x71, 0x72, 0x73, 0x74], [0; 4], plain], "CPUIDs with the table");
    if !faulting {
        println!("# this host cannot make CPUID fault (ENODEV): a plain cpuid gave the host's values");
    }
    drop(vm);

    // Guest user mode: the prefix works there too.
    let vm = user_vm(&user_kernel, &user)?;
    check_eq!(set_cpuid(&vm.f, &table), Ok(0), "SET_CPUID");
    let notes = notes_to_shutdown(&vm)?;
    let cs = abi::LGUEST_USER_CS;
    let end = 0x11_0000 + user.len() as u64 - 4;
    let want = vec![(0x80, hv64[0]), (0x81, cs), (0x80, hv64[1]), (0x81, cs), (0x8d, 0xfa), (0x8c, end)];
    check_eq!(notes, want, "what the guest kernel saw");
    drop(vm);

    // The prefix before anything else is the ud2's #UD.
    let vm = TestVm::new(&badprefix)?;
    check_eq!(vm.run(), Ok(0), "RUN");
    check_eq!(vm.exit_reason(), abi::LGUEST_EXIT_KILLED, "exit reason");
    check!(vm.message().contains("#UD"), "kill message: {:?}", vm.message());
    Ok(())
}

/// The segment registers' selector, read in this thread.
fn selectors() -> [u16; 4] {
    let (ds, es, fs, gs): (u16, u16, u16, u16);
    // SAFETY: Reading segment registers has no side effects.
    unsafe {
        core::arch::asm!("mov {0:x}, ds", "mov {1:x}, es", "mov {2:x}, fs", "mov {3:x}, gs",
            out(reg) ds, out(reg) es, out(reg) fs, out(reg) gs, options(nomem, nostack));
    }
    [ds, es, fs, gs]
}

/// Loads `sel` into GS (this program's Rust and libc never use GS).
fn load_gs(sel: u16) {
    // SAFETY: GS is unused here; an invalid selector raises #GP, which is
    // the failure the caller looks for.
    unsafe { core::arch::asm!("mov gs, {0:x}", in(reg) sel, options(nomem, nostack)) };
}

/// The guest gets null data selectors and no LDT, whatever the launcher's
/// thread has, and the launcher gets its own back, whatever the guest
/// loaded: the switcher loads each only where the two differ. The thread
/// here has an LDT and an LDT selector in GS; the guest reads its DS, ES,
/// FS and GS into R8-R11, then loads __USER_DS into FS and GS itself.
fn host_selectors() -> TestResult {
    let mut code = vec![
        0x41, 0x8c, 0xd8, // mov %ds, %r8d
        0x41, 0x8c, 0xc1, // mov %es, %r9d
        0x41, 0x8c, 0xe2, // mov %fs, %r10d
        0x41, 0x8c, 0xeb, // mov %gs, %r11d
        0xb8, 0x2b, 0x00, 0x00, 0x00, // mov $0x2b, %eax
        0x8e, 0xe0, // mov %eax, %fs
        0x8e, 0xe8, // mov %eax, %gs
    ];
    code.extend_from_slice(GUEST_OK);
    let vm = TestVm::new(&code)?;
    // An LDT of one flat data segment (struct user_desc: entry 0, base 0,
    // limit 0xfffff pages, seg_32bit, limit_in_pages, useable).
    let desc: [u32; 4] = [0, 0, 0xf_ffff, 0x51];
    // SAFETY: modify_ldt(1, desc, 16) reads 16 bytes of `desc`.
    let r = unsafe { libc::syscall(libc::SYS_modify_ldt, 1, desc.as_ptr(), 16usize) };
    check_eq!(r, 0, "modify_ldt");
    const LDT_SEL: u16 = 0x7; // entry 0, LDT, RPL 3
    let before = selectors();
    load_gs(LDT_SEL);
    let result = vm.run();
    let after = selectors();
    // Loading the LDT selector again faults if the LDT is gone.
    load_gs(LDT_SEL);
    load_gs(0);
    check_eq!(result, Ok(0), "RUN");
    check_eq!(vm.exit_reason(), abi::LGUEST_EXIT_NOTIFY, "exit reason");
    let mut regs = abi::LguestVcpuRegs::default();
    check_eq!(t::ioctl_ptr(&vm.f, abi::LGUEST_GET_REGS, &mut regs), Ok(0), "GET_REGS");
    let r = regs.regs;
    check_eq!([r.r8, r.r9, r.r10, r.r11], [0u64; 4], "the guest's DS, ES, FS, GS");
    check_eq!(after, [before[0], before[1], before[2], LDT_SEL], "this thread's DS, ES, FS, GS after RUN");
    // Once more, to the guest's SHUTDOWN: the same again.
    check_eq!(vm.run(), Ok(0), "second RUN");
    check_eq!(vm.exit_reason(), abi::LGUEST_EXIT_SHUTDOWN, "exit reason");
    check_eq!(selectors(), [before[0], before[1], before[2], 0], "this thread's DS, ES, FS, GS at the end");
    Ok(())
}

fn main() -> ExitCode {
    t::run(&[
        ("tiny_guest_runs", tiny_guest_runs),
        ("killed_stays_dead", killed_stays_dead),
        ("immediate_exit", immediate_exit),
        ("create_vm_validation", create_vm_validation),
        ("ordering_errors", ordering_errors),
        ("regs_roundtrip", regs_roundtrip),
        ("munmap_under_guest", munmap_under_guest),
        ("run_from_other_process", run_from_other_process),
        ("memlock_limit", memlock_limit),
        ("create_destroy_1000", create_destroy_1000),
        ("shadow_paging", shadow_paging),
        ("shadow_paging_faults", shadow_paging_faults),
        ("user_mode", user_mode),
        ("shadow_teardown", shadow_teardown),
        ("shadow_root_cache", shadow_root_cache),
        ("halt_sleeps_irq_wakes", halt_sleeps_irq_wakes),
        ("irqfd_wakes_halted_guest", irqfd_wakes_halted_guest),
        ("irqfd_signalled_before_bind", irqfd_signalled_before_bind),
        ("ioeventfd_kicks", ioeventfd_kicks),
        ("kicks_100000", kicks_100000),
        ("last_guest_page", last_guest_page),
        ("upper_half", upper_half),
        ("host_global_pages", host_global_pages),
        ("tlb_shadows", tlb_shadows),
        ("tlb_pcids", tlb_pcids),
        ("tlb_twelve_pcids", tlb_twelve_pcids),
        ("mov_ss_and_tf", mov_ss_and_tf),
        ("second_thread_during_run", second_thread_during_run),
        ("fpu_state", fpu_state),
        ("cpuid_table", cpuid_table),
        ("host_selectors", host_selectors),
    ])
}
