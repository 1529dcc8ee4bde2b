//! Event-driven waiting on a real Redis: a release wakes few acquire attempts, not one per
//! waiting task (attempts counted by the server, INFO commandstats, not by the client);
//! waiters wake after their subscription comes back; a wait ends by its deadline whatever the
//! store does; waiting for a lock the task holds itself is never silent.

use lock_tests::Built;
use lock_tests::TakeFree;
use lock_tests::proxied_redis;
use std::time::Duration;

use std::sync::Arc;

use lock_runtime::{LockError, LockRuntime, current_lease, distributed_lock};
use lock_tests::{FaultProxy, RedisServer, TestStore, redis_runtime, wake};
use tokio::time::Instant;

/// Script calls (EVALSHA and EVAL) the server has executed so far.
async fn script_calls(server: &RedisServer) -> u64 {
    server
        .command_stat("calls", |c| c == "evalsha" || c == "eval")
        .await
        .expect("INFO commandstats")
}

/// `runtimes` runtimes x `tasks` tasks each take the one key `rounds` times, holding it 2 ms.
/// Returns store acquire attempts per acquisition.
async fn attempts_per_acquisition(runtimes: usize, tasks: usize, rounds: usize) -> f64 {
    let server = RedisServer::start();
    let mut handles = Vec::new();
    let mut all = Vec::new();
    for _ in 0..runtimes {
        all.push(LockRuntime::builder().redis(server.url()).built().await);
    }
    let before = script_calls(&server).await;
    for runtime in &all {
        for _ in 0..tasks {
            let runtime = runtime.clone();
            handles.push(tokio::spawn(async move {
                for _ in 0..rounds {
                    let guard = runtime
                        .lock("herd")
                        .ttl(Duration::from_secs(10))
                        .acquire_timeout(Duration::from_secs(60))
                        .await
                        .expect("acquire");
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    assert!(guard.release().await.expect("release"));
                }
            }));
        }
    }
    for handle in handles {
        handle.await.expect("task");
    }
    let calls = script_calls(&server).await - before;
    let acquisitions = (runtimes * tasks * rounds) as u64;
    // Every acquisition is followed by exactly one release script call.
    let attempts = calls - acquisitions;
    attempts as f64 / acquisitions as f64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_runtime_sixteen_waiters_make_few_attempts_per_handoff() {
    let per = attempts_per_acquisition(1, 16, 10).await;
    println!("1 runtime x 16 waiters: {per:.2} acquire attempts per acquisition");
    // Without the per-runtime queue every release would wake all 15 other waiters.
    assert!(per <= 3.0, "{per:.2} attempts per acquisition");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_runtimes_wake_about_one_attempt_each_per_handoff() {
    let per = attempts_per_acquisition(4, 4, 10).await;
    println!("4 runtimes x 4 waiters: {per:.2} acquire attempts per acquisition");
    assert!(per <= 2.0 * 4.0 + 1.0, "{per:.2} attempts per acquisition");
}

/// Subscribers on the server for `channel` (PUBSUB NUMSUB).
async fn subscribers(server: &RedisServer, channel: &str) -> i64 {
    let mut conn = server.conn().await;
    let (_, count): (String, i64) =
        lock_tests::query(&mut conn, ("PUBSUB", "NUMSUB", channel)).await;
    count
}

/// A waiter that gives up while the link to Redis is cut cannot unsubscribe then; once the
/// link is back, its subscription must not outlive it (the client would otherwise renew it at
/// every reconnect for the life of the process): the server counts no subscriber left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_that_gives_up_during_a_cut_leaves_no_subscription() {
    let server = RedisServer::start();
    let proxy = lock_tests::FaultProxy::start(server.port());
    let holder = LockRuntime::builder().redis(server.url()).built().await;
    let waiting = LockRuntime::builder()
        .redis(proxy.url())
        .command_timeout(Duration::from_millis(500))
        .connect_timeout(Duration::from_millis(500))
        .built()
        .await;
    let guard = holder.take("gave-up", Duration::from_secs(30)).await;
    let channel = "lock:{gave-up}:released";
    let waiter = lock_tests::acquire_in_task(waiting.clone(), "gave-up", Duration::from_secs(2));
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        subscribers(&server, channel).await,
        1,
        "the waiter subscribed"
    );
    proxy.refuse(true);
    proxy.drop_connections();
    let gave_up = waiter.await.expect("task");
    assert!(gave_up.is_err(), "the lock is held: {gave_up:?}");
    tokio::time::sleep(Duration::from_secs(2)).await;
    proxy.refuse(false);
    // The subscriber reconnects (and renews what it still has); within a few seconds no
    // subscription of the given-up waiter may be left.
    let until = tokio::time::Instant::now() + Duration::from_secs(10);
    let mut left = subscribers(&server, channel).await;
    while left > 0 && tokio::time::Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(200)).await;
        left = subscribers(&server, channel).await;
    }
    // And it stays that way: the reconnect is over, not still to come.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let later = subscribers(&server, channel).await;
    assert_eq!(
        (left, later),
        (0, 0),
        "the given-up waiter's subscription was left on the server"
    );
    // The waiting runtime still works once the link is back.
    let taken = lock_tests::acquire_in_task(waiting.clone(), "gave-up", Duration::from_secs(10));
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(guard.release().await.expect("release"));
    let taken = taken.await.expect("task").expect("the waiter gets it");
    taken.release().await.expect("release");
    waiting.shutdown().await;
    holder.shutdown().await;
}

// Finding 13a: `acquire_timeout` returns by its deadline even when a store call hangs.
// Before: a call in flight at the deadline ran to its own command timeout (5 s here).

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_timeout_bounds_store_calls() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    let runtime = redis_runtime(proxy.url(), Duration::from_secs(5)).await;
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
async fn a_redlock_waiter_rides_out_a_majority_outage() {
    let mut servers: Vec<RedisServer> = (0..5).map(|_| RedisServer::start()).collect();
    let runtime = LockRuntime::builder()
        .redlock(servers.iter().map(RedisServer::url))
        .built()
        .await;
    for s in &mut servers[..3] {
        s.kill();
    }
    let waiter = {
        let runtime = runtime.clone();
        lock_tests::acquire_in_task(runtime, "majority-down", Duration::from_secs(15))
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

// The re-entrant half of finding 11 is the kit case `attr_reentrant_once_leaves_its_marker`.

// Finding 13c: a task that waits for a lock it holds itself through `lock()` is never left
// waiting silently. Before: both the annotated `wait` call and a second `acquire` waited
// forever without a word (here: until the 3 s test timeout). An error was tried and dropped:
// a guard moved to another task, which will release it, is held by "this task" as far as the
// runtime can tell, and waiting for it there is a fine pattern (the last case below).

#[distributed_lock(key = "held-by-guard", on_contention = "wait", wait_timeout = "300ms")]
async fn waits_for_held_key() -> Result<u64, LockError> {
    match current_lease() {
        Some(lease) => lease.fence().await,
        None => Ok(0),
    }
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

/// This thread's warnings, kept in the returned buffer until the guard drops.
fn capture_warnings() -> (Logs, tracing::subscriber::DefaultGuard) {
    let logs = Logs::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::WARN)
        .with_writer(move || writer.clone())
        .finish();
    (logs, tracing::subscriber::set_default(subscriber))
}

#[tokio::test]
async fn waiting_for_a_lock_this_task_holds_is_never_silent() {
    let (logs, _default) = capture_warnings();
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

/// Two guards of one record in one runtime: one that outlived its lease (no watchdog, expired)
/// and the holder's anew. Dropping the stale one first must leave the holder known, so its
/// own wait is still reported; once both are gone, a wait is silent.
#[tokio::test]
async fn a_guard_that_outlived_its_lease_leaves_the_new_holder_known() {
    let (logs, _default) = capture_warnings();
    let warned = || {
        logs.text()
            .matches("already holds the lock it now waits for")
            .count()
    };
    let runtime = TestStore::memory().runtime().await;
    let stale = runtime
        .lock("outlived")
        .ttl(Duration::from_millis(200))
        .watchdog(false)
        .acquire()
        .await
        .expect("acquire");
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(stale.lease().is_lost(), "the stale lease has expired");
    let fresh = tokio::time::timeout(Duration::from_secs(3), runtime.lock("outlived").acquire())
        .await
        .expect("bounded")
        .expect("acquired anew once the first lease expired");
    drop(stale);
    let again = runtime
        .lock("outlived")
        .acquire_timeout(Duration::from_millis(300))
        .await;
    assert!(
        matches!(again, Err(LockError::WaitTimeout { .. })),
        "{again:?}"
    );
    assert_eq!(
        warned(),
        1,
        "the holder's own wait is reported: {}",
        logs.text()
    );
    fresh.release().await.expect("release");
    let after = runtime
        .lock("outlived")
        .acquire_timeout(Duration::from_secs(3))
        .await
        .expect("free after the release");
    after.release().await.expect("release");
    assert_eq!(warned(), 1, "no guard left, no warning: {}", logs.text());
}

// Finding 10: waiters are woken when their channel's subscription is confirmed again after a
// reconnect. Before: a release published between the disconnection's wake-up and the
// re-subscription was missed, and the waiter slept until the holder's ttl ran out (30 s).

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_wake_after_the_subscriber_resubscribes() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    let waiting = LockRuntime::builder()
        .redis(proxy.url())
        .connect_timeout(Duration::from_secs(10))
        .command_timeout(Duration::from_secs(5))
        .built()
        .await;
    let holder = redis_runtime(server.url(), Duration::from_secs(2)).await;
    let guard = holder.take("resubscribed", Duration::from_secs(30)).await;
    let waiter = {
        let waiting = waiting.clone();
        lock_tests::acquire_in_task(waiting, "resubscribed", Duration::from_secs(20))
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    // Only the subscriber connection drops, and its reconnect is slow (1 s each way); the
    // command connection stays up, so the waiter's wake-up attempt finds the lock held.
    proxy.set_new_connection_latency(Duration::from_secs(1));
    let mut conn = server.conn().await;
    let killed: i64 = lock_tests::query(&mut conn, ("CLIENT", "KILL", "TYPE", "pubsub")).await;
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
async fn waiters_wake_after_a_long_outage() {
    let (_server, proxy, waiting, holder) = proxied_redis(Duration::from_millis(500)).await;
    wake::waiter_wakes_after_an_outage(&waiting, &holder, "long-outage", |down| {
        proxy.refuse(down);
        if down {
            proxy.drop_connections();
        }
    })
    .await;
}

/// PUBLISH calls the server has executed so far, inside scripts too (INFO commandstats).
async fn publishes(server: &RedisServer) -> u64 {
    server
        .command_stat("calls", |c| c == "publish")
        .await
        .expect("INFO commandstats")
}

/// A release publishes only while someone waits: with nobody waiting it costs no PUBLISH; a
/// waiter raises the lock's waiters flag and is woken by the release, long before the
/// holder's ttl would have let it retry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_publishes_only_while_someone_waits() {
    let server = RedisServer::start();
    let holder = redis_runtime(server.url(), Duration::from_secs(2)).await;
    let waiter = redis_runtime(server.url(), Duration::from_secs(2)).await;
    let before = publishes(&server).await;
    for _ in 0..20 {
        let guard = holder.take("alone", Duration::from_secs(30)).await;
        assert!(guard.release().await.expect("release"));
    }
    assert_eq!(
        publishes(&server).await,
        before,
        "a release with nobody waiting published"
    );
    let guard = holder.take("awaited", Duration::from_secs(30)).await;
    let waiting = tokio::spawn(async move {
        let started = Instant::now();
        let got = waiter
            .lock("awaited")
            .acquire_timeout(Duration::from_secs(20))
            .await
            .expect("the waiter gets the lock");
        got.release().await.expect("release");
        started.elapsed()
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(guard.release().await.expect("release"));
    let waited = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the waiter was woken by the release, not by the 30 s ttl")
        .expect("waiter task");
    println!("woken {waited:?} after it began waiting (released at 500 ms)");
    assert!(
        publishes(&server).await > before,
        "the release a waiter waited for was not published"
    );
}

/// A waiter marks the record it waits for (the release publishes only then): the mark is no
/// part of the owner that `inspect` and `list` show, renewal keeps a marked record, and a
/// holder that asked for its fence (which rewrites the record) still wakes its waiter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiters_mark_is_invisible_to_inspect_and_survives_renewal_and_fencing() {
    let server = RedisServer::start();
    let holder = LockRuntime::builder()
        .redis(server.url())
        .owner("holder-a")
        .built()
        .await;
    let waiter = redis_runtime(server.url(), Duration::from_secs(2)).await;
    // A ttl the watchdog renews a few times while the waiter waits.
    let guard = holder.take("marked", Duration::from_secs(1)).await;
    let waiting = tokio::spawn(async move {
        let got = waiter
            .lock("marked")
            .acquire_timeout(Duration::from_secs(30))
            .await
            .expect("the waiter gets the lock");
        got.release().await.expect("release");
    });
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let mut conn = server.conn().await;
    let raw: String = lock_tests::query(&mut conn, ("GET", "lock:{marked}")).await;
    assert!(
        raw.ends_with("\nw"),
        "the waiter marked the record: {raw:?}"
    );
    // The fence asked after the mark: fence.lua rewrites the record and keeps the mark.
    let fence = guard.lease().fence().await.expect("a fence while held");
    let raw: String = lock_tests::query(&mut conn, ("GET", "lock:{marked}")).await;
    assert!(
        raw.ends_with("\nw") && raw.contains(&format!(" {fence} ")),
        "fenced and still marked: {raw:?}"
    );
    assert!(!guard.lease().is_lost(), "renewed through the mark");
    let info = holder
        .inspect("marked")
        .await
        .expect("inspect")
        .expect("held");
    assert_eq!(info.owner, "holder-a");
    assert_eq!(info.fence, Some(fence));
    let listed = holder.list("*").await.expect("list");
    assert_eq!(
        listed.iter().map(|l| l.owner.as_str()).collect::<Vec<_>>(),
        ["holder-a"]
    );
    let before = publishes(&server).await;
    assert!(guard.release().await.expect("release"));
    tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the waiter gets the lock after the release")
        .expect("waiter task");
    assert_eq!(
        publishes(&server).await,
        before + 1,
        "the release of the fenced, marked record was published (and the waiter's own, \
         with nobody waiting, was not)"
    );
}
