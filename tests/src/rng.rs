//! A small seeded random generator (xorshift64), so fault schedules replay from a printed seed.

/// Xorshift64: not for secrets, only for replayable test schedules.
#[derive(Debug, Clone)]
pub struct XorShift(u64);

impl XorShift {
    /// A generator from `seed` (any value; zero is mapped to a fixed non-zero state).
    pub fn new(seed: u64) -> Self {
        XorShift(seed | 1)
    }

    /// A generator from `seed` through SplitMix64 first, so that nearby seeds (1, 2, 3...)
    /// start far apart and no two seeds share a state.
    pub fn mixed(seed: u64) -> Self {
        let mut z = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        XorShift::new(z ^ (z >> 31))
    }

    /// The next value.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// A value in `0..n` (`n` > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }
}
