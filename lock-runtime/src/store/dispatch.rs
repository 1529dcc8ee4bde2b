//! The one route from the runtime to its store: [`LockStore`] made object safe, and the
//! bounding of calls by the command timeout.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use super::listing::LIST_TIMEOUT;
use super::{
    AcquireOutcome, AcquireRequest, ExtendItem, KeyNames, LockStore, RecordView, ReleaseOutcome,
    ReleaseWatch, Renewal, Retention, key_matches,
};
use crate::LockError;

pub(crate) type StoreFuture<'a, T> =
    Pin<Box<dyn Future<Output = Result<T, LockError>> + Send + 'a>>;

/// [`LockStore`] made object safe, so the runtime can hold any store behind one pointer.
pub(crate) trait DynStore: Send + Sync {
    fn acquire<'a>(&'a self, request: AcquireRequest<'a>) -> StoreFuture<'a, AcquireOutcome>;
    fn release<'a>(
        &'a self,
        names: &'a KeyNames,
        token: &'a str,
        done_retention: Option<Duration>,
    ) -> StoreFuture<'a, ReleaseOutcome>;
    fn extend<'a>(&'a self, items: &'a [ExtendItem]) -> StoreFuture<'a, Vec<Renewal>>;
    fn inspect<'a>(&'a self, names: &'a KeyNames) -> StoreFuture<'a, Option<RecordView>>;
    fn watch_releases<'a>(&'a self, names: &'a KeyNames) -> StoreFuture<'a, ReleaseWatch>;
    fn list<'a>(
        &'a self,
        namespace: &'a str,
        pattern: &'a str,
    ) -> StoreFuture<'a, Vec<(String, RecordView)>>;
    fn force_release<'a>(&'a self, names: &'a KeyNames, fence: u64) -> StoreFuture<'a, bool>;
    fn force_release_holder<'a>(
        &'a self,
        names: &'a KeyNames,
        holder: &'a str,
    ) -> StoreFuture<'a, bool>;
    fn fence<'a>(
        &'a self,
        names: &'a KeyNames,
        token: &'a str,
        ttl: Duration,
    ) -> StoreFuture<'a, Option<u64>>;
    fn raise_fence<'a>(
        &'a self,
        names: &'a KeyNames,
        token: &'a str,
        fence: u64,
        ttl: Duration,
    ) -> StoreFuture<'a, bool>;
    fn append_run<'a>(
        &'a self,
        namespace: &'a str,
        job: &'a str,
        entry: &'a str,
        keep: &'a Retention,
    ) -> StoreFuture<'a, ()>;
    fn runs<'a>(
        &'a self,
        namespace: &'a str,
        job: &'a str,
        limit: usize,
    ) -> StoreFuture<'a, Vec<String>>;
    fn journalled_jobs<'a>(&'a self, namespace: &'a str) -> StoreFuture<'a, Vec<String>>;
}

impl<S: LockStore> DynStore for S {
    fn acquire<'a>(&'a self, request: AcquireRequest<'a>) -> StoreFuture<'a, AcquireOutcome> {
        Box::pin(LockStore::acquire(self, request))
    }
    fn release<'a>(
        &'a self,
        names: &'a KeyNames,
        token: &'a str,
        done_retention: Option<Duration>,
    ) -> StoreFuture<'a, ReleaseOutcome> {
        Box::pin(LockStore::release(self, names, token, done_retention))
    }
    fn extend<'a>(&'a self, items: &'a [ExtendItem]) -> StoreFuture<'a, Vec<Renewal>> {
        Box::pin(LockStore::extend(self, items))
    }
    fn inspect<'a>(&'a self, names: &'a KeyNames) -> StoreFuture<'a, Option<RecordView>> {
        Box::pin(LockStore::inspect(self, names))
    }
    fn watch_releases<'a>(&'a self, names: &'a KeyNames) -> StoreFuture<'a, ReleaseWatch> {
        Box::pin(LockStore::watch_releases(self, names))
    }
    fn list<'a>(
        &'a self,
        namespace: &'a str,
        pattern: &'a str,
    ) -> StoreFuture<'a, Vec<(String, RecordView)>> {
        Box::pin(LockStore::list(self, namespace, pattern))
    }
    fn force_release<'a>(&'a self, names: &'a KeyNames, fence: u64) -> StoreFuture<'a, bool> {
        Box::pin(LockStore::force_release(self, names, fence))
    }
    fn force_release_holder<'a>(
        &'a self,
        names: &'a KeyNames,
        holder: &'a str,
    ) -> StoreFuture<'a, bool> {
        Box::pin(LockStore::force_release_holder(self, names, holder))
    }
    fn fence<'a>(
        &'a self,
        names: &'a KeyNames,
        token: &'a str,
        ttl: Duration,
    ) -> StoreFuture<'a, Option<u64>> {
        Box::pin(LockStore::fence(self, names, token, ttl))
    }
    fn raise_fence<'a>(
        &'a self,
        names: &'a KeyNames,
        token: &'a str,
        fence: u64,
        ttl: Duration,
    ) -> StoreFuture<'a, bool> {
        Box::pin(LockStore::raise_fence(self, names, token, fence, ttl))
    }
    fn append_run<'a>(
        &'a self,
        namespace: &'a str,
        job: &'a str,
        entry: &'a str,
        keep: &'a Retention,
    ) -> StoreFuture<'a, ()> {
        Box::pin(LockStore::append_run(self, namespace, job, entry, keep))
    }
    fn runs<'a>(
        &'a self,
        namespace: &'a str,
        job: &'a str,
        limit: usize,
    ) -> StoreFuture<'a, Vec<String>> {
        Box::pin(LockStore::runs(self, namespace, job, limit))
    }
    fn journalled_jobs<'a>(&'a self, namespace: &'a str) -> StoreFuture<'a, Vec<String>> {
        Box::pin(LockStore::journalled_jobs(self, namespace))
    }
}

/// The store of one runtime, the one route every call takes: any store, built-in or plugged
/// in, behind [`DynStore`]. `lock-bench --macro-overhead` measured this against the enum it
/// replaced (which called the built-in stores without a boxed future): docs/benchmarks.md.
pub(crate) struct Backend {
    store: Arc<dyn DynStore>,
    /// Every call is cut off after this, and counts as transient: the command timeout for
    /// PostgreSQL, etcd and any plugged-in store. `None` for Redis, Redlock and the memory
    /// store, each of whose round trips is already bounded (Redis' response timeout, a quorum
    /// member's node timeout): an outer cut would change what they answer (a Cluster renewal
    /// answers shard by shard; a replicated acquire waits its own timeout).
    bound: Option<Duration>,
    /// The store, for `Debug` (credentials masked); none for a plugged-in one, shown as
    /// `store(..)`.
    shown: Option<Arc<dyn std::fmt::Debug + Send + Sync>>,
}

/// Shared handle to a store.
pub(crate) type SharedBackend = Arc<Backend>;

impl Backend {
    /// A built-in store, which bounds its own calls.
    pub(crate) fn new(store: impl LockStore + std::fmt::Debug) -> Self {
        Self::built_in(store, None)
    }

    /// A built-in store (PostgreSQL, etcd, ZooKeeper) each of whose calls the runtime cuts off
    /// after `timeout`, the command timeout.
    #[cfg(any(feature = "postgres", feature = "etcd", feature = "zookeeper"))]
    pub(crate) fn bounded(store: impl LockStore + std::fmt::Debug, timeout: Duration) -> Self {
        Self::built_in(store, Some(timeout))
    }

    fn built_in(store: impl LockStore + std::fmt::Debug, bound: Option<Duration>) -> Self {
        let store = Arc::new(store);
        Backend {
            store: store.clone(),
            bound,
            shown: Some(store),
        }
    }

    /// `store`, each of whose calls the runtime cuts off after `bound` (the builder's command
    /// timeout for any store that is not built in) unless `None`.
    pub(crate) fn from_dyn(store: Box<dyn DynStore>, bound: Option<Duration>) -> Self {
        Backend {
            store: Arc::from(store),
            bound,
            shown: None,
        }
    }

    async fn within<T>(
        &self,
        what: &str,
        limit: Option<Duration>,
        call: StoreFuture<'_, T>,
    ) -> Result<T, LockError> {
        let Some(limit) = limit else {
            return call.await;
        };
        match tokio::time::timeout(limit, call).await {
            Ok(answer) => answer,
            Err(_) => Err(crate::BackendError::transient(format!(
                "the store did not answer {what} within {limit:?}"
            ))
            .into()),
        }
    }

    pub(crate) async fn acquire(
        &self,
        request: AcquireRequest<'_>,
    ) -> Result<AcquireOutcome, LockError> {
        let call = self.store.acquire(request);
        self.within("an acquire", self.bound, call).await
    }

    pub(crate) async fn release(
        &self,
        names: &KeyNames,
        token: &str,
        done_retention: Option<Duration>,
    ) -> Result<ReleaseOutcome, LockError> {
        let call = self.store.release(names, token, done_retention);
        self.within("a release", self.bound, call).await
    }

    /// Writes the done marker of `names` for `retention`, touching no lock record: a release
    /// with a token no lease has (tokens are 32 hex digits) writes the marker and finds the
    /// record "not ours".
    pub(crate) async fn mark_done(
        &self,
        names: &KeyNames,
        retention: Duration,
    ) -> Result<(), LockError> {
        self.release(names, "", Some(retention)).await.map(|_| ())
    }

    /// The fence of a lease acquired without one (see [`LockStore::fence`]).
    pub(crate) async fn fence(
        &self,
        names: &KeyNames,
        token: &str,
        ttl: Duration,
    ) -> Result<Option<u64>, LockError> {
        let call = self.store.fence(names, token, ttl);
        self.within("a fence request", self.bound, call).await
    }

    /// Renews every item; one answer per item, in order. `Err` only when no item could be
    /// answered at all; otherwise a part of the store that failed (one Cluster shard) costs
    /// only its own items, which answer [`Renewal::Unknown`].
    pub(crate) async fn extend(&self, items: &[ExtendItem]) -> Result<Vec<Renewal>, LockError> {
        let call = self.store.extend(items);
        self.within("a renewal", self.bound, call).await
    }

    pub(crate) async fn inspect(&self, names: &KeyNames) -> Result<Option<RecordView>, LockError> {
        let call = self.store.inspect(names);
        self.within("an inspect", self.bound, call).await
    }

    /// Starts watching a lock's release channel. Resolves once the subscription is live, so a
    /// release published after this returns is never missed.
    pub(crate) async fn watch_releases(&self, names: &KeyNames) -> Result<ReleaseWatch, LockError> {
        let call = self.store.watch_releases(names);
        self.within("a watch", self.bound, call).await
    }

    /// The live records of `namespace` whose key matches `pattern`, sorted by key. A listing
    /// scans the store: it gets a minute rather than one command's time.
    pub(crate) async fn list(
        &self,
        namespace: &str,
        pattern: &str,
    ) -> Result<Vec<(String, RecordView)>, LockError> {
        let call = self.store.list(namespace, pattern);
        let limit = self.bound.map(|bound| bound.max(LIST_TIMEOUT));
        let mut listed = self.within("a listing", limit, call).await?;
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
        let call = self.store.force_release(names, fence);
        self.within("a forced release", self.bound, call).await
    }

    /// Removes the lock's record if it is the holding `holder` names, waking its waiters.
    pub(crate) async fn force_release_holder(
        &self,
        names: &KeyNames,
        holder: &str,
    ) -> Result<bool, LockError> {
        let call = self.store.force_release_holder(names, holder);
        self.within("a forced release", self.bound, call).await
    }

    /// Appends one run to the journal of `job`, trimmed to `keep`.
    pub(crate) async fn append_run(
        &self,
        namespace: &str,
        job: &str,
        entry: &str,
        keep: &Retention,
    ) -> Result<(), LockError> {
        let call = self.store.append_run(namespace, job, entry, keep);
        self.within("a journal append", self.bound, call).await
    }

    /// The newest `limit` runs of `job` (a quorum: of each member), newest first.
    pub(crate) async fn runs(
        &self,
        namespace: &str,
        job: &str,
        limit: usize,
    ) -> Result<Vec<String>, LockError> {
        let call = self.store.runs(namespace, job, limit);
        let limit_time = self.bound.map(|bound| bound.max(LIST_TIMEOUT));
        // Not cut to `limit` here: a Redlock read joins the masters' answers unsorted, and
        // `LockRuntime::history` sorts before it cuts.
        self.within("a journal read", limit_time, call).await
    }

    /// The jobs with a journal, sorted.
    pub(crate) async fn journalled_jobs(&self, namespace: &str) -> Result<Vec<String>, LockError> {
        let call = self.store.journalled_jobs(namespace);
        let limit = self.bound.map(|bound| bound.max(LIST_TIMEOUT));
        let mut jobs = self.within("a listing of journals", limit, call).await?;
        jobs.sort();
        jobs.dedup();
        Ok(jobs)
    }
}

impl std::fmt::Debug for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut shown = f.debug_struct("Backend");
        match &self.shown {
            Some(store) => shown.field("store", store),
            None => shown.field("store", &format_args!("store(..)")),
        };
        shown.field("bound", &self.bound).finish()
    }
}
