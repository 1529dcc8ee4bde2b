//! The simulated store: one master with an asynchronously replicated replica, failovers that
//! drop what the replica had not received, and a network that delays, drops and loses.
//!
//! Every decision comes from the world's seeded generator, drawn in the order calls arrive,
//! so one seed replays the same run on a current-thread runtime with paused time.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use lock_runtime::store::{
    AcquireOutcome, AcquireRequest, ExtendItem, KeyNames, LockStore, RecordView, ReleaseHub,
    ReleaseOutcome, ReleaseWatch, Renewal,
};
use lock_runtime::{BackendError, LockError};
use tokio::time::Instant;

use super::history::{FaultKind, Grant, History};
use crate::rng::XorShift;

/// How often the network misbehaves, per thousand calls, and how slow it is.
#[derive(Debug, Clone)]
pub struct NetFaults {
    /// The reply arrives after the client's timeout (the call took effect).
    pub slow_reply: u64,
    /// The reply never arrives (the call took effect).
    pub lost_reply: u64,
    /// The request never arrives (the call did not take effect).
    pub dropped_request: u64,
    /// The reply takes up to 90% of the client's timeout.
    pub sluggish_reply: u64,
    /// One-way latency is uniform in `[0, max_latency)`.
    pub max_latency: Duration,
}

/// The bound within which the servers' clocks agree (DESIGN §5: a failover takes longer).
pub const CLOCK_BOUND_US: i64 = 2_000;

#[derive(Debug, Clone)]
struct Rec {
    token: String,
    owner: String,
    fence: u64,
    acquired_at: Instant,
    min_hold_until: Instant,
    expires_at: Instant,
}

#[derive(Debug, Clone, Default)]
struct Node {
    records: BTreeMap<String, Rec>,
    done: BTreeMap<String, Instant>,
    counters: BTreeMap<String, u64>,
    clock_offset_us: i64,
}

impl Node {
    fn live(&mut self, record: &str, now: Instant) -> Option<&mut Rec> {
        if self
            .records
            .get(record)
            .is_some_and(|r| r.expires_at <= now)
        {
            self.records.remove(record);
        }
        self.records.get_mut(record)
    }
}

/// One write of the replication stream: the new value of one key.
#[derive(Debug, Clone)]
enum Write {
    Record(String, Option<Rec>),
    Done(String, Instant),
    Counter(String, u64),
}

/// The whole simulated deployment: servers, network, and the history the checker reads.
#[derive(Debug)]
pub struct World {
    rng: XorShift,
    master: Node,
    replica: Node,
    /// Writes the replica has not applied yet, each with the instant it will.
    stream: VecDeque<(Instant, Write)>,
    /// Replication delay of new writes.
    lag: Duration,
    /// A failover is under way until then: every call fails.
    unavailable_until: Instant,
    partitioned_until: Vec<Instant>,
    /// When the last request of each client arrives: one connection per client, so requests
    /// arrive in the order they were sent (as on a Redis connection).
    last_arrival: Vec<Instant>,
    hubs: Vec<Arc<ReleaseHub>>,
    net: NetFaults,
    /// The client-side timeout of one call.
    pub timeout: Duration,
    start: Instant,
    base_us: u64,
    /// What happened, for the checker.
    pub history: History,
}

fn lock(world: &Mutex<World>) -> MutexGuard<'_, World> {
    world.lock().unwrap_or_else(PoisonError::into_inner)
}

impl World {
    /// A world of `clients` runtimes, every decision drawn from `seed`.
    pub fn new(seed: u64, clients: usize, net: NetFaults, timeout: Duration) -> Self {
        let now = Instant::now();
        World {
            rng: XorShift::mixed(seed ^ 0x5eed_5eed),
            master: Node::default(),
            replica: Node::default(),
            stream: VecDeque::new(),
            lag: Duration::from_millis(1),
            unavailable_until: now,
            partitioned_until: vec![now; clients],
            last_arrival: vec![now; clients],
            hubs: (0..clients).map(|_| Arc::new(ReleaseHub::new())).collect(),
            net,
            timeout,
            start: now,
            // A fixed wall clock, so fences replay too.
            base_us: 1_800_000_000_000_000,
            history: History::new(now),
        }
    }

    fn node_time_us(&self, now: Instant) -> u64 {
        let elapsed = i64::try_from((now - self.start).as_micros()).unwrap_or(i64::MAX / 4);
        let base = i64::try_from(self.base_us).unwrap_or(i64::MAX / 4);
        u64::try_from(base + elapsed + self.master.clock_offset_us).unwrap_or(0)
    }

    /// Applies to the replica every write whose time has come, in order.
    fn replicate(&mut self, now: Instant) {
        while self.stream.front().is_some_and(|(at, _)| *at <= now) {
            let Some((_, write)) = self.stream.pop_front() else {
                break;
            };
            match write {
                Write::Record(name, Some(rec)) => {
                    self.replica.records.insert(name, rec);
                }
                Write::Record(name, None) => {
                    self.replica.records.remove(&name);
                }
                Write::Done(name, until) => {
                    self.replica.done.insert(name, until);
                }
                Write::Counter(name, value) => {
                    self.replica.counters.insert(name, value);
                }
            }
        }
    }

    fn ship(&mut self, now: Instant, write: Write) {
        // The stream is ordered: a write never overtakes an earlier one.
        let at = (now + self.lag).max(self.stream.back().map_or(now, |(at, _)| *at));
        self.stream.push_back((at, write));
    }

    fn reachable(&self, client: usize, now: Instant) -> bool {
        now >= self.unavailable_until && now >= self.partitioned_until[client]
    }

    fn acquire(&mut self, client: usize, r: &OwnedAcquire, now: Instant) -> AcquireOutcome {
        if r.once
            && let Some(until) = self.master.done.get(&r.done).copied()
            && until > now
        {
            return AcquireOutcome::Done {
                pttl: Some(until - now),
            };
        }
        if let Some(held) = self.master.live(&r.record, now) {
            return AcquireOutcome::Held {
                pttl: Some(held.expires_at - now),
            };
        }
        let counter = self.master.counters.get(&r.fence).copied().unwrap_or(0);
        let fence = (counter + 1).max(self.node_time_us(now));
        let rec = Rec {
            token: r.token.clone(),
            owner: r.owner.clone(),
            fence,
            acquired_at: now,
            min_hold_until: now + r.min_hold,
            expires_at: now + r.ttl,
        };
        self.master.counters.insert(r.fence.clone(), fence);
        self.master.records.insert(r.record.clone(), rec.clone());
        self.ship(now, Write::Counter(r.fence.clone(), fence));
        self.ship(now, Write::Record(r.record.clone(), Some(rec)));
        self.history.grant(Grant {
            key: r.key.clone(),
            token: r.token.clone(),
            fence,
            client,
            at: now,
            sent: r.sent,
            ttl: r.ttl,
            min_hold: r.min_hold,
        });
        AcquireOutcome::Acquired { fence }
    }

    fn release(&mut self, r: &OwnedRelease, now: Instant) -> ReleaseOutcome {
        if let Some(retention) = r.done_retention {
            self.master.done.insert(r.done.clone(), now + retention);
            self.ship(now, Write::Done(r.done.clone(), now + retention));
        }
        let Some(rec) = self.master.live(&r.record, now) else {
            return ReleaseOutcome::NotOwner;
        };
        if rec.token != r.token {
            return ReleaseOutcome::NotOwner;
        }
        if rec.min_hold_until > now {
            rec.expires_at = rec.expires_at.min(rec.min_hold_until);
            rec.token = "released".to_owned();
            let kept = rec.clone();
            self.history.freed(&r.token, kept.expires_at);
            self.ship(now, Write::Record(r.record.clone(), Some(kept)));
            self.publish(now, &r.channel);
            return ReleaseOutcome::KeptForMinHold;
        }
        self.master.records.remove(&r.record);
        self.ship(now, Write::Record(r.record.clone(), None));
        self.history.freed(&r.token, now);
        self.publish(now, &r.channel);
        ReleaseOutcome::Released
    }

    /// A release announced, kept for min_hold or not (as the Redis script does).
    fn publish(&self, now: Instant, channel: &str) {
        for (client, hub) in self.hubs.iter().enumerate() {
            // Pub/sub is not replayed: a partitioned client misses the message.
            if now >= self.partitioned_until[client] {
                hub.notify(channel);
            }
        }
    }

    fn extend(&mut self, items: &[ExtendItem], now: Instant) -> Vec<Renewal> {
        let mut answers = Vec::with_capacity(items.len());
        for item in items {
            let renewed = match self.master.live(&item.record, now) {
                Some(rec) if rec.token == item.token => {
                    rec.expires_at = rec.expires_at.max(now + item.ttl);
                    Some(rec.clone())
                }
                _ => None,
            };
            answers.push(Renewal::from(renewed.is_some()));
            if let Some(rec) = renewed {
                self.history.renewed(&item.token, now);
                self.ship(now, Write::Record(item.record.clone(), Some(rec)));
            }
        }
        answers
    }

    fn inspect(&mut self, record: &str, now: Instant) -> Option<RecordView> {
        self.master.live(record, now).map(|r| {
            RecordView::new(
                r.owner.clone(),
                r.fence,
                Some(r.expires_at - now),
                now - r.acquired_at,
            )
        })
    }

    /// The replica becomes master with what it has received; the rest is lost. Every call
    /// fails for `takes`. Leases whose record or last renewal the replica lacked are noted:
    /// no lease survives that (the checker counts, and excuses, what follows from it).
    pub fn failover(&mut self, now: Instant, takes: Duration) {
        self.replicate(now);
        for (name, rec) in &self.master.records {
            if rec.expires_at <= now || rec.token == "released" {
                continue;
            }
            let kept = self
                .replica
                .records
                .get(name)
                .is_some_and(|r| r.token == rec.token && r.expires_at >= rec.expires_at);
            if !kept {
                self.history.failover_hit(&rec.token, now);
            }
        }
        let offset = self.draw_offset();
        self.master = std::mem::take(&mut self.replica);
        self.master.clock_offset_us = offset;
        self.replica = self.master.clone();
        self.stream.clear();
        self.unavailable_until = now + takes;
        self.history.fault(None, now, FaultKind::Failover);
    }

    fn draw_offset(&mut self) -> i64 {
        let span = u64::try_from(2 * CLOCK_BOUND_US + 1).unwrap_or(1);
        i64::try_from(self.rng.below(span)).unwrap_or(0) - CLOCK_BOUND_US
    }

    /// The master's clock steps, staying within [`CLOCK_BOUND_US`] of true time.
    pub fn clock_step(&mut self, now: Instant) {
        self.master.clock_offset_us = self.draw_offset();
        self.history.fault(None, now, FaultKind::ClockStep);
    }

    /// Replication slows to `lag` for new writes.
    pub fn set_lag(&mut self, now: Instant, lag: Duration) {
        if lag > Duration::from_millis(5) {
            self.history.fault(None, now, FaultKind::ReplicationStall);
        }
        self.lag = lag;
    }

    /// Cuts `client` off the store until `until`.
    pub fn partition(&mut self, client: usize, now: Instant, until: Instant) {
        self.partitioned_until[client] = self.partitioned_until[client].max(until);
        self.history.fault(Some(client), now, FaultKind::Partition);
    }

    /// The client's subscription comes back: its waiters are woken, as the Redis subscriber
    /// does after re-subscribing.
    pub fn heal(&mut self, client: usize) {
        self.hubs[client].notify_all();
    }

    /// A random draw from the world's generator.
    pub fn below(&mut self, n: u64) -> u64 {
        self.rng.below(n)
    }

    /// Offset of `at` from the start of the run.
    pub fn since_start(&self, at: Instant) -> Duration {
        at - self.start
    }

    fn plan(&mut self) -> Plan {
        let max = u64::try_from(self.net.max_latency.as_micros())
            .unwrap_or(1)
            .max(1);
        let there = Duration::from_micros(self.rng.below(max));
        let mut back = Duration::from_micros(self.rng.below(max));
        let roll = self.rng.below(1000);
        let mut fate = Fate::Normal;
        if roll < self.net.dropped_request {
            fate = Fate::Dropped;
        } else if roll < self.net.dropped_request + self.net.lost_reply {
            fate = Fate::LostReply;
        } else if roll < self.net.dropped_request + self.net.lost_reply + self.net.slow_reply {
            back += self.timeout;
            fate = Fate::Slow;
        } else if roll
            < self.net.dropped_request
                + self.net.lost_reply
                + self.net.slow_reply
                + self.net.sluggish_reply
        {
            let timeout_us = u64::try_from(self.timeout.as_micros()).unwrap_or(1);
            back = Duration::from_micros(self.rng.below(timeout_us * 9 / 10));
            fate = Fate::Sluggish;
        }
        Plan { there, back, fate }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fate {
    Normal,
    Sluggish,
    Slow,
    Dropped,
    LostReply,
}

struct Plan {
    there: Duration,
    back: Duration,
    fate: Fate,
}

struct OwnedAcquire {
    key: String,
    record: String,
    fence: String,
    done: String,
    token: String,
    owner: String,
    ttl: Duration,
    min_hold: Duration,
    once: bool,
    sent: Instant,
}

struct OwnedRelease {
    record: String,
    done: String,
    channel: String,
    token: String,
    done_retention: Option<Duration>,
}

/// One runtime's connection to the simulated world.
#[derive(Debug, Clone)]
pub struct SimStore {
    world: Arc<Mutex<World>>,
    client: usize,
}

impl SimStore {
    /// Client number `client` of `world`.
    pub fn new(world: Arc<Mutex<World>>, client: usize) -> Self {
        SimStore { world, client }
    }

    /// Sends `op` to the master. The request travels on its own (it lands even if the caller
    /// gives up), is applied at arrival, and the reply travels back; the caller waits at most
    /// the world's timeout.
    async fn call<T: Send + std::fmt::Debug + 'static>(
        &self,
        what: String,
        tokens: Vec<String>,
        op: impl FnOnce(&mut World, Instant) -> T + Send + 'static,
    ) -> Result<T, LockError> {
        let sent = Instant::now();
        let (plan, timeout, arrival) = {
            let mut world = lock(&self.world);
            let plan = world.plan();
            let arrival = (sent + plan.there).max(world.last_arrival[self.client]);
            world.last_arrival[self.client] = arrival;
            (plan, world.timeout, arrival)
        };
        let (tx, rx) = tokio::sync::oneshot::channel();
        let world = self.world.clone();
        let client = self.client;
        tokio::spawn(async move {
            tokio::time::sleep_until(arrival).await;
            let now = Instant::now();
            let answer = {
                let mut w = lock(&world);
                if !w.reachable(client, now) {
                    w.history
                        .call_fault(Some(client), now, FaultKind::Unreachable, tokens);
                    return;
                }
                if plan.fate == Fate::Dropped {
                    w.history
                        .call_fault(Some(client), now, FaultKind::DroppedRequest, tokens);
                    return;
                }
                w.replicate(now);
                let answer = op(&mut w, now);
                if w.history.tracing {
                    let line = format!("client {client}: {what} -> {answer:?}");
                    w.history.trace(now, line);
                }
                let kind = match plan.fate {
                    Fate::LostReply => Some(FaultKind::LostReply),
                    Fate::Slow => Some(FaultKind::SlowReply),
                    Fate::Sluggish => Some(FaultKind::Sluggish),
                    Fate::Normal | Fate::Dropped => None,
                };
                if let Some(kind) = kind {
                    w.history.call_fault(Some(client), now, kind, tokens);
                }
                if plan.fate == Fate::LostReply {
                    return;
                }
                answer
            };
            tokio::time::sleep(plan.back).await;
            let _ = tx.send(answer);
        });
        let deadline = sent + timeout;
        match tokio::time::timeout_at(deadline, rx).await {
            Ok(Ok(answer)) => Ok(answer),
            Ok(Err(_)) => {
                // No answer is coming: the client learns it at its timeout.
                tokio::time::sleep_until(deadline).await;
                Err(no_answer(timeout))
            }
            Err(_) => Err(no_answer(timeout)),
        }
    }
}

fn no_answer(timeout: Duration) -> LockError {
    LockError::Backend(BackendError::transient(format!(
        "simulated store: no answer within {timeout:?}"
    )))
}

impl LockStore for SimStore {
    async fn acquire(&self, r: AcquireRequest<'_>) -> Result<AcquireOutcome, LockError> {
        let owned = OwnedAcquire {
            key: r.names.key().to_owned(),
            record: r.names.record().to_owned(),
            fence: r.names.fence().to_owned(),
            done: r.names.done().to_owned(),
            token: r.token.to_owned(),
            owner: r.owner.to_owned(),
            ttl: r.ttl,
            min_hold: r.min_hold,
            once: r.once,
            sent: Instant::now(),
        };
        let client = self.client;
        let what = format!(
            "acquire {} {}",
            owned.key,
            &owned.token[..6.min(owned.token.len())]
        );
        let tokens = vec![owned.token.clone()];
        self.call(what, tokens, move |w, now| w.acquire(client, &owned, now))
            .await
    }

    async fn release(
        &self,
        names: &KeyNames,
        token: &str,
        done_retention: Option<Duration>,
    ) -> Result<ReleaseOutcome, LockError> {
        let owned = OwnedRelease {
            record: names.record().to_owned(),
            done: names.done().to_owned(),
            channel: names.channel().to_owned(),
            token: token.to_owned(),
            done_retention,
        };
        let what = format!(
            "release {} {}",
            owned.record,
            &owned.token[..6.min(owned.token.len())]
        );
        let tokens = vec![owned.token.clone()];
        self.call(what, tokens, move |w, now| w.release(&owned, now))
            .await
    }

    async fn extend(&self, items: &[ExtendItem]) -> Result<Vec<Renewal>, LockError> {
        let items = items.to_vec();
        let what = format!("extend {} items", items.len());
        let tokens = items.iter().map(|i| i.token.clone()).collect();
        self.call(what, tokens, move |w, now| w.extend(&items, now))
            .await
    }

    async fn inspect(&self, names: &KeyNames) -> Result<Option<RecordView>, LockError> {
        let record = names.record().to_owned();
        self.call(format!("inspect {record}"), Vec::new(), move |w, now| {
            w.inspect(&record, now)
        })
        .await
    }

    async fn watch_releases(&self, names: &KeyNames) -> Result<ReleaseWatch, LockError> {
        // Registered before the subscribe goes out, so nothing published after the server
        // has it is missed; an extra wake-up is harmless.
        let hub = lock(&self.world).hubs[self.client].clone();
        let watch = hub.subscribe(names.channel());
        self.call(
            format!("subscribe {}", names.channel()),
            Vec::new(),
            |_, _| (),
        )
        .await?;
        Ok(watch)
    }

    // The simulation checks locking under faults; operators' calls are tested on the real
    // stores (the kit's list_and_force_release, lockctl's end-to-end tests).
    async fn list(&self, _: &str, _: &str) -> Result<Vec<(String, RecordView)>, LockError> {
        Err(BackendError::new("the simulated store does not model listing").into())
    }

    async fn force_release(&self, _: &KeyNames, _: u64) -> Result<bool, LockError> {
        Err(BackendError::new("the simulated store does not model forced releases").into())
    }
}
