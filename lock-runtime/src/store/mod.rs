//! The stores a runtime can lock in.
//!
//! Every store, the built-in ones included, implements [`LockStore`], and the runtime calls
//! nothing else, through one object-safe handle (`dispatch`). Any other store is plugged in with
//! [`LockRuntimeBuilder::store`](crate::LockRuntimeBuilder::store). The runtime brings
//! everything else (tokens, validity, the watchdog, waiting, shutdown); a store answers the
//! calls of [`LockStore`] with the semantics written on each (five that locking needs, two
//! for operators: `list` and `force_release`, and three for the run history of scheduled
//! jobs, which a store may decline).

mod choice;
mod dispatch;
#[cfg(feature = "etcd")]
pub(crate) mod etcd;
mod hub;
mod kinds;
mod listing;
mod lock_store;
mod memory;
#[cfg(feature = "postgres")]
mod postgres;
mod pubsub;
mod redis;
mod redlock;
mod types;
#[cfg(feature = "zookeeper")]
mod zookeeper;

pub use choice::{Chosen, IntoStore};
pub(crate) use choice::{Forwarded, Shared, StoreChoice, check_replicated};
pub(crate) use dispatch::{Backend, DynStore, SharedBackend};
#[cfg(feature = "etcd")]
pub(crate) use etcd::{EtcdBackend, EtcdOptions};
pub use hub::{ReleaseHub, ReleaseWatch};
#[cfg(feature = "etcd")]
pub use kinds::EtcdStore;
#[cfg(feature = "postgres")]
pub use kinds::PostgresStore;
#[cfg(feature = "zookeeper")]
pub use kinds::ZooKeeperStore;
pub use kinds::{RedisClusterStore, RedisStore, RedlockStore};
pub use listing::{QuorumView, key_matches, key_of_record};
pub use lock_store::LockStore;
pub use memory::MemoryStore;
#[cfg(feature = "postgres")]
pub(crate) use postgres::{DEFAULT_TABLE, PostgresBackend, PostgresOptions, PostgresTarget};
pub use pubsub::{PubSubConnection, PubSubEvent, Subscriber};
pub(crate) use redis::{RedisBackend, RedisOptions, Topology};
pub(crate) use redlock::{DEFAULT_NODE_TIMEOUT, RedlockBackend};
/// The PostgreSQL driver the store is built on (cargo feature `postgres`), so a
/// [`Config`](tokio_postgres::Config) for
/// [`LockRuntimeBuilder::postgres_config`](crate::LockRuntimeBuilder::postgres_config) comes
/// from the same version.
#[cfg(feature = "postgres")]
pub use tokio_postgres;
pub use types::{
    AcquireOutcome, AcquireRequest, ExtendItem, KeyNames, RecordView, ReleaseOutcome, Renewal,
    Retention,
};
#[cfg(feature = "zookeeper")]
pub(crate) use zookeeper::{ZooKeeperBackend, ZooKeeperOptions, checked_session_timeout};
