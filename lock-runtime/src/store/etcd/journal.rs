//! The run journal on etcd: one key per run under `<ns>:runs:{<job>}:`, named by its append
//! time in milliseconds (20 digits, so keys sort by time) and a random suffix. Each append
//! deletes the job's runs older than the age bound in the same transaction, then the oldest
//! beyond the count bound. The keys live on a lease of one and a half times the age bound,
//! shared by a job's runs for half of it, so a journal that nobody appends to any more
//! expires by itself, and a job costs one or two leases, not one per run.

use std::time::Duration;

use etcd_client::{DeleteOptions, GetOptions, PutOptions, SortOrder, SortTarget, Txn, TxnOp};
use tokio::time::Instant;

use super::{EtcdBackend, now_ms};
use crate::LockError;
use crate::store::Retention;

fn prefix(namespace: &str, job: &str) -> String {
    format!("{namespace}:runs:{{{job}}}:")
}

fn stamp(ms: u64) -> String {
    format!("{ms:020}")
}

impl EtcdBackend {
    /// The lease the runs of `journal` are put on: the cached one while it is younger than
    /// half the age bound, else a new one of the age bound.
    async fn journal_lease(&self, journal: &str, max_age: Duration) -> Result<i64, LockError> {
        let fresh = |granted: Instant| granted.elapsed() < max_age / 2;
        if let Ok(leases) = self.journal_leases.lock()
            && let Some((lease, granted)) = leases.get(journal)
            && fresh(*granted)
        {
            return Ok(*lease);
        }
        // Granted for half as long again as the age bound: a key put on it at the end of its
        // half-life still lives its whole age (each append deletes what is older).
        let lease = self
            .conn
            .grant(
                max_age + max_age / 2,
                &format!("appending to the journal `{journal}`"),
            )
            .await?;
        if let Ok(mut leases) = self.journal_leases.lock() {
            leases.retain(|_, (_, granted)| fresh(*granted));
            leases.insert(journal.to_owned(), (lease, Instant::now()));
        }
        Ok(lease)
    }

    pub(super) async fn append_run_key(
        &self,
        namespace: &str,
        job: &str,
        entry: &str,
        keep: &Retention,
    ) -> Result<(), LockError> {
        let prefix = prefix(namespace, job);
        let context = format!("appending to the journal of `{job}` failed");
        let max_age = keep.max_age.max(Duration::from_secs(1));
        let lease = self.journal_lease(&prefix, max_age).await?;
        let now = now_ms();
        let suffix = uuid::Uuid::new_v4().simple().to_string();
        let key = format!("{prefix}{}-{}", stamp(now), &suffix[..8]);
        let cutoff = now.saturating_sub(u64::try_from(max_age.as_millis()).unwrap_or(u64::MAX));
        let txn = Txn::new().and_then([
            TxnOp::put(
                key.as_str(),
                entry,
                Some(PutOptions::new().with_lease(lease)),
            ),
            TxnOp::delete(
                prefix.as_str(),
                Some(DeleteOptions::new().with_range(format!("{prefix}{}", stamp(cutoff)))),
            ),
        ]);
        if let Err(e) = self.conn.txn(txn, &context).await {
            // The lease may be gone (revoked, or etcd lost it): the next append grants anew.
            if let Ok(mut leases) = self.journal_leases.lock() {
                leases.remove(&prefix);
            }
            return Err(e);
        }
        // The count bound: the newest `max_runs` stay.
        let max_runs = keep.max_runs.max(1);
        let newest = self
            .conn
            .send(|mut c| {
                let prefix = prefix.clone();
                let limit = i64::try_from(max_runs + 1).unwrap_or(i64::MAX);
                async move {
                    c.get(
                        prefix,
                        Some(
                            GetOptions::new()
                                .with_prefix()
                                .with_keys_only()
                                .with_sort(SortTarget::Key, SortOrder::Descend)
                                .with_limit(limit),
                        ),
                    )
                    .await
                }
            })
            .await
            .map_err(|e| self.conn.error(&context, e))?;
        if newest.kvs().len() > max_runs
            && let Some(oldest_kept) = newest.kvs().get(max_runs - 1)
        {
            let end = oldest_kept.key().to_vec();
            self.conn
                .send(|mut c| {
                    let (prefix, end) = (prefix.clone(), end.clone());
                    async move {
                        c.delete(prefix, Some(DeleteOptions::new().with_range(end)))
                            .await
                    }
                })
                .await
                .map_err(|e| self.conn.error(&context, e))?;
        }
        Ok(())
    }

    pub(super) async fn run_keys(
        &self,
        namespace: &str,
        job: &str,
        limit: usize,
    ) -> Result<Vec<String>, LockError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let prefix = prefix(namespace, job);
        let answer = self
            .conn
            .send(|mut c| {
                let prefix = prefix.clone();
                let limit = i64::try_from(limit).unwrap_or(i64::MAX);
                async move {
                    c.get(
                        prefix,
                        Some(
                            GetOptions::new()
                                .with_prefix()
                                .with_sort(SortTarget::Key, SortOrder::Descend)
                                .with_limit(limit),
                        ),
                    )
                    .await
                }
            })
            .await
            .map_err(|e| {
                self.conn
                    .error(&format!("reading the journal of `{job}` failed"), e)
            })?;
        Ok(answer
            .kvs()
            .iter()
            .map(|kv| String::from_utf8_lossy(kv.value()).into_owned())
            .collect())
    }

    pub(super) async fn jobs_with_keys(&self, namespace: &str) -> Result<Vec<String>, LockError> {
        let root = format!("{namespace}:runs:{{");
        let answer = self
            .conn
            .send(|mut c| {
                let root = root.clone();
                async move {
                    c.get(root, Some(GetOptions::new().with_prefix().with_keys_only()))
                        .await
                }
            })
            .await
            .map_err(|e| self.conn.error("listing the run journals failed", e))?;
        let mut jobs: Vec<String> = answer
            .kvs()
            .iter()
            .filter_map(|kv| {
                let key = kv.key_str().ok()?;
                let rest = key.strip_prefix(&root)?;
                // `<job>}:<stamp>-<suffix>`: the job is what comes before the last `}:`.
                let end = rest.rfind("}:")?;
                Some(rest[..end].to_owned())
            })
            .collect();
        jobs.dedup();
        Ok(jobs)
    }
}
