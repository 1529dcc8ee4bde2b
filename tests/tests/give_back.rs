//! A grant nobody got is given back: an acquire that failed after the server may have granted
//! it (a late or lost answer, a failed Redlock quorum) releases its token, and tries again
//! while the grant could still be live.
//! Each test failed on the code before its fix (docs/SAFETY.md); its comments say how.

use lock_tests::Built;
use lock_tests::proxied_redis;
use std::time::Duration;

use lock_runtime::{LockRuntime, RedlockStore};
use lock_testkit::suite::free_now;
use lock_tests::server::send_signal;
use lock_tests::wake::free_within_5s;
use lock_tests::{FaultProxy, RedisServer, SentinelSet};

// Finding 6: an acquire that errors after the server granted it gives the lock back.
// Before: the grant stayed, held by nobody, for its whole ttl (30 s here).

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_error_after_the_grant_gives_it_back() {
    let (_server, proxy, late, other) = proxied_redis(Duration::from_millis(300)).await;
    proxy.set_latency(Duration::from_millis(400));
    let failed = late
        .lock("late-reply")
        .ttl(Duration::from_secs(30))
        .try_acquire()
        .await;
    assert!(
        failed.is_err(),
        "the reply came after the command timeout: {failed:?}"
    );
    proxy.set_latency(Duration::ZERO);
    free_within_5s(
        &other,
        "late-reply",
        "the orphaned grant was given back, not left for its 30 s ttl",
    )
    .await;
}

/// The same when the give-back itself cannot get through at first: the connection drops right
/// after the acquire failed (the give-back, still on its way, is lost with it) and Redis is
/// unreachable for 2 s. The give-back is tried again until it lands. Before: it was tried
/// once, and the grant stayed for its 30 s ttl.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_give_back_that_fails_is_tried_again() {
    let (_server, proxy, late, other) = proxied_redis(Duration::from_millis(300)).await;
    // The acquire reaches Redis after 400 ms, past the 300 ms timeout; its retry and the
    // give-back would arrive at about 700 and 1000 ms.
    proxy.set_latency(Duration::from_millis(400));
    let failed = late
        .lock("give-back-lost")
        .ttl(Duration::from_secs(30))
        .try_acquire()
        .await;
    proxy.refuse(true);
    proxy.drop_connections();
    assert!(
        failed.is_err(),
        "the reply came after the command timeout: {failed:?}"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    proxy.set_latency(Duration::ZERO);
    proxy.refuse(false);
    free_within_5s(
        &other,
        "give-back-lost",
        "the grant was given back once Redis was reachable, not left for its 30 s ttl",
    )
    .await;
}

/// The same inside the wait loop, whose transient errors are retried.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_wait_loop_leaves_no_grant_behind() {
    let (_server, proxy, late, other) = proxied_redis(Duration::from_millis(300)).await;
    proxy.set_latency(Duration::from_millis(400));
    let waited = late
        .lock("late-wait")
        .ttl(Duration::from_secs(30))
        .acquire_timeout(Duration::from_millis(1500))
        .await;
    assert!(waited.is_err(), "every reply came late: {waited:?}");
    proxy.set_latency(Duration::ZERO);
    free_within_5s(
        &other,
        "late-wait",
        "no grant of the wait loop was left behind",
    )
    .await;
}

/// The same through Sentinel, whose connection handling differs: a master that stops answering
/// (SIGSTOP, no failover: the sentinels wait 60 s before they call it down) while an acquire is
/// on its way. The acquire's bytes wait in the master's socket; when it resumes it runs them.
/// Before: the timeout counted as "the master is gone", so the retry and the give-back went
/// out on a new connection that could not connect while the master was stopped, and the
/// first acquire, run on resume, left the lock to nobody for its 30 s ttl.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_acquire_timeout_leaves_no_grant_behind() {
    let set = SentinelSet::start();
    set.configure("down-after-milliseconds", 60_000);
    let sentinel_runtime = |timeout: Duration| {
        LockRuntime::builder()
            .redis_sentinel(&set.master_name, set.sentinel_urls())
            .command_timeout(timeout)
            .connect_timeout(timeout)
            .build()
    };
    let late = sentinel_runtime(Duration::from_millis(300))
        .await
        .expect("build");
    let other = sentinel_runtime(Duration::from_secs(2))
        .await
        .expect("build");
    free_now(&late, "stopped-master", "free before the test").await;
    let master = set
        .servers
        .iter()
        .find(|s| Some(s.port()) == set.master_port())
        .expect("the master");
    send_signal(master, "-STOP");
    let failed = late
        .lock("stopped-master")
        .ttl(Duration::from_secs(30))
        .try_acquire()
        .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    send_signal(master, "-CONT");
    assert!(failed.is_err(), "the master was stopped: {failed:?}");
    free_within_5s(
        &other,
        "stopped-master",
        "the grant the stopped master ran on resume was given back",
    )
    .await;
}

// Finding 7: a Redlock acquire that fails its quorum releases on every node, including nodes
// that answered too late. Before: with no grant counted in time nothing was released, and the
// late grants blocked every quorum for the whole ttl.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_redlock_quorum_gives_back_late_grants() {
    let servers: Vec<RedisServer> = (0..5).map(|_| RedisServer::start()).collect();
    let proxies: Vec<FaultProxy> = servers
        .iter()
        .map(|s| FaultProxy::start(s.port()))
        .collect();
    let late = LockRuntime::builder()
        .store(
            RedlockStore::new(proxies.iter().map(FaultProxy::url))
                .node_timeout(Duration::from_millis(200)),
        )
        .built()
        .await;
    let other = LockRuntime::builder()
        .redlock(servers.iter().map(RedisServer::url))
        .built()
        .await;
    // Three nodes answer after the node timeout (their grants count for nothing), two refuse.
    for p in &proxies[..3] {
        p.set_latency(Duration::from_millis(350));
    }
    for p in &proxies[3..] {
        p.refuse(true);
        p.drop_connections();
    }
    let failed = late
        .lock("late-quorum")
        .ttl(Duration::from_secs(30))
        .try_acquire()
        .await;
    assert!(!matches!(failed, Ok(Some(_))), "no quorum: {failed:?}");
    // The late grants are still travelling back; give the release time to follow them.
    tokio::time::sleep(Duration::from_secs(1)).await;
    for p in &proxies {
        p.set_latency(Duration::ZERO);
        p.refuse(false);
    }
    free_within_5s(
        &other,
        "late-quorum",
        "the late grants were released, not left for their 30 s ttl",
    )
    .await;
}

/// The acquire script, as the store sends it for `once` requests.
const ACQUIRE_LUA: &str = concat!(
    include_str!("../../lock-runtime/src/store/redis/lua/record.lua"),
    include_str!("../../lock-runtime/src/store/redis/lua/acquire.lua")
);

// Review of 2026-12-03, finding 2: a `once` acquire whose reply was lost, sent again by the
// connection after another holder's successful release wrote the done marker, answered "done"
// and left its own grant in place, held by nobody for its ttl (the runtime disarms its give-back
// on "done"). Now the resent call removes its own grant before answering "done", and announces
// it as a release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_once_acquire_sent_again_after_the_done_marker_gives_its_own_grant_back() {
    let server = RedisServer::start();
    let mut conn = server.conn().await;
    let send = |conn: &mut redis::aio::MultiplexedConnection| {
        let mut eval = redis::cmd("EVAL");
        eval.arg(ACQUIRE_LUA)
            .arg(3)
            .arg(&[
                "lock:{once-resent}",
                "lock:{once-resent}:fence",
                "lock:{once-resent}:done",
            ])
            .arg(&[
                "0123456789abcdef0123456789abcdef",
                "resender",
                "30000",
                "0",
                "1",
                "86400000",
                "lock:{once-resent}:released",
                "0",
            ]);
        let mut conn = conn.clone();
        async move {
            let reply: Vec<i64> = eval.query_async(&mut conn).await.expect("acquire script");
            reply
        }
    };
    let first = send(&mut conn).await;
    assert_eq!(first.first(), Some(&1), "granted: {first:?}");
    // A waiter of another runtime, told the grant's whole 30 s.
    let waiter = lock_tests::redis_runtime(server.url(), Duration::from_secs(2)).await;
    let waiting = tokio::spawn(async move {
        let guard = waiter
            .lock("once-resent")
            .acquire_timeout(Duration::from_secs(20))
            .await
            .expect("the waiter gets the lock");
        guard.release().await.expect("release");
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    // The previous holder's release, meanwhile: the work is done.
    let _: () = lock_tests::query(
        &mut conn,
        ("SET", "lock:{once-resent}:done", 1, "PX", 60_000),
    )
    .await;
    let again = send(&mut conn).await;
    assert_eq!(again.first(), Some(&2), "done: {again:?}");
    // Gone, or already the woken waiter's (it may win the race with this read).
    let left: Option<String> = lock_tests::query(&mut conn, ("GET", "lock:{once-resent}")).await;
    assert!(
        !left
            .as_deref()
            .is_some_and(|v| v.starts_with("0123456789abcdef0123456789abcdef ")),
        "the grant of the first send is held by nobody: {left:?}"
    );
    tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("the removal was announced: the waiter woke long before the grant's 30 s")
        .expect("waiter task");
}
