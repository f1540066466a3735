#!/bin/bash
# SPDX-License-Identifier: GPL-2.0
#
# Boots the QEMU TCG host built by build.sh.
#   qemu.sh MODE [CPU] [TESTS]
# MODE is test, run or shell (see harness/init); CPU is a QEMU -cpu value
# (default max: 5-level paging; max,la57=off for 4-level). GDB=1 adds QEMU's
# gdb stub on :1234 and waits for the debugger. ROOTFS=IMAGE attaches IMAGE
# as the host's NVMe disk (/dev/nvme0n1, writes discarded). The console goes
# to stdout; KTAP_LOG=FILE sends the second serial port (the KTAP stream) to
# FILE.
set -euo pipefail
. "$(dirname "$0")/env.sh"
MODE=${1:-shell}
CPU=${2:-max}
TESTS=${3:-}
OUT="${LGUEST_OUT:-$CACHE/out/$FLAVOUR}"
[ -f "$OUT/bzImage" ] || { echo "run scripts/build.sh first" >&2; exit 1; }
# HOST_KARGS: extra host kernel parameters (e.g. highres=off).
HOST_KARGS=${HOST_KARGS-}
MEM=${QEMU_MEM:-2G}
[ "$FLAVOUR" = debug ] && MEM=${QEMU_MEM:-4G}
args=(-accel "${ACCEL:-tcg}" -cpu "$CPU" -m "$MEM" -smp 2 -nographic -no-reboot
      -kernel "$OUT/bzImage" -initrd "$OUT/initramfs.gz"
      -append "console=ttyS0 panic=-1 loglevel=6 $HOST_KARGS lgtest.mode=$MODE${TESTS:+ lgtest.tests=$TESTS} ${KARGS:-}")
# ROOTFS=IMAGE: a disk image (make rootfs's Debian root) as the QEMU host's
# NVMe disk /dev/nvme0n1, written to a snapshot only, for the launcher's
# --disk path=/dev/nvme0n1 (the distro flavour has the NVMe driver built in).
[ -n "${ROOTFS:-}" ] && args+=(-drive "file=$ROOTFS,if=none,id=rootfs,format=raw,snapshot=on"
	-device nvme,drive=rootfs,serial=lguest-rootfs)
# ICOUNT=1: guest time advances one nanosecond per instruction, so that
# benchmark figures are instruction counts and repeatable.
[ "${ICOUNT:-0}" = 1 ] && args+=(-icount shift=0)
# A second serial port for the clean KTAP stream (test mode).
[ -n "${KTAP_LOG:-}" ] && args+=(-serial mon:stdio -serial "file:$KTAP_LOG")
if [ "${GDB:-0}" = 1 ]; then
	args+=(-s -S)
	echo "[qemu] waiting for gdb: gdb $OUT/kernel-tree/vmlinux -ex 'target remote :1234'" >&2
fi
exec qemu-system-x86_64 "${args[@]}"
