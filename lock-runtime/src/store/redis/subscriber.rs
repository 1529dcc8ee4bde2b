//! The subscriber side of a Redis store: one RESP3 connection per runtime whose pushes wake
//! waiters, owned by a task that performs every (un)subscription in order.

use std::collections::HashSet;
use std::sync::Arc;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{IntoConnectionInfo, ProtocolVersion, PushKind};
use tokio::sync::{mpsc, oneshot};

use super::super::ReleaseHub;
use super::super::conn::{SubConn, cluster_builder, open_client};
use super::super::sentinel::SentinelConn;
use super::super::{KeyNames, ReleaseWatch};
use super::{RedisBackend, RedisOptions, value_text};
use crate::{BackendError, LockError};

/// The shared subscription connection of one runtime (RESP3, pushes fed to the hub), owned by
/// its task; this is the way to talk to it.
pub(super) struct Subscriber {
    commands: mpsc::UnboundedSender<SubscriberCommand>,
}

impl RedisBackend {
    pub(crate) async fn watch_releases(&self, names: &KeyNames) -> Result<ReleaseWatch, LockError> {
        let (notify, first) = self.hub.watch(&names.channel);
        if first {
            self.subscribe(&names.channel)
                .await
                .map_err(|e| self.wait_error(names, e))?;
        }
        let Some(handle) = self.subscriber_handle() else {
            return Err(self.wait_error(names, None));
        };
        Ok(handle.watch(notify, &names.channel))
    }

    fn wait_error(&self, names: &KeyNames, e: Option<redis::RedisError>) -> LockError {
        match e {
            Some(e) => self.error(&format!("cannot wait for `{}`", names.key), e),
            None => BackendError::new(format!(
                "cannot wait for `{}`: the subscriber connection to `{}` has stopped",
                names.key, self.shown_url
            ))
            .into(),
        }
    }

    /// Subscribes this server's subscriber connection (started on first use) to `channel`;
    /// resolves once the server confirmed. `Err(None)`: the subscriber task is gone.
    async fn subscribe(&self, channel: &str) -> Result<(), Option<redis::RedisError>> {
        let subscriber = self
            .subscriber
            .get_or_try_init(|| self.start_subscriber())
            .await
            .map_err(Some)?;
        let (ack_tx, ack_rx) = oneshot::channel();
        subscriber
            .commands
            .send(SubscriberCommand::Subscribe(channel.to_owned(), ack_tx))
            .map_err(|_| None)?;
        match ack_rx.await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(Some(e)),
            Err(_) => Err(None),
        }
    }

    /// A handle on the running subscriber, if it was started.
    fn subscriber_handle(&self) -> Option<SubscriberHandle> {
        self.subscriber.get().map(|s| SubscriberHandle {
            commands: s.commands.clone(),
        })
    }

    /// Opens the runtime's one subscription connection and the task that owns it: it turns
    /// pushes into wake-ups and performs every (un)subscription in order, so a waiter arriving
    /// as the last one leaves can never be unsubscribed by mistake. The task ends when the
    /// backend is dropped.
    async fn start_subscriber(&self) -> Result<Subscriber, redis::RedisError> {
        let (push_tx, mut push_rx) = mpsc::unbounded_channel();
        let mut conn = if self.options.cluster {
            let client = cluster_builder(&self.options)
                .use_protocol(ProtocolVersion::RESP3)
                .push_sender(push_tx.clone())
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
            single_subscriber(&url, &self.options, push_tx.clone()).await?
        };
        // With Sentinel, a dropped subscriber connection may mean its server failed over and
        // died: the task then asks the sentinels for the master again and moves there.
        let follow = self
            .sentinel
            .clone()
            .map(|sentinel| (sentinel, self.options.clone(), push_tx));
        let (commands, mut command_rx) = mpsc::unbounded_channel::<SubscriberCommand>();
        let hub = Arc::downgrade(&self.hub);
        tokio::spawn(async move {
            // Channels watched when the connection dropped and not yet subscribed again. A
            // release published while a channel was unsubscribed went unheard, so its waiters
            // are woken once the (automatic) re-subscription is confirmed, not only at the
            // disconnection.
            let mut unconfirmed: HashSet<String> = HashSet::new();
            loop {
                tokio::select! {
                    push = push_rx.recv() => {
                        let Some(push) = push else { break };
                        let Some(hub) = hub.upgrade() else { break };
                        match push.kind {
                            PushKind::Message | PushKind::SMessage => {
                                if let Some(channel) = push.data.first() {
                                    hub.notify(&value_text(channel));
                                }
                            }
                            PushKind::Subscribe | PushKind::SSubscribe if !unconfirmed.is_empty() => {
                                if let Some(channel) = push.data.first() {
                                    let channel = value_text(channel);
                                    if unconfirmed.remove(&channel) {
                                        hub.notify(&channel);
                                    }
                                }
                            }
                            // Releases published while we were disconnected are lost: let every
                            // waiter retry now instead of sleeping out the lease's ttl.
                            PushKind::Disconnection => {
                                // Only what is watched now: a channel nobody waits on any
                                // more is not re-subscribed, and must not linger here.
                                unconfirmed = hub.channels().into_iter().collect();
                                hub.notify_all();
                                if let Some((sentinel, options, push_tx)) = &follow
                                    && let Some(moved) = resubscribe_at_master(sentinel, options, push_tx, &hub).await
                                {
                                    conn = moved;
                                }
                            }
                            _ => {}
                        }
                    }
                    command = command_rx.recv() => {
                        let Some(command) = command else { break };
                        let Some(hub) = hub.upgrade() else { break };
                        match command {
                            SubscriberCommand::Subscribe(channel, ack) => {
                                let _ = ack.send(conn.subscribe(&channel).await);
                            }
                            SubscriberCommand::Unsubscribe(channel) => {
                                // A waiter may have come back for it meanwhile.
                                if hub.forget_if_unwatched(&channel) {
                                    unconfirmed.remove(&channel);
                                    let _ = conn.unsubscribe(&channel).await;
                                }
                            }
                            SubscriberCommand::Requeue(channel) => {
                                // Redis delivers a message to subscribers in subscription order,
                                // so the first subscriber's waiters would always win the race
                                // for a released lock. Moving to the back after each win rotates
                                // the advantage between runtimes.
                                let _ = conn.unsubscribe(&channel).await;
                                let _ = conn.subscribe(&channel).await;
                                // A release published between the two was not heard: retry.
                                hub.notify(&channel);
                            }
                        }
                    }
                }
            }
        });
        Ok(Subscriber { commands })
    }
}

/// A cloneable way to ask a server's subscriber task to drop or rotate a subscription.
#[derive(Debug, Clone)]
pub(super) struct SubscriberHandle {
    commands: mpsc::UnboundedSender<SubscriberCommand>,
}

impl SubscriberHandle {
    fn unsubscribe(&self, channel: &str) {
        let _ = self
            .commands
            .send(SubscriberCommand::Unsubscribe(channel.to_owned()));
    }

    fn requeue(&self, channel: &str) {
        let _ = self
            .commands
            .send(SubscriberCommand::Requeue(channel.to_owned()));
    }

    /// A watch of `channel` on this subscriber that unsubscribes when dropped.
    fn watch(self, notify: Arc<tokio::sync::Notify>, channel: &str) -> ReleaseWatch {
        let on_drop = self.clone();
        let drop_channel = channel.to_owned();
        let requeue_channel = channel.to_owned();
        ReleaseWatch::new(
            notify,
            Some(Box::new(move || on_drop.unsubscribe(&drop_channel))),
        )
        .with_requeue(Box::new(move || self.requeue(&requeue_channel)))
    }
}

/// Work for the subscriber task.
#[derive(Debug)]
enum SubscriberCommand {
    Subscribe(String, oneshot::Sender<redis::RedisResult<()>>),
    Unsubscribe(String),
    Requeue(String),
}

/// A RESP3 subscription connection to one server, feeding `push_tx`.
async fn single_subscriber(
    url: &str,
    options: &RedisOptions,
    push_tx: mpsc::UnboundedSender<redis::PushInfo>,
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
        .set_push_sender(push_tx)
        .set_automatic_resubscription();
    Ok(SubConn::Single(
        ConnectionManager::new_with_config(client, config).await?,
    ))
}

/// Opens a subscription connection at the master the sentinels name now and subscribes it to
/// every channel someone waits on; `None` if that failed (the old connection keeps trying).
async fn resubscribe_at_master(
    sentinel: &SentinelConn,
    options: &RedisOptions,
    push_tx: &mpsc::UnboundedSender<redis::PushInfo>,
    hub: &ReleaseHub,
) -> Option<SubConn> {
    let url = sentinel.master_url().await.ok()?;
    let mut conn = single_subscriber(&url, options, push_tx.clone())
        .await
        .ok()?;
    for channel in hub.channels() {
        conn.subscribe(&channel).await.ok()?;
    }
    // Releases between the old connection's loss and now were not heard.
    hub.notify_all();
    tracing::debug!("subscriber moved to the master the sentinels name now");
    Some(conn)
}
