//! Redlock: one lock across N independent Redis masters, held when a quorum (N/2 + 1) granted
//! it within its validity. Each node runs the same scripts as a standalone server; this module
//! fans the calls out in parallel, each bounded by a short per-node timeout, and counts.

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinSet;
use tokio::time::Instant;

use super::listing::{LIST_TIMEOUT, combine_masters, combine_one};
use super::redis::SubscriberHandle;
use super::{
    AcquireOutcome, ExtendItem, KeyNames, RecordView, RedisBackend, RedisOptions, ReleaseHub,
    ReleaseOutcome, ReleaseWatch, Renewal,
};
use crate::config::{drift, jitter};
use crate::{BackendError, LockError};

/// The default bound on one node's answer.
pub(crate) const DEFAULT_NODE_TIMEOUT: Duration = Duration::from_millis(250);

/// A lock store made of independent masters.
pub(crate) struct RedlockBackend {
    nodes: Vec<Arc<RedisBackend>>,
    quorum: usize,
    node_timeout: Duration,
    hub: Arc<ReleaseHub>,
}

impl std::fmt::Debug for RedlockBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let urls: Vec<&str> = self.nodes.iter().map(|n| n.shown_url()).collect();
        f.debug_struct("RedlockBackend")
            .field("nodes", &urls)
            .field("quorum", &self.quorum)
            .finish_non_exhaustive()
    }
}

/// One node's answer, or why there is none.
type NodeResult<T> = Result<T, String>;

impl RedlockBackend {
    /// Connects to every node; builds when at least a quorum answers (the others connect
    /// lazily and count again once they are back).
    pub(crate) async fn connect(
        urls: Vec<String>,
        connect_timeout: Duration,
        command_timeout: Duration,
        node_timeout: Duration,
        tls_root_cert: Option<Vec<u8>>,
    ) -> Result<Self, LockError> {
        if urls.len() < 3 {
            return Err(LockError::config(format!(
                "redlock needs at least 3 independent masters, got {}; use .redis(url) for one server",
                urls.len()
            )));
        }
        let hub = Arc::new(ReleaseHub::default());
        let mut connecting = JoinSet::new();
        for (i, url) in urls.into_iter().enumerate() {
            let hub = hub.clone();
            let tls_root_cert = tls_root_cert.clone();
            connecting.spawn(async move {
                let mut options = RedisOptions::single(url, connect_timeout, command_timeout);
                options.tls_root_cert = tls_root_cert;
                (i, RedisBackend::connect_with(options, hub, true).await)
            });
        }
        let mut slots: Vec<Option<Arc<RedisBackend>>> = Vec::new();
        let mut down = Vec::new();
        while let Some(joined) = connecting.join_next().await {
            let (i, result) = joined.map_err(|e| {
                LockError::from(BackendError::new(format!(
                    "connecting a redlock node failed: {e}"
                )))
            })?;
            let (backend, unreachable) = result?;
            if let Some(e) = unreachable {
                down.push(e.to_string());
            }
            if slots.len() <= i {
                slots.resize_with(i + 1, || None);
            }
            slots[i] = Some(Arc::new(backend));
        }
        let nodes: Vec<Arc<RedisBackend>> = slots.into_iter().flatten().collect();
        let quorum = nodes.len() / 2 + 1;
        let up = nodes.len() - down.len();
        if up < quorum {
            return Err(BackendError::new(format!(
                "redlock: only {up} of {} masters answered, a quorum is {quorum}: {}",
                nodes.len(),
                down.join("; ")
            ))
            .into());
        }
        for failure in &down {
            tracing::warn!(error = %failure, "redlock node unreachable at startup; continuing with a quorum");
        }
        Ok(RedlockBackend {
            nodes,
            quorum,
            node_timeout,
            hub,
        })
    }

    /// Runs `op` on every node in parallel, each bounded by the node timeout; answers in node
    /// order.
    async fn fan_out<T, F, Fut>(&self, op: F) -> Vec<NodeResult<T>>
    where
        T: Send + 'static,
        F: Fn(Arc<RedisBackend>) -> Fut,
        Fut: std::future::Future<Output = Result<T, LockError>> + Send + 'static,
    {
        self.fan_out_within(self.node_timeout, op).await
    }

    /// `fan_out` with each node bounded by `timeout`.
    async fn fan_out_within<T, F, Fut>(&self, timeout: Duration, op: F) -> Vec<NodeResult<T>>
    where
        T: Send + 'static,
        F: Fn(Arc<RedisBackend>) -> Fut,
        Fut: std::future::Future<Output = Result<T, LockError>> + Send + 'static,
    {
        let mut set = JoinSet::new();
        for (i, node) in self.nodes.iter().enumerate() {
            let url = node.shown_url().to_owned();
            let fut = op(node.clone());
            set.spawn(async move {
                let answer = match tokio::time::timeout(timeout, fut).await {
                    Ok(Ok(v)) => Ok(v),
                    Ok(Err(e)) => Err(format!("{url}: {e}")),
                    Err(_) => Err(format!("{url}: no answer within {timeout:?}")),
                };
                (i, answer)
            });
        }
        let mut answers: Vec<Option<NodeResult<T>>> = (0..self.nodes.len()).map(|_| None).collect();
        while let Some(joined) = set.join_next().await {
            if let Ok((i, answer)) = joined {
                answers[i] = Some(answer);
            }
        }
        answers
            .into_iter()
            .map(|a| a.unwrap_or_else(|| Err("the node's task failed".to_owned())))
            .collect()
    }

    pub(crate) async fn acquire(
        &self,
        names: &KeyNames,
        token: &str,
        owner: &str,
        ttl: Duration,
        min_hold: Duration,
        once: bool,
    ) -> Result<AcquireOutcome, LockError> {
        let started = Instant::now();
        let answers = {
            let names = names.clone();
            let token = token.to_owned();
            let owner = owner.to_owned();
            self.fan_out(move |node| {
                let names = names.clone();
                let token = token.clone();
                let owner = owner.clone();
                async move {
                    node.acquire(&names, &token, &owner, ttl, min_hold, once)
                        .await
                }
            })
            .await
        };
        let elapsed = started.elapsed();
        let mut fences = Vec::new();
        let mut held_pttls = Vec::new();
        let mut done_pttls = Vec::new();
        let mut errors = Vec::new();
        for answer in answers {
            match answer {
                Ok(AcquireOutcome::Acquired { fence }) => fences.push(fence),
                Ok(AcquireOutcome::Held { pttl }) => held_pttls.push(pttl),
                Ok(AcquireOutcome::Done { pttl }) => done_pttls.push(pttl),
                Err(e) => errors.push(e),
            }
        }
        let valid = ttl.saturating_sub(elapsed).saturating_sub(drift(ttl));
        if fences.len() >= self.quorum && !valid.is_zero() {
            // The lease carries the quorum's largest fence, and a quorum of nodes is lifted to
            // it before the lease is handed out: every later quorum shares one of those nodes,
            // so its fence is strictly larger, even after split votes let counters drift.
            let fence = fences.iter().copied().max().unwrap_or(0);
            let lifted = {
                let names = names.clone();
                let token = token.to_owned();
                self.fan_out(move |node| {
                    let names = names.clone();
                    let token = token.clone();
                    async move { node.raise_fence(&names, &token, fence, ttl).await }
                })
                .await
            };
            let stamped = lifted.iter().filter(|r| matches!(r, Ok(true))).count();
            let valid = ttl
                .saturating_sub(started.elapsed())
                .saturating_sub(drift(ttl));
            if stamped >= self.quorum && !valid.is_zero() {
                return Ok(AcquireOutcome::Acquired { fence });
            }
            tracing::debug!(key = %names.key, stamped, "redlock fence could not be set on a quorum; giving the lock back");
        }
        // Not ours: give back what we got, on every node that granted it or did not answer in
        // time (a late answer may be a grant). The release follows the acquire on each node's
        // connection, so it lands after it; it is token-checked, so it touches nothing else.
        if !fences.is_empty() || !errors.is_empty() {
            self.release(names, token, None).await.ok();
        }
        let n = self.nodes.len();
        if done_pttls.len() >= self.quorum {
            return Ok(AcquireOutcome::Done {
                pttl: done_pttls.into_iter().flatten().min(),
            });
        }
        if errors.len() > n - self.quorum {
            // Transient: waiters ride out an outage of a majority, as of a single server.
            return Err(BackendError::transient(format!(
                "redlock: only {} of {n} masters answered for `{}`, a quorum is {} ({} granted, {} held); failures: {}",
                n - errors.len(),
                names.key,
                self.quorum,
                fences.len(),
                held_pttls.len(),
                errors.join("; ")
            ))
            .into());
        }
        // Held elsewhere: retry when the records expire (or on a release). A split vote
        // between contenders, or a grant that came too late, retries after a random delay so
        // the contenders do not split again in lockstep.
        let expiry = held_pttls.iter().flatten().min().copied();
        let pttl = match expiry {
            Some(p) if fences.is_empty() => Some(p),
            _ => Some(Duration::from_millis(10) + jitter(Duration::from_millis(50))),
        };
        Ok(AcquireOutcome::Held { pttl })
    }

    pub(crate) async fn release(
        &self,
        names: &KeyNames,
        token: &str,
        done_retention: Option<Duration>,
    ) -> Result<ReleaseOutcome, LockError> {
        let answers = {
            let names = names.clone();
            let token = token.to_owned();
            self.fan_out(move |node| {
                let names = names.clone();
                let token = token.clone();
                async move { node.release(&names, &token, done_retention).await }
            })
            .await
        };
        let mut released = 0;
        let mut kept = 0;
        let mut errors = Vec::new();
        for answer in answers {
            match answer {
                Ok(ReleaseOutcome::Released) => released += 1,
                Ok(ReleaseOutcome::KeptForMinHold) => kept += 1,
                Ok(ReleaseOutcome::NotOwner) => {}
                Err(e) => errors.push(e),
            }
        }
        if kept > 0 {
            Ok(ReleaseOutcome::KeptForMinHold)
        } else if released > 0 {
            Ok(ReleaseOutcome::Released)
        } else if errors.len() > self.nodes.len() - self.quorum {
            Err(BackendError::new(format!(
                "redlock release of `{}` reached too few masters: {}",
                names.key,
                errors.join("; ")
            ))
            .into())
        } else {
            Ok(ReleaseOutcome::NotOwner)
        }
    }

    /// Renews by quorum: an item is renewed when at least a quorum of nodes renewed it.
    pub(crate) async fn extend(&self, items: &[ExtendItem]) -> Result<Vec<bool>, LockError> {
        let answers = {
            let items: Arc<Vec<ExtendItem>> = Arc::new(items.to_vec());
            self.fan_out(move |node| {
                let items = items.clone();
                async move { node.extend(&items).await }
            })
            .await
        };
        let mut votes = vec![0usize; items.len()];
        let mut errors = Vec::new();
        for answer in answers {
            match answer {
                Ok(renewed) => {
                    for (vote, ok) in votes.iter_mut().zip(renewed) {
                        *vote += usize::from(ok == Renewal::Renewed);
                    }
                }
                Err(e) => errors.push(e),
            }
        }
        if errors.len() > self.nodes.len() - self.quorum {
            // Too few answers to tell "lost" from "unreachable": let the watchdog retry until
            // the validity ends.
            return Err(BackendError::new(format!(
                "redlock renewal reached too few masters: {}",
                errors.join("; ")
            ))
            .into());
        }
        Ok(votes.into_iter().map(|v| v >= self.quorum).collect())
    }

    pub(crate) async fn inspect(&self, names: &KeyNames) -> Result<Option<RecordView>, LockError> {
        let answers = {
            let names = names.clone();
            self.fan_out(move |node| {
                let names = names.clone();
                async move { node.inspect(&names).await }
            })
            .await
        };
        // The record a quorum agrees on (same owner and fence), with how the masters see it.
        let mut views = Vec::new();
        let mut errors = Vec::new();
        for answer in answers {
            match answer {
                Ok(Some(view)) => views.push(view),
                Ok(None) => {}
                Err(e) => errors.push(e),
            }
        }
        self.enough_answered(&format!("inspect of `{}`", names.key), &errors)?;
        Ok(combine_one(views, errors.len(), self.nodes.len())
            .filter(|view| view.quorum.is_some_and(|q| q.agreeing >= self.quorum)))
    }

    /// Every record the masters list, combined per key with how many masters agree; keys
    /// held on fewer masters than a quorum are listed too, flagged by their view.
    pub(crate) async fn list(
        &self,
        namespace: &str,
        pattern: &str,
    ) -> Result<Vec<(String, RecordView)>, LockError> {
        let answers = {
            let (namespace, pattern) = (namespace.to_owned(), pattern.to_owned());
            self.fan_out_within(LIST_TIMEOUT, move |node| {
                let (namespace, pattern) = (namespace.clone(), pattern.clone());
                async move { node.list(&namespace, &pattern).await }
            })
            .await
        };
        let mut listed = Vec::new();
        let mut errors = Vec::new();
        for answer in answers {
            match answer {
                Ok(records) => listed.push(records),
                Err(e) => errors.push(e),
            }
        }
        self.enough_answered("listing", &errors)?;
        Ok(combine_masters(listed, errors.len(), self.nodes.len()))
    }

    /// Removes the record carrying `fence` on every master that answers (the masters of the
    /// quorum carry the lease's fence); true if any had it.
    pub(crate) async fn force_release(
        &self,
        names: &KeyNames,
        fence: u64,
    ) -> Result<bool, LockError> {
        let answers = {
            let names = names.clone();
            self.fan_out(move |node| {
                let names = names.clone();
                async move { node.force_release(&names, fence).await }
            })
            .await
        };
        let mut removed = false;
        let mut errors = Vec::new();
        for answer in answers {
            match answer {
                Ok(here) => removed |= here,
                Err(e) => errors.push(e),
            }
        }
        self.enough_answered(&format!("forced release of `{}`", names.key), &errors)?;
        Ok(removed)
    }

    /// An error unless a quorum of masters answered.
    fn enough_answered(&self, what: &str, errors: &[String]) -> Result<(), LockError> {
        if errors.len() > self.nodes.len() - self.quorum {
            return Err(BackendError::new(format!(
                "redlock {what} reached too few masters: {}",
                errors.join("; ")
            ))
            .into());
        }
        Ok(())
    }

    /// Watches releases on every reachable node; a release published on any of them wakes the
    /// waiters.
    pub(crate) async fn watch_releases(&self, names: &KeyNames) -> Result<ReleaseWatch, LockError> {
        let (notify, first) = self.hub.watch(&names.channel);
        if first {
            let channel = names.channel.clone();
            let answers = self
                .fan_out(move |node| {
                    let channel = channel.clone();
                    async move {
                        node.subscribe(&channel).await.map_err(|e| {
                            LockError::from(BackendError::new(match e {
                                Some(e) => e.to_string(),
                                None => "subscriber stopped".to_owned(),
                            }))
                        })
                    }
                })
                .await;
            if answers.iter().all(Result::is_err) {
                let errors: Vec<String> = answers.into_iter().filter_map(Result::err).collect();
                return Err(BackendError::new(format!(
                    "cannot wait for `{}`: no redlock master accepted the subscription: {}",
                    names.key,
                    errors.join("; ")
                ))
                .into());
            }
        }
        let handles: Vec<SubscriberHandle> = self
            .nodes
            .iter()
            .filter_map(|n| n.subscriber_handle())
            .collect();
        Ok(SubscriberHandle::watch_all(handles, notify, &names.channel))
    }
}
