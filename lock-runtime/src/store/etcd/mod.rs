//! The etcd store (cargo feature `etcd`): one key per held lock, attached to an etcd lease of
//! the lock's ttl, taken by a transaction that succeeds only while the key does not exist.
//!
//! - **Fence**: the revision of the acquire's transaction, which is the key's create revision:
//!   etcd's revisions increase across the whole cluster, are replicated by Raft before they
//!   are answered, and survive leader failover, so a fence is never handed out twice.
//! - **Expiry**: etcd leases count in whole seconds; a ttl is rounded up (and the server may
//!   raise it to its minimum lease ttl). The server therefore keeps a lock at least as long
//!   as the runtime believes it holds it, never shorter.
//! - **Renewal**: keep-alive of the lease the key is attached to, then a read that confirms
//!   the key still carries the token on that lease (so a key deleted between the two is never
//!   reported renewed).
//! - **min_hold**: a second key (`<record>:hold`) on a lease of the min_hold, written with the
//!   record; a release while it lives moves the record onto that lease under a value no token
//!   matches, so it ends exactly when min_hold does.
//! - **once**: the done marker is a key on a lease of its retention.
//! - **Waiting**: one watch stream per runtime ([`watch`]), driven by the shared
//!   [`Subscriber`](super::Subscriber).
//! - **Clock**: etcd has none a client can read. `held_for` in `inspect` counts from the
//!   acquirer's wall clock (stored in the value, for display only); every expiry is the
//!   server's lease.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use etcd_client::{
    Compare, CompareOp, GetOptions, KeyValue, PutOptions, Txn, TxnOp, TxnOpResponse, TxnResponse,
};
use tokio::sync::OnceCell;

mod conn;
mod connect;
mod journal;
mod renew;
pub(crate) mod step;
mod watch;

use self::step::lease_secs;

use self::conn::Conn;

use super::{
    AcquireOutcome, AcquireRequest, ExtendItem, KeyNames, LockStore, RecordView, ReleaseHub,
    ReleaseOutcome, ReleaseWatch, Renewal, Retention, Subscriber, key_matches, key_of_record,
};
use crate::error::scrub;
use crate::{BackendError, LockError};

/// How the builder asked to connect.
#[derive(Debug, Clone)]
pub(crate) struct EtcdOptions {
    pub(crate) endpoints: Vec<String>,
    /// User name and password (etcd authentication).
    pub(crate) user: Option<(String, String)>,
    /// A PEM root certificate to trust for `https://` endpoints instead of the system's.
    pub(crate) tls_root_cert: Option<Vec<u8>>,
    pub(crate) connect_timeout: Duration,
    pub(crate) command_timeout: Duration,
}

/// The value of a record held by a token: `v1`, the token, the acquirer's wall clock (ms since
/// the epoch, for `held_for` only) and the owner, one per line.
const VERSION: &str = "v1";
/// The token of a record kept for min_hold after its release: no token (32 hex digits)
/// matches it.
const RELEASED: &str = "released";
/// Most operations in one etcd transaction (etcd's default `--max-txn-ops`).
const MAX_TXN_OPS: usize = 128;
/// Most entries kept of what granted acquires wrote (a release without one reads first).
const MAX_WRITTEN: usize = 100_000;
/// How often an idle connection is pinged.
const KEEP_ALIVE: Duration = Duration::from_secs(1);

/// A store in etcd.
pub(crate) struct EtcdBackend {
    conn: Arc<Conn>,
    hub: Arc<ReleaseHub>,
    subscriber: OnceCell<Subscriber>,
    /// What this store's granted acquires wrote, by token: the record's exact value. A release compares the record with the value, and so frees the lock in one
    /// transaction, without reading it first; without an entry (another runtime's lease, a
    /// full table) it reads first.
    written: Mutex<HashMap<String, Vec<u8>>>,
    /// The lease each run journal's keys are put on, with when it was granted.
    journal_leases: Mutex<HashMap<String, (i64, tokio::time::Instant)>>,
}

impl std::fmt::Debug for EtcdBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdBackend")
            .field("endpoints", &self.conn.shown)
            .finish_non_exhaustive()
    }
}

/// The leases of an acquire whose transaction was sent and not answered. Such an acquire may
/// still land, after the release the runtime sends to give it back: the client spreads
/// requests over the members, so that release can reach etcd first, find nothing, and leave
/// the late grant to nobody for its whole ttl. Dropped with leases left (the call failed, or
/// its future was dropped by the timeout), this revokes them in the background, again until
/// etcd confirms (or the ttl has passed and they expired anyway): a grant that landed goes
/// with its lease, and one still on its way fails for want of it.
struct Unanswered {
    conn: Arc<Conn>,
    leases: Vec<i64>,
    ttl: Duration,
}

impl Drop for Unanswered {
    fn drop(&mut self) {
        if self.leases.is_empty() {
            return;
        }
        let (conn, leases, ttl) = (
            self.conn.clone(),
            std::mem::take(&mut self.leases),
            self.ttl,
        );
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(conn.revoke_until_gone(leases, ttl));
        }
    }
}

fn now_ms() -> u64 {
    crate::config::unix_ms(SystemTime::now())
}

/// A record's value as stored.
fn record_value(token: &str, owner: &str, acquired_ms: u64) -> String {
    format!("{VERSION}\n{token}\n{acquired_ms}\n{owner}")
}

/// A record's value read back: (token, acquired ms, owner), or None for a value that is not a
/// record of ours.
fn parse_value(value: &[u8]) -> Option<(&str, u64, &str)> {
    let text = std::str::from_utf8(value).ok()?;
    let mut parts = text.splitn(4, '\n');
    if parts.next()? != VERSION {
        return None;
    }
    let token = parts.next()?;
    let acquired = parts.next()?.parse().ok()?;
    Some((token, acquired, parts.next()?))
}

fn hold_key(names: &KeyNames) -> String {
    format!("{}:hold", names.record())
}

fn put(key: &str, value: impl Into<Vec<u8>>, lease: i64) -> TxnOp {
    TxnOp::put(key, value, Some(PutOptions::new().with_lease(lease)))
}

/// The first key-value of each `Get` in a transaction's answer, in order.
fn gets(response: &TxnResponse) -> Vec<Option<KeyValue>> {
    response
        .op_responses()
        .into_iter()
        .filter_map(|op| match op {
            TxnOpResponse::Get(get) => Some(get.kvs().first().cloned()),
            _ => None,
        })
        .collect()
}

impl LockStore for EtcdBackend {
    async fn acquire(&self, r: AcquireRequest<'_>) -> Result<AcquireOutcome, LockError> {
        let context = format!("acquire of `{}` failed", r.names.key());
        let record = r.names.record();
        let lease = self.conn.grant_record(r.ttl, &context).await?;
        let hold = if r.min_hold.is_zero() {
            None
        } else {
            match self.conn.grant(r.min_hold, &context).await {
                Ok(hold) => Some(hold),
                Err(e) => {
                    self.conn.revoke_later(vec![lease]);
                    return Err(e);
                }
            }
        };
        let mut when = vec![Compare::create_revision(record, CompareOp::Equal, 0)];
        if r.once {
            when.push(Compare::create_revision(
                r.names.done(),
                CompareOp::Equal,
                0,
            ));
        }
        let value = record_value(r.token, r.owner, now_ms());
        let mut then = vec![put(record, value.as_str(), lease)];
        match hold {
            Some(hold) => then.push(put(&hold_key(r.names), "", hold)),
            // A hold key of an earlier holder that the lease sweep has not taken yet must not
            // make this holder's release keep the lock.
            None => then.push(TxnOp::delete(hold_key(r.names), None)),
        }
        let txn = Txn::new()
            .when(when)
            .and_then(then)
            .or_else([TxnOp::get(record, None), TxnOp::get(r.names.done(), None)]);
        let mut unanswered = Unanswered {
            conn: self.conn.clone(),
            leases: std::iter::once(lease).chain(hold).collect(),
            ttl: r.ttl,
        };
        let answer = self.conn.txn(txn, &context).await?;
        unanswered.leases.clear();
        if answer.succeeded() {
            let revision = answer.header().map_or(0, |h| h.revision());
            let fence = u64::try_from(revision)
                .ok()
                .filter(|&f| f > 0)
                .ok_or_else(|| {
                    LockError::from(BackendError::new(format!(
                        "{context}: etcd answered revision {revision}"
                    )))
                })?;
            let mut written = self.written_of();
            if written.len() < MAX_WRITTEN {
                written.insert(r.token.to_owned(), value.into_bytes());
            }
            return Ok(AcquireOutcome::Acquired { fence });
        }
        self.conn
            .revoke_later(std::iter::once(lease).chain(hold).collect());
        let found = gets(&answer);
        let (held, done) = (
            found.first().cloned().flatten(),
            found.get(1).cloned().flatten(),
        );
        if r.once
            && let Some(done) = done
        {
            return Ok(AcquireOutcome::Done {
                pttl: self.conn.remaining(done.lease()).await,
            });
        }
        Ok(AcquireOutcome::Held {
            pttl: match held {
                Some(kv) => self.conn.remaining(kv.lease()).await,
                None => None,
            },
        })
    }

    async fn release(
        &self,
        names: &KeyNames,
        token: &str,
        done_retention: Option<Duration>,
    ) -> Result<ReleaseOutcome, LockError> {
        let outcome = self.release_record(names, token, done_retention).await;
        // Also after an error: a release the runtime tries again takes the read-first path,
        // which is right without the entry.
        self.written_of().remove(token);
        outcome
    }

    async fn extend(&self, items: &[ExtendItem]) -> Result<Vec<Renewal>, LockError> {
        Ok(renew::extend(&self.conn, items).await)
    }

    async fn inspect(&self, names: &KeyNames) -> Result<Option<RecordView>, LockError> {
        let context = format!("inspect of `{}` failed", names.key());
        let record = names.record();
        let answer = self
            .conn
            .send(|mut c| async move { c.get(record, None).await })
            .await
            .map_err(|e| self.conn.error(&context, e))?;
        let Some(kv) = answer.kvs().first() else {
            return Ok(None);
        };
        Ok(Some(self.view(kv).await))
    }

    async fn watch_releases(&self, names: &KeyNames) -> Result<ReleaseWatch, LockError> {
        let subscriber = self
            .subscriber
            .get_or_init(|| async {
                watch::subscriber(
                    self.conn.client.clone(),
                    self.hub.clone(),
                    self.conn.options.command_timeout,
                )
            })
            .await;
        subscriber.watch(names.channel()).await
    }

    async fn list(
        &self,
        namespace: &str,
        pattern: &str,
    ) -> Result<Vec<(String, RecordView)>, LockError> {
        let prefix = format!("{namespace}:{{");
        let answer = self
            .conn
            .send(|mut c| {
                let prefix = prefix.clone();
                async move { c.get(prefix, Some(GetOptions::new().with_prefix())).await }
            })
            .await
            .map_err(|e| self.conn.error("listing the locks failed", e))?;
        let mut found = Vec::new();
        for kv in answer.kvs() {
            let Ok(record) = kv.key_str() else { continue };
            let Some(key) = key_of_record(namespace, record) else {
                continue; // a hold key or a done marker
            };
            if key_matches(pattern, &key) && parse_value(kv.value()).is_some() {
                found.push((key, self.view(kv).await));
            }
        }
        Ok(found)
    }

    async fn force_release(&self, names: &KeyNames, fence: u64) -> Result<bool, LockError> {
        let context = format!("forced release of `{}` failed", names.key());
        let revision = i64::try_from(fence).unwrap_or(i64::MAX);
        let answer = self
            .conn
            .txn(
                Txn::new()
                    .when([Compare::create_revision(
                        names.record(),
                        CompareOp::Equal,
                        revision,
                    )])
                    .and_then([
                        TxnOp::delete(names.record(), None),
                        TxnOp::delete(hold_key(names), None),
                    ]),
                &context,
            )
            .await?;
        Ok(answer.succeeded())
    }

    async fn append_run(
        &self,
        namespace: &str,
        job: &str,
        entry: &str,
        keep: &Retention,
    ) -> Result<(), LockError> {
        self.append_run_key(namespace, job, entry, keep).await
    }

    async fn runs(
        &self,
        namespace: &str,
        job: &str,
        limit: usize,
    ) -> Result<Vec<String>, LockError> {
        self.run_keys(namespace, job, limit).await
    }

    async fn journalled_jobs(&self, namespace: &str) -> Result<Vec<String>, LockError> {
        self.jobs_with_keys(namespace).await
    }
}

impl EtcdBackend {
    /// Releases the record: in one
    /// conditional transaction when this store wrote it and no min_hold or marker is in play,
    /// otherwise after reading it and its hold key.
    async fn release_record(
        &self,
        names: &KeyNames,
        token: &str,
        done_retention: Option<Duration>,
    ) -> Result<ReleaseOutcome, LockError> {
        let context = format!("release of `{}` failed", names.key());
        let record = names.record();
        let hold = hold_key(names);
        let reads = || [TxnOp::get(record, None), TxnOp::get(hold.as_str(), None)];
        let written = self.written_of().get(token).cloned();
        let mut found = match (written, done_retention) {
            (Some(value), None) => {
                let answer = self
                    .conn
                    .txn(
                        Txn::new()
                            .when([
                                Compare::value(record, CompareOp::Equal, value),
                                Compare::create_revision(hold.as_str(), CompareOp::Equal, 0),
                            ])
                            .and_then([TxnOp::delete(record, None)])
                            .or_else(reads()),
                        &context,
                    )
                    .await?;
                if answer.succeeded() {
                    // The lease, without keys now, is left to expire by its ttl, as a
                    // hand-written lock leaves it: etcd's leader then revokes it (a write,
                    // deferred; at most 1,000 leases a second, so releases faster than that,
                    // sustained, pile up keyless leases until they slow down). Revoking it
                    // here cost a quarter of the pairs per second with 64 tasks
                    // (`lock-bench --etcd-only`: 0.59x against 0.81x the hand-written lock).
                    return Ok(ReleaseOutcome::Released);
                }
                gets(&answer)
            }
            _ => {
                // The done marker first, whether or not the lock is still ours: while the
                // record lives nobody else runs, so a marker written before the release can
                // never let the work run twice.
                let mut first = Vec::new();
                if let Some(retention) = done_retention {
                    let marker = self.conn.grant(retention, &context).await?;
                    first.push(put(names.done(), "1", marker));
                }
                first.extend(reads());
                gets(&self.conn.txn(Txn::new().and_then(first), &context).await?)
            }
        };
        // The record or its hold may change under us (an expiry, a takeover): read again and
        // retry a few times; each try is conditional on exactly what was read.
        for _ in 0..4 {
            let (kv, hold_kv) = (
                found.first().cloned().flatten(),
                found.get(1).cloned().flatten(),
            );
            let Some(kv) = kv.filter(|kv| parse_value(kv.value()).is_some_and(|v| v.0 == token))
            else {
                return Ok(ReleaseOutcome::NotOwner);
            };
            let mut when = vec![Compare::mod_revision(
                record,
                CompareOp::Equal,
                kv.mod_revision(),
            )];
            let (then, outcome) = match &hold_kv {
                Some(hold_kv) => {
                    // min_hold has not passed: keep the record, on the hold's lease, under a
                    // value no token matches.
                    when.push(Compare::mod_revision(
                        hold.as_str(),
                        CompareOp::Equal,
                        hold_kv.mod_revision(),
                    ));
                    let (_, acquired, owner) = parse_value(kv.value()).unwrap_or(("", 0, ""));
                    let kept = record_value(RELEASED, owner, acquired);
                    (
                        vec![put(record, kept, hold_kv.lease())],
                        ReleaseOutcome::KeptForMinHold,
                    )
                }
                None => (vec![TxnOp::delete(record, None)], ReleaseOutcome::Released),
            };
            let answer = self
                .conn
                .txn(
                    Txn::new()
                        .when(when)
                        .and_then(then)
                        .or_else([TxnOp::get(record, None), TxnOp::get(hold.as_str(), None)]),
                    &context,
                )
                .await?;
            if answer.succeeded() {
                self.conn.revoke_later(vec![kv.lease()]);
                return Ok(outcome);
            }
            found = gets(&answer);
        }
        Err(BackendError::transient(format!(
            "{context}: the record kept changing while it was being released"
        ))
        .into())
    }

    fn written_of(&self) -> std::sync::MutexGuard<'_, HashMap<String, Vec<u8>>> {
        self.written
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl EtcdBackend {
    /// A record as `inspect` and `list` show it.
    async fn view(&self, kv: &KeyValue) -> RecordView {
        let (_, acquired, owner) = parse_value(kv.value()).unwrap_or(("", 0, ""));
        let held_for = Duration::from_millis(now_ms().saturating_sub(acquired));
        RecordView::new(
            owner,
            u64::try_from(kv.create_revision()).unwrap_or(0),
            self.conn.remaining(kv.lease()).await,
            held_for,
        )
    }
}

/// A request that never reached etcd: the connection to the endpoint it was sent to could not
/// be made.
pub(super) fn unsent(e: &etcd_client::Error) -> bool {
    match e {
        etcd_client::Error::GRpcStatus(status) => {
            status.code() == tonic::Code::Unavailable && status.message().contains("connect error")
        }
        _ => false,
    }
}

/// An etcd error in `context`, naming the endpoints and scrubbed of `secrets`. Transient when
/// a retry may cure it: no connection, no leader, a deadline.
fn error(shown: &str, secrets: &[String], context: &str, e: etcd_client::Error) -> LockError {
    let transient = match &e {
        // Cancelled: the client's own request timeout; Unknown and Internal: a connection
        // that broke under the call; NotFound: a lease that expired between its grant and
        // its use (a long election); Unauthenticated: a token that expired (refreshed by the
        // next call).
        etcd_client::Error::GRpcStatus(status) => {
            matches!(
                status.code(),
                tonic::Code::Unavailable
                    | tonic::Code::DeadlineExceeded
                    | tonic::Code::Aborted
                    | tonic::Code::ResourceExhausted
                    | tonic::Code::Cancelled
                    | tonic::Code::Unknown
                    | tonic::Code::Internal
                    | tonic::Code::NotFound
            ) || (status.code() == tonic::Code::Unauthenticated
                && status.message().contains("invalid auth token"))
        }
        etcd_client::Error::TransportError(_)
        | etcd_client::Error::IoError(_)
        | etcd_client::Error::WatchError(_)
        | etcd_client::Error::LeaseKeepAliveError(_) => true,
        _ => false,
    };
    let message = format!(
        "{context} (etcd at `{shown}`): {}",
        scrub(&e.to_string(), secrets)
    );
    if transient {
        BackendError::transient(message).into()
    } else {
        BackendError::new(message).into()
    }
}
