//! One driver task per runtime that renews every lease it holds, notices losses, and performs
//! the releases that `Drop` cannot await.
//!
//! A new lease waits in a shared registry until its first event (its first renewal, or the
//! end of its validity): a lock released before then, as most short jobs' are, is added and
//! removed under one mutex and never wakes the driver. Guards talk to the driver over an
//! unbounded channel, so dropping a guard (on a panic, a cancelled future, or plain scope
//! exit) never blocks a tokio worker. Renewals that fall due within a few milliseconds of
//! each other go out as one batched script call.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::config::drift;
use crate::lease::LeaseState;
use crate::store::{ExtendItem, Renewal, SharedBackend};

mod registry;
mod release;

use self::registry::{Pending, first_event, first_renewal, lock, renew_interval};
use self::release::run_release;
pub(crate) use self::release::{InFlight, InFlightRelease, ReleaseJob, Stopping};

/// Renewals due within this window of each other are sent together.
const COALESCE: Duration = Duration::from_millis(10);
/// At most this many leases per renewal script call.
const BATCH_MAX: usize = 1000;

pub(crate) enum Command {
    /// A lease was registered whose first event (renewal or end of validity) comes before
    /// any the driver knew of: arm the timer earlier.
    Wake,
    /// The holder released a lease the driver had taken over already; stop renewing it.
    Forget(u64),
    Release(ReleaseJob),
    /// Graceful shutdown: keep renewing what is held for at most `grace`, then mark what
    /// remains lost and release it; answer on `done` once the registry is empty.
    Shutdown {
        grace: Duration,
        done: oneshot::Sender<()>,
    },
}

/// The sending side, held by the runtime and by every guard.
#[derive(Debug, Clone)]
pub(crate) struct WatchdogHandle {
    tx: mpsc::UnboundedSender<Command>,
    pending: Arc<Mutex<Pending>>,
    /// For releases after the driver has stopped.
    fallback: (SharedBackend, Duration),
    /// True from the start of a shutdown: failed releases are no longer tried again, so the
    /// shutdown ends.
    stopping: Arc<Stopping>,
    /// Work the driver does not track: releases a holder awaits itself, acquires on their way,
    /// and releases started after the driver stopped. A shutdown waits for them too.
    in_flight: Arc<InFlight>,
    /// Turns true once the driver has stopped and finished its releases.
    stopped: tokio::sync::watch::Receiver<bool>,
}

impl WatchdogHandle {
    pub(crate) fn spawn(backend: SharedBackend, command_timeout: Duration) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        let fallback = (backend.clone(), command_timeout);
        let (stopped_tx, stopped) = tokio::sync::watch::channel(false);
        let (results_tx, results_rx) = mpsc::unbounded_channel();
        let stopping = Arc::new(Stopping::default());
        let pending = Arc::new(Mutex::new(Pending::default()));
        let driver = Driver {
            pending: pending.clone(),
            backend,
            command_timeout,
            stopping: stopping.clone(),
            entries: HashMap::new(),
            heap: BinaryHeap::new(),
            results_tx,
            releases: JoinSet::new(),
            draining: None,
            stopped: stopped_tx,
        };
        tokio::spawn(driver.run(rx, results_rx));
        WatchdogHandle {
            tx,
            pending,
            fallback,
            stopping,
            in_flight: Arc::new(InFlight::default()),
            stopped,
        }
    }

    /// Releases `job` in the background: through the driver, or, once the driver has stopped
    /// (after a shutdown), on a task of its own, so a grant that arrives late is never left
    /// to its ttl. Never blocks; without a tokio runtime to run on, the lease expires by its
    /// ttl.
    pub(crate) fn release_in_background(&self, job: ReleaseJob) -> bool {
        let lease_id = job.lease_id;
        let job = {
            // Sent under the registry's lock: the lease leaves the registry only once the
            // driver is sure to hear of its release, so a shutdown cannot end in between
            // knowing of it nowhere. If the driver stopped taking commands, the lease stays
            // for its last sweep (which releases it too; a second release is harmless).
            let mut pending = lock(&self.pending);
            match self.tx.send(Command::Release(job)) {
                Ok(()) => {
                    if let Some(id) = lease_id {
                        pending.leases.remove(&id);
                    }
                    return true;
                }
                Err(mpsc::error::SendError(Command::Release(job))) => job,
                Err(_) => return false,
            }
        };
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return false;
        };
        // After the driver stopped: one try, as at the end of a shutdown.
        let job = ReleaseJob {
            retry_until: None,
            ..job
        };
        let (backend, timeout) = self.fallback.clone();
        let stopping = self.stopping.clone();
        let counted = self.in_flight.start();
        handle.spawn(async move {
            run_release(backend, timeout, job, stopping).await;
            drop(counted);
        });
        true
    }

    /// Sends a command; false if the driver is gone (its tokio runtime ended, or shutdown
    /// finished).
    pub(crate) fn send(&self, command: Command) -> bool {
        self.tx.send(command).is_ok()
    }

    /// Hands a new lease to the watchdog; false if the driver is gone (its tokio runtime
    /// ended, or shutdown finished): the lease would never be renewed nor reported lost.
    pub(crate) fn register(&self, lease: Arc<LeaseState>) -> bool {
        let due = first_event(&lease);
        let id = lease.id;
        let wake = {
            let mut pending = lock(&self.pending);
            if pending.closed || self.tx.is_closed() {
                return false;
            }
            pending.leases.insert(id, lease);
            let earlier = pending.told.is_none_or(|told| due < told);
            if earlier {
                pending.told = Some(due);
            }
            earlier
        };
        // Sent after the lock is let go. If the driver stopped meanwhile, either its last
        // sweep took the lease (it releases it and marks it lost), or it stopped without one
        // (its tokio runtime ended) and the lease is taken back here and refused.
        if wake && self.tx.send(Command::Wake).is_err() {
            // Stopped without a sweep (its tokio runtime ended): nobody will renew it.
            return lock(&self.pending).leases.remove(&id).is_none();
        }
        true
    }

    /// The holder released the lease itself: stop renewing it.
    pub(crate) fn forget(&self, id: u64) {
        if lock(&self.pending).leases.remove(&id).is_none() {
            // Taken over by the driver already.
            let _ = self.tx.send(Command::Forget(id));
        }
    }

    /// Lets held leases finish within `grace`, then marks the rest lost and releases them;
    /// returns when nothing is registered any more and the driver has stopped.
    pub(crate) async fn shutdown(&self, grace: Duration) {
        let (done, done_rx) = oneshot::channel();
        if self.send(Command::Shutdown { grace, done }) {
            let _ = done_rx.await;
        }
        // A caller that came after the driver stopped taking commands (a second shutdown)
        // waits for the same end: the driver's last releases, then the untracked ones.
        let mut stopped = self.stopped.clone();
        let _ = stopped.wait_for(|stopped| *stopped).await;
        // Bounded: each store call of an acquire or a release is, but a future that is never
        // polled again (an acquire pinned in a `select!` whose other arm awaits this
        // shutdown) would hold the count for ever.
        let limit = 2 * self.fallback.1 + Duration::from_secs(1);
        if tokio::time::timeout(limit, self.in_flight.finished())
            .await
            .is_err()
        {
            tracing::warn!(
                in_flight = self.in_flight.count.load(Ordering::Acquire),
                waited = ?limit,
                "shutdown stopped waiting for acquires and releases still on their way (a future \
                 not polled any more?); their locks expire by their ttl"
            );
        }
    }

    /// Counts work a shutdown must wait for (a release a holder awaits itself, an acquire on
    /// its way) until the returned value drops.
    pub(crate) fn work_in_flight(&self) -> InFlightRelease {
        self.in_flight.start()
    }
}

struct Entry {
    lease: Arc<LeaseState>,
    /// When the next renewal is due; None for leases without a watchdog.
    next_renew: Option<Instant>,
    in_flight: bool,
    /// Bumped on every reschedule so stale heap items are skipped.
    generation: u64,
}

struct RenewReport {
    sent: Instant,
    /// Each lease with the ttl its renewal asked for (capped by max_hold).
    leases: Vec<(Arc<LeaseState>, Duration)>,
    result: Result<Vec<Renewal>, String>,
}

struct Driver {
    /// Leases registered and not taken over yet (see [`Pending`]).
    pending: Arc<Mutex<Pending>>,
    backend: SharedBackend,
    command_timeout: Duration,
    /// Set when a shutdown begins (see [`WatchdogHandle`]).
    stopping: Arc<Stopping>,
    entries: HashMap<u64, Entry>,
    heap: BinaryHeap<Reverse<(Instant, u64, u64)>>,
    results_tx: mpsc::UnboundedSender<RenewReport>,
    releases: JoinSet<()>,
    /// Set by a shutdown: when the grace period ends, and who waits for the end.
    draining: Option<(Instant, Vec<oneshot::Sender<()>>)>,
    stopped: tokio::sync::watch::Sender<bool>,
}

impl Drop for Driver {
    /// However the driver ends (stopped, or its task cancelled with its tokio runtime), the
    /// releases it started stop trying again.
    fn drop(&mut self) {
        self.stopping.set();
    }
}

impl Driver {
    async fn run(
        mut self,
        mut commands: mpsc::UnboundedReceiver<Command>,
        mut results: mpsc::UnboundedReceiver<RenewReport>,
    ) {
        // One timer, re-armed only when the earliest event changes: creating a timer per loop
        // turn would cost a timer-wheel insert for every lock taken.
        let timer = tokio::time::sleep(Duration::ZERO);
        tokio::pin!(timer);
        let mut armed_for: Option<Instant> = None;
        let grace_timer = tokio::time::sleep(Duration::ZERO);
        tokio::pin!(grace_timer);
        let mut grace_armed = false;
        loop {
            if self.draining.is_some() {
                // Everything held counts from the start of a shutdown.
                self.take_pending();
            }
            if let Some((grace_end, _)) = &self.draining {
                if self.entries.is_empty() {
                    break;
                }
                if !grace_armed {
                    grace_timer.as_mut().reset(*grace_end);
                    grace_armed = true;
                }
            }
            let told = lock(&self.pending).told;
            let next_wake = [self.heap.peek().map(|Reverse((at, _, _))| *at), told]
                .into_iter()
                .flatten()
                .min();
            if next_wake != armed_for {
                if let Some(at) = next_wake {
                    timer.as_mut().reset(at);
                }
                armed_for = next_wake;
            }
            // A fixed order, so a simulation replays from its seed. No branch starves the
            // others: the timer handles everything due in one turn, and the rest is finite.
            tokio::select! {
                biased;
                _ = &mut timer, if armed_for.is_some() => {
                    armed_for = None;
                    self.on_timer();
                }
                _ = &mut grace_timer, if grace_armed => {
                    self.end_grace();
                }
                Some(report) = results.recv() => self.on_report(report),
                command = commands.recv() => {
                    let Some(command) = command else { break };
                    // This command, then whatever else is queued, before the timer again.
                    let mut next = Some(command);
                    while let Some(command) = next {
                        self.handle(command);
                        next = commands.try_recv().ok();
                    }
                    self.compact();
                }
                Some(_) = self.releases.join_next(), if !self.releases.is_empty() => {}
            }
        }
        self.stop(commands).await;
    }

    /// The grace period is over: whatever is still held is marked lost (so its holder stops
    /// acting on it) and only then released.
    fn end_grace(&mut self) {
        let mut entries: Vec<(u64, Entry)> = self.entries.drain().collect();
        // In the order the leases were taken, not the map's: the same on every replay.
        entries.sort_unstable_by_key(|(id, _)| *id);
        let entries = entries.into_iter().map(|(_, e)| e);
        for entry in entries {
            let lease = entry.lease;
            // Marked as the shutdown's before its holder hears of it: the holder can tell.
            if lease.take_at_shutdown() {
                tracing::warn!(key = %lease.names.key(), fence = ?lease.known_fence(), reason = "the runtime shut down and its grace period ended", "lock lost");
            }
            // One try: the shutdown must end.
            self.spawn_release(ReleaseJob {
                names: lease.names.clone(),
                token: lease.token.clone(),
                done_until: None,
                lease_id: None,
                retry_until: None,
            });
        }
    }

    /// Stops taking commands, handles those already queued (a lease registered at the last
    /// moment is lost and released, never left unrenewed), finishes every release, then
    /// answers the shutdown callers.
    async fn stop(mut self, mut commands: mpsc::UnboundedReceiver<Command>) {
        // The runtime is gone or shut down: no release is tried again from here, so this ends.
        self.stopping.set();
        commands.close();
        while let Ok(command) = commands.try_recv() {
            self.handle(command);
        }
        lock(&self.pending).closed = true;
        self.take_pending();
        self.end_grace();
        while self.releases.join_next().await.is_some() {}
        self.stopped.send_replace(true);
        if let Some((_, waiting)) = self.draining.take() {
            for done in waiting {
                let _ = done.send(());
            }
        }
    }

    /// Rebuilds the heap when it is mostly stale items of leases released long before their
    /// first renewal (the common case for short jobs), so it stays proportional to the leases
    /// actually held.
    fn compact(&mut self) {
        if self.heap.len() <= 2 * self.entries.len() + 1024 {
            return;
        }
        let ids: Vec<u64> = self.entries.keys().copied().collect();
        self.heap.clear();
        for id in ids {
            self.schedule(id);
        }
    }

    /// Takes over every lease waiting in the registry.
    fn take_pending(&mut self) {
        let leases = {
            let mut pending = lock(&self.pending);
            pending.told = None;
            std::mem::take(&mut pending.leases)
        };
        for (id, lease) in leases {
            let entry = Entry {
                next_renew: first_renewal(&lease),
                lease,
                in_flight: false,
                generation: 0,
            };
            self.entries.insert(id, entry);
            self.schedule(id);
        }
    }

    fn handle(&mut self, command: Command) {
        match command {
            // The loop arms its timer for the registry's earliest event.
            Command::Wake => {}
            Command::Forget(id) => {
                self.entries.remove(&id);
            }
            Command::Release(job) => {
                if let Some(id) = job.lease_id {
                    self.entries.remove(&id);
                }
                self.spawn_release(job);
            }
            Command::Shutdown { grace, done } => {
                self.stopping.set();
                let now = Instant::now();
                let grace_end = now
                    .checked_add(grace)
                    .unwrap_or_else(|| now + Duration::from_secs(100 * 365 * 24 * 3600));
                match &mut self.draining {
                    Some((_, waiting)) => waiting.push(done),
                    None => self.draining = Some((grace_end, vec![done])),
                }
            }
        }
    }

    fn spawn_release(&mut self, job: ReleaseJob) {
        self.releases.spawn(run_release(
            self.backend.clone(),
            self.command_timeout,
            job,
            self.stopping.clone(),
        ));
    }

    /// Puts the entry's next event (renewal or end of validity) on the heap.
    fn schedule(&mut self, id: u64) {
        let Some(entry) = self.entries.get_mut(&id) else {
            return;
        };
        entry.generation += 1;
        let valid_until = entry.lease.valid_until();
        let at = match (entry.in_flight, entry.next_renew) {
            (false, Some(renew)) => renew.min(valid_until),
            _ => valid_until,
        };
        self.heap.push(Reverse((at, id, entry.generation)));
    }

    fn on_timer(&mut self) {
        self.take_pending();
        let now = Instant::now();
        let mut batch: Vec<(Arc<LeaseState>, Duration)> = Vec::new();
        let mut touched = Vec::new();
        while let Some(Reverse((at, id, generation))) = self.heap.peek().copied() {
            if at > now + COALESCE {
                break;
            }
            self.heap.pop();
            let Some(entry) = self.entries.get_mut(&id) else {
                continue;
            };
            if entry.generation != generation {
                continue;
            }
            if now >= entry.lease.valid_until() {
                let lease = entry.lease.clone();
                self.entries.remove(&id);
                lose(&lease, "the lease expired before a renewal succeeded");
                continue;
            }
            let renew_due =
                !entry.in_flight && entry.next_renew.is_some_and(|r| r <= now + COALESCE);
            // A renewal never reaches past max_hold: the last one asks only for what is left.
            let renew_ttl = match entry.lease.max_hold_until {
                Some(m) => entry.lease.ttl.min(m.saturating_duration_since(now)),
                None => entry.lease.ttl,
            };
            if renew_due && renew_ttl < Duration::from_millis(1) {
                tracing::debug!(key = %entry.lease.names.key(), "max_hold reached; renewals stop and the lease will expire");
                entry.next_renew = None;
            } else if renew_due {
                entry.in_flight = true;
                batch.push((entry.lease.clone(), renew_ttl));
            }
            touched.push(id);
        }
        for id in touched {
            self.schedule(id);
        }
        for chunk in batch.chunks(BATCH_MAX) {
            self.spawn_renewal(chunk.to_vec());
        }
    }

    fn spawn_renewal(&mut self, leases: Vec<(Arc<LeaseState>, Duration)>) {
        let backend = self.backend.clone();
        let results = self.results_tx.clone();
        // Not cut short by the validity of any lease in the batch: a lease whose validity ends
        // while its renewal is in flight is reported lost at that instant by the timer (see
        // `schedule`), so one lease near its end must not fail the renewal of the others. The
        // store bounds its own calls by the command timeout; this is only a backstop.
        let timeout = self.command_timeout + Duration::from_secs(1);
        tokio::spawn(async move {
            let items: Vec<ExtendItem> = leases
                .iter()
                .map(|(l, ttl)| ExtendItem {
                    record: l.names.record().to_owned(),
                    token: l.token.clone(),
                    ttl: *ttl,
                })
                .collect();
            let sent = Instant::now();
            let result = match tokio::time::timeout(timeout, backend.extend(&items)).await {
                Ok(Ok(renewed)) => Ok(renewed),
                Ok(Err(e)) => Err(e.to_string()),
                Err(_) => Err(format!("no answer within {timeout:?}")),
            };
            let _ = results.send(RenewReport {
                sent,
                leases,
                result,
            });
        });
    }

    fn on_report(&mut self, report: RenewReport) {
        let now = Instant::now();
        for (i, (lease, ttl)) in report.leases.iter().enumerate() {
            let Some(entry) = self.entries.get_mut(&lease.id) else {
                continue; // released meanwhile
            };
            entry.in_flight = false;
            let answer = match &report.result {
                Ok(answers) => answers
                    .get(i)
                    .cloned()
                    .unwrap_or_else(|| Renewal::Unknown("no answer for this lease".to_owned())),
                Err(e) => Renewal::Unknown(e.clone()),
            };
            match answer {
                Renewal::Renewed => {
                    let until = report.sent + *ttl - drift(lease.ttl).min(*ttl);
                    if !lease.extend_validity(until) {
                        self.entries.remove(&lease.id);
                        lose(lease, "the renewal was answered after the lease ended");
                        continue;
                    }
                    entry.next_renew = Some(report.sent + renew_interval(lease.ttl));
                    tracing::trace!(key = %lease.names.key(), fence = ?lease.known_fence(), "lease renewed");
                }
                Renewal::NotOurs => {
                    self.entries.remove(&lease.id);
                    lose(lease, "the record now belongs to another token");
                    continue;
                }
                Renewal::Unknown(e) => {
                    if now >= lease.valid_until() {
                        self.entries.remove(&lease.id);
                        lose(lease, "renewals failed until the lease expired");
                        continue;
                    }
                    crate::metrics::renewal_failed(&lease.label);
                    let retry =
                        (lease.ttl / 10).clamp(Duration::from_millis(10), Duration::from_secs(1));
                    entry.next_renew = Some(now + retry);
                    tracing::warn!(key = %lease.names.key(), fence = ?lease.known_fence(), error = %e, "lease renewal failed; retrying");
                }
            }
            self.schedule(lease.id);
        }
    }
}

fn lose(lease: &LeaseState, why: &str) {
    if lease.mark_lost() {
        tracing::warn!(key = %lease.names.key(), fence = ?lease.known_fence(), reason = why, "lock lost");
    }
}
