//! Waiting on ZooKeeper: a persistent watch on the record node of each lock someone waits
//! for. A release writes the record (free, or kept for min_hold): the event wakes the lock's
//! waiters, through the shared [`Subscriber`].

use std::collections::HashMap;
use std::sync::Arc;

use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use zookeeper_client::{AddWatchMode, EventType, SessionId, SessionState};

use super::record_path;
use super::session::Session;
use crate::LockError;
use crate::store::{PubSubConnection, PubSubEvent, ReleaseHub, Subscriber};

/// The subscriber of a store: its channels are the locks' `<record>:released` names.
pub(super) fn subscriber(session: Arc<Session>, hub: Arc<ReleaseHub>) -> Subscriber {
    let (events, events_rx) = mpsc::unbounded_channel();
    let conn = WatchConn {
        session,
        events,
        watches: HashMap::new(),
    };
    Subscriber::spawn(conn, events_rx, hub)
}

struct WatchConn {
    session: Arc<Session>,
    events: mpsc::UnboundedSender<PubSubEvent>,
    /// The task turning each watched channel's node events into reports, with the session
    /// its watch was made on; aborting it drops its watcher, which removes the watch.
    watches: HashMap<String, (JoinHandle<()>, SessionId)>,
}

impl WatchConn {
    async fn start(&mut self, channel: &str) -> Result<(), LockError> {
        let Some(record) = channel.strip_suffix(":released") else {
            return Err(LockError::config(format!(
                "`{channel}` is no release channel of this store"
            )));
        };
        let client = self.session.client();
        let mut watcher = client
            .watch(&record_path(record), AddWatchMode::Persistent)
            .await
            .map_err(|e| {
                self.session
                    .error(&format!("watching `{record}` failed"), e, &client)
            })?;
        let events = self.events.clone();
        let watched = channel.to_owned();
        let task = tokio::spawn(async move {
            let channel = watched;
            loop {
                let event = watcher.changed().await;
                let report = match (event.event_type, event.session_state) {
                    (EventType::Session, SessionState::SyncConnected) => {
                        // Events during the disconnection may be lost (ZOOKEEPER-4698): a
                        // renewed subscription wakes the channel's waiters.
                        PubSubEvent::Subscribed(channel.clone())
                    }
                    (EventType::Session, state) if state.is_terminated() => {
                        // No event comes after this one (and asking would panic).
                        let _ = events.send(PubSubEvent::Disconnected);
                        return;
                    }
                    (EventType::Session, _) => PubSubEvent::Disconnected,
                    _ => PubSubEvent::Message(channel.clone()),
                };
                if events.send(report).is_err() {
                    return;
                }
            }
        });
        if let Some((old, _)) = self
            .watches
            .insert(channel.to_owned(), (task, client.session_id()))
        {
            old.abort();
        }
        Ok(())
    }
}

impl Drop for WatchConn {
    fn drop(&mut self) {
        for (task, _) in self.watches.values() {
            task.abort();
        }
    }
}

impl PubSubConnection for WatchConn {
    async fn subscribe(&mut self, channel: &str) -> Result<(), LockError> {
        self.start(channel).await
    }

    async fn unsubscribe(&mut self, channel: &str) -> Result<(), LockError> {
        if let Some((task, _)) = self.watches.remove(channel) {
            task.abort();
        }
        Ok(())
    }

    /// After a disconnection: within one session the client renews its watches itself (each
    /// reports `Subscribed` again); a session that ended takes its watches with it, so they
    /// are made again on the new session, and every waiter is woken.
    async fn disconnected(&mut self, watched: &[String]) -> bool {
        let mut client = self.session.client();
        if client.state().is_terminated() {
            if let Err(e) = self.session.renew(&client).await {
                tracing::warn!(error = %e, "ZooKeeper: no new session yet");
            }
            client = self.session.client();
        }
        // Watches of a session that ended (the store may have replaced it already, on
        // another call's error) went with it: made again on the current one.
        let current = client.session_id();
        let lost: Vec<&String> = watched
            .iter()
            .filter(|channel| {
                self.watches
                    .get(*channel)
                    .is_none_or(|(task, session)| task.is_finished() || *session != current)
            })
            .collect();
        if lost.is_empty() {
            return false;
        }
        for channel in lost {
            if let Err(e) = self.start(channel).await {
                // Reported as ended, so the subscriber subscribes again (and keeps trying).
                tracing::debug!(channel = %channel, error = %e, "ZooKeeper: could not watch again yet");
                let _ = self.events.send(PubSubEvent::Unsubscribed(channel.clone()));
            }
        }
        true
    }
}
