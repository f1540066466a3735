#!/bin/bash
# SPDX-License-Identifier: GPL-2.0
#
# Builds (once) and caches the Debian root filesystem for the Linux guest;
# prints the image's path.
#
#   scripts/rootfs.sh           ->  $CACHE/rootfs/<suite>-<key>/debian.ext4
#   scripts/rootfs.sh --built   the same path if that image is built
#                               already (status 1, no output, if not)
#
# mmdebstrap makes the tree from the Debian archive (--mode=unshare: no
# root needed where unprivileged user namespaces and subuids exist; as
# root, --mode=root), guest/rootfs/customize.sh makes it bootable under
# lguest, and mke2fs -d packs it into an ext4 image without mounting
# anything. The key covers the suite, the package list, the hook and the
# image size: change any and a new image is built.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/env.sh"
SUITE=${ROOTFS_SUITE:-bookworm}
MIRROR=${ROOTFS_MIRROR:-http://deb.debian.org/debian}
SIZE=${ROOTFS_SIZE:-2G}
# More packages on top of guest/rootfs/packages (e.g. ROOTFS_EXTRA="strace gdb").
EXTRA=${ROOTFS_EXTRA:-}
HERE=$REPO/guest/rootfs

say()  { printf '[rootfs] %s\n' "$*" >&2; }
fail() { printf '[rootfs] ERROR: %s\n' "$*" >&2; exit 1; }

pkgs=$( { grep -v '^#' "$HERE/packages"; echo "$EXTRA"; } | xargs | tr ' ' ,)
key=$( { echo "$SUITE $MIRROR $SIZE $pkgs"; cat "$HERE/customize.sh"; } | sha256sum | cut -c1-12)
DIR=$CACHE/rootfs/$SUITE-$key
IMG=$DIR/debian.ext4
if [ -f "$DIR/.lguest-built" ]; then
	echo "$IMG"
	exit 0
fi
[ "${1:-}" = --built ] && exit 1
command -v mmdebstrap >/dev/null || fail "mmdebstrap is missing: apt-get install mmdebstrap (scripts/setup.sh installs it)"
command -v mke2fs >/dev/null || fail "mke2fs is missing: apt-get install e2fsprogs"
# A clear error where the archive cannot be reached, before anything else.
curl -fsS -o /dev/null --max-time 30 "$MIRROR/dists/$SUITE/Release" \
	|| fail "the Debian archive at $MIRROR cannot be reached (dists/$SUITE/Release): set ROOTFS_MIRROR to a mirror you can reach"
if [ "$(id -u)" = 0 ]; then mode=root; else mode=unshare; fi
rm -rf "$DIR"
mkdir -p "$DIR"
LOG=$DIR/build.log
say "building the $SUITE root filesystem in $DIR (mode $mode, log: $LOG)"
start=$(date +%s)
# As root the tree is written as a directory; in unshare mode it is a
# tarball, since only the user namespace can own its files.
if [ "$mode" = root ]; then target=$DIR/tree; else target=$DIR/tree.tar; fi
mmdebstrap --mode="$mode" --variant=important --include="$pkgs" \
	--customize-hook="$HERE/customize.sh \"\$1\"" \
	--skip=cleanup/apt/lists \
	"$SUITE" "$target" "$MIRROR" >>"$LOG" 2>&1 \
	|| { tail -20 "$LOG" >&2; fail "mmdebstrap failed (log: $LOG)"; }
# mke2fs -d takes a tarball (e2fsprogs >= 1.47.1) or a directory: unpack
# to a directory for the e2fsprogs of bookworm, as the user who owns it.
if [ "$mode" = root ]; then
	mke2fs -q -t ext4 -L debian -d "$DIR/tree" "$IMG.tmp" "$SIZE" >>"$LOG" 2>&1
else
	mkdir "$DIR/tree"
	# Inside the same user namespace, so that owners are kept.
	unshare --map-auto --map-root-user sh -c \
		'tar -C "$1/tree" --numeric-owner -xpf "$1/tree.tar" && mke2fs -q -t ext4 -L debian -d "$1/tree" "$2" "$3"' \
		- "$DIR" "$IMG.tmp" "$SIZE" >>"$LOG" 2>&1
fi || { tail -20 "$LOG" >&2; fail "mke2fs failed (log: $LOG)"; }
rm -rf "$DIR/tree" "$DIR/tree.tar"
mv "$IMG.tmp" "$IMG"
end=$(date +%s)
echo "$((end - start))" >"$DIR/.build-seconds"
touch "$DIR/.lguest-built"
say "built in $((end - start)) s: $(du -h --apparent-size "$IMG" | cut -f1) image, $(du -h "$IMG" | cut -f1) used"
echo "$IMG"
