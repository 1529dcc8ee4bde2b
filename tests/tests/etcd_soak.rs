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

use lock_tests::fleet::StoreSoak;
use lock_tests::{EtcdCluster, FaultProxy};

fn leader(cluster: &EtcdCluster) -> usize {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(cluster.leader())
}

#[test]
fn etcd_soak_keeps_exclusion_fences_and_counters() {
    let soak = StoreSoak::from_env("ETCD", "etcd");
    let mut cluster = EtcdCluster::start(3);
    let proxy = FaultProxy::start(cluster.members[0].port());
    let mut endpoints = vec![format!("http://127.0.0.1:{}", proxy.port())];
    endpoints.extend(cluster.members[1..].iter().map(|m| m.url()));
    let worker = env!("CARGO_BIN_EXE_soak_worker");
    let target = format!("etcd:{}", endpoints.join(","));
    soak.run(
        worker,
        "etcd (3 members)",
        target,
        &proxy,
        3,
        |kind, rng| match kind {
            0 => {
                let i = leader(&cluster);
                cluster.restart(i);
                "leader SIGKILL + restart"
            }
            1 => {
                cluster.restart(rng.below(3) as usize);
                "member SIGKILL + restart"
            }
            _ => {
                cluster.restart_all();
                "every member SIGKILL + restart"
            }
        },
    );
    drop(cluster);
}
