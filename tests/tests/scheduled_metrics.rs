//! The scheduled jobs' metrics (feature `metrics`): `scheduled_firings_total{job, outcome}`
//! and `scheduled_run_seconds{job}`, from a scripted run on the memory store and tokio's
//! paused clock, under a debugging recorder (the only one of this test binary).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, UNIX_EPOCH};

use lock_runtime::{LockRuntime, MemoryStore, Scheduler, distributed_lock, scheduled};
use lock_tests::Built;
use metrics_util::MetricKind;
use metrics_util::debugging::{DebugValue, DebuggingRecorder};

static RUNS: AtomicU32 = AtomicU32::new(0);

#[scheduled(every = "1s", name = "metered")]
#[distributed_lock(key = "metered", ttl = "10s")]
async fn metered() -> anyhow::Result<()> {
    let run = RUNS.fetch_add(1, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(100)).await;
    anyhow::ensure!(run.is_multiple_of(2), "every second run fails");
    Ok(())
}

/// Two instances with one clock, four firings: one instance runs each (two ok, two failed),
/// the other finds the firing's marker (four skipped_done); four run times.
#[tokio::test(start_paused = true)]
async fn firings_are_counted_by_job_and_outcome() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder
        .install()
        .expect("the only recorder of this test binary");
    let store = MemoryStore::new();
    let start = UNIX_EPOCH + Duration::from_secs(1_796_126_400);
    let mut handles = Vec::new();
    for owner in ["a", "b"] {
        let runtime = LockRuntime::builder()
            .memory(store.clone())
            .owner(owner)
            .built()
            .await;
        handles.push(tokio::spawn(
            Scheduler::new(runtime)
                .only(["metered"])
                .wall_clock_from(start)
                .run_until(tokio::time::sleep(Duration::from_millis(4_500))),
        ));
    }
    for handle in handles {
        handle.await.expect("the task").expect("the scheduler ran");
    }
    let mut firings: BTreeMap<String, u64> = BTreeMap::new();
    let mut run_times = 0;
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        let (kind, key) = key.into_parts();
        let label = |name: &str| {
            key.labels()
                .find(|l| l.key() == name)
                .map(|l| l.value().to_owned())
                .unwrap_or_default()
        };
        match (key.name(), kind, value) {
            ("scheduled_firings_total", MetricKind::Counter, DebugValue::Counter(n)) => {
                assert_eq!(label("job"), "metered");
                firings.insert(label("outcome"), n);
            }
            ("scheduled_run_seconds", MetricKind::Histogram, DebugValue::Histogram(h)) => {
                assert_eq!(label("job"), "metered");
                run_times = h.len();
                assert!(
                    h.iter().all(|s| s.into_inner() >= 0.1),
                    "each run took 100 ms: {h:?}"
                );
            }
            _ => {}
        }
    }
    let expected: BTreeMap<String, u64> = [("ok", 2), ("failed", 2), ("skipped_done", 4)]
        .into_iter()
        .map(|(o, n)| (o.to_owned(), n))
        .collect();
    assert_eq!(firings, expected);
    assert_eq!(run_times, 4);
}
