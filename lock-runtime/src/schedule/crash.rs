//! Crashed runs: an instance that finds a firing claimed by another follows the job's lock
//! while that holder has it. A lease that runs out unrenewed (not released before its
//! expiry), with no run of the firing journalled a few seconds later, is a crash: the first
//! of the watching instances to claim the report journals the firing as `crashed`, naming
//! the holder and its fence.
//!
//! Only jobs whose lease says it: renewed by the watchdog and stopped on a loss (a live
//! holder never outlives its lease unnoticed), no `min_hold` or `once` (the record ends with
//! the run), `on_contention = "skip"` (a firing finding the previous run is journalled
//! skipped, not queued behind it), no `retry_crashed` (its crashed firing runs again).
//!
//! A holder that was only paused or cut off, and comes back after its lease ran out,
//! journals the run as `lost` as well. Nobody watches a firing no other instance reached
//! while its holder held the lock (one instance alone, or the others reaching the firing
//! after the lease had already run out), and one watch per job at a time leaves some firings
//! of a job with short runs unwatched: such crashes are not journalled.

use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::time::Instant;

use super::engine::Firer;
use super::marker::marker_key;
use crate::history::RunOutcome;
use crate::request::TryOutcome;

/// How long a holder that lost its lease has to journal its run before it counts as crashed.
const SETTLE: Duration = Duration::from_secs(3);
/// The holder is read again at half its lease's time left, within these bounds.
const POLL_MIN: Duration = Duration::from_millis(100);
const POLL_MAX: Duration = Duration::from_secs(10);
/// A lease gone later than this before its expiry may have run out; earlier, it was released.
/// Generous: etcd tells the time left in whole seconds, rounded up, and a release taken for
/// an expiry costs only the journal's read that follows.
const EXPIRY_MARGIN: Duration = Duration::from_millis(1_500);
/// How long the claimant's lease may take to appear after its marker.
const APPEAR: Duration = Duration::from_secs(2);
/// How many of the job's newest runs are searched for the firing and the lease.
const JOURNAL_READ: usize = 1_000;
/// A store that does not answer for this long past the lease's expiry ends the watch.
const GIVE_UP: Duration = Duration::from_secs(60);

/// Follows the holder of `key` for the firing `at` that another instance claimed, on a task
/// of its own that ends with the scheduler's stop; at most one such watch per job.
pub(super) fn watch(firer: &Firer, at: std::time::SystemTime, key: String) {
    if firer.watching.swap(true, Ordering::AcqRel) {
        return;
    }
    let firer = firer.clone();
    tokio::spawn(async move {
        let mut stopped = firer.stopped.clone();
        tokio::select! {
            () = follow(&firer, at, &key) => {}
            () = async move { let _ = stopped.wait_for(|stop| *stop).await; } => {}
        }
        firer.watching.store(false, Ordering::Release);
    });
}

async fn follow(firer: &Firer, at: std::time::SystemTime, key: &str) {
    let runtime = &firer.runtime;
    let job = firer.job.def.name;
    // A later firing is journalled already: this instance's clock is behind, and the lease it
    // would see is a later run's.
    match runtime.history(job, 1).await {
        Ok(newest) if newest.iter().all(|r| r.scheduled_at() <= at) => {}
        _ => return,
    }
    // The claimant takes the job's lock a few round trips after its marker: a short while to
    // see it. Nobody holds it then: the run ended (or ran out) before this instance came.
    let appear = Instant::now() + APPEAR;
    let first = loop {
        match runtime.inspect(key).await {
            Ok(Some(holder)) => break holder,
            Ok(None) if Instant::now() < appear => tokio::time::sleep(POLL_MIN).await,
            _ => return,
        }
    };
    // A record without expiry cannot run out; this instance's own run it does not watch.
    let Some(mut left) = first.remaining else {
        return;
    };
    if first.owner == runtime.owner() {
        return;
    }
    let mut clock = firer.clock.clone();
    let started_at = first
        .held_for
        .and_then(|held| clock.now().checked_sub(held))
        .unwrap_or(at);
    let mut expires = Instant::now() + left;
    // The holder's fence as the record shows it last: a store that fences on demand shows one
    // only once the run asked for it.
    let mut fence = first.fence;
    loop {
        tokio::time::sleep((left / 2).clamp(POLL_MIN, POLL_MAX)).await;
        match runtime.inspect(key).await {
            Ok(Some(now)) if now.holder == first.holder => match now.remaining {
                Some(r) => {
                    fence = now.fence.or(fence);
                    left = r;
                    expires = Instant::now() + r;
                }
                None => return,
            },
            // Gone, or held by the next run.
            Ok(_) => break,
            Err(_) => {
                if Instant::now() > expires + GIVE_UP {
                    return;
                }
                left = expires.saturating_duration_since(Instant::now());
            }
        }
    }
    // Gone well before it would have run out: its holder released it, and journals the run.
    if Instant::now() + EXPIRY_MARGIN < expires {
        return;
    }
    tokio::time::sleep(SETTLE).await;
    // The firing journalled meanwhile (its run, or its claimant saying why it did not run:
    // the lease was a previous run's), or the lease's run journalled (the holder came back):
    // no crash of this firing's run to tell.
    match runtime.history(job, JOURNAL_READ).await {
        Ok(runs)
            if runs
                .iter()
                .all(|r| r.scheduled_at() != at && fence.is_none_or(|f| r.fence() != Some(f))) => {}
        _ => return,
    }
    // One report, whichever of the watching instances gets here first.
    let life = firer.job.marker_life();
    let claim = runtime
        .lock(format!("{}#crashed", marker_key(key, job, at)))
        .once(life)
        .ttl(life)
        .watchdog(false);
    let report = match claim.try_acquire_detailed().await {
        Ok(TryOutcome::Acquired(report)) => report,
        Ok(_) => return, // another watcher reports it
        Err(e) => {
            tracing::debug!(job, error = %e, "the crash of a run could not be claimed for the journal");
            return;
        }
    };
    tracing::warn!(
        job,
        holder = %first.owner,
        fence,
        "the run of a firing crashed: its holder's lease ran out unreleased and no run was journalled"
    );
    firer.writer.write(firer.run(
        at,
        first.owner,
        (started_at, clock.now()),
        (Some(key.to_owned()), fence),
        RunOutcome::Crashed,
    ));
    if let Err(e) = report.complete().await {
        tracing::debug!(job, error = %e, "the crash report's marker was not kept");
    }
}
