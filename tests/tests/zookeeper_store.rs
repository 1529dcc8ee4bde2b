//! The ZooKeeper store's own tests on real ZooKeeper: bad connect strings and unreachable
//! ensembles give clear errors, a server without TTL nodes is refused with what to change,
//! a chroot keeps its locks apart, credentials never show, a session timeout outside its
//! range is refused, and racing takeovers of an expired record give it to one. Faults (the
//! leader killed, pauses, a partition) are in `zookeeper_faults`.

use std::time::Duration;

use lock_runtime::{LockError, LockRuntime, ZooKeeperStore};
use lock_tests::{Built, Free, TakeFree, ZooKeeperEnsemble};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_ensemble_is_a_transient_error_naming_it() {
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.local_addr().expect("addr").port()
    };
    let connect = format!("127.0.0.1:{port}");
    let started = std::time::Instant::now();
    let err = LockRuntime::builder()
        .zookeeper(connect.clone())
        .connect_timeout(Duration::from_secs(1))
        .build()
        .await
        .map(|_| ())
        .expect_err("nothing listens there");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "build() is bounded by the connect timeout: {:?}",
        started.elapsed()
    );
    assert!(err.is_transient(), "{err}");
    assert!(err.to_string().contains(&connect), "{err}");
}

/// A session timeout of zero, or longer than ZooKeeper can carry, is a configuration error
/// at `build()` naming the option, before any connection is tried.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_timeout_out_of_range_is_a_config_error() {
    for timeout in [Duration::ZERO, Duration::from_secs(2 * 86_400)] {
        let err = LockRuntime::builder()
            .store(ZooKeeperStore::new("127.0.0.1:1").session_timeout(timeout))
            .build()
            .await
            .map(|_| ())
            .expect_err("a session timeout out of range");
        assert!(matches!(err, LockError::Config(_)), "{timeout:?}: {err:?}");
        assert!(err.to_string().contains("session_timeout"), "{err}");
    }
}

/// Connect strings that can never work are configuration errors at `build()`, never
/// transient (a caller retrying transient errors would retry them for ever).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unusable_connect_strings_are_config_errors() {
    for connect in [
        "",
        "127.0.0.1:notaport",
        "127.0.0.1:2181/chroot/",
        "127.0.0.1:2181/a//b",
        "127.0.0.1:2181,/only-a-chroot",
    ] {
        let err = LockRuntime::builder()
            .zookeeper(connect)
            .connect_timeout(Duration::from_secs(2))
            .build()
            .await
            .map(|_| ())
            .expect_err("an unusable connect string");
        assert!(matches!(err, LockError::Config(_)), "{connect:?}: {err:?}");
        assert!(!err.is_transient(), "{connect:?}: {err}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_without_ttl_nodes_is_refused_with_what_to_change() {
    let ensemble = ZooKeeperEnsemble::start_without_ttl_nodes();
    let err = LockRuntime::builder()
        .zookeeper(ensemble.connect_string())
        .build()
        .await
        .map(|_| ())
        .expect_err("no TTL nodes");
    assert!(matches!(err, LockError::Config(_)), "{err:?}");
    assert!(
        err.to_string()
            .contains("zookeeper.extendedTypesEnabled=true"),
        "{err}"
    );
}

/// Runtimes on one chroot share their locks; a runtime on another chroot (or none) locks
/// apart from them, and lists none of theirs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chroot_keeps_its_locks_apart() {
    let ensemble = ZooKeeperEnsemble::start(1);
    let at = |chroot: &str| {
        LockRuntime::builder()
            .zookeeper(format!("{}{chroot}", ensemble.connect_string()))
            .built()
    };
    let jobs_a = at("/jobs").await;
    let jobs_b = at("/jobs").await;
    let other = at("/other").await;
    let root = at("").await;
    let guard = jobs_a.take_default_ttl("nightly").await;
    assert!(
        jobs_b
            .lock("nightly")
            .try_acquire()
            .await
            .expect("try")
            .is_none(),
        "the same chroot: held"
    );
    for apart in [&other, &root] {
        let elsewhere = apart.take_default_ttl("nightly").await;
        assert!(apart.list("*").await.expect("list").len() == 1);
        assert!(elsewhere.release().await.expect("release"));
    }
    assert_eq!(jobs_b.list("*").await.expect("list").len(), 1);
    assert!(guard.release().await.expect("release"));
}

/// The digest password shows in no `Debug` output and no error, and the nodes made with it
/// are its user's alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_digest_password_never_shows() {
    const SECRET: &str = "zk-s3cr3t-Pa55";
    let ensemble = ZooKeeperEnsemble::start(1);
    let store = || ZooKeeperStore::new(ensemble.connect_string()).digest("locks", SECRET);
    let builder = LockRuntime::builder().store(store());
    for shown in [format!("{builder:?}"), format!("{:?}", store())] {
        assert!(!shown.contains(SECRET), "the password leaked: {shown}");
    }
    let runtime = builder.built().await;
    assert!(!format!("{runtime:?}").contains(SECRET));
    let guard = runtime.take_default_ttl("authed").await;
    assert!(guard.release().await.expect("release"));
    // The nodes it made are its user's alone: a client without the credentials can neither
    // write a record nor build a runtime there.
    let held = runtime.take_default_ttl("authed").await;
    let stranger = zookeeper_client::Client::connect(&ensemble.connect_string())
        .await
        .expect("connect");
    let node = lock_tests::zookeeper::record_node("lock:{authed}");
    assert_eq!(
        stranger.set_data(&node, b"v1 free", None).await,
        Err(zookeeper_client::Error::NoAuth)
    );
    let err = LockRuntime::builder()
        .zookeeper(ensemble.connect_string())
        .build()
        .await
        .map(|_| ())
        .expect_err("no credentials");
    assert!(!err.is_transient(), "{err}");
    assert!(held.lease().is_held());
    assert!(held.release().await.expect("release"));
    // Unreachable with the same credentials: the error names the ensemble, not the password.
    let err = LockRuntime::builder()
        .store(ZooKeeperStore::new("127.0.0.1:1").digest("locks", SECRET))
        .connect_timeout(Duration::from_millis(500))
        .build()
        .await
        .map(|_| ())
        .expect_err("unreachable");
    for shown in [err.to_string(), format!("{err:?}")] {
        assert!(!shown.contains(SECRET), "the password leaked: {shown}");
    }
}

/// Many acquirers that find one expired record at once: exactly one takes it over. (ZooKeeper
/// numbers a node's versions from 0 again when it is created again, so a takeover that
/// deleted "at the version read" could delete the record another takeover had just made, at
/// the same version, and both held the lock: found in review, failed here before the fix.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_takeovers_of_an_expired_record_give_it_to_one() {
    let ensemble = ZooKeeperEnsemble::start(1);
    let mut runtimes = Vec::new();
    for i in 0..8 {
        runtimes.push(
            LockRuntime::builder()
                .zookeeper(ensemble.connect_string())
                .owner(format!("racer-{i}"))
                .built()
                .await,
        );
    }
    let crashed = LockRuntime::builder()
        .zookeeper(ensemble.connect_string())
        .owner("crashed")
        .built()
        .await;
    let mut doubles = Vec::new();
    for round in 0..15 {
        let key = format!("expired-{round}");
        // A holder that stops renewing (as a crashed one does) and whose record expires.
        let stale = crashed
            .lock(key.as_str())
            .ttl(Duration::from_millis(300))
            .watchdog(false)
            .try_acquire()
            .await
            .free();
        std::mem::forget(stale);
        tokio::time::sleep(Duration::from_millis(600)).await;
        let tries = runtimes.iter().map(|runtime| {
            let (runtime, key) = (runtime.clone(), key.clone());
            tokio::spawn(async move {
                runtime
                    .lock(key.as_str())
                    .ttl(Duration::from_secs(20))
                    .try_acquire()
                    .await
            })
        });
        let mut holders = Vec::new();
        for task in tries.collect::<Vec<_>>() {
            if let Some(guard) = task.await.expect("task").expect("try_acquire") {
                holders.push(guard);
            }
        }
        if holders.len() != 1 {
            doubles.push((round, holders.len()));
        }
        for guard in holders {
            let _ = guard.release().await;
        }
    }
    assert!(
        doubles.is_empty(),
        "rounds whose expired record went to other than one holder (round, holders): {doubles:?}"
    );
}

/// The servers' sweep of idle TTL nodes deletes a record it listed without looking at it
/// again (refusing only a node with children), and ZooKeeper numbers a node made again from
/// version 0: an acquirer that read an idle record before the sweep deleted it, then wrote
/// "at the version read" after another acquirer made the node again, would take the other's
/// record. Here the servers' clock is moved two days on (two crashed holders' records idle
/// past a day), replies to the taker are slowed by 1 s, and the sweep's delete is made by hand
/// (refused, as the sweep's is, on a node with a child) while the taker works, then another
/// acquirer tries: early (before the taker could pin the record) and late (after). One of
/// them holds the lock, never both. Failed with two holders (late) before idle records were
/// pinned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_record_deleted_under_a_takeover_goes_to_one_holder() {
    let ensemble = ZooKeeperEnsemble::start_with_clock(1);
    let connect = ensemble.connect_string();
    // Holders that took their locks and crashed: the records stay, expired.
    let crashed = LockRuntime::builder()
        .zookeeper(connect.as_str())
        .owner("crashed")
        .built()
        .await;
    let rounds = [("idle-early", 1500), ("idle-late", 4000)];
    for (key, _) in rounds {
        let stale = crashed
            .lock(key)
            .ttl(Duration::from_secs(1))
            .watchdog(false)
            .try_acquire()
            .await
            .free();
        std::mem::forget(stale);
    }
    ensemble.set_clock_offset("+2d");
    let client = zookeeper_client::Client::connect(&connect)
        .await
        .expect("a plain client");
    let proxy = lock_tests::FaultProxy::start(ensemble.members[0].port());
    let taker = LockRuntime::builder()
        .zookeeper(format!("127.0.0.1:{}", proxy.port()))
        .owner("taker")
        .command_timeout(Duration::from_secs(60))
        .built()
        .await;
    let other = LockRuntime::builder()
        .zookeeper(connect.as_str())
        .owner("other")
        .built()
        .await;
    proxy.set_reply_latency(Duration::from_secs(1));
    for (key, delete_after_ms) in rounds {
        let node = lock_tests::zookeeper::record_node(&format!("lock:{{{key}}}"));
        let taking = {
            let taker = taker.clone();
            tokio::spawn(async move {
                taker
                    .lock(key)
                    .ttl(Duration::from_secs(60))
                    .try_acquire()
                    .await
            })
        };
        tokio::time::sleep(Duration::from_millis(delete_after_ms)).await;
        match client.delete(&node, None).await {
            Ok(()) | Err(zookeeper_client::Error::NotEmpty) => {}
            Err(e) => panic!("{key}: the sweep's delete: {e}"),
        }
        let by_other = other
            .lock(key)
            .ttl(Duration::from_secs(60))
            .try_acquire()
            .await
            .expect("the other's try_acquire");
        let by_taker = taking
            .await
            .expect("task")
            .expect("the taker's try_acquire");
        match (&by_taker, &by_other) {
            (Some(t), Some(o)) => panic!(
                "{key}: two holders: the taker (fence {:?}) and the other (fence {:?})",
                t.lease().fence().await,
                o.lease().fence().await
            ),
            (None, None) => panic!("{key}: nobody took the expired lock"),
            _ => {}
        }
        if key == "idle-late" {
            let children = client.list_children(&node).await.expect("children");
            assert!(
                children.iter().any(|child| child.starts_with("p-")),
                "the idle record was pinned before it was written: {children:?}"
            );
        }
    }
}
