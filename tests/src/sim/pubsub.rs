//! Simulated subscriber connections: what the server delivers to each client, connections
//! that drop and come back (renewing their subscriptions by themselves, as Redis clients do),
//! and announcements lost in between. The runtime's own `Subscriber` task drives them.

use std::collections::BTreeSet;

use lock_runtime::BackendError;
use lock_runtime::LockError;
use lock_runtime::store::{PubSubConnection, PubSubEvent};
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::history::FaultKind;
use super::store::Line;
use super::world::World;

/// One client's subscriber connection to one deployment.
#[derive(Debug, Default)]
pub(super) struct SubLine {
    events: Option<mpsc::UnboundedSender<PubSubEvent>>,
    /// What the client subscribed to: renewed by the connection itself after a reconnect.
    wanted: BTreeSet<String>,
    /// What the server delivers on this connection now.
    delivered: BTreeSet<String>,
    down: bool,
}

impl SubLine {
    fn send(&self, event: PubSubEvent) {
        if let Some(events) = &self.events {
            let _ = events.send(event);
        }
    }
}

impl World {
    /// The events of `client`'s subscriber connection to `node`, for its `Subscriber`.
    pub(super) fn open_line(
        &mut self,
        client: usize,
        node: usize,
    ) -> mpsc::UnboundedReceiver<PubSubEvent> {
        let (tx, rx) = mpsc::unbounded_channel();
        self.subs[client][node].events = Some(tx);
        rx
    }

    /// A release announced by `node`: delivered to every client subscribed there whose
    /// connection is up (pub/sub is not replayed: anyone else misses it).
    pub(super) fn publish(&self, node: usize, now: Instant, channel: &str) {
        for (client, lines) in self.subs.iter().enumerate() {
            let line = &lines[node];
            if now >= self.partitioned_until[client]
                && !line.down
                && line.delivered.contains(channel)
            {
                line.send(PubSubEvent::Message(channel.to_owned()));
            }
        }
    }

    /// A SUBSCRIBE arriving at `node`: false if the connection is down.
    fn line_subscribe(&mut self, client: usize, node: usize, channel: &str, now: Instant) -> bool {
        let line = &mut self.subs[client][node];
        if line.down {
            return false;
        }
        line.wanted.insert(channel.to_owned());
        line.delivered.insert(channel.to_owned());
        self.history.wakeups.subscribed(client, node, channel, now);
        true
    }

    fn line_unsubscribe(&mut self, client: usize, node: usize, channel: &str, now: Instant) {
        let line = &mut self.subs[client][node];
        line.wanted.remove(channel);
        line.delivered.remove(channel);
        self.history
            .wakeups
            .unsubscribed(client, node, channel, now);
    }

    /// The connection drops (a fault of its own, or the client cut off): the server forgets
    /// its subscriptions and the client hears of it at once.
    pub(super) fn drop_line(&mut self, client: usize, node: usize, now: Instant) {
        let line = &mut self.subs[client][node];
        if line.down {
            return;
        }
        line.down = true;
        line.delivered.clear();
        line.send(PubSubEvent::Disconnected);
        self.history.wakeups.outage_start(client, node, now);
    }

    /// Only `client`'s subscriber connection to `node` drops; it reconnects by itself when
    /// [`reconnect_subscriber`](Self::reconnect_subscriber) is called.
    pub fn drop_subscriber(&mut self, client: usize, node: usize, now: Instant) {
        self.history
            .fault(Some(client), now, FaultKind::SubscriberDrop);
        self.drop_line(client, node, now);
    }

    /// The connection is back and renews every subscription it had, each confirmed to the
    /// client; while the client is cut off, it stays down.
    pub fn reconnect_subscriber(&mut self, client: usize, node: usize, now: Instant) {
        if now < self.partitioned_until[client] {
            return;
        }
        let line = &mut self.subs[client][node];
        if !line.down {
            return;
        }
        line.down = false;
        line.delivered = line.wanted.clone();
        for channel in &line.wanted {
            line.send(PubSubEvent::Subscribed(channel.clone()));
        }
        self.history.wakeups.outage_end(client, node, now);
    }
}

/// A client's subscriber connection as its `Subscriber` task drives it: each (un)subscribe is
/// a call through the simulated network.
#[derive(Debug)]
pub(super) struct SimPubSub {
    line: Line,
}

impl SimPubSub {
    pub(super) fn new(line: Line) -> Self {
        SimPubSub { line }
    }
}

impl PubSubConnection for SimPubSub {
    async fn subscribe(&mut self, channel: &str) -> Result<(), LockError> {
        let owned = channel.to_owned();
        let client = self.line.client;
        let up = self
            .line
            .call(
                format!("subscribe {channel}"),
                Vec::new(),
                move |w, node, now| w.line_subscribe(client, node, &owned, now),
            )
            .await?;
        if up {
            Ok(())
        } else {
            Err(BackendError::transient("simulated subscriber connection is down").into())
        }
    }

    async fn unsubscribe(&mut self, channel: &str) -> Result<(), LockError> {
        let owned = channel.to_owned();
        let client = self.line.client;
        self.line
            .call(
                format!("unsubscribe {channel}"),
                Vec::new(),
                move |w, node, now| w.line_unsubscribe(client, node, &owned, now),
            )
            .await
    }
}
