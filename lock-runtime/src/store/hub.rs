//! Fan-out of release notifications to the tasks waiting for a lock.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

use tokio::sync::Notify;

/// Maps a release channel to the waiters of that lock: the fan-out a [`LockStore`] needs for
/// [`watch_releases`](super::LockStore::watch_releases). Entries live as long as some
/// [`ReleaseWatch`] holds them.
///
/// [`LockStore`]: super::LockStore
#[derive(Debug, Default)]
pub struct ReleaseHub {
    channels: Mutex<HashMap<String, Weak<Notify>>>,
}

impl ReleaseHub {
    /// An empty hub.
    pub fn new() -> Self {
        Self::default()
    }

    /// A live watch on `channel`: [`notify`](Self::notify) of that channel wakes it from now
    /// on. Dropping the last watch of a channel forgets the channel.
    pub fn subscribe(self: &Arc<Self>, channel: &str) -> ReleaseWatch {
        let (notify, _first) = self.watch(channel);
        let hub = Arc::downgrade(self);
        let channel = channel.to_owned();
        ReleaseWatch::new(
            notify,
            Some(Box::new(move || {
                if let Some(hub) = hub.upgrade() {
                    hub.forget_if_unwatched(&channel);
                }
            })),
        )
    }

    /// Returns the notifier for `channel` and whether this is its first live watcher.
    pub(crate) fn watch(&self, channel: &str) -> (Arc<Notify>, bool) {
        let mut channels = lock(&self.channels);
        if let Some(existing) = channels.get(channel).and_then(Weak::upgrade) {
            return (existing, false);
        }
        let notify = Arc::new(Notify::new());
        channels.insert(channel.to_owned(), Arc::downgrade(&notify));
        (notify, true)
    }

    /// Wakes every task waiting on `channel`.
    pub fn notify(&self, channel: &str) {
        let target = {
            let mut channels = lock(&self.channels);
            match channels.get(channel).map(Weak::upgrade) {
                Some(Some(n)) => Some(n),
                Some(None) => {
                    channels.remove(channel);
                    None
                }
                None => None,
            }
        };
        if let Some(n) = target {
            n.notify_waiters();
        }
    }

    /// Wakes every waiter of every lock: used when the subscription connection dropped and
    /// releases may have been missed.
    pub fn notify_all(&self) {
        let mut targets: Vec<(String, Arc<Notify>)> = {
            let mut channels = lock(&self.channels);
            channels.retain(|_, w| w.strong_count() > 0);
            channels
                .iter()
                .filter_map(|(c, w)| Some((c.clone(), w.upgrade()?)))
                .collect()
        };
        // In channel order, not the map's: the same on every run of a simulation seed.
        targets.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        for (_, n) in targets {
            n.notify_waiters();
        }
    }

    /// Every channel someone watches now.
    pub(crate) fn channels(&self) -> Vec<String> {
        let mut channels = lock(&self.channels);
        channels.retain(|_, w| w.strong_count() > 0);
        channels.keys().cloned().collect()
    }

    /// True when someone watches `channel` now.
    pub(crate) fn is_watched(&self, channel: &str) -> bool {
        lock(&self.channels)
            .get(channel)
            .is_some_and(|w| w.strong_count() > 0)
    }

    /// True when nobody watches `channel` any more; the entry is dropped.
    pub(crate) fn forget_if_unwatched(&self, channel: &str) -> bool {
        let mut channels = lock(&self.channels);
        match channels.get(channel) {
            Some(w) if w.strong_count() > 0 => false,
            _ => {
                channels.remove(channel);
                true
            }
        }
    }
}

pub(super) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // The maps hold no invariant a panicking holder could break half-way.
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A live watch on one lock's releases, made by [`ReleaseHub::subscribe`]. Dropping it ends
/// the watch.
pub struct ReleaseWatch {
    pub(crate) notify: Arc<Notify>,
    on_drop: Option<Box<dyn FnOnce() + Send + Sync>>,
    on_requeue: Option<Box<dyn Fn() + Send + Sync>>,
}

impl std::fmt::Debug for ReleaseWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReleaseWatch").finish_non_exhaustive()
    }
}

impl ReleaseWatch {
    pub(crate) fn new(
        notify: Arc<Notify>,
        on_drop: Option<Box<dyn FnOnce() + Send + Sync>>,
    ) -> Self {
        ReleaseWatch {
            notify,
            on_drop,
            on_requeue: None,
        }
    }

    /// Sets what `requeue` does.
    pub(crate) fn with_requeue(mut self, f: Box<dyn Fn() + Send + Sync>) -> Self {
        self.on_requeue = Some(f);
        self
    }

    /// Takes out what `requeue` does, for a watch made of others (Redlock's) that keeps it
    /// while their watches live elsewhere.
    pub(crate) fn take_requeue(&mut self) -> Option<Box<dyn Fn() + Send + Sync>> {
        self.on_requeue.take()
    }

    /// After one of its waiters won the lock, gives the other runtimes' waiters the first
    /// chance at the next release (Redis: re-subscribe, moving to the back of the channel's
    /// delivery order). Does nothing for stores without delivery order.
    pub(crate) fn requeue(&self) {
        if let Some(f) = &self.on_requeue {
            f();
        }
    }
}

impl Drop for ReleaseWatch {
    fn drop(&mut self) {
        if let Some(f) = self.on_drop.take() {
            // Let go of our own handle first so the hook sees the true number of watchers.
            drop(std::mem::replace(&mut self.notify, Arc::new(Notify::new())));
            f();
        }
    }
}
