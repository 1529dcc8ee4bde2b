//! `replicated_acquire`: the script and its `WAIT` run on a connection of their own, pipelined
//! and never retried, so only a write the replicas acknowledged is confirmed, a `WAIT` never
//! holds up renewals, and a cancelled one leaves no grant.
//! Each test failed on the code before its fix (docs/SAFETY.md); its comments say how.

use lock_tests::Built;
use lock_tests::TakeFree;
use std::time::Duration;

use lock_runtime::{LockRuntime, RedisStore};
use lock_testkit::suite::free_now;
use lock_tests::server::send_signal;
use lock_tests::wake::free_within_5s;
use lock_tests::{FaultProxy, RedisServer, redis_runtime};
use tokio::time::Instant;

// Findings 1 and 2: `replicated_acquire` runs its script and WAIT on a connection of their own,
// pipelined and never retried.

/// A master and one replica in sync.
async fn master_with_replica() -> (RedisServer, RedisServer) {
    // No 5 s pause before the first sync (the master's default).
    let master = RedisServer::start_with(&["--repl-diskless-sync-delay", "0"]);
    let port = master.port().to_string();
    let replica = RedisServer::start_with(&["--replicaof", "127.0.0.1", &port]);
    let mut conn = master.conn().await;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let info: String = lock_tests::query(&mut conn, ("INFO", "replication")).await;
        // `state=online` is not enough: after a diskless sync the master streams to the
        // replica only once the replica's first REPLCONF ACK arrives (up to a second later),
        // and until then WAIT blocks. A write that WAIT confirms proves the stream is up.
        if info.contains("state=online") {
            let _: () = lock_tests::query(&mut conn, ("SET", "replica-sync-probe", 1)).await;
            // (Short: the client's own response timeout is under a second.)
            let acked: i64 = lock_tests::query(&mut conn, ("WAIT", 1, 200)).await;
            let _: () = lock_tests::query(&mut conn, ("DEL", "replica-sync-probe")).await;
            if acked >= 1 {
                break;
            }
        }
        assert!(
            Instant::now() < deadline,
            "the replica did not sync: {info}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    (master, replica)
}

/// Finding 1. Before: with the replica paused (it acknowledges nothing), a connection dropped
/// during the WAIT made the runtime retry the WAIT on a fresh connection, where it counts the
/// replica at once (that connection had written nothing), and the acquire was confirmed
/// although no replica had the record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn never_confirms_through_a_retry() {
    let (master, replica) = master_with_replica().await;
    let proxy = FaultProxy::start(master.port());
    let runtime = LockRuntime::builder()
        .store(RedisStore::new(proxy.url()).replicated_acquire(1, Duration::from_secs(3)))
        .built()
        .await;
    send_signal(&replica, "-STOP");
    let acquiring = {
        let runtime = runtime.clone();
        tokio::spawn(async move { runtime.lock("unreplicated").try_acquire().await })
    };
    tokio::time::sleep(Duration::from_millis(700)).await;
    proxy.drop_connections();
    let result = acquiring.await.expect("task");
    send_signal(&replica, "-CONT");
    assert!(
        result.is_err(),
        "an acquire no replica acknowledged was confirmed: {:?}",
        result
            .as_ref()
            .map(|g| g.as_ref().map(|g| g.lease().known_fence()))
    );
    // And it was given back: free for others without waiting out the ttl.
    let direct = redis_runtime(master.url(), Duration::from_secs(2)).await;
    free_within_5s(
        &direct,
        "unreplicated",
        "the unconfirmed grant was given back",
    )
    .await;
}

/// Finding 2. Before: WAIT blocked the runtime's shared connection, so with the replica down
/// every renewal queued behind it and 20 of 20 healthy leases were declared lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn its_waits_do_not_starve_renewals() {
    let (master, mut replica) = master_with_replica().await;
    let runtime = LockRuntime::builder()
        .store(RedisStore::new(master.url()).replicated_acquire(1, Duration::from_secs(1)))
        .built()
        .await;
    let mut held = Vec::new();
    for i in 0..20 {
        held.push(
            runtime
                .take(format!("healthy-{i}"), Duration::from_millis(900))
                .await,
        );
    }
    replica.kill();
    let started = Instant::now();
    let mut contenders = Vec::new();
    for t in 0..3 {
        let runtime = runtime.clone();
        contenders.push(tokio::spawn(async move {
            let mut failures = 0;
            while started.elapsed() < Duration::from_secs(3) {
                if runtime
                    .lock(format!("unconfirmable-{t}"))
                    .try_acquire()
                    .await
                    .is_err()
                {
                    failures += 1;
                }
            }
            failures
        }));
    }
    let mut failures = 0;
    for c in contenders {
        failures += c.await.expect("task");
    }
    assert!(failures >= 3, "acquires without a replica fail: {failures}");
    let lost = held.iter().filter(|g| g.lease().is_lost()).count();
    assert_eq!(lost, 0, "{lost} of 20 healthy leases were lost");
    for guard in held {
        assert!(guard.release().await.expect("release"));
    }
}

/// Review of the fixes: a replicated acquire cut off by its deadline after its script was
/// written, but before the server ran it, gives the grant back on its own connection, after
/// the script. Before: the give-back went out on the runtime's shared connection, overtook
/// the slow script, found nothing, and the grant stayed with a token nobody holds (ttl 30 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_one_leaves_no_grant() {
    let (master, _replica) = master_with_replica().await;
    let proxy = FaultProxy::start(master.port());
    let runtime = LockRuntime::builder()
        .store(RedisStore::new(proxy.url()).replicated_acquire(1, Duration::from_secs(2)))
        .command_timeout(Duration::from_secs(10))
        .connect_timeout(Duration::from_secs(10))
        .built()
        .await;
    let direct = redis_runtime(master.url(), Duration::from_secs(2)).await;
    // Each replicated acquire opens a connection of its own: make those slow (latency L per
    // hop) while the runtime's shared connection stays fast.
    let hop = Duration::from_millis(600);
    proxy.set_new_connection_latency(hop);
    // One whole acquire, to learn how long the set-up takes: the pipeline is written 2 hops
    // before the answer arrives and runs on the server 1 hop before it.
    let started = Instant::now();
    let probe = runtime.take("probe", Duration::from_secs(30)).await;
    let whole = started.elapsed();
    drop(probe);
    assert!(
        whole >= 2 * hop,
        "the acquire crossed the slow link: {whole:?}"
    );
    // Cut the next one off between the write and the server running it.
    let cut_at = whole - hop * 3 / 2;
    let cut = tokio::time::timeout(
        cut_at,
        runtime
            .lock("cut-off")
            .ttl(Duration::from_secs(30))
            .try_acquire(),
    )
    .await;
    assert!(cut.is_err(), "cut off by the deadline");
    tokio::time::sleep(Duration::from_secs(3)).await;
    proxy.set_new_connection_latency(Duration::ZERO);
    free_now(
        &direct,
        "cut-off",
        "no grant was left behind for the 30 s ttl",
    )
    .await;
}
