//! The release script's call for one token, packed straight into the lean connection's
//! buffer (or handed to another connection as a `Cmd`).

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

use super::conn::{self, Conn};
use super::lean;
use super::resp::{Arg, Decimal};
use super::scripts::{self, Scripts};
use super::{KeyNames, RedisBackend};
use crate::config::millis_ceil;

/// The release script's call for one token; owned ([`ReleaseCall::into_owned`]), a task of
/// its own can run it.
pub(super) struct ReleaseCall<'a> {
    scripts: Arc<Scripts>,
    names: KeyNames,
    token: Cow<'a, str>,
    /// The owner this store's lean acquires wrote, if it made any: the record's value as a
    /// lean acquire of this token wrote it is the script's one-comparison case.
    pub(super) owner: Option<Cow<'a, str>>,
    done_retention_ms: u64,
    /// SPUBLISH instead of PUBLISH (a Cluster of Redis 7.0 or newer).
    sharded: bool,
}

impl<'a> ReleaseCall<'a> {
    pub(super) fn new(
        backend: &'a RedisBackend,
        names: &KeyNames,
        token: &'a str,
        done_retention: Option<Duration>,
    ) -> Self {
        ReleaseCall {
            scripts: backend.scripts.clone(),
            names: names.clone(),
            token: Cow::Borrowed(token),
            owner: backend.lean_owner.get().map(|o| Cow::Borrowed(o.as_str())),
            done_retention_ms: done_retention.map_or(0, millis_ceil),
            sharded: backend.sharded_pubsub,
        }
    }

    pub(super) fn into_owned(self) -> ReleaseCall<'static> {
        ReleaseCall {
            token: Cow::Owned(self.token.into_owned()),
            owner: self.owner.map(|o| Cow::Owned(o.into_owned())),
            scripts: self.scripts,
            names: self.names,
            done_retention_ms: self.done_retention_ms,
            sharded: self.sharded,
        }
    }

    /// `EVALSHA release <keys> <args>`, with the record's value as a lean acquire wrote it
    /// (an empty argument without an owner) and, for `once`, `retention`: the arguments
    /// and how many of them there are.
    fn args<'b>(&'b self, retention: &'b Decimal) -> ([Arg<'b>; 9], usize) {
        let evalsha = "EVALSHA".into();
        let sha = self.scripts.release.get_hash().into();
        let record = self.names.record().into();
        let token = Arg::from(&*self.token);
        let lean = self
            .owner
            .as_deref()
            .map_or(Arg::new(b""), |owner| lean::lean_arg(&self.token, owner));
        let sharded = if self.sharded { "1" } else { "0" }.into();
        if self.done_retention_ms > 0 {
            let done = self.names.done().into();
            let retention = Arg::new(retention.as_bytes());
            let args = [
                evalsha,
                sha,
                "2".into(),
                record,
                done,
                token,
                lean,
                sharded,
                retention,
            ];
            (args, 9)
        } else {
            let none = Arg::new(b"");
            let args = [
                evalsha,
                sha,
                "1".into(),
                record,
                token,
                lean,
                sharded,
                none,
                none,
            ];
            (args, 7)
        }
    }

    /// Runs the script on the store's connection, noting in `retried` a send repeated after
    /// its connection broke.
    pub(super) async fn run(&self, conn: &mut Conn, retried: &mut bool) -> redis::RedisResult<i64> {
        let retention = Decimal::of(self.done_retention_ms);
        let (args, count) = self.args(&retention);
        scripts::run_args(&self.scripts.release, &args[..count], conn, retried).await
    }

    /// Runs the script on another connection (a replicated acquire's own).
    pub(super) async fn run_on<C: redis::aio::ConnectionLike>(
        &self,
        conn: &mut C,
    ) -> redis::RedisResult<i64> {
        let retention = Decimal::of(self.done_retention_ms);
        let (args, count) = self.args(&retention);
        let call = conn::command_of(&args[..count]);
        scripts::run(&self.scripts.release, &call, conn).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::redis::resp;

    /// Every shape of the release call, against the same call built as a `Cmd` in the order
    /// the script reads it: KEYS record (and the `once` marker), ARGV token, lean value,
    /// sharded flag (and the marker's retention).
    #[test]
    fn the_release_call_is_packed_as_the_script_reads_it() {
        let scripts = Arc::new(Scripts::new());
        let names = KeyNames::new("lock", "k");
        for (owner, retention_ms, sharded) in [
            (Some("host:1 worker"), 0, false),
            (None, 0, true),
            (Some("o"), 5_000, false),
            (None, 86_400_000, true),
        ] {
            let call = ReleaseCall {
                scripts: scripts.clone(),
                names: names.clone(),
                token: Cow::Borrowed("tok"),
                owner: owner.map(Cow::Borrowed),
                done_retention_ms: retention_ms,
                sharded,
            };
            let retention = Decimal::of(retention_ms);
            let (args, count) = call.args(&retention);
            let mut packed = Vec::new();
            resp::write_command(&mut packed, &args[..count]);
            let mut expected = redis::cmd("EVALSHA");
            expected.arg(scripts.release.get_hash());
            if retention_ms > 0 {
                expected.arg(2).arg(names.record()).arg(names.done());
            } else {
                expected.arg(1).arg(names.record());
            }
            expected
                .arg("tok")
                .arg(owner.map_or_else(String::new, |o| lean::lean_value("tok", o)))
                .arg(if sharded { "1" } else { "0" });
            if retention_ms > 0 {
                expected.arg(retention_ms);
            }
            assert_eq!(
                String::from_utf8_lossy(&packed),
                String::from_utf8_lossy(&expected.get_packed_command()),
                "owner {owner:?}, retention {retention_ms}, sharded {sharded}"
            );
            // And the owned copy a task of its own runs is the same call.
            let owned = call.into_owned();
            let (args, count) = owned.args(&retention);
            let mut again = Vec::new();
            resp::write_command(&mut again, &args[..count]);
            assert_eq!(again, packed);
        }
    }
}
