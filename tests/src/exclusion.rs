//! The real-process exclusion checker. Holder processes log, per lease, when they were granted
//! it, every instant they checked it was still valid before acting (a write), and the last such
//! instant before they let go; all stamped with the system-wide monotonic clock, so stamps from
//! different processes on one machine compare. The test that drives them logs the faults it
//! injected on the same clock. [`check`] then asserts that no two holders of a key believed
//! their leases valid at the same instant, except across a fault that no lease can survive,
//! counted by cause.
//!
//! Stamps are taken on the safe side of each event: a grant is stamped after the acquire
//! returned (the server granted it earlier), a validity check before `is_lost()` is asked (the
//! answer holds at a later instant). So an overlap the checker reports really happened.
//!
//! Log lines, one per event (`<key>` has no spaces):
//! - `G <key> <fence> <token> <t>`: the lease was granted;
//! - `W <key> <token> <t>`: a validity check passed at `t`, and a write under the fence follows;
//! - `R <key> <token> <1|0|e>`: that write was accepted, refused as stale, or failed;
//! - `E <key> <token> <t>`: the holder let go; `t` is its last passing validity check.

use std::collections::{BTreeMap, HashMap};
use std::io::Write as _;
use std::path::Path;
use std::sync::Mutex;

/// `CLOCK_MONOTONIC` in microseconds: one clock for every process on the machine (what
/// `std::time::Instant` reads on Linux, which the runtime's `is_lost()` compares against).
pub fn monotonic_us() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    t.tv_sec as u64 * 1_000_000 + t.tv_nsec as u64 / 1_000
}

/// An append-only event log a holder process writes, one `write` call per line, so a process
/// killed with SIGKILL loses at most the line it was writing.
#[derive(Debug)]
pub struct EventLog(Mutex<std::fs::File>);

impl EventLog {
    /// Creates (or appends to) the log at `path`.
    pub fn open(path: &Path) -> std::io::Result<Self> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)?;
        Ok(EventLog(Mutex::new(file)))
    }

    /// Appends one event line.
    pub fn line(&self, line: std::fmt::Arguments<'_>) {
        let text = format!("{line}\n");
        if let Ok(mut file) = self.0.lock() {
            // A log that cannot be written fails the run's checks (the holdings go missing
            // and the counter's accepted writes no longer match), so an error is not lost.
            let _ = file.write_all(text.as_bytes());
        }
    }
}

/// One lease as its holder saw it.
#[derive(Debug, Clone)]
pub struct Holding {
    /// The holder's process id.
    pub pid: u32,
    /// The lock key.
    pub key: String,
    /// The lease's token.
    pub token: String,
    /// The lease's fence.
    pub fence: u64,
    /// When the grant was known (after the acquire returned).
    pub start_us: u64,
    /// The last instant the holder knew the lease valid: its `E` line, or for a holder killed
    /// before it let go, its last logged check (or the grant).
    pub end_us: u64,
    /// The writes it made: when it checked validity before each, and what the store answered
    /// (`None`: unknown, the process died or the call failed).
    pub writes: Vec<(u64, Option<bool>)>,
}

/// A fault the driving test injected that a lease cannot survive, on the monotonic clock.
#[derive(Debug, Clone, Copy)]
pub enum Excuse {
    /// The holder process `pid` was stopped (SIGSTOP) from `from_us` to `to_us`.
    Pause {
        /// The stopped process.
        pid: u32,
        /// When it was stopped.
        from_us: u64,
        /// When it was continued.
        to_us: u64,
    },
    /// A failover at `at_us` that may have lost acknowledged writes (no `replicated_acquire`).
    LostWrites {
        /// When the old master died.
        at_us: u64,
    },
}

/// Parses the event log of the holder process `pid`.
pub fn read_log(path: &Path, pid: u32) -> std::io::Result<Vec<Holding>> {
    let text = std::fs::read_to_string(path)?;
    let mut by_token: HashMap<String, Holding> = HashMap::new();
    let mut order = Vec::new();
    for line in text.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        match fields.as_slice() {
            ["G", key, fence, token, t] => {
                let (Ok(fence), Ok(t)) = (fence.parse(), t.parse()) else {
                    continue;
                };
                order.push(token.to_string());
                by_token.insert(
                    token.to_string(),
                    Holding {
                        pid,
                        key: key.to_string(),
                        token: token.to_string(),
                        fence,
                        start_us: t,
                        end_us: t,
                        writes: Vec::new(),
                    },
                );
            }
            ["W", _, token, t] => {
                if let (Some(h), Ok(t)) = (by_token.get_mut(*token), t.parse::<u64>()) {
                    h.writes.push((t, None));
                    h.end_us = h.end_us.max(t);
                }
            }
            ["R", _, token, outcome] => {
                if let Some(last) = by_token.get_mut(*token).and_then(|h| h.writes.last_mut()) {
                    last.1 = match *outcome {
                        "1" => Some(true),
                        "0" => Some(false),
                        _ => None,
                    };
                }
            }
            ["E", _, token, t] => {
                if let (Some(h), Ok(t)) = (by_token.get_mut(*token), t.parse::<u64>()) {
                    h.end_us = h.end_us.max(t);
                }
            }
            // A torn last line of a killed process.
            _ => {}
        }
    }
    Ok(order
        .into_iter()
        .filter_map(|token| by_token.remove(&token))
        .collect())
}

/// What [`check`] found.
#[derive(Debug, Default)]
pub struct Report {
    /// Leases checked.
    pub holdings: usize,
    /// Overlapping valid intervals explained by an injected fault, by cause.
    pub excused: BTreeMap<&'static str, usize>,
    /// Writes made after a newer lease of the key had been granted (a superseded holder
    /// acting), and how many of those the store accepted.
    pub superseded_writes: usize,
    /// Of [`superseded_writes`](Self::superseded_writes), the ones the store accepted.
    pub superseded_accepted: usize,
    /// Overlaps no injected fault explains, described.
    pub violations: Vec<String>,
}

/// Checks exclusion: for every key, no two leases' valid intervals overlap unless the earlier
/// holder was paused, or a failover that may lose writes happened, inside its interval.
pub fn check(holdings: &[Holding], excuses: &[Excuse]) -> Report {
    let mut report = Report {
        holdings: holdings.len(),
        ..Report::default()
    };
    let mut by_key: BTreeMap<&str, Vec<&Holding>> = BTreeMap::new();
    for h in holdings {
        by_key.entry(h.key.as_str()).or_default().push(h);
    }
    for leases in by_key.values_mut() {
        leases.sort_by_key(|h| (h.start_us, h.fence));
        for (i, a) in leases.iter().enumerate() {
            for b in &leases[i + 1..] {
                if b.start_us >= a.end_us {
                    // Sorted by start: no later lease starts inside `a` either.
                    break;
                }
                if a.token == b.token {
                    continue;
                }
                // `a` still believed valid after `b` was granted.
                let stale: Vec<_> = a.writes.iter().filter(|w| w.0 > b.start_us).collect();
                report.superseded_writes += stale.len();
                report.superseded_accepted += stale.iter().filter(|w| w.1 == Some(true)).count();
                match excuse_for(a, excuses) {
                    Some(cause) => *report.excused.entry(cause).or_default() += 1,
                    None => report.violations.push(format!(
                        "key {}: pid {} (fence {}, valid {}..{} us) and pid {} (fence {}, \
                         granted at {} us) overlap by {} us",
                        a.key,
                        a.pid,
                        a.fence,
                        a.start_us,
                        a.end_us,
                        b.pid,
                        b.fence,
                        b.start_us,
                        a.end_us - b.start_us
                    )),
                }
            }
        }
    }
    report
}

fn excuse_for(a: &Holding, excuses: &[Excuse]) -> Option<&'static str> {
    let inside = |t: u64| a.start_us <= t && t <= a.end_us;
    excuses.iter().find_map(|e| match *e {
        Excuse::Pause {
            pid,
            from_us,
            to_us,
        } if pid == a.pid && from_us <= a.end_us && a.start_us <= to_us => {
            Some("holder paused (SIGSTOP)")
        }
        Excuse::LostWrites { at_us } if inside(at_us) => {
            Some("failover without replicated_acquire")
        }
        _ => None,
    })
}

/// Counts pairs of leases of one key granted one after the other (the first holder's last
/// valid instant before the second grant was known) whose fences do not increase. A late
/// grant stamp can make a lease look later than it was: the holder paused before stamping,
/// or its record lost in a failover while its reply was under way; those pairs are left out.
pub fn fence_order_violations(holdings: &[Holding], excuses: &[Excuse]) -> usize {
    const SLACK_US: u64 = 1_000_000;
    let mut by_key: BTreeMap<&str, Vec<&Holding>> = BTreeMap::new();
    for h in holdings {
        by_key.entry(h.key.as_str()).or_default().push(h);
    }
    let late_stamp = |a: &Holding, b: &Holding| {
        excuses.iter().any(|e| match *e {
            Excuse::Pause { pid, from_us, .. } => {
                pid == b.pid && from_us <= b.start_us && b.start_us <= from_us + SLACK_US * 2
            }
            Excuse::LostWrites { at_us } => {
                a.start_us.saturating_sub(SLACK_US) <= at_us && at_us <= b.start_us
            }
        })
    };
    let mut violations = 0;
    for leases in by_key.values_mut() {
        leases.sort_by_key(|h| h.start_us);
        let mut by_end = leases.clone();
        by_end.sort_by_key(|h| h.end_us);
        // The highest fence of the leases that ended before the current grant: when it is
        // below the grant's fence, no pair with this grant can break the order.
        let (mut ended, mut top) = (0, 0);
        for (i, b) in leases.iter().enumerate() {
            while ended < by_end.len() && by_end[ended].end_us <= b.start_us {
                top = top.max(by_end[ended].fence);
                ended += 1;
            }
            if top < b.fence {
                continue;
            }
            violations += leases[..i]
                .iter()
                .filter(|a| a.end_us <= b.start_us && a.fence >= b.fence && !late_stamp(a, b))
                .count();
        }
    }
    violations
}

#[cfg(test)]
mod tests {
    use super::*;

    fn holding(pid: u32, token: &str, fence: u64, start: u64, end: u64) -> Holding {
        Holding {
            pid,
            key: "k".into(),
            token: token.into(),
            fence,
            start_us: start,
            end_us: end,
            writes: vec![(end, Some(true))],
        }
    }

    /// The checker must be able to fail: an overlap with no fault behind it is a violation,
    /// the same overlap across a pause of the earlier holder is excused and counted.
    #[test]
    fn an_unexplained_overlap_is_a_violation() {
        let a = holding(1, "a", 1, 0, 1_000);
        let b = holding(2, "b", 2, 900, 2_000);
        let c = holding(3, "c", 3, 2_000, 3_000);
        let report = check(&[a.clone(), b.clone(), c.clone()], &[]);
        assert_eq!(report.violations.len(), 1, "{report:?}");
        assert_eq!(report.superseded_writes, 1);
        assert_eq!(report.superseded_accepted, 1);
        let paused = [Excuse::Pause {
            pid: 1,
            from_us: 500,
            to_us: 800,
        }];
        let report = check(&[a, b, c], &paused);
        assert!(report.violations.is_empty(), "{report:?}");
        assert_eq!(report.excused.values().sum::<usize>(), 1);
    }
}
