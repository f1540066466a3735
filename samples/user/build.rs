// SPDX-License-Identifier: GPL-2.0
//! Links `user-upper` in the top 2 GiB: lguest-guest.ld puts the image at
//! `LGUEST_KERNEL_BASE` plus its physical address when the link defines it.

fn main() {
    println!("cargo:rustc-link-arg-bin=user-upper=--defsym=LGUEST_KERNEL_BASE=0xffffffff80000000");
    println!("cargo:rerun-if-changed=build.rs");
}
