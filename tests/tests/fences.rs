//! Hybrid fences: a fence never repeats, also when its counter is lost or runs ahead of the
//! clock, and nothing is kept per key forever.
//! Each test failed on the code before its fix (docs/SAFETY.md); its comments say how.

use lock_tests::Built;
use lock_tests::Free;
use lock_tests::TakeFree;
use std::time::Duration;

use lock_runtime::{LockRuntime, MemoryStore};
use lock_tests::{RedisServer, TestStore, redis_runtime};

// Finding 14: hybrid fences (never repeat after the counter is lost) and nothing kept forever.
// Before: a lost counter restarted fences at 1, and every key left a `:fence` key without an
// expiry.

/// The counter deleted where the store keeps it (the server, the slot's node, the master the
/// sentinels name, every Redlock master): a failover that lost the last INCR, or a counter
/// that expired. The next fence is still higher, on every Redis topology, each through its
/// own connection handling.
async fn fence_survives_a_lost_counter(store: TestStore) {
    let runtime = store.runtime().await;
    let first = runtime.take_default_ttl("counter-lost").await;
    let fence = first.lease().fence().await.expect("a fence");
    assert!(first.release().await.expect("release"));
    store.redis_del("lock:{counter-lost}:fence").await;
    let second = runtime.take_default_ttl("counter-lost").await;
    assert!(
        second.lease().fence().await.expect("a fence") > fence,
        "fence {} after the counter was lost, {fence} before",
        second.lease().fence().await.expect("a fence")
    );
    assert!(second.release().await.expect("release"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fence_survives_a_lost_counter_redis() {
    fence_survives_a_lost_counter(TestStore::redis()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fence_survives_a_lost_counter_cluster() {
    fence_survives_a_lost_counter(TestStore::cluster()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fence_survives_a_lost_counter_sentinel() {
    fence_survives_a_lost_counter(TestStore::sentinel()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fence_survives_a_lost_counter_redlock() {
    fence_survives_a_lost_counter(TestStore::redlock()).await;
}

/// Redlock: a counter far ahead of the clock on one master (its clock ran fast) is lifted onto
/// every master with the grant, so when two masters later lose their counters the next quorum
/// still contains one that remembers, and fences go on from there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_fences_go_on_when_a_minority_loses_its_counters() {
    let store = TestStore::redlock();
    let TestStore::Redlock(servers) = &store else {
        unreachable!("made as redlock")
    };
    let runtime = store.runtime().await;
    let ahead: u64 = 3_000_000_000_000_000;
    let mut conn = servers[0].conn().await;
    let _: () = lock_tests::query(&mut conn, ("SET", "lock:{lifted}:fence", ahead)).await;
    let first = runtime.take_default_ttl("lifted").await;
    let fence = first.lease().fence().await.expect("a fence");
    assert!(
        fence > ahead,
        "fence {fence} below the counter {ahead} of a granting master"
    );
    assert!(first.release().await.expect("release"));
    for server in &servers[..2] {
        lock_tests::store::delete_on(server, "lock:{lifted}:fence").await;
    }
    let second = runtime.take_default_ttl("lifted").await;
    assert!(
        second.lease().fence().await.expect("a fence") > fence,
        "fence {} after two of five masters lost their counters, {fence} before",
        second.lease().fence().await.expect("a fence")
    );
    assert!(second.release().await.expect("release"));
}

/// A counter ahead of the server's clock (the clock stepped back, or a master with a faster
/// clock wrote it before a failover): fences go on from the counter, one more each time, and
/// the counter keeps its expiry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_counter_ahead_of_the_clock_goes_on_from_the_counter() {
    let server = RedisServer::start();
    let runtime = redis_runtime(server.url(), Duration::from_secs(2)).await;
    let mut conn = server.conn().await;
    // About 31 years of microseconds ahead of today's clock, still below 2^53.
    let ahead: u64 = 3_000_000_000_000_000;
    let _: () = lock_tests::query(&mut conn, ("SET", "lock:{clock-behind}:fence", ahead)).await;
    for step in 1..=2u64 {
        let guard = runtime.take_default_ttl("clock-behind").await;
        assert_eq!(
            guard.lease().fence().await.expect("a fence"),
            ahead + step,
            "acquire {step}"
        );
        guard.release().await.expect("release");
    }
    let pttl: i64 = lock_tests::query(&mut conn, ("PTTL", "lock:{clock-behind}:fence")).await;
    assert!(pttl > 0, "the counter keeps an expiry: PTTL {pttl}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_key_left_behind_expires() {
    let server = RedisServer::start();
    let runtime = redis_runtime(server.url(), Duration::from_secs(2)).await;
    for i in 0..200 {
        let guard = runtime
            .lock(format!("one-shot-{i}"))
            .once(Duration::from_secs(60))
            .try_acquire()
            .await
            .free();
        if i % 2 == 0 {
            guard.complete().await.expect("complete");
        } else {
            guard.release().await.expect("release");
        }
    }
    let mut conn = server.conn().await;
    let keys: Vec<String> = lock_tests::query(&mut conn, ("KEYS", "*")).await;
    assert!(
        !keys.is_empty(),
        "the fence counters and done markers are there"
    );
    let mut forever = Vec::new();
    for key in &keys {
        let pttl: i64 = lock_tests::query(&mut conn, ("PTTL", key)).await;
        if pttl < 0 {
            forever.push(key.clone());
        }
    }
    assert!(
        forever.is_empty(),
        "{} of {} keys have no expiry, e.g. {:?}",
        forever.len(),
        keys.len(),
        forever.first()
    );
}

#[tokio::test(start_paused = true)]
async fn a_fence_survives_a_cleared_memory_store() {
    let store = MemoryStore::new();
    let runtime = LockRuntime::builder().memory(store.clone()).built().await;
    let first = runtime.take_default_ttl("cleared").await;
    let fence = first.lease().fence().await.expect("a fence");
    first.release().await.expect("release");
    store.clear();
    let second = runtime.take_default_ttl("cleared").await;
    assert!(
        second.lease().fence().await.expect("a fence") > fence,
        "fence {} after the store lost its counters, {fence} before",
        second.lease().fence().await.expect("a fence")
    );
    second.release().await.expect("release");
}
