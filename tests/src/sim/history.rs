//! What a simulated run did, and the checker that reads it: exclusion, fencing, liveness.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::time::Duration;

use tokio::time::Instant;

use super::wakeups::Wakeups;

/// A fault the simulation injected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum FaultKind {
    /// A call reached a store the client could not reach (partition or failover).
    Unreachable,
    /// A request was lost on the way; it did not take effect.
    DroppedRequest,
    /// A reply was lost; the call took effect.
    LostReply,
    /// A reply came after the client's timeout; the call took effect.
    SlowReply,
    /// A reply came late but within the client's timeout.
    Sluggish,
    /// The replica was promoted, losing what it had not received.
    Failover,
    /// A client was cut off the store.
    Partition,
    /// The master's clock stepped (within the bound).
    ClockStep,
    /// Replication fell behind.
    ReplicationStall,
    /// A holder stopped for longer than its lease and acted on it afterwards.
    Pause,
    /// A runtime shut down.
    Shutdown,
    /// A client's subscriber connection dropped (it reconnects by itself). Excuses no missed
    /// wake-up once it is back: the runtime must then wake its waiters.
    SubscriberDrop,
}

/// What a store (one deployment) granted, to whom, when.
#[derive(Debug, Clone)]
pub(super) struct Grant {
    pub(super) key: String,
    pub(super) token: String,
    pub(super) fence: u64,
    pub(super) client: usize,
    /// The deployment that granted it (several grant one token under Redlock).
    pub(super) node: usize,
    pub(super) at: Instant,
    /// When the client sent the acquire.
    pub(super) sent: Instant,
    /// The ttl the client asked for.
    pub(super) ttl: Duration,
    /// How long the store keeps it unless renewed or released (the ttl, or whole seconds).
    pub(super) lease: Duration,
    /// How long the store keeps it at least (as the store counts it).
    pub(super) min_hold: Duration,
}

/// One holder's stretch of believing it holds a lock: from the moment its acquire returned
/// until it released, dropped, or saw its lease lost, whichever came first.
#[derive(Debug, Clone)]
struct Hold {
    key: String,
    token: String,
    fence: u64,
    client: usize,
    from: Instant,
    to: Option<Instant>,
    lost_at: Option<Instant>,
    /// Renewed by the watchdog with no max_hold: only a fault may end it.
    renewed: bool,
}

impl Hold {
    fn end(&self, run_end: Instant) -> Instant {
        let to = self.to.unwrap_or(run_end);
        self.lost_at.map_or(to, |l| l.min(to))
    }
}

/// One injected fault: of the store (`client` None), of a client, or of one call of a client
/// (`tokens`: the leases the call was about).
#[derive(Debug, Clone)]
pub(super) struct Fault {
    pub(super) client: Option<usize>,
    pub(super) at: Instant,
    pub(super) kind: FaultKind,
    pub(super) tokens: Vec<String>,
}

#[derive(Debug, Clone)]
struct Storage {
    fence: u64,
    token: String,
}

/// Everything the checker needs, recorded as the run goes.
#[derive(Debug)]
pub struct History {
    start: Instant,
    grants: Vec<Grant>,
    /// The grants of each token, in order (one per deployment that granted it).
    grant_of: BTreeMap<String, Vec<usize>>,
    /// When each deployment freed each token's record.
    freed: BTreeMap<(String, usize), Instant>,
    /// Leases a failover hit, per deployment: when, and when a renewal there found their
    /// record whole again.
    failover_hit: BTreeMap<(String, usize), (Instant, Option<Instant>)>,
    faults: Vec<Fault>,
    holds: Vec<Hold>,
    storage: BTreeMap<String, Storage>,
    /// Writes refused by the fenced storage although their holder believed its lease valid.
    stale_valid_writes: Vec<(String, String, Instant)>,
    /// Violations seen while running (hangs, `is_lost` going back, a fence reused).
    violations: Vec<String>,
    /// Writes the fenced storage accepted and refused.
    pub writes: (u64, u64),
    /// Record every store call (`SIM_TRACE=1`), for the story of a failing seed.
    pub tracing: bool,
    calls: Vec<(Instant, String)>,
    /// How many deployments the run has (the wake-up rule applies to one).
    deployments: usize,
    /// What the wake-up rule reads.
    pub(super) wakeups: Wakeups,
}

impl History {
    pub(super) fn new(start: Instant, deployments: usize) -> Self {
        History {
            start,
            grants: Vec::new(),
            grant_of: BTreeMap::new(),
            freed: BTreeMap::new(),
            failover_hit: BTreeMap::new(),
            faults: Vec::new(),
            holds: Vec::new(),
            storage: BTreeMap::new(),
            stale_valid_writes: Vec::new(),
            violations: Vec::new(),
            writes: (0, 0),
            tracing: std::env::var_os("SIM_TRACE").is_some(),
            calls: Vec::new(),
            deployments,
            wakeups: Wakeups::default(),
        }
    }

    /// Notes one store call (when tracing).
    pub fn trace(&mut self, at: Instant, line: String) {
        self.calls.push((at, line));
    }

    fn t(&self, at: Instant) -> String {
        format!("{:.3}s", (at - self.start).as_secs_f64())
    }

    pub(super) fn grant(&mut self, grant: Grant) {
        self.grant_of
            .entry(grant.token.clone())
            .or_default()
            .push(self.grants.len());
        self.grants.push(grant);
    }

    /// The first grant of `token` (of any deployment).
    fn first_grant(&self, token: &str) -> Option<&Grant> {
        let first = *self.grant_of.get(token)?.first()?;
        self.grants.get(first)
    }

    pub(super) fn freed(&mut self, token: &str, node: usize, at: Instant) {
        self.freed.entry((token.to_owned(), node)).or_insert(at);
    }

    pub(super) fn failover_hit(&mut self, token: &str, node: usize, at: Instant) {
        self.failover_hit
            .insert((token.to_owned(), node), (at, None));
    }

    /// A renewal of `token` on `node` succeeded: a failover's damage to its record there is
    /// repaired.
    pub(super) fn renewed(&mut self, token: &str, node: usize, at: Instant) {
        if let Some((_, healed @ None)) = self.failover_hit.get_mut(&(token.to_owned(), node)) {
            *healed = Some(at);
        }
    }

    /// True when a failover of any deployment had damaged `token`'s record at `at` (and no
    /// renewal had repaired it yet): what follows from that, no lease can survive (under
    /// Redlock, a quorum can survive it; counting it excused only makes the check weaker).
    fn failover_excuses(&self, token: &str, at: Instant) -> bool {
        self.failover_hit.iter().any(|((t, _), (hit, healed))| {
            t == token && *hit <= at && healed.is_none_or(|h| at < h)
        })
    }

    /// Notes a fault of the whole store (`client` None) or of one client.
    pub fn fault(&mut self, client: Option<usize>, at: Instant, kind: FaultKind) {
        self.call_fault(client, at, kind, Vec::new());
    }

    /// Notes a fault of one call, which carried `tokens`.
    pub fn call_fault(
        &mut self,
        client: Option<usize>,
        at: Instant,
        kind: FaultKind,
        tokens: Vec<String>,
    ) {
        self.faults.push(Fault {
            client,
            at,
            kind,
            tokens,
        });
    }

    /// A holder got its lease: returns the hold's number.
    /// `renewed`: the watchdog renews it and no max_hold ends it.
    pub fn hold(
        &mut self,
        key: &str,
        token: &str,
        fence: u64,
        client: usize,
        at: Instant,
        renewed: bool,
    ) -> usize {
        self.holds.push(Hold {
            key: key.to_owned(),
            token: token.to_owned(),
            fence,
            client,
            from: at,
            to: None,
            renewed,
            lost_at: None,
        });
        self.holds.len() - 1
    }

    /// The holder let go (release, drop, or its body was stopped).
    pub fn unhold(&mut self, hold: usize, at: Instant) {
        if let Some(h) = self.holds.get_mut(hold) {
            h.to.get_or_insert(at);
        }
    }

    /// The holder's lease was reported lost.
    pub fn lost(&mut self, hold: usize, at: Instant) {
        if let Some(h) = self.holds.get_mut(hold) {
            h.lost_at.get_or_insert(at);
        }
    }

    /// A write to the fenced storage of `key`. `believed_valid`: the writer checked
    /// `!is_lost()` at this instant. Returns whether the storage accepted it.
    pub fn write(
        &mut self,
        key: &str,
        token: &str,
        fence: u64,
        believed_valid: bool,
        at: Instant,
    ) -> bool {
        let slot = self.storage.entry(key.to_owned()).or_insert(Storage {
            fence: 0,
            token: String::new(),
        });
        let accepted = if fence > slot.fence {
            slot.fence = fence;
            slot.token = token.to_owned();
            true
        } else if fence == slot.fence {
            if slot.token == token {
                true
            } else {
                let other = slot.token.clone();
                let msg = format!(
                    "fencing: key {key}: tokens {other} and {token} both wrote with fence {fence} (at {})",
                    self.t(at)
                );
                self.violations.push(msg);
                false
            }
        } else {
            false
        };
        if accepted {
            self.writes.0 += 1;
        } else {
            self.writes.1 += 1;
            if believed_valid {
                self.stale_valid_writes
                    .push((key.to_owned(), token.to_owned(), at));
            }
        }
        accepted
    }

    /// True when the store or `client` had a fault in `[from, to]`.
    pub fn disturbed(&self, client: usize, from: Instant, to: Instant) -> bool {
        self.faults
            .iter()
            .any(|f| f.at >= from && f.at <= to && f.client.is_none_or(|c| c == client))
    }

    /// A violation seen while running.
    pub fn violation(&mut self, what: String) {
        self.violations.push(what);
    }

    /// A digest of what the store granted and the holders did, in order: equal for two runs
    /// of one seed exactly when they went the same way.
    pub fn fingerprint(&self) -> u64 {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        for g in &self.grants {
            (&g.key, g.fence, g.client, g.node, g.at - self.start).hash(&mut h);
        }
        for x in &self.holds {
            (
                &x.key,
                x.fence,
                x.from - self.start,
                x.to.map(|t| t - self.start),
            )
                .hash(&mut h);
        }
        self.faults.len().hash(&mut h);
        h.finish()
    }

    /// Number of leases handed to callers.
    pub fn acquisitions(&self) -> usize {
        self.holds.len()
    }

    /// Reads the history. `orphan_bound`: how soon a grant its caller never got must be given
    /// back when the client can reach the store.
    pub fn check(&self, run_end: Instant, orphan_bound: Duration) -> Verdict {
        let mut verdict = Verdict {
            violations: self.violations.clone(),
            ..Verdict::default()
        };
        for f in &self.faults {
            *verdict.faults.entry(f.kind).or_default() += 1;
        }
        self.check_exclusion(run_end, &mut verdict);
        self.check_fences(&mut verdict);
        self.check_orphans(run_end, orphan_bound, &mut verdict);
        self.check_losses(&mut verdict);
        if self.deployments == 1 {
            self.wakeups.check(
                &self.grants,
                &self.freed,
                &self.faults,
                run_end,
                orphan_bound,
                self.start,
                &mut verdict,
            );
        }
        verdict
    }

    /// A renewed lease is lost only for a cause: a fault of its client or of the store after
    /// it was handed out, or an acquire answered too late to leave time for a renewal.
    fn check_losses(&self, verdict: &mut Verdict) {
        for h in &self.holds {
            let Some(lost_at) = h.lost_at else { continue };
            if !h.renewed || h.to.is_some_and(|to| to <= lost_at) {
                continue;
            }
            let Some(g) = self.first_grant(&h.token) else {
                continue;
            };
            // Validity as the runtime counts it: from the send, less the drift margin.
            let valid_until = g.sent + g.ttl - (g.ttl / 100 + Duration::from_millis(2));
            if valid_until < h.from + g.ttl / 4 {
                continue; // answered too late for a renewal to make it in time
            }
            // What can end a renewed lease: a failover, its instance cut off, paused or shut
            // down, or a fault of a call about this very lease (its renewal), except the
            // acquire's own sluggish reply, whose cost the test above has weighed.
            let disturbed = self.faults.iter().any(|f| {
                let about_it = f.tokens.contains(&h.token);
                f.at <= lost_at
                    && (f.at > g.at || (about_it && f.kind != FaultKind::Sluggish))
                    && match f.client {
                        None => f.kind == FaultKind::Failover,
                        Some(c) => {
                            c == h.client
                                && (about_it
                                    || matches!(
                                        f.kind,
                                        FaultKind::Partition
                                            | FaultKind::Pause
                                            | FaultKind::Shutdown
                                    ))
                        }
                    }
            });
            if !disturbed {
                verdict.violations.push(format!(
                    "liveness: key {}: client {} lost a renewed lease (fence {}) at {} with no fault since its grant at {}",
                    h.key,
                    h.client,
                    h.fence,
                    self.t(lost_at),
                    self.t(g.at)
                ));
            }
        }
    }

    fn check_exclusion(&self, run_end: Instant, verdict: &mut Verdict) {
        let mut by_key: BTreeMap<&str, Vec<&Hold>> = BTreeMap::new();
        for h in &self.holds {
            by_key.entry(&h.key).or_default().push(h);
        }
        for (key, mut holds) in by_key {
            holds.sort_by_key(|h| h.from);
            let mut active: Vec<&Hold> = Vec::new();
            for h in holds {
                active.retain(|a| a.end(run_end) > h.from);
                for a in &active {
                    if a.token == h.token || h.end(run_end) <= h.from {
                        continue;
                    }
                    // The older grant is the one a failover can have lost, and the newer
                    // one must have come while its record was damaged.
                    let (older, newer) = if a.fence < h.fence { (*a, h) } else { (h, *a) };
                    let newer_granted = self.first_grant(&newer.token).map_or(newer.from, |g| g.at);
                    if self.failover_excuses(&older.token, newer_granted) {
                        *verdict
                            .excused
                            .entry("overlap after a failover lost the record or its renewal")
                            .or_default() += 1;
                    } else {
                        verdict.violations.push(format!(
                            "exclusion: key {key}: client {} (fence {}) believed it held the lock from {} to {}, and client {} (fence {}) from {}",
                            a.client,
                            a.fence,
                            self.t(a.from),
                            self.t(a.end(run_end)),
                            h.client,
                            h.fence,
                            self.t(h.from),
                        ));
                    }
                }
                if h.end(run_end) > h.from {
                    active.push(h);
                }
            }
        }
        for (key, token, at) in &self.stale_valid_writes {
            if self.failover_excuses(token, *at) {
                *verdict
                    .excused
                    .entry("write refused by the fence after a failover")
                    .or_default() += 1;
            } else {
                verdict.violations.push(format!(
                    "exclusion: key {key}: token {token} believed its lease valid at {} but a newer fence had written",
                    self.t(*at)
                ));
            }
        }
    }

    /// Each deployment's fences of a key strictly increase, and every lease carries the fence
    /// of a grant of its token (under Redlock, the largest of its quorum's).
    fn check_fences(&self, verdict: &mut Verdict) {
        let mut last: BTreeMap<(&str, usize), u64> = BTreeMap::new();
        for g in &self.grants {
            let previous = last.insert((&g.key, g.node), g.fence);
            if let Some(p) = previous
                && g.fence <= p
            {
                verdict.violations.push(format!(
                    "fencing: key {}: fence {} granted at {} after fence {p}",
                    g.key,
                    g.fence,
                    self.t(g.at)
                ));
            }
        }
        for h in &self.holds {
            let grants = self.grant_of.get(&h.token).map_or(&[][..], Vec::as_slice);
            let carried = grants
                .iter()
                .map(|&i| &self.grants[i])
                .find(|g| g.fence == h.fence && g.key == h.key);
            match (carried, self.first_grant(&h.token)) {
                (Some(_), _) => {}
                (None, Some(g)) => verdict.violations.push(format!(
                    "fencing: the runtime reported fence {} on {} for a grant of fence {} on {}",
                    h.fence, h.key, g.fence, g.key
                )),
                (None, None) => verdict.violations.push(format!(
                    "exclusion: key {}: a lease (fence {}) was handed out that the store never granted",
                    h.key, h.fence
                )),
            }
        }
    }

    fn check_orphans(&self, run_end: Instant, bound: Duration, verdict: &mut Verdict) {
        let handed: BTreeSet<&str> = self.holds.iter().map(|h| h.token.as_str()).collect();
        for g in &self.grants {
            if handed.contains(g.token.as_str()) {
                continue;
            }
            let gone = self
                .freed
                .get(&(g.token.clone(), g.node))
                .copied()
                .unwrap_or(g.at + g.lease)
                .min(run_end);
            // A release that lands in time still keeps the record for its min_hold.
            if gone <= g.at + bound.max(g.min_hold) {
                continue;
            }
            // Only what kept the give-back from landing: a failover, the instance cut off,
            // or the release of this very token lost on the way.
            let excused = self.faults.iter().any(|f| {
                f.at >= g.at
                    && f.at <= g.at + bound
                    && match f.client {
                        None => f.kind == FaultKind::Failover,
                        Some(c) => {
                            c == g.client
                                && (matches!(f.kind, FaultKind::Partition | FaultKind::Pause)
                                    || (f.tokens.contains(&g.token)
                                        && matches!(
                                            f.kind,
                                            FaultKind::Unreachable | FaultKind::DroppedRequest
                                        )))
                        }
                    }
            });
            if excused {
                *verdict
                    .excused
                    .entry("a grant nobody got outlived its bound while its client could not reach the store")
                    .or_default() += 1;
            } else {
                verdict.violations.push(format!(
                    "liveness: key {}: client {} was granted fence {} at {} by deployment {} but never got it, and the lock stayed taken there until {}",
                    g.key,
                    g.client,
                    g.fence,
                    self.t(g.at),
                    g.node,
                    self.t(gone)
                ));
            }
        }
    }

    /// The story of `key` around the first instant a violation names (or its end), for a
    /// failure report: grants, holds, and the faults of the store and of its clients.
    pub fn story(&self, violation: &str, limit: usize) -> String {
        let key = violation
            .split("key ")
            .nth(1)
            .and_then(|rest| rest.split(':').next())
            .unwrap_or("");
        let around = violation
            .split(" at ")
            .nth(1)
            .or_else(|| violation.split(" from ").nth(1))
            .and_then(|rest| rest.split('s').next())
            .and_then(|secs| secs.parse::<f64>().ok())
            .map(|secs| self.start + Duration::from_secs_f64(secs));
        let mut lines: Vec<(Instant, String)> = Vec::new();
        for g in self.grants.iter().filter(|g| g.key == key) {
            lines.push((
                g.at,
                format!(
                    "deployment {} grants fence {} to client {} (ttl {:?})",
                    g.node, g.fence, g.client, g.ttl
                ),
            ));
            if let Some(at) = self.freed.get(&(g.token.clone(), g.node)) {
                lines.push((
                    *at,
                    format!("deployment {} frees fence {}", g.node, g.fence),
                ));
            }
        }
        for h in self.holds.iter().filter(|h| h.key == key) {
            lines.push((
                h.from,
                format!("client {} holds fence {}", h.client, h.fence),
            ));
            if let Some(at) = h.lost_at {
                lines.push((
                    at,
                    format!("client {} sees fence {} lost", h.client, h.fence),
                ));
            }
            if let Some(at) = h.to {
                lines.push((
                    at,
                    format!("client {} lets go of fence {}", h.client, h.fence),
                ));
            }
        }
        for f in &self.faults {
            let who = f
                .client
                .map_or("store".to_owned(), |c| format!("client {c}"));
            lines.push((f.at, format!("fault: {:?} ({who})", f.kind)));
        }
        for (at, line) in &self.calls {
            lines.push((*at, line.clone()));
        }
        lines.sort_by_key(|(at, _)| *at);
        if let Some(around) = around {
            let window = Duration::from_millis(500);
            lines.retain(|(at, _)| *at + window >= around && *at <= around + 3 * window);
        }
        let mut out = String::new();
        for (at, line) in lines.into_iter().take(limit) {
            let _ = writeln!(out, "  {} {line}", self.t(at));
        }
        out
    }
}

/// What the checker concluded about one run.
#[derive(Debug, Default)]
pub struct Verdict {
    /// Broken promises; empty when the run is clean.
    pub violations: Vec<String>,
    /// Overlaps and delays caused by faults no lease can survive, by cause.
    pub excused: BTreeMap<&'static str, u64>,
    /// Faults injected, by kind.
    pub faults: BTreeMap<FaultKind, u64>,
}
