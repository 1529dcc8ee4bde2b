//! A small seeded random generator (xorshift64), so fault schedules replay from a printed seed.

/// Xorshift64: not for secrets, only for replayable test schedules.
#[derive(Debug, Clone)]
pub struct XorShift(u64);

impl XorShift {
    /// A generator from `seed` (any value; zero is mapped to a fixed non-zero state).
    pub fn new(seed: u64) -> Self {
        XorShift(seed | 1)
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
