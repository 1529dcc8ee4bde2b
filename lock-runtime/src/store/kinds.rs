//! The store types with options of their own, passed to
//! [`LockRuntimeBuilder::store`](crate::LockRuntimeBuilder::store); the builder's shortcuts
//! (`.redis(url)`, `.postgres(url)`, ...) make their defaults.

use std::sync::Arc;
use std::time::Duration;

use super::{DynStore, LockStore};
use crate::config::redact_url;

/// One Redis server, or a master watched by Sentinel, with its options; the store of
/// [`LockRuntimeBuilder::redis`](crate::LockRuntimeBuilder::redis) and
/// [`redis_sentinel`](crate::LockRuntimeBuilder::redis_sentinel).
///
/// ```
/// # use std::time::Duration;
/// # use lock_runtime::{LockRuntime, RedisStore};
/// let store = RedisStore::new("redis://127.0.0.1:6379")
///     .replicated_acquire(1, Duration::from_millis(200));
/// let builder = LockRuntime::builder().store(store);
/// ```
#[derive(Clone)]
pub struct RedisStore {
    pub(super) urls: Vec<String>,
    pub(super) sentinel_master: Option<String>,
    pub(super) replicated: Option<(usize, Duration)>,
}

impl RedisStore {
    /// One server: `redis://[user:password@]host:port[/db]`, or `rediss://` for TLS. The
    /// password never appears in errors or logs.
    pub fn new(url: impl Into<String>) -> Self {
        RedisStore {
            urls: vec![url.into()],
            sentinel_master: None,
            replicated: None,
        }
    }

    /// The master the sentinels at `urls` (`redis://host:26379`) monitor as `master_name`;
    /// the sentinels' credentials are used for the master too. See
    /// [`LockRuntimeBuilder::redis_sentinel`](crate::LockRuntimeBuilder::redis_sentinel).
    pub fn sentinel<I, S>(master_name: impl Into<String>, urls: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        RedisStore {
            urls: urls.into_iter().map(Into::into).collect(),
            sentinel_master: Some(master_name.into()),
            replicated: None,
        }
    }

    /// A Redis Cluster, given some of its nodes as seeds; see
    /// [`LockRuntimeBuilder::redis_cluster`](crate::LockRuntimeBuilder::redis_cluster).
    pub fn cluster<I, S>(urls: I) -> RedisClusterStore
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        RedisClusterStore {
            urls: urls.into_iter().map(Into::into).collect(),
        }
    }

    /// After each acquire, wait (Redis `WAIT`) until `replicas` replicas have the lock record,
    /// for at most `timeout`; if they do not confirm in time, the lock is given back and the
    /// acquire fails with a `LockError::Backend` saying how many confirmed. A lock acquired
    /// this way survives a failover to one of those replicas.
    ///
    /// Each such acquire sends its script and `WAIT` pipelined on a connection of its own,
    /// never retried, so a `WAIT` answers for that acquire alone and never holds up the
    /// runtime's renewals and releases; it costs one connection set-up per acquire. A
    /// shortfall is a transient error: waiters keep waiting through a replica outage. (Not on
    /// a Cluster: [`RedisClusterStore`] has no such option.)
    pub fn replicated_acquire(mut self, replicas: usize, timeout: Duration) -> Self {
        self.replicated = Some((replicas, timeout));
        self
    }
}

/// A Redis Cluster; the store of
/// [`LockRuntimeBuilder::redis_cluster`](crate::LockRuntimeBuilder::redis_cluster), made by
/// [`RedisStore::cluster`].
#[derive(Clone)]
pub struct RedisClusterStore {
    pub(super) urls: Vec<String>,
}

/// Redlock: one lock across independent Redis masters or other stores, held when a quorum
/// granted it; the store of [`LockRuntimeBuilder::redlock`](crate::LockRuntimeBuilder::redlock).
///
/// ```
/// # use std::time::Duration;
/// # use lock_runtime::{LockRuntime, MemoryStore, RedlockStore};
/// let members = [MemoryStore::new(), MemoryStore::new(), MemoryStore::new()];
/// let builder = LockRuntime::builder()
///     .store(RedlockStore::over(members).node_timeout(Duration::from_millis(100)));
/// ```
#[derive(Clone)]
pub struct RedlockStore {
    pub(super) members: Members,
    pub(super) node_timeout: Option<Duration>,
}

#[derive(Clone)]
pub(super) enum Members {
    Urls(Vec<String>),
    Stores(Vec<Arc<dyn DynStore>>),
}

impl RedlockStore {
    /// Across the Redis masters at `urls` (at least 3, independent of each other). See
    /// [`LockRuntimeBuilder::redlock`](crate::LockRuntimeBuilder::redlock).
    pub fn new<I, S>(urls: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        RedlockStore {
            members: Members::Urls(urls.into_iter().map(Into::into).collect()),
            node_timeout: None,
        }
    }

    /// Over stores of any kind: the same quorum, fences and fan-out, with each member a
    /// [`LockStore`] the caller built (at least 3, independent of each other). Every member
    /// must implement [`LockStore::raise_fence`]; the built-in
    /// [`MemoryStore`](super::MemoryStore) does, so a quorum of memory stores lets a test
    /// exercise Redlock's logic without servers. Each
    /// call of a member is bounded by the node timeout (a listing, by a minute). A member
    /// that does not implement `raise_fence` makes the first acquire fail with that error.
    pub fn over<I, S>(stores: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: LockStore,
    {
        RedlockStore {
            members: Members::Stores(
                stores
                    .into_iter()
                    .map(|s| Arc::new(s) as Arc<dyn DynStore>)
                    .collect(),
            ),
            node_timeout: None,
        }
    }

    /// How long one member may take to answer before it counts as failed for that call
    /// (default 250 ms).
    pub fn node_timeout(mut self, timeout: Duration) -> Self {
        self.node_timeout = Some(timeout);
        self
    }
}

/// A PostgreSQL database (cargo feature `postgres`); the store of
/// [`LockRuntimeBuilder::postgres`](crate::LockRuntimeBuilder::postgres).
///
/// ```
/// # use lock_runtime::{LockRuntime, PostgresStore};
/// let builder = LockRuntime::builder()
///     .store(PostgresStore::new("postgres://locks@127.0.0.1/app").table("job_locks"));
/// ```
#[cfg(feature = "postgres")]
#[derive(Clone)]
pub struct PostgresStore {
    pub(super) target: super::PostgresTarget,
    pub(super) table: Option<String>,
}

#[cfg(feature = "postgres")]
impl PostgresStore {
    /// `postgres://user:password@host:port/database` or the `key=value` form of libpq; see
    /// [`LockRuntimeBuilder::postgres`](crate::LockRuntimeBuilder::postgres).
    pub fn new(url: impl Into<String>) -> Self {
        PostgresStore {
            target: super::PostgresTarget::Url(url.into()),
            table: None,
        }
    }

    /// From a configuration the service already builds (hosts, user, a password from its
    /// secret store, `sslmode`); take the driver from
    /// [`store::tokio_postgres`](crate::store::tokio_postgres) so the versions match. The
    /// runtime sets the connect timeout, TCP keepalives and user timeout and the application
    /// name, and TLS follows the same rule as for a URL: `SslMode::Require` (or a direct TLS
    /// negotiation, or a `tls_root_cert_pem`) means TLS, verified; `SslMode::Prefer`, the
    /// driver's default, means **no** TLS here. The runtime opens its own connections from
    /// it: a service's `Client` or pool cannot be lent, because waiting needs a connection
    /// whose notifications the runtime reads itself, a broken command connection is replaced
    /// only after its server process has ended, and a pool would not keep a release behind
    /// its acquire.
    pub fn with_config(config: super::tokio_postgres::Config) -> Self {
        PostgresStore {
            target: super::PostgresTarget::Config(Box::new(config)),
            table: None,
        }
    }

    /// The table to lock in (default `lock_records`). Lower-case letters, digits and `_`, at
    /// most 40 bytes; its sequence is `<table>_fence` and its release channel
    /// `<table>_released`. For another schema, set the connection's `search_path`
    /// (`?options=-csearch_path%3Dmy_schema`). If the table is missing and the user may not
    /// create it, `build()` fails with the SQL to run.
    pub fn table(mut self, table: impl Into<String>) -> Self {
        self.table = Some(table.into());
        self
    }
}

/// An etcd cluster (cargo feature `etcd`); the store of
/// [`LockRuntimeBuilder::etcd`](crate::LockRuntimeBuilder::etcd).
///
/// ```
/// # use lock_runtime::{EtcdStore, LockRuntime};
/// let builder = LockRuntime::builder()
///     .store(EtcdStore::new(["https://10.0.0.1:2379"]).user("locks", "secret"));
/// ```
#[cfg(feature = "etcd")]
#[derive(Clone)]
pub struct EtcdStore {
    pub(super) endpoints: Vec<String>,
    pub(super) user: Option<(String, String)>,
}

#[cfg(feature = "etcd")]
impl EtcdStore {
    /// The endpoints of one cluster's members, `http://host:port`, `https://host:port` or
    /// `host:port`; see [`LockRuntimeBuilder::etcd`](crate::LockRuntimeBuilder::etcd).
    pub fn new<I, S>(endpoints: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        EtcdStore {
            endpoints: endpoints.into_iter().map(Into::into).collect(),
            user: None,
        }
    }

    /// Authenticate as `user` with `password` (never printed). Over plain `http://` the
    /// runtime warns: the password and the auth token would cross the network in clear.
    pub fn user(mut self, user: impl Into<String>, password: impl Into<String>) -> Self {
        self.user = Some((user.into(), password.into()));
        self
    }
}

/// A ZooKeeper ensemble (cargo feature `zookeeper`); the store of
/// [`LockRuntimeBuilder::zookeeper`](crate::LockRuntimeBuilder::zookeeper).
///
/// ```
/// # use lock_runtime::{LockRuntime, ZooKeeperStore};
/// let builder = LockRuntime::builder()
///     .store(ZooKeeperStore::new("10.0.0.1:2181,10.0.0.2:2181/jobs").digest("locks", "secret"));
/// ```
#[cfg(feature = "zookeeper")]
#[derive(Clone)]
pub struct ZooKeeperStore {
    pub(super) connect: String,
    pub(super) digest: Option<(String, String)>,
    pub(super) session_timeout: Option<Duration>,
}

#[cfg(feature = "zookeeper")]
impl ZooKeeperStore {
    /// The ensemble's connect string, `host:port,host:port[/chroot]`; see
    /// [`LockRuntimeBuilder::zookeeper`](crate::LockRuntimeBuilder::zookeeper).
    pub fn new(connect: impl Into<String>) -> Self {
        ZooKeeperStore {
            connect: connect.into(),
            digest: None,
            session_timeout: None,
        }
    }

    /// Authenticate the session with ZooKeeper's `digest` scheme as `user` with `password`
    /// (never printed).
    pub fn digest(mut self, user: impl Into<String>, password: impl Into<String>) -> Self {
        self.digest = Some((user.into(), password.into()));
        self
    }

    /// The session timeout this store's client asks for (default 30 s; the servers clamp it
    /// to their `minSessionTimeout..maxSessionTimeout`, by default 2 to 20 ticks). Leases do
    /// not ride on the session: a lease lives by its ttl and renewals, and a session that
    /// expires (after a pause or a partition longer than this) is replaced without losing a
    /// lease whose ttl has not run out. What the timeout bounds is how long the servers keep
    /// a vanished process's session (its watches). Zero, or more than a day, is refused by
    /// `build()`.
    pub fn session_timeout(mut self, timeout: Duration) -> Self {
        self.session_timeout = Some(timeout);
        self
    }
}

#[cfg(feature = "zookeeper")]
impl std::fmt::Debug for ZooKeeperStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ZooKeeperStore")
            .field("connect", &self.connect)
            .field("user", &self.digest.as_ref().map(|(user, _)| user))
            .field("session_timeout", &self.session_timeout)
            .finish_non_exhaustive()
    }
}

pub(super) fn shown_urls(urls: &[String]) -> String {
    urls.iter()
        .map(|u| redact_url(u))
        .collect::<Vec<_>>()
        .join(", ")
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("urls", &shown_urls(&self.urls))
            .field("sentinel_master", &self.sentinel_master)
            .field("replicated", &self.replicated)
            .finish()
    }
}

impl std::fmt::Debug for RedisClusterStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisClusterStore")
            .field("urls", &shown_urls(&self.urls))
            .finish()
    }
}

impl std::fmt::Debug for RedlockStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let members = match &self.members {
            Members::Urls(urls) => shown_urls(urls),
            Members::Stores(stores) => format!("{} stores", stores.len()),
        };
        f.debug_struct("RedlockStore")
            .field("members", &members)
            .field("node_timeout", &self.node_timeout)
            .finish()
    }
}

#[cfg(feature = "postgres")]
impl std::fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresStore")
            .field("target", &self.target.shown())
            .field("table", &self.table)
            .finish()
    }
}

#[cfg(feature = "etcd")]
impl std::fmt::Debug for EtcdStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdStore")
            .field("endpoints", &shown_urls(&self.endpoints))
            .field("user", &self.user.as_ref().map(|(user, _)| user))
            .finish_non_exhaustive()
    }
}
