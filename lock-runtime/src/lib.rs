//! Distributed locks for scheduled async jobs: run a job on exactly one of N service
//! instances, with leases in Redis, PostgreSQL or etcd (or in process memory for demos and
//! tests).
//!
//! ```no_run
//! use lock_runtime::{distributed_lock, LockRuntime};
//!
//! #[distributed_lock(key = "interest-posting", ttl = "60s", on_contention = "skip")]
//! async fn post_daily_interest() -> anyhow::Result<()> {
//!     // runs on one instance only; the others return Ok(()) without running it
//!     Ok(())
//! }
//!
//! #[tokio::main]
//! async fn main() -> anyhow::Result<()> {
//!     LockRuntime::builder().redis("redis://127.0.0.1:6379").build().await?.install()?;
//!     post_daily_interest().await
//! }
//! ```
//!
//! The example the project README opens with; the README goes on with the options, the
//! guarantees in brief, and the stores.
//!
//! - [`LockRuntime`] is configured once at startup ([`LockRuntime::builder`]) and either
//!   installed process-wide or used directly.
//! - [`LockRuntime::lock`] returns a [`LockRequest`]; acquiring it gives a [`LockGuard`] whose
//!   [`Lease`] carries a fencing token and tells when the lock was lost.
//! - A watchdog renews held leases at a third of their ttl; a release happens when the guard is
//!   released or dropped (also on panic and on a cancelled future), without blocking.
//!
//! ```
//! use std::time::Duration;
//! use lock_runtime::{LockRuntime, MemoryStore};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), lock_runtime::LockError> {
//! let runtime = LockRuntime::builder().memory(MemoryStore::new()).build().await?;
//! match runtime.lock("interest-posting").ttl(Duration::from_secs(60)).try_acquire().await? {
//!     Some(guard) => {
//!         // ... the job, passing guard.lease().fence().await? to the storage it writes ...
//!         guard.release().await?;
//!     }
//!     None => println!("another instance runs it"),
//! }
//! # Ok(()) }
//! ```
//!
//! # What a lease guarantees
//! A Redis lease makes double runs rare; it cannot make them impossible. A holder paused (GC,
//! SIGSTOP, a slow VM) past its ttl, or a failover that loses an acknowledged write, can let
//! two holders overlap. The defence is the [`Lease::fence`]: strictly increasing per key, to be
//! checked by the storage the job writes. The project README states the remaining failure
//! modes.
// On docs.rs (a nightly toolchain, `--cfg docsrs`): each item gated by a cargo feature shows
// which one.
#![cfg_attr(docsrs, feature(doc_cfg))]

#[doc(hidden)]
pub mod __private;
mod builder;
mod config;
mod context;
mod error;
mod guard;
mod history;
mod lease;
pub mod metrics;
mod request;
mod runtime;
mod schedule;
pub mod store;
mod token;
mod watchdog;

pub use builder::LockRuntimeBuilder;
pub use config::redact_url;
pub use context::current_lease;
pub use error::{BackendError, LockError};
pub use guard::LockGuard;
pub use history::{MAX_ERROR_TEXT, Run, RunOutcome};
pub use lease::{Lease, LockInfo};
/// Runs an async fn's body on exactly one of the instances competing for its `key`.
///
/// ```
/// use lock_runtime::{distributed_lock, LockRuntime, MemoryStore};
///
/// #[distributed_lock(key = "interest:{day}", ttl = "60s", min_hold = "5s", on_contention = "skip")]
/// async fn post_daily_interest(day: &str) -> Result<Option<u64>, lock_runtime::LockError> {
///     let lease = lock_runtime::current_lease().expect("inside the locked body");
///     Ok(Some(lease.fence().await?)) // Ok(None) when another instance held the lock
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), lock_runtime::LockError> {
/// let runtime = LockRuntime::builder().memory(MemoryStore::new()).build().await?;
/// let posted = runtime.scope(post_daily_interest("2026-12-01")).await?;
/// assert!(posted.is_some(), "ran, under a fence");
/// # Ok(()) }
/// ```
///
/// Options: `key` (required; `{param}`, `{param.field}`, `{self.field}` placeholders), `ttl`,
/// `min_hold`, `max_hold`, `on_contention` (`"skip"`, `"wait"`, `"error"`), `wait_timeout`,
/// `watchdog`, `on_lost` (`"abort"`, `"continue"`), `once` and `crate`. Their meanings and
/// defaults are in the table of the project README ("The attribute's options", also the
/// crate's page on crates.io), and each with the code it stands for in `docs/attribute.md`.
///
/// What a call returns when the body did not run is decided by its return type: `()` and
/// `Option<T>` (`None`) log lock errors with `tracing::error!`; `Result<T, E>` with
/// `E: From<LockError>` returns them as `Err`, and a skip as `Ok(())` / `Ok(None)` (so `T` must
/// be `()` or `Option<_>` with `"skip"` or `once`). Any other return type is a compile error
/// that says so. The body never runs without the lock (fail closed).
///
/// The runtime used is the task's [`LockRuntime::scope`] if any, else the installed
/// [`LockRuntime::install`] one, else the call returns `LockError::NotConfigured`. A nested
/// call in the same task for a key it already holds runs directly (re-entrant). Inside the
/// body, [`current_lease`] gives the lease and its fence.
pub use lock_macros::distributed_lock;
/// Fires an async fn without parameters on a schedule; with [`distributed_lock`] below it,
/// each firing runs on one instance only. [`Scheduler`] runs the jobs.
///
/// ```standalone_crate
/// use std::sync::atomic::{AtomicU32, Ordering};
/// use std::time::{Duration, SystemTime, UNIX_EPOCH};
/// use lock_runtime::{distributed_lock, scheduled, LockRuntime, MemoryStore, Scheduler};
///
/// static RUNS: AtomicU32 = AtomicU32::new(0);
///
/// #[scheduled(cron = "0 0 2 * * *", tz = "Europe/Berlin")]
/// #[distributed_lock(key = "interest-posting", ttl = "60s")]
/// async fn post_daily_interest() -> Result<(), lock_runtime::LockError> {
///     RUNS.fetch_add(1, Ordering::SeqCst);
///     Ok(())
/// }
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() -> Result<(), lock_runtime::LockError> {
/// // Two instances on one store, from noon on 1 December 2026 for ten days on tokio's
/// // paused clock: ten postings.
/// let store = MemoryStore::new();
/// let a = LockRuntime::builder().memory(store.clone()).build().await?;
/// let b = LockRuntime::builder().memory(store).build().await?;
/// let noon = UNIX_EPOCH + Duration::from_secs(1_796_126_400);
/// let ten_days = || tokio::time::sleep(Duration::from_secs(10 * 86_400));
/// let instance = |runtime| Scheduler::new(runtime).only(["post_daily_interest"]).wall_clock_from(noon);
/// let (ra, rb) = tokio::join!(
///     instance(a).run_until(ten_days()),
///     instance(b).run_until(ten_days()),
/// );
/// ra?;
/// rb?;
/// assert_eq!(RUNS.load(Ordering::SeqCst), 10);
/// # Ok(()) }
/// ```
///
/// Options: `cron` (five fields, or six with seconds first) or `every` (a fixed rate such as
/// `"5m"`, firings at multiples of it since the Unix epoch); `tz` (an IANA zone for `cron`;
/// default UTC); `catch_up` (`"skip"`, the default, or `"last"`: at start-up, run the last
/// missed firing if it is younger than `catch_up_window`, default 24 h); `name` (default the
/// fn's name); `local = true` (no lock: runs on every instance; only without
/// `#[distributed_lock]`); `retry_crashed = true` (a firing whose run crashed may be run by an
/// instance that reaches it later); `crate`. Every mistake is a compile error on its token.
/// What a firing does, and the clock skew it tolerates ([`SKEW_BOUND`]), are in
/// `docs/scheduling.md`.
pub use lock_macros::scheduled;
pub use request::LockRequest;
pub use runtime::LockRuntime;
pub use schedule::{Firing, JobInfo, MARKER_LIFE, SKEW_BOUND, Scheduler, current_firing};
#[cfg(feature = "etcd")]
pub use store::EtcdStore;
#[cfg(feature = "postgres")]
pub use store::PostgresStore;
#[cfg(feature = "zookeeper")]
pub use store::ZooKeeperStore;
pub use store::{MemoryStore, RedisClusterStore, RedisStore, RedlockStore};

/// The project README's code blocks, compiled and run as doctests so it cannot drift.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct ReadmeDoctests;

/// The same for the pages of `docs/` that hold Rust code.
#[cfg(doctest)]
#[doc = include_str!("../../docs/operations.md")]
pub struct OperationsDoctests;

/// The same for the scheduled jobs' page.
#[cfg(doctest)]
#[doc = include_str!("../../docs/scheduling.md")]
pub struct SchedulingDoctests;
