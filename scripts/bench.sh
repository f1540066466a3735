#!/bin/bash
# SPDX-License-Identifier: GPL-2.0
#
# `make bench`: the benchmarks. Prints the static instruction count of one
# world switch (from lguest.ko), then boots the QEMU host with
# `-icount shift=0` (ICOUNT=0 to turn that off) and runs lguest_bench, then
# boots it again without -icount for the network benchmark lguest_netbench
# (NET_MIB per run, default 256, 0 leaves it out; NET_REPS runs per row,
# default 3, the median stands for the row).
set -euo pipefail
. "$(dirname "$0")/env.sh"
OUT=$(bash "$REPO/scripts/build.sh")

# Instructions on each path of the switcher, counted between its labels in
# lguest.ko (every instruction on the path, branches included).
python3 - "$OUT/module/lguest.ko" <<'PY'
import re, subprocess, sys
ko = sys.argv[1]
syms = {}
for l in subprocess.run(["llvm-objdump-19", "-t", ko], capture_output=True, text=True).stdout.splitlines():
    f = l.split()
    if len(f) >= 5 and f[-1].startswith("lguest_"):
        syms[f[-1]] = (int(f[0], 16), int(f[-2], 16))
addrs = [int(m.group(1), 16) for m in re.finditer(r"^ +([0-9a-f]+):\s",
         subprocess.run(["llvm-objdump-19", "-d", "--no-show-raw-insn", ko], capture_output=True, text=True).stdout, re.M)]
def n(a, b):
    return sum(1 for x in addrs if a <= x < b)
def whole(name):
    a, size = syms[name]
    return n(a, a + size)
sw = syms["lguest_switch_to_guest"]
entry = n(sw[0], syms["lguest_iretq"][0] + 1)
back = n(syms["lguest_host_return"][0], sw[0] + sw[1])
# The stub (ENDBR, push, push, jmp), the exit path and the way home. The
# mitigation sites (untraining, IBPB, BHB clearing, VERW) are alternatives:
# on a host without the feature they are NOPs, counted here as such.
out = 4 + whole("lguest_exit_common") + whole("lguest_restore_host")
print(f"bench: switcher_insns_entry {entry} insns (lguest_switch_to_guest to the iretq)")
print(f"bench: switcher_insns_exit {out + back} insns (stub, lguest_exit_common, lguest_restore_host, return)")
print(f"bench: switcher_insns_round_trip {entry + out + back} insns")

# The mitigation sites, which TCG cannot observe: the instructions each
# runs when the host has its feature (Documentation/switcher.rst,
# Speculation), found by running the module's own code for them on a
# small model of the few instructions they use.
dis = subprocess.run(["llvm-objdump-19", "-d", "--no-show-raw-insn", ko], capture_output=True, text=True).stdout
insn = {}
for m in re.finditer(r"^ +([0-9a-f]+):[ \t]+(\S+)[ \t]*([^<\n]*)", dis.split("Disassembly of section .exit.text")[0], re.M):
    insn[int(m.group(1), 16)] = (m.group(2), m.group(3).strip())
order = sorted(insn)
def run(name):
    """Instructions executed by a call of `name`, the call and RET included."""
    pc, regs, stack, count = syms[name][0], {}, ["caller"], 1
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
PY

mkdir -p "$CACHE/logs"
stamp=$(date +%Y%m%d-%H%M%S)
log="$CACHE/logs/$stamp-bench.log"
ICOUNT=${ICOUNT:-1} KTAP_LOG="${log%.log}.out" timeout -s KILL 3600 \
	bash "$REPO/scripts/qemu.sh" bench "${CPU:-max}" </dev/null >"$log" 2>&1 || true
grep '^bench:' "${log%.log}.out" || { tail -20 "$log"; echo "bench: failed (log $log)"; exit 1; }

# The network benchmark runs without -icount (NET_ICOUNT=1 to add it):
# it measures a guest's vCPU and the host's side of the devices (launcher
# threads, tap, TCP, the sink) running at the same time on the QEMU host's
# two CPUs, and -icount runs QEMU's CPUs one at a time. Compare its rows
# with each other, within one run.
[ "${NET_MIB:-256}" = 0 ] && exit 0
log="$CACHE/logs/$stamp-netbench.log"
ICOUNT=${NET_ICOUNT:-0} KTAP_LOG="${log%.log}.out" KARGS="lgtest.netmib=${NET_MIB:-256} lgtest.netreps=${NET_REPS:-3} ${KARGS:-}" \
	timeout -s KILL 5400 bash "$REPO/scripts/qemu.sh" netbench "${CPU:-max}" </dev/null >"$log" 2>&1 || true
grep '^bench:' "${log%.log}.out" || { tail -20 "$log"; echo "bench: net failed (log $log)"; exit 1; }
