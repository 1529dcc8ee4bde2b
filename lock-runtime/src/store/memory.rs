//! The in-process store: same semantics as Redis, driven by `tokio::time`.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use super::listing::key_of_record;
use super::{
    AcquireOutcome, AcquireRequest, ExtendItem, KeyNames, LockStore, RecordView, ReleaseHub,
    ReleaseOutcome, ReleaseWatch, Renewal, Retention, key_matches,
};
use crate::LockError;

/// An in-process lock store for demos and unit tests.
///
/// Clones share one state, so several runtimes built on clones of one `MemoryStore` compete
/// for the same locks, the way several service instances compete through one Redis. Time comes
/// from `tokio::time`, so a test that calls `tokio::time::pause()` controls lease expiry
/// exactly.
///
/// It coordinates tasks of one process only; use Redis across processes.
///
/// ```
/// use lock_runtime::{LockRuntime, MemoryStore};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), lock_runtime::LockError> {
/// let store = MemoryStore::new();
/// let a = LockRuntime::builder().memory(store.clone()).build().await?;
/// let b = LockRuntime::builder().memory(store).build().await?;
///
/// let guard = a.lock("report").try_acquire().await?.expect("the lock is free");
/// assert!(b.lock("report").try_acquire().await?.is_none());
/// guard.release().await?;
/// assert!(b.lock("report").try_acquire().await?.is_some());
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Default)]
pub struct MemoryStore {
    shared: Arc<Shared>,
}

#[derive(Debug, Default)]
struct Shared {
    state: Mutex<State>,
    hub: Arc<ReleaseHub>,
}

#[derive(Debug)]
struct State {
    records: HashMap<String, Record>,
    done: HashMap<String, Instant>,
    /// The run journals, by namespace and job: each run with when it was appended.
    journals: HashMap<(String, String), VecDeque<(Instant, String)>>,
    /// The last fence handed out, for any key. Fences are hybrid, as on Redis: one more than
    /// the last, and never below the clock in microseconds, so nothing is kept per key.
    last_fence: u64,
    /// The clock fences are read from: wall time at creation, advanced by `tokio::time`
    /// (so a paused test clock drives it too).
    clock_base_us: u64,
    clock_base: Instant,
    /// Expired records and markers are swept when the maps reach this size.
    sweep_at: usize,
}

impl Default for State {
    fn default() -> Self {
        let wall_us = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX / 2));
        State {
            records: HashMap::new(),
            done: HashMap::new(),
            journals: HashMap::new(),
            last_fence: 0,
            clock_base_us: wall_us,
            clock_base: Instant::now(),
            sweep_at: SWEEP_MIN,
        }
    }
}

/// The smallest map size at which expired entries are swept.
const SWEEP_MIN: usize = 1024;

#[derive(Debug)]
struct Record {
    token: String,
    owner: String,
    fence: u64,
    acquired_at: Instant,
    min_hold_until: Instant,
    expires_at: Instant,
}

impl Record {
    fn view(&self, now: Instant) -> RecordView {
        RecordView::new(
            self.owner.clone(),
            self.fence,
            Some(self.expires_at - now),
            now - self.acquired_at,
        )
    }
}

impl State {
    /// The live record at `record`, dropping it first if it has expired.
    fn live(&mut self, record: &str, now: Instant) -> Option<&mut Record> {
        if self
            .records
            .get(record)
            .is_some_and(|r| r.expires_at <= now)
        {
            self.records.remove(record);
        }
        self.records.get_mut(record)
    }

    fn next_fence(&mut self, now: Instant) -> u64 {
        let elapsed = u64::try_from((now - self.clock_base).as_micros()).unwrap_or(u64::MAX / 4);
        let clock_us = self.clock_base_us.saturating_add(elapsed);
        self.last_fence = self.last_fence.saturating_add(1).max(clock_us);
        self.last_fence
    }

    /// Drops expired records and markers once the maps have doubled since the last sweep, so
    /// a million one-shot keys leave nothing behind once they expire (amortised O(1)).
    fn sweep(&mut self, now: Instant) {
        if self.records.len() + self.done.len() < self.sweep_at {
            return;
        }
        self.records.retain(|_, r| r.expires_at > now);
        self.done.retain(|_, until| *until > now);
        self.sweep_at = (2 * (self.records.len() + self.done.len())).max(SWEEP_MIN);
    }

    fn done_remaining(&mut self, done: &str, now: Instant) -> Option<Duration> {
        match self.done.get(done) {
            Some(&until) if until > now => Some(until - now),
            Some(_) => {
                self.done.remove(done);
                None
            }
            None => None,
        }
    }
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// Forgets every lock record and done marker, as a Redis server restarted without
    /// persistence would. Leases held on this store are then reported lost at their next
    /// renewal. Fences keep increasing, as the hybrid fence does on Redis (its clock part
    /// survives a restart). Meant for tests that simulate a store failure.
    pub fn clear(&self) {
        let mut state = self.state();
        state.records.clear();
        state.done.clear();
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // Every update below is a single map operation; a poisoned lock holds consistent data.
        self.shared
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    // The store's synchronous core, one method per call of [`LockStore`]; the trait's
    // implementation below answers each with `Ok`.

    fn acquire_now(&self, request: AcquireRequest<'_>) -> AcquireOutcome {
        let AcquireRequest {
            names,
            token,
            owner,
            ttl,
            min_hold,
            once,
        } = request;
        let now = Instant::now();
        let mut state = self.state();
        if once && let Some(pttl) = state.done_remaining(names.done(), now) {
            return AcquireOutcome::Done { pttl: Some(pttl) };
        }
        if let Some(held) = state.live(names.record(), now) {
            return AcquireOutcome::Held {
                pttl: Some(held.expires_at - now),
            };
        }
        state.sweep(now);
        let fence = state.next_fence(now);
        state.records.insert(
            names.record().to_owned(),
            Record {
                token: token.to_owned(),
                owner: owner.to_owned(),
                fence,
                acquired_at: now,
                min_hold_until: now + min_hold,
                expires_at: now + ttl,
            },
        );
        AcquireOutcome::Acquired { fence }
    }

    fn release_now(
        &self,
        names: &KeyNames,
        token: &str,
        done_retention: Option<Duration>,
    ) -> ReleaseOutcome {
        let now = Instant::now();
        let outcome = {
            let mut state = self.state();
            // As on Redis: the marker records that the work succeeded, ours or not any more.
            if let Some(retention) = done_retention {
                state.done.insert(names.done().to_owned(), now + retention);
            }
            let Some(record) = state.live(names.record(), now) else {
                return ReleaseOutcome::NotOwner;
            };
            if record.token != token {
                return ReleaseOutcome::NotOwner;
            }
            let hold_until = record.min_hold_until;
            if hold_until > now {
                // Kept until min_hold passes, but no longer the holder's (as on Redis).
                record.expires_at = record.expires_at.min(hold_until);
                // Never a token: those are 32 hex digits (and `mark_done` uses "").
                record.token = "released".to_owned();
                ReleaseOutcome::KeptForMinHold
            } else {
                state.records.remove(names.record());
                ReleaseOutcome::Released
            }
        };
        // Kept for min_hold too: waiters were told the holder's whole ttl, and ask again to
        // learn that the lock frees when min_hold ends.
        if outcome != ReleaseOutcome::NotOwner {
            self.shared.hub.notify(names.channel());
        }
        outcome
    }

    fn extend_now(&self, items: &[ExtendItem]) -> Vec<Renewal> {
        let now = Instant::now();
        let mut state = self.state();
        items
            .iter()
            .map(|item| match state.live(&item.record, now) {
                Some(r) if r.token == item.token => {
                    r.expires_at = r.expires_at.max(now + item.ttl);
                    Renewal::Renewed
                }
                _ => Renewal::NotOurs,
            })
            .collect()
    }

    fn inspect_now(&self, names: &KeyNames) -> Option<RecordView> {
        let now = Instant::now();
        let mut state = self.state();
        state.live(names.record(), now).map(|r| r.view(now))
    }

    fn list_now(&self, namespace: &str, pattern: &str) -> Vec<(String, RecordView)> {
        let now = Instant::now();
        let state = self.state();
        state
            .records
            .iter()
            .filter(|(_, r)| r.expires_at > now)
            .filter_map(|(record, r)| {
                let key = key_of_record(namespace, record)?;
                key_matches(pattern, &key).then(|| (key, r.view(now)))
            })
            .collect()
    }

    fn force_release_now(&self, names: &KeyNames, fence: u64) -> bool {
        let now = Instant::now();
        let removed = {
            let mut state = self.state();
            state
                .live(names.record(), now)
                .is_some_and(|r| r.fence == fence)
                && state.records.remove(names.record()).is_some()
        };
        if removed {
            self.shared.hub.notify(names.channel());
        }
        removed
    }

    /// As a quorum member: no later fence here is `fence` or lower, and our record carries it.
    fn raise_fence_now(&self, names: &KeyNames, token: &str, fence: u64) -> bool {
        let now = Instant::now();
        let mut state = self.state();
        state.last_fence = state.last_fence.max(fence);
        match state.live(names.record(), now) {
            Some(r) if r.token == token => {
                r.fence = fence;
                true
            }
            _ => false,
        }
    }

    fn append_run_now(&self, namespace: &str, job: &str, entry: &str, keep: &Retention) {
        let now = Instant::now();
        let mut state = self.state();
        // Every append sweeps the namespace's journals gone past its age, so a journal
        // nobody appends to any more goes too.
        state.journals.retain(|(ns, _), runs| {
            while ns == namespace
                && runs
                    .front()
                    .is_some_and(|(at, _)| now.saturating_duration_since(*at) >= keep.max_age)
            {
                runs.pop_front();
            }
            !runs.is_empty()
        });
        let runs = state
            .journals
            .entry((namespace.to_owned(), job.to_owned()))
            .or_default();
        runs.push_back((now, entry.to_owned()));
        while runs.len() > keep.max_runs.max(1) {
            runs.pop_front();
        }
        if runs.is_empty() {
            state
                .journals
                .remove(&(namespace.to_owned(), job.to_owned()));
        }
    }

    fn runs_now(&self, namespace: &str, job: &str, limit: usize) -> Vec<String> {
        let state = self.state();
        state
            .journals
            .get(&(namespace.to_owned(), job.to_owned()))
            .map(|runs| {
                runs.iter()
                    .rev()
                    .take(limit)
                    .map(|(_, e)| e.clone())
                    .collect()
            })
            .unwrap_or_default()
    }

    fn journalled_jobs_now(&self, namespace: &str) -> Vec<String> {
        let state = self.state();
        state
            .journals
            .keys()
            .filter(|(ns, _)| ns == namespace)
            .map(|(_, job)| job.clone())
            .collect()
    }

    fn watch_releases_now(&self, names: &KeyNames) -> ReleaseWatch {
        self.shared.hub.subscribe(names.channel())
    }
}

/// The memory store through the public trait, the one route the runtime calls every store by.
impl LockStore for MemoryStore {
    async fn acquire(&self, r: AcquireRequest<'_>) -> Result<AcquireOutcome, LockError> {
        Ok(self.acquire_now(r))
    }

    async fn release(
        &self,
        names: &KeyNames,
        token: &str,
        done_retention: Option<Duration>,
    ) -> Result<ReleaseOutcome, LockError> {
        Ok(self.release_now(names, token, done_retention))
    }

    async fn extend(&self, items: &[ExtendItem]) -> Result<Vec<Renewal>, LockError> {
        Ok(self.extend_now(items))
    }

    async fn inspect(&self, names: &KeyNames) -> Result<Option<RecordView>, LockError> {
        Ok(self.inspect_now(names))
    }

    async fn watch_releases(&self, names: &KeyNames) -> Result<ReleaseWatch, LockError> {
        Ok(self.watch_releases_now(names))
    }

    /// The fence counter is one per store and never expires, so `ttl` needs no keeping.
    async fn raise_fence(
        &self,
        names: &KeyNames,
        token: &str,
        fence: u64,
        _ttl: Duration,
    ) -> Result<bool, LockError> {
        Ok(self.raise_fence_now(names, token, fence))
    }

    async fn list(
        &self,
        namespace: &str,
        pattern: &str,
    ) -> Result<Vec<(String, RecordView)>, LockError> {
        Ok(self.list_now(namespace, pattern))
    }

    async fn force_release(&self, names: &KeyNames, fence: u64) -> Result<bool, LockError> {
        Ok(self.force_release_now(names, fence))
    }

    async fn append_run(
        &self,
        namespace: &str,
        job: &str,
        entry: &str,
        keep: &Retention,
    ) -> Result<(), LockError> {
        self.append_run_now(namespace, job, entry, keep);
        Ok(())
    }

    async fn runs(
        &self,
        namespace: &str,
        job: &str,
        limit: usize,
    ) -> Result<Vec<String>, LockError> {
        Ok(self.runs_now(namespace, job, limit))
    }

    async fn journalled_jobs(&self, namespace: &str) -> Result<Vec<String>, LockError> {
        Ok(self.journalled_jobs_now(namespace))
    }
}
