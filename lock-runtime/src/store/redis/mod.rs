//! The Redis store: one multiplexed connection that reconnects by itself, Lua scripts run by
//! SHA (reloaded on NOSCRIPT), and a lazily started subscriber connection for waiters. The
//! layers, bottom-up: `options`, `client` (clients from URLs and TLS), `sentinel`, `conn` (one
//! connection type over every topology), `version`, `scripts` and `reply`, `connect`; then
//! this store's calls, `lean` (the plain request's path), `release` (the release script's
//! call), `group` (releases sent together), `replication`, `subscriber` (waiters) and
//! `operator` (listing). `wire` is the lean connection, `resp` its protocol.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use redis::Value;
use tokio::sync::OnceCell;

mod client;
mod conn;
mod connect;
mod group;
mod journal;
mod lean;
mod operator;
mod options;
mod release;
mod replication;
mod reply;
mod resp;
mod scripts;
mod sentinel;
mod subscriber;
mod version;
mod wire;

use self::conn::{Conn, slot};
use self::group::{GroupReply, ReleaseGroup};
use self::operator::Read;
pub(crate) use self::options::{RedisOptions, Topology};
use self::release::ReleaseCall;
use self::reply::{acquire_outcome, redis_error};
use self::scripts::{ACQUIRE_LUA, Scripts};
use self::sentinel::{SentinelConn, is_readonly};
use super::{
    AcquireOutcome, AcquireRequest, ExtendItem, KeyNames, LockStore, RecordView, ReleaseHub,
    ReleaseOutcome, ReleaseWatch, Renewal, Retention, Subscriber,
};
use crate::config::millis_ceil;
use crate::{BackendError, LockError};

/// A store on one Redis server (standalone, or the master a URL points at) or on a Redis
/// Cluster. Every script touches only keys of one lock, which share a hash slot.
pub(crate) struct RedisBackend {
    conn: Conn,
    options: RedisOptions,
    /// Texts that must never appear in an error: the URLs' passwords, raw and decoded.
    secrets: Vec<String>,
    shown_url: String,
    scripts: Arc<Scripts>,
    subscriber: OnceCell<Subscriber>,
    hub: Arc<ReleaseHub>,
    sentinel: Option<Arc<SentinelConn>>,
    /// Releases are announced with SPUBLISH and waiters use SSUBSCRIBE: on a Cluster whose
    /// nodes all run Redis 7.0 or newer. Older Clusters (6.2) and single servers use classic
    /// PUBLISH / SUBSCRIBE.
    sharded_pubsub: bool,
    /// The server takes `DELIFEQ` (Valkey 9): a release of a record exactly as its lean
    /// acquire wrote it is that one native command, no script. Turned off for good when the
    /// server refuses it later (a restart into an older version, narrowed rights).
    native_delifeq: std::sync::atomic::AtomicBool,
    /// The owner of this store's first lean acquire: a release of a lean record that is still
    /// exactly as that acquire wrote it costs the server one comparison (release.lua). A
    /// store shared by runtimes of other owners releases their records by the general path.
    lean_owner: std::sync::OnceLock<String>,
    /// Group commit of plain releases (`group.rs`); None on a Cluster.
    group: Option<Arc<ReleaseGroup>>,
}

impl std::fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisBackend")
            .field("url", &self.shown_url)
            .field("topology", &self.options.topology)
            .field("sharded_pubsub", &self.sharded_pubsub)
            .finish_non_exhaustive()
    }
}

impl LockStore for RedisBackend {
    async fn acquire(&self, request: AcquireRequest<'_>) -> Result<AcquireOutcome, LockError> {
        let AcquireRequest {
            names,
            token,
            owner,
            ttl,
            min_hold,
            once,
        } = request;
        let lean = !once
            && min_hold.is_zero()
            && self.options.replicated.is_none()
            && !self.options.fence_at_acquire;
        if lean {
            return self.acquire_lean(names, token, owner, ttl).await;
        }
        let args = [
            token.to_owned(),
            owner.to_owned(),
            millis_ceil(ttl).to_string(),
            millis_ceil(min_hold).to_string(),
            if once { "1" } else { "0" }.to_owned(),
            millis_ceil(fence_retention(ttl)).to_string(),
            names.channel().to_owned(),
            if self.sharded_pubsub { "1" } else { "0" }.to_owned(),
        ];
        let keys = [names.record(), names.fence(), names.done()];
        if let Some((replicas, timeout)) = self.options.replicated {
            // EVAL, not EVALSHA: a NOSCRIPT here would need a second round trip on this path.
            let mut eval = redis::cmd("EVAL");
            eval.arg(ACQUIRE_LUA).arg(keys.len()).arg(&keys).arg(&args);
            // Boxed: the rare path would otherwise set the size of every acquire's future.
            return Box::pin(self.acquire_replicated(names, token, eval, replicas, timeout)).await;
        }
        let mut invocation = self.scripts.acquire.prepare_invoke();
        for key in keys {
            invocation.key(key);
        }
        for arg in &args {
            invocation.arg(arg);
        }
        let mut conn = self.conn.clone();
        let reply: Vec<Value> = invocation
            .invoke_async(&mut conn)
            .await
            .map_err(|e| self.error(&format!("acquire of `{}` failed", names.key()), e))?;
        acquire_outcome(names, &reply)
    }

    async fn release(
        &self,
        names: &KeyNames,
        token: &str,
        done_retention: Option<Duration>,
    ) -> Result<ReleaseOutcome, LockError> {
        let mut conn = self.conn.clone();
        // Set when a call was sent again after its connection broke under it.
        let mut retried = false;
        let call = ReleaseCall::new(self, names, token, done_retention);
        let failed = |e| self.error(&format!("release of `{}` failed", names.key()), e);
        // The record exactly as the lean acquire wrote it, if nothing changed it since.
        let plain = call.owner.as_deref().filter(|_| done_retention.is_none());
        if let Some(owner) = plain
            && self.native_delifeq.load(Ordering::Relaxed)
        {
            // The record exactly as the lean acquire wrote it (no fence asked, nobody
            // waiting): deleted by the server's own compare-and-delete. Anything else (marked,
            // fenced, min_hold, gone, taken over) is the script's to sort out, on the same
            // connection, which remembers whether a send had to be repeated.
            let delifeq = [
                "DELIFEQ".into(),
                names.record().into(),
                lean::lean_arg(token, owner),
            ];
            match conn.query_args::<i64>(&delifeq, &mut retried).await {
                Ok(1) => return Ok(ReleaseOutcome::Released),
                Ok(_) => {}
                Err(e) if e.code().is_some() => {
                    tracing::debug!(error = %e, "DELIFEQ refused; releases use the script from now on");
                    self.native_delifeq.store(false, Ordering::Relaxed);
                }
                Err(e) => return Err(failed(e)),
            }
        }
        // The same record as above, in a group with other releases; anything the group
        // leaves alone is the script's to sort out.
        let mut group_resent = false;
        let group = self
            .group
            .as_ref()
            .filter(|_| !self.native_delifeq.load(Ordering::Relaxed))
            .zip(plain)
            .map(|(g, owner)| (g, owner, g.enter()));
        if let Some((group, owner, (_busy, true))) = &group {
            match group.release(names, lean::lean_value(token, owner)).await {
                GroupReply::Deleted => return Ok(ReleaseOutcome::Released),
                GroupReply::NotAsWritten { resent } => group_resent = resent,
                GroupReply::Refused => {}
                GroupReply::Failed(why) => {
                    return Err(BackendError::transient(format!(
                        "release of `{}` failed (Redis at `{}`): {why}",
                        names.key(),
                        self.shown_url
                    ))
                    .into());
                }
            }
        }
        let reply = call.run(&mut conn, &mut retried).await.map_err(failed)?;
        Ok(match reply {
            1 => ReleaseOutcome::Released,
            2 => ReleaseOutcome::KeptForMinHold,
            // Sent again after its connection broke: the first send was most likely carried
            // out and its answer lost.
            _ if retried || group_resent => {
                tracing::debug!(key = %names.key(), "release: sent again after its connection broke, and the record was gone");
                ReleaseOutcome::GoneAfterRetry
            }
            _ => ReleaseOutcome::NotOwner,
        })
    }

    /// Redlock: lifts this node's fence counter to `fence` and stamps the record with it;
    /// true when the record here is ours.
    async fn raise_fence(
        &self,
        names: &KeyNames,
        token: &str,
        fence: u64,
        ttl: Duration,
    ) -> Result<bool, LockError> {
        let mut conn = self.conn.clone();
        let reply: i64 = self
            .scripts
            .raise_fence
            .key(names.record())
            .key(names.fence())
            .arg(token)
            .arg(fence)
            .arg(millis_ceil(fence_retention(ttl)))
            .invoke_async(&mut conn)
            .await
            .map_err(|e| self.error(&format!("fence update of `{}` failed", names.key()), e))?;
        Ok(reply == 1)
    }

    async fn fence(
        &self,
        names: &KeyNames,
        token: &str,
        ttl: Duration,
    ) -> Result<Option<u64>, LockError> {
        self.fence_on_demand(names, token, ttl).await
    }

    async fn extend(&self, items: &[ExtendItem]) -> Result<Vec<Renewal>, LockError> {
        if items.is_empty() {
            return Ok(Vec::new());
        }
        if !self.options.is_cluster() {
            return Ok(self
                .extend_group(self.conn.clone(), self.scripts.clone(), items)
                .await?
                .into_iter()
                .map(Renewal::from)
                .collect());
        }
        // A script may only touch keys of one slot: one call per slot, all in flight at once.
        let mut by_slot: std::collections::HashMap<u16, Vec<usize>> =
            std::collections::HashMap::new();
        for (i, item) in items.iter().enumerate() {
            by_slot.entry(slot(&item.record)).or_default().push(i);
        }
        // Each slot answers for itself: a shard that fails or fails over costs only the leases
        // in its slots, never the renewals of the healthy shards.
        let mut calls = tokio::task::JoinSet::new();
        let timeout = self.options.command_timeout;
        for (_, indexes) in by_slot {
            let group: Vec<ExtendItem> = indexes.iter().map(|&i| items[i].clone()).collect();
            let conn = self.conn.clone();
            let scripts = self.scripts.clone();
            calls.spawn(async move {
                let answer = tokio::time::timeout(timeout, run_extend(conn, scripts, &group)).await;
                (indexes, answer)
            });
        }
        let mut renewed = vec![Renewal::Unknown("no answer".to_owned()); items.len()];
        let mut first_error = None;
        let mut answered = 0;
        while let Some(joined) = calls.join_next().await {
            let Ok((indexes, answer)) = joined else {
                continue; // a panicked task: its items stay unknown
            };
            let failure = match answer {
                Ok(Ok(answers)) => {
                    answered += 1;
                    for (&i, ok) in indexes.iter().zip(answers) {
                        renewed[i] = Renewal::from(ok);
                    }
                    continue;
                }
                Ok(Err(e)) => self.error("lease renewal failed", e),
                Err(_) => BackendError::transient(format!(
                    "lease renewal failed: no answer within {timeout:?}"
                ))
                .into(),
            };
            let why = failure.to_string();
            for &i in &indexes {
                renewed[i] = Renewal::Unknown(why.clone());
            }
            first_error.get_or_insert(failure);
        }
        match first_error {
            Some(e) if answered == 0 => Err(e),
            _ => Ok(renewed),
        }
    }

    async fn inspect(&self, names: &KeyNames) -> Result<Option<RecordView>, LockError> {
        match self.read_record(names).await? {
            Read::Free => Ok(None),
            Read::Held(view) => Ok(Some(view)),
            Read::Foreign(kind) => Err(BackendError::new(format!(
                "Redis key `{}` holds a value of type `{kind}`, not a lock record",
                names.record()
            ))
            .into()),
        }
    }

    async fn watch_releases(&self, names: &KeyNames) -> Result<ReleaseWatch, LockError> {
        self.subscribe_releases(names).await
    }

    async fn list(
        &self,
        namespace: &str,
        pattern: &str,
    ) -> Result<Vec<(String, RecordView)>, LockError> {
        self.scan_records(namespace, pattern).await
    }

    async fn force_release(&self, names: &KeyNames, fence: u64) -> Result<bool, LockError> {
        self.remove_holding(names, "fence", &fence.to_string())
            .await
    }

    async fn force_release_holder(
        &self,
        names: &KeyNames,
        holder: &str,
    ) -> Result<bool, LockError> {
        self.remove_holding(names, "holder", holder).await
    }

    async fn append_run(
        &self,
        namespace: &str,
        job: &str,
        entry: &str,
        keep: &Retention,
    ) -> Result<(), LockError> {
        self.append_run_to_stream(namespace, job, entry, keep).await
    }

    async fn runs(
        &self,
        namespace: &str,
        job: &str,
        limit: usize,
    ) -> Result<Vec<String>, LockError> {
        self.runs_of_stream(namespace, job, limit).await
    }

    async fn journalled_jobs(&self, namespace: &str) -> Result<Vec<String>, LockError> {
        self.jobs_with_streams(namespace).await
    }
}

impl RedisBackend {
    /// The server's URL with credentials hidden.
    pub(crate) fn shown_url(&self) -> &str {
        &self.shown_url
    }

    fn error(&self, context: &str, e: redis::RedisError) -> LockError {
        redis_error(&self.shown_url, &self.secrets, context, e)
    }

    /// `replicated_acquire`: the acquire script and a WAIT go out together, pipelined, on a
    /// connection of their own, and are never retried. WAIT counts the replicas that have this
    /// connection's last write, so it answers for this acquire only on the connection that
    /// sent it: on a shared connection a retry after a reconnect (or a Sentinel
    /// re-resolution) would confirm a write the replicas never saw, and a blocking WAIT would
    /// hold up every renewal of the runtime. Any error or shortfall means "not confirmed":
    /// the lock is given back and the acquire fails.
    async fn acquire_replicated(
        &self,
        names: &KeyNames,
        token: &str,
        eval: redis::Cmd,
        replicas: usize,
        timeout: Duration,
    ) -> Result<AcquireOutcome, LockError> {
        let context = format!("replicated acquire of `{}` failed", names.key());
        let mut pipe = redis::pipe();
        pipe.add_command(eval)
            .cmd("WAIT")
            .arg(replicas)
            .arg(millis_ceil(timeout));
        // One more try only where nothing can have been written: the connection could not be
        // opened, or the server refused the script as a read-only replica (a failover the
        // sentinels have announced since the master was last resolved).
        let mut tries = 0;
        let (reply, confirmed) = loop {
            tries += 1;
            let (url, conn) = match replication::connect(self, timeout).await {
                Ok(opened) => opened,
                Err((url, e)) => {
                    if self.note_master_failure(url.as_deref(), &e) && tries < 2 {
                        continue;
                    }
                    return Err(self.error(&context, e));
                }
            };
            let answered = self
                .pipeline_owning(conn, pipe.clone(), names, token, replicas)
                .await;
            match answered {
                Ok(answer) => break answer,
                Err(e) => {
                    let moved = self.note_master_failure(Some(&url), &e);
                    if moved && is_readonly(&e) && tries < 2 {
                        continue;
                    }
                    // The script may have run: the caller gives the token back in the
                    // background.
                    return Err(self.error(&context, e));
                }
            }
        };
        let outcome = acquire_outcome(names, &reply)?;
        if !matches!(
            outcome,
            AcquireOutcome::Acquired { .. } | AcquireOutcome::AcquiredUnfenced
        ) {
            return Ok(outcome);
        }
        let confirmed = usize::try_from(confirmed).unwrap_or(0);
        if confirmed >= replicas {
            return Ok(outcome);
        }
        // `pipeline_owning` has given the lock back already. Transient: a waiter keeps waiting
        // through a replica outage.
        Err(BackendError::transient(format!(
            "lock `{}` was confirmed by {confirmed} of the {replicas} replicas required within \
             {timeout:?}; it was given back (replicated_acquire)",
            names.key()
        ))
        .into())
    }

    /// Runs the acquire + WAIT pipeline on a task that owns `conn`, so that when the grant is
    /// not kept (too few replicas confirmed it, or the caller went away meanwhile: a deadline,
    /// a shutdown, an abort) the lock is given back on the same connection, where it cannot
    /// overtake the acquire script. On any other connection it could arrive first, find
    /// nothing, and leave the grant to a token nobody holds.
    async fn pipeline_owning(
        &self,
        mut conn: redis::aio::MultiplexedConnection,
        pipe: redis::Pipeline,
        names: &KeyNames,
        token: &str,
        replicas: usize,
    ) -> Result<(Vec<Value>, i64), redis::RedisError> {
        let (answer_tx, answer_rx) = tokio::sync::oneshot::channel();
        let release = ReleaseCall::new(self, names, token, None).into_owned();
        tokio::spawn(async move {
            let answered: Result<(Vec<Value>, i64), redis::RedisError> =
                pipe.query_async(&mut conn).await;
            // A grant is the acquire script's {1, fence}: an acquire that answers otherwise
            // must be counted as a grant here too, or an unconfirmed one is never given back.
            let confirmed = match &answered {
                Ok((reply, confirmed)) if matches!(reply.first(), Some(Value::Int(1))) => {
                    usize::try_from(*confirmed).unwrap_or(0) >= replicas
                }
                _ => true, // not granted (or unknown: the caller gives it back)
            };
            // Not kept: given back before the caller hears of it, so an error that says "given
            // back" is true when it arrives (an inspect or another acquire right after it
            // finds the lock free). Kept but nobody to take it: given back after.
            if !confirmed {
                let _ = release.run_on(&mut conn).await;
                let _ = answer_tx.send(answered);
            } else if answer_tx.send(answered).is_err() {
                let _ = release.run_on(&mut conn).await;
            }
        });
        answer_rx.await.unwrap_or_else(|_| {
            Err(redis::RedisError::from((
                redis::ErrorKind::Io,
                "the replicated acquire task ended without an answer",
            )))
        })
    }

    async fn extend_group(
        &self,
        conn: Conn,
        scripts: Arc<Scripts>,
        items: &[ExtendItem],
    ) -> Result<Vec<bool>, LockError> {
        run_extend(conn, scripts, items)
            .await
            .map_err(|e| self.error("lease renewal failed", e))
    }

    /// With Sentinel: forgets the master `url` when `e` says it is gone or demoted, so the
    /// next command asks the sentinels again. True when it did.
    fn note_master_failure(&self, url: Option<&str>, e: &redis::RedisError) -> bool {
        match (&self.sentinel, url) {
            (Some(sentinel), Some(url)) => sentinel.note_failure(url, e),
            _ => false,
        }
    }
}

/// One extend script call for leases that share a slot; one answer per item.
async fn run_extend(
    mut conn: Conn,
    scripts: Arc<Scripts>,
    items: &[ExtendItem],
) -> Result<Vec<bool>, redis::RedisError> {
    let mut invocation = scripts.extend.prepare_invoke();
    for item in items {
        invocation
            .key(&item.record)
            .arg(&item.token)
            .arg(millis_ceil(item.ttl));
    }
    let reply: Vec<i64> = invocation.invoke_async(&mut conn).await?;
    if reply.len() != items.len() {
        return Err(redis::RedisError::from((
            redis::ErrorKind::Client,
            "renewal answered a different number of results than leases",
        )));
    }
    Ok(reply.into_iter().map(|r| r == 1).collect())
}

/// How long a fence counter outlives its last acquire: a day, or the ttl if longer. After
/// that the server clock alone keeps fences increasing (DESIGN.md §5, hybrid fences).
pub(crate) fn fence_retention(ttl: Duration) -> Duration {
    ttl.max(Duration::from_secs(24 * 3600))
}
