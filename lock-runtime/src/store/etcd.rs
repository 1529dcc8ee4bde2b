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

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, GetOptions, KeyValue, PutOptions, Txn, TxnOp,
    TxnOpResponse, TxnResponse,
};
use tokio::sync::OnceCell;

mod watch;

use super::{
    AcquireOutcome, AcquireRequest, ExtendItem, KeyNames, LockStore, RecordView, ReleaseHub,
    ReleaseOutcome, ReleaseWatch, Renewal, Subscriber, key_matches, key_of_record,
};
use crate::error::scrub;
use crate::{BackendError, LockError};

/// How the builder asked to connect.
#[derive(Debug, Clone)]
pub(crate) struct EtcdOptions {
    pub(crate) endpoints: Vec<String>,
    /// User name and password (etcd authentication).
    pub(crate) user: Option<(String, String)>,
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

/// A store in etcd.
pub(crate) struct EtcdStore {
    client: Client,
    options: EtcdOptions,
    shown: String,
    secrets: Vec<String>,
    hub: Arc<ReleaseHub>,
    subscriber: OnceCell<Subscriber>,
}

impl std::fmt::Debug for EtcdStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdStore")
            .field("endpoints", &self.shown)
            .finish_non_exhaustive()
    }
}

/// Whole seconds, rounded up, at least one: what an etcd lease can say.
fn lease_secs(d: Duration) -> i64 {
    let secs = d.as_millis().div_ceil(1000).max(1);
    i64::try_from(secs).unwrap_or(i64::MAX)
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
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

impl EtcdStore {
    /// Connects and checks that the cluster answers, within the connect timeout.
    pub(crate) async fn connect(options: EtcdOptions) -> Result<Self, LockError> {
        if options.endpoints.is_empty() {
            return Err(LockError::config("etcd needs at least one endpoint"));
        }
        let shown = options.endpoints.join(", ");
        let secrets: Vec<String> = options.user.iter().map(|(_, p)| p.clone()).collect();
        let mut connect = ConnectOptions::new()
            .with_connect_timeout(options.connect_timeout)
            .with_timeout(options.command_timeout);
        if let Some((user, password)) = &options.user {
            connect = connect.with_user(user.clone(), password.clone());
        }
        let opened = tokio::time::timeout(options.connect_timeout, async {
            let mut client = Client::connect(&options.endpoints, Some(connect)).await?;
            // A read answers only once a leader serves it: the cluster is usable.
            client
                .get(
                    "lock-runtime:probe",
                    Some(GetOptions::new().with_count_only()),
                )
                .await?;
            Ok::<_, etcd_client::Error>(client)
        })
        .await;
        let client = match opened {
            Ok(Ok(client)) => client,
            Ok(Err(e)) => {
                return Err(error(
                    &shown,
                    &secrets,
                    &format!("cannot connect to etcd at `{shown}`"),
                    e,
                ));
            }
            Err(_) => {
                return Err(BackendError::transient(format!(
                    "cannot connect to etcd at `{shown}`: no answer within {:?}",
                    options.connect_timeout
                ))
                .into());
            }
        };
        Ok(EtcdStore {
            client,
            options,
            shown,
            secrets,
            hub: Arc::new(ReleaseHub::default()),
            subscriber: OnceCell::new(),
        })
    }

    fn error(&self, context: &str, e: etcd_client::Error) -> LockError {
        error(&self.shown, &self.secrets, context, e)
    }

    /// Runs `call` on the client; again (up to twice per endpoint) while it fails without
    /// having been sent. The client spreads requests over the endpoints, and one whose member
    /// is down refuses the connection: such a request never reached etcd, so sending it again
    /// is safe for every call, and without it a third of the calls would fail while one
    /// member of three is down.
    async fn send<T, F, Fut>(&self, call: F) -> Result<T, etcd_client::Error>
    where
        F: Fn(Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        let mut tries = 0;
        loop {
            match call(self.client.clone()).await {
                Err(e) if unsent(&e) && tries < 2 * self.options.endpoints.len() => {
                    tries += 1;
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                answer => return answer,
            }
        }
    }

    async fn grant(&self, ttl: Duration, what: &str) -> Result<i64, LockError> {
        let secs = lease_secs(ttl);
        let granted = self
            .send(|mut c| async move { c.lease_grant(secs, None).await })
            .await
            .map_err(|e| self.error(&format!("{what}: lease grant failed"), e))?;
        Ok(granted.id())
    }

    /// Gives leases nobody uses back, in the background (they would expire by themselves).
    fn revoke_later(&self, leases: Vec<i64>) {
        let mut client = self.client.clone();
        tokio::spawn(async move {
            for lease in leases {
                let _ = client.lease_revoke(lease).await;
            }
        });
    }

    /// The time left on `lease` (None: no lease, or unknown).
    async fn remaining(&self, lease: i64) -> Option<Duration> {
        if lease == 0 {
            return None;
        }
        let answer = self
            .send(|mut c| async move { c.lease_time_to_live(lease, None).await })
            .await
            .ok()?;
        Some(Duration::from_secs(
            u64::try_from(answer.ttl()).unwrap_or(0),
        ))
    }

    async fn txn(&self, txn: Txn, context: &str) -> Result<TxnResponse, LockError> {
        self.send(|mut c| {
            let txn = txn.clone();
            async move { c.txn(txn).await }
        })
        .await
        .map_err(|e| self.error(context, e))
    }

    /// Renews one lease: keep-alive of the lease its key is attached to (or, for a longer ttl
    /// than that lease was granted, a move onto a new lease), then a read that confirms the
    /// key still carries the token on that lease.
    async fn renew(&self, item: &ExtendItem, kv: KeyValue) -> Result<Renewal, LockError> {
        let context = "lease renewal failed";
        let mut lease = kv.lease();
        let (mut keeper, mut answers) = self
            .send(|mut c| async move { c.lease_keep_alive(lease).await })
            .await
            .map_err(|e| self.error(context, e))?;
        keeper
            .keep_alive()
            .await
            .map_err(|e| self.error(context, e))?;
        let granted = match answers
            .message()
            .await
            .map_err(|e| self.error(context, e))?
        {
            Some(answer) => answer.ttl(),
            None => return Err(BackendError::transient(format!("{context}: no answer")).into()),
        };
        if granted <= 0 {
            return Ok(Renewal::NotOurs); // the lease, and so the key, is gone
        }
        if granted < lease_secs(item.ttl) {
            // A longer ttl than the lease was granted with: move the key onto a new lease.
            let longer = self.grant(item.ttl, context).await?;
            let moved = self
                .txn(
                    Txn::new()
                        .when([
                            Compare::value(item.record.as_str(), CompareOp::Equal, kv.value()),
                            Compare::lease(item.record.as_str(), CompareOp::Equal, lease),
                        ])
                        .and_then([put(&item.record, kv.value(), longer)]),
                    context,
                )
                .await?;
            if !moved.succeeded() {
                self.revoke_later(vec![longer]);
                return Ok(Renewal::NotOurs);
            }
            lease = longer;
        }
        let confirmed = self
            .txn(
                Txn::new().when([
                    Compare::value(item.record.as_str(), CompareOp::Equal, kv.value()),
                    Compare::lease(item.record.as_str(), CompareOp::Equal, lease),
                ]),
                context,
            )
            .await?;
        Ok(Renewal::from(confirmed.succeeded()))
    }
}

impl LockStore for EtcdStore {
    async fn acquire(&self, r: AcquireRequest<'_>) -> Result<AcquireOutcome, LockError> {
        let context = format!("acquire of `{}` failed", r.names.key());
        let record = r.names.record();
        let lease = self.grant(r.ttl, &context).await?;
        let hold = if r.min_hold.is_zero() {
            None
        } else {
            match self.grant(r.min_hold, &context).await {
                Ok(hold) => Some(hold),
                Err(e) => {
                    self.revoke_later(vec![lease]);
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
        let mut then = vec![put(record, record_value(r.token, r.owner, now_ms()), lease)];
        if let Some(hold) = hold {
            then.push(put(&hold_key(r.names), "", hold));
        }
        let txn = Txn::new()
            .when(when)
            .and_then(then)
            .or_else([TxnOp::get(record, None), TxnOp::get(r.names.done(), None)]);
        let answer = match self.txn(txn, &context).await {
            Ok(answer) => answer,
            Err(e) => {
                // Maybe applied: the runtime releases the token; the leases stay with the key.
                return Err(e);
            }
        };
        if answer.succeeded() {
            let revision = answer.header().map_or(0, |h| h.revision());
            let fence = u64::try_from(revision).map_err(|_| {
                LockError::from(BackendError::new(format!(
                    "{context}: etcd answered revision {revision}"
                )))
            })?;
            return Ok(AcquireOutcome::Acquired { fence });
        }
        self.revoke_later(std::iter::once(lease).chain(hold).collect());
        let found = gets(&answer);
        let (held, done) = (
            found.first().cloned().flatten(),
            found.get(1).cloned().flatten(),
        );
        if r.once
            && let Some(done) = done
        {
            return Ok(AcquireOutcome::Done {
                pttl: self.remaining(done.lease()).await,
            });
        }
        Ok(AcquireOutcome::Held {
            pttl: match held {
                Some(kv) => self.remaining(kv.lease()).await,
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
        let context = format!("release of `{}` failed", names.key());
        let record = names.record();
        let hold = hold_key(names);
        // The done marker first, whether or not the lock is still ours: while the record
        // lives nobody else runs, so a marker written before the release can never let the
        // work run twice.
        let mut first = Vec::new();
        if let Some(retention) = done_retention {
            let marker = self.grant(retention, &context).await?;
            first.push(put(names.done(), "1", marker));
        }
        first.push(TxnOp::get(record, None));
        first.push(TxnOp::get(hold.as_str(), None));
        let mut found = gets(&self.txn(Txn::new().and_then(first), &context).await?);
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
                .txn(
                    Txn::new()
                        .when(when)
                        .and_then(then)
                        .or_else([TxnOp::get(record, None), TxnOp::get(hold.as_str(), None)]),
                    &context,
                )
                .await?;
            if answer.succeeded() {
                self.revoke_later(vec![kv.lease()]);
                return Ok(outcome);
            }
            found = gets(&answer);
        }
        Err(BackendError::transient(format!(
            "{context}: the record kept changing while it was being released"
        ))
        .into())
    }

    async fn extend(&self, items: &[ExtendItem]) -> Result<Vec<Renewal>, LockError> {
        let mut read = Vec::with_capacity(items.len());
        for chunk in items.chunks(MAX_TXN_OPS) {
            let ops: Vec<TxnOp> = chunk
                .iter()
                .map(|item| TxnOp::get(item.record.as_str(), None))
                .collect();
            read.extend(gets(
                &self
                    .txn(Txn::new().and_then(ops), "lease renewal failed")
                    .await?,
            ));
        }
        let mut renewed = Vec::with_capacity(items.len());
        for (item, kv) in items.iter().zip(read) {
            let ours = kv.filter(|kv| {
                parse_value(kv.value()).is_some_and(|v| v.0 == item.token) && kv.lease() != 0
            });
            renewed.push(match ours {
                None => Renewal::NotOurs,
                Some(kv) => match self.renew(item, kv).await {
                    Ok(renewal) => renewal,
                    Err(e) => Renewal::Unknown(e.to_string()),
                },
            });
        }
        Ok(renewed)
    }

    async fn inspect(&self, names: &KeyNames) -> Result<Option<RecordView>, LockError> {
        let context = format!("inspect of `{}` failed", names.key());
        let record = names.record();
        let answer = self
            .send(|mut c| async move { c.get(record, None).await })
            .await
            .map_err(|e| self.error(&context, e))?;
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
                    self.client.clone(),
                    self.hub.clone(),
                    self.options.command_timeout,
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
            .send(|mut c| {
                let prefix = prefix.clone();
                async move { c.get(prefix, Some(GetOptions::new().with_prefix())).await }
            })
            .await
            .map_err(|e| self.error("listing the locks failed", e))?;
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
}

impl EtcdStore {
    /// A record as `inspect` and `list` show it.
    async fn view(&self, kv: &KeyValue) -> RecordView {
        let (_, acquired, owner) = parse_value(kv.value()).unwrap_or(("", 0, ""));
        let held_for = Duration::from_millis(now_ms().saturating_sub(acquired));
        RecordView::new(
            owner,
            u64::try_from(kv.create_revision()).unwrap_or(0),
            self.remaining(kv.lease()).await,
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
        etcd_client::Error::GRpcStatus(status) => matches!(
            status.code(),
            tonic::Code::Unavailable
                | tonic::Code::DeadlineExceeded
                | tonic::Code::Aborted
                | tonic::Code::ResourceExhausted
        ),
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
