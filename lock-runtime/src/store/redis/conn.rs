//! One connection type over a single Redis server or a Redis Cluster, so the scripts and the
//! subscriber code are written once.

use redis::aio::{ConnectionLike, ConnectionManager};
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, FromRedisValue, Pipeline, RedisFuture, RedisResult, Value};

use super::resp::{self, Arg};
use super::sentinel::SentinelHandle;
use super::wire::Wire;

/// The command connection of a store: the lean connection to one server over plain TCP, a
/// self-reconnecting multiplexed connection to one server (TLS, Unix sockets, RESP3), or a
/// cluster connection that follows MOVED/ASK and topology changes.
#[derive(Clone)]
pub(crate) enum Conn {
    Wire(Wire),
    Single(ConnectionManager),
    Cluster(ClusterConnection),
    Sentinel(SentinelHandle),
}

/// A connection that broke under a request: the connection reconnects, and one retry
/// is safe for every command the runtime sends (acquire re-grants to the same token; renewal
/// and release are token-checked).
fn worth_one_retry(e: &redis::RedisError) -> bool {
    e.is_connection_dropped() || e.is_io_error()
}

impl Conn {
    /// Sends `cmd`, once more on one server when its connection broke under it (the
    /// connection reconnects by itself), and then sets `retried`: the first send may have
    /// been carried out, its answer lost. Sentinel's connection retries and notes alike; a
    /// Cluster connection retries inside the client, unseen here.
    async fn request_noting(&mut self, cmd: &Cmd, retried: &mut bool) -> RedisResult<Value> {
        match self {
            Conn::Wire(c) => wire_noting(c, |buf| cmd.write_packed_command(buf), retried).await,
            Conn::Single(c) => match c.req_packed_command(cmd).await {
                Err(e) if worth_one_retry(&e) => {
                    *retried = true;
                    c.req_packed_command(cmd).await
                }
                other => other,
            },
            Conn::Cluster(c) => c.req_packed_command(cmd).await,
            Conn::Sentinel(c) => c.0.request_noting(cmd, retried).await,
        }
    }

    /// Sends the command `args` and reads its reply as `T`, as `Cmd::query_async` does (a
    /// server error is an error), noting in `retried` a send repeated after its connection
    /// broke, as [`Conn::request_noting`]. The lean connection packs the arguments straight
    /// into its outgoing buffer; the others are handed a `Cmd` made of them.
    pub(crate) async fn query_args<T: FromRedisValue>(
        &mut self,
        args: &[Arg<'_>],
        retried: &mut bool,
    ) -> RedisResult<T> {
        let value = match self {
            Conn::Wire(c) => wire_noting(c, |buf| resp::write_command(buf, args), retried).await,
            _ => {
                let cmd = command_of(args);
                // Boxed: the rare connections would otherwise set the size of every call's
                // future.
                Box::pin(self.request_noting(&cmd, retried)).await
            }
        }?;
        Ok(redis::from_redis_value(value.extract_error()?)?)
    }
}

/// Sends on the lean connection what `write` packs, once more when the connection broke
/// under it (it reconnects by itself), and then sets `retried`.
async fn wire_noting(
    c: &Wire,
    write: impl Fn(&mut Vec<u8>),
    retried: &mut bool,
) -> RedisResult<Value> {
    match c.request_with(&write).await {
        Err(e) if worth_one_retry(&e) => {
            *retried = true;
            c.request_with(&write).await
        }
        other => other,
    }
}

/// The command `args` as a `Cmd`, for a connection that takes nothing else.
pub(crate) fn command_of(args: &[Arg<'_>]) -> Cmd {
    let mut cmd = Cmd::with_capacity(args.len(), 0);
    for arg in args {
        cmd.arg(arg.to_vec());
    }
    cmd
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move { self.request_noting(cmd, &mut false).await })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Wire(c) => Box::pin(c.request_many(pipeline, offset, count)),
            Conn::Single(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Sentinel(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Wire(c) => c.db(),
            Conn::Single(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
            Conn::Sentinel(c) => c.get_db(),
        }
    }
}

/// The command connection for one call whose answer must tell "done by a send whose answer
/// was lost" from "never ours" (a release, an operator's forced release): it notes whether
/// the command was sent again after its connection broke. (A Cluster connection retries
/// inside the client, unseen here.)
pub(crate) struct NotingConn {
    conn: Conn,
    retried: bool,
}

impl Conn {
    pub(crate) fn noting_retries(&self) -> NotingConn {
        NotingConn {
            conn: self.clone(),
            retried: false,
        }
    }
}

impl NotingConn {
    /// True when a command went out again after its connection broke under it: the first
    /// send may have been carried out, its answer lost.
    pub(crate) fn retried(&self) -> bool {
        self.retried
    }
}

impl ConnectionLike for NotingConn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move { self.conn.request_noting(cmd, &mut self.retried).await })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        self.conn.req_packed_commands(pipeline, offset, count)
    }

    fn get_db(&self) -> i64 {
        self.conn.get_db()
    }
}

/// The subscription connection: plain SUBSCRIBE on one server; on a Cluster, sharded
/// SSUBSCRIBE where every node runs Redis 7.0 or newer, where the release channel lives in the
/// lock's own slot. Sharded pub/sub sends a release only to the shard that owns the slot,
/// instead of broadcasting every release over the cluster bus to every node as PUBLISH does;
/// the cluster connection re-subscribes by itself when the slot moves. A 6.2 Cluster has no
/// sharded pub/sub: its waiters subscribe classically, on any node, and hear the broadcast.
pub(crate) enum SubConn {
    Single(ConnectionManager),
    Cluster {
        conn: ClusterConnection,
        /// SSUBSCRIBE / SUNSUBSCRIBE rather than SUBSCRIBE / UNSUBSCRIBE.
        sharded: bool,
    },
}

impl SubConn {
    pub(crate) async fn subscribe(&mut self, channel: &str) -> RedisResult<()> {
        match self {
            SubConn::Single(c) => c.subscribe(channel).await,
            SubConn::Cluster {
                conn,
                sharded: true,
            } => conn.ssubscribe(channel).await,
            SubConn::Cluster {
                conn,
                sharded: false,
            } => conn.subscribe(channel).await,
        }
    }

    pub(crate) async fn unsubscribe(&mut self, channel: &str) -> RedisResult<()> {
        match self {
            SubConn::Single(c) => c.unsubscribe(channel).await,
            SubConn::Cluster {
                conn,
                sharded: true,
            } => conn.sunsubscribe(channel).await,
            SubConn::Cluster {
                conn,
                sharded: false,
            } => conn.unsubscribe(channel).await,
        }
    }
}

/// The Redis Cluster hash slot of a key (CRC16/XMODEM of its hash tag, mod 16384).
pub(crate) fn slot(key: &str) -> u16 {
    let bytes = key.as_bytes();
    let tagged = key
        .find('{')
        .and_then(|open| {
            let rest = &bytes[open + 1..];
            rest.iter()
                .position(|&b| b == b'}')
                .filter(|&close| close > 0)
                .map(|close| &rest[..close])
        })
        .unwrap_or(bytes);
    crc16_xmodem(tagged) % 16384
}

fn crc16_xmodem(data: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &byte in data {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

#[cfg(test)]
mod tests {
    use super::slot;

    #[test]
    fn slots_match_redis_cluster() {
        // Reference values from CLUSTER KEYSLOT.
        assert_eq!(slot("foo"), 12182);
        assert_eq!(slot("123456789"), 12739);
        assert_eq!(slot("lock:{foo}"), 12182);
        assert_eq!(slot("lock:{foo}:fence"), 12182);
        assert_eq!(slot("{}bar"), slot("{}bar"));
    }
}
