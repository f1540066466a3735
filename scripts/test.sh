#!/bin/bash
# SPDX-License-Identifier: GPL-2.0
#
# `make test`: build everything, run the host-side `cargo test` and the module
# build tests (scripts/module-test.sh), then boot the
# QEMU host once per CPU model, run the selftests in it and print the verdict.
#
#   T=PROG[:TEST],...   run only these (e.g. T=lguest_dev_test:api_version)
#   CPUS="max,la57=off max"   the CPU models (4-level and 5-level paging)
#   FLAVOUR=distro      Debian's cloud-amd64 configuration (kernel/distro.config),
#                       booted with pti=on: what `make test` uses
#   FLAVOUR=normal      the small clang-built kernel (allnoconfig + host.config),
#                       the one `make run` and `make bochs-test` boot
#   FLAVOUR=debug       the debug host kernel (KASAN, lockdep, kmemleak)
#   LONG=1              run the long programs (the fuzzers) whole, not in
#                       their short form (LGUEST_SMOKE=1)
#   WATCHDOG=SECONDS    limit for one whole boot (default 2000, debug 3600,
#                       an hour more with LONG=1)
# Every console log is kept in $CACHE/logs/.
set -euo pipefail
. "$(dirname "$0")/env.sh"
CPUS=${CPUS:-"max,la57=off max"}
if [ "$FLAVOUR" = debug ]; then WATCHDOG=${WATCHDOG:-3600}; else WATCHDOG=${WATCHDOG:-2000}; fi
# The long runs (LONG=1, make debug-test and make fuzz) add up to an hour
# of fuzzing per boot on the debug kernel.
[ -n "${LONG:-}" ] && WATCHDOG=$((WATCHDOG + 3600))
# The distro kernel runs with page-table isolation forced on (QEMU's CPU
# models may not be Meltdown-affected, which would leave PTI off) and KASLR
# as Debian has it (on).
[ "$FLAVOUR" = distro ] && KARGS="pti=on${KARGS:+ $KARGS}"

start=$(date +%s)
OUT=$(bash "$REPO/scripts/build.sh")

echo "[test] cargo test (host-side crates)"
clog="$OUT/cargo-test.log"
set +e
# The userspace workspace, and the guest logic that runs on the build
# host too (the guest workspace's lguest-virtio crate).
{ ( cd "$REPO" && cargo test --quiet --workspace ) &&
  ( cd "$REPO/guest" && cargo test --quiet --target x86_64-unknown-linux-gnu -p lguest-virtio ); } >"$clog" 2>&1
crc=$?
set -e
cpass=$(sed -n 's/^test result: .* \([0-9]\+\) passed; \([0-9]\+\) failed.*/\1/p' "$clog" | awk '{s+=$1} END {print s+0}')
cfail=$(sed -n 's/^test result: .* \([0-9]\+\) passed; \([0-9]\+\) failed.*/\2/p' "$clog" | awk '{s+=$1} END {print s+0}')
if [ $crc != 0 ] && [ "$cfail" = 0 ]; then
	cat "$clog"
	cfail=1
fi
[ "$cfail" = 0 ] || grep -E "FAILED|panicked|error" "$clog" || true
echo "[test] cargo test: $cpass passed, $cfail failed"

# Building the module for "your own kernel": module.sh, DKMS, install, and
# the trees that must be refused (scripts/module-test.sh), against this
# flavour's kernel tree.
echo "[test] module builds (scripts/module-test.sh)"
mlog="$OUT/module-test.log"
set +e
bash "$REPO/scripts/module-test.sh" "$(bash "$REPO/scripts/kernel.sh")" >"$mlog" 2>&1
set -e
mpass=$(sed -n 's/^module-test: \([0-9]\+\) passed, \([0-9]\+\) failed$/\1/p' "$mlog")
mfail=$(sed -n 's/^module-test: \([0-9]\+\) passed, \([0-9]\+\) failed$/\2/p' "$mlog")
if [ -z "$mpass" ]; then
	cat "$mlog"
	mpass=0 mfail=1
fi
grep 'FAIL' "$mlog" || true
echo "[test] module builds: $mpass passed, $mfail failed"
cpass=$((cpass + mpass))
cfail=$((cfail + mfail))

# The Debian root filesystem (`make rootfs`), attached as the QEMU host's
# disk for lguest_run_test:linux_debian: built here where the Debian
# archive can be reached; otherwise that test skips and says why.
# ROOTFS=none leaves it out.
if [ -z "${ROOTFS:-}" ]; then
	if ROOTFS=$(bash "$REPO/scripts/rootfs.sh"); then
		echo "[test] the Debian root filesystem: $ROOTFS"
	else
		echo "[test] no Debian root filesystem (see above): lguest_run_test:linux_debian will skip"
		ROOTFS=
	fi
fi
[ "${ROOTFS:-}" = none ] && ROOTFS=
export ROOTFS

mkdir -p "$CACHE/logs"
stamp=$(date +%Y%m%d-%H%M%S)
logs=()
# The Debian boots (lguest_run_test:linux_debian) run in the boots of the
# CPU models in DEBIAN_CPUS, by default all of them; the others get no
# disk, and the test skips there, saying so (lgtest.nodebian=1).
DEBIAN_CPUS=${DEBIAN_CPUS-$CPUS}
# PARALLEL=1 (not yet the default: untried in CI) boots the CPU
# models' QEMU hosts side by side: a test run keeps about one of the
# emulator's threads busy (one vCPU thread at a time runs a guest), so two
# boots take little longer than one. Their lines on the terminal start
# with the model's name; each log is whole.
PARALLEL=${PARALLEL:-0}
boot() {
	local cpu=$1 log=$2 disk= note= prefix=
	case " $DEBIAN_CPUS " in *" $cpu "*) disk=$ROOTFS ;; esac
	[ -n "$ROOTFS" ] && [ -z "$disk" ] && note="; no Debian disk (DEBIAN_CPUS=$DEBIAN_CPUS)"
	[ "$PARALLEL" = 1 ] && prefix="[$cpu] "
	echo "[test] booting the QEMU host (cpu=$cpu, watchdog ${WATCHDOG}s$note); console log: $log"
	set +e
	ROOTFS=$disk KARGS="${KARGS:-}${LONG:+ lgtest.long=$LONG}${note:+ lgtest.nodebian=1}" KTAP_LOG="${log%.log}.ktap" timeout -s KILL "$WATCHDOG" bash "$REPO/scripts/qemu.sh" test "$cpu" "${T:-}" </dev/null 2>&1 \
		| tee "$log" | grep --line-buffered -E '^(TAP|1\.\.|ok|not ok|# (ok|not ok|selftests|.*: )|lguest-harness)' \
		| sed -u "s/^/$prefix/"
	set -e
}
# One CPU model's boot; the log to read goes to the file $2.
boot_cpu() {
	local cpu=$1 label="cpu=$1" log="$CACHE/logs/$stamp-$FLAVOUR-${1//[,=]/_}.log"
	boot "$cpu" "$log"
	# A host kernel that dies before the harness starts (before lguest.ko
	# or any test ran) is booted once more: QEMU 7.2's emulator has a
	# cross-CPU code-patching bug that sometimes kills the boot with an
	# Oops at an int3 the kernel's text patching left (testing.rst, "Known
	# issues"). The first log is kept; a second such boot fails the run.
	if ! grep -q 'lguest-harness:' "$log" && grep -qE 'Oops|Kernel panic' "$log"; then
		echo "[test] $label: the host kernel crashed before the harness started ($(grep -m1 -oE 'Oops: [^[]*' "$log" || echo panic)); booting it again"
		log="${log%.log}-again.log"
		boot "$cpu" "$log"
	fi
	echo "$label::$log" >"$2"
}
picks=$(mktemp -d)
i=0
for cpu in $CPUS; do
	i=$((i + 1))
	if [ "$PARALLEL" = 1 ]; then
		boot_cpu "$cpu" "$picks/$i" &
	else
		boot_cpu "$cpu" "$picks/$i"
	fi
done
wait
for n in $(seq 1 $i); do logs+=("$(cat "$picks/$n")"); done
rm -rf "$picks"

echo "[test] verdict"
set +e
python3 "$REPO/scripts/ktap_summary.py" --cargo "$cpass:$cfail" "${logs[@]}"
rc=$?
set -e
echo "[test] $(( $(date +%s) - start )) s in all"
exit $rc
