//! Security: the runtime works as a Redis ACL user restricted to what it needs, and a wrong
//! password fails clearly without showing it.

use lock_tests::Built;
use lock_tests::Free;
use lock_tests::TakeFree;
use std::time::Duration;

use lock_runtime::{LockError, LockRuntime, distributed_lock};
use lock_tests::RedisServer;

/// The minimal ACL rule for a lock user of namespace `lock`, as documented in docs/security.md.
const LOCK_USER_ACL: &str = "on >s3cret-lock-pw ~lock:* resetchannels &lock:* -@all +ping +hello \
+evalsha +eval +script|load +subscribe +unsubscribe +ssubscribe +sunsubscribe +wait \
+pttl +type +exists +time +pexpire +set +get +del +publish +spublish \
+xadd +xtrim +xrevrange +scan";

#[distributed_lock(key = "acl-job", ttl = "1s", once = "1h")]
async fn once_job() -> Result<Option<u32>, LockError> {
    Ok(Some(1))
}

#[lock_runtime::scheduled(every = "1s", name = "acl-scheduled")]
#[distributed_lock(key = "acl-scheduled", ttl = "5s")]
async fn scheduled_job() -> Result<(), LockError> {
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restricted_acl_user_can_do_everything_the_runtime_needs() {
    let server = RedisServer::start();
    let mut admin = server.conn().await;
    let mut setuser = redis::cmd("ACL");
    setuser.arg("SETUSER").arg("locker");
    for part in LOCK_USER_ACL.split_whitespace() {
        setuser.arg(part);
    }
    let _: () = setuser.query_async(&mut admin).await.expect("ACL SETUSER");
    let url = format!("redis://locker:s3cret-lock-pw@127.0.0.1:{}", server.port());

    let a = LockRuntime::builder().redis(url.as_str()).built().await;
    let b = LockRuntime::builder().redis(url.as_str()).built().await;
    // Acquire, renew (watchdog), inspect, wait on a release, min_hold, once.
    let guard = a.take("acl", Duration::from_millis(600)).await;
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert!(!guard.lease().is_lost(), "renewals are permitted");
    assert!(a.inspect("acl").await.expect("inspect").is_some());
    assert!(guard.release().await.expect("release"));
    // Waiting on the release channel (subscribe and publish are permitted).
    lock_testkit::suite::release_wakes_waiter(&a, &b, "acl-wait").await;
    let held = a
        .lock("acl-min")
        .ttl(Duration::from_secs(5))
        .min_hold(Duration::from_millis(200))
        .try_acquire()
        .await
        .free();
    assert!(held.release().await.expect("release with min_hold"));
    assert_eq!(a.scope(once_job()).await.expect("ran"), Some(1));
    assert_eq!(a.scope(once_job()).await.expect("skipped"), None);
    // A scheduled job's firings, their markers and its run journal.
    let scheduler = LockRuntime::builder().redis(url.as_str()).built().await;
    lock_runtime::Scheduler::new(scheduler)
        .only(["acl-scheduled"])
        .run_until(tokio::time::sleep(Duration::from_millis(2_100)))
        .await
        .expect("the scheduler ran");
    let runs = a.history("acl-scheduled", 10).await.expect("history");
    assert!(!runs.is_empty(), "no run journalled as the ACL user");
    assert_eq!(
        a.journalled_jobs().await.expect("journalled jobs"),
        ["acl-scheduled"]
    );

    // Outside its key pattern the user is refused.
    let other_ns = LockRuntime::builder()
        .redis(url.as_str())
        .namespace("elsewhere")
        .built()
        .await;
    let err = other_ns
        .lock("x")
        .try_acquire()
        .await
        .expect_err("no permission");
    assert!(
        err.to_string().to_lowercase().contains("permission"),
        "{err}"
    );

    // A wrong password fails clearly, without the password in the message.
    let wrong = format!("redis://locker:not-the-pw@127.0.0.1:{}", server.port());
    let err = LockRuntime::builder()
        .redis(wrong)
        .build()
        .await
        .expect_err("wrong password");
    let text = format!("{err} {err:?}");
    assert!(
        text.contains("authentication") || text.contains("Authentication"),
        "{text}"
    );
    assert!(!text.contains("not-the-pw"), "{text}");
}
