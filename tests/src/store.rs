//! A store under test: the memory store, or a real Redis server.

use std::sync::atomic::{AtomicUsize, Ordering};

use lock_runtime::{LockRuntime, MemoryStore};

use crate::RedisServer;

/// Where the behaviour suite locks.
#[derive(Debug)]
pub enum TestStore {
    /// One in-process store shared by every runtime of the test.
    Memory(MemoryStore),
    /// A redis-server started for the test.
    Redis(RedisServer),
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

    /// A new runtime (a simulated service instance) on this store, with a distinct owner.
    pub async fn runtime(&self) -> LockRuntime {
        let owner = format!("instance-{}", NEXT_OWNER.fetch_add(1, Ordering::Relaxed));
        let builder = LockRuntime::builder().owner(owner);
        let builder = match self {
            TestStore::Memory(store) => builder.memory(store.clone()),
            TestStore::Redis(server) => builder.redis(server.url()),
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
            TestStore::Redis(server) => {
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
        }
    }
}
