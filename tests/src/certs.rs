//! Certificates for the TLS tests, made with the `openssl` command (Debian: `openssl`).

use crate::TakeFree;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use lock_runtime::{LockError, LockRuntime, LockRuntimeBuilder};

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("running openssl (Debian: apt-get install -y openssl)");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A self-signed CA in `dir`: `<ca>.crt` and `<ca>.key`.
pub fn ca(dir: &Path, ca: &str) {
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            &format!("{ca}.key"),
            "-out",
            &format!("{ca}.crt"),
            "-days",
            "2",
            "-subj",
            &format!("/CN={ca}"),
        ],
    );
}

/// A server certificate for 127.0.0.1 signed by the CA `ca`, in `dir`: `server.crt` and
/// `server.key`.
pub fn server_cert(dir: &Path, ca: &str) {
    openssl(
        dir,
        &[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
            "-subj",
            "/CN=127.0.0.1",
        ],
    );
    std::fs::write(dir.join("ext.cnf"), "subjectAltName=IP:127.0.0.1\n").expect("ext.cnf");
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            &format!("{ca}.crt"),
            "-CAkey",
            &format!("{ca}.key"),
            "-CAcreateserial",
            "-out",
            "server.crt",
            "-days",
            "2",
            "-extfile",
            "ext.cnf",
        ],
    );
}

/// Over the TLS connections of `a` and `b`: a lease shorter than the pause is renewed and
/// released, and a waiter in `b` is woken by a release in `a`.
pub async fn renews_and_wakes(a: &LockRuntime, b: &LockRuntime) {
    let guard = a.take("tls", Duration::from_millis(600)).await;
    tokio::time::sleep(Duration::from_millis(900)).await;
    assert!(!guard.lease().is_lost(), "renewed over TLS");
    assert!(guard.release().await.expect("release"));
    lock_testkit::suite::release_wakes_waiter(a, b, "tls-wait").await;
}

/// A runtime on `store()` trusting only `other_ca` (a CA that did not sign the servers'
/// certificates), and one trusting the system's roots, both fail to build, with an error that
/// names the certificate.
pub async fn refuses_other_roots(store: impl Fn() -> LockRuntimeBuilder, other_ca: Vec<u8>) {
    refused_for_the_certificate(vec![
        ("a wrong CA", store().tls_root_cert_pem(other_ca)),
        ("the system roots", store()),
    ])
    .await;
}

/// Each builder's `build()` fails, as a store error that names the certificate.
pub async fn refused_for_the_certificate(cases: Vec<(&str, LockRuntimeBuilder)>) {
    for (what, builder) in cases {
        let err = builder
            .connect_timeout(Duration::from_secs(2))
            .build()
            .await
            .expect_err(what);
        assert!(matches!(err, LockError::Backend(_)), "{what}: {err:?}");
        let text = err.to_string().to_lowercase();
        assert!(
            text.contains("certificate") || text.contains("issuer"),
            "{what}: {err}"
        );
    }
}

/// A temporary directory with two CAs (`ca`, `other-ca`) and a server certificate signed by
/// `ca` (see [`server_cert`]), with both CAs' certificates as PEM: `(dir, ca, other_ca)`.
pub fn two_cas() -> (tempfile::TempDir, Vec<u8>, Vec<u8>) {
    let dir = tempfile::tempdir().expect("temp dir");
    ca(dir.path(), "ca");
    ca(dir.path(), "other-ca");
    server_cert(dir.path(), "ca");
    let read = |name: &str| std::fs::read(dir.path().join(name)).expect(name);
    let (ca, other_ca) = (read("ca.crt"), read("other-ca.crt"));
    (dir, ca, other_ca)
}
