// SPDX-License-Identifier: GPL-2.0
//! The fuzzer's pseudo-random numbers: splitmix64, seeded from the command
//! line, so that a seed reproduces the same sequence of operations (only
//! the timing of timer interrupts differs from run to run).

/// A splitmix64 generator.
pub struct Rng(u64);

/// Values at the edges of what hypercall arguments and registers may hold.
const EDGES: &[u64] = &[
    0,
    1,
    2,
    0xff,
    0x1000,
    0xfff,
    0x10_0000,
    0x7fff_ffff,
    0x8000_0000,
    0xffff_ffff,
    0x1_0000_0000,
    (1 << 47) - 1,
    1 << 47,
    (1 << 56) - 1,
    1 << 56,
    0x7fff_ffff_ffff_ffff,
    0x8000_0000_0000_0000,
    0xffff_8000_0000_0000,
    0xffff_ffff_ffff_f000,
    0xffff_ffff_ffff_fffe,
    u64::MAX,
];

impl Rng {
    /// A generator for `seed` (any value, 0 included).
    pub fn new(seed: u64) -> Self {
        let mut rng = Self(seed);
        // Stir once so that neighbouring seeds start far apart.
        rng.next();
        rng
    }

    /// The next 64 random bits.
    pub fn next(&mut self) -> u64 {
        lguest_splitmix::next(&mut self.0)
    }

    /// A number in `0..n` (0 when `n` is 0), without modulo bias worth
    /// speaking of.
    pub fn below(&mut self, n: u64) -> u64 {
        lguest_splitmix::below(self.next(), n)
    }

    /// A number in `lo..=hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo + 1)
    }

    /// True with probability `permille` / 1000.
    pub fn chance(&mut self, permille: u64) -> bool {
        self.below(1000) < permille
    }

    /// One element of a non-empty slice.
    pub fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.below(items.len() as u64) as usize]
    }

    /// A value for an argument or a register: an edge value, a small
    /// number, or 64 random bits, about a third each.
    pub fn arg(&mut self) -> u64 {
        match self.below(3) {
            0 => self.pick(EDGES),
            1 => self.below(0x1_0000),
            _ => self.next(),
        }
    }
}
