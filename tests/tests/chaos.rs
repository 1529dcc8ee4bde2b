//! Real faults between the runtime and a real redis-server: stalls and dropped connections
//! through a TCP fault proxy, a server killed and restarted empty, foreign values at lock
//! keys, a server out of memory.

use lock_tests::TakeFree;
use lock_tests::proxied_redis;
use std::time::Duration;

use lock_runtime::LockError;
use lock_tests::{FaultProxy, RedisServer, redis_runtime};
use tokio::time::Instant;

/// A stall longer than the ttl: the holder reports the loss by the end of its validity, and
/// before anyone else can get the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stall_longer_than_ttl_is_reported_by_the_end_of_validity() {
    let (_server, proxy, holder, other) = proxied_redis(Duration::from_millis(500)).await;
    let ttl = Duration::from_millis(1200);
    let guard = holder.take("stalled", ttl).await;
    // Asked while held: a lease that is lost can no longer obtain a fence.
    let held_fence = guard.lease().fence().await.expect("a fence while held");
    // Let one renewal through, then stall.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let stalled_at = Instant::now();
    proxy.stall();
    // Another instance tries for the lock throughout the stall. The moment it gets it, the
    // holder must already consider its lease lost (`is_lost` reads the clock, so this does not
    // depend on when the holder's task next runs).
    let holder_lease = guard.lease().clone();
    let taking = tokio::spawn(async move {
        let taken = other
            .lock("stalled")
            .acquire_timeout(Duration::from_secs(5))
            .await
            .expect("the record expires in Redis");
        (holder_lease.is_lost(), taken)
    });
    tokio::time::timeout(ttl + Duration::from_millis(400), guard.lease().lost())
        .await
        .expect("lost() resolves by the end of the validity (at most a ttl after the stall)");
    let lost_after = stalled_at.elapsed();
    assert!(
        lost_after <= ttl + Duration::from_millis(400),
        "{lost_after:?}"
    );
    let (holder_knew, taken) = taking.await.expect("task");
    assert!(
        holder_knew,
        "another instance got the lock while the holder still considered it valid"
    );
    assert!(taken.lease().fence().await.expect("a fence") > held_fence);
    proxy.resume();
    assert!(
        !guard.release().await.expect("release after resume"),
        "no longer ours"
    );
    taken.release().await.expect("release");
}

/// A stall shorter than ttl/3 loses nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn short_stall_loses_nothing() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    let holder = redis_runtime(proxy.url(), Duration::from_secs(2)).await;
    let guard = holder.take("brief", Duration::from_secs(3)).await;
    for _ in 0..3 {
        proxy.stall();
        tokio::time::sleep(Duration::from_millis(700)).await;
        proxy.resume();
        tokio::time::sleep(Duration::from_millis(700)).await;
    }
    assert!(!guard.lease().is_lost());
    assert!(guard.release().await.expect("release"));
}

/// Every connection dropped: in-flight operations end with errors within their timeouts (no
/// hang), and the runtime reconnects by itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_connections_reconnect_and_nothing_hangs() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    let runtime = redis_runtime(proxy.url(), Duration::from_millis(800)).await;
    let guard = runtime.take("dropped", Duration::from_secs(5)).await;
    // Asked now, so the record carries it (the Redis store fences on demand).
    let fence = guard.lease().fence().await.expect("a fence");

    // An operation in flight during a stall fails within the command timeout.
    proxy.stall();
    let started = Instant::now();
    let stuck = tokio::time::timeout(Duration::from_secs(5), runtime.lock("other").try_acquire())
        .await
        .expect("no hang");
    assert!(stuck.is_err(), "{stuck:?}");
    assert!(started.elapsed() < Duration::from_secs(3));
    proxy.drop_connections();
    proxy.resume();

    // Refusing new connections for a while: calls fail fast, then work again.
    proxy.refuse(true);
    let refused = tokio::time::timeout(Duration::from_secs(5), runtime.inspect("dropped"))
        .await
        .expect("no hang");
    assert!(refused.is_err());
    proxy.refuse(false);

    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match tokio::time::timeout(Duration::from_secs(3), runtime.inspect("dropped")).await {
            Ok(Ok(Some(info))) => {
                assert_eq!(info.fence, Some(fence));
                break;
            }
            other => {
                assert!(Instant::now() < deadline, "did not reconnect: {other:?}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
    assert!(
        !guard.lease().is_lost(),
        "the 5 s lease outlived a short outage"
    );
    assert!(guard.release().await.expect("release after reconnecting"));
}

/// Redis killed and restarted empty on the same port during a lease and a wait: the holder is
/// told it lost the lock, the waiter and new acquisitions work again within seconds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_restart_mid_lease_and_wait() {
    let mut server = RedisServer::start();
    let a = redis_runtime(server.url(), Duration::from_secs(1)).await;
    let b = redis_runtime(server.url(), Duration::from_secs(1)).await;
    let held = a.take("restarted", Duration::from_secs(3)).await;
    let waiter = tokio::spawn(async move {
        b.lock("restarted")
            .acquire_timeout(Duration::from_secs(20))
            .await
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    server.restart();
    let restarted = Instant::now();
    tokio::time::timeout(Duration::from_secs(5), held.lease().lost())
        .await
        .expect("the holder learns it lost the lock");
    let got = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the waiter works again")
        .expect("task")
        .expect("acquired after the restart");
    assert!(restarted.elapsed() < Duration::from_secs(10));
    assert!(got.release().await.expect("release"));
    let fresh = a.take_default_ttl("after-restart").await;
    fresh.release().await.expect("release");
}

/// A foreign value at a lock key: a clear error naming the key and its type; nothing is
/// overwritten.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_values_at_lock_keys_are_left_alone() {
    let server = RedisServer::start();
    let runtime = redis_runtime(server.url(), Duration::from_secs(2)).await;
    let mut conn = server.conn().await;
    let _: () = lock_tests::query(&mut conn, ("SET", "lock:{plain}", "someone else's")).await;
    let _: () = lock_tests::query(&mut conn, ("RPUSH", "lock:{listy}", "x")).await;
    // Five words, like a lock record, but "session" is no start time.
    let lookalike = "user 7 session 3600 alice";
    let _: () = lock_tests::query(&mut conn, ("SET", "lock:{lookalike}", lookalike)).await;
    for (key, kind) in [
        ("plain", "string"),
        ("listy", "list"),
        ("lookalike", "string"),
    ] {
        let err = runtime
            .lock(key)
            .try_acquire()
            .await
            .expect_err("a foreign value");
        let message = err.to_string();
        assert!(matches!(err, LockError::Backend(_)), "{err:?}");
        assert!(
            message.contains(&format!("lock:{{{key}}}")) && message.contains(kind),
            "{message}"
        );
        let err = runtime.inspect(key).await.expect_err("a foreign value");
        assert!(err.to_string().contains(kind), "{err}");
        // Nor does a `once` request wait on it, or an operator's forced release remove it.
        let err = runtime
            .lock(key)
            .once(Duration::from_secs(60))
            .try_acquire()
            .await
            .expect_err("a foreign value");
        assert!(err.to_string().contains(kind), "{err}");
        assert!(runtime.force_release(key).await.is_err(), "{key}");
    }
    assert!(
        !runtime
            .force_release_fence("lookalike", 7)
            .await
            .unwrap_or(false),
        "a forced release by the lookalike's second word"
    );
    let value: String = lock_tests::query(&mut conn, ("GET", "lock:{lookalike}")).await;
    assert_eq!(value, lookalike, "nothing removed");
    let value: String = lock_tests::query(&mut conn, ("GET", "lock:{plain}")).await;
    assert_eq!(value, "someone else's", "nothing overwritten");
    let len: i64 = lock_tests::query(&mut conn, ("LLEN", "lock:{listy}")).await;
    assert_eq!(len, 1);
}

/// A server at maxmemory with noeviction: acquire fails with a clear error and writes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_memory_fails_cleanly() {
    let server = RedisServer::start();
    let runtime = redis_runtime(server.url(), Duration::from_secs(2)).await;
    let mut conn = server.conn().await;
    let _: () = lock_tests::query(
        &mut conn,
        ("CONFIG", "SET", "maxmemory-policy", "noeviction"),
    )
    .await;
    let _: () = lock_tests::query(&mut conn, ("CONFIG", "SET", "maxmemory", "1")).await;
    let err = runtime
        .lock("oom")
        .try_acquire()
        .await
        .expect_err("no memory");
    assert!(matches!(err, LockError::Backend(_)), "{err:?}");
    assert!(err.to_string().to_lowercase().contains("oom"), "{err}");
    let _: () = lock_tests::query(&mut conn, ("CONFIG", "SET", "maxmemory", "0")).await;
    let keys: Vec<String> = lock_tests::query(&mut conn, ("KEYS", "lock:*")).await;
    // No record and no fence counter: the failed attempt did not advance the fence.
    assert!(keys.is_empty(), "nothing half-written: {keys:?}");
    let (secs, micros): (u64, u64) = lock_tests::query(&mut conn, ("TIME",)).await;
    let guard = runtime.take_default_ttl("oom").await;
    // A key without a counter starts its fences at the server clock (hybrid fence).
    assert!(
        guard.lease().fence().await.expect("a fence") >= secs * 1_000_000 + micros,
        "fence {} below the server clock",
        guard.lease().fence().await.expect("a fence")
    );
    guard.release().await.expect("release");
}
