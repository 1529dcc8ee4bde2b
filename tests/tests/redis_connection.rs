//! The store's own connection to one Redis server (`store/redis/wire.rs`): its replies line
//! up with the requests that asked, also when a request gave up before its reply came.

use std::time::Duration;

use lock_tests::runtimes::redis_runtime;
use lock_tests::{FaultProxy, RedisServer, TakeFree, acquire_in_task};
use tokio::time::Instant;

/// A request that timed out leaves its connection up, and its reply, when it comes, must go
/// to no one: handed to the next request on the connection, the late "OK" of an acquire would
/// tell that request it holds a lock another runtime holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_that_comes_after_its_request_gave_up_goes_to_no_one_else() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    let direct = redis_runtime(server.url(), Duration::from_secs(2)).await;
    let other = direct.take("held-elsewhere", Duration::from_secs(30)).await;

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
    server
        .command_stat("calls", |command| command == name)
        .await
        .expect("INFO commandstats")
}

/// Whether the server knows `DELIFEQ` (Valkey 9).
async fn takes_delifeq(server: &RedisServer) -> bool {
    let native: redis::Value = redis::cmd("COMMAND")
        .arg("INFO")
        .arg("DELIFEQ")
        .query_async(&mut server.conn().await)
        .await
        .expect("COMMAND INFO");
    matches!(&native, redis::Value::Array(items) if items.first().is_some_and(|c| *c != redis::Value::Nil))
}

/// Where the server has `DELIFEQ` (Valkey 9; the server matrix runs this file there), a plain
/// release is that one native command and no script; elsewhere it is the release script. A
/// record a waiter marked is still released by the script, which wakes the waiter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_release_is_the_servers_own_compare_and_delete_where_it_has_one() {
    let server = RedisServer::start();
    let native = takes_delifeq(&server).await;
    let runtime = redis_runtime(server.url(), Duration::from_secs(2)).await;
    let (delifeq, evalsha) = (
        calls(&server, "delifeq").await,
        calls(&server, "evalsha").await,
    );
    let guard = runtime.take("plain", Duration::from_secs(10)).await;
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
    let holder = runtime.take("waited", Duration::from_secs(30)).await;
    let other = redis_runtime(server.url(), Duration::from_secs(2)).await;
    let started = Instant::now();
    let waiter = acquire_in_task(other, "waited", Duration::from_secs(25));
    tokio::time::sleep(Duration::from_millis(500)).await;
    let evalsha = calls(&server, "evalsha").await;
    assert!(holder.release().await.expect("release"), "released");
    assert!(calls(&server, "evalsha").await > evalsha, "the script ran");
    let _guard = waiter
        .await
        .expect("waiter task")
        .expect("the waiter's acquire");
    let waited = started.elapsed();
    assert!(
        waited < Duration::from_secs(10),
        "woken by the release, not by the 30 s ttl: {waited:?}"
    );
}

/// Plain releases on their way at the same time go out together, as one script call per
/// group (`store/redis/group.rs`), where the server has no `DELIFEQ`. Among them, a record a
/// waiter marked is still released by the full script, which wakes the waiter, and a record
/// another runtime holds by now is left to it and reported as not ours.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_releases_on_their_way_together_go_out_as_one_script_call() {
    const PLAIN: usize = 64;
    const TTL: Duration = Duration::from_secs(30);
    let server = RedisServer::start();
    let native = takes_delifeq(&server).await;
    let runtime = redis_runtime(server.url(), Duration::from_secs(2)).await;
    let other = redis_runtime(server.url(), Duration::from_secs(2)).await;
    let mut guards = Vec::new();
    for i in 0..PLAIN {
        guards.push(runtime.take(format!("group-{i}"), TTL).await);
    }
    // Waited for: the waiter marks the record.
    let waited = runtime.take("group-waited", TTL).await;
    let started = Instant::now();
    let waiter = acquire_in_task(other.clone(), "group-waited", Duration::from_secs(25));
    // Lapsed and taken by the other runtime meanwhile (its record deleted by hand).
    let lapsed = runtime.take("group-lapsed", TTL).await;
    let _: i64 = redis::cmd("DEL")
        .arg("lock:{group-lapsed}")
        .query_async(&mut server.conn().await)
        .await
        .expect("DEL");
    let taken_over = other.take("group-lapsed", TTL).await;
    tokio::time::sleep(Duration::from_millis(500)).await;

    let (evalsha, delifeq) = (
        calls(&server, "evalsha").await,
        calls(&server, "delifeq").await,
    );
    let mut releases = Vec::new();
    for guard in guards.into_iter().chain([waited]) {
        releases.push(tokio::spawn(guard.release()));
    }
    let lapsed_release = tokio::spawn(lapsed.release());
    for release in releases {
        assert!(release.await.expect("task").expect("release"), "released");
    }
    assert!(
        !lapsed_release.await.expect("task").expect("release"),
        "a record another runtime holds is not ours to release"
    );
    let (evalsha, delifeq) = (
        calls(&server, "evalsha").await - evalsha,
        calls(&server, "delifeq").await - delifeq,
    );
    if native {
        // DELIFEQ per plain release; the script only for the two it leaves alone.
        assert_eq!(delifeq, PLAIN as u64 + 2, "DELIFEQ per release");
        assert_eq!(
            evalsha, 2,
            "the script for the marked and the lapsed record"
        );
    } else {
        assert!(
            evalsha < (PLAIN as u64) / 2,
            "{} releases took {evalsha} script calls: they did not go out in groups",
            PLAIN + 2
        );
    }
    for i in 0..PLAIN {
        let exists: i64 = redis::cmd("EXISTS")
            .arg(format!("lock:{{group-{i}}}"))
            .query_async(&mut server.conn().await)
            .await
            .expect("EXISTS");
        assert_eq!(exists, 0, "group-{i} is released");
    }
    let _guard = waiter
        .await
        .expect("waiter task")
        .expect("the waiter's acquire");
    let waited = started.elapsed();
    assert!(
        waited < Duration::from_secs(10),
        "woken by the release, not by the 30 s ttl: {waited:?}"
    );
    assert!(
        taken_over.release().await.expect("release"),
        "the other runtime's record was left alone"
    );
}
