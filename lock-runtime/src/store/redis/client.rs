//! Redis clients built from the store's URLs, timeouts and TLS root: the lowest layer.

use redis::cluster::ClusterClientBuilder;
use redis::{Client, IntoConnectionInfo, RedisResult};

use super::options::RedisOptions;

/// A client for one server, trusting `root_cert` (PEM) for TLS when given.
pub(crate) fn open_client<C: IntoConnectionInfo>(
    info: C,
    root_cert: Option<&[u8]>,
) -> RedisResult<Client> {
    match root_cert {
        #[cfg(feature = "tls")]
        Some(pem) => Client::build_with_tls(
            info,
            redis::TlsCertificates {
                client_tls: None,
                root_cert: Some(pem.to_vec()),
            },
        ),
        _ => Client::open(info),
    }
}

/// A Cluster client over the seed nodes, with the store's timeouts; `rediss://` seeds make
/// every node connection TLS, trusting `tls_root_cert` when given (else the system's roots).
pub(crate) fn cluster_builder(options: &RedisOptions) -> ClusterClientBuilder {
    let builder = ClusterClientBuilder::new(options.urls.iter().map(String::as_str))
        .connection_timeout(options.connect_timeout)
        .response_timeout(options.command_timeout);
    match &options.tls_root_cert {
        #[cfg(feature = "tls")]
        Some(pem) => builder.certs(redis::TlsCertificates {
            client_tls: None,
            root_cert: Some(pem.clone()),
        }),
        _ => builder,
    }
}
