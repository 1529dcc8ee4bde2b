//! The real-process exclusion checker. Holder processes log, per lease, every instant they
//! checked it was still valid before acting on it (the first check right after the grant, one
//! before each operation on the fenced store, one every 20 ms of work), what the store answered,
//! and the last passing check before they let go; all stamped with the system-wide monotonic
//! clock, so stamps from different processes on one machine compare. The test that drives them
//! logs the failovers it injected on the same clock. [`check`] then finds, per key, instants at
//! which two holders believed their leases valid.
//!
//! A validity check is stamped *before* `is_lost()` is asked: the runtime compares the clock
//! with the lease's validity, so a lease found valid was valid at the stamp, and a holder
//! paused or descheduled around a check cannot stretch its interval. With a correct runtime,
//! `a.end < a's validity end <= the server's expiry < b's grant <= b.start` for leases granted
//! one after the other, on one machine's clock, whatever the holder processes suffered; so a
//! SIGSTOP excuses nothing. Only a failover that lost the record can (a store fault, counted
//! by cause). An interval starts at the first passing check, not at the grant's reply: a
//! holder paused between the reply and its first check never believed a lease that expired
//! meanwhile.
//!
//! Log lines, one per event (`<key>` has no spaces):
//! - `G <key> <fence> <token> <t>`: the lease was granted and its first check passed at `t`;
//! - `W <key> <token> <t>`: a check passed at `t`, and an operation under the fence follows;
//! - `R <key> <token> <1|0|e> <t>`: the store accepted it, refused it as stale, or the call
//!   failed; `t` is when the answer came back;
//! - `E <key> <token> <t>`: the holder let go; `t` is its last passing check.
//! - `M <key> <token> <sent> <min_hold>`: the lease was asked with `min_hold` (us), by a call
//!   sent at `sent`: no other lease of the key may begin before `sent + min_hold`.
//! - `C <key> <token> <sent> <answered> <retention>`: `complete()` of a `once` lease, sent at
//!   `sent`, answered "done" at `answered`: no lease of the key (all of whose acquires use
//!   `once`) may begin between `answered` and `sent + retention`.
//! - `H <key> <token>`: the acquire handed the lease to its caller (written as it returned,
//!   before the fence is asked: with fences on demand that is a call to the store, which a
//!   shutdown may begin during).
//! - `S <t>`: the process's `shutdown()` began at `t`: no lease whose `H` line (or, without
//!   one, whose `G` line) comes after this line may have been handed out.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::Write as _;
use std::path::Path;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

/// `CLOCK_MONOTONIC` in microseconds: one clock for every process on the machine (what
/// `std::time::Instant` reads on Linux, which the runtime's `is_lost()` compares against).
pub fn monotonic_us() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    t.tv_sec as u64 * 1_000_000 + t.tv_nsec as u64 / 1_000
}

/// An append-only event log a holder process writes, one `write` call per line, so a process
/// killed with SIGKILL loses at most the line it was writing.
#[derive(Debug)]
pub struct EventLog {
    file: Mutex<std::fs::File>,
    failed: AtomicBool,
}

impl EventLog {
    /// Creates (or appends to) the log at `path`.
    pub fn open(path: &Path) -> std::io::Result<Self> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)?;
        Ok(EventLog {
            file: Mutex::new(file),
            failed: AtomicBool::new(false),
        })
    }

    /// Appends one event line.
    pub fn line(&self, line: std::fmt::Arguments<'_>) {
        let text = format!("{line}\n");
        let written = match self.file.lock() {
            Ok(mut file) => file.write_all(text.as_bytes()).is_ok(),
            Err(_) => false,
        };
        if !written {
            self.failed.store(true, Ordering::SeqCst);
        }
    }

    /// True if a line could not be written: a lost line would shorten an interval and hide
    /// an overlap, so the holder process must fail its run.
    pub fn failed(&self) -> bool {
        self.failed.load(Ordering::SeqCst)
    }
}

/// One operation on the fenced store under a lease.
#[derive(Debug, Clone, Copy)]
pub struct Op {
    /// The passing validity check before it.
    pub checked_us: u64,
    /// What the store answered (`None`: unknown, the call failed or the process died).
    pub accepted: Option<bool>,
    /// When the answer came back.
    pub answered_us: Option<u64>,
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
    /// The first passing validity check, right after the grant.
    pub start_us: u64,
    /// The last passing check: its `E` line, or for a holder killed before it let go, its
    /// last logged check.
    pub end_us: u64,
    /// Its operations on the fenced store, in order.
    pub ops: Vec<Op>,
    /// Asked with a min_hold: when the acquire was sent, and the min_hold (us).
    pub min_hold: Option<(u64, u64)>,
    /// Completed (`once`): sent, answered, retention (us).
    pub completed: Option<(u64, u64, u64)>,
    /// Handed out after its process's `shutdown()` began. A lease handed over late whose
    /// grant line never came is kept with fence 0 and an empty interval at 0.
    pub after_shutdown: bool,
}

/// A failover the driving test injected, on the monotonic clock: the old master died at
/// `at_us`; `lossy` when its replica's link had been stalled first (writes lost for sure).
#[derive(Debug, Clone, Copy)]
pub struct Failover {
    /// When the old master died.
    pub at_us: u64,
    /// Replication was stalled before the kill.
    pub lossy: bool,
}

/// Parses the event log of the holder process `pid`.
pub fn read_log(path: &Path, pid: u32) -> std::io::Result<Vec<Holding>> {
    let text = std::fs::read_to_string(path)?;
    let mut holdings: Vec<Holding> = Vec::new();
    // The token's latest holding; a token granted twice keeps both (the checker counts it).
    let mut latest: HashMap<String, usize> = HashMap::new();
    let mut shut_down = false;
    // Per token, its key and whether the shutdown had begun when the acquire handed it over.
    let mut handed: HashMap<String, (String, bool)> = HashMap::new();
    for line in text.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        match fields.as_slice() {
            ["G", key, fence, token, t] => {
                let (Ok(fence), Ok(t)) = (fence.parse(), t.parse()) else {
                    continue;
                };
                latest.insert(token.to_string(), holdings.len());
                holdings.push(Holding {
                    pid,
                    key: key.to_string(),
                    token: token.to_string(),
                    fence,
                    start_us: t,
                    end_us: t,
                    ops: Vec::new(),
                    min_hold: None,
                    completed: None,
                    after_shutdown: handed.remove(*token).map_or(shut_down, |(_, late)| late),
                });
            }
            ["M", _, token, sent, min_hold] => {
                if let (Some(&i), Ok(sent), Ok(min_hold)) =
                    (latest.get(*token), sent.parse(), min_hold.parse())
                {
                    holdings[i].min_hold = Some((sent, min_hold));
                }
            }
            ["C", _, token, sent, answered, retention] => {
                if let (Some(&i), Ok(sent), Ok(answered), Ok(retention)) = (
                    latest.get(*token),
                    sent.parse(),
                    answered.parse(),
                    retention.parse(),
                ) {
                    holdings[i].completed = Some((sent, answered, retention));
                }
            }
            ["H", key, token] => {
                handed.insert(token.to_string(), (key.to_string(), shut_down));
            }
            ["S", _] => shut_down = true,
            ["W", _, token, t] => {
                if let (Some(&i), Ok(t)) = (latest.get(*token), t.parse::<u64>()) {
                    let h = &mut holdings[i];
                    h.ops.push(Op {
                        checked_us: t,
                        accepted: None,
                        answered_us: None,
                    });
                    h.end_us = h.end_us.max(t);
                }
            }
            ["R", _, token, outcome, t] => {
                if let Some(&i) = latest.get(*token)
                    && let Some(op) = holdings[i].ops.last_mut()
                {
                    op.accepted = match *outcome {
                        "1" => Some(true),
                        "0" => Some(false),
                        _ => None,
                    };
                    op.answered_us = t.parse().ok();
                }
            }
            ["E", _, token, t] => {
                if let (Some(&i), Ok(t)) = (latest.get(*token), t.parse::<u64>()) {
                    holdings[i].end_us = holdings[i].end_us.max(t);
                }
            }
            // A torn last line of a killed process.
            _ => {}
        }
    }
    // Handed over after the shutdown began, with no grant line after: its fence call failed
    // or its first check found it lost, but it was handed out late all the same. Fence 0 and
    // an interval ending at 0 keep it out of the overlap, refusal and window checks (fences
    // start at 1, stamps are later than 0).
    let mut late: Vec<(String, String)> = handed
        .into_iter()
        .filter(|(_, (_, late))| *late)
        .map(|(token, (key, _))| (key, token))
        .collect();
    late.sort();
    for (key, token) in late {
        holdings.push(Holding {
            pid,
            key,
            token,
            fence: 0,
            start_us: 0,
            end_us: 0,
            ops: Vec::new(),
            min_hold: None,
            completed: None,
            after_shutdown: true,
        });
    }
    Ok(holdings)
}

/// What [`check`] found.
#[derive(Debug, Default)]
pub struct Report {
    /// Leases checked.
    pub holdings: usize,
    /// Tokens handed out more than once.
    pub duplicate_tokens: usize,
    /// Overlapping valid intervals explained by an injected failover, by cause.
    pub excused: BTreeMap<&'static str, usize>,
    /// Operations made after a newer lease of the key had been granted (a superseded holder
    /// acting).
    pub superseded_ops: usize,
    /// Of [`superseded_ops`](Self::superseded_ops), the ones the store accepted: stale writes
    /// that got through, measured.
    pub superseded_accepted: usize,
    /// Operations the store refused as stale although no newer lease (higher fence) of the
    /// key had been granted before the answer: a fence that went backwards or repeated.
    pub refused_unexplained: usize,
    /// Leases asked with a min_hold, whose window was checked.
    pub min_hold_windows: usize,
    /// `once` completions, whose retention was checked.
    pub once_completions: usize,
    /// Overlaps no injected failover explains, and unexplained refusals, described.
    pub violations: Vec<String>,
}

/// How long before a holder's first check a failover can still have lost its grant: the
/// grant's reply may come back just before the master dies.
const GRANT_SLACK_US: u64 = 100_000;

/// Checks exclusion: for every key, no two leases' valid intervals overlap unless a failover
/// that may lose writes happened between the earlier holder's grant and the later one's.
/// Checks fencing from the holders' side: every refusal by the store is explained by a newer
/// lease with a higher fence.
pub fn check(holdings: &[Holding], failovers: &[Failover]) -> Report {
    let mut report = Report {
        holdings: holdings.len(),
        ..Report::default()
    };
    report.min_hold_windows = holdings.iter().filter(|h| h.min_hold.is_some()).count();
    report.once_completions = holdings.iter().filter(|h| h.completed.is_some()).count();
    let mut tokens = HashSet::new();
    report.duplicate_tokens = holdings
        .iter()
        .filter(|h| !tokens.insert(h.token.as_str()))
        .count();
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
                // `a` still believed valid after `b` was granted.
                let stale: Vec<_> = a.ops.iter().filter(|o| o.checked_us > b.start_us).collect();
                report.superseded_ops += stale.len();
                report.superseded_accepted +=
                    stale.iter().filter(|o| o.accepted == Some(true)).count();
                match failover_between(a, b, failovers) {
                    Some(cause) => *report.excused.entry(cause).or_default() += 1,
                    None => report.violations.push(format!(
                        "key {}: pid {} (fence {}, valid {}..{} us) and pid {} (fence {}, \
                         valid from {} us) overlap by {} us",
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
        refusals(leases, &mut report);
        kept_windows(leases, failovers, &mut report);
    }
    for h in holdings.iter().filter(|h| h.after_shutdown) {
        report.violations.push(format!(
            "key {}: pid {} was handed a lease (fence {}; 0: no grant line) after its shutdown() began",
            h.key, h.pid, h.fence
        ));
    }
    report
}

/// Clock slack between the holders' monotonic clock and a store's own expiry clock (the same
/// machine's, read through another call).
const STORE_CLOCK_SLACK_US: u64 = 2_000;

/// The windows a store keeps a lock taken after its holder let go: no lease of the key begins
/// before the min_hold of an earlier one has passed, nor inside the retention of a `once`
/// completion (unless a failover between the two lost the record or the marker).
fn kept_windows(leases: &[&Holding], failovers: &[Failover], report: &mut Report) {
    for a in leases {
        let kept_until = [
            a.min_hold
                .map(|(sent, min_hold)| (a.start_us, sent + min_hold, "min_hold")),
            a.completed
                .map(|(sent, answered, retention)| (answered, sent + retention, "once retention")),
        ];
        for (after, until, what) in kept_until.into_iter().flatten() {
            for b in leases.iter().filter(|b| b.token != a.token) {
                if b.start_us <= after || b.start_us + STORE_CLOCK_SLACK_US >= until {
                    continue;
                }
                if failover_between(a, b, failovers).is_some() {
                    *report
                        .excused
                        .entry("failover inside a kept window")
                        .or_default() += 1;
                    continue;
                }
                report.violations.push(format!(
                    "key {}: pid {} (fence {}) began at {} us, inside the {what} of pid {} \
                     (fence {}), which lasts until {until} us",
                    a.key, b.pid, b.fence, b.start_us, a.pid, a.fence
                ));
            }
        }
    }
}

/// Refusals the holders' history explains: a lease with a higher fence began before the
/// refusal's answer came back.
fn refusals(leases: &[&Holding], report: &mut Report) {
    for a in leases {
        for op in a.ops.iter().filter(|o| o.accepted == Some(false)) {
            let answered = op.answered_us.unwrap_or(u64::MAX);
            let explained = leases
                .iter()
                .any(|b| b.fence > a.fence && b.start_us < answered);
            if !explained {
                report.refused_unexplained += 1;
                report.violations.push(format!(
                    "key {}: pid {}'s operation under fence {} was refused at {answered} us, \
                     but no lease with a higher fence had begun",
                    a.key, a.pid, a.fence
                ));
            }
        }
    }
}

fn failover_between(a: &Holding, b: &Holding, failovers: &[Failover]) -> Option<&'static str> {
    failovers
        .iter()
        .filter(|f| a.start_us.saturating_sub(GRANT_SLACK_US) <= f.at_us && f.at_us <= b.start_us)
        .map(|f| {
            if f.lossy {
                "failover, replication stalled first"
            } else {
                "failover, replica in sync a moment before"
            }
        })
        .next()
}

/// Counts pairs of leases of one key granted one after the other (the first holder's last
/// passing check before the second's first) whose fences do not increase. No fault excuses
/// this: the fence is a hybrid of a counter and the server clock (DESIGN.md §5), and every
/// server here shares one clock.
pub fn fence_order_violations(holdings: &[Holding]) -> usize {
    let mut by_key: BTreeMap<&str, Vec<&Holding>> = BTreeMap::new();
    for h in holdings {
        by_key.entry(h.key.as_str()).or_default().push(h);
    }
    let mut violations = 0;
    for leases in by_key.values_mut() {
        leases.sort_by_key(|h| h.start_us);
        let mut by_end = leases.clone();
        by_end.sort_by_key(|h| h.end_us);
        // The highest fence of the leases that ended before the current one began: when it is
        // below that lease's fence, no pair with it can break the order.
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
                .filter(|a| a.end_us <= b.start_us && a.fence >= b.fence)
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
            ops: vec![Op {
                checked_us: end,
                accepted: Some(true),
                answered_us: Some(end + 10),
            }],
            min_hold: None,
            completed: None,
            after_shutdown: false,
        }
    }

    /// A lease handed out after its process's shutdown began, one begun inside an earlier
    /// lease's min_hold, one begun inside a `once` retention: each is found, and a lease begun
    /// after the window is not.
    #[test]
    fn kept_windows_and_shutdowns_are_checked() {
        let mut late = holding(1, "late", 1, 0, 100);
        late.after_shutdown = true;
        assert_eq!(check(&[late], &[]).violations.len(), 1);
        let mut held = holding(1, "a", 1, 1_000, 2_000);
        held.min_hold = Some((900, 50_000));
        let inside = holding(2, "b", 2, 20_000, 21_000);
        let after = holding(3, "c", 3, 60_000, 61_000);
        let report = check(&[held.clone(), inside.clone(), after.clone()], &[]);
        assert_eq!(report.violations.len(), 1, "{report:?}");
        held.min_hold = None;
        held.completed = Some((1_500, 1_900, 50_000));
        let report = check(&[held, inside, after], &[]);
        assert_eq!(report.violations.len(), 1, "{report:?}");
    }

    /// A lease handed over before its process's shutdown began, whose fence (asked of the
    /// store: fences on demand) came back after it, was not handed out after the shutdown:
    /// the `H` line, written as the acquire returned, says when it was. One handed over after
    /// the `S` line still is, and so is a `G` with no `H` line after an `S`.
    #[test]
    fn a_fence_answered_after_the_shutdown_began_is_not_a_late_grant() {
        let holdings = read_text(
            "h",
            "H k1 early\nS 100\nG k1 7 early 120\nE k1 early 130\n\
             H k2 late\nG k2 3 late 140\nE k2 late 150\nG k3 4 bare 160\n",
        );
        let late: Vec<&str> = holdings
            .iter()
            .filter(|h| h.after_shutdown)
            .map(|h| h.token.as_str())
            .collect();
        assert_eq!(late, ["late", "bare"]);
    }

    /// `text` read as the event log of pid 1, through a file as the soak reads it.
    fn read_text(name: &str, text: &str) -> Vec<Holding> {
        let dir = std::env::temp_dir().join(format!("exclusion-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a temp dir");
        let path = dir.join("log");
        std::fs::write(&path, text).expect("the log written");
        let holdings = read_log(&path, 1).expect("the log read");
        let _ = std::fs::remove_dir_all(&dir);
        holdings
    }

    /// A lease handed over after the shutdown began whose grant line never came (the fence
    /// asked of the store failed, or the first validity check found it lost) was still handed
    /// out late: the checker reports it, and the lease stands apart from every other check.
    #[test]
    fn a_late_handover_without_a_grant_line_is_reported() {
        let holdings = read_text(
            "h-only",
            "H k1 lost\nG k2 1 ok 50\nE k2 ok 60\nS 100\nH k1 late\n",
        );
        let report = check(&holdings, &[]);
        assert_eq!(report.violations.len(), 1, "{report:?}");
        assert!(report.violations[0].contains("k1"), "{report:?}");
        assert_eq!(report.duplicate_tokens, 0, "{report:?}");
    }

    /// The checker must be able to fail: an overlap with no failover behind it is a
    /// violation; a failover after the later grant excuses nothing; one between the grants
    /// is counted by cause.
    #[test]
    fn an_unexplained_overlap_is_a_violation() {
        let a = holding(1, "a", 1, 0, 1_000);
        let b = holding(2, "b", 2, 900, 2_000);
        let c = holding(3, "c", 3, 2_000, 3_000);
        let all = [a, b, c];
        let report = check(&all, &[]);
        assert_eq!(report.violations.len(), 1, "{report:?}");
        assert_eq!(report.superseded_ops, 1);
        assert_eq!(report.superseded_accepted, 1);
        let late = [Failover {
            at_us: 950,
            lossy: true,
        }];
        assert_eq!(check(&all, &late).violations.len(), 1);
        let between = [Failover {
            at_us: 500,
            lossy: true,
        }];
        let report = check(&all, &between);
        assert!(report.violations.is_empty(), "{report:?}");
        assert_eq!(report.excused.values().sum::<usize>(), 1);
    }

    /// Fences: a refusal with no newer lease behind it, a repeated token and fences out of
    /// order are each found.
    #[test]
    fn fence_faults_are_found() {
        let mut a = holding(1, "a", 5, 0, 100);
        a.ops[0].accepted = Some(false);
        let b = holding(2, "b", 4, 200, 300);
        let dup = holding(3, "b", 6, 400, 500);
        let report = check(&[a.clone(), b.clone(), dup.clone()], &[]);
        assert_eq!(report.refused_unexplained, 1, "{report:?}");
        assert_eq!(report.duplicate_tokens, 1);
        assert_eq!(fence_order_violations(&[a, b, dup]), 1);
    }
}
