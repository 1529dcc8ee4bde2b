//! What the builder asked of a Redis store.

use std::time::Duration;

/// Which Redis deployment the URLs name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Topology {
    /// One server: standalone, or the master a URL points at.
    Single,
    /// A Redis Cluster; the URLs are seed nodes.
    Cluster,
    /// A master watched by Sentinel; the URLs are the sentinels.
    Sentinel {
        /// The name the sentinels monitor the master under.
        master: String,
    },
}

impl Topology {
    /// What a connect error calls the deployment.
    pub(crate) fn what(&self) -> &'static str {
        match self {
            Topology::Single => "Redis",
            Topology::Cluster => "Redis Cluster",
            Topology::Sentinel { .. } => "the Redis master named by the sentinels",
        }
    }
}

/// How the builder asked to connect.
#[derive(Debug, Clone)]
pub(crate) struct RedisOptions {
    /// One URL for a single server; the seed nodes for a Cluster; the sentinels for Sentinel.
    pub(crate) urls: Vec<String>,
    pub(crate) topology: Topology,
    /// After each acquire, WAIT for this many replicas for at most this long.
    pub(crate) replicated: Option<(usize, Duration)>,
    /// A PEM root certificate to trust for `rediss://` instead of the system's.
    pub(crate) tls_root_cert: Option<Vec<u8>>,
    pub(crate) connect_timeout: Duration,
    pub(crate) command_timeout: Duration,
    /// The runtime's key namespace: a Cluster's sharded pub/sub probe publishes inside it,
    /// where the documented ACL rule (`&<namespace>:*`) lets every lock user publish.
    pub(crate) namespace: String,
    /// Every acquire computes its fence at once (the acquire script), never on demand: the
    /// store is a Redlock member, whose quorum takes the largest of its members' fences.
    pub(crate) fence_at_acquire: bool,
}

impl RedisOptions {
    pub(crate) fn single(
        url: String,
        connect_timeout: Duration,
        command_timeout: Duration,
    ) -> Self {
        RedisOptions {
            urls: vec![url],
            topology: Topology::Single,
            replicated: None,
            tls_root_cert: None,
            connect_timeout,
            command_timeout,
            namespace: "lock".to_owned(),
            fence_at_acquire: false,
        }
    }

    /// With Sentinel: the name of the monitored master.
    pub(crate) fn sentinel_master(&self) -> Option<&str> {
        match &self.topology {
            Topology::Sentinel { master } => Some(master),
            Topology::Single | Topology::Cluster => None,
        }
    }

    pub(crate) fn is_cluster(&self) -> bool {
        self.topology == Topology::Cluster
    }
}
