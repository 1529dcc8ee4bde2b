//! Runtimes the tests build again and again.

use std::time::Duration;

use lock_runtime::{LockError, LockGuard, LockRuntime, LockRuntimeBuilder};
use tokio::task::JoinHandle;

/// A runtime on the Redis server at `url` (often a fault proxy in front of one), with
/// `command_timeout` and a 2 s connect timeout.
pub async fn redis_runtime(url: String, command_timeout: Duration) -> LockRuntime {
    LockRuntime::builder()
        .redis(url)
        .command_timeout(command_timeout)
        .connect_timeout(Duration::from_secs(2))
        .built()
        .await
}

/// Taking a lock the test knows to be free, in one line.
pub trait TakeFree {
    /// `lock(key).ttl(ttl).try_acquire()`, panicking (with the key) on an error or when the
    /// lock is held.
    fn take(
        &self,
        key: impl Into<String> + Send,
        ttl: Duration,
    ) -> impl Future<Output = LockGuard> + Send;
    /// `lock(key).try_acquire()` with the default ttl, panicking on an error: `None` when the
    /// lock is held.
    fn try_take(
        &self,
        key: impl Into<String> + Send,
    ) -> impl Future<Output = Option<LockGuard>> + Send;
    /// The same with the runtime's default ttl.
    fn take_default_ttl(
        &self,
        key: impl Into<String> + Send,
    ) -> impl Future<Output = LockGuard> + Send;
}

impl TakeFree for LockRuntime {
    async fn take(&self, key: impl Into<String> + Send, ttl: Duration) -> LockGuard {
        let key = key.into();
        free(&key, self.lock(key.as_str()).ttl(ttl).try_acquire().await)
    }

    async fn try_take(&self, key: impl Into<String> + Send) -> Option<LockGuard> {
        let key = key.into();
        match self.lock(key.as_str()).try_acquire().await {
            Ok(got) => got,
            Err(e) => panic!("trying {key:?}: {e}"),
        }
    }

    async fn take_default_ttl(&self, key: impl Into<String> + Send) -> LockGuard {
        let key = key.into();
        free(&key, self.lock(key.as_str()).try_acquire().await)
    }
}

fn free(key: &str, got: Result<Option<LockGuard>, LockError>) -> LockGuard {
    match got {
        Ok(Some(guard)) => guard,
        Ok(None) => panic!("{key:?} was expected free and is held"),
        Err(e) => panic!("acquiring {key:?}: {e}"),
    }
}

/// A builder on the store a worker process is given as `LOCK_URL`: `postgres://..`,
/// `etcd:` and the endpoints separated by commas, `zookeeper:` and a connect string (with
/// the session timeout from `ZOOKEEPER_SESSION_TIMEOUT_MS` when set), or a Redis URL.
pub fn builder_for(lock_url: &str) -> LockRuntimeBuilder {
    let builder = LockRuntime::builder();
    if lock_url.starts_with("postgres") {
        builder.postgres(lock_url)
    } else if let Some(endpoints) = lock_url.strip_prefix("etcd:") {
        builder.etcd(endpoints.split(','))
    } else if let Some(connect) = lock_url.strip_prefix("zookeeper:") {
        let mut store = lock_runtime::ZooKeeperStore::new(connect);
        if let Some(ms) = std::env::var("ZOOKEEPER_SESSION_TIMEOUT_MS")
            .ok()
            .and_then(|ms| ms.parse().ok())
        {
            store = store.session_timeout(Duration::from_millis(ms));
        }
        builder.store(store)
    } else {
        builder.redis(lock_url)
    }
}

/// `build().await`, panicking with the builder's error.
pub trait Built {
    /// Builds the runtime or panics with the error.
    fn built(self) -> impl Future<Output = LockRuntime> + Send;
}

impl Built for LockRuntimeBuilder {
    async fn built(self) -> LockRuntime {
        match self.build().await {
            Ok(runtime) => runtime,
            Err(e) => panic!("building the runtime: {e}"),
        }
    }
}

/// A waiter in a task of its own: `lock(key).acquire_timeout(limit)` on `runtime`.
pub fn acquire_in_task(
    runtime: LockRuntime,
    key: impl Into<String>,
    limit: Duration,
) -> JoinHandle<Result<LockGuard, LockError>> {
    let key = key.into();
    tokio::spawn(async move { runtime.lock(key).acquire_timeout(limit).await })
}

/// A Redis server with a fault proxy in front of it, a runtime through the proxy (with
/// `command_timeout`) and one straight to the server (2 s): the set-up of the tests of faults
/// between a runtime and Redis. Keep the server bound for the test's length.
pub async fn proxied_redis(
    command_timeout: Duration,
) -> (
    crate::RedisServer,
    crate::FaultProxy,
    LockRuntime,
    LockRuntime,
) {
    let server = crate::RedisServer::start();
    let proxy = crate::FaultProxy::start(server.port());
    let through = redis_runtime(proxy.url(), command_timeout).await;
    let direct = redis_runtime(server.url(), Duration::from_secs(2)).await;
    (server, proxy, through, direct)
}
