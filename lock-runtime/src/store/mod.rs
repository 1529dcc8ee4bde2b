//! The stores a runtime can lock in, behind one enum so each call is a plain `match`.

use std::sync::Arc;
use std::time::Duration;

use crate::LockError;

mod conn;
mod hub;
mod memory;
mod redis;
mod redlock;
mod sentinel;

pub(crate) use hub::{ReleaseHub, ReleaseWatch};
pub use memory::MemoryStore;
pub(crate) use redis::{RedisBackend, RedisOptions};
pub(crate) use redlock::{DEFAULT_NODE_TIMEOUT, RedlockBackend};

/// The store keys of one lock: `<ns>:{<key>}` and its companions. The braces are a Redis
/// Cluster hash tag, so all of them live in one slot and one script may touch them together.
#[derive(Debug, Clone)]
pub(crate) struct KeyNames {
    /// The key as the caller gave it.
    pub(crate) key: String,
    pub(crate) record: String,
    pub(crate) fence: String,
    pub(crate) done: String,
    pub(crate) channel: String,
}

impl KeyNames {
    pub(crate) fn new(namespace: &str, key: &str) -> Self {
        let record = format!("{namespace}:{{{key}}}");
        KeyNames {
            key: key.to_owned(),
            fence: format!("{record}:fence"),
            done: format!("{record}:done"),
            channel: format!("{record}:released"),
            record,
        }
    }
}

/// What an acquire attempt found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AcquireOutcome {
    /// The lock is ours, with this fence.
    Acquired { fence: u64 },
    /// Someone else holds it; it expires in `pttl` unless renewed (None: no expiry known).
    Held { pttl: Option<Duration> },
    /// A done marker (`once`) says the work already ran; it expires in `pttl`.
    Done { pttl: Option<Duration> },
}

/// What a release did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReleaseOutcome {
    /// The record is gone and waiters were told.
    Released,
    /// The record stays until its min_hold has passed, then expires.
    KeptForMinHold,
    /// The record was not ours any more: expired, or another owner holds it.
    NotOwner,
}

/// What a renewal found for one lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Renewal {
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
pub(crate) struct ExtendItem {
    pub(crate) record: String,
    pub(crate) token: String,
    pub(crate) ttl: Duration,
}

/// A lock record as `inspect` reports it, before the runtime turns it into `LockInfo`.
#[derive(Debug, Clone)]
pub(crate) struct RecordView {
    pub(crate) owner: String,
    pub(crate) fence: u64,
    pub(crate) remaining: Option<Duration>,
    pub(crate) held_for: Duration,
}

/// The store of one runtime. Held behind an `Arc`, so the size difference between variants
/// costs nothing per call.
#[derive(Debug)]
#[allow(clippy::large_enum_variant)]
pub(crate) enum Backend {
    Redis(RedisBackend),
    Redlock(RedlockBackend),
    Memory(MemoryStore),
}

impl Backend {
    pub(crate) async fn acquire(
        &self,
        names: &KeyNames,
        token: &str,
        owner: &str,
        ttl: Duration,
        min_hold: Duration,
        once: bool,
    ) -> Result<AcquireOutcome, LockError> {
        match self {
            Backend::Redis(r) => r.acquire(names, token, owner, ttl, min_hold, once).await,
            Backend::Redlock(r) => r.acquire(names, token, owner, ttl, min_hold, once).await,
            Backend::Memory(m) => Ok(m.acquire(names, token, owner, ttl, min_hold, once)),
        }
    }

    pub(crate) async fn release(
        &self,
        names: &KeyNames,
        token: &str,
        done_retention: Option<Duration>,
    ) -> Result<ReleaseOutcome, LockError> {
        match self {
            Backend::Redis(r) => r.release(names, token, done_retention).await,
            Backend::Redlock(r) => r.release(names, token, done_retention).await,
            Backend::Memory(m) => Ok(m.release(names, token, done_retention)),
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
            Backend::Redis(r) => r.extend(items).await,
            Backend::Redlock(r) => Ok(r
                .extend(items)
                .await?
                .into_iter()
                .map(Renewal::from)
                .collect()),
            Backend::Memory(m) => Ok(m.extend(items).into_iter().map(Renewal::from).collect()),
        }
    }

    pub(crate) async fn inspect(&self, names: &KeyNames) -> Result<Option<RecordView>, LockError> {
        match self {
            Backend::Redis(r) => r.inspect(names).await,
            Backend::Redlock(r) => r.inspect(names).await,
            Backend::Memory(m) => Ok(m.inspect(names)),
        }
    }

    /// Starts watching a lock's release channel. Resolves once the subscription is live, so a
    /// release published after this returns is never missed.
    pub(crate) async fn watch_releases(&self, names: &KeyNames) -> Result<ReleaseWatch, LockError> {
        match self {
            Backend::Redis(r) => r.watch_releases(names).await,
            Backend::Redlock(r) => r.watch_releases(names).await,
            Backend::Memory(m) => Ok(m.watch_releases(names)),
        }
    }
}

/// Shared handle to a store.
pub(crate) type SharedBackend = Arc<Backend>;
