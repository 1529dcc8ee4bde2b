//! Background releases: the job, its retries, and the counts and signals a shutdown waits on.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use crate::config::jitter;
use crate::store::{KeyNames, ReleaseOutcome, SharedBackend};

/// A release to perform in the background.
pub(crate) struct ReleaseJob {
    pub(crate) names: KeyNames,
    pub(crate) token: String,
    /// The `once` marker to write with the release: until when it must last (a retry made
    /// later writes it for what is left of its retention, not for a whole one again; none
    /// once that has passed).
    pub(crate) done_until: Option<Instant>,
    /// The lease being released, when there is one (None: an acquire whose caller went away).
    pub(crate) lease_id: Option<u64>,
    /// Until when a try that fails for a passing reason is made again: the instant the lease
    /// (or the grant nobody got) expires anyway. None: one try.
    pub(crate) retry_until: Option<Instant>,
}

/// A count of releases and acquires under way, and a way to wait until there are none.
#[derive(Debug, Default)]
pub(crate) struct InFlight {
    pub(super) count: AtomicUsize,
    none_left: tokio::sync::Notify,
}

/// Counts one release or acquire as under way until dropped.
pub(crate) struct InFlightRelease(Arc<InFlight>);

impl Drop for InFlightRelease {
    fn drop(&mut self) {
        if self.0.count.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.none_left.notify_waiters();
        }
    }
}

impl InFlight {
    pub(super) fn start(self: &Arc<Self>) -> InFlightRelease {
        self.count.fetch_add(1, Ordering::AcqRel);
        InFlightRelease(self.clone())
    }

    pub(super) async fn finished(&self) {
        loop {
            let none_left = self.none_left.notified();
            tokio::pin!(none_left);
            none_left.as_mut().enable();
            if self.count.load(Ordering::Acquire) == 0 {
                return;
            }
            none_left.await;
        }
    }
}

/// One background release, each try bounded by the command timeout. A try that fails for a
/// passing reason (a transient error, no answer) is made again, 100 ms doubling to 2 s, until
/// the job's `retry_until` or the start of a shutdown: a grant whose answer was lost, or a
/// release sent into a failover, would otherwise leave the lock to nobody for the rest of its
/// ttl. The release is token-checked, so a late try never touches another holder's lock.
pub(super) async fn run_release(
    backend: SharedBackend,
    timeout: Duration,
    job: ReleaseJob,
    stopping: Arc<Stopping>,
) {
    let mut pause = Duration::from_millis(100);
    loop {
        let done_retention = job
            .done_until
            .map(|until| until.saturating_duration_since(Instant::now()))
            .filter(|left| *left >= Duration::from_millis(1));
        let released = backend.release(&job.names, &job.token, done_retention);
        let failure = match tokio::time::timeout(timeout, released).await {
            Ok(Ok(ReleaseOutcome::NotOwner)) => {
                tracing::debug!(key = %job.names.key(), "lock was no longer ours at release");
                return;
            }
            Ok(Ok(outcome)) => {
                tracing::debug!(key = %job.names.key(), ?outcome, "lock released in the background");
                return;
            }
            Ok(Err(e)) if !e.is_transient() => {
                tracing::warn!(key = %job.names.key(), error = %e, "release failed; the lease will expire by its ttl");
                return;
            }
            Ok(Err(e)) => e.to_string(),
            Err(_) => "no answer within the command timeout".to_owned(),
        };
        let again = job
            .retry_until
            .is_some_and(|until| Instant::now() + pause < until)
            && !stopping.is_set();
        if !again {
            tracing::warn!(key = %job.names.key(), error = %failure, "release failed; the lease will expire by its ttl");
            return;
        }
        tracing::debug!(key = %job.names.key(), error = %failure, "release failed; trying again");
        // Jittered: the releases that failed together (an outage) do not all come back at once.
        // A shutdown that begins meanwhile cuts the pause short: one last try at once, rather
        // than holding the shutdown up for the rest of the pause.
        stopping.sleep(pause / 2 + jitter(pause / 2)).await;
        pause = (pause * 2).min(Duration::from_secs(2));
    }
}

/// Set once a shutdown begins (or the driver ends): background releases stop trying again, and
/// one pausing between two tries makes its last try at once.
#[derive(Debug, Default)]
pub(crate) struct Stopping {
    set: AtomicBool,
    wake: tokio::sync::Notify,
}

impl Stopping {
    pub(super) fn set(&self) {
        self.set.store(true, Ordering::Release);
        self.wake.notify_waiters();
    }

    pub(super) fn is_set(&self) -> bool {
        self.set.load(Ordering::Acquire)
    }

    /// Sleeps `pause`, or until the shutdown begins.
    async fn sleep(&self, pause: Duration) {
        let woken = self.wake.notified();
        tokio::pin!(woken);
        // Registered before the flag is read, so a `set` in between still wakes it.
        woken.as_mut().enable();
        if self.is_set() {
            return;
        }
        tokio::select! {
            () = tokio::time::sleep(pause) => {}
            () = woken => {}
        }
    }
}
