//! The connection of `replicated_acquire`: a new connection to the current master for each
//! acquire, used for nothing but its script and its `WAIT`, which go out pipelined and are
//! never retried once sent (see `RedisBackend::acquire_replicated`). A connection of its own
//! means a `WAIT` answers for this acquire's write alone, never blocks other commands of the
//! runtime, and never queues this acquire behind another one's `WAIT` (where a cancelled
//! acquire could be granted after its background release had already run).

use std::time::Duration;

use redis::AsyncConnectionConfig;
use redis::aio::MultiplexedConnection;

use super::RedisBackend;
use super::client::open_client;

/// Opens a connection to the current master (for Sentinel: the master the sentinels name
/// now), with that master's URL. Its reply timeout covers the longest `WAIT` plus a command.
/// On failure, the URL it tried, if it got that far.
pub(super) async fn connect(
    backend: &RedisBackend,
    wait: Duration,
) -> Result<(String, MultiplexedConnection), (Option<String>, redis::RedisError)> {
    let url = match &backend.sentinel {
        Some(sentinel) => sentinel.current_master_url().await.map_err(|e| (None, e))?,
        None => backend.options.urls.first().cloned().unwrap_or_default(),
    };
    let config = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(backend.options.connect_timeout))
        .set_response_timeout(Some(wait + backend.options.command_timeout));
    let opened = async {
        open_client(url.as_str(), backend.options.tls_root_cert.as_deref())?
            .get_multiplexed_async_connection_with_config(&config)
            .await
    };
    match opened.await {
        Ok(conn) => Ok((url, conn)),
        Err(e) => Err((Some(url), e)),
    }
}
