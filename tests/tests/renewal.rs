//! Renewal keeps a lease exactly as long as it may: the first renewal is timed from the
//! acquire's send, a failing Cluster shard costs only its own leases, a lease released for
//! `min_hold` is nobody's, and `max_hold` caps renewals and `extend` alike.
//! Each test failed on the code before its fix (docs/SAFETY.md); its comments say how.

use lock_tests::Built;
use lock_tests::Free;
use lock_tests::TakeFree;
use std::time::Duration;

use lock_runtime::LockRuntime;
use lock_tests::{FaultProxy, RedisCluster, RedisServer, TestStore, redis_runtime};
use tokio::time::Instant;

// Finding 9: the first renewal is due a third of the ttl after the acquire was *sent*.
// Before: it was timed from registration, so an acquire whose answer took long was declared
// lost before its first renewal could be answered.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_renewal_is_timed_from_the_send() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    let runtime = redis_runtime(proxy.url(), Duration::from_secs(5)).await;
    let ttl = Duration::from_secs(6);
    // Every answer takes 2.6 s (commands reach the server at once), for the whole test, so
    // nothing depends on when the test changes a setting. Timed from the send, the first
    // renewal goes out as the grant arrives (2.6 s) and is answered at 5.2 s, inside the
    // validity (about 5.94 s). Timed from registration it would go out at 4.6 s and be
    // answered at 7.2 s, after the lease was lost.
    proxy.set_reply_latency(Duration::from_millis(2600));
    let sent = Instant::now();
    let guard = runtime.take("slow-grant", ttl).await;
    let took = sent.elapsed();
    assert!(
        took >= Duration::from_millis(2500) && took < ttl,
        "the grant took over 40% of the ttl: {took:?}"
    );
    assert!(!guard.lease().is_lost(), "valid when granted");
    tokio::time::sleep_until(sent + Duration::from_millis(6600)).await;
    assert!(
        !guard.lease().is_lost(),
        "renewed in time although the grant was slow"
    );
    assert!(guard.release().await.expect("release"), "still ours");
}

// Finding 13d: max_hold is a hard cap: the lease ends by max_hold, not up to a ttl later.
// Before: the last renewal extended the lease by a full ttl past max_hold.

#[tokio::test(start_paused = true)]
async fn max_hold_is_not_exceeded() {
    let store = TestStore::memory();
    let a = store.runtime().await;
    let b = store.runtime().await;
    let start = Instant::now();
    let guard = a
        .lock("capped-hard")
        .ttl(Duration::from_secs(30))
        .max_hold(Duration::from_secs(40))
        .try_acquire()
        .await
        .free();
    guard.lease().lost().await;
    let held = start.elapsed();
    assert!(
        held <= Duration::from_secs(40),
        "the lease outlived max_hold 40 s: {held:?}"
    );
    // The store agrees: free by max_hold too.
    tokio::time::sleep_until(start + Duration::from_secs(40)).await;
    assert!(
        b.try_take("capped-hard").await.is_some(),
        "the record outlived max_hold"
    );
    drop(guard);
}

/// A new lease waits for the watchdog in a registry until its first renewal is due; a lease
/// with a short ttl registered after one with a long ttl must still be renewed on time, and
/// both leases, and one taken after the driver's first sweep, are renewed for as long as they
/// are held (paused time: 10 minutes in a few milliseconds).
#[tokio::test(start_paused = true)]
async fn leases_registered_in_any_order_are_renewed_on_time() {
    let store = TestStore::memory();
    let a = store.runtime().await;
    let b = store.runtime().await;
    let long = a.take("registered-long", Duration::from_secs(600)).await;
    let short = a.take("registered-short", Duration::from_secs(3)).await;
    tokio::time::sleep(Duration::from_secs(30)).await;
    let later = a.take("registered-later", Duration::from_secs(3)).await;
    tokio::time::sleep(Duration::from_secs(570)).await;
    for guard in [&long, &short, &later] {
        assert!(
            !guard.lease().is_lost(),
            "`{}` lost while held",
            guard.lease().key()
        );
    }
    for key in ["registered-long", "registered-short", "registered-later"] {
        assert!(
            b.try_take(key).await.is_none(),
            "`{key}` is free while held"
        );
    }
    drop((long, short, later));
}

// Finding 8: on a Cluster, renewals answer per slot: a shard that stops answering costs only
// the leases in its own slots. Before: one failing shard failed the renewal of every lease in
// the batch, and leases on healthy shards were declared lost with it.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_cluster_shard_costs_only_its_own_leases() {
    let cluster = RedisCluster::start(3);
    let runtime = LockRuntime::builder()
        .redis_cluster(cluster.urls())
        .command_timeout(Duration::from_millis(400))
        .built()
        .await;
    let keys: Vec<String> = (0..30).map(|i| format!("sharded-{i}")).collect();
    let (victim, _) = cluster.master_and_replica_of(&format!("lock:{{{}}}", keys[0]));
    let mut healthy = Vec::new();
    let mut on_victim = 0;
    let mut guards = Vec::new();
    for key in &keys {
        let guard = runtime
            .take(key.as_str(), Duration::from_millis(1500))
            .await;
        let (master, _) = cluster.shard_of(0, &format!("lock:{{{key}}}"));
        if master == victim {
            on_victim += 1;
        } else {
            healthy.push(guard.lease().clone());
        }
        guards.push(guard);
    }
    assert!(on_victim > 0 && healthy.len() >= 10, "keys on every shard");
    // The shard stays down (its replica does not take over), and the other shards keep
    // serving their slots meanwhile, as with `cluster-require-full-coverage no`.
    let (_, victim_replica) = cluster.master_and_replica_of(&format!("lock:{{{}}}", keys[0]));
    for (i, node) in cluster.nodes.iter().enumerate() {
        let mut conn = node.conn().await;
        let _: () = lock_tests::query(
            &mut conn,
            ("CONFIG", "SET", "cluster-require-full-coverage", "no"),
        )
        .await;
        if i == victim_replica {
            let _: () = lock_tests::query(
                &mut conn,
                ("CONFIG", "SET", "cluster-replica-no-failover", "yes"),
            )
            .await;
        }
    }
    let pid = cluster.nodes[victim].pid().expect("running");
    let signal = |sig: &str| {
        let status = std::process::Command::new("kill")
            .args([sig, &pid.to_string()])
            .status()
            .expect("kill");
        assert!(status.success());
    };
    signal("-STOP");
    tokio::time::sleep(Duration::from_secs(3)).await;
    let lost = healthy.iter().filter(|l| l.is_lost()).count();
    signal("-CONT");
    assert_eq!(
        lost,
        0,
        "{lost} of {} leases on healthy shards were lost to another shard's failure",
        healthy.len()
    );
    drop(guards);
}

/// Review of the fixes: a release kept for `min_hold` is no longer the holder's. A renewal
/// that reaches the store after it (spawned before the release, or retried after a reconnect)
/// must not stretch the record to a whole ttl. Before: the record kept the token, so the late
/// renewal (the runtime's own extend script, sent here by hand) extended it from min_hold to
/// the 60 s ttl, held by nobody.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_after_a_min_hold_release_does_not_extend_it() {
    let server = RedisServer::start();
    let runtime = redis_runtime(server.url(), Duration::from_secs(2)).await;
    let guard = runtime
        .lock("kept")
        .ttl(Duration::from_secs(60))
        .min_hold(Duration::from_secs(2))
        .try_acquire()
        .await
        .free();
    let token = guard.lease().token().to_owned();
    assert!(guard.release().await.expect("release"), "kept for min_hold");
    let mut conn = server.conn().await;
    let renewed: Vec<i64> = redis::Script::new(include_str!(
        "../../lock-runtime/src/store/redis/lua/extend.lua"
    ))
    .key("lock:{kept}")
    .arg(&token)
    .arg(60_000)
    .invoke_async(&mut conn)
    .await
    .expect("the extend script");
    let pttl: i64 = lock_tests::query(&mut conn, ("PTTL", "lock:{kept}")).await;
    assert_eq!(renewed, vec![0], "a released lease is not renewed");
    assert!(
        pttl <= 2_000,
        "the record lives {pttl} ms, beyond its 2 s min_hold"
    );
}

/// Review of the fixes: `LockGuard::extend` respects `max_hold` as the watchdog does. Before:
/// an explicit extend of 60 s took the lease 45 s past its 20 s max_hold.
#[tokio::test(start_paused = true)]
async fn extend_respects_max_hold() {
    let store = TestStore::memory();
    let a = store.runtime().await;
    let b = store.runtime().await;
    let start = Instant::now();
    let guard = a
        .lock("capped-extend")
        .ttl(Duration::from_secs(10))
        .max_hold(Duration::from_secs(20))
        .watchdog(false)
        .try_acquire()
        .await
        .free();
    tokio::time::advance(Duration::from_secs(5)).await;
    assert!(guard.extend(Duration::from_secs(60)).await.expect("extend"));
    tokio::time::sleep_until(start + Duration::from_secs(20)).await;
    assert!(guard.lease().is_lost(), "the lease ends at max_hold");
    assert!(
        b.try_take("capped-extend").await.is_some(),
        "the record ends at max_hold too"
    );
    assert!(
        !guard.extend(Duration::from_secs(60)).await.expect("extend"),
        "nothing is left of max_hold"
    );
}
