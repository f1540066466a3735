#!/bin/bash
# SPDX-License-Identifier: GPL-2.0
#
# `make bench`: the benchmarks. Prints the switcher's inventory (the
# instructions one world switch executes, from lguest.ko), then boots the
# QEMU host with `-icount shift=0` (ICOUNT=0 to turn that off) and runs lguest_bench, then
# boots the distro flavour with the Debian image, if make rootfs built it,
# for `lguest_bench debian` (boot to systemd and to the login prompt,
# memory), then boots it again without -icount for the network benchmark lguest_netbench
# (NET_MIB per run, default 256, 0 leaves it out; NET_REPS runs per row,
# default 3, the median stands for the row). Last, the peer benchmark
# (scripts/peers.sh bench: gVisor and User-Mode Linux beside lguest-rs in
# one QEMU host boot, with -icount and without; PEERS picks them, default
# all, PEERS=none leaves it out).
set -euo pipefail
. "$(dirname "$0")/env.sh"
OUT=$(PEERS= bash "$REPO/scripts/build.sh")

# The switcher's inventory: the instructions each path executes, by class
# (MSR writes, CR3 writes, descriptor-table loads, ...), weighted with
# their cost on hardware, which TCG does not show; and the mitigation
# sites' own instructions (scripts/switch_inventory.py).
python3 "$REPO/scripts/switch_inventory.py" "$OUT/module/lguest.ko"

mkdir -p "$CACHE/logs"
stamp=$(date +%Y%m%d-%H%M%S)
log="$CACHE/logs/$stamp-bench.log"
ICOUNT=${ICOUNT:-1} KTAP_LOG="${log%.log}.out" timeout -s KILL 3600 \
	bash "$REPO/scripts/qemu.sh" bench "${CPU:-max}" </dev/null >"$log" 2>&1 || true
grep '^bench:' "${log%.log}.out" || { tail -20 "$log"; echo "bench: failed (log $log)"; exit 1; }

# The Debian guest (lguest_bench debian), when make rootfs has built its
# image: a QEMU host boot of its own, on the distro flavour (its NVMe
# driver attaches the image), with -icount as above.
if IMG=$(bash "$REPO/scripts/rootfs.sh" --built); then
	FLAVOUR=distro PEERS= bash "$REPO/scripts/build.sh" >/dev/null
	log="$CACHE/logs/$stamp-debianbench.log"
	FLAVOUR=distro ROOTFS=$IMG ICOUNT=${ICOUNT:-1} KTAP_LOG="${log%.log}.out" timeout -s KILL 5400 \
		bash "$REPO/scripts/qemu.sh" debianbench "${CPU:-max}" </dev/null >"$log" 2>&1 || true
	grep '^bench:' "${log%.log}.out" || { tail -20 "$log"; echo "bench: debian failed (log $log)"; }
else
	echo "bench: debian: no Debian root filesystem (make rootfs builds it); left out"
fi

# The network benchmark runs without -icount (NET_ICOUNT=1 to add it):
# it measures a guest's vCPU and the host's side of the devices (launcher
# threads, tap, TCP, the sink) running at the same time on the QEMU host's
# two CPUs, and -icount runs QEMU's CPUs one at a time. Compare its rows
# with each other, within one run.
rc=0
if [ "${NET_MIB:-256}" != 0 ]; then
	log="$CACHE/logs/$stamp-netbench.log"
	ICOUNT=${NET_ICOUNT:-0} KTAP_LOG="${log%.log}.out" KARGS="lgtest.netmib=${NET_MIB:-256} lgtest.netreps=${NET_REPS:-3} ${KARGS:-}" \
		timeout -s KILL 5400 bash "$REPO/scripts/qemu.sh" netbench "${CPU:-max}" </dev/null >"$log" 2>&1 || true
	grep '^bench:' "${log%.log}.out" || { tail -20 "$log"; echo "bench: net failed (log $log)"; rc=1; }
fi

# The peers (Documentation/dev/testing.rst, "Peers"): their own boots, on
# the distro host kernel (it has SECCOMP and USER_NS), in $CACHE/out/peers.
if [ "${PEERS-all}" != none ] && [ -n "${PEERS-all}" ]; then
	PEERS=${PEERS-all} bash "$REPO/scripts/peers.sh" bench || { echo "bench: peers failed (above)"; rc=1; }
fi
exit $rc
