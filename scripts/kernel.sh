#!/bin/bash
# SPDX-License-Identifier: GPL-2.0
#
# Build (once) and cache the Rust-enabled host kernel. Prints the build
# directory on stdout. Rebuilds only when the kernel version, the toolchain or
# a config fragment changes.
set -euo pipefail
. "$(dirname "$0")/env.sh"

say()  { printf '[kernel] %s\n' "$*" >&2; }
fail() { printf '[kernel] ERROR: %s\n' "$*" >&2; exit 1; }

[ -f "$KSRC/Makefile" ] || fail "no kernel source at $KSRC: run scripts/setup.sh"
KOBJ="$CACHE/build/$(kernel_key)"
if [ -f "$KOBJ/.lguest-built" ]; then
	echo "$KOBJ"
	exit 0
fi

mkdir -p "$KOBJ"
LOG="$KOBJ/build.log"
say "building host kernel in $KOBJ (log: $LOG); the first build takes a while"
start=$(date +%s)
{
	"${KMAKE[@]}" -C "$KSRC" O="$KOBJ" rustavailable
	if [ "$FLAVOUR" = distro ]; then
		# Debian's configuration, every module left out (the initramfs
		# holds none), then kernel/distro.config's listed deviations.
		[ -f "$DISTRO_CONFIG" ] || { echo "no $DISTRO_CONFIG: run scripts/setup.sh"; exit 1; }
		sed -E 's/^(CONFIG_[A-Za-z0-9_]+)=m$/# \1 is not set/' "$DISTRO_CONFIG" >"$KOBJ/.config"
	else
		"${KMAKE[@]}" -C "$KSRC" O="$KOBJ" allnoconfig
	fi
	"$KSRC/scripts/kconfig/merge_config.sh" -m -O "$KOBJ" "$KOBJ/.config" $(kernel_fragments)
	"${KMAKE[@]}" -C "$KSRC" O="$KOBJ" olddefconfig
} >"$LOG" 2>&1 || { tail -30 "$LOG" >&2; fail "configuration failed"; }

# Every line of the fragments must have survived: a dropped option (a missing
# dependency) would otherwise show up much later as a confusing test failure.
bad=0
for frag in $(kernel_fragments); do
	while IFS= read -r line; do
		case "$line" in
		CONFIG_*=n) sym=${line%%=*}
			if grep -q "^$sym=" "$KOBJ/.config"; then say "config: $sym should be off"; bad=1; fi ;;
		CONFIG_*=*) if ! grep -qxF "$line" "$KOBJ/.config"; then say "config: wanted $line, got: $(grep "^${line%%=*}=" "$KOBJ/.config" || echo unset)"; bad=1; fi ;;
		esac
	done <"$frag"
done
[ $bad = 0 ] || fail "the config fragments could not all be applied (see above)"

"${KMAKE[@]}" -C "$KSRC" O="$KOBJ" -j"$(( $(nproc) + 1 ))" bzImage modules_prepare >>"$LOG" 2>&1 \
	|| { grep -E 'error|Error' "$LOG" | tail -20 >&2; fail "kernel build failed (log: $LOG)"; }
cp "$KOBJ/vmlinux.symvers" "$KOBJ/Module.symvers"
end=$(date +%s)
echo "$((end - start))" >"$KOBJ/.build-seconds"
touch "$KOBJ/.lguest-built"
say "built in $((end - start)) s"
echo "$KOBJ"
