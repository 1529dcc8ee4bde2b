//! The etcd store under faults, on real three-member clusters: the leader killed while a
//! lease is held, and every member restarted at once. In each, the holder either keeps its
//! lease (and its fence) or is told it lost it before anyone else gets the lock; never two
//! holders.

use std::time::Duration;

use lock_runtime::LockRuntime;
use lock_tests::EtcdCluster;
use tokio::time::Instant;

async fn runtime(cluster: &EtcdCluster, owner: &str) -> LockRuntime {
    LockRuntime::builder()
        .etcd(cluster.endpoints())
        .owner(owner)
        .command_timeout(Duration::from_secs(2))
        .build()
        .await
        .expect("build")
}

/// Tries `key` through `contender` for `span`; every time it gets it, `holder_lost` must
/// already be true. Returns how many tries got it.
async fn contend(
    contender: &LockRuntime,
    key: &str,
    span: Duration,
    holder: &lock_runtime::Lease,
) -> u32 {
    let until = Instant::now() + span;
    let mut got = 0;
    while Instant::now() < until {
        if let Ok(Some(guard)) = contender.lock(key).try_acquire().await {
            assert!(
                holder.is_lost(),
                "a second holder got `{key}` (fence {}) while the first (fence {}) still \
                 believed it held it",
                guard.lease().fence(),
                holder.fence()
            );
            got += 1;
            let _ = guard.release().await;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    got
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_killed_mid_lease_never_makes_two_holders() {
    let mut cluster = EtcdCluster::start(3);
    let a = runtime(&cluster, "holder").await;
    let b = runtime(&cluster, "contender").await;
    let guard = a
        .lock("leader-kill")
        .ttl(Duration::from_secs(3))
        .try_acquire()
        .await
        .expect("acquire")
        .expect("free");
    let lease = guard.lease().clone();
    let fence = lease.fence();
    let leader = cluster.leader().await;
    cluster.kill(leader);
    // Through the election and after it: the holder keeps renewing through the surviving
    // members, so the contender never gets the lock while the holder believes it has it.
    let got = contend(&b, "leader-kill", Duration::from_secs(6), &lease).await;
    if lease.is_lost() {
        eprintln!("the holder was told it lost the lease; the contender got it {got} times");
    } else {
        assert_eq!(got, 0, "the lock was taken from a live holder");
        assert_eq!(lease.fence(), fence);
        assert!(
            guard.release().await.expect("release"),
            "still the holder's after the failover"
        );
    }
    // Whatever happened, the next fence is higher.
    let next = b
        .lock("leader-kill")
        .acquire_timeout(Duration::from_secs(10))
        .await
        .expect("free again");
    assert!(next.lease().fence() > fence, "fences go on increasing");
    next.release().await.expect("release");
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_member_restarted_keeps_fences_increasing_and_one_holder() {
    let mut cluster = EtcdCluster::start(3);
    let a = runtime(&cluster, "holder").await;
    let b = runtime(&cluster, "contender").await;
    let guard = a
        .lock("restart-all")
        .ttl(Duration::from_secs(3))
        .try_acquire()
        .await
        .expect("acquire")
        .expect("free");
    let lease = guard.lease().clone();
    let fence = lease.fence();
    cluster.restart_all();
    let got = contend(&b, "restart-all", Duration::from_secs(6), &lease).await;
    if lease.is_lost() {
        eprintln!("the holder was told it lost the lease; the contender got it {got} times");
    } else {
        assert_eq!(got, 0, "the lock was taken from a live holder");
        assert!(
            guard.release().await.expect("release"),
            "still the holder's"
        );
    }
    let next = b
        .lock("restart-all")
        .acquire_timeout(Duration::from_secs(10))
        .await
        .expect("free again");
    assert!(
        next.lease().fence() > fence,
        "a restart does not reset revisions: {} after {fence}",
        next.lease().fence()
    );
    next.release().await.expect("release");
    a.shutdown().await;
    b.shutdown().await;
}
