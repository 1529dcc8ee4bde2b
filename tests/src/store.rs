//! A store under test: the memory store, or a real Redis server.

use std::sync::atomic::{AtomicUsize, Ordering};

use lock_runtime::{LockRuntime, MemoryStore};

use crate::{RedisCluster, RedisServer};

/// Where the behaviour suite locks.
#[derive(Debug)]
pub enum TestStore {
    /// One in-process store shared by every runtime of the test.
    Memory(MemoryStore),
    /// A redis-server started for the test.
    Redis(RedisServer),
    /// Five independent redis-servers, locked by Redlock quorum.
    Redlock(Vec<RedisServer>),
    /// A 3-master, 3-replica Redis Cluster.
    Cluster(RedisCluster),
}

static NEXT_OWNER: AtomicUsize = AtomicUsize::new(1);

impl TestStore {
    /// A fresh memory store.
    pub fn memory() -> Self {
        TestStore::Memory(MemoryStore::new())
    }

    /// A fresh redis-server.
    pub fn redis() -> Self {
        TestStore::Redis(RedisServer::start())
    }

    /// A fresh 3-master, 3-replica cluster.
    pub fn cluster() -> Self {
        TestStore::Cluster(RedisCluster::start(3))
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
            TestStore::Redis(server) => builder.redis(server.url()),
            TestStore::Redlock(servers) => builder.redlock(servers.iter().map(RedisServer::url)),
            TestStore::Cluster(cluster) => builder.redis_cluster(cluster.urls()),
        };
        builder
            .build()
            .await
            .expect("building a runtime on the test store")
    }

    /// Removes the record of `key` behind the holder's back (namespace `lock`).
    pub async fn delete_record(&self, key: &str) {
        match self {
            TestStore::Memory(store) => store.clear(),
            TestStore::Redis(server) => delete_on(server, key).await,
            TestStore::Redlock(servers) => {
                for server in servers {
                    delete_on(server, key).await;
                }
            }
            TestStore::Cluster(cluster) => {
                let mut conn = cluster
                    .client()
                    .get_async_connection()
                    .await
                    .expect("connecting to the test cluster");
                let _: () = redis::cmd("DEL")
                    .arg(format!("lock:{{{key}}}"))
                    .query_async(&mut conn)
                    .await
                    .expect("DEL of a lock record");
            }
        }
    }
}

async fn delete_on(server: &RedisServer, key: &str) {
    let mut conn = server
        .client()
        .get_multiplexed_async_connection()
        .await
        .expect("connecting to the test server");
    let _: () = redis::cmd("DEL")
        .arg(format!("lock:{{{key}}}"))
        .query_async(&mut conn)
        .await
        .expect("DEL of a lock record");
}
