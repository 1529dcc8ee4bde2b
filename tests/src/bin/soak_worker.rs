//! One process of the mixed soak: until its deadline, several tasks take random keys through
//! the runtime and increment each key's fenced counter by a read-sleep-write (one sleep in ten
//! long enough to span renewals and a failover), skipping the
//! write when the lease is already known lost. Every grant, validity check before a write, the
//! write's outcome and the end of each lease go to an event log for the exclusion checker
//! (`lock_tests::exclusion`). Prints `done` at the end.
//!
//! Each lease draws its calls from the public API: `try_acquire` or `acquire_timeout`, a ttl
//! of 0.3-2 s, sometimes `min_hold`, `max_hold`, an `extend` to a ttl of its own mid-work, and
//! let go by `release()` or a drop; keys `o<n>` are taken with `once` and let go by
//! `complete()`. One process in three shuts its runtime down at a random moment, with
//! acquires in flight, and ends.
//!
//! Usage: `soak_worker LOCK_URL RESOURCE_URL KEYS SECONDS SEED TASKS LOG_PATH [careless]`
//! (`LOCK_URL`: `redis://..`, `postgres://..`, or `etcd:` and the endpoints separated by commas)
//!
//! `careless` makes a worker that the checker must catch: without renewals, it sleeps up to
//! 1.5 s (ttl 0.6 s) between read and write and never asks whether its lease is lost.

use std::sync::Arc;
use std::time::{Duration, Instant};

use lock_runtime::{LockError, LockGuard, LockRuntime};
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
        let built = lock_tests::builder_for(lock_url)
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
    // One process in three shuts down mid-run, while its tasks acquire and hold, and ends.
    let mut draws = XorShift::mixed(seed ^ 0x5d0f_2a11);
    let shutdown_after = (!careless && draws.below(3) == 0).then(|| {
        deadline
            .saturating_duration_since(Instant::now())
            .mul_f64(draws.below(100) as f64 / 100.0)
    });
    if let Some(after) = shutdown_after {
        let (runtime, log) = (runtime.clone(), log.clone());
        tokio::spawn(async move {
            tokio::time::sleep(after).await;
            log.line(format_args!("S {}", monotonic_us()));
            runtime.shutdown().await;
        });
    }
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

/// Lease lengths a careful worker draws from.
const TTLS_MS: [u64; 4] = [300, 600, 1_000, 2_000];

/// One lease's calls, drawn.
struct Plan {
    ttl: Duration,
    min_hold: Option<Duration>,
    max_hold: Option<Duration>,
    once: Option<Duration>,
    try_only: bool,
    extend_to: Option<Duration>,
    drop_it: bool,
}

impl Plan {
    fn draw(rng: &mut XorShift, careless: bool, once: bool) -> Self {
        if careless {
            return Plan {
                ttl: Duration::from_millis(600),
                min_hold: None,
                max_hold: None,
                once: None,
                try_only: false,
                extend_to: None,
                drop_it: false,
            };
        }
        let pick = |rng: &mut XorShift| Duration::from_millis(TTLS_MS[rng.below(4) as usize]);
        let ttl = pick(rng);
        Plan {
            ttl,
            min_hold: (rng.below(8) == 0).then(|| ttl.mul_f64(rng.below(100) as f64 / 100.0)),
            max_hold: (rng.below(8) == 0).then(|| ttl * (1 + rng.below(3) as u32)),
            once: once.then(|| Duration::from_millis(200 + rng.below(800))),
            try_only: rng.below(3) == 0,
            extend_to: (rng.below(4) == 0).then(|| pick(rng)),
            drop_it: rng.below(4) == 0,
        }
    }
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
        // One lease in ten on a key taken only with `once`.
        let once = !careless && rng.below(10) == 0;
        let key = format!("{}{}", if once { "o" } else { "k" }, rng.below(keys));
        let plan = Plan::draw(&mut rng, careless, once);
        let mut request = runtime
            .lock(key.as_str())
            .ttl(plan.ttl)
            // A careless holder's lease is not renewed, so it does run out under it.
            .watchdog(!careless);
        if let Some(min_hold) = plan.min_hold {
            request = request.min_hold(min_hold);
        }
        if let Some(max_hold) = plan.max_hold {
            request = request.max_hold(max_hold);
        }
        if let Some(retention) = plan.once {
            request = request.once(retention);
        }
        let sent = monotonic_us();
        let got = if plan.try_only {
            request.try_acquire().await
        } else {
            request
                .acquire_timeout(Duration::from_secs(1))
                .await
                .map(Some)
        };
        let guard = match got {
            Ok(Some(guard)) => {
                // Before any await: a shutdown that begins while the fence is asked below
                // began after the handover.
                log.line(format_args!("H {key} {}", guard.lease().token()));
                guard
            }
            Err(LockError::Shutdown) => return,
            Ok(None) | Err(_) => {
                if plan.try_only {
                    tokio::time::sleep(Duration::from_millis(rng.below(50))).await;
                }
                continue;
            }
        };
        let lease = guard.lease();
        // A lease lost before its first fence cannot obtain one (fences on demand), and a
        // fence asked during a failover may fail: either way the grant is never believed
        // held, like a lease found lost at the first check below.
        let Ok(fence) = lease.fence().await else {
            let _ = guard.release().await;
            continue;
        };
        let token = lease.token().to_owned();
        // The first check, stamped before asking (see lock_tests::exclusion): a lease found
        // lost already was never believed.
        let first_check = monotonic_us();
        if lease.is_lost() {
            let _ = guard.release().await;
            continue;
        }
        log.line(format_args!("G {key} {fence} {token} {first_check}"));
        if let Some(min_hold) = plan.min_hold {
            log.line(format_args!(
                "M {key} {token} {sent} {}",
                min_hold.as_micros()
            ));
        }
        if let Some(ttl) = plan.extend_to {
            let _ = guard.extend(ttl).await;
        }
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
        if let Some(retention) = plan.once {
            let sent = monotonic_us();
            if let Ok(true) = guard.complete().await {
                log.line(format_args!(
                    "C {key} {token} {sent} {} {}",
                    monotonic_us(),
                    retention.as_micros()
                ));
            }
        } else if plan.drop_it {
            drop(guard);
        } else {
            let _ = guard.release().await;
        }
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
    let (fence, token) = (lease.fence().await.expect("a fence"), lease.token());
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
