//! The behaviour and attribute suites on a Sentinel set (1 master, 1 replica, 3 sentinels,
//! acquires confirmed by the replica), and failovers.

use lock_tests::Built;
use lock_tests::TakeFree;
use std::time::Duration;

use lock_runtime::{LockError, LockRuntime, RedisStore};
use lock_tests::{TestStore, wake};

lock_testkit::behaviour_suite!(lock_tests::TestStore::sentinel());
lock_testkit::attribute_suite!(lock_tests::TestStore::sentinel());

/// SENTINEL FAILOVER while a lock is held: the runtime follows the new master, the lock
/// acquired (and confirmed by the replica) before the failover survives it, and new locks work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_survives_a_sentinel_failover_and_the_runtime_follows() {
    let store = TestStore::sentinel();
    let TestStore::Sentinel(set) = &store else {
        unreachable!("made as sentinel")
    };
    let a = store.runtime().await;
    let b = store.runtime().await;
    let guard = a.take("survivor", Duration::from_secs(3)).await;
    let old_master = set.master_port();
    set.failover();
    assert_ne!(set.master_port(), old_master);
    // On the new master the record is there: nobody else gets the lock.
    let until = tokio::time::Instant::now() + Duration::from_secs(4);
    while tokio::time::Instant::now() < until {
        match b.lock("survivor").try_acquire().await {
            Ok(Some(_)) => {
                panic!("a second holder got a lock that was confirmed before the failover")
            }
            Ok(None) => {}
            Err(e) => eprintln!("during failover: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The holder's renewals followed the master.
    assert!(
        !guard.lease().is_lost(),
        "the lease was renewed through the failover"
    );
    assert!(guard.release().await.expect("release on the new master"));
    // The old master rejoins as a replica of the new one; replicated acquires need it.
    set.wait_for(Duration::from_secs(20), |set| set.replica_in_sync());
    let fresh = b.take_default_ttl("after-failover").await;
    assert!(fresh.release().await.expect("release"));
}

/// With no replica reachable, replicated_acquire fails clearly and leaves no lock behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicated_acquire_without_a_replica_fails_clearly() {
    let mut store = TestStore::sentinel();
    let TestStore::Sentinel(set) = &mut store else {
        unreachable!("made as sentinel")
    };
    set.servers[1].kill();
    let runtime = LockRuntime::builder()
        .store(
            RedisStore::sentinel(&set.master_name, set.sentinel_urls())
                .replicated_acquire(1, Duration::from_millis(300)),
        )
        .built()
        .await;
    let err = runtime
        .lock("unreplicated")
        .try_acquire()
        .await
        .expect_err("no replica can confirm");
    assert!(matches!(err, LockError::Backend(_)), "{err:?}");
    let message = err.to_string();
    assert!(
        message.contains("confirmed by 0 of the 1 replicas"),
        "{message}"
    );
    assert!(message.contains("given back"), "{message}");
    assert!(
        runtime
            .inspect("unreplicated")
            .await
            .expect("inspect")
            .is_none(),
        "nothing left behind"
    );
}

/// After a failover, the server the subscriber was on dies: the subscriber moves to the new
/// master, so a waiter still wakes on the release instead of sleeping out the holder's ttl.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_follow_the_master_after_failover_and_the_old_one_dying() {
    let mut store = TestStore::sentinel();
    let a = store.runtime().await;
    // The waiter does not use replicated_acquire: after the failover no replica is left, and a
    // replicated acquire then keeps waiting (a transient shortfall) instead of taking the lock.
    let b = {
        let TestStore::Sentinel(set) = &store else {
            unreachable!("made as sentinel")
        };
        LockRuntime::builder()
            .redis_sentinel(&set.master_name, set.sentinel_urls())
            .built()
            .await
    };
    // The waiter's subscriber connects to the first master.
    wake::warm_subscriber(&a, &b, "warm").await;

    let TestStore::Sentinel(set) = &mut store else {
        unreachable!("made as sentinel")
    };
    let old_port = set.master_port().expect("a master");
    set.failover();
    set.wait_for(Duration::from_secs(20), |set| set.replica_in_sync());
    let old = set.index_of(old_port);
    set.servers[old].kill();

    let held = a
        .lock("followed")
        .ttl(Duration::from_secs(30))
        .try_acquire()
        .await;
    // Replicated acquire needs a replica, and the only one just died: take it without.
    let held = match held {
        Ok(Some(guard)) => guard,
        other => {
            drop(other);
            let plain = LockRuntime::builder()
                .redis_sentinel(&set.master_name, set.sentinel_urls())
                .built()
                .await;
            plain.take("followed", Duration::from_secs(30)).await
        }
    };
    let waiting = lock_tests::acquire_in_task(b.clone(), "followed", Duration::from_secs(20));
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let released = tokio::time::Instant::now();
    assert!(held.release().await.expect("release"));
    let got = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("the waiter woke on the release, not after the 30 s ttl")
        .expect("task");
    let guard = got.expect("acquired on the new master");
    assert!(released.elapsed() < Duration::from_secs(5));
    guard.release().await.expect("release");
}

/// The master crashes (SIGKILL, never back) while a runtime's subscriber is connected to it:
/// once the sentinels have promoted the replica, that runtime's waiters wake on releases
/// there, and a wait for a free lock takes it at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_follow_the_master_after_it_crashes() {
    let mut store = TestStore::sentinel();
    let TestStore::Sentinel(set) = &mut store else {
        unreachable!("made as sentinel")
    };
    // Plain acquires: after the crash no replica is left to confirm them.
    let plain = || {
        LockRuntime::builder()
            .redis_sentinel(&set.master_name, set.sentinel_urls())
            .command_timeout(Duration::from_millis(500))
            .connect_timeout(Duration::from_millis(500))
            .build()
    };
    let holder = plain().await.expect("build");
    let waiter = plain().await.expect("build");
    // The waiter's subscriber connects to the first master.
    wake::warm_subscriber(&holder, &waiter, "warm").await;

    let old_port = set.master_port().expect("a master");
    let old = set.index_of(old_port);
    set.servers[old].kill();
    set.wait_for(Duration::from_secs(30), |set| {
        set.master_port().is_some_and(|p| p != old_port)
    });
    let crashed = tokio::time::Instant::now();

    // A wait for a free lock takes it.
    let fresh = waiter
        .lock("fresh-after-crash")
        .acquire_timeout(Duration::from_secs(10))
        .await
        .expect("a free lock is taken after the failover");
    assert!(fresh.release().await.expect("release"));

    // A waiter wakes on a release on the new master.
    let follow = Duration::from_secs(15).saturating_sub(crashed.elapsed());
    wake::waiter_wakes_after_a_failover(&holder, &waiter, "after-crash", follow).await;
}

/// With authentication on (servers and sentinels), a master that stops answering while a
/// lease renews makes the runtime doubt it and ask the sentinels again: nothing it logs, at
/// any level, may show the password, which the master's URL carries.
#[tokio::test]
async fn a_password_never_reaches_the_logs_while_the_master_stalls() {
    password_stays_out_of_the_logs("plain-s3cr3t-pw").await;
}

/// The same with a password made of the characters a URL reserves (`/ ? # %`): the master's
/// URL carries it percent-encoded, else the runtime cannot even connect.
#[tokio::test]
async fn a_password_with_url_characters_reaches_the_master() {
    password_stays_out_of_the_logs("pw/with?odd#chars%s3cr3t").await;
}

async fn password_stays_out_of_the_logs(secret: &str) {
    let captured = lock_tests::LogCapture::default();
    let _default = captured.install();
    let set = lock_tests::SentinelSet::start();
    let master = set.master_port().expect("a master");
    set.protect(secret);
    let encoded = secret
        .replace('%', "%25")
        .replace('/', "%2F")
        .replace('?', "%3F")
        .replace('#', "%23");
    let runtime = LockRuntime::builder()
        .redis_sentinel(
            &set.master_name,
            set.sentinels
                .iter()
                .map(|s| format!("redis://:{encoded}@127.0.0.1:{}", s.port())),
        )
        .command_timeout(Duration::from_millis(300))
        .connect_timeout(Duration::from_millis(300))
        .built()
        .await;
    let guard = runtime
        .take("stalled-renewals", Duration::from_secs(3))
        .await;
    let server = &set.servers[set.index_of(master)];
    lock_tests::server::send_signal(server, "-STOP");
    // Renewals every second; each times out after 300 ms.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    lock_tests::server::send_signal(server, "-CONT");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let _ = guard.release().await;
    runtime.shutdown().await;
    let logs = captured.text();
    assert!(
        logs.contains("asking the sentinels again"),
        "the stall was noticed (else this test shows nothing): {logs}"
    );
    for shown in [secret, encoded.as_str(), "s3cr3t"] {
        assert!(!logs.contains(shown), "the password is in the logs: {logs}");
    }
}
