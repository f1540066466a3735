#!/usr/bin/env python3
# SPDX-License-Identifier: GPL-2.0
"""The switcher's instruction inventory, for `make bench`.

Walks the switcher's paths in lguest.ko's disassembly as the CPU executes
them: from lguest_switch_to_guest's first instruction through the entry to
the iretq into the guest, then from the stub of the vector that brought the
guest back through the exit to the RET, following every jump, call and
return, and taking each conditional branch the way the block's flags (the
fields the switcher tests: guest FPU loaded, PKRU, CET, the global flush)
make it go. A branch the walker cannot decide stops it with an error, so a
new test in the switcher cannot be counted wrong silently.

Each executed instruction is put in a class (MSR write, CR3 write,
descriptor-table load, ...), and each class weighted with a range of
cycles on hardware (COSTS below, with where each figure comes from), which
gives the per-switch estimate TCG cannot show: under TCG, and under
-icount in particular, every one of these instructions costs what an add
costs.

The mitigation sites (ALTERNATIVEs) are counted as they are in the file,
as on a host without the feature; bench.sh prints their cost apart.

Usage: switch_inventory.py lguest.ko
"""
import re
import subprocess
import sys

# Cycles on current x86-64 hardware, (low, high), and the source. [P] a
# primary measurement, [S] secondary, [I] an estimate; the sources are
# cited in Documentation/dev/testing.rst ("The switch inventory").
COSTS = {
    "wrmsr": ((100, 300), "serializing; rule of thumb [S]"),
    "ibpb": ((1000, 10000), "a WRMSR of PRED_CMD.IBPB: flushes the branch predictors, thousands of cycles [I]"),
    "rdmsr": ((30, 50), "rule of thumb [S]"),
    "mov-cr3": ((150, 250), "with the TLB refill after it, from KPTI's cost [I]"),
    "mov-cr0": ((50, 150), "serializing [I]"),
    "mov-cr4": ((50, 150), "serializing [I]"),
    "read-cr": ((1, 5), "CR0/CR2/CR4 reads [I]"),
    "lgdt/lidt": ((50, 100), "serializing [I]"),
    "ltr": ((50, 100), "loads a descriptor, sets its busy bit [I]"),
    "lldt": ((20, 60), "loads a descriptor [I]"),
    "sgdt/sidt/str/sldt": ((2, 10), "[I]"),
    "segment load": ((10, 20), "MOV Sreg, r: microcoded [I]"),
    "fsgsbase": ((5, 30), "RD/WR FS/GS BASE; SWAPGS is about the same (tglx) [I]"),
    "pkru": ((20, 30), "RDPKRU/WRPKRU [I]"),
    "invpcid": ((200, 400), "INVPCID, all contexts [I]"),
    "popf": ((10, 20), "POPF in ring 0 [I]"),
    "iretq": ((150, 300), "IRET to ring 3 (~270 measured with its bookkeeping) [S]"),
    "exception": ((300, 450), "the guest's INT or exception into ring 0 (~440 with bookkeeping) [S]"),
    "syscall": ((50, 100), "SYSCALL into ring 0, no stack or privilege-table work [I]"),
    "other": ((0.3, 1), "ordinary instructions [I]"),
}

# A null system call on the same hardware: getpid without PTI, 0.06 us at
# 2.5 GHz (PVM, Table 2) and 62 ns at 2.6 GHz (Ant's gVisor figures) [P].
GETPID_CYCLES = (150, 161)


def klass(op, args):
    if op in ("wrmsr", "rdmsr", "iretq", "invpcid"):
        return op
    if op in ("movq", "movl") and args.endswith(("%cr3",)):
        return "mov-cr3"
    if op in ("movq", "movl") and args.endswith("%cr0"):
        return "mov-cr0"
    if op in ("movq", "movl") and args.endswith("%cr4"):
        return "mov-cr4"
    if op in ("movq", "movl") and re.match(r"%cr\d,", args):
        return "read-cr"
    if op in ("lgdtq", "lidtq", "lgdt", "lidt"):
        return "lgdt/lidt"
    if op in ("ltrw", "ltr"):
        return "ltr"
    if op in ("lldtw", "lldt"):
        return "lldt"
    if op in ("sgdtq", "sidtq", "strw", "sldtw", "sgdt", "sidt", "str", "sldt"):
        return "sgdt/sidt/str/sldt"
    if op in ("movw", "movl") and re.search(r", %[defgs]s$", args):
        return "segment load"
    if op in ("rdfsbaseq", "wrfsbaseq", "rdgsbaseq", "wrgsbaseq", "rdfsbase", "wrfsbase", "rdgsbase", "wrgsbase"):
        return "fsgsbase"
    if op in ("rdpkru", "wrpkru"):
        return "pkru"
    if op in ("popfq", "popf"):
        return "popf"
    return "other"


def load(ko):
    syms = {}
    for line in subprocess.run(["llvm-objdump-19", "-t", ko], capture_output=True, text=True, check=True).stdout.splitlines():
        f = line.split()
        if len(f) >= 5 and f[-1].startswith("lguest_"):
            syms[f[-1]] = int(f[0], 16)
    dis = subprocess.run(["llvm-objdump-19", "-d", "--no-show-raw-insn", ko], capture_output=True, text=True, check=True).stdout
    insn = {}
    # .text and the switcher's section (the module's addresses are per
    # section; the switcher's functions are all in .text.lguest_switcher
    # or .text, whose ranges do not overlap in a .ko's disassembly).
    for m in re.finditer(r"^ +([0-9a-f]+):[ \t]+(\S+)[ \t]*([^<#\n]*)", dis.split("Disassembly of section .exit.text")[0], re.M):
        insn[int(m.group(1), 16)] = (m.group(2), m.group(3).strip())
    return syms, insn


# The block's fields the switcher tests (offsets from switcher_64.S).
FIELD = {
    "pkru_on": 16564, "cet_on": 16568, "guest_fpu": 16572, "flush_global": 100,
    "fsgsbase": 120, "sysenter": 124, "direct": 128, "user_mode": 132,
    "nmi_pending": 16, "mc_pending": 24, "irq_waiting": 208, "ibpb": 212,
    "host_ldt": 16482, "host_ds": 16484, "host_es": 16486, "host_fs": 16488, "host_gs": 16490,
}
# The host as a launcher leaves it: no LDT, and the four data selectors
# null (execve loads null DS, ES, FS and GS for a 64-bit process; the
# host_selectors test sees it); the guest's selectors are null too.
HOST = {"host_ldt": 0, "host_ds": 0, "host_es": 0, "host_fs": 0, "host_gs": 0}
LG_GUEST_ENTRY, LG_HOST_RESUME = 16592, 16600
# STAR and SYSCALL_MASK as the entry found them, and the host kernel's:
# the walk takes them equal (the host's own values live, as they are but
# where KVM left its guest's), so neither is written (SET_IF_OTHER).
SAME_MSR_PAIRS = ({16624, 16640}, {16632, 16648})
# The frame's vector slot (LG_FRAME + 15 * 8), where the direct paths keep
# RSP while they address page 0 relative to it.
VECTOR_SLOT = 3920 + 15 * 8
STUB_SIZE = 32


def walk(syms, insn, fields, vector, from_guest=True, exit_by=None):
    """The classes of the instructions one round trip executes (a dict of
    counts), and the number of instructions. The guest comes back by
    `vector`'s stub, or by `exit_by` (a symbol, entered by SYSCALL)."""
    block = {FIELD[k]: v for k, v in fields.items()}
    order = sorted(insn)
    nxt_of = {a: b for a, b in zip(order, order[1:])}
    pc = syms["lguest_switch_to_guest"]
    stack = ["caller"]
    regs = {}
    zf = None
    rsp_adj = 0
    counts = {}
    n = 0
    in_guest_done = False
    trace = []

    def count(k):
        counts[k] = counts.get(k, 0) + 1

    while pc != "caller":
        op, args = insn[pc]
        nxt = nxt_of[pc]
        n += 1
        trace.append(pc)
        if n > 5000:
            sys.exit("switch_inventory: no end to the walk; last: " + " ".join(f"{a:#x}" for a in trace[-12:]))
        count(klass(op, args))
        tgt = lambda: int(args.split()[0], 16)
        m_off = re.match(r"\$0x([0-9a-f]+), 0x([0-9a-f]+)\(%rdi\)$", args)
        if op == "iretq" and pc == syms["lguest_iretq"]:
            # Into the guest, which comes back by `vector`: the CPU pushes
            # the frame and runs that vector's stub.
            if in_guest_done:
                sys.exit("switch_inventory: a second iretq into the guest")
            in_guest_done = True
            if exit_by:
                count("syscall")
                pc = syms[exit_by]
                rsp_adj = 0
            else:
                count("exception")
                pc = syms["lguest_idt_stubs"] + STUB_SIZE * vector
            continue
        if op in ("callq", "call"):
            stack.append(nxt)
            if args == "*%rax":
                pc = regs["rax"]
            else:
                pc = tgt()
            continue
        if op in ("retq", "ret"):
            pc = stack.pop()
            continue
        if op == "jmp":
            pc = tgt()
            continue
        if op in ("je", "jne", "jz", "jnz"):
            if zf is None:
                sys.exit(f"switch_inventory: {pc:#x}: {op} on flags the walker does not know")
            taken = zf if op in ("je", "jz") else not zf
            pc = tgt() if taken else nxt
            zf = None
            continue
        if op.startswith("j"):
            sys.exit(f"switch_inventory: {pc:#x}: no model for {op} {args}")
        # What the branches depend on.
        m_rsp = re.match(r"\$0x([0-9a-f]+), (-?0x[0-9a-f]+)\(%rsp\)$", args)
        if op in ("cmpl", "cmpq") and m_rsp and not m_off:
            # The direct paths' page-0 fields, relative to the vector slot.
            off = VECTOR_SLOT + rsp_adj + int(m_rsp.group(2), 16)
            if off not in block:
                sys.exit(f"switch_inventory: {pc:#x}: a test of block offset {off} the walker does not know")
            zf = block[off] == int(m_rsp.group(1), 16)
            pc = nxt
            continue
        if op == "addq" and args == "$0x10, %rsp":
            rsp_adj += 16
        if op == "subq" and args == "$0x10, %rsp":
            rsp_adj -= 16
        if op == "shrq" and args == "$0x23, %rax":
            # lguest_sysret's check of the user RIP: a lower-half one.
            zf = True
            pc = nxt
            continue
        if op in ("cmpl", "cmpb", "cmpq", "cmpw") and m_off:
            off = int(m_off.group(2), 16)
            if off not in block:
                sys.exit(f"switch_inventory: {pc:#x}: a test of block offset {off} the walker does not know")
            zf = block[off] == int(m_off.group(1), 16)
        elif op in ("movl", "movw") and re.match(r"%[defgs]s, %e?ax$", args):
            regs["ax"] = 0  # the guest's selector: null
        elif op == "cmpw" and re.match(r"0x([0-9a-f]+)\(%rdi\), %ax$", args):
            off = int(args.split("(")[0], 16)
            if off not in block or "ax" not in regs:
                sys.exit(f"switch_inventory: {pc:#x}: {op} {args}: unknown operands")
            zf = block[off] == regs["ax"]
        elif op == "testb" and args == "$0x3, 0x18(%rsp)":
            zf = not from_guest
        elif op in ("testl", "testq") and args in ("%r15d, %r15d", "%r15, %r15"):
            zf = regs.get("r15", 0) == 0
        elif op == "movl" and args == "$0x1, %r15d":
            regs["r15"] = 1
        elif op == "xorl" and args == "%r15d, %r15d":
            regs["r15"] = 0
        elif op == "movq" and re.match(r"0x([0-9a-f]+)\(%rdi\), %rax$", args):
            off = int(args.split("(")[0], 16)
            regs["rax"] = {LG_GUEST_ENTRY: syms["lguest_guest_entry"], LG_HOST_RESUME: syms["lguest_host_resume"]}.get(off)
            regs["rax_from"] = off
        elif op == "cmpq" and re.match(r"0x([0-9a-f]+)\(%rdi\), %rax$", args):
            off = int(args.split("(")[0], 16)
            if {off, regs.get("rax_from")} not in SAME_MSR_PAIRS:
                sys.exit(f"switch_inventory: {pc:#x}: {op} {args}: unknown operands")
            zf = True
        elif op == "movq" and args == "0x4000(%rdi), %rsp":
            # LG_HOST_RSP: the host stack as it was before the entry's
            # call (whose return address is never used).
            stack = ["caller"]
        elif op == "movq" and args == "%rax, (%rsp)":
            stack[-1] = regs["rax"]
        elif op in ("pushq", "push", "pushfq"):
            pass
        elif re.match(r"(sub|add|and|or|xor|test|cmp|dec|inc)", op):
            zf = None  # flags the walker does not track
        pc = nxt
    return counts, n


def walk_direct(syms, insn, fields, start, entered_by):
    """One direct switch: from `start` (SYSCALL's entry, or the stub of
    the direct return's vector) to its iretq back into the guest; the
    event that entered it (`entered_by`: syscall or exception) counted."""
    block = {FIELD[k]: v for k, v in fields.items()}
    order = sorted(insn)
    nxt_of = {a: b for a, b in zip(order, order[1:])}
    pc = start
    counts = {entered_by: 1}
    n, zf, rsp_adj, ecx = 0, None, 0, None
    while True:
        op, args = insn[pc]
        nxt = nxt_of[pc]
        n += 1
        if n > 500:
            sys.exit("switch_inventory: no end to the direct walk")
        # A WRMSR of MSR_IA32_PRED_CMD (0x49) is the barrier, not an MSR write.
        k = "ibpb" if op == "wrmsr" and ecx == 0x49 else klass(op, args)
        counts[k] = counts.get(k, 0) + 1
        if op == "movl" and args.endswith(", %ecx") and args.startswith("$"):
            ecx = int(args.split(",")[0][1:], 16)
        if op == "iretq":
            return counts, n
        m_rsp = re.match(r"\$0x([0-9a-f]+), (-?0x[0-9a-f]+)\(%rsp\)$", args)
        if op == "jmp":
            pc = int(args.split()[0], 16)
            continue
        if op in ("je", "jne", "jz", "jnz"):
            if zf is None:
                sys.exit(f"switch_inventory: {pc:#x}: {op} on flags the walker does not know")
            taken = zf if op in ("je", "jz") else not zf
            pc = int(args.split()[0], 16) if taken else nxt
            zf = None
            continue
        if op.startswith("j") or op in ("callq", "call", "retq", "ret"):
            sys.exit(f"switch_inventory: {pc:#x}: no model for {op} {args} in a direct path")
        if op in ("cmpl", "cmpq") and m_rsp:
            off = VECTOR_SLOT + rsp_adj + int(m_rsp.group(2), 16)
            if off not in block:
                sys.exit(f"switch_inventory: {pc:#x}: a test of block offset {off} the walker does not know")
            zf = block[off] == int(m_rsp.group(1), 16)
        elif op == "testb" and args == "$0x3, 0x18(%rsp)":
            zf = False  # from the guest
        elif op == "shrq" and args == "$0x23, %rax":
            zf = True  # a lower-half user RIP
        elif op == "addq" and args == "$0x10, %rsp":
            rsp_adj += 16
        elif re.match(r"(sub|add|and|or|xor|test|cmp|dec|inc|shr)", op):
            zf = None
        pc = nxt


def weighted(counts):
    lo = sum(c * COSTS[k][0][0] for k, c in counts.items())
    hi = sum(c * COSTS[k][0][1] for k, c in counts.items())
    return lo, hi


def mitigations(ko, syms):
    """The mitigation sites, which TCG cannot observe: the instructions each
    runs when the host has its feature (Documentation/switcher.rst,
    Speculation), found by running the module's own code for them on a
    small model of the few instructions they use."""
    dis = subprocess.run(["llvm-objdump-19", "-d", "--no-show-raw-insn", ko], capture_output=True, text=True, check=True).stdout
    insn = {}
    for m in re.finditer(r"^ +([0-9a-f]+):[ \t]+(\S+)[ \t]*([^<\n]*)", dis.split("Disassembly of section .exit.text")[0], re.M):
        insn[int(m.group(1), 16)] = (m.group(2), m.group(3).strip())
    order = sorted(insn)
    def run(name):
        """Instructions executed by a call of `name`, the call and RET included."""
        pc, regs, stack, count = syms[name], {}, ["caller"], 1
        while pc != "caller":
            op, args = insn[pc]
            nxt = order[order.index(pc) + 1]
            count += 1
            if count > 100000:
                sys.exit(f"bench: {name}: no end")
            tgt = lambda: int(args.split()[0], 16)
            if op in ("callq", "call"):
                stack.append(nxt); pc = tgt(); continue
            if op in ("retq", "ret"):
                pc = stack.pop(); continue
            if op == "jmp":
                pc = tgt(); continue
            if op in ("jne", "jnz"):
                pc = tgt() if regs["zf"] == 0 else nxt; continue
            if op in ("movl", "movq") and args.startswith("$"):
                v, r = args.split(", "); regs[r] = int(v[1:], 16)
            elif op in ("subl", "subq"):
                v, r = args.split(", "); regs[r] -= int(v[1:], 16); regs["zf"] = int(regs[r] == 0)
            elif op in ("pushq", "push"):
                stack.append(None)
            elif op in ("popq", "pop"):
                stack.pop()
            elif op not in ("movq", "movl", "xorl", "wrmsr", "lfence", "nop", "nopw", "nopl"):
                sys.exit(f"bench: {name}: no model for {op} {args}")
            pc = nxt
        return count
    # FILL_RETURN_BUFFER (nospec-branch.h, RSB_CLEAR_LOOPS 32) is an
    # alternative inside lguest_ibpb, a jmp over NOPs in the file (the jmp
    # is what it replaces): mov, 16
    # rounds of two calls, add, dec, jnz, then lfence.
    rsb_fill = 1 + 16 * 5 + 1
    bhb = run("lguest_clear_bhb_loop")
    ibpb = run("lguest_ibpb")
    print("bench: mitigation_verw 1 insns on entry (X86_FEATURE_CLEAR_CPU_BUF: verw before the iretq)")
    print("bench: mitigation_untrain_ret 1 call on exit, plus the kernel's entry_untrain_ret or srso_alias_untrain_ret (X86_FEATURE_UNRET, X86_FEATURE_SRSO_ALIAS)")
    print(f"bench: mitigation_ibpb {ibpb} insns on exit, one a wrmsr of PRED_CMD (X86_FEATURE_ENTRY_IBPB), {ibpb - 1 + rsb_fill} with the return-stack fill (the jmp over it replaced) (X86_BUG_IBPB_NO_RET)")
    print(f"bench: mitigation_clear_bhb {bhb} insns on exit (X86_FEATURE_CLEAR_BHB_LOOP, X86_FEATURE_CLEAR_BHB_VMEXIT)")


def main():
    syms, insn = load(sys.argv[1])
    paths = [
        ("hypercall", "a hypercall (int $0x1f) on an Intel host with FSGSBASE, guest FPU state loaded", {"guest_fpu": 1}, 0x1F),
        ("hypercall_nofpu", "the same before the guest's first FPU use (CR0.TS set for it)", {"guest_fpu": 0}, 0x1F),
        ("hypercall_upper", "the same for an upper-half guest on a host with INVPCID", {"guest_fpu": 1, "flush_global": 1}, 0x1F),
        ("nmi", "an NMI that hit the guest (IST stack, the frame moved)", {"guest_fpu": 1}, 2),
        ("hypercall_amd", "a hypercall on an AMD host (no SYSENTER in long mode)", {"guest_fpu": 1, "sysenter": 0}, 0x1F),
        ("hypercall_nofsgsbase", "a hypercall on a host without FSGSBASE (the bases by MSR)", {"guest_fpu": 1, "fsgsbase": 0}, 0x1F),
        ("hypercall_pkru", "a hypercall on a host with protection keys (PKRU switched)", {"guest_fpu": 1, "pkru_on": 1}, 0x1F),
        ("hypercall_cet", "a hypercall on a host with user shadow stacks (U_CET, PL3_SSP switched)", {"guest_fpu": 1, "cet_on": 1}, 0x1F),
    ]
    for name, what, fields, vector in paths:
        # An Intel host with FSGSBASE (Linux turns it on where the CPU has
        # it, since 5.9), without protection keys or user shadow stacks.
        f = {"pkru_on": 0, "cet_on": 0, "flush_global": 0, "fsgsbase": 1, "sysenter": 1, "direct": 0, **HOST}
        f.update(fields)
        counts, n = walk(syms, insn, f, vector)
        if name == "hypercall":
            lo, hi = weighted(counts)
            print(f"bench: switch_executed_{name} {n} insns ({what})")
            for k in COSTS:
                if k in counts and k != "other":
                    print(f"bench: switch_{name}_{k.replace('/', '_').replace(' ', '_')} {counts[k]} per round trip ({COSTS[k][0][0]}-{COSTS[k][0][1]} cycles each: {COSTS[k][1]})")
            print(f"bench: switch_weighted_{name} {lo:.0f}-{hi:.0f} cycles (hardware estimate of one round trip)")
            print(f"bench: switch_weighted_{name}_vs_getpid {lo / GETPID_CYCLES[1]:.1f}-{hi / GETPID_CYCLES[0]:.1f} ratio (to a no-PTI getpid of {GETPID_CYCLES[0]}-{GETPID_CYCLES[1]} cycles)")
        else:
            lo, hi = weighted(counts)
            print(f"bench: switch_executed_{name} {n} insns, weighted {lo:.0f}-{hi:.0f} cycles ({what})")
    # The direct system call: the switcher's own moves between the guest's
    # modes, without the world switch (Documentation/switcher.rst, "The
    # direct system call"), and the kernel-mode SYSCALL, a hypercall.
    base = {"pkru_on": 0, "cet_on": 0, "flush_global": 0, "fsgsbase": 1, "sysenter": 1, "direct": 1,
            "nmi_pending": 0, "mc_pending": 0, "irq_waiting": 0, "ibpb": 0, **HOST}
    sc, n1 = walk_direct(syms, insn, {**base, "user_mode": 1}, syms["lguest_syscall"], "syscall")
    sr, n2 = walk_direct(syms, insn, {**base, "user_mode": 0}, syms["lguest_idt_stubs"] + STUB_SIZE * 0x1B, "exception")
    both = {k: sc.get(k, 0) + sr.get(k, 0) for k in set(sc) | set(sr)}
    for name, counts, n, what in [
        ("direct_syscall", sc, n1, "a user syscall to the guest kernel's entry"),
        ("direct_sysret", sr, n2, "int $0x1b back to user mode"),
    ]:
        lo, hi = weighted(counts)
        print(f"bench: switch_executed_{name} {n} insns, weighted {lo:.0f}-{hi:.0f} cycles ({what})")
    # The same with the guest's barrier at each entry from user mode
    # (LHCALL_IBPB, LGUEST_IBPB_USER_ENTRY, on a host with IBPB).
    sci, n3 = walk_direct(syms, insn, {**base, "user_mode": 1, "ibpb": 1}, syms["lguest_syscall"], "syscall")
    lo, hi = weighted(sci)
    print(f"bench: switch_executed_direct_syscall_ibpb {n3} insns, weighted {lo:.0f}-{hi:.0f} cycles "
          f"(the same with the guest's IBPB at each entry from user mode, LGUEST_IBPB_USER_ENTRY)")
    lo, hi = weighted(both)
    print(f"bench: switch_weighted_direct_round_trip {lo:.0f}-{hi:.0f} cycles (the switcher's part of a guest null system call: "
          f"{', '.join(f'{both[k]} {k}' for k in COSTS if k in both and k != 'other')})")
    print(f"bench: switch_weighted_direct_round_trip_vs_getpid {lo / GETPID_CYCLES[1]:.1f}-{hi / GETPID_CYCLES[0]:.1f} ratio (to a no-PTI getpid)")
    counts, n = walk(syms, insn, {**base, "guest_fpu": 1, "user_mode": 0}, 0x1F, exit_by="lguest_syscall")
    lo, hi = weighted(counts)
    print(f"bench: switch_executed_hypercall_syscall {n} insns, weighted {lo:.0f}-{hi:.0f} cycles "
          f"(a hypercall by SYSCALL from a kernel with a direct entry: LSTAR switched instead of EFER)")
    print(f"bench: switch_weighted_hypercall_syscall_vs_getpid {lo / GETPID_CYCLES[1]:.1f}-{hi / GETPID_CYCLES[0]:.1f} ratio")
    mitigations(sys.argv[1], syms)


if __name__ == "__main__":
    main()
