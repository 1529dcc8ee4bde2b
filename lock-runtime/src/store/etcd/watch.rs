//! Waiting on etcd: one watch stream per runtime, carrying one etcd watch per lock that some
//! task of the runtime waits for, driven by the shared [`Subscriber`] task.
//!
//! A lock is free again when its record key is deleted (a release, an expiry, a forced
//! release) and worth asking about again when it is rewritten for min_hold (the holder
//! released early): both are events of the key's watch, and each becomes a message on the
//! lock's release channel. A watch is live once etcd answers `created`; events after that are
//! delivered in revision order, so a release after `watch_releases` returned is never missed.
//! When the stream breaks, the subscriber wakes every waiter, and the next use opens a new
//! stream and creates the watches again.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use etcd_client::{Client, EventType, WatchRequestSender, WatchResponseStream};
use tokio::sync::{mpsc, oneshot};

use super::{RELEASED, parse_value, unsent};
use crate::store::{PubSubConnection, PubSubEvent, ReleaseHub, Subscriber};
use crate::{BackendError, LockError};

/// The suffix of a lock's release channel after its record key (`KeyNames::channel`).
const CHANNEL_SUFFIX: &str = ":released";

/// Starts the subscriber of a runtime's etcd store.
pub(super) fn subscriber(client: Client, hub: Arc<ReleaseHub>, timeout: Duration) -> Subscriber {
    let (events, events_rx) = mpsc::unbounded_channel();
    let conn = WatchConn {
        client,
        timeout,
        sender: None,
        routes: Arc::new(Mutex::new(Routes::default())),
        watched: HashSet::new(),
        events,
    };
    Subscriber::spawn(conn, events_rx, hub)
}

/// Which etcd watch belongs to which channel, shared with the stream's reader task.
#[derive(Default)]
struct Routes {
    /// Creates sent and not yet answered, in order: etcd answers them in the order sent.
    pending: VecDeque<(String, oneshot::Sender<i64>)>,
    by_id: HashMap<i64, String>,
    by_channel: HashMap<String, i64>,
}

fn routes(shared: &Mutex<Routes>) -> MutexGuard<'_, Routes> {
    shared
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

struct WatchConn {
    client: Client,
    timeout: Duration,
    /// The open stream's request side; None until opened, and after it broke.
    sender: Option<WatchRequestSender>,
    routes: Arc<Mutex<Routes>>,
    /// Every channel subscribed now: created again on a new stream.
    watched: HashSet<String>,
    events: mpsc::UnboundedSender<PubSubEvent>,
}

fn record_of(channel: &str) -> &str {
    channel.strip_suffix(CHANNEL_SUFFIX).unwrap_or(channel)
}

fn watch_error(what: &str, e: impl std::fmt::Display) -> LockError {
    BackendError::transient(format!("etcd watch: {what}: {e}")).into()
}

impl WatchConn {
    /// Sends the create of `channel`'s watch on the open stream and waits for etcd's answer.
    async fn create(&mut self, channel: &str) -> Result<(), LockError> {
        let Some(sender) = self.sender.as_mut() else {
            return Err(watch_error("create", "no stream"));
        };
        let (created, answer) = oneshot::channel();
        routes(&self.routes)
            .pending
            .push_back((channel.to_owned(), created));
        sender
            .watch(record_of(channel), None)
            .await
            .map_err(|e| watch_error("create", e))?;
        match tokio::time::timeout(self.timeout, answer).await {
            Ok(Ok(_id)) => Ok(()),
            Ok(Err(_)) => Err(watch_error("create", "the stream ended")),
            Err(_) => Err(watch_error(
                "create",
                format!("no answer within {:?}", self.timeout),
            )),
        }
    }

    /// Opens a stream (its first watch is `first`'s) and starts its reader; then creates the
    /// watches of every other watched channel.
    async fn open(&mut self, first: &str) -> Result<(), LockError> {
        let (created, answer) = oneshot::channel();
        *routes(&self.routes) = Routes::default();
        routes(&self.routes)
            .pending
            .push_back((first.to_owned(), created));
        // Again on another endpoint while the connection could not be made (as the store's
        // calls do).
        let mut tries = 0;
        let stream = loop {
            match self.client.clone().watch(record_of(first), None).await {
                Ok(stream) => break stream,
                Err(e) if unsent(&e) && tries < 6 => tries += 1,
                Err(e) => return Err(watch_error("open", e)),
            }
        };
        let (sender, responses) = stream.split();
        self.sender = Some(sender);
        tokio::spawn(read(responses, self.routes.clone(), self.events.clone()));
        match tokio::time::timeout(self.timeout, answer).await {
            Ok(Ok(_)) => {}
            _ => {
                self.sender = None;
                return Err(watch_error("open", "no answer to the first watch"));
            }
        }
        let others: Vec<String> = self
            .watched
            .iter()
            .filter(|c| c.as_str() != first)
            .cloned()
            .collect();
        for channel in others {
            self.create(&channel).await?;
        }
        Ok(())
    }
}

impl PubSubConnection for WatchConn {
    async fn subscribe(&mut self, channel: &str) -> Result<(), LockError> {
        self.watched.insert(channel.to_owned());
        let done = if self.sender.is_some() {
            self.create(channel).await
        } else {
            self.open(channel).await
        };
        if done.is_err() {
            self.watched.remove(channel);
        }
        done
    }

    async fn unsubscribe(&mut self, channel: &str) -> Result<(), LockError> {
        self.watched.remove(channel);
        let id = {
            let mut routes = routes(&self.routes);
            let id = routes.by_channel.remove(channel);
            if let Some(id) = id {
                routes.by_id.remove(&id);
            }
            id
        };
        if let (Some(id), Some(sender)) = (id, self.sender.as_mut()) {
            sender
                .cancel(id)
                .await
                .map_err(|e| watch_error("cancel", e))?;
        }
        Ok(())
    }

    async fn disconnected(&mut self, watched: &[String]) -> bool {
        // A new stream with every watched channel's watch; the subscriber wakes every waiter
        // (releases may have passed while the stream was down). If the cluster does not
        // answer now, the next subscribe opens the stream; meanwhile waiters fall back on
        // their holders' ttl.
        self.sender = None;
        self.watched = watched.iter().cloned().collect();
        if let Some(first) = watched.first() {
            let first = first.clone();
            let _ = self.open(&first).await;
        }
        true
    }
}

/// The stream's reader: routes `created` answers to their creates and turns the record keys'
/// deletes and min_hold rewrites into messages; reports the stream's end as a disconnect.
async fn read(
    mut responses: WatchResponseStream,
    shared: Arc<Mutex<Routes>>,
    events: mpsc::UnboundedSender<PubSubEvent>,
) {
    while let Ok(Some(response)) = responses.message().await {
        let id = response.watch_id();
        if response.created() {
            let mut routes = routes(&shared);
            if let Some((channel, created)) = routes.pending.pop_front() {
                routes.by_id.insert(id, channel.clone());
                routes.by_channel.insert(channel, id);
                let _ = created.send(id);
            }
        }
        let channel = routes(&shared).by_id.get(&id).cloned();
        let Some(channel) = channel else { continue };
        let freed = response.events().iter().any(|event| {
            event.event_type() == EventType::Delete
                || event
                    .kv()
                    .and_then(|kv| parse_value(kv.value()))
                    .is_some_and(|(token, _, _)| token == RELEASED)
        });
        if freed && events.send(PubSubEvent::Message(channel)).is_err() {
            return;
        }
    }
    let _ = events.send(PubSubEvent::Disconnected);
}
