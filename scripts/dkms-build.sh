#!/bin/bash
# SPDX-License-Identifier: GPL-2.0
#
# Builds lguest.ko with DKMS, as a distribution user's machine rebuilds it
# on a kernel upgrade (dkms.conf), but in private DKMS trees under OUTDIR:
# nothing of the system's DKMS state is touched.
#
#   scripts/dkms-build.sh KDIR OUTDIR   ->  OUTDIR/lguest.ko
#
# The sources DKMS builds are a copy of the repository's tracked and
# untracked, not ignored, files (what `dkms add` of a checkout would see).
# Used by scripts/module-test.sh (the DKMS check) and scripts/build.sh (the
# distro flavour's host boots the module built this way).
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
KDIR=$(realpath "$1")
OUT=$(realpath -m "$2")
release=$(cat "$KDIR/include/config/kernel.release")
command -v dkms >/dev/null 2>&1 || { echo "dkms-build: dkms is not installed (scripts/setup.sh installs it)" >&2; exit 1; }
rm -rf "$OUT" && mkdir -p "$OUT/src/lguest-0.1.0" "$OUT/dkms" "$OUT/install"
(cd "$REPO" && git ls-files -z --cached --others --exclude-standard | xargs -0 cp --parents -t "$OUT/src/lguest-0.1.0") 2>/dev/null
d=(--dkmstree "$OUT/dkms" --sourcetree "$OUT/src" --installtree "$OUT/install")
if ! { dkms add "${d[@]}" lguest/0.1.0 && dkms build "${d[@]}" lguest/0.1.0 -k "$release" --kernelsourcedir "$KDIR"; } >"$OUT/dkms.log" 2>&1; then
	tail -5 "$OUT/dkms.log" >&2
	tail -5 "$OUT/dkms/lguest/0.1.0/build/make.log" >&2 2>/dev/null || true
	echo "dkms-build: the DKMS build failed (log: $OUT/dkms.log)" >&2
	exit 1
fi
cp "$OUT/dkms/lguest/0.1.0/$release/x86_64/module/lguest.ko" "$OUT/lguest.ko"
echo "dkms-build: built $OUT/lguest.ko for $release"
