#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
# The demo of `make run`, by `lgtest.demo=` on the host's command line
# (DEMO= of make run, scripts/run.sh):
#   debian   the Debian root filesystem on the host's NVMe disk (make
#            rootfs's image, attached by scripts/qemu.sh) booted by the
#            Linux guest from a virtio disk; log in as root; `poweroff`
#            ends the guest;
#   busybox  the Linux guest to an interactive busybox shell on its virtio
#            console (hvc1), attached to the terminal; `exit` powers the
#            guest off (`linux` is its older name);
#   rust     the Rust guests: hello, then the devices demo (virtio console,
#            entropy, a disk and a network card on the lguest bus), then
#            guest user mode, each attached to the terminal.
demo=busybox
for arg in $(cat /proc/cmdline); do
	case "$arg" in
	lgtest.demo=*) demo=${arg#lgtest.demo=} ;;
	esac
done
G=/usr/share/lguest/guests
echo "== /dev/lguest: $(ls -l /dev/lguest)"
lguest version
case "$demo" in
debian)
	if [ ! -b /dev/nvme0n1 ]; then
		echo "== no Debian root filesystem attached (/dev/nvme0n1): make rootfs, then make run"
	else
		echo "== lguest run --memory 512M --disk path=/dev/nvme0n1 $G/vmlinux -- root=/dev/vda rw"
		echo "== log in as root (no password); poweroff ends the guest, then the QEMU host"
		lguest run --memory 512M --disk path=/dev/nvme0n1 $G/vmlinux -- root=/dev/vda rw
		echo "== the launcher exited with status $?"
	fi
	;;
busybox | linux)
	echo "== lguest run --memory 128M --initrd $G/linux-initramfs.gz $G/vmlinux"
	echo "== (the Rust guests' demo: DEMO=rust make run)"
	lguest run --memory 128M --initrd $G/linux-initramfs.gz $G/vmlinux
	echo "== the launcher exited with status $?"
	;;
rust)
	echo "== lguest run $G/hello"
	lguest run --memory 64M $G/hello from the demo
	echo "== the launcher exited with status $?"
	dd if=/dev/zero of=/tmp/demo-disk.img bs=1M count=8 2>/dev/null
	echo "== lguest run --disk /tmp/demo-disk.img --net tap=demo0 $G/devices"
	lguest run --memory 64M --disk /tmp/demo-disk.img --net tap=demo0 $G/devices </dev/null
	echo "== the launcher exited with status $?"
	echo "== lguest run $G/user"
	lguest run --memory 64M $G/user
	echo "== the launcher exited with status $?"
	;;
*)
	echo "== lgtest.demo=$demo: not a demo (debian, busybox or rust)"
	;;
esac
