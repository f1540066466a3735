#!/bin/bash
# SPDX-License-Identifier: GPL-2.0
#
# Host-side tests of building lguest.ko for "your own kernel"
# (scripts/module.sh, dkms.conf), run by `make test` before the boots:
#
#  - a DKMS build (dkms add + build in a private DKMS tree, nothing of the
#    system's touched) against the kernel build tree KOBJ: the module it
#    makes is for that tree's release (vermagic) and has the same
#    code module.sh builds directly;
#  - the trees it must refuse, each with its message: no CONFIG_RUST, no
#    Rust metadata (a copy of what a distribution headers package has),
#    a rustc that is not the tree's;
#  - make install and uninstall into a staging INSTALL_MOD_PATH (a kernel
#    with MODULE_COMPRESS_* installs lguest.ko.xz or .zst).
#
#   scripts/module-test.sh KOBJ
# Prints "module-test: N passed, M failed" and exits non-zero on a failure.
set -uo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
KOBJ=$1
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
pass=0
failed=0
ok() { echo "module-test: ok $1"; pass=$((pass + 1)); }
bad() { echo "module-test: FAIL $1"; failed=$((failed + 1)); }
release=$(cat "$KOBJ/include/config/kernel.release")
# The code of a module (DKMS strips debug information, and the source
# path differs, so the files differ; the code must not).
text() {
	llvm-objcopy-19 --dump-section .text="$TMP/text.bin" "$1" "$TMP/text.o" && cat "$TMP/text.bin"
	rm -f "$TMP/text.bin" "$TMP/text.o"
}

# The module as module.sh builds it.
if MODULE_OUT="$TMP/direct" bash "$REPO/scripts/module.sh" build "$KOBJ" >"$TMP/direct.log" 2>&1; then
	ok "module.sh build"
else
	bad "module.sh build: $(tail -5 "$TMP/direct.log")"
fi

# DKMS, in trees of its own.
if command -v dkms >/dev/null 2>&1; then
	if bash "$REPO/scripts/dkms-build.sh" "$KOBJ" "$TMP/dkms" >"$TMP/dkms.log" 2>&1; then
		ko="$TMP/dkms/lguest.ko"
		vm=$(modinfo -F vermagic "$ko" 2>/dev/null | cut -d' ' -f1)
		if [ "$vm" != "$release" ]; then
			bad "dkms build: vermagic '$vm', expected '$release'"
		elif ! text "$ko" >"$TMP/a.text" || ! text "$TMP/direct/lguest.ko" >"$TMP/b.text" ||
			[ ! -s "$TMP/a.text" ] || ! cmp -s "$TMP/a.text" "$TMP/b.text"; then
			bad "dkms build: its lguest.ko's code differs from module.sh's"
		else
			ok "dkms build for $release"
		fi
	else
		bad "dkms build: $(tail -8 "$TMP/dkms.log")"
	fi
else
	bad "dkms is not installed (scripts/setup.sh installs it)"
fi

# Trees that cannot build it: the message says why.
refuse() {
	local name=$1 tree=$2 want=$3
	shift 3
	local out
	if out=$(env "$@" bash "$REPO/scripts/module.sh" check "$tree" 2>&1); then
		bad "$name: accepted ($out)"
	elif [[ $out != *"$want"* ]]; then
		bad "$name: said '$out', expected '$want'"
	else
		ok "$name"
	fi
}
mkdir -p "$TMP/norust" "$TMP/headers/include/generated"
printf 'CONFIG_MODULES=y\n' >"$TMP/norust/.config"
refuse "no CONFIG_RUST" "$TMP/norust" "configured without CONFIG_RUST=y"
# What Debian's linux-headers-7.3.*-cloud-amd64 holds of Rust: the
# config, and include/generated/rustc_cfg, no metadata.
cp "$KOBJ/.config" "$TMP/headers/.config"
cp "$KOBJ/include/generated/rustc_cfg" "$TMP/headers/include/generated/" 2>/dev/null
cp "$KOBJ/Module.symvers" "$TMP/headers/"
refuse "a headers package's tree" "$TMP/headers" "lacks the Rust metadata"
printf '#!/bin/sh\necho "rustc 0.0.1 (test)"\n' >"$TMP/rustc"
chmod +x "$TMP/rustc"
refuse "another rustc" "$KOBJ" "the kernel at $KOBJ was built with" KRUSTC="$TMP/rustc"
refuse "no tree" "$TMP/nothing" "no kernel build tree at"

# install and uninstall, staged.
if MODULE_OUT="$TMP/direct" INSTALL_MOD_PATH="$TMP/root" bash "$REPO/scripts/module.sh" install "$KOBJ" >"$TMP/inst.log" 2>&1 &&
	grep -Eq '^extra/lguest\.ko(\.xz|\.zst|\.gz)?:' "$TMP/root/lib/modules/$release/modules.dep"; then
	if INSTALL_MOD_PATH="$TMP/root" bash "$REPO/scripts/module.sh" uninstall "$KOBJ" >>"$TMP/inst.log" 2>&1 &&
		! ls "$TMP/root/lib/modules/$release/extra/" 2>/dev/null | grep -q '^lguest\.ko' &&
		! grep -q 'lguest' "$TMP/root/lib/modules/$release/modules.dep"; then
		ok "install and uninstall (staged)"
	else
		bad "uninstall: $(tail -5 "$TMP/inst.log")"
	fi
else
	bad "install: $(tail -5 "$TMP/inst.log")"
fi

echo "module-test: $pass passed, $failed failed"
[ "$failed" = 0 ]
