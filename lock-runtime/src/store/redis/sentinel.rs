//! A Sentinel-managed master: the master's address comes from the sentinels, and is asked for
//! again whenever the current master stops answering or refuses writes (a failover made it a
//! replica), so commands follow the master through failovers.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::{
    Cmd, ConnectionAddr, ConnectionInfo, IntoConnectionInfo, Pipeline, RedisError, RedisFuture,
    Value,
};

use super::client::open_client;
use crate::config::{encode_userinfo, redact_url};

/// Where the sentinels are and how to reach the master they name.
#[derive(Debug, Clone)]
pub(crate) struct SentinelSpec {
    pub(crate) master_name: String,
    /// Sentinel URLs; their credentials are also used for the master.
    pub(crate) sentinels: Vec<String>,
    pub(crate) connect_timeout: Duration,
    pub(crate) command_timeout: Duration,
    /// A PEM root certificate to trust for `rediss://` sentinels and masters.
    pub(crate) tls_root_cert: Option<Vec<u8>>,
}

/// The command connection to whichever server the sentinels currently name as master.
pub(crate) struct SentinelConn {
    spec: SentinelSpec,
    current: Mutex<Option<Master>>,
    /// Serialises re-resolution so a burst of failures asks the sentinels once.
    resolving: tokio::sync::Mutex<()>,
}

/// The master last named, its connection, and whether that is still believed.
struct Master {
    url: String,
    manager: ConnectionManager,
    /// False once a failure made it doubtful: the next command asks the sentinels again, and
    /// keeps this connection if they still name the same server.
    believed: bool,
}

impl std::fmt::Debug for SentinelConn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SentinelConn")
            .field("master_name", &self.spec.master_name)
            .finish_non_exhaustive()
    }
}

impl SentinelConn {
    pub(crate) fn new(spec: SentinelSpec) -> Arc<Self> {
        Arc::new(SentinelConn {
            spec,
            current: Mutex::new(None),
            resolving: tokio::sync::Mutex::new(()),
        })
    }

    fn cached(&self) -> Option<(String, ConnectionManager)> {
        self.current
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .filter(|m| m.believed)
            .map(|m| (m.url.clone(), m.manager.clone()))
    }

    /// Doubts the current master if it is still `addr`, so the next command asks again.
    fn invalidate(&self, addr: &str) {
        let mut current = self.current.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(master) = current.as_mut().filter(|m| m.url == addr) {
            tracing::debug!(master = %self.spec.master_name, old = %redact_url(addr), "master changed or unreachable; asking the sentinels again");
            master.believed = false;
        }
    }

    /// The master's `redis://` URL, with the sentinels' credentials, as the sentinels say now.
    /// It carries the password: show it only through `redact_url`.
    pub(crate) async fn master_url(&self) -> Result<String, RedisError> {
        let mut last_error = None;
        for sentinel in &self.spec.sentinels {
            match self.ask(sentinel).await {
                Ok(url) => return Ok(url),
                Err(e) => last_error = Some(e),
            }
        }
        Err(last_error.unwrap_or_else(|| {
            RedisError::from((redis::ErrorKind::Client, "no sentinel configured"))
        }))
    }

    async fn ask(&self, sentinel: &str) -> Result<String, RedisError> {
        let info = sentinel.into_connection_info()?;
        let client = open_client(info.clone(), self.spec.tls_root_cert.as_deref())?;
        let ask = async {
            let mut conn = client.get_multiplexed_async_connection().await?;
            let reply: Option<(String, u16)> = redis::cmd("SENTINEL")
                .arg("get-master-addr-by-name")
                .arg(&self.spec.master_name)
                .query_async(&mut conn)
                .await?;
            Ok::<_, RedisError>(reply)
        };
        let reply = tokio::time::timeout(self.spec.connect_timeout, ask)
            .await
            .map_err(|_| {
                RedisError::from((redis::ErrorKind::Io, "sentinel did not answer in time"))
            })??;
        let Some((host, port)) = reply else {
            return Err(RedisError::from((
                redis::ErrorKind::Client,
                "the sentinel does not know this master name",
            )));
        };
        let settings = info.redis_settings();
        // Percent-encoded: the URL is parsed again to connect, and a password with `/`, `?`,
        // `#` or `%` would otherwise end the authority early or decode to something else.
        let auth = match (settings.username(), settings.password()) {
            (Some(user), Some(pw)) => format!("{}:{}@", encode_userinfo(user), encode_userinfo(pw)),
            (None, Some(pw)) => format!(":{}@", encode_userinfo(pw)),
            _ => String::new(),
        };
        let host = if host.contains(':') {
            format!("[{host}]")
        } else {
            host
        };
        // Sentinels reached over TLS name masters reached over TLS (a deployment that secures
        // one secures both), verified the same way.
        let (scheme, fragment) = match info.addr() {
            ConnectionAddr::TcpTls { insecure: true, .. } => ("rediss", "#insecure"),
            ConnectionAddr::TcpTls { .. } => ("rediss", ""),
            _ => ("redis", ""),
        };
        Ok(format!("{scheme}://{auth}{host}:{port}{fragment}"))
    }

    /// The connection to the current master, resolving it if needed.
    async fn master(&self) -> Result<(String, ConnectionManager), RedisError> {
        if let Some(current) = self.cached() {
            return Ok(current);
        }
        let _one_at_a_time = self.resolving.lock().await;
        if let Some(current) = self.cached() {
            return Ok(current);
        }
        let url = self.master_url().await?;
        // The same server named again (it was slow, or its connection dropped): keep its
        // connection. The commands already sent on it, a timed-out acquire among them, run
        // on the server in the order they were sent, so a retry or a give-back sent after
        // them cannot overtake them; on a new connection a give-back could run first, and
        // the late acquire after it would leave the lock to nobody for its ttl.
        {
            let mut current = self.current.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some(master) = current.as_mut().filter(|m| m.url == url) {
                master.believed = true;
                return Ok((url, master.manager.clone()));
            }
        }
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(self.spec.connect_timeout))
            .set_response_timeout(Some(self.spec.command_timeout))
            .set_number_of_retries(1);
        let manager = tokio::time::timeout(
            self.spec.connect_timeout,
            ConnectionManager::new_with_config(
                open_client(
                    dropped_silently_after(url.as_str(), self.spec.command_timeout)?,
                    self.spec.tls_root_cert.as_deref(),
                )?,
                config,
            ),
        )
        .await
        .map_err(|_| {
            RedisError::from((redis::ErrorKind::Io, "the master did not answer in time"))
        })??;
        *self.current.lock().unwrap_or_else(PoisonError::into_inner) = Some(Master {
            url: url.clone(),
            manager: manager.clone(),
            believed: true,
        });
        Ok((url, manager))
    }

    /// The URL of the master the sentinels name now (cached until a failure invalidates it).
    pub(crate) async fn current_master_url(&self) -> Result<String, RedisError> {
        self.master().await.map(|(url, _)| url)
    }

    /// True when the error means "this is not (or no longer) a working master": the next
    /// command must ask the sentinels again.
    pub(crate) fn note_failure(&self, addr: &str, e: &RedisError) -> bool {
        let moved_on = is_readonly(e)
            || e.is_io_error()
            || e.is_connection_dropped()
            || e.is_connection_refusal()
            || e.is_timeout();
        if moved_on {
            self.invalidate(addr);
        }
        moved_on
    }

    /// Sends `cmd` to the master; when the master turned out to be gone or demoted, asks the
    /// sentinels again and retries once. Every command the runtime sends is safe to repeat:
    /// acquire re-grants to the same token, renewals and releases are token-checked.
    pub(crate) async fn request(&self, cmd: &Cmd) -> Result<Value, RedisError> {
        self.request_noting(cmd, &mut false).await
    }

    /// As [`request`](Self::request), and sets `retried` when the command went out again
    /// after the first send failed on a broken connection (that send may have been carried
    /// out, its answer lost).
    pub(crate) async fn request_noting(
        &self,
        cmd: &Cmd,
        retried: &mut bool,
    ) -> Result<Value, RedisError> {
        let (addr, mut conn) = self.master().await?;
        match conn.req_packed_command(cmd).await {
            Err(e) if self.note_failure(&addr, &e) => {
                // A refused connection sent nothing; a replica refused the write (READONLY).
                *retried |= !e.is_connection_refusal() && !is_readonly(&e);
                let (addr, mut conn) = self.master().await?;
                let retried = conn.req_packed_command(cmd).await;
                if let Err(e) = &retried {
                    self.note_failure(&addr, e);
                }
                retried
            }
            other => other,
        }
    }

    pub(crate) async fn request_many(
        &self,
        pipeline: &Pipeline,
        offset: usize,
        count: usize,
    ) -> Result<Vec<Value>, RedisError> {
        let (addr, mut conn) = self.master().await?;
        let result = conn.req_packed_commands(pipeline, offset, count).await;
        if let Err(e) = &result {
            self.note_failure(&addr, e);
        }
        result
    }
}

/// The connection info of `url`, with the connection closed when data it sent stays
/// unacknowledged by the peer's TCP stack for `limit` (at least 2 s; Linux's
/// `TCP_USER_TIMEOUT`). A master named again keeps its connection, and redis-rs does not
/// reconnect after a command times out: without this, a connection a network dropped
/// silently would be kept as long as the sentinels name its server. A server that is alive
/// but slow (even stopped) still acknowledges, so its connection, and the order of what was
/// sent on it, stays.
fn dropped_silently_after(url: &str, limit: Duration) -> Result<ConnectionInfo, RedisError> {
    let info = url.into_connection_info()?;
    #[cfg(target_os = "linux")]
    let info = {
        let tcp = info
            .tcp_settings()
            .clone()
            .set_user_timeout(limit.max(Duration::from_secs(2)));
        info.set_tcp_settings(tcp)
    };
    #[cfg(not(target_os = "linux"))]
    let _ = limit;
    Ok(info)
}

/// A cloneable handle implementing redis-rs' connection trait.
#[derive(Clone)]
pub(crate) struct SentinelHandle(pub(crate) Arc<SentinelConn>);

impl ConnectionLike for SentinelHandle {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        let conn = self.0.clone();
        Box::pin(async move { conn.request(cmd).await })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        let conn = self.0.clone();
        Box::pin(async move { conn.request_many(pipeline, offset, count).await })
    }

    fn get_db(&self) -> i64 {
        0
    }
}

/// A write refused because the server is (now) a replica. From Redis 7.0 the reply's code is
/// READONLY, for a script's refused write too; before (6.2) a script's refused write comes
/// back as `ERR Error running script (...): ... -READONLY You can't write against a read only
/// replica.`, where only the text tells. In a pipeline, any refused command counts.
pub(crate) fn is_readonly(e: &RedisError) -> bool {
    if e.code() == Some("READONLY") {
        return true;
    }
    e.clone().into_server_errors().is_some_and(|errors| {
        errors.iter().any(|(_, error)| {
            error.code() == "READONLY"
                || error
                    .details()
                    .is_some_and(|detail| detail.contains("-READONLY "))
        })
    })
}

#[cfg(test)]
mod tests {
    use super::is_readonly;

    /// The error redis-rs makes of one error reply, as the server sent it.
    fn reply(raw: &str) -> redis::RedisError {
        let value = redis::parse_redis_value(raw.as_bytes()).expect("a RESP error reply");
        value.extract_error().expect_err("an error reply")
    }

    #[test]
    fn readonly_is_recognised_in_every_form_the_servers_send() {
        // Redis 7.0 and newer, a command or a script's write.
        assert!(is_readonly(&reply(
            "-READONLY You can't write against a read only replica.\r\n"
        )));
        // Redis 6.2, a script's write.
        assert!(is_readonly(&reply(
            "-ERR Error running script (call to f_6562ecdf0b46729271ec3add9c1a854a6d499a28): \
             @user_script:37: @user_script: 37: -READONLY You can't write against a read only \
             replica.\r\n"
        )));
        assert!(!is_readonly(&reply(
            "-ERR unknown command 'SSUBSCRIBE'\r\n"
        )));
        assert!(!is_readonly(&reply(
            "-ERR Error running script (call to f_0b7f): @user_script:12: Unknown Redis command \
             called from Lua script\r\n"
        )));
    }
}
