//! Lease tokens: the value that says "this record is mine" to every token-checked script.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::{BackendError, LockError};

/// Where one runtime's lease tokens come from.
///
/// A token is 32 hex digits: 64 bits drawn from the operating system's random source for
/// this token alone, then the next value of the runtime's counter. The counter keeps a
/// runtime's tokens apart from each other; the fresh draw keeps them apart from every other
/// process's, including copies of this one: a child forked after the runtime was built, or
/// several instances restored from one snapshot of a warmed-up service (Firecracker, CRIU,
/// Lambda SnapStart), which hold this struct bit for bit. Nothing kept in memory can tell
/// such copies apart, so each token asks the kernel (which reseeds its generator when a
/// virtual machine is restored). That costs one `getrandom` system call per acquire attempt
/// (about 0.4 us on the 2-core machine of `docs/benchmarks.md`).
pub(crate) struct TokenSource {
    counter: AtomicU64,
}

impl TokenSource {
    pub(crate) fn new() -> Self {
        // Where the counter starts matters to nobody's safety (the per-token draw does that);
        // a random start only keeps tokens from telling how many came before.
        TokenSource {
            counter: AtomicU64::new(getrandom::u64().unwrap_or(0)),
        }
    }

    /// A new lease token; fails only if the operating system's random source does.
    pub(crate) fn next(&self) -> Result<String, LockError> {
        let fresh = getrandom::u64().map_err(|err| {
            LockError::Backend(BackendError::new(format!(
                "the operating system's random source failed while drawing a lease token: {err}"
            )))
        })?;
        let n = self.counter.fetch_add(1, Ordering::Relaxed);
        Ok(hex_token([fresh, n]))
    }

    /// What a copy of the process image holds (a `fork`, or a VM or container snapshot
    /// restored more than once): the same fields, bit for bit.
    #[cfg(test)]
    fn image_copy(&self) -> Self {
        TokenSource {
            counter: AtomicU64::new(self.counter.load(Ordering::Relaxed)),
        }
    }
}

fn hex_token(words: [u64; 2]) -> String {
    let mut token = String::with_capacity(32);
    for word in words {
        for shift in (0..16).rev() {
            let digit = ((word >> (shift * 4)) & 0xf) as u32;
            token.push(char::from_digit(digit, 16).unwrap_or('0'));
        }
    }
    token
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two instances restored from one snapshot of a warmed-up service (or a child forked
    /// after the runtime was built) hold the same token source. Their tokens must still
    /// differ: the acquire script takes "the record holds my token" for a retry of a lost
    /// reply and grants the lock again, so equal tokens would be two holders of one lock,
    /// and the release of one would delete the other's.
    #[test]
    fn copies_of_one_process_image_draw_different_tokens() {
        let original = TokenSource::new();
        let _ = original.next().expect("a token");
        let copy = original.image_copy();
        for _ in 0..100 {
            assert_ne!(
                original.next().expect("a token"),
                copy.next().expect("a token")
            );
        }
    }

    #[test]
    fn tokens_are_32_hex_digits_and_unique() {
        let source = TokenSource::new();
        let mut seen = std::collections::HashSet::new();
        for _ in 0..1000 {
            let token = source.next().expect("a token");
            assert_eq!(token.len(), 32, "{token}");
            assert!(
                token
                    .bytes()
                    .all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f')),
                "{token}"
            );
            assert!(seen.insert(token));
        }
        assert_ne!(
            source.next().expect("a token"),
            TokenSource::new().next().expect("a token")
        );
    }
}
