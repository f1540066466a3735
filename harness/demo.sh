#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
# The default demo of `make run`: the hello guest, attached to the terminal.
echo "== /dev/lguest: $(ls -l /dev/lguest)"
lguest version
echo "== lguest run /usr/share/lguest/guests/hello"
lguest run --memory 64M /usr/share/lguest/guests/hello from the demo
echo "== the launcher exited with status $?"
