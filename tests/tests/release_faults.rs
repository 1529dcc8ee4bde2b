//! Ends of a lock while the link to the store is cut or slow, on one Redis server, PostgreSQL
//! and a one-member etcd, each behind a fault proxy: a release or completion that fails for a
//! passing reason is still carried out once the store is reachable, and a shutdown waits for
//! the acquires in flight. In each, the other runtime (connected directly) must find the lock
//! free within a few seconds, not after the 30 s ttl.

use lock_tests::Built;
use lock_tests::Free;
use lock_tests::TakeFree;
use std::time::Duration;

use lock_runtime::{LockError, LockRuntime};
use lock_tests::wake::free_within_5s;
use lock_tests::{EtcdCluster, FaultProxy, PostgresServer, RedisServer};

/// A store behind a fault proxy.
enum Server {
    Redis(RedisServer),
    Postgres(PostgresServer),
    Etcd(EtcdCluster),
}

struct Rig {
    server: Server,
    proxy: FaultProxy,
}

impl Rig {
    fn redis() -> Self {
        let server = RedisServer::start();
        let proxy = FaultProxy::start(server.port());
        Rig {
            server: Server::Redis(server),
            proxy,
        }
    }

    fn postgres() -> Self {
        let server = PostgresServer::start();
        let proxy = FaultProxy::start(server.port());
        Rig {
            server: Server::Postgres(server),
            proxy,
        }
    }

    fn etcd() -> Self {
        let server = EtcdCluster::start(1);
        let proxy = FaultProxy::start(server.members[0].port());
        Rig {
            server: Server::Etcd(server),
            proxy,
        }
    }

    fn builder(&self, through_proxy: bool) -> lock_runtime::LockRuntimeBuilder {
        let builder = LockRuntime::builder();
        let proxy = self.proxy.port();
        match &self.server {
            Server::Redis(s) if through_proxy => builder.redis(self.proxy.url()),
            Server::Redis(s) => builder.redis(s.url()),
            Server::Postgres(s) if through_proxy => builder.postgres(
                s.url()
                    .replace(&format!(":{}/", s.port()), &format!(":{proxy}/")),
            ),
            Server::Postgres(s) => builder.postgres(s.url()),
            Server::Etcd(_) if through_proxy => builder.etcd([format!("http://127.0.0.1:{proxy}")]),
            Server::Etcd(s) => builder.etcd(s.endpoints()),
        }
    }

    /// A runtime whose every connection goes through the proxy.
    async fn slow(&self, command_timeout: Duration) -> LockRuntime {
        self.builder(true)
            .owner("through-the-proxy")
            .command_timeout(command_timeout)
            .connect_timeout(command_timeout)
            .built()
            .await
    }

    /// A runtime connected to the store directly.
    async fn direct(&self) -> LockRuntime {
        self.builder(false)
            .owner("direct")
            .command_timeout(Duration::from_secs(2))
            .built()
            .await
    }

    /// Closes every connection through the proxy and refuses new ones.
    fn cut(&self) {
        self.proxy.refuse(true);
        self.proxy.drop_connections();
    }

    fn mend(&self) {
        self.proxy.refuse(false);
    }
}

/// An awaited `release()` that fails because the link is cut returns the error, and the
/// release is carried out in the background once the store is reachable again.
async fn a_failed_release_is_carried_out_later(rig: Rig) {
    let slow = rig.slow(Duration::from_millis(500)).await;
    let direct = rig.direct().await;
    let guard = slow
        .take("release-into-a-cut", Duration::from_secs(30))
        .await;
    rig.cut();
    let released = guard.release().await;
    assert!(
        released.as_ref().is_err_and(LockError::is_transient),
        "the link is cut: {released:?}"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    rig.mend();
    free_within_5s(
        &direct,
        "release-into-a-cut",
        "the release was carried out once the store was reachable, not left to the 30 s ttl",
    )
    .await;
    slow.shutdown().await;
    direct.shutdown().await;
}

/// The same for `complete()` with `once`: its done marker is written by the later release, so
/// the work does not run again inside its window.
async fn a_failed_completion_still_marks_the_work_done(rig: Rig) {
    let slow = rig.slow(Duration::from_millis(500)).await;
    let direct = rig.direct().await;
    let guard = slow
        .lock("complete-into-a-cut")
        .ttl(Duration::from_secs(30))
        .once(Duration::from_secs(3600))
        .try_acquire()
        .await
        .free();
    rig.cut();
    let completed = guard.complete().await;
    assert!(
        completed.as_ref().is_err_and(LockError::is_transient),
        "the link is cut: {completed:?}"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    rig.mend();
    let again = direct
        .lock("complete-into-a-cut")
        .ttl(Duration::from_secs(30))
        .once(Duration::from_secs(3600))
        .acquire_timeout(Duration::from_secs(5))
        .await;
    assert!(
        matches!(again, Err(LockError::AlreadyDone { .. })),
        "the work was done once; its marker must be written once the store is reachable: {again:?}"
    );
    slow.shutdown().await;
    direct.shutdown().await;
}

/// `shutdown()` while a `try_acquire` is on its way (replies delayed 400 ms), then the tokio
/// runtime ends at once, as a service's `main` returns right after `shutdown()`. The grant
/// that lands meanwhile must have been given back before `shutdown()` returned.
async fn shutdown_waits_for_acquires_in_flight(rig: Rig) {
    let direct = rig.direct().await;
    let builder = rig
        .builder(true)
        .owner("through-the-proxy")
        .command_timeout(Duration::from_secs(5));
    let proxy = &rig.proxy;
    // The service: its own tokio runtime on its own thread, which ends (and with it every task
    // and connection of the lock runtime) as soon as shutdown() returns.
    let service = || {
        let own = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("the service's tokio runtime");
        own.block_on(async move {
            let slow = builder.build().await.expect("build through the proxy");
            proxy.set_reply_latency(Duration::from_millis(400));
            let attempt = tokio::spawn({
                let slow = slow.clone();
                async move {
                    slow.lock("in-flight-at-shutdown")
                        .ttl(Duration::from_secs(30))
                        .try_acquire()
                        .await
                }
            });
            tokio::time::sleep(Duration::from_millis(100)).await;
            assert!(!attempt.is_finished(), "the acquire is still on its way");
            slow.shutdown().await;
        });
    };
    tokio::task::block_in_place(|| {
        std::thread::scope(|scope| {
            scope.spawn(service).join().expect("the service thread");
        })
    });
    rig.proxy.set_reply_latency(Duration::ZERO);
    free_within_5s(
        &direct,
        "in-flight-at-shutdown",
        "the grant of an acquire in flight at shutdown was given back before shutdown() returned",
    )
    .await;
    direct.shutdown().await;
}

/// A `complete()` whose marker is written by the background retry, later: the marker lasts
/// what is left of its retention from the completion, not a whole retention from the retry.
/// Retention 2 s, the link cut 3 s: once the link is back the work may run again at once.
async fn a_late_marker_keeps_its_retention_from_the_completion(rig: Rig) {
    let slow = rig.slow(Duration::from_millis(500)).await;
    let direct = rig.direct().await;
    let once = Duration::from_secs(2);
    let guard = slow
        .lock("late-marker")
        .ttl(Duration::from_secs(30))
        .once(once)
        .try_acquire()
        .await
        .free();
    rig.cut();
    assert!(guard.complete().await.is_err(), "the link is cut");
    tokio::time::sleep(Duration::from_secs(3)).await;
    rig.mend();
    let again = direct
        .lock("late-marker")
        .ttl(Duration::from_secs(30))
        .once(once)
        .acquire_timeout(Duration::from_secs(5))
        .await;
    assert!(
        again.is_ok(),
        "the marker's 2 s had passed when the link came back: {again:?}"
    );
    slow.shutdown().await;
    direct.shutdown().await;
}

macro_rules! on_every_store {
    ($($case:ident),* $(,)?) => {
        mod redis { $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() { super::$case(super::Rig::redis()).await }
        )* }
        mod postgres { $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() { super::$case(super::Rig::postgres()).await }
        )* }
        mod etcd { $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() { super::$case(super::Rig::etcd()).await }
        )* }
    };
}

on_every_store!(
    a_failed_release_is_carried_out_later,
    a_failed_completion_still_marks_the_work_done,
    shutdown_waits_for_acquires_in_flight,
    a_late_marker_keeps_its_retention_from_the_completion,
);

/// An acquire future that is never polled again (pinned in a `select!` whose other arm awaits
/// the shutdown, in the same task) holds its in-flight count for ever: `shutdown()` still
/// returns, after a bounded wait (twice the command timeout and a second).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_returns_with_an_acquire_nobody_polls() {
    let rig = Rig::redis();
    let slow = rig.slow(Duration::from_secs(1)).await;
    rig.proxy.stall();
    let acquire = slow.lock("never-polled").try_acquire();
    tokio::pin!(acquire);
    tokio::select! {
        _ = &mut acquire => panic!("the store is stalled"),
        _ = tokio::time::sleep(Duration::from_millis(200)) => {}
    }
    let returned = tokio::time::timeout(Duration::from_secs(10), slow.shutdown()).await;
    rig.proxy.resume();
    assert!(
        returned.is_ok(),
        "shutdown() waited for an acquire that is never polled again"
    );
}

/// A release that Redis carried out but whose answer was lost (the connection dropped on the
/// way back) is sent again, and the second send finds the record gone: `release()` must still
/// say it released the lock (`Ok(true)`), not that it was no longer ours; the same for an
/// operator's forced release (lockctl's `release --force`). Redis only: the retry is its
/// connection's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_whose_answer_was_lost_still_reports_it_released() {
    let rig = Rig::redis();
    let slow = rig.slow(Duration::from_secs(3)).await;
    let direct = rig.direct().await;
    for forced in [false, true] {
        let key = format!("answer-lost-{forced}");
        let guard = slow.take(&key, Duration::from_secs(30)).await;
        // Answers held back 600 ms; the connection drops while this one is held back.
        rig.proxy.set_reply_latency(Duration::from_millis(600));
        let dropper = async {
            tokio::time::sleep(Duration::from_millis(200)).await;
            rig.proxy.set_reply_latency(Duration::ZERO);
            rig.proxy.drop_connections_and_what_they_hold();
        };
        let released = if forced {
            let (released, ()) = tokio::join!(slow.force_release(&key), dropper);
            drop(guard);
            released
        } else {
            let (released, ()) = tokio::join!(guard.release(), dropper);
            released
        };
        assert!(
            matches!(released, Ok(true)),
            "the {} was carried out, only its answer was lost: {released:?}",
            if forced { "forced release" } else { "release" }
        );
        assert!(
            direct.inspect(&key).await.expect("inspect").is_none(),
            "`{key}` is free"
        );
    }
    slow.shutdown().await;
    direct.shutdown().await;
}
