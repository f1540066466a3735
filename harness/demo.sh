#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
# The default demo of `make run`: the hello guest, then the devices demo
# (virtio console, entropy, a disk and a network card on the lguest bus),
# then guest user mode, each attached to the terminal.
echo "== /dev/lguest: $(ls -l /dev/lguest)"
lguest version
echo "== lguest run /usr/share/lguest/guests/hello"
lguest run --memory 64M /usr/share/lguest/guests/hello from the demo
echo "== the launcher exited with status $?"
dd if=/dev/zero of=/tmp/demo-disk.img bs=1M count=8 2>/dev/null
echo "== lguest run --disk /tmp/demo-disk.img --net tap=demo0 /usr/share/lguest/guests/devices"
lguest run --memory 64M --disk /tmp/demo-disk.img --net tap=demo0 /usr/share/lguest/guests/devices </dev/null
echo "== the launcher exited with status $?"
echo "== lguest run /usr/share/lguest/guests/user"
lguest run --memory 64M /usr/share/lguest/guests/user
echo "== the launcher exited with status $?"
