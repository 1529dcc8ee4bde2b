//! Waiting on a Redlock store: every member's release watch, forwarded into one.

use std::pin::Pin;
use std::sync::{Arc, Weak};

use tokio::sync::Notify;
use tokio::sync::futures::OwnedNotified;

use super::super::{KeyNames, ReleaseWatch};
use super::{RedlockBackend, joined};
use crate::{BackendError, LockError};

impl RedlockBackend {
    /// Watches releases on every member that accepts the watch; a release announced by any
    /// of them wakes the waiters. Each member's watch is forwarded by a small task of its own,
    /// listening from when that member's answer reached its fan-out task (not from when the
    /// slowest member answers). A release before the combined watch is returned is seen by
    /// the runtime's next attempt anyway; this only saves waiting for the holder's ttl.
    pub(super) async fn watch_members(&self, names: &KeyNames) -> Result<ReleaseWatch, LockError> {
        let notify = Arc::new(Notify::new());
        let answers = {
            let names = names.clone();
            let target = Arc::downgrade(&notify);
            self.fan_out(move |node| {
                let (names, target) = (names.clone(), target.clone());
                async move {
                    let mut watch = node.watch_releases(&names).await?;
                    let mut next = Box::pin(watch.notify.clone().notified_owned());
                    next.as_mut().enable();
                    let requeue = watch.take_requeue();
                    let forwarding = Forwarding {
                        next,
                        source: watch.notify.clone(),
                        target,
                        _watch: watch,
                    };
                    Ok((forwarding, requeue))
                }
            })
            .await
        };
        let mut forwarders = Vec::new();
        let mut requeues = Vec::new();
        let mut errors = Vec::new();
        for answer in answers {
            match answer {
                Ok((forwarding, requeue)) => {
                    requeues.extend(requeue);
                    forwarders.push(tokio::spawn(forward(forwarding)).abort_handle());
                }
                Err(e) => errors.push(e),
            }
        }
        if forwarders.is_empty() {
            // Transient unless every member refused for good: waiters keep waiting until
            // their deadline, as they do through one server's outage (found by the
            // simulation, seed 3: they gave up at once).
            let message = format!(
                "cannot wait for `{}`: no redlock member accepted the watch: {}",
                names.key(),
                joined(&errors)
            );
            return Err(if errors.iter().any(|e| e.transient) {
                BackendError::transient(message).into()
            } else {
                BackendError::new(message).into()
            });
        }
        Ok(ReleaseWatch::new(
            notify,
            Some(Box::new(move || {
                // Each task drops its member's watch as it ends, which unsubscribes there.
                for forwarder in &forwarders {
                    forwarder.abort();
                }
            })),
        )
        .with_requeue(Box::new(move || {
            for requeue in &requeues {
                requeue();
            }
        })))
    }
}

/// One member's watch and the handles on its notifier that forward its wake-ups. Fields drop
/// in order: the handles first, then the watch, so that the member's unsubscribe, which
/// happens only when nobody holds the notifier any more, is not skipped (also when the
/// combined watch is cancelled before its forwarding task starts).
struct Forwarding {
    next: Pin<Box<OwnedNotified>>,
    source: Arc<Notify>,
    target: Weak<Notify>,
    /// Kept for its drop: the member unsubscribes.
    _watch: ReleaseWatch,
}

/// Wakes the combined watch's waiters each time the member's watch wakes, until the combined
/// watch is gone (or this task is aborted). The next wake-up is listened for before the
/// current one is passed on.
async fn forward(mut f: Forwarding) {
    loop {
        f.next.as_mut().await;
        let mut following = Box::pin(f.source.clone().notified_owned());
        following.as_mut().enable();
        let Some(target) = f.target.upgrade() else {
            return;
        };
        target.notify_waiters();
        f.next = following;
    }
}
