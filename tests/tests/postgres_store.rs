//! What only the PostgreSQL store has: its table, its errors, and its faults (a restart, a
//! terminated backend, a statement timeout, a dropped listening connection), each on a real
//! server started by the test.

use lock_tests::Built;
use lock_tests::Free;
use lock_tests::TakeFree;
use std::time::{Duration, Instant};

use lock_runtime::{LockError, LockRuntime, PostgresStore};
use lock_tests::PostgresServer;
use lock_tests::postgres::{PG_PASSWORD, hold};

/// Opens a transaction that holds the row lock of `key` (namespace `lock`), as a foreign
/// session would; rolled back when dropped.
async fn lock_row<'a>(
    admin: &'a mut tokio_postgres::Client,
    key: &str,
) -> tokio_postgres::Transaction<'a> {
    let tx = admin.transaction().await.expect("BEGIN");
    tx.execute(
        "SELECT 1 FROM lock_records WHERE key = $1 FOR UPDATE",
        &[&format!("lock:{{{key}}}")],
    )
    .await
    .expect("row lock");
    tx
}

async fn rows(server: &PostgresServer) -> i64 {
    server
        .client()
        .await
        .query_one("SELECT count(*) FROM lock_records", &[])
        .await
        .expect("counting rows")
        .get(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_urls_and_names_are_config_errors_without_the_password() {
    let err = LockRuntime::builder()
        .postgres("postgres://app:hunter2@127.0.0.1:notaport/db")
        .build()
        .await
        .expect_err("an unparsable URL");
    let text = err.to_string();
    assert!(matches!(err, LockError::Config(_)), "{text}");
    assert!(!text.contains("hunter2"), "{text}");

    // No host at all: it can never connect, so a configuration error (a transient one would be
    // retried for ever by a caller that retries transient build() errors).
    for url in [
        "postgres:///db",
        "postgres://app:hunter2@/db",
        "user=app dbname=db",
    ] {
        let err = LockRuntime::builder()
            .postgres(url)
            .build()
            .await
            .expect_err("no host");
        let text = err.to_string();
        assert!(matches!(err, LockError::Config(_)), "{url}: {text}");
        assert!(text.contains("no host"), "{url}: {text}");
        assert!(!text.contains("hunter2"), "{text}");
    }

    // No form of a password is shown: in the user part, as a parameter, spaced or quoted.
    for url in [
        "postgres://app:hunter2@127.0.0.1:5432/db",
        "postgres://app@127.0.0.1/db?password=hunter2",
        "host=127.0.0.1 user=app password = hunter2",
        "host=127.0.0.1 user=app password='hunter2 x'",
    ] {
        let shown = format!("{:?}", LockRuntime::builder().postgres(url));
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(shown.contains("app@127.0.0.1"), "{shown}");
    }

    for bad in ["Locks", "locks;drop", "", &"t".repeat(41)] {
        let err = LockRuntime::builder()
            .store(PostgresStore::new("postgres://127.0.0.1:1/db").table(bad))
            .build()
            .await
            .expect_err("a bad table name");
        assert!(matches!(err, LockError::Config(_)), "{bad:?}: {err}");
    }
    // The deprecated builder setter, forwarded to the store: refused on any other store.
    #[allow(deprecated)]
    let builder = LockRuntime::builder()
        .memory(lock_runtime::MemoryStore::new())
        .postgres_table("locks");
    let err = builder
        .build()
        .await
        .expect_err("postgres_table without postgres");
    assert!(err.to_string().contains("postgres_table"), "{err}");

    // Nothing listens on the port: a transient error naming the server, at build().
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
        l.local_addr().expect("bound").port()
    };
    let err = LockRuntime::builder()
        .postgres(format!("postgres://app:hunter2@127.0.0.1:{port}/db"))
        .connect_timeout(Duration::from_secs(2))
        .build()
        .await
        .expect_err("no server");
    let text = err.to_string();
    assert!(err.is_transient(), "{text}");
    assert!(
        text.contains(&port.to_string()) && !text.contains("hunter2"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_password_is_refused_and_never_printed() {
    let server = PostgresServer::start();
    let url = server.url().replace(PG_PASSWORD, "wrong-password-2718");
    let builder = LockRuntime::builder().postgres(&url);
    let shown = format!("{builder:?}");
    assert!(!shown.contains("wrong-password-2718"), "{shown}");
    let err = builder.build().await.expect_err("a wrong password");
    let text = format!("{err} {err:?}");
    assert!(
        !err.is_transient(),
        "a wrong password is not cured by retrying: {text}"
    );
    assert!(text.contains("password authentication failed"), "{text}");
    assert!(!text.contains("wrong-password-2718"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_table_without_create_permission_is_explained() {
    let server = PostgresServer::start();
    let admin = server.client().await;
    // PostgreSQL 15 and later let only the owner create in schema `public`.
    admin
        .batch_execute("CREATE ROLE app LOGIN PASSWORD 'app-pw-1618'; REVOKE CREATE ON SCHEMA public FROM PUBLIC;")
        .await
        .expect("creating a role without CREATE");
    let url = format!(
        "postgres://app:app-pw-1618@127.0.0.1:{}/postgres",
        server.port()
    );
    let err = LockRuntime::builder()
        .store(PostgresStore::new(&url).table("job_locks"))
        .build()
        .await
        .expect_err("no table and no right to create it");
    let text = err.to_string();
    assert!(matches!(err, LockError::Config(_)), "{text}");
    assert!(
        text.contains("CREATE TABLE IF NOT EXISTS job_locks"),
        "{text}"
    );
    assert!(!text.contains("app-pw-1618"), "{text}");

    // The documented migration, run by the owner, and the grants the store needs.
    let sql = text
        .split("run this SQL once as its owner: ")
        .nth(1)
        .expect("the message carries the SQL");
    admin
        .batch_execute(sql)
        .await
        .expect("the SQL of the message runs");
    admin
        .batch_execute(
            "GRANT SELECT, INSERT, UPDATE, DELETE ON job_locks TO app; \
             GRANT USAGE ON SEQUENCE job_locks_fence TO app;",
        )
        .await
        .expect("grants");
    let rt = LockRuntime::builder()
        .store(PostgresStore::new(&url).table("job_locks"))
        .built()
        .await;
    let guard = rt.lock("nightly").try_acquire().await.expect("acquire");
    assert!(guard.expect("free").release().await.expect("release"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn released_rows_are_deleted_and_expired_ones_swept() {
    let server = PostgresServer::start();
    let a = server.runtime("a").await;
    for i in 0..20 {
        let guard = a
            .lock(format!("job-{i}"))
            .try_acquire()
            .await
            .expect("acquire");
        assert!(guard.expect("free").release().await.expect("release"));
    }
    assert_eq!(rows(&server).await, 0, "a release deletes its row");

    // A done marker keeps its row until the retention ends.
    let guard = a
        .lock("once-job")
        .once(Duration::from_secs(60))
        .try_acquire()
        .await
        .free();
    assert!(guard.complete().await.expect("complete"));
    assert_eq!(rows(&server).await, 1, "the done marker's row stays");

    // What crashed holders leave: rows long expired. The next runtime's build sweeps them.
    server
        .client()
        .await
        .batch_execute(
            "INSERT INTO lock_records (key, token, owner, fence, acquired_at, expires_at, min_hold_until)
             SELECT 'lock:{crashed-' || i || '}', md5(i::text), 'gone', i,
                    now() - interval '1 hour', now() - interval '5 seconds', now() - interval '1 hour'
             FROM generate_series(1, 300) i",
        )
        .await
        .expect("inserting expired rows");
    assert_eq!(rows(&server).await, 301);
    let _b = server.runtime("b").await;
    assert_eq!(
        rows(&server).await,
        1,
        "expired rows swept, the live marker kept"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_mid_lease_keeps_the_lease_or_reports_it_lost_and_fences_keep_rising() {
    let server = PostgresServer::start();
    let a = server.runtime("a").await;
    let b = server.runtime("b").await;
    let ttl = Duration::from_secs(6);
    let first = a
        .lock("ledger")
        .ttl(ttl)
        .try_acquire()
        .await
        .expect("acquire");
    let first = first.expect("free");
    let fence_before = first.lease().fence().await.expect("a fence");

    // A waiter is parked when the server goes away.
    let waiter = lock_tests::acquire_in_task(b.clone(), "ledger", Duration::from_secs(40));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let server = tokio::task::spawn_blocking(move || {
        let mut server = server;
        server.restart();
        server
    })
    .await
    .expect("restarting");

    // The committed row survived the crash; the watchdog reconnects and renews it in time.
    tokio::time::sleep(ttl).await;
    assert!(
        !first.lease().is_lost(),
        "the lease was renewed across the restart"
    );
    assert!(
        !waiter.is_finished(),
        "the waiter is still waiting while A holds"
    );
    let released_at = Instant::now();
    assert!(first.release().await.expect("release"));
    let second = waiter
        .await
        .expect("the waiter task")
        .expect("the waiter gets the lock");
    let woke = released_at.elapsed();
    assert!(
        woke < Duration::from_secs(2),
        "the waiter woke {woke:?} after the release: the listener did not come back"
    );
    assert!(
        second.lease().fence().await.expect("a fence") > fence_before,
        "fence after the restart {} <= before {fence_before}",
        second.lease().fence().await.expect("a fence")
    );
    drop(server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminated_backends_cost_no_lease_and_no_wake_up() {
    let server = PostgresServer::start();
    let a = server.runtime("a").await;
    let b = server.runtime("b").await;
    let ttl = Duration::from_secs(3);
    let held = a
        .lock("report")
        .ttl(ttl)
        .try_acquire()
        .await
        .expect("acquire");
    let held = held.expect("free");
    let waiter = lock_tests::acquire_in_task(b.clone(), "report", Duration::from_secs(30));
    let admin = server.client().await;
    // Every connection of both runtimes (commands and listening), three times over a ttl.
    for _ in 0..3 {
        let killed: i64 = admin
            .query_one(
                "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity
                 WHERE application_name = 'lock-runtime' AND pid <> pg_backend_pid()) t",
                &[],
            )
            .await
            .expect("pg_terminate_backend")
            .get(0);
        assert!(killed >= 2, "terminated {killed} connections");
        tokio::time::sleep(ttl / 2).await;
    }
    assert!(!held.lease().is_lost(), "renewals reconnected in time");
    assert!(!waiter.is_finished());
    let released_at = Instant::now();
    assert!(held.release().await.expect("release"));
    let got = waiter
        .await
        .expect("task")
        .expect("the waiter gets the lock");
    assert!(
        released_at.elapsed() < Duration::from_secs(2),
        "woke {:?} after the release",
        released_at.elapsed()
    );
    drop(got);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_stuck_behind_a_foreign_row_lock_answers_busy_in_bounded_time() {
    let server = PostgresServer::start();
    let a = server.runtime("a").await;
    let b = server.runtime("b").await;
    let held = hold(&a, "payroll", Duration::from_secs(20)).await;
    // Another session holds the row's lock in an open transaction.
    let mut admin = server.client().await;
    let tx = lock_row(&mut admin, "payroll").await;
    let started = Instant::now();
    // The statement gives up at lock_timeout (a quarter of the 2 s command timeout), rolled
    // back: nothing granted, the lock is busy.
    let answer = b.lock("payroll").try_acquire().await.expect("an answer");
    assert!(answer.is_none(), "granted behind a foreign row lock");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "lock_timeout (0.5 s) bounds it: {:?}",
        started.elapsed()
    );
    tx.rollback().await.expect("ROLLBACK");
    assert!(b.try_take("payroll").await.is_none(), "A still holds it");
    assert!(!held.lease().is_lost());
    assert!(held.release().await.expect("release"));
    assert!(b.try_take("payroll").await.is_some());
}

/// A release whose row changed under it (another caller wrote the lock's done marker while
/// the release waited for the row) still releases. Before the fix, every branch of the
/// release statement missed the row: it answered "not ours", and the lock stayed taken by
/// nobody for its ttl with no waiter woken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_racing_a_done_marker_still_releases() {
    let server = PostgresServer::start();
    let a = server.runtime("a").await;
    let b = server.runtime("b").await;
    let held = hold(&a, "nightly", Duration::from_secs(30)).await;
    let mut admin = server.client().await;
    let tx = admin.transaction().await.expect("BEGIN");
    tx.execute(
        "UPDATE lock_records SET done_until = clock_timestamp() + interval '1 hour'
         WHERE key = 'lock:{nightly}'",
        &[],
    )
    .await
    .expect("a done marker, not committed yet");
    let release = tokio::spawn(async move { held.release().await });
    tokio::time::sleep(Duration::from_millis(150)).await;
    tx.commit().await.expect("COMMIT");
    assert!(
        release.await.expect("task").expect("release"),
        "the holder's release was reported as not its own"
    );
    assert!(
        b.try_take("nightly").await.is_some(),
        "the lock is free after its release"
    );
}

/// A foreign transaction sitting on one lock's row holds up that lock only: other leases of
/// the same runtime keep renewing (its statements give up on a row lock after a quarter of the
/// command timeout instead of blocking the connection they share).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_row_lock_costs_no_other_lease() {
    let server = PostgresServer::start();
    let a = server.runtime("a").await;
    let b = server.runtime("b").await;
    let _blocked = hold(&a, "blocked", Duration::from_secs(60)).await;
    let other = hold(&b, "other", Duration::from_secs(2)).await;
    let mut admin = server.client().await;
    let tx = lock_row(&mut admin, "blocked").await;
    // B keeps trying the blocked lock while its other lease needs renewals.
    let waiter = lock_tests::acquire_in_task(b.clone(), "blocked", Duration::from_secs(6));
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert!(
        !other.lease().is_lost(),
        "a lease of the same runtime was lost behind a foreign row lock"
    );
    assert!(waiter.await.expect("task").is_err(), "A still holds it");
    tx.rollback().await.expect("ROLLBACK");
    assert!(other.release().await.expect("release"));
}

/// The same with both leases in one runtime, so their renewals share one batch: the lease
/// whose row a foreign transaction locks may go unrenewed, the other must not be lost with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_row_lock_costs_no_lease_renewed_in_the_same_batch() {
    let server = PostgresServer::start();
    let a = server.runtime("a").await;
    let ttl = Duration::from_secs(2);
    let (blocked, other) = tokio::join!(hold(&a, "blocked", ttl), hold(&a, "other", ttl));
    let mut admin = server.client().await;
    let tx = lock_row(&mut admin, "blocked").await;
    tokio::time::sleep(ttl * 3).await;
    assert!(
        !other.lease().is_lost(),
        "a lease renewed in the same batch as a row-locked one was lost"
    );
    tx.rollback().await.expect("ROLLBACK");
    drop(blocked);
    assert!(other.release().await.expect("release"));
}

/// A table made by an earlier version lacks the `wanted` column: its owner's runtime adds
/// it; a user who may not gets the SQL to run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_older_table_gains_its_column_or_the_sql_for_it() {
    let server = PostgresServer::start();
    let admin = server.client().await;
    let old_schema = |t: &str| {
        format!(
            "CREATE TABLE {t} (key text PRIMARY KEY, token text, owner text NOT NULL,
                fence bigint NOT NULL, acquired_at timestamptz NOT NULL,
                expires_at timestamptz NOT NULL, min_hold_until timestamptz NOT NULL,
                done_until timestamptz);
             CREATE SEQUENCE {t}_fence;"
        )
    };
    admin
        .batch_execute(&format!(
            "{} {}
             CREATE ROLE app LOGIN PASSWORD 'app-pw-2718';
             GRANT SELECT, INSERT, UPDATE, DELETE ON old_locks TO app;
             GRANT USAGE ON SEQUENCE old_locks_fence TO app;",
            old_schema("own_locks"),
            old_schema("old_locks")
        ))
        .await
        .expect("tables of an earlier version");

    // The owner's runtime (the superuser here) brings its table up to date.
    let rt = LockRuntime::builder()
        .store(PostgresStore::new(server.url()).table("own_locks"))
        .built()
        .await;
    let guard = rt.lock("nightly").try_acquire().await.expect("acquire");
    assert!(guard.expect("free").release().await.expect("release"));
    rt.shutdown().await;

    let url = format!(
        "postgres://app:app-pw-2718@127.0.0.1:{}/postgres",
        server.port()
    );
    let build = || {
        LockRuntime::builder()
            .store(PostgresStore::new(&url).table("old_locks"))
            .build()
    };
    let err = build().await.expect_err("no right to change the table");
    let text = err.to_string();
    assert!(matches!(err, LockError::Config(_)), "{text}");
    assert!(
        text.contains("ALTER TABLE old_locks ADD COLUMN IF NOT EXISTS wanted"),
        "{text}"
    );
    let sql = text
        .split("run this SQL once as its owner: ")
        .nth(1)
        .expect("the message carries the SQL");
    admin.batch_execute(sql).await.expect("the SQL runs");
    let rt = build().await.expect("the table is up to date");
    let guard = rt.lock("nightly").try_acquire().await.expect("acquire");
    assert!(guard.expect("free").release().await.expect("release"));
}

/// A service that builds its driver configuration itself (a password from its secret store)
/// hands it over as it is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_driver_config_the_service_built_is_accepted() {
    use lock_runtime::store::tokio_postgres::Config;
    let server = PostgresServer::start();
    let mut config = Config::new();
    config
        .host("127.0.0.1")
        .port(server.port())
        .user(lock_tests::postgres::PG_USER)
        .password(PG_PASSWORD)
        .dbname("postgres");
    let builder = LockRuntime::builder().store(PostgresStore::with_config(config.clone()));
    let shown = format!("{builder:?}");
    assert!(!shown.contains(PG_PASSWORD), "{shown}");
    assert!(shown.contains("locktest@127.0.0.1"), "{shown}");
    let rt = builder.build().await.expect("build from a Config");
    hold(&rt, "from-config", Duration::from_secs(5))
        .await
        .release()
        .await
        .expect("release");

    config.password("wrong-password-5772");
    let err = LockRuntime::builder()
        .store(PostgresStore::with_config(config))
        .build()
        .await
        .expect_err("a wrong password");
    let text = err.to_string();
    assert!(text.contains("password authentication failed"), "{text}");
    assert!(!text.contains("wrong-password-5772"), "{text}");
    rt.shutdown().await;
}

/// Rows that hold nothing (crashed holders, rows kept for min_hold, expired done markers) are
/// all swept, however many: the table stays bounded by what is live whatever the rate at which
/// such rows come. 5,000 of them, then three runtimes built at once (each sweeps at build, as
/// every minute after): every expired row is gone, the live done marker stays. A sweep that
/// deleted at most 1,000 rows a minute, the same rows for runtimes sweeping at once, let a
/// table that gains more than that grow without bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_expired_row_is_swept_however_many() {
    let server = PostgresServer::start();
    let a = server.runtime("a").await;
    let guard = a
        .lock("once-job")
        .once(Duration::from_secs(600))
        .try_acquire()
        .await
        .free();
    assert!(guard.complete().await.expect("complete"));
    server
        .client()
        .await
        .batch_execute(
            "INSERT INTO lock_records (key, token, owner, fence, acquired_at, expires_at,
                                       min_hold_until, done_until)
             SELECT 'lock:{gone-' || i || '}',
                    CASE WHEN i % 3 = 0 THEN NULL ELSE md5(i::text) END, 'gone', i,
                    now() - interval '1 hour', now() - interval '5 seconds',
                    now() - interval '5 seconds',
                    CASE WHEN i % 3 = 1 THEN now() - interval '2 seconds' END
             FROM generate_series(1, 5000) i",
        )
        .await
        .expect("inserting expired rows");
    assert_eq!(rows(&server).await, 5001);
    let (b, c, d) = tokio::join!(
        server.runtime("b"),
        server.runtime("c"),
        server.runtime("d")
    );
    assert_eq!(
        rows(&server).await,
        1,
        "every expired row swept, the live marker kept"
    );
    for runtime in [a, b, c, d] {
        runtime.shutdown().await;
    }
}
