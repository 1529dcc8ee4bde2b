//! The values the runtime and a store exchange.

use std::time::Duration;

use super::QuorumView;

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

/// One acquire, as the runtime asks a [`LockStore`](super::LockStore) for it.
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

/// How much of a job's run journal a store keeps: runs younger than `max_age`, and of those
/// the newest `max_runs`. Both bounds hold after every append.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Retention {
    /// Runs older than this (since their append) are dropped; a journal with no append for
    /// this long goes altogether.
    pub max_age: Duration,
    /// At most this many runs per job are kept, the newest.
    pub max_runs: usize,
}

impl Retention {
    /// The longest age a journal keeps: ten years (every store can express it).
    pub const MAX_AGE: Duration = Duration::from_secs(10 * 365 * 86_400);

    /// Keep runs for `max_age` (between 1 s and [`MAX_AGE`](Self::MAX_AGE), clamped), at
    /// most `max_runs` per job (at least 1).
    pub fn new(max_age: Duration, max_runs: usize) -> Self {
        Retention {
            max_age: max_age.clamp(Duration::from_secs(1), Self::MAX_AGE),
            max_runs: max_runs.max(1),
        }
    }
}
