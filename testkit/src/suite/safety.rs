//! Cases for promises that a safety review of the runtime once found broken (the project's
//! `docs/SAFETY.md`, findings 3, 4, 12 and 13): graceful shutdown, a lost lease that stays
//! lost, `max_hold` as a hard cap. The review's own tests ran them on two stores; here every
//! store runs them, since each store answers the calls they depend on in its own way.

use crate::short::{Free, two_runtimes};
use std::time::Duration;

use lock_runtime::{LockError, LockRuntime};
use tokio::time::Instant;

use crate::Harness;

/// Takes `key` through `runtime` at once and gives it back: it is free right now.
pub async fn free_now(runtime: &LockRuntime, key: &str, why: &str) {
    let taken = runtime
        .lock(key)
        .try_acquire()
        .await
        .expect("try")
        .unwrap_or_else(|| panic!("{key}: {why}"));
    assert!(taken.release().await.expect("release"));
}

/// Polls `key` from `runtime` until it can be taken, failing after `limit`; returns the guard
/// and how long it took.
async fn take_when_free(
    runtime: &LockRuntime,
    key: &str,
    limit: Duration,
    why: &str,
) -> (lock_runtime::LockGuard, Duration) {
    let started = Instant::now();
    loop {
        if let Some(taken) = runtime.lock(key).try_acquire().await.expect("try") {
            return (taken, started.elapsed());
        }
        assert!(started.elapsed() < limit, "{key}: {why}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A task waiting for a lock when its runtime shuts down ends with `LockError::Shutdown` and
/// leaves nothing behind (finding 3: it once waited on and was handed a guard nobody renewed).
pub async fn shutdown_ends_waiters<H: Harness>(store: &H) {
    let holder = store.runtime().await;
    let waiting = store.runtime().await;
    let guard = holder
        .lock("sd-wait")
        .ttl(Duration::from_secs(30))
        .try_acquire()
        .await
        .free();
    let waiter = {
        let waiting = waiting.clone();
        tokio::spawn(async move { waiting.lock("sd-wait").acquire().await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !waiter.is_finished(),
        "the waiter waits while the lock is held"
    );
    tokio::time::timeout(Duration::from_secs(5), waiting.shutdown())
        .await
        .expect("a runtime that holds nothing shuts down at once");
    let result = tokio::time::timeout(Duration::from_secs(3), waiter)
        .await
        .expect("the waiter ends with its runtime")
        .expect("waiter task");
    assert!(
        matches!(result, Err(LockError::Shutdown)),
        "expected Shutdown, got {result:?}"
    );
    assert!(
        guard.release().await.expect("release"),
        "still the holder's"
    );
    free_now(
        &holder,
        "sd-wait",
        "the shut-down waiter left a grant behind",
    )
    .await;
}

/// Shutdown is graceful: new requests are refused at once, but a lease still held keeps being
/// renewed (and stays exclusive) through the grace period, and shutdown returns once it is
/// released (finding 4: shutdown once released locks while their jobs still ran).
pub async fn shutdown_lets_running_jobs_finish<H: Harness>(store: &H) {
    let (a, b) = two_runtimes(store).await;
    let guard = a
        .lock("sd-job")
        .ttl(Duration::from_secs(1))
        .try_acquire()
        .await
        .free();
    let shutting = {
        let a = a.clone();
        tokio::spawn(async move { a.shutdown().await })
    };
    // Past the ttl and the store's clock granularity, inside the default grace of 5 s: the
    // lease lives on renewals alone now.
    tokio::time::sleep(Duration::from_millis(1500) + store.clock_granularity()).await;
    assert!(
        matches!(
            a.lock("sd-other").try_acquire().await,
            Err(LockError::Shutdown)
        ),
        "new requests are refused during the grace period"
    );
    assert!(guard.lease().is_held(), "the running job keeps its lease");
    assert!(
        b.lock("sd-job").try_acquire().await.expect("try").is_none(),
        "and its exclusivity"
    );
    assert!(!shutting.is_finished(), "shutdown waits for the job");
    assert!(
        guard.release().await.expect("release"),
        "still ours at the end"
    );
    tokio::time::timeout(Duration::from_secs(3), shutting)
        .await
        .expect("shutdown returns once the last lease is released")
        .expect("shutdown task");
    free_now(&b, "sd-job", "the job released it").await;
}

/// At the end of the grace period shutdown tells every holder its lease is lost *before* it
/// releases the lock, so no job runs on while another instance holds the lock; then it
/// releases everything and keeps refusing requests.
pub async fn shutdown_releases_everything<H: Harness>(store: &H) {
    let (a, b) = two_runtimes(store).await;
    let mut held = Vec::new();
    for key in ["sd-1", "sd-2"] {
        let guard = a
            .lock(key)
            .ttl(Duration::from_secs(30))
            .try_acquire()
            .await
            .free();
        held.push(guard);
    }
    let shutting = {
        let a = a.clone();
        tokio::spawn(async move { a.shutdown().await })
    };
    // The default grace period is 5 s; the ttl 30 s.
    let (taken, after) = take_when_free(
        &b,
        "sd-1",
        Duration::from_secs(15),
        "not released at the end of the grace period",
    )
    .await;
    assert!(
        held[0].lease().is_lost(),
        "the holder was told before its lock was released"
    );
    assert!(
        after >= Duration::from_secs(4),
        "released at the end of the grace period (5 s), not after {after:?}"
    );
    tokio::time::timeout(Duration::from_secs(5), shutting)
        .await
        .expect("shutdown returns after releasing")
        .expect("shutdown task");
    assert!(held[1].lease().is_lost());
    free_now(&b, "sd-2", "freed by shutdown").await;
    assert!(matches!(
        a.lock("sd-3").try_acquire().await,
        Err(LockError::Shutdown)
    ));
    assert!(taken.release().await.expect("release"));
    drop(held);
}

/// Once lost, always lost: a lease past its validity reads lost, an extend does not bring it
/// back, and it is not held; a lease released in time is neither held nor lost (finding 12:
/// a late renewal once made a lost lease valid again).
pub async fn lost_stays_lost<H: Harness>(store: &H) {
    let (a, b) = two_runtimes(store).await;
    let guard = a
        .lock("lost-stays")
        .ttl(Duration::from_millis(600))
        .watchdog(false)
        .try_acquire()
        .await
        .free();
    assert!(guard.lease().is_held() && !guard.lease().is_lost());
    tokio::time::timeout(Duration::from_secs(5), guard.lease().lost())
        .await
        .expect("lost at the end of its validity without renewals");
    assert!(
        !guard.extend(Duration::from_secs(30)).await.expect("extend"),
        "a lost lease is not extended"
    );
    assert!(guard.lease().is_lost(), "once lost, always lost");
    assert!(!guard.lease().is_held(), "a lost lease is not held");
    let (taken, _) = take_when_free(
        &b,
        "lost-stays",
        Duration::from_secs(5) + store.clock_granularity(),
        "the lapsed lease's record did not expire",
    )
    .await;
    assert!(guard.lease().is_lost(), "still lost once another holds it");
    drop(guard);
    let lease = taken.lease().clone();
    assert!(taken.release().await.expect("release"));
    assert!(!lease.is_held(), "a released lease is not held");
    assert!(!lease.is_lost(), "released in time: not lost");
}

/// `max_hold` is a hard cap: neither the watchdog's last renewal nor an `extend` asking for
/// more keeps the record past it, and the holder knows before anyone else can take the lock
/// (finding 13: the last renewal once took a lease up to a ttl past max_hold).
pub async fn max_hold_is_a_hard_cap<H: Harness>(store: &H) {
    let (a, b) = two_runtimes(store).await;
    let started = Instant::now();
    // Renewals every 2 s: uncapped, the one at 6 s would keep the record to 12 s.
    let guard = a
        .lock("hard-cap")
        .ttl(Duration::from_secs(6))
        .max_hold(Duration::from_secs(7))
        .try_acquire()
        .await
        .free();
    assert!(
        guard.extend(Duration::from_secs(60)).await.expect("extend"),
        "an extend within max_hold is granted, cut to what is left of it"
    );
    let limit = Duration::from_secs(9) + store.clock_granularity();
    let (taken, after) = take_when_free(
        &b,
        "hard-cap",
        limit,
        "still held past max_hold (7 s) and a margin",
    )
    .await;
    assert!(
        guard.lease().is_lost(),
        "the holder knew before the lock was free"
    );
    assert!(
        started.elapsed() >= Duration::from_secs(6),
        "held until max_hold, not released early: free after {after:?}"
    );
    assert!(taken.release().await.expect("release"));
    drop(guard);
}

/// A renewal never shortens a lease: after an `extend` past the ttl, the watchdog's renewals
/// (each asking for the ttl) leave the longer expiry in place. A store that shortened it would
/// end the record while its holder still believes the lease valid for the extension.
pub async fn renewals_never_shorten_an_extended_lease<H: Harness>(store: &H) {
    let a = store.runtime().await;
    let guard = a
        .lock("never-shorter")
        .ttl(Duration::from_secs(1))
        .try_acquire()
        .await
        .free();
    assert!(guard.extend(Duration::from_secs(30)).await.expect("extend"));
    // Renewals every third of the ttl, each asking for 1 s.
    tokio::time::sleep(Duration::from_millis(1500) + store.clock_granularity()).await;
    assert!(guard.lease().is_held());
    let info = a
        .inspect("never-shorter")
        .await
        .expect("inspect")
        .expect("still held");
    let left = info.remaining.expect("an expiry");
    assert!(
        left >= Duration::from_secs(20),
        "{left:?} left after an extend to 30 s and a few renewals asking for 1 s"
    );
    assert!(guard.release().await.expect("release"));
}
