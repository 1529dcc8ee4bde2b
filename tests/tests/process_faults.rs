//! Faults that need a separate OS process: holders killed, paused, or stopped with SIGTERM,
//! run-once across processes, SCRIPT FLUSH.

use lock_tests::TakeFree;
use std::process::Stdio;
use std::time::Duration;

use lock_tests::{Helper, TestStore};
use tokio::process::Command;
use tokio::time::Instant;

/// A holder killed with SIGKILL never releases: the lock stays held until its ttl runs out,
/// then it is free again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_holder_frees_the_lock_after_its_ttl() {
    let store = TestStore::redis();
    let TestStore::Redis(server) = &store else {
        unreachable!("made as redis")
    };
    let ttl = Duration::from_secs(2);
    let mut holder = Helper::start(
        env!("CARGO_BIN_EXE_lock_holder"),
        &[server.url(), "job".into(), ttl.as_millis().to_string()],
        &[],
    );
    let line = holder.next_line().await;
    assert!(line.starts_with("acquired "), "holder said {line:?}");

    let runtime = store.runtime().await;
    // Held across several ttl/3 renewals by the live holder.
    tokio::time::sleep(ttl + Duration::from_millis(500)).await;
    assert!(runtime.try_take("job").await.is_none());

    holder.child.start_kill().expect("SIGKILL the holder");
    holder.child.wait().await.expect("reaping the holder");
    let killed = Instant::now();
    // Right after the kill the record is still there: nobody released it.
    assert!(runtime.try_take("job").await.is_none());
    let guard = runtime
        .lock("job")
        .acquire_timeout(ttl + Duration::from_secs(3))
        .await
        .expect("free again once the killed holder's ttl ran out");
    let waited = killed.elapsed();
    assert!(waited <= ttl + Duration::from_secs(3), "took {waited:?}");
    assert!(guard.lease().fence().await.expect("a fence") >= 2);
    guard.release().await.expect("release");
}

/// SCRIPT FLUSH while leases are held: the scripts are reloaded transparently (NOSCRIPT), and
/// renewals, releases and new acquisitions keep working.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn script_flush_is_transparent() {
    let store = TestStore::redis();
    let TestStore::Redis(server) = &store else {
        unreachable!("made as redis")
    };
    let runtime = store.runtime().await;
    let held = runtime.take("flushed", Duration::from_millis(600)).await;
    let mut conn = server.conn().await;
    let _: () = lock_tests::query(&mut conn, ("SCRIPT", "FLUSH")).await;
    // Several renewal periods pass: the watchdog's first renewal after the flush reloads.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(!held.lease().is_lost(), "renewals survived the flush");
    let _: () = lock_tests::query(&mut conn, ("SCRIPT", "FLUSH")).await;
    let first_fence = held.lease().fence().await.expect("a fence");
    assert!(held.release().await.expect("release after a flush"));
    let _: () = lock_tests::query(&mut conn, ("SCRIPT", "FLUSH")).await;
    let again = runtime.take_default_ttl("flushed").await;
    assert!(again.lease().fence().await.expect("a fence") > first_fence);
    again.release().await.expect("release");
}

/// A holder process that receives SIGTERM shuts its runtime down: the lock is free at once
/// (a waiter elsewhere wakes), not after the 30 s ttl, and the process exits cleanly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_shutdown_releases_held_locks_at_once() {
    let store = TestStore::redis();
    let TestStore::Redis(server) = &store else {
        unreachable!("made as redis")
    };
    let mut holder = Helper::start(
        env!("CARGO_BIN_EXE_lock_holder"),
        &[server.url(), "graceful".into(), "30000".into()],
        &[],
    );
    let line = holder.next_line().await;
    assert!(line.starts_with("acquired "), "{line}");

    let runtime = store.runtime().await;
    let waiter = lock_tests::acquire_in_task(runtime, "graceful", Duration::from_secs(10));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiter.is_finished(), "held by the other process");
    holder.signal("-TERM");
    let signalled = Instant::now();
    let guard = tokio::time::timeout(Duration::from_secs(3), waiter)
        .await
        .expect("the waiter got the lock within seconds of SIGTERM, not after the 30 s ttl")
        .expect("task")
        .expect("acquired");
    assert!(signalled.elapsed() < Duration::from_secs(3));
    let status = holder.child.wait().await.expect("reaping the holder");
    assert!(status.success(), "the holder exited cleanly: {status}");
    let said = holder.lines.next_line().await.expect("stdout");
    assert_eq!(said.as_deref(), Some("shut down"));
    guard.release().await.expect("release");
}

/// Run-once markers across five processes whose schedulers fire 300 ms apart, longer than the
/// 200 ms job: with `once` and a key per slot, the job runs once per slot with no min_hold; a
/// run that fails leaves no marker, so the next instance runs it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn once_runs_a_slot_once_across_skewed_processes() {
    let store = TestStore::redis();
    let TestStore::Redis(server) = &store else {
        unreachable!("made as redis")
    };
    let run_slot = |date: &'static str, first_fails: bool| {
        let url = server.url();
        async move {
            let mut workers = Vec::new();
            for i in 0..5u64 {
                let mut args = vec![url.clone(), date.to_owned(), (i * 300).to_string()];
                if first_fails && i == 0 {
                    args.push("FAIL".to_owned());
                }
                workers.push(
                    Command::new(env!("CARGO_BIN_EXE_once_worker"))
                        .args(&args)
                        .stdout(Stdio::null())
                        .kill_on_drop(true)
                        .spawn()
                        .expect("spawning a worker"),
                );
            }
            for mut worker in workers {
                let status = tokio::time::timeout(Duration::from_secs(30), worker.wait())
                    .await
                    .expect("the worker finishes")
                    .expect("reaping a worker");
                assert!(status.success(), "a worker failed: {status}");
            }
        }
    };
    run_slot("2026-12-01", false).await;
    run_slot("2026-12-02", true).await;
    let mut conn = server.conn().await;
    let runs: Vec<Option<u64>> =
        lock_tests::query(&mut conn, ("MGET", "runs:2026-12-01", "runs:2026-12-02")).await;
    assert_eq!(runs[0], Some(1), "five skewed instances, one run");
    assert_eq!(
        runs[1],
        Some(2),
        "the failed run left no marker; the next instance ran it once"
    );
    let marker: bool =
        lock_tests::query(&mut conn, ("EXISTS", "lock:{interest:2026-12-01}:done")).await;
    assert!(marker, "the done marker stays for its retention");
}

/// A holder paused (SIGSTOP) past its ttl, then resumed: it knows its lease is lost before it
/// does more work, and its write to a fenced store is refused while the new holder's is
/// accepted. Stale writes accepted: 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_holder_is_fenced_off() {
    let store = TestStore::redis();
    let TestStore::Redis(server) = &store else {
        unreachable!("made as redis")
    };
    let mut holder = Helper::start_with_stdin(
        env!("CARGO_BIN_EXE_fenced_writer"),
        &[server.url(), "ledger-job".into(), "1000".into()],
        &[],
    );
    let mut stdin = holder.stdin();
    let line = holder.next_line().await;
    let old_fence: u64 = line
        .strip_prefix("acquired ")
        .and_then(|f| f.parse().ok())
        .expect("acquired <fence>");
    holder.signal("-STOP");
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let runtime = store.runtime().await;
    let guard = runtime
        .lock("ledger-job")
        .acquire_timeout(Duration::from_secs(5))
        .await
        .expect("the paused holder's lease expired");
    assert!(guard.lease().fence().await.expect("a fence") > old_fence);
    let mut conn = server.conn().await;
    lock_tests::fenced::new_holder_writes_and_the_paused_one_is_refused(
        &mut conn,
        guard.lease().fence().await.expect("a fence"),
        &mut holder,
        &mut stdin,
    )
    .await;
    guard.release().await.expect("release");
}
