//! The behaviour and attribute suites on a Redlock quorum of five independent redis-servers,
//! and the faults that only a quorum survives.

use lock_tests::Built;
use lock_tests::TakeFree;
use std::time::Duration;

use lock_runtime::{LockError, LockRuntime};
use lock_tests::{FaultProxy, RedisServer, TestStore, wake};

lock_testkit::behaviour_suite!(lock_tests::TestStore::redlock());
lock_testkit::attribute_suite!(lock_tests::TestStore::redlock());

fn servers(store: &mut TestStore) -> &mut Vec<RedisServer> {
    match store {
        TestStore::Redlock(servers) => servers,
        _ => unreachable!("made as redlock"),
    }
}

/// Two of five masters down: locks are still taken and released; three down: a clear error
/// naming the failed masters, quickly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quorum_tolerates_two_of_five_down_and_fails_fast_at_three() {
    let mut store = TestStore::redlock();
    let runtime = store.runtime().await;
    {
        let nodes = servers(&mut store);
        nodes[0].kill();
        nodes[1].kill();
    }
    let guard = runtime.take("quorum", Duration::from_secs(5)).await;
    assert!(guard.release().await.expect("release"));

    let down_port = servers(&mut store)[2].port();
    servers(&mut store)[2].kill();
    let started = std::time::Instant::now();
    let err = runtime
        .lock("quorum")
        .try_acquire()
        .await
        .expect_err("2 of 5 masters cannot make a quorum");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "fails fast: {:?}",
        started.elapsed()
    );
    let message = err.to_string();
    assert!(matches!(err, LockError::Backend(_)), "{err:?}");
    assert!(message.contains("quorum is 3"), "{message}");
    assert!(
        message.contains(&down_port.to_string()),
        "names the failed master: {message}"
    );

    // A new runtime cannot even be built without a quorum.
    let ports: Vec<String> = servers(&mut store).iter().map(RedisServer::url).collect();
    let err = LockRuntime::builder()
        .redlock(ports)
        .connect_timeout(Duration::from_millis(500))
        .build()
        .await
        .expect_err("no quorum at startup");
    assert!(
        err.to_string().contains("only 2 of 5 masters answered"),
        "{err}"
    );
}

/// A master killed and restarted empty during a lease does not let a second holder in while
/// the quorum still holds the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarted_empty_master_does_not_admit_a_second_holder() {
    let mut store = TestStore::redlock();
    let a = store.runtime().await;
    let b = store.runtime().await;
    let guard = a.take("restart", Duration::from_secs(2)).await;
    servers(&mut store)[0].restart();
    servers(&mut store)[1].restart();
    // Two masters forgot the lock; three still hold it.
    for _ in 0..10 {
        assert!(
            b.try_take("restart").await.is_none(),
            "a second holder got in while 3 of 5 masters hold the lock"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Renewals keep the lease through the restarts (quorum of renewals).
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(!guard.lease().is_lost());
    let first_fence = guard.lease().fence().await.expect("a fence");
    assert!(guard.release().await.expect("release"));
    let next = b.take_default_ttl("restart").await;
    assert!(next.lease().fence().await.expect("a fence") > first_fence);
}

/// A waiter rides out a moment when no master answers at all (every master stopped with
/// SIGSTOP), its watch included, and gets the lock once they are back and the holder lets go.
/// Found by the simulation (seed 3) once it ran the quorum code: the watch's failure was final,
/// so the waiter gave up at once, long before its deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_rides_out_every_master_stalling() {
    let mut store = TestStore::redlock();
    let holder = store.runtime().await;
    let waiter = store.runtime().await;
    let guard = holder.take("stalled", Duration::from_secs(4)).await;
    let pids: Vec<u32> = servers(&mut store)
        .iter()
        .filter_map(RedisServer::pid)
        .collect();
    assert_eq!(pids.len(), 5, "every master runs");
    for pid in &pids {
        lock_tests::fleet::signal(*pid, "-STOP");
    }
    let waiting = tokio::spawn(async move {
        let got = waiter
            .lock("stalled")
            .acquire_timeout(Duration::from_secs(10))
            .await;
        (got, waiter)
    });
    tokio::time::sleep(Duration::from_millis(1500)).await;
    for pid in &pids {
        lock_tests::fleet::signal(*pid, "-CONT");
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !waiting.is_finished(),
        "the waiter ended while the lock was held: {:?}",
        waiting.await.map(|(got, _)| got)
    );
    assert!(guard.release().await.expect("release after the stall"));
    let (got, _waiter) = waiting.await.expect("the waiter's task");
    let got = got.expect("the waiter gets the lock after the release");
    assert!(got.lease().fence().await.expect("a fence") > 0);
}

/// Once nobody waits for a lock any more, no master keeps a subscription to its channel: a
/// combined watch lets go of every member's watch. Before, a member's unsubscribe could run
/// while the task forwarding its wake-ups still held its notifier, and was skipped; its client
/// renews the subscription after every reconnect: stale subscriptions pile up per key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_master_keeps_a_subscription_once_nobody_waits() {
    // Before the fix, one round in eight or so left a subscription behind.
    const ROUNDS: usize = 20;
    let mut store = TestStore::redlock();
    let holder = store.runtime().await;
    let waiter = store.runtime().await;
    for round in 0..ROUNDS {
        let key = format!("subscribed-{round}");
        let guard = holder.take_default_ttl(key.clone()).await;
        let waiting = {
            let waiter = waiter.clone();
            let key = key.clone();
            lock_tests::acquire_in_task(waiter, key, Duration::from_secs(5))
        };
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(guard.release().await.expect("release"));
        let got = waiting.await.expect("join").expect("the waiter gets it");
        assert!(got.release().await.expect("release"));
    }
    let channels: Vec<String> = (0..ROUNDS)
        .map(|round| {
            lock_runtime::store::KeyNames::new("lock", &format!("subscribed-{round}"))
                .channel()
                .to_owned()
        })
        .collect();
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let mut left = Vec::new();
        for server in servers(&mut store).iter() {
            let mut conn = server.conn().await;
            for channel in &channels {
                let reply: Vec<redis::Value> =
                    lock_tests::query(&mut conn, ("PUBSUB", "NUMSUB", channel)).await;
                let n: i64 = redis::from_redis_value(reply[1].clone()).expect("a count");
                if n > 0 {
                    left.push(format!("{}: {channel}", server.port()));
                }
            }
        }
        if left.is_empty() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "subscriptions left 5 s after the last waiter: {left:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Finding 10 on Redlock: a waiter whose runtime was cut off from every master for 10 s (its
/// connections refused and dropped, longer than the Redis client's own reconnect tries) wakes
/// on a release made once the masters are reachable again, not at the holder's ttl.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_wakes_after_a_long_outage() {
    let servers: Vec<RedisServer> = (0..5).map(|_| RedisServer::start()).collect();
    let proxies: Vec<FaultProxy> = servers
        .iter()
        .map(|s| FaultProxy::start(s.port()))
        .collect();
    let waiting = LockRuntime::builder()
        .redlock(proxies.iter().map(FaultProxy::url))
        .command_timeout(Duration::from_millis(500))
        .connect_timeout(Duration::from_millis(500))
        .built()
        .await;
    let holder = LockRuntime::builder()
        .redlock(servers.iter().map(RedisServer::url))
        .built()
        .await;
    wake::waiter_wakes_after_an_outage(&waiting, &holder, "long-outage", |down| {
        for proxy in &proxies {
            proxy.refuse(down);
            if down {
                proxy.drop_connections();
            }
        }
    })
    .await;
}
