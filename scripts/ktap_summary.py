#!/usr/bin/env python3
# SPDX-License-Identifier: GPL-2.0
"""Reads the QEMU console logs of a test run and prints the verdict.

For each console log (one per CPU model) it collects the KTAP results of
every test case and every test program from LOG's sibling LOG.ktap (the
clean stream of the second serial port; the console log itself if that is
missing), checks that the harness reached its end, and scans the whole
console log for kernel reports (oops, BUG, WARNING, KASAN, lockdep,
kmemleak, panic). Each distinct report counts as one failure. The last line
is "N passed, M failed[, K skipped]"; the exit status is 1 on any failure.

usage: ktap_summary.py [--cargo PASSED:FAILED] LABEL::LOG...
"""
import re
import sys

LEAF = re.compile(r"^# (not ok|ok) \d+ (\S+)(.*)$")
PROG = re.compile(r"^(not ok|ok) \d+ selftests: lguest: (\S+)(.*)$")
REPORTS = [
    re.compile(p) for p in (
        r"Oops", r"\bBUG[: ]", r"WARNING:", r"KASAN", r"UBSAN",
        r"possible circular locking", r"possible recursive locking",
        r"inconsistent lock state", r"suspicious RCU usage",
        r"lockdep", r"unreferenced object", r"Kernel panic",
        r"general protection fault", r"Call Trace:", r"kernel BUG",
        r"sleeping function called from invalid context",
        r"list_(add|del) corruption", r"stack-protector", r"double fault",
        r"rcu: INFO", r"detected stalls", r"soft lockup", r"hard LOCKUP",
        r"blocked for more than", r"kthread starved",
        r"switcher took exception", r"Disabling lock debugging",
    )
]
STAMP = re.compile(r"^\[\s*\d+\.\d+\]\s*")
# The lines of an NMI backtrace (SysRq-L): what an "expected backtraces"
# window lets through, and nothing else.
BACKTRACE = re.compile(
    r"^(NMI backtrace for cpu \d+|Sending NMI from CPU|Call Trace:|CPU: \d+ |Hardware name:"
    r"|\s*</?(NMI|IRQ|TASK)>|\s*\? |\s*[\w.]+\+0x[0-9a-f]+/0x[0-9a-f]+"
    r"|\s*(RIP|RSP|RAX|RDX|RBP|R10|R13|FS|CS|CR2|DR0|DR3|PKRU|Code):)"
)
PROG_BOUNDARY = re.compile(r"^(# selftests: lguest: |(not )?ok \d+ selftests: lguest: )")
WINDOW = 2000


def scan(label, path):
    passed = failed = skipped = 0
    messages = []
    try:
        text = open(path, errors="replace").read()
    except OSError as e:
        return 0, 1, 0, [f"{label}: cannot read {path}: {e}"]
    lines = [l.rstrip("\r") for l in text.splitlines()]
    ktap_path = path[:-4] + ".ktap" if path.endswith(".log") else path + ".ktap"
    try:
        ktap = [l.rstrip("\r") for l in open(ktap_path, errors="replace").read().splitlines()]
    except OSError:
        ktap = lines
    progs = {}
    prog_results = 0
    leaf_fail_in = set()
    current = None
    for line in ktap:
        m = re.match(r"^# selftests: lguest: (\S+)", line)
        if m:
            current = m.group(1)
        m = LEAF.match(line)
        if m and not line.startswith("# Totals"):
            status, name, rest = m.groups()
            if "# SKIP" in rest:
                skipped += 1
            elif status == "ok":
                passed += 1
            else:
                failed += 1
                leaf_fail_in.add(current)
                messages.append(f"{label}: FAIL {current}:{name}")
            continue
        m = PROG.match(line)
        if m:
            status, prog, rest = m.groups()
            progs[prog] = (status, rest)
            prog_results += 1
            if status == "not ok" and prog not in leaf_fail_in:
                # The program died, timed out or failed outside a test case.
                failed += 1
                messages.append(f"{label}: FAIL program {prog}{rest}")
    if not any(l.startswith("lguest-harness: done") for l in lines + ktap):
        failed += 1
        messages.append(f"{label}: the host did not reach the end of the run (crash, hang or watchdog)")
    for l in lines:
        m = re.search(r"lguest-harness: lockdep debug_locks (\S*)", l)
        if m and m.group(1) != "1":
            failed += 1
            messages.append(f"{label}: lock debugging was off at the end of the run (debug_locks {m.group(1)!r}): lockdep checked nothing after its first report or a taint")
    if not progs:
        failed += 1
        messages.append(f"{label}: no test program reported a result")
    plans = [int(m.group(1)) for m in (re.match(r"^1\.\.(\d+)$", l) for l in ktap) if m]
    if plans and prog_results < plans[0]:
        failed += plans[0] - prog_results
        messages.append(f"{label}: {plans[0] - prog_results} test program(s) never reported (crash, hang or watchdog)")
    seen = set()
    expected = 0  # lines left in an "expected backtraces" window
    for line in lines:
        body = STAMP.sub("", line)
        # A test that provokes backtraces on purpose (the NMI test's SysRq-L)
        # brackets them with markers. Inside, only the shapes of a backtrace
        # are let through; every real report still counts. The window also
        # closes at the next program boundary, or after WINDOW lines that
        # are not backtrace lines, so a test that dies inside it cannot hide
        # the rest of the log.
        if "lguest-selftest: expected backtraces begin" in line:
            expected = WINDOW
        elif "lguest-selftest: expected backtraces end" in line or PROG_BOUNDARY.match(body):
            expected = 0
        if line.startswith("# ") or line.startswith("lguest-harness: "):
            continue  # test programs' and the harness's own output
        if expected:
            if BACKTRACE.search(body):
                continue
            expected -= 1
        for r in REPORTS:
            if r.search(line):
                key = body
                if key not in seen:
                    seen.add(key)
                    failed += 1
                    messages.append(f"{label}: kernel report: {key}")
                break
    return passed, failed, skipped, messages


def main(argv):
    passed = failed = skipped = 0
    msgs = []
    args = argv[1:]
    if args and args[0] == "--cargo":
        p, f = args[1].split(":")
        passed += int(p)
        failed += int(f)
        if int(f):
            msgs.append(f"cargo test: {f} failed")
        args = args[2:]
    for a in args:
        label, path = a.split("::", 1)
        p, f, s, m = scan(label, path)
        print(f"{label}: {p} passed, {f} failed, {s} skipped ({path})")
        passed, failed, skipped = passed + p, failed + f, skipped + s
        msgs += m
    for m in msgs:
        print(m)
    line = f"{passed} passed, {failed} failed"
    if skipped:
        line += f", {skipped} skipped"
    print(line)
    return 1 if failed or passed == 0 else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
