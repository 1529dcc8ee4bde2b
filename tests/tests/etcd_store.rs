//! The etcd store's own tests on real etcd: bad endpoints and credentials give clear errors
//! (a password never printed), and a cluster with authentication on works with `etcd_user`.

use lock_tests::Built;
use lock_tests::TakeFree;
use std::time::Duration;

use lock_runtime::{EtcdStore, LockError, LockRuntime};
use lock_tests::EtcdCluster;

const PASSWORD: &str = "s3cr3t-Pa55word";

/// Turns authentication on, with `root` (the only user etcd lets enable it) and PASSWORD.
async fn with_auth(cluster: &EtcdCluster) {
    let mut admin = etcd_client::Client::connect(cluster.endpoints(), None)
        .await
        .expect("connect");
    admin
        .user_add("root", PASSWORD, None)
        .await
        .expect("user_add");
    admin
        .user_grant_role("root", "root")
        .await
        .expect("grant root");
    admin.auth_enable().await.expect("auth_enable");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_endpoint_is_a_transient_error_naming_it() {
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.local_addr().expect("addr").port()
    };
    let endpoint = format!("http://127.0.0.1:{port}");
    let started = std::time::Instant::now();
    let err = LockRuntime::builder()
        .etcd([endpoint.clone()])
        .connect_timeout(Duration::from_secs(1))
        .build()
        .await
        .expect_err("nothing listens there");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "build() is bounded by the connect timeout"
    );
    assert!(err.is_transient(), "{err}");
    assert!(err.to_string().contains(&endpoint), "{err}");
    let empty: [&str; 0] = [];
    let err = LockRuntime::builder()
        .etcd(empty)
        .build()
        .await
        .expect_err("no endpoint");
    assert!(matches!(err, LockError::Config(_)), "{err}");
    // The deprecated builder setter, forwarded to the store: refused on any other store.
    #[allow(deprecated)]
    let builder = LockRuntime::builder()
        .redis("redis://127.0.0.1:1")
        .etcd_user("u", "p");
    let err = builder.build().await.expect_err("etcd_user without etcd");
    assert!(err.to_string().contains("etcd_user applies to"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn authentication_works_and_a_wrong_password_is_never_printed() {
    let cluster = EtcdCluster::start(1);
    with_auth(&cluster).await;
    // Without credentials: refused, and final (a retry will not cure it).
    let err = LockRuntime::builder()
        .etcd(cluster.endpoints())
        .build()
        .await
        .map(|_| ())
        .expect_err("auth is on");
    assert!(!err.is_transient(), "{err}");
    // A wrong password: refused, never printed.
    let wrong = "Wr0ng-Pa55word-xyz";
    let err = LockRuntime::builder()
        .store(EtcdStore::new(cluster.endpoints()).user("root", wrong))
        .build()
        .await
        .map(|_| ())
        .expect_err("wrong password");
    for shown in [err.to_string(), format!("{err:?}")] {
        assert!(!shown.contains(wrong), "the password leaked: {shown}");
    }
    // The right one: locks work, waiting too.
    let runtime = |owner: &'static str| {
        LockRuntime::builder()
            .store(EtcdStore::new(cluster.endpoints()).user("root", PASSWORD))
            .owner(owner)
            .build()
    };
    let a = runtime("a").await.expect("build with the password");
    let b = runtime("b").await.expect("build with the password");
    for shown in [
        format!("{a:?}"),
        format!(
            "{:?}",
            LockRuntime::builder().store(EtcdStore::new(["127.0.0.1:2379"]).user("root", PASSWORD))
        ),
    ] {
        assert!(!shown.contains(PASSWORD), "the password leaked: {shown}");
    }
    let guard = a.take_default_ttl("authed").await;
    let waiter = tokio::spawn(async move {
        let got = b
            .lock("authed")
            .acquire_timeout(Duration::from_secs(10))
            .await;
        (got, b)
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(guard.release().await.expect("release"));
    let (got, b) = waiter.await.expect("waiter");
    got.expect("the waiter gets it")
        .release()
        .await
        .expect("release");
    a.shutdown().await;
    b.shutdown().await;
}

/// Endpoints that can never work are configuration errors at `build()` (not backend errors,
/// and never transient: a caller retrying transient errors would retry them for ever), and a
/// password written into an endpoint shows nowhere: not in the builder's `Debug`, not in the
/// error. etcd takes credentials from `etcd_user` only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unusable_endpoints_are_config_errors_without_their_password() {
    const SECRET: &str = "3ndp0int-s3cret";
    for endpoint in [
        format!("http://root:{SECRET}@127.0.0.1:2379"),
        format!("root:{SECRET}@127.0.0.1:2379"),
        "http://127.0.0.1:notaport".to_owned(),
        "http://127.0.0.1".to_owned(),
        "ftp://127.0.0.1:2379".to_owned(),
        "http://:2379".to_owned(),
        "http://127.0.0.1:2379/v3/kv".to_owned(),
        "not an endpoint".to_owned(),
    ] {
        let builder = LockRuntime::builder().etcd([endpoint.clone()]);
        let debug = format!("{builder:?}");
        assert!(!debug.contains(SECRET), "the password leaked: {debug}");
        let err = builder
            .build()
            .await
            .map(|_| ())
            .expect_err("an unusable endpoint");
        assert!(matches!(err, LockError::Config(_)), "{endpoint}: {err:?}");
        for shown in [err.to_string(), format!("{err:?}")] {
            assert!(!shown.contains(SECRET), "the password leaked: {shown}");
        }
    }
}

/// `etcd_user` over plain http sends the password (and every auth token) in clear: the
/// runtime says so in the log, once at build().
#[tokio::test]
async fn a_password_over_plain_http_is_warned_about() {
    let captured = lock_tests::LogCapture::default();
    let _default = captured.install();
    let cluster = EtcdCluster::start(1);
    with_auth(&cluster).await;
    let runtime = LockRuntime::builder()
        .store(EtcdStore::new(cluster.endpoints()).user("root", PASSWORD))
        .built()
        .await;
    runtime.shutdown().await;
    let logs = captured.text();
    assert!(logs.contains("in clear"), "no warning: {logs}");
    assert!(!logs.contains(PASSWORD), "the password leaked: {logs}");
}
