// SPDX-License-Identifier: GPL-2.0
//! Puts this crate's directory on the linker's search path, so that every
//! guest binary linking against `lguest-guest` finds `lguest-guest.ld` by its
//! bare name (guest/.cargo/config.toml passes `-Tlguest-guest.ld`).

fn main() {
    let dir = std::env::var("CARGO_MANIFEST_DIR").unwrap_or_else(|_| String::from("."));
    println!("cargo:rustc-link-search=native={dir}");
    println!("cargo:rerun-if-changed=lguest-guest.ld");
    println!("cargo:rerun-if-changed=build.rs");
}
