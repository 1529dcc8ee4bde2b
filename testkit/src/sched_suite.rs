//! The scheduled jobs' cases, run once per store as part of `attribute_suite!`: instances
//! whose clocks are apart run each firing of a `#[distributed_lock]` job once, a firing that
//! comes while the previous run still runs is skipped, a catch-up after a restart runs only
//! what nobody ran, the journal keeps what its retention says, and a stop mid-run lets the
//! run finish and frees its lock. The jobs here are given to the scheduler directly, not
//! registered, so they never run in a binary that links the kit.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use lock_runtime::__private::{JobFuture, ScheduledJob, job_end, scheduler_of};
use lock_runtime::{
    LockError, LockRuntime, RunOutcome, current_firing, current_lease, distributed_lock,
};

use crate::{Free, Harness};

/// Runs per owner: the firings (ms since the epoch) each instance ran, whatever case.
static RUNS: Mutex<BTreeMap<String, Vec<u64>>> = Mutex::new(BTreeMap::new());

fn record() -> Result<(), LockError> {
    record_in(&RUNS)
}

/// Milliseconds since the Unix epoch (0 before it).
fn ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Adds the current firing to this instance's list in `runs`.
fn record_in(runs: &Mutex<BTreeMap<String, Vec<u64>>>) -> Result<(), LockError> {
    let firing = current_firing().ok_or_else(|| LockError::Config("no firing".into()))?;
    let owner = LockRuntime::current()?.owner().to_owned();
    if let Ok(mut runs) = runs.lock() {
        runs.entry(owner)
            .or_default()
            .push(ms(firing.scheduled_at()));
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
    // Asked for in the body: a store that computes fences on demand journals the run with it.
    current_lease()
        .ok_or_else(|| LockError::Config("no lease".into()))?
        .fence()
        .await?;
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
    // A firing nobody ran must be one whose claimant found the previous run still holding
    // the lock (a loaded machine can stretch a 30 ms run past a second): the journal says so.
    // Without a journal (a store that declines it), every firing must have run.
    let journal = match store.runtime().await.history(SHORT_RUN.name, 1_000).await {
        Ok(runs) => Some(runs),
        Err(LockError::Unsupported(_)) if !store.keeps_history() => None,
        Err(e) => panic!("reading the journal: {e}"),
    };
    let skipped: BTreeSet<u64> = journal
        .iter()
        .flatten()
        .filter(|r| matches!(r.outcome(), RunOutcome::Skipped { .. }))
        .map(|r| ms(r.scheduled_at()))
        .collect();
    let missed: Vec<_> = window
        .iter()
        .filter(|f| !counted.contains_key(f) && !skipped.contains(f))
        .collect();
    assert!(
        missed.is_empty(),
        "firings nobody ran, and no journal entry says why: {missed:?} (ran: {counted:?}, skipped: {skipped:?})"
    );
    if let Some(journal) = journal {
        // Each firing that ran is journalled once, as ok, by the instance that ran it.
        let runs = RUNS.lock().expect("not poisoned").clone();
        for (owner, firings) in runs.iter().filter(|(o, _)| owners.contains(o)) {
            for f in firings {
                let entries: Vec<_> = journal
                    .iter()
                    .filter(|r| ms(r.scheduled_at()) == *f)
                    .collect();
                assert!(
                    matches!(entries.as_slice(), [r] if r.owner() == owner
                        && *r.outcome() == RunOutcome::Ok
                        && r.fence().is_some()
                        && r.started_at() <= r.finished_at()),
                    "firing {f} ran by {owner}: journalled as {entries:?}"
                );
            }
        }
    }
}

/// The journal keeps the newest runs of a job, at most as many as its retention says, newest
/// first, each with the instance that ran it; the job is listed as journalled. A store may
/// decline run history with `LockError::Unsupported`, on every call.
pub async fn sched_journal_keeps_the_newest_runs<H: Harness>(store: &H) {
    // Until it has run three firings: a stop overtaking a firing at its start would leave a
    // run that is not one of the newest two.
    let owner = run_journalled(store, (Duration::from_secs(3600), 2), 3).await;
    let reader = store.runtime().await;
    let journal = match reader.history(JOURNALLED.name, 10).await {
        Ok(runs) if store.keeps_history() => runs,
        Ok(runs) => panic!("the harness says the store keeps no history, and it has {runs:?}"),
        Err(LockError::Unsupported(_)) if !store.keeps_history() => {
            assert!(
                matches!(
                    reader.journalled_jobs().await,
                    Err(LockError::Unsupported(_))
                ),
                "a store without history lists journals"
            );
            return;
        }
        Err(e) => panic!("reading the journal: {e}"),
    };
    let ran = ran_by(&owner);
    assert!(ran.len() >= 3, "{} runs in 10 s: {ran:?}", ran.len());
    let newest: Vec<u64> = ran.iter().rev().take(2).copied().collect();
    let journalled: Vec<u64> = journal.iter().map(|r| ms(r.scheduled_at())).collect();
    assert_eq!(journalled, newest, "the journal: {journal:?}");
    assert!(
        journal.iter().all(|r| r.owner() == owner
            && r.job() == JOURNALLED.name
            && *r.outcome() == RunOutcome::Ok),
        "the journal: {journal:?}"
    );
    let limited = reader.history(JOURNALLED.name, 1).await.expect("a read");
    assert_eq!(limited.len(), 1, "a limit of 1 gave {limited:?}");
    assert!(
        reader
            .journalled_jobs()
            .await
            .expect("a listing")
            .iter()
            .any(|j| j == JOURNALLED.name),
        "the job is not listed as journalled"
    );
    assert!(
        reader
            .history("kit-never-ran", 10)
            .await
            .expect("a read")
            .is_empty(),
        "a job that never ran has runs"
    );
}

#[distributed_lock(key = "kit-scheduled-journal", ttl = "10s")]
async fn journalled() -> Result<(), LockError> {
    record()?;
    Ok(())
}

/// With an age bound of 1 s, the journal forgets the runs older than that at the next
/// append: after runs a second apart it keeps the newest one or two, never the first. Read
/// while the job still runs, by a runtime built beforehand, and read again until the journal
/// names the newest run: the whole journal also expires 1 s after its last append, so a read
/// that came later than that (a loaded machine) would find nothing, which is right but tells
/// nothing.
pub async fn sched_journal_forgets_runs_older_than_its_age<H: Harness>(store: &H) {
    let reader = store.runtime().await;
    let runtime = store.runtime().await;
    let owner = runtime.owner().to_owned();
    let watched = owner.clone();
    let read = std::sync::Arc::new(Mutex::new(None));
    let seen = read.clone();
    scheduler_of(runtime, vec![&JOURNALLED])
        .history_retention(Duration::from_secs(1), 1_000)
        .run_until(async move {
            // At most 15 s: four runs, then a read that names the newest one.
            for _ in 0..300 {
                let ran = ran_by(&watched);
                if ran.len() >= 4 {
                    match reader.history(JOURNALLED.name, 100).await {
                        Ok(journal) => {
                            let journalled: Vec<u64> =
                                journal.iter().map(|r| ms(r.scheduled_at())).collect();
                            if journalled.first() == ran.last() {
                                *seen.lock().expect("not poisoned") = Some(Ok((ran, journalled)));
                                return;
                            }
                        }
                        // A passing failure (a connection broken under load): read again.
                        Err(e) if e.is_transient() => {}
                        Err(e) => {
                            *seen.lock().expect("not poisoned") = Some(Err(e));
                            return;
                        }
                    }
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
        .await
        .expect("the scheduler ran");
    let outcome = read.lock().expect("not poisoned").take();
    let (ran, journalled) = match outcome {
        Some(Ok(read)) => read,
        Some(Err(LockError::Unsupported(_))) if !store.keeps_history() => return,
        Some(Err(e)) => panic!("reading the journal: {e}"),
        None => panic!(
            "in 15 s, no read of the journal named the newest of the runs {:?}",
            ran_by(&owner)
        ),
    };
    assert!(
        (1..=2).contains(&journalled.len()) && !journalled.contains(&ran[0]),
        "runs {ran:?} a second apart, an age bound of 1 s: the journal kept {journalled:?}"
    );
}

/// Runs the journalled job on one instance of `store`, its journal kept by `keep` (age,
/// count), until it has run `runs` firings (at most 10 s); the instance's owner.
async fn run_journalled<H: Harness>(store: &H, keep: (Duration, usize), runs: usize) -> String {
    let runtime = store.runtime().await;
    let owner = runtime.owner().to_owned();
    let watched = owner.clone();
    scheduler_of(runtime, vec![&JOURNALLED])
        .history_retention(keep.0, keep.1)
        .run_until(async move {
            for _ in 0..200 {
                if ran_by(&watched).len() >= runs {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
        .await
        .expect("the scheduler ran");
    owner
}

static JOURNALLED: ScheduledJob = every_second("kit-journalled", || {
    Box::pin(async { job_end(&journalled().await) })
});

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

#[distributed_lock(key = "kit-scheduled-catch-up", ttl = "10s")]
async fn caught_up() -> Result<(), LockError> {
    record()?;
    tokio::time::sleep(Duration::from_millis(30)).await;
    Ok(())
}

static CAUGHT_UP: ScheduledJob = ScheduledJob {
    catch_up_within_ms: Some(30_000),
    ..every_second("kit-caught-up", || {
        Box::pin(async { job_end(&caught_up().await) })
    })
};

/// The firings `owner` ran, in order.
fn ran_by(owner: &str) -> Vec<u64> {
    RUNS.lock()
        .expect("not poisoned")
        .get(owner)
        .cloned()
        .unwrap_or_default()
}

/// Runs `job` on a new runtime whose clock starts at `start`, for `length`; returns its owner.
async fn run_one<H: Harness>(
    store: &H,
    job: &'static ScheduledJob,
    start: SystemTime,
    length: Duration,
) -> String {
    let runtime = store.runtime().await;
    let owner = runtime.owner().to_owned();
    scheduler_of(runtime, vec![job])
        .wall_clock_from(start)
        .run_until(tokio::time::sleep(length))
        .await
        .expect("the scheduler ran");
    owner
}

/// A `catch_up = "last"` job across a restart: instance A runs firings and stops; B starts
/// just after a firing A ran and catches up on it: the store's marker says it is done, so B
/// does not run it again; C starts just after a firing nobody ran and catches up on it once.
pub async fn sched_catch_up_after_a_restart_runs_what_nobody_ran<H: Harness>(store: &H) {
    // A: until it has run two firings (its catch-up at start and one on time), at most 10 s.
    let runtime = store.runtime().await;
    let a = runtime.owner().to_owned();
    let watched = a.clone();
    scheduler_of(runtime, vec![&CAUGHT_UP])
        .run_until(async move {
            for _ in 0..200 {
                if ran_by(&watched).len() >= 2 {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
        .await
        .expect("the scheduler ran");
    let ran_a = ran_by(&a);
    assert!(ran_a.len() >= 2, "A ran {ran_a:?} in 10 s");
    let last = *ran_a.iter().max().unwrap_or(&0);
    let at = |ms: u64| UNIX_EPOCH + Duration::from_millis(ms);
    // B's clock: 200 ms after A's last firing, for 500 ms: its catch-up is that firing.
    let b = run_one(
        store,
        &CAUGHT_UP,
        at(last + 200),
        Duration::from_millis(500),
    )
    .await;
    assert_eq!(
        ran_by(&b),
        Vec::<u64>::new(),
        "B ran a firing A had run ({ran_a:?})"
    );
    // C's clock: 200 ms after the firing following A's last, which nobody ran.
    let c = run_one(
        store,
        &CAUGHT_UP,
        at(last + 1_200),
        Duration::from_millis(500),
    )
    .await;
    assert_eq!(
        ran_by(&c),
        vec![last + 1_000],
        "C caught up on the firing nobody ran (A ran {ran_a:?})"
    );
}

/// The firings whose run of the stopped job got to its end, by owner.
static FINISHED: Mutex<BTreeMap<String, Vec<u64>>> = Mutex::new(BTreeMap::new());

#[distributed_lock(key = "kit-scheduled-stop", ttl = "10s")]
async fn stopped_mid_run() -> Result<(), LockError> {
    record()?;
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    record_in(&FINISHED)
}

static STOPPED_MID_RUN: ScheduledJob = every_second("kit-stopped-mid-run", || {
    Box::pin(async { job_end(&stopped_mid_run().await) })
});

/// The scheduler stopped 200 ms into a run of 1.5 s: no firing starts after the stop, the run
/// finishes within the runtime's shutdown grace (5 s) and gives its lock back, so another
/// instance takes it at once; where the store keeps history, the run is journalled `ok`.
pub async fn sched_stop_mid_run_lets_the_run_finish_and_frees_its_lock<H: Harness>(store: &H) {
    let runtime = store.runtime().await;
    let owner = runtime.owner().to_owned();
    let watched = owner.clone();
    scheduler_of(runtime, vec![&STOPPED_MID_RUN])
        .run_until(async move {
            for _ in 0..200 {
                if !ran_by(&watched).is_empty() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        })
        .await
        .expect("the scheduler ran");
    let ran = ran_by(&owner);
    assert_eq!(
        ran.len(),
        1,
        "one run began before the stop, none after: {ran:?}"
    );
    let finished = FINISHED
        .lock()
        .expect("not poisoned")
        .get(&owner)
        .cloned()
        .unwrap_or_default();
    assert_eq!(finished, ran, "the run went on to its end within the grace");
    let other = store.runtime().await;
    let guard = other.lock("kit-scheduled-stop").try_acquire().await.free();
    assert!(guard.release().await.expect("a release"), "released");
    match other.history(STOPPED_MID_RUN.name, 10).await {
        Ok(journal) => {
            assert!(store.keeps_history(), "history from a store without it");
            assert_eq!(journal.len(), 1, "{journal:?}");
            assert_eq!(*journal[0].outcome(), RunOutcome::Ok, "{journal:?}");
            assert_eq!(journal[0].owner(), owner, "{journal:?}");
        }
        Err(LockError::Unsupported(_)) if !store.keeps_history() => {}
        Err(e) => panic!("reading the journal: {e}"),
    }
}
