//! The subscriber side of a Redis store: one RESP3 connection per runtime whose pushes are
//! turned into [`PubSubEvent`]s for the store's [`Subscriber`] task, which keeps the
//! subscriptions and wakes the waiters.

use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{IntoConnectionInfo, ProtocolVersion, PushInfo, PushKind};
use tokio::sync::mpsc;

use super::super::pubsub::{FIRST_RETRY, LAST_RETRY, PubSubConnection, PubSubEvent, Subscriber};
use super::super::{KeyNames, ReleaseWatch};
use super::RedisBackend;
use super::client::{cluster_builder, open_client};
use super::conn::SubConn;
use super::options::RedisOptions;
use super::reply::{redis_error, value_text};
use super::sentinel::SentinelConn;
use crate::LockError;

impl RedisBackend {
    pub(super) async fn subscribe_releases(
        &self,
        names: &KeyNames,
    ) -> Result<ReleaseWatch, LockError> {
        let subscriber = self
            .subscriber
            .get_or_try_init(|| self.start_subscriber())
            .await
            .map_err(|e| self.error(&format!("cannot wait for `{}`", names.key()), e))?;
        subscriber.watch(names.channel()).await
    }

    /// Opens the runtime's one subscription connection and hands it to a [`Subscriber`] task,
    /// which ends when the backend is dropped.
    async fn start_subscriber(&self) -> Result<Subscriber, redis::RedisError> {
        let (events, events_rx) = mpsc::unbounded_channel();
        let push = PushEvents(events);
        let conn = if self.options.is_cluster() {
            let client = cluster_builder(&self.options)
                .use_protocol(ProtocolVersion::RESP3)
                .push_sender(push.clone())
                .build()?;
            SubConn::Cluster {
                conn: client.get_async_connection().await?,
                sharded: self.sharded_pubsub,
            }
        } else {
            let url = match &self.sentinel {
                Some(sentinel) => sentinel.master_url().await?,
                None => self.options.urls.first().cloned().unwrap_or_default(),
            };
            single_subscriber(&url, &self.options, push.clone()).await?
        };
        // With Sentinel, a dropped subscriber connection may mean its server failed over and
        // died: the connection then asks the sentinels for the master again and moves there.
        let follow = self
            .sentinel
            .clone()
            .map(|sentinel| (sentinel, self.options.clone()));
        let conn = RedisPubSub {
            conn,
            follow,
            push,
            retry_in: FIRST_RETRY,
            command_timeout: self.options.command_timeout,
            secrets: self.secrets.clone(),
            shown_url: self.shown_url.clone(),
        };
        Ok(Subscriber::spawn(conn, events_rx, self.hub.clone()))
    }
}

/// Turns the connection's pushes into the subscriber task's events.
#[derive(Debug, Clone)]
struct PushEvents(mpsc::UnboundedSender<PubSubEvent>);

impl redis::aio::AsyncPushSender for PushEvents {
    fn send(&self, push: PushInfo) -> Result<(), redis::aio::SendError> {
        let channel = || push.data.first().map(value_text);
        let event = match push.kind {
            PushKind::Message | PushKind::SMessage => channel().map(PubSubEvent::Message),
            PushKind::Subscribe | PushKind::SSubscribe => channel().map(PubSubEvent::Subscribed),
            PushKind::Unsubscribe | PushKind::SUnsubscribe => {
                channel().map(PubSubEvent::Unsubscribed)
            }
            PushKind::Disconnection => Some(PubSubEvent::Disconnected),
            _ => None,
        };
        match event {
            Some(event) => self.0.send(event).map_err(|_| redis::aio::SendError),
            None => Ok(()),
        }
    }
}

// A subscriber connection that is not back after a drop is looked at again as a failed
// (un)subscription is made again: FIRST_RETRY at first, doubling up to LAST_RETRY.

/// The Redis subscription connection as the [`Subscriber`] task drives it.
struct RedisPubSub {
    conn: SubConn,
    follow: Option<(Arc<SentinelConn>, RedisOptions)>,
    /// Where the connection's pushes go; a look at a connection not back yet is scheduled
    /// there too, as another [`PubSubEvent::Disconnected`].
    push: PushEvents,
    /// The pause before the next look at a connection that is not back.
    retry_in: Duration,
    /// The bound on each (un)subscribe: the subscriber task does one thing at a time, and a
    /// call to a server that died must not hold it up (nor the reports behind it).
    command_timeout: Duration,
    secrets: Vec<String>,
    shown_url: String,
}

impl RedisPubSub {
    fn error(&self, context: &str, e: redis::RedisError) -> LockError {
        redis_error(&self.shown_url, &self.secrets, context, e)
    }
}

impl PubSubConnection for RedisPubSub {
    async fn subscribe(&mut self, channel: &str) -> Result<(), LockError> {
        let result = within(self.command_timeout, self.conn.subscribe(channel)).await;
        result.map_err(|e| self.error(&format!("subscribing to `{channel}` failed"), e))
    }

    async fn unsubscribe(&mut self, channel: &str) -> Result<(), LockError> {
        let result = within(self.command_timeout, self.conn.unsubscribe(channel)).await;
        result.map_err(|e| self.error(&format!("unsubscribing `{channel}` failed"), e))
    }

    /// With Sentinel, first moves to the master the sentinels name now and subscribes there.
    /// Otherwise (or when that fails) the connection must come back by itself: looked at with
    /// a PING, which also makes a client that gave up reconnecting (redis-rs stops after a
    /// few tries, some 6 s) try again, and looked at again a little later until it answers.
    /// A connection that cannot reconnect reports nothing more, so without this the waiters
    /// would hear no release until their holder's ttl after an outage of more than a few
    /// seconds, or after a Sentinel master crashed (the sentinels still name it at first:
    /// they call it down only after their down-after time, then elect).
    async fn disconnected(&mut self, watched: &[String]) -> bool {
        if let Some((sentinel, options)) = &self.follow
            && let Some(moved) = resubscribe_at_master(sentinel, options, &self.push, watched).await
        {
            self.conn = moved;
            self.retry_in = FIRST_RETRY;
            return true;
        }
        let SubConn::Single(single) = &mut self.conn else {
            // The cluster client reconnects each node and moves subscriptions with their slots
            // by itself (tested through a crash failover of a slot's master).
            return false;
        };
        let ping = redis::cmd("PING");
        if within(
            self.command_timeout,
            ping.query_async::<redis::Value>(single),
        )
        .await
        .is_ok()
        {
            // Back: it renews its subscriptions and reports each.
            self.retry_in = FIRST_RETRY;
            return false;
        }
        let (push, pause) = (self.push.clone(), self.retry_in);
        self.retry_in = (self.retry_in * 2).min(LAST_RETRY);
        tokio::spawn(async move {
            tokio::time::sleep(pause).await;
            // Still down as far as the waiters know: each try wakes them too, so they look at
            // the lock again meanwhile.
            let _ = push.0.send(PubSubEvent::Disconnected);
        });
        false
    }
}

/// `call`'s answer, or, when none came within `limit`, a timeout as redis-rs reports one
/// (an I/O error of kind `TimedOut`, transient).
async fn within<T>(
    limit: Duration,
    call: impl std::future::Future<Output = redis::RedisResult<T>>,
) -> redis::RedisResult<T> {
    tokio::time::timeout(limit, call).await.unwrap_or_else(|_| {
        Err(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            "no answer within the command timeout",
        )
        .into())
    })
}

/// A RESP3 subscription connection to one server, feeding `push`.
async fn single_subscriber(
    url: &str,
    options: &RedisOptions,
    push: PushEvents,
) -> Result<SubConn, redis::RedisError> {
    let info = url.into_connection_info()?;
    let settings = info
        .redis_settings()
        .clone()
        .set_protocol(ProtocolVersion::RESP3);
    let client = open_client(
        info.set_redis_settings(settings),
        options.tls_root_cert.as_deref(),
    )?;
    let config = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(options.connect_timeout))
        .set_response_timeout(Some(options.command_timeout))
        .set_push_sender(push)
        .set_automatic_resubscription();
    Ok(SubConn::Single(
        ConnectionManager::new_with_config(client, config).await?,
    ))
}

/// Opens a subscription connection at the master the sentinels name now and subscribes it to
/// every channel in `watched`; `None` if that failed (the old connection keeps trying).
async fn resubscribe_at_master(
    sentinel: &SentinelConn,
    options: &RedisOptions,
    push: &PushEvents,
    watched: &[String],
) -> Option<SubConn> {
    let url = sentinel.master_url().await.ok()?;
    // Bounded: the client would retry a dead server for seconds, holding up the subscriber.
    let open = single_subscriber(&url, options, push.clone());
    let mut conn = tokio::time::timeout(options.connect_timeout, open)
        .await
        .ok()?
        .ok()?;
    for channel in watched {
        conn.subscribe(channel).await.ok()?;
    }
    tracing::debug!("subscriber moved to the master the sentinels name now");
    Some(conn)
}
