# SPDX-License-Identifier: GPL-2.0
# Sourced by the other scripts: where things live and which toolchain builds
# the kernel side. Override any variable from the environment.
CACHE=${LGUEST_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/lguest}
KSERIES=${KSERIES:-7.3}
KSRC=${KSRC:-$CACHE/src/linux-source-$KSERIES}
FLAVOUR=${FLAVOUR:-normal}
# LGUEST_OUT: where build.sh puts the module, initramfs and guests (default
# $CACHE/out/$FLAVOUR); separate ones let several runs go at once.
export PATH="$HOME/.cargo/bin:$PATH"
# The kernel side is built with Debian's rustc-web and its matching library
# source (a matched pair, see Documentation/dev/environment.rst).
KRUSTC=${KRUSTC:-/usr/bin/rustc}
KRUST_LIB_SRC=${KRUST_LIB_SRC:-/usr/lib/rustlib/src/rust/library}
KMAKE=(make LLVM=-19 RUSTC="$KRUSTC" RUST_LIB_SRC="$KRUST_LIB_SRC" BINDGEN=bindgen)
# The distro flavour is built as Debian builds it: with GCC (and rustc).
[ "$FLAVOUR" = distro ] && KMAKE=(make RUSTC="$KRUSTC" RUST_LIB_SRC="$KRUST_LIB_SRC" BINDGEN=bindgen)
# Its base configuration (scripts/setup.sh fetches it).
DISTRO_CONFIG=${DISTRO_CONFIG:-$CACHE/src/debian-$KSERIES-cloud-amd64.config}
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

kernel_fragments() {
	if [ "$FLAVOUR" = distro ]; then
		echo "$REPO/kernel/distro.config"
		return 0
	fi
	echo "$REPO/kernel/host.config"
	[ "$FLAVOUR" = debug ] && echo "$REPO/kernel/debug.config"
	return 0
}

# The build tree is keyed by the source's version, the toolchain and a hash of
# the config fragments: change any of them and a new tree is built.
kernel_key() {
	local ver
	ver=$(make -s --no-print-directory -C "$KSRC" kernelversion 2>/dev/null)
	local h
	h=$( { cat $(kernel_fragments); "$KRUSTC" --version; clang-19 --version | head -1;
		if [ "$FLAVOUR" = distro ]; then cat "$DISTRO_CONFIG"; gcc --version | head -1; fi; } | sha256sum | cut -c1-12)
	echo "$ver-$FLAVOUR-$h"
}
