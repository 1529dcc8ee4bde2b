//! The conformance kit of `lock-runtime`: the behaviour suite and the attribute suite that
//! every lock store must pass, run on your store with one macro call.
//!
//! A store written against [`lock_runtime::store::LockStore`] proves itself the way the
//! built-in ones do (the memory store, one Redis server, Cluster, Sentinel and Redlock all run
//! this kit in this project's CI): implement [`Harness`] (make a runtime on your store; delete
//! a lock record behind its holder's back), then in a test file of your crate:
//!
//! ```text
//! lock_testkit::conformance_suite!(MyHarness::start().await);
//! ```
//!
//! That generates one `#[test]` per case (25 of them); each builds its own tokio runtime, so
//! your crate needs no tokio test setup. The expression is evaluated once per case, inside the
//! case's runtime, so it may `.await` and should give each case a fresh store (cases run in
//! parallel and reuse key names). `behaviour_suite!` and `attribute_suite!` run either half.
//!
//! What the cases check, in short: mutual exclusion under contention from several runtimes,
//! token-checked release, watchdog renewal and loss detection, strictly increasing fences,
//! `min_hold`, release on drop, panic and cancellation, event-driven waiting and timeouts,
//! expiry of a crashed holder, `inspect`, shutdown, `extend` and `max_hold`; and for the
//! attribute every contention policy, `on_lost`, re-entrancy, per-argument keys and `once`.
//! Timing margins are seconds, so a slow CI machine does not fail them.
//!
//! A complete example, a store over a `tokio::sync::Mutex<HashMap>` that passes the kit, is
//! `tests/map_store.rs` of this crate.

pub mod attr_suite;
pub mod jobs;
pub mod suite;

use std::future::Future;

use lock_runtime::LockRuntime;

/// A store under test, as the suites see it.
pub trait Harness: Send + Sync {
    /// A new runtime on the store: one service instance, with an owner of its own. Every
    /// runtime made from one harness locks the same locks (one shared store).
    fn runtime(&self) -> impl Future<Output = LockRuntime> + Send;

    /// Deletes the record of `key` straight from the storage, behind its holder's back (as an
    /// operator or a data loss would). Its holder must find out at its next renewal.
    fn delete_record(&self, key: &str) -> impl Future<Output = ()> + Send;
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

/// Generates one `#[test]` per case of the behaviour suite *and* the attribute suite, for the
/// [`Harness`] the expression makes (evaluated once per case, inside an async block).
#[macro_export]
macro_rules! conformance_suite {
    ($make:expr) => {
        $crate::behaviour_suite!($make);
        $crate::attribute_suite!($make);
    };
}

/// Generates one `#[test]` per behaviour case for the [`Harness`] the expression makes.
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
            dropped_future_releases_promptly,
            panic_releases_promptly,
            waiter_wakes_on_release,
            wait_timeout_gives_up,
            expired_holder_lets_waiter_in,
            inspect_shows_holder,
            shutdown_releases_everything,
            extend_and_max_hold,
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

/// Generates one `#[test]` per attribute case for the [`Harness`] the expression makes. Each
/// case runs inside `LockRuntime::scope` of runtimes built on the store.
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
            attr_methods_and_generics,
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
