// SPDX-License-Identifier: GPL-2.0
//! `hello`: the smallest lguest guest. It greets, shows its command line and
//! the shared page's address, and powers off with "hello: done".
#![no_std]
#![no_main]

use lguest_guest::{entry, poweroff, println, Args};

entry!(main);

fn main(args: Args) -> ! {
    println!("Hello from the lguest guest!");
    println!("hello: command line: \"{}\"", args.as_str());
    println!("hello: lguest_data at {:#x}", lguest_guest::data::address());
    poweroff("hello: done")
}
