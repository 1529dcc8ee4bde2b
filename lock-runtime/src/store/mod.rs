//! The stores a runtime can lock in.
//!
//! Every store, the built-in ones included, implements [`LockStore`], and the runtime calls
//! nothing else; the built-in stores sit behind one enum, so their calls are a plain `match`
//! rather than a boxed future. Any other store is plugged in with
//! [`LockRuntimeBuilder::store`](crate::LockRuntimeBuilder::store). The runtime brings
//! everything else (tokens, validity, the watchdog, waiting, shutdown); a store answers the
//! calls of [`LockStore`] with the semantics written on each (five that locking needs, two
//! for operators: `list` and `force_release`).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::LockError;

mod builtin;
mod conn;
mod custom;
#[cfg(feature = "etcd")]
pub(crate) mod etcd;
mod hub;
mod listing;
mod memory;
#[cfg(feature = "postgres")]
mod postgres;
mod pubsub;
mod redis;
mod redlock;
mod sentinel;

pub(crate) use custom::{CustomStore, DynStore};
#[cfg(feature = "etcd")]
pub(crate) use etcd::{EtcdOptions, EtcdStore};
pub use hub::{ReleaseHub, ReleaseWatch};
pub use listing::{QuorumView, key_matches, key_of_record};
pub use memory::MemoryStore;
#[cfg(feature = "postgres")]
pub(crate) use postgres::{DEFAULT_TABLE, PostgresOptions, PostgresStore, PostgresTarget};
pub use pubsub::{PubSubConnection, PubSubEvent, Subscriber};
pub(crate) use redis::{RedisBackend, RedisOptions};
pub(crate) use redlock::{DEFAULT_NODE_TIMEOUT, RedlockBackend};
/// The PostgreSQL driver the store is built on (cargo feature `postgres`), so a
/// [`Config`](tokio_postgres::Config) for
/// [`LockRuntimeBuilder::postgres_config`](crate::LockRuntimeBuilder::postgres_config) comes
/// from the same version.
#[cfg(feature = "postgres")]
pub use tokio_postgres;

/// The names of one lock in a store: `<ns>:{<key>}` and its companions. The braces are a Redis
/// Cluster hash tag, so all of them live in one slot and one script may touch them together.
/// Other stores may use them as they are, or only [`record`](Self::record) (unique per
/// namespace and key) and derive their own.
#[derive(Debug, Clone)]
pub struct KeyNames {
    /// The key as the caller gave it.
    pub(crate) key: String,
    pub(crate) record: String,
    pub(crate) fence: String,
    pub(crate) done: String,
    pub(crate) channel: String,
}

impl KeyNames {
    /// The names of `key` in `namespace`.
    pub fn new(namespace: &str, key: &str) -> Self {
        let record = format!("{namespace}:{{{key}}}");
        KeyNames {
            key: key.to_owned(),
            fence: format!("{record}:fence"),
            done: format!("{record}:done"),
            channel: format!("{record}:released"),
            record,
        }
    }

    /// The key as the caller gave it.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The lock record: `<ns>:{<key>}`.
    pub fn record(&self) -> &str {
        &self.record
    }

    /// The fence counter: `<ns>:{<key>}:fence`.
    pub fn fence(&self) -> &str {
        &self.fence
    }

    /// The `once` marker: `<ns>:{<key>}:done`.
    pub fn done(&self) -> &str {
        &self.done
    }

    /// The channel releases are announced on: `<ns>:{<key>}:released`.
    pub fn channel(&self) -> &str {
        &self.channel
    }
}

/// What an acquire attempt found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum AcquireOutcome {
    /// The lock is ours.
    Acquired {
        /// The new holder's fence: greater than every earlier fence of this lock.
        fence: u64,
    },
    /// Someone else holds it.
    Held {
        /// It expires in this unless renewed (None: no expiry known).
        pttl: Option<Duration>,
    },
    /// A done marker (`once`) says the work already ran.
    Done {
        /// The marker expires in this (None: no expiry known).
        pttl: Option<Duration>,
    },
}

/// What a release did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ReleaseOutcome {
    /// The record is gone and waiters were told.
    Released,
    /// The record stays until its min_hold has passed, then expires.
    KeptForMinHold,
    /// The record was not ours any more: expired, or another owner holds it.
    NotOwner,
    /// The release was sent again after its connection broke, and the second send found the
    /// record no longer ours: the first send most likely released it and its answer was lost.
    /// The runtime reports it released when the holder's lease is still valid at the answer
    /// (so the record cannot have expired meanwhile), and no longer ours otherwise. (A store
    /// that cannot tell answers `NotOwner`.)
    GoneAfterRetry,
}

/// What a renewal found for one lease.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Renewal {
    /// Renewed: the record is ours and lives on.
    Renewed,
    /// The record belongs to another token, or is gone.
    NotOurs,
    /// The part of the store holding it did not answer (why); retry.
    Unknown(String),
}

impl From<bool> for Renewal {
    fn from(renewed: bool) -> Self {
        if renewed {
            Renewal::Renewed
        } else {
            Renewal::NotOurs
        }
    }
}

/// One lease to renew.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ExtendItem {
    /// The lock's record ([`KeyNames::record`]).
    pub record: String,
    /// The token the lease was acquired with.
    pub token: String,
    /// The new time to live, counted from when the store applies the renewal.
    pub ttl: Duration,
}

/// A lock record as `inspect` reports it, before the runtime turns it into `LockInfo`.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct RecordView {
    /// The owner name the holder's runtime acquired with.
    pub owner: String,
    /// The holder's fence.
    pub fence: u64,
    /// How long until the record expires unless renewed (None: no expiry known).
    pub remaining: Option<Duration>,
    /// How long since it was acquired, on the store's clock.
    pub held_for: Duration,
    /// Redlock: how the masters see this record (None for a store of one record per lock).
    pub quorum: Option<QuorumView>,
}

impl RecordView {
    /// A record held by `owner` with `fence`, expiring in `remaining` (None: no expiry known),
    /// acquired `held_for` ago.
    pub fn new(
        owner: impl Into<String>,
        fence: u64,
        remaining: Option<Duration>,
        held_for: Duration,
    ) -> Self {
        RecordView {
            owner: owner.into(),
            fence,
            remaining,
            held_for,
            quorum: None,
        }
    }
}

/// One acquire, as the runtime asks a [`LockStore`] for it.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct AcquireRequest<'a> {
    /// The lock's names.
    pub names: &'a KeyNames,
    /// A fresh token (32 hex digits), unique to this attempt.
    pub token: &'a str,
    /// The owner name of the runtime, for `inspect` and operators.
    pub owner: &'a str,
    /// Time to live of the record, counted from when the store applies the acquire.
    pub ttl: Duration,
    /// A release before this much time has passed (store clock) leaves the record until then.
    pub min_hold: Duration,
    /// Refuse with [`AcquireOutcome::Done`] while the `once` marker of this lock lives.
    pub once: bool,
}

/// A store the runtime can lock in: implement this to add one, and plug it in with
/// [`LockRuntimeBuilder::store`](crate::LockRuntimeBuilder::store).
///
/// Every call acts on the store atomically, on the store's clock. A call that fails must say
/// nothing it does not know: `Err` means "maybe applied, maybe not", and the runtime treats it
/// that way (an acquire that failed is released in the background with its token, which is
/// harmless if it never landed). Fail with [`LockError::Backend`]:
/// [`BackendError::transient`](crate::BackendError::transient) for what a retry may cure (no
/// answer, a broken connection), which waiters ride out until their deadline and the watchdog
/// retries until the lease's validity ends; [`BackendError::new`](crate::BackendError::new)
/// for the rest, which ends the caller's call. The runtime bounds every call by the builder's
/// `command_timeout` (a call cut off counts as transient); calls should bound their own time
/// too. The runtime calls `acquire` again only with a fresh token, and `extend` again for the
/// same leases.
///
/// The promises the runtime builds on (DESIGN §5): fences strictly increase per lock, across
/// restarts of the store where it has any; at most one live record per lock; a release or
/// renewal with a token that is not the record's changes nothing of the record; a release
/// that frees the lock wakes every [`ReleaseWatch`] of it.
///
/// Order: the runtime gives back a grant it could not hand out (the caller gave up, the
/// answer came too late or never) with a release sent *after* the acquire. The store must
/// apply that release after the acquire, as one connection does; a store whose calls can
/// overtake one another (a pool of connections) must order them per lock, or such a grant
/// stays taken by nobody until its ttl.
///
/// A store proves itself with the conformance kit, the `lock-testkit` crate: the behaviour
/// and attribute suites every built-in store passes, generated for yours by one macro call.
///
/// # Example
///
/// A store in this process's memory (what [`MemoryStore`] does, in
/// brief), plugged into a runtime:
///
/// ```
/// use std::collections::HashMap;
/// use std::sync::{Arc, Mutex, MutexGuard};
/// use std::time::Duration;
///
/// use lock_runtime::store::{
///     AcquireOutcome, AcquireRequest, ExtendItem, KeyNames, LockStore, RecordView, ReleaseHub,
///     ReleaseOutcome, ReleaseWatch, Renewal, key_matches, key_of_record,
/// };
/// use lock_runtime::{LockError, LockRuntime};
/// use tokio::time::Instant;
///
/// struct Record {
///     token: String,
///     owner: String,
///     fence: u64,
///     since: Instant,
///     keep_until: Instant, // min_hold
///     until: Instant,      // expiry
/// }
///
/// #[derive(Default)]
/// struct State {
///     records: HashMap<String, Record>,
///     done: HashMap<String, Instant>,
///     last_fence: u64, // one counter for every lock: a fence is never reused
/// }
///
/// #[derive(Default)]
/// struct MapStore {
///     state: Mutex<State>,
///     hub: Arc<ReleaseHub>,
/// }
///
/// impl MapStore {
///     fn state(&self) -> MutexGuard<'_, State> {
///         self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
///     }
/// }
///
/// impl LockStore for MapStore {
///     async fn acquire(&self, r: AcquireRequest<'_>) -> Result<AcquireOutcome, LockError> {
///         let now = Instant::now();
///         let mut s = self.state();
///         if let Some(&until) = s.done.get(r.names.done())
///             && r.once
///             && until > now
///         {
///             return Ok(AcquireOutcome::Done { pttl: Some(until - now) });
///         }
///         if let Some(held) = s.records.get(r.names.record())
///             && held.until > now
///         {
///             return Ok(AcquireOutcome::Held { pttl: Some(held.until - now) });
///         }
///         s.last_fence += 1;
///         let fence = s.last_fence;
///         let record = Record {
///             token: r.token.to_owned(),
///             owner: r.owner.to_owned(),
///             fence,
///             since: now,
///             keep_until: now + r.min_hold,
///             until: now + r.ttl,
///         };
///         s.records.insert(r.names.record().to_owned(), record);
///         Ok(AcquireOutcome::Acquired { fence })
///     }
///
///     async fn release(
///         &self,
///         names: &KeyNames,
///         token: &str,
///         done_retention: Option<Duration>,
///     ) -> Result<ReleaseOutcome, LockError> {
///         let now = Instant::now();
///         let mut s = self.state();
///         if let Some(retention) = done_retention {
///             s.done.insert(names.done().to_owned(), now + retention);
///         }
///         let outcome = match s.records.get_mut(names.record()) {
///             Some(rec) if rec.token == token && rec.until > now => {
///                 if rec.keep_until > now {
///                     rec.until = rec.until.min(rec.keep_until);
///                     rec.token = "released".to_owned(); // no token: those are 32 hex digits
///                     ReleaseOutcome::KeptForMinHold
///                 } else {
///                     s.records.remove(names.record());
///                     ReleaseOutcome::Released
///                 }
///             }
///             _ => return Ok(ReleaseOutcome::NotOwner),
///         };
///         drop(s);
///         self.hub.notify(names.channel());
///         Ok(outcome)
///     }
///
///     async fn extend(&self, items: &[ExtendItem]) -> Result<Vec<Renewal>, LockError> {
///         let now = Instant::now();
///         let mut s = self.state();
///         let mut renew = |item: &ExtendItem| match s.records.get_mut(&item.record) {
///             Some(rec) if rec.token == item.token && rec.until > now => {
///                 rec.until = rec.until.max(now + item.ttl);
///                 Renewal::Renewed
///             }
///             _ => Renewal::NotOurs,
///         };
///         Ok(items.iter().map(&mut renew).collect())
///     }
///
///     async fn inspect(&self, names: &KeyNames) -> Result<Option<RecordView>, LockError> {
///         let now = Instant::now();
///         let s = self.state();
///         let live = s.records.get(names.record()).filter(|r| r.until > now);
///         Ok(live.map(|r| RecordView::new(&r.owner, r.fence, Some(r.until - now), now - r.since)))
///     }
///
///     async fn watch_releases(&self, names: &KeyNames) -> Result<ReleaseWatch, LockError> {
///         Ok(self.hub.subscribe(names.channel()))
///     }
///
///     async fn list(
///         &self,
///         namespace: &str,
///         pattern: &str,
///     ) -> Result<Vec<(String, RecordView)>, LockError> {
///         let now = Instant::now();
///         let s = self.state();
///         let live = s.records.iter().filter(|(_, r)| r.until > now);
///         Ok(live
///             .filter_map(|(record, r)| Some((key_of_record(namespace, record)?, r)))
///             .filter(|(key, _)| key_matches(pattern, key))
///             .map(|(key, r)| {
///                 (key, RecordView::new(&r.owner, r.fence, Some(r.until - now), now - r.since))
///             })
///             .collect())
///     }
///
///     async fn force_release(&self, names: &KeyNames, fence: u64) -> Result<bool, LockError> {
///         let now = Instant::now();
///         let mut s = self.state();
///         let live = s.records.get(names.record()).filter(|r| r.until > now);
///         if live.is_none_or(|r| r.fence != fence) {
///             return Ok(false);
///         }
///         s.records.remove(names.record());
///         drop(s);
///         self.hub.notify(names.channel());
///         Ok(true)
///     }
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), LockError> {
/// let runtime = LockRuntime::builder().store(MapStore::default()).build().await?;
/// let guard = runtime.lock("report").try_acquire().await?.expect("the lock is free");
/// assert!(runtime.lock("report").try_acquire().await?.is_none(), "held");
/// assert!(guard.release().await?);
/// assert!(runtime.lock("report").try_acquire().await?.is_some(), "free again");
/// # Ok(()) }
/// ```
pub trait LockStore: Send + Sync + 'static {
    /// Creates the record if the lock is free (no live record), with a fence greater than
    /// every fence this lock had before, and answers [`AcquireOutcome::Acquired`]. Otherwise
    /// answers [`AcquireOutcome::Held`] with the holder's remaining time to live, or, when
    /// `request.once` is set and the lock's `once` marker lives, [`AcquireOutcome::Done`]
    /// (checked first).
    fn acquire(
        &self,
        request: AcquireRequest<'_>,
    ) -> impl Future<Output = Result<AcquireOutcome, LockError>> + Send;

    /// Gives the lock back if its record carries `token`: removes it and wakes the lock's
    /// watchers ([`ReleaseOutcome::Released`]), or, while the record's `min_hold` has not
    /// passed, keeps it until then under a value no token matches and wakes them too
    /// ([`ReleaseOutcome::KeptForMinHold`]: they were told the holder's whole ttl, and asking
    /// again tells them when min_hold ends). Any other token changes nothing
    /// ([`ReleaseOutcome::NotOwner`]). When `done_retention` is set, the `once` marker is
    /// written for that long whatever the token, in the same atomic step as the release (a
    /// marker written apart from it can let the job run twice); the runtime writes a marker
    /// alone with the token `""`.
    fn release(
        &self,
        names: &KeyNames,
        token: &str,
        done_retention: Option<Duration>,
    ) -> impl Future<Output = Result<ReleaseOutcome, LockError>> + Send;

    /// Renews every item whose record still carries its token, to at least `ttl` from now;
    /// one answer per item, in order. `Err` only when no item could be answered; an item whose
    /// part of the store failed answers [`Renewal::Unknown`].
    fn extend(
        &self,
        items: &[ExtendItem],
    ) -> impl Future<Output = Result<Vec<Renewal>, LockError>> + Send;

    /// The lock's live record, if any.
    fn inspect(
        &self,
        names: &KeyNames,
    ) -> impl Future<Output = Result<Option<RecordView>, LockError>> + Send;

    /// Starts watching the lock's releases. Resolves once the watch is live: a release that
    /// frees the lock after this returns must wake it (a [`ReleaseHub`] does the fan-out).
    /// A store whose subscription broke and came back must wake every watch
    /// ([`ReleaseHub::notify_all`]), since releases may have passed meanwhile. A watch may
    /// also wake without a release; the runtime then just tries again, and without any wake
    /// it still retries when the holder's ttl runs out.
    fn watch_releases(
        &self,
        names: &KeyNames,
    ) -> impl Future<Output = Result<ReleaseWatch, LockError>> + Send;

    /// For operators (`LockRuntime::list`, lockctl): every live record of `namespace` whose
    /// key matches `pattern` ([`key_matches`]: `*` any run of characters, `?` one), with its
    /// key (without namespace), in any order. Records kept for min_hold count as live; done
    /// markers are not records. Not on any hot path: a scan is fine.
    fn list(
        &self,
        namespace: &str,
        pattern: &str,
    ) -> impl Future<Output = Result<Vec<(String, RecordView)>, LockError>> + Send;

    /// For operators: removes the lock's live record, whatever token it carries, if it carries
    /// `fence` (the holder the operator saw), and wakes the lock's watchers as a release that
    /// frees the lock does; true when it removed one. Conditional on the fence so that a call
    /// retried or arriving late, after a new holder came in, removes nothing. The holder learns
    /// it lost the lock at its next renewal. The `once` marker and the fence history stay.
    fn force_release(
        &self,
        names: &KeyNames,
        fence: u64,
    ) -> impl Future<Output = Result<bool, LockError>> + Send;

    /// Only for a store that is one member of a quorum
    /// ([`LockRuntimeBuilder::redlock_stores`](crate::LockRuntimeBuilder::redlock_stores)):
    /// after a quorum granted the lock, the lease carries the largest fence among the quorum,
    /// and each member is asked to make every later fence of this lock greater than `fence`
    /// (kept at least `ttl`) and, if its record carries `token`, to stamp the record with
    /// `fence`; true when the record carries `token`. Any later quorum shares a member with
    /// this one, so its fence is then larger. The default refuses, so a store that does not
    /// implement it cannot serve in a quorum (a lone store never needs it).
    fn raise_fence(
        &self,
        names: &KeyNames,
        token: &str,
        fence: u64,
        ttl: Duration,
    ) -> impl Future<Output = Result<bool, LockError>> + Send {
        let _ = (names, token, fence, ttl);
        async {
            Err(LockError::config(
                "this store does not implement LockStore::raise_fence, so it cannot be a member of a quorum",
            ))
        }
    }
}

/// The store of one runtime. Held behind an `Arc`, so the size difference between variants
/// costs nothing per call.
#[derive(Debug)]
#[allow(clippy::large_enum_variant)]
pub(crate) enum Backend {
    Redis(RedisBackend),
    Redlock(RedlockBackend),
    Memory(MemoryStore),
    Custom(CustomStore),
}

impl Backend {
    /// Every store answers through [`LockStore`]; the match only saves the built-in stores a
    /// boxed future per call.
    pub(crate) async fn acquire(
        &self,
        request: AcquireRequest<'_>,
    ) -> Result<AcquireOutcome, LockError> {
        match self {
            Backend::Redis(r) => LockStore::acquire(r, request).await,
            // Boxed: the quorum's fan-out is a deep future, and inline it would size every
            // acquire's future (whatever the store) after it; one allocation next to N round
            // trips. `lock-bench --macro-overhead` prints the size.
            Backend::Redlock(r) => Box::pin(LockStore::acquire(r, request)).await,
            Backend::Memory(m) => LockStore::acquire(m, request).await,
            Backend::Custom(c) => c.acquire(request).await,
        }
    }

    pub(crate) async fn release(
        &self,
        names: &KeyNames,
        token: &str,
        done_retention: Option<Duration>,
    ) -> Result<ReleaseOutcome, LockError> {
        match self {
            Backend::Redis(r) => LockStore::release(r, names, token, done_retention).await,
            Backend::Redlock(r) => LockStore::release(r, names, token, done_retention).await,
            Backend::Memory(m) => LockStore::release(m, names, token, done_retention).await,
            Backend::Custom(c) => c.release(names, token, done_retention).await,
        }
    }

    /// Writes the done marker of `names` for `retention`, touching no lock record: the release
    /// script with a token no lease has (tokens are 32 hex digits) writes the marker and
    /// finds the record "not ours".
    pub(crate) async fn mark_done(
        &self,
        names: &KeyNames,
        retention: Duration,
    ) -> Result<(), LockError> {
        self.release(names, "", Some(retention)).await.map(|_| ())
    }

    /// Renews every item; one answer per item, in order. `Err` only when no item could be
    /// answered at all; otherwise a part of the store that failed (one Cluster shard) costs
    /// only its own items, which answer [`Renewal::Unknown`].
    pub(crate) async fn extend(&self, items: &[ExtendItem]) -> Result<Vec<Renewal>, LockError> {
        match self {
            Backend::Redis(r) => LockStore::extend(r, items).await,
            Backend::Redlock(r) => LockStore::extend(r, items).await,
            Backend::Memory(m) => LockStore::extend(m, items).await,
            Backend::Custom(c) => c.extend(items).await,
        }
    }

    pub(crate) async fn inspect(&self, names: &KeyNames) -> Result<Option<RecordView>, LockError> {
        match self {
            Backend::Redis(r) => LockStore::inspect(r, names).await,
            Backend::Redlock(r) => LockStore::inspect(r, names).await,
            Backend::Memory(m) => LockStore::inspect(m, names).await,
            Backend::Custom(c) => c.inspect(names).await,
        }
    }

    /// Starts watching a lock's release channel. Resolves once the subscription is live, so a
    /// release published after this returns is never missed.
    pub(crate) async fn watch_releases(&self, names: &KeyNames) -> Result<ReleaseWatch, LockError> {
        match self {
            Backend::Redis(r) => LockStore::watch_releases(r, names).await,
            Backend::Redlock(r) => LockStore::watch_releases(r, names).await,
            Backend::Memory(m) => LockStore::watch_releases(m, names).await,
            Backend::Custom(c) => c.watch_releases(names).await,
        }
    }

    /// The live records of `namespace` whose key matches `pattern`, sorted by key.
    pub(crate) async fn list(
        &self,
        namespace: &str,
        pattern: &str,
    ) -> Result<Vec<(String, RecordView)>, LockError> {
        let mut listed = match self {
            Backend::Redis(r) => LockStore::list(r, namespace, pattern).await,
            Backend::Redlock(r) => LockStore::list(r, namespace, pattern).await,
            Backend::Memory(m) => LockStore::list(m, namespace, pattern).await,
            Backend::Custom(c) => c.list(namespace, pattern).await,
        }?;
        // Whatever the store's own matching did, the pattern language is the one documented.
        listed.retain(|(key, _)| key_matches(pattern, key));
        listed.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(listed)
    }

    /// Removes the lock's record if it carries `fence`, whatever its token, waking its waiters.
    pub(crate) async fn force_release(
        &self,
        names: &KeyNames,
        fence: u64,
    ) -> Result<bool, LockError> {
        match self {
            Backend::Redis(r) => LockStore::force_release(r, names, fence).await,
            Backend::Redlock(r) => LockStore::force_release(r, names, fence).await,
            Backend::Memory(m) => LockStore::force_release(m, names, fence).await,
            Backend::Custom(c) => c.force_release(names, fence).await,
        }
    }
}

/// Shared handle to a store.
pub(crate) type SharedBackend = Arc<Backend>;
