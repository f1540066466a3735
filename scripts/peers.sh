#!/bin/bash
# SPDX-License-Identifier: GPL-2.0
#
# Fetches and builds the peers that the peer benchmark runs beside lguest-rs
# in the QEMU host (Documentation/dev/testing.rst, "Peers"), into the cache:
#
#   peers.sh [runsc] [uml]     (default: both)
#   peers.sh bench             the peer boots (make bench's last part)
#
#   runsc  gVisor's runsc from bookworm-backports (a static Go binary),
#          fetched with a private apt configuration like setup.sh's (the
#          system's sources never see backports) and unpacked with
#          dpkg-deb -x into $CACHE/peers/runsc-<version>/;
#   uml    User-Mode Linux 7.3 built (with GCC, see UML_MAKE below) from
#          the cached kernel source ($KSRC) with kernel/uml.config, in
#          $CACHE/build/uml-<key>, the key from the version, the fragment
#          and the toolchain (as kernel_key does); its binary and the
#          shared libraries it needs (UML_NET_VECTOR links it dynamically)
#          are copied into $CACHE/peers/uml-<key>/, at their own paths
#          under root/.
#
# Prints one line per peer on stdout: `runsc PATH` (the binary) and
# `uml PATH` (the directory: linux, and root/ with the libraries). Only
# build.sh with PEERS set, scripts/bench.sh and make peers call it; never
# make test.
#
# `bench` builds the peer boot's run directory (FLAVOUR=distro: Debian's
# configuration has SECCOMP, SECCOMP_FILTER and USER_NS, which the normal
# host.config leaves out; in $PEER_OUT, default $CACHE/out/peers, apart
# from the test outputs), boots it with -icount shift=0 and without
# (PEER_ICOUNT, default "1 0"), runs harness/peerbench.sh there for PEERS
# (default all; PEER_COUNTS="GETPID_N FAULT_N FORK_N K" for other counts
# than harness/peerbench.sh's) and prints its bench: lines. The boot
# without -icount also runs the TCP stream rows: PEER_NET_MIB MiB per run
# (default 64; 0 leaves them out), PEER_NET_REPS runs per row (default 3);
# under -icount the QEMU host's CPUs take turns, which a stream's two ends
# would wait on (as lguest_netbench says). Exits 1, saying which, when a
# requested peer could not run.
set -euo pipefail
. "$(dirname "$0")/env.sh"

say()  { printf '[peers] %s\n' "$*" >&2; }
fail() { printf '[peers] ERROR: %s\n' "$*" >&2; exit 1; }

want=("$@")
[ ${#want[@]} -gt 0 ] || want=(runsc uml)
mkdir -p "$CACHE/peers"

# UML is built with GCC. Clang 19 (the normal host kernel's toolchain,
# UML_CLANG=1) builds it too, and its ptrace mode runs, but with
# seccomp=on its first user process (init) dies at once: "segfault at 0
# ... sp 0000000000000000" in the stub area, where GCC's build runs (seen
# 2026-12-04 on the build machine's 6.18 kernel). SUBARCH=x86 (what the
# top Makefile derives from x86_64): Makefile.clang has a target triple
# for it, none for x86_64; 64BIT comes from the config.
if [ "${UML_CLANG:-0}" = 1 ]; then
	UML_MAKE=(make LLVM=-19 ARCH=um SUBARCH=x86)
	uml_cc() { clang-19 --version | head -1; ld.lld-19 --version | head -1; }
else
	UML_MAKE=(make ARCH=um SUBARCH=x86)
	uml_cc() { gcc --version | head -1; ld --version | head -1; }
fi
RUNSC_SUITE=${RUNSC_SUITE:-bookworm-backports}

runsc() {
	local APT="$CACHE/apt-$RUNSC_SUITE"
	mkdir -p "$APT/lists/partial" "$APT/archives/partial"
	cat >"$APT/sources.list" <<EOS
deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian $RUNSC_SUITE main
EOS
	[ -f "$APT/status" ] || : >"$APT/status"
	local APTOPTS=(-o Dir::Etc::SourceList="$APT/sources.list" -o Dir::Etc::SourceParts=/dev/null
		 -o Dir::State::Lists="$APT/lists" -o Dir::State::Status="$APT/status"
		 -o Dir::Cache::Archives="$APT/archives" -o Debug::NoLocking=1
		 -o APT::Sandbox::User=root)
	# The version is whatever the suite has now; a cached unpack of it is
	# reused (RUNSC_VERSION pins one without asking the mirror).
	local ver=${RUNSC_VERSION:-}
	if [ -z "$ver" ]; then
		if ! apt-get "${APTOPTS[@]}" update -qq >/dev/null 2>&1; then
			# Offline: the newest unpack in the cache will do.
			local have
			have=$(ls -d "$CACHE"/peers/runsc-*/usr/bin/runsc 2>/dev/null | sort -V | tail -1)
			[ -n "$have" ] || fail "private apt update for $RUNSC_SUITE failed and no runsc is cached"
			say "apt update failed; using the cached $have"
			echo "runsc $have"
			return 0
		fi
		ver=$(apt-cache "${APTOPTS[@]}" show runsc 2>/dev/null | sed -n 's/^Version: //p' | sort -V | tail -1)
		[ -n "$ver" ] || fail "no runsc package in $RUNSC_SUITE"
	fi
	local dir="$CACHE/peers/runsc-$ver"
	if [ ! -x "$dir/usr/bin/runsc" ]; then
		say "fetching runsc $ver from $RUNSC_SUITE (private apt configuration, unpacked only)"
		(cd "$APT/archives" && apt-get "${APTOPTS[@]}" download "runsc=$ver") >/dev/null 2>&1 \
			|| fail "could not download runsc=$ver from $RUNSC_SUITE"
		local deb
		deb=$(ls "$APT/archives"/runsc_*.deb | sort -V | tail -1)
		rm -rf "$dir.tmp" && dpkg-deb -x "$deb" "$dir.tmp" || fail "dpkg-deb -x $deb failed"
		[ -x "$dir.tmp/usr/bin/runsc" ] || fail "$deb has no usr/bin/runsc"
		file -L "$dir.tmp/usr/bin/runsc" 2>/dev/null | grep -q 'statically linked' \
			|| say "warning: $dir.tmp/usr/bin/runsc is not statically linked"
		rm -f "$deb"
		rm -rf "$dir" && mv "$dir.tmp" "$dir"
	fi
	echo "runsc $dir/usr/bin/runsc"
}

uml_key() {
	local ver h
	ver=$(make -s --no-print-directory -C "$KSRC" kernelversion 2>/dev/null)
	h=$( { cat "$REPO/kernel/uml.config" "$KSRC/arch/um/configs/x86_64_defconfig";
		uml_cc; } | sha256sum | cut -c1-12)
	echo "$ver-$h"
}

uml() {
	[ -f "$KSRC/Makefile" ] || fail "no kernel source at $KSRC: run scripts/setup.sh"
	local key UOBJ dir
	key=$(uml_key)
	UOBJ="$CACHE/build/uml-$key"
	dir="$CACHE/peers/uml-$key"
	if [ ! -f "$UOBJ/.lguest-built" ]; then
		mkdir -p "$UOBJ"
		local LOG="$UOBJ/build.log"
		say "building UML $key in $UOBJ (log: $LOG)"
		local start
		start=$(date +%s)
		{
			"${UML_MAKE[@]}" -C "$KSRC" O="$UOBJ" x86_64_defconfig
			"$KSRC/scripts/kconfig/merge_config.sh" -m -O "$UOBJ" "$UOBJ/.config" "$REPO/kernel/uml.config"
			"${UML_MAKE[@]}" -C "$KSRC" O="$UOBJ" olddefconfig
		} >"$LOG" 2>&1 || { tail -30 "$LOG" >&2; fail "UML configuration failed (log: $LOG)"; }
		# Every line of the fragment must have survived.
		local bad=0 line sym
		while IFS= read -r line; do
			case "$line" in
			"# CONFIG_"*" is not set") sym=${line#\# }; sym=${sym%% *}
				if grep -q "^$sym=y" "$UOBJ/.config"; then say "config: $sym should be off"; bad=1; fi ;;
			CONFIG_*=*) if ! grep -qxF "$line" "$UOBJ/.config"; then
					say "config: wanted $line, got: $(grep "^${line%%=*}=" "$UOBJ/.config" || echo unset)"; bad=1; fi ;;
			esac
		done <"$REPO/kernel/uml.config"
		[ $bad = 0 ] || fail "kernel/uml.config could not all be applied (see above)"
		"${UML_MAKE[@]}" -C "$KSRC" O="$UOBJ" -j"$(( $(nproc) + 1 ))" linux >>"$LOG" 2>&1 \
			|| { grep -E 'error|Error' "$LOG" | tail -20 >&2; fail "UML build failed (log: $LOG)"; }
		echo "$(( $(date +%s) - start ))" >"$UOBJ/.build-seconds"
		touch "$UOBJ/.lguest-built"
		say "built UML in $(cat "$UOBJ/.build-seconds") s"
	fi
	if [ ! -f "$dir/.complete" ]; then
		rm -rf "$dir" && mkdir -p "$dir/root"
		cp "$UOBJ/linux" "$dir/linux"
		# A dynamic binary: its libraries, at the paths ldd names (the
		# loader included), for the initramfs; and libgcc_s, which glibc
		# loads itself for pthread_cancel (without it UML aborts at its
		# power-off: "libgcc_s.so.1 must be installed for pthread_cancel").
		local lib libgcc
		libgcc=$(/sbin/ldconfig -p | sed -n 's/^[[:space:]]*libgcc_s.so.1 (libc6,x86-64) => //p' | head -1)
		[ -n "$libgcc" ] || fail "no libgcc_s.so.1 (ldconfig -p)"
		for lib in $(ldd "$UOBJ/linux" 2>/dev/null | grep -oE '/[^ ]+' | sort -u) "$libgcc"; do
			mkdir -p "$dir/root$(dirname "$lib")"
			cp -L "$lib" "$dir/root$lib"
		done
		touch "$dir/.complete"
	fi
	echo "uml $dir"
}

bench() {
	local peers=${PEERS:-all} pout=${PEER_OUT:-$CACHE/out/peers} key rc=0
	# The distro kernel is built once by the suite (make test); a peer
	# boot that would start a kernel build is a mistake somewhere.
	key=$(FLAVOUR=distro; . "$REPO/scripts/env.sh"; kernel_key)
	[ -f "$CACHE/build/$key/.lguest-built" ] || [ "${PEER_BUILD_KERNEL:-0}" = 1 ] \
		|| fail "the distro host kernel $key is not built (FLAVOUR=distro make kernel, or PEER_BUILD_KERNEL=1)"
	say "the peer boot's run directory ($pout; peers $peers)"
	FLAVOUR=distro LGUEST_OUT="$pout" PEERS="$peers" bash "$REPO/scripts/build.sh" >/dev/null \
		|| fail "FLAVOUR=distro build.sh for the peer boot failed"
	mkdir -p "$CACHE/logs"
	local stamp ic log label net counts=
	[ -n "${PEER_COUNTS:-}" ] && counts="lgtest.peercounts=$(echo $PEER_COUNTS | tr ' ' ,)"
	stamp=$(date +%Y%m%d-%H%M%S)
	for ic in ${PEER_ICOUNT:-1 0}; do
		log="$CACHE/logs/$stamp-peerbench-icount$ic.log"
		label="without -icount"
		net="lgtest.peernet=${PEER_NET_MIB:-64} lgtest.peernetreps=${PEER_NET_REPS:-3}"
		if [ "$ic" = 1 ]; then label="with -icount shift=0"; net=; fi
		say "peer boot $label (log $log)"
		FLAVOUR=distro LGUEST_OUT="$pout" ICOUNT=$ic KTAP_LOG="${log%.log}.out" \
			KARGS="lgtest.peers=$peers $counts $net ${KARGS:-}" timeout -s KILL "${PEER_BOOT_TIMEOUT:-7200}" \
			bash "$REPO/scripts/qemu.sh" peerbench "${CPU:-max}" </dev/null >"$log" 2>&1 || true
		echo "bench: peers $label ($peers)"
		if ! grep '^bench:' "${log%.log}.out"; then
			tail -20 "$log"
			echo "bench: peers failed $label: no output (log $log)"
			rc=1
		elif ! grep -q '^bench: peers done' "${log%.log}.out"; then
			echo "bench: peers failed $label: $(grep '^bench: FAILED: peer ' "${log%.log}.out" \
				| sed 's/^bench: FAILED: peer //' | paste -sd';' -) (log $log)"
			rc=1
		fi
	done
	return $rc
}

if [ "${want[0]}" = bench ]; then
	bench
	exit
fi

for p in "${want[@]}"; do
	case "$p" in
	runsc|gvisor) runsc ;;
	uml) uml ;;
	*) fail "unknown peer '$p' (runsc, uml)" ;;
	esac
done
