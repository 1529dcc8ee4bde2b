//! Test support for the lock-runtime tests: real Redis and PostgreSQL servers, a fault proxy, the deterministic
//! simulation and the real-process exclusion checker. The suites every store runs live in the
//! public conformance kit, `lock-testkit`.

pub mod certs;
pub mod etcd;
pub mod exclusion;
pub mod fenced;
pub mod fleet;
pub mod logs;
pub mod postgres;
pub mod proxy;
pub mod rng;
pub mod runtimes;
pub mod server;
pub mod sim;
pub mod store;
pub mod wake;

pub use etcd::EtcdCluster;
pub use logs::LogCapture;
pub use postgres::PostgresServer;
pub use proxy::FaultProxy;
pub use runtimes::redis_runtime;
pub use server::{RedisCluster, RedisServer, SentinelSet};
pub use store::TestStore;
