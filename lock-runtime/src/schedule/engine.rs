//! The engine: one loop per job on `tokio::time`, each firing in a task of its own, and the
//! report of every firing (a tracing event in the firing's span, and metrics).

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::task::JoinHandle;

use super::MARKER_LIFE;
use super::clock::Clock;
use super::marker::{self, FiringContext, Report};
use super::registry::{JobEnd, SCHEDULED, ScheduledJob};
use super::spec::Schedule;
use crate::history::{self, Run, RunOutcome, Writer};
use crate::store::Retention;
use crate::{LockError, LockRuntime};

/// The longest the loop sleeps before it reads the wall clock again (a clock set while it
/// sleeps is noticed within this).
const REREAD: Duration = Duration::from_secs(60);

/// A firing the loop reaches later than this after its instant is missed, not run: a run
/// that late could come after the marker of the instance that ran it has gone.
pub(crate) const LATE: Duration = Duration::from_secs(60);

/// How many missed firings one report counts at the most ("at least" beyond).
const MISSED_COUNTED: u64 = 10_000;

/// A registered job, as [`crate::Scheduler::jobs`] lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobInfo {
    /// The job's name.
    pub name: String,
    /// Its schedule, e.g. `cron "0 0 2 * * *" in Europe/Berlin` or `every 5s`.
    pub schedule: String,
    /// Its next firing after now (`None`: it has no further firing).
    pub next: Option<SystemTime>,
    /// `local = true`: it runs on every instance, without a lock.
    pub local: bool,
}

/// A job with its schedule checked.
#[derive(Debug)]
pub(crate) struct Job {
    pub(super) def: &'static ScheduledJob,
    pub(super) schedule: Schedule,
}

impl Job {
    pub(crate) fn info(&self, now: SystemTime) -> JobInfo {
        JobInfo {
            name: self.def.name.to_owned(),
            schedule: self.schedule.to_string(),
            next: self.schedule.next_after(now),
            local: self.def.local,
        }
    }

    /// `catch_up = "last"`: how old a missed firing may be and still run.
    fn catch_up_window(&self) -> Option<Duration> {
        self.def.catch_up_within_ms.map(Duration::from_millis)
    }

    /// How long this job's firing markers are kept: a catch-up job's window, plus the margin
    /// every marker has for the instances' clocks.
    pub(super) fn marker_life(&self) -> Duration {
        self.catch_up_window().unwrap_or(Duration::ZERO) + MARKER_LIFE
    }
}

/// The jobs of `from` (default: every `#[scheduled]` fn of the binary), or those of them
/// named in `only`, by name.
pub(crate) fn select(
    from: Option<&[&'static ScheduledJob]>,
    only: Option<&[String]>,
) -> Result<Vec<Job>, LockError> {
    let all: Vec<&'static ScheduledJob> = match from {
        Some(jobs) => jobs.to_vec(),
        None => SCHEDULED.iter().collect(),
    };
    if all.is_empty() {
        return Err(LockError::Config(
            "no #[scheduled] fn is linked into this binary".to_owned(),
        ));
    }
    let mut jobs = Vec::new();
    for def in all.iter().copied() {
        if only.is_some_and(|names| !names.iter().any(|n| n == def.name)) {
            continue;
        }
        let schedule = match (def.cron, def.every_ms) {
            (Some(cron), _) => Schedule::cron(cron, def.tz),
            (None, Some(ms)) => Schedule::every(Duration::from_millis(ms)),
            (None, None) => Err("neither cron nor every".to_owned()),
        }
        .map_err(|e| LockError::Config(format!("scheduled job `{}`: {e}", def.name)))?;
        jobs.push(Job { def, schedule });
    }
    if let Some(names) = only {
        for name in names {
            if !jobs.iter().any(|j| j.def.name == name) {
                let mut known: Vec<&str> = all.iter().map(|d| d.name).collect();
                known.sort_unstable();
                return Err(LockError::Config(format!(
                    "no scheduled job is named `{name}` (the jobs: {})",
                    known.join(", ")
                )));
            }
        }
    }
    let mut names: Vec<&str> = jobs.iter().map(|j| j.def.name).collect();
    names.sort_unstable();
    if let Some(pair) = names.windows(2).find(|w| w[0] == w[1]) {
        return Err(LockError::Config(format!(
            "two scheduled jobs are named `{}`: give one a `name = \"..\"`",
            pair[0]
        )));
    }
    jobs.sort_by_key(|j| j.def.name);
    Ok(jobs)
}

/// Runs the jobs until `signal`, then shuts down as [`crate::Scheduler::run_until`] says.
pub(crate) async fn run<F: Future>(
    runtime: LockRuntime,
    jobs: Vec<Job>,
    start: Option<SystemTime>,
    history: Option<Retention>,
    signal: F,
) {
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let (grace_over, grace_ended) = tokio::sync::watch::channel(false);
    let clock = Clock::new(start);
    let (writer, flush) = Writer::start(&runtime, history);
    // Dropped (the caller's future cancelled): every loop and its running firing stop, and
    // their locks are released in the background as their guards drop.
    let mut loops: Vec<Aborting<Option<Aborting<()>>>> = jobs
        .into_iter()
        .map(|job| {
            let runtime = runtime.clone();
            let firing = Firer {
                runtime: runtime.clone(),
                job: Arc::new(job),
                clock: clock.clone(),
                writer: writer.clone(),
                grace_ended: grace_ended.clone(),
                stopped: stopped.clone(),
                watching: Arc::default(),
            };
            Aborting(tokio::spawn(job_loop(firing, stopped.clone())))
        })
        .collect();
    signal.await;
    let _ = stop.send(true);
    let mut running = Vec::new();
    for handle in &mut loops {
        if let Ok(Some(firing)) = (&mut handle.0).await {
            running.push(firing);
        }
    }
    // The running firings get the runtime's grace period to end: the runtime's shutdown
    // waits for their leases, and this for the firings themselves (a local job holds no
    // lease). What still runs after it has no lease any more and is stopped by its firing,
    // which then journals how it ended. (Stopping the firing's task here instead could come
    // between a run's release and its journal entry: a run that ended well would go
    // unrecorded.)
    let grace_end = tokio::time::Instant::now() + runtime.inner.shutdown_grace;
    tokio::join!(runtime.shutdown(), ended_by(&mut running, grace_end));
    let _ = grace_over.send(true);
    ended_by(&mut running, tokio::time::Instant::now() + REPORTED).await;
    for firing in &mut running {
        if firing.is_running() {
            firing.0.abort();
            let _ = (&mut firing.0).await;
        }
    }
    // Every firing has reported: the journal gets what is queued, within its bound.
    drop(loops);
    drop(writer);
    flush.wait().await;
}

/// Waits for the `firings` still running to end, until `deadline`.
async fn ended_by(firings: &mut [Aborting<()>], deadline: tokio::time::Instant) {
    for firing in firings {
        if firing.is_running() {
            let _ = tokio::time::timeout_at(deadline, &mut firing.0).await;
        }
    }
}

/// What a job's loop and its firings need: the runtime, the job, the wall clock, the journal.
#[derive(Clone)]
pub(super) struct Firer {
    pub(super) runtime: LockRuntime,
    pub(super) job: Arc<Job>,
    pub(super) clock: Clock,
    pub(super) writer: Writer,
    /// True once the runtime's shutdown grace has ended: a body still running is stopped.
    grace_ended: tokio::sync::watch::Receiver<bool>,
    /// True once the scheduler stops.
    pub(super) stopped: tokio::sync::watch::Receiver<bool>,
    /// Set while this instance watches a firing another one claimed ([`super::crash`]).
    pub(super) watching: Arc<std::sync::atomic::AtomicBool>,
}

/// A task that is aborted when its handle is dropped.
struct Aborting<T>(JoinHandle<T>);

impl<T> Drop for Aborting<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl<T> Aborting<T> {
    fn is_running(&self) -> bool {
        !self.0.is_finished()
    }
}

/// One job's loop: sleep to the next firing, fire it in a task of its own, and so on until
/// the stop; returns the firing still running then.
async fn job_loop(
    firer: Firer,
    mut stopped: tokio::sync::watch::Receiver<bool>,
) -> Option<Aborting<()>> {
    let (job, mut clock) = (firer.job.clone(), firer.clock.clone());
    let mut running: Option<Aborting<()>> = None;
    let mut after = clock.now();
    if *stopped.borrow() {
        return None;
    }
    if let Some(window) = job.catch_up_window()
        && let Some(last) = job.schedule.last_at_or_before(after)
        && after.duration_since(last).unwrap_or(Duration::ZERO) <= window
    {
        tracing::info!(
            job = job.def.name,
            "catching up on the last firing (catch_up = \"last\")"
        );
        running = Some(Aborting(tokio::spawn(fire(firer.clone(), last))));
    }
    loop {
        let Some(next) = job.schedule.next_after(after) else {
            tracing::info!(job = job.def.name, "the job has no further firing");
            return running;
        };
        let now = loop {
            let now = clock.now();
            if now >= next {
                break now;
            }
            let wait = next
                .duration_since(now)
                .unwrap_or(Duration::ZERO)
                .min(REREAD);
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = stopped.wait_for(|stop| *stop) => return running,
            }
        };
        if *stopped.borrow() {
            return running;
        }
        // Woken long after the firing (the process was stopped or starved, the clock was set
        // forward): of the firings passed since, only the last one may still run, if it is
        // at most LATE old (a `catch_up = "last"` job: at most its window old, the life of
        // its markers); the others are missed, not run: run that late, one could come after
        // the marker of the instance that ran it had gone.
        let mut due = next;
        if now.duration_since(next).unwrap_or(Duration::ZERO) > LATE {
            let last = job
                .schedule
                .last_at_or_before(now)
                .unwrap_or(next)
                .max(next);
            let may_run = job.catch_up_window().unwrap_or(LATE).max(LATE);
            let runs_last = now.duration_since(last).unwrap_or(Duration::ZERO) <= may_run;
            let mut missed = u64::from(!runs_last);
            let mut n = next;
            while n < last && missed < MISSED_COUNTED {
                missed += 1;
                match job.schedule.next_after(n) {
                    Some(following) => n = following,
                    None => break,
                }
            }
            if missed > 0 {
                let at = clock.now();
                firer.report(next, &Ended::Missed(missed), (at, at));
            }
            after = last;
            if !runs_last {
                continue;
            }
            due = last;
        }
        after = due;
        if running.as_ref().is_some_and(Aborting::is_running) {
            let at = clock.now();
            firer.report(due, &Ended::StillRunningHere, (at, at));
            continue;
        }
        running = Some(Aborting(tokio::spawn(fire(firer.clone(), due))));
    }
}

/// How long the stop waits, after the grace period, for the firings to say how they ended.
const REPORTED: Duration = Duration::from_secs(1);

/// The error journalled for a run the shutdown's grace period did not see to its end.
const STOPPED_AT_GRACE: &str =
    "stopped at the end of the shutdown grace period, before the run had ended";

/// How a firing ended, for the report.
#[derive(Debug)]
enum Ended {
    Ok,
    Failed(String),
    Panicked(String),
    HeldBy(Option<String>),
    AlreadyRun,
    OnceMarker,
    Lost,
    StillRunningHere,
    Missed(u64),
    /// The scheduler stopped before the firing's lock was taken.
    StoppedFirst,
}

impl Ended {
    /// What the job's journal says of it; `None` when another instance says it: a firing
    /// another instance claimed (that one ran it, or journals why not), or one skipped here
    /// because this instance still runs the previous one (the instance that claims the
    /// firing finds the lock held and journals the skip).
    fn journalled(&self, local: bool) -> Option<RunOutcome> {
        Some(match self {
            Ended::Ok => RunOutcome::Ok,
            Ended::Failed(e) => RunOutcome::Failed {
                error: history::bounded(e),
            },
            Ended::Panicked(e) => RunOutcome::Failed {
                error: history::bounded(&format!("panicked: {e}")),
            },
            Ended::HeldBy(holder) => RunOutcome::Skipped {
                holder: holder.clone(),
            },
            Ended::OnceMarker => RunOutcome::AlreadyDone,
            Ended::Lost => RunOutcome::Lost,
            Ended::Missed(_) => RunOutcome::Missed,
            // A local job runs on every instance: each says what it skipped.
            Ended::StillRunningHere if local => RunOutcome::Skipped { holder: None },
            Ended::AlreadyRun | Ended::StillRunningHere | Ended::StoppedFirst => return None,
        })
    }

    fn label(&self) -> &'static str {
        match self {
            Ended::Ok => "ok",
            Ended::Failed(_) => "failed",
            Ended::Panicked(_) => "panicked",
            Ended::HeldBy(_) | Ended::StillRunningHere => "skipped_held",
            Ended::AlreadyRun | Ended::OnceMarker => "skipped_done",
            Ended::Missed(_) => "missed",
            Ended::Lost => "lost",
            Ended::StoppedFirst => "stopped",
        }
    }
}

/// Runs one firing: the job's fn in a task of its own (a panic ends that task only), as the
/// firing `at`, on `runtime`.
async fn fire(mut firer: Firer, at: SystemTime) {
    let (runtime, job) = (firer.runtime.clone(), firer.job.clone());
    let began = firer.clock.now();
    let ctx = FiringContext::new(
        job.def.name,
        at,
        job.marker_life(),
        job.def.retry_crashed,
        job.def.local,
    );
    let started = tokio::time::Instant::now();
    let body = runtime.scope(marker::scope(ctx.clone(), (job.def.run)()));
    // A firing stopped at shutdown stops its body too.
    let mut task = Aborting(tokio::spawn(body));
    let mut grace_ended = firer.grace_ended.clone();
    let joined = tokio::select! {
        biased;
        joined = &mut task.0 => joined,
        () = async move {
            // The scheduler's `run` dropped (its caller's future cancelled) closes the
            // channel: that is no end of a grace period, and the firing is aborted anyway.
            if grace_ended.wait_for(|ended| *ended).await.is_err() {
                std::future::pending::<()>().await;
            }
        } => {
            // Ended meanwhile, it says how; else it is stopped now.
            task.0.abort();
            (&mut task.0).await
        }
    };
    let ended = match joined {
        Err(e) if e.is_panic() => Ended::Panicked(panic_text(e.into_panic())),
        // Stopped at the end of the grace. Claimed here (or a local job), the firing was
        // this instance's; otherwise it had not got as far as its marker: not this
        // instance's to tell.
        Err(_) if job.def.local || ctx.is_claimed() => Ended::Failed(STOPPED_AT_GRACE.to_owned()),
        Err(_) => Ended::StoppedFirst,
        Ok(end) => match (ctx.reported(), end) {
            (Some(Report::HeldBy(owner)), _) => Ended::HeldBy(owner),
            (Some(Report::AlreadyRun), _) => Ended::AlreadyRun,
            (Some(Report::DoneMarker), _) => Ended::OnceMarker,
            // Its lease was taken at the end of the shutdown's grace, not lost to the store.
            (Some(Report::StoppedAtGrace), _) => Ended::Failed(STOPPED_AT_GRACE.to_owned()),
            (Some(Report::Lost), _) => Ended::Lost,
            // The stop came before the job's lock was taken. Claimed here, the firing is
            // done for every instance (its marker says so): it failed. Not claimed, it is
            // not this instance's to tell (another may still run it).
            (None, _) if !job.def.local && runtime.inner.is_shut_down() => {
                if ctx.is_claimed() {
                    Ended::Failed("the scheduler stopped before the job's lock was taken".into())
                } else {
                    Ended::StoppedFirst
                }
            }
            (_, JobEnd::Failed(text)) => Ended::Failed(text),
            (Some(Report::Ran), _) => Ended::Ok,
            (None, _) if job.def.local => Ended::Ok,
            // The locked call did not get as far as the lock (no runtime, a store error) and
            // its value could not say so (`()` or `None`): the error is in the log.
            (None, _) => {
                Ended::Failed("the job's lock could not be taken (see the log)".to_owned())
            }
        },
    };
    let took = started.elapsed();
    let ended_at = firer.clock.now();
    firer.report_run(
        at,
        &ended,
        (began, ended_at),
        took,
        (ctx.key(), ctx.fence()),
    );
    // Claimed by another instance: follow its run, to tell if it crashes. (A crashed run of
    // a `retry_crashed` job is run again instead; a scheduler without history writes none.)
    if matches!(ended, Ended::AlreadyRun)
        && !job.def.retry_crashed
        && firer.writer.is_on()
        && let Some(key) = ctx.watchable_key()
    {
        super::crash::watch(&firer, at, key);
    }
}

fn panic_text(payload: Box<dyn std::any::Any + Send>) -> String {
    if let Some(text) = payload.downcast_ref::<&str>() {
        (*text).to_owned()
    } else if let Some(text) = payload.downcast_ref::<String>() {
        text.clone()
    } else {
        "a panic".to_owned()
    }
}

impl Firer {
    /// A firing that did not run here: reported, and journalled if this instance is the one
    /// to say so.
    fn report(&self, at: SystemTime, ended: &Ended, times: (SystemTime, SystemTime)) {
        self.report_run(at, ended, times, Duration::ZERO, (None, None));
    }

    /// A firing's end: the event, the metrics, and its run in the job's journal.
    fn report_run(
        &self,
        at: SystemTime,
        ended: &Ended,
        (started_at, finished_at): (SystemTime, SystemTime),
        took: Duration,
        (key, fence): (Option<String>, Option<u64>),
    ) {
        report(&self.runtime, &self.job, at, ended, took);
        if let Some(outcome) = ended.journalled(self.job.def.local) {
            let owner = self.runtime.owner().to_owned();
            self.writer.write(self.run(
                at,
                owner,
                (started_at, finished_at),
                (key, fence),
                outcome,
            ));
        }
    }

    /// The journal's entry for the firing `at` of this job: its run by `owner`, with the
    /// job's schedule and next firing.
    pub(super) fn run(
        &self,
        at: SystemTime,
        owner: String,
        (started_at, finished_at): (SystemTime, SystemTime),
        (key, fence): (Option<String>, Option<u64>),
        outcome: RunOutcome,
    ) -> Run {
        Run {
            job: self.job.def.name.to_owned(),
            scheduled_at: at,
            owner,
            started_at,
            finished_at,
            fence,
            outcome,
            key,
            schedule: Some(self.job.schedule.to_string()),
            next_firing: self.job.schedule.next_after(at),
        }
    }
}

/// One event per firing, in a span naming the job, its firing and this instance.
fn report(runtime: &LockRuntime, job: &Job, at: SystemTime, ended: &Ended, took: Duration) {
    let at_ms = at
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let span = tracing::info_span!(
        "firing",
        job = job.def.name,
        scheduled_at_ms = at_ms,
        instance = runtime.owner(),
        outcome = ended.label(),
    );
    let _entered = span.enter();
    match ended {
        Ended::Ok => tracing::info!(took_ms = took.as_millis() as u64, "ran"),
        Ended::Failed(e) => {
            tracing::warn!(error = %e, took_ms = took.as_millis() as u64, "ran and failed")
        }
        Ended::Panicked(e) => {
            tracing::error!(panic = %e, "the job panicked; the scheduler goes on")
        }
        Ended::HeldBy(Some(owner)) => {
            tracing::info!(holder = %owner, "skipped: the job's lock is held (the previous run still runs)")
        }
        Ended::HeldBy(None) => {
            tracing::info!("skipped: the job's lock is held (the previous run still runs)")
        }
        Ended::StillRunningHere => {
            tracing::info!("skipped: the previous run still runs on this instance")
        }
        Ended::AlreadyRun => tracing::info!("skipped: another instance has run this firing"),
        Ended::OnceMarker => tracing::info!("skipped: the job's `once` marker is there"),
        Ended::Missed(n) => tracing::warn!(
            missed = n,
            "woke too late for this firing (and the next ones it names): missed, not run"
        ),
        Ended::Lost => tracing::warn!("the job lost its lock while it ran and was stopped"),
        Ended::StoppedFirst => {
            tracing::info!("not run: the scheduler stopped before the job's lock was taken")
        }
    }
    crate::metrics::firing(job.def.name, ended.label(), took);
}
