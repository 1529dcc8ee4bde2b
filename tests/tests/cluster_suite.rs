//! The behaviour and attribute suites on a real 3-master, 3-replica Redis Cluster, and a
//! failover of the master that owns a held lock's slot.

use lock_tests::Built;
use lock_tests::TakeFree;
use std::time::Duration;

use lock_runtime::LockRuntime;
use lock_tests::{TestStore, wake};

lock_testkit::behaviour_suite!(lock_tests::TestStore::cluster());
lock_testkit::attribute_suite!(lock_tests::TestStore::cluster());

/// CLUSTER FAILOVER of the master owning a held lock's slot: the holder either keeps its lease
/// (its renewals follow the slot to the new master) or is told it lost it; a second runtime
/// never holds the lock while the first still believes it does, unless the fence tells them
/// apart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failover_of_the_slot_owner_keeps_or_reports_the_lease() {
    let store = TestStore::cluster();
    let TestStore::Cluster(cluster) = &store else {
        unreachable!("made as a cluster")
    };
    let a = store.runtime().await;
    let b = store.runtime().await;
    let guard = a.take("failover", Duration::from_millis(1500)).await;
    let (_, replica) = cluster.master_and_replica_of("lock:{failover}");
    let mut conn = cluster.nodes[replica].conn().await;
    let _: () = lock_tests::query(&mut conn, ("CLUSTER", "FAILOVER")).await;
    // Watch for 4 s, past two ttls, while the slot moves.
    let until = tokio::time::Instant::now() + Duration::from_secs(4);
    let mut b_held = 0;
    while tokio::time::Instant::now() < until {
        match b
            .lock("failover")
            .ttl(Duration::from_millis(1500))
            .try_acquire()
            .await
        {
            Ok(Some(other)) => {
                b_held += 1;
                assert!(
                    guard.lease().is_lost()
                        || other.lease().fence().await.expect("a fence")
                            > guard.lease().fence().await.expect("a fence"),
                    "two holders at once and the fence does not tell them apart"
                );
                other.release().await.ok();
            }
            Ok(None) => {}
            // A moment of unavailability during the failover is fine; it must not last.
            Err(e) => eprintln!("during failover: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (new_master, _) = cluster.shard_of(replica, "lock:{failover}");
    assert_eq!(new_master, replica, "the replica took over the slot");
    if guard.lease().is_lost() {
        eprintln!("the holder was told it lost the lease during failover");
    } else {
        assert_eq!(
            b_held, 0,
            "the holder kept its lease, so nobody else got the lock"
        );
        assert!(guard.release().await.expect("release on the new master"));
    }
    // The runtime keeps working against the new topology.
    let again = b
        .lock("failover")
        .acquire_timeout(Duration::from_secs(5))
        .await
        .expect("acquire after the failover");
    again.release().await.expect("release");
}

/// Releases are announced where the cluster's servers can hear them: SPUBLISH in the lock's
/// slot on Redis 7.0 or newer (Valkey included), classic PUBLISH on 6.2, which has no sharded
/// pub/sub (its Lua scripts fail on SPUBLISH, and SSUBSCRIBE is an unknown command). Counted
/// by the servers themselves, so a 7.0 cluster quietly falling back to the broadcast fails too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn releases_are_published_sharded_where_the_servers_have_it() {
    let store = TestStore::cluster();
    let TestStore::Cluster(cluster) = &store else {
        unreachable!("made as a cluster")
    };
    let a = store.runtime().await;
    let b = store.runtime().await;
    let guard = a.take_default_ttl("announced").await;
    let waiter = tokio::spawn(async move {
        b.lock("announced")
            .acquire_timeout(Duration::from_secs(10))
            .await
            .expect("the waiter got the lock")
            .lease()
            .fence()
            .await
    });
    // The waiter is subscribed once it asked and was refused; give it that moment.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(guard.release().await.expect("release"));
    let woken = waiter
        .await
        .expect("the waiter task")
        .expect("the waiter got the lock");
    assert!(woken > 0);
    assert_published_as_the_servers_allow(cluster, 1).await;
}

/// Runtimes whose users differ in what they may run (INFO is in the `@dangerous` category
/// that least-privilege users often lack) choose the same kind of pub/sub, so releases from
/// either wake waiters of the other: sharded on 7.0 and newer, classic on 6.2, asked of the
/// servers rather than read from INFO. (Taking an unknown version as 7.0 made every release on
/// a 6.2 Cluster fail on SPUBLISH; taking it as 6.2 left such a runtime's waiters deaf to the
/// sharded releases of runtimes that may run INFO.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runtimes_with_and_without_info_hear_each_other() {
    let store = TestStore::cluster();
    let TestStore::Cluster(cluster) = &store else {
        unreachable!("made as a cluster")
    };
    for node in &cluster.nodes {
        let mut conn = node.client().get_connection().expect("connect");
        let _: () = redis::cmd("ACL")
            .arg(
                &[
                    "SETUSER",
                    "app",
                    "on",
                    ">app-secret",
                    "~*",
                    "&*",
                    "+@all",
                    "-info",
                ][..],
            )
            .query(&mut conn)
            .expect("ACL SETUSER");
    }
    let urls: Vec<String> = cluster
        .nodes
        .iter()
        .map(|n| format!("redis://app:app-secret@127.0.0.1:{}", n.port()))
        .collect();
    let without_info = LockRuntime::builder().redis_cluster(urls).built().await;
    let with_info = store.runtime().await;
    lock_testkit::suite::release_wakes_waiter(&with_info, &without_info, "acl-wait-1").await;
    lock_testkit::suite::release_wakes_waiter(&without_info, &with_info, "acl-wait-2").await;
    assert_published_as_the_servers_allow(cluster, 2).await;
}

/// At least `releases` announcements were counted by the cluster's nodes, all of the kind the
/// servers allow: SPUBLISH only on 7.0 and newer (Valkey included), PUBLISH only on 6.2.
async fn assert_published_as_the_servers_allow(cluster: &lock_tests::RedisCluster, releases: u64) {
    let (sharded, classic) = publishes(cluster).await;
    let version = lock_tests::server::server_version();
    if version >= (7, 0) {
        assert!(
            sharded >= releases && classic == 0,
            "server {version:?}: expected SPUBLISH only, counted {sharded} SPUBLISH and \
             {classic} PUBLISH"
        );
    } else {
        assert!(
            classic >= releases && sharded == 0,
            "server {version:?}: expected PUBLISH only, counted {sharded} SPUBLISH and \
             {classic} PUBLISH"
        );
    }
}

/// SPUBLISH and PUBLISH calls (scripts' included) that the cluster's nodes counted.
async fn publishes(cluster: &lock_tests::RedisCluster) -> (u64, u64) {
    let (mut sharded, mut classic) = (0, 0);
    for node in &cluster.nodes {
        sharded += node
            .command_stat("calls", |c| c == "spublish")
            .await
            .expect("INFO commandstats");
        classic += node
            .command_stat("calls", |c| c == "publish")
            .await
            .expect("INFO commandstats");
    }
    (sharded, classic)
}

/// The master of a lock's slot crashes (SIGKILL, never back) while a runtime's subscriber is
/// subscribed on it: once its replica is promoted, that runtime's waiters wake on a release
/// there within seconds, not at the holder's ttl.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_follow_the_slot_after_its_master_crashes() {
    let mut store = TestStore::cluster();
    let holder = store.runtime().await;
    let waiter = store.runtime().await;
    let TestStore::Cluster(cluster) = &mut store else {
        unreachable!("made as a cluster")
    };
    let key = "crashed-slot";
    // The waiter's subscriber subscribes on the slot's master.
    wake::warm_subscriber(&holder, &waiter, key).await;

    let (master, replica) = cluster.master_and_replica_of(&format!("lock:{{{key}}}"));
    cluster.nodes[master].kill();
    wake::waiter_wakes_after_a_failover(&holder, &waiter, key, Duration::from_secs(20)).await;
    let (now_serving, _) = cluster.shard_of(replica, &format!("lock:{{{key}}}"));
    assert_eq!(now_serving, replica, "the replica took over the slot");
}

/// A waiter waits (subscribed in the key's slot) for `key`, which `holder` holds for 30 s;
/// `moving` moves the slot to another node; then the release must reach the waiter within
/// 5 s, not at the holder's ttl. Redis 7 ends the sharded subscriptions of a slot a node
/// gives up, and the client then forgets them: the waiter's subscriber must subscribe again.
async fn waiter_hears_a_release_after_the_slot_moves(
    store: &TestStore,
    key: &str,
    moving: impl FnOnce(),
) {
    let holder = store.runtime().await;
    let waiter = store.runtime().await;
    let guard = holder.take(key, Duration::from_secs(30)).await;
    let waiting = tokio::spawn({
        let (waiter, key) = (waiter.clone(), key.to_owned());
        async move {
            waiter
                .lock(key)
                .acquire_timeout(Duration::from_secs(25))
                .await
        }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    moving();
    // The clients learn the new topology (MOVED, their refresh) meanwhile.
    tokio::time::sleep(Duration::from_secs(2)).await;
    if waiting.is_finished() {
        let early = waiting.await.expect("task");
        panic!(
            "the waiter finished while `{key}` was still held: {}",
            match &early {
                Ok(_) => "it was told it holds the lock".to_owned(),
                Err(e) => format!("with the error {e}"),
            }
        );
    }
    let released = tokio::time::Instant::now();
    let mut tries = 0;
    loop {
        tries += 1;
        match guard.extend(Duration::from_secs(30)).await {
            Ok(true) => break,
            Ok(false) => panic!("the holder lost `{key}` while its slot moved"),
            Err(e) if tries < 50 => {
                eprintln!("while the slot settles: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("the holder cannot reach the slot's new node: {e}"),
        }
    }
    assert!(guard.release().await.expect("release"));
    let got = waiting
        .await
        .expect("task")
        .expect("the waiter got the lock");
    let took = released.elapsed();
    assert!(
        took < Duration::from_secs(5),
        "the waiter got the lock {took:?} after the release: its subscription was lost"
    );
    got.release().await.expect("release");
    holder.shutdown().await;
    waiter.shutdown().await;
}

/// A planned CLUSTER FAILOVER of the key's slot (its master stays up, as a replica).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_follow_the_slot_through_a_planned_failover() {
    let store = TestStore::cluster();
    let TestStore::Cluster(cluster) = &store else {
        unreachable!("made as a cluster")
    };
    let key = "planned-failover";
    let record = format!("lock:{{{key}}}");
    let (_, replica) = cluster.master_and_replica_of(&record);
    waiter_hears_a_release_after_the_slot_moves(&store, key, || {
        let mut conn = cluster.nodes[replica]
            .client()
            .get_connection()
            .expect("connect to the replica");
        let _: () = redis::cmd("CLUSTER")
            .arg("FAILOVER")
            .query(&mut conn)
            .expect("CLUSTER FAILOVER");
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while cluster.shard_of(replica, &record).0 != replica {
            assert!(
                std::time::Instant::now() < deadline,
                "the failover did not happen"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    })
    .await;
}

/// A manual migration of the key's slot to another master (a resharding).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_follow_the_slot_through_a_migration() {
    let store = TestStore::cluster();
    let TestStore::Cluster(cluster) = &store else {
        unreachable!("made as a cluster")
    };
    let key = "migrated-slot";
    let record = format!("lock:{{{key}}}");
    let (from, _) = cluster.shard_of(0, &record);
    // Another master: one that serves some other slot.
    let to = (0..cluster.nodes.len())
        .find(|&n| {
            n != from && {
                let (serving, _) = cluster.shard_of(0, &format!("other-{n}"));
                serving == n
            }
        })
        .or_else(|| {
            (0..200).find_map(|i| {
                let (serving, _) = cluster.shard_of(0, &format!("probe-{i}"));
                (serving != from).then_some(serving)
            })
        })
        .expect("another master");
    waiter_hears_a_release_after_the_slot_moves(&store, key, || {
        cluster.migrate_slot_of(&record, to);
    })
    .await;
}

/// The documented ACL rule, on every node, for the waiting runtime, while the holder and an
/// operator use the default user: every runtime chooses the same kind of pub/sub whatever its
/// rights (the probe publishes inside the namespace), so a restricted waiter wakes on a
/// release and on an operator's forced release within 2 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restricted_waiter_hears_releases_of_unrestricted_runtimes() {
    let mut rule =
        "on >s3cret-lock-pw ~lock:* resetchannels &lock:* -@all +ping +hello +evalsha +eval \
        +script|load +subscribe +unsubscribe +wait +pttl +type +exists +incr +time +hset \
        +hget +hmget +pexpire +set +get +del +publish +cluster|slots +cluster|nodes +readonly \
        +asking"
            .to_owned();
    // As docs/security.md says: the sharded commands from 7.0, CLIENT SETINFO from 7.2.
    let version = lock_tests::server::server_version();
    if version >= (7, 0) {
        rule.push_str(" +ssubscribe +sunsubscribe +spublish +cluster|shards");
    }
    if version >= (7, 2) {
        rule.push_str(" +client|setinfo");
    }
    let store = TestStore::cluster();
    let TestStore::Cluster(cluster) = &store else {
        unreachable!("made as a cluster")
    };
    for node in &cluster.nodes {
        let mut conn = node.client().get_connection().expect("connect");
        let mut setuser = redis::cmd("ACL");
        setuser.arg("SETUSER").arg("locker");
        for part in rule.split_whitespace() {
            setuser.arg(part);
        }
        let _: () = setuser.query(&mut conn).expect("ACL SETUSER");
    }
    let restricted = LockRuntime::builder()
        .redis_cluster(
            cluster
                .nodes
                .iter()
                .map(|n| format!("redis://locker:s3cret-lock-pw@127.0.0.1:{}", n.port())),
        )
        .built()
        .await;
    let holder = store.runtime().await;
    for (i, forced) in [false, true].into_iter().enumerate() {
        let key = format!("restricted-{i}");
        let guard = holder.take(&key, Duration::from_secs(30)).await;
        let waiting = tokio::spawn({
            let (restricted, key) = (restricted.clone(), key.clone());
            async move {
                restricted
                    .lock(key)
                    .acquire_timeout(Duration::from_secs(20))
                    .await
            }
        });
        tokio::time::sleep(Duration::from_millis(500)).await;
        let released = tokio::time::Instant::now();
        if forced {
            assert!(holder.force_release(&key).await.expect("force release"));
        } else {
            assert!(guard.release().await.expect("release"));
        }
        let got = waiting
            .await
            .expect("task")
            .expect("the waiter got the lock");
        let took = released.elapsed();
        assert!(
            took < Duration::from_secs(2),
            "the restricted waiter got `{key}` {took:?} after the {} (ttl 30 s)",
            if forced { "forced release" } else { "release" }
        );
        got.release().await.expect("release");
    }
    restricted.shutdown().await;
    holder.shutdown().await;
}
