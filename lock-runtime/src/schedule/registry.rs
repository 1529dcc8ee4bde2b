//! The registry of `#[scheduled]` fns (a linkme distributed slice the linker fills, one
//! entry per fn) and what the generated code calls; re-exported through `__private`.

use std::fmt::Display;
use std::future::Future;

use crate::LockRuntime;

/// The crate that places each entry, for the generated code's `#[linkme(crate = ..)]`.
pub use linkme;

/// Every `#[scheduled]` fn linked into the binary.
#[linkme::distributed_slice]
pub static SCHEDULED: [ScheduledJob];

/// One `#[scheduled]` fn, as the attribute registers it (its options already checked).
#[derive(Debug)]
pub struct ScheduledJob {
    /// The job's name.
    pub name: &'static str,
    /// The cron expression, or `None` with `every_ms`.
    pub cron: Option<&'static str>,
    /// The IANA time zone of `cron`.
    pub tz: &'static str,
    /// The fixed rate, or `None` with `cron`.
    pub every_ms: Option<u64>,
    /// `catch_up = "last"`: the window in which a missed firing is still run at start-up.
    pub catch_up_within_ms: Option<u64>,
    /// `local = true`: no lock, runs on every instance.
    pub local: bool,
    /// `retry_crashed = true`.
    pub retry_crashed: bool,
    /// Calls the fn.
    pub run: fn() -> JobFuture,
}

/// A scheduled fn's call, boxed.
pub type JobFuture = std::pin::Pin<Box<dyn Future<Output = JobEnd> + Send>>;

/// How a scheduled fn's value ended its run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobEnd {
    /// `()`, `Ok(..)` or `Some(..)`.
    Ok,
    /// `Err(e)`, with `e`'s text (at most 1,000 characters).
    Failed(String),
    /// `None`: a skip or a lock error, which the firing's report tells apart.
    NoValue,
}

/// A return type a scheduled fn may have.
#[diagnostic::on_unimplemented(
    message = "a `#[scheduled]` fn returns `()`, `Option<T>` or `Result<T, E>` with `E: Display`, not `{Self}`",
    label = "the scheduler cannot tell from a `{Self}` how the run ended"
)]
pub trait JobReturn {
    /// How the run ended.
    fn job_end(&self) -> JobEnd;
}

impl JobReturn for () {
    fn job_end(&self) -> JobEnd {
        JobEnd::Ok
    }
}

impl<T> JobReturn for Option<T> {
    fn job_end(&self) -> JobEnd {
        match self {
            Some(_) => JobEnd::Ok,
            None => JobEnd::NoValue,
        }
    }
}

impl<T, E: Display> JobReturn for Result<T, E> {
    fn job_end(&self) -> JobEnd {
        match self {
            Ok(_) => JobEnd::Ok,
            Err(e) => {
                let mut text = e.to_string();
                if let Some((cut, _)) = text.char_indices().nth(1000) {
                    text.truncate(cut);
                    text.push('…');
                }
                JobEnd::Failed(text)
            }
        }
    }
}

/// A scheduler of `jobs` only, not of the binary's `#[scheduled]` fns: the conformance kit
/// runs its scheduled cases with it, so its jobs never run in its users' binaries.
pub fn scheduler_of(runtime: LockRuntime, jobs: Vec<&'static ScheduledJob>) -> crate::Scheduler {
    crate::Scheduler::of(runtime, jobs)
}

/// How a scheduled fn's run ended, from its value.
pub fn job_end<R: JobReturn>(value: &R) -> JobEnd {
    value.job_end()
}
