# SPDX-License-Identifier: GPL-2.0
#
# lguest-rs. The module itself is described in Kbuild; this Makefile drives
# the whole loop (see README.md and Documentation/dev/testing.rst):
#
#   make run      boot the QEMU host, load lguest.ko and run the demo: the
#                 Linux guest to a busybox shell (DEMO=rust: the Rust guests)
#   make test     build everything and run the whole suite (T=, CPUS=, FLAVOUR=)
#   make bochs-test   the targeted set (selftests/bochs.list) under Bochs,
#                 the second test bed (T=, BOCHS_CPUS=1|2, WATCHDOG=)
#   make shell    boot the QEMU host with lguest.ko loaded and give a shell
#   make gdb      the same, stopped at the first instruction, gdb stub on :1234
#   make debug-test   the whole suite, fuzzers included, on the debug kernel
#                 (KASAN, lockdep, kmemleak)
#   make fuzz     only the long runs: the guest and ioctl fuzzers
#   make bench    the benchmarks (instruction counts and ratios), the peer
#                 benchmark last (PEERS=, default all; PEERS=none leaves it out)
#   make peers    only the peer benchmark: gVisor and User-Mode Linux beside
#                 lguest-rs in one QEMU host boot (PEERS=; scripts/peers.sh)
#   make rootfs   the Debian root filesystem for the Linux guest (issue 36)
#   make setup / kernel / build   the individual steps
#   make module [KDIR=...]   lguest.ko for your own kernel (default: the
#                 running one's /lib/modules/$(uname -r)/build), into build/module
#   make install [KDIR=...]  that, then modules_install to extra/ and depmod
#   make uninstall [KDIR=...]  remove what install put there
#   make check    rustfmt (userspace and module) and clippy (userspace)

SHELL := /bin/bash
S := scripts

.PHONY: all setup kernel build test bochs-test run shell gdb debug-test fuzz bench peers check clean module install uninstall rootfs

all: build

setup:
	bash $(S)/setup.sh

kernel: setup
	bash $(S)/kernel.sh

build:
	bash $(S)/build.sh

# The Debian root filesystem for the Linux guest (scripts/rootfs.sh): a
# bookworm ext4 image from the Debian archive, cached by its package list.
rootfs:
	bash $(S)/rootfs.sh

# The suite runs on the distro flavour, Debian's cloud kernel configuration
# (PTI, KASLR, IBT, retpolines and return thunks, GCC): the kernel users
# run. FLAVOUR=normal runs it on the small clang-built kernel that make run,
# make bochs-test and make shell use (Documentation/dev/testing.rst).
test:
	FLAVOUR=$${FLAVOUR:-distro} bash $(S)/test.sh

bochs-test:
	bash $(S)/bochs.sh

# The debug kernel boots on a 4-level CPU: with LA57 a KASAN false report in
# early boot (Documentation/dev/testing.rst, "The debug kernel") would turn
# lockdep off for the whole run.
debug-test:
	FLAVOUR=debug LONG=1 CPUS="max,la57=off" bash $(S)/test.sh

fuzz:
	LONG=1 CPUS=max T=$$(awk '$$2 == "long" { printf "%s%s", s, $$1; s = "," }' selftests/tests.list) bash $(S)/test.sh

module:
	bash $(S)/module.sh build $(KDIR)

install:
	bash $(S)/module.sh install $(KDIR)

uninstall:
	bash $(S)/module.sh uninstall $(KDIR)

bench:
	bash $(S)/bench.sh

peers:
	bash $(S)/peers.sh bench

# DEMO=debian (the default once make rootfs has built the image),
# busybox (the default before) or rust: scripts/run.sh.
run:
	bash $(S)/run.sh

shell: build
	@echo "[shell] booting the QEMU host; 'poweroff -f' or Ctrl-A X leaves"
	bash $(S)/qemu.sh shell "$${CPU:-max}"

gdb: build
	GDB=1 bash $(S)/qemu.sh shell "$${CPU:-max}"

check:
	cargo fmt --all -- --check
	cargo clippy --workspace --all-targets -- -D warnings
	. $(S)/env.sh && rustfmt --config-path "$$KSRC/.rustfmt.toml" --edition 2021 --check lguest_host.rs

clean:
	cargo clean
	rm -rf "$${LGUEST_CACHE:-$${XDG_CACHE_HOME:-$$HOME/.cache}/lguest}/out"
