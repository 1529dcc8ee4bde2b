//! The built-in Redis stores through [`LockStore`], the one interface the runtime calls.
//!
//! `Backend` still matches on the built-in stores, so each call is a direct (inlinable) call
//! of these methods rather than a boxed future; the trait is the contract they all keep.

use std::time::Duration;

use super::{
    AcquireOutcome, AcquireRequest, ExtendItem, KeyNames, LockStore, RecordView, RedisBackend,
    RedlockBackend, ReleaseOutcome, ReleaseWatch, Renewal,
};
use crate::LockError;

/// One server, a Cluster or a Sentinel-watched master.
impl LockStore for RedisBackend {
    async fn acquire(&self, r: AcquireRequest<'_>) -> Result<AcquireOutcome, LockError> {
        RedisBackend::acquire(self, r.names, r.token, r.owner, r.ttl, r.min_hold, r.once).await
    }

    async fn release(
        &self,
        names: &KeyNames,
        token: &str,
        done_retention: Option<Duration>,
    ) -> Result<ReleaseOutcome, LockError> {
        RedisBackend::release(self, names, token, done_retention).await
    }

    async fn extend(&self, items: &[ExtendItem]) -> Result<Vec<Renewal>, LockError> {
        RedisBackend::extend(self, items).await
    }

    async fn inspect(&self, names: &KeyNames) -> Result<Option<RecordView>, LockError> {
        RedisBackend::inspect(self, names).await
    }

    async fn watch_releases(&self, names: &KeyNames) -> Result<ReleaseWatch, LockError> {
        RedisBackend::watch_releases(self, names).await
    }

    async fn list(
        &self,
        namespace: &str,
        pattern: &str,
    ) -> Result<Vec<(String, RecordView)>, LockError> {
        RedisBackend::list(self, namespace, pattern).await
    }

    async fn force_release(&self, names: &KeyNames, fence: u64) -> Result<bool, LockError> {
        RedisBackend::force_release(self, names, fence).await
    }

    async fn raise_fence(
        &self,
        names: &KeyNames,
        token: &str,
        fence: u64,
        ttl: Duration,
    ) -> Result<bool, LockError> {
        RedisBackend::raise_fence(self, names, token, fence, ttl).await
    }
}

/// A quorum of independent masters.
impl LockStore for RedlockBackend {
    async fn acquire(&self, r: AcquireRequest<'_>) -> Result<AcquireOutcome, LockError> {
        RedlockBackend::acquire(self, r.names, r.token, r.owner, r.ttl, r.min_hold, r.once).await
    }

    async fn release(
        &self,
        names: &KeyNames,
        token: &str,
        done_retention: Option<Duration>,
    ) -> Result<ReleaseOutcome, LockError> {
        RedlockBackend::release(self, names, token, done_retention).await
    }

    async fn extend(&self, items: &[ExtendItem]) -> Result<Vec<Renewal>, LockError> {
        RedlockBackend::extend(self, items).await
    }

    async fn inspect(&self, names: &KeyNames) -> Result<Option<RecordView>, LockError> {
        RedlockBackend::inspect(self, names).await
    }

    async fn watch_releases(&self, names: &KeyNames) -> Result<ReleaseWatch, LockError> {
        RedlockBackend::watch_releases(self, names).await
    }

    async fn list(
        &self,
        namespace: &str,
        pattern: &str,
    ) -> Result<Vec<(String, RecordView)>, LockError> {
        RedlockBackend::list(self, namespace, pattern).await
    }

    async fn force_release(&self, names: &KeyNames, fence: u64) -> Result<bool, LockError> {
        RedlockBackend::force_release(self, names, fence).await
    }
}
