#!/bin/bash
# SPDX-License-Identifier: GPL-2.0
#
# `make bochs-test`: the targeted set (selftests/bochs.list) on the second
# test bed, Bochs 2.7 with its tigerlake CPU model, where a ring-0 #GP on
# iretq, CET/IBT and global TLB entries are modelled as on hardware
# (Documentation/dev/testing.rst, "make bochs-test"). Builds everything with build.sh,
# boots the same bzImage and initramfs as the QEMU runs from a CD image
# (isolinux), once per CPU count the chosen tests need, and judges the runs
# with ktap_summary.py like `make test`.
#
#   T=PROG[:TEST],...   run these instead of the list (CPU count from the
#                       list, else 2)
#   BOCHS_CPUS=1|2      one boot with this many CPUs for every test
#   WATCHDOG=SECONDS    wall-clock limit for one boot (default 1800)
#   BOCHS_IPS           Bochs's emulated instructions per second (40000000)
#   KARGS               extra kernel command-line arguments
#   BOCHS_NOBUILD=1     boot what is already in $LGUEST_OUT
# Console logs, KTAP streams and Bochs's own logs go to $CACHE/logs/.
set -euo pipefail
. "$(dirname "$0")/env.sh"
WATCHDOG=${WATCHDOG:-1800}
IPS=${BOCHS_IPS:-40000000}
LIST="$REPO/selftests/bochs.list"

say()  { printf '[bochs] %s\n' "$*"; }
fail() { printf '[bochs] ERROR: %s\n' "$*" >&2; exit 1; }

start=$(date +%s)
if [ "${BOCHS_NOBUILD:-0}" = 1 ]; then
	OUT="${LGUEST_OUT:-$CACHE/out/$FLAVOUR}"
else
	OUT=$(bash "$REPO/scripts/build.sh")
fi
[ -f "$OUT/bzImage" ] && [ -f "$OUT/initramfs.gz" ] || fail "no bzImage/initramfs.gz in $OUT"
for f in /usr/bin/bochs /usr/lib/ISOLINUX/isolinux.bin /usr/lib/syslinux/modules/bios/ldlinux.c32 \
	 /usr/share/bochs/BIOS-bochs-latest /usr/share/bochs/VGABIOS-lgpl-latest /usr/bin/genisoimage; do
	[ -e "$f" ] || fail "$f missing: run scripts/setup.sh"
done

# The tests and the CPUs each needs: "PROG:TEST CPUS" lines.
list_cpus() { awk -v t="$1" '$1 == t { print $2; exit }' "$LIST"; }
sel=()
if [ -n "${T:-}" ]; then
	for t in ${T//,/ }; do
		c=$(list_cpus "$t"); sel+=("$t ${c:-2}")
	done
else
	while read -r t c _; do
		case "$t" in ''|'#'*) continue ;; esac
		sel+=("$t $c")
	done <"$LIST"
fi
[ ${#sel[@]} -gt 0 ] || fail "no tests chosen"
if [ -n "${BOCHS_CPUS:-}" ]; then
	counts=$BOCHS_CPUS
else
	counts=$(printf '%s\n' "${sel[@]}" | awk '{ print $2 }' | sort -un)
fi
for c in $counts; do
	case "$c" in 1|2) ;; *) fail "CPU count $c: 1 or 2" ;; esac
done

mkdir -p "$CACHE/logs"
stamp=$(date +%Y%m%d-%H%M%S)
work=$(mktemp -d "${TMPDIR:-/tmp}/lguest-bochs.XXXXXX")
trap 'rm -rf "$work"' EXIT

# One boot: boot N "TESTS" LOG. The console (com1, ttyS0) goes to LOG and
# the KTAP stream (com2, ttyS1, which harness/init tees it to) to LOG's
# .ktap, as in the QEMU runs.
boot() {
	local n=$1 tests=$2 log=$3 d="$work/boot$1"
	mkdir -p "$d/iso/isolinux"
	cp /usr/lib/ISOLINUX/isolinux.bin /usr/lib/syslinux/modules/bios/ldlinux.c32 "$d/iso/isolinux/"
	cp "$OUT/bzImage" "$d/iso/bzimage"
	cp "$OUT/initramfs.gz" "$d/iso/initrd.gz"
	# nopku clearcpuid=xsaves,xsavec: Bochs 2.7 reports XSAVE sizes that
	# Linux's FPU set-up rejects (it oopses at boot); ht: its CPUID leaf
	# 1 and 4 core counts disagree, a boot WARNING otherwise.
	local args="console=ttyS0 panic=-1 loglevel=6 nopku clearcpuid=xsaves,xsavec,ht lgtest.bed=bochs lgtest.mode=test lgtest.tests=$tests ${KARGS:-}"
	cat >"$d/iso/isolinux/isolinux.cfg" <<-EOF
	DEFAULT lg
	PROMPT 0
	TIMEOUT 0
	LABEL lg
	  KERNEL /bzimage
	  INITRD /initrd.gz
	  APPEND $args
	EOF
	genisoimage -quiet -o "$d/boot.iso" -b isolinux/isolinux.bin -c isolinux/boot.cat \
		-no-emul-boot -boot-load-size 4 -boot-info-table -J -R -V LGUEST "$d/iso" \
		|| fail "genisoimage failed"
	rm -rf "$d/iso"
	: >"$log"
	: >"${log%.log}.ktap"
	# reset_on_triple_fault=0: a panic reboots (panic=-1) into the BIOS,
	# which then triple-faults, and Bochs stops instead of looping.
	cat >"$d/bochsrc" <<-EOF
	megs: 2048
	romimage: file=/usr/share/bochs/BIOS-bochs-latest
	vgaromimage: file=/usr/share/bochs/VGABIOS-lgpl-latest
	cpu: model=tigerlake, count=$n, ips=$IPS, reset_on_triple_fault=0
	pci: enabled=1, chipset=i440fx
	display_library: term
	ata0: enabled=1, ioaddr1=0x1f0, ioaddr2=0x3f0, irq=14
	ata0-master: type=cdrom, path=$d/boot.iso, status=inserted
	boot: cdrom
	com1: enabled=1, mode=file, dev=$log
	com2: enabled=1, mode=file, dev=${log%.log}.ktap
	clock: sync=none, time0=utc
	log: ${log%.log}.bochs
	panic: action=fatal
	error: action=report
	info: action=report
	debug: action=ignore
	mouse: enabled=0
	speaker: enabled=0
	EOF
	# The Debian build has the debugger and stops at its prompt: continue.
	printf 'c\nquit\n' >"$d/dbg.rc"
	say "booting Bochs ($n CPU$([ "$n" = 1 ] || echo s), watchdog ${WATCHDOG}s): $tests"
	say "console log: $log"
	local t0 rc bpid
	t0=$(date +%s)
	# Bochs's term display needs a terminal: script gives it one. SIGTERM
	# only drops Bochs into its debugger, so the watchdog sends SIGKILL.
	TERM=xterm timeout -s KILL "$WATCHDOG" nice -n 10 script -qec \
		"bochs -q -f $d/bochsrc -rc $d/dbg.rc" /dev/null </dev/null >"${log%.log}.term" 2>&1 &
	bpid=$!
	# The tests' progress as it comes (the KTAP results and the harness's
	# lines, from the clean stream; the harness's from the console), with
	# the wall-clock seconds since Bochs started.
	{ tail --pid=$bpid -n +1 -F "${log%.log}.ktap" 2>/dev/null | grep --line-buffered -aE '^(TAP|1\.\.|ok|not ok|# (ok|not ok|selftests|# [a-z0-9_]+: ))' &
	  tail --pid=$bpid -n +1 -F "$log" 2>/dev/null | grep --line-buffered -a '^lguest-harness'; wait; } |
		while IFS= read -r line; do printf '[%4d s] %s\n' $(( $(date +%s) - t0 )) "${line%$'\r'}"; done
	set +e
	wait $bpid
	rc=$?
	set -e
	# Bochs exits 1 on power-off and on a panic alike: the logs decide.
	[ $rc = 137 ] && say "watchdog: Bochs killed after ${WATCHDOG}s"
	say "boot with $n CPU(s): $(( $(date +%s) - t0 )) s wall"
	rm -f "$d/boot.iso"
}

logs=()
short=()
for c in $counts; do
	if [ -n "${BOCHS_CPUS:-}" ]; then
		tests=$(printf '%s\n' "${sel[@]}" | awk '{ print $1 }' | paste -sd, -)
	else
		tests=$(printf '%s\n' "${sel[@]}" | awk -v c="$c" '$2 == c { print $1 }' | paste -sd, -)
	fi
	log="$CACHE/logs/$stamp-$FLAVOUR-bochs-${c}cpu.log"
	boot "$c" "$tests" "$log"
	logs+=("bochs,cpus=$c::$log")
	# The harness runs what reached it on the kernel command line: a plan
	# short of what was asked would otherwise pass unnoticed.
	want=$(echo "$tests" | tr ',' '\n' | wc -l)
	plan=$(sed -n 's/\r$//; s/^1\.\.\([0-9]*\)$/\1/p' "${log%.log}.ktap" | head -1)
	if [ -n "$plan" ] && [ "$plan" != "$want" ]; then
		short+=("bochs,cpus=$c: the KTAP plan is 1..$plan, $want tests were asked for")
	fi
done

say "verdict"
set +e
python3 "$REPO/scripts/ktap_summary.py" "${logs[@]}"
rc=$?
set -e
for m in "${short[@]}"; do
	echo "$m"
	rc=1
done
say "$(( $(date +%s) - start )) s in all"
exit $rc
