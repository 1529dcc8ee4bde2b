//! The `metrics` feature: a scripted run on the memory store under a debugging recorder, and
//! the values it must have recorded.

use lock_tests::Built;
use lock_tests::TakeFree;
use std::collections::HashMap;
use std::time::Duration;

use lock_runtime::{LockError, LockRuntime, MemoryStore};
use metrics_util::MetricKind;
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};

/// name -> (key label -> value), counters and gauges as f64, histograms as sample counts.
fn read(snapshotter: &Snapshotter) -> HashMap<String, HashMap<String, f64>> {
    let mut out: HashMap<String, HashMap<String, f64>> = HashMap::new();
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        let (kind, key) = key.into_parts();
        let label = key
            .labels()
            .find(|l| l.key() == "key")
            .map(|l| l.value().to_owned())
            .unwrap_or_default();
        let v = match (kind, value) {
            (MetricKind::Counter, DebugValue::Counter(c)) => c as f64,
            (MetricKind::Gauge, DebugValue::Gauge(g)) => g.into_inner(),
            (MetricKind::Histogram, DebugValue::Histogram(h)) => h.len() as f64,
            _ => continue,
        };
        out.entry(key.name().to_owned())
            .or_default()
            .insert(label, v);
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scripted_run_records_every_metric() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder
        .install()
        .expect("the only recorder of this test binary");

    let store = MemoryStore::new();
    let a = LockRuntime::builder()
        .memory(store.clone())
        // Bounded cardinality: `report:<date>` keys share the label `report`.
        .metrics_key_label(|key| key.split(':').next().unwrap_or(key).to_owned())
        .built()
        .await;
    let b = LockRuntime::builder().memory(store.clone()).built().await;

    // 2 acquisitions and releases on two `report:` keys.
    for day in ["report:1", "report:2"] {
        let guard = a.take_default_ttl(day).await;
        guard.release().await.expect("release");
    }
    // Held: a contended attempt, then a wait that times out, then one that succeeds.
    let held = a.take("job", Duration::from_secs(30)).await;
    assert!(b.lock("job").try_acquire().await.expect("try").is_none());
    assert!(matches!(
        b.lock("job")
            .acquire_timeout(Duration::from_millis(200))
            .await,
        Err(LockError::WaitTimeout { .. })
    ));
    let waiter = lock_tests::acquire_in_task(b.clone(), "job", Duration::from_secs(5));
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(held.release().await.expect("release"));
    let waited = waiter
        .await
        .expect("task")
        .expect("acquired after the release");
    // A lost lease: the store forgets everything behind the holder's back.
    let doomed = a.take("doomed", Duration::from_millis(300)).await;
    store.clear();
    tokio::time::timeout(Duration::from_secs(2), doomed.lease().lost())
        .await
        .expect("lost");

    let m = read(&snapshotter);
    let get = |name: &str, label: &str| {
        m.get(name)
            .and_then(|l| l.get(label))
            .copied()
            .unwrap_or(0.0)
    };
    assert_eq!(
        get("distributed_lock_acquired_total", "report"),
        2.0,
        "{m:?}"
    );
    assert_eq!(get("distributed_lock_released_total", "report"), 2.0);
    assert_eq!(
        get("distributed_lock_hold_seconds", "report"),
        2.0,
        "two hold samples"
    );
    assert_eq!(get("distributed_lock_leases_held", "report"), 0.0);
    // `job`: a (1 acquired) + b (1 contended try, attempts during waits, 1 acquired).
    assert_eq!(get("distributed_lock_acquired_total", "job"), 2.0);
    assert_eq!(
        get("distributed_lock_leases_held", "job"),
        1.0,
        "the waiter still holds it"
    );
    assert!(get("distributed_lock_contended_total", "job") >= 2.0);
    assert_eq!(get("distributed_lock_wait_timeouts_total", "job"), 1.0);
    assert_eq!(
        get("distributed_lock_wait_seconds", "job"),
        1.0,
        "one successful wait"
    );
    assert_eq!(get("distributed_lock_lost_total", "doomed"), 1.0);
    assert_eq!(
        get("distributed_lock_leases_held", "doomed"),
        0.0,
        "a lost lease leaves the gauge"
    );
    assert!(get("distributed_lock_attempts_total", "job") >= 4.0);
    drop(waited);
    drop(doomed);
}
