#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
# The default demo of `make run`. Until a guest can run, it shows the device
# and asks the module for its ABI version through the launcher.
echo "== /dev/lguest"
ls -l /dev/lguest
echo "== lguest version"
lguest version
echo "== kernel log"
dmesg | grep lguest
