//! What operators ask of a Redis store (`LockRuntime::list`, `force_release`, lockctl): a
//! SCAN of the records (never KEYS), on every master of a Cluster, and a forced release.

use std::time::Duration;

use redis::Value;
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};

use super::super::listing::{key_of_record, redis_match};
use super::super::{KeyNames, RecordView, key_matches};
use super::RedisBackend;
use super::conn::Conn;
use super::reply::{pttl_of, value_text};
use crate::{BackendError, LockError};

/// What the inspect script found at a record key.
pub(super) enum Read {
    Free,
    Held(RecordView),
    /// A value that is no lock record, of this type.
    Foreign(String),
}

/// Keys asked per SCAN call: large enough that a big keyspace takes few round trips, small
/// enough that one call stays short on the server.
const SCAN_COUNT: u32 = 1000;

impl RedisBackend {
    /// The live records of `namespace` whose key matches `pattern`.
    pub(super) async fn scan_records(
        &self,
        namespace: &str,
        pattern: &str,
    ) -> Result<Vec<(String, RecordView)>, LockError> {
        let records = self
            .scan_keys(
                &redis_match(namespace, pattern),
                "string",
                "the lock records",
            )
            .await?;
        let mut listed = Vec::new();
        for record in records {
            let Some(key) = key_of_record(namespace, &record) else {
                continue;
            };
            if !key_matches(pattern, &key) {
                continue;
            }
            // Read one by one through the inspect script (the record may have gone since the
            // SCAN saw it); a string that is no lock record is not listed.
            if let Read::Held(view) = self.read_record(&KeyNames::new(namespace, &key)).await? {
                listed.push((key, view));
            }
        }
        Ok(listed)
    }

    /// The record at `names` as the inspect script reads it.
    pub(super) async fn read_record(&self, names: &KeyNames) -> Result<Read, LockError> {
        let mut conn = self.conn.clone();
        let reply: Vec<Value> = self
            .scripts
            .inspect
            .key(names.record())
            .invoke_async(&mut conn)
            .await
            .map_err(|e| self.error(&format!("inspect of `{}` failed", names.key()), e))?;
        match reply.as_slice() {
            [] => Ok(Read::Free),
            [tag, kind] if value_text(tag) == "foreign" => Ok(Read::Foreign(value_text(kind))),
            [
                owner,
                fence,
                since,
                Value::Int(pttl),
                Value::Int(now),
                holder,
            ] => {
                let held_for = value_text(since)
                    .parse::<i64>()
                    .ok()
                    .map(|since| Duration::from_millis(u64::try_from(now - since).unwrap_or(0)));
                let mut view = RecordView::unfenced(
                    value_text(owner),
                    value_text(holder),
                    pttl_of(*pttl),
                    held_for,
                );
                view.fence = value_text(fence).parse::<u64>().ok();
                Ok(Read::Held(view))
            }
            _ => Err(BackendError::new(format!(
                "inspect of `{}` got an unexpected reply from Redis",
                names.key()
            ))
            .into()),
        }
    }

    /// Every key of type `kind` matching `scan_match` (a SCAN pattern), on every master of a
    /// Cluster; `what` names them in errors.
    pub(super) async fn scan_keys(
        &self,
        scan_match: &str,
        kind: &str,
        what: &str,
    ) -> Result<Vec<String>, LockError> {
        let keys =
            match &self.conn {
                Conn::Cluster(cluster) => {
                    let mut keys = Vec::new();
                    for (slot, node) in self.cluster_masters().await? {
                        // Routed by a slot the master serves, so the cluster connection reaches it
                        // by its own view of the topology, whatever CLUSTER SLOTS says for a host.
                        let route = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(
                            Route::new(slot, SlotAddr::Master),
                        ));
                        let mut scan = |cmd: redis::Cmd| {
                            let (route, mut cluster) = (route.clone(), cluster.clone());
                            async move { cluster.route_command(cmd, route).await }
                        };
                        keys.extend(scan_all(scan_match, kind, &mut scan).await.map_err(|e| {
                            self.error(&format!("SCAN of {what} on master {node}"), e)
                        })?);
                    }
                    // A key moving between masters during the scan may be seen on both.
                    keys.sort();
                    keys.dedup();
                    keys
                }
                conn => {
                    let mut scan = |cmd: redis::Cmd| {
                        let mut conn = conn.clone();
                        async move { cmd.query_async::<Value>(&mut conn).await }
                    };
                    scan_all(scan_match, kind, &mut scan)
                        .await
                        .map_err(|e| self.error(&format!("SCAN of {what}"), e))?
                }
            };
        Ok(keys)
    }

    /// Removes the record if it is the holding `by` ("fence" or "holder") `what` names,
    /// whatever its token, and announces the release.
    pub(super) async fn remove_holding(
        &self,
        names: &KeyNames,
        by: &str,
        what: &str,
    ) -> Result<bool, LockError> {
        let mut conn = self.conn.noting_retries();
        let removed: i64 = self
            .scripts
            .force_release
            .key(names.record())
            .arg(by)
            .arg(what)
            .arg(names.channel())
            .arg(if self.sharded_pubsub { "1" } else { "0" })
            .invoke_async(&mut conn)
            .await
            .map_err(|e| self.error(&format!("forced release of `{}` failed", names.key()), e))?;
        match removed {
            1 => Ok(true),
            // Sent again after its connection broke: the first send most likely removed it,
            // its answer lost (or the holder released it meanwhile: either way the holder the
            // operator named holds it no more).
            0 if conn.retried() => Ok(true),
            0 => Ok(false),
            _ => Err(BackendError::new(format!(
                "Redis key `{}` holds a value that is not a lock record; it was left untouched",
                names.record()
            ))
            .into()),
        }
    }

    /// The masters of the Cluster as `CLUSTER SLOTS` names them now: one slot each serves,
    /// and its node id (or address) for messages.
    async fn cluster_masters(&self) -> Result<Vec<(u16, String)>, LockError> {
        let mut conn = self.conn.clone();
        let slots: Value = redis::cmd("CLUSTER")
            .arg("SLOTS")
            .query_async(&mut conn)
            .await
            .map_err(|e| self.error("CLUSTER SLOTS", e))?;
        let mut masters: Vec<(u16, String)> = Vec::new();
        if let Value::Array(ranges) = slots {
            for range in ranges {
                let Value::Array(parts) = range else { continue };
                // start, end, then the master as [host, port, id, ...], then its replicas.
                let (Some(Value::Int(start)), Some(Value::Array(master))) =
                    (parts.first(), parts.get(2))
                else {
                    continue;
                };
                let Ok(start) = u16::try_from(*start) else {
                    continue;
                };
                let node = match (master.get(2), master.first(), master.get(1)) {
                    (Some(id), _, _) => value_text(id),
                    (None, Some(host), Some(port)) => {
                        format!("{}:{}", value_text(host), value_text(port))
                    }
                    _ => continue,
                };
                if !masters.iter().any(|(_, known)| *known == node) {
                    masters.push((start, node));
                }
            }
        }
        if masters.is_empty() {
            return Err(BackendError::new("CLUSTER SLOTS named no master").into());
        }
        Ok(masters)
    }
}

/// Every key of type `kind` one server's SCAN yields for `pattern`, through `send`.
async fn scan_all<F, Fut>(
    pattern: &str,
    kind: &str,
    send: &mut F,
) -> redis::RedisResult<Vec<String>>
where
    F: FnMut(redis::Cmd) -> Fut,
    Fut: std::future::Future<Output = redis::RedisResult<Value>>,
{
    let mut keys = Vec::new();
    let mut cursor: u64 = 0;
    loop {
        let mut cmd = redis::cmd("SCAN");
        cmd.arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(SCAN_COUNT)
            .arg("TYPE")
            .arg(kind);
        let (next, batch): (u64, Vec<String>) = redis::from_redis_value(send(cmd).await?)?;
        keys.extend(batch);
        if next == 0 {
            return Ok(keys);
        }
        cursor = next;
    }
}
