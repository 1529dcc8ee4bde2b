//! Event-driven waiting on a real Redis: a release wakes few acquire attempts, not one per
//! waiting task. Attempts are counted by the server (INFO commandstats), not by the client.

use std::time::Duration;

use lock_runtime::LockRuntime;
use lock_tests::RedisServer;

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
        all.push(
            LockRuntime::builder()
                .redis(server.url())
                .build()
                .await
                .expect("build"),
        );
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
    let mut conn = server
        .client()
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    let (_, count): (String, i64) = redis::cmd("PUBSUB")
        .arg("NUMSUB")
        .arg(channel)
        .query_async(&mut conn)
        .await
        .expect("PUBSUB NUMSUB");
    count
}

/// A waiter that gives up while the link to Redis is cut cannot unsubscribe then; once the
/// link is back, its subscription must not outlive it (the client would otherwise renew it at
/// every reconnect for the life of the process): the server counts no subscriber left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_that_gives_up_during_a_cut_leaves_no_subscription() {
    let server = RedisServer::start();
    let proxy = lock_tests::FaultProxy::start(server.port());
    let holder = LockRuntime::builder()
        .redis(server.url())
        .build()
        .await
        .expect("build");
    let waiting = LockRuntime::builder()
        .redis(proxy.url())
        .command_timeout(Duration::from_millis(500))
        .connect_timeout(Duration::from_millis(500))
        .build()
        .await
        .expect("build");
    let guard = holder
        .lock("gave-up")
        .ttl(Duration::from_secs(30))
        .try_acquire()
        .await
        .expect("acquire")
        .expect("free");
    let channel = "lock:{gave-up}:released";
    let waiter = tokio::spawn({
        let waiting = waiting.clone();
        async move {
            waiting
                .lock("gave-up")
                .acquire_timeout(Duration::from_secs(2))
                .await
        }
    });
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
    let taken = tokio::spawn({
        let waiting = waiting.clone();
        async move {
            waiting
                .lock("gave-up")
                .acquire_timeout(Duration::from_secs(10))
                .await
        }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(guard.release().await.expect("release"));
    let taken = taken.await.expect("task").expect("the waiter gets it");
    taken.release().await.expect("release");
    waiting.shutdown().await;
    holder.shutdown().await;
}
