//! The deterministic simulation (DESIGN §6): the real runtime on a simulated faulty store,
//! many seeds, and a checker of exclusion, fencing and liveness over each run's history.
//!
//! - Default: seeds from 1 on until 1,000,000 leases have been handed out (100,000 in a debug
//!   build; `scripts/test.sh` runs the release build), at most 20,000 seeds.
//! - `SIM_SEEDS=a..b` runs those seeds; `SIM_SEED=n` replays one; `SIM_SECONDS` sets the
//!   simulated length of each run (default 20); `SIM_ACQUISITIONS` the target; `SIM_THREADS`
//!   how many seeds run at once (default: one per core; the totals and the digest do not
//!   depend on it: reports are counted in seed order).

use std::ops::ControlFlow;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use lock_tests::sim::{SimReport, run_seed};

fn env_u64(name: &str) -> Option<u64> {
    let value = std::env::var(name).ok()?;
    match value.parse() {
        Ok(v) => Some(v),
        Err(_) => panic!("{name}={value:?} is not a number"),
    }
}

fn seeds() -> (Vec<u64>, bool) {
    if let Some(seed) = env_u64("SIM_SEED") {
        return (vec![seed], true);
    }
    if let Ok(range) = std::env::var("SIM_SEEDS") {
        let (a, b) = range
            .split_once("..")
            .unwrap_or_else(|| panic!("SIM_SEEDS={range:?} is not a range like 1..500"));
        let a: u64 = a.parse().expect("SIM_SEEDS start");
        let b: u64 = b.parse().expect("SIM_SEEDS end");
        return ((a..b).collect(), true);
    }
    ((1..=20_000).collect(), false)
}

/// Runs one seed on a thread of its own. A run normally takes milliseconds; one that is
/// still going after a minute of real time is spinning at one simulated instant (a livelock
/// that paused time cannot step past), which is a failure, reported with its seed.
fn run_guarded(seed: u64, length: Duration) -> Result<SimReport, String> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(run_seed(seed, length));
    });
    rx.recv_timeout(Duration::from_secs(60)).map_err(|_| {
        format!(
            "seed {seed} did not finish in a minute of real time: the runtime spins at one simulated instant; replay with:\n  SIM_SEED={seed} SIM_SECONDS={} cargo test -p lock-tests --test simulation -- --nocapture",
            length.as_secs()
        )
    })
}

/// Runs `seeds` on `threads` threads and hands the reports to `each` in seed order (so the
/// totals and the digest are those of a run on one thread), until `each` says stop; seeds
/// still running then are finished and their reports dropped.
fn in_seed_order(
    seeds: &[u64],
    length: Duration,
    threads: usize,
    mut each: impl FnMut(u64, Result<SimReport, String>) -> ControlFlow<()>,
) {
    let next = AtomicUsize::new(0);
    let stop = AtomicBool::new(false);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::scope(|scope| {
        for _ in 0..threads {
            let tx = tx.clone();
            let (next, stop) = (&next, &stop);
            scope.spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(&seed) = seeds.get(i) else { break };
                    if tx.send((i, run_guarded(seed, length))).is_err() {
                        break;
                    }
                }
            });
        }
        drop(tx);
        let mut waiting = std::collections::BTreeMap::new();
        let mut due = 0;
        'reports: for (i, report) in rx {
            waiting.insert(i, report);
            while let Some(report) = waiting.remove(&due) {
                let flow = each(seeds[due], report);
                due += 1;
                if flow.is_break() {
                    stop.store(true, Ordering::Relaxed);
                    break 'reports;
                }
            }
        }
    });
}

#[test]
fn simulated_runs_keep_every_promise() {
    let (seeds, explicit) = seeds();
    let length = Duration::from_secs(env_u64("SIM_SECONDS").unwrap_or(20));
    // A debug build runs about ten times slower: `cargo test` alone stops at 100,000 leases;
    // the test script runs the release build to the full million.
    let default_target = if cfg!(debug_assertions) {
        100_000
    } else {
        1_000_000
    };
    let target = env_u64("SIM_ACQUISITIONS").unwrap_or(default_target);
    let started = Instant::now();
    let mut acquisitions = 0u64;
    let mut writes = (0u64, 0u64);
    let mut runs = 0u64;
    let mut digest = 0u64;
    let mut excused = std::collections::BTreeMap::new();
    let mut faults = std::collections::BTreeMap::new();
    let threads = env_u64("SIM_THREADS").map_or_else(
        || std::thread::available_parallelism().map_or(1, |n| n.get()),
        |n| n.max(1) as usize,
    );
    let mut failure = None;
    in_seed_order(&seeds, length, threads, |seed, report| {
        let report = match report {
            Ok(report) => report,
            Err(text) => {
                failure = Some(text);
                return ControlFlow::Break(());
            }
        };
        if explicit {
            println!(
                "seed {seed}: {} leases, fingerprint {:016x}",
                report.acquisitions, report.fingerprint
            );
        }
        runs += 1;
        digest = digest.rotate_left(7) ^ report.fingerprint;
        acquisitions += report.acquisitions as u64;
        writes.0 += report.writes.0;
        writes.1 += report.writes.1;
        for (cause, n) in &report.verdict.excused {
            *excused.entry(*cause).or_insert(0u64) += n;
        }
        for (kind, n) in &report.verdict.faults {
            *faults.entry(format!("{kind:?}")).or_insert(0u64) += n;
        }
        if !report.verdict.violations.is_empty() {
            let mut text = format!(
                "seed {seed} broke a promise ({} violation(s)); replay with:\n  SIM_SEED={seed} SIM_SECONDS={} cargo test -p lock-tests --test simulation -- --nocapture\n",
                report.verdict.violations.len(),
                length.as_secs()
            );
            for v in report.verdict.violations.iter().take(5) {
                text.push_str(&format!("- {v}\n"));
            }
            if let Some(story) = &report.story {
                text.push_str("history of that key around then:\n");
                text.push_str(story);
            }
            failure = Some(text);
            return ControlFlow::Break(());
        }
        if !explicit && acquisitions >= target {
            return ControlFlow::Break(());
        }
        ControlFlow::Continue(())
    });
    if let Some(text) = failure {
        panic!("{text}");
    }
    println!(
        "simulation: {runs} seeds, {acquisitions} leases handed out, {} fenced writes accepted and {} refused, in {:.1} s on {threads} thread(s)",
        writes.0,
        writes.1,
        started.elapsed().as_secs_f64()
    );
    println!("faults injected: {faults:?}");
    println!("digest of every run: {digest:016x}");
    println!("excused by cause: {excused:?}");
    assert!(
        explicit || acquisitions >= target,
        "only {acquisitions} leases in {runs} seeds (target {target})"
    );
}

/// One seed, one run: the same seed twice gives the same history (what makes a printed seed
/// a replay).
#[test]
fn a_seed_replays_the_same_run() {
    for seed in [3, 7, 11] {
        let a = run_seed(seed, Duration::from_secs(5));
        let b = run_seed(seed, Duration::from_secs(5));
        assert!(a.acquisitions > 0, "seed {seed} handed out no lease");
        assert_eq!(
            (a.fingerprint, a.acquisitions),
            (b.fingerprint, b.acquisitions),
            "seed {seed} went two ways"
        );
    }
}
