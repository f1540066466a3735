// SPDX-License-Identifier: GPL-2.0
//! splitmix64 (Steele, Lea and Flood, 2014): small, fast, and every seed,
//! 0 included, gives a good stream. The one copy of it that the ioctl
//! fuzzer (`selftests`) and the guest fuzzer and page-table stress test
//! (`samples/fuzz`, `samples/mmstress`, freestanding) share, so that a seed
//! means the same sequence everywhere.
#![no_std]

/// Advances `state` and returns the next 64 random bits.
pub fn next(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// `bits` scaled to `0..n` (0 when `n` is 0), by multiplying and keeping
/// the high half: no division, and no modulo bias worth speaking of.
pub fn below(bits: u64, n: u64) -> u64 {
    // CAST: the high 64 bits of a 128-bit product fit a u64.
    ((u128::from(bits) * u128::from(n)) >> 64) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The reference stream for seed 0 (from the splitmix64 paper's code).
    #[test]
    fn known_values() {
        let mut s = 0u64;
        assert_eq!(next(&mut s), 0xe220_a839_7b1d_cdaf);
        assert_eq!(next(&mut s), 0x6e78_9e6a_a1b9_65f4);
        assert_eq!(next(&mut s), 0x06c4_5d18_8009_454f);
    }

    #[test]
    fn below_stays_below() {
        assert_eq!(below(u64::MAX, 0), 0);
        assert_eq!(below(u64::MAX, 10), 9);
        assert_eq!(below(0, 10), 0);
        let mut s = 7;
        assert!((0..1000).all(|_| below(next(&mut s), 3) < 3));
    }
}
