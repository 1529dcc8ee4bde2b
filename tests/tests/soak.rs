//! The mixed soak with the real-process exclusion checker. Worker processes (several tasks
//! each) take random keys through the runtime on a Redis master with a replica, behind a fault
//! proxy that plays the part of the master's address; each increments the key's fenced counter
//! in a separate resource server. Faults come at random from a printed seed: stalls, dropped
//! connections and latency at the proxy, SCRIPT FLUSH, workers paused with SIGSTOP and killed
//! with SIGKILL, the lock master killed and restarted (append-only file, fsync always: it
//! loses nothing it acknowledged), and crash failovers (master killed, replica promoted, the
//! proxy moved to it, the old master restarted as the new replica).
//!
//! Checks, from what the workers logged (`lock_tests::exclusion`) and what the stores hold:
//! - exclusion: no two holders of a key believed their leases valid at one instant, except
//!   after a failover between their grants (the replica may not have had the record), counted
//!   by cause; a paused holder excuses nothing (its checks are against the clock);
//! - stale writes accepted: operations by a holder whose key had already been granted to a
//!   newer lease, that the resource accepted (measured, per operation);
//! - fencing: every refusal by the resource has a newer lease with a higher fence behind it
//!   (a fence that repeated or went backwards would show here); fences of leases held one
//!   after the other increase; no token is handed out twice;
//! - the logs are complete (every write the resource accepted comes from a logged lease), and
//!   no update is lost (each counter equals its accepted increments).
//!
//! About 12 s by default. `SOAK_SECS=600` for the long run; `SOAK_SEED=<n>` replays a fault
//! schedule; `SOAK_RESULTS=<file>` writes the figures as JSON.

use std::collections::BTreeMap;
use std::process::Child;
use std::time::{Duration, Instant};

use lock_tests::exclusion::{Failover, monotonic_us};
use lock_tests::fleet::{Fleet, env_or, git_commit};
use lock_tests::rng::XorShift;
use lock_tests::{FaultProxy, RedisServer};

const WORKERS: usize = 3;
/// The lock servers keep what they acknowledged across a restart, and a (re)starting replica
/// syncs at once rather than after the default 5 s diskless-sync delay.
const DURABLE: &[&str] = &[
    "--appendonly",
    "yes",
    "--appendfsync",
    "always",
    "--repl-diskless-sync-delay",
    "0",
];

struct Soak {
    lock_servers: [RedisServer; 2],
    master: usize,
    proxy: FaultProxy,
    /// The replica's link to the master goes through this proxy, so a failover can be made to
    /// lose writes: stall it, let writes land on the master only, then kill the master.
    repl_proxy: FaultProxy,
    /// The workers, locking through `proxy`.
    fleet: Fleet,
}

impl Soak {
    /// Starts the soak's servers: two durable lock servers (the second replicating the first)
    /// behind the proxy, and the resource server.
    fn start(seed: u64) -> Self {
        let lock_servers = [
            RedisServer::start_with(DURABLE),
            RedisServer::start_with(DURABLE),
        ];
        let proxy = FaultProxy::start(lock_servers[0].port());
        let repl_proxy = FaultProxy::start(lock_servers[0].port());
        let fleet = Fleet::new(env!("CARGO_BIN_EXE_soak_worker"), proxy.url(), seed);
        let soak = Soak {
            lock_servers,
            master: 0,
            proxy,
            repl_proxy,
            fleet,
        };
        soak.follow_master(1);
        let ready = Instant::now() + Duration::from_secs(20);
        while !soak.replica_in_sync() {
            assert!(Instant::now() < ready, "the replica never synced");
            std::thread::sleep(Duration::from_millis(100));
        }
        soak
    }

    fn spawn_worker(&mut self, seconds: f64, seed: u64, careless: bool) -> Child {
        self.fleet.spawn_worker(seconds, seed, careless)
    }

    fn replica(&self) -> usize {
        1 - self.master
    }

    /// True when the replica confirms a fresh write of the master within a second.
    fn replica_in_sync(&self) -> bool {
        self.lock_servers[self.master]
            .replica_confirms_write("soak:sync-probe", Duration::from_secs(1))
    }

    /// Makes server `index` a replica of the current master, through the replication proxy
    /// (retried while it loads).
    fn follow_master(&self, index: usize) {
        let master_port = self.repl_proxy.port();
        for _ in 0..50 {
            if let Ok(mut conn) = self.lock_servers[index].client().get_connection() {
                let done: redis::RedisResult<()> = redis::cmd("REPLICAOF")
                    .arg("127.0.0.1")
                    .arg(master_port)
                    .query(&mut conn);
                if done.is_ok() {
                    return;
                }
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("server {index} did not accept REPLICAOF");
    }

    /// SIGKILL of the master, its replica promoted and the proxy moved to it, the old master
    /// restarted as the new replica. With `lag`, the replication link is stalled for that
    /// long first, so the writes of that time die with the master. Returns the instant the
    /// master died.
    fn crash_failover(&mut self, lag: Option<Duration>) -> u64 {
        let old = self.master;
        if let Some(lag) = lag {
            self.repl_proxy.stall();
            std::thread::sleep(lag);
        }
        self.lock_servers[old].kill();
        let died = monotonic_us();
        let new = self.replica();
        let mut conn = self.lock_servers[new]
            .client()
            .get_connection()
            .expect("connecting to the replica");
        let _: () = redis::cmd("REPLICAOF")
            .arg("NO")
            .arg("ONE")
            .query(&mut conn)
            .expect("promoting the replica");
        self.master = new;
        self.proxy.set_upstream(self.lock_servers[new].port());
        self.proxy.drop_connections();
        self.repl_proxy.set_upstream(self.lock_servers[new].port());
        self.repl_proxy.drop_connections();
        self.repl_proxy.resume();
        self.lock_servers[old].restart();
        self.follow_master(old);
        died
    }
}

#[test]
fn mixed_soak_keeps_exclusion_fences_and_counters() {
    let seconds: f64 = env_or("SOAK_SECS", 12.0);
    let seed: u64 = env_or(
        "SOAK_SEED",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1),
    );
    println!("soak: {seconds} s, seed {seed} (replay with SOAK_SEED={seed})");
    // Read now: the working tree may move on during a long run.
    let commit = git_commit();
    let mut rng = XorShift::new(seed);
    let mut soak = Soak::start(seed);
    let started = Instant::now();
    let deadline = started + Duration::from_secs_f64(seconds);
    let mut workers: Vec<Child> = (0..WORKERS)
        .map(|i| soak.spawn_worker(seconds, seed.wrapping_add(i as u64 + 1), false))
        .collect();
    let mut failovers = Vec::new();
    let mut faults: BTreeMap<&str, usize> = BTreeMap::new();
    while Instant::now() + Duration::from_millis(1500) < deadline {
        std::thread::sleep(Duration::from_millis(300 + rng.below(700)));
        let kind = match rng.below(9) {
            3 => {
                if let Ok(mut admin) = soak.lock_servers[soak.master].client().get_connection() {
                    let _: redis::RedisResult<()> =
                        redis::cmd("SCRIPT").arg("FLUSH").query(&mut admin);
                }
                "SCRIPT FLUSH"
            }
            // The fault numbers of earlier versions of this soak, so a seed replays the same
            // schedule.
            n @ (0 | 1 | 2 | 4 | 5) => {
                let which = if n < 3 { n } else { n - 1 };
                soak.fleet
                    .common_fault(which, &soak.proxy, &mut workers, &mut rng, deadline)
            }
            6 | 7 => {
                let master = soak.master;
                soak.lock_servers[master].restart();
                "lock master SIGKILL + restart"
            }
            _ => {
                if soak.replica_in_sync() {
                    let lossy = rng.below(2) == 0;
                    let lag = lossy.then(|| Duration::from_millis(100 + rng.below(400)));
                    let at_us = soak.crash_failover(lag);
                    failovers.push(Failover { at_us, lossy });
                    if lossy {
                        "crash failover, replication stalled first"
                    } else {
                        "crash failover"
                    }
                } else {
                    "crash failover skipped (replica not in sync)"
                }
            }
        };
        *faults.entry(kind).or_default() += 1;
    }
    for mut w in workers {
        let status = w.wait().expect("reaping a worker");
        assert!(status.success(), "a worker failed: {status}");
    }

    let figures = soak.fleet.evaluate(&failovers);
    let run = format!("  \"commit\": \"{commit}\",\n  \"seed\": {seed},\n  \"seconds\": {seconds}");
    soak.fleet.report(&figures, &run, &faults, "SOAK_RESULTS");
}

/// The checker must be able to fail on real processes: workers that let their leases run out
/// (no renewals, sleeps past the ttl) and write without asking are caught, by the exclusion
/// check and by the fenced store.
#[test]
fn the_checker_catches_holders_that_ignore_their_expiry() {
    let mut soak = Soak::start(1);
    let workers: Vec<Child> = (0..2)
        .map(|i| soak.spawn_worker(4.0, i + 1, true))
        .collect();
    for mut w in workers {
        let status = w.wait().expect("reaping a worker");
        assert!(status.success(), "a worker failed: {status}");
    }
    let figures = soak.fleet.evaluate(&[]);
    println!(
        "careless: {} acquisitions, {} violations, {} operations by superseded holders, {} \
         refused",
        figures.report.holdings,
        figures.report.violations.len(),
        figures.report.superseded_ops,
        figures.refused
    );
    assert!(
        !figures.report.violations.is_empty(),
        "careless holders overlapped and the checker saw nothing"
    );
    assert!(figures.report.superseded_ops > 0);
    assert!(
        figures.refused > 0,
        "the fenced store refused no stale write"
    );
    // Every refusal has a newer lease behind it: careless holders break exclusion, not
    // the fences.
    assert_eq!(figures.report.refused_unexplained, 0);
}
