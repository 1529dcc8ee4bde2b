//! Test support for the lock-runtime tests: real Redis and PostgreSQL servers, a fault proxy, the deterministic
//! simulation and the real-process exclusion checker. The suites every store runs live in the
//! public conformance kit, `lock-testkit`.

pub mod certs;
pub mod etcd;
pub mod exclusion;
pub mod fenced;
pub mod fleet;
pub mod helper;
pub mod logs;
pub mod on_demand;
pub mod postgres;
pub mod proxy;
pub mod rng;
pub mod runtimes;
pub mod server;
pub mod sim;
pub mod store;
pub mod wake;
pub mod with_server;
pub mod zookeeper;

pub use etcd::EtcdCluster;
pub use helper::Helper;
pub use lock_testkit::Free;
pub use logs::{LogCapture, RecordedSpan, SpanRecorder};
pub use on_demand::OnDemandFences;
pub use postgres::PostgresServer;
pub use proxy::FaultProxy;
pub use runtimes::{Built, TakeFree, acquire_in_task, builder_for, proxied_redis, redis_runtime};
pub use server::{RedisCluster, RedisServer, SentinelSet, query};
pub use store::TestStore;
pub use zookeeper::ZooKeeperEnsemble;
