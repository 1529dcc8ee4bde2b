//! The mixed soak and its real-process exclusion checker on a three-member ZooKeeper
//! ensemble: worker processes (several tasks each) take random keys through the runtime and
//! increment each key's fenced counter in a resource redis-server. One member is reached
//! through a fault proxy (stalls, dropped connections, latency: a member cut off from the
//! clients), and faults come at random from a printed seed: the leader killed (SIGKILL) and
//! restarted, any member killed and restarted, workers paused with SIGSTOP and killed with
//! SIGKILL.
//!
//! ZooKeeper orders every write through its leader and a quorum before it answers, so no
//! leader change is excused: no two holders of a key may believe their leases valid at one
//! instant, fences of consecutive leases increase, every refusal by the resource has a newer
//! lease behind it, no update is lost (`lock_tests::fleet`).
//!
//! About 10 s by default. `ZOOKEEPER_SOAK_SECS=600` for a long run; `ZOOKEEPER_SOAK_SEED=<n>`
//! replays a fault schedule; `ZOOKEEPER_SOAK_RESULTS=<file>` writes the figures as JSON.

use lock_tests::fleet::StoreSoak;
use lock_tests::{FaultProxy, ZooKeeperEnsemble};

#[test]
fn zookeeper_soak_keeps_exclusion_fences_and_counters() {
    let soak = StoreSoak::from_env("ZOOKEEPER", "ZooKeeper");
    let mut ensemble = ZooKeeperEnsemble::start(3);
    let proxy = FaultProxy::start(ensemble.members[0].port());
    let mut hosts = vec![format!("127.0.0.1:{}", proxy.port())];
    hosts.extend(ensemble.members[1..].iter().map(|m| m.address()));
    let worker = env!("CARGO_BIN_EXE_soak_worker");
    let target = format!("zookeeper:{}", hosts.join(","));
    soak.run(
        worker,
        "ZooKeeper (3 members)",
        target,
        &proxy,
        2,
        |kind, rng| match kind {
            0 => {
                let i = ensemble.leader().unwrap_or(0);
                ensemble.restart(i);
                "leader SIGKILL + restart"
            }
            _ => {
                ensemble.restart(rng.below(3) as usize);
                "member SIGKILL + restart"
            }
        },
    );
    drop(ensemble);
}
