//! The contract every store keeps.

use std::future::Future;
use std::time::Duration;

use super::{
    AcquireOutcome, AcquireRequest, ExtendItem, KeyNames, RecordView, ReleaseOutcome, ReleaseWatch,
    Renewal, Retention,
};
use crate::LockError;

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
/// A store in this process's memory (what [`MemoryStore`](super::MemoryStore) does, in
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
    /// frees the lock after this returns must wake it (a [`ReleaseHub`](super::ReleaseHub)
    /// does the fan-out). A store whose subscription broke and came back must wake every
    /// watch ([`ReleaseHub::notify_all`](super::ReleaseHub::notify_all)), since releases may
    /// have passed meanwhile. A watch may also wake without a release; the runtime then just
    /// tries again, and without any wake it still retries when the holder's ttl runs out.
    fn watch_releases(
        &self,
        names: &KeyNames,
    ) -> impl Future<Output = Result<ReleaseWatch, LockError>> + Send;

    /// For operators (`LockRuntime::list`, lockctl): every live record of `namespace` whose
    /// key matches `pattern` ([`key_matches`](super::key_matches): `*` any run of characters,
    /// `?` one), with its key (without namespace), in any order. Records kept for min_hold
    /// count as live; done markers are not records. Not on any hot path: a scan is fine.
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

    /// For operators: as [`force_release`](Self::force_release), conditional on the holding
    /// instead, by the [`RecordView::holder`] id `inspect` or `list` showed. The default
    /// accepts the ids [`RecordView::new`] derives from a fence and calls `force_release`
    /// with that fence, and refuses any other id with a configuration error: a store that
    /// sets its own ids with [`RecordView::with_holder`] implements this too.
    fn force_release_holder(
        &self,
        names: &KeyNames,
        holder: &str,
    ) -> impl Future<Output = Result<bool, LockError>> + Send {
        let fence = super::types::holder_fence(holder).ok_or_else(|| {
            LockError::config(format!(
                "`{holder}` is no holder id this store gives (it names holders `f<fence>`)"
            ))
        });
        async move { self.force_release(names, fence?).await }
    }

    /// The fence of a lease acquired as [`AcquireOutcome::AcquiredUnfenced`], computed now:
    /// only if the record still carries `token` (then `Some`, greater than every fence this
    /// lock had before, and every later holder's fence is greater than it), else `None` (the
    /// lease is no longer this holder's; the runtime reports it lost). `ttl` is the lease's
    /// length, for how long the store keeps what makes later fences greater. Asked again only
    /// when an earlier call for the lease failed, timed out or was cancelled (so a repeat
    /// must be harmless). The default refuses: a store that always answers
    /// [`AcquireOutcome::Acquired`] never gets this call.
    ///
    /// Such a store's [`RecordView`] says `fence: None` for a holder that has not asked yet,
    /// names its holders by ids of its own ([`RecordView::unfenced`],
    /// [`RecordView::with_holder`]) and implements
    /// [`force_release_holder`](Self::force_release_holder) for them.
    fn fence(
        &self,
        names: &KeyNames,
        token: &str,
        ttl: Duration,
    ) -> impl Future<Output = Result<Option<u64>, LockError>> + Send {
        let _ = (names, token, ttl);
        async {
            Err(LockError::config(
                "this store answered AcquiredUnfenced but does not implement LockStore::fence",
            ))
        }
    }

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

    /// Appends `entry` (one run, as text) to the journal of `job` in `namespace`, then drops
    /// what `keep` no longer allows: runs older than `keep.max_age` (since their append),
    /// and beyond the newest `keep.max_runs`. Nothing of a journal may outlive
    /// `keep.max_age` after its last append. The entry is opaque to the store. The default
    /// declines with [`LockError::Unsupported`]: the scheduler then logs and counts each run
    /// it could not journal, and runs its jobs as before.
    fn append_run(
        &self,
        namespace: &str,
        job: &str,
        entry: &str,
        keep: &Retention,
    ) -> impl Future<Output = Result<(), LockError>> + Send {
        let _ = (namespace, job, entry, keep);
        async { Err(no_history()) }
    }

    /// The newest `limit` entries of the journal of `job` in `namespace`, newest (last
    /// appended) first; none for a job with no journal.
    fn runs(
        &self,
        namespace: &str,
        job: &str,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<String>, LockError>> + Send {
        let _ = (namespace, job, limit);
        async { Err(no_history()) }
    }

    /// The jobs of `namespace` that have a journal, in any order. Not on any hot path: a scan
    /// is fine.
    fn journalled_jobs(
        &self,
        namespace: &str,
    ) -> impl Future<Output = Result<Vec<String>, LockError>> + Send {
        let _ = namespace;
        async { Err(no_history()) }
    }
}

fn no_history() -> LockError {
    LockError::Unsupported(
        "this store keeps no run history (it does not implement LockStore::append_run)".to_owned(),
    )
}
