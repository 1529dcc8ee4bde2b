//! Annotated functions the attribute tests call. Each takes what it touches as arguments, so
//! tests running in parallel never share state.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use lock_runtime::{LockError, current_lease, distributed_lock};
use tokio::sync::{Barrier, Semaphore};

/// Counts runs; returns the fence it ran under.
#[distributed_lock(key = "skip:{tag}", ttl = "10s")]
pub(crate) async fn skip_job(tag: &str, runs: Arc<AtomicU64>) -> Option<u64> {
    runs.fetch_add(1, Ordering::SeqCst);
    Some(current_lease()?.fence().await.expect("a fence"))
}

/// The unit-returning flavour of the skip policy.
#[distributed_lock(key = "skip-unit:{tag}")]
pub(crate) async fn skip_unit_job(tag: &str, runs: Arc<AtomicU64>) {
    runs.fetch_add(1, Ordering::SeqCst);
}

/// A skip-policy job whose caller wants errors as `Result`.
#[distributed_lock(key = "skip-result:{tag}", ttl = "10s")]
pub(crate) async fn skip_result_job(tag: &str, runs: Arc<AtomicU64>) -> anyhow::Result<()> {
    runs.fetch_add(1, Ordering::SeqCst);
    Ok(())
}

/// The error policy.
#[distributed_lock(key = "error:{tag}", on_contention = "error")]
pub(crate) async fn error_job(tag: &str, runs: Arc<AtomicU64>) -> Result<u64, LockError> {
    runs.fetch_add(1, Ordering::SeqCst);
    Ok(runs.load(Ordering::SeqCst))
}

/// The wait policy with a bound.
#[distributed_lock(key = "wait:{tag}", on_contention = "wait", wait_timeout = "3s")]
pub(crate) async fn wait_job(tag: &str, runs: Arc<AtomicU64>) -> Result<(), LockError> {
    runs.fetch_add(1, Ordering::SeqCst);
    Ok(())
}

/// Ticks until stopped; with on_lost = "abort" it is stopped when the lease is lost.
#[distributed_lock(key = "abort:{tag}", ttl = "900ms")]
pub(crate) async fn endless_job(tag: &str, ticks: Arc<AtomicU64>) -> Result<(), LockError> {
    loop {
        ticks.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// With on_lost = "continue" the body finishes even after the lease is lost.
#[distributed_lock(key = "continue:{tag}", ttl = "900ms", on_lost = "continue")]
pub(crate) async fn stubborn_job(tag: &str, hold: Duration) -> Result<Option<bool>, LockError> {
    tokio::time::sleep(hold).await;
    Ok(current_lease().map(|l| l.is_lost()))
}

/// Keeps its lock at least 30 s after it was taken: far beyond any scheduling delay, so a
/// test of it never depends on the machine's speed.
#[distributed_lock(key = "min-hold:{tag}", ttl = "60s", min_hold = "30s")]
pub(crate) async fn min_hold_job(tag: &str, runs: Arc<AtomicU64>) {
    runs.fetch_add(1, Ordering::SeqCst);
}

/// Keeps its lock at least 300 ms after it was taken.
#[distributed_lock(key = "min-hold-short:{tag}", ttl = "5s", min_hold = "300ms")]
pub(crate) async fn min_hold_short_job(tag: &str, runs: Arc<AtomicU64>) {
    runs.fetch_add(1, Ordering::SeqCst);
}

/// Calls itself for the same key: re-entrant, no deadlock.
#[distributed_lock(key = "reentrant:{tag}", on_contention = "wait", wait_timeout = "2s")]
pub(crate) async fn outer_job(tag: &str, runs: Arc<AtomicU64>) -> Result<(), LockError> {
    runs.fetch_add(1, Ordering::SeqCst);
    inner_job(tag, runs.clone()).await
}

/// The nested call of [`outer_job`].
#[distributed_lock(key = "reentrant:{tag}", on_contention = "error")]
pub(crate) async fn inner_job(tag: &str, runs: Arc<AtomicU64>) -> Result<(), LockError> {
    runs.fetch_add(1, Ordering::SeqCst);
    Ok(())
}

/// A posting per account: `{account}` makes one lock per argument.
#[distributed_lock(key = "post:{tag}:{account}", ttl = "10s")]
pub(crate) async fn post(
    tag: &str,
    account: u32,
    inside: Arc<Barrier>,
    finish: Arc<Semaphore>,
    runs: Arc<AtomicU64>,
) -> Option<()> {
    runs.fetch_add(1, Ordering::SeqCst);
    // Meet the other callers inside the body, then stay until the test lets go.
    tokio::time::timeout(Duration::from_secs(5), inside.wait())
        .await
        .ok()?;
    let permit = tokio::time::timeout(Duration::from_secs(5), finish.acquire())
        .await
        .ok()?;
    permit.ok()?.forget();
    Some(())
}

/// Panics inside the locked body.
#[distributed_lock(key = "panic:{tag}", ttl = "30s")]
pub(crate) async fn panicking_job(tag: &str) {
    panic!("the job failed on purpose");
}

/// Never finishes; cancelled by its caller.
#[distributed_lock(key = "cancel:{tag}", ttl = "30s")]
pub(crate) async fn hanging_job(tag: &str) {
    std::future::pending::<()>().await;
}

/// Runs once per retention window when it succeeds.
#[distributed_lock(key = "once:{tag}", ttl = "10s", once = "1h")]
pub(crate) async fn once_job(tag: &str, fail: bool, runs: Arc<AtomicU64>) -> anyhow::Result<()> {
    runs.fetch_add(1, Ordering::SeqCst);
    if fail {
        anyhow::bail!("the job failed");
    }
    Ok(())
}

/// A `once` job whose lease is taken from it while it runs (the test deletes the record); it
/// waits until its runtime finds out, then succeeds all the same. `None` if it never found out.
#[distributed_lock(key = "once-lost:{tag}", ttl = "3s", on_lost = "continue", once = "1h")]
pub(crate) async fn once_outliving_its_lease(tag: &str, runs: Arc<AtomicU64>) -> Option<bool> {
    runs.fetch_add(1, Ordering::SeqCst);
    let lease = current_lease()?;
    tokio::time::timeout(Duration::from_secs(10), lease.lost())
        .await
        .ok()?;
    Some(lease.is_lost())
}

/// A plain call that calls [`nested_once`] for the same key.
#[distributed_lock(key = "nested-once:{tag}")]
pub(crate) async fn outer_plain(tag: &str, runs: Arc<AtomicU64>) -> Option<()> {
    nested_once(tag, runs).await
}

/// A plain call that calls [`nested_once`] for the same key twice.
#[distributed_lock(key = "nested-once:{tag}")]
pub(crate) async fn outer_plain_twice(tag: &str, runs: Arc<AtomicU64>) -> Option<()> {
    nested_once(tag, runs.clone()).await;
    nested_once(tag, runs).await
}

/// A plain call that waits for `go`, then calls [`nested_once`] for the same key.
#[distributed_lock(key = "nested-once:{tag}", ttl = "10s")]
pub(crate) async fn outer_plain_after(
    tag: &str,
    go: Arc<tokio::sync::Notify>,
    runs: Arc<AtomicU64>,
) -> Option<()> {
    go.notified().await;
    nested_once(tag, runs).await
}

/// A `once` call, made inside [`outer_plain`]'s lock (re-entrant) or on its own.
#[distributed_lock(key = "nested-once:{tag}", once = "1h")]
pub(crate) async fn nested_once(tag: &str, runs: Arc<AtomicU64>) -> Option<()> {
    runs.fetch_add(1, Ordering::SeqCst);
    Some(())
}

/// A service whose methods are locked per instance name.
#[derive(Debug)]
pub(crate) struct Ledger {
    /// Part of the lock key.
    pub(crate) name: String,
    /// Postings made.
    pub(crate) postings: u64,
}

impl Ledger {
    /// `&mut self` method with a `{self.field}` placeholder.
    #[distributed_lock(key = "ledger:{self.name}", on_contention = "error")]
    pub(crate) async fn post(&mut self, amount: u64) -> Result<u64, LockError> {
        self.postings += amount;
        Ok(self.postings)
    }

    /// `&self` method.
    #[distributed_lock(key = "ledger-read:{self.name}")]
    pub(crate) async fn read(&self) -> Option<u64> {
        Some(self.postings)
    }
}

/// A generic function.
#[distributed_lock(key = "generic:{label}", on_contention = "error")]
pub(crate) async fn generic_job<T: std::fmt::Display + Send>(
    label: T,
) -> Result<String, LockError> {
    Ok(format!("ran {label}"))
}
