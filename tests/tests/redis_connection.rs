//! The store's own connection to one Redis server (`store/redis/wire.rs`): its replies line
//! up with the requests that asked, also when a request gave up before its reply came.

use std::time::Duration;

use lock_tests::runtimes::redis_runtime;
use lock_tests::{FaultProxy, RedisServer};

/// A request that timed out leaves its connection up, and its reply, when it comes, must go
/// to no one: handed to the next request on the connection, the late "OK" of an acquire would
/// tell that request it holds a lock another runtime holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_that_comes_after_its_request_gave_up_goes_to_no_one_else() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    let direct = redis_runtime(server.url(), Duration::from_secs(2)).await;
    let other = direct
        .lock("held-elsewhere")
        .ttl(Duration::from_secs(30))
        .try_acquire()
        .await
        .expect("acquire")
        .expect("the lock was free");

    let slow = redis_runtime(proxy.url(), Duration::from_millis(400)).await;
    proxy.set_reply_latency(Duration::from_millis(1_500));
    let timed_out = slow
        .lock("free")
        .ttl(Duration::from_secs(30))
        .try_acquire()
        .await;
    assert!(timed_out.is_err(), "no reply within 400 ms: {timed_out:?}");
    proxy.set_reply_latency(Duration::ZERO);
    // Sent on the same connection behind the acquire whose "OK" is still on its way.
    let second = slow
        .lock("held-elsewhere")
        .ttl(Duration::from_secs(30))
        .try_acquire()
        .await
        .expect("an answer");
    assert!(
        second.is_none(),
        "told it holds a lock the other runtime holds"
    );
    // And the connection still works.
    let third = slow
        .lock("third")
        .ttl(Duration::from_secs(5))
        .try_acquire()
        .await
        .expect("an answer");
    assert!(third.is_some(), "a free lock is granted");
    drop(other);
}

/// The calls of `name` the server counted (`INFO commandstats`), 0 when none.
async fn calls(server: &RedisServer, name: &str) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut server.conn().await)
        .await
        .expect("INFO commandstats");
    info.lines()
        .find_map(|line| line.strip_prefix(&format!("cmdstat_{name}:calls=")))
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// Where the server has `DELIFEQ` (Valkey 9; the server matrix runs this file there), a plain
/// release is that one native command and no script; elsewhere it is the release script. A
/// record a waiter marked is still released by the script, which wakes the waiter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_release_is_the_servers_own_compare_and_delete_where_it_has_one() {
    let server = RedisServer::start();
    let native: redis::Value = redis::cmd("COMMAND")
        .arg("INFO")
        .arg("DELIFEQ")
        .query_async(&mut server.conn().await)
        .await
        .expect("COMMAND INFO");
    let native = matches!(&native, redis::Value::Array(items) if items.first().is_some_and(|c| *c != redis::Value::Nil));
    let runtime = redis_runtime(server.url(), Duration::from_secs(2)).await;
    let (delifeq, evalsha) = (
        calls(&server, "delifeq").await,
        calls(&server, "evalsha").await,
    );
    let guard = runtime
        .lock("plain")
        .ttl(Duration::from_secs(10))
        .try_acquire()
        .await
        .expect("acquire")
        .expect("free");
    assert!(guard.release().await.expect("release"), "released");
    let used = (
        calls(&server, "delifeq").await - delifeq,
        calls(&server, "evalsha").await - evalsha,
    );
    assert_eq!(
        used,
        if native { (1, 0) } else { (0, 1) },
        "native: {native}"
    );
    assert!(
        runtime
            .lock("plain")
            .try_acquire()
            .await
            .expect("acquire")
            .is_some(),
        "the lock is free after its release"
    );

    // A waiter marks the record: the release goes through the script and wakes it.
    let holder = runtime
        .lock("waited")
        .ttl(Duration::from_secs(30))
        .try_acquire()
        .await
        .expect("acquire")
        .expect("free");
    let other = redis_runtime(server.url(), Duration::from_secs(2)).await;
    let waiter = tokio::spawn(async move {
        let started = std::time::Instant::now();
        let guard = other
            .lock("waited")
            .ttl(Duration::from_secs(30))
            .acquire()
            .await
            .expect("the waiter's acquire");
        (started.elapsed(), guard)
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    let evalsha = calls(&server, "evalsha").await;
    assert!(holder.release().await.expect("release"), "released");
    assert!(calls(&server, "evalsha").await > evalsha, "the script ran");
    let (waited, _guard) = waiter.await.expect("waiter task");
    assert!(
        waited < Duration::from_secs(10),
        "woken by the release, not by the 30 s ttl: {waited:?}"
    );
}
