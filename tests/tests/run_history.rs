//! Run history on the memory store and tokio's paused clock: the journal stays within its
//! bounds over ten thousand firings, and a journal that is slow or refuses every write
//! neither fails nor delays a single firing.

use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use lock_runtime::store::{
    AcquireOutcome, AcquireRequest, ExtendItem, KeyNames, LockStore, RecordView, ReleaseOutcome,
    ReleaseWatch, Renewal, Retention,
};
use lock_runtime::{
    LockError, LockRuntime, MemoryStore, RunOutcome, Scheduler, current_firing, distributed_lock,
    scheduled,
};
use lock_tests::Built;

/// 2026-12-01T12:00:00Z.
const NOON: u64 = 1_796_126_400;

fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

async fn instance(store: impl lock_runtime::store::IntoStore, owner: &str) -> LockRuntime {
    LockRuntime::builder()
        .store(store)
        .owner(owner)
        .built()
        .await
}

#[scheduled(every = "100ms")]
#[distributed_lock(key = "history-count", ttl = "10s")]
async fn by_count() -> Result<(), LockError> {
    Ok(())
}

#[scheduled(every = "100ms")]
#[distributed_lock(key = "history-age", ttl = "10s")]
async fn by_age() -> Result<(), LockError> {
    Ok(())
}

/// Runs `job` on two instances of `store` from noon for `length` of paused time, the journal
/// kept by `keep`.
async fn two_instances(store: &MemoryStore, job: &str, length: Duration, keep: (Duration, usize)) {
    let mut runs = Vec::new();
    for owner in ["history-a", "history-b"] {
        let runtime = instance(store.clone(), owner).await;
        runs.push(tokio::spawn(
            Scheduler::new(runtime)
                .only([job])
                .wall_clock_from(UNIX_EPOCH + Duration::from_secs(NOON))
                .history_retention(keep.0, keep.1)
                .run_until(tokio::time::sleep(length)),
        ));
    }
    for run in runs {
        run.await
            .expect("a scheduler task")
            .expect("the scheduler ran");
    }
}

/// Ten thousand firings of a job of every 100 ms on two instances: the journal keeps the
/// newest 500 (its count bound), each firing once, newest first; with an age bound of 20 s
/// instead, it keeps only the last 20 s of firings.
#[tokio::test(start_paused = true)]
async fn ten_thousand_firings_keep_the_journal_within_its_bounds() {
    let store = MemoryStore::new();
    let length = Duration::from_millis(1_000_050);
    two_instances(
        &store,
        "by_count",
        length,
        (Duration::from_secs(86_400), 500),
    )
    .await;
    let reader = instance(store.clone(), "reader").await;
    let runs = reader.history("by_count", 100_000).await.expect("history");
    assert_eq!(runs.len(), 500, "the count bound");
    let firings: Vec<u64> = runs.iter().map(|r| unix_ms(r.scheduled_at())).collect();
    let last = NOON * 1000 + 1_000_000;
    let expected: Vec<u64> = (0..500).map(|i| last - i * 100).collect();
    assert_eq!(
        firings, expected,
        "the newest 500 firings, each once, newest first"
    );
    assert!(
        runs.iter().all(|r| *r.outcome() == RunOutcome::Ok
            && (r.owner() == "history-a" || r.owner() == "history-b")),
        "every kept run ran ok on one of the two instances"
    );

    assert!(
        reader
            .journalled_jobs()
            .await
            .expect("jobs")
            .contains(&"by_count".to_owned()),
        "by_count is journalled"
    );

    two_instances(&store, "by_age", length, (Duration::from_secs(20), 100_000)).await;
    let runs = reader.history("by_age", 100_000).await.expect("history");
    let oldest = runs.last().map(|r| unix_ms(r.scheduled_at())).unwrap_or(0);
    assert!(
        (199..=201).contains(&runs.len()),
        "20 s of firings every 100 ms: {} kept",
        runs.len()
    );
    assert!(
        oldest >= last - 20_100,
        "the oldest kept firing is {} ms before the last",
        last - oldest
    );
    // The age bound of an append holds for every journal of its namespace: by_count's runs,
    // 1,000 s old now, went with by_age's first append.
    let mut jobs = reader.journalled_jobs().await.expect("jobs");
    jobs.retain(|j| j.starts_with("by_"));
    assert_eq!(jobs, ["by_age"]);
}

/// A store whose journal takes 10 s per write and then refuses it (a user's store, locks in
/// memory): every firing still runs, once, at its instant; the runs not written are gaps, not
/// failures.
#[derive(Clone, Default)]
struct SlowJournal(MemoryStore);

impl LockStore for SlowJournal {
    async fn acquire(&self, r: AcquireRequest<'_>) -> Result<AcquireOutcome, LockError> {
        self.0.acquire(r).await
    }
    async fn release(
        &self,
        names: &KeyNames,
        token: &str,
        done_retention: Option<Duration>,
    ) -> Result<ReleaseOutcome, LockError> {
        self.0.release(names, token, done_retention).await
    }
    async fn extend(&self, items: &[ExtendItem]) -> Result<Vec<Renewal>, LockError> {
        self.0.extend(items).await
    }
    async fn inspect(&self, names: &KeyNames) -> Result<Option<RecordView>, LockError> {
        self.0.inspect(names).await
    }
    async fn watch_releases(&self, names: &KeyNames) -> Result<ReleaseWatch, LockError> {
        self.0.watch_releases(names).await
    }
    async fn list(&self, ns: &str, pattern: &str) -> Result<Vec<(String, RecordView)>, LockError> {
        self.0.list(ns, pattern).await
    }
    async fn force_release(&self, names: &KeyNames, fence: u64) -> Result<bool, LockError> {
        self.0.force_release(names, fence).await
    }
    async fn append_run(&self, _: &str, _: &str, _: &str, _: &Retention) -> Result<(), LockError> {
        tokio::time::sleep(Duration::from_secs(10)).await;
        Err(lock_runtime::BackendError::transient("the journal is down").into())
    }
}

/// Each firing's lateness: tokio's clock at the body's start, against the firing's instant
/// counted from the scheduler's start (its wall clock starts at noon, carried by tokio's).
static LATENESS: Mutex<Vec<(u64, Duration)>> = Mutex::new(Vec::new());
static STARTED: Mutex<Option<tokio::time::Instant>> = Mutex::new(None);

#[scheduled(every = "100ms")]
#[distributed_lock(key = "history-slow", ttl = "10s")]
async fn beside_a_slow_journal() -> Result<(), LockError> {
    let now = tokio::time::Instant::now();
    let firing = current_firing().ok_or_else(|| LockError::Config("no firing".into()))?;
    let ms = unix_ms(firing.scheduled_at());
    let started = STARTED
        .lock()
        .map_err(|_| LockError::Config("poisoned".into()))?
        .ok_or_else(|| LockError::Config("no start".into()))?;
    let due = started + Duration::from_millis(ms - NOON * 1000);
    LATENESS
        .lock()
        .map_err(|_| LockError::Config("poisoned".into()))?
        .push((ms, now.saturating_duration_since(due)));
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn a_slow_or_failing_journal_never_fails_or_delays_a_firing() {
    let store = SlowJournal::default();
    let runtime = instance(store.clone(), "slow-journal").await;
    let started = tokio::time::Instant::now();
    *STARTED.lock().expect("not poisoned") = Some(started);
    Scheduler::new(runtime)
        .only(["beside_a_slow_journal"])
        .wall_clock_from(UNIX_EPOCH + Duration::from_secs(NOON))
        .run_until(tokio::time::sleep(Duration::from_millis(60_050)))
        .await
        .expect("the scheduler ran");
    let seen = LATENESS.lock().expect("not poisoned").clone();
    let firings: Vec<u64> = seen.iter().map(|(ms, _)| *ms).collect();
    let expected: Vec<u64> = (1..=600).map(|i| NOON * 1000 + i * 100).collect();
    assert_eq!(firings, expected, "every firing ran, once, in order");
    let latest = seen.iter().map(|(_, late)| *late).max().unwrap_or_default();
    assert!(
        latest <= Duration::from_millis(20),
        "a firing ran {latest:?} after its instant"
    );
    // The stop waited for the queue at most its 5 s bound, not 10 s per queued run.
    assert!(
        started.elapsed() < Duration::from_secs(70),
        "the scheduler's stop took {:?} of paused time",
        started.elapsed()
    );
    let reader = instance(store, "reader").await;
    assert!(
        matches!(
            reader.history("beside_a_slow_journal", 10).await,
            Err(LockError::Unsupported(_))
        ),
        "a store without history reads say so"
    );
}

#[scheduled(every = "1m")]
#[distributed_lock(key = "history-ends-in-grace", ttl = "10s")]
async fn ends_within_the_grace() {
    tokio::time::sleep(Duration::from_secs(3)).await;
}

#[scheduled(every = "1m")]
#[distributed_lock(key = "history-outlasts-grace", ttl = "10s")]
async fn outlasts_the_grace() {
    tokio::time::sleep(Duration::from_secs(30)).await;
}

/// The one run of `job` in the journal after a scheduler started at noon is stopped 61 s
/// later, 1 s into the run of the firing at noon + 60 s.
async fn journal_of_a_run_the_stop_caught(job: &str) -> lock_runtime::Run {
    let store = MemoryStore::new();
    let runtime = instance(store.clone(), "stopped-mid-run").await;
    Scheduler::new(runtime)
        .only([job])
        .wall_clock_from(UNIX_EPOCH + Duration::from_secs(NOON))
        .run_until(tokio::time::sleep(Duration::from_secs(61)))
        .await
        .expect("the scheduler ran");
    let reader = instance(store, "reader").await;
    let mut runs = reader.history(job, 10).await.expect("the journal reads");
    assert_eq!(runs.len(), 1, "one firing, one entry: {runs:?}");
    let run = runs.remove(0);
    assert_eq!(unix_ms(run.scheduled_at()), (NOON + 60) * 1000);
    assert_eq!(run.owner(), "stopped-mid-run");
    run
}

/// The run is journalled failed, stopped at the end of the shutdown grace.
fn assert_stopped_at_the_grace(run: &lock_runtime::Run) {
    match run.outcome() {
        RunOutcome::Failed { error } => assert!(
            error.contains("stopped at the end of the shutdown grace"),
            "{error}"
        ),
        other => panic!("journalled as {other:?}"),
    }
}

/// A run the stop signal caught, which then ends within the runtime's grace period (5 s),
/// is journalled as it ended: ok. (On tokio's threads the stop used to end the firing's task
/// as soon as the run's lease was released, which could come before the task had journalled
/// the run; on this one thread the old code journalled it all the same, so this case guards
/// the outcome, not that race.)
#[tokio::test(start_paused = true)]
async fn a_run_ending_within_the_shutdown_grace_is_journalled() {
    let run = journal_of_a_run_the_stop_caught("ends_within_the_grace").await;
    assert_eq!(*run.outcome(), RunOutcome::Ok, "{run:?}");
    assert!(run.fence().is_some(), "{run:?}");
    // What `lockctl jobs` shows beside it: the lock, the schedule, the next firing.
    assert_eq!(run.key(), Some("history-ends-in-grace"));
    assert_eq!(run.schedule(), Some("every 60s"));
    assert_eq!(
        run.next_firing(),
        Some(run.scheduled_at() + Duration::from_secs(60))
    );
}

/// A run still going at the end of the grace period is stopped, and journalled as failed,
/// saying so, not as a lock lost to the store (its marker keeps every other instance from
/// running the firing, unless the job has `retry_crashed`).
#[tokio::test(start_paused = true)]
async fn a_run_stopped_at_the_end_of_the_shutdown_grace_is_journalled_failed() {
    let run = journal_of_a_run_the_stop_caught("outlasts_the_grace").await;
    assert_stopped_at_the_grace(&run);
}

#[scheduled(every = "1m", local = true)]
async fn local_ending_within_the_grace() {
    tokio::time::sleep(Duration::from_secs(3)).await;
}

/// A local job (no lock, so no lease for the runtime's shutdown to wait for) gets the same
/// grace period: the run the stop caught ends, and is journalled ok. (It used to be stopped
/// at once, unjournalled.)
#[tokio::test(start_paused = true)]
async fn a_local_run_gets_the_shutdown_grace_too() {
    let run = journal_of_a_run_the_stop_caught("local_ending_within_the_grace").await;
    assert_eq!(*run.outcome(), RunOutcome::Ok, "{run:?}");
    assert_eq!(run.key(), None, "a local job has no lock");
}

#[scheduled(every = "1m", local = true)]
async fn local_outlasting_the_grace() {
    tokio::time::sleep(Duration::from_secs(30)).await;
}

/// A local run still going at the end of the grace period (no lease for the shutdown to take)
/// is stopped by its firing, and journalled as failed, saying so.
#[tokio::test(start_paused = true)]
async fn a_local_run_outlasting_the_grace_is_stopped_and_journalled_failed() {
    let run = journal_of_a_run_the_stop_caught("local_outlasting_the_grace").await;
    assert_stopped_at_the_grace(&run);
    let took = run
        .finished_at()
        .duration_since(run.started_at())
        .unwrap_or_default();
    assert!(
        took >= Duration::from_secs(5) && took < Duration::from_secs(7),
        "stopped after the grace of 5 s: {took:?}"
    );
}

static OUTLIVED: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

#[scheduled(every = "1m")]
#[distributed_lock(
    key = "history-outlives-its-lease",
    ttl = "1s",
    watchdog = false,
    on_lost = "continue"
)]
async fn outlives_its_lease() {
    OUTLIVED.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(10)).await;
}

/// A run that outlives its unrenewed lease (`watchdog = false`, `on_lost = "continue"`), its holder alive: the other
/// instance, which found the firing claimed, does not take the lease's end for a crash; the
/// journal has the run once, ok, by its holder. (A watch of any lease used to journal it
/// `crashed` 3 s after the lease ran out, before the holder journalled it ok.)
#[tokio::test(start_paused = true)]
async fn a_live_run_outliving_an_unrenewed_lease_is_not_journalled_crashed() {
    let store = MemoryStore::new();
    let mut schedulers = Vec::new();
    for (owner, behind_ms) in [("ahead", 0), ("behind", 300)] {
        let runtime = instance(store.clone(), owner).await;
        schedulers.push(tokio::spawn(
            Scheduler::new(runtime)
                .only(["outlives_its_lease"])
                .wall_clock_from(
                    UNIX_EPOCH + Duration::from_secs(NOON + 1) - Duration::from_millis(behind_ms),
                )
                .run_until(tokio::time::sleep(Duration::from_secs(75))),
        ));
    }
    for s in schedulers {
        s.await
            .expect("a scheduler task")
            .expect("the scheduler ran");
    }
    assert_eq!(
        OUTLIVED.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "one run"
    );
    let reader = instance(store, "reader").await;
    let runs = reader
        .history("outlives_its_lease", 10)
        .await
        .expect("the journal reads");
    assert!(
        matches!(runs.as_slice(), [r] if *r.outcome() == RunOutcome::Ok && r.owner() == "ahead"),
        "journalled as {runs:?}"
    );
}
