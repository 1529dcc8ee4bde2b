//! TLS to PostgreSQL (cargo features `postgres` and `tls`) against a real server that refuses
//! plain TCP, with certificates this test generates with the `openssl` command: verified
//! connections work (commands, waiting, renewal), a wrong CA and the system's roots are
//! refused at `build()`, and a plain connection is refused by the server.

use std::time::Duration;

use lock_runtime::LockRuntime;
use lock_tests::PostgresServer;
use lock_tests::certs;
use lock_tests::postgres::hold;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verified_tls_works_and_everything_else_is_refused() {
    let (dir, ca, other_ca) = certs::two_cas();
    let server = PostgresServer::start_tls(dir.path());

    // libpq's strictest mode, and the root certificate alone (which asks for TLS too).
    let runtimes = [
        format!("{}?sslmode=verify-full", server.url()),
        server.url(),
    ]
    .map(|url| {
        LockRuntime::builder()
            .postgres(url)
            .tls_root_cert_pem(ca.clone())
            .command_timeout(Duration::from_secs(2))
            .build()
    });
    let [a, b] = runtimes;
    let (a, b) = (
        a.await.expect("TLS, verify-full"),
        b.await.expect("TLS, root given"),
    );
    certs::renews_and_wakes(&a, &b).await;
    let _held = hold(&a, "held", Duration::from_secs(30)).await;

    // Every connection of both runtimes (two each) is encrypted.
    let encrypted: Vec<bool> = server
        .client()
        .await
        .query(
            "SELECT s.ssl FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid)
             WHERE a.application_name = 'lock-runtime'",
            &[],
        )
        .await
        .expect("pg_stat_ssl")
        .iter()
        .map(|row| row.get(0))
        .collect();
    assert_eq!(encrypted, vec![true; 4], "{encrypted:?}");

    certs::refused_for_the_certificate(vec![
        (
            "a wrong CA",
            LockRuntime::builder()
                .postgres(server.url())
                .tls_root_cert_pem(other_ca),
        ),
        (
            "the system roots",
            LockRuntime::builder().postgres(format!("{}?sslmode=require", server.url())),
        ),
        (
            "verify-full alone (the system roots)",
            LockRuntime::builder().postgres(format!("{}?sslmode=verify-full", server.url())),
        ),
        (
            // The certificate names 127.0.0.1 only: the name is checked, not just the chain.
            "the right CA but another host name",
            LockRuntime::builder()
                .postgres(server.url().replace("127.0.0.1", "localhost"))
                .tls_root_cert_pem(ca.clone()),
        ),
    ])
    .await;

    // Without TLS the server says no, and says why.
    let err = LockRuntime::builder()
        .postgres(server.url())
        .build()
        .await
        .expect_err("plain TCP");
    let text = err.to_string();
    assert!(text.contains("no encryption"), "{text}");
    assert!(!text.contains(lock_tests::postgres::PG_PASSWORD), "{text}");
    a.shutdown().await;
    b.shutdown().await;
}
