//! The deterministic simulation (DESIGN §6): the real runtime on a simulated faulty store,
//! many seeds, and a checker of exclusion, fencing and liveness over each run's history.
//!
//! - Default: seeds from 1 on until 1,000,000 leases have been handed out (100,000 in a debug
//!   build; `scripts/test.sh` runs the release build), at most 20,000 seeds.
//! - `SIM_SEEDS=a..b` runs those seeds; `SIM_SEED=n` replays one; `SIM_SECONDS` sets the
//!   simulated length of each run (default 20); `SIM_ACQUISITIONS` the target.

use std::time::{Duration, Instant};

use lock_tests::sim::run_seed;

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
fn run_guarded(seed: u64, length: Duration) -> lock_tests::sim::SimReport {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(run_seed(seed, length));
    });
    match rx.recv_timeout(Duration::from_secs(60)) {
        Ok(report) => report,
        Err(_) => panic!(
            "seed {seed} did not finish in a minute of real time: the runtime spins at one simulated instant; replay with:\n  SIM_SEED={seed} SIM_SECONDS={} cargo test -p lock-tests --test simulation -- --nocapture",
            length.as_secs()
        ),
    }
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
    for seed in seeds {
        let report = run_guarded(seed, length);
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
            panic!("{text}");
        }
        if !explicit && acquisitions >= target {
            break;
        }
    }
    println!(
        "simulation: {runs} seeds, {acquisitions} leases handed out, {} fenced writes accepted and {} refused, in {:.1} s",
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
