//! A store that computes fences on demand (`lock_tests::OnDemandFences`: the memory store, its
//! fence kept back at acquire and handed out only to the token whose record it still is; the
//! whole kit runs on it in memory_suite.rs). `Lease::fence` asks once and keeps the answer, fails
//! with `Lost` (marking the lease lost) when the record is gone, and cannot be asked by a
//! lease that is no longer held.

use std::sync::atomic::Ordering;
use std::time::Duration;

use lock_runtime::{LockError, LockRuntime};
use lock_tests::{Built, OnDemandFences as OnDemand, TakeFree};

async fn runtime_on(store: &OnDemand) -> LockRuntime {
    LockRuntime::builder().store(store.clone()).built().await
}

/// The fence is unknown until asked; concurrent first calls ask the store once and get the
/// same fence; later calls answer from the lease; a later holder's fence is greater.
#[tokio::test]
async fn a_fence_is_asked_for_once_and_kept() {
    let store = OnDemand::default();
    let runtime = runtime_on(&store).await;
    let guard = runtime.take("on-demand", Duration::from_secs(10)).await;
    let lease = guard.lease().clone();
    assert_eq!(lease.known_fence(), None, "no fence before it is asked for");
    assert_eq!(store.asked.load(Ordering::SeqCst), 0);
    let (a, b) = tokio::join!(lease.fence(), lease.fence());
    let fence = a.expect("a fence");
    assert_eq!(b.expect("a fence"), fence);
    assert_eq!(lease.fence().await.expect("a fence"), fence);
    assert_eq!(lease.known_fence(), Some(fence));
    assert_eq!(store.asked.load(Ordering::SeqCst), 1, "asked once");
    assert!(guard.release().await.expect("a release"));
    // Known before the release: still answered after it, without asking.
    assert_eq!(lease.fence().await.expect("the kept fence"), fence);
    let next = runtime.take("on-demand", Duration::from_secs(10)).await;
    let later = next.lease().fence().await.expect("a fence");
    assert!(later > fence, "{later} after {fence}");
    next.release().await.expect("a release");
    runtime.shutdown().await;
}

/// A lease whose record the store no longer has cannot obtain a fence: the call fails with
/// `Lost` and the lease is lost from then on. A released lease that never asked cannot either,
/// and the store is not asked.
#[tokio::test]
async fn a_lease_that_is_not_held_gets_no_fence() {
    let store = OnDemand::default();
    let runtime = runtime_on(&store).await;
    let guard = runtime.take("gone", Duration::from_secs(10)).await;
    let lease = guard.lease().clone();
    store.store.clear();
    let err = lease.fence().await.expect_err("the record is gone");
    assert!(
        matches!(&err, LockError::Lost { key } if key == "gone"),
        "{err:?}"
    );
    assert!(lease.is_lost(), "told lost");
    drop(guard);

    let guard = runtime.take("released", Duration::from_secs(10)).await;
    let lease = guard.lease().clone();
    guard.release().await.expect("a release");
    let asked = store.asked.load(Ordering::SeqCst);
    let err = lease.fence().await.expect_err("released before asking");
    assert!(matches!(err, LockError::Lost { .. }), "{err:?}");
    assert_eq!(
        store.asked.load(Ordering::SeqCst),
        asked,
        "the store was not asked"
    );
    runtime.shutdown().await;
}
