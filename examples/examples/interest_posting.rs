//! The nightly interest posting as a scheduled job, on five service instances whose clocks
//! are apart by up to two seconds.
//!
//! Each instance is its own `LockRuntime` and `Scheduler` (as five processes would be), all
//! firing the same `#[scheduled]` + `#[distributed_lock]` fn. A "night" is compressed into a
//! firing every 2 s, and the job takes 50 ms, much less than the clocks' spread: without the
//! firing's marker the instances behind would find the lock free and post again. Exactly one
//! instance posts per night, with neither `min_hold` nor `once`; the demo checks it. The
//! posting is also idempotent per night and fenced, so even a forced second run (an operator
//! re-running it by hand) posts nothing twice.
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
//!
//! or on ZooKeeper (a connect string; its servers must take TTL nodes):
//!
//!     ZOOKEEPER_CONNECT=127.0.0.1:2181 cargo run -p lock-examples --example interest_posting
//!
//! `RUST_LOG=lock_runtime=info` shows every instance's report of every firing.

use std::collections::BTreeMap;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use lock_examples::ledger::{Ledger, Posting};
use lock_runtime::{
    LockRuntime, MemoryStore, Scheduler, current_firing, current_lease, distributed_lock, scheduled,
};

/// The instances' clocks, against this machine's: 0, +0.4, -0.7, +1.2 and -1.9 s.
const SKEWS_MS: [i64; 5] = [0, 400, -700, 1200, -1900];
/// How long the instances run: the nights they all see, and the spread of their clocks.
const RUN_FOR: Duration = Duration::from_millis(7_500);
/// The fewest nights every run covers (a night every 2 s, seen through the spread clocks).
const AT_LEAST_NIGHTS: usize = 3;

static LEDGER: OnceLock<Ledger> = OnceLock::new();
/// Postings per night, as the job bodies saw them.
static POSTED: Mutex<BTreeMap<u64, Vec<String>>> = Mutex::new(BTreeMap::new());

/// Posts one night's interest: once per firing, on whichever instance reaches it first.
#[scheduled(every = "2s", name = "interest-posting")]
#[distributed_lock(key = "interest-posting", ttl = "60s")]
async fn post_daily_interest() -> anyhow::Result<()> {
    let firing = current_firing().context("inside a scheduled run")?;
    let lease = current_lease().context("inside a locked body")?;
    let instance = LockRuntime::current()?.owner().to_owned();
    let night = firing
        .scheduled_at()
        .duration_since(UNIX_EPOCH)
        .context("after 1970")?
        .as_secs();
    // Computing interest on every account takes a while.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let ledger = LEDGER.get().context("the ledger is set up")?;
    let posting = ledger
        .post_interest(
            &format!("night-{night}"),
            &instance,
            lease.fence().await?,
            lease.token(),
        )
        .await?;
    println!("{instance}: night {night}: {posting:?}");
    if let Ok(mut posted) = POSTED.lock() {
        posted.entry(night).or_default().push(instance);
    }
    Ok(())
}

async fn instance_runtime(name: &str, store: &MemoryStore) -> anyhow::Result<LockRuntime> {
    let builder = LockRuntime::builder().namespace("demo").owner(name);
    let builder = match (
        std::env::var("DATABASE_URL"),
        std::env::var("REDIS_URL"),
        std::env::var("ETCD_ENDPOINTS"),
        std::env::var("ZOOKEEPER_CONNECT"),
    ) {
        (Ok(url), ..) => builder.postgres(url),
        (_, Ok(url), ..) => builder.redis(url),
        (_, _, Ok(endpoints), _) => builder.etcd(endpoints.split(',').map(str::to_owned)),
        (.., Ok(connect)) => builder.zookeeper(connect),
        _ => builder.memory(store.clone()),
    };
    Ok(builder.build().await?)
}

fn skewed(now: SystemTime, ms: i64) -> SystemTime {
    let by = Duration::from_millis(ms.unsigned_abs());
    if ms >= 0 { now + by } else { now - by }
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
    } else if std::env::var("ZOOKEEPER_CONNECT").is_ok() {
        "ZooKeeper (ZOOKEEPER_CONNECT)"
    } else {
        "the in-process memory store"
    };
    println!(
        "{} instances, clocks apart by {SKEWS_MS:?} ms, a night every 2 s, on {store_name}\n",
        SKEWS_MS.len()
    );

    // On PostgreSQL the ledger lives in the same database as the locks.
    let ledger = match std::env::var("DATABASE_URL") {
        Ok(url) => Ledger::postgres(&url).await?,
        Err(_) => Ledger::memory(),
    };
    let _ = LEDGER.set(ledger.clone());

    // Graceful shutdown: on Ctrl-C or SIGTERM every scheduler stops firing, lets a running
    // posting finish within the grace period and shuts its runtime down, which releases
    // whatever it still holds.
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
            _ = tokio::time::sleep(RUN_FOR) => return,
        }
        println!("stopping: shutting the instances down");
        let _ = stop_tx.send(true);
    });

    let store = MemoryStore::new();
    let now = SystemTime::now();
    let mut instances = Vec::new();
    for (i, skew) in SKEWS_MS.iter().enumerate() {
        let runtime = instance_runtime(&format!("instance-{}", i + 1), &store).await?;
        let mut stop = stop_rx.clone();
        let scheduler = Scheduler::new(runtime)
            .only(["interest-posting"])
            .wall_clock_from(skewed(now, *skew));
        instances.push(tokio::spawn(scheduler.run_until(async move {
            tokio::select! {
                _ = tokio::time::sleep(RUN_FOR) => {}
                _ = stop.wait_for(|stopped| *stopped) => {}
            }
        })));
    }
    for instance in instances {
        instance.await??;
    }
    let stopped_early = *stop_rx.borrow();
    let posted = POSTED.lock().map(|p| p.clone()).unwrap_or_default();

    // An operator forces a second run of the first night by hand, bypassing the lock: the
    // ledger's per-night marker keeps the posting single.
    let (&first, _) = posted.iter().next().context("no night was posted")?;
    let forced = ledger
        .post_interest(&format!("night-{first}"), "operator", u64::MAX, "operator")
        .await?;
    println!("\nforced re-run of night {first} by an operator: {forced:?}");
    // A write with the fence of a night's last writer but another token (two holders handed
    // one fence) is refused like a stale one.
    let second = format!(
        "night-{}",
        posted.keys().nth(1).copied().context("a second night")?
    );
    let last = ledger.highest_fence(&second).await?;
    let twin = ledger
        .post_interest(&second, "twin", last, "another-token")
        .await?;
    println!("same fence, another token, for {second}: {twin:?}");
    anyhow::ensure!(
        matches!(twin, Posting::StaleFence { .. }),
        "an equal fence from another token must be refused"
    );

    let postings = ledger.postings().await?;
    let per_night: Vec<usize> = posted.values().map(Vec::len).collect();
    println!("postings per night: {per_night:?}; ledger holds {postings} postings");
    if stopped_early {
        println!("stopped early; every instance released its locks.");
        return Ok(());
    }
    anyhow::ensure!(
        per_night.iter().all(|&n| n == 1) && postings == per_night.len(),
        "expected exactly one posting per night"
    );
    anyhow::ensure!(
        per_night.len() >= AT_LEAST_NIGHTS,
        "expected at least {AT_LEAST_NIGHTS} nights in {RUN_FOR:?}, saw {}",
        per_night.len()
    );
    println!("exactly one posting per night, on clocks up to 1.9 s apart.");
    Ok(())
}
