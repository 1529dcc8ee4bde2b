//! `shutdown()` ends only when what it started has landed: a release a holder awaits, the
//! give-back of a grant it cut off, and the same end for a second call. That waiters end and
//! held leases get their grace are conformance-kit cases on every store
//! (`shutdown_ends_waiters`, `shutdown_lets_running_jobs_finish`, `shutdown_releases_everything`).
//! Each test failed on the code before its fix (docs/SAFETY.md); its comments say how.

use lock_tests::Built;
use lock_tests::TakeFree;
use std::sync::Arc;
use std::time::Duration;

use lock_runtime::{LockError, LockRuntime};
use lock_testkit::suite::free_now;
use lock_tests::{FaultProxy, RedisServer, redis_runtime};

/// Review of the fixes: `shutdown()` returns only after a release that the holder awaits
/// itself has landed. Before: the watchdog, finding no lease left, let `shutdown()` return
/// while that release was still on its way (here: 1 s through a slow link), so a process
/// exiting right after its shutdown could leave the lock to its ttl.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waits_for_a_release_in_flight() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    let holder = LockRuntime::builder()
        .redis(proxy.url())
        .shutdown_grace(Duration::from_secs(20))
        .built()
        .await;
    let other = redis_runtime(server.url(), Duration::from_secs(2)).await;
    let guard = holder.take("released-late", Duration::from_secs(30)).await;
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
async fn waits_for_the_give_back_of_a_cut_off_grant() {
    let server = RedisServer::start();
    let proxy = Arc::new(FaultProxy::start(server.port()));
    let direct = redis_runtime(server.url(), Duration::from_secs(2)).await;
    let in_process = proxy.clone();
    let process = in_a_process_that_exits(move || async move {
        let proxy = in_process;
        let runtime = redis_runtime(proxy.url(), Duration::from_secs(5)).await;
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
async fn a_second_shutdown_waits_for_the_same_end() {
    let server = RedisServer::start();
    let proxy = Arc::new(FaultProxy::start(server.port()));
    let direct = redis_runtime(server.url(), Duration::from_secs(2)).await;
    let in_process = proxy.clone();
    let process = in_a_process_that_exits(move || async move {
        let proxy = in_process;
        let runtime = LockRuntime::builder()
            .redis(proxy.url())
            .command_timeout(Duration::from_secs(5))
            .shutdown_grace(Duration::from_millis(300))
            .built()
            .await;
        let guard = runtime.take("shut-twice", Duration::from_secs(30)).await;
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
