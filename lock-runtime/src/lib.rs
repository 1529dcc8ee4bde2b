//! Distributed locks for scheduled async jobs: run a job on exactly one of N service
//! instances, with leases in Redis (or in process memory for demos and tests).
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
//!         // ... the job, passing guard.lease().fence() to the storage it writes ...
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

#[doc(hidden)]
pub mod __private;
mod builder;
mod config;
mod context;
mod error;
mod guard;
mod lease;
mod request;
mod runtime;
mod store;
mod watchdog;

pub use builder::LockRuntimeBuilder;
pub use context::current_lease;
pub use error::{BackendError, LockError};
pub use guard::LockGuard;
pub use lease::{Lease, LockInfo};
pub use lock_macros::distributed_lock;
pub use request::LockRequest;
pub use runtime::LockRuntime;
pub use store::MemoryStore;

/// The project README's code blocks, compiled and run as doctests so it cannot drift.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct ReadmeDoctests;
