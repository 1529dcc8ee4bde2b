//! The values the runtime and a store exchange.

use std::time::Duration;

use super::QuorumView;

/// The names of one lock in a store: `<ns>:{<key>}` and its companions. The braces are a Redis
/// Cluster hash tag, so all of them live in one slot and one script may touch them together.
/// Other stores may use them as they are, or only [`record`](Self::record) (unique per
/// namespace and key) and derive their own.
///
/// Cloning is cheap (the names are built once per request and shared by the lease, its
/// releases and its renewals), and so is building them: the record (which holds the key) is
/// written at once, the companions only when first asked for.
#[derive(Debug, Clone)]
pub struct KeyNames(std::sync::Arc<Names>);

/// The names themselves, behind [`KeyNames`]' shared pointer.
#[derive(Debug)]
struct Names {
    /// `<ns>:{<key>}`.
    record: String,
    /// Where the key starts in `record` (it ends one byte before the record does).
    key_at: usize,
    fence: std::sync::OnceLock<String>,
    done: std::sync::OnceLock<String>,
    channel: std::sync::OnceLock<String>,
}

impl KeyNames {
    /// The names of `key` in `namespace`.
    pub fn new(namespace: &str, key: &str) -> Self {
        let mut record = String::with_capacity(namespace.len() + key.len() + 3);
        record.push_str(namespace);
        record.push_str(":{");
        record.push_str(key);
        record.push('}');
        KeyNames(std::sync::Arc::new(Names {
            record,
            key_at: namespace.len() + 2,
            fence: std::sync::OnceLock::new(),
            done: std::sync::OnceLock::new(),
            channel: std::sync::OnceLock::new(),
        }))
    }

    /// The key as the caller gave it.
    pub fn key(&self) -> &str {
        let record = &self.0.record;
        // Both ends are ASCII bytes placed by `new`, so the range is on char boundaries.
        record
            .get(self.0.key_at..record.len() - 1)
            .unwrap_or_default()
    }

    /// The lock record: `<ns>:{<key>}`.
    pub fn record(&self) -> &str {
        &self.0.record
    }

    /// The fence counter: `<ns>:{<key>}:fence`.
    pub fn fence(&self) -> &str {
        self.companion(&self.0.fence, ":fence")
    }

    /// The `once` marker: `<ns>:{<key>}:done`.
    pub fn done(&self) -> &str {
        self.companion(&self.0.done, ":done")
    }

    /// The channel releases are announced on: `<ns>:{<key>}:released`.
    pub fn channel(&self) -> &str {
        self.companion(&self.0.channel, ":released")
    }

    fn companion<'a>(&'a self, slot: &'a std::sync::OnceLock<String>, suffix: &str) -> &'a str {
        slot.get_or_init(|| format!("{}{suffix}", self.0.record))
    }
}

#[cfg(test)]
mod names_tests {
    use super::KeyNames;

    /// Every name, from a namespace and a key with braces, colons and non-ASCII text.
    #[test]
    fn names_are_the_record_and_its_companions() {
        for (ns, key) in [("lock", "job"), ("a:b", "{x}:y"), ("", "ünï"), ("n", "")] {
            let names = KeyNames::new(ns, key);
            let record = format!("{ns}:{{{key}}}");
            assert_eq!(names.key(), key);
            assert_eq!(names.record(), record);
            assert_eq!(names.fence(), format!("{record}:fence"));
            assert_eq!(names.done(), format!("{record}:done"));
            assert_eq!(names.channel(), format!("{record}:released"));
            let copy = names.clone();
            assert_eq!(copy.fence(), names.fence());
        }
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
    /// The lock is ours, and no fence was computed yet: the runtime asks
    /// [`LockStore::fence`](crate::store::LockStore::fence) for one the first time the holder wants
    /// it ([`Lease::fence`](crate::Lease::fence)). For a store whose fence costs more than the
    /// acquire itself; a store that answers this must implement `LockStore::fence`.
    AcquiredUnfenced,
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
    /// The holder's fence; None when none was issued to this holder (a store that fences
    /// on demand, before the holder asked).
    pub fence: Option<u64>,
    /// An opaque id of this holding: the same on every read while one acquisition holds the
    /// lock, another for the next acquisition (even by the same owner), and of no use for
    /// acting as the holder. [`LockStore::force_release_holder`](crate::store::LockStore::force_release_holder)
    /// takes it. [`RecordView::new`] derives it from the fence (`f<fence>`), which names one
    /// holding already; a store whose holders may have no fence yet sets its own with
    /// [`RecordView::with_holder`].
    pub holder: String,
    /// How long until the record expires unless renewed (None: no expiry known).
    pub remaining: Option<Duration>,
    /// How long since it was acquired, on the store's clock; None when the store does not
    /// keep when a holding began.
    pub held_for: Option<Duration>,
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
            fence: Some(fence),
            holder: fence_holder(fence),
            remaining,
            held_for: Some(held_for),
            quorum: None,
        }
    }

    /// A record held by `owner` as the holding `holder` (see [`RecordView::holder`]) with no
    /// fence issued yet, expiring in `remaining` (None: no expiry known), acquired `held_for`
    /// ago (None: not known).
    pub fn unfenced(
        owner: impl Into<String>,
        holder: impl Into<String>,
        remaining: Option<Duration>,
        held_for: Option<Duration>,
    ) -> Self {
        RecordView {
            owner: owner.into(),
            fence: None,
            holder: holder.into(),
            remaining,
            held_for,
            quorum: None,
        }
    }

    /// The same record with `holder` as its holder id (see [`RecordView::holder`]).
    pub fn with_holder(mut self, holder: impl Into<String>) -> Self {
        self.holder = holder.into();
        self
    }
}

/// The holder id [`RecordView::new`] gives a holding with `fence`.
pub(crate) fn fence_holder(fence: u64) -> String {
    format!("f{fence}")
}

/// The fence a holder id of [`fence_holder`]'s form names; None for any other id.
pub(crate) fn holder_fence(holder: &str) -> Option<u64> {
    let digits = holder.strip_prefix('f')?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fence_holder_ids_give_back_their_fence_and_nothing_else_does() {
        assert_eq!(holder_fence(&fence_holder(42)), Some(42));
        assert_eq!(holder_fence(&fence_holder(u64::MAX)), Some(u64::MAX));
        for other in [
            "42",
            "f",
            "f-1",
            "f+1",
            "f 1",
            "f1x",
            "g1",
            "f18446744073709551616",
        ] {
            assert_eq!(holder_fence(other), None, "{other}");
        }
    }
}
