//! `LockRuntimeBuilder`: choose a store, set names and defaults, connect.

use std::sync::Arc;
use std::time::Duration;

use crate::config::{
    DEFAULT_CONNECT_TIMEOUT, DEFAULT_SHUTDOWN_GRACE, DEFAULT_TTL, check_name, check_ttl,
    default_owner,
};
use crate::runtime::MetricsLabel;
#[cfg(feature = "etcd")]
use crate::store::EtcdStore;
#[cfg(feature = "postgres")]
use crate::store::PostgresStore;
use crate::store::{
    Forwarded, IntoStore, LockStore, RedisStore, RedlockStore, Shared, StoreChoice,
    check_replicated,
};
use crate::{LockError, LockRuntime, MemoryStore};

/// Configures a [`LockRuntime`]. Pick exactly one store, then `build().await`.
///
/// # Default
/// namespace `"lock"`; default_ttl 30 s; owner `hostname:pid`; connect_timeout 5 s;
/// command_timeout 5 s; shutdown_grace 5 s. There is no default store: a forgotten `.redis(..)` must not silently
/// turn into a per-process memory store that excludes nothing across instances.
#[derive(Default)]
pub struct LockRuntimeBuilder {
    store: Option<StoreChoice>,
    /// Set when a second store was chosen: both names, for the error.
    second_store: Option<String>,
    namespace: Option<String>,
    default_ttl: Option<Duration>,
    owner: Option<String>,
    connect_timeout: Option<Duration>,
    command_timeout: Option<Duration>,
    /// What the deprecated store-specific setters gave.
    forwarded: Forwarded,
    metrics_label: Option<MetricsLabel>,
    tls_root_cert: Option<Vec<u8>>,
    shutdown_grace: Option<Duration>,
}

impl std::fmt::Debug for LockRuntimeBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let store = self
            .store
            .as_ref()
            .map_or_else(|| "none".to_owned(), StoreChoice::shown);
        f.debug_struct("LockRuntimeBuilder")
            .field("store", &store)
            .field("namespace", &self.namespace)
            .field("default_ttl", &self.default_ttl)
            .field("owner", &self.owner)
            .finish_non_exhaustive()
    }
}

impl LockRuntime {
    /// Starts configuring a runtime. See [`LockRuntimeBuilder`].
    pub fn builder() -> LockRuntimeBuilder {
        LockRuntimeBuilder::default()
    }
}

impl LockRuntimeBuilder {
    fn set_store(mut self, choice: StoreChoice) -> Self {
        if let Some(first) = &self.store {
            self.second_store = Some(format!("{} and {}", first.name(), choice.name()));
        }
        self.store = Some(choice);
        self
    }

    /// Lock in one Redis server: `redis://[user:password@]host:port[/db]`, or `rediss://` for
    /// TLS. The password never appears in errors or logs.
    pub fn redis(self, url: impl Into<String>) -> Self {
        self.store(RedisStore::new(url))
    }

    /// Lock in a Redis Cluster, given some of its nodes as seeds (`redis://host:port`, all
    /// with the same credentials). Each lock's record, fence counter and release channel share
    /// one hash slot (`<ns>:{<key>}`), so every script runs on the one shard that owns it;
    /// MOVED/ASK redirections and topology changes are followed by the cluster connection, and
    /// waiters use sharded pub/sub (SSUBSCRIBE), so a release reaches only the shard's
    /// subscribers. On a Cluster of Redis 6.2 (no sharded pub/sub) they subscribe classically
    /// and releases are broadcast. With `rediss://` seeds every node is reached over TLS
    /// (cargo feature `tls`; see `tls_root_cert_pem`).
    pub fn redis_cluster<I, S>(self, urls: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.store(RedisStore::cluster(urls))
    }

    /// Lock in a Sentinel-managed master: `urls` are the sentinels (`redis://host:26379`);
    /// their credentials are used for the master too. The master's address is asked of the
    /// sentinels at startup and again whenever the master stops answering or refuses writes
    /// (a failover demoted it), so the runtime follows failovers by itself. With `rediss://`
    /// sentinel URLs (cargo feature `tls`), the masters they name are reached over TLS too.
    ///
    /// Replication is asynchronous: a lock the old master granted but had not yet passed on
    /// is gone after a failover.
    /// [`RedisStore::replicated_acquire`](crate::RedisStore::replicated_acquire) closes that
    /// gap.
    pub fn redis_sentinel<I, S>(self, master_name: impl Into<String>, urls: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.store(RedisStore::sentinel(master_name, urls))
    }

    /// Deprecated: moved to
    /// [`RedisStore::replicated_acquire`](crate::RedisStore::replicated_acquire); use
    /// `.store(RedisStore::new(url).replicated_acquire(replicas, timeout))` (or
    /// `RedisStore::sentinel(..)`). Forwards to it (a value set on the store itself wins); it will
    /// be removed in the next release.
    ///
    /// After each acquire, wait (Redis `WAIT`) until `replicas` replicas have the lock record,
    /// for at most `timeout`; if they do not confirm in time, the lock is given back and the
    /// acquire fails with a `LockError::Backend` saying how many confirmed. A lock acquired
    /// this way survives a failover to one of those replicas. For `.redis(url)` (a master
    /// with replicas) and `.redis_sentinel(..)`.
    ///
    /// Each such acquire sends its script and `WAIT` pipelined on a connection of its own,
    /// never retried, so a `WAIT` answers for that acquire alone and never holds up the
    /// runtime's renewals and releases; it costs one connection set-up per acquire. A
    /// shortfall is a transient error: waiters keep waiting through a replica outage.
    #[deprecated(
        since = "0.1.0",
        note = "use .store(RedisStore::new(url).replicated_acquire(replicas, timeout)) (or RedisStore::sentinel(..))"
    )]
    pub fn replicated_acquire(mut self, replicas: usize, timeout: Duration) -> Self {
        self.forwarded.replicated = Some((replicas, timeout));
        self
    }

    /// Lock across N independent Redis masters (Redlock): a lock is held when a quorum
    /// (N/2 + 1) granted it within its validity. Calls fan out in parallel, each bounded by
    /// [`RedlockStore::node_timeout`](crate::RedlockStore::node_timeout); `build()` succeeds
    /// when a quorum answers.
    ///
    /// The fence of a Redlock lease is the largest fence among the granting quorum. It keeps
    /// increasing as long as a majority of the masters keep their counters; a master that
    /// restarts empty restarts its counter, and if a majority did so at once, fences could
    /// repeat. Masters with persistence (AOF) avoid that.
    pub fn redlock<I, S>(self, urls: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.store(RedlockStore::new(urls))
    }

    /// Deprecated: moved to [`RedlockStore::over`](crate::RedlockStore::over); use
    /// `.store(RedlockStore::over(stores))`. It will be removed in the next release.
    ///
    /// Redlock over stores of any kind: the same quorum, fences and fan-out as
    /// [`redlock`](Self::redlock), with each member a [`LockStore`] the caller built (at least
    /// 3, independent of each other). Every member must implement
    /// [`LockStore::raise_fence`]; the built-in [`MemoryStore`] does, so a quorum of memory
    /// stores lets a test exercise Redlock's logic without servers. Each call of a member is
    /// bounded by [`node_timeout`](Self::node_timeout) (a listing, by a minute). A member that
    /// does not implement `raise_fence` makes the first acquire fail with that error.
    #[deprecated(since = "0.1.0", note = "use .store(RedlockStore::over(stores))")]
    pub fn redlock_stores<I, S>(self, stores: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: LockStore,
    {
        self.store(RedlockStore::over(stores))
    }

    /// Deprecated: moved to [`RedlockStore::node_timeout`](crate::RedlockStore::node_timeout); use
    /// `.store(RedlockStore::new(urls).node_timeout(timeout))` (or `RedlockStore::over(..)`).
    /// Forwards to it (a value set on the store itself wins); it will be removed in the next
    /// release.
    ///
    /// With [`redlock`](Self::redlock) or [`redlock_stores`](Self::redlock_stores): how long
    /// one member may take to answer before it counts as failed for that call (default
    /// 250 ms).
    #[deprecated(
        since = "0.1.0",
        note = "use .store(RedlockStore::new(urls).node_timeout(timeout)) (or RedlockStore::over(..))"
    )]
    pub fn node_timeout(mut self, timeout: Duration) -> Self {
        self.forwarded.node_timeout = Some(timeout);
        self
    }

    /// Lock in a PostgreSQL database (cargo feature `postgres`):
    /// `postgres://user:password@host:port/database` or the `key=value` form of libpq; the
    /// password never appears in errors or logs. One row per held lock in one table
    /// ([`PostgresStore::table`](crate::PostgresStore::table), default `lock_records`, created
    /// by `build()` if missing), every time from the database's clock, fences from one
    /// sequence, waiting through `LISTEN`/`NOTIFY`. Each runtime keeps two connections: one for commands, one
    /// listening. TLS (with the `tls` cargo feature) when the URL says `sslmode=require`,
    /// `verify-ca` or `verify-full` (or `sslnegotiation=direct`), or a `tls_root_cert_pem` is
    /// given; the server's certificate and name are then always verified, against the
    /// system's roots or that certificate. `sslmode=prefer`, libpq's default, connects
    /// without TLS.
    #[cfg(feature = "postgres")]
    pub fn postgres(self, url: impl Into<String>) -> Self {
        self.store(PostgresStore::new(url))
    }

    /// Deprecated: moved to [`PostgresStore::with_config`](crate::PostgresStore::with_config); use
    /// `.store(PostgresStore::with_config(config))`. It will be removed in the next release.
    ///
    /// Like [`postgres`](Self::postgres), from a configuration the service already builds
    /// (hosts, user, a password from its secret store, `sslmode`); take the driver from
    /// [`store::tokio_postgres`](crate::store::tokio_postgres) so the versions match. The
    /// runtime sets the connect timeout, TCP keepalives and user timeout and the application
    /// name, and TLS follows the same rule as for a URL: `SslMode::Require` (or a direct TLS
    /// negotiation, or a `tls_root_cert_pem`) means TLS, verified; `SslMode::Prefer`, the
    /// driver's default, means **no** TLS here. The runtime opens its own connections from
    /// it: a service's `Client` or pool cannot be lent, because waiting needs a connection
    /// whose notifications the runtime reads itself, a broken command connection is replaced
    /// only after its server process has ended, and a pool would not keep a release behind
    /// its acquire.
    #[cfg(feature = "postgres")]
    #[deprecated(
        since = "0.1.0",
        note = "use .store(PostgresStore::with_config(config))"
    )]
    pub fn postgres_config(self, config: crate::store::tokio_postgres::Config) -> Self {
        self.store(PostgresStore::with_config(config))
    }

    /// Deprecated: moved to [`PostgresStore::table`](crate::PostgresStore::table); use
    /// `.store(PostgresStore::new(url).table(table))`. Forwards to it (a value set on the store
    /// itself wins); it will be removed in the next release.
    ///
    /// With [`postgres`](Self::postgres): the table to lock in (default `lock_records`).
    /// Lower-case letters, digits and `_`, at most 40 bytes; its sequence is `<table>_fence`
    /// and its release channel `<table>_released`. For another schema, set the connection's
    /// `search_path` (`?options=-csearch_path%3Dmy_schema`). If the table is missing and the
    /// user may not create it, `build()` fails with the SQL to run.
    #[cfg(feature = "postgres")]
    #[deprecated(
        since = "0.1.0",
        note = "use .store(PostgresStore::new(url).table(table))"
    )]
    pub fn postgres_table(mut self, table: impl Into<String>) -> Self {
        self.forwarded.postgres_table = Some(table.into());
        self
    }

    /// Lock in etcd (cargo feature `etcd`): the endpoints of one cluster's members,
    /// `http://host:port` (or `host:port`). One key per held lock on an etcd lease of the
    /// ttl (whole seconds, rounded up), fences from etcd's revisions (they survive every
    /// failover), waiting through one watch stream per runtime. For user and password, see
    /// [`EtcdStore::user`](crate::EtcdStore::user). `https://` endpoints (all of them) mean
    /// TLS, with the `tls` cargo feature, verified against the system's roots or
    /// `tls_root_cert_pem`.
    #[cfg(feature = "etcd")]
    pub fn etcd<I, S>(self, endpoints: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.store(EtcdStore::new(endpoints))
    }

    /// Lock in ZooKeeper (cargo feature `zookeeper`): the ensemble's connect string,
    /// `host:port,host:port[/chroot]`. One TTL node per held lock (the servers must run with
    /// `-Dzookeeper.extendedTypesEnabled=true`, ZooKeeper 3.5.3 or newer), fences from the
    /// zxid of the write that acquired, expiry on the server's clock, waiting by watches. For digest
    /// authentication see [`ZooKeeperStore::digest`](crate::ZooKeeperStore::digest).
    #[cfg(feature = "zookeeper")]
    pub fn zookeeper(self, connect: impl Into<String>) -> Self {
        self.store(crate::ZooKeeperStore::new(connect))
    }

    /// Deprecated: moved to [`EtcdStore::user`](crate::EtcdStore::user); use
    /// `.store(EtcdStore::new(endpoints).user(user, password))`. Forwards to it (a value set on the
    /// store itself wins); it will be removed in the next release.
    ///
    /// With [`etcd`](Self::etcd): authenticate as `user` with `password` (never printed).
    #[cfg(feature = "etcd")]
    #[deprecated(
        since = "0.1.0",
        note = "use .store(EtcdStore::new(endpoints).user(user, password))"
    )]
    pub fn etcd_user(mut self, user: impl Into<String>, password: impl Into<String>) -> Self {
        self.forwarded.etcd_user = Some((user.into(), password.into()));
        self
    }

    /// Lock in an in-process [`MemoryStore`]; runtimes built on clones of one store compete
    /// with each other. For demos and tests.
    pub fn memory(self, store: MemoryStore) -> Self {
        self.set_store(StoreChoice::Memory(store))
    }

    /// Lock in `store`: one of the store types with options of their own
    /// ([`RedisStore`](crate::RedisStore), [`RedisClusterStore`](crate::RedisClusterStore),
    /// [`RedlockStore`](crate::RedlockStore), `PostgresStore`, `EtcdStore`), or any store
    /// that implements [`LockStore`]: a third-party store, or a test's simulated one. The
    /// runtime keeps every promise of its own (validity, the watchdog, waiting, shutdown) on
    /// top of what the store's calls promise, and bounds each call of a plugged-in store by
    /// the command timeout.
    pub fn store(self, store: impl IntoStore) -> Self {
        self.set_store(store.into_choice().0)
    }

    /// The prefix of every store key (default `"lock"`): records are `<namespace>:{<key>}`.
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = Some(namespace.into());
        self
    }

    /// The ttl of requests and attributes that give none (default 30 s).
    pub fn default_ttl(mut self, ttl: Duration) -> Self {
        self.default_ttl = Some(ttl);
        self
    }

    /// The owner written into lock records, shown by `inspect` (default `hostname:pid`).
    pub fn owner(mut self, owner: impl Into<String>) -> Self {
        self.owner = Some(owner.into());
        self
    }

    /// With the `tls` cargo feature and `rediss://` URLs given to [`redis`](Self::redis),
    /// [`redis_cluster`](Self::redis_cluster), [`redis_sentinel`](Self::redis_sentinel) (the
    /// sentinels and the masters they name) or [`redlock`](Self::redlock), with `https://`
    /// endpoints given to `etcd` (cargo feature `etcd`), or with `postgres` and
    /// `PostgresStore::with_config` (cargo feature `postgres`; where it also asks for TLS, as
    /// `sslmode=require` does): trust this PEM root certificate (e.g. a private CA's) instead
    /// of the system's roots.
    /// A server whose certificate does not chain to it is refused at `build()`.
    #[cfg(feature = "tls")]
    pub fn tls_root_cert_pem(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.tls_root_cert = Some(pem.into());
        self
    }

    /// With the `metrics` cargo feature: maps a lock key to the `key` label of its metrics
    /// (default: the key itself). Keys built from arguments (`interest:{date}`) would give one
    /// time series per value; map them to their stable part to bound the cardinality:
    ///
    /// ```
    /// # use lock_runtime::{LockRuntime, MemoryStore};
    /// let builder = LockRuntime::builder()
    ///     .memory(MemoryStore::new())
    ///     .metrics_key_label(|key| key.split(':').next().unwrap_or(key).to_owned());
    /// ```
    pub fn metrics_key_label(
        mut self,
        label: impl Fn(&str) -> String + Send + Sync + 'static,
    ) -> Self {
        self.metrics_label = Some(Arc::new(label));
        self
    }

    /// How long `build()` may take to reach the store (default 5 s).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = Some(timeout);
        self
    }

    /// How long one store command may take before it counts as failed (default 5 s).
    pub fn command_timeout(mut self, timeout: Duration) -> Self {
        self.command_timeout = Some(timeout);
        self
    }

    /// How long [`LockRuntime::shutdown`] keeps renewing leases that are still held, so
    /// running jobs can finish with their lock (default 5 s). When it ends, the remaining
    /// leases are marked lost, then released. Zero: mark lost and release at once.
    pub fn shutdown_grace(mut self, grace: Duration) -> Self {
        self.shutdown_grace = Some(grace);
        self
    }

    /// Checks the configuration, connects to the store, verifies it answers and loads the
    /// lock scripts. Fails fast with a clear [`LockError`]; it never retries for longer than
    /// the connect timeout.
    pub async fn build(self) -> Result<LockRuntime, LockError> {
        if let Some(both) = self.second_store {
            return Err(LockError::config(format!(
                "two stores were configured ({both}); choose one"
            )));
        }
        let namespace = self.namespace.unwrap_or_else(|| "lock".to_owned());
        check_name("namespace", &namespace)?;
        let default_ttl = self.default_ttl.unwrap_or(DEFAULT_TTL);
        check_ttl("default_ttl", default_ttl)?;
        let owner = self.owner.unwrap_or_else(default_owner);
        check_name("owner", &owner)?;
        let connect_timeout = self.connect_timeout.unwrap_or(DEFAULT_CONNECT_TIMEOUT);
        check_ttl("connect_timeout", connect_timeout)?;
        let command_timeout = self.command_timeout.unwrap_or(DEFAULT_CONNECT_TIMEOUT);
        check_ttl("command_timeout", command_timeout)?;
        // The deprecated setters' values are checked first, as they always were.
        check_replicated(self.forwarded.replicated)?;
        let Some(choice) = self.store else {
            return Err(LockError::config(
                "no store configured: call .redis(url) or .memory(MemoryStore::new()) on the builder",
            ));
        };
        let backend = choice
            .forward(self.forwarded)?
            .connect(Shared {
                namespace: namespace.clone(),
                connect_timeout,
                command_timeout,
                tls_root_cert: self.tls_root_cert,
            })
            .await?;
        Ok(LockRuntime::from_parts(
            Arc::new(backend),
            namespace,
            default_ttl,
            owner,
            command_timeout,
            self.shutdown_grace.unwrap_or(DEFAULT_SHUTDOWN_GRACE),
            self.metrics_label,
        ))
    }
}
