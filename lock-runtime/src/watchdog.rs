//! One driver task per runtime that renews every lease it holds, notices losses, and performs
//! the releases that `Drop` cannot await.
//!
//! Guards talk to it over an unbounded channel, so dropping a guard (on a panic, a cancelled
//! future, or plain scope exit) never blocks a tokio worker. Renewals that fall due within a
//! few milliseconds of each other go out as one batched script call.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::config::drift;
use crate::lease::LeaseState;
use crate::store::{ExtendItem, KeyNames, ReleaseOutcome, SharedBackend};

/// Renewals due within this window of each other are sent together.
const COALESCE: Duration = Duration::from_millis(10);
/// At most this many leases per renewal script call.
const BATCH_MAX: usize = 1000;

/// A release to perform in the background.
pub(crate) struct ReleaseJob {
    pub(crate) names: KeyNames,
    pub(crate) token: String,
    pub(crate) done_retention: Option<Duration>,
    /// The lease being released, when there is one (None: an acquire whose caller went away).
    pub(crate) lease_id: Option<u64>,
}

pub(crate) enum Command {
    Register(Arc<LeaseState>),
    /// The holder released the lease itself; stop renewing it.
    Forget(u64),
    Release(ReleaseJob),
    Shutdown(oneshot::Sender<()>),
}

/// The sending side, held by the runtime and by every guard.
#[derive(Debug, Clone)]
pub(crate) struct WatchdogHandle {
    tx: mpsc::UnboundedSender<Command>,
}

impl WatchdogHandle {
    pub(crate) fn spawn(backend: SharedBackend, command_timeout: Duration) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        let (results_tx, results_rx) = mpsc::unbounded_channel();
        let driver = Driver {
            backend,
            command_timeout,
            entries: HashMap::new(),
            heap: BinaryHeap::new(),
            results_tx,
            releases: JoinSet::new(),
        };
        tokio::spawn(driver.run(rx, results_rx));
        WatchdogHandle { tx }
    }

    /// Sends a command; false if the driver is gone (its tokio runtime ended, or shutdown).
    pub(crate) fn send(&self, command: Command) -> bool {
        self.tx.send(command).is_ok()
    }

    /// Releases everything still registered and stops the driver.
    pub(crate) async fn shutdown(&self) {
        let (done_tx, done_rx) = oneshot::channel();
        if self.send(Command::Shutdown(done_tx)) {
            let _ = done_rx.await;
        }
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
    leases: Vec<Arc<LeaseState>>,
    result: Result<Vec<bool>, String>,
}

struct Driver {
    backend: SharedBackend,
    command_timeout: Duration,
    entries: HashMap<u64, Entry>,
    heap: BinaryHeap<Reverse<(Instant, u64, u64)>>,
    results_tx: mpsc::UnboundedSender<RenewReport>,
    releases: JoinSet<()>,
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
        loop {
            let next_wake = self.heap.peek().map(|Reverse((at, _, _))| *at);
            if next_wake != armed_for {
                if let Some(at) = next_wake {
                    timer.as_mut().reset(at);
                }
                armed_for = next_wake;
            }
            tokio::select! {
                command = commands.recv() => {
                    let Some(command) = command else { break };
                    // This command, then whatever else is queued, before the timer again.
                    let mut next = Some(command);
                    while let Some(command) = next {
                        if let Some(done) = self.handle(command) {
                            self.shutdown().await;
                            let _ = done.send(());
                            return;
                        }
                        next = commands.try_recv().ok();
                    }
                    self.compact();
                }
                Some(report) = results.recv() => self.on_report(report),
                Some(_) = self.releases.join_next(), if !self.releases.is_empty() => {}
                _ = &mut timer, if armed_for.is_some() => {
                    armed_for = None;
                    self.on_timer();
                }
            }
        }
        // Every handle is gone; finish the releases already started.
        while self.releases.join_next().await.is_some() {}
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

    /// Applies a command; a shutdown is handed back for `run` to carry out.
    fn handle(&mut self, command: Command) -> Option<oneshot::Sender<()>> {
        match command {
            Command::Register(lease) => {
                let next_renew = lease
                    .watchdog
                    .then(|| Instant::now() + renew_interval(lease.ttl));
                let entry = Entry {
                    lease,
                    next_renew,
                    in_flight: false,
                    generation: 0,
                };
                let id = entry.lease.id;
                self.entries.insert(id, entry);
                self.schedule(id);
            }
            Command::Forget(id) => {
                self.entries.remove(&id);
            }
            Command::Release(job) => {
                if let Some(id) = job.lease_id {
                    self.entries.remove(&id);
                }
                self.spawn_release(job);
            }
            Command::Shutdown(done) => return Some(done),
        }
        None
    }

    fn spawn_release(&mut self, job: ReleaseJob) {
        let backend = self.backend.clone();
        let timeout = self.command_timeout;
        self.releases.spawn(async move {
            match tokio::time::timeout(
                timeout,
                backend.release(&job.names, &job.token, job.done_retention),
            )
            .await
            {
                Ok(Ok(ReleaseOutcome::NotOwner)) => {
                    tracing::debug!(key = %job.names.key, "lock was no longer ours at release");
                }
                Ok(Ok(outcome)) => {
                    tracing::debug!(key = %job.names.key, ?outcome, "lock released by guard drop");
                }
                Ok(Err(e)) => {
                    tracing::warn!(key = %job.names.key, error = %e, "release failed; the lease will expire by its ttl");
                }
                Err(_) => {
                    tracing::warn!(key = %job.names.key, "release timed out; the lease will expire by its ttl");
                }
            }
        });
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
        let now = Instant::now();
        let mut batch: Vec<Arc<LeaseState>> = Vec::new();
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
            let past_max_hold = entry.lease.max_hold_until.is_some_and(|m| now >= m);
            if renew_due && past_max_hold {
                tracing::debug!(key = %entry.lease.names.key, "max_hold reached; renewals stop and the lease will expire");
                entry.next_renew = None;
            } else if renew_due {
                entry.in_flight = true;
                batch.push(entry.lease.clone());
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

    fn spawn_renewal(&mut self, leases: Vec<Arc<LeaseState>>) {
        let backend = self.backend.clone();
        let results = self.results_tx.clone();
        // Never wait past the earliest validity end in the batch: the loss must be reported then.
        let shortest = leases
            .iter()
            .map(|l| l.ttl)
            .min()
            .unwrap_or(self.command_timeout);
        let timeout = self
            .command_timeout
            .min(renew_interval(shortest))
            .max(Duration::from_millis(5));
        tokio::spawn(async move {
            let items: Vec<ExtendItem> = leases
                .iter()
                .map(|l| ExtendItem {
                    record: l.names.record.clone(),
                    token: l.token.clone(),
                    ttl: l.ttl,
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
        for (i, lease) in report.leases.iter().enumerate() {
            let Some(entry) = self.entries.get_mut(&lease.id) else {
                continue; // released meanwhile
            };
            entry.in_flight = false;
            match &report.result {
                Ok(renewed) if renewed.get(i).copied().unwrap_or(false) => {
                    lease
                        .extend_validity(report.sent + lease.ttl - drift(lease.ttl).min(lease.ttl));
                    entry.next_renew = Some(report.sent + renew_interval(lease.ttl));
                    tracing::trace!(key = %lease.names.key, fence = lease.fence, "lease renewed");
                }
                Ok(_) => {
                    self.entries.remove(&lease.id);
                    lose(lease, "the record now belongs to another token");
                    continue;
                }
                Err(e) => {
                    if now >= lease.valid_until() {
                        self.entries.remove(&lease.id);
                        lose(lease, "renewals failed until the lease expired");
                        continue;
                    }
                    crate::metrics::renewal_failed(&lease.label);
                    let retry =
                        (lease.ttl / 10).clamp(Duration::from_millis(10), Duration::from_secs(1));
                    entry.next_renew = Some(now + retry);
                    tracing::warn!(key = %lease.names.key, fence = lease.fence, error = %e, "lease renewal failed; retrying");
                }
            }
            self.schedule(lease.id);
        }
    }

    /// Releases every registered lease (marking it lost first, so bodies relying on it stop)
    /// and waits for the releases to finish.
    async fn shutdown(&mut self) {
        let entries: Vec<Entry> = self.entries.drain().map(|(_, e)| e).collect();
        for entry in entries {
            let lease = entry.lease;
            lose(&lease, "the runtime is shutting down");
            lease.mark_ended();
            self.spawn_release(ReleaseJob {
                names: lease.names.clone(),
                token: lease.token.clone(),
                done_retention: None,
                lease_id: None,
            });
        }
        while self.releases.join_next().await.is_some() {}
    }
}

fn lose(lease: &LeaseState, why: &str) {
    if lease.mark_lost() {
        tracing::warn!(key = %lease.names.key, fence = lease.fence, reason = why, "lock lost");
    }
}

/// Renew at a third of the ttl: two more chances before the lease runs out.
fn renew_interval(ttl: Duration) -> Duration {
    (ttl / 3).max(Duration::from_millis(1))
}
