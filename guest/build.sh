#!/bin/bash
# SPDX-License-Identifier: GPL-2.0
#
# Builds every guest ELF (the samples under samples/) and copies them to OUT:
#
#   guest/build.sh OUT      ->  OUT/hello, OUT/guest-ops, ...
#
# The guest is freestanding (x86_64-unknown-none) and needs build-std, hence
# RUSTC_BOOTSTRAP=1 and the -Z flags on stable; guest/.cargo/config.toml adds
# the linker script and -C relocation-model=static, so cargo runs from guest/.
# Extra arguments after OUT go to cargo (e.g. --locked). CARGO_TARGET_DIR is
# honoured.
set -euo pipefail

fail() {
	echo "guest/build.sh: $*" >&2
	exit 1
}

[ $# -ge 1 ] && [ -n "$1" ] || fail "usage: guest/build.sh OUTDIR [CARGO ARGS...]"
out=$1
shift

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
samples="$here/../samples"
target=x86_64-unknown-none

command -v cargo >/dev/null || fail "cargo not found (install rustup's stable toolchain)"

# Every sample is a binary named after its directory, plus any other
# [[bin]] its Cargo.toml names (user-upper, say).
bins=()
for dir in "$samples"/*/; do
	[ -f "$dir/Cargo.toml" ] || continue
	bins+=("$(basename "$dir")")
	for extra in $(awk '/^\[\[bin\]\]/ { b = 1; next } b && /^name *=/ { gsub(/[" ]/, "", $0); sub(/^name=/, "", $0); print; b = 0 }' "$dir/Cargo.toml"); do
		[ "$extra" = "$(basename "$dir")" ] || bins+=("$extra")
	done
done
[ ${#bins[@]} -gt 0 ] || fail "no samples found under $samples"

cd "$here"
export RUSTC_BOOTSTRAP=1
cargo build --release --target "$target" \
	-Zbuild-std=core,alloc,compiler_builtins \
	-Zbuild-std-features=compiler-builtins-mem "$@" \
	|| fail "cargo build failed (see above; build-std also needs 'rustup component add rust-src')"

tdir=${CARGO_TARGET_DIR:-$here/target}
case $tdir in /*) ;; *) tdir="$here/$tdir" ;; esac
mkdir -p "$out" || fail "cannot create $out"
for bin in "${bins[@]}"; do
	elf="$tdir/$target/release/$bin"
	[ -f "$elf" ] || fail "$bin was not built (expected $elf)"
	cp "$elf" "$out/$bin" || fail "cannot copy $bin to $out"
done
echo "guest/build.sh: built ${bins[*]} into $out" >&2
