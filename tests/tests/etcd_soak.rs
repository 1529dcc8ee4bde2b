//! The mixed soak and its real-process exclusion checker on a three-member etcd cluster:
//! worker processes (several tasks each) take random keys through the runtime and increment
//! each key's fenced counter in a resource redis-server. One member is reached through a fault
//! proxy (stalls, dropped connections, latency: a member cut off from the clients), and faults
//! come at random from a printed seed: the leader killed (SIGKILL) and restarted, any member
//! killed and restarted, every member restarted at once, workers paused with SIGSTOP and
//! killed with SIGKILL.
//!
//! etcd replicates every write through Raft before it answers, so no failover is excused: no
//! two holders of a key may believe their leases valid at one instant, fences of consecutive
//! leases increase, every refusal by the resource has a newer lease behind it, no update is
//! lost (`lock_tests::fleet`).
//!
//! About 10 s by default. `ETCD_SOAK_SECS=600` for a long run; `ETCD_SOAK_SEED=<n>` replays a
//! fault schedule; `ETCD_SOAK_RESULTS=<file>` writes the figures as JSON.

use std::collections::BTreeMap;
use std::process::Child;
use std::time::{Duration, Instant};

use lock_tests::fleet::{Fleet, git_commit};
use lock_tests::rng::XorShift;
use lock_tests::{EtcdCluster, FaultProxy};

const WORKERS: usize = 3;

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

fn leader(cluster: &EtcdCluster) -> usize {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(cluster.leader())
}

#[test]
fn etcd_soak_keeps_exclusion_fences_and_counters() {
    let seconds: f64 = env_or("ETCD_SOAK_SECS", 10.0);
    let seed: u64 = env_or(
        "ETCD_SOAK_SEED",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1),
    );
    println!("etcd soak: {seconds} s, seed {seed} (replay with ETCD_SOAK_SEED={seed})");
    let commit = git_commit();
    let mut rng = XorShift::new(seed);
    let mut cluster = EtcdCluster::start(3);
    let proxy = FaultProxy::start(cluster.members[0].port());
    let mut endpoints = vec![format!("http://127.0.0.1:{}", proxy.port())];
    endpoints.extend(cluster.members[1..].iter().map(|m| m.url()));
    let mut fleet = Fleet::new(
        env!("CARGO_BIN_EXE_soak_worker"),
        format!("etcd:{}", endpoints.join(",")),
        seed,
    );
    let started = Instant::now();
    let deadline = started + Duration::from_secs_f64(seconds);
    let mut workers: Vec<Child> = (0..WORKERS)
        .map(|i| fleet.spawn_worker(seconds, seed.wrapping_add(i as u64 + 1), false))
        .collect();
    let mut faults: BTreeMap<&str, usize> = BTreeMap::new();
    while Instant::now() + Duration::from_millis(1500) < deadline {
        std::thread::sleep(Duration::from_millis(300 + rng.below(700)));
        let kind = match rng.below(8) {
            n @ 0..=4 => fleet.common_fault(n, &proxy, &mut workers, &mut rng, deadline),
            5 => {
                let i = leader(&cluster);
                cluster.restart(i);
                "leader SIGKILL + restart"
            }
            6 => {
                cluster.restart(rng.below(3) as usize);
                "member SIGKILL + restart"
            }
            _ => {
                cluster.restart_all();
                "every member SIGKILL + restart"
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
        "  \"store\": \"etcd (3 members)\",\n  \"commit\": \"{commit}\",\n  \"seed\": {seed},\n  \
         \"seconds\": {seconds}"
    );
    fleet.report(&figures, &run, &faults, "ETCD_SOAK_RESULTS");
    drop(cluster);
}
