//! The waiting side of a store whose release announcements arrive over a subscription
//! connection that can drop (Redis pub/sub; any store with a similar feed): one task per
//! connection performs every (un)subscription in order and turns what the connection reports
//! into wake-ups, so that no release is missed across a reconnect.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::sync::{Notify, mpsc, oneshot};

use super::{ReleaseHub, ReleaseWatch};
use crate::{BackendError, LockError};

/// What a subscription connection reports to its [`Subscriber`], in the order it happened.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum PubSubEvent {
    /// A release was announced on this channel.
    Message(String),
    /// The server confirmed a subscription to this channel: one the [`Subscriber`] asked for,
    /// or one the connection renewed by itself after reconnecting.
    Subscribed(String),
    /// The subscription to this channel ended: one the [`Subscriber`] asked to end, or one the
    /// server ended by itself (Redis Cluster ends the sharded subscriptions of a slot that
    /// moves to another node, by a failover or a resharding). A channel still watched is
    /// subscribed again, and its watchers are woken.
    Unsubscribed(String),
    /// The connection dropped: announcements may be lost until each channel is
    /// [`Subscribed`](PubSubEvent::Subscribed) again.
    Disconnected,
}

/// A subscription connection, driven by one [`Subscriber`] task: the only caller of these
/// methods, one at a time. After a drop, the connection reconnects and renews its
/// subscriptions by itself, reporting each as [`PubSubEvent::Subscribed`] (Redis clients do),
/// or does it in [`disconnected`](Self::disconnected).
pub trait PubSubConnection: Send + 'static {
    /// Subscribes to `channel`; resolves once the server confirmed.
    fn subscribe(&mut self, channel: &str) -> impl Future<Output = Result<(), LockError>> + Send;

    /// Ends the subscription to `channel`.
    fn unsubscribe(&mut self, channel: &str) -> impl Future<Output = Result<(), LockError>> + Send;

    /// Called after each [`PubSubEvent::Disconnected`], with every channel watched now. A
    /// connection that moves to another server (a Sentinel failover) subscribes there to
    /// `watched` and answers true; every waiter is then woken. The default answers false: the
    /// connection renews its own subscriptions and reports each.
    fn disconnected(&mut self, watched: &[String]) -> impl Future<Output = bool> + Send {
        let _ = watched;
        async { false }
    }
}

/// Work for the subscriber task.
#[derive(Debug)]
enum Command {
    Subscribe(String, oneshot::Sender<Result<(), LockError>>),
    Unsubscribe(String),
    Requeue(String),
}

/// The waiting side of one subscription connection: [`watch`](Self::watch) gives a
/// [`ReleaseWatch`] for [`LockStore::watch_releases`](super::LockStore::watch_releases), and a
/// task owned by this value keeps the subscriptions and wakes the watchers:
/// - an announced release wakes its channel's watchers;
/// - a dropped connection wakes every watcher (releases may have passed unheard), and so does
///   each channel's renewed subscription once confirmed: a release announced between the drop
///   and the renewal was lost, and nobody else would wake them before the holder's ttl;
/// - the first watcher of a channel subscribes, the last one gone unsubscribes, in order, so a
///   watcher that arrives as the last one leaves is never unsubscribed by mistake.
///
/// The task ends when this value and every watch it gave are dropped.
#[derive(Debug)]
pub struct Subscriber {
    commands: mpsc::UnboundedSender<Command>,
    hub: Arc<ReleaseHub>,
}

impl Subscriber {
    /// Starts the task for `conn`, whose reports arrive on `events`; it wakes the watchers
    /// through `hub` (which the store may also notify itself, for releases it makes locally).
    /// Call it inside a tokio runtime (it spawns the task; outside one it panics).
    pub fn spawn(
        conn: impl PubSubConnection,
        events: mpsc::UnboundedReceiver<PubSubEvent>,
        hub: Arc<ReleaseHub>,
    ) -> Self {
        let (commands, command_rx) = mpsc::unbounded_channel();
        tokio::spawn(run(conn, events, command_rx, Arc::downgrade(&hub)));
        Subscriber { commands, hub }
    }

    /// A live watch on `channel`: subscribed (the first watcher of a channel waits for the
    /// server's confirmation) and woken as described on [`Subscriber`]. Dropping the last
    /// watch of a channel unsubscribes it. A second watcher that arrives while the first one's
    /// subscribe is still unanswered returns at once; if that subscribe then fails, the second
    /// watch is not subscribed. The runtime never does this (one watch per lock per runtime);
    /// a store that watches one channel from several tasks should do the same.
    pub async fn watch(&self, channel: &str) -> Result<ReleaseWatch, LockError> {
        let (mut notify, first) = self.hub.watch(channel);
        if first {
            let (ack_tx, ack_rx) = oneshot::channel();
            self.commands
                .send(Command::Subscribe(channel.to_owned(), ack_tx))
                .map_err(|_| stopped())?;
            // Given up before the answer (the caller's timeout) or refused, the subscription
            // may be made all the same: the task then drops it unless someone watches.
            let undo = Undo {
                notify: Some(notify),
                unsubscribe: Some((self.commands.clone(), channel.to_owned())),
            };
            ack_rx.await.map_err(|_| stopped())??;
            notify = undo.disarm();
        }
        let on_drop = self.commands.clone();
        let on_requeue = self.commands.clone();
        let (drop_channel, requeue_channel) = (channel.to_owned(), channel.to_owned());
        Ok(ReleaseWatch::new(
            notify,
            Some(Box::new(move || {
                let _ = on_drop.send(Command::Unsubscribe(drop_channel));
            })),
        )
        .with_requeue(Box::new(move || {
            let _ = on_requeue.send(Command::Requeue(requeue_channel.clone()));
        })))
    }
}

/// A subscribe under way: dropped armed, it lets go of the watcher's notifier first and then
/// asks for the unsubscribe, which the task makes only if nobody watches the channel.
struct Undo {
    notify: Option<Arc<Notify>>,
    unsubscribe: Option<(mpsc::UnboundedSender<Command>, String)>,
}

impl Undo {
    /// The subscription stands: hands the notifier back.
    fn disarm(mut self) -> Arc<Notify> {
        self.unsubscribe = None;
        self.notify
            .take()
            .unwrap_or_else(|| Arc::new(Notify::new()))
    }
}

impl Drop for Undo {
    fn drop(&mut self) {
        drop(self.notify.take());
        if let Some((commands, channel)) = self.unsubscribe.take() {
            let _ = commands.send(Command::Unsubscribe(channel));
        }
    }
}

fn stopped() -> LockError {
    BackendError::new("the subscriber connection's task has stopped").into()
}

/// A (un)subscription that failed, to be made again later.
#[derive(Debug)]
enum Retry {
    Subscribe(String, u32),
    Unsubscribe(String, u32),
}

impl Retry {
    /// The channel and the direction (true: subscribe).
    fn what(&self) -> (String, bool) {
        match self {
            Retry::Subscribe(channel, _) => (channel.clone(), true),
            Retry::Unsubscribe(channel, _) => (channel.clone(), false),
        }
    }
}

/// How often a failed (un)subscription is made again, and the pause before the first retry
/// (doubling up to [`LAST_RETRY`]): some five minutes in all, so a subscription is not left
/// behind after an outage of that length, and the retries end.
const RETRIES: u32 = 150;
pub(crate) const FIRST_RETRY: Duration = Duration::from_millis(250);
pub(crate) const LAST_RETRY: Duration = Duration::from_secs(2);

/// The task's state besides the connection.
struct Task<C> {
    conn: C,
    /// Channels watched when the connection dropped and not yet confirmed again.
    unconfirmed: HashSet<String>,
    /// Unsubscribes this task sent whose end the connection has not reported yet, by channel:
    /// an end reported beyond them was the server's own doing. Emptied at a drop (the server
    /// forgot every subscription then), and when it grows large (a connection that never
    /// reports ends).
    ours: HashMap<String, u32>,
    retry: mpsc::UnboundedSender<Retry>,
    /// The retries scheduled and not yet made: one per channel and direction.
    waiting: HashSet<(String, bool)>,
}

/// Unsubscribes waiting for their report that [`Task::ours`] keeps at most.
const OURS_KEPT: usize = 10_000;

impl<C: PubSubConnection> Task<C> {
    async fn subscribe(&mut self, hub: &ReleaseHub, channel: &str, attempt: u32) {
        match self.conn.subscribe(channel).await {
            // A release announced while it was not subscribed was not heard.
            Ok(()) => hub.notify(channel),
            Err(e) => {
                tracing::debug!(channel, error = %e, "subscribing again failed; trying again later");
                hub.notify(channel);
                self.later(Retry::Subscribe(channel.to_owned(), attempt + 1), attempt);
            }
        }
    }

    async fn unsubscribe(&mut self, channel: &str, attempt: u32) {
        match self.conn.unsubscribe(channel).await {
            // Counted once it went through (its report is handled after this returns): one
            // that failed without reaching the server must not make a later end by the server
            // pass for ours.
            Ok(()) => {
                if self.ours.len() >= OURS_KEPT {
                    self.ours.clear();
                }
                *self.ours.entry(channel.to_owned()).or_default() += 1;
            }
            Err(e) => {
                // Left as it is, the connection would renew it at every reconnect for the life
                // of the process.
                tracing::debug!(channel, error = %e, "unsubscribing failed; trying again later");
                self.later(Retry::Unsubscribe(channel.to_owned(), attempt + 1), attempt);
            }
        }
    }

    /// Schedules `retry`, unless one for the same channel and direction is already waiting.
    fn later(&mut self, retry: Retry, attempt: u32) {
        if attempt >= RETRIES || !self.waiting.insert(retry.what()) {
            return;
        }
        let pause = FIRST_RETRY
            .saturating_mul(1 << attempt.min(4))
            .min(LAST_RETRY);
        let to = self.retry.clone();
        tokio::spawn(async move {
            tokio::time::sleep(pause).await;
            let _ = to.send(retry);
        });
    }

    async fn on_event(&mut self, hub: &ReleaseHub, event: PubSubEvent) {
        match event {
            PubSubEvent::Message(channel) => hub.notify(&channel),
            PubSubEvent::Subscribed(channel) => {
                if self.unconfirmed.remove(&channel) {
                    hub.notify(&channel);
                } else if !hub.is_watched(&channel) {
                    // Renewed by the connection for nobody (its unsubscribe failed, or came
                    // while it was down): end it.
                    self.unsubscribe(&channel, 0).await;
                }
            }
            PubSubEvent::Unsubscribed(channel) => {
                if let Some(pending) = self.ours.get_mut(&channel) {
                    *pending -= 1;
                    if *pending == 0 {
                        self.ours.remove(&channel);
                    }
                } else if hub.is_watched(&channel) {
                    tracing::debug!(
                        channel,
                        "the server ended a watched subscription; subscribing again"
                    );
                    self.subscribe(hub, &channel, 0).await;
                }
            }
            PubSubEvent::Disconnected => {
                // Only what is watched now: a channel nobody waits on any more is not
                // renewed, and must not linger here.
                let watched = hub.channels();
                self.unconfirmed = watched.iter().cloned().collect();
                self.ours.clear();
                hub.notify_all();
                if self.conn.disconnected(&watched).await {
                    self.unconfirmed.clear();
                    hub.notify_all();
                }
            }
        }
    }

    async fn on_command(&mut self, hub: &ReleaseHub, command: Command) {
        match command {
            Command::Subscribe(channel, ack) => {
                let _ = ack.send(self.conn.subscribe(&channel).await);
            }
            Command::Unsubscribe(channel) => {
                // A watcher may have come back for it meanwhile.
                if hub.forget_if_unwatched(&channel) {
                    self.unconfirmed.remove(&channel);
                    self.unsubscribe(&channel, 0).await;
                }
            }
            Command::Requeue(channel) => {
                // Redis delivers a message to subscribers in subscription order, so the first
                // subscriber's waiters would always win the race for a released lock. Moving
                // to the back after each win rotates the advantage between runtimes. (A
                // release announced between the two is not heard: the subscribe wakes its
                // watchers to look again.)
                self.unsubscribe(&channel, 0).await;
                self.subscribe(hub, &channel, 0).await;
            }
        }
    }

    async fn on_retry(&mut self, hub: &ReleaseHub, retry: Retry) {
        self.waiting.remove(&retry.what());
        match retry {
            Retry::Subscribe(channel, attempt) if hub.is_watched(&channel) => {
                self.subscribe(hub, &channel, attempt).await;
            }
            Retry::Unsubscribe(channel, attempt) if !hub.is_watched(&channel) => {
                self.unsubscribe(&channel, attempt).await;
            }
            // Watched again, or no longer: nothing left to do.
            _ => {}
        }
    }
}

/// The task: reports before commands at each turn (a fixed order, so a simulation replays).
async fn run(
    conn: impl PubSubConnection,
    mut events: mpsc::UnboundedReceiver<PubSubEvent>,
    mut commands: mpsc::UnboundedReceiver<Command>,
    hub: Weak<ReleaseHub>,
) {
    let (retry, mut retries) = mpsc::unbounded_channel();
    let mut task = Task {
        conn,
        unconfirmed: HashSet::new(),
        ours: HashMap::new(),
        retry,
        waiting: HashSet::new(),
    };
    loop {
        tokio::select! {
            biased;
            event = events.recv() => {
                let Some(event) = event else { break };
                let Some(hub) = hub.upgrade() else { break };
                task.on_event(&hub, event).await;
            }
            command = commands.recv() => {
                let Some(command) = command else { break };
                let Some(hub) = hub.upgrade() else { break };
                task.on_command(&hub, command).await;
            }
            Some(retry) = retries.recv() => {
                let Some(hub) = hub.upgrade() else { break };
                task.on_retry(&hub, retry).await;
            }
        }
    }
}
