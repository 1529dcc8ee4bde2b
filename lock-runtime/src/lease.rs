//! What a holder knows about its lock: key, token, fence, and whether it is still valid.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::LockError;
use crate::store::{KeyNames, QuorumView, RecordView, SharedBackend};

/// A held lease, cheap to clone and share with the code doing the locked work.
///
/// The lease is *valid* from the instant the acquire was sent for `ttl` minus a drift margin
/// (ttl * 1% + 2 ms), and each successful renewal moves that end forward. Once the end passes
/// without a renewal, or a renewal finds another owner's token, the lease is *lost*: `is_lost`
/// turns true and stays true, and `lost()` resolves. A renewal whose answer arrives after the
/// end never brings a lost lease back. A lease its holder released in time is not lost (`lost()`
/// then never resolves) but it is not held either: [`Lease::is_held`] is the question "may I
/// still act under this lock?".
///
/// Pass [`Lease::fence`] to the storage the locked work writes: it is the only protection
/// against a holder that was paused past its lease. A store may compute the fence only when
/// the holder first asks for it (the call then goes to the store once, and fails if the lease
/// is no longer held); [`Lease::known_fence`] reads it without asking.
#[derive(Clone)]
pub struct Lease {
    pub(crate) state: Arc<LeaseState>,
}

impl std::fmt::Debug for Lease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The token is a bearer secret for this lock; keep it out of logs.
        f.debug_struct("Lease")
            .field("key", &self.key())
            .field("fence", &self.known_fence())
            .field("lost", &self.is_lost())
            .finish_non_exhaustive()
    }
}

pub(crate) struct LeaseState {
    pub(crate) id: u64,
    pub(crate) runtime_id: u64,
    pub(crate) names: KeyNames,
    pub(crate) token: String,
    /// Set at acquire, or by the first [`Lease::fence`] for a store that computes it then.
    fence: tokio::sync::OnceCell<u64>,
    /// The store, asked for the fence when the acquire gave none (only then kept: a lease
    /// that outlives its runtime does not keep the store's connections alive).
    backend: Option<SharedBackend>,
    pub(crate) ttl: Duration,
    pub(crate) watchdog: bool,
    pub(crate) max_hold_until: Option<Instant>,
    /// The `key` label of this lease's metrics (empty without the `metrics` feature).
    pub(crate) label: String,
    pub(crate) acquired_at: Instant,
    /// The task that acquired the lease, to warn when that task waits for it (likely a
    /// deadlock, unless the guard went to another task).
    pub(crate) holder_task: TaskIdentity,
    /// Set once the leases-held gauge has been decremented for this lease.
    uncounted: AtomicBool,
    valid_until: Mutex<Instant>,
    lost: AtomicBool,
    /// Set when the runtime's shutdown took the lease at the end of its grace period (the
    /// store did not lose it).
    taken_by_shutdown: AtomicBool,
    /// Set once the holder released (or began releasing) the lease.
    ended: AtomicBool,
    lost_notify: Notify,
}

pub(crate) struct LeaseParams {
    pub(crate) id: u64,
    pub(crate) runtime_id: u64,
    pub(crate) names: KeyNames,
    pub(crate) token: String,
    /// None: the store computes it on demand.
    pub(crate) fence: Option<u64>,
    pub(crate) backend: SharedBackend,
    pub(crate) ttl: Duration,
    pub(crate) watchdog: bool,
    pub(crate) max_hold_until: Option<Instant>,
    pub(crate) valid_until: Instant,
    pub(crate) label: String,
    pub(crate) acquired_at: Instant,
}

impl LeaseState {
    pub(crate) fn new(p: LeaseParams) -> Self {
        LeaseState {
            id: p.id,
            runtime_id: p.runtime_id,
            names: p.names,
            token: p.token,
            fence: tokio::sync::OnceCell::new_with(p.fence),
            backend: p.fence.is_none().then_some(p.backend),
            ttl: p.ttl,
            watchdog: p.watchdog,
            max_hold_until: p.max_hold_until,
            label: p.label,
            acquired_at: p.acquired_at,
            holder_task: TaskIdentity::current(),
            uncounted: AtomicBool::new(false),
            valid_until: Mutex::new(p.valid_until),
            lost: AtomicBool::new(false),
            taken_by_shutdown: AtomicBool::new(false),
            ended: AtomicBool::new(false),
            lost_notify: Notify::new(),
        }
    }

    /// The fence, if given at acquire or asked for already.
    pub(crate) fn known_fence(&self) -> Option<u64> {
        self.fence.get().copied()
    }

    pub(crate) fn valid_until(&self) -> Instant {
        *self
            .valid_until
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// How long from now a release of this lease that fails is worth trying again: until the
    /// store would have dropped it anyway, a ttl from now or the end of a validity an `extend`
    /// took further, whichever is later.
    pub(crate) fn release_window(&self) -> Duration {
        self.ttl
            .max(self.valid_until().saturating_duration_since(Instant::now()))
    }

    /// Moves the end of validity forward (never back), unless the lease is lost already: a
    /// renewal answered after the validity ended does not revive it (the lease may have been
    /// taken over in between, as far as the holder can tell). False when the lease is lost.
    pub(crate) fn extend_validity(&self, until: Instant) -> bool {
        {
            let mut v = self
                .valid_until
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if !self.lost.load(Ordering::Acquire) && Instant::now() < *v {
                if until > *v {
                    *v = until;
                }
                return true;
            }
        }
        self.mark_lost();
        false
    }

    /// Marks the lease lost to the shutdown's end of grace; true if it was not lost before.
    pub(crate) fn take_at_shutdown(&self) -> bool {
        if self.ended.load(Ordering::Acquire) || self.lost.load(Ordering::Acquire) {
            return false;
        }
        self.taken_by_shutdown.store(true, Ordering::Release);
        self.mark_lost()
    }

    /// Whether the lease was lost because the shutdown's grace period ended, not to the store.
    pub(crate) fn was_taken_by_shutdown(&self) -> bool {
        self.taken_by_shutdown.load(Ordering::Acquire)
    }

    /// Marks the lease lost and wakes `lost()` waiters; true the first time.
    pub(crate) fn mark_lost(&self) -> bool {
        if self.ended.load(Ordering::Acquire) {
            return false;
        }
        let first = !self.lost.swap(true, Ordering::AcqRel);
        if first {
            crate::metrics::lost(&self.label);
            self.uncount();
            self.lost_notify.notify_waiters();
        }
        first
    }

    /// Takes the lease out of the leases-held gauge, once.
    pub(crate) fn uncount(&self) {
        if !self.uncounted.swap(true, Ordering::AcqRel) {
            crate::metrics::ended(&self.label);
        }
    }

    /// Counts a release by the holder.
    pub(crate) fn count_release(&self) {
        if !self.lost.load(Ordering::Acquire) {
            crate::metrics::released(&self.label, self.acquired_at.elapsed());
        }
        self.uncount();
    }

    /// The holder let go of the lease. A lease already past its validity was lost first, and
    /// stays reported lost.
    pub(crate) fn mark_ended(&self) {
        if Instant::now() >= self.valid_until() {
            self.mark_lost();
        }
        self.ended.store(true, Ordering::Release);
    }

    pub(crate) fn is_ended(&self) -> bool {
        self.ended.load(Ordering::Acquire)
    }

    pub(crate) fn is_lost(&self) -> bool {
        if self.lost.load(Ordering::Acquire) {
            return true;
        }
        if self.is_ended() || Instant::now() < self.valid_until() {
            return false;
        }
        // Seen lost by the clock before the watchdog noticed: record it, so the answer never
        // goes back to false.
        self.mark_lost();
        self.lost.load(Ordering::Acquire)
    }
}

/// Which task is running: a spawned tokio task, or else the thread (a `block_on` future never
/// moves to another thread).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TaskIdentity {
    Task(tokio::task::Id),
    Thread(std::thread::ThreadId),
}

impl TaskIdentity {
    pub(crate) fn current() -> Self {
        match tokio::task::try_id() {
            Some(id) => TaskIdentity::Task(id),
            None => TaskIdentity::Thread(std::thread::current().id()),
        }
    }
}

impl Lease {
    /// The lock key, as given to `lock(key)` or built by the attribute (without namespace).
    pub fn key(&self) -> &str {
        self.state.names.key()
    }

    /// The token that proves ownership of the record in the store: 32 hex digits, 64 of its
    /// bits drawn from the operating system's random source for this lease alone.
    pub fn token(&self) -> &str {
        &self.state.token
    }

    /// The fencing token: strictly increasing per key across all acquisitions by anyone.
    /// Storage the job writes should reject a write whose fence is lower than one it has seen.
    ///
    /// Given at acquire by most stores (then this returns at once); a store that computes it
    /// on demand is asked the first time, by a call that succeeds only while the store's
    /// record is still this lease's, and the answer is kept for later calls. Fails with
    /// [`LockError::Lost`] when no fence is known and the lease is known not to be held
    /// (lost, or released) or the store finds the record no longer this lease's, and with the
    /// store's error if it could not answer (a later call asks again). A fence the store gave
    /// while the record was this lease's is kept even if the lease is lost while the answer
    /// travels: every later holder's fence is greater.
    ///
    /// # Cancel safety
    /// Cancel safe: a cancelled first call leaves the fence unknown; the next call asks again.
    pub async fn fence(&self) -> Result<u64, LockError> {
        let state = &self.state;
        let lost = || LockError::Lost {
            key: state.names.key().to_owned(),
        };
        state
            .fence
            .get_or_try_init(|| async {
                if !self.is_held() {
                    return Err(lost());
                }
                // Kept exactly when no fence was given at acquire, so always there here.
                let Some(backend) = &state.backend else {
                    return Err(LockError::config("no store to ask for the fence"));
                };
                match backend.fence(&state.names, &state.token, state.ttl).await? {
                    Some(fence) => Ok(fence),
                    None => {
                        // The store's record is not this lease's any more.
                        state.mark_lost();
                        Err(lost())
                    }
                }
            })
            .await
            .copied()
    }

    /// The fence if it is known without asking the store: given at acquire, or asked for
    /// by [`fence`](Self::fence) before.
    pub fn known_fence(&self) -> Option<u64> {
        self.state.known_fence()
    }

    /// The lease length requested at acquire (and used by each renewal).
    pub fn ttl(&self) -> Duration {
        self.state.ttl
    }

    /// True once the lease is known not to be held any more: its validity ended without a
    /// renewal, or the store's record belongs to another token, or the runtime's shutdown grace
    /// period ended. Checked against the clock directly, so it is right even before the
    /// watchdog has run. Monotonic: once true, it stays true.
    ///
    /// A lease released by its holder while still valid is not lost; use
    /// [`is_held`](Self::is_held) to ask whether the lock may still be acted under.
    pub fn is_lost(&self) -> bool {
        self.state.is_lost()
    }

    /// True while the lease is held: not lost, and not released by its holder. Once false, it
    /// stays false.
    pub fn is_held(&self) -> bool {
        !self.state.is_ended() && !self.state.is_lost()
    }

    /// Resolves when the lease is lost. Never resolves for a lease that is released by its
    /// holder while still valid.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future loses nothing; call it again to keep waiting.
    pub async fn lost(&self) {
        loop {
            let notified = self.state.lost_notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.state.is_lost() {
                return;
            }
            // The runtime's watchdog driver marks the lease lost at the end of its validity
            // (or at a failed renewal) and wakes this future; no timer per waiter is needed.
            notified.await;
        }
    }
}

/// A lock record as seen by [`LockRuntime::inspect`](crate::LockRuntime::inspect) and
/// [`LockRuntime::list`](crate::LockRuntime::list).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockInfo {
    /// The lock key (without namespace).
    pub key: String,
    /// Who holds it: the runtime's `owner`, by default `hostname:pid`.
    pub owner: String,
    /// The fence of the current holder; None when none was issued to it yet (a store that
    /// fences on demand, before the holder asked).
    pub fence: Option<u64>,
    /// An opaque id of the current holding, the same on every read while it lasts and another
    /// for the next holder: what [`LockRuntime::force_release_holder`](crate::LockRuntime::force_release_holder)
    /// takes to free this holding and no later one.
    pub holder: String,
    /// Time left before the record expires unless renewed; `None` if it has no expiry.
    pub remaining: Option<Duration>,
    /// How long the current holder has held it, by the store's clock; None when the store
    /// does not keep when a holding began.
    pub held_for: Option<Duration>,
    /// Redlock only: how many masters hold this record, hold another one, or did not answer.
    pub quorum: Option<QuorumView>,
}

impl LockInfo {
    pub(crate) fn from_record(key: String, record: RecordView) -> Self {
        LockInfo {
            key,
            owner: record.owner,
            fence: record.fence,
            holder: record.holder,
            remaining: record.remaining,
            held_for: record.held_for,
            quorum: record.quorum,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(valid_for: Duration) -> LeaseState {
        let now = Instant::now();
        LeaseState::new(LeaseParams {
            id: 1,
            runtime_id: 1,
            names: KeyNames::new("lock", "k"),
            token: "t".to_owned(),
            fence: Some(1),
            backend: std::sync::Arc::new(crate::store::Backend::new(crate::MemoryStore::new())),
            ttl: valid_for,
            watchdog: true,
            max_hold_until: None,
            valid_until: now + valid_for,
            label: String::new(),
            acquired_at: now,
        })
    }

    /// A renewal answered after the validity ended must not revive the lease. Before the fix,
    /// `is_lost` read true at the end of validity and false again after the late report.
    #[tokio::test(start_paused = true)]
    async fn a_late_renewal_does_not_revive_a_lost_lease() {
        let state = lease(Duration::from_secs(10));
        tokio::time::advance(Duration::from_secs(11)).await;
        assert!(state.is_lost());
        let revived = state.extend_validity(Instant::now() + Duration::from_secs(10));
        assert!(!revived);
        assert!(state.is_lost(), "once lost, always lost");
    }

    /// The same when nobody looked in between: the clock alone decides.
    #[tokio::test(start_paused = true)]
    async fn a_renewal_after_the_end_is_a_loss_even_unobserved() {
        let state = lease(Duration::from_secs(10));
        tokio::time::advance(Duration::from_secs(11)).await;
        assert!(!state.extend_validity(Instant::now() + Duration::from_secs(10)));
        assert!(state.is_lost());
    }
}
