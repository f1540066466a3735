#!/bin/bash
# SPDX-License-Identifier: GPL-2.0
#
# One-time (idempotent) set-up of a fresh Debian 12 machine for lguest-rs:
#  - Debian packages from bookworm (never trixie in the system's sources),
#    Bochs and a CD image's boot loader for `make bochs-test` among them,
#  - the Debian-patched 7.3 kernel source, fetched with a private apt
#    configuration and only unpacked,
#  - a matched rustc + Rust library source for the kernel side
#    (bookworm-security's rustc-web / rust-web-src),
#  - bindgen-cli.
# Each step is skipped when its result is already present.
set -euo pipefail

CACHE=${LGUEST_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/lguest}
KSERIES=${KSERIES:-7.3}
mkdir -p "$CACHE"

say()  { printf '[setup] %s\n' "$*"; }
fail() { printf '[setup] ERROR: %s\n' "$*" >&2; exit 1; }

SUDO=
if [ "$(id -u)" != 0 ]; then SUDO=sudo; fi

PKGS=(qemu-system-x86 busybox-static cpio flex bison bc libelf-dev libssl-dev
      xz-utils clang-19 lld-19 llvm-19 libclang-19-dev rustc-web rust-web-src
      libstd-rust-web-dev python3 iproute2 kmod dkms patch
      bochs bochs-term bochsbios vgabios isolinux syslinux-common genisoimage
      mmdebstrap e2fsprogs curl)

missing=()
for p in "${PKGS[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
	say "installing Debian packages: ${missing[*]}"
	$SUDO apt-get update -qq || fail "apt-get update failed"
	DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" \
		>"$CACHE/apt.log" 2>&1 || { tail -20 "$CACHE/apt.log"; fail "apt-get install failed (log: $CACHE/apt.log)"; }
fi

# The kernel source: linux-source-$KSERIES from trixie-backports, via a
# private apt state so the system's sources never see trixie.
SRCDIR="$CACHE/src"
if [ ! -f "$SRCDIR/linux-source-$KSERIES/Makefile" ]; then
	say "fetching linux-source-$KSERIES (private apt configuration, unpacked only)"
	APT="$CACHE/apt-trixie"
	mkdir -p "$APT/lists/partial" "$APT/archives/partial" "$SRCDIR"
	cat >"$APT/sources.list" <<EOS
deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian trixie-backports main
EOS
	: >"$APT/status"
	APTOPTS=(-o Dir::Etc::SourceList="$APT/sources.list" -o Dir::Etc::SourceParts=/dev/null
		 -o Dir::State::Lists="$APT/lists" -o Dir::State::Status="$APT/status"
		 -o Dir::Cache::Archives="$APT/archives" -o Debug::NoLocking=1
		 -o APT::Sandbox::User=root)
	apt-get "${APTOPTS[@]}" update -qq >/dev/null || fail "private apt update for trixie-backports failed"
	(cd "$APT/archives" && apt-get "${APTOPTS[@]}" download "linux-source-$KSERIES") \
		|| fail "could not download linux-source-$KSERIES"
	deb=$(ls "$APT/archives"/linux-source-"$KSERIES"_*.deb | tail -1)
	rm -rf "$APT/unpack"; dpkg-deb -x "$deb" "$APT/unpack"
	tarball=$(ls "$APT/unpack"/usr/src/linux-source-"$KSERIES".tar.* | head -1)
	say "unpacking $(basename "$tarball")"
	tar -C "$SRCDIR" -xf "$tarball" || fail "could not unpack $tarball"
	rm -rf "$APT/unpack" "$deb"
	[ -f "$SRCDIR/linux-source-$KSERIES/Makefile" ] || fail "kernel source tree incomplete"
fi

# The distro flavour's base: the .config of Debian's $KSERIES cloud-amd64
# kernel, from its headers package (the newest $KSERIES.x there: the series
# is pinned, not the patch release), through the same private apt state.
# Only for FLAVOUR=distro: nothing else depends on it.
DISTRO_CONFIG="$SRCDIR/debian-$KSERIES-cloud-amd64.config"
if [ "${FLAVOUR:-normal}" = distro ] && [ ! -f "$DISTRO_CONFIG" ]; then
	say "fetching the .config of Debian's $KSERIES cloud-amd64 kernel"
	APT="$CACHE/apt-trixie"
	APTOPTS=(-o Dir::Etc::SourceList="$APT/sources.list" -o Dir::Etc::SourceParts=/dev/null
		 -o Dir::State::Lists="$APT/lists" -o Dir::State::Status="$APT/status"
		 -o Dir::Cache::Archives="$APT/archives" -o Debug::NoLocking=1
		 -o APT::Sandbox::User=root)
	[ -f "$APT/sources.list" ] && apt-get "${APTOPTS[@]}" update -qq >/dev/null 2>&1 || true
	pkg=$(apt-cache "${APTOPTS[@]}" pkgnames "linux-headers-$KSERIES." 2>/dev/null | grep -E -- "-cloud-amd64\$" | sort -V | tail -1)
	[ -n "$pkg" ] || fail "no linux-headers-$KSERIES.*-cloud-amd64 in trixie-backports"
	(cd "$APT/archives" && apt-get "${APTOPTS[@]}" download "$pkg") >/dev/null 2>&1 || fail "could not download $pkg"
	deb=$(ls "$APT/archives/${pkg}"_*.deb | tail -1)
	rm -rf "$APT/unpack"; dpkg-deb -x "$deb" "$APT/unpack"
	cp "$APT/unpack/usr/src/$pkg/.config" "$DISTRO_CONFIG" || fail "$pkg has no .config"
	echo "# from $(basename "$deb")" >>"$DISTRO_CONFIG"
	rm -rf "$APT/unpack" "$deb"
fi

# bindgen for the kernel's Rust bindings.
if ! command -v bindgen >/dev/null 2>&1 && [ ! -x "$HOME/.cargo/bin/bindgen" ]; then
	say "installing bindgen-cli"
	cargo install --locked --quiet bindgen-cli >"$CACHE/bindgen.log" 2>&1 \
		|| { tail -20 "$CACHE/bindgen.log"; fail "cargo install bindgen-cli failed"; }
fi

# The guest is built with build-std: rustup's toolchain needs its rust-src.
if ! [ -d "$(rustc --print sysroot)/lib/rustlib/src/rust/library/core" ]; then
	say "adding rust-src to the rustup toolchain (for the guest's build-std)"
	rustup component add rust-src >/dev/null 2>&1 || say "rustup rust-src unavailable; the guest build will fail"
fi

say "ok (cache: $CACHE)"
