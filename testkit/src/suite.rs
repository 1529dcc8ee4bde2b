//! The behaviour suite: every function here runs once per store (see `behaviour_suite!`).
//! Timing margins are generous (seconds), because CI machines are noisy.

use crate::short::{Free, two_runtimes};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use lock_runtime::{LockError, LockRuntime};
use tokio::time::Instant;

use crate::Harness;

mod operator;
mod safety;
pub use operator::{force_release_names_one_holding, list_and_force_release};
pub use safety::{
    free_now, lost_stays_lost, max_hold_is_a_hard_cap, renewals_never_shorten_an_extended_lease,
    shutdown_ends_waiters, shutdown_lets_running_jobs_finish, shutdown_releases_everything,
};

/// 3 runtimes x 4 tasks x 100 iterations on 2 keys, each doing an unsynchronised
/// read-sleep-write on a counter under the lock: the totals must be exact.
pub async fn mutual_exclusion<H: Harness>(store: &H) {
    const RUNTIMES: usize = 3;
    const TASKS: usize = 4;
    const ITERATIONS: usize = 100;
    let counters = Arc::new([AtomicU64::new(0), AtomicU64::new(0)]);
    let mut tasks = Vec::new();
    for _ in 0..RUNTIMES {
        let runtime = store.runtime().await;
        for t in 0..TASKS {
            let runtime = runtime.clone();
            let counters = counters.clone();
            tasks.push(tokio::spawn(async move {
                for i in 0..ITERATIONS {
                    let k = (i + t) % 2;
                    let guard = runtime
                        .lock(format!("counter-{k}"))
                        .ttl(Duration::from_secs(10))
                        .acquire_timeout(Duration::from_secs(60))
                        .await
                        .expect("acquire within a minute");
                    let seen = counters[k].load(Ordering::SeqCst);
                    tokio::task::yield_now().await;
                    tokio::time::sleep(Duration::from_micros(200)).await;
                    counters[k].store(seen + 1, Ordering::SeqCst);
                    assert!(guard.release().await.expect("release"), "lock was ours");
                }
            }));
        }
    }
    for task in tasks {
        task.await.expect("worker task");
    }
    let per_key = (RUNTIMES * TASKS * ITERATIONS / 2) as u64;
    assert_eq!(counters[0].load(Ordering::SeqCst), per_key);
    assert_eq!(counters[1].load(Ordering::SeqCst), per_key);
}

/// A guard whose lease expired while another runtime took the lock releases nothing.
pub async fn stale_guard_releases_nothing<H: Harness>(store: &H) {
    let (a, b) = two_runtimes(store).await;
    let stale = a
        .lock("stale")
        .ttl(Duration::from_millis(300))
        .watchdog(false)
        .try_acquire()
        .await
        .free();
    // Asked while held: a store that computes fences on demand gives none to a lost lease.
    let stale_fence = stale.lease().fence().await.expect("a fence");
    tokio::time::sleep(Duration::from_millis(600) + store.clock_granularity()).await;
    assert!(
        stale.lease().is_lost(),
        "an expired, unrenewed lease is lost"
    );
    let fresh = b
        .lock("stale")
        .ttl(Duration::from_secs(10))
        .try_acquire()
        .await
        .expect("acquire")
        .expect("the expired lock is free");
    assert!(fresh.lease().fence().await.expect("a fence") > stale_fence);
    assert!(
        !stale.release().await.expect("release"),
        "a stale release reports false"
    );
    let info = b
        .inspect("stale")
        .await
        .expect("inspect")
        .expect("still held");
    assert_eq!(info.owner, b.owner(), "the new holder keeps the lock");
    assert_eq!(
        info.fence,
        Some(fresh.lease().fence().await.expect("a fence"))
    );
    assert!(fresh.release().await.expect("release"));
}

/// The watchdog keeps a 1 s lease alive through a 4 s hold while another runtime keeps trying.
pub async fn watchdog_keeps_short_lease_alive<H: Harness>(store: &H) {
    let (a, b) = two_runtimes(store).await;
    let guard = a
        .lock("watched")
        .ttl(Duration::from_secs(1))
        .try_acquire()
        .await
        .free();
    let until = Instant::now() + Duration::from_secs(4);
    let mut attempts = 0;
    while Instant::now() < until {
        let other = b
            .lock("watched")
            .ttl(Duration::from_secs(1))
            .try_acquire()
            .await
            .expect("try");
        assert!(
            other.is_none(),
            "another runtime got a lock whose holder is alive"
        );
        attempts += 1;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(attempts > 10);
    assert!(!guard.lease().is_lost());
    assert!(
        guard.release().await.expect("release"),
        "still ours after 4 s"
    );
}

/// Deleting the record behind a live lease is noticed within ttl/3 plus a margin.
pub async fn deleted_record_is_reported_lost<H: Harness>(store: &H) {
    let a = store.runtime().await;
    let ttl = Duration::from_millis(900);
    let guard = a.lock("doomed").ttl(ttl).try_acquire().await.free();
    let lease = guard.lease().clone();
    assert!(!lease.is_lost());
    store.delete_record("doomed").await;
    let deleted_at = Instant::now();
    tokio::time::timeout(ttl / 3 + Duration::from_secs(1), lease.lost())
        .await
        .expect("lost() resolves within ttl/3 plus a margin");
    assert!(lease.is_lost());
    assert!(deleted_at.elapsed() <= ttl / 3 + Duration::from_secs(1));
    assert!(
        !guard.release().await.expect("release"),
        "nothing of ours to release"
    );
}

/// Fences strictly increase across acquisitions from three runtimes.
pub async fn fences_strictly_increase<H: Harness>(store: &H) {
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for _ in 0..3 {
        let runtime = store.runtime().await;
        let seen = seen.clone();
        tasks.push(tokio::spawn(async move {
            for _ in 0..40 {
                let guard = runtime
                    .lock("fenced")
                    .acquire_timeout(Duration::from_secs(30))
                    .await
                    .expect("acquire");
                // Recorded inside the critical section: list order is acquisition order.
                let fence = guard.lease().fence().await.expect("a fence");
                seen.lock().expect("not poisoned").push(fence);
                guard.release().await.expect("release");
            }
        }));
    }
    for task in tasks {
        task.await.expect("task");
    }
    let seen = seen.lock().expect("not poisoned").clone();
    assert_eq!(seen.len(), 120);
    assert!(
        seen.windows(2).all(|w| w[0] < w[1]),
        "fences not strictly increasing: {seen:?}"
    );
}

/// A lock released before its min_hold stays held until min_hold has passed, and one released
/// after it is freed at once. Timing is read from the store's own clock (`inspect`), never
/// from how fast this machine ran.
pub async fn min_hold_keeps_lock_after_release<H: Harness>(store: &H) {
    let (a, b) = two_runtimes(store).await;
    // 30 s: far beyond any scheduling delay between the acquire and the checks below.
    let guard = a
        .lock("min-hold")
        .ttl(Duration::from_secs(60))
        .min_hold(Duration::from_secs(30))
        .try_acquire()
        .await
        .free();
    assert!(guard.release().await.expect("release"));
    assert!(
        b.lock("min-hold")
            .try_acquire()
            .await
            .expect("try")
            .is_none(),
        "min_hold must keep the lock after an early release"
    );
    let info = a
        .inspect("min-hold")
        .await
        .expect("inspect")
        .expect("the record stays");
    let expires = info
        .held_for
        .expect("a min_hold record knows when it was taken")
        + info.remaining.expect("the record has an expiry");
    let slack = Duration::from_millis(100) + store.clock_granularity();
    assert!(
        expires >= Duration::from_secs(30) - slack && expires <= Duration::from_secs(30) + slack,
        "the record expires at min_hold (30 s after it was taken, by the store's clock), not \
         at the 60 s ttl: {expires:?}"
    );

    // Released after its min_hold has passed (by the store's clock): freed at once.
    let short = a
        .lock("min-hold-short")
        .ttl(Duration::from_secs(5))
        .min_hold(Duration::from_millis(200))
        .try_acquire()
        .await
        .free();
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let info = a
            .inspect("min-hold-short")
            .await
            .expect("inspect")
            .expect("held");
        let held_for = info
            .held_for
            .expect("a min_hold record knows when it was taken");
        if held_for >= Duration::from_millis(250) + store.clock_granularity() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the store's clock did not advance"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(short.release().await.expect("release"));
    let got = b
        .lock("min-hold-short")
        .try_acquire()
        .await
        .expect("try")
        .expect("free at once: min_hold had passed");
    got.release().await.expect("release");
}

/// A waiter refused while the lock was held (and told the holder's whole ttl) gets it soon
/// after an early release's min_hold ends, not at the holder's ttl: the store wakes waiters
/// when it keeps a released lock for min_hold, and they learn the shorter wait.
pub async fn min_hold_end_lets_waiter_in<H: Harness>(store: &H) {
    let (a, b) = two_runtimes(store).await;
    let guard = a
        .lock("min-hold-wait")
        .ttl(Duration::from_secs(60))
        .min_hold(Duration::from_secs(1))
        .try_acquire()
        .await
        .free();
    let waiter = tokio::spawn(async move {
        let got = b
            .lock("min-hold-wait")
            .acquire_timeout(Duration::from_secs(30))
            .await;
        (Instant::now(), got)
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !waiter.is_finished(),
        "the waiter must wait while the lock is held"
    );
    let released = Instant::now();
    assert!(guard.release().await.expect("release"));
    let (got_at, got) = waiter.await.expect("waiter task");
    let guard = got.expect("the waiter gets the lock once min_hold has passed");
    assert!(
        got_at.duration_since(released) < Duration::from_secs(10),
        "the waiter got the lock {:?} after the release (min_hold 1 s, ttl 60 s)",
        got_at.duration_since(released)
    );
    guard.release().await.expect("release");
}

/// A future holding a guard that is dropped (aborted task, timeout) frees the lock at once.
pub async fn dropped_future_releases_promptly<H: Harness>(store: &H) {
    let (a, b) = two_runtimes(store).await;
    let (tx, rx) = tokio::sync::oneshot::channel();
    let holder = {
        let a = a.clone();
        tokio::spawn(async move {
            let _guard = a
                .lock("dropped")
                .ttl(Duration::from_secs(30))
                .acquire()
                .await
                .expect("acquire");
            let _ = tx.send(());
            std::future::pending::<()>().await;
        })
    };
    rx.await.expect("holder acquired");
    assert!(
        b.lock("dropped")
            .try_acquire()
            .await
            .expect("try")
            .is_none()
    );
    holder.abort();
    let start = Instant::now();
    let got = b
        .lock("dropped")
        .acquire_timeout(Duration::from_secs(1))
        .await
        .expect("the lock is free within a second, not after its 30 s ttl");
    assert!(start.elapsed() < Duration::from_secs(1));
    got.release().await.expect("release");

    // The same through tokio::time::timeout cancelling the holding future.
    let timed_out = tokio::time::timeout(Duration::from_millis(200), async {
        let _guard = a
            .lock("dropped")
            .ttl(Duration::from_secs(30))
            .acquire()
            .await;
        std::future::pending::<()>().await;
    })
    .await;
    assert!(timed_out.is_err());
    b.lock("dropped")
        .acquire_timeout(Duration::from_secs(1))
        .await
        .expect("free within a second after the timeout")
        .release()
        .await
        .expect("release");
}

/// A panic in the code holding the guard frees the lock at once.
pub async fn panic_releases_promptly<H: Harness>(store: &H) {
    let (a, b) = two_runtimes(store).await;
    let holder = {
        let a = a.clone();
        tokio::spawn(async move {
            let _guard = a
                .lock("panicky")
                .ttl(Duration::from_secs(30))
                .acquire()
                .await
                .expect("acquire");
            tokio::time::sleep(Duration::from_millis(100)).await;
            panic!("the job failed");
        })
    };
    let joined = holder.await;
    assert!(joined.expect_err("the task panicked").is_panic());
    let got = b
        .lock("panicky")
        .acquire_timeout(Duration::from_secs(1))
        .await
        .expect("free within a second of the panic");
    got.release().await.expect("release");
}

/// A waiter wakes when the holder releases, long before the holder's ttl.
pub async fn waiter_wakes_on_release<H: Harness>(store: &H) {
    let (a, b) = two_runtimes(store).await;
    release_wakes_waiter(&a, &b, "handoff").await;
}

/// `holder` takes `key` for 30 s and releases it while `waiter` waits for it: the waiter gets
/// it within 2 s of the release. Its fallback (retrying when the holder's ttl runs out) would
/// take 30 s, so only the published release can pass this.
pub async fn release_wakes_waiter(holder: &LockRuntime, waiter: &LockRuntime, key: &str) {
    let guard = holder
        .lock(key)
        .ttl(Duration::from_secs(30))
        .try_acquire()
        .await
        .free();
    let b = waiter.clone();
    let key_owned = key.to_owned();
    let waiter = tokio::spawn(async move {
        let guard = b.lock(key_owned).acquire().await.expect("acquire");
        (Instant::now(), guard)
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !waiter.is_finished(),
        "the waiter must wait while the lock is held"
    );
    let released = Instant::now();
    assert!(guard.release().await.expect("release"));
    let (woke, got) = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("waiter wakes long before the 30 s ttl")
        .expect("waiter task");
    assert!(woke.duration_since(released) < Duration::from_secs(2));
    got.release().await.expect("release");
}

/// acquire_timeout gives up with WaitTimeout.
pub async fn wait_timeout_gives_up<H: Harness>(store: &H) {
    let (a, b) = two_runtimes(store).await;
    let guard = a.lock("busy").try_acquire().await.free();
    let start = Instant::now();
    let err = b
        .lock("busy")
        .acquire_timeout(Duration::from_millis(400))
        .await
        .expect_err("the lock stays held");
    match err {
        LockError::WaitTimeout { key, waited } => {
            assert_eq!(key, "busy");
            assert!(waited >= Duration::from_millis(400));
        }
        other => panic!("expected WaitTimeout, got {other:?}"),
    }
    assert!(start.elapsed() < Duration::from_secs(5));
    guard.release().await.expect("release");
}

/// A holder that stops renewing (watchdog off) lets a waiter in once its ttl runs out.
pub async fn expired_holder_lets_waiter_in<H: Harness>(store: &H) {
    let (a, b) = two_runtimes(store).await;
    let guard = a
        .lock("expiring")
        .ttl(Duration::from_millis(500))
        .watchdog(false)
        .try_acquire()
        .await
        .free();
    let expired_fence = guard.lease().fence().await.expect("a fence");
    let got = b
        .lock("expiring")
        .acquire_timeout(Duration::from_secs(5))
        .await
        .expect("the waiter gets the lock after the ttl");
    assert!(guard.lease().is_lost());
    assert!(got.lease().fence().await.expect("a fence") > expired_fence);
    drop(guard);
    got.release().await.expect("release");
}

/// inspect reports owner, fence and remaining ttl of the holder, and None when free.
pub async fn inspect_shows_holder<H: Harness>(store: &H) {
    let a = store.runtime().await;
    assert!(a.inspect("shown").await.expect("inspect").is_none());
    let guard = a
        .lock("shown")
        .ttl(Duration::from_secs(20))
        .try_acquire()
        .await
        .free();
    let info = a.inspect("shown").await.expect("inspect").expect("held");
    assert_eq!(info.key, "shown");
    assert_eq!(info.owner, a.owner());
    // A store that fences on demand shows no fence before the holder asked for one; once
    // asked, every store shows it.
    let fence = guard.lease().fence().await.expect("a fence");
    assert!(info.fence.is_none_or(|f| f == fence), "{info:?}");
    let info = a.inspect("shown").await.expect("inspect").expect("held");
    assert_eq!(info.fence, Some(fence));
    let remaining = info.remaining.expect("a lease has an expiry");
    assert!(remaining <= Duration::from_secs(20) && remaining > Duration::from_secs(10));
    guard.release().await.expect("release");
    assert!(a.inspect("shown").await.expect("inspect").is_none());
}

/// extend lengthens a lease; max_hold stops renewals so the lease expires and is lost.
pub async fn extend_and_max_hold<H: Harness>(store: &H) {
    let a = store.runtime().await;
    let guard = a
        .lock("extended")
        .ttl(Duration::from_millis(600))
        .watchdog(false)
        .try_acquire()
        .await
        .free();
    assert!(guard.extend(Duration::from_secs(5)).await.expect("extend"));
    tokio::time::sleep(Duration::from_millis(900)).await;
    assert!(!guard.lease().is_lost(), "extended past the original ttl");
    assert!(guard.release().await.expect("release"));

    let capped = a
        .lock("capped")
        .ttl(Duration::from_millis(400))
        .max_hold(Duration::from_millis(800))
        .try_acquire()
        .await
        .free();
    tokio::time::timeout(Duration::from_secs(5), capped.lease().lost())
        .await
        .expect("renewals stop after max_hold and the lease is lost");
    // The holder's validity ends a drift margin before the store's record expires.
    let rt: LockRuntime = a.clone();
    let retaken = rt
        .lock("capped")
        .acquire_timeout(Duration::from_secs(2))
        .await
        .expect("the capped lease expired in the store too");
    assert!(retaken.release().await.expect("release"));
    drop(capped);
}
