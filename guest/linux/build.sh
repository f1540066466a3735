#!/bin/bash
# SPDX-License-Identifier: GPL-2.0
#
# Builds (once) and caches the Linux guest kernel; prints its vmlinux.
#
#   guest/linux/build.sh   ->  $CACHE/guest-linux/<key>/obj/vmlinux
#
# The source is the host's linux-source-7.3 (scripts/setup.sh), copied as
# hard links and patched (GNU patch writes each changed file anew, so the
# host's tree is never modified), configured from allnoconfig and
# guest.config, and built out of tree with the host's toolchain (clang 19
# and Debian's rustc-web). The cache key covers the kernel version, the
# patches, the fragment and the toolchain: change any and it is rebuilt.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
FLAVOUR=normal
. "$HERE/../../scripts/env.sh"

say()  { printf '[guest-linux] %s\n' "$*" >&2; }
fail() { printf '[guest-linux] ERROR: %s\n' "$*" >&2; exit 1; }

[ -f "$KSRC/Makefile" ] || fail "no kernel source at $KSRC: run scripts/setup.sh"
ver=$(make -s --no-print-directory -C "$KSRC" kernelversion)
key=$ver-$( { cat "$HERE/guest.config" "$HERE"/patches/*.patch;
	(cd "$HERE" && find arch -type f | LC_ALL=C sort | xargs sha256sum);
	"$KRUSTC" --version; clang-19 --version | head -1; } | sha256sum | cut -c1-12)
DIR=$CACHE/guest-linux/$key
if [ -f "$DIR/.lguest-built" ]; then
	echo "$DIR/obj/vmlinux"
	exit 0
fi
rm -rf "$DIR"
mkdir -p "$DIR/obj"
LOG=$DIR/build.log
say "building the Linux guest in $DIR (log: $LOG)"
start=$(date +%s)
cp -al "$KSRC" "$DIR/src"
for p in "$HERE"/patches/*.patch; do
	patch -d "$DIR/src" -p1 -s --no-backup-if-mismatch <"$p" >>"$LOG" 2>&1 \
		|| { tail -5 "$LOG" >&2; fail "$(basename "$p") does not apply to $ver"; }
done
# The backend's own files (arch/x86/lguest/): new files, so copies, not links.
cp -r --remove-destination "$HERE/arch" "$DIR/src/"
{
	"${KMAKE[@]}" -C "$DIR/src" O="$DIR/obj" allnoconfig
	"$DIR/src/scripts/kconfig/merge_config.sh" -m -O "$DIR/obj" "$DIR/obj/.config" "$HERE/guest.config"
	"${KMAKE[@]}" -C "$DIR/src" O="$DIR/obj" olddefconfig
} >>"$LOG" 2>&1 || { tail -30 "$LOG" >&2; fail "configuration failed"; }
bad=0
while IFS= read -r line; do
	case "$line" in
	CONFIG_*=n) sym=${line%%=*}
		if grep -q "^$sym=" "$DIR/obj/.config"; then say "config: $sym should be off"; bad=1; fi ;;
	CONFIG_*=*) if ! grep -qxF "$line" "$DIR/obj/.config"; then say "config: wanted $line, got: $(grep "^${line%%=*}=" "$DIR/obj/.config" || echo unset)"; bad=1; fi ;;
	esac
done <"$HERE/guest.config"
[ $bad = 0 ] || fail "guest.config could not be applied whole (see above)"
"${KMAKE[@]}" -C "$DIR/src" O="$DIR/obj" -j"$(( $(nproc) + 1 ))" vmlinux >>"$LOG" 2>&1 \
	|| { grep -E 'error|Error' "$LOG" | tail -20 >&2; fail "the guest kernel build failed (log: $LOG)"; }
end=$(date +%s)
echo "$((end - start))" >"$DIR/.build-seconds"
touch "$DIR/.lguest-built"
say "built in $((end - start)) s"
echo "$DIR/obj/vmlinux"
