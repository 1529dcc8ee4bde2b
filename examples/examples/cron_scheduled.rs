//! A job scheduled with tokio-cron-scheduler on two instances: the cron fires on both, the
//! lock lets one run each time. Stops by itself after a few firings.
//!
//!     cargo run -p lock-examples --example cron_scheduled

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use lock_runtime::{LockRuntime, MemoryStore, distributed_lock};
use tokio_cron_scheduler::{Job, JobScheduler};

/// Every two seconds on every instance; runs on one. The key names the firing's second so each
/// firing is its own lock, and `min_hold` covers schedulers that fire a little apart.
#[distributed_lock(key = "purge-sessions:{slot}", ttl = "30s", min_hold = "1s")]
async fn purge_expired_sessions(slot: u64, instance: &str, runs: Arc<AtomicU64>) {
    runs.fetch_add(1, Ordering::SeqCst);
    println!("{instance}: purged expired sessions for slot {slot}");
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let store = MemoryStore::new();
    let runs = Arc::new(AtomicU64::new(0));
    let mut schedulers = Vec::new();
    for name in ["instance-a", "instance-b"] {
        let runtime = LockRuntime::builder()
            .memory(store.clone())
            .owner(name)
            .build()
            .await?;
        let scheduler = JobScheduler::new().await?;
        let runs = runs.clone();
        scheduler
            .add(Job::new_async("*/2 * * * * *", move |_id, _scheduler| {
                let runtime = runtime.clone();
                let runs = runs.clone();
                Box::pin(async move {
                    let now = std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .unwrap_or_default();
                    let slot = now.as_secs() / 2;
                    runtime
                        .scope(purge_expired_sessions(slot, name, runs))
                        .await;
                })
            })?)
            .await?;
        scheduler.start().await?;
        schedulers.push(scheduler);
    }
    tokio::time::sleep(Duration::from_secs(7)).await;
    for mut scheduler in schedulers {
        scheduler.shutdown().await?;
    }
    println!(
        "two instances, one cron schedule: {} runs in about 3 firings",
        runs.load(Ordering::SeqCst)
    );
    Ok(())
}
