#!/bin/bash
# SPDX-License-Identifier: GPL-2.0
#
# make run: builds what is missing and boots the QEMU host with a demo
# (harness/demo.sh), chosen by DEMO=:
#   debian   the Debian root filesystem of `make rootfs` booted by the Linux
#            guest from a virtio disk, to systemd's login prompt on the
#            virtio console (the default once the image is built; the QEMU
#            host is then the distro flavour, which has the NVMe driver
#            the image is attached with);
#   busybox  the Linux guest with its initramfs, to a busybox shell (the
#            default until then; `linux` is its older name);
#   rust     the Rust guests.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/env.sh"
S=$REPO/scripts
DEMO=${DEMO:-}
IMG=
if [ -z "$DEMO" ]; then
	if IMG=$(bash "$S/rootfs.sh" --built); then
		DEMO=debian
	else
		DEMO=busybox
		echo "[run] no Debian root filesystem yet: 'make rootfs' builds it (about 5 minutes, from the Debian archive), then 'make run' boots it; now the busybox demo"
	fi
fi
case "$DEMO" in
debian)
	if [ -z "$IMG" ] && ! IMG=$(bash "$S/rootfs.sh" --built); then
		echo "[run] DEMO=debian needs the Debian root filesystem: run 'make rootfs' first" >&2
		exit 1
	fi
	export FLAVOUR=distro ROOTFS=$IMG
	;;
busybox | linux) DEMO=busybox ;;
rust) ;;
*)
	echo "[run] DEMO=$DEMO: not a demo (debian, busybox or rust)" >&2
	exit 2
	;;
esac
bash "$S/build.sh" >/dev/null
echo "[run] booting the QEMU host ($FLAVOUR flavour) with the $DEMO demo; Ctrl-A X leaves QEMU"
KARGS="${KARGS:-} lgtest.demo=$DEMO" exec bash "$S/qemu.sh" run "${CPU:-max}"
