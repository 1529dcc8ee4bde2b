//! A lease that is lost stays lost, and nothing runs on it: `on_lost = "abort"` stops the
//! body, a lease lost at grant never starts it, `is_lost` never turns back, and a body that
//! succeeded still leaves its `once` marker.
//! Each test failed on the code before its fix (docs/SAFETY.md); its comments say how.

use lock_tests::Built;
use lock_tests::Free;
use lock_tests::TakeFree;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use lock_runtime::{LockError, LockRuntime, MemoryStore, current_lease, distributed_lock};
use lock_tests::{FaultProxy, RedisServer, TestStore, redis_runtime};

// Finding 3 (a waiter whose runtime shuts down gets `LockError::Shutdown`) and finding 4 (shutdown
// is graceful) are conformance-kit cases now, run on every store: `shutdown_ends_waiters`,
// `shutdown_lets_running_jobs_finish`, `shutdown_releases_everything` (lock-testkit). Their
// tests that need a fault proxy or a stopped process stay here, further down.

// Finding 5: with on_lost = "abort", the body is not polled again once the lease is lost.
// Before: `select!` polled the body first, so a body woken by the same loss ran on and
// completed its write after the lease was gone.

#[distributed_lock(
    key = "abort-order",
    ttl = "600ms",
    watchdog = false,
    on_lost = "abort"
)]
async fn writes_after_loss(wrote: Arc<AtomicBool>) -> Result<(), LockError> {
    if let Some(lease) = current_lease() {
        lease.lost().await;
    }
    wrote.store(true, Ordering::SeqCst);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abort_checks_the_loss_before_polling_the_body() {
    let runtime = TestStore::memory().runtime().await;
    let wrote = Arc::new(AtomicBool::new(false));
    let result = runtime.scope(writes_after_loss(wrote.clone())).await;
    assert!(
        matches!(result, Err(LockError::Lost { .. })),
        "expected Lost, got {result:?}"
    );
    assert!(
        !wrote.load(Ordering::SeqCst),
        "the body ran on after its lease was lost"
    );
}

#[distributed_lock(key = "born-lost", ttl = "300ms", on_lost = "abort")]
async fn never_starts(started: Arc<AtomicBool>) -> Result<(), LockError> {
    started.store(true, Ordering::SeqCst);
    Ok(())
}

/// A lease already lost when it is granted (the acquire's round trip took longer than the
/// ttl) never starts the body: the grant is given back and the call fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_lost_at_grant_never_starts_the_body() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    let runtime = redis_runtime(proxy.url(), Duration::from_secs(5)).await;
    proxy.set_latency(Duration::from_millis(200));
    let started = Arc::new(AtomicBool::new(false));
    let result = runtime.scope(never_starts(started.clone())).await;
    assert!(result.is_err(), "expected an error, got {result:?}");
    assert!(
        !started.load(Ordering::SeqCst),
        "the body started on a lost lease"
    );
}

// Finding 12: once lost, always lost; a released lease is not held.
// Before: a lease past its validity read as lost, then as valid again after a late extend.

#[tokio::test(start_paused = true)]
async fn once_lost_a_lease_stays_lost() {
    let runtime = LockRuntime::builder()
        .memory(MemoryStore::new())
        .built()
        .await;
    let ttl = Duration::from_secs(10);
    let guard = runtime
        .lock("monotonic")
        .ttl(ttl)
        .watchdog(false)
        .try_acquire()
        .await
        .free();
    assert!(guard.lease().is_held());
    // Past the validity (ttl minus drift) but before the store's record expires.
    tokio::time::advance(ttl - Duration::from_millis(50)).await;
    assert!(guard.lease().is_lost(), "past its validity");
    let extended = guard.extend(ttl).await.expect("extend");
    assert!(!extended, "a lost lease is not extended back to life");
    assert!(guard.lease().is_lost(), "once lost, always lost");
    assert!(!guard.lease().is_held());

    let released = runtime.take("released", ttl).await;
    let lease = released.lease().clone();
    assert!(released.release().await.expect("release"));
    assert!(!lease.is_held(), "a released lease is not held");
    assert!(!lease.is_lost(), "released in time: not lost");
}

// Finding 11: a body that succeeded leaves its `once` marker, even when its lease lapsed while
// it ran, and a re-entrant call with `once` leaves its own. Before: no marker was written in
// either case, and the job silently ran again at the next call.

#[distributed_lock(
    key = "once-lapsed",
    ttl = "1s",
    watchdog = false,
    on_lost = "continue",
    once = "1h"
)]
async fn slow_once(runs: Arc<std::sync::atomic::AtomicU64>) -> Option<()> {
    runs.fetch_add(1, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(2)).await;
    Some(())
}

#[tokio::test(start_paused = true)]
async fn a_once_marker_survives_a_lapsed_lease() {
    let runtime = TestStore::memory().runtime().await;
    let runs = Arc::new(std::sync::atomic::AtomicU64::new(0));
    assert_eq!(runtime.scope(slow_once(runs.clone())).await, Some(()));
    assert_eq!(
        runtime.scope(slow_once(runs.clone())).await,
        None,
        "skipped"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the job ran once");
}
