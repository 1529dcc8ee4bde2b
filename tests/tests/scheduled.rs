//! Scheduled jobs on the memory store and tokio's paused clock: once per firing across
//! instances (their clocks apart too), missed firings, a run still going, a panic, shutdown,
//! daylight-saving changes, and the scheduler's own errors. Each test has jobs of its own
//! (every `#[scheduled]` fn of this binary is registered; `only` picks a test's).

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use lock_runtime::{
    LockError, LockRuntime, MemoryStore, Scheduler, current_firing, distributed_lock, scheduled,
};
use lock_tests::Built;

/// 2026-12-01T12:00:00Z.
const NOON: u64 = 1_796_126_400;

fn at(unix_secs: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(unix_secs)
}

fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_millis() as u64
}

async fn instances(n: usize) -> Vec<LockRuntime> {
    instances_on(&MemoryStore::new(), n).await
}

/// `n` runtimes on `store`, owners `instance-0` and on.
async fn instances_on(store: &MemoryStore, n: usize) -> Vec<LockRuntime> {
    let mut runtimes = Vec::new();
    for i in 0..n {
        runtimes.push(
            LockRuntime::builder()
                .memory(store.clone())
                .owner(format!("instance-{i}"))
                .built()
                .await,
        );
    }
    runtimes
}

/// Runs `job` on every runtime, the i-th scheduler's clock starting at `starts[i]`, for
/// `length` of tokio's (paused) time.
async fn run_fleet(job: &str, runtimes: Vec<LockRuntime>, starts: &[SystemTime], length: Duration) {
    let handles: Vec<_> = runtimes
        .into_iter()
        .zip(starts)
        .map(|(runtime, start)| {
            tokio::spawn(
                Scheduler::new(runtime)
                    .only([job.to_owned()])
                    .wall_clock_from(*start)
                    .run_until(tokio::time::sleep(length)),
            )
        })
        .collect();
    for handle in handles {
        handle
            .await
            .expect("the scheduler task")
            .expect("the scheduler ran");
    }
}

/// The firings each job's body saw, by job, in order.
static SEEN: Mutex<BTreeMap<&'static str, Vec<SystemTime>>> = Mutex::new(BTreeMap::new());

fn seen(job: &'static str) {
    let firing = current_firing().expect("a scheduled body knows its firing");
    assert_eq!(firing.job(), job);
    SEEN.lock()
        .expect("not poisoned")
        .entry(job)
        .or_default()
        .push(firing.scheduled_at());
}

fn seen_by(job: &str) -> Vec<SystemTime> {
    SEEN.lock()
        .expect("not poisoned")
        .get(job)
        .cloned()
        .unwrap_or_default()
}

#[scheduled(cron = "0 0 2 * * *")]
#[distributed_lock(key = "nightly", ttl = "60s")]
async fn nightly() -> Result<(), LockError> {
    seen("nightly");
    tokio::time::sleep(Duration::from_millis(50)).await;
    Ok(())
}

/// Three instances, ten days: ten runs, one per night, each at 02:00 UTC.
#[tokio::test(start_paused = true)]
async fn a_daily_job_runs_once_a_night_across_instances() {
    let start = at(NOON);
    run_fleet(
        "nightly",
        instances(3).await,
        &[start; 3],
        Duration::from_secs(10 * 86_400),
    )
    .await;
    let runs = seen_by("nightly");
    let expected: Vec<SystemTime> = (0..10).map(|d| at(NOON + 14 * 3600 + d * 86_400)).collect();
    assert_eq!(runs, expected, "one run per night, at 02:00 UTC");
}

static QUICK_RUNS: AtomicU32 = AtomicU32::new(0);

#[scheduled(every = "1s")]
#[distributed_lock(key = "quick", ttl = "10s")]
async fn quick() {
    seen("quick");
    QUICK_RUNS.fetch_add(1, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(50)).await;
}

/// Five instances whose clocks are apart by up to 1.9 s (0, +0.4, -0.7, +1.2, -1.9 s), a job
/// of every second that runs 50 ms, without `min_hold` or `once`: thirty firings, each run
/// exactly once, whichever instance reached it first.
#[tokio::test(start_paused = true)]
async fn skewed_clocks_run_each_firing_once() {
    let base = at(NOON);
    let starts: Vec<SystemTime> = [0i64, 400, -700, 1200, -1900]
        .iter()
        .map(|&ms| {
            if ms >= 0 {
                base + Duration::from_millis(ms as u64)
            } else {
                base - Duration::from_millis(ms.unsigned_abs())
            }
        })
        .collect();
    // 30 s of real time from the earliest clock's view, plus the spread.
    run_fleet(
        "quick",
        instances(5).await,
        &starts,
        Duration::from_millis(30_500),
    )
    .await;
    let runs = seen_by("quick");
    let firings: std::collections::BTreeSet<u64> = runs.iter().map(|t| unix_ms(*t)).collect();
    assert_eq!(
        firings.len(),
        runs.len(),
        "a firing ran twice: {:?}",
        runs.iter().map(|t| unix_ms(*t)).collect::<Vec<_>>()
    );
    assert_eq!(QUICK_RUNS.load(Ordering::SeqCst) as usize, runs.len());
    // The earliest clock (-1.9 s) starts at NOON-1.9 s, so its first firing is NOON-1 s; the
    // latest (+1.2 s) stops at NOON+31.7 s, so its last is NOON+31 s: every firing between,
    // once.
    let expected: std::collections::BTreeSet<u64> =
        (NOON - 1..=NOON + 31).map(|s| s * 1000).collect();
    assert_eq!(firings, expected);
}

#[scheduled(cron = "0 0 2 * * *", catch_up = "last", catch_up_window = "36h")]
#[distributed_lock(key = "catching-up", ttl = "60s")]
async fn catching_up() {
    seen("catching_up");
}

#[scheduled(cron = "0 0 2 * * *")]
#[distributed_lock(key = "not-catching-up", ttl = "60s")]
async fn not_catching_up() {
    seen("not_catching_up");
}

/// 02:00 UTC on day `k` (day 0 is 1 December 2026).
fn two_am(k: u64) -> SystemTime {
    at(NOON - 10 * 3600 + k * 86_400)
}

/// Two days with two instances, then three days with none, then two instances again at
/// noon: the job with `catch_up = "last"` runs the last missed firing (that morning's 02:00)
/// once, at start-up, and not the two before it; the job without it catches up on nothing.
/// (At the first start-up, noon of day 0, the catching-up job also runs that morning's
/// firing: it was missed too.)
#[tokio::test(start_paused = true)]
async fn catch_up_last_runs_the_last_missed_firing_once() {
    let store = MemoryStore::new();
    let day = Duration::from_secs(86_400);
    for (start, length) in [
        (at(NOON), 2 * day),
        (at(NOON) + 5 * day, Duration::from_secs(3600)),
    ] {
        for job in ["catching_up", "not_catching_up"] {
            let fleet = instances_on(&store, 2).await;
            run_fleet(job, fleet, &[start; 2], length).await;
        }
    }
    assert_eq!(
        seen_by("catching_up"),
        vec![two_am(0), two_am(1), two_am(2), two_am(5)],
        "caught up at each start-up on that morning's firing, once"
    );
    assert_eq!(seen_by("not_catching_up"), vec![two_am(1), two_am(2)]);
}

static SLOW_RUNNING: AtomicU32 = AtomicU32::new(0);
static SLOW_MOST: AtomicU32 = AtomicU32::new(0);

#[scheduled(every = "1s")]
#[distributed_lock(key = "slow", ttl = "10s")]
async fn slow() {
    seen("slow");
    let now = SLOW_RUNNING.fetch_add(1, Ordering::SeqCst) + 1;
    SLOW_MOST.fetch_max(now, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(2500)).await;
    SLOW_RUNNING.fetch_sub(1, Ordering::SeqCst);
}

/// A run of 2.5 s on a schedule of every second, on two instances: the firings that come
/// while it runs (here or on the other instance) are skipped, never run beside it.
#[tokio::test(start_paused = true)]
async fn a_firing_while_the_previous_run_still_runs_is_skipped() {
    run_fleet(
        "slow",
        instances(2).await,
        &[at(NOON), at(NOON) + Duration::from_millis(300)],
        Duration::from_millis(10_500),
    )
    .await;
    assert_eq!(SLOW_MOST.load(Ordering::SeqCst), 1, "two runs at once");
    // Runs start at NOON+1, +4, +7, +10 (each takes 2.5 s; the two firings after each are
    // skipped, whichever instance reaches them).
    assert_eq!(
        seen_by("slow"),
        vec![at(NOON + 1), at(NOON + 4), at(NOON + 7), at(NOON + 10)]
    );
}

static FRAGILE_RUNS: AtomicU32 = AtomicU32::new(0);

#[scheduled(every = "1s")]
#[distributed_lock(key = "fragile", ttl = "10s")]
async fn fragile() -> anyhow::Result<()> {
    let run = FRAGILE_RUNS.fetch_add(1, Ordering::SeqCst);
    match run {
        0 => panic!("the first run panics"),
        1 => Err(anyhow::anyhow!("the second run fails")),
        _ => Ok(()),
    }
}

/// A job that panics, then fails, then succeeds: the scheduler goes on firing it (ShedLock
/// #3145: one exception stopped every later run), and its lock is not left held by the
/// panicked run.
#[tokio::test(start_paused = true)]
async fn a_panicking_job_does_not_stop_the_scheduler() {
    run_fleet(
        "fragile",
        instances(1).await,
        &[at(NOON)],
        Duration::from_millis(5_500),
    )
    .await;
    assert_eq!(
        FRAGILE_RUNS.load(Ordering::SeqCst),
        5,
        "one run a second for 5 s"
    );
}

static LONG_STARTED: AtomicU32 = AtomicU32::new(0);
static LONG_FINISHED: AtomicU32 = AtomicU32::new(0);

#[scheduled(every = "1m")]
#[distributed_lock(key = "long", ttl = "10s")]
async fn long() {
    LONG_STARTED.fetch_add(1, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(30)).await;
    LONG_FINISHED.fetch_add(1, Ordering::SeqCst);
}

/// The stop signal while a run goes on: no new firing, the run gets the runtime's grace
/// period (5 s by default), then it is stopped, its lease released, and `run_until` returns.
#[tokio::test(start_paused = true)]
async fn shutdown_mid_run_gives_the_run_its_grace_period_then_stops_it() {
    let store = MemoryStore::new();
    let runtime = instances_on(&store, 1).await.remove(0);
    let started = tokio::time::Instant::now();
    // The firing at NOON+60 s starts the run; the signal comes 10 s into it.
    Scheduler::new(runtime)
        .only(["long"])
        .wall_clock_from(at(NOON))
        .run_until(tokio::time::sleep(Duration::from_secs(70)))
        .await
        .expect("the scheduler ran");
    let took = started.elapsed();
    assert_eq!(LONG_STARTED.load(Ordering::SeqCst), 1);
    assert_eq!(
        LONG_FINISHED.load(Ordering::SeqCst),
        0,
        "stopped before its end"
    );
    assert!(
        took >= Duration::from_secs(75) && took < Duration::from_secs(90),
        "the grace period of 5 s, then the stop: {took:?}"
    );
    let other = instances_on(&store, 1).await.remove(0);
    assert!(
        other
            .lock("long")
            .try_acquire()
            .await
            .expect("the store answers")
            .is_some(),
        "the stopped run's lock was released"
    );
}

#[scheduled(
    cron = "0 30 2 * * *",
    tz = "Europe/Berlin",
    name = "berlin-half-past-two"
)]
#[distributed_lock(key = "berlin", ttl = "60s")]
async fn berlin() {
    seen("berlin-half-past-two");
}

/// 02:30 in Berlin across both of 2026/27's changes, on two instances: on 28 March 2027
/// (02:00 CET jumps to 03:00 CEST, 02:30 does not exist) the firing comes at 03:00 CEST, once;
/// on 25 October 2026 (03:00 CEST falls back to 02:00 CET, 02:30 comes twice) it comes at the
/// first 02:30, once. The other days, at 02:30 local time.
#[tokio::test(start_paused = true)]
async fn daylight_saving_changes_fire_once_as_documented() {
    let three_days = Duration::from_secs(3 * 86_400);
    // Noon UTC on 24 October 2026, then on 27 March 2027.
    for start in [1_792_843_200, 1_806_148_800] {
        run_fleet(
            "berlin-half-past-two",
            instances(2).await,
            &[at(start); 2],
            three_days,
        )
        .await;
    }
    let runs: Vec<u64> = seen_by("berlin-half-past-two")
        .into_iter()
        .map(|t| unix_ms(t) / 1000)
        .collect();
    assert_eq!(
        runs,
        vec![
            1_792_888_200, // 2026-10-25T00:30Z: 02:30 CEST, the first of the two
            1_792_978_200, // 2026-10-26T01:30Z: 02:30 CET
            1_793_064_600, // 2026-10-27T01:30Z
            1_806_195_600, // 2027-03-28T01:00Z: 03:00 CEST, right after the gap
            1_806_280_200, // 2027-03-29T00:30Z: 02:30 CEST
            1_806_366_600, // 2027-03-30T00:30Z
        ]
    );
}

#[scheduled(every = "1h", local = true)]
async fn local_chore() {}

/// `only` with a name no job has, and `jobs()` listing the selection with its next firing.
#[tokio::test(start_paused = true)]
async fn the_scheduler_refuses_unknown_jobs_and_lists_the_next_firings() {
    let runtime = instances(1).await.remove(0);
    let err = Scheduler::new(runtime.clone())
        .only(["nightly", "no-such-job"])
        .run_until(std::future::pending::<()>())
        .await
        .expect_err("an unknown job");
    match err {
        LockError::Config(message) => {
            assert!(
                message.contains("no scheduled job is named `no-such-job`"),
                "{message}"
            );
            assert!(
                message.contains("nightly"),
                "the known jobs are listed: {message}"
            );
        }
        other => panic!("expected a Config error, got {other:?}"),
    }
    let jobs = Scheduler::new(runtime)
        .only(["nightly", "local_chore"])
        .wall_clock_from(at(NOON))
        .jobs()
        .expect("both exist");
    let listed: Vec<(String, String, Option<SystemTime>, bool)> = jobs
        .into_iter()
        .map(|j| (j.name, j.schedule, j.next, j.local))
        .collect();
    assert_eq!(
        listed,
        vec![
            (
                "local_chore".to_owned(),
                "every 3600s".to_owned(),
                Some(at(NOON + 3600)),
                true
            ),
            (
                "nightly".to_owned(),
                "cron \"0 0 2 * * *\" in UTC".to_owned(),
                Some(at(NOON + 14 * 3600)),
                false
            ),
        ]
    );
}

static LOCAL_RUNS: AtomicU32 = AtomicU32::new(0);

#[scheduled(every = "10s", local = true)]
async fn local_tick() {
    assert!(
        lock_runtime::current_lease().is_none(),
        "a local job runs without a lock"
    );
    LOCAL_RUNS.fetch_add(1, Ordering::SeqCst);
}

/// `local = true`: every instance runs every firing (here 3 instances x 3 firings).
#[tokio::test(start_paused = true)]
async fn a_local_job_runs_on_every_instance() {
    run_fleet(
        "local_tick",
        instances(3).await,
        &[at(NOON); 3],
        Duration::from_secs(35),
    )
    .await;
    assert_eq!(LOCAL_RUNS.load(Ordering::SeqCst), 9);
}

static CUT_STARTED: AtomicU32 = AtomicU32::new(0);
static CUT_FINISHED: AtomicU32 = AtomicU32::new(0);

#[scheduled(every = "1m")]
#[distributed_lock(key = "cut", ttl = "3s")]
async fn cut() -> anyhow::Result<()> {
    CUT_STARTED.fetch_add(1, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(10)).await;
    CUT_FINISHED.fetch_add(1, Ordering::SeqCst);
    Ok(())
}

/// A run whose lock is lost (the store forgets it) is stopped (`on_lost = "abort"`, the
/// default), reported as `lost`, and its firing is not run again by an instance that reaches
/// it later; the next firing runs as usual.
#[tokio::test(start_paused = true)]
async fn a_run_that_loses_its_lock_is_stopped_and_reported() {
    let logs = lock_tests::LogCapture::default();
    let _installed = logs.install();
    let store = MemoryStore::new();
    let fleet = instances_on(&store, 2).await;
    let forget = {
        let store = store.clone();
        async move {
            // 5 s into the first run (the firing at NOON+60 s): every record gone, the
            // firing's marker with it; the watchdog's next renewal finds the lock gone.
            tokio::time::sleep(Duration::from_secs(65)).await;
            store.clear();
        }
    };
    let starts = [at(NOON), at(NOON) - Duration::from_secs(30)];
    let ((), ()) = tokio::join!(
        run_fleet("cut", fleet, &starts, Duration::from_secs(140)),
        forget
    );
    // By the first clock: the instance 30 s behind runs the firing NOON at +30 (to +40); the
    // first runs NOON+60 at +60 and loses it at about +66; the one behind reaches NOON+60 at
    // +90, but the stopped run marked its firing done again after the store forgot the
    // marker, so it skips; the first runs NOON+120 at +120 (to +130).
    let text = logs.text();
    assert_eq!(CUT_FINISHED.load(Ordering::SeqCst), 2, "{text}");
    assert!(
        text.contains("the job lost its lock while it ran and was stopped"),
        "{text}"
    );
    assert_eq!(
        CUT_STARTED.load(Ordering::SeqCst),
        3,
        "the lost run's firing is not run again: {text}"
    );
}

#[scheduled(every = "1s")]
#[distributed_lock(key = "stalled", ttl = "10s")]
async fn stalled() {
    seen("stalled");
}

/// A scheduler woken long after a firing (its process stopped, starved, or its clock set
/// forward; here tokio's clock jumps three minutes at once) reports the firings it slept
/// through as missed and runs none of them (run that late, one could come after the marker
/// of the instance that ran it had gone), except the last one, which is not a minute old;
/// then it goes on with the next firing.
#[tokio::test(start_paused = true)]
async fn a_scheduler_woken_late_misses_the_firings_it_slept_through() {
    let logs = lock_tests::LogCapture::default();
    let _installed = logs.install();
    let runtime = instances(1).await.remove(0);
    let scheduler = tokio::spawn(
        Scheduler::new(runtime)
            .only(["stalled"])
            .wall_clock_from(at(NOON))
            .run_until(tokio::time::sleep(Duration::from_millis(200_500))),
    );
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    tokio::time::advance(Duration::from_secs(180)).await;
    scheduler
        .await
        .expect("the task")
        .expect("the scheduler ran");
    let runs: Vec<u64> = seen_by("stalled")
        .into_iter()
        .map(|t| unix_ms(t) / 1000 - NOON)
        .collect();
    let expected: Vec<u64> = [1, 2].into_iter().chain(182..=200).collect();
    assert_eq!(runs, expected, "{}", logs.text());
    assert!(
        logs.text().contains("woke too late for this firing"),
        "{}",
        logs.text()
    );
}

static MAINT: Mutex<Vec<&'static str>> = Mutex::new(Vec::new());

#[scheduled(every = "10s", name = "maint-vacuum")]
#[distributed_lock(key = "db-maint", ttl = "10s", on_contention = "wait")]
async fn vacuum() {
    MAINT.lock().expect("not poisoned").push("vacuum");
    tokio::time::sleep(Duration::from_millis(100)).await;
}

#[scheduled(every = "10s", name = "maint-reindex")]
#[distributed_lock(key = "db-maint", ttl = "10s", on_contention = "wait")]
async fn reindex() {
    MAINT.lock().expect("not poisoned").push("reindex");
    tokio::time::sleep(Duration::from_millis(100)).await;
}

/// Two jobs that share a lock key to run one after the other, at the same firings: each
/// runs at every firing (the firings' markers are per job), one waiting for the other.
#[tokio::test(start_paused = true)]
async fn jobs_sharing_a_lock_key_each_run_every_firing() {
    let runtime = instances(1).await.remove(0);
    Scheduler::new(runtime)
        .only(["maint-vacuum", "maint-reindex"])
        .wall_clock_from(at(NOON))
        .run_until(tokio::time::sleep(Duration::from_secs(35)))
        .await
        .expect("the scheduler ran");
    let ran = MAINT.lock().expect("not poisoned").clone();
    assert_eq!(ran.iter().filter(|j| **j == "vacuum").count(), 3, "{ran:?}");
    assert_eq!(
        ran.iter().filter(|j| **j == "reindex").count(),
        3,
        "{ran:?}"
    );
}

static LEDGER_WRITES: AtomicU32 = AtomicU32::new(0);

#[distributed_lock(key = "ledger", ttl = "10s")]
async fn write_ledger() -> Result<(), LockError> {
    LEDGER_WRITES.fetch_add(1, Ordering::SeqCst);
    Ok(())
}

#[scheduled(every = "10s")]
#[distributed_lock(key = "nesting", ttl = "10s")]
async fn nesting() -> Result<(), LockError> {
    seen("nesting");
    // Locked calls inside a scheduled body are plain locked calls: both run.
    write_ledger().await?;
    write_ledger().await?;
    Ok(())
}

/// A scheduled body that calls another `#[distributed_lock]` fn twice: both calls run (only
/// the job's own call claims the firing), and the firing is reported as run.
#[tokio::test(start_paused = true)]
async fn locked_calls_inside_a_scheduled_body_run_as_usual() {
    let logs = lock_tests::LogCapture::default();
    let _installed = logs.install();
    // Two instances: the one that does not run a firing says so, and nothing else skips.
    run_fleet(
        "nesting",
        instances(2).await,
        &[at(NOON); 2],
        Duration::from_secs(25),
    )
    .await;
    let text = logs.text();
    assert_eq!(seen_by("nesting").len(), 2);
    assert_eq!(LEDGER_WRITES.load(Ordering::SeqCst), 4, "{text}");
    assert_eq!(text.matches("skipped: ").count(), 2, "{text}");
    assert_eq!(
        text.matches("skipped: another instance has run this firing")
            .count(),
        2,
        "{text}"
    );
}

static PANICKY_RUNS: AtomicU32 = AtomicU32::new(0);

#[scheduled(every = "1s")]
#[distributed_lock(key = "panicky", ttl = "10s")]
async fn panicky() {
    seen("panicky");
    PANICKY_RUNS.fetch_add(1, Ordering::SeqCst);
    panic!("after its side effect");
}

/// A run that panics after its side effect, on instances whose clocks are 0.5 s apart: the
/// instance behind finds the lock free but the firing's marker there, and does not run it
/// again (the marker is marked done when the run starts, so no end of the run can take it
/// back).
#[tokio::test(start_paused = true)]
async fn a_firing_whose_run_panicked_is_not_run_again_elsewhere() {
    let starts = [at(NOON), at(NOON) - Duration::from_millis(500)];
    run_fleet(
        "panicky",
        instances(2).await,
        &starts,
        Duration::from_millis(5_200),
    )
    .await;
    let runs: Vec<u64> = seen_by("panicky")
        .into_iter()
        .map(|t| unix_ms(t) / 1000 - NOON)
        .collect();
    let mut unique = runs.clone();
    unique.dedup();
    assert_eq!(runs, unique, "a firing ran twice");
    assert_eq!(PANICKY_RUNS.load(Ordering::SeqCst) as usize, runs.len());
    assert_eq!(runs, vec![0, 1, 2, 3, 4, 5], "every firing ran once");
}

static LOCAL_INNER: AtomicU32 = AtomicU32::new(0);

#[distributed_lock(key = "local-inner", ttl = "10s", on_contention = "wait")]
async fn local_inner() -> Result<(), LockError> {
    LOCAL_INNER.fetch_add(1, Ordering::SeqCst);
    Ok(())
}

#[scheduled(every = "10s", local = true)]
async fn local_with_a_locked_call() -> Result<(), LockError> {
    local_inner().await
}

/// A `local = true` job's body calling a `#[distributed_lock]` fn: the call is a plain
/// locked call on every instance (3 instances x 2 firings), not one claiming the firing.
#[tokio::test(start_paused = true)]
async fn a_local_jobs_locked_calls_run_on_every_instance() {
    run_fleet(
        "local_with_a_locked_call",
        instances(3).await,
        &[at(NOON); 3],
        Duration::from_secs(25),
    )
    .await;
    assert_eq!(LOCAL_INNER.load(Ordering::SeqCst), 6);
}

#[scheduled(every = "1s")]
#[distributed_lock(key = "queued", ttl = "10s", on_contention = "wait")]
async fn queued() {
    seen("queued");
    tokio::time::sleep(Duration::from_millis(50)).await;
}

/// Each firing on each instance leaves one `firing` span with the job, the firing's instant,
/// the instance and the outcome as fields: one `ok` per firing, `skipped_done` on the other
/// instances, each with the event that says so. A job that waits on contention, returning
/// `()`, skips another instance's firing without logging a lock error.
#[tokio::test(start_paused = true)]
async fn each_firing_leaves_a_span_naming_job_instant_instance_and_outcome() {
    let recorder = lock_tests::SpanRecorder::new("firing");
    let _installed = recorder.install();
    let starts = [
        at(NOON),
        at(NOON) + Duration::from_millis(400),
        at(NOON) - Duration::from_millis(700),
    ];
    run_fleet(
        "queued",
        instances(3).await,
        &starts,
        Duration::from_millis(10_500),
    )
    .await;
    let spans = recorder.spans();
    // firing instant -> (instance, outcome, events) of each span.
    let mut by_firing: BTreeMap<u64, Vec<(String, String, Vec<String>)>> = BTreeMap::new();
    for span in &spans {
        let field = |name: &str| {
            span.fields
                .get(name)
                .cloned()
                .unwrap_or_else(|| panic!("a firing span without `{name}`: {span:?}"))
        };
        assert_eq!(field("job"), "queued", "{span:?}");
        let at_ms: u64 = field("scheduled_at_ms").parse().expect("a number");
        by_firing.entry(at_ms).or_default().push((
            field("instance"),
            field("outcome"),
            span.events.clone(),
        ));
    }
    // The firings every clock passed: NOON+1 s (the latest clock starts at NOON+0.4 s) to
    // NOON+9 s (the earliest stops at NOON+9.8 s).
    for s in NOON + 1..=NOON + 9 {
        let spans = by_firing
            .get(&(s * 1000))
            .unwrap_or_else(|| panic!("no span for the firing at {s}: {by_firing:?}"));
        let mut instances: Vec<&str> = spans.iter().map(|(i, ..)| i.as_str()).collect();
        instances.sort_unstable();
        assert_eq!(
            instances,
            ["instance-0", "instance-1", "instance-2"],
            "one span per instance for {s}: {spans:?}"
        );
        let ok: Vec<_> = spans.iter().filter(|(_, o, _)| o == "ok").collect();
        assert_eq!(ok.len(), 1, "one run of the firing at {s}: {spans:?}");
        assert_eq!(ok[0].2, ["ran"], "{spans:?}");
        for (instance, outcome, events) in spans.iter().filter(|(_, o, _)| o != "ok") {
            assert_eq!(outcome, "skipped_done", "{instance} at {s}: {spans:?}");
            assert_eq!(
                events,
                &["skipped: another instance has run this firing"],
                "{instance} at {s}"
            );
        }
    }
    let runs = seen_by("queued");
    assert_eq!(
        runs.len(),
        by_firing
            .values()
            .map(|spans| spans.iter().filter(|(_, o, _)| o == "ok").count())
            .sum::<usize>(),
        "every run has its ok span"
    );
    let lock_errors: Vec<String> = recorder
        .messages()
        .into_iter()
        .filter(|m| m.contains("locked call did not complete"))
        .collect();
    assert!(
        lock_errors.is_empty(),
        "the instances that skipped logged a lock error: {lock_errors:?}"
    );
}
