//! The store a builder was given ([`IntoStore`]), and its connecting at `build()` into the
//! runtime's one dispatch handle.

use std::time::Duration;

#[cfg(feature = "etcd")]
use super::kinds::EtcdStore;
#[cfg(feature = "postgres")]
use super::kinds::PostgresStore;
use super::kinds::{Members, RedisClusterStore, RedisStore, RedlockStore, shown_urls};
use super::{Backend, DEFAULT_NODE_TIMEOUT, DynStore, LockStore, MemoryStore};
use super::{RedisBackend, RedisOptions, RedlockBackend, Topology};
use crate::LockError;
use crate::config::{check_name, check_ttl};

/// What [`LockRuntimeBuilder::store`](crate::LockRuntimeBuilder::store) takes: one of the
/// store types of this module ([`RedisStore`], [`RedisClusterStore`], [`RedlockStore`],
/// `PostgresStore`, `EtcdStore`), or any [`LockStore`] (a [`MemoryStore`] too, plugged in
/// as a third-party store would be, each call bounded by the command timeout; `.memory(..)`
/// calls it directly).
pub trait IntoStore {
    #[doc(hidden)]
    fn into_choice(self) -> Chosen;
}

/// A store chosen for a runtime, not yet connected (opaque).
#[doc(hidden)]
pub struct Chosen(pub(crate) StoreChoice);

impl std::fmt::Debug for Chosen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0.shown())
    }
}

impl<S: LockStore> IntoStore for S {
    fn into_choice(self) -> Chosen {
        Chosen(StoreChoice::Custom(Box::new(self)))
    }
}

impl IntoStore for RedisStore {
    fn into_choice(self) -> Chosen {
        Chosen(StoreChoice::Redis(self))
    }
}

impl IntoStore for RedisClusterStore {
    fn into_choice(self) -> Chosen {
        Chosen(StoreChoice::Cluster(self))
    }
}

impl IntoStore for RedlockStore {
    fn into_choice(self) -> Chosen {
        Chosen(StoreChoice::Redlock(self))
    }
}

#[cfg(feature = "postgres")]
impl IntoStore for PostgresStore {
    fn into_choice(self) -> Chosen {
        Chosen(StoreChoice::Postgres(self))
    }
}

#[cfg(feature = "zookeeper")]
impl IntoStore for super::kinds::ZooKeeperStore {
    fn into_choice(self) -> Chosen {
        Chosen(StoreChoice::ZooKeeper(self))
    }
}

#[cfg(feature = "etcd")]
impl IntoStore for EtcdStore {
    fn into_choice(self) -> Chosen {
        Chosen(StoreChoice::Etcd(self))
    }
}

pub(crate) enum StoreChoice {
    Redis(RedisStore),
    Cluster(RedisClusterStore),
    Redlock(RedlockStore),
    Memory(MemoryStore),
    Custom(Box<dyn DynStore>),
    #[cfg(feature = "postgres")]
    Postgres(PostgresStore),
    #[cfg(feature = "etcd")]
    Etcd(EtcdStore),
    #[cfg(feature = "zookeeper")]
    ZooKeeper(super::kinds::ZooKeeperStore),
}

/// The store-specific options a builder was given through its deprecated setters, applied to
/// the chosen store at `build()` (where the store's own option, if set, wins).
#[derive(Default)]
pub(crate) struct Forwarded {
    pub(crate) replicated: Option<(usize, Duration)>,
    pub(crate) node_timeout: Option<Duration>,
    #[cfg(feature = "postgres")]
    pub(crate) postgres_table: Option<String>,
    #[cfg(feature = "etcd")]
    pub(crate) etcd_user: Option<(String, String)>,
}

/// What every store is connected with.
pub(crate) struct Shared {
    pub(crate) namespace: String,
    pub(crate) connect_timeout: Duration,
    pub(crate) command_timeout: Duration,
    pub(crate) tls_root_cert: Option<Vec<u8>>,
}

impl StoreChoice {
    /// The builder method that chose it, for "two stores were configured".
    pub(crate) fn name(&self) -> &'static str {
        match self {
            StoreChoice::Redis(r) if r.sentinel_master.is_some() => "redis_sentinel",
            StoreChoice::Redis(_) => "redis",
            StoreChoice::Cluster(_) => "redis_cluster",
            StoreChoice::Redlock(RedlockStore {
                members: Members::Urls(_),
                ..
            }) => "redlock",
            StoreChoice::Redlock(_) => "redlock_stores",
            StoreChoice::Memory(_) => "memory",
            StoreChoice::Custom(_) => "store",
            #[cfg(feature = "postgres")]
            StoreChoice::Postgres(_) => "postgres",
            #[cfg(feature = "etcd")]
            StoreChoice::Etcd(_) => "etcd",
            #[cfg(feature = "zookeeper")]
            StoreChoice::ZooKeeper(_) => "zookeeper",
        }
    }

    /// How the builder's `Debug` shows it (no passwords).
    pub(crate) fn shown(&self) -> String {
        match self {
            StoreChoice::Redis(RedisStore {
                urls,
                sentinel_master: Some(name),
                ..
            }) => format!("redis_sentinel({name}, {})", shown_urls(urls)),
            StoreChoice::Redis(r) => format!("redis({})", shown_urls(&r.urls)),
            StoreChoice::Cluster(c) => format!("redis_cluster({})", shown_urls(&c.urls)),
            StoreChoice::Redlock(RedlockStore {
                members: Members::Urls(urls),
                ..
            }) => format!("redlock({})", shown_urls(urls)),
            StoreChoice::Redlock(RedlockStore {
                members: Members::Stores(stores),
                ..
            }) => format!("redlock_stores({} stores)", stores.len()),
            StoreChoice::Memory(_) => "memory".to_owned(),
            StoreChoice::Custom(_) => "store(..)".to_owned(),
            #[cfg(feature = "postgres")]
            StoreChoice::Postgres(p) => format!("postgres({})", p.target.shown()),
            #[cfg(feature = "etcd")]
            StoreChoice::Etcd(e) => format!("etcd({})", shown_urls(&e.endpoints)),
            #[cfg(feature = "zookeeper")]
            StoreChoice::ZooKeeper(z) => format!("zookeeper({})", z.connect),
        }
    }

    /// Applies what the deprecated builder setters gave, refusing what does not fit the store
    /// (the checks and messages the builder always had).
    pub(crate) fn forward(mut self, forwarded: Forwarded) -> Result<Self, LockError> {
        if let Some((replicas, timeout)) = forwarded.replicated {
            let StoreChoice::Redis(redis) = &mut self else {
                return Err(LockError::config(
                    "replicated_acquire applies to .redis(url) and .redis_sentinel(..) only",
                ));
            };
            redis.replicated.get_or_insert((replicas, timeout));
        }
        #[cfg(feature = "postgres")]
        if let Some(table) = forwarded.postgres_table {
            let StoreChoice::Postgres(postgres) = &mut self else {
                return Err(LockError::config(
                    "postgres_table applies to .postgres(url) and .postgres_config(config) only",
                ));
            };
            postgres.table.get_or_insert(table);
        }
        #[cfg(feature = "etcd")]
        if let Some(user) = forwarded.etcd_user {
            let StoreChoice::Etcd(etcd) = &mut self else {
                return Err(LockError::config(
                    "etcd_user applies to .etcd(endpoints) only",
                ));
            };
            etcd.user.get_or_insert(user);
        }
        if let (Some(timeout), StoreChoice::Redlock(redlock)) = (forwarded.node_timeout, &mut self)
        {
            redlock.node_timeout.get_or_insert(timeout);
        }
        Ok(self)
    }

    /// Connects the store: the runtime's one handle on it.
    pub(crate) async fn connect(self, shared: Shared) -> Result<Backend, LockError> {
        let Shared {
            namespace,
            connect_timeout,
            command_timeout,
            tls_root_cert,
        } = shared;
        Ok(match self {
            StoreChoice::Memory(store) => Backend::new(store),
            StoreChoice::Custom(store) => Backend::from_dyn(store, Some(command_timeout)),
            #[cfg(feature = "postgres")]
            StoreChoice::Postgres(PostgresStore { target, table }) => {
                // Boxed: the connect future is deep, and callers' futures that build a
                // runtime would otherwise carry all of its layout.
                let store = Box::pin(super::PostgresBackend::connect(super::PostgresOptions {
                    target,
                    table: table.unwrap_or_else(|| super::DEFAULT_TABLE.to_owned()),
                    connect_timeout,
                    command_timeout,
                    tls_root_cert,
                }))
                .await?;
                Backend::bounded(store, command_timeout)
            }
            #[cfg(feature = "etcd")]
            StoreChoice::Etcd(EtcdStore { endpoints, user }) => {
                let store = Box::pin(super::EtcdBackend::connect(super::EtcdOptions {
                    endpoints,
                    user,
                    tls_root_cert,
                    connect_timeout,
                    command_timeout,
                }))
                .await?;
                Backend::bounded(store, command_timeout)
            }
            #[cfg(feature = "zookeeper")]
            StoreChoice::ZooKeeper(super::kinds::ZooKeeperStore {
                connect,
                digest,
                session_timeout,
            }) => {
                let session_timeout = super::checked_session_timeout(session_timeout)?;
                let store = Box::pin(super::ZooKeeperBackend::connect(super::ZooKeeperOptions {
                    connect,
                    digest: digest.map(|(user, password)| format!("{user}:{password}")),
                    connect_timeout,
                    session_timeout,
                }))
                .await?;
                Backend::bounded(store, command_timeout)
            }
            StoreChoice::Redlock(RedlockStore {
                members,
                node_timeout,
            }) => {
                let node_timeout = node_timeout.unwrap_or(DEFAULT_NODE_TIMEOUT);
                check_ttl("node_timeout", node_timeout)?;
                match members {
                    Members::Stores(stores) => {
                        Backend::new(RedlockBackend::from_stores(stores, node_timeout)?)
                    }
                    Members::Urls(urls) => Backend::new(
                        RedlockBackend::connect(
                            urls,
                            connect_timeout,
                            command_timeout,
                            node_timeout,
                            tls_root_cert,
                        )
                        .await?,
                    ),
                }
            }
            StoreChoice::Redis(RedisStore {
                urls,
                sentinel_master: None,
                replicated,
            }) => {
                check_replicated(replicated)?;
                let url = urls.into_iter().next().unwrap_or_default();
                let mut options = RedisOptions::single(url, connect_timeout, command_timeout);
                options.replicated = replicated;
                options.tls_root_cert = tls_root_cert;
                Backend::new(RedisBackend::connect(options).await?)
            }
            StoreChoice::Redis(RedisStore {
                urls,
                sentinel_master: Some(master_name),
                replicated,
            }) => {
                check_replicated(replicated)?;
                check_name("sentinel master name", &master_name)?;
                if urls.is_empty() {
                    return Err(LockError::config(
                        "redis_sentinel needs at least one sentinel URL",
                    ));
                }
                Backend::new(
                    RedisBackend::connect(RedisOptions {
                        urls,
                        topology: Topology::Sentinel {
                            master: master_name,
                        },
                        replicated,
                        tls_root_cert,
                        connect_timeout,
                        command_timeout,
                        namespace,
                        fence_at_acquire: false,
                    })
                    .await?,
                )
            }
            StoreChoice::Cluster(RedisClusterStore { urls }) => {
                if urls.is_empty() {
                    return Err(LockError::config(
                        "redis_cluster needs at least one seed node URL",
                    ));
                }
                Backend::new(
                    RedisBackend::connect(RedisOptions {
                        urls,
                        topology: Topology::Cluster,
                        replicated: None,
                        tls_root_cert,
                        connect_timeout,
                        command_timeout,
                        namespace,
                        fence_at_acquire: false,
                    })
                    .await?,
                )
            }
        })
    }
}

/// `replicated_acquire(replicas, timeout)`: at least one replica, a usable timeout.
pub(crate) fn check_replicated(replicated: Option<(usize, Duration)>) -> Result<(), LockError> {
    if let Some((replicas, timeout)) = replicated {
        if replicas == 0 {
            return Err(LockError::config(
                "replicated_acquire needs at least 1 replica",
            ));
        }
        check_ttl("replicated_acquire timeout", timeout)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_memory_store_given_to_store_is_plugged_in_like_any_other() {
        let chosen = MemoryStore::new().into_choice().0;
        assert_eq!(chosen.name(), "store", "{}", chosen.shown());
        assert!(matches!(chosen, StoreChoice::Custom(_)));
    }
}
