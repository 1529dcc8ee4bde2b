//! A deterministic simulation of the runtime on a faulty store, and the checker of its
//! history (DESIGN §6).
//!
//! The real runtime code (acquire, waiting, the watchdog, release, shutdown, the attribute)
//! runs on a [`SimStore`] through the public `LockStore` trait, on a current-thread tokio
//! runtime with paused time. The store models one master with an asynchronously replicated
//! replica and failovers that lose what was not replicated (in one run of three, three such
//! deployments as the members of a Redlock quorum, so the runtime's quorum code runs too); a network that delays replies
//! past the client's timeout, loses replies after the call took effect, drops requests, and
//! cuts one instance off; bounded clock steps; and instance pauses longer than a lease. Every
//! choice comes from one `u64` seed. The checker then asserts exclusion, fencing and liveness
//! over the recorded history (see [`History::check`]).

mod history;
mod pubsub;
mod store;
mod wakeups;
mod workload;
mod world;

pub use history::{FaultKind, History, Verdict};
pub use store::SimStore;
pub use workload::{SimReport, run_seed};
pub use world::{CLOCK_BOUND_US, Leases, NetFaults, World};
