//! Reading the scripts' replies, and Redis errors as the runtime reports them.

use std::time::Duration;

use redis::Value;

use super::super::{AcquireOutcome, KeyNames};
use crate::{BackendError, LockError};

/// Reads the acquire script's reply.
pub(super) fn acquire_outcome(
    names: &KeyNames,
    reply: &[Value],
) -> Result<AcquireOutcome, LockError> {
    let bad = || {
        LockError::from(BackendError::new(format!(
            "acquire of `{}` got an unexpected reply from Redis",
            names.key()
        )))
    };
    match reply {
        [Value::Int(1), Value::Int(fence)] => Ok(AcquireOutcome::Acquired {
            fence: u64::try_from(*fence).map_err(|_| bad())?,
        }),
        [Value::Int(0), Value::Int(pttl)] => Ok(AcquireOutcome::Held {
            pttl: pttl_of(*pttl),
        }),
        [Value::Int(2), Value::Int(pttl)] => Ok(AcquireOutcome::Done {
            pttl: pttl_of(*pttl),
        }),
        [Value::Int(3), kind] => Err(BackendError::new(format!(
            "Redis key `{}` holds a value of type `{}`, not a lock record; it was left untouched",
            names.record(),
            value_text(kind)
        ))
        .into()),
        _ => Err(bad()),
    }
}

pub(super) fn pttl_of(pttl: i64) -> Option<Duration> {
    u64::try_from(pttl).ok().map(Duration::from_millis)
}

pub(super) fn value_text(v: &Value) -> String {
    match v {
        Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        Value::SimpleString(s) => s.clone(),
        Value::Okay => "OK".to_owned(),
        Value::Int(i) => i.to_string(),
        other => format!("{other:?}"),
    }
}

pub(super) fn percent_decode(s: &str) -> String {
    fn hex(b: u8) -> Option<u8> {
        (b as char).to_digit(16).and_then(|d| u8::try_from(d).ok())
    }
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && i + 2 < bytes.len()
            && let (Some(hi), Some(lo)) = (hex(bytes[i + 1]), hex(bytes[i + 2]))
        {
            out.push(hi * 16 + lo);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A Redis error in `context`, naming the server as shown (no password) and scrubbed of
/// `secrets`.
pub(super) fn redis_error(
    shown_url: &str,
    secrets: &[String],
    context: &str,
    e: redis::RedisError,
) -> LockError {
    BackendError::redis(&format!("{context} (Redis at `{shown_url}`)"), e, secrets).into()
}
