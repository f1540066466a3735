#!/bin/bash
# SPDX-License-Identifier: GPL-2.0
#
# Builds lguest.ko against a kernel build tree, the way a user builds it
# for the kernel they run (`make module`, `make install`, DKMS), and the way
# the suite builds it for its own host kernels (scripts/build.sh).
#
#   scripts/module.sh check   [KDIR]   only check that KDIR can build it
#   scripts/module.sh build   [KDIR]   build (default KDIR: the running
#                                      kernel's /lib/modules/$(uname -r)/build)
#   scripts/module.sh install [KDIR]   build, then modules_install to extra/
#                                      and depmod
#   scripts/module.sh uninstall [KDIR] remove the installed module, depmod
#
#   MODULE_OUT=DIR   where the .ko goes (default $REPO/build/module);
#   KRUSTC, LLVM     override the rustc and the LLVM suffix found below;
#   INSTALL_MOD_PATH the usual staging prefix for install.
#
# An out-of-tree Rust module needs the build tree of a kernel configured
# with CONFIG_RUST=y, with its Rust metadata (rust/libkernel.rmeta and
# friends, made by `make modules_prepare`), and the very rustc that built
# that metadata. Each missing piece stops the build here with what is
# missing and how to get it, not with a compiler error.
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cmd=${1:-build}
KDIR=${2:-${KDIR:-/lib/modules/$(uname -r)/build}}
OUTDIR=$(realpath -m "${MODULE_OUT:-$REPO/build/module}")

die() {
	printf 'lguest module: %s\n' "$*" >&2
	exit 1
}

# The tree: a kernel build directory (where .config and the Rust metadata
# are), as /lib/modules/<release>/build is for a kernel built from source.
[ -d "$KDIR" ] || die "no kernel build tree at $KDIR (KDIR=/path/to/build; for the running kernel install its build tree at /lib/modules/$(uname -r)/build)"
conf="$KDIR/include/config/auto.conf"
[ -f "$conf" ] || conf="$KDIR/.config"
[ -f "$conf" ] || die "$KDIR is not a configured kernel build tree (no include/config/auto.conf or .config)"
cfg() { sed -n "s/^$1=//p" "$conf" | tr -d '"'; }

if [ "$cmd" = uninstall ]; then
	release=$(cat "$KDIR/include/config/kernel.release" 2>/dev/null) || die "$KDIR has no include/config/kernel.release"
	ko="${INSTALL_MOD_PATH:-}/lib/modules/$release/extra/lguest.ko"
	[ -e "$ko" ] || [ -e "$ko.xz" ] || [ -e "$ko.zst" ] || die "nothing to remove: no $ko"
	rm -f "$ko" "$ko.xz" "$ko.zst" "$ko.gz"
	if command -v depmod >/dev/null 2>&1; then
		depmod ${INSTALL_MOD_PATH:+-b "$INSTALL_MOD_PATH"} "$release"
	fi
	echo "lguest module: removed $ko (a loaded lguest stays until modprobe -r lguest)"
	exit 0
fi

[ "$(cfg CONFIG_RUST)" = y ] || die "the kernel at $KDIR was configured without CONFIG_RUST=y: lguest.ko is a Rust module and needs a Rust-enabled kernel (rebuild it with CONFIG_RUST=y)"
[ "$(cfg CONFIG_MODULES)" = y ] || die "the kernel at $KDIR has no module support (CONFIG_MODULES)"
missing=
for f in rust/libkernel.rmeta rust/libcore.rmeta rust/libmacros.so rust/libpin_init.rmeta; do
	[ -e "$KDIR/$f" ] || missing="$missing $f"
done
[ -z "$missing" ] || die "the tree at $KDIR lacks the Rust metadata an out-of-tree Rust module builds against:$missing. Distribution headers packages do not ship it (Debian's linux-headers-7.3.*-cloud-amd64 has only include/generated/rustc_cfg): build the kernel from the same source with the same .config and toolchain (its own rustc, $(cfg CONFIG_RUSTC_VERSION_TEXT)) and point KDIR at that build directory"
[ -f "$KDIR/Module.symvers" ] || die "$KDIR has no Module.symvers: the kernel itself must have been built there (make, or at least make vmlinux modules_prepare), so that the module's symbol versions can be checked"

# The rustc that built the metadata: a different one cannot read it.
want=$(cfg CONFIG_RUSTC_VERSION_TEXT)
rustc=${KRUSTC:-}
if [ -z "$rustc" ]; then
	for r in rustc /usr/bin/rustc "$HOME/.cargo/bin/rustc"; do
		command -v "$r" >/dev/null 2>&1 || continue
		if [ "$("$r" --version 2>/dev/null)" = "$want" ]; then
			rustc=$(command -v "$r")
			break
		fi
	done
fi
[ -n "$rustc" ] || die "the kernel at $KDIR was built with \"$want\"; no rustc on PATH (nor /usr/bin/rustc) is that one. Install it, or set KRUSTC=/path/to/that/rustc"
[ "$("$rustc" --version)" = "$want" ] || die "KRUSTC=$rustc is \"$("$rustc" --version)\", the kernel at $KDIR was built with \"$want\""

# The C compiler: a clang-built kernel (all Rust-enabled x86 kernels that
# Debian ships are) wants the same LLVM for lg_helpers.c.
args=(RUSTC="$rustc")
if [ "$(cfg CONFIG_CC_IS_CLANG)" = y ]; then
	major=$(( $(cfg CONFIG_CLANG_VERSION) / 10000 ))
	if [ -n "${LLVM:-}" ]; then
		args+=(LLVM="$LLVM")
	elif command -v "clang-$major" >/dev/null 2>&1; then
		args+=(LLVM="-$major")
	elif command -v clang >/dev/null 2>&1 && clang --version | grep -q "version $major\."; then
		args+=(LLVM=1)
	else
		die "the kernel at $KDIR was built with clang $major; install clang-$major and lld-$major (or set LLVM=)"
	fi
fi
[ -z "${BINDGEN:-}" ] || args+=(BINDGEN="$BINDGEN")

[ "$cmd" = check ] && { echo "lguest module: $KDIR can build lguest.ko (${args[*]})"; exit 0; }

mkdir -p "$OUTDIR"
log="$OUTDIR/build.log"
# MO= keeps Kbuild's output out of the source tree.
if ! make -C "$KDIR" M="$REPO" MO="$OUTDIR" "${args[@]}" -j"$(nproc)" modules >"$log" 2>&1; then
	cat "$log" >&2
	die "the build failed (log: $log)"
fi
if grep -E 'warning:|warning\[' "$log" >&2; then
	die "the module must build without warnings (log: $log)"
fi
echo "lguest module: built $OUTDIR/lguest.ko for $(cat "$KDIR/include/config/kernel.release" 2>/dev/null || echo "$KDIR")"

if [ "$cmd" = install ]; then
	make -C "$KDIR" M="$REPO" MO="$OUTDIR" "${args[@]}" INSTALL_MOD_DIR=extra modules_install >>"$log" 2>&1 \
		|| { tail -20 "$log" >&2; die "modules_install failed (log: $log)"; }
	release=$(cat "$KDIR/include/config/kernel.release")
	if command -v depmod >/dev/null 2>&1; then
		depmod ${INSTALL_MOD_PATH:+-b "$INSTALL_MOD_PATH"} "$release"
	fi
	echo "lguest module: installed as ${INSTALL_MOD_PATH:-}/lib/modules/$release/extra/lguest.ko; load it with modprobe lguest"
elif [ "$cmd" != build ]; then
	die "unknown command $cmd (check, build, install)"
fi
