//! The guard that owns a held lock and gives it back.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::config::{check_ttl, drift};
use crate::runtime::RuntimeInner;
use crate::store::{ExtendItem, KeyNames, ReleaseOutcome, Renewal};
use crate::watchdog::ReleaseJob;
use crate::{BackendError, Lease, LockError};

/// Proof that this runtime holds a lock. The lock is released when the guard is released or
/// dropped.
///
/// - [`LockGuard::release`] gives the lock back and says whether it was still ours.
/// - Dropping the guard (end of scope, a panic unwinding through it, a cancelled future that
///   owned it) hands the release to the runtime's background driver: it never blocks the
///   dropping thread, and the lock is free within a round trip, not after its ttl.
///
/// While the guard lives, the runtime's watchdog renews the lease at a third of its ttl
/// (unless the request turned the watchdog off).
#[must_use = "the lock is released as soon as the guard is dropped; bind it to a variable: `let _guard = ...`"]
pub struct LockGuard {
    lease: Lease,
    runtime: Arc<RuntimeInner>,
    done_retention: Option<Duration>,
    armed: bool,
}

impl std::fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockGuard")
            .field("lease", &self.lease)
            .finish_non_exhaustive()
    }
}

impl LockGuard {
    pub(crate) fn new(
        lease: Lease,
        runtime: Arc<RuntimeInner>,
        done_retention: Option<Duration>,
    ) -> Self {
        runtime.guard_opened(&lease.state);
        LockGuard {
            lease,
            runtime,
            done_retention,
            armed: true,
        }
    }

    /// The lease this guard holds.
    pub fn lease(&self) -> &Lease {
        &self.lease
    }

    /// Makes the lease last at least `ttl` from now, but never past the request's `max_hold`.
    /// Returns `Ok(false)` when the lock is no longer ours (expired or taken over), in which
    /// case the lease is marked lost, or when `max_hold` has been reached. A lease is never
    /// shortened by this call.
    ///
    /// # Cancel safety
    /// Cancel safe: if dropped, the extension may or may not have been applied.
    pub async fn extend(&self, ttl: Duration) -> Result<bool, LockError> {
        check_ttl("extend ttl", ttl)?;
        let state = &self.lease.state;
        if state.is_lost() {
            return Ok(false);
        }
        // max_hold is a hard cap here too: never ask for more than what is left of it.
        let ttl = match state.max_hold_until {
            Some(cap) => ttl.min(cap.saturating_duration_since(Instant::now())),
            None => ttl,
        };
        if ttl < Duration::from_millis(1) {
            return Ok(false);
        }
        let sent = Instant::now();
        let renewed = self
            .runtime
            .backend
            .extend(&[ExtendItem {
                record: state.names.record().to_owned(),
                token: state.token.clone(),
                ttl,
            }])
            .await?;
        let renewed = match renewed.into_iter().next() {
            Some(Renewal::Renewed) => true,
            Some(Renewal::Unknown(why)) => return Err(BackendError::transient(why).into()),
            Some(Renewal::NotOurs) | None => false,
        };
        if renewed {
            if !state.extend_validity(sent + ttl - drift(ttl).min(ttl)) {
                tracing::warn!(key = %state.names.key(), fence = ?state.known_fence(), "lock lost: the extension was answered after the lease ended");
                return Ok(false);
            }
            tracing::debug!(key = %state.names.key(), fence = ?state.known_fence(), ?ttl, "lease extended");
            Ok(true)
        } else {
            if state.mark_lost() {
                tracing::warn!(key = %state.names.key(), fence = ?state.known_fence(), "lock lost: extend found another owner");
            }
            Ok(false)
        }
    }

    /// Gives the lock back now. `Ok(true)`: it was ours and is released (or, with `min_hold`,
    /// will expire when min_hold has passed). `Ok(false)`: it was no longer ours, nothing was
    /// touched. An `Err` means the store could not be reached. When the failure is a passing
    /// one ([`LockError::is_transient`]: a network blip, a failover), the same release is
    /// tried again in the background (100 ms doubling to 2 s, until the lease would have
    /// expired anyway, one try once a shutdown begins, which waits for it); otherwise the lease
    /// expires by its ttl, since the watchdog no longer renews it.
    ///
    /// # Cancel safety
    /// If the returned future is dropped before it completes, the release still happens in the
    /// background.
    pub async fn release(self) -> Result<bool, LockError> {
        self.finish(None).await
    }

    /// Releases the lock and, for a request made with [`once`](crate::LockRequest::once),
    /// records that the work is done: later requests for the key skip until the retention
    /// ends. Marker and release are written by one script. Without `once` it is `release`.
    /// The marker is written even when the lease lapsed while the work ran (the work did
    /// succeed, and must not run again); the call then returns `Ok(false)`. A passing failure
    /// is tried again in the background as for [`release`](Self::release), marker included,
    /// and still returned.
    ///
    /// # Cancel safety
    /// As for [`release`](Self::release).
    pub async fn complete(self) -> Result<bool, LockError> {
        let once = self.done_retention;
        self.finish(once).await
    }

    async fn finish(mut self, done_retention: Option<Duration>) -> Result<bool, LockError> {
        self.armed = false;
        let state = self.lease.state.clone();
        // Counted before the watchdog forgets the lease, so a shutdown that finds the
        // watchdog empty still waits for this release.
        let _in_flight = self.runtime.watchdog.work_in_flight();
        state.mark_ended();
        self.runtime.guard_closed(&state);
        state.count_release();
        self.runtime.watchdog.forget(state.id);
        // If this future is dropped mid-way, the pending release below still runs, tried
        // again until the lease would have expired anyway.
        let pending = PendingRelease::new(
            &self.runtime,
            &state.names,
            &state.token,
            done_retention,
            state.release_window(),
        );
        let outcome = self
            .runtime
            .backend
            .release(&state.names, &state.token, done_retention)
            .await;
        // A record a retried release found gone was freed by the first try only if it could
        // not have expired meanwhile: the lease still valid when the answer came (its validity
        // ends before the store's expiry). Judged at the answer, not at the send: a first try
        // that never landed, and a record that expired before the retry, must not read as
        // released, or a `once` marker would look older than a grant made in between.
        let lapsed = state.is_lost() || Instant::now() >= state.valid_until();
        match &outcome {
            // A passing failure (a network blip, a failover): the same release, marker
            // included, is tried again in the background until the lease would have expired
            // anyway, as a dropped guard's is; the caller still hears of the failure.
            Err(e) if e.is_transient() => {
                tracing::debug!(key = %state.names.key(), fence = ?state.known_fence(), error = %e, "release failed; trying again in the background");
                drop(pending);
            }
            _ => pending.disarm(),
        }
        let outcome = outcome?;
        match outcome {
            ReleaseOutcome::NotOwner => {
                tracing::debug!(key = %state.names.key(), fence = ?state.known_fence(), "release: the lock was no longer ours");
            }
            _ => {
                tracing::debug!(key = %state.names.key(), fence = ?state.known_fence(), ?outcome, "lock released");
            }
        }
        Ok(match outcome {
            ReleaseOutcome::NotOwner => false,
            ReleaseOutcome::GoneAfterRetry => !lapsed,
            _ => true,
        })
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let state = &self.lease.state;
        state.mark_ended();
        self.runtime.guard_closed(state);
        state.count_release();
        // A dropped guard (early return, panic, cancellation) never marks the work done.
        let sent = self.runtime.watchdog.release_in_background(ReleaseJob {
            names: state.names.clone(),
            token: state.token.clone(),
            done_until: None,
            lease_id: Some(state.id),
            retry_until: Instant::now().checked_add(state.release_window()),
        });
        // A lease lost to the end of a shutdown grace period was released by the runtime.
        if !sent && !state.is_lost() {
            tracing::warn!(key = %state.names.key(), "lock runtime stopped; the lease will expire by its ttl");
        }
    }
}

/// Hands a release to the background driver if the future doing it is dropped first.
/// It only borrows what it would release, so the common path (the future completes and
/// `disarm` is called) costs no allocation.
pub(crate) struct PendingRelease<'a> {
    runtime: &'a RuntimeInner,
    names: &'a KeyNames,
    token: &'a str,
    /// Until when the done marker must last: its retention counted from the start of the
    /// release.
    done_until: Option<Instant>,
    /// How long a failed release is tried again: until what it gives back would have
    /// expired anyway (the ttl, or a longer validity).
    retry_for: Duration,
    armed: bool,
}

impl<'a> PendingRelease<'a> {
    pub(crate) fn new(
        runtime: &'a RuntimeInner,
        names: &'a KeyNames,
        token: &'a str,
        done_retention: Option<Duration>,
        retry_for: Duration,
    ) -> Self {
        PendingRelease {
            runtime,
            names,
            token,
            done_until: done_retention.and_then(|retention| Instant::now().checked_add(retention)),
            retry_for,
            armed: true,
        }
    }

    /// The operation completed: nothing to do in the background.
    pub(crate) fn disarm(mut self) {
        self.armed = false;
    }
}

impl Drop for PendingRelease<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.runtime.watchdog.release_in_background(ReleaseJob {
                names: self.names.clone(),
                token: self.token.to_owned(),
                done_until: self.done_until,
                lease_id: None,
                retry_until: Instant::now().checked_add(self.retry_for),
            });
        }
    }
}
