//! The mixed soak and its real-process exclusion checker on PostgreSQL: worker processes
//! (several tasks each) take random keys through the runtime on one PostgreSQL server, reached
//! through a fault proxy, and increment each key's fenced counter in a resource redis-server.
//! Faults come at random from a printed seed: proxy stalls, dropped connections and latency,
//! every runtime connection terminated with `pg_terminate_backend`, workers paused with
//! SIGSTOP and killed with SIGKILL, and the server itself killed (SIGKILL) and restarted
//! (crash recovery from its WAL).
//!
//! One server and no failover, so nothing is excused: no two holders of a key may believe
//! their leases valid at one instant, fences of consecutive leases increase, every refusal by
//! the resource has a newer lease behind it, no update is lost (`lock_tests::fleet`).
//!
//! About 10 s by default. `PG_SOAK_SECS=600` for a long run; `PG_SOAK_SEED=<n>` replays a
//! fault schedule; `PG_SOAK_RESULTS=<file>` writes the figures as JSON.

use std::collections::BTreeMap;
use std::process::Child;
use std::time::{Duration, Instant};

use lock_tests::fleet::{Fleet, git_commit};
use lock_tests::postgres::{PG_PASSWORD, PG_USER};
use lock_tests::rng::XorShift;
use lock_tests::{FaultProxy, PostgresServer};

const WORKERS: usize = 3;

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

/// Terminates every connection of the lock runtimes (commands and listening).
fn terminate_backends(server: &PostgresServer) -> i64 {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let admin = server.client().await;
        admin
            .query_one(
                "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity
                 WHERE application_name = 'lock-runtime') t",
                &[],
            )
            .await
            .map_or(0, |row| row.get(0))
    })
}

#[test]
fn postgres_soak_keeps_exclusion_fences_and_counters() {
    let seconds: f64 = env_or("PG_SOAK_SECS", 10.0);
    let seed: u64 = env_or(
        "PG_SOAK_SEED",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1),
    );
    println!("postgres soak: {seconds} s, seed {seed} (replay with PG_SOAK_SEED={seed})");
    let commit = git_commit();
    let mut rng = XorShift::new(seed);
    let mut server = PostgresServer::start();
    let proxy = FaultProxy::start(server.port());
    let url = format!(
        "postgres://{PG_USER}:{PG_PASSWORD}@127.0.0.1:{}/postgres",
        proxy.port()
    );
    let mut fleet = Fleet::new(env!("CARGO_BIN_EXE_soak_worker"), url, seed);
    let started = Instant::now();
    let deadline = started + Duration::from_secs_f64(seconds);
    let mut workers: Vec<Child> = (0..WORKERS)
        .map(|i| fleet.spawn_worker(seconds, seed.wrapping_add(i as u64 + 1), false))
        .collect();
    let mut faults: BTreeMap<&str, usize> = BTreeMap::new();
    while Instant::now() + Duration::from_millis(1500) < deadline {
        std::thread::sleep(Duration::from_millis(300 + rng.below(700)));
        let kind = match rng.below(7) {
            n @ 0..=4 => fleet.common_fault(n, &proxy, &mut workers, &mut rng, deadline),
            5 => {
                terminate_backends(&server);
                "pg_terminate_backend of every runtime connection"
            }
            _ => {
                server.restart();
                "server SIGKILL + restart"
            }
        };
        *faults.entry(kind).or_default() += 1;
    }
    for mut w in workers {
        let status = w.wait().expect("reaping a worker");
        assert!(status.success(), "a worker failed: {status}");
    }
    let figures = fleet.evaluate(&[]);
    let run = format!(
        "  \"store\": \"postgres\",\n  \"commit\": \"{commit}\",\n  \"seed\": {seed},\n  \
         \"seconds\": {seconds}"
    );
    fleet.report(&figures, &run, &faults, "PG_SOAK_RESULTS");
    drop(server);
}
