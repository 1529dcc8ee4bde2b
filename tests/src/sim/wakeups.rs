//! The checker's wake-up rule: a waiter subscribed to a lock's releases tries again within a
//! small bound of a release, or of its subscriber connection's return when the release came
//! while that connection was down (the announcement was lost; the runtime must not sleep out
//! the holder's ttl).

use std::collections::BTreeMap;
use std::time::Duration;

use lock_runtime::store::KeyNames;
use tokio::time::Instant;

use super::history::{Fault, FaultKind, Grant, Verdict};

/// Stretches of time, the last one possibly still open.
type Spans = Vec<(Instant, Option<Instant>)>;

/// Starts a span at `at`, unless one is open.
fn open(spans: &mut Spans, at: Instant) {
    if spans.last().is_none_or(|(_, to)| to.is_some()) {
        spans.push((at, None));
    }
}

/// Ends the open span, if any, at `at`.
fn close(spans: &mut Spans, at: Instant) {
    if let Some((_, to @ None)) = spans.last_mut() {
        *to = Some(at);
    }
}

/// One `acquire_timeout` call of a worker.
#[derive(Debug, Clone)]
struct Wait {
    client: usize,
    key: String,
    from: Instant,
    to: Instant,
}

/// What the rule reads, recorded as the run goes (deployment 0 only: the rule applies to
/// runs of one deployment, where one release frees the lock).
#[derive(Debug, Default)]
pub(super) struct Wakeups {
    waits: Vec<Wait>,
    /// Per client and channel: while the client's subscriber connection wanted it (it renews
    /// these by itself after a reconnect).
    wanted: BTreeMap<(usize, String), Spans>,
    /// Per client: its subscriber connection down, from..to.
    outages: BTreeMap<usize, Spans>,
}

impl Wakeups {
    pub(super) fn wait(&mut self, client: usize, key: &str, from: Instant, to: Instant) {
        self.waits.push(Wait {
            client,
            key: key.to_owned(),
            from,
            to,
        });
    }

    // Each record below is about one client's connection to deployment `node`; the rule reads
    // deployment 0 only, so the others are not kept.

    pub(super) fn subscribed(&mut self, client: usize, node: usize, channel: &str, at: Instant) {
        if node != 0 {
            return;
        }
        open(
            self.wanted.entry((client, channel.to_owned())).or_default(),
            at,
        );
    }

    pub(super) fn unsubscribed(&mut self, client: usize, node: usize, channel: &str, at: Instant) {
        if node != 0 {
            return;
        }
        if let Some(spans) = self.wanted.get_mut(&(client, channel.to_owned())) {
            close(spans, at);
        }
    }

    pub(super) fn outage_start(&mut self, client: usize, node: usize, at: Instant) {
        if node != 0 {
            return;
        }
        open(self.outages.entry(client).or_default(), at);
    }

    pub(super) fn outage_end(&mut self, client: usize, node: usize, at: Instant) {
        if node != 0 {
            return;
        }
        if let Some(spans) = self.outages.get_mut(&client) {
            close(spans, at);
        }
    }

    fn wanted_at(&self, client: usize, channel: &str, at: Instant) -> bool {
        self.wanted
            .get(&(client, channel.to_owned()))
            .is_some_and(|spans| {
                spans
                    .iter()
                    .any(|(from, to)| *from < at && to.is_none_or(|t| at < t))
            })
    }

    /// When the client's subscriber connection was back, if it was down at `at`.
    fn back_after(&self, client: usize, at: Instant, run_end: Instant) -> Instant {
        self.outages
            .get(&client)
            .and_then(|spans| {
                spans
                    .iter()
                    .find(|(from, to)| *from <= at && to.is_none_or(|t| at < t))
            })
            .map_or(at, |(_, to)| to.unwrap_or(run_end))
    }

    /// For each release of a lock while a waiter of another attempt was subscribed to it and
    /// waiting, someone must be granted the lock within `bound` of the release (or of the
    /// waiter's subscriber connection coming back). Excused: a fault of the waiter's instance
    /// other than its subscriber connection dropping, or a failover, within 2 s before (a
    /// waiter may be backing off after errors) up to the deadline.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn check(
        &self,
        grants: &[Grant],
        freed: &BTreeMap<(String, usize), Instant>,
        faults: &[Fault],
        run_end: Instant,
        bound: Duration,
        start: Instant,
        verdict: &mut Verdict,
    ) {
        let mut frees: BTreeMap<&str, Vec<Instant>> = BTreeMap::new();
        let mut granted: BTreeMap<&str, Vec<Instant>> = BTreeMap::new();
        for g in grants {
            granted.entry(&g.key).or_default().push(g.at);
            if let Some(at) = freed.get(&(g.token.clone(), g.node)) {
                frees.entry(&g.key).or_default().push(*at);
            }
        }
        let t = |at: Instant| format!("{:.3}s", (at - start).as_secs_f64());
        for w in &self.waits {
            let channel = KeyNames::new("lock", &w.key).channel().to_owned();
            for &r in frees.get(w.key.as_str()).map_or(&[][..], Vec::as_slice) {
                if r <= w.from || !self.wanted_at(w.client, &channel, r) {
                    continue;
                }
                let deadline = self.back_after(w.client, r, run_end) + bound;
                if deadline >= w.to || deadline >= run_end {
                    continue;
                }
                let times = granted.get(w.key.as_str()).map_or(&[][..], Vec::as_slice);
                if times.iter().any(|g| *g >= r && *g <= deadline) {
                    continue;
                }
                let since = r.checked_sub(Duration::from_secs(2)).unwrap_or(w.from);
                let excused = faults.iter().any(|f| {
                    f.at >= since
                        && f.at <= deadline
                        && match f.client {
                            None => f.kind == FaultKind::Failover,
                            Some(c) => c == w.client && f.kind != FaultKind::SubscriberDrop,
                        }
                });
                if excused {
                    *verdict
                        .excused
                        .entry(
                            "a release no waiter acted on while the waiter's instance had a fault",
                        )
                        .or_default() += 1;
                } else {
                    verdict.violations.push(format!(
                        "liveness: key {}: client {} waited from {} to {}, subscribed, and nobody took the lock released at {} by {}",
                        w.key,
                        w.client,
                        t(w.from),
                        t(w.to),
                        t(r),
                        t(deadline)
                    ));
                }
            }
        }
    }
}
