//! The lean path of the Redis store: a plain request (no `min_hold`, no `once`, not a
//! replicated acquire, not a Redlock member) takes its lock by one `SET NX PX`, with no
//! script and no fence (a taken lock costs a second call, `contended.lua`), and asks for its
//! fence only if its holder does
//! ([`LockStore::fence`](super::super::LockStore::fence), the fence script).
//!
//! The record, whichever path wrote it, is a string:
//! `"<token> <fence> <since_ms> <hold_until_ms> <owner>"`. The lean path writes `-` for the
//! fence and the start (both unknown to a client: the server's clock is read by scripts only)
//! and `0` for the hold; the fence script fills the fence in later.

use std::time::Duration;

use redis::Value;

use super::super::{AcquireOutcome, KeyNames};
use super::RedisBackend;
use super::reply::{pttl_of, value_text};
use super::resp::{Arg, Decimal};
use crate::config::millis_ceil;
use crate::{BackendError, LockError};

/// How many times a lean acquire sets again after finding the record gone between its SET and
/// its read of the holder (a release in between); then it reports the lock held.
const LEAN_TRIES: usize = 3;

/// What stands between the token and the owner in a lean record: no fence, no start, no hold.
pub(super) const LEAN_FIELDS: &str = " - - 0 ";

/// A lean record's value, before any fence.
pub(super) fn lean_value(token: &str, owner: &str) -> String {
    let mut value = String::with_capacity(token.len() + LEAN_FIELDS.len() + owner.len());
    value.push_str(token);
    value.push_str(LEAN_FIELDS);
    value.push_str(owner);
    value
}

/// A lean record's value as one command argument, in pieces (see [`lean_value`]).
pub(super) fn lean_arg<'a>(token: &'a str, owner: &'a str) -> Arg<'a> {
    Arg::joined([token.as_bytes(), LEAN_FIELDS.as_bytes(), owner.as_bytes()])
}

/// The fields of a record's value: token, fence, start, hold, owner; None for a string that
/// is no lock record.
pub(super) fn record_fields(value: &str) -> Option<(&str, &str, &str, &str, &str)> {
    // The waiters mark (record.lua) is no part of the owner.
    let value = value.strip_suffix("\nw").unwrap_or(value);
    let mut parts = value.splitn(5, ' ');
    let fields = (
        parts.next()?,
        parts.next()?,
        parts.next()?,
        parts.next()?,
        parts.next()?,
    );
    let (token, fence, since, hold, _) = fields;
    let number_or_dash =
        |s: &str| s == "-" || (!s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()));
    // As Lua's `%S+` reads the token: no space of any kind in it.
    let well_formed = !token.is_empty()
        && !token.bytes().any(|b| b" \t\n\x0b\x0c\r".contains(&b))
        && number_or_dash(fence)
        && number_or_dash(since)
        && !hold.is_empty()
        && hold.bytes().all(|b| b.is_ascii_digit());
    well_formed.then_some(fields)
}

impl RedisBackend {
    /// `SET record value NX PX ttl`. When it is not set, `contended.lua` says by whom and for
    /// how long, and marks the record as waited for: the value may be this very token's (the SET was sent again
    /// after its connection broke, and the first send won), which is then a grant, never an
    /// orphan.
    pub(super) async fn acquire_lean(
        &self,
        names: &KeyNames,
        token: &str,
        owner: &str,
        ttl: Duration,
    ) -> Result<AcquireOutcome, LockError> {
        if self.lean_owner.get().is_none() {
            let _ = self.lean_owner.set(owner.to_owned());
        }
        let context = || format!("acquire of `{}` failed", names.key());
        let mut conn = self.conn.clone();
        // Packed straight into the connection's buffer: no string for the value, no command.
        let ttl_ms = Decimal::of(millis_ceil(ttl));
        let set = [
            "SET".into(),
            names.record().into(),
            lean_arg(token, owner),
            "NX".into(),
            "PX".into(),
            Arg::new(ttl_ms.as_bytes()),
        ];
        for _ in 0..LEAN_TRIES {
            let set: Value = conn
                .query_args(&set, &mut false)
                .await
                .map_err(|e| self.error(&context(), e))?;
            if matches!(set, Value::Okay) {
                return Ok(AcquireOutcome::AcquiredUnfenced);
            }
            // Who holds it, for how long, and the record marked as waited for (contended.lua).
            let reply: Vec<Value> = self
                .scripts
                .contended
                .key(names.record())
                .arg(token)
                .invoke_async(&mut conn)
                .await
                .map_err(|e| self.error(&context(), e))?;
            let (held, pttl) = match reply.as_slice() {
                [] => (None, 0),
                // Bytes: a value that is not UTF-8 is refused by its format below.
                [Value::BulkString(value), Value::Int(pttl)] => (Some(value.clone()), *pttl),
                [tag, kind] if value_text(tag) == "foreign" => {
                    return Err(foreign_error(names, &value_text(kind)));
                }
                _ => {
                    return Err(BackendError::new(format!(
                        "acquire of `{}` got an unexpected reply from Redis",
                        names.key()
                    ))
                    .into());
                }
            };
            let Some(held) = held else {
                continue; // released between the SET and the GET: set again
            };
            let held = String::from_utf8_lossy(&held);
            let Some((holder, fence, ..)) = record_fields(&held) else {
                return Err(foreign_error(names, "string"));
            };
            if holder == token {
                return Ok(match fence.parse::<u64>() {
                    Ok(fence) => AcquireOutcome::Acquired { fence },
                    Err(_) => AcquireOutcome::AcquiredUnfenced,
                });
            }
            return Ok(AcquireOutcome::Held {
                pttl: pttl_of(pttl),
            });
        }
        Ok(AcquireOutcome::Held { pttl: None })
    }

    /// The fence script: `Some(fence)` while the record is `token`'s, else None.
    pub(super) async fn fence_on_demand(
        &self,
        names: &KeyNames,
        token: &str,
        ttl: Duration,
    ) -> Result<Option<u64>, LockError> {
        let mut conn = self.conn.clone();
        let reply: i64 = self
            .scripts
            .fence
            .key(names.record())
            .key(names.fence())
            .arg(token)
            .arg(millis_ceil(super::fence_retention(ttl)))
            .invoke_async(&mut conn)
            .await
            .map_err(|e| self.error(&format!("fence of `{}` failed", names.key()), e))?;
        Ok(u64::try_from(reply).ok())
    }
}

pub(super) fn foreign_error(names: &KeyNames, kind: &str) -> LockError {
    BackendError::new(format!(
        "Redis key `{}` holds a value of type `{kind}`, not a lock record; it was left untouched",
        names.record()
    ))
    .into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_fields_read_both_paths_and_refuse_other_strings() {
        let lean = lean_value("ab12", "host:1 worker a");
        assert_eq!(
            lean_arg("ab12", "host:1 worker a").to_vec(),
            lean.as_bytes()
        );
        assert_eq!(
            record_fields(&lean),
            Some(("ab12", "-", "-", "0", "host:1 worker a"))
        );
        assert_eq!(
            record_fields("ab12 1700000000000001 1700000000000 0 me"),
            Some(("ab12", "1700000000000001", "1700000000000", "0", "me"))
        );
        assert_eq!(
            record_fields("ab12 - - 0 "),
            Some(("ab12", "-", "-", "0", ""))
        );
        for foreign in [
            "someone else's",
            "a b c d",
            "a x - 0 me",
            "a - - x me",
            "user 7 session 3600 alice",
            "a\tb - - 0 me",
            "",
        ] {
            assert_eq!(record_fields(foreign), None, "{foreign:?}");
        }
    }

    #[test]
    fn the_waiters_mark_is_no_part_of_a_records_fields() {
        let plain = lean_value("tok", "host:42");
        let marked = format!("{plain}\nw");
        assert_eq!(
            record_fields(&marked),
            Some(("tok", "-", "-", "0", "host:42"))
        );
        assert_eq!(record_fields(&plain), record_fields(&marked));
        // A mark alone, or in the middle, makes no record of a string that is none.
        assert_eq!(record_fields("\nw"), None);
        assert_eq!(record_fields("tok - -\nw 0 host"), None);
    }
}
