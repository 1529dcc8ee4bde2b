//! Counters, histograms and a gauge through the `metrics` facade (cargo feature `metrics`).
//! Without the feature every function here is an empty inline function.
//!
//! | name | kind | meaning |
//! |---|---|---|
//! | `distributed_lock_attempts_total` | counter | acquire attempts sent to the store |
//! | `distributed_lock_acquired_total` | counter | locks obtained |
//! | `distributed_lock_contended_total` | counter | attempts that found the lock held (a skip, with `try_acquire`) |
//! | `distributed_lock_wait_timeouts_total` | counter | waits that gave up (`WaitTimeout`) |
//! | `distributed_lock_lost_total` | counter | leases lost while held |
//! | `distributed_lock_released_total` | counter | leases given back by their holder |
//! | `distributed_lock_renewal_failures_total` | counter | renewals that failed (retried until the validity ends) |
//! | `distributed_lock_wait_seconds` | histogram | time from the request to holding the lock, for waiting acquires |
//! | `distributed_lock_hold_seconds` | histogram | time from acquiring to releasing |
//! | `distributed_lock_leases_held` | gauge | leases held right now |
//! | `scheduled_firings_total` | counter | firings of a scheduled job, by `job` and `outcome` (`ok`, `failed`, `panicked`, `skipped_held`, `skipped_done`, `lost`, `missed`, `stopped`) |
//! | `scheduled_run_seconds` | histogram | how long a firing's run took (`ok` and `failed` ones), by `job` |
//! | `scheduled_history_gaps_total` | counter | runs not written to their journal (the store failed, or the writer's queue was full), by `job` |
//!
//! Every `distributed_lock_*` metric has the label `key` (the `scheduled_*` ones have `job`): the lock key, or what the runtime's
//! [`metrics_key_label`](crate::LockRuntimeBuilder::metrics_key_label) function makes of it,
//! to keep label cardinality bounded when keys are built from arguments.

#[cfg(feature = "metrics")]
mod enabled {
    use std::time::Duration;

    pub(crate) fn firing(job: &str, outcome: &str, took: Duration) {
        metrics::counter!("scheduled_firings_total", "job" => job.to_owned(), "outcome" => outcome.to_owned())
            .increment(1);
        if outcome == "ok" || outcome == "failed" {
            metrics::histogram!("scheduled_run_seconds", "job" => job.to_owned())
                .record(took.as_secs_f64());
        }
    }

    pub(crate) fn history_gap(job: &str) {
        metrics::counter!("scheduled_history_gaps_total", "job" => job.to_owned()).increment(1);
    }

    pub(crate) fn attempt(label: &str) {
        metrics::counter!("distributed_lock_attempts_total", "key" => label.to_owned())
            .increment(1);
    }
    pub(crate) fn acquired(label: &str) {
        metrics::counter!("distributed_lock_acquired_total", "key" => label.to_owned())
            .increment(1);
        metrics::gauge!("distributed_lock_leases_held", "key" => label.to_owned()).increment(1.0);
    }
    pub(crate) fn contended(label: &str) {
        metrics::counter!("distributed_lock_contended_total", "key" => label.to_owned())
            .increment(1);
    }
    pub(crate) fn wait_timeout(label: &str) {
        metrics::counter!("distributed_lock_wait_timeouts_total", "key" => label.to_owned())
            .increment(1);
    }
    pub(crate) fn waited(label: &str, waited: Duration) {
        metrics::histogram!("distributed_lock_wait_seconds", "key" => label.to_owned())
            .record(waited.as_secs_f64());
    }
    pub(crate) fn lost(label: &str) {
        metrics::counter!("distributed_lock_lost_total", "key" => label.to_owned()).increment(1);
    }
    pub(crate) fn released(label: &str, held: Duration) {
        metrics::counter!("distributed_lock_released_total", "key" => label.to_owned())
            .increment(1);
        metrics::histogram!("distributed_lock_hold_seconds", "key" => label.to_owned())
            .record(held.as_secs_f64());
    }
    pub(crate) fn ended(label: &str) {
        metrics::gauge!("distributed_lock_leases_held", "key" => label.to_owned()).decrement(1.0);
    }
    pub(crate) fn renewal_failed(label: &str) {
        metrics::counter!("distributed_lock_renewal_failures_total", "key" => label.to_owned())
            .increment(1);
    }
}

#[cfg(not(feature = "metrics"))]
mod enabled {
    use std::time::Duration;

    #[inline]
    pub(crate) fn firing(_: &str, _: &str, _: Duration) {}
    #[inline]
    pub(crate) fn history_gap(_: &str) {}
    #[inline]
    pub(crate) fn attempt(_: &str) {}
    #[inline]
    pub(crate) fn acquired(_: &str) {}
    #[inline]
    pub(crate) fn contended(_: &str) {}
    #[inline]
    pub(crate) fn wait_timeout(_: &str) {}
    #[inline]
    pub(crate) fn waited(_: &str, _: Duration) {}
    #[inline]
    pub(crate) fn lost(_: &str) {}
    #[inline]
    pub(crate) fn released(_: &str, _: Duration) {}
    #[inline]
    pub(crate) fn ended(_: &str) {}
    #[inline]
    pub(crate) fn renewal_failed(_: &str) {}
}

pub(crate) use enabled::*;
