//! The subscriber side of a Redis store: one RESP3 connection per runtime whose pushes are
//! turned into [`PubSubEvent`]s for the store's [`Subscriber`] task, which keeps the
//! subscriptions and wakes the waiters.

use std::sync::Arc;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{IntoConnectionInfo, ProtocolVersion, PushInfo, PushKind};
use tokio::sync::mpsc;

use super::super::conn::{SubConn, cluster_builder, open_client};
use super::super::pubsub::{PubSubConnection, PubSubEvent, Subscriber};
use super::super::sentinel::SentinelConn;
use super::super::{KeyNames, ReleaseWatch};
use super::{RedisBackend, RedisOptions, redis_error, value_text};
use crate::LockError;

impl RedisBackend {
    pub(crate) async fn watch_releases(&self, names: &KeyNames) -> Result<ReleaseWatch, LockError> {
        let subscriber = self
            .subscriber
            .get_or_try_init(|| self.start_subscriber())
            .await
            .map_err(|e| self.error(&format!("cannot wait for `{}`", names.key), e))?;
        subscriber.watch(&names.channel).await
    }

    /// Opens the runtime's one subscription connection and hands it to a [`Subscriber`] task,
    /// which ends when the backend is dropped.
    async fn start_subscriber(&self) -> Result<Subscriber, redis::RedisError> {
        let (events, events_rx) = mpsc::unbounded_channel();
        let push = PushEvents(events);
        let conn = if self.options.cluster {
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
            .map(|sentinel| (sentinel, self.options.clone(), push));
        let conn = RedisPubSub {
            conn,
            follow,
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
            PushKind::Disconnection => Some(PubSubEvent::Disconnected),
            _ => None,
        };
        match event {
            Some(event) => self.0.send(event).map_err(|_| redis::aio::SendError),
            None => Ok(()),
        }
    }
}

/// The Redis subscription connection as the [`Subscriber`] task drives it.
struct RedisPubSub {
    conn: SubConn,
    follow: Option<(Arc<SentinelConn>, RedisOptions, PushEvents)>,
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
        let result = self.conn.subscribe(channel).await;
        result.map_err(|e| self.error(&format!("subscribing to `{channel}` failed"), e))
    }

    async fn unsubscribe(&mut self, channel: &str) -> Result<(), LockError> {
        let result = self.conn.unsubscribe(channel).await;
        result.map_err(|e| self.error(&format!("unsubscribing `{channel}` failed"), e))
    }

    /// With Sentinel: moves to the master the sentinels name now and subscribes there.
    async fn disconnected(&mut self, watched: &[String]) -> bool {
        let Some((sentinel, options, push)) = &self.follow else {
            return false;
        };
        match resubscribe_at_master(sentinel, options, push, watched).await {
            Some(moved) => {
                self.conn = moved;
                true
            }
            None => false,
        }
    }
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
    let mut conn = single_subscriber(&url, options, push.clone()).await.ok()?;
    for channel in watched {
        conn.subscribe(channel).await.ok()?;
    }
    tracing::debug!("subscriber moved to the master the sentinels name now");
    Some(conn)
}
