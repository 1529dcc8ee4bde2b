//! `LockRuntime::lock(key)`: a request with options, then one of three ways to acquire.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::config::{check_name, check_ttl, drift, jitter};
use crate::guard::PendingRelease;
use crate::lease::{LeaseParams, LeaseState};
use crate::store::{AcquireOutcome, AcquireRequest, KeyNames};
use crate::{BackendError, Lease, LockError, LockGuard, LockRuntime};

/// A lock request built by [`LockRuntime::lock`]; configure it, then acquire.
///
/// ```
/// use std::time::Duration;
/// use lock_runtime::{LockRuntime, MemoryStore};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), lock_runtime::LockError> {
/// let runtime = LockRuntime::builder().memory(MemoryStore::new()).build().await?;
/// if let Some(guard) = runtime
///     .lock("nightly-report")
///     .ttl(Duration::from_secs(60))
///     .min_hold(Duration::from_secs(10))
///     .try_acquire()
///     .await?
/// {
///     println!("fence {}", guard.lease().fence().await?);
///     guard.release().await?;
/// }
/// # Ok(()) }
/// ```
///
/// # Default
/// ttl: the runtime's `default_ttl` (30 s unless set); min_hold: none; max_hold: none;
/// watchdog: on.
#[derive(Debug, Clone)]
#[must_use = "a lock request does nothing until try_acquire, acquire or acquire_timeout is awaited"]
pub struct LockRequest {
    runtime: LockRuntime,
    key: String,
    ttl: Option<Duration>,
    min_hold: Duration,
    max_hold: Option<Duration>,
    watchdog: bool,
    done_retention: Option<Duration>,
}

enum Attempt {
    Acquired(LockGuard),
    Busy(Option<Duration>),
    Done,
}

/// What a single acquire attempt found, for callers that treat "held" and "done" differently.
pub(crate) enum TryOutcome {
    Acquired(LockGuard),
    Held,
    Done,
}

impl LockRequest {
    pub(crate) fn new(runtime: LockRuntime, key: String) -> Self {
        LockRequest {
            runtime,
            key,
            ttl: None,
            min_hold: Duration::ZERO,
            max_hold: None,
            watchdog: true,
            done_retention: None,
        }
    }

    /// The lease length: how long the lock survives a holder that stops renewing (crashed,
    /// paused, partitioned). ShedLock calls it lockAtMostFor.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = Some(ttl);
        self
    }

    /// Keep the lock at least this long after acquiring, even if released earlier (ShedLock's
    /// lockAtLeastFor): other instances whose clocks run a little late then still skip.
    /// Must not exceed the ttl.
    pub fn min_hold(mut self, min_hold: Duration) -> Self {
        self.min_hold = min_hold;
        self
    }

    /// Stop renewing after this long; the lease then expires by its ttl and is reported lost.
    /// Must be at least the ttl.
    pub fn max_hold(mut self, max_hold: Duration) -> Self {
        self.max_hold = Some(max_hold);
        self
    }

    /// Renew the lease at ttl/3 while the guard lives (default true). Off: the lease simply
    /// expires after its ttl and is reported lost then.
    pub fn watchdog(mut self, on: bool) -> Self {
        self.watchdog = on;
        self
    }

    /// Run-once marker: when the guard is finished with [`LockGuard::complete`], the store
    /// keeps a done marker for `retention`, and later requests for the key find the work
    /// done: `try_acquire` returns `Ok(None)`, `acquire` returns [`LockError::AlreadyDone`].
    /// A guard released or dropped without `complete` writes no marker.
    pub fn once(mut self, retention: Duration) -> Self {
        self.done_retention = Some(retention);
        self
    }

    /// Takes the lock if it is free; `Ok(None)` if someone else holds it (or, with
    /// [`once`](Self::once), the work is already done).
    ///
    /// # Cancel safety
    /// If the future is dropped after the store granted the lock, the lock is released in the
    /// background.
    pub async fn try_acquire(self) -> Result<Option<LockGuard>, LockError> {
        match self.try_acquire_detailed().await? {
            TryOutcome::Acquired(guard) => Ok(Some(guard)),
            TryOutcome::Held | TryOutcome::Done => Ok(None),
        }
    }

    pub(crate) async fn try_acquire_detailed(self) -> Result<TryOutcome, LockError> {
        let (names, ttl) = self.validate()?;
        Ok(match self.attempt(&names, ttl).await? {
            Attempt::Acquired(guard) => TryOutcome::Acquired(guard),
            Attempt::Busy(_) => TryOutcome::Held,
            Attempt::Done => TryOutcome::Done,
        })
    }

    /// Waits until the lock is ours, however long that takes. With [`once`](Self::once), a
    /// done marker ends the wait with [`LockError::AlreadyDone`].
    ///
    /// Waiting is event driven: the runtime subscribes to the lock's release channel before
    /// retrying and wakes when the holder releases; for a holder that never releases (it
    /// crashed) it retries when the record's ttl runs out, plus jitter.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future stops waiting; a lock granted at that instant is
    /// released in the background.
    pub async fn acquire(self) -> Result<LockGuard, LockError> {
        self.acquire_until(None).await
    }

    /// Like [`acquire`](Self::acquire), but gives up with [`LockError::WaitTimeout`] after
    /// `timeout`.
    ///
    /// # Cancel safety
    /// As for [`acquire`](Self::acquire).
    pub async fn acquire_timeout(self, timeout: Duration) -> Result<LockGuard, LockError> {
        let deadline = Instant::now().checked_add(timeout);
        self.acquire_until(Some(deadline.unwrap_or_else(far_future)))
            .await
    }

    fn already_done(&self) -> LockError {
        LockError::AlreadyDone {
            key: self.key.clone(),
        }
    }

    fn validate(&self) -> Result<(KeyNames, Duration), LockError> {
        if self.runtime.inner.is_shut_down() {
            return Err(LockError::Shutdown);
        }
        self.check()
    }

    /// For a re-entrant call with `once`, made under its enclosing call's lease: asks the
    /// store as an acquire with `once` does, which checks the done marker first. Not refused
    /// during a shutdown's grace period: the enclosing job may still be running then.
    pub(crate) async fn probe_done(self) -> Result<TryOutcome, LockError> {
        let (names, ttl) = self.check()?;
        Ok(match self.attempt(&names, ttl).await? {
            Attempt::Acquired(guard) => TryOutcome::Acquired(guard),
            Attempt::Busy(_) => TryOutcome::Held,
            Attempt::Done => TryOutcome::Done,
        })
    }

    fn check(&self) -> Result<(KeyNames, Duration), LockError> {
        let inner = &self.runtime.inner;
        check_name("lock key", &self.key)?;
        let ttl = self.ttl.unwrap_or(inner.default_ttl);
        check_ttl("ttl", ttl)?;
        if self.min_hold > ttl {
            return Err(LockError::config(format!(
                "min_hold ({:?}) is longer than the ttl ({ttl:?}) of `{}`",
                self.min_hold, self.key
            )));
        }
        if let Some(max_hold) = self.max_hold
            && max_hold < ttl
        {
            return Err(LockError::config(format!(
                "max_hold ({max_hold:?}) is shorter than the ttl ({ttl:?}) of `{}`",
                self.key
            )));
        }
        if let Some(retention) = self.done_retention {
            check_ttl("once retention", retention)?;
        }
        Ok((KeyNames::new(&inner.namespace, &self.key), ttl))
    }

    async fn attempt(&self, names: &KeyNames, ttl: Duration) -> Result<Attempt, LockError> {
        let inner = &self.runtime.inner;
        let token = inner.new_token()?;
        // Counted as work in flight until the attempt ends, so a shutdown that begins while it
        // is on its way waits for it: for its grant to be given back (the pending release
        // below, which counts itself before this drops: locals drop in reverse order) or
        // handed to a holder. Otherwise a service that returns from `main` right after
        // `shutdown()` would leave that grant to nobody for its whole ttl.
        let _in_flight = inner.watchdog.work_in_flight();
        // Until the lock is handed to the caller as a registered lease, anything that ends this
        // attempt (the future dropped while the script is in flight, a call that fails after
        // the store may have granted it, a grant the caller will not get) releases the token in
        // the background. The release is token-checked, so it never touches anyone's lock.
        let pending = PendingRelease::new(inner, names, &token, None, ttl);
        let label = inner.metric_label(names.key());
        crate::metrics::attempt(&label);
        let sent = Instant::now();
        let outcome = inner
            .backend
            .acquire(AcquireRequest {
                names,
                token: &token,
                owner: &inner.owner,
                ttl,
                min_hold: self.min_hold,
                once: self.done_retention.is_some(),
            })
            .await;
        match outcome? {
            outcome @ (AcquireOutcome::Acquired { .. } | AcquireOutcome::AcquiredUnfenced) => {
                let fence = match outcome {
                    AcquireOutcome::Acquired { fence } => Some(fence),
                    _ => None,
                };
                // Granted while the runtime shuts down: nobody will renew it (given back).
                if inner.is_shut_down() {
                    return Err(LockError::Shutdown);
                }
                // Granted, but the answer came after the lease's validity had ended: the
                // record may have expired and been taken by another holder already.
                let valid_until = sent + ttl - drift(ttl).min(ttl);
                if Instant::now() >= valid_until {
                    return Err(BackendError::transient(format!(
                        "lock `{}` was granted after its ttl ({ttl:?}) had passed; it was given back",
                        names.key()
                    ))
                    .into());
                }
                let state = Arc::new(LeaseState::new(LeaseParams {
                    id: inner.next_lease_id(),
                    runtime_id: inner.id,
                    names: names.clone(),
                    token: token.clone(),
                    fence,
                    backend: inner.backend.clone(),
                    ttl,
                    watchdog: self.watchdog,
                    max_hold_until: self.max_hold.and_then(|m| sent.checked_add(m)),
                    valid_until,
                    label,
                    acquired_at: sent,
                }));
                if !inner.watchdog.register(state.clone()) {
                    // The watchdog has stopped (shutdown finished): the lease would never be
                    // renewed nor reported lost (given back).
                    state.mark_ended();
                    return Err(LockError::Shutdown);
                }
                pending.disarm();
                crate::metrics::acquired(&state.label);
                tracing::debug!(key = %names.key(), ?fence, ?ttl, "lock acquired");
                Ok(Attempt::Acquired(LockGuard::new(
                    Lease { state },
                    inner.clone(),
                    self.done_retention,
                )))
            }
            AcquireOutcome::Held { pttl } => {
                pending.disarm();
                crate::metrics::contended(&label);
                tracing::debug!(key = %names.key(), ?pttl, "lock contended");
                Ok(Attempt::Busy(pttl))
            }
            AcquireOutcome::Done { pttl } => {
                pending.disarm();
                tracing::debug!(key = %names.key(), ?pttl, "work already done for this key");
                Ok(Attempt::Done)
            }
        }
    }

    async fn acquire_until(self, deadline: Option<Instant>) -> Result<LockGuard, LockError> {
        let started = Instant::now();
        let (names, ttl) = self.validate()?;
        let inner = self.runtime.inner.clone();
        // Waiting for a lock this task holds through a guard waits for itself, unless the
        // guard was handed to another task that will release it (which cannot be told from
        // here, and is a fine pattern). Say so loudly rather than fail a legitimate program.
        if inner.held_by_this_task(names.record()) {
            tracing::warn!(
                key = %self.key,
                "this task already holds the lock it now waits for (through a LockGuard); unless \
                 that guard is released by another task, the wait never ends: release the guard \
                 first, or use acquire_timeout"
            );
        }
        // The deadline bounds everything, store calls included; a grant that the deadline or a
        // shutdown cuts off is released in the background by the attempt's own guard.
        let waiting = self.wait_for(&names, ttl, deadline, started);
        let bounded = async {
            match deadline {
                Some(d) => tokio::time::timeout_at(d, waiting)
                    .await
                    .unwrap_or_else(|_| Err(self.wait_timeout(started))),
                None => waiting.await,
            }
        };
        tokio::select! {
            biased;
            _ = inner.shutting_down() => Err(LockError::Shutdown),
            result = bounded => result,
        }
    }

    async fn wait_for(
        &self,
        names: &KeyNames,
        ttl: Duration,
        deadline: Option<Instant>,
        started: Instant,
    ) -> Result<LockGuard, LockError> {
        let names = names.clone();
        // Waiters of one key in this runtime line up in FIFO order and only the head talks to
        // the store: a release wakes one attempt per runtime instead of one per waiting task,
        // and a task that just released cannot barge ahead of tasks already waiting.
        let queue = self.runtime.inner.wait_queue(names.record());
        let mut turn = match queue.clone().try_lock_owned() {
            Ok(turn) => {
                // Nobody of ours is waiting: try at once. A transient error is retried below,
                // like any later attempt.
                match self.attempt(&names, ttl).await {
                    Ok(Attempt::Acquired(guard)) => return Ok(guard),
                    Ok(Attempt::Done) => return Err(self.already_done()),
                    Ok(Attempt::Busy(_)) => {}
                    Err(e) if e.is_transient() => {
                        tracing::debug!(key = %names.key(), error = %e, "store unreachable; waiting and retrying");
                    }
                    Err(e) => return Err(e),
                }
                turn
            }
            Err(_) => {
                // Others are queued; the lock was just taken by the one ahead of us, so the
                // first attempt waits for a release.
                let wait = queue.lock_owned();
                match deadline {
                    Some(d) => tokio::time::timeout_at(d, wait)
                        .await
                        .map_err(|_| self.wait_timeout(started))?,
                    None => wait.await,
                }
            }
        };
        // The queue keeps the subscription for as long as anyone waits, so a handoff costs no
        // SUBSCRIBE round trip. Subscribed before the next attempt, so a release between the
        // attempt and the wait is not missed.
        let mut backoff = Duration::ZERO;
        // A subscribe the store cannot answer now is retried like an attempt: a waiter rides
        // out an unreachable store until its deadline.
        let watch = match &mut *turn {
            Some(watch) => watch,
            slot => {
                let watch = loop {
                    match self.runtime.inner.backend.watch_releases(&names).await {
                        Ok(watch) => break watch,
                        Err(e) if e.is_transient() => {
                            tracing::debug!(key = %names.key(), error = %e, "cannot watch for releases yet; retrying");
                            self.back_off(&mut backoff, deadline, started).await?;
                        }
                        Err(e) => return Err(e),
                    }
                };
                backoff = Duration::ZERO;
                slot.insert(watch)
            }
        };
        loop {
            let notified = watch.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let attempt = match self.attempt(&names, ttl).await {
                Ok(attempt) => attempt,
                // The store is unreachable for now (restart, failover, network): a waiter keeps
                // waiting, retrying with a growing pause, until its deadline.
                Err(e) if e.is_transient() => {
                    tracing::debug!(key = %names.key(), error = %e, "store unreachable while waiting; retrying");
                    self.back_off(&mut backoff, deadline, started).await?;
                    continue;
                }
                Err(e) => return Err(e),
            };
            backoff = Duration::ZERO;
            let pttl = match attempt {
                Attempt::Acquired(guard) => {
                    watch.requeue();
                    crate::metrics::waited(&guard.lease().state.label, started.elapsed());
                    return Ok(guard);
                }
                Attempt::Done => return Err(self.already_done()),
                Attempt::Busy(pttl) => pttl,
            };
            let now = Instant::now();
            if deadline.is_some_and(|d| now >= d) {
                return Err(self.wait_timeout(started));
            }
            // A holder that crashed never publishes: retry when its record expires.
            let fallback = match pttl {
                Some(p) => p + jitter(p / 10 + Duration::from_millis(1)),
                None => Duration::from_millis(100) + jitter(Duration::from_millis(50)),
            };
            let mut wake = now + fallback;
            if let Some(d) = deadline {
                wake = wake.min(d);
            }
            tokio::select! {
                biased; // a fixed order, so a simulation replays from its seed
                _ = &mut notified => {}
                _ = tokio::time::sleep_until(wake) => {}
            }
        }
    }

    /// After a transient store error while waiting: sleeps a growing pause (50 ms doubling
    /// to 1 s), cut short by the deadline; `WaitTimeout` once the deadline has passed.
    async fn back_off(
        &self,
        backoff: &mut Duration,
        deadline: Option<Instant>,
        started: Instant,
    ) -> Result<(), LockError> {
        let now = Instant::now();
        if deadline.is_some_and(|d| now >= d) {
            return Err(self.wait_timeout(started));
        }
        *backoff = (*backoff * 2).clamp(Duration::from_millis(50), Duration::from_secs(1));
        let mut wake = now + *backoff;
        if let Some(d) = deadline {
            wake = wake.min(d);
        }
        tokio::time::sleep_until(wake).await;
        Ok(())
    }

    fn wait_timeout(&self, started: Instant) -> LockError {
        crate::metrics::wait_timeout(&self.runtime.inner.metric_label(&self.key));
        LockError::WaitTimeout {
            key: self.key.clone(),
            waited: started.elapsed(),
        }
    }
}

fn far_future() -> Instant {
    Instant::now() + Duration::from_secs(100 * 365 * 24 * 3600)
}
