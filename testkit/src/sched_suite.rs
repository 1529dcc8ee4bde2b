//! The scheduled jobs' cases, run once per store as part of `attribute_suite!`: instances
//! whose clocks are apart run each firing of a `#[distributed_lock]` job once, and a firing
//! that comes while the previous run still runs is skipped. The jobs here are given to the
//! scheduler directly, not registered, so they never run in a binary that links the kit.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use lock_runtime::__private::{JobFuture, ScheduledJob, job_end, scheduler_of};
use lock_runtime::{LockError, LockRuntime, current_firing, distributed_lock};

use crate::Harness;

/// Runs per owner: the firings (ms since the epoch) each instance ran, whatever case.
static RUNS: Mutex<BTreeMap<String, Vec<u64>>> = Mutex::new(BTreeMap::new());

fn record() -> Result<(), LockError> {
    let firing = current_firing().ok_or_else(|| LockError::Config("no firing".into()))?;
    let owner = LockRuntime::current()?.owner().to_owned();
    let ms = firing
        .scheduled_at()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    if let Ok(mut runs) = RUNS.lock() {
        runs.entry(owner).or_default().push(ms);
    }
    Ok(())
}

/// A job of every second, as `#[scheduled(every = "1s")]` would register it.
const fn every_second(name: &'static str, run: fn() -> JobFuture) -> ScheduledJob {
    ScheduledJob {
        name,
        cron: None,
        tz: "UTC",
        every_ms: Some(1_000),
        catch_up_within_ms: None,
        local: false,
        retry_crashed: false,
        run,
    }
}

#[distributed_lock(key = "kit-scheduled-once", ttl = "10s")]
async fn short_run() -> Result<(), LockError> {
    record()?;
    tokio::time::sleep(Duration::from_millis(30)).await;
    Ok(())
}

static SHORT_RUN: ScheduledJob = every_second("kit-short-run", || {
    Box::pin(async { job_end(&short_run().await) })
});

#[distributed_lock(key = "kit-scheduled-slow", ttl = "10s")]
async fn long_run() -> Result<(), LockError> {
    record()?;
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    Ok(())
}

static LONG_RUN: ScheduledJob = every_second("kit-long-run", || {
    Box::pin(async { job_end(&long_run().await) })
});

fn shifted(t: SystemTime, ms: i64) -> SystemTime {
    let by = Duration::from_millis(ms.unsigned_abs());
    if ms >= 0 { t + by } else { t - by }
}

/// Runs `job` on one runtime per skew (its clock that far from this one's) for `length`;
/// returns the owners and each one's clock at the start.
async fn run_instances<H: Harness>(
    store: &H,
    job: &'static ScheduledJob,
    skews_ms: &[i64],
    length: Duration,
) -> Vec<(String, SystemTime)> {
    let now = SystemTime::now();
    let mut instances = Vec::new();
    let mut handles = Vec::new();
    for &ms in skews_ms {
        let runtime = store.runtime().await;
        let start = shifted(now, ms);
        instances.push((runtime.owner().to_owned(), start));
        handles.push(tokio::spawn(
            scheduler_of(runtime, vec![job])
                .wall_clock_from(start)
                .run_until(tokio::time::sleep(length)),
        ));
    }
    for handle in handles {
        handle
            .await
            .expect("a scheduler task")
            .expect("the scheduler ran");
    }
    instances
}

/// The firings the owners ran, each with how many times.
fn runs_of(owners: &[String]) -> BTreeMap<u64, usize> {
    let owners: BTreeSet<&String> = owners.iter().collect();
    let runs = RUNS.lock().expect("not poisoned");
    let mut counted = BTreeMap::new();
    for owner in owners {
        for ms in runs.get(owner).into_iter().flatten() {
            *counted.entry(*ms).or_default() += 1;
        }
    }
    counted
}

/// Three instances whose clocks are 0, +300 and -450 ms apart fire a job of every second
/// that runs 30 ms, with neither `min_hold` nor `once`: each firing runs once; every firing
/// all three reached ran. (Without the firing's marker, the instances behind find the lock
/// free after the first run and run the firing again.)
pub async fn sched_skewed_instances_run_each_firing_once<H: Harness>(store: &H) {
    let length = Duration::from_millis(5_600);
    let instances = run_instances(store, &SHORT_RUN, &[0, 300, -450], length).await;
    let owners: Vec<String> = instances.iter().map(|(o, _)| o.clone()).collect();
    let counted = runs_of(&owners);
    let twice: Vec<_> = counted.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "firings run more than once: {twice:?}");
    // Every firing after the latest clock's start and before the earliest clock's end.
    let ms = |t: SystemTime| {
        t.duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64)
    };
    let latest = instances.iter().map(|(_, s)| ms(*s)).max().unwrap_or(0);
    let earliest_end = instances
        .iter()
        .map(|(_, s)| ms(*s) + length.as_millis() as u64)
        .min()
        .unwrap_or(0);
    let window: BTreeSet<u64> = (latest / 1000 + 1..earliest_end / 1000)
        .map(|s| s * 1000)
        .collect();
    assert!(
        window.len() >= 3,
        "the window holds {} firings",
        window.len()
    );
    let missed: Vec<_> = window.iter().filter(|f| !counted.contains_key(f)).collect();
    assert!(
        missed.is_empty(),
        "firings nobody ran: {missed:?} (ran: {counted:?})"
    );
}

/// A job of every second that runs 1.5 s, on two instances: the firings that come while a
/// run goes on (here or on the other instance) are skipped, never run beside it; each firing
/// runs at most once.
pub async fn sched_firing_while_running_is_skipped<H: Harness>(store: &H) {
    let instances = run_instances(store, &LONG_RUN, &[0, 200], Duration::from_millis(5_500)).await;
    let owners: Vec<String> = instances.iter().map(|(o, _)| o.clone()).collect();
    let counted = runs_of(&owners);
    assert!(
        counted.values().all(|n| *n == 1),
        "a firing ran twice: {counted:?}"
    );
    let ran = counted.len();
    assert!(
        (2..=4).contains(&ran),
        "{ran} runs of 1.5 s in 5.5 s: {counted:?}"
    );
    let firings: Vec<u64> = counted.keys().copied().collect();
    assert!(
        firings.windows(2).all(|w| w[1] - w[0] >= 2_000),
        "a run began while the previous one (1.5 s) still ran: {firings:?}"
    );
}
