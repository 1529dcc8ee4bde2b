//! The etcd store under faults, on real three-member clusters: the leader killed while a
//! lease is held, and every member restarted at once. In each, the holder either keeps its
//! lease (and its fence) or is told it lost it before anyone else gets the lock; never two
//! holders.

use lock_tests::Built;
use lock_tests::Free;
use lock_tests::TakeFree;
use std::time::Duration;

use lock_runtime::LockRuntime;
use lock_tests::EtcdCluster;
use tokio::time::Instant;

async fn runtime(cluster: &EtcdCluster, owner: &str) -> LockRuntime {
    LockRuntime::builder()
        .etcd(cluster.endpoints())
        .owner(owner)
        .command_timeout(Duration::from_secs(2))
        .built()
        .await
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
                guard.lease().fence().await.expect("a fence"),
                holder.fence().await.expect("a fence")
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
    let guard = a.take("leader-kill", Duration::from_secs(3)).await;
    let lease = guard.lease().clone();
    let fence = lease.fence().await.expect("a fence");
    let leader = cluster.leader().await;
    cluster.kill(leader);
    // Through the election and after it: the holder keeps renewing through the surviving
    // members, so the contender never gets the lock while the holder believes it has it.
    let got = contend(&b, "leader-kill", Duration::from_secs(6), &lease).await;
    if lease.is_lost() {
        eprintln!("the holder was told it lost the lease; the contender got it {got} times");
    } else {
        assert_eq!(got, 0, "the lock was taken from a live holder");
        assert_eq!(lease.fence().await.expect("a fence"), fence);
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
    assert!(
        next.lease().fence().await.expect("a fence") > fence,
        "fences go on increasing"
    );
    next.release().await.expect("release");
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_member_restarted_keeps_fences_increasing_and_one_holder() {
    let mut cluster = EtcdCluster::start(3);
    let a = runtime(&cluster, "holder").await;
    let b = runtime(&cluster, "contender").await;
    let guard = a.take("restart-all", Duration::from_secs(3)).await;
    let lease = guard.lease().clone();
    let fence = lease.fence().await.expect("a fence");
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
        next.lease().fence().await.expect("a fence") > fence,
        "a restart does not reset revisions: {} after {fence}",
        next.lease().fence().await.expect("a fence")
    );
    next.release().await.expect("release");
    a.shutdown().await;
    b.shutdown().await;
}

/// An acquire whose answer comes after the command timeout may still be applied by etcd; the
/// runtime gives it back with a release sent after it. The client spreads requests over the
/// members: when the acquire went through a member that is slow to pass it on and the release
/// through a fast one, the release must not overtake the acquire: else it finds nothing, the
/// acquire lands after it, and the lock stays taken by nobody for its whole ttl (30 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_answered_too_late_leaves_no_orphan() {
    let cluster = EtcdCluster::start(3);
    let proxy = lock_tests::FaultProxy::start(cluster.members[0].port());
    let mut endpoints = vec![format!("http://127.0.0.1:{}", proxy.port())];
    endpoints.extend(cluster.members[1..].iter().map(|m| m.url()));
    let slow = LockRuntime::builder()
        .etcd(endpoints)
        .command_timeout(Duration::from_millis(300))
        .built()
        .await;
    let direct = runtime(&cluster, "checker").await;
    proxy.set_latency(Duration::from_millis(400));
    let mut cut_off = 0;
    for round in 0..30 {
        let key = format!("late-{round}");
        let attempt = slow
            .lock(&key)
            .ttl(Duration::from_secs(30))
            .try_acquire()
            .await;
        if let Ok(Some(guard)) = attempt {
            // Answered in time (through a fast member): nothing to check this round (its
            // release may be cut off in turn; the key is not used again).
            let _ = guard.release().await;
            continue;
        }
        cut_off += 1;
        // Let a late acquire land before looking.
        tokio::time::sleep(Duration::from_millis(600)).await;
        let got = direct
            .lock(&key)
            .acquire_timeout(Duration::from_secs(5))
            .await
            .unwrap_or_else(|e| {
                panic!("round {round}: `{key}` was left to a token nobody holds: {e}")
            });
        got.release().await.expect("release");
    }
    proxy.set_latency(Duration::ZERO);
    assert!(
        cut_off > 0,
        "no acquire went through the slow member in 30 rounds"
    );
    eprintln!("{cut_off} of 30 acquires were cut off");
    slow.shutdown().await;
    direct.shutdown().await;
}

/// A waiter's watch stream breaks when etcd goes down; when it stays down longer than the
/// command timeout, the first reopen fails. The reopen must be tried again, so that once etcd
/// is back the holder's release wakes the waiter at once, not at the holder's ttl (30 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_hears_a_release_after_etcd_was_down_a_while() {
    let mut cluster = EtcdCluster::start(1);
    let holder = runtime(&cluster, "holder").await;
    let waiting = runtime(&cluster, "waiter").await;
    let guard = holder.take("outage", Duration::from_secs(30)).await;
    let waiter = tokio::spawn(async move {
        let got = waiting
            .lock("outage")
            .acquire_timeout(Duration::from_secs(60))
            .await;
        (Instant::now(), got, waiting)
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    cluster.kill(0);
    // Longer than the command timeout (2 s), so the first reopen fails.
    tokio::time::sleep(Duration::from_secs(4)).await;
    cluster.restart(0);
    // Time for the reopen to be tried again and the watch created.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(!waiter.is_finished(), "the lock is still held");
    let released = Instant::now();
    assert!(
        guard.release().await.expect("release"),
        "still the holder's"
    );
    let (got_at, got, waiting) = waiter.await.expect("waiter task");
    let got = got.expect("the waiter gets the lock");
    assert!(
        got_at.duration_since(released) < Duration::from_secs(5),
        "the waiter got the lock {:?} after the release (ttl 30 s): its watch was not back",
        got_at.duration_since(released)
    );
    got.release().await.expect("release");
    holder.shutdown().await;
    waiting.shutdown().await;
}

/// `build()` with one member of three down: the probe that checks the cluster answers is sent
/// again to another member when it went to the dead one, so the runtime starts every time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runtime_builds_with_one_member_down() {
    let mut cluster = EtcdCluster::start(3);
    cluster.kill(0);
    // The two left elect a leader if the dead one led.
    cluster.wait_healthy(Duration::from_secs(30));
    for i in 0..8 {
        let runtime = LockRuntime::builder()
            .etcd(cluster.endpoints())
            .build()
            .await
            .unwrap_or_else(|e| panic!("build {i} with one member down: {e}"));
        let guard = runtime.take_default_ttl("one-down").await;
        assert!(guard.release().await.expect("release"));
        runtime.shutdown().await;
    }
}

/// etcd tells a lease's time left in whole seconds, rounded down. An `extend` to a ttl shorter
/// than the one the key's lease was granted moves the key onto another lease; that lease must
/// not end before the validity the holder counts (never shortened by an `extend`). Here the
/// 10 s lease has ~6.9 s left when `extend(6 s)` runs at 3.1 s, and etcd says 6: a new lease
/// of 6 s would end at ~9.1 s while the holder counts itself valid until ~9.9 s. Three keys
/// at once; whenever the contender gets one, its first holder must already count it lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_extend_to_a_shorter_ttl_never_ends_the_key_before_its_holders_validity() {
    let cluster = EtcdCluster::start(1);
    let holder = runtime(&cluster, "holder").await;
    let contender = runtime(&cluster, "contender").await;
    let mut rounds = tokio::task::JoinSet::new();
    for round in 0..3 {
        let (holder, contender) = (holder.clone(), contender.clone());
        rounds.spawn(async move {
            let key = format!("whole-seconds-{round}");
            let guard = holder
                .lock(&key)
                .ttl(Duration::from_secs(10))
                .watchdog(false)
                .try_acquire()
                .await
                .free();
            tokio::time::sleep(Duration::from_millis(3100)).await;
            assert!(
                guard.extend(Duration::from_secs(6)).await.expect("extend"),
                "still ours at 3.1 s"
            );
            let lease = guard.lease().clone();
            // Until well past both the lease's and the extend's end.
            let got = contend(&contender, &key, Duration::from_secs(9), &lease).await;
            assert!(got > 0, "`{key}` was never free again");
            drop(guard);
        });
    }
    while let Some(round) = rounds.join_next().await {
        round.expect("round");
    }
    holder.shutdown().await;
    contender.shutdown().await;
}

/// Renewals of many leases through a slow link: one renewal batch of a thousand leases takes
/// longer than the command timeout, and must not be thrown away whole (every lease lost)
/// because it does. 1,000 leases held through 10 ms of latency on every reply, command timeout
/// 1 s, watched for 20 s: none may be lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_leases_stay_held_through_a_slow_link() {
    let cluster = EtcdCluster::start(1);
    let proxy = lock_tests::FaultProxy::start(cluster.members[0].port());
    let slow = LockRuntime::builder()
        .etcd([format!("http://127.0.0.1:{}", proxy.port())])
        .command_timeout(Duration::from_secs(1))
        .built()
        .await;
    let mut guards = Vec::with_capacity(1000);
    let mut acquires = tokio::task::JoinSet::new();
    for i in 0..1000 {
        let slow = slow.clone();
        acquires.spawn(async move {
            slow.lock(format!("many-{i}"))
                .ttl(Duration::from_secs(6))
                .acquire_timeout(Duration::from_secs(30))
                .await
                .expect("acquire")
        });
        if acquires.len() >= 50
            && let Some(guard) = acquires.join_next().await
        {
            guards.push(guard.expect("acquire task"));
        }
    }
    guards.extend(acquires.join_all().await);
    proxy.set_reply_latency(Duration::from_millis(10));
    let until = Instant::now() + Duration::from_secs(20);
    while Instant::now() < until {
        let lost = guards.iter().filter(|g| g.lease().is_lost()).count();
        assert_eq!(
            lost, 0,
            "{lost} of 1,000 leases lost through 10 ms of reply latency"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    proxy.set_reply_latency(Duration::ZERO);
    let direct = runtime(&cluster, "checker").await;
    for i in (0..1000).step_by(97) {
        let key = format!("many-{i}");
        let info = direct.inspect(&key).await.expect("inspect");
        assert!(info.is_some(), "`{key}` is no longer held in etcd");
    }
    drop(guards);
    slow.shutdown().await;
    direct.shutdown().await;
}
