//! A store plugged in through [`LockStore`]: the trait made object safe, and every call
//! bounded by the runtime's command timeout.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use super::listing::LIST_TIMEOUT;
use super::{
    AcquireOutcome, AcquireRequest, ExtendItem, KeyNames, LockStore, RecordView, ReleaseOutcome,
    ReleaseWatch, Renewal,
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
    fn raise_fence<'a>(
        &'a self,
        names: &'a KeyNames,
        token: &'a str,
        fence: u64,
        ttl: Duration,
    ) -> StoreFuture<'a, bool>;
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
    fn raise_fence<'a>(
        &'a self,
        names: &'a KeyNames,
        token: &'a str,
        fence: u64,
        ttl: Duration,
    ) -> StoreFuture<'a, bool> {
        Box::pin(LockStore::raise_fence(self, names, token, fence, ttl))
    }
}

/// A store plugged in through [`LockStore`], each call bounded by the command timeout.
pub(crate) struct CustomStore {
    store: Box<dyn DynStore>,
    timeout: Duration,
}

impl CustomStore {
    pub(crate) fn new(store: impl LockStore) -> Self {
        CustomStore {
            store: Box::new(store),
            timeout: crate::config::DEFAULT_CONNECT_TIMEOUT,
        }
    }

    /// Bounds every call by `timeout` (the builder's command timeout).
    pub(crate) fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    async fn bounded<T>(
        &self,
        what: &str,
        limit: Duration,
        call: StoreFuture<'_, T>,
    ) -> Result<T, LockError> {
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
        self.bounded("an acquire", self.timeout, call).await
    }

    pub(crate) async fn release(
        &self,
        names: &KeyNames,
        token: &str,
        done_retention: Option<Duration>,
    ) -> Result<ReleaseOutcome, LockError> {
        let call = self.store.release(names, token, done_retention);
        self.bounded("a release", self.timeout, call).await
    }

    pub(crate) async fn extend(&self, items: &[ExtendItem]) -> Result<Vec<Renewal>, LockError> {
        let call = self.store.extend(items);
        self.bounded("a renewal", self.timeout, call).await
    }

    pub(crate) async fn inspect(&self, names: &KeyNames) -> Result<Option<RecordView>, LockError> {
        let call = self.store.inspect(names);
        self.bounded("an inspect", self.timeout, call).await
    }

    pub(crate) async fn watch_releases(&self, names: &KeyNames) -> Result<ReleaseWatch, LockError> {
        let call = self.store.watch_releases(names);
        self.bounded("a watch", self.timeout, call).await
    }

    /// A listing scans the store: it gets a minute rather than one command's time.
    pub(crate) async fn list(
        &self,
        namespace: &str,
        pattern: &str,
    ) -> Result<Vec<(String, RecordView)>, LockError> {
        let call = self.store.list(namespace, pattern);
        let limit = self.timeout.max(LIST_TIMEOUT);
        self.bounded("a listing", limit, call).await
    }

    pub(crate) async fn force_release(
        &self,
        names: &KeyNames,
        fence: u64,
    ) -> Result<bool, LockError> {
        let call = self.store.force_release(names, fence);
        self.bounded("a forced release", self.timeout, call).await
    }
}

impl std::fmt::Debug for CustomStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CustomStore")
    }
}
