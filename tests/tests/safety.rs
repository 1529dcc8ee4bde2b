//! The safety findings of the line-by-line review (issue 10), one test (or more) per finding.
//! Each test failed on the code before its fix; the doc comment says what it showed then.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use lock_runtime::{LockError, LockRuntime, MemoryStore, current_lease, distributed_lock};
use lock_testkit::suite::free_now;
use lock_tests::server::send_signal;
use lock_tests::wake::free_within_5s;
use lock_tests::{FaultProxy, RedisCluster, RedisServer, SentinelSet, TestStore, wake};
use tokio::time::Instant;

async fn runtime_via(url: String, command_timeout: Duration) -> LockRuntime {
    LockRuntime::builder()
        .redis(url)
        .command_timeout(command_timeout)
        .connect_timeout(Duration::from_secs(2))
        .build()
        .await
        .expect("build")
}

// ---------------------------------------------------------------------------------------------
// Finding 3 (a waiter whose runtime shuts down gets `LockError::Shutdown`) and finding 4 (shutdown
// is graceful) are conformance-kit cases now, run on every store: `shutdown_ends_waiters`,
// `shutdown_lets_running_jobs_finish`, `shutdown_releases_everything` (lock-testkit). Their
// tests that need a fault proxy or a stopped process stay here, further down.

// ---------------------------------------------------------------------------------------------
// Finding 5: with on_lost = "abort", the body is not polled again once the lease is lost.
// Before: `select!` polled the body first, so a body woken by the same loss ran on and
// completed its write after the lease was gone.

#[distributed_lock(
    key = "abort-order",
    ttl = "600ms",
    watchdog = false,
    on_lost = "abort"
)]
async fn writes_after_loss(wrote: Arc<AtomicBool>) -> Result<(), LockError> {
    if let Some(lease) = current_lease() {
        lease.lost().await;
    }
    wrote.store(true, Ordering::SeqCst);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn f05_abort_checks_the_loss_before_polling_the_body() {
    let runtime = TestStore::memory().runtime().await;
    let wrote = Arc::new(AtomicBool::new(false));
    let result = runtime.scope(writes_after_loss(wrote.clone())).await;
    assert!(
        matches!(result, Err(LockError::Lost { .. })),
        "expected Lost, got {result:?}"
    );
    assert!(
        !wrote.load(Ordering::SeqCst),
        "the body ran on after its lease was lost"
    );
}

#[distributed_lock(key = "born-lost", ttl = "300ms", on_lost = "abort")]
async fn never_starts(started: Arc<AtomicBool>) -> Result<(), LockError> {
    started.store(true, Ordering::SeqCst);
    Ok(())
}

/// A lease already lost when it is granted (the acquire's round trip took longer than the
/// ttl) never starts the body: the grant is given back and the call fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn f05_a_lease_lost_at_grant_never_starts_the_body() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    let runtime = runtime_via(proxy.url(), Duration::from_secs(5)).await;
    proxy.set_latency(Duration::from_millis(200));
    let started = Arc::new(AtomicBool::new(false));
    let result = runtime.scope(never_starts(started.clone())).await;
    assert!(result.is_err(), "expected an error, got {result:?}");
    assert!(
        !started.load(Ordering::SeqCst),
        "the body started on a lost lease"
    );
}

// ---------------------------------------------------------------------------------------------
// Finding 6: an acquire that errors after the server granted it gives the lock back.
// Before: the grant stayed, held by nobody, for its whole ttl (30 s here).

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn f06_acquire_error_after_grant_releases_in_the_background() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    let late = runtime_via(proxy.url(), Duration::from_millis(300)).await;
    let other = runtime_via(server.url(), Duration::from_secs(2)).await;
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
async fn f06_a_give_back_that_fails_is_tried_again() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    let late = runtime_via(proxy.url(), Duration::from_millis(300)).await;
    let other = runtime_via(server.url(), Duration::from_secs(2)).await;
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
async fn f06_wait_loop_leaves_no_orphan() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    let late = runtime_via(proxy.url(), Duration::from_millis(300)).await;
    let other = runtime_via(server.url(), Duration::from_secs(2)).await;
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
async fn f06_sentinel_acquire_timeout_leaves_no_orphan() {
    let set = SentinelSet::start();
    for sentinel in &set.sentinels {
        let mut conn = sentinel
            .client()
            .get_connection()
            .expect("connect to a sentinel");
        let _: () = redis::cmd("SENTINEL")
            .arg("SET")
            .arg(&set.master_name)
            .arg("down-after-milliseconds")
            .arg(60_000)
            .query(&mut conn)
            .expect("SENTINEL SET");
    }
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

// ---------------------------------------------------------------------------------------------
// Finding 7: a Redlock acquire that fails its quorum releases on every node, including nodes
// that answered too late. Before: with no grant counted in time nothing was released, and the
// late grants blocked every quorum for the whole ttl.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn f07_redlock_failed_quorum_releases_late_grants() {
    let servers: Vec<RedisServer> = (0..5).map(|_| RedisServer::start()).collect();
    let proxies: Vec<FaultProxy> = servers
        .iter()
        .map(|s| FaultProxy::start(s.port()))
        .collect();
    let late = LockRuntime::builder()
        .redlock(proxies.iter().map(FaultProxy::url))
        .node_timeout(Duration::from_millis(200))
        .build()
        .await
        .expect("build");
    let other = LockRuntime::builder()
        .redlock(servers.iter().map(RedisServer::url))
        .build()
        .await
        .expect("build");
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

// ---------------------------------------------------------------------------------------------
// Finding 9: the first renewal is due a third of the ttl after the acquire was *sent*.
// Before: it was timed from registration, so an acquire whose answer took long was declared
// lost before its first renewal could be answered.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn f09_first_renewal_is_timed_from_the_send() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    let runtime = runtime_via(proxy.url(), Duration::from_secs(5)).await;
    let ttl = Duration::from_secs(6);
    // Every answer takes 2.6 s (commands reach the server at once), for the whole test, so
    // nothing depends on when the test changes a setting. Timed from the send, the first
    // renewal goes out as the grant arrives (2.6 s) and is answered at 5.2 s, inside the
    // validity (about 5.94 s). Timed from registration it would go out at 4.6 s and be
    // answered at 7.2 s, after the lease was lost.
    proxy.set_reply_latency(Duration::from_millis(2600));
    let sent = Instant::now();
    let guard = runtime
        .lock("slow-grant")
        .ttl(ttl)
        .try_acquire()
        .await
        .expect("acquire")
        .expect("free");
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

// ---------------------------------------------------------------------------------------------
// Finding 12: once lost, always lost; a released lease is not held.
// Before: a lease past its validity read as lost, then as valid again after a late extend.

#[tokio::test(start_paused = true)]
async fn f12_is_lost_is_monotonic() {
    let runtime = LockRuntime::builder()
        .memory(MemoryStore::new())
        .build()
        .await
        .expect("build");
    let ttl = Duration::from_secs(10);
    let guard = runtime
        .lock("monotonic")
        .ttl(ttl)
        .watchdog(false)
        .try_acquire()
        .await
        .expect("acquire")
        .expect("free");
    assert!(guard.lease().is_held());
    // Past the validity (ttl minus drift) but before the store's record expires.
    tokio::time::advance(ttl - Duration::from_millis(50)).await;
    assert!(guard.lease().is_lost(), "past its validity");
    let extended = guard.extend(ttl).await.expect("extend");
    assert!(!extended, "a lost lease is not extended back to life");
    assert!(guard.lease().is_lost(), "once lost, always lost");
    assert!(!guard.lease().is_held());

    let released = runtime
        .lock("released")
        .ttl(ttl)
        .try_acquire()
        .await
        .expect("acquire")
        .expect("free");
    let lease = released.lease().clone();
    assert!(released.release().await.expect("release"));
    assert!(!lease.is_held(), "a released lease is not held");
    assert!(!lease.is_lost(), "released in time: not lost");
}

// ---------------------------------------------------------------------------------------------
// Finding 13a: `acquire_timeout` returns by its deadline even when a store call hangs.
// Before: a call in flight at the deadline ran to its own command timeout (5 s here).

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn f13_wait_timeout_bounds_store_calls() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    let runtime = runtime_via(proxy.url(), Duration::from_secs(5)).await;
    proxy.stall();
    let started = Instant::now();
    let result = runtime
        .lock("hung")
        .acquire_timeout(Duration::from_millis(500))
        .await;
    let took = started.elapsed();
    proxy.resume();
    assert!(
        matches!(result, Err(LockError::WaitTimeout { .. })),
        "expected WaitTimeout, got {result:?}"
    );
    assert!(
        took < Duration::from_millis(2500),
        "wait_timeout 500 ms took {took:?}"
    );
}

// Finding 13b: a Redlock waiter rides out a majority of masters being down.
// Before: "majority unreachable" was not transient, so the waiter failed at once.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn f13_redlock_waiter_rides_out_a_majority_outage() {
    let mut servers: Vec<RedisServer> = (0..5).map(|_| RedisServer::start()).collect();
    let runtime = LockRuntime::builder()
        .redlock(servers.iter().map(RedisServer::url))
        .build()
        .await
        .expect("build");
    for s in &mut servers[..3] {
        s.kill();
    }
    let waiter = {
        let runtime = runtime.clone();
        tokio::spawn(async move {
            runtime
                .lock("majority-down")
                .acquire_timeout(Duration::from_secs(15))
                .await
        })
    };
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        !waiter.is_finished(),
        "the waiter keeps waiting through the outage"
    );
    for s in &mut servers[..3] {
        s.restart();
    }
    let guard = waiter
        .await
        .expect("task")
        .expect("acquired once the masters were back");
    guard.release().await.expect("release");
}

// Finding 13d: max_hold is a hard cap: the lease ends by max_hold, not up to a ttl later.
// Before: the last renewal extended the lease by a full ttl past max_hold.

#[tokio::test(start_paused = true)]
async fn f13_max_hold_is_not_exceeded() {
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
        .expect("acquire")
        .expect("free");
    guard.lease().lost().await;
    let held = start.elapsed();
    assert!(
        held <= Duration::from_secs(40),
        "the lease outlived max_hold 40 s: {held:?}"
    );
    // The store agrees: free by max_hold too.
    tokio::time::sleep_until(start + Duration::from_secs(40)).await;
    assert!(
        b.lock("capped-hard")
            .try_acquire()
            .await
            .expect("try")
            .is_some(),
        "the record outlived max_hold"
    );
    drop(guard);
}

// ---------------------------------------------------------------------------------------------
// Finding 14: hybrid fences (never repeat after the counter is lost) and nothing kept forever.
// Before: a lost counter restarted fences at 1, and every key left a `:fence` key without an
// expiry.

/// The counter deleted where the store keeps it (the server, the slot's node, the master the
/// sentinels name, every Redlock master): a failover that lost the last INCR, or a counter
/// that expired. The next fence is still higher, on every Redis topology, each through its
/// own connection handling.
async fn fence_survives_a_lost_counter(store: TestStore) {
    let runtime = store.runtime().await;
    let first = runtime
        .lock("counter-lost")
        .try_acquire()
        .await
        .expect("acquire")
        .expect("free");
    let fence = first.lease().fence();
    assert!(first.release().await.expect("release"));
    store.redis_del("lock:{counter-lost}:fence").await;
    let second = runtime
        .lock("counter-lost")
        .try_acquire()
        .await
        .expect("acquire")
        .expect("free");
    assert!(
        second.lease().fence() > fence,
        "fence {} after the counter was lost, {fence} before",
        second.lease().fence()
    );
    assert!(second.release().await.expect("release"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn f14_fence_survives_a_lost_counter_redis() {
    fence_survives_a_lost_counter(TestStore::redis()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn f14_fence_survives_a_lost_counter_cluster() {
    fence_survives_a_lost_counter(TestStore::cluster()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn f14_fence_survives_a_lost_counter_sentinel() {
    fence_survives_a_lost_counter(TestStore::sentinel()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn f14_fence_survives_a_lost_counter_redlock() {
    fence_survives_a_lost_counter(TestStore::redlock()).await;
}

/// Redlock: a counter far ahead of the clock on one master (its clock ran fast) is lifted onto
/// every master with the grant, so when two masters later lose their counters the next quorum
/// still contains one that remembers, and fences go on from there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn f14_redlock_fences_go_on_when_a_minority_loses_its_counters() {
    let store = TestStore::redlock();
    let TestStore::Redlock(servers) = &store else {
        unreachable!("made as redlock")
    };
    let runtime = store.runtime().await;
    let ahead: u64 = 3_000_000_000_000_000;
    let mut conn = servers[0]
        .client()
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    let _: () = redis::cmd("SET")
        .arg("lock:{lifted}:fence")
        .arg(ahead)
        .query_async(&mut conn)
        .await
        .expect("SET");
    let first = runtime
        .lock("lifted")
        .try_acquire()
        .await
        .expect("acquire")
        .expect("free");
    let fence = first.lease().fence();
    assert!(
        fence > ahead,
        "fence {fence} below the counter {ahead} of a granting master"
    );
    assert!(first.release().await.expect("release"));
    for server in &servers[..2] {
        lock_tests::store::delete_on(server, "lock:{lifted}:fence").await;
    }
    let second = runtime
        .lock("lifted")
        .try_acquire()
        .await
        .expect("acquire")
        .expect("free");
    assert!(
        second.lease().fence() > fence,
        "fence {} after two of five masters lost their counters, {fence} before",
        second.lease().fence()
    );
    assert!(second.release().await.expect("release"));
}

/// A counter ahead of the server's clock (the clock stepped back, or a master with a faster
/// clock wrote it before a failover): fences go on from the counter, one more each time, and
/// the counter keeps its expiry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn f14_fence_counter_ahead_of_the_clock_goes_on_from_the_counter_redis() {
    let server = RedisServer::start();
    let runtime = runtime_via(server.url(), Duration::from_secs(2)).await;
    let mut conn = server
        .client()
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    // About 31 years of microseconds ahead of today's clock, still below 2^53.
    let ahead: u64 = 3_000_000_000_000_000;
    let _: () = redis::cmd("SET")
        .arg("lock:{clock-behind}:fence")
        .arg(ahead)
        .query_async(&mut conn)
        .await
        .expect("SET");
    for step in 1..=2u64 {
        let guard = runtime
            .lock("clock-behind")
            .try_acquire()
            .await
            .expect("acquire")
            .expect("free");
        assert_eq!(guard.lease().fence(), ahead + step, "acquire {step}");
        guard.release().await.expect("release");
    }
    let pttl: i64 = redis::cmd("PTTL")
        .arg("lock:{clock-behind}:fence")
        .query_async(&mut conn)
        .await
        .expect("PTTL");
    assert!(pttl > 0, "the counter keeps an expiry: PTTL {pttl}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn f14_every_key_left_behind_expires_redis() {
    let server = RedisServer::start();
    let runtime = runtime_via(server.url(), Duration::from_secs(2)).await;
    for i in 0..200 {
        let guard = runtime
            .lock(format!("one-shot-{i}"))
            .once(Duration::from_secs(60))
            .try_acquire()
            .await
            .expect("acquire")
            .expect("free");
        if i % 2 == 0 {
            guard.complete().await.expect("complete");
        } else {
            guard.release().await.expect("release");
        }
    }
    let mut conn = server
        .client()
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("*")
        .query_async(&mut conn)
        .await
        .expect("KEYS");
    assert!(
        !keys.is_empty(),
        "the fence counters and done markers are there"
    );
    let mut forever = Vec::new();
    for key in &keys {
        let pttl: i64 = redis::cmd("PTTL")
            .arg(key)
            .query_async(&mut conn)
            .await
            .expect("PTTL");
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
async fn f14_fence_survives_a_cleared_memory_store() {
    let store = MemoryStore::new();
    let runtime = LockRuntime::builder()
        .memory(store.clone())
        .build()
        .await
        .expect("build");
    let first = runtime
        .lock("cleared")
        .try_acquire()
        .await
        .expect("acquire")
        .expect("free");
    let fence = first.lease().fence();
    first.release().await.expect("release");
    store.clear();
    let second = runtime
        .lock("cleared")
        .try_acquire()
        .await
        .expect("acquire")
        .expect("free");
    assert!(
        second.lease().fence() > fence,
        "fence {} after the store lost its counters, {fence} before",
        second.lease().fence()
    );
    second.release().await.expect("release");
}

// ---------------------------------------------------------------------------------------------
// Findings 1 and 2: `replicated_acquire` runs its script and WAIT on a connection of their own,
// pipelined and never retried.

/// A master and one replica in sync.
async fn master_with_replica() -> (RedisServer, RedisServer) {
    // No 5 s pause before the first sync (the master's default).
    let master = RedisServer::start_with(&["--repl-diskless-sync-delay", "0"]);
    let port = master.port().to_string();
    let replica = RedisServer::start_with(&["--replicaof", "127.0.0.1", &port]);
    let mut conn = master
        .client()
        .get_multiplexed_async_connection()
        .await
        .expect("connect to the master");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let info: String = redis::cmd("INFO")
            .arg("replication")
            .query_async(&mut conn)
            .await
            .expect("INFO");
        // `state=online` is not enough: after a diskless sync the master streams to the
        // replica only once the replica's first REPLCONF ACK arrives (up to a second later),
        // and until then WAIT blocks. A write that WAIT confirms proves the stream is up.
        if info.contains("state=online") {
            let _: () = redis::cmd("SET")
                .arg("replica-sync-probe")
                .arg(1)
                .query_async(&mut conn)
                .await
                .expect("SET");
            // (Short: the client's own response timeout is under a second.)
            let acked: i64 = redis::cmd("WAIT")
                .arg(1)
                .arg(200)
                .query_async(&mut conn)
                .await
                .expect("WAIT");
            let _: () = redis::cmd("DEL")
                .arg("replica-sync-probe")
                .query_async(&mut conn)
                .await
                .expect("DEL");
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
async fn f01_replicated_acquire_never_confirms_through_a_retry() {
    let (master, replica) = master_with_replica().await;
    let proxy = FaultProxy::start(master.port());
    let runtime = LockRuntime::builder()
        .redis(proxy.url())
        .replicated_acquire(1, Duration::from_secs(3))
        .build()
        .await
        .expect("build");
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
            .map(|g| g.as_ref().map(|g| g.lease().fence()))
    );
    // And it was given back: free for others without waiting out the ttl.
    let direct = runtime_via(master.url(), Duration::from_secs(2)).await;
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
async fn f02_waits_do_not_starve_renewals() {
    let (master, mut replica) = master_with_replica().await;
    let runtime = LockRuntime::builder()
        .redis(master.url())
        .replicated_acquire(1, Duration::from_secs(1))
        .build()
        .await
        .expect("build");
    let mut held = Vec::new();
    for i in 0..20 {
        held.push(
            runtime
                .lock(format!("healthy-{i}"))
                .ttl(Duration::from_millis(900))
                .try_acquire()
                .await
                .expect("acquire while the replica is up")
                .expect("free"),
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

// ---------------------------------------------------------------------------------------------
// Finding 11: a body that succeeded leaves its `once` marker, even when its lease lapsed while
// it ran, and a re-entrant call with `once` leaves its own. Before: no marker was written in
// either case, and the job silently ran again at the next call.

#[distributed_lock(
    key = "once-lapsed",
    ttl = "1s",
    watchdog = false,
    on_lost = "continue",
    once = "1h"
)]
async fn slow_once(runs: Arc<std::sync::atomic::AtomicU64>) -> Option<()> {
    runs.fetch_add(1, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(2)).await;
    Some(())
}

#[tokio::test(start_paused = true)]
async fn f11_once_marker_survives_a_lapsed_lease() {
    let runtime = TestStore::memory().runtime().await;
    let runs = Arc::new(std::sync::atomic::AtomicU64::new(0));
    assert_eq!(runtime.scope(slow_once(runs.clone())).await, Some(()));
    assert_eq!(
        runtime.scope(slow_once(runs.clone())).await,
        None,
        "skipped"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the job ran once");
}

// The re-entrant half of finding 11 is the kit case `attr_reentrant_once_leaves_its_marker`.

// ---------------------------------------------------------------------------------------------
// Finding 13c: a task that waits for a lock it holds itself through `lock()` is never left
// waiting silently. Before: both the annotated `wait` call and a second `acquire` waited
// forever without a word (here: until the 3 s test timeout). An error was tried and dropped:
// a guard moved to another task, which will release it, is held by "this task" as far as the
// runtime can tell, and waiting for it there is a fine pattern (the last case below).

#[distributed_lock(key = "held-by-guard", on_contention = "wait", wait_timeout = "300ms")]
async fn waits_for_held_key() -> Result<u64, LockError> {
    Ok(current_lease().map_or(0, |l| l.fence()))
}

/// Collects what the runtime logs, for the assertions on warnings.
#[derive(Clone, Default)]
struct Logs(Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Logs {
    fn text(&self) -> String {
        String::from_utf8_lossy(
            &self
                .0
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        )
        .into_owned()
    }
}

#[tokio::test]
async fn f13_waiting_for_a_lock_this_task_holds_is_never_silent() {
    let logs = Logs::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::WARN)
        .with_writer(move || writer.clone())
        .finish();
    let _default = tracing::subscriber::set_default(subscriber);
    let runtime = TestStore::memory().runtime().await;
    let guard = runtime
        .lock("held-by-guard")
        .acquire()
        .await
        .expect("acquire");
    let nested = tokio::time::timeout(Duration::from_secs(3), runtime.scope(waits_for_held_key()))
        .await
        .expect("bounded by its wait_timeout");
    assert!(
        matches!(nested, Err(LockError::WaitTimeout { .. })),
        "expected WaitTimeout, got {nested:?}"
    );
    let again = tokio::time::timeout(
        Duration::from_secs(3),
        runtime
            .lock("held-by-guard")
            .acquire_timeout(Duration::from_millis(300)),
    )
    .await
    .expect("bounded by its timeout");
    assert!(
        matches!(again, Err(LockError::WaitTimeout { .. })),
        "{again:?}"
    );
    let warned = logs
        .text()
        .matches("already holds the lock it now waits for")
        .count();
    assert_eq!(warned, 2, "each self-wait is reported: {}", logs.text());

    // The guard handed to another task that releases it: the wait here simply succeeds.
    let worker = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(200)).await;
        guard.release().await.expect("release");
    });
    let after_worker = runtime
        .lock("held-by-guard")
        .acquire_timeout(Duration::from_secs(3))
        .await
        .expect("acquired once the worker released it");
    worker.await.expect("worker");
    after_worker.release().await.expect("release");
}

// ---------------------------------------------------------------------------------------------
// Finding 10: waiters are woken when their channel's subscription is confirmed again after a
// reconnect. Before: a release published between the disconnection's wake-up and the
// re-subscription was missed, and the waiter slept until the holder's ttl ran out (30 s).

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn f10_waiters_wake_after_the_subscriber_resubscribes() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    let waiting = LockRuntime::builder()
        .redis(proxy.url())
        .connect_timeout(Duration::from_secs(10))
        .command_timeout(Duration::from_secs(5))
        .build()
        .await
        .expect("build");
    let holder = runtime_via(server.url(), Duration::from_secs(2)).await;
    let guard = holder
        .lock("resubscribed")
        .ttl(Duration::from_secs(30))
        .try_acquire()
        .await
        .expect("acquire")
        .expect("free");
    let waiter = {
        let waiting = waiting.clone();
        tokio::spawn(async move {
            waiting
                .lock("resubscribed")
                .acquire_timeout(Duration::from_secs(20))
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    // Only the subscriber connection drops, and its reconnect is slow (1 s each way); the
    // command connection stays up, so the waiter's wake-up attempt finds the lock held.
    proxy.set_new_connection_latency(Duration::from_secs(1));
    let mut conn = server
        .client()
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    let killed: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("pubsub")
        .query_async(&mut conn)
        .await
        .expect("CLIENT KILL");
    assert_eq!(killed, 1, "the waiter's subscriber connection");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let released_at = Instant::now();
    assert!(
        guard.release().await.expect("release"),
        "published while unsubscribed"
    );
    let taken = waiter
        .await
        .expect("task")
        .expect("the waiter got the lock without waiting out the 30 s ttl");
    let took = released_at.elapsed();
    assert!(
        took < Duration::from_secs(15),
        "woken {took:?} after the release"
    );
    proxy.set_new_connection_latency(Duration::ZERO);
    taken.release().await.expect("release");
}

/// The same after a long outage: the waiter's runtime cannot reach Redis for 10 s (every
/// connection refused and dropped) while the lock stays held; a release made after Redis is
/// reachable again wakes the waiter within seconds, not at the holder's ttl.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn f10_waiters_wake_after_a_long_outage() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    let waiting = runtime_via(proxy.url(), Duration::from_millis(500)).await;
    let holder = runtime_via(server.url(), Duration::from_secs(2)).await;
    wake::waiter_wakes_after_an_outage(&waiting, &holder, "long-outage", |down| {
        proxy.refuse(down);
        if down {
            proxy.drop_connections();
        }
    })
    .await;
}

// ---------------------------------------------------------------------------------------------
// Finding 8: on a Cluster, renewals answer per slot: a shard that stops answering costs only
// the leases in its own slots. Before: one failing shard failed the renewal of every lease in
// the batch, and leases on healthy shards were declared lost with it.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn f08_a_failing_shard_costs_only_its_own_leases() {
    let cluster = RedisCluster::start(3);
    let runtime = LockRuntime::builder()
        .redis_cluster(cluster.urls())
        .command_timeout(Duration::from_millis(400))
        .build()
        .await
        .expect("build");
    let keys: Vec<String> = (0..30).map(|i| format!("sharded-{i}")).collect();
    let (victim, _) = cluster.master_and_replica_of(&format!("lock:{{{}}}", keys[0]));
    let mut healthy = Vec::new();
    let mut on_victim = 0;
    let mut guards = Vec::new();
    for key in &keys {
        let guard = runtime
            .lock(key.as_str())
            .ttl(Duration::from_millis(1500))
            .try_acquire()
            .await
            .expect("acquire")
            .expect("free");
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
        let mut conn = node
            .client()
            .get_multiplexed_async_connection()
            .await
            .expect("connect to a node");
        let _: () = redis::cmd("CONFIG")
            .arg("SET")
            .arg("cluster-require-full-coverage")
            .arg("no")
            .query_async(&mut conn)
            .await
            .expect("CONFIG SET");
        if i == victim_replica {
            let _: () = redis::cmd("CONFIG")
                .arg("SET")
                .arg("cluster-replica-no-failover")
                .arg("yes")
                .query_async(&mut conn)
                .await
                .expect("CONFIG SET");
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

/// Review of the fixes: `shutdown()` returns only after a release that the holder awaits
/// itself has landed. Before: the watchdog, finding no lease left, let `shutdown()` return
/// while that release was still on its way (here: 1 s through a slow link), so a process
/// exiting right after its shutdown could leave the lock to its ttl.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn f04_shutdown_waits_for_a_release_in_flight() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    let holder = LockRuntime::builder()
        .redis(proxy.url())
        .shutdown_grace(Duration::from_secs(20))
        .build()
        .await
        .expect("build");
    let other = runtime_via(server.url(), Duration::from_secs(2)).await;
    let guard = holder
        .lock("released-late")
        .ttl(Duration::from_secs(30))
        .try_acquire()
        .await
        .expect("acquire")
        .expect("free");
    proxy.set_latency(Duration::from_millis(500));
    let releasing = tokio::spawn(guard.release());
    tokio::time::sleep(Duration::from_millis(100)).await;
    holder.shutdown().await;
    assert!(
        other
            .lock("released-late")
            .try_acquire()
            .await
            .expect("try")
            .is_some(),
        "shutdown returned before the holder's own release had landed"
    );
    assert!(releasing.await.expect("task").expect("release"));
}

/// Review of the fixes: a release kept for `min_hold` is no longer the holder's. A renewal
/// that reaches the store after it (spawned before the release, or retried after a reconnect)
/// must not stretch the record to a whole ttl. Before: the record kept the token, so the late
/// renewal (the runtime's own extend script, sent here by hand) extended it from min_hold to
/// the 60 s ttl, held by nobody.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn f04_a_renewal_after_a_min_hold_release_does_not_extend_it() {
    let server = RedisServer::start();
    let runtime = runtime_via(server.url(), Duration::from_secs(2)).await;
    let guard = runtime
        .lock("kept")
        .ttl(Duration::from_secs(60))
        .min_hold(Duration::from_secs(2))
        .try_acquire()
        .await
        .expect("acquire")
        .expect("free");
    let token = guard.lease().token().to_owned();
    assert!(guard.release().await.expect("release"), "kept for min_hold");
    let mut conn = server
        .client()
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    let renewed: Vec<i64> = redis::Script::new(include_str!(
        "../../lock-runtime/src/store/redis/lua/extend.lua"
    ))
    .key("lock:{kept}")
    .arg(&token)
    .arg(60_000)
    .invoke_async(&mut conn)
    .await
    .expect("the extend script");
    let pttl: i64 = redis::cmd("PTTL")
        .arg("lock:{kept}")
        .query_async(&mut conn)
        .await
        .expect("PTTL");
    assert_eq!(renewed, vec![0], "a released lease is not renewed");
    assert!(
        pttl <= 2_000,
        "the record lives {pttl} ms, beyond its 2 s min_hold"
    );
}

/// Review of the fixes: a replicated acquire cut off by its deadline after its script was
/// written, but before the server ran it, gives the grant back on its own connection, after
/// the script. Before: the give-back went out on the runtime's shared connection, overtook
/// the slow script, found nothing, and the grant stayed with a token nobody holds (ttl 30 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn f01_a_cancelled_replicated_acquire_leaves_no_grant() {
    let (master, _replica) = master_with_replica().await;
    let proxy = FaultProxy::start(master.port());
    let runtime = LockRuntime::builder()
        .redis(proxy.url())
        .replicated_acquire(1, Duration::from_secs(2))
        .command_timeout(Duration::from_secs(10))
        .connect_timeout(Duration::from_secs(10))
        .build()
        .await
        .expect("build");
    let direct = runtime_via(master.url(), Duration::from_secs(2)).await;
    // Each replicated acquire opens a connection of its own: make those slow (latency L per
    // hop) while the runtime's shared connection stays fast.
    let hop = Duration::from_millis(600);
    proxy.set_new_connection_latency(hop);
    // One whole acquire, to learn how long the set-up takes: the pipeline is written 2 hops
    // before the answer arrives and runs on the server 1 hop before it.
    let started = Instant::now();
    let probe = runtime
        .lock("probe")
        .ttl(Duration::from_secs(30))
        .try_acquire()
        .await
        .expect("acquire")
        .expect("free");
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

/// Runs `body` on a tokio runtime of its own that is dropped as soon as `body` returns, like a
/// process that exits right after `shutdown().await`: whatever the shutdown did not wait for
/// is cut off.
fn in_a_process_that_exits<F, Fut>(body: F) -> std::thread::JoinHandle<()>
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()>,
{
    std::thread::spawn(move || {
        let process = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("a tokio runtime");
        process.block_on(body());
    })
}

/// Cuts every connection through `proxy` and refuses new ones for `outage`: a write that
/// was not sent yet waits for a reconnect, one already on its way still lands.
fn outage(proxy: &Arc<FaultProxy>, outage: Duration) {
    proxy.refuse(true);
    proxy.drop_connections();
    let proxy = proxy.clone();
    std::thread::spawn(move || {
        std::thread::sleep(outage);
        proxy.refuse(false);
    });
}

/// Review of the fixes: a grant cut off by the shutdown itself is given back before
/// `shutdown()` returns, also when nothing else was held (the watchdog stops at once), so a
/// process exiting right after its shutdown leaves nothing behind. A regression test: it also
/// passed on the code before the fix, where the give-back usually reached the watchdog before
/// it stopped; the fix counts the give-back that comes too late for the watchdog.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn f03_shutdown_waits_for_the_give_back_of_a_cut_off_grant() {
    let server = RedisServer::start();
    let proxy = Arc::new(FaultProxy::start(server.port()));
    let direct = runtime_via(server.url(), Duration::from_secs(2)).await;
    let in_process = proxy.clone();
    let process = in_a_process_that_exits(move || async move {
        let proxy = in_process;
        let runtime = runtime_via(proxy.url(), Duration::from_secs(5)).await;
        proxy.set_latency(Duration::from_millis(500));
        let waiting = {
            let runtime = runtime.clone();
            tokio::spawn(async move {
                runtime
                    .lock("cut-by-shutdown")
                    .ttl(Duration::from_secs(30))
                    .acquire()
                    .await
            })
        };
        // The acquire is on its way through the slow link (it will land) when the link
        // breaks for a second and the shutdown starts: the give-back must wait to reconnect.
        tokio::time::sleep(Duration::from_millis(200)).await;
        outage(&proxy, Duration::from_secs(1));
        runtime.shutdown().await;
        let ended = waiting.await.expect("task");
        assert!(matches!(ended, Err(LockError::Shutdown)), "{ended:?}");
    });
    tokio::task::spawn_blocking(move || process.join())
        .await
        .expect("join")
        .expect("the process ran");
    proxy.set_latency(Duration::ZERO);
    tokio::time::sleep(Duration::from_secs(2)).await;
    free_now(
        &direct,
        "cut-by-shutdown",
        "no grant was left behind for the 30 s ttl",
    )
    .await;
}

/// Review of the fixes: a second `shutdown()` (say from a signal handler while `main` shuts
/// down too) returns only when the first one's releases have landed. Before: once the
/// watchdog stopped taking commands, a second call returned at once, and the process exiting
/// then cut off the end-of-grace release while it waited for a reconnect, leaving the lock
/// for its 30 s ttl.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn f04_a_second_shutdown_waits_for_the_same_end() {
    let server = RedisServer::start();
    let proxy = Arc::new(FaultProxy::start(server.port()));
    let direct = runtime_via(server.url(), Duration::from_secs(2)).await;
    let in_process = proxy.clone();
    let process = in_a_process_that_exits(move || async move {
        let proxy = in_process;
        let runtime = LockRuntime::builder()
            .redis(proxy.url())
            .command_timeout(Duration::from_secs(5))
            .shutdown_grace(Duration::from_millis(300))
            .build()
            .await
            .expect("build");
        let guard = runtime
            .lock("shut-twice")
            .ttl(Duration::from_secs(30))
            .try_acquire()
            .await
            .expect("acquire")
            .expect("free");
        // The link breaks for a second: the end-of-grace release waits to reconnect.
        outage(&proxy, Duration::from_secs(1));
        let first = {
            let runtime = runtime.clone();
            tokio::spawn(async move { runtime.shutdown().await })
        };
        tokio::time::sleep(Duration::from_millis(500)).await;
        runtime.shutdown().await;
        drop(guard);
        drop(first);
    });
    tokio::task::spawn_blocking(move || process.join())
        .await
        .expect("join")
        .expect("the process ran");
    tokio::time::sleep(Duration::from_secs(2)).await;
    free_now(
        &direct,
        "shut-twice",
        "the lock was released before the process exited",
    )
    .await;
}

/// Review of the fixes: `LockGuard::extend` respects `max_hold` as the watchdog does. Before:
/// an explicit extend of 60 s took the lease 45 s past its 20 s max_hold.
#[tokio::test(start_paused = true)]
async fn f13_extend_respects_max_hold() {
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
        .expect("acquire")
        .expect("free");
    tokio::time::advance(Duration::from_secs(5)).await;
    assert!(guard.extend(Duration::from_secs(60)).await.expect("extend"));
    tokio::time::sleep_until(start + Duration::from_secs(20)).await;
    assert!(guard.lease().is_lost(), "the lease ends at max_hold");
    assert!(
        b.lock("capped-extend")
            .try_acquire()
            .await
            .expect("try")
            .is_some(),
        "the record ends at max_hold too"
    );
    assert!(
        !guard.extend(Duration::from_secs(60)).await.expect("extend"),
        "nothing is left of max_hold"
    );
}
