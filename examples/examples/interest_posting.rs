//! The nightly interest posting, run by five service instances at every tick of a schedule.
//!
//! Each instance is its own `LockRuntime` (as five processes would be), all calling the same
//! annotated `post_daily_interest`. Exactly one posts per night; the others are told another
//! instance holds the lock and skip. The posting is also idempotent per date and fenced, so
//! even a forced second run (an operator re-running it by hand) posts nothing twice.
//!
//! Runs on the in-process memory store by default:
//!     cargo run -p lock-examples --example interest_posting
//! or on a real Redis:
//!     REDIS_URL=redis://127.0.0.1:6379 cargo run -p lock-examples --example interest_posting
//! or on PostgreSQL (the table `lock_records` is created if missing; the ledger then lives in
//! the same database, in `demo_interest_fences` and `demo_interest_postings`, and checks the
//! fence in the transaction that writes the posting):
//!     DATABASE_URL=postgres://user:password@127.0.0.1:5432/db \
//!         cargo run -p lock-examples --example interest_posting
//! or on etcd (the endpoints separated by commas; the ledger stays in memory):
//!     ETCD_ENDPOINTS=http://127.0.0.1:2379 cargo run -p lock-examples --example interest_posting

use std::time::Duration;

use anyhow::Context;
use lock_examples::ledger::{Ledger, Posting};
use lock_runtime::{LockRuntime, MemoryStore, current_lease, distributed_lock};

const INSTANCES: usize = 5;
const NIGHTS: usize = 3;
/// One "night" of the demo schedule; a real service would use a cron expression for 2 AM.
const TICK: Duration = Duration::from_millis(1500);

/// Posts one night's interest. Runs on one instance only; the others get `Ok(None)`.
/// `min_hold` keeps the lock a little after the work, so an instance whose clock or scheduler
/// fires late still finds it taken.
#[distributed_lock(
    key = "interest-posting:{date}",
    ttl = "60s",
    min_hold = "1s",
    on_contention = "skip"
)]
async fn post_daily_interest(
    date: &str,
    instance: &str,
    ledger: &Ledger,
) -> anyhow::Result<Option<Posting>> {
    let lease = current_lease().context("inside a locked body")?;
    // Computing interest on every account takes a while.
    tokio::time::sleep(Duration::from_millis(300)).await;
    Ok(Some(
        ledger
            .post_interest(date, instance, lease.fence(), lease.token())
            .await?,
    ))
}

async fn instance_runtime(name: &str, store: &MemoryStore) -> anyhow::Result<LockRuntime> {
    let builder = LockRuntime::builder().namespace("demo").owner(name);
    let builder = match (
        std::env::var("DATABASE_URL"),
        std::env::var("REDIS_URL"),
        std::env::var("ETCD_ENDPOINTS"),
    ) {
        (Ok(url), _, _) => builder.postgres(url),
        (_, Ok(url), _) => builder.redis(url),
        (_, _, Ok(endpoints)) => builder.etcd(endpoints.split(',').map(str::to_owned)),
        _ => builder.memory(store.clone()),
    };
    Ok(builder.build().await?)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .init();
    let store_name = if std::env::var("DATABASE_URL").is_ok() {
        "PostgreSQL (DATABASE_URL)"
    } else if std::env::var("REDIS_URL").is_ok() {
        "Redis (REDIS_URL)"
    } else if std::env::var("ETCD_ENDPOINTS").is_ok() {
        "etcd (ETCD_ENDPOINTS)"
    } else {
        "the in-process memory store"
    };
    println!("{INSTANCES} instances, {NIGHTS} nights, on {store_name}\n");

    // Graceful shutdown: on Ctrl-C or SIGTERM every instance stops at its next tick and calls
    // `LockRuntime::shutdown()`, which releases whatever it still holds (waiters elsewhere
    // wake at once) and stops its watchdog.
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        let mut terminate =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(signal) => signal,
                Err(_) => return,
            };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = terminate.recv() => {}
        }
        println!("stopping: shutting the instances down");
        let _ = stop_tx.send(true);
    });

    let store = MemoryStore::new();
    // On PostgreSQL the ledger lives in the same database as the locks.
    let ledger = match std::env::var("DATABASE_URL") {
        Ok(url) => Ledger::postgres(&url).await?,
        Err(_) => Ledger::memory(),
    };
    let start = tokio::time::Instant::now() + Duration::from_millis(200);
    let mut instances = Vec::new();
    for i in 1..=INSTANCES {
        let name = format!("instance-{i}");
        let runtime = instance_runtime(&name, &store).await?;
        let ledger = ledger.clone();
        let mut stop = stop_rx.clone();
        instances.push(tokio::spawn(async move {
            let mut outcomes = Vec::new();
            for night in 0..NIGHTS {
                // Schedulers on different machines never fire at the same instant.
                let skew = Duration::from_millis((i as u64 * 37 + night as u64 * 53) % 120);
                tokio::select! {
                    _ = tokio::time::sleep_until(start + TICK * night as u32 + skew) => {}
                    _ = stop.wait_for(|stopped| *stopped) => break,
                }
                let date = format!("2026-12-{:02}", night + 1);
                let result = runtime
                    .scope(post_daily_interest(&date, &name, &ledger))
                    .await;
                let line = match &result {
                    Ok(Some(Posting::Posted { fence })) => {
                        format!("{name}: posted interest for {date} (fence {fence})")
                    }
                    Ok(Some(other)) => format!("{name}: ledger refused the posting: {other:?}"),
                    Ok(None) => {
                        format!("{name}: another instance holds the lock for {date}; skipped")
                    }
                    Err(e) => format!("{name}: failed: {e:#}"),
                };
                println!("{line}");
                outcomes.push(result.ok().flatten());
            }
            runtime.shutdown().await;
            outcomes
        }));
    }
    let mut posted_per_night = vec![0usize; NIGHTS];
    for instance in instances {
        for (night, outcome) in instance.await?.into_iter().enumerate() {
            if matches!(outcome, Some(Posting::Posted { .. })) {
                posted_per_night[night] += 1;
            }
        }
    }
    let stopped_early = *stop_rx.borrow();

    // An operator forces a second run of night 1 by hand, bypassing the lock: the ledger's
    // per-date marker keeps the posting single.
    let forced = ledger
        .post_interest("2026-12-01", "operator", u64::MAX, "operator")
        .await?;
    println!("\nforced re-run of 2026-12-01 by an operator: {forced:?}");
    // A write with the fence of the night's last writer but another token (two holders handed
    // one fence) is refused like a stale one.
    let last = ledger.highest_fence("2026-12-02").await?;
    let twin = ledger
        .post_interest("2026-12-02", "twin", last, "another-token")
        .await?;
    println!("same fence, another token, for 2026-12-02: {twin:?}");
    anyhow::ensure!(
        matches!(twin, Posting::StaleFence { .. }),
        "an equal fence from another token must be refused"
    );

    let postings = ledger.postings().await?;
    println!("postings per night: {posted_per_night:?}; ledger holds {postings} postings");
    if stopped_early {
        println!("stopped before the last night; every instance released its locks.");
        return Ok(());
    }
    anyhow::ensure!(
        posted_per_night.iter().all(|&n| n == 1) && postings == NIGHTS,
        "expected exactly one posting per night"
    );
    println!("exactly one posting per night.");
    Ok(())
}
