//! The memory store follows tokio's clock, so tests of lock expiry can pause time.

use std::time::Duration;

use lock_runtime::{LockRuntime, MemoryStore};

#[tokio::test(start_paused = true)]
async fn memory_store_ttl_is_deterministic_under_paused_time() {
    let store = MemoryStore::new();
    let a = LockRuntime::builder()
        .memory(store.clone())
        .build()
        .await
        .expect("build");
    let b = LockRuntime::builder()
        .memory(store)
        .build()
        .await
        .expect("build");

    let unrenewed = a
        .lock("report")
        .ttl(Duration::from_secs(60))
        .watchdog(false)
        .try_acquire()
        .await
        .expect("acquire")
        .expect("free");
    let start = tokio::time::Instant::now();
    tokio::time::advance(Duration::from_millis(59_999)).await;
    assert!(
        b.lock("report").try_acquire().await.expect("try").is_none(),
        "1 ms before expiry"
    );
    tokio::time::advance(Duration::from_millis(1)).await;
    assert!(unrenewed.lease().is_lost());
    let taken = b
        .lock("report")
        .try_acquire()
        .await
        .expect("try")
        .expect("expired at exactly 60 s");
    // Only virtual time passed.
    assert_eq!(start.elapsed(), Duration::from_secs(60));
    drop(taken);

    // With the watchdog on, a lease outlives its ttl many times over in virtual time.
    let renewed = a
        .lock("renewed")
        .ttl(Duration::from_secs(10))
        .try_acquire()
        .await
        .expect("acquire")
        .expect("free");
    tokio::time::sleep(Duration::from_secs(3600)).await;
    assert!(!renewed.lease().is_lost());
    assert!(
        b.lock("renewed")
            .try_acquire()
            .await
            .expect("try")
            .is_none()
    );
    assert!(renewed.release().await.expect("release"));
}
