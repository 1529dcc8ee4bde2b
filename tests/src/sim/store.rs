//! The client side of the simulated world: one runtime's connection to one simulated master
//! (or, with several, to one member of a Redlock quorum), through the public `LockStore`
//! trait.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use lock_runtime::store::{
    AcquireOutcome, AcquireRequest, ExtendItem, KeyNames, LockStore, RecordView, ReleaseHub,
    ReleaseOutcome, ReleaseWatch, Renewal, Subscriber,
};
use lock_runtime::{BackendError, LockError};
use tokio::time::Instant;

use super::history::FaultKind;
use super::pubsub::SimPubSub;
use super::world::{Fate, OwnedAcquire, OwnedRelease, World, lock};

/// One runtime's connection to the simulated world: commands, and a subscriber connection
/// driven by the runtime's own [`Subscriber`] task.
#[derive(Debug, Clone)]
pub struct SimStore {
    line: Line,
    subscriber: Arc<Subscriber>,
}

/// Who talks to which deployment.
#[derive(Debug, Clone)]
pub(super) struct Line {
    pub(super) world: Arc<Mutex<World>>,
    pub(super) client: usize,
    pub(super) node: usize,
}

impl SimStore {
    /// Client number `client` of `world`, talking to its deployment number `node`. Starts
    /// the client's subscriber there (inside a tokio runtime).
    pub fn new(world: Arc<Mutex<World>>, client: usize, node: usize) -> Self {
        let line = Line {
            world,
            client,
            node,
        };
        let events = lock(&line.world).open_line(client, node);
        let subscriber = Subscriber::spawn(
            SimPubSub::new(line.clone()),
            events,
            Arc::new(ReleaseHub::new()),
        );
        SimStore {
            line,
            subscriber: Arc::new(subscriber),
        }
    }

    async fn call<T: Send + std::fmt::Debug + 'static>(
        &self,
        what: String,
        tokens: Vec<String>,
        op: impl FnOnce(&mut World, usize, Instant) -> T + Send + 'static,
    ) -> Result<T, LockError> {
        self.line.call(what, tokens, op).await
    }
}

impl Line {
    /// Sends `op` to the master of this line's deployment. The request travels on its own
    /// (it lands even if the caller gives up), is applied at arrival, and the reply travels
    /// back; the caller waits at most the world's timeout.
    pub(super) async fn call<T: Send + std::fmt::Debug + 'static>(
        &self,
        what: String,
        tokens: Vec<String>,
        op: impl FnOnce(&mut World, usize, Instant) -> T + Send + 'static,
    ) -> Result<T, LockError> {
        let sent = Instant::now();
        let ended = {
            let world = lock(&self.world);
            world.ended[self.client].then_some(world.timeout)
        };
        if let Some(timeout) = ended {
            tokio::time::sleep(timeout).await;
            return Err(no_answer(timeout));
        }
        let (plan, timeout, arrival) = {
            let mut world = lock(&self.world);
            let plan = world.plan();
            let last = &mut world.last_arrival[self.client][self.node];
            let arrival = (sent + plan.there).max(*last);
            *last = arrival;
            (plan, world.timeout, arrival)
        };
        let (tx, rx) = tokio::sync::oneshot::channel();
        let world = self.world.clone();
        let (client, node) = (self.client, self.node);
        tokio::spawn(async move {
            tokio::time::sleep_until(arrival).await;
            let now = Instant::now();
            let answer = {
                let mut w = lock(&world);
                if !w.reachable(client, node, now) {
                    w.history
                        .call_fault(Some(client), now, FaultKind::Unreachable, tokens);
                    return;
                }
                if plan.fate == Fate::Dropped {
                    w.history
                        .call_fault(Some(client), now, FaultKind::DroppedRequest, tokens);
                    return;
                }
                w.replicate(node, now);
                let answer = op(&mut w, node, now);
                if w.history.tracing {
                    let line = format!("client {client} @{node}: {what} -> {answer:?}");
                    w.history.trace(now, line);
                }
                let kind = match plan.fate {
                    Fate::LostReply => Some(FaultKind::LostReply),
                    Fate::Slow => Some(FaultKind::SlowReply),
                    Fate::Sluggish => Some(FaultKind::Sluggish),
                    Fate::Normal | Fate::Dropped => None,
                };
                if let Some(kind) = kind {
                    w.history.call_fault(Some(client), now, kind, tokens);
                }
                if plan.fate == Fate::LostReply {
                    return;
                }
                answer
            };
            tokio::time::sleep(plan.back).await;
            let _ = tx.send(answer);
        });
        let deadline = sent + timeout;
        match tokio::time::timeout_at(deadline, rx).await {
            Ok(Ok(answer)) => Ok(answer),
            Ok(Err(_)) => {
                // No answer is coming: the client learns it at its timeout.
                tokio::time::sleep_until(deadline).await;
                Err(no_answer(timeout))
            }
            Err(_) => Err(no_answer(timeout)),
        }
    }
}

fn no_answer(timeout: Duration) -> LockError {
    LockError::Backend(BackendError::transient(format!(
        "simulated store: no answer within {timeout:?}"
    )))
}

impl LockStore for SimStore {
    async fn acquire(&self, r: AcquireRequest<'_>) -> Result<AcquireOutcome, LockError> {
        let owned = OwnedAcquire {
            key: r.names.key().to_owned(),
            record: r.names.record().to_owned(),
            fence: r.names.fence().to_owned(),
            done: r.names.done().to_owned(),
            token: r.token.to_owned(),
            owner: r.owner.to_owned(),
            ttl: r.ttl,
            min_hold: r.min_hold,
            once: r.once,
            sent: Instant::now(),
        };
        let client = self.line.client;
        let what = format!(
            "acquire {} {}",
            owned.key,
            &owned.token[..6.min(owned.token.len())]
        );
        let tokens = vec![owned.token.clone()];
        self.call(what, tokens, move |w, node, now| {
            w.acquire(client, node, &owned, now)
        })
        .await
    }

    async fn release(
        &self,
        names: &KeyNames,
        token: &str,
        done_retention: Option<Duration>,
    ) -> Result<ReleaseOutcome, LockError> {
        let owned = OwnedRelease {
            record: names.record().to_owned(),
            done: names.done().to_owned(),
            channel: names.channel().to_owned(),
            token: token.to_owned(),
            done_retention,
        };
        let what = format!(
            "release {} {}",
            owned.record,
            &owned.token[..6.min(owned.token.len())]
        );
        let tokens = vec![owned.token.clone()];
        self.call(what, tokens, move |w, node, now| {
            w.release(node, &owned, now)
        })
        .await
    }

    async fn extend(&self, items: &[ExtendItem]) -> Result<Vec<Renewal>, LockError> {
        let items = items.to_vec();
        let what = format!("extend {} items", items.len());
        let tokens = items.iter().map(|i| i.token.clone()).collect();
        self.call(what, tokens, move |w, node, now| {
            w.extend(node, &items, now)
        })
        .await
    }

    async fn inspect(&self, names: &KeyNames) -> Result<Option<RecordView>, LockError> {
        let record = names.record().to_owned();
        self.call(
            format!("inspect {record}"),
            Vec::new(),
            move |w, node, now| w.inspect(node, &record, now),
        )
        .await
    }

    async fn watch_releases(&self, names: &KeyNames) -> Result<ReleaseWatch, LockError> {
        self.subscriber.watch(names.channel()).await
    }

    // The simulation checks locking under faults; operators' calls are tested on the real
    // stores (the kit's list_and_force_release, lockctl's end-to-end tests).
    async fn list(&self, _: &str, _: &str) -> Result<Vec<(String, RecordView)>, LockError> {
        Err(BackendError::new("the simulated store does not model listing").into())
    }

    async fn force_release(&self, _: &KeyNames, _: u64) -> Result<bool, LockError> {
        Err(BackendError::new("the simulated store does not model forced releases").into())
    }

    async fn raise_fence(
        &self,
        names: &KeyNames,
        token: &str,
        fence: u64,
        _ttl: Duration,
    ) -> Result<bool, LockError> {
        let (record, counter, token) = (
            names.record().to_owned(),
            names.fence().to_owned(),
            token.to_owned(),
        );
        let what = format!("raise fence {record} to {fence}");
        let tokens = vec![token.clone()];
        self.call(what, tokens, move |w, node, now| {
            w.raise_fence(node, &record, &counter, &token, fence, now)
        })
        .await
    }
}
