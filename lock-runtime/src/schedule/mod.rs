//! Scheduled jobs: `#[scheduled]` fns, registered where they are written, fired by a
//! [`Scheduler`] on the runtime's store, at most once per firing across every instance.
//!
//! How one firing runs (the job's own `#[distributed_lock]` call, with the firing known):
//! 1. the firing's marker, a lock named `<key>@<job>@<scheduled instant in ms>`, is claimed
//!    and marked done at once (kept for its life): found there, another instance has this
//!    firing and this one is skipped ("already run");
//! 2. the job's lock (its `key`) is taken as `#[distributed_lock]` says; held, the firing is
//!    skipped ("held by ...");
//! 3. the body runs, and the lock is released.
//!
//! Instances whose clocks differ name the same firings (a cron firing is a wall-clock
//! instant; `every` firings are multiples of the period since the Unix epoch), so whichever
//! reaches a firing first runs it and the others find its marker, as long as they reach it
//! within the marker's life: [`SKEW_BOUND`]. A loop woken more than a minute after a firing
//! reports it missed instead of running it.

mod clock;
mod crash;
mod engine;
pub(crate) mod marker;
pub(crate) mod registry;
pub(crate) mod spec;

use std::fmt;
use std::time::{Duration, SystemTime};

use crate::store::Retention;
use crate::{LockError, LockRuntime};
use registry::ScheduledJob;

pub use engine::JobInfo;

/// How far apart the instances' clocks may be for "at most one run per firing" to hold: an
/// instance that reaches a firing this long after the first one did still finds its marker.
/// Markers live [`MARKER_LIFE`], which leaves a margin of five minutes for the store's round
/// trips and a wake-up up to a minute late (later ones are missed, not run).
pub const SKEW_BOUND: Duration = Duration::from_secs(10 * 60);

/// How long a firing's marker is kept (for `catch_up = "last"` jobs, their window plus this).
pub const MARKER_LIFE: Duration = Duration::from_secs(15 * 60);

/// One firing of a scheduled job, as its body sees it through [`current_firing`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Firing {
    job: String,
    scheduled_at: SystemTime,
}

impl Firing {
    /// The job's name (`name = ".."`, or the fn's name).
    pub fn job(&self) -> &str {
        &self.job
    }

    /// The instant this firing was scheduled for: the same on every instance.
    pub fn scheduled_at(&self) -> SystemTime {
        self.scheduled_at
    }
}

/// The firing whose body is running in this task, or `None` outside a scheduled job.
pub fn current_firing() -> Option<Firing> {
    marker::current().map(|ctx| Firing {
        job: ctx.job.to_owned(),
        scheduled_at: ctx.scheduled_at,
    })
}

/// Runs the `#[scheduled]` fns linked into this binary on a runtime.
///
/// ```no_run
/// use lock_runtime::{LockRuntime, Scheduler, distributed_lock, scheduled};
///
/// #[scheduled(cron = "0 0 2 * * *", tz = "Europe/Berlin")]
/// #[distributed_lock(key = "interest-posting", ttl = "60s")]
/// async fn post_daily_interest() -> Result<(), lock_runtime::LockError> {
///     Ok(())
/// }
///
/// # async fn run() -> Result<(), lock_runtime::LockError> {
/// let runtime = LockRuntime::builder().redis("redis://127.0.0.1:6379").build().await?;
/// Scheduler::new(runtime).run_until(tokio::signal::ctrl_c()).await?;
/// # Ok(())
/// # }
/// ```
pub struct Scheduler {
    runtime: LockRuntime,
    only: Option<Vec<String>>,
    start: Option<SystemTime>,
    /// The jobs to choose from: `None`, every `#[scheduled]` fn of the binary.
    from: Option<Vec<&'static ScheduledJob>>,
    /// What the run journals keep; `None`: no journal is written.
    history: Option<Retention>,
}

impl fmt::Debug for Scheduler {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Scheduler")
            .field("runtime", &self.runtime)
            .field("only", &self.only)
            .finish_non_exhaustive()
    }
}

impl Scheduler {
    /// A scheduler of every `#[scheduled]` fn in the binary, on `runtime`.
    pub fn new(runtime: LockRuntime) -> Self {
        Scheduler {
            runtime,
            only: None,
            start: None,
            from: None,
            history: Some(Retention::new(
                crate::history::DEFAULT_MAX_AGE,
                crate::history::DEFAULT_MAX_RUNS,
            )),
        }
    }

    /// How much of each job's run journal the store keeps (default: 30 days, at most 1,000
    /// runs per job; see [`LockRuntime::history`]). A `max_runs` of 0 counts as 1.
    pub fn history_retention(mut self, max_age: Duration, max_runs: usize) -> Self {
        self.history = Some(Retention::new(max_age, max_runs));
        self
    }

    /// Writes no run journal: firings are still logged and counted, but
    /// [`LockRuntime::history`] and `lockctl history` show nothing of them.
    pub fn without_history(mut self) -> Self {
        self.history = None;
        self
    }

    /// A scheduler of the given jobs only, not of the binary's registry (for the conformance
    /// kit, whose jobs must not run in its users' binaries).
    pub(crate) fn of(runtime: LockRuntime, jobs: Vec<&'static ScheduledJob>) -> Self {
        Scheduler {
            from: Some(jobs),
            ..Scheduler::new(runtime)
        }
    }

    /// Keeps only the jobs of these names (`run_until` refuses a name no job has).
    pub fn only<I, S>(mut self, names: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.only = Some(names.into_iter().map(Into::into).collect());
        self
    }

    /// Reads the wall clock as `start` when `run_until` begins and carries it forward with
    /// `tokio::time` from there, never reading the system's clock: for tests on paused time
    /// (exactly the same run every time, from a given date: a daylight-saving change, a
    /// month's end), and to give an instance a clock of its own in a demo.
    pub fn wall_clock_from(mut self, start: SystemTime) -> Self {
        self.start = Some(start);
        self
    }

    /// The selected jobs, each with its schedule and next firing from now, by name.
    pub fn jobs(&self) -> Result<Vec<JobInfo>, LockError> {
        let now = self.start.unwrap_or_else(SystemTime::now);
        Ok(engine::select(self.from.as_deref(), self.only.as_deref())?
            .iter()
            .map(|job| job.info(now))
            .collect())
    }

    /// Fires the selected jobs until `signal` resolves; then fires no more, gives running
    /// jobs the runtime's shutdown grace period to finish and shuts the runtime down.
    ///
    /// Fails at once, with [`LockError::Config`], when no `#[scheduled]` fn is linked into
    /// the binary or `only` names one that is not.
    pub async fn run_until<F>(self, signal: F) -> Result<(), LockError>
    where
        F: Future,
    {
        let jobs = engine::select(self.from.as_deref(), self.only.as_deref())?;
        engine::run(self.runtime, jobs, self.start, self.history, signal).await;
        Ok(())
    }
}
