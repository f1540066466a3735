#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
# mmdebstrap's customize hook (scripts/rootfs.sh): $1 is the new root.
# Makes the image boot as an lguest guest: the root is the first virtio
# disk, root logs in without a password on the virtio console (hvc1, the
# launcher's terminal), and the network card is configured by
# systemd-networkd from the kernel's ip= option when the launcher gives one.
set -eu
R=$1
echo lguest-debian >"$R/etc/hostname"
chmod 644 "$R/etc/hostname"
printf '127.0.0.1\tlocalhost\n127.0.1.1\tlguest-debian\n::1\tlocalhost ip6-localhost ip6-loopback\n' >"$R/etc/hosts"
printf '/dev/vda\t/\text4\terrors=remount-ro\t0\t1\n' >"$R/etc/fstab"
# A guest for tests and a first login: no root password (passwd sets one).
chroot "$R" passwd -d root >/dev/null
# hvc0 is the launcher's boot console (write-only); hvc1 is the virtio
# console a person types on: a getty there, none on hvc0.
chroot "$R" systemctl enable serial-getty@hvc1.service >/dev/null 2>&1
chroot "$R" systemctl mask serial-getty@hvc0.service >/dev/null 2>&1
# The guest's clock is the host's TSC; there is no NTP server to reach.
chroot "$R" systemctl mask systemd-timesyncd.service >/dev/null 2>&1 || true
# The network: systemd-networkd, configured from ip= on the kernel's
# command line by systemd-network-generator (no DHCP server to wait for).
chroot "$R" systemctl enable systemd-networkd.service systemd-network-generator.service >/dev/null 2>&1
# Machine id made at first boot.
: >"$R/etc/machine-id"
