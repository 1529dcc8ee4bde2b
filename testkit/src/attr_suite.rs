//! The attribute's behaviour, run once per store (see `attribute_suite!`). Each case runs
//! inside `LockRuntime::scope` of runtimes built on the store.

use crate::short::{Free, two_runtimes};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use lock_runtime::LockError;
use tokio::sync::{Barrier, Semaphore};
use tokio::time::Instant;

use crate::Harness;
use crate::jobs::*;

pub use crate::sched_suite::{
    sched_catch_up_after_a_restart_runs_what_nobody_ran, sched_firing_while_running_is_skipped,
    sched_journal_forgets_runs_older_than_its_age, sched_journal_keeps_the_newest_runs,
    sched_skewed_instances_run_each_firing_once,
    sched_stop_mid_run_lets_the_run_finish_and_frees_its_lock,
};

fn counter() -> Arc<AtomicU64> {
    Arc::new(AtomicU64::new(0))
}

/// skip: a held lock makes the call return "did not run" in each return shape.
pub async fn attr_skip_returns_without_running<H: Harness>(store: &H) {
    let holder = store.runtime().await;
    let caller = store.runtime().await;
    let runs = counter();

    let free = caller.scope(skip_job("a", runs.clone())).await;
    assert!(free.is_some(), "a free lock runs the body");
    assert_eq!(runs.load(Ordering::SeqCst), 1);

    let _g1 = holder.lock("skip:a").try_acquire().await.free();
    let _g2 = holder.lock("skip-unit:a").try_acquire().await.free();
    let _g3 = holder.lock("skip-result:a").try_acquire().await.free();
    assert_eq!(caller.scope(skip_job("a", runs.clone())).await, None);
    caller.scope(skip_unit_job("a", runs.clone())).await;
    caller
        .scope(skip_result_job("a", runs.clone()))
        .await
        .expect("a skip is Ok(())");
    assert_eq!(runs.load(Ordering::SeqCst), 1, "no skipped body ran");
}

/// error: a held lock gives `LockError::Contended`.
pub async fn attr_error_returns_contended<H: Harness>(store: &H) {
    let holder = store.runtime().await;
    let caller = store.runtime().await;
    let runs = counter();
    let guard = holder.lock("error:b").try_acquire().await.free();
    match caller.scope(error_job("b", runs.clone())).await {
        Err(LockError::Contended { key }) => assert_eq!(key, "error:b"),
        other => panic!("expected Contended, got {other:?}"),
    }
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    guard.release().await.expect("release");
    assert_eq!(
        caller
            .scope(error_job("b", runs.clone()))
            .await
            .expect("free now"),
        1
    );
}

/// wait: the body runs once the holder releases; a holder that keeps it past wait_timeout
/// gives WaitTimeout.
pub async fn attr_wait_runs_after_release_and_times_out<H: Harness>(store: &H) {
    let holder = store.runtime().await;
    let caller = store.runtime().await;
    let runs = counter();
    let guard = holder.lock("wait:c").try_acquire().await.free();
    let waiting = tokio::spawn(caller.scope(wait_job("c", runs.clone())));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(runs.load(Ordering::SeqCst), 0, "waits while held");
    guard.release().await.expect("release");
    tokio::time::timeout(Duration::from_secs(2), waiting)
        .await
        .expect("runs soon after the release")
        .expect("task")
        .expect("ran");
    assert_eq!(runs.load(Ordering::SeqCst), 1);

    let _held = holder.lock("wait:c").try_acquire().await.free();
    let start = Instant::now();
    match caller.scope(wait_job("c", runs.clone())).await {
        Err(LockError::WaitTimeout { waited, .. }) => assert!(waited >= Duration::from_secs(3)),
        other => panic!("expected WaitTimeout, got {other:?}"),
    }
    assert!(start.elapsed() < Duration::from_secs(8));
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// on_lost = "abort": losing the lease stops the body; its side effects stop.
pub async fn attr_abort_stops_the_body_on_loss<H: Harness>(store: &H) {
    let caller = store.runtime().await;
    let ticks = counter();
    let running = tokio::spawn(caller.scope(endless_job("d", ticks.clone())));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(ticks.load(Ordering::SeqCst) > 0, "the body runs");
    store.delete_record("abort:d").await;
    let result = tokio::time::timeout(Duration::from_secs(3), running)
        .await
        .expect("the body is stopped within ttl/3 plus a margin")
        .expect("task");
    assert!(matches!(result, Err(LockError::Lost { .. })), "{result:?}");
    let after = ticks.load(Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        ticks.load(Ordering::SeqCst),
        after,
        "no side effects after the abort"
    );
}

/// on_lost = "continue": the body finishes and can see that its lease was lost.
pub async fn attr_continue_lets_the_body_finish<H: Harness>(store: &H) {
    let caller = store.runtime().await;
    let running = tokio::spawn(caller.scope(stubborn_job("e", Duration::from_millis(1500))));
    tokio::time::sleep(Duration::from_millis(200)).await;
    store.delete_record("continue:e").await;
    let result = tokio::time::timeout(Duration::from_secs(5), running)
        .await
        .expect("finishes")
        .expect("task");
    assert_eq!(
        result.expect("the body's own result"),
        Some(true),
        "it ran to the end, lease lost"
    );
}

/// min_hold: the lock stays held after the call returns, until min_hold has passed. Timing
/// is read from the store's own clock (`inspect`), never from how fast this machine ran.
pub async fn attr_min_hold_outlives_the_call<H: Harness>(store: &H) {
    let (a, b) = two_runtimes(store).await;
    let runs = counter();
    a.scope(min_hold_job("f", runs.clone())).await;
    b.scope(min_hold_job("f", runs.clone())).await;
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "the second call skips during min_hold"
    );
    let info = a
        .inspect("min-hold:f")
        .await
        .expect("inspect")
        .expect("the record outlives the call");
    let expires = info
        .held_for
        .expect("a min_hold record knows when it was taken")
        + info.remaining.expect("the record has an expiry");
    let slack = Duration::from_millis(100) + store.clock_granularity();
    assert!(
        expires >= Duration::from_secs(30) - slack && expires <= Duration::from_secs(30) + slack,
        "the record expires at min_hold (30 s after it was taken, by the store's clock), \
         not at the 60 s ttl: {expires:?}"
    );

    // Once the store has let the record go, the job runs again.
    let short_runs = counter();
    a.scope(min_hold_short_job("g", short_runs.clone())).await;
    wait_until_free(&a, "min-hold-short:g").await;
    b.scope(min_hold_short_job("g", short_runs.clone())).await;
    assert_eq!(
        short_runs.load(Ordering::SeqCst),
        2,
        "runs again once min_hold has passed"
    );
}

/// Polls `inspect` until the store has no record for `key` (at most 5 s).
async fn wait_until_free(runtime: &lock_runtime::LockRuntime, key: &str) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while runtime.inspect(key).await.expect("inspect").is_some() {
        assert!(
            Instant::now() < deadline,
            "the record of {key} outlived its min_hold by seconds"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A nested call for a key the task holds runs directly (no deadlock, no contention).
pub async fn attr_is_reentrant<H: Harness>(store: &H) {
    let caller = store.runtime().await;
    let runs = counter();
    tokio::time::timeout(
        Duration::from_secs(5),
        caller.scope(outer_job("g", runs.clone())),
    )
    .await
    .expect("no deadlock")
    .expect("both levels ran");
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

/// `{param}` keys: post(1) and post(2) run concurrently; a second post(1) skips.
pub async fn attr_param_keys_lock_per_argument<H: Harness>(store: &H) {
    let (a, b) = two_runtimes(store).await;
    let runs = counter();
    let inside = Arc::new(Barrier::new(3));
    let finish = Arc::new(Semaphore::new(0));
    let one = tokio::spawn(a.scope(post("h", 1, inside.clone(), finish.clone(), runs.clone())));
    let two = tokio::spawn(b.scope(post("h", 2, inside.clone(), finish.clone(), runs.clone())));
    tokio::time::timeout(Duration::from_secs(5), inside.wait())
        .await
        .expect("post(1) and post(2) are inside their bodies at the same time");
    let again = b
        .scope(post(
            "h",
            1,
            Arc::new(Barrier::new(1)),
            Arc::new(Semaphore::new(1)),
            runs.clone(),
        ))
        .await;
    assert_eq!(again, None, "post(1) while post(1) runs is skipped");
    assert_eq!(
        runs.load(Ordering::SeqCst),
        2,
        "the skipped body did not run"
    );
    finish.add_permits(2);
    assert_eq!(one.await.expect("task"), Some(()));
    assert_eq!(two.await.expect("task"), Some(()));
}

/// A body that panics, or a call that is cancelled, frees its lock at once, not after its ttl.
pub async fn attr_panic_and_cancel_release_at_once<H: Harness>(store: &H) {
    let (a, b) = two_runtimes(store).await;
    let panicked = tokio::spawn(a.scope(panicking_job("i"))).await;
    assert!(panicked.expect_err("the body panicked").is_panic());
    b.lock("panic:i")
        .acquire_timeout(Duration::from_secs(1))
        .await
        .expect("free within a second of the panic (ttl is 30 s)")
        .release()
        .await
        .expect("release");

    let cancelled =
        tokio::time::timeout(Duration::from_millis(300), a.scope(hanging_job("i"))).await;
    assert!(cancelled.is_err(), "the call was cancelled by the timeout");
    b.lock("cancel:i")
        .acquire_timeout(Duration::from_secs(1))
        .await
        .expect("free within a second of the cancellation (ttl is 30 s)")
        .release()
        .await
        .expect("release");
}

/// once: a successful run leaves a done marker that skips later calls, even after the lock
/// is free; a failed run leaves none.
pub async fn attr_once_skips_after_success_only<H: Harness>(store: &H) {
    let (a, b) = two_runtimes(store).await;
    let runs = counter();
    assert!(
        a.scope(once_job("j", true, runs.clone())).await.is_err(),
        "the failing run"
    );
    a.scope(once_job("j", false, runs.clone()))
        .await
        .expect("the first success");
    assert_eq!(runs.load(Ordering::SeqCst), 2, "a failure leaves no marker");
    b.scope(once_job("j", false, runs.clone()))
        .await
        .expect("skipped is Ok(())");
    a.scope(once_job("j", false, runs.clone()))
        .await
        .expect("skipped is Ok(())");
    assert_eq!(runs.load(Ordering::SeqCst), 2, "done: later calls skip");
    assert!(
        b.inspect("once:j").await.expect("inspect").is_none(),
        "the lock itself is free"
    );
}

/// once: a body that succeeded leaves its marker even when its lease was lost while it ran
/// (finding 11 of the safety review: the marker was silently not written, and the job ran
/// again at the next call).
pub async fn attr_once_marker_survives_a_lost_lease<H: Harness>(store: &H) {
    let (a, b) = two_runtimes(store).await;
    let runs = counter();
    let running = tokio::spawn(a.scope(once_outliving_its_lease("k", runs.clone())));
    tokio::time::sleep(Duration::from_millis(300)).await;
    store.delete_record("once-lost:k").await;
    let result = tokio::time::timeout(Duration::from_secs(15), running)
        .await
        .expect("the job ends")
        .expect("task");
    assert_eq!(result, Some(true), "the job ran and saw its lease lost");
    assert_eq!(
        b.scope(once_outliving_its_lease("k", runs.clone())).await,
        None,
        "the success left its marker: later calls skip"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the job ran once");
}

/// once: a `once` call nested in a plain call for the same key (re-entrant, no lock of its
/// own) still leaves its marker when it succeeds (finding 11, its second part).
pub async fn attr_reentrant_once_leaves_its_marker<H: Harness>(store: &H) {
    let a = store.runtime().await;
    let runs = counter();
    assert_eq!(a.scope(outer_plain("l", runs.clone())).await, Some(()));
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(
        a.scope(nested_once("l", runs.clone())).await,
        None,
        "the nested call's success left its marker"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the job ran once");
}

/// once: a nested `once` call honours a marker that is already there: an outer call that
/// calls it twice runs its body once; the second call returns as a skipped one does.
pub async fn attr_reentrant_once_honours_its_marker<H: Harness>(store: &H) {
    let a = store.runtime().await;
    let runs = counter();
    assert_eq!(
        a.scope(outer_plain_twice("t", runs.clone())).await,
        None,
        "the second nested call found the first one's marker"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the job ran once");
    assert_eq!(a.scope(outer_plain_twice("t", runs.clone())).await, None);
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "and not again in a later outer call"
    );
}

/// once: a job still running in its runtime's shutdown grace period calls a nested `once`
/// call: it runs (the enclosing lease covers it), it is not refused as a new request is.
pub async fn attr_reentrant_once_runs_during_the_shutdown_grace<H: Harness>(store: &H) {
    let a = store.runtime().await;
    let runs = counter();
    let go = Arc::new(tokio::sync::Notify::new());
    let job = tokio::spawn(a.scope(outer_plain_after("g", go.clone(), runs.clone())));
    // The job holds its lock and waits.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let shutting = {
        let a = a.clone();
        tokio::spawn(async move { a.shutdown().await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !shutting.is_finished(),
        "the grace period waits for the job"
    );
    go.notify_one();
    assert_eq!(job.await.expect("job"), Some(()), "the nested call ran");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    tokio::time::timeout(Duration::from_secs(5), shutting)
        .await
        .expect("shutdown ends once the job is done")
        .expect("shutdown task");
}

/// Methods (`&self`, `&mut self` with `{self.field}`) and generic functions.
pub async fn attr_methods_and_generics<H: Harness>(store: &H) {
    let rt = store.runtime().await;
    rt.scope(async {
        let mut ledger = Ledger {
            name: "main".into(),
            postings: 0,
        };
        assert_eq!(ledger.post(5).await.expect("post"), 5);
        assert_eq!(ledger.post(2).await.expect("post"), 7);
        assert_eq!(ledger.read().await, Some(7));
        assert_eq!(generic_job(42).await.expect("ran"), "ran 42");
        assert_eq!(generic_job("x").await.expect("ran"), "ran x");
    })
    .await;
    let held = rt.lock("ledger:main").try_acquire().await.free();
    let mut ledger = Ledger {
        name: "main".into(),
        postings: 0,
    };
    assert!(matches!(
        rt.scope(ledger.post(1)).await,
        Err(LockError::Contended { .. })
    ));
    assert_eq!(ledger.postings, 0, "the contended body did not run");
    held.release().await.expect("release");
}
