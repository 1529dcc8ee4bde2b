//! What a lock costs the PostgreSQL server beyond its two statements: the plans they run
//! (found by key, whatever the table's statistics say) and the announcements a release
//! sends (only when somebody asked for the lock).

use lock_tests::TakeFree;
use std::time::{Duration, Instant};

use lock_tests::PostgresServer;
use lock_tests::postgres::hold;

/// Sequential and index scans of the lock table so far, as the server's statistics show them.
async fn scans(admin: &tokio_postgres::Client) -> (i64, i64) {
    let row = admin
        .query_one(
            "SELECT seq_scan, coalesce(idx_scan, 0) FROM pg_stat_user_tables
             WHERE relname = 'lock_records'",
            &[],
        )
        .await
        .expect("reading the table's scan counters");
    (row.get(0), row.get(1))
}

/// A lock table is small most of the time, and a vacuum of an empty one records zero pages:
/// statements planned then would read the whole table on every acquire and release, also
/// once it holds thousands of rows. The store's statements must find their row by key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statements_find_rows_by_key_whatever_the_statistics_say() {
    let server = PostgresServer::start();
    let admin = server.client().await;
    server.runtime("creator").await.shutdown().await;
    // Statistics of an empty table, kept (no autovacuum) while 20,000 live rows arrive.
    for sql in [
        "ALTER TABLE lock_records SET (autovacuum_enabled = false)",
        "VACUUM ANALYZE lock_records",
    ] {
        admin.batch_execute(sql).await.expect(sql);
    }
    let rt = server.runtime("worker").await;
    // Enough rounds on the empty table for the server to settle on a generic plan of each
    // statement (it tries custom plans five times first).
    for i in 0..10 {
        let guard = hold(&rt, &format!("warm{i}"), Duration::from_secs(30)).await;
        assert!(rt.try_take(format!("warm{i}")).await.is_none());
        guard.release().await.expect("release");
    }
    admin
        .batch_execute(
            "INSERT INTO lock_records (key, token, owner, fence, acquired_at, expires_at,
                                       min_hold_until)
             SELECT 'filler:' || i, 't' || i, 'filler', nextval('lock_records_fence'), now(),
                    now() + interval '1 hour', now()
             FROM generate_series(1, 20000) i;",
        )
        .await
        .expect("filling the table behind the planner's back");
    let held = hold(&rt, "busy", Duration::from_secs(30)).await;
    // Count from here, once the sweeps of build() (which read the whole table, as they must)
    // are counted: a server process reports its counters before it leaves pg_stat_activity,
    // and only this runtime's command and listening connections stay.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let others: i64 = admin
            .query_one(
                "SELECT count(*) FROM pg_stat_activity
                 WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()",
                &[],
            )
            .await
            .expect("listing connections")
            .get(0);
        if others == 2 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{others} connections besides ours stay"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (seq_before, idx_before) = scans(&admin).await;
    const PAIRS: i64 = 100;
    for i in 0..PAIRS {
        let guard = hold(&rt, &format!("k{i}"), Duration::from_secs(30)).await;
        assert!(
            rt.try_take("busy").await.is_none(),
            "a held lock was granted again"
        );
        guard.release().await.expect("release");
    }
    held.release().await.expect("release");
    // Each backend reports its counters at least every ~10 s when idle; wait for every
    // statement above (three per round at least) to be counted one way or the other.
    let deadline = Instant::now() + Duration::from_secs(30);
    let (seq, idx) = loop {
        let (seq, idx) = scans(&admin).await;
        if (seq - seq_before) + (idx - idx_before) >= 3 * PAIRS || Instant::now() > deadline {
            break (seq - seq_before, idx - idx_before);
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    assert!(
        idx >= 3 * PAIRS,
        "{idx} index scans and {seq} sequential scans counted for {PAIRS} rounds"
    );
    assert_eq!(
        seq, 0,
        "statements of the store read the whole table {seq} times ({idx} index scans)"
    );
    rt.shutdown().await;
}

/// A `NOTIFY` serializes the commits of every transaction that sends one and wakes every
/// runtime's listening connection, so only releases somebody asked for are announced: an
/// acquire that found the lock held, whether it then waits or not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_releases_somebody_asked_for_are_announced() {
    let server = PostgresServer::start();
    let a = server.runtime("a").await;
    let b = server.runtime("b").await;
    let (listen, mut connection) = tokio_postgres::connect(&server.url(), tokio_postgres::NoTls)
        .await
        .expect("a listening connection");
    let (tx, mut heard) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Some(Ok(message)) = std::future::poll_fn(|cx| connection.poll_message(cx)).await {
            if let tokio_postgres::AsyncMessage::Notification(n) = message {
                let _ = tx.send(n.payload().to_owned());
            }
        }
    });
    listen
        .batch_execute("LISTEN lock_records_released")
        .await
        .expect("LISTEN");

    // Nobody else wants these: no announcement.
    for i in 0..20 {
        hold(&a, &format!("alone{i}"), Duration::from_secs(30))
            .await
            .release()
            .await
            .expect("release");
    }
    // Somebody tried and gave up: announced once.
    let guard = hold(&a, "tried", Duration::from_secs(30)).await;
    assert!(b.try_take("tried").await.is_none());
    guard.release().await.expect("release");
    // Somebody waits: announced, and the waiter is woken by it, long before the ttl.
    let guard = hold(&a, "waited", Duration::from_secs(30)).await;
    let waiter = {
        let b = b.clone();
        tokio::spawn(async move {
            let started = Instant::now();
            let g = b
                .lock("waited")
                .acquire_timeout(Duration::from_secs(20))
                .await
                .expect("the waiter gets the lock");
            (started.elapsed(), g)
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    guard.release().await.expect("release");
    let (waited, g) = waiter.await.expect("waiter task");
    assert!(waited < Duration::from_secs(10), "woken after {waited:?}");
    // The waiter's own release: nobody asked.
    g.release().await.expect("release");

    // Announcements arrive in commit order: one sent now marks the end of the ones above.
    listen
        .batch_execute("NOTIFY lock_records_released, 'end'")
        .await
        .expect("NOTIFY");
    let mut payloads = Vec::new();
    loop {
        let p = tokio::time::timeout(Duration::from_secs(10), heard.recv())
            .await
            .expect("the end marker arrives")
            .expect("the listening connection stays");
        if p == "end" {
            break;
        }
        payloads.push(p);
    }
    assert_eq!(payloads.len(), 2, "announced: {payloads:?}");
    assert!(payloads[0].contains("tried"), "{payloads:?}");
    assert!(payloads[1].contains("waited"), "{payloads:?}");
    a.shutdown().await;
    b.shutdown().await;
}

/// A waiter told to sleep until the holder's expiry must still be woken by a release that
/// comes sooner, also when the row was taken over in place in between. Here the holder is a
/// foreign row whose lease ends early (its expiry moved to now behind everyone's back: no
/// release, no announcement), as it does within the timers' jitter when several runtimes wait
/// for a crashed holder; another runtime takes the row over in place and releases it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_takeover_in_place_keeps_the_waiters_wake_up() {
    let server = PostgresServer::start();
    let admin = server.client().await;
    let (w, c) = (
        server.runtime("waiter").await,
        server.runtime("passer-by").await,
    );
    admin
        .execute(
            "INSERT INTO lock_records (key, token, owner, fence, acquired_at, expires_at,
                                       min_hold_until)
             VALUES ('lock:{job}', 'foreign', 'crashed', nextval('lock_records_fence'),
                     clock_timestamp(), clock_timestamp() + interval '60 seconds',
                     clock_timestamp())",
            &[],
        )
        .await
        .expect("a holder that will not release");
    let waiter = tokio::spawn(async move {
        w.lock("job")
            .acquire_timeout(Duration::from_secs(20))
            .await
            .expect("the waiter got the lock")
            .lease()
            .fence()
            .await
    });
    // Until the waiter has been refused (and sleeps until about the holder's 60 s).
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let wanted: bool = admin
            .query_one(
                "SELECT wanted FROM lock_records WHERE key = 'lock:{job}'",
                &[],
            )
            .await
            .expect("reading the row")
            .get(0);
        if wanted {
            break;
        }
        assert!(Instant::now() < deadline, "the waiter never asked");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    admin
        .execute(
            "UPDATE lock_records SET expires_at = clock_timestamp() WHERE key = 'lock:{job}'",
            &[],
        )
        .await
        .expect("ending the holder's lease early");
    hold(&c, "job", Duration::from_secs(30))
        .await
        .release()
        .await
        .expect("release");
    let got = waiter.await.expect("waiter task");
    assert!(got.is_ok(), "the waiter was not woken: {got:?}");
}
