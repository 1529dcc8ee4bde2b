//! The simulated store: deployments of one master with an asynchronously replicated replica
//! (one, or several as the members of a Redlock quorum), failovers that drop what the replica
//! had not received, and a network that delays, drops and loses.
//!
//! Every decision comes from the world's seeded generator, drawn in the order calls arrive,
//! so one seed replays the same run on a current-thread runtime with paused time.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use lock_runtime::__private::{LeaseStep, lease_secs, lease_step};
use lock_runtime::store::{AcquireOutcome, ExtendItem, RecordView, ReleaseOutcome, Renewal};
use tokio::time::Instant;

use super::history::{FaultKind, Grant, History};
use super::pubsub::SubLine;
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

/// How the simulated store counts a lease's time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Leases {
    /// As on Redis and PostgreSQL: a record lives exactly its ttl, and a renewal makes it last
    /// at least the asked ttl from its arrival.
    Exact,
    /// As on etcd: a record is on a lease of whole seconds, rounded up; a renewal keeps the
    /// lease alive to the ttl it was granted, leaves it alone, or moves the record onto a new
    /// lease, as the etcd store's own rule (`lease_step`) decides from the time left rounded
    /// down, which is all etcd tells.
    WholeSeconds,
}

impl Leases {
    /// How long the store keeps a record asked to live `ttl`.
    fn length(self, ttl: Duration) -> Duration {
        match self {
            Leases::Exact => ttl,
            Leases::WholeSeconds => {
                Duration::from_secs(u64::try_from(lease_secs(ttl)).unwrap_or(u64::MAX))
            }
        }
    }
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
    /// The ttl its lease was granted (whole seconds on etcd).
    lease: Duration,
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

/// One master and its replica.
#[derive(Debug)]
struct Deployment {
    master: Node,
    replica: Node,
    /// Writes the replica has not applied yet, each with the instant it will.
    stream: VecDeque<(Instant, Write)>,
    /// Replication delay of new writes.
    lag: Duration,
    /// A failover is under way until then: every call fails.
    unavailable_until: Instant,
}

impl Deployment {
    fn new(now: Instant) -> Self {
        Deployment {
            master: Node::default(),
            replica: Node::default(),
            stream: VecDeque::new(),
            lag: Duration::from_millis(1),
            unavailable_until: now,
        }
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
}

/// The whole simulated system: servers, network, and the history the checker reads.
#[derive(Debug)]
pub struct World {
    rng: XorShift,
    nodes: Vec<Deployment>,
    pub(super) partitioned_until: Vec<Instant>,
    /// Per client: its process has ended (after its `shutdown()` returned, as a service's
    /// `main` does): it sends nothing any more; what it sent before still arrives.
    pub(super) ended: Vec<bool>,
    /// When the last request of each client to each deployment arrives: one connection per
    /// client and deployment, so requests arrive in the order they were sent (as on a Redis
    /// connection).
    pub(super) last_arrival: Vec<Vec<Instant>>,
    /// Per client, per deployment: the client's subscriber connection there.
    pub(super) subs: Vec<Vec<SubLine>>,
    net: NetFaults,
    leases: Leases,
    /// The client-side timeout of one call.
    pub timeout: Duration,
    start: Instant,
    base_us: u64,
    /// What happened, for the checker.
    pub history: History,
}

pub(super) fn lock(world: &Mutex<World>) -> MutexGuard<'_, World> {
    world.lock().unwrap_or_else(PoisonError::into_inner)
}

impl World {
    /// A world of `clients` runtimes and `nodes` deployments, every decision drawn from
    /// `seed`.
    pub fn new(
        seed: u64,
        clients: usize,
        nodes: usize,
        net: NetFaults,
        leases: Leases,
        timeout: Duration,
    ) -> Self {
        let now = Instant::now();
        World {
            rng: XorShift::mixed(seed ^ 0x5eed_5eed),
            nodes: (0..nodes).map(|_| Deployment::new(now)).collect(),
            partitioned_until: vec![now; clients],
            ended: vec![false; clients],
            last_arrival: vec![vec![now; nodes]; clients],
            subs: (0..clients)
                .map(|_| (0..nodes).map(|_| SubLine::default()).collect())
                .collect(),
            net,
            leases,
            timeout,
            start: now,
            // A fixed wall clock, so fences replay too.
            base_us: 1_800_000_000_000_000,
            history: History::new(now, nodes),
        }
    }

    /// How many deployments there are.
    pub fn nodes(&self) -> usize {
        self.nodes.len()
    }

    fn node_time_us(&self, node: usize, now: Instant) -> u64 {
        let elapsed = i64::try_from((now - self.start).as_micros()).unwrap_or(i64::MAX / 4);
        let base = i64::try_from(self.base_us).unwrap_or(i64::MAX / 4);
        u64::try_from(base + elapsed + self.nodes[node].master.clock_offset_us).unwrap_or(0)
    }

    /// Brings deployment `node`'s replica up to `now`.
    pub(super) fn replicate(&mut self, node: usize, now: Instant) {
        self.nodes[node].replicate(now);
    }

    pub(super) fn reachable(&self, client: usize, node: usize, now: Instant) -> bool {
        now >= self.nodes[node].unavailable_until && now >= self.partitioned_until[client]
    }

    pub(super) fn acquire(
        &mut self,
        client: usize,
        node: usize,
        r: &OwnedAcquire,
        now: Instant,
    ) -> AcquireOutcome {
        let clock_us = self.node_time_us(node, now);
        let d = &mut self.nodes[node];
        if r.once
            && let Some(until) = d.master.done.get(&r.done).copied()
            && until > now
        {
            return AcquireOutcome::Done {
                pttl: Some(until - now),
            };
        }
        if let Some(held) = d.master.live(&r.record, now) {
            return AcquireOutcome::Held {
                pttl: Some(held.expires_at - now),
            };
        }
        let counter = d.master.counters.get(&r.fence).copied().unwrap_or(0);
        let fence = (counter + 1).max(clock_us);
        let lease = self.leases.length(r.ttl);
        let min_hold = if r.min_hold.is_zero() {
            Duration::ZERO
        } else {
            self.leases.length(r.min_hold)
        };
        let rec = Rec {
            token: r.token.clone(),
            owner: r.owner.clone(),
            fence,
            acquired_at: now,
            min_hold_until: now + min_hold,
            expires_at: now + lease,
            lease,
        };
        d.master.counters.insert(r.fence.clone(), fence);
        d.master.records.insert(r.record.clone(), rec.clone());
        d.ship(now, Write::Counter(r.fence.clone(), fence));
        d.ship(now, Write::Record(r.record.clone(), Some(rec)));
        self.history.grant(Grant {
            key: r.key.clone(),
            token: r.token.clone(),
            fence,
            client,
            node,
            at: now,
            sent: r.sent,
            ttl: r.ttl,
            lease,
            min_hold,
        });
        AcquireOutcome::Acquired { fence }
    }

    pub(super) fn release(
        &mut self,
        node: usize,
        r: &OwnedRelease,
        now: Instant,
    ) -> ReleaseOutcome {
        let retention = r.done_retention.map(|t| self.leases.length(t));
        let d = &mut self.nodes[node];
        if let Some(retention) = retention {
            d.master.done.insert(r.done.clone(), now + retention);
            d.ship(now, Write::Done(r.done.clone(), now + retention));
        }
        let Some(rec) = d.master.live(&r.record, now) else {
            return ReleaseOutcome::NotOwner;
        };
        if rec.token != r.token {
            return ReleaseOutcome::NotOwner;
        }
        if rec.min_hold_until > now {
            rec.expires_at = rec.expires_at.min(rec.min_hold_until);
            rec.token = "released".to_owned();
            let kept = rec.clone();
            d.ship(now, Write::Record(r.record.clone(), Some(kept.clone())));
            self.history.freed(&r.token, node, kept.expires_at);
            self.publish(node, now, &r.channel);
            return ReleaseOutcome::KeptForMinHold;
        }
        d.master.records.remove(&r.record);
        d.ship(now, Write::Record(r.record.clone(), None));
        self.history.freed(&r.token, node, now);
        self.publish(node, now, &r.channel);
        ReleaseOutcome::Released
    }

    pub(super) fn extend(
        &mut self,
        node: usize,
        items: &[ExtendItem],
        now: Instant,
    ) -> Vec<Renewal> {
        let leases = self.leases;
        let d = &mut self.nodes[node];
        let mut answers = Vec::with_capacity(items.len());
        for item in items {
            let renewed = match d.master.live(&item.record, now) {
                Some(rec) if rec.token == item.token => {
                    match leases {
                        Leases::Exact => rec.expires_at = rec.expires_at.max(now + item.ttl),
                        Leases::WholeSeconds => renew_lease(rec, item.ttl, now),
                    }
                    Some(rec.clone())
                }
                _ => None,
            };
            answers.push(Renewal::from(renewed.is_some()));
            if let Some(rec) = renewed {
                self.history.renewed(&item.token, node, now);
                d.ship(now, Write::Record(item.record.clone(), Some(rec)));
            }
        }
        answers
    }

    /// Redlock's fence lift on one member (as `raise_fence.lua` does on Redis).
    pub(super) fn raise_fence(
        &mut self,
        node: usize,
        record: &str,
        counter: &str,
        token: &str,
        fence: u64,
        now: Instant,
    ) -> bool {
        let d = &mut self.nodes[node];
        if d.master.counters.get(counter).is_none_or(|c| *c < fence) {
            d.master.counters.insert(counter.to_owned(), fence);
            d.ship(now, Write::Counter(counter.to_owned(), fence));
        }
        let stamped = match d.master.live(record, now) {
            Some(rec) if rec.token == token => {
                rec.fence = fence;
                Some(rec.clone())
            }
            _ => None,
        };
        match stamped {
            Some(rec) => {
                d.ship(now, Write::Record(record.to_owned(), Some(rec)));
                true
            }
            None => false,
        }
    }

    pub(super) fn inspect(
        &mut self,
        node: usize,
        record: &str,
        now: Instant,
    ) -> Option<RecordView> {
        self.nodes[node].master.live(record, now).map(|r| {
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
    pub fn failover(&mut self, node: usize, now: Instant, takes: Duration) {
        let offset = self.draw_offset();
        let d = &mut self.nodes[node];
        d.replicate(now);
        for (name, rec) in &d.master.records {
            if rec.expires_at <= now || rec.token == "released" {
                continue;
            }
            let kept = d
                .replica
                .records
                .get(name)
                .is_some_and(|r| r.token == rec.token && r.expires_at >= rec.expires_at);
            if !kept {
                self.history.failover_hit(&rec.token, node, now);
            }
        }
        d.master = std::mem::take(&mut d.replica);
        d.master.clock_offset_us = offset;
        d.replica = d.master.clone();
        d.stream.clear();
        d.unavailable_until = now + takes;
        self.history.fault(None, now, FaultKind::Failover);
    }

    fn draw_offset(&mut self) -> i64 {
        let span = u64::try_from(2 * CLOCK_BOUND_US + 1).unwrap_or(1);
        i64::try_from(self.rng.below(span)).unwrap_or(0) - CLOCK_BOUND_US
    }

    /// The master's clock steps, staying within [`CLOCK_BOUND_US`] of true time.
    pub fn clock_step(&mut self, node: usize, now: Instant) {
        self.nodes[node].master.clock_offset_us = self.draw_offset();
        self.history.fault(None, now, FaultKind::ClockStep);
    }

    /// Replication slows to `lag` for new writes.
    pub fn set_lag(&mut self, node: usize, now: Instant, lag: Duration) {
        if lag > Duration::from_millis(5) {
            self.history.fault(None, now, FaultKind::ReplicationStall);
        }
        self.nodes[node].lag = lag;
    }

    /// Cuts `client` off the store until `until`.
    /// Its subscriber connections drop too, until [`heal`](Self::heal).
    pub fn partition(&mut self, client: usize, now: Instant, until: Instant) {
        self.partitioned_until[client] = self.partitioned_until[client].max(until);
        self.history.fault(Some(client), now, FaultKind::Partition);
        for node in 0..self.nodes.len() {
            self.drop_line(client, node, now);
        }
    }

    /// The client's cut is over (unless a longer one still runs): its subscriber connections
    /// come back and renew their subscriptions.
    pub fn heal(&mut self, client: usize, now: Instant) {
        for node in 0..self.nodes.len() {
            self.reconnect_subscriber(client, node, now);
        }
    }

    /// `client`'s process ends: from now on it sends nothing (its runtime's tasks still run,
    /// but no call of theirs leaves the machine).
    pub fn end_process(&mut self, client: usize) {
        self.ended[client] = true;
    }

    /// A random draw from the world's generator.
    pub fn below(&mut self, n: u64) -> u64 {
        self.rng.below(n)
    }

    /// Offset of `at` from the start of the run.
    pub fn since_start(&self, at: Instant) -> Duration {
        at - self.start
    }

    pub(super) fn plan(&mut self) -> Plan {
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

/// One renewal of a live record on etcd: what the etcd store decides from what etcd would
/// answer (the time left rounded down to whole seconds, the ttl the lease was granted).
fn renew_lease(rec: &mut Rec, asked: Duration, now: Instant) {
    let left = i64::try_from((rec.expires_at - now).as_secs()).unwrap_or(i64::MAX);
    let granted = lease_secs(rec.lease);
    match lease_step(asked, lease_secs(asked), left, granted) {
        // A live record's lease is not gone; a time left of more than asked needs nothing.
        LeaseStep::Gone | LeaseStep::LeaveAlone => {}
        LeaseStep::KeepAlive => rec.expires_at = now + rec.lease,
        LeaseStep::MoveTo(ttl) => {
            rec.lease = Leases::WholeSeconds.length(ttl);
            rec.expires_at = now + rec.lease;
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Fate {
    Normal,
    Sluggish,
    Slow,
    Dropped,
    LostReply,
}

pub(super) struct Plan {
    pub(super) there: Duration,
    pub(super) back: Duration,
    pub(super) fate: Fate,
}

pub(super) struct OwnedAcquire {
    pub(super) key: String,
    pub(super) record: String,
    pub(super) fence: String,
    pub(super) done: String,
    pub(super) token: String,
    pub(super) owner: String,
    pub(super) ttl: Duration,
    pub(super) min_hold: Duration,
    pub(super) once: bool,
    pub(super) sent: Instant,
}

pub(super) struct OwnedRelease {
    pub(super) record: String,
    pub(super) done: String,
    pub(super) channel: String,
    pub(super) token: String,
    pub(super) done_retention: Option<Duration>,
}
