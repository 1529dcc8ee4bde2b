//! The conformance kit of `lock-runtime`: the behaviour suite and the attribute suite that
//! every lock store must pass, run on your store with one macro call.
//!
//! A store written against [`lock_runtime::store::LockStore`] proves itself the way the
//! built-in ones do (the memory store, one Redis server, Cluster, Sentinel and Redlock all run
//! this kit in this project's CI): implement [`Harness`] (make a runtime on your store; delete
//! a lock record behind its holder's back), then name a module and the harness:
//!
//! ```
//! use lock_runtime::{LockRuntime, MemoryStore};
//!
//! struct MemoryHarness(MemoryStore);
//!
//! impl lock_testkit::Harness for MemoryHarness {
//!     async fn runtime(&self) -> LockRuntime {
//!         let builder = LockRuntime::builder().store(self.0.clone());
//!         builder.build().await.expect("a runtime on the store")
//!     }
//!
//!     async fn delete_record(&self, _key: &str) {
//!         self.0.clear(); // the memory store can only forget everything at once
//!     }
//! }
//!
//! lock_testkit::conformance_suite!(memory_store, MemoryHarness(MemoryStore::new()));
//! # fn main() {}
//! ```
//!
//! That generates a module `memory_store` with one `#[test]` per case (36); each builds its
//! own tokio runtime, so your crate needs no tokio test setup. The expression is evaluated
//! once per case, inside the case's runtime, so it may `.await`. Cases run in parallel and
//! reuse key names: give each case a fresh store, or, on a shared database, a namespace of
//! its own (`LockRuntimeBuilder::namespace`) that `delete_record` uses too.
//! [`behaviour_suite!`] and [`attribute_suite!`] generate either half into the current module.
//!
//! What the cases check, in short: mutual exclusion under contention from several runtimes,
//! token-checked release, watchdog renewal and loss detection, strictly increasing fences,
//! `min_hold`, release on drop, panic and cancellation, event-driven waiting and timeouts,
//! expiry of a crashed holder, `inspect`, `extend`, graceful shutdown (waiters end, running
//! jobs keep their lease through the grace period, holders are told before the release), a
//! lost lease that stays lost, `max_hold` as a hard cap, renewals that never shorten an
//! extended lease; and for the attribute every
//! contention policy, `on_lost`, re-entrancy, per-argument keys and `once` (whose marker a
//! success leaves even when its lease was lost, and from a nested call). Most leases in the
//! cases last a few hundred milliseconds and two cases check an expiry to within
//! 100 ms: a store that keeps time to the millisecond (Redis, PostgreSQL) passes as is; a
//! store whose clock is coarser (etcd's leases count whole seconds) says by how much in
//! [`Harness::clock_granularity`], and those cases allow that much more. Where a case waits
//! for something to happen, it allows seconds, so a slow CI machine does not fail it.
//!
//! The kit's cases call `lock-runtime` through its public API only, and [`Harness::runtime`]
//! returns its `LockRuntime`: use the kit of the same version as `lock-runtime`. A complete
//! store that passes the kit, over a `tokio::sync::Mutex<HashMap>`, is `tests/map_store.rs`
//! in this crate's repository.

#[doc(hidden)]
pub mod attr_suite;
mod jobs;
mod sched_suite;
mod short;

pub use short::Free;
#[doc(hidden)]
pub mod suite;

use std::future::Future;

use lock_runtime::LockRuntime;

/// A store under test, as the suites see it.
pub trait Harness: Send + Sync {
    /// A new runtime on the store: one service instance, with an owner of its own. Every
    /// runtime made from one harness locks the same locks (one shared store, one namespace).
    fn runtime(&self) -> impl Future<Output = LockRuntime> + Send;

    /// Deletes the record of `key` (in the namespace the harness's runtimes use; `"lock"`
    /// unless set) straight from the storage, behind its holder's back, as an operator or a
    /// data loss would. Its holder must find out at its next renewal.
    fn delete_record(&self, key: &str) -> impl Future<Output = ()> + Send;

    /// How coarse the store's clock is: an expiry may come this much later than asked, and a
    /// remaining time it reports may be off by this much. Zero (the default) for a store that
    /// keeps time to the millisecond; an etcd harness answers 1.5 s (leases count whole
    /// seconds, and expire in sweeps every 500 ms). Only the cases that check an expiry use
    /// it, and they still tell a min_hold from a ttl twice as long.
    fn clock_granularity(&self) -> std::time::Duration {
        std::time::Duration::ZERO
    }

    /// Whether the store keeps the run history of scheduled jobs (`LockStore::append_run` and
    /// the two reads). True (the default) makes the journal cases check it; a harness for a
    /// store that declines it answers false, and the cases then check that every call says
    /// `LockError::Unsupported`.
    fn keeps_history(&self) -> bool {
        true
    }
}

/// Runs one case on a multi-threaded tokio runtime of its own (2 workers).
#[doc(hidden)]
pub fn __run_case<F: Future<Output = ()>>(case: F) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime for a conformance case");
    runtime.block_on(case);
}

/// Generates a module `$name` with one `#[test]` per case of the behaviour suite *and* the
/// attribute suite, for the [`Harness`] the expression makes (evaluated once per case, inside
/// an async block, with the enclosing module's names in scope).
#[macro_export]
macro_rules! conformance_suite {
    ($name:ident, $make:expr) => {
        mod $name {
            #[allow(unused_imports)]
            use super::*;
            $crate::behaviour_suite!($make);
            $crate::attribute_suite!($make);
        }
    };
}

/// Generates one `#[test]` per behaviour case, named after the case, into the current module,
/// for the [`Harness`] the expression makes.
#[macro_export]
macro_rules! behaviour_suite {
    ($make:expr) => {
        $crate::behaviour_suite!(@cases $make;
            mutual_exclusion,
            stale_guard_releases_nothing,
            watchdog_keeps_short_lease_alive,
            deleted_record_is_reported_lost,
            fences_strictly_increase,
            min_hold_keeps_lock_after_release,
            min_hold_end_lets_waiter_in,
            dropped_future_releases_promptly,
            panic_releases_promptly,
            waiter_wakes_on_release,
            wait_timeout_gives_up,
            expired_holder_lets_waiter_in,
            inspect_shows_holder,
            list_and_force_release,
            force_release_names_one_holding,
            shutdown_releases_everything,
            extend_and_max_hold,
            shutdown_ends_waiters,
            shutdown_lets_running_jobs_finish,
            lost_stays_lost,
            max_hold_is_a_hard_cap,
            renewals_never_shorten_an_extended_lease,
        );
    };
    (@cases $make:expr; $($case:ident),* $(,)?) => {
        $(
            #[test]
            fn $case() {
                $crate::__run_case(async {
                    let store = $make;
                    $crate::suite::$case(&store).await;
                });
            }
        )*
    };
}

/// Generates one `#[test]` per attribute case, named after the case, into the current module,
/// for the [`Harness`] the expression makes. Each case runs inside `LockRuntime::scope` of
/// runtimes built on the store.
#[macro_export]
macro_rules! attribute_suite {
    ($make:expr) => {
        $crate::attribute_suite!(@cases $make;
            attr_skip_returns_without_running,
            attr_error_returns_contended,
            attr_wait_runs_after_release_and_times_out,
            attr_abort_stops_the_body_on_loss,
            attr_continue_lets_the_body_finish,
            attr_min_hold_outlives_the_call,
            attr_is_reentrant,
            attr_param_keys_lock_per_argument,
            attr_panic_and_cancel_release_at_once,
            attr_once_skips_after_success_only,
            attr_once_marker_survives_a_lost_lease,
            attr_reentrant_once_leaves_its_marker,
            attr_reentrant_once_honours_its_marker,
            attr_reentrant_once_runs_during_the_shutdown_grace,
            attr_methods_and_generics,
            sched_skewed_instances_run_each_firing_once,
            sched_firing_while_running_is_skipped,
            sched_catch_up_after_a_restart_runs_what_nobody_ran,
            sched_journal_keeps_the_newest_runs,
            sched_journal_forgets_runs_older_than_its_age,
            sched_stop_mid_run_lets_the_run_finish_and_frees_its_lock,
        );
    };
    (@cases $make:expr; $($case:ident),* $(,)?) => {
        $(
            #[test]
            fn $case() {
                $crate::__run_case(async {
                    let store = $make;
                    $crate::attr_suite::$case(&store).await;
                });
            }
        )*
    };
}
