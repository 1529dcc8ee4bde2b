//! The run journal on a Redlock quorum: each run goes to every member (at least one must take
//! it), and a read joins what the members answer, dropping the copies. A member that was down
//! for an append misses that run; the others still have it.

use std::sync::Arc;

use super::RedlockBackend;
use crate::LockError;
use crate::store::Retention;

impl RedlockBackend {
    pub(super) async fn append_run_everywhere(
        &self,
        namespace: &str,
        job: &str,
        entry: &str,
        keep: &Retention,
    ) -> Result<(), LockError> {
        let (namespace, job, entry, keep): (Arc<str>, Arc<str>, Arc<str>, Retention) =
            (namespace.into(), job.into(), entry.into(), *keep);
        let answers = self
            .fan_out(move |node| {
                let (namespace, job, entry) = (namespace.clone(), job.clone(), entry.clone());
                async move { node.append_run(&namespace, &job, &entry, &keep).await }
            })
            .await;
        self.any_answered("journal append", answers).map(|_| ())
    }

    pub(super) async fn runs_joined(
        &self,
        namespace: &str,
        job: &str,
        limit: usize,
    ) -> Result<Vec<String>, LockError> {
        let (namespace, job): (Arc<str>, Arc<str>) = (namespace.into(), job.into());
        let answers = self
            .fan_out(move |node| {
                let (namespace, job) = (namespace.clone(), job.clone());
                async move { node.runs(&namespace, &job, limit).await }
            })
            .await;
        let mut joined: Vec<String> = Vec::new();
        for runs in self.any_answered("journal read", answers)? {
            for run in runs {
                if !joined.contains(&run) {
                    joined.push(run);
                }
            }
        }
        Ok(joined)
    }

    pub(super) async fn jobs_joined(&self, namespace: &str) -> Result<Vec<String>, LockError> {
        let namespace: Arc<str> = namespace.into();
        let answers = self
            .fan_out(move |node| {
                let namespace = namespace.clone();
                async move { node.journalled_jobs(&namespace).await }
            })
            .await;
        Ok(self
            .any_answered("listing of journals", answers)?
            .into_iter()
            .flatten()
            .collect())
    }

    /// The answers of the members that gave one; an error when none did.
    fn any_answered<T>(
        &self,
        what: &str,
        answers: Vec<super::NodeResult<T>>,
    ) -> Result<Vec<T>, LockError> {
        let mut got = Vec::new();
        let mut errors = Vec::new();
        for answer in answers {
            match answer {
                Ok(v) => got.push(v),
                Err(e) => errors.push(e),
            }
        }
        if got.is_empty() {
            return Err(self.failure(
                format!(
                    "redlock {what} reached no master: {}",
                    super::joined(&errors)
                ),
                &errors,
            ));
        }
        Ok(got)
    }
}
