//! Redlock: one lock across N independent stores, held when a quorum (N/2 + 1) granted it
//! within its validity. The members are Redis masters (`.redlock(urls)`) or any [`LockStore`]
//! (`RedlockStore::over(..)`, which is how the simulation runs this very code on simulated
//! masters). This module fans each call out in parallel, each member bounded by a short
//! timeout, and counts.

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinSet;
use tokio::time::Instant;

mod journal;
mod operator;
mod watch;

use super::{
    AcquireOutcome, AcquireRequest, DynStore, ExtendItem, KeyNames, LockStore, RecordView,
    RedisBackend, RedisOptions, ReleaseHub, ReleaseOutcome, ReleaseWatch, Renewal, Retention,
};
use crate::config::{drift, jitter};
use crate::{BackendError, LockError};

/// The default bound on one node's answer.
pub(crate) const DEFAULT_NODE_TIMEOUT: Duration = Duration::from_millis(250);

/// A lock store made of independent members.
pub(crate) struct RedlockBackend {
    nodes: Vec<Member>,
    quorum: usize,
    node_timeout: Duration,
}

/// One member and how errors name it.
struct Member {
    label: String,
    store: Arc<dyn DynStore>,
}

impl std::fmt::Debug for RedlockBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let labels: Vec<&str> = self.nodes.iter().map(|n| n.label.as_str()).collect();
        f.debug_struct("RedlockBackend")
            .field("nodes", &labels)
            .field("quorum", &self.quorum)
            .finish_non_exhaustive()
    }
}

/// One node's answer, or why there is none.
type NodeResult<T> = Result<T, NodeError>;

/// Why a member gave no answer, named, and whether a retry may cure it.
struct NodeError {
    text: String,
    transient: bool,
}

/// The members' errors, for a message.
fn joined(errors: &[NodeError]) -> String {
    errors
        .iter()
        .map(|e| e.text.as_str())
        .collect::<Vec<_>>()
        .join("; ")
}

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
        check_members(urls.len())?;
        let mut connecting = JoinSet::new();
        for (i, url) in urls.into_iter().enumerate() {
            let tls_root_cert = tls_root_cert.clone();
            connecting.spawn(async move {
                let mut options = RedisOptions::single(url, connect_timeout, command_timeout);
                options.tls_root_cert = tls_root_cert;
                options.fence_at_acquire = true;
                // Each master wakes its own watchers; a quorum watch forwards them.
                let hub = Arc::new(ReleaseHub::default());
                (i, RedisBackend::connect_with(options, hub, true).await)
            });
        }
        let mut slots: Vec<Option<Member>> = Vec::new();
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
            slots[i] = Some(Member {
                label: backend.shown_url().to_owned(),
                store: Arc::new(backend),
            });
        }
        let nodes: Vec<Member> = slots.into_iter().flatten().collect();
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
        })
    }

    /// A quorum of stores the caller made (each answering for itself, as independent
    /// masters do), named "store 1", "store 2", ... in errors.
    pub(crate) fn from_stores(
        stores: Vec<Arc<dyn DynStore>>,
        node_timeout: Duration,
    ) -> Result<Self, LockError> {
        check_members(stores.len())?;
        let nodes: Vec<Member> = stores
            .into_iter()
            .enumerate()
            .map(|(i, store)| Member {
                label: format!("store {}", i + 1),
                store,
            })
            .collect();
        Ok(RedlockBackend {
            quorum: nodes.len() / 2 + 1,
            nodes,
            node_timeout,
        })
    }

    /// Runs `op` on every node in parallel, each bounded by the node timeout; answers in node
    /// order.
    async fn fan_out<T, F, Fut>(&self, op: F) -> Vec<NodeResult<T>>
    where
        T: Send + 'static,
        F: Fn(Arc<dyn DynStore>) -> Fut,
        Fut: std::future::Future<Output = Result<T, LockError>> + Send + 'static,
    {
        self.fan_out_within(self.node_timeout, op).await
    }

    /// `fan_out` with each node bounded by `timeout`.
    async fn fan_out_within<T, F, Fut>(&self, timeout: Duration, op: F) -> Vec<NodeResult<T>>
    where
        T: Send + 'static,
        F: Fn(Arc<dyn DynStore>) -> Fut,
        Fut: std::future::Future<Output = Result<T, LockError>> + Send + 'static,
    {
        let mut set = JoinSet::new();
        for (i, node) in self.nodes.iter().enumerate() {
            let label = node.label.clone();
            let fut = op(node.store.clone());
            set.spawn(async move {
                let answer = match tokio::time::timeout(timeout, fut).await {
                    Ok(Ok(v)) => Ok(v),
                    Ok(Err(e)) => Err(NodeError {
                        text: format!("{label}: {e}"),
                        transient: e.is_transient(),
                    }),
                    Err(_) => Err(NodeError {
                        text: format!("{label}: no answer within {timeout:?}"),
                        transient: true,
                    }),
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
            .map(|a| {
                a.unwrap_or_else(|| {
                    Err(NodeError {
                        text: "the node's task failed".to_owned(),
                        transient: false,
                    })
                })
            })
            .collect()
    }

    /// A failure made of the members' errors: transient while the members that failed for
    /// good (a refused command, a wrong password, a store that cannot serve in a quorum) still
    /// leave room for a quorum, so waiters ride out the rest (members that did not answer in
    /// time or lost their connection) as they would an outage of one server; final once they
    /// do not.
    fn failure(&self, message: String, errors: &[NodeError]) -> LockError {
        let lasting = errors.iter().filter(|e| !e.transient).count();
        if lasting <= self.nodes.len() - self.quorum {
            BackendError::transient(message).into()
        } else {
            BackendError::new(message).into()
        }
    }

    /// An error unless a quorum of masters answered.
    fn enough_answered(&self, what: &str, errors: &[NodeError]) -> Result<(), LockError> {
        if errors.len() > self.nodes.len() - self.quorum {
            return Err(self.failure(
                format!("redlock {what} reached too few masters: {}", joined(errors)),
                errors,
            ));
        }
        Ok(())
    }
}

/// Redlock needs at least three members to outlive the loss of one.
fn check_members(n: usize) -> Result<(), LockError> {
    if n < 3 {
        return Err(LockError::config(format!(
            "redlock needs at least 3 independent masters, got {n}; use .redis(url) for one server"
        )));
    }
    Ok(())
}

impl LockStore for RedlockBackend {
    async fn acquire(&self, request: AcquireRequest<'_>) -> Result<AcquireOutcome, LockError> {
        let AcquireRequest {
            names,
            token,
            owner,
            ttl,
            min_hold,
            once,
        } = request;
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
                    node.acquire(AcquireRequest {
                        names: &names,
                        token: &token,
                        owner: &owner,
                        ttl,
                        min_hold,
                        once,
                    })
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
                // The quorum's fence is the members' largest at acquire: a member that
                // computes fences on demand cannot take part yet. Its grant is counted as a
                // failure: given back with the rest if the quorum fails; if the others make
                // a quorum, it is renewed and released with them.
                Ok(AcquireOutcome::AcquiredUnfenced) => errors.push(NodeError {
                    text: "a member answered without a fence, which a quorum cannot use".to_owned(),
                    transient: false,
                }),
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
            tracing::debug!(key = %names.key(), stamped, "redlock fence could not be set on a quorum; giving the lock back");
            // Members that cannot lift fences at all (a store without `raise_fence`) must
            // say so rather than look like a lock that is always held.
            let refused: Vec<NodeError> = lifted
                .into_iter()
                .filter_map(Result::err)
                .filter(|e| !e.transient)
                .collect();
            if refused.len() > self.nodes.len() - self.quorum {
                LockStore::release(self, names, token, None).await.ok();
                return Err(self.failure(
                    format!(
                        "redlock: the fence of `{}` could not be lifted on a quorum: {}",
                        names.key(),
                        joined(&refused)
                    ),
                    &refused,
                ));
            }
        }
        // Not ours: give back what we got, on every node that granted it or did not answer in
        // time (a late answer may be a grant). The release follows the acquire on each node's
        // connection, so it lands after it; it is token-checked, so it touches nothing else.
        if !fences.is_empty() || !errors.is_empty() {
            LockStore::release(self, names, token, None).await.ok();
        }
        let n = self.nodes.len();
        if done_pttls.len() >= self.quorum {
            return Ok(AcquireOutcome::Done {
                pttl: done_pttls.into_iter().flatten().min(),
            });
        }
        if errors.len() > n - self.quorum {
            // Waiters ride out an outage of a majority, as of a single server.
            return Err(self.failure(
                format!(
                    "redlock: only {} of {n} masters answered for `{}`, a quorum is {} ({} granted, {} held); failures: {}",
                    n - errors.len(),
                    names.key(),
                    self.quorum,
                    fences.len(),
                    held_pttls.len(),
                    joined(&errors)
                ),
                &errors,
            ));
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

    async fn release(
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
        let mut gone = 0;
        let mut errors = Vec::new();
        for answer in answers {
            match answer {
                Ok(ReleaseOutcome::Released) => released += 1,
                Ok(ReleaseOutcome::KeptForMinHold) => kept += 1,
                Ok(ReleaseOutcome::GoneAfterRetry) => gone += 1,
                Ok(_) => {}
                Err(e) => errors.push(e),
            }
        }
        // Too many members that may still hold the record for a quorum to be free: a failure,
        // tried again, even when some member took it (otherwise the record stays on the
        // others for the rest of its ttl, and nobody can take the lock).
        if errors.len() > self.nodes.len() - self.quorum {
            Err(self.failure(
                format!(
                    "redlock release of `{}` reached too few masters: {}",
                    names.key(),
                    joined(&errors)
                ),
                &errors,
            ))
        } else if kept > 0 {
            Ok(ReleaseOutcome::KeptForMinHold)
        } else if released > 0 {
            Ok(ReleaseOutcome::Released)
        } else if gone > 0 {
            Ok(ReleaseOutcome::GoneAfterRetry)
        } else {
            Ok(ReleaseOutcome::NotOwner)
        }
    }

    /// Renews by quorum: an item is renewed when at least a quorum of nodes renewed it, and
    /// not ours when so many nodes said it is not theirs (or gone) that the others can no
    /// longer make a quorum. Anything between (nodes that failed, or answered "unknown") is
    /// unknown: the watchdog tries again until the validity ends, as with a lone store that
    /// cannot tell; never a loss no node reported.
    async fn extend(&self, items: &[ExtendItem]) -> Result<Vec<Renewal>, LockError> {
        let answers = {
            let items: Arc<Vec<ExtendItem>> = Arc::new(items.to_vec());
            self.fan_out(move |node| {
                let items = items.clone();
                async move { node.extend(&items).await }
            })
            .await
        };
        let mut renewed = vec![0usize; items.len()];
        let mut gone = vec![0usize; items.len()];
        let mut errors = Vec::new();
        for answer in answers {
            match answer {
                Ok(answers) => {
                    for (i, answer) in answers.into_iter().enumerate().take(items.len()) {
                        match answer {
                            Renewal::Renewed => renewed[i] += 1,
                            Renewal::NotOurs => gone[i] += 1,
                            Renewal::Unknown(_) => {}
                        }
                    }
                }
                Err(e) => errors.push(e),
            }
        }
        if errors.len() > self.nodes.len() - self.quorum {
            // Too few answers to tell "lost" from "unreachable": let the watchdog retry until
            // the validity ends.
            return Err(self.failure(
                format!(
                    "redlock renewal reached too few masters: {}",
                    joined(&errors)
                ),
                &errors,
            ));
        }
        let nodes = self.nodes.len();
        Ok(renewed
            .into_iter()
            .zip(gone)
            .map(|(renewed, gone)| {
                if renewed >= self.quorum {
                    Renewal::Renewed
                } else if gone > nodes - self.quorum {
                    Renewal::NotOurs
                } else {
                    Renewal::Unknown(format!(
                        "{renewed} of {nodes} members renewed the lease and {gone} no longer \
                         hold it; the others did not answer (a quorum is {})",
                        self.quorum
                    ))
                }
            })
            .collect())
    }

    async fn inspect(&self, names: &KeyNames) -> Result<Option<RecordView>, LockError> {
        self.inspect_quorum(names).await
    }

    async fn list(
        &self,
        namespace: &str,
        pattern: &str,
    ) -> Result<Vec<(String, RecordView)>, LockError> {
        self.list_combined(namespace, pattern).await
    }

    async fn force_release(&self, names: &KeyNames, fence: u64) -> Result<bool, LockError> {
        self.force_release_everywhere(names, fence).await
    }

    async fn force_release_holder(
        &self,
        names: &KeyNames,
        holder: &str,
    ) -> Result<bool, LockError> {
        self.force_release_holder_everywhere(names, holder).await
    }

    async fn append_run(
        &self,
        namespace: &str,
        job: &str,
        entry: &str,
        keep: &Retention,
    ) -> Result<(), LockError> {
        self.append_run_everywhere(namespace, job, entry, keep)
            .await
    }

    async fn runs(
        &self,
        namespace: &str,
        job: &str,
        limit: usize,
    ) -> Result<Vec<String>, LockError> {
        self.runs_joined(namespace, job, limit).await
    }

    async fn journalled_jobs(&self, namespace: &str) -> Result<Vec<String>, LockError> {
        self.jobs_joined(namespace).await
    }

    async fn watch_releases(&self, names: &KeyNames) -> Result<ReleaseWatch, LockError> {
        self.watch_members(names).await
    }
}
