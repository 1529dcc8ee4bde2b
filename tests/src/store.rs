//! A store under test: the memory store, or real Redis or PostgreSQL servers.

use crate::Built;
use std::sync::atomic::{AtomicUsize, Ordering};

use lock_runtime::{LockRuntime, MemoryStore, RedisStore, RedlockStore};

use crate::{
    EtcdCluster, OnDemandFences, PostgresServer, RedisCluster, RedisServer, SentinelSet,
    ZooKeeperEnsemble,
};

/// Where the behaviour suite locks.
#[derive(Debug)]
pub enum TestStore {
    /// One in-process store shared by every runtime of the test.
    Memory(MemoryStore),
    /// One memory store plugged in through the public `LockStore` trait
    /// (`.store(..)`), as a third-party store would be.
    Plugged(MemoryStore),
    /// A memory store that gives fences only on demand (`AcquiredUnfenced`).
    OnDemand(OnDemandFences),
    /// Three memory stores as the members of one Redlock quorum (`RedlockStore::over(..)`).
    RedlockMemory(Vec<MemoryStore>),
    /// A redis-server started for the test.
    Redis(RedisServer),
    /// Five independent redis-servers, locked by Redlock quorum.
    Redlock(Vec<RedisServer>),
    /// A 3-master, 3-replica Redis Cluster.
    Cluster(RedisCluster),
    /// One master, one replica, three sentinels.
    Sentinel(SentinelSet),
    /// A PostgreSQL server started for the test (the default table).
    Postgres(PostgresServer),
    /// An etcd cluster started for the test (one member, or three).
    Etcd(EtcdCluster),
    /// A ZooKeeper ensemble started for the test (one member, or three).
    ZooKeeper(ZooKeeperEnsemble),
}

static NEXT_OWNER: AtomicUsize = AtomicUsize::new(1);

impl TestStore {
    /// A fresh memory store.
    pub fn memory() -> Self {
        TestStore::Memory(MemoryStore::new())
    }

    /// A fresh memory store, plugged in through the public `LockStore` trait.
    pub fn plugged() -> Self {
        TestStore::Plugged(MemoryStore::new())
    }

    /// A fresh memory store that gives fences only on demand.
    pub fn on_demand() -> Self {
        TestStore::OnDemand(OnDemandFences::default())
    }

    /// Three fresh memory stores, locked by Redlock quorum.
    pub fn redlock_memory() -> Self {
        TestStore::RedlockMemory((0..3).map(|_| MemoryStore::new()).collect())
    }

    /// A fresh redis-server.
    pub fn redis() -> Self {
        TestStore::Redis(RedisServer::start())
    }

    /// A fresh 3-master, 3-replica cluster.
    pub fn cluster() -> Self {
        TestStore::Cluster(RedisCluster::start(3))
    }

    /// A fresh Sentinel set.
    pub fn sentinel() -> Self {
        TestStore::Sentinel(SentinelSet::start())
    }

    /// A fresh PostgreSQL server.
    pub fn postgres() -> Self {
        TestStore::Postgres(PostgresServer::start())
    }

    /// A fresh one-member etcd.
    pub fn etcd() -> Self {
        TestStore::Etcd(EtcdCluster::start(1))
    }

    /// A fresh three-member etcd cluster.
    pub fn etcd_cluster() -> Self {
        TestStore::Etcd(EtcdCluster::start(3))
    }

    /// A fresh one-member ZooKeeper.
    pub fn zookeeper() -> Self {
        TestStore::ZooKeeper(ZooKeeperEnsemble::start(1))
    }

    /// A fresh three-member ZooKeeper ensemble.
    pub fn zookeeper_ensemble() -> Self {
        TestStore::ZooKeeper(ZooKeeperEnsemble::start(3))
    }

    /// Five fresh redis-servers for Redlock.
    pub fn redlock() -> Self {
        TestStore::Redlock((0..5).map(|_| RedisServer::start()).collect())
    }

    /// A new runtime (a simulated service instance) on this store, with a distinct owner.
    pub async fn runtime(&self) -> LockRuntime {
        let owner = format!("instance-{}", NEXT_OWNER.fetch_add(1, Ordering::Relaxed));
        let builder = LockRuntime::builder().owner(owner);
        let builder = match self {
            TestStore::Memory(store) => builder.memory(store.clone()),
            TestStore::Plugged(store) => builder.store(store.clone()),
            TestStore::OnDemand(store) => builder.store(store.clone()),
            TestStore::RedlockMemory(stores) => {
                builder.store(RedlockStore::over(stores.iter().cloned()))
            }
            TestStore::Redis(server) => builder.redis(server.url()),
            TestStore::Redlock(servers) => builder.redlock(servers.iter().map(RedisServer::url)),
            TestStore::Cluster(cluster) => builder.redis_cluster(cluster.urls()),
            TestStore::Sentinel(set) => builder.store(
                RedisStore::sentinel(&set.master_name, set.sentinel_urls())
                    .replicated_acquire(1, std::time::Duration::from_secs(1)),
            ),
            TestStore::Postgres(server) => builder.postgres(server.url()),
            TestStore::Etcd(cluster) => builder.etcd(cluster.endpoints()),
            TestStore::ZooKeeper(ensemble) => builder.zookeeper(ensemble.connect_string()),
        };
        builder.built().await
    }

    /// Removes the record of `key` behind the holder's back (namespace `lock`).
    pub async fn delete_record(&self, key: &str) {
        match self {
            TestStore::Memory(store) | TestStore::Plugged(store) => store.clear(),
            TestStore::OnDemand(store) => store.store.clear(),
            TestStore::RedlockMemory(stores) => stores.iter().for_each(MemoryStore::clear),
            TestStore::Redis(_)
            | TestStore::Redlock(_)
            | TestStore::Sentinel(_)
            | TestStore::Cluster(_) => self.redis_del(&format!("lock:{{{key}}}")).await,
            TestStore::Postgres(server) => {
                let client = server.client().await;
                client
                    .execute(
                        "DELETE FROM lock_records WHERE key = $1",
                        &[&format!("lock:{{{key}}}")],
                    )
                    .await
                    .expect("DELETE of a lock row");
            }
            TestStore::Etcd(cluster) => {
                let mut client = etcd_client::Client::connect(cluster.endpoints(), None)
                    .await
                    .expect("connecting to the test etcd");
                client
                    .delete(format!("lock:{{{key}}}"), None)
                    .await
                    .expect("delete of a lock key");
            }
            TestStore::ZooKeeper(ensemble) => {
                let client = zookeeper_client::Client::connect(&ensemble.connect_string())
                    .await
                    .expect("connecting to the test ZooKeeper");
                let node = crate::zookeeper::record_node(&format!("lock:{{{key}}}"));
                // Its pin children first, if any (a node with children cannot be deleted).
                let children = client.list_children(&node).await.unwrap_or_default();
                for child in children {
                    let _ = client.delete(&format!("{node}/{child}"), None).await;
                }
                match client.delete(&node, None).await {
                    Ok(()) | Err(zookeeper_client::Error::NoNode) => {}
                    Err(e) => panic!("delete of {node}: {e}"),
                }
            }
        }
    }

    /// Deletes the Redis key `redis_key` where the store keeps it: on the server, the master
    /// the sentinels name, the cluster node of its slot, or every Redlock master.
    /// Panics on a store that is not Redis.
    pub async fn redis_del(&self, redis_key: &str) {
        match self {
            TestStore::Redis(server) => delete_on(server, redis_key).await,
            TestStore::Redlock(servers) => {
                for server in servers {
                    delete_on(server, redis_key).await;
                }
            }
            TestStore::Sentinel(set) => {
                let port = set.master_port().expect("the sentinels name a master");
                let master = &set.servers[set.index_of(port)];
                delete_on(master, redis_key).await;
            }
            TestStore::Cluster(cluster) => {
                let mut conn = cluster
                    .client()
                    .get_async_connection()
                    .await
                    .expect("connecting to the test cluster");
                let _: () = crate::query(&mut conn, ("DEL", redis_key)).await;
            }
            other => panic!("not a Redis store: {other:?}"),
        }
    }
}

/// The built-in stores run the public conformance kit like any other store.
impl lock_testkit::Harness for TestStore {
    fn runtime(&self) -> impl std::future::Future<Output = LockRuntime> + Send {
        TestStore::runtime(self)
    }

    fn delete_record(&self, key: &str) -> impl std::future::Future<Output = ()> + Send {
        TestStore::delete_record(self, key)
    }

    fn clock_granularity(&self) -> std::time::Duration {
        match self {
            // Fine to the millisecond, but the expiry of a record nobody takes over comes
            // from the server's sweep of TTL nodes (every 100 ms in the tests).
            TestStore::ZooKeeper(_) => std::time::Duration::from_millis(300),
            // Whole-second leases, expired in sweeps every 500 ms.
            TestStore::Etcd(_) => std::time::Duration::from_millis(1500),
            _ => std::time::Duration::ZERO,
        }
    }
}

/// Deletes the key `redis_key` on `server`.
pub async fn delete_on(server: &RedisServer, redis_key: &str) {
    let mut conn = server.conn().await;
    let _: () = crate::query(&mut conn, ("DEL", redis_key)).await;
}
