//! Support for the code `#[distributed_lock]` generates. Not public API: hidden from the docs
//! and outside semver; only the macro of the same version may call it.

use std::fmt::{self, Display};
use std::future::Future;
use std::time::Duration;

use tracing::Instrument;

use crate::context::{held_lease, with_lease};
use crate::request::TryOutcome;
use crate::schedule::marker::{self, Report};
use crate::{Lease, LockError, LockRuntime};

/// Makes the runtime's retry jitter on this thread a function of `seed` (None: random again),
/// so a deterministic simulation on a current-thread runtime replays from its seed. For tests.
pub fn seed_jitter(seed: Option<u64>) {
    crate::config::seed_jitter(seed);
}

/// The etcd store's renewal rule for the lease a key is on, for the simulation's model of
/// etcd.
#[cfg(feature = "etcd")]
pub use crate::store::etcd::step::{LeaseStep, lease_secs, lease_step};

/// The contention policy of one annotated function.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Contention {
    /// Return "did not run" when the lock is held elsewhere.
    Skip,
    /// Wait for the lock (optionally bounded by `wait_timeout_ms`).
    Wait,
    /// Return `LockError::Contended`.
    Error,
}

/// Everything one call of an annotated function needs, built by the generated code.
#[derive(Debug)]
pub struct LockSpec {
    /// The key with its placeholders filled in.
    pub key: String,
    /// `None`: the runtime's default ttl.
    pub ttl_ms: Option<u64>,
    /// Zero: no min_hold.
    pub min_hold_ms: u64,
    /// `None`: renew for as long as the body runs.
    pub max_hold_ms: Option<u64>,
    /// What to do when the lock is held elsewhere.
    pub contention: Contention,
    /// With `Contention::Wait`: give up after this long (`None`: wait forever).
    pub wait_timeout_ms: Option<u64>,
    /// Renew the lease while the body runs.
    pub watchdog: bool,
    /// Drop the body future when the lease is lost.
    pub abort_on_lost: bool,
    /// After a successful run, keep a done marker this long and skip calls meanwhile.
    pub once_ms: Option<u64>,
}

/// Formats the key from `format_args!`.
pub fn format_key(args: fmt::Arguments<'_>) -> String {
    fmt::format(args)
}

/// A value a key placeholder may name: anything that implements `Display`.
#[diagnostic::on_unimplemented(
    message = "a `key` placeholder names a value of type `{Self}`, which does not implement `Display`",
    label = "this key has a placeholder whose value cannot be formatted",
    note = "placeholders are formatted with `Display`: implement it for `{Self}`, or name a field that has it, e.g. `{{account.id}}`"
)]
pub trait KeyPart {
    /// Writes the value into the key.
    fn fmt_key_part(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result;
}

impl<T: Display + ?Sized> KeyPart for T {
    fn fmt_key_part(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        Display::fmt(self, f)
    }
}

/// Adapts a [`KeyPart`] for `format_args!`. Its `Display` has no bounds, so a placeholder
/// that is not `Display` fails only at [`key_part`]: one mistake, one error.
pub struct KeyArg<'a>(&'a dyn KeyPart);

impl fmt::Debug for KeyArg<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("KeyArg")
    }
}

impl Display for KeyArg<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt_key_part(f)
    }
}

/// Wraps a placeholder's value; fails to compile, with a plain message, unless it is `Display`.
pub fn key_part<T: KeyPart>(value: &T) -> KeyArg<'_> {
    KeyArg(value)
}

/// A return type that can carry a [`LockError`] when the body did not run.
#[diagnostic::on_unimplemented(
    message = "`#[distributed_lock]` cannot report a lock error through the return type `{Self}`",
    label = "this return type cannot say that the lock was not obtained",
    note = "use `()` or `Option<T>` (the error is logged with tracing::error!), or `Result<T, E>` where `E: From<lock_runtime::LockError>` (anyhow::Error qualifies)"
)]
pub trait LockErrorReturn: Sized {
    /// The value returned when a lock error kept the body from running (or stopped it).
    fn from_lock_error(error: LockError, key: &str) -> Self;
    /// The value returned by a scheduled job's call on an instance that found its firing run
    /// (or claimed) by another: nothing went wrong, so nothing is logged. A `Result` still
    /// carries [`LockError::Contended`] (it has no other "did not run"); the scheduler reports
    /// the firing as skipped either way.
    fn firing_taken(key: &str) -> Self;
    /// Whether the body's result counts as success (for `once`).
    fn succeeded(&self) -> bool;
}

impl LockErrorReturn for () {
    fn from_lock_error(error: LockError, key: &str) {
        tracing::error!(key, error = %error, "locked call did not complete");
    }
    fn firing_taken(_key: &str) {}
    fn succeeded(&self) -> bool {
        true
    }
}

impl<T> LockErrorReturn for Option<T> {
    fn from_lock_error(error: LockError, key: &str) -> Self {
        tracing::error!(key, error = %error, "locked call did not complete");
        None
    }
    fn firing_taken(_key: &str) -> Self {
        None
    }
    fn succeeded(&self) -> bool {
        self.is_some()
    }
}

impl<T, E: From<LockError>> LockErrorReturn for Result<T, E> {
    fn from_lock_error(error: LockError, _key: &str) -> Self {
        Err(E::from(error))
    }
    fn firing_taken(key: &str) -> Self {
        Err(E::from(LockError::Contended {
            key: key.to_owned(),
        }))
    }
    fn succeeded(&self) -> bool {
        self.is_ok()
    }
}

/// A return type that can say "skipped: another instance holds the lock".
#[diagnostic::on_unimplemented(
    message = "`#[distributed_lock]` with on_contention = \"skip\" (or `once`) needs a return type that can say \"did not run\"; `{Self}` cannot",
    label = "a skipped call has nothing of this type to return",
    note = "use `()`, `Option<T>` (None when skipped), or `Result<(), E>` / `Result<Option<T>, E>` (Ok(()) / Ok(None) when skipped); or choose on_contention = \"wait\" or \"error\""
)]
pub trait SkipReturn: LockErrorReturn {
    /// The value of a skipped call.
    fn skipped() -> Self;
}

impl SkipReturn for () {
    fn skipped() -> Self {}
}

impl<T> SkipReturn for Option<T> {
    fn skipped() -> Self {
        None
    }
}

impl<T: SkipValue, E: From<LockError>> SkipReturn for Result<T, E> {
    fn skipped() -> Self {
        Ok(T::skipped_value())
    }
}

/// The `Ok` value of a skipped call returning `Result`.
#[diagnostic::on_unimplemented(
    message = "`#[distributed_lock]` with on_contention = \"skip\" (or `once`) returns `Ok(..)` when it skips, but `{Self}` has no \"skipped\" value",
    label = "a skipped call has no `{Self}` to put in `Ok(..)`",
    note = "return `Result<(), E>` or `Result<Option<T>, E>`, or choose on_contention = \"wait\" or \"error\""
)]
pub trait SkipValue {
    /// `()` or `None`.
    fn skipped_value() -> Self;
}

impl SkipValue for () {
    fn skipped_value() -> Self {}
}

impl<T> SkipValue for Option<T> {
    fn skipped_value() -> Self {
        None
    }
}

/// How a call returns when its body did not run. Built by [`skip_policy`] or
/// [`error_policy`], whose trait bounds are the only place a wrong return type is reported:
/// one mistake, one error, spanned on the return type.
#[derive(Debug)]
pub struct ReturnPolicy<R> {
    skipped: Option<fn() -> R>,
    from_error: fn(LockError, &str) -> R,
    firing_taken: fn(&str) -> R,
    succeeded: fn(&R) -> bool,
}

/// The policy for on_contention = "skip" (and for any policy with `once`).
pub fn skip_policy<R: SkipReturn>() -> ReturnPolicy<R> {
    ReturnPolicy {
        skipped: Some(R::skipped),
        from_error: R::from_lock_error,
        firing_taken: R::firing_taken,
        succeeded: R::succeeded,
    }
}

/// The policy for on_contention = "wait" and "error".
pub fn error_policy<R: LockErrorReturn>() -> ReturnPolicy<R> {
    ReturnPolicy {
        skipped: None,
        from_error: R::from_lock_error,
        firing_taken: R::firing_taken,
        succeeded: R::succeeded,
    }
}

enum Outcome<R> {
    Ran(R),
    /// A done marker (`once`) was there.
    Skipped,
    /// A scheduled firing's marker was taken by another instance.
    FiringTaken,
    Failed(LockError),
}

/// Runs `body` under the lock described by `spec`.
pub async fn run<R, F>(policy: ReturnPolicy<R>, spec: LockSpec, body: F) -> R
where
    F: Future<Output = R>,
{
    match execute(&spec, body, policy.succeeded).await {
        Outcome::Ran(r) => r,
        Outcome::Skipped => match policy.skipped {
            Some(skipped) => skipped(),
            // A done marker: without the skip policy the caller gets the policy's lock error.
            None => (policy.from_error)(
                LockError::Contended {
                    key: spec.key.clone(),
                },
                &spec.key,
            ),
        },
        Outcome::FiringTaken => match policy.skipped {
            Some(skipped) => skipped(),
            None => (policy.firing_taken)(&spec.key),
        },
        Outcome::Failed(e) => (policy.from_error)(e, &spec.key),
    }
}

async fn execute<R, F>(spec: &LockSpec, body: F, succeeded: fn(&R) -> bool) -> Outcome<R>
where
    F: Future<Output = R>,
{
    let span = tracing::debug_span!(
        "distributed_lock",
        key = %spec.key,
        policy = ?spec.contention,
        fence = tracing::field::Empty,
        outcome = tracing::field::Empty,
    );
    let outcome = execute_in_span(spec, body, succeeded, &span)
        .instrument(span.clone())
        .await;
    let label = match &outcome {
        Outcome::Ran(_) => "ran",
        Outcome::Skipped | Outcome::FiringTaken => "skipped",
        Outcome::Failed(LockError::Contended { .. }) => "contended",
        Outcome::Failed(LockError::WaitTimeout { .. }) => "wait_timeout",
        Outcome::Failed(LockError::Lost { .. }) => "lost",
        Outcome::Failed(_) => "error",
    };
    span.record("outcome", label);
    outcome
}

/// For a re-entrant call with `once`: true when its body may run (no done marker). Asks the
/// store as an acquire with `once` does, which checks the marker first: "done" skips; "held"
/// (by the enclosing call's lease) lets the body run. A grant means the enclosing lease is
/// gone from the store: it is given back, the enclosing lease is marked lost, and the call
/// fails closed as a lost one. (The ask costs one acquire attempt: on PostgreSQL it marks the
/// row wanted, so its release announces itself; on etcd a lease is granted and revoked.)
async fn nested_once_state(
    runtime: &LockRuntime,
    spec: &LockSpec,
    once_ms: u64,
    outer: &Lease,
) -> Result<bool, LockError> {
    let mut request = runtime
        .lock(spec.key.clone())
        .once(Duration::from_millis(once_ms));
    if let Some(ms) = spec.ttl_ms {
        request = request.ttl(Duration::from_millis(ms));
    }
    let lost = || {
        if outer.state.mark_lost() {
            tracing::warn!(key = %spec.key, fence = ?outer.known_fence(), "lock lost: a nested call found it free in the store");
        }
        LockError::Lost {
            key: spec.key.clone(),
        }
    };
    match request.probe_done().await {
        Ok(TryOutcome::Held) => Ok(true),
        Ok(TryOutcome::Done) => {
            tracing::debug!(key = %spec.key, "work already done for this key; the nested call is skipped");
            Ok(false)
        }
        Ok(TryOutcome::Acquired(guard)) => {
            let _ = guard.release().await;
            Err(lost())
        }
        // Granted while the runtime shuts down: given back already, and as above.
        Err(LockError::Shutdown) => Err(lost()),
        Err(e) => Err(e),
    }
}

async fn execute_in_span<R, F>(
    spec: &LockSpec,
    body: F,
    succeeded: fn(&R) -> bool,
    span: &tracing::Span,
) -> Outcome<R>
where
    F: Future<Output = R>,
{
    let runtime = match LockRuntime::current() {
        Ok(r) => r,
        Err(e) => return Outcome::Failed(e),
    };
    // Re-entrant per task: a nested call for a key an enclosing annotated call of this task
    // holds runs directly. (A key this task holds through a `LockGuard` is not re-entrant:
    // "skip" and "error" see it held, and "wait" waits, with a warning in the log.)
    if let Some(lease) = held_lease(runtime.inner.id, &spec.key).filter(|l| !l.is_lost()) {
        tracing::trace!("re-entrant call; the lock is already held by this task");
        // The nested call runs under the enclosing call's lease (its ttl, min_hold, max_hold,
        // watchdog and on_lost decide), but its own `once` marker is honoured: one that is
        // already there skips the body.
        if let Some(ms) = spec.once_ms {
            match Box::pin(nested_once_state(&runtime, spec, ms, &lease)).await {
                Ok(true) => {}
                Ok(false) => return Outcome::Skipped,
                Err(e) => return Outcome::Failed(e),
            }
        }
        let result = body.await;
        // The nested call's `once` holds for it too: its success leaves its marker now.
        if let Some(ms) = spec.once_ms
            && succeeded(&result)
            && let Err(e) = Box::pin(
                runtime
                    .inner
                    .backend
                    .mark_done(&lease.state.names, Duration::from_millis(ms)),
            )
            .await
        {
            tracing::warn!(key = %spec.key, error = %e, "could not write the done marker of a re-entrant call");
        }
        return Outcome::Ran(result);
    }
    // A scheduled job's firing: the job's own call (not a locked call nested in its body)
    // claims the firing's marker first, so the first instance to reach a firing decides it.
    let firing = marker::current().filter(|f| f.take_turn());
    let mut retry_marker = None;
    if let Some(firing) = &firing {
        // Its crash can be told from the lease alone when a live holder never outlives its
        // lease unnoticed (renewed, stopped on a loss), the lease ends with the run (no
        // `min_hold` record kept after it, no `once` marker), and a firing that finds the
        // lock held is skipped and says so (not queued behind the run before it).
        let watchable = spec.watchdog
            && spec.abort_on_lost
            && spec.min_hold_ms == 0
            && spec.once_ms.is_none()
            && matches!(spec.contention, Contention::Skip);
        firing.locks(&spec.key, watchable);
        match Box::pin(marker::claim(&runtime, &spec.key, firing)).await {
            Ok(marker::Claim::Mine(guard)) => {
                firing.claimed();
                retry_marker = guard;
            }
            Ok(marker::Claim::Taken) => {
                firing.report(Report::AlreadyRun);
                return Outcome::FiringTaken;
            }
            Err(e) => return Outcome::Failed(e),
        }
    }
    let mut request = runtime
        .lock(spec.key.clone())
        .min_hold(Duration::from_millis(spec.min_hold_ms))
        .watchdog(spec.watchdog);
    if let Some(ms) = spec.ttl_ms {
        request = request.ttl(Duration::from_millis(ms));
    }
    if let Some(ms) = spec.max_hold_ms {
        request = request.max_hold(Duration::from_millis(ms));
    }
    if let Some(ms) = spec.once_ms {
        request = request.once(Duration::from_millis(ms));
    }
    // The store calls below are boxed: their futures are deep (a script call, reconnects, a
    // quorum's fan-out), and inline they would make every annotated function's future as
    // deep and as large, enough in a caller's nested async code to reach the compiler's
    // recursion limit. One allocation per call, next to a round trip to the store.
    let guard = match spec.contention {
        Contention::Skip | Contention::Error => {
            match Box::pin(request.try_acquire_detailed()).await {
                Ok(TryOutcome::Acquired(guard)) => guard,
                Ok(TryOutcome::Done) => {
                    if let Some(firing) = &firing {
                        firing.report(Report::DoneMarker);
                        Box::pin(marker::done(&runtime, &spec.key, firing, retry_marker)).await;
                    }
                    return Outcome::Skipped;
                }
                Ok(TryOutcome::Held) if spec.contention == Contention::Skip => {
                    tracing::debug!(key = %spec.key, "lock held elsewhere; skipping");
                    if let Some(firing) = &firing {
                        let owner = Box::pin(runtime.inspect(&spec.key))
                            .await
                            .ok()
                            .flatten()
                            .map(|info| info.owner);
                        firing.report(Report::HeldBy(owner));
                        Box::pin(marker::done(&runtime, &spec.key, firing, retry_marker)).await;
                    }
                    return Outcome::Skipped;
                }
                Ok(TryOutcome::Held) => {
                    return Outcome::Failed(LockError::Contended {
                        key: spec.key.clone(),
                    });
                }
                Err(e) => return Outcome::Failed(e),
            }
        }
        Contention::Wait => {
            let waited = match spec.wait_timeout_ms {
                Some(ms) => Box::pin(request.acquire_timeout(Duration::from_millis(ms))).await,
                None => Box::pin(request.acquire()).await,
            };
            match waited {
                Ok(guard) => guard,
                Err(LockError::AlreadyDone { .. }) => {
                    if let Some(firing) = &firing {
                        firing.report(Report::DoneMarker);
                        Box::pin(marker::done(&runtime, &spec.key, firing, retry_marker)).await;
                    }
                    return Outcome::Skipped;
                }
                Err(e) => return Outcome::Failed(e),
            }
        }
    };
    let lease = guard.lease().clone();
    if let Some(firing) = &firing {
        firing.holds(lease.known_fence().unwrap_or(0));
        firing.report(Report::Ran);
    }
    if let Some(fence) = lease.known_fence() {
        span.record("fence", fence);
    }
    let body = with_lease(lease.clone(), body);
    let result = if spec.abort_on_lost {
        // The loss is checked before every poll of the body, so a lease lost when granted
        // never starts the body and a body woken by the loss is not polled again. `is_lost`
        // answers both by the watchdog's word and by the clock: the body's own timer may fire
        // at the instant the validity ends, before the watchdog's timer has run, and that poll
        // must not reach the body either.
        //
        // The task listens for the watchdog's word (`lost()`, which wakes it) only once the
        // body waits: a body done in its first poll never registers with the lease's notifier.
        let lost = lease.lost();
        tokio::pin!(body, lost);
        std::future::poll_fn(|cx| {
            if lease.is_lost() {
                return std::task::Poll::Ready(None);
            }
            if let std::task::Poll::Ready(result) = body.as_mut().poll(cx) {
                return std::task::Poll::Ready(Some(result));
            }
            // The body waits: from now on the watchdog's word wakes this task too.
            lost.as_mut().poll(cx).map(|()| None)
        })
        .await
    } else {
        Some(body.await)
    };
    // A store that fences on demand: the body may have asked for the fence meanwhile; the
    // run is journalled with it.
    if let (Some(firing), Some(fence)) = (&firing, lease.known_fence()) {
        firing.holds(fence);
    }
    let Some(result) = result else {
        // The body future is dropped here, before the release the guard's drop starts.
        tracing::warn!(key = %spec.key, fence = ?lease.known_fence(), "lease lost; the locked body was stopped");
        drop(guard);
        if let Some(firing) = &firing {
            firing.report(if lease.state.was_taken_by_shutdown() {
                Report::StoppedAtGrace
            } else {
                Report::Lost
            });
            // The firing ran in part. Its marker is done already, unless the job asks for
            // crashed runs to be retried: then it is given back for another instance.
            match retry_marker {
                Some(marker) => {
                    let _ = Box::pin(marker.release()).await;
                }
                None => Box::pin(marker::mark_done_again(&runtime, &spec.key, firing)).await,
            }
        }
        return Outcome::Failed(LockError::Lost {
            key: spec.key.clone(),
        });
    };
    if let Some(firing) = &firing {
        Box::pin(marker::done(&runtime, &spec.key, firing, retry_marker)).await;
    }
    let once = spec.once_ms.is_some() && succeeded(&result);
    let released = if once {
        Box::pin(guard.complete()).await
    } else {
        Box::pin(guard.release()).await
    };
    match released {
        // The lease lapsed while the body ran; `complete` wrote the done marker all the same.
        Ok(false) if once => {
            tracing::warn!(key = %spec.key, "the lease lapsed before the body finished; its done marker was written");
        }
        Ok(_) => {}
        Err(e) if once && e.is_transient() => {
            tracing::warn!(key = %spec.key, error = %e, "the body succeeded but its done marker could not be written yet; trying again in the background");
        }
        Err(e) if once => {
            tracing::error!(key = %spec.key, error = %e, "the body succeeded but its done marker could not be written; the job may run again at the next firing");
        }
        Err(e) if e.is_transient() => {
            tracing::warn!(key = %spec.key, error = %e, "release after the locked body failed; trying again in the background");
        }
        Err(e) => {
            tracing::warn!(key = %spec.key, error = %e, "release after the locked body failed; the lease will expire by its ttl");
        }
    }
    Outcome::Ran(result)
}

/// What `#[scheduled]` generates code against.
pub use crate::schedule::registry::{
    JobEnd, JobFuture, JobReturn, SCHEDULED, ScheduledJob, job_end, linkme, scheduler_of,
};
