//! The handoff row: how long a waiter takes to hold a lock once its holder released it, for
//! ours (event-driven), rslock, async-redis-lock and plain poll loops.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use lock_runtime::LockRuntime;
use tokio::time::Instant;

use crate::peers::RawLock;

/// How long the holder keeps the lock before releasing, so the waiter is surely waiting.
const HOLD_BEFORE_HANDOFF: Duration = Duration::from_millis(20);

/// Handoff latency of ours: from the holder's release returning to the waiter (another
/// runtime) holding the lock.
pub(crate) async fn handoff_ours(
    holder: LockRuntime,
    waiter: LockRuntime,
    n: usize,
) -> anyhow::Result<Vec<Duration>> {
    let mut latencies = Vec::new();
    for i in 0..n {
        let key = format!("handoff:ours:{i}");
        let guard = holder
            .lock(&key)
            .try_acquire()
            .await?
            .context("a fresh key was held")?;
        let waiting = {
            let waiter = waiter.clone();
            let key = key.clone();
            tokio::spawn(async move {
                let guard = waiter.lock(key).acquire().await?;
                let at = Instant::now();
                guard.release().await?;
                Ok::<Instant, anyhow::Error>(at)
            })
        };
        tokio::time::sleep(HOLD_BEFORE_HANDOFF).await;
        guard.release().await?;
        let released = Instant::now();
        let acquired = waiting.await??;
        latencies.push(acquired.saturating_duration_since(released));
    }
    holder.shutdown().await;
    waiter.shutdown().await;
    Ok(latencies)
}

/// Handoff latency of rslock's waiting `acquire` (retries with random 0-200 ms delays).
pub(crate) async fn handoff_rslock(url: &str, n: usize) -> anyhow::Result<Vec<Duration>> {
    let holder = rslock::LockManager::new(vec![url.to_owned()]);
    let waiter = rslock::LockManager::new(vec![url.to_owned()]);
    let ttl = Duration::from_secs(10);
    let mut latencies = Vec::new();
    for i in 0..n {
        let key = format!("handoff:rslock:{i}");
        let lock = holder
            .lock(key.as_bytes(), ttl)
            .await
            .map_err(|e| anyhow::anyhow!("rslock: {e:?}"))?;
        let waiting = {
            let waiter = waiter.clone();
            tokio::spawn(async move {
                let guard = waiter
                    .acquire(key.as_bytes(), ttl)
                    .await
                    .map_err(|e| anyhow::anyhow!("rslock: {e:?}"))?;
                let at = Instant::now();
                guard.release().await;
                Ok::<Instant, anyhow::Error>(at)
            })
        };
        tokio::time::sleep(HOLD_BEFORE_HANDOFF).await;
        holder.unlock(&lock).await;
        let released = Instant::now();
        let acquired = waiting.await??;
        latencies.push(acquired.saturating_duration_since(released));
    }
    Ok(latencies)
}

/// Handoff latency of a plain poll loop: SET NX PX every `every` until it succeeds.
pub(crate) async fn handoff_poll(
    url: &str,
    n: usize,
    every: Duration,
) -> anyhow::Result<Vec<Duration>> {
    let raw = Arc::new(RawLock::connect(url).await?);
    let mut latencies = Vec::new();
    for i in 0..n {
        let key = format!("handoff:poll{}:{i}", every.as_millis());
        let token = format!("holder-{i}");
        anyhow::ensure!(raw.try_lock(&key, &token).await?, "a fresh key was held");
        let waiting = {
            let raw = raw.clone();
            let key = key.clone();
            tokio::spawn(async move {
                let mine = format!("waiter-{i}");
                while !raw.try_lock(&key, &mine).await? {
                    tokio::time::sleep(every).await;
                }
                let at = Instant::now();
                raw.unlock(&key, &mine).await?;
                Ok::<Instant, anyhow::Error>(at)
            })
        };
        tokio::time::sleep(HOLD_BEFORE_HANDOFF).await;
        raw.unlock(&key, &token).await?;
        let released = Instant::now();
        let acquired = waiting.await??;
        latencies.push(acquired.saturating_duration_since(released));
    }
    Ok(latencies)
}

/// Handoff latency of async-redis-lock's waiting acquire (a SET NX retried every 100 ms, its
/// default).
pub(crate) async fn handoff_async_redis_lock(url: &str, n: usize) -> anyhow::Result<Vec<Duration>> {
    let holder = async_redis_lock::Locker::from_redis_url(url)
        .await
        .map_err(|e| anyhow::anyhow!("async-redis-lock: {e:?}"))?;
    let waiter = Arc::new(
        async_redis_lock::Locker::from_redis_url(url)
            .await
            .map_err(|e| anyhow::anyhow!("async-redis-lock: {e:?}"))?,
    );
    let options = async_redis_lock::Options::new()
        .ttl(Duration::from_secs(10))
        .timeout(Some(Duration::from_secs(10)));
    let mut latencies = Vec::new();
    for i in 0..n {
        let key = format!("handoff:arl:{i}");
        let lock = holder
            .acquire_with_options(&options, &key)
            .await
            .map_err(|e| anyhow::anyhow!("async-redis-lock: {e:?}"))?;
        let waiting = {
            let (waiter, options) = (waiter.clone(), options.clone());
            tokio::spawn(async move {
                let lock = waiter
                    .acquire_with_options(&options, &key)
                    .await
                    .map_err(|e| anyhow::anyhow!("async-redis-lock: {e:?}"))?;
                let at = Instant::now();
                lock.release()
                    .await
                    .map_err(|e| anyhow::anyhow!("async-redis-lock: {e:?}"))?;
                Ok::<Instant, anyhow::Error>(at)
            })
        };
        tokio::time::sleep(HOLD_BEFORE_HANDOFF).await;
        lock.release()
            .await
            .map_err(|e| anyhow::anyhow!("async-redis-lock: {e:?}"))?;
        let released = Instant::now();
        let acquired = waiting.await??;
        latencies.push(acquired.saturating_duration_since(released));
    }
    Ok(latencies)
}
