#!/bin/bash
# SPDX-License-Identifier: GPL-2.0
#
# Fetches and builds the peers that the peer benchmark runs beside lguest-rs
# in the QEMU host (Documentation/dev/testing.rst, "Peers"), into the cache:
#
#   peers.sh [runsc] [uml]     (default: both)
#
#   runsc  gVisor's runsc from bookworm-backports (a static Go binary),
#          fetched with a private apt configuration like setup.sh's (the
#          system's sources never see backports) and unpacked with
#          dpkg-deb -x into $CACHE/peers/runsc-<version>/;
#   uml    User-Mode Linux 7.3 built from the cached kernel source
#          ($KSRC) with kernel/uml.config, in $CACHE/build/uml-<key>, the
#          key from the version, the fragment and the toolchain (as
#          kernel_key does); its binary and the shared libraries it needs
#          (UML_NET_VECTOR links it dynamically) are copied into
#          $CACHE/peers/uml-<key>/, at their own paths under root/.
#
# Prints one line per peer on stdout: `runsc PATH` (the binary) and
# `uml PATH` (the directory: linux, and root/ with the libraries). Only
# build.sh with PEERS set and scripts/bench.sh call it; never make test.
set -euo pipefail
. "$(dirname "$0")/env.sh"

say()  { printf '[peers] %s\n' "$*" >&2; }
fail() { printf '[peers] ERROR: %s\n' "$*" >&2; exit 1; }

want=("$@")
[ ${#want[@]} -gt 0 ] || want=(runsc uml)
mkdir -p "$CACHE/peers"

# UML is built with the normal host kernel's toolchain (clang 19, LLD);
# UML_GCC=1 builds it with GCC instead. SUBARCH=x86 (what the top Makefile
# derives from x86_64): Makefile.clang has a target triple for it, none
# for x86_64; 64BIT comes from the config.
if [ "${UML_GCC:-0}" = 1 ]; then
	UML_MAKE=(make ARCH=um SUBARCH=x86)
	uml_cc() { gcc --version | head -1; ld --version | head -1; }
else
	UML_MAKE=(make LLVM=-19 ARCH=um SUBARCH=x86)
	uml_cc() { clang-19 --version | head -1; ld.lld-19 --version | head -1; }
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
		# loader included), for the initramfs.
		local lib
		for lib in $(ldd "$UOBJ/linux" 2>/dev/null | grep -oE '/[^ ]+' | sort -u); do
			mkdir -p "$dir/root$(dirname "$lib")"
			cp -L "$lib" "$dir/root$lib"
		done
		touch "$dir/.complete"
	fi
	echo "uml $dir"
}

for p in "${want[@]}"; do
	case "$p" in
	runsc|gvisor) runsc ;;
	uml) uml ;;
	*) fail "unknown peer '$p' (runsc, uml)" ;;
	esac
done
