//! The firing a task runs (task-local), its marker in the store, and what the locked call
//! reports back to the scheduler about it.

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::request::TryOutcome;
use crate::{LockError, LockGuard, LockRuntime};

/// What became of a firing's locked call, as the call saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Report {
    /// The body ran (its value says how it ended).
    Ran,
    /// The job's lock was held: by this owner, when the store could say.
    HeldBy(Option<String>),
    /// The firing's marker was there: another instance ran (or runs) this firing.
    AlreadyRun,
    /// The lease was lost while the body ran, and the body was stopped.
    Lost,
}

/// The firing a task runs.
#[derive(Debug)]
pub(crate) struct FiringContext {
    pub(crate) job: &'static str,
    pub(crate) scheduled_at: SystemTime,
    /// How long the marker is kept.
    pub(crate) life: Duration,
    /// A marker whose holder crashed expires with its lease instead of living on.
    pub(crate) retry_crashed: bool,
    report: Mutex<Option<Report>>,
}

impl FiringContext {
    pub(crate) fn new(
        job: &'static str,
        scheduled_at: SystemTime,
        life: Duration,
        retry_crashed: bool,
    ) -> Arc<Self> {
        Arc::new(FiringContext {
            job,
            scheduled_at,
            life,
            retry_crashed,
            report: Mutex::new(None),
        })
    }

    pub(crate) fn report(&self, report: Report) {
        if let Ok(mut slot) = self.report.lock() {
            *slot = Some(report);
        }
    }

    pub(crate) fn reported(&self) -> Option<Report> {
        self.report.lock().ok().and_then(|slot| slot.clone())
    }
}

tokio::task_local! {
    static FIRING: Arc<FiringContext>;
}

/// The firing this task runs, if any.
pub(crate) fn current() -> Option<Arc<FiringContext>> {
    FIRING.try_with(Arc::clone).ok()
}

/// Runs `fut` as the firing `ctx`.
pub(crate) fn scope<F: Future>(ctx: Arc<FiringContext>, fut: F) -> impl Future<Output = F::Output> {
    FIRING.scope(ctx, fut)
}

/// The marker's key for a firing of the job locked by `key`.
pub(crate) fn marker_key(key: &str, scheduled_at: SystemTime) -> String {
    let ms = scheduled_at
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    format!("{key}@{ms}")
}

/// Claims the firing's marker, with the job's lock `key` held: `Some(guard)` when this
/// instance runs the firing, `None` when another one has (the marker is held or done).
pub(crate) async fn claim(
    runtime: &LockRuntime,
    key: &str,
    ctx: &FiringContext,
) -> Result<Option<LockGuard>, LockError> {
    let mut request = runtime
        .lock(marker_key(key, ctx.scheduled_at))
        .once(ctx.life);
    // Kept for its life whatever becomes of the run; or, to let a crashed run be retried,
    // renewed like a lease and gone soon after its holder.
    request = if ctx.retry_crashed {
        request.watchdog(true)
    } else {
        request.ttl(ctx.life).watchdog(false)
    };
    match request.try_acquire_detailed().await? {
        TryOutcome::Acquired(guard) => Ok(Some(guard)),
        TryOutcome::Held | TryOutcome::Done => Ok(None),
    }
}

/// Marks the firing done: its marker stays for its life, so no other instance runs it.
pub(crate) async fn done(key: &str, marker: LockGuard) {
    match marker.complete().await {
        Ok(_) => {}
        Err(e) => {
            tracing::warn!(key, error = %e, "could not mark the firing done; an instance whose clock is behind may run it again");
        }
    }
}
