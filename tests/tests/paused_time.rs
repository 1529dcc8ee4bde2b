//! The memory store follows tokio's clock, so tests of lock expiry can pause time.

use lock_tests::Built;
use lock_tests::Free;
use lock_tests::TakeFree;
use std::time::Duration;

use lock_runtime::{LockRuntime, MemoryStore};

#[tokio::test(start_paused = true)]
async fn memory_store_ttl_is_deterministic_under_paused_time() {
    let store = MemoryStore::new();
    let a = LockRuntime::builder().memory(store.clone()).built().await;
    let b = LockRuntime::builder().memory(store).built().await;

    let unrenewed = a
        .lock("report")
        .ttl(Duration::from_secs(60))
        .watchdog(false)
        .try_acquire()
        .await
        .free();
    let start = tokio::time::Instant::now();
    tokio::time::advance(Duration::from_millis(59_999)).await;
    assert!(
        b.lock("report").try_acquire().await.expect("try").is_none(),
        "1 ms before expiry"
    );
    tokio::time::advance(Duration::from_millis(1)).await;
    assert!(unrenewed.lease().is_lost());
    let taken = b.take_default_ttl("report").await;
    // Only virtual time passed.
    assert_eq!(start.elapsed(), Duration::from_secs(60));
    drop(taken);

    // With the watchdog on, a lease outlives its ttl many times over in virtual time.
    let renewed = a.take("renewed", Duration::from_secs(10)).await;
    tokio::time::sleep(Duration::from_secs(3600)).await;
    assert!(!renewed.lease().is_lost());
    assert!(b.try_take("renewed").await.is_none());
    assert!(renewed.release().await.expect("release"));
}
