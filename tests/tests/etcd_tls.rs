//! TLS to etcd (cargo features `etcd` and `tls`) against a real member that accepts clients
//! over TLS only, with certificates this test generates with the `openssl` command: verified
//! connections work (commands, waiting, renewal), a wrong CA and the system's roots are
//! refused at `build()`, plain connections fail, and mixed or contradictory settings are
//! configuration errors.

use std::time::Duration;

use lock_runtime::{LockError, LockRuntime};
use lock_tests::{EtcdCluster, certs};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verified_tls_works_and_everything_else_is_refused() {
    let (dir, ca, other_ca) = certs::two_cas();
    let cluster = EtcdCluster::start_tls(1, dir.path());
    let endpoints = cluster.endpoints();
    assert!(endpoints.iter().all(|e| e.starts_with("https://")));

    let runtime = || {
        LockRuntime::builder()
            .etcd(endpoints.clone())
            .tls_root_cert_pem(ca.clone())
            .command_timeout(Duration::from_secs(2))
            .build()
    };
    let a = runtime().await.expect("TLS, root given");
    let b = runtime().await.expect("TLS, root given");
    certs::renews_and_wakes(&a, &b).await;

    certs::refuses_other_roots(|| LockRuntime::builder().etcd(endpoints.clone()), other_ca).await;

    // Plain HTTP/2 to a TLS-only member: no answer that etcd would give.
    let plain: Vec<String> = endpoints
        .iter()
        .map(|e| e.replacen("https://", "http://", 1))
        .collect();
    let err = LockRuntime::builder()
        .etcd(plain)
        .connect_timeout(Duration::from_secs(2))
        .build()
        .await
        .map(|_| ())
        .expect_err("plain connection to a TLS-only member");
    assert!(matches!(err, LockError::Backend(_)), "{err:?}");

    // Settings that contradict each other are refused before connecting.
    let mixed = vec![endpoints[0].clone(), "http://127.0.0.1:1".to_owned()];
    let err = LockRuntime::builder()
        .etcd(mixed)
        .build()
        .await
        .map(|_| ())
        .expect_err("mixed endpoints");
    assert!(matches!(err, LockError::Config(_)), "{err:?}");
    let err = LockRuntime::builder()
        .etcd(["http://127.0.0.1:1"])
        .tls_root_cert_pem(ca.clone())
        .build()
        .await
        .map(|_| ())
        .expect_err("a root certificate without TLS");
    assert!(matches!(err, LockError::Config(_)), "{err:?}");
    a.shutdown().await;
    b.shutdown().await;
}
