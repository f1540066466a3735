#!/bin/bash
# SPDX-License-Identifier: GPL-2.0
#
# Builds everything that goes into the QEMU host and packs the initramfs:
#   the host kernel (cached; see kernel.sh), lguest.ko (warnings are errors),
#   the launcher and the selftests (static binaries), the initramfs.
# Prints the path of the run directory (bzImage + initramfs) on stdout.
set -euo pipefail
. "$(dirname "$0")/env.sh"

say()  { printf '[build] %s\n' "$*" >&2; }
fail() { printf '[build] ERROR: %s\n' "$*" >&2; exit 1; }

bash "$REPO/scripts/setup.sh" >&2
KOBJ=$(bash "$REPO/scripts/kernel.sh")
OUT="${LGUEST_OUT:-$CACHE/out/$FLAVOUR}"
MOD="$OUT/module"
mkdir -p "$MOD"

say "lguest.ko"
# Built as a user builds it for their own kernel (make module KDIR=...):
# module.sh checks the tree and the toolchain, and warnings are errors.
MODULE_OUT="$MOD" KRUSTC="$KRUSTC" bash "$REPO/scripts/module.sh" build "$KOBJ" >&2 \
	|| fail "module build failed"
# The distro flavour's host loads the module as a distribution user's
# machine builds it: by DKMS (in private trees, scripts/dkms-build.sh).
if [ "$FLAVOUR" = distro ]; then
	say "lguest.ko by DKMS"
	KRUSTC="$KRUSTC" bash "$REPO/scripts/dkms-build.sh" "$KOBJ" "$OUT/dkms" >&2 \
		|| fail "DKMS build failed"
	cp "$OUT/dkms/lguest.ko" "$MOD/lguest.ko"
fi

say "launcher and selftests (static)"
TARGET=x86_64-unknown-linux-gnu
( cd "$REPO" && CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUSTFLAGS="-C target-feature=+crt-static" \
	cargo build --quiet --release --target $TARGET -p lguest-launcher -p lguest-selftests ) >&2 \
	|| fail "cargo build failed"
BIN="$REPO/target/$TARGET/release"

if [ -n "${PREBUILT_GUESTS:-}" ]; then
	# A development aid: use guest ELFs built elsewhere (e.g. from another
	# checkout) instead of building guest/ and samples/.
	say "guests from $PREBUILT_GUESTS"
	rm -rf "$OUT/guests" && cp -r "$PREBUILT_GUESTS" "$OUT/guests"
else
	say "guests"
	bash "$REPO/guest/build.sh" "$OUT/guests" --quiet >&2 || fail "guest build failed"
fi

if [ -n "${LGUEST_LINUX_GUEST:-}" ]; then
	# A guest kernel built by hand (guest/linux/README.md, "Working on it").
	say "the Linux guest: $LGUEST_LINUX_GUEST"
	LINUX=$LGUEST_LINUX_GUEST
	[ -f "$LINUX" ] || fail "LGUEST_LINUX_GUEST=$LINUX: no such file"
else
	say "the Linux guest (guest/linux)"
	LINUX=$(bash "$REPO/guest/linux/build.sh") || fail "the Linux guest build failed"
fi

say "initramfs"
ROOT="$OUT/rootfs"
rm -rf "$ROOT"
mkdir -p "$ROOT"/{bin,sbin,usr/bin,usr/share/lguest/guests,lib/modules,selftests/lguest,etc}
cp "$OUT"/guests/* "$ROOT/usr/share/lguest/guests/"
cp "$LINUX" "$ROOT/usr/share/lguest/guests/vmlinux"
cp /bin/busybox "$ROOT/bin/busybox"
cp "$REPO/harness/init" "$ROOT/init"
cp "$REPO/harness/demo.sh" "$ROOT/usr/share/lguest/demo.sh"
cp "$MOD/lguest.ko" "$ROOT/lib/modules/lguest.ko"
cp "$BIN/lguest" "$ROOT/usr/bin/lguest"
cp "$BIN/lguest-tcpsink" "$ROOT/usr/bin/lguest-tcpsink"
cp "$REPO/selftests/run_tests.sh" "$REPO/selftests/settings" "$REPO/selftests/tests.list" "$ROOT/selftests/lguest/"
while read -r prog _; do
	[ -n "$prog" ] || continue
	cp "$BIN/$prog" "$ROOT/selftests/lguest/$prog" || fail "test program $prog was not built"
done <"$REPO/selftests/tests.list"
cp "$BIN/lguest_bench" "$BIN/lguest_netbench" "$BIN/lguest_peer_bench" "$BIN/lguest_probe" "$ROOT/selftests/lguest/"
# The peer benchmark's peers (PEERS=all or a list, scripts/bench.sh; never
# make test): runsc, UML and its libraries, and the script that runs them.
cp "$REPO/harness/peerbench.sh" "$ROOT/usr/share/lguest/peerbench.sh"
if [ -n "${PEERS:-}" ]; then
	want=()
	case ",$PEERS," in *,all,*|*,gvisor*) want+=(runsc) ;; esac
	case ",$PEERS," in *,all,*|*,uml*) want+=(uml) ;; esac
	if [ ${#want[@]} -gt 0 ]; then
		say "peers: ${want[*]}"
		list=$(bash "$REPO/scripts/peers.sh" "${want[@]}") || fail "scripts/peers.sh ${want[*]} failed"
		while read -r peer path; do
			case "$peer" in
			runsc) cp "$path" "$ROOT/usr/bin/runsc" ;;
			uml) mkdir -p "$ROOT/usr/lib/uml"
				cp "$path/linux" "$ROOT/usr/lib/uml/linux"
				cp -r "$path/root/." "$ROOT/" ;;
			esac
		done <<<"$list"
	fi
fi
# The Linux guest's own initramfs: busybox and its /init (guest/linux/init).
GROOT="$OUT/guest-rootfs"
rm -rf "$GROOT"
mkdir -p "$GROOT/bin"
cp /bin/busybox "$GROOT/bin/busybox"
cp "$BIN/lguest_linux_user" "$GROOT/bin/lguest-linux-user"
cp "$BIN/lguest_peer_bench" "$GROOT/bin/lguest-peer-bench"
cp "$BIN/lguest_probe" "$GROOT/bin/lguest-probe"
cp "$BIN/lguest-tcpsink" "$GROOT/bin/lguest-tcpsink"
cp "$REPO/guest/linux/init" "$GROOT/init"
( cd "$GROOT" && find . | cpio -o -H newc --quiet | gzip -1 ) >"$ROOT/usr/share/lguest/guests/linux-initramfs.gz"
echo "root:x:0:0:root:/:/bin/sh" >"$ROOT/etc/passwd"
echo "nobody:x:65534:65534:nobody:/:/bin/false" >>"$ROOT/etc/passwd"
( cd "$ROOT" && find . | cpio -o -H newc --quiet | gzip -1 ) >"$OUT/initramfs.gz"
cp "$KOBJ/arch/x86/boot/bzImage" "$OUT/bzImage"
ln -sfn "$KOBJ" "$OUT/kernel-tree"
echo "$OUT"
