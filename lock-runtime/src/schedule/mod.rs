//! Scheduled jobs: `#[scheduled]` fns, registered where they are written, fired by a
//! [`Scheduler`] on the runtime's store, at most once per firing across every instance.
//!
//! How one firing runs (the `#[distributed_lock]` body's path, with the firing known):
//! 1. the job's lock (its `key`) is taken as `#[distributed_lock]` says; held elsewhere, the
//!    firing is skipped ("held by ...") — the previous run is still going somewhere;
//! 2. the firing's marker, a lock named `<key>@<scheduled instant in ms>`, is claimed: taken
//!    with a ttl of the marker's life, or found taken or done, in which case another instance
//!    has run this firing and this one is skipped ("already run");
//! 3. the body runs; then the marker is marked done (kept for its life) and the lock released.
//!
//! Instances whose clocks differ name the same firings (a cron firing is a wall-clock
//! instant; `every` firings are multiples of the period since the Unix epoch), so whichever
//! reaches a firing first runs it and the others find its marker, as long as they reach it
//! within the marker's life: [`SKEW_BOUND`].

mod clock;
mod engine;
pub(crate) mod marker;
pub(crate) mod spec;

use std::fmt;
use std::time::{Duration, SystemTime};

use crate::{LockError, LockRuntime};

pub use engine::JobInfo;

/// How far apart the instances' clocks may be for "at most one run per firing" to hold: an
/// instance that reaches a firing this long after the first one did still finds its marker.
/// Markers live [`MARKER_LIFE`], which leaves a margin of five minutes for a late wake-up and
/// for the store's round trips.
pub const SKEW_BOUND: Duration = Duration::from_secs(10 * 60);

/// How long a firing's marker is kept (longer for `catch_up = "last"` jobs: their window).
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
    /// that need a given date (a daylight-saving change, a month's end).
    pub fn wall_clock_from(mut self, start: SystemTime) -> Self {
        self.start = Some(start);
        self
    }

    /// The selected jobs, each with its schedule and next firing from now, by name.
    pub fn jobs(&self) -> Result<Vec<JobInfo>, LockError> {
        let now = self.start.unwrap_or_else(SystemTime::now);
        Ok(engine::select(self.only.as_deref())?
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
        let jobs = engine::select(self.only.as_deref())?;
        engine::run(self.runtime, jobs, self.start, signal).await;
        Ok(())
    }
}
