//! Whether a waiter hears a release after a fault, and whether a lock was left free: the
//! checks the stores' fault tests share (finding 10 of the safety review, on every Redis
//! topology; releases into a cut link). Each allows 5 s against a holder's ttl of 30 s, so
//! only a heard release, or a lock really given back, can pass.

use crate::TakeFree;
use std::time::Duration;

use lock_runtime::LockRuntime;
use tokio::time::Instant;

/// `waiting` waits for `key`, which `holder` holds for 30 s, through an outage of 10 s that
/// `cut(true)` starts and `cut(false)` ends (its connections refused and dropped: longer than
/// the Redis client's own reconnect tries); a release 3 s after the outage reaches it within
/// 5 s.
pub async fn waiter_wakes_after_an_outage(
    waiting: &LockRuntime,
    holder: &LockRuntime,
    key: &str,
    cut: impl Fn(bool),
) {
    let guard = holder.take(key, Duration::from_secs(30)).await;
    let waiter = {
        let (waiting, key) = (waiting.clone(), key.to_owned());
        crate::acquire_in_task(waiting, key, Duration::from_secs(28))
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    cut(true);
    tokio::time::sleep(Duration::from_secs(10)).await;
    cut(false);
    // Time for the waiting runtime to find the store again.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let released_at = Instant::now();
    assert!(guard.release().await.expect("release"));
    let taken = waiter
        .await
        .expect("task")
        .expect("the waiter got the lock before its deadline");
    let took = released_at.elapsed();
    assert!(
        took < Duration::from_secs(5),
        "woken {took:?} after the release (the holder's ttl had about 17 s left)"
    );
    assert!(taken.release().await.expect("release"));
}

/// After a failover: `holder` takes `key` for 30 s as soon as the store lets it (retrying
/// errors for up to `follow` while the store moves to its new master), `waiter` waits for it,
/// and the release 1.5 s later reaches the waiter within 5 s.
pub async fn waiter_wakes_after_a_failover(
    holder: &LockRuntime,
    waiter: &LockRuntime,
    key: &str,
    follow: Duration,
) {
    let started = Instant::now();
    let held = loop {
        match holder
            .lock(key)
            .ttl(Duration::from_secs(30))
            .try_acquire()
            .await
        {
            Ok(Some(guard)) => break guard,
            Ok(None) => panic!("nobody else holds {key}"),
            Err(e) => {
                assert!(
                    started.elapsed() < follow,
                    "the holder did not reach the new master: {e}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    let waiting = {
        let (waiter, key) = (waiter.clone(), key.to_owned());
        crate::acquire_in_task(waiter, key, Duration::from_secs(20))
    };
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let released = Instant::now();
    assert!(held.release().await.expect("release"));
    let got = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("the waiter woke on the release, not after the 30 s ttl")
        .expect("task")
        .expect("acquired on the new master");
    assert!(released.elapsed() < Duration::from_secs(5));
    got.release().await.expect("release");
}

/// Opens `waiter`'s subscriber connection where the store is now: `holder` takes `key`,
/// `waiter` waits for it, and gets it (within 5 s) when `holder` releases it.
pub async fn warm_subscriber(holder: &LockRuntime, waiter: &LockRuntime, key: &str) {
    let warm = holder.take_default_ttl(key).await;
    let warm_wait = {
        let (waiter, key) = (waiter.clone(), key.to_owned());
        crate::acquire_in_task(waiter, key, Duration::from_secs(5))
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    warm.release().await.expect("release");
    warm_wait
        .await
        .expect("task")
        .expect("woken")
        .release()
        .await
        .expect("release");
}

/// Takes `key` through `runtime` within 5 s, then gives it back: the lock was not left held
/// (`why` says what that shows, in the failure).
pub async fn free_within_5s(runtime: &LockRuntime, key: &str, why: &str) {
    let taken = runtime
        .lock(key)
        .acquire_timeout(Duration::from_secs(5))
        .await
        .unwrap_or_else(|e| panic!("{why}: {e}"));
    taken.release().await.expect("release");
}
