//! Connecting a Redis store: the connection of its topology, a PING, the server version and
//! the scripts, all within the connect timeout.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{IntoConnectionInfo, Value};
use tokio::sync::OnceCell;

use super::super::ReleaseHub;
use super::client::{cluster_builder, open_client};
use super::conn::Conn;
use super::group::ReleaseGroup;
use super::options::{RedisOptions, Topology};
use super::reply::percent_decode;
use super::scripts::Scripts;
use super::sentinel::{SentinelConn, SentinelHandle, SentinelSpec};
use super::wire::Wire;
use super::{RedisBackend, version};
use crate::config::{redact_url, url_secret};
use crate::error::scrub;
use crate::{BackendError, LockError};

/// Why connecting failed: the configuration (retrying cannot help) or the servers.
enum Failure {
    Config(LockError),
    Redis(redis::RedisError),
}

impl From<redis::RedisError> for Failure {
    fn from(e: redis::RedisError) -> Self {
        Failure::Redis(e)
    }
}

/// The URLs' passwords, raw and percent-decoded: texts no error may show.
fn secrets_of(urls: &[String]) -> Vec<String> {
    let mut secrets = Vec::new();
    for url in urls {
        if let Some(secret) = url_secret(url) {
            let decoded = percent_decode(&secret);
            if decoded != secret {
                secrets.push(decoded);
            }
            secrets.push(secret);
        }
    }
    secrets
}

/// What connecting learnt of the servers, beyond that they answer.
#[derive(Default)]
struct Probed {
    /// Every node of a Cluster takes SPUBLISH.
    sharded_pubsub: bool,
    /// The one server takes DELIFEQ from this user.
    delifeq: bool,
}

/// The URLs as errors show them: credentials hidden.
struct Shown {
    url: String,
    secrets: Vec<String>,
}

impl Shown {
    fn bad_url(&self, e: redis::RedisError) -> LockError {
        LockError::config(format!(
            "cannot use Redis URL `{}`: {}",
            self.url,
            scrub(&e.to_string(), &self.secrets)
        ))
    }
}

impl RedisBackend {
    /// Connects, checks the server answers and loads the scripts; bounded by the connect
    /// timeout so an unreachable server fails `build()` quickly.
    pub(crate) async fn connect(options: RedisOptions) -> Result<Self, LockError> {
        let (backend, unreachable) =
            Self::connect_with(options, Arc::new(ReleaseHub::default()), false).await?;
        match unreachable {
            Some(e) => Err(e),
            None => Ok(backend),
        }
    }

    /// Connects and notifies `hub` of releases. With `allow_unreachable` (Redlock nodes), a
    /// single server that does not answer yields a handle that connects lazily, plus the error.
    pub(crate) async fn connect_with(
        options: RedisOptions,
        hub: Arc<ReleaseHub>,
        allow_unreachable: bool,
    ) -> Result<(Self, Option<LockError>), LockError> {
        let shown = Shown {
            url: options
                .urls
                .iter()
                .map(|u| redact_url(u))
                .collect::<Vec<_>>()
                .join(", "),
            secrets: secrets_of(&options.urls),
        };
        let what = options.topology.what();
        let sentinel = options.sentinel_master().map(|master_name| {
            SentinelConn::new(SentinelSpec {
                master_name: master_name.to_owned(),
                sentinels: options.urls.clone(),
                connect_timeout: options.connect_timeout,
                command_timeout: options.command_timeout,
                tls_root_cert: options.tls_root_cert.clone(),
            })
        });
        let attempt = handshake(&options, sentinel.as_ref(), &shown, what);
        let failure: LockError = match tokio::time::timeout(options.connect_timeout, attempt).await
        {
            Ok(Ok((conn, probed))) => {
                let backend = Self::assemble(conn, probed, options, shown, hub, sentinel);
                backend.load_scripts().await?;
                return Ok((backend, None));
            }
            Ok(Err(Failure::Config(e))) => return Err(e),
            Ok(Err(Failure::Redis(e))) => BackendError::redis(
                &format!("cannot connect to {what} at `{}`", shown.url),
                e,
                &shown.secrets,
            )
            .into(),
            Err(_) => BackendError::transient(format!(
                "cannot connect to {what} at `{}`: no answer within {:?}",
                shown.url, options.connect_timeout
            ))
            .into(),
        };
        if !allow_unreachable || options.topology != Topology::Single {
            return Err(failure);
        }
        let conn = single(&options, &shown, true).await.map_err(|e| match e {
            Failure::Config(e) => e,
            Failure::Redis(e) => shown.bad_url(e),
        })?;
        let backend = Self::assemble(conn, Probed::default(), options, shown, hub, None);
        Ok((backend, Some(failure)))
    }

    fn assemble(
        conn: Conn,
        probed: Probed,
        options: RedisOptions,
        shown: Shown,
        hub: Arc<ReleaseHub>,
        sentinel: Option<Arc<SentinelConn>>,
    ) -> Self {
        let scripts = Arc::new(Scripts::new());
        // Plain releases go out in groups wherever every record lives on one server; a Cluster
        // spreads them over slots, and there each release stays one script call.
        let group = (!options.is_cluster()).then(|| {
            Arc::new(ReleaseGroup::new(
                conn.clone(),
                scripts.clone(),
                shown.secrets.clone(),
            ))
        });
        RedisBackend {
            sharded_pubsub: probed.sharded_pubsub,
            native_delifeq: AtomicBool::new(probed.delifeq),
            lean_owner: std::sync::OnceLock::new(),
            conn,
            options,
            secrets: shown.secrets,
            shown_url: shown.url,
            scripts,
            group,
            subscriber: OnceCell::new(),
            hub,
            sentinel,
        }
    }

    async fn load_scripts(&self) -> Result<(), LockError> {
        let mut conn = self.conn.clone();
        for script in self.scripts.all() {
            script
                .prepare_invoke()
                .load_async(&mut conn)
                .await
                .map_err(|e| self.error("cannot load the lock scripts", e))?;
        }
        Ok(())
    }
}

/// The command connection of the topology (not yet used).
async fn open(
    options: &RedisOptions,
    sentinel: Option<&Arc<SentinelConn>>,
    shown: &Shown,
) -> Result<Conn, Failure> {
    let bad_url = |e| Failure::Config(shown.bad_url(e));
    if let Some(sentinel) = sentinel {
        for url in &options.urls {
            url.as_str().into_connection_info().map_err(bad_url)?;
        }
        return Ok(Conn::Sentinel(SentinelHandle(sentinel.clone())));
    }
    if options.is_cluster() {
        let client = cluster_builder(options).build().map_err(bad_url)?;
        return Ok(Conn::Cluster(client.get_async_connection().await?));
    }
    single(options, shown, false).await
}

/// The connection to one server: the lean one (`wire`) over plain TCP, which connects on its
/// first request; else redis-rs' connection manager, connected now unless `lazy`.
async fn single(options: &RedisOptions, shown: &Shown, lazy: bool) -> Result<Conn, Failure> {
    let bad_url = |e| Failure::Config(shown.bad_url(e));
    let url = options.urls.first().map(String::as_str).unwrap_or_default();
    let info = url.into_connection_info().map_err(bad_url)?;
    if let Some(wire) = Wire::for_info(&info, options.connect_timeout, options.command_timeout) {
        return Ok(Conn::Wire(wire));
    }
    let client = open_client(info, options.tls_root_cert.as_deref()).map_err(bad_url)?;
    let config = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(options.connect_timeout))
        .set_response_timeout(Some(options.command_timeout));
    if lazy {
        let config = config.set_number_of_retries(1);
        return Ok(Conn::Single(
            ConnectionManager::new_lazy_with_config(client, config).map_err(bad_url)?,
        ));
    }
    let config = config
        .set_number_of_retries(3)
        .set_max_delay(Duration::from_secs(1));
    Ok(Conn::Single(
        ConnectionManager::new_with_config(client, config).await?,
    ))
}

/// Opens the connection and checks the servers: they answer, run a version the scripts
/// support, (a Cluster) whether they take sharded pub/sub, and (one server) whether it takes
/// `DELIFEQ` from this user.
async fn handshake(
    options: &RedisOptions,
    sentinel: Option<&Arc<SentinelConn>>,
    shown: &Shown,
    what: &str,
) -> Result<(Conn, Probed), Failure> {
    let mut conn = open(options, sentinel, shown).await?;
    redis::cmd("PING").query_async::<()>(&mut conn).await?;
    // A server that refuses INFO (ACL `-@dangerous`, a rename, some proxies) has an unknown
    // version, and nothing is refused.
    let info = redis::cmd("INFO")
        .arg("server")
        .query_async::<Value>(&mut conn)
        .await
        .unwrap_or(Value::Nil);
    let found = version::lowest(&info);
    if version::too_old(found) {
        let (major, minor, patch) = found.unwrap_or_default();
        let (min_major, min_minor) = version::MINIMUM;
        return Err(Failure::Config(LockError::config(format!(
            "{what} at `{}` runs Redis {major}.{minor}.{patch}; the lock runtime needs Redis \
             {min_major}.{min_minor} or newer (or Valkey)",
            shown.url
        ))));
    }
    // Sharded pub/sub is asked of the servers themselves rather than read from the version:
    // every runtime of a deployment must choose alike (a sharded release never reaches a
    // classic subscriber), whether or not its user may run INFO.
    let sharded =
        options.is_cluster() && version::answers_spublish(&mut conn, &options.namespace).await?;
    let delifeq = options.topology == Topology::Single
        && version::answers_delifeq(&mut conn, &options.namespace).await?;
    Ok((
        conn,
        Probed {
            sharded_pubsub: sharded,
            delifeq,
        },
    ))
}
