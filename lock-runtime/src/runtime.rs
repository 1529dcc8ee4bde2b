//! `LockRuntime`: the configured handle, process-global or task-scoped.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError, Weak};
use std::time::Duration;

use crate::builder::LockRuntimeBuilder;
use crate::config::check_name;
use crate::store::{KeyNames, ReleaseWatch, SharedBackend};
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
/// assert_eq!(runtime.inspect("interest-posting").await?.map(|i| i.fence), Some(1));
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
    shut_down: AtomicBool,
    /// Maps a lock key to its metrics label (`metrics_key_label`); identity by default.
    pub(crate) metrics_label: Option<MetricsLabel>,
    /// Per-key FIFO queues of this runtime's waiting tasks (see `LockRequest::acquire`).
    wait_queues: Mutex<HashMap<String, Weak<WaitQueue>>>,
}

impl RuntimeInner {
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
    /// Starts configuring a runtime. See [`LockRuntimeBuilder`].
    pub fn builder() -> LockRuntimeBuilder {
        LockRuntimeBuilder::default()
    }

    pub(crate) fn from_parts(
        backend: SharedBackend,
        namespace: String,
        default_ttl: Duration,
        owner: String,
        command_timeout: Duration,
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
                shut_down: AtomicBool::new(false),
                wait_queues: Mutex::new(HashMap::new()),
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
        Ok(self.inner.backend.inspect(&names).await?.map(|r| LockInfo {
            key: key.to_owned(),
            owner: r.owner,
            fence: r.fence,
            remaining: r.remaining,
            held_for: r.held_for,
        }))
    }

    /// Releases every lease this runtime holds (each is reported lost to its holder first, so
    /// locked bodies with `on_lost = "abort"` stop) and stops the watchdog. Later lock requests
    /// fail with [`LockError::Shutdown`]. Calling it again does nothing.
    pub async fn shutdown(&self) {
        if self.inner.shut_down.swap(true, Ordering::AcqRel) {
            return;
        }
        self.inner.watchdog.shutdown().await;
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
