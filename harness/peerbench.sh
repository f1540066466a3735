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
#
# With PEER_NET_MIB=N (lgtest.peernet=N; scripts/peers.sh sets it for the
# boot without -icount) the TCP stream rows follow: N MiB out of each peer
# to a host socket (tcp_out) and into it (tcp_in), timed by the host's
# lguest-tcpsink (on CPU 0; the peer on CPU 1), the median of
# PEER_NET_REPS runs (default 3), in MB/s, with the ratios to the host's
# own stream over loopback (lguest-tcpsink at both ends, `_vs_host`) and
# to the native stream between two network namespaces over a veth pair
# (`netns`: the connecting side in a namespace of its own; `_vs_netns`). The
# paths:
# lguest, the tcpblast sample (a Rust guest with smoltcp) over virtio-net
# and a tap, to the host's 192.168.4.1 on it; UML, Linux's TCP in UML over
# its vector tap transport (the same tap, gro=1: without it UML drops the
# host's GSO frames); gVisor, runsc --rootless --network=host (the
# Sentry's socket calls go to host sockets), over loopback. gVisor's own
# netstack (runsc do's veth and NAT, which need iptables) is not measured.

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
reported=
METRICS="getpid fault fork start_ms"

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

# report NAME: the figures; or why not.
report() {
	name=$1
	if ! grep -q '^peer: done$' "$W/$name.out"; then
		why=$(grep -m1 -E '^peer: (FAILED|timeout|exit)' "$W/$name.out")
		fail "$name" "${why:-no output} (no 'peer: done'; console lines above)"
		return
	fi
	for m in $METRICS; do
		v=$(value "$name" $m)
		unit=cycles
		[ $m = start_ms ] && unit=ms
		[ -n "$v" ] || { fail "$name" "no $m figure"; continue; }
		echo "bench: peer_${name}_$m $v $unit"
	done
	reported="$reported $name"
}

echo "peerbench: peers $peers; counts $COUNTS; pinned to CPU $CPU; $(uname -r)" >&2

# The host itself, first and again last: every ratio is to its figures,
# the lower of the two runs of each. Under -icount the QEMU host's clock
# counts the instructions of both CPUs (QEMU runs them in turn), so work
# left over from the boot on CPU 0 (seen once: 6 times the getpid) would
# count in the first run; the pause lets most of it end.
sleep ${PEER_SETTLE:-5}
run host taskset -c "$CPU" "$BIN" all $COUNTS
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

# The host again, then the ratios to the lower of its two figures.
run host-again taskset -c "$CPU" "$BIN" all $COUNTS
for m in $METRICS; do
	a=$(value host $m)
	b=$(value host-again $m)
	unit=cycles
	[ $m = start_ms ] && unit=ms
	[ -n "$b" ] && [ "$b" -lt "$a" ] && a=$b
	echo "bench: peer_host_$m $a $unit (the lower of $(value host $m) first and ${b:-none} last)"
	eval "host_$m=$a"
done
for name in $reported; do
	for m in $METRICS; do
		v=$(value "$name" $m)
		h=$(eval echo "\$host_$m")
		[ -n "$v" ] && [ -n "$h" ] && [ "$h" -gt 0 ] &&
			echo "bench: peer_${name}_${m}_vs_host $(awk "BEGIN { printf \"%.2f\", $v / $h }") ratio"
	done
done

# The TCP streams (see the top).
NET_MIB=${PEER_NET_MIB:-0}
NET_REPS=${PEER_NET_REPS:-3}
NET_BYTES=$((NET_MIB * 1048576))
TAP=peertap0
HOSTIP=192.168.4.1
PEERIP=192.168.4.2
NSHOSTIP=192.168.5.1
NSPEERIP=192.168.5.2
PORT=9999
SINK=${PEER_SINK:-/usr/bin/lguest-tcpsink}

# stream ADDR DIR CMD...: one transfer of NET_BYTES between the host's
# sink, listening at ADDR, and CMD (the peer's side, which connects);
# prints the sink's MB/s, or nothing.
stream() {
	addr=$1 dir=$2
	shift 2
	if [ "$dir" = out ]; then mode="--expect $NET_BYTES"; else mode="--send $NET_BYTES"; fi
	taskset -c 0 "$SINK" "$addr" $mode --timeout 600 >"$W/sink.out" 2>&1 &
	sp=$!
	sleep 1
	timeout 900 "$@" >"$W/stream.out" 2>&1 </dev/null
	# A peer that failed leaves the sink waiting: 30 s more, then no.
	( sleep 30; kill $sp 2>/dev/null ) &
	kp=$!
	wait $sp
	kill $kp 2>/dev/null
	sed -n 's/^tcpsink: .*, \([0-9.]*\) MB\/s.*/\1/p' "$W/sink.out" | head -1
}

# streams NAME ADDR CMD_OUT CMD_IN: NET_REPS runs each way, the medians.
# CMD_OUT and CMD_IN are the peer's commands, as words.
streams() {
	name=$1 addr=$2 cmd_out=$3 cmd_in=$4
	for dir in out in; do
		cmd=$cmd_out
		[ $dir = in ] && cmd=$cmd_in
		rates=
		i=0
		while [ $i -lt "$NET_REPS" ]; do
			r=$(stream "$addr" $dir $cmd)
			if [ -z "$r" ]; then
				echo "peerbench: $name tcp_$dir: no rate; sink: $(tr '\n' ' ' <"$W/sink.out"); peer: $(tail -3 "$W/stream.out" | tr '\n' ' ')" >&2
				fail "$name" "tcp_$dir: the transfer failed"
				return
			fi
			echo "peerbench: $name tcp_$dir run $((i + 1)): $r MB/s" >&2
			rates="$rates $r"
			i=$((i + 1))
		done
		med=$(printf '%s\n' $rates | sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }')
		echo "bench: peer_${name}_tcp_$dir $med MB/s (median of $NET_REPS, $NET_MIB MiB)"
		# The two native references keep their figure; every row gets
		# its ratio to those measured before it.
		case $name in host|netns) eval "${name}_tcp_$dir=$med" ;; esac
		for ref in host netns; do
			[ "$ref" = "$name" ] && continue
			h=$(eval echo "\${${ref}_tcp_$dir:-}")
			[ -n "$h" ] && echo "bench: peer_${name}_tcp_${dir}_vs_$ref $(awk "BEGIN { printf \"%.2f\", $med / $h }") ratio"
		done
	done
}

if [ "$NET_MIB" -gt 0 ]; then
	echo "peerbench: TCP streams, $NET_MIB MiB, $NET_REPS runs each way" >&2
	ip link set lo up
	if "$BIN" tap $TAP && ip addr add $HOSTIP/24 dev $TAP && ip link set $TAP up; then
		streams host 127.0.0.1:$PORT \
			"taskset -c $CPU $SINK 127.0.0.1:$PORT --connect --send $NET_BYTES" \
			"taskset -c $CPU $SINK 127.0.0.1:$PORT --connect --expect $NET_BYTES"
	else
		fail host "could not set up the tap $TAP"
	fi
	# The native reference across a device: the connecting side in a network
	# namespace of its own, behind a veth pair (Linux's TCP at both ends,
	# as in a container).
	unshare -n sleep 100000 &
	nsp=$!
	sleep 1
	if ip link add lgveth0 type veth && ve=$(ip -o link | sed -n 's/^[0-9]*: \([^@:]*\)@lgveth0.*/\1/p') &&
		[ -n "$ve" ] && ip link set "$ve" netns $nsp && ip addr add $NSHOSTIP/24 dev lgveth0 && ip link set lgveth0 up &&
		nsenter -t $nsp -n ip link set lo up && nsenter -t $nsp -n ip link set "$ve" up &&
		nsenter -t $nsp -n ip addr add $NSPEERIP/24 dev "$ve"; then
		n="nsenter -t $nsp -n taskset -c $CPU $SINK $NSHOSTIP:$PORT --connect"
		streams netns $NSHOSTIP:$PORT "$n --send $NET_BYTES" "$n --expect $NET_BYTES"
	else
		fail netns "could not set up the veth pair and its namespace"
	fi
	kill $nsp 2>/dev/null
	for p in $(echo "$peers" | tr ',' ' '); do
		case "$p" in
		lguest)
			[ -c /dev/lguest ] || continue
			tb="taskset -c $CPU /usr/bin/lguest run --memory 256M --net tap=$TAP $GUESTS/tcpblast ip=$PEERIP/24 peer=$HOSTIP:$PORT timeout=600"
			streams $p $HOSTIP:$PORT "$tb send=$NET_BYTES" "$tb recv=$NET_BYTES"
			;;
		uml-ptrace|uml-seccomp)
			[ -x "$UML" ] || continue
			sc=off
			[ $p = uml-seccomp ] && sc=on
			for dir in out in; do
				m="--send $NET_BYTES"
				[ $dir = in ] && m="--expect $NET_BYTES"
				cat >"$W/uml-net-$dir" <<EOF
#!/bin/busybox sh
/bin/busybox ip link set lo up
/bin/busybox ip link set vec0 up
/bin/busybox ip addr add $PEERIP/24 dev vec0
$SINK $HOSTIP:$PORT --connect $m --timeout 600
/bin/busybox poweroff -f
EOF
				chmod +x "$W/uml-net-$dir"
			done
			u="taskset -c $CPU $UML mem=256M root=/dev/root rootfstype=hostfs rootflags=/ rw con0=null,fd:1 con=null seccomp=$sc quiet vec0:transport=tap,ifname=$TAP,gro=1"
			streams $p $HOSTIP:$PORT "$u init=$W/uml-net-out" "$u init=$W/uml-net-in"
			;;
		gvisor-systrap|gvisor-ptrace)
			[ -x "$RUNSC" ] || continue
			# runsc do sets up a network namespace of its own unless
			# --rootless (then --network=host is the caller's).
			g="taskset -c $CPU $RUNSC --root=/run/runsc --rootless --ignore-cgroups --network=host --platform=${p#gvisor-} do $SINK 127.0.0.1:$PORT --connect"
			streams $p 127.0.0.1:$PORT "$g --send $NET_BYTES" "$g --expect $NET_BYTES"
			;;
		esac
	done
fi

if [ -n "$failed" ]; then
	echo "bench: FAILED: peers:$failed"
	exit 1
fi
echo "bench: peers done"
