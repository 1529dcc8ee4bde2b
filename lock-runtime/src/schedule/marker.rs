//! The firing a task runs (task-local), its marker in the store, and what the locked call
//! reports back to the scheduler about it.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::request::TryOutcome;
use crate::store::KeyNames;
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
    /// The job's own `once` marker was there (`#[distributed_lock(once = ..)]`).
    DoneMarker,
    /// The lease was lost while the body ran, and the body was stopped.
    Lost,
    /// The runtime's shutdown took the lease at the end of its grace period, and the body
    /// was stopped.
    StoppedAtGrace,
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
    /// Taken by the job's own locked call; locked calls nested in its body are plain calls.
    turn: AtomicBool,
    /// The fence of the job's lease, once it holds one (0: none yet).
    fence: AtomicU64,
    /// This instance claimed the firing's marker: no other instance will run it.
    claimed: AtomicBool,
    /// The job's lock key, once its locked call has begun, and whether a crash of a run of
    /// that call can be told from its lease ([`super::crash`]).
    key: OnceLock<(String, bool)>,
}

impl FiringContext {
    pub(crate) fn new(
        job: &'static str,
        scheduled_at: SystemTime,
        life: Duration,
        retry_crashed: bool,
        local: bool,
    ) -> Arc<Self> {
        Arc::new(FiringContext {
            job,
            scheduled_at,
            life,
            retry_crashed,
            report: Mutex::new(None),
            // A local job has no lock of its own: the locked calls in its body are plain.
            turn: AtomicBool::new(!local),
            fence: AtomicU64::new(0),
            claimed: AtomicBool::new(false),
            key: OnceLock::new(),
        })
    }

    /// The job's own locked call has begun, on `key`.
    pub(crate) fn locks(&self, key: &str, watchable: bool) {
        let _ = self.key.set((key.to_owned(), watchable));
    }

    /// The job's lock key, if its locked call began.
    pub(crate) fn key(&self) -> Option<String> {
        self.key.get().map(|(key, _)| key.clone())
    }

    /// The job's lock key, if its locked call began and a run's crash can be told from its
    /// lease.
    pub(crate) fn watchable_key(&self) -> Option<String> {
        self.key
            .get()
            .filter(|(_, watchable)| *watchable)
            .map(|(key, _)| key.clone())
    }

    /// This instance claimed the firing: its end, whatever it is, is this instance's to tell.
    pub(crate) fn claimed(&self) {
        self.claimed.store(true, Ordering::Release);
    }

    /// Whether this instance claimed the firing.
    pub(crate) fn is_claimed(&self) -> bool {
        self.claimed.load(Ordering::Acquire)
    }

    /// The job's own locked call holds its lease, of this fence.
    pub(crate) fn holds(&self, fence: u64) {
        self.fence.store(fence, Ordering::Release);
    }

    /// The fence of the job's lease, if it took one.
    pub(crate) fn fence(&self) -> Option<u64> {
        Some(self.fence.load(Ordering::Acquire)).filter(|&f| f > 0)
    }

    /// True for the first locked call of the firing only (the job's own).
    pub(crate) fn take_turn(&self) -> bool {
        self.turn.swap(false, Ordering::AcqRel)
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

/// The marker's key for a firing of `job`, locked by `key` (jobs sharing a lock key have
/// markers of their own).
pub(crate) fn marker_key(key: &str, job: &str, scheduled_at: SystemTime) -> String {
    let ms = scheduled_at
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    format!("{key}@{job}@{ms}")
}

/// What claiming a firing's marker found.
#[derive(Debug)]
pub(crate) enum Claim {
    /// This instance runs the firing. With `retry_crashed`, the marker's lease, renewed while
    /// the run goes on and marked done after it; otherwise the marker is done already.
    Mine(Option<LockGuard>),
    /// Another instance has this firing.
    Taken,
}

/// Claims the firing's marker, before the job's lock: the first instance to reach a firing
/// decides it (runs it, or skips it because the previous run still holds the lock).
///
/// Without `retry_crashed` the marker is marked done at once, before the run, and kept for its
/// life: no end of the run (a panic, a crash, a cancelled future, a shutdown) can take it
/// back. With `retry_crashed` it is a renewed lease until the run ends, and goes with a run
/// that crashed.
pub(crate) async fn claim(
    runtime: &LockRuntime,
    key: &str,
    ctx: &FiringContext,
) -> Result<Claim, LockError> {
    let request = runtime
        .lock(marker_key(key, ctx.job, ctx.scheduled_at))
        .once(ctx.life);
    let request = if ctx.retry_crashed {
        request.watchdog(true)
    } else {
        request.ttl(ctx.life).watchdog(false)
    };
    let guard = match request.try_acquire_detailed().await? {
        TryOutcome::Acquired(guard) => guard,
        TryOutcome::Held | TryOutcome::Done => return Ok(Claim::Taken),
    };
    if ctx.retry_crashed {
        return Ok(Claim::Mine(Some(guard)));
    }
    done(runtime, key, ctx, Some(guard)).await;
    Ok(Claim::Mine(None))
}

/// Marks the firing done: its marker stays for its life, so no other instance runs it. If
/// that fails, the done marker is written once more without the lease (a `retry_crashed`
/// marker would otherwise go with its lease and let a finished firing run again).
pub(crate) async fn done(
    runtime: &LockRuntime,
    key: &str,
    ctx: &FiringContext,
    marker: Option<LockGuard>,
) {
    let Some(marker) = marker else { return };
    if let Err(e) = marker.complete().await {
        tracing::warn!(key, error = %e, "could not mark the firing done; writing its done marker again");
        mark_done_again(runtime, key, ctx).await;
    }
}

/// Writes the firing's done marker again, after a run lost its lock (the store may have lost
/// its records, the marker with them): whatever the store forgot, this firing has run.
pub(crate) async fn mark_done_again(runtime: &LockRuntime, key: &str, ctx: &FiringContext) {
    let names = KeyNames::new(
        runtime.namespace(),
        &marker_key(key, ctx.job, ctx.scheduled_at),
    );
    if let Err(e) = runtime.inner.backend.mark_done(&names, ctx.life).await {
        tracing::warn!(key, error = %e, "could not write the firing's done marker again after the lost run");
    }
}
