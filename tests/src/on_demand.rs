//! A store that computes fences on demand (`AcquireOutcome::AcquiredUnfenced` and
//! `LockStore::fence`), for the tests of that path: the memory store, its fence kept back at
//! acquire and handed out only to the token whose record it still is.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lock_runtime::store::{
    AcquireOutcome, AcquireRequest, ExtendItem, KeyNames, LockStore, RecordView, ReleaseOutcome,
    ReleaseWatch, Renewal, Retention,
};
use lock_runtime::{LockError, MemoryStore};

/// The memory store, answering acquires without their fence.
#[derive(Debug, Clone, Default)]
pub struct OnDemandFences {
    /// The store underneath, which gives every acquire its fence.
    pub store: MemoryStore,
    /// token -> the fence its acquire got (kept back until asked for).
    fences: Arc<Mutex<HashMap<String, u64>>>,
    /// How many times the runtime asked for a fence.
    pub asked: Arc<AtomicUsize>,
}

impl LockStore for OnDemandFences {
    async fn acquire(&self, r: AcquireRequest<'_>) -> Result<AcquireOutcome, LockError> {
        let token = r.token.to_owned();
        match self.store.acquire(r).await? {
            AcquireOutcome::Acquired { fence } => {
                self.fences.lock().expect("fences").insert(token, fence);
                Ok(AcquireOutcome::AcquiredUnfenced)
            }
            other => Ok(other),
        }
    }
    async fn fence(
        &self,
        names: &KeyNames,
        token: &str,
        _ttl: Duration,
    ) -> Result<Option<u64>, LockError> {
        self.asked.fetch_add(1, Ordering::SeqCst);
        // Yield, so that concurrent first callers of one lease overlap here.
        tokio::task::yield_now().await;
        let mine = self.fences.lock().expect("fences").get(token).copied();
        let record = self.store.inspect(names).await?;
        // The record is this token's when it carries the fence this token's acquire got
        // (fences are never reused).
        Ok(mine.filter(|f| record.is_some_and(|r| r.fence == Some(*f))))
    }
    async fn release(
        &self,
        names: &KeyNames,
        token: &str,
        done_retention: Option<Duration>,
    ) -> Result<ReleaseOutcome, LockError> {
        self.store.release(names, token, done_retention).await
    }
    async fn extend(&self, items: &[ExtendItem]) -> Result<Vec<Renewal>, LockError> {
        self.store.extend(items).await
    }
    async fn inspect(&self, names: &KeyNames) -> Result<Option<RecordView>, LockError> {
        self.store.inspect(names).await
    }
    async fn watch_releases(&self, names: &KeyNames) -> Result<ReleaseWatch, LockError> {
        self.store.watch_releases(names).await
    }
    async fn list(&self, ns: &str, pattern: &str) -> Result<Vec<(String, RecordView)>, LockError> {
        self.store.list(ns, pattern).await
    }
    async fn force_release(&self, names: &KeyNames, fence: u64) -> Result<bool, LockError> {
        self.store.force_release(names, fence).await
    }
    async fn force_release_holder(
        &self,
        names: &KeyNames,
        holder: &str,
    ) -> Result<bool, LockError> {
        self.store.force_release_holder(names, holder).await
    }
    async fn append_run(
        &self,
        namespace: &str,
        job: &str,
        entry: &str,
        keep: &Retention,
    ) -> Result<(), LockError> {
        self.store.append_run(namespace, job, entry, keep).await
    }
    async fn runs(
        &self,
        namespace: &str,
        job: &str,
        limit: usize,
    ) -> Result<Vec<String>, LockError> {
        self.store.runs(namespace, job, limit).await
    }
    async fn journalled_jobs(&self, namespace: &str) -> Result<Vec<String>, LockError> {
        self.store.journalled_jobs(namespace).await
    }
}
