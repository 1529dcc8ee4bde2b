//! Input checks shared by the builder, lock requests and the attribute's runtime path.

use std::time::Duration;

use crate::LockError;

/// The longest key accepted, in bytes.
pub(crate) const MAX_KEY_BYTES: usize = 1024;

/// The longest lease accepted. Far beyond any sensible job, and small enough that instants
/// and Redis millisecond arithmetic never overflow.
pub(crate) const MAX_TTL: Duration = Duration::from_secs(365 * 24 * 3600);

/// The default lease length when neither the request nor the builder sets one.
pub(crate) const DEFAULT_TTL: Duration = Duration::from_secs(30);

/// How long `build()` waits for the store to answer before giving up.
pub(crate) const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a shutdown lets held leases finish, unless the builder says otherwise.
pub(crate) const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// Checks a lock key or a namespace: non-empty, at most 1 KiB, no braces (they would break the
/// Cluster hash tag `{key}` that keeps a lock's record, fence and channel in one slot), no
/// control characters.
pub(crate) fn check_name(what: &str, value: &str) -> Result<(), LockError> {
    if value.is_empty() {
        return Err(LockError::config(format!("{what} must not be empty")));
    }
    if value.len() > MAX_KEY_BYTES {
        return Err(LockError::config(format!(
            "{what} is {} bytes long; the limit is {MAX_KEY_BYTES} bytes",
            value.len()
        )));
    }
    if value.contains(['{', '}']) {
        return Err(LockError::config(format!(
            "{what} `{}` contains a brace; braces are reserved for the Redis Cluster hash tag",
            preview(value)
        )));
    }
    if value.chars().any(char::is_control) {
        return Err(LockError::config(format!(
            "{what} `{}` contains a control character",
            preview(value).escape_debug()
        )));
    }
    Ok(())
}

/// Checks a lease length.
pub(crate) fn check_ttl(what: &str, ttl: Duration) -> Result<(), LockError> {
    if ttl.is_zero() {
        return Err(LockError::config(format!(
            "{what} must be longer than zero"
        )));
    }
    if ttl < Duration::from_millis(1) {
        return Err(LockError::config(format!(
            "{what} of {ttl:?} is below Redis' 1 ms resolution"
        )));
    }
    if ttl > MAX_TTL {
        return Err(LockError::config(format!(
            "{what} of {ttl:?} is longer than the limit of 365 days"
        )));
    }
    Ok(())
}

/// Milliseconds since the Unix epoch (0 before it).
pub(crate) fn unix_ms(t: std::time::SystemTime) -> u64 {
    t.duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Milliseconds for Redis, rounded up so a lease is never shorter than asked.
pub(crate) fn millis_ceil(d: Duration) -> u64 {
    let ms = d.as_millis();
    let ms = if Duration::from_millis(ms as u64) < d {
        ms + 1
    } else {
        ms
    };
    u64::try_from(ms).unwrap_or(u64::MAX)
}

/// A random duration in `[0, max)`, to spread the retries of many waiters or contenders. Not
/// for secrets: seeded per call from the std hasher's random keys, or, on a thread where
/// [`seed_jitter`] was called (a deterministic simulation), drawn from that seed.
pub(crate) fn jitter(max: Duration) -> Duration {
    use std::hash::{BuildHasher, RandomState};
    let nanos = u64::try_from(max.as_nanos()).unwrap_or(u64::MAX).max(1);
    let seeded = JITTER_SEED.with(|state| {
        let mut x = state.get()?;
        // xorshift64
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        state.set(Some(x));
        Some(x)
    });
    let draw = seeded.unwrap_or_else(|| RandomState::new().hash_one(std::time::SystemTime::now()));
    Duration::from_nanos(draw % nanos)
}

thread_local! {
    static JITTER_SEED: std::cell::Cell<Option<u64>> = const { std::cell::Cell::new(None) };
}

/// Makes [`jitter`] on this thread a function of `seed` (None: random again).
pub(crate) fn seed_jitter(seed: Option<u64>) {
    JITTER_SEED.with(|state| state.set(seed.map(|s| s | 1)));
}

/// The safety margin subtracted from a lease's validity: ttl * 1% + 2 ms, for clock drift
/// between this process and the store.
pub(crate) fn drift(ttl: Duration) -> Duration {
    ttl / 100 + Duration::from_millis(2)
}

fn preview(value: &str) -> String {
    const MAX: usize = 64;
    if value.len() <= MAX {
        return value.to_owned();
    }
    let mut end = MAX;
    while !value.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &value[..end])
}

/// Replaces the password (and a lone token-style user) of a URL with `***`, so a URL can be
/// shown in errors and logs (as the runtime shows store addresses; `lockctl` too).
///
/// ```
/// assert_eq!(lock_runtime::redact_url("redis://app:s3cret@db:6379/0"), "redis://app:***@db:6379/0");
/// ```
pub fn redact_url(url: &str) -> String {
    let Some(scheme_end) = url.find("://") else {
        // Not a URL we can read; show nothing that could be a secret.
        return if url.contains('@') {
            "<redacted>".to_owned()
        } else {
            url.to_owned()
        };
    };
    let rest = &url[scheme_end + 3..];
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let authority = &rest[..authority_end];
    let Some(at) = authority.rfind('@') else {
        return url.to_owned();
    };
    let userinfo = &authority[..at];
    let shown_user = match userinfo.split_once(':') {
        Some((user, _password)) => format!("{user}:***"),
        None => "***".to_owned(),
    };
    format!(
        "{}{}@{}{}",
        &url[..scheme_end + 3],
        shown_user,
        &authority[at + 1..],
        &rest[authority_end..]
    )
}

/// `text` percent-encoded for the user or password part of a URL: every byte but the
/// unreserved ones (letters, digits, `-._~`), so a password with `/`, `?`, `#`, `@` or `%`
/// reads back as itself.
pub(crate) fn encode_userinfo(text: &str) -> String {
    use std::fmt::Write as _;
    let mut encoded = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            encoded.push(char::from(byte));
        } else {
            let _ = write!(encoded, "%{byte:02X}");
        }
    }
    encoded
}

/// The password of a URL, if any, so error texts can be scrubbed of it.
pub(crate) fn url_secret(url: &str) -> Option<String> {
    let rest = &url[url.find("://")? + 3..];
    let authority = &rest[..rest.find(['/', '?', '#']).unwrap_or(rest.len())];
    let userinfo = &authority[..authority.rfind('@')?];
    let secret = match userinfo.split_once(':') {
        Some((_, password)) => password,
        None => userinfo,
    };
    (!secret.is_empty()).then(|| secret.to_owned())
}

/// `hostname:pid`, the default owner written into lock records.
pub(crate) fn default_owner() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok().filter(|h| !h.is_empty()))
        .unwrap_or_else(|| "unknown-host".to_owned());
    format!("{host}:{}", std::process::id())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_userinfo() {
        assert_eq!(encode_userinfo("plain-pw_1.~"), "plain-pw_1.~");
        assert_eq!(
            encode_userinfo("a/b?c#d%e@f:g"),
            "a%2Fb%3Fc%23d%25e%40f%3Ag"
        );
        assert_eq!(encode_userinfo("é"), "%C3%A9");
    }

    #[test]
    fn redacts_passwords() {
        assert_eq!(
            redact_url("redis://user:hunter2@127.0.0.1:6379/0"),
            "redis://user:***@127.0.0.1:6379/0"
        );
        assert_eq!(
            redact_url("redis://:hunter2@localhost"),
            "redis://:***@localhost"
        );
        assert_eq!(
            redact_url("redis://127.0.0.1:6379"),
            "redis://127.0.0.1:6379"
        );
        assert_eq!(redact_url("garbage@secret"), "<redacted>");
        assert_eq!(
            url_secret("redis://u:p%40ss@h:1").as_deref(),
            Some("p%40ss")
        );
        assert_eq!(url_secret("redis://h:1"), None);
    }

    #[test]
    fn names_are_checked() {
        assert!(check_name("key", "").is_err());
        assert!(check_name("key", &"k".repeat(1025)).is_err());
        assert!(check_name("key", &"k".repeat(1024)).is_ok());
        assert!(check_name("key", "a{b}").is_err());
        assert!(check_name("key", "a\nb").is_err());
        assert!(check_name("key", "interest:2026-11-30").is_ok());
    }

    #[test]
    fn ttl_bounds() {
        assert!(check_ttl("ttl", Duration::ZERO).is_err());
        assert!(check_ttl("ttl", Duration::from_micros(10)).is_err());
        assert!(check_ttl("ttl", MAX_TTL + Duration::from_secs(1)).is_err());
        assert!(check_ttl("ttl", Duration::from_secs(60)).is_ok());
        assert_eq!(millis_ceil(Duration::from_micros(1500)), 2);
        assert_eq!(millis_ceil(Duration::from_millis(7)), 7);
    }
}
