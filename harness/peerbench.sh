#!/bin/busybox sh
# SPDX-License-Identifier: GPL-2.0
#
# The peer benchmark inside the QEMU host (harness/init's `peerbench`
# mode; Documentation/dev/testing.rst, "Peers"). Runs lguest_peer_bench's
# `all` (start marker, getpid, demand-zero fault, fork) on the host itself
# and in each requested peer, every process pinned to CPU 1 (taskset), and
# prints, for each peer P and metric M (getpid, fault, fork, start_ms):
#
#   bench: peer_P_M <value> cycles|ms
#   bench: peer_P_M_vs_host <ratio> ratio     (to the host's own figure)
#
# Peers (lgtest.peers=, comma-separated, default all):
#   lguest          the Linux guest through the launcher (lginit=peer)
#   uml-ptrace      User-Mode Linux 7.3, ptrace userspace
#   uml-seccomp     the same with seccomp=on
#   gvisor-systrap  runsc do, --platform=systrap
#   gvisor-ptrace   runsc do, --platform=ptrace
# A requested peer that cannot run prints `bench: FAILED: peer P: reason`
# and the script exits 1 at the end.
#
# start_ms is the wall clock from the spawn of the environment to the
# program's first line (`peer: start`): the host's fork+exec, the Linux
# guest's boot, UML's boot, runsc's sandbox start.

BIN=${PEER_BIN:-/selftests/lguest/lguest_peer_bench}
GUESTS=/usr/share/lguest/guests
UML=${PEER_UML:-/usr/lib/uml/linux}
RUNSC=${PEER_RUNSC:-/usr/bin/runsc}
CPU=${PEER_CPU:-1}
TIMEOUT=${PEER_TIMEOUT:-1200}
# The counts: getpid calls, fault pages, fork rounds, samples.
COUNTS="${PEER_COUNTS:-20000 256 20 5}"
peers=${1:-all}
[ "$peers" = all ] && peers=lguest,uml-ptrace,uml-seccomp,gvisor-systrap,gvisor-ptrace
W=/tmp/peerbench
mkdir -p "$W" /run/runsc
failed=

fail() {
	echo "bench: FAILED: peer $1: $2"
	failed="$failed $1"
}

# run NAME CMD...: runs CMD under `lguest_peer_bench time`; its output
# (the peer: lines) goes to $W/NAME.out, the rest to the console.
run() {
	name=$1
	shift
	echo "peerbench: $name: $*" >&2
	"$BIN" time "$TIMEOUT" "$@" >"$W/$name.out"
	sed "s/^/peerbench: $name: /" "$W/$name.out" >&2
}

# value NAME METRIC: the figure of METRIC in NAME's output.
value() {
	case "$2" in
	start_ms) sed -n 's/^peer: start_ms \([0-9]*\) ms$/\1/p' "$W/$1.out" | head -1 ;;
	*) sed -n "s/^peer: $2 \\([0-9]*\\) cycles.*/\\1/p" "$W/$1.out" | head -1 ;;
	esac
}

# report NAME: the figures and the ratios to the host's; or why not.
report() {
	name=$1
	if ! grep -q '^peer: done$' "$W/$name.out"; then
		why=$(grep -m1 -E '^peer: (FAILED|timeout|exit)' "$W/$name.out")
		fail "$name" "${why:-no output} (no 'peer: done'; console lines above)"
		return
	fi
	for m in getpid fault fork start_ms; do
		v=$(value "$name" $m)
		h=$(value host $m)
		unit=cycles
		[ $m = start_ms ] && unit=ms
		[ -n "$v" ] || { fail "$name" "no $m figure"; continue; }
		echo "bench: peer_${name}_$m $v $unit"
		[ "$name" = host ] && continue
		[ -n "$h" ] && [ "$h" -gt 0 ] &&
			echo "bench: peer_${name}_${m}_vs_host $(awk "BEGIN { printf \"%.2f\", $v / $h }") ratio"
	done
}

echo "peerbench: peers $peers; counts $COUNTS; pinned to CPU $CPU; $(uname -r)" >&2

# The host itself first: every ratio is to its figures.
run host taskset -c "$CPU" "$BIN" all $COUNTS
report host
grep -q '^peer: done$' "$W/host.out" || { echo "bench: FAILED: the host's own run"; exit 1; }

# UML's init: the benchmark and power off. UML's root is the QEMU host's
# (hostfs), so it finds the same binary and busybox.
cat >"$W/uml-init" <<EOF
#!/bin/busybox sh
$BIN all $COUNTS
/bin/busybox poweroff -f
echo "peerbench: uml-init: poweroff -f failed: \$?"
EOF
chmod +x "$W/uml-init"

for p in $(echo "$peers" | tr ',' ' '); do
	case "$p" in
	lguest)
		[ -c /dev/lguest ] || { fail $p "no /dev/lguest (lguest.ko not loaded)"; continue; }
		run $p taskset -c "$CPU" /usr/bin/lguest run --memory 128M \
			--initrd "$GUESTS/linux-initramfs.gz" "$GUESTS/vmlinux" -- \
			lginit=peer "lgpeer=$(echo $COUNTS | tr ' ' ,)"
		;;
	uml-ptrace|uml-seccomp)
		[ -x "$UML" ] || { fail $p "no $UML in the initramfs (build with PEERS=$p)"; continue; }
		sc=off
		[ $p = uml-seccomp ] && sc=on
		# UML's memory is a file in TMPDIR (tmpfs here); con0 writes to
		# stdout, the other consoles go nowhere.
		export TMPDIR=/tmp
		run $p taskset -c "$CPU" "$UML" mem=256M root=/dev/root rootfstype=hostfs \
			rootflags=/ rw init="$W/uml-init" con0=null,fd:1 con=null seccomp=$sc quiet
		;;
	gvisor-systrap|gvisor-ptrace)
		[ -x "$RUNSC" ] || { fail $p "no $RUNSC in the initramfs (build with PEERS=$p)"; continue; }
		run $p taskset -c "$CPU" "$RUNSC" --root=/run/runsc --ignore-cgroups --network=none \
			--platform=${p#gvisor-} do "$BIN" all $COUNTS
		;;
	*)
		fail "$p" "unknown peer (lguest, uml-ptrace, uml-seccomp, gvisor-systrap, gvisor-ptrace)"
		continue
		;;
	esac
	report $p
done

if [ -n "$failed" ]; then
	echo "bench: FAILED: peers:$failed"
	exit 1
fi
echo "bench: peers done"
