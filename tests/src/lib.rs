//! Test support for the lock-runtime suite: real Redis servers and a behaviour suite that runs
//! unchanged on every store.

pub mod attr_suite;
pub mod exclusion;
pub mod fenced;
pub mod jobs;
pub mod proxy;
pub mod rng;
pub mod server;
pub mod sim;
pub mod store;
pub mod suite;

pub use proxy::FaultProxy;
pub use server::{RedisCluster, RedisServer, SentinelSet};
pub use store::TestStore;
