//! TLS (`rediss://`, cargo feature `tls`) against TLS-only redis-servers (one server, a Redlock
//! quorum, a Cluster, a Sentinel set) with certificates this test generates with the `openssl`
//! command; a wrong CA fails clearly.

use lock_tests::Built;
use lock_tests::TakeFree;
use std::time::Duration;

use lock_runtime::LockRuntime;
use lock_tests::certs;
use lock_tests::server::{RedisCluster, RedisServer, SentinelSet};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rediss_with_a_private_ca_works_and_a_wrong_ca_fails() {
    let (dir, ca, other_ca) = certs::two_cas();
    let server = RedisServer::start_tls_with(Some(dir.path()), &[]);
    let url = server.url();

    let a = LockRuntime::builder()
        .redis(url.as_str())
        .tls_root_cert_pem(ca.clone())
        .built()
        .await;
    let b = LockRuntime::builder()
        .redis(url.as_str())
        .tls_root_cert_pem(ca)
        .built()
        .await;
    certs::renews_and_wakes(&a, &b).await;

    certs::refuses_other_roots(|| LockRuntime::builder().redis(url.as_str()), other_ca).await;
}

/// Redlock over TLS: every master is a TLS-only server trusted through the private CA.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_over_tls() {
    let dir = tempfile::tempdir().expect("temp dir");
    certs::ca(dir.path(), "ca");
    certs::server_cert(dir.path(), "ca");
    let servers: Vec<RedisServer> = (0..3)
        .map(|_| RedisServer::start_tls_with(Some(dir.path()), &[]))
        .collect();
    let urls: Vec<String> = servers.iter().map(RedisServer::url).collect();
    let ca = std::fs::read(dir.path().join("ca.crt")).expect("ca.crt");
    let runtime = LockRuntime::builder()
        .redlock(urls.clone())
        .tls_root_cert_pem(ca)
        .built()
        .await;
    let first = runtime.take_default_ttl("tls-quorum").await;
    let first_fence = first.lease().fence().await.expect("a fence");
    assert!(first.release().await.expect("release"));
    let second = runtime.take_default_ttl("tls-quorum").await;
    assert!(second.lease().fence().await.expect("a fence") > first_fence);
    second.release().await.expect("release");
    let err = LockRuntime::builder()
        .redlock(urls)
        .connect_timeout(Duration::from_secs(2))
        .build()
        .await
        .expect_err("the system roots do not trust the private CA");
    assert!(
        err.to_string().contains("only 0 of 3 masters answered"),
        "{err}"
    );
}

/// A TLS-only 3+3 Redis Cluster (clients, replication and the cluster bus over TLS): with the
/// private CA a lease is renewed and a waiter woken; a wrong CA, and the system roots, are
/// refused at `build()`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_over_tls() {
    let (dir, ca, other_ca) = certs::two_cas();
    let cluster = RedisCluster::start_tls(Some(dir.path()), 3);
    let urls = cluster.urls();
    assert!(urls.iter().all(|u| u.starts_with("rediss://")), "{urls:?}");
    let runtime = || {
        LockRuntime::builder()
            .redis_cluster(urls.clone())
            .tls_root_cert_pem(ca.clone())
            .build()
    };
    let a = runtime().await.expect("Cluster over TLS with the right CA");
    let b = runtime().await.expect("Cluster over TLS with the right CA");
    certs::renews_and_wakes(&a, &b).await;
    certs::refuses_other_roots(
        || LockRuntime::builder().redis_cluster(urls.clone()),
        other_ca,
    )
    .await;
}

/// A TLS-only Sentinel set (the master, its replica and three sentinels; replication and the
/// sentinels' links over TLS): the runtime asks the sentinels over TLS and reaches the master
/// they name over TLS, follows a failover there, and a wrong CA is refused at `build()`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_over_tls() {
    let (dir, ca, other_ca) = certs::two_cas();
    let set = SentinelSet::start_tls(Some(dir.path()));
    let urls = set.sentinel_urls();
    assert!(urls.iter().all(|u| u.starts_with("rediss://")), "{urls:?}");
    let runtime = || {
        LockRuntime::builder()
            .redis_sentinel(&set.master_name, urls.clone())
            .tls_root_cert_pem(ca.clone())
            .build()
    };
    let a = runtime()
        .await
        .expect("Sentinel over TLS with the right CA");
    let b = runtime()
        .await
        .expect("Sentinel over TLS with the right CA");
    certs::renews_and_wakes(&a, &b).await;
    // Through a failover: the new master is reached over TLS as well.
    let guard = a.take("tls-failover", Duration::from_secs(3)).await;
    let before = guard.lease().fence().await.expect("a fence");
    assert!(guard.release().await.expect("release"));
    let old_master = set.master_port();
    set.failover();
    assert_ne!(set.master_port(), old_master);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let after = loop {
        match b.lock("tls-failover").try_acquire().await {
            Ok(Some(guard)) => break guard,
            Ok(None) => panic!("nobody holds tls-failover"),
            Err(e) => {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "no acquire on the new master within 10 s: {e}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    assert!(
        after.lease().fence().await.expect("a fence") > before,
        "hybrid fences keep rising"
    );
    assert!(after.release().await.expect("release on the new master"));
    certs::refuses_other_roots(
        || LockRuntime::builder().redis_sentinel(&set.master_name, urls.clone()),
        other_ca,
    )
    .await;
}
