//! One process of the mixed soak: until its deadline, several tasks take random keys through
//! the runtime and increment each key's fenced counter by a read-sleep-write (one sleep in ten
//! long enough to span renewals and a failover), skipping the
//! write when the lease is already known lost. Every grant, validity check before a write, the
//! write's outcome and the end of each lease go to an event log for the exclusion checker
//! (`lock_tests::exclusion`). Prints `done` at the end.
//!
//! Usage: `soak_worker LOCK_URL RESOURCE_URL KEYS SECONDS SEED TASKS LOG_PATH [careless]`
//! (`LOCK_URL`: `redis://..`, `postgres://..`, or `etcd:` and the endpoints separated by commas)
//!
//! `careless` makes a worker that the checker must catch: without renewals, it sleeps up to
//! 1.5 s (ttl 0.6 s) between read and write and never asks whether its lease is lost.

use std::sync::Arc;
use std::time::{Duration, Instant};

use lock_runtime::{LockGuard, LockRuntime};
use lock_tests::exclusion::{EventLog, monotonic_us};
use lock_tests::fenced::{counter_read, counter_set};
use lock_tests::rng::XorShift;
use redis::aio::ConnectionManager;

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let (careless, args) = match args.split_last() {
        Some((last, rest)) if last == "careless" => (true, rest),
        _ => (false, args.as_slice()),
    };
    let [_, lock_url, resource_url, keys, seconds, seed, tasks, log] = args else {
        anyhow::bail!(
            "usage: soak_worker LOCK_URL RESOURCE_URL KEYS SECONDS SEED TASKS LOG_PATH [careless]"
        );
    };
    let keys: u64 = keys.parse()?;
    let deadline = Instant::now() + Duration::from_secs_f64(seconds.parse()?);
    let seed: u64 = seed.parse()?;
    let log = Arc::new(EventLog::open(log.as_ref())?);
    // A worker (re)started while the store is down (restarting, stalled) retries, as a
    // service restarted by its supervisor would, until its deadline.
    let runtime = loop {
        let builder = LockRuntime::builder();
        let builder = if lock_url.starts_with("postgres") {
            builder.postgres(lock_url.as_str())
        } else if let Some(endpoints) = lock_url.strip_prefix("etcd:") {
            builder.etcd(endpoints.split(','))
        } else {
            builder.redis(lock_url.as_str())
        };
        let built = builder
            .connect_timeout(Duration::from_secs(2))
            .command_timeout(Duration::from_millis(500))
            .build()
            .await;
        match built {
            Ok(runtime) => break runtime,
            Err(e) if e.is_transient() && Instant::now() < deadline => {
                eprintln!("soak_worker: the store is not reachable yet ({e}); retrying");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => return Err(e.into()),
        }
    };
    let resource = redis::Client::open(resource_url.as_str())?
        .get_connection_manager()
        .await?;
    let mut handles = Vec::new();
    for task in 0..tasks.parse::<u64>()? {
        let rng = XorShift::mixed(seed.wrapping_add(task));
        handles.push(tokio::spawn(work(
            runtime.clone(),
            resource.clone(),
            log.clone(),
            rng,
            keys,
            deadline,
            careless,
        )));
    }
    for handle in handles {
        handle.await?;
    }
    runtime.shutdown().await;
    if log.failed() {
        anyhow::bail!("an event line could not be written: the checker would miss it");
    }
    println!("done");
    Ok(())
}

async fn work(
    runtime: LockRuntime,
    mut resource: ConnectionManager,
    log: Arc<EventLog>,
    mut rng: XorShift,
    keys: u64,
    deadline: Instant,
    careless: bool,
) {
    while Instant::now() < deadline {
        let key = format!("k{}", rng.below(keys));
        let Ok(guard) = runtime
            .lock(key.as_str())
            .ttl(Duration::from_millis(600))
            // A careless holder's lease is not renewed, so it does run out under it.
            .watchdog(!careless)
            .acquire_timeout(Duration::from_secs(1))
            .await
        else {
            continue;
        };
        let lease = guard.lease();
        let (fence, token) = (lease.fence(), lease.token().to_owned());
        // The first check, stamped before asking (see lock_tests::exclusion): a lease found
        // lost already was never believed.
        let first_check = monotonic_us();
        if lease.is_lost() {
            let _ = guard.release().await;
            continue;
        }
        log.line(format_args!("G {key} {fence} {token} {first_check}"));
        // One hold in ten outlasts a renewal and a failover's few hundred milliseconds.
        let work_ms = if careless {
            rng.below(1500)
        } else if rng.below(10) == 0 {
            100 + rng.below(300)
        } else {
            rng.below(10)
        };
        let last_valid = increment(
            &mut resource,
            &log,
            &guard,
            &key,
            first_check,
            work_ms,
            careless,
        )
        .await;
        log.line(format_args!("E {key} {token} {last_valid}"));
        let _ = guard.release().await;
    }
}

/// Reads the counter under the fence, works for `work_ms` (a careful holder asks whether its
/// lease is lost every 20 ms, as a job's loop would), checks the lease, writes `value + 1`.
/// Both operations are logged with the check before them and the store's answer. Returns the
/// stamp of the last check that passed.
async fn increment(
    resource: &mut ConnectionManager,
    log: &EventLog,
    guard: &LockGuard,
    key: &str,
    first_check: u64,
    work_ms: u64,
    careless: bool,
) -> u64 {
    let lease = guard.lease();
    let (fence, token) = (lease.fence(), lease.token());
    log.line(format_args!("W {key} {token} {first_check}"));
    let read = counter_read(resource, key, fence, token).await;
    let outcome = match read {
        Ok(Some(_)) => "1",
        Ok(None) => "0",
        Err(_) => "e",
    };
    log.line(format_args!("R {key} {token} {outcome} {}", monotonic_us()));
    let Ok(Some(value)) = read else {
        return first_check;
    };
    let mut last_valid = first_check;
    let work_until = Instant::now() + Duration::from_millis(work_ms);
    loop {
        let step = if careless {
            Duration::from_millis(work_ms)
        } else {
            Duration::from_millis(20)
        };
        tokio::time::sleep(step.min(work_until.saturating_duration_since(Instant::now()))).await;
        // Stamped before asking: if the lease was valid when asked, it was valid at the stamp.
        let checked = monotonic_us();
        if !careless && lease.is_lost() {
            return last_valid;
        }
        last_valid = checked;
        if Instant::now() >= work_until {
            break;
        }
    }
    log.line(format_args!("W {key} {token} {last_valid}"));
    let outcome = match counter_set(resource, key, fence, token, value + 1).await {
        Ok(true) => "1",
        Ok(false) => "0",
        Err(_) => "e",
    };
    log.line(format_args!("R {key} {token} {outcome} {}", monotonic_us()));
    last_valid
}
