// SPDX-License-Identifier: GPL-2.0
//! `lguest-abi`: the lguest ioctl and guest ABI for Rust userspace and guests.
//!
//! The definitions live in `uapi.rs`, which `lguest.ko` compiles too; this
//! crate only re-exports them, so there is exactly one definition.
#![no_std]

pub mod bus;
mod uapi;
pub use uapi::*;
