//! The Redis store: one multiplexed connection that reconnects by itself, four Lua scripts run
//! by SHA (reloaded on NOSCRIPT), and a lazily started subscriber connection for waiters.

use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClientBuilder;
use redis::{Client, IntoConnectionInfo, Script, Value};
use tokio::sync::OnceCell;

mod subscriber;

use subscriber::Subscriber;
pub(crate) use subscriber::SubscriberHandle;

use super::conn::{Conn, slot};
use super::sentinel::{SentinelConn, SentinelHandle, SentinelSpec};
use super::{AcquireOutcome, ExtendItem, KeyNames, RecordView, ReleaseHub, ReleaseOutcome};
use crate::config::{millis_ceil, redact_url, url_secret};
use crate::{BackendError, LockError};

/// How the builder asked to connect.
#[derive(Debug, Clone)]
pub(crate) struct RedisOptions {
    /// One URL for a single server; the seed nodes for a Cluster; the sentinels for Sentinel.
    pub(crate) urls: Vec<String>,
    pub(crate) cluster: bool,
    /// With Sentinel: the name of the monitored master.
    pub(crate) sentinel_master: Option<String>,
    /// After each acquire, WAIT for this many replicas for at most this long.
    pub(crate) replicated: Option<(usize, Duration)>,
    /// A PEM root certificate to trust for `rediss://` instead of the system's.
    pub(crate) tls_root_cert: Option<Vec<u8>>,
    pub(crate) connect_timeout: Duration,
    pub(crate) command_timeout: Duration,
}

impl RedisOptions {
    pub(crate) fn single(
        url: String,
        connect_timeout: Duration,
        command_timeout: Duration,
    ) -> Self {
        RedisOptions {
            urls: vec![url],
            cluster: false,
            sentinel_master: None,
            replicated: None,
            tls_root_cert: None,
            connect_timeout,
            command_timeout,
        }
    }
}

/// A store on one Redis server (standalone, or the master a URL points at) or on a Redis
/// Cluster. Every script touches only keys of one lock, which share a hash slot.
pub(crate) struct RedisBackend {
    conn: Conn,
    options: RedisOptions,
    /// Texts that must never appear in an error: the URLs' passwords, raw and decoded.
    secrets: Vec<String>,
    shown_url: String,
    scripts: Arc<Scripts>,
    subscriber: OnceCell<Subscriber>,
    hub: Arc<ReleaseHub>,
    sentinel: Option<Arc<SentinelConn>>,
}

impl std::fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisBackend")
            .field("url", &self.shown_url)
            .field("cluster", &self.options.cluster)
            .finish_non_exhaustive()
    }
}

struct Scripts {
    acquire: Script,
    release: Script,
    extend: Script,
    inspect: Script,
    raise_fence: Script,
}

impl Scripts {
    fn new() -> Self {
        Scripts {
            acquire: Script::new(include_str!("lua/acquire.lua")),
            release: Script::new(include_str!("lua/release.lua")),
            extend: Script::new(include_str!("lua/extend.lua")),
            inspect: Script::new(include_str!("lua/inspect.lua")),
            raise_fence: Script::new(include_str!("lua/raise_fence.lua")),
        }
    }
}

/// A client for one server, trusting `root_cert` (PEM) for TLS when given.
fn open_client<C: IntoConnectionInfo>(
    info: C,
    root_cert: Option<&[u8]>,
) -> redis::RedisResult<Client> {
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
    /// server that does not answer yields a handle that connects lazily, plus the error.
    pub(crate) async fn connect_with(
        options: RedisOptions,
        hub: Arc<ReleaseHub>,
        allow_unreachable: bool,
    ) -> Result<(Self, Option<LockError>), LockError> {
        let shown_url = options
            .urls
            .iter()
            .map(|u| redact_url(u))
            .collect::<Vec<_>>()
            .join(", ");
        let secrets = secrets_of(&options.urls);
        let bad_url = |e: redis::RedisError| {
            LockError::config(format!(
                "cannot use Redis URL `{shown_url}`: {}",
                scrub(&e.to_string(), &secrets)
            ))
        };
        let what = if options.cluster {
            "Redis Cluster"
        } else if options.sentinel_master.is_some() {
            "the Redis master named by the sentinels"
        } else {
            "Redis"
        };
        let sentinel = options.sentinel_master.as_ref().map(|master_name| {
            SentinelConn::new(SentinelSpec {
                master_name: master_name.clone(),
                sentinels: options.urls.clone(),
                connect_timeout: options.connect_timeout,
                command_timeout: options.command_timeout,
            })
        });
        let connect = async {
            let mut conn = if let Some(sentinel) = &sentinel {
                for url in &options.urls {
                    url.as_str()
                        .into_connection_info()
                        .map_err(|e| Err(bad_url(e)))?;
                }
                Conn::Sentinel(SentinelHandle(sentinel.clone()))
            } else if options.cluster {
                let client = ClusterClientBuilder::new(options.urls.iter().map(String::as_str))
                    .connection_timeout(options.connect_timeout)
                    .response_timeout(options.command_timeout)
                    .build()
                    .map_err(|e| Err(bad_url(e)))?;
                Conn::Cluster(client.get_async_connection().await.map_err(Ok)?)
            } else {
                let url = options.urls.first().map(String::as_str).unwrap_or_default();
                let client = open_client(url, options.tls_root_cert.as_deref())
                    .map_err(|e| Err(bad_url(e)))?;
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(options.connect_timeout))
                    .set_response_timeout(Some(options.command_timeout))
                    .set_number_of_retries(3)
                    .set_max_delay(Duration::from_secs(1));
                Conn::Single(
                    ConnectionManager::new_with_config(client, config)
                        .await
                        .map_err(Ok)?,
                )
            };
            redis::cmd("PING")
                .query_async::<()>(&mut conn)
                .await
                .map_err(Ok)?;
            Ok::<_, Result<redis::RedisError, LockError>>(conn)
        };
        let failure: LockError = match tokio::time::timeout(options.connect_timeout, connect).await
        {
            Ok(Ok(conn)) => {
                let backend = RedisBackend {
                    conn,
                    options,
                    secrets,
                    shown_url,
                    scripts: Arc::new(Scripts::new()),
                    subscriber: OnceCell::new(),
                    hub,
                    sentinel,
                };
                backend.load_scripts().await?;
                return Ok((backend, None));
            }
            Ok(Err(Err(config_error))) => return Err(config_error),
            Ok(Err(Ok(e))) => BackendError::redis(
                &format!("cannot connect to {what} at `{shown_url}`"),
                e,
                &secrets,
            )
            .into(),
            Err(_) => BackendError::transient(format!(
                "cannot connect to {what} at `{shown_url}`: no answer within {:?}",
                options.connect_timeout
            ))
            .into(),
        };
        if !allow_unreachable || options.cluster || options.sentinel_master.is_some() {
            return Err(failure);
        }
        let url = options.urls.first().map(String::as_str).unwrap_or_default();
        let client = open_client(url, options.tls_root_cert.as_deref()).map_err(bad_url)?;
        let lazy_config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(options.connect_timeout))
            .set_response_timeout(Some(options.command_timeout))
            .set_number_of_retries(1);
        let conn = ConnectionManager::new_lazy_with_config(client, lazy_config).map_err(bad_url)?;
        let backend = RedisBackend {
            conn: Conn::Single(conn),
            options,
            secrets,
            shown_url,
            scripts: Arc::new(Scripts::new()),
            subscriber: OnceCell::new(),
            hub,
            sentinel: None,
        };
        Ok((backend, Some(failure)))
    }

    /// The server's URL with credentials hidden.
    pub(crate) fn shown_url(&self) -> &str {
        &self.shown_url
    }

    async fn load_scripts(&self) -> Result<(), LockError> {
        let mut conn = self.conn.clone();
        for script in [
            &self.scripts.acquire,
            &self.scripts.release,
            &self.scripts.extend,
            &self.scripts.inspect,
            &self.scripts.raise_fence,
        ] {
            script
                .prepare_invoke()
                .load_async(&mut conn)
                .await
                .map_err(|e| self.error("cannot load the lock scripts", e))?;
        }
        Ok(())
    }

    fn error(&self, context: &str, e: redis::RedisError) -> LockError {
        BackendError::redis(
            &format!("{context} (Redis at `{}`)", self.shown_url),
            e,
            &self.secrets,
        )
        .into()
    }

    pub(crate) async fn acquire(
        &self,
        names: &KeyNames,
        token: &str,
        owner: &str,
        ttl: Duration,
        min_hold: Duration,
        once: bool,
    ) -> Result<AcquireOutcome, LockError> {
        let mut conn = self.conn.clone();
        let reply: Vec<Value> = self
            .scripts
            .acquire
            .key(&names.record)
            .key(&names.fence)
            .key(&names.done)
            .arg(token)
            .arg(owner)
            .arg(millis_ceil(ttl))
            .arg(millis_ceil(min_hold))
            .arg(if once { "1" } else { "0" })
            .invoke_async(&mut conn)
            .await
            .map_err(|e| self.error(&format!("acquire of `{}` failed", names.key), e))?;
        let bad = || {
            LockError::from(BackendError::msg(format!(
                "acquire of `{}` got an unexpected reply from Redis",
                names.key
            )))
        };
        match reply.as_slice() {
            [Value::Int(1), Value::Int(fence)] => {
                let fence = u64::try_from(*fence).map_err(|_| bad())?;
                if let Some((replicas, timeout)) = self.options.replicated {
                    self.confirm_replicated(names, token, replicas, timeout, &mut conn)
                        .await?;
                }
                Ok(AcquireOutcome::Acquired { fence })
            }
            [Value::Int(0), Value::Int(pttl)] => Ok(AcquireOutcome::Held { pttl: pttl_of(*pttl) }),
            [Value::Int(2), Value::Int(pttl)] => Ok(AcquireOutcome::Done { pttl: pttl_of(*pttl) }),
            [Value::Int(3), kind] => Err(BackendError::msg(format!(
                "Redis key `{}` holds a value of type `{}`, not a lock record; it was left untouched",
                names.record,
                value_text(kind)
            ))
            .into()),
            _ => Err(bad()),
        }
    }

    /// WAITs until `replicas` replicas have the acquire; if they do not confirm in time, gives
    /// the lock back and fails: a lock that only the master knows is lost on failover.
    async fn confirm_replicated(
        &self,
        names: &KeyNames,
        token: &str,
        replicas: usize,
        timeout: Duration,
        conn: &mut Conn,
    ) -> Result<(), LockError> {
        let confirmed: Result<i64, _> = redis::cmd("WAIT")
            .arg(replicas)
            .arg(millis_ceil(timeout))
            .query_async(conn)
            .await;
        let confirmed = match confirmed {
            Ok(n) => usize::try_from(n).unwrap_or(0),
            Err(e) => {
                self.release(names, token, None).await.ok();
                return Err(self.error(&format!("WAIT after acquiring `{}` failed", names.key), e));
            }
        };
        if confirmed >= replicas {
            return Ok(());
        }
        self.release(names, token, None).await.ok();
        Err(BackendError::msg(format!(
            "lock `{}` was confirmed by {confirmed} of the {replicas} replicas required within \
             {timeout:?}; it was given back (replicated_acquire)",
            names.key
        ))
        .into())
    }

    pub(crate) async fn release(
        &self,
        names: &KeyNames,
        token: &str,
        done_retention: Option<Duration>,
    ) -> Result<ReleaseOutcome, LockError> {
        let mut conn = self.conn.clone();
        let reply: i64 = self
            .scripts
            .release
            .key(&names.record)
            .key(&names.done)
            .arg(token)
            .arg(&names.channel)
            .arg(done_retention.map_or(0, millis_ceil))
            .arg(if self.options.cluster { "1" } else { "0" })
            .invoke_async(&mut conn)
            .await
            .map_err(|e| self.error(&format!("release of `{}` failed", names.key), e))?;
        Ok(match reply {
            1 => ReleaseOutcome::Released,
            2 => ReleaseOutcome::KeptForMinHold,
            _ => ReleaseOutcome::NotOwner,
        })
    }

    /// Redlock: lifts this node's fence counter to `fence` and stamps the record with it;
    /// true when the record here is ours.
    pub(crate) async fn raise_fence(
        &self,
        names: &KeyNames,
        token: &str,
        fence: u64,
    ) -> Result<bool, LockError> {
        let mut conn = self.conn.clone();
        let reply: i64 = self
            .scripts
            .raise_fence
            .key(&names.record)
            .key(&names.fence)
            .arg(token)
            .arg(fence)
            .invoke_async(&mut conn)
            .await
            .map_err(|e| self.error(&format!("fence update of `{}` failed", names.key), e))?;
        Ok(reply == 1)
    }

    pub(crate) async fn extend(&self, items: &[ExtendItem]) -> Result<Vec<bool>, LockError> {
        if items.is_empty() {
            return Ok(Vec::new());
        }
        if !self.options.cluster {
            return self
                .extend_group(self.conn.clone(), self.scripts.clone(), items)
                .await;
        }
        // A script may only touch keys of one slot: one call per slot, all in flight at once.
        let mut by_slot: std::collections::HashMap<u16, Vec<usize>> =
            std::collections::HashMap::new();
        for (i, item) in items.iter().enumerate() {
            by_slot.entry(slot(&item.record)).or_default().push(i);
        }
        let mut calls = tokio::task::JoinSet::new();
        for (_, indexes) in by_slot {
            let group: Vec<ExtendItem> = indexes.iter().map(|&i| items[i].clone()).collect();
            let conn = self.conn.clone();
            let scripts = self.scripts.clone();
            calls.spawn(async move { (indexes, run_extend(conn, scripts, &group).await) });
        }
        let mut renewed = vec![false; items.len()];
        while let Some(joined) = calls.join_next().await {
            let (indexes, result) = joined.map_err(|e| {
                LockError::from(BackendError::msg(format!("lease renewal task failed: {e}")))
            })?;
            let answers = result.map_err(|e| self.error("lease renewal failed", e))?;
            for (i, ok) in indexes.into_iter().zip(answers) {
                renewed[i] = ok;
            }
        }
        Ok(renewed)
    }

    async fn extend_group(
        &self,
        conn: Conn,
        scripts: Arc<Scripts>,
        items: &[ExtendItem],
    ) -> Result<Vec<bool>, LockError> {
        run_extend(conn, scripts, items)
            .await
            .map_err(|e| self.error("lease renewal failed", e))
    }

    pub(crate) async fn inspect(&self, names: &KeyNames) -> Result<Option<RecordView>, LockError> {
        let mut conn = self.conn.clone();
        let reply: Vec<Value> = self
            .scripts
            .inspect
            .key(&names.record)
            .invoke_async(&mut conn)
            .await
            .map_err(|e| self.error(&format!("inspect of `{}` failed", names.key), e))?;
        match reply.as_slice() {
            [] => Ok(None),
            [tag, kind] if value_text(tag) == "foreign" => Err(BackendError::msg(format!(
                "Redis key `{}` holds a value of type `{}`, not a lock record",
                names.record,
                value_text(kind)
            ))
            .into()),
            [
                owner,
                Value::Int(fence),
                Value::Int(acquired),
                Value::Int(pttl),
                Value::Int(now),
            ] => Ok(Some(RecordView {
                owner: value_text(owner),
                fence: u64::try_from(*fence).unwrap_or(0),
                remaining: pttl_of(*pttl),
                held_for: Duration::from_millis(u64::try_from(now - acquired).unwrap_or(0)),
            })),
            _ => Err(BackendError::msg(format!(
                "inspect of `{}` got an unexpected reply from Redis",
                names.key
            ))
            .into()),
        }
    }
}

/// One extend script call for leases that share a slot; one answer per item.
async fn run_extend(
    mut conn: Conn,
    scripts: Arc<Scripts>,
    items: &[ExtendItem],
) -> Result<Vec<bool>, redis::RedisError> {
    let mut invocation = scripts.extend.prepare_invoke();
    for item in items {
        invocation
            .key(&item.record)
            .arg(&item.token)
            .arg(millis_ceil(item.ttl));
    }
    let reply: Vec<i64> = invocation.invoke_async(&mut conn).await?;
    if reply.len() != items.len() {
        return Err(redis::RedisError::from((
            redis::ErrorKind::Client,
            "renewal answered a different number of results than leases",
        )));
    }
    Ok(reply.into_iter().map(|r| r == 1).collect())
}

fn pttl_of(pttl: i64) -> Option<Duration> {
    u64::try_from(pttl).ok().map(Duration::from_millis)
}

fn value_text(v: &Value) -> String {
    match v {
        Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        Value::SimpleString(s) => s.clone(),
        Value::Okay => "OK".to_owned(),
        Value::Int(i) => i.to_string(),
        other => format!("{other:?}"),
    }
}

fn scrub(text: &str, secrets: &[String]) -> String {
    secrets
        .iter()
        .fold(text.to_owned(), |t, s| t.replace(s.as_str(), "***"))
}

fn percent_decode(s: &str) -> String {
    fn hex(b: u8) -> Option<u8> {
        (b as char).to_digit(16).and_then(|d| u8::try_from(d).ok())
    }
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && i + 2 < bytes.len()
            && let (Some(hi), Some(lo)) = (hex(bytes[i + 1]), hex(bytes[i + 2]))
        {
            out.push(hi * 16 + lo);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}
