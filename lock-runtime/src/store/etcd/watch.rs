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
use tokio::task::JoinHandle;

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
        stream: None,
        watched: HashSet::new(),
        events,
    };
    Subscriber::spawn(conn, events_rx, hub)
}

/// How long after a failed reopen of the stream it is tried again.
const REOPEN_AFTER: Duration = Duration::from_secs(1);

/// Which etcd watch of one stream belongs to which channel, shared with that stream's reader
/// task (a new stream gets new routes: watch ids start again at 0 on each).
#[derive(Default)]
struct Routes {
    /// Creates sent and not yet answered, in order: etcd answers them in the order sent.
    pending: VecDeque<(String, oneshot::Sender<Result<i64, String>>)>,
    by_id: HashMap<i64, String>,
    by_channel: HashMap<String, i64>,
}

fn routes(shared: &Mutex<Routes>) -> MutexGuard<'_, Routes> {
    shared
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// One open watch stream: its request side, its routes and its reader task.
struct Stream {
    sender: WatchRequestSender,
    routes: Arc<Mutex<Routes>>,
    reader: JoinHandle<()>,
}

impl Drop for Stream {
    fn drop(&mut self) {
        // A stream given up on (its open timed out, it broke, its watches were cancelled)
        // must not route anything any more, even if etcd still answers on it.
        self.reader.abort();
    }
}

struct WatchConn {
    client: Client,
    timeout: Duration,
    /// The open stream; None until opened, and after it broke.
    stream: Option<Stream>,
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
    /// Waits for etcd's answer to a create: the watch id, or why it was refused.
    async fn created(
        &self,
        answer: oneshot::Receiver<Result<i64, String>>,
    ) -> Result<i64, LockError> {
        match tokio::time::timeout(self.timeout, answer).await {
            Ok(Ok(Ok(id))) => Ok(id),
            Ok(Ok(Err(why))) => Err(watch_error("create refused", why)),
            Ok(Err(_)) => Err(watch_error("create", "the stream ended")),
            Err(_) => Err(watch_error(
                "create",
                format!("no answer within {:?}", self.timeout),
            )),
        }
    }

    /// Sends the create of `channel`'s watch on the open stream and waits for etcd's answer.
    async fn create(&mut self, channel: &str) -> Result<(), LockError> {
        let Some(stream) = self.stream.as_mut() else {
            return Err(watch_error("create", "no stream"));
        };
        let (created, answer) = oneshot::channel();
        routes(&stream.routes)
            .pending
            .push_back((channel.to_owned(), created));
        stream
            .sender
            .watch(record_of(channel), None)
            .await
            .map_err(|e| watch_error("create", e))?;
        self.created(answer).await.map(|_| ())
    }

    /// Opens a stream (its first watch is `first`'s) and starts its reader; then creates the
    /// watches of every other watched channel. Any failure leaves no stream.
    async fn open(&mut self, first: &str) -> Result<(), LockError> {
        self.stream = None;
        let shared = Arc::new(Mutex::new(Routes::default()));
        let (created, answer) = oneshot::channel();
        routes(&shared)
            .pending
            .push_back((first.to_owned(), created));
        // Again on another endpoint while the connection could not be made (as the store's
        // calls do).
        let mut tries = 0;
        let opened = loop {
            match self.client.clone().watch(record_of(first), None).await {
                Ok(opened) => break opened,
                Err(e) if unsent(&e) && tries < 6 => tries += 1,
                Err(e) => return Err(watch_error("open", e)),
            }
        };
        let (sender, responses) = opened.split();
        let reader = tokio::spawn(read(responses, shared.clone(), self.events.clone()));
        self.stream = Some(Stream {
            sender,
            routes: shared,
            reader,
        });
        let others: Vec<String> = self
            .watched
            .iter()
            .filter(|c| c.as_str() != first)
            .cloned()
            .collect();
        let done = async {
            self.created(answer).await?;
            for channel in others {
                self.create(&channel).await?;
            }
            Ok(())
        }
        .await;
        if done.is_err() {
            self.stream = None;
        }
        done
    }

    /// Reports the stream broken again after a pause, so that the subscriber calls
    /// [`disconnected`](PubSubConnection::disconnected) once more: a reopen that failed is
    /// retried until it works (or nothing is watched).
    fn reopen_later(&self) {
        let events = self.events.clone();
        tokio::spawn(async move {
            tokio::time::sleep(REOPEN_AFTER).await;
            let _ = events.send(PubSubEvent::Disconnected);
        });
    }
}

impl PubSubConnection for WatchConn {
    async fn subscribe(&mut self, channel: &str) -> Result<(), LockError> {
        // Already watched on this stream: a rebuild that ran between the watcher's arrival
        // and this call created it (a second watch would be left behind by the unsubscribe).
        if let Some(stream) = &self.stream
            && routes(&stream.routes).by_channel.contains_key(channel)
        {
            self.watched.insert(channel.to_owned());
            return Ok(());
        }
        self.watched.insert(channel.to_owned());
        let done = if self.stream.is_some() {
            self.create(channel).await
        } else {
            self.open(channel).await
        };
        if done.is_err() {
            self.watched.remove(channel);
            if self.stream.is_some() {
                // A live stream that could not take a watch (no answer, a refusal): rebuild
                // it, with every other watch.
                self.stream = None;
                let _ = self.events.send(PubSubEvent::Disconnected);
            }
        }
        done
    }

    async fn unsubscribe(&mut self, channel: &str) -> Result<(), LockError> {
        self.watched.remove(channel);
        let Some(stream) = self.stream.as_mut() else {
            return Ok(());
        };
        let id = {
            let mut routes = routes(&stream.routes);
            let id = routes.by_channel.remove(channel);
            if let Some(id) = id {
                routes.by_id.remove(&id);
            }
            id
        };
        if let Some(id) = id {
            stream
                .sender
                .cancel(id)
                .await
                .map_err(|e| watch_error("cancel", e))?;
        }
        Ok(())
    }

    async fn disconnected(&mut self, watched: &[String]) -> bool {
        // A new stream with every watched channel's watch; the subscriber wakes every waiter
        // (releases may have passed while the stream was down). If the cluster does not
        // answer now, try again shortly; meanwhile waiters fall back on their holders' ttl.
        self.stream = None;
        self.watched = watched.iter().cloned().collect();
        if let Some(first) = watched.first()
            && self.open(&first.clone()).await.is_err()
        {
            self.reopen_later();
        }
        true
    }
}

/// The stream's reader: routes `created` answers to their creates and turns the record keys'
/// deletes and min_hold rewrites into messages. The stream's end, and a watch etcd cancels
/// by itself (compaction, an expired auth token, a member that lost its leader), are reported
/// as a disconnect: every waiter is woken and the stream rebuilt.
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
                if response.canceled() {
                    // Refused (etcd answers created and canceled at once).
                    let _ = created.send(Err(response.cancel_reason().to_owned()));
                    continue;
                }
                routes.by_id.insert(id, channel.clone());
                routes.by_channel.insert(channel, id);
                let _ = created.send(Ok(id));
            }
        }
        let channel = routes(&shared).by_id.get(&id).cloned();
        let Some(channel) = channel else { continue };
        if response.canceled() {
            // Not by us: an unsubscribe forgets the route before it cancels.
            break;
        }
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
