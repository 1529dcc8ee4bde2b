//! `LockRuntime`: the configured handle, process-global or task-scoped.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError, Weak};
use std::time::Duration;

use crate::config::check_name;
use crate::lease::{LeaseState, TaskIdentity};
use crate::store::{KeyNames, ReleaseWatch, SharedBackend};
use crate::token::TokenSource;
use crate::watchdog::WatchdogHandle;
use crate::{LockError, LockInfo, LockRequest};

static GLOBAL: OnceLock<LockRuntime> = OnceLock::new();
static NEXT_RUNTIME_ID: AtomicU64 = AtomicU64::new(1);

tokio::task_local! {
    static SCOPED: LockRuntime;
}

/// A configured lock runtime: a store connection, a namespace, an owner name and one watchdog
/// driver. Cheap to clone; all clones share everything.
///
/// Build it once at startup, then either [`install`](Self::install) it for the whole process
/// (what `#[distributed_lock]` uses) or pass it around and call [`lock`](Self::lock).
///
/// ```
/// use std::time::Duration;
/// use lock_runtime::{LockRuntime, MemoryStore};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), lock_runtime::LockError> {
/// let runtime = LockRuntime::builder()
///     .memory(MemoryStore::new())      // or .redis("redis://127.0.0.1:6379")
///     .namespace("billing")
///     .default_ttl(Duration::from_secs(60))
///     .build()
///     .await?;
/// let guard = runtime.lock("interest-posting").acquire().await?;
/// let fence = guard.lease().fence().await?;
/// // Asked before the read: a store that fences on demand (Redis) shows a fence only then.
/// let shown = runtime.inspect("interest-posting").await?.and_then(|i| i.fence);
/// assert_eq!(shown, Some(fence));
/// guard.release().await?;
/// runtime.shutdown().await;
/// # Ok(()) }
/// ```
///
/// The runtime's background tasks live on the tokio runtime that called `build()`: build it
/// on the runtime that will use it.
#[derive(Clone)]
pub struct LockRuntime {
    pub(crate) inner: Arc<RuntimeInner>,
}

impl std::fmt::Debug for LockRuntime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockRuntime")
            .field("namespace", &self.inner.namespace)
            .field("owner", &self.inner.owner)
            .field("store", &self.inner.backend)
            .finish_non_exhaustive()
    }
}

/// A function from lock key to metrics label.
pub(crate) type MetricsLabel = Arc<dyn Fn(&str) -> String + Send + Sync>;

/// The FIFO line of one key's waiting tasks in one runtime; the head holds the lock of it and
/// the release subscription lives inside, for as long as anyone waits.
pub(crate) type WaitQueue = tokio::sync::Mutex<Option<ReleaseWatch>>;

pub(crate) struct RuntimeInner {
    pub(crate) id: u64,
    pub(crate) backend: SharedBackend,
    pub(crate) namespace: String,
    pub(crate) default_ttl: Duration,
    pub(crate) owner: String,
    pub(crate) watchdog: WatchdogHandle,
    next_lease: AtomicU64,
    /// Where this runtime's lease tokens come from.
    tokens: TokenSource,
    shut_down: AtomicBool,
    /// Turns true when `shutdown` starts; waiters watch it.
    shutdown_signal: tokio::sync::watch::Sender<bool>,
    /// How long `shutdown` lets held leases finish (builder `shutdown_grace`).
    pub(crate) shutdown_grace: Duration,
    /// Maps a lock key to its metrics label (`metrics_key_label`); identity by default.
    pub(crate) metrics_label: Option<MetricsLabel>,
    /// Per-key FIFO queues of this runtime's waiting tasks (see `LockRequest::acquire`).
    wait_queues: Mutex<HashMap<String, Weak<WaitQueue>>>,
    /// The leases whose guards are alive, by record key: a task that waits for a lock it
    /// holds itself through a guard gets a warning in the log instead of a silent wait.
    guarded: Mutex<HashMap<RecordKey, Guarded>>,
}

impl RuntimeInner {
    /// A new lease token (see [`TokenSource`]).
    pub(crate) fn new_token(&self) -> Result<String, LockError> {
        self.tokens.next()
    }

    pub(crate) fn next_lease_id(&self) -> u64 {
        self.next_lease.fetch_add(1, Ordering::Relaxed)
    }

    /// The `key` label for metrics of `key`; empty (no allocation) without the feature.
    pub(crate) fn metric_label(&self, key: &str) -> String {
        if cfg!(feature = "metrics") {
            match &self.metrics_label {
                Some(f) => f(key),
                None => key.to_owned(),
            }
        } else {
            String::new()
        }
    }

    pub(crate) fn is_shut_down(&self) -> bool {
        self.shut_down.load(Ordering::Acquire)
    }

    /// Resolves once `shutdown` has started (at once if it already has).
    pub(crate) async fn shutting_down(&self) {
        let mut signal = self.shutdown_signal.subscribe();
        // The sender lives as long as `self`, so this only ends on `true`.
        let _ = signal.wait_for(|started| *started).await;
    }

    /// Notes that a guard for `lease` is alive.
    pub(crate) fn guard_opened(&self, lease: &Arc<LeaseState>) {
        let mut guarded = self.guarded.lock().unwrap_or_else(PoisonError::into_inner);
        match guarded.entry(RecordKey(lease.names.clone())) {
            Entry::Occupied(mut leases) => leases.get_mut().push(lease.clone()),
            Entry::Vacant(slot) => {
                slot.insert(Guarded::One(lease.clone()));
            }
        }
    }

    /// Notes that the guard of `lease` is gone.
    pub(crate) fn guard_closed(&self, lease: &LeaseState) {
        let mut guarded = self.guarded.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(leases) = guarded.get_mut(lease.names.record())
            && leases.remove(lease.id)
        {
            guarded.remove(lease.names.record());
        }
    }

    /// Whether a lease of `record` is still held through a guard acquired by the current task.
    pub(crate) fn held_by_this_task(&self, record: &str) -> bool {
        let task = TaskIdentity::current();
        let guarded = self.guarded.lock().unwrap_or_else(PoisonError::into_inner);
        guarded.get(record).is_some_and(|leases| {
            leases
                .all()
                .iter()
                .any(|l| l.holder_task == task && !l.is_ended() && !l.is_lost())
        })
    }

    /// The wait queue of `record`, shared by every task of this runtime waiting for it.
    pub(crate) fn wait_queue(&self, record: &str) -> Arc<WaitQueue> {
        let mut queues = self
            .wait_queues
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(queue) = queues.get(record).and_then(Weak::upgrade) {
            return queue;
        }
        // Forget queues nobody holds any more, amortised over insertions.
        if queues.len() >= 64 && queues.len().is_power_of_two() {
            queues.retain(|_, q| q.strong_count() > 0);
        }
        let queue = Arc::new(tokio::sync::Mutex::new(None));
        queues.insert(record.to_owned(), Arc::downgrade(&queue));
        queue
    }
}

impl LockRuntime {
    pub(crate) fn from_parts(
        backend: SharedBackend,
        namespace: String,
        default_ttl: Duration,
        owner: String,
        command_timeout: Duration,
        shutdown_grace: Duration,
        metrics_label: Option<MetricsLabel>,
    ) -> Self {
        let watchdog = WatchdogHandle::spawn(backend.clone(), command_timeout);
        LockRuntime {
            inner: Arc::new(RuntimeInner {
                id: NEXT_RUNTIME_ID.fetch_add(1, Ordering::Relaxed),
                backend,
                namespace,
                default_ttl,
                owner,
                watchdog,
                next_lease: AtomicU64::new(1),
                tokens: TokenSource::new(),
                shut_down: AtomicBool::new(false),
                shutdown_signal: tokio::sync::watch::Sender::new(false),
                shutdown_grace,
                wait_queues: Mutex::new(HashMap::new()),
                guarded: Mutex::new(HashMap::new()),
                metrics_label,
            }),
        }
    }

    /// Makes this runtime the process-wide one that `#[distributed_lock]` functions use.
    /// Fails with [`LockError::AlreadyConfigured`] if one is installed already.
    pub fn install(self) -> Result<(), LockError> {
        GLOBAL.set(self).map_err(|_| LockError::AlreadyConfigured)
    }

    /// The installed process-wide runtime, or [`LockError::NotConfigured`].
    pub fn global() -> Result<LockRuntime, LockError> {
        GLOBAL.get().cloned().ok_or(LockError::NotConfigured)
    }

    /// The runtime a locked call in this task uses: the one set by [`scope`](Self::scope) if
    /// any, else the installed one, else [`LockError::NotConfigured`].
    pub fn current() -> Result<LockRuntime, LockError> {
        SCOPED.try_with(Clone::clone).or_else(|_| Self::global())
    }

    /// Runs `fut` with this runtime as the current one for the task (task-local). Lets one
    /// process simulate several service instances, and lets tests avoid the process-global.
    pub fn scope<F: Future>(&self, fut: F) -> impl Future<Output = F::Output> + use<F> {
        SCOPED.scope(self.clone(), fut)
    }

    /// A request for the lock `key` (namespaced by this runtime). Nothing happens until it is
    /// acquired.
    pub fn lock(&self, key: impl Into<String>) -> LockRequest {
        LockRequest::new(self.clone(), key.into())
    }

    /// Reads the record of lock `key`: owner, fence, time left, time held. `Ok(None)` when the
    /// lock is free.
    pub async fn inspect(&self, key: &str) -> Result<Option<LockInfo>, LockError> {
        check_name("lock key", key)?;
        let names = KeyNames::new(&self.inner.namespace, key);
        Ok(self
            .inner
            .backend
            .inspect(&names)
            .await?
            .map(|r| LockInfo::from_record(key.to_owned(), r)))
    }

    /// The newest `limit` runs of the scheduled job `job` in this runtime's namespace, newest
    /// first (by scheduled instant, then by start), from its journal in the store: which
    /// instance ran each firing, when, how it ended. A journal keeps what the
    /// [`Scheduler`](crate::Scheduler)'s retention allows (by default 30 days, at most 1,000
    /// runs per job). A store that keeps no history (one plugged in without it) answers
    /// [`LockError::Unsupported`].
    pub async fn history(&self, job: &str, limit: usize) -> Result<Vec<crate::Run>, LockError> {
        let lines = self
            .inner
            .backend
            .runs(&self.inner.namespace, job, limit)
            .await?;
        let mut runs: Vec<crate::Run> = lines
            .iter()
            .filter_map(|line| crate::history::decode(line))
            .filter(|run| run.job == job)
            .collect();
        runs.sort_by_key(|r| std::cmp::Reverse((r.scheduled_at, r.started_at)));
        runs.truncate(limit);
        Ok(runs)
    }

    /// The scheduled jobs of this runtime's namespace that have a run journal, sorted.
    pub async fn journalled_jobs(&self) -> Result<Vec<String>, LockError> {
        self.inner
            .backend
            .journalled_jobs(&self.inner.namespace)
            .await
    }

    /// Every held lock of this runtime's namespace whose key matches `pattern` (`*` stands
    /// for any run of characters, `?` for one; `"*"` lists all), sorted by key: for operators
    /// and dashboards (`lockctl` is built on it). It walks the store (on Redis a `SCAN` of
    /// every master, never `KEYS`), so it is no hot-path call. On Redlock, a key held on fewer
    /// masters than a quorum is listed too, and [`LockInfo::quorum`] says how the masters see
    /// each lock.
    pub async fn list(&self, pattern: &str) -> Result<Vec<LockInfo>, LockError> {
        check_name("key pattern", pattern)?;
        let listed = self
            .inner
            .backend
            .list(&self.inner.namespace, pattern)
            .await?;
        Ok(listed
            .into_iter()
            .map(|(key, record)| LockInfo::from_record(key, record))
            .collect())
    }

    /// Frees lock `key` from its current holder, whatever its token, and wakes its waiters;
    /// `true` when there was a holder to remove. For an operator who knows the holder is gone
    /// (a host that crashed, whose lease would otherwise run out its whole ttl). A holder that
    /// is in fact still alive learns it at its next renewal (its lease is then lost), but until
    /// then it may work alongside the next holder: only fencing keeps the two apart. The
    /// `once` marker stays, and fences keep increasing.
    ///
    /// It reads the holding first (its [`LockInfo::holder`] id) and removes only that one, so
    /// a holder that came in meanwhile, or a call that the store applies twice, never evicts
    /// anyone else. To remove exactly the holder you saw (in [`list`](Self::list), say), use
    /// [`force_release_holder`](Self::force_release_holder).
    pub async fn force_release(&self, key: &str) -> Result<bool, LockError> {
        if let Some(holder) = self.inspect(key).await? {
            return self.force_release_holder(key, &holder.holder).await;
        }
        // No holder by `inspect`; on Redlock a record may still stand on fewer masters than a
        // quorum and keep the lock from a new quorum: the listing shows it, so clear that.
        let listed = self.list(key).await?;
        match listed.iter().find(|lock| lock.key == key) {
            Some(leftover) => self.force_release_holder(key, &leftover.holder).await,
            None => Ok(false),
        }
    }

    /// Frees lock `key` if it is still the holding `holder` names (a [`LockInfo::holder`] id,
    /// as [`inspect`](Self::inspect) or [`list`](Self::list) showed it), as
    /// [`force_release`](Self::force_release) does; `false` when the lock is free or held by
    /// another holding, even one of the same owner. An id the store does not give is a
    /// [`LockError::Config`].
    pub async fn force_release_holder(&self, key: &str, holder: &str) -> Result<bool, LockError> {
        check_name("lock key", key)?;
        let names = KeyNames::new(&self.inner.namespace, key);
        let removed = self
            .inner
            .backend
            .force_release_holder(&names, holder)
            .await?;
        if removed {
            tracing::warn!(
                key,
                holder,
                "lock released by force: its holder, if alive, loses it"
            );
        }
        Ok(removed)
    }

    /// Frees lock `key` if its holder's fence is `fence`, as
    /// [`force_release`](Self::force_release) does; `false` when the lock is free or held with
    /// another fence. On Redlock it also clears a record that fewer masters than a quorum
    /// still hold (which [`list`](Self::list) shows, and `inspect` does not call held).
    pub async fn force_release_fence(&self, key: &str, fence: u64) -> Result<bool, LockError> {
        check_name("lock key", key)?;
        let names = KeyNames::new(&self.inner.namespace, key);
        let removed = self.inner.backend.force_release(&names, fence).await?;
        if removed {
            tracing::warn!(
                key,
                fence,
                "lock released by force: its holder, if alive, loses it"
            );
        }
        Ok(removed)
    }

    /// Shuts the runtime down gracefully:
    ///
    /// 1. new lock requests fail with [`LockError::Shutdown`] at once, and so do tasks
    ///    waiting for a lock (a lock granted to a waiter at that moment is given back);
    /// 2. leases still held keep being renewed for up to the grace period
    ///    ([`shutdown_grace`](crate::LockRuntimeBuilder::shutdown_grace), 5 s by default), so
    ///    running jobs finish with their lock; each is released as its guard is released or
    ///    dropped;
    /// 3. when the grace period ends, what is still held is marked lost first (its
    ///    [`Lease::lost`](crate::Lease::lost) fires, `on_lost = "abort"` bodies stop) and
    ///    only then released, so a lock is never released while its holder still believes it
    ///    holds it.
    ///
    /// Returns once no lease is held any more and the watchdog has stopped. Calling it again
    /// (or from several tasks) waits for the same end.
    ///
    /// # Cancel safety
    /// Dropping the future does not stop the shutdown: it goes on in the background.
    pub async fn shutdown(&self) {
        if !self.inner.shut_down.swap(true, Ordering::AcqRel) {
            self.inner.shutdown_signal.send_replace(true);
            tracing::debug!(namespace = %self.inner.namespace, grace = ?self.inner.shutdown_grace, "lock runtime shutting down");
        }
        self.inner
            .watchdog
            .shutdown(self.inner.shutdown_grace)
            .await;
        tracing::debug!(namespace = %self.inner.namespace, "lock runtime shut down");
    }

    /// The namespace every key of this runtime is prefixed with.
    pub fn namespace(&self) -> &str {
        &self.inner.namespace
    }

    /// The owner name written into the records of locks this runtime takes.
    pub fn owner(&self) -> &str {
        &self.inner.owner
    }

    /// The ttl used when a request gives none.
    pub fn default_ttl(&self) -> Duration {
        self.inner.default_ttl
    }
}

/// The leases of one record whose guards are alive: one, unless a guard outlives its lease
/// (lost or expired) while another of the runtime's tasks holds the lock anew. The one is
/// kept without a vector of its own.
enum Guarded {
    One(Arc<LeaseState>),
    Many(Vec<Arc<LeaseState>>),
}

impl Guarded {
    fn push(&mut self, lease: Arc<LeaseState>) {
        match self {
            Guarded::One(first) => *self = Guarded::Many(vec![first.clone(), lease]),
            Guarded::Many(leases) => leases.push(lease),
        }
    }

    /// Forgets lease `id`; true when none is left.
    fn remove(&mut self, id: u64) -> bool {
        match self {
            Guarded::One(lease) => lease.id == id,
            Guarded::Many(leases) => {
                leases.retain(|l| l.id != id);
                leases.is_empty()
            }
        }
    }

    fn all(&self) -> &[Arc<LeaseState>] {
        match self {
            Guarded::One(lease) => std::slice::from_ref(lease),
            Guarded::Many(leases) => leases,
        }
    }
}

/// A lock's names as a map key, compared and hashed by their record (so a `&str` finds it),
/// shared with the lease rather than copied.
#[derive(Debug, Clone)]
struct RecordKey(crate::store::KeyNames);

impl PartialEq for RecordKey {
    fn eq(&self, other: &Self) -> bool {
        self.0.record() == other.0.record()
    }
}

impl Eq for RecordKey {}

impl std::hash::Hash for RecordKey {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.0.record().hash(state);
    }
}

impl std::borrow::Borrow<str> for RecordKey {
    fn borrow(&self) -> &str {
        self.0.record()
    }
}
