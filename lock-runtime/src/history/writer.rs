//! The scheduler's journal writer: runs are queued (never waited for) and written one after
//! the other by a task of their own, so a slow or failed store never holds up a job.

use std::time::Duration;

use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::{Run, encode};
use crate::LockRuntime;
use crate::store::Retention;

/// Runs waiting to be written, at most; a run that finds the queue full is a gap.
const QUEUE: usize = 1_024;

/// How long the scheduler's stop waits for queued runs to be written.
pub(crate) const FLUSH: Duration = Duration::from_secs(5);

/// Where the runs of one scheduler go.
#[derive(Debug, Clone)]
pub(crate) struct Writer {
    queue: Option<mpsc::Sender<Run>>,
}

/// The writer's task, to wait for at the scheduler's stop.
pub(crate) struct Flush(Option<JoinHandle<()>>);

impl Writer {
    /// A writer into `runtime`'s store, keeping `keep`; `None` writes nothing.
    pub(crate) fn start(runtime: &LockRuntime, keep: Option<Retention>) -> (Self, Flush) {
        let Some(keep) = keep else {
            return (Writer { queue: None }, Flush(None));
        };
        let (queue, mut runs) = mpsc::channel::<Run>(QUEUE);
        let runtime = runtime.clone();
        let task = tokio::spawn(async move {
            while let Some(run) = runs.recv().await {
                let backend = &runtime.inner.backend;
                let written = backend
                    .append_run(runtime.namespace(), &run.job, &encode(&run), &keep)
                    .await;
                match written {
                    Ok(()) => {}
                    // Said once, not at every firing: this store keeps no history.
                    Err(e @ crate::LockError::Unsupported(_)) => {
                        tracing::info!("no run journal is written: {e}");
                        runs.close();
                        while runs.recv().await.is_some() {}
                        return;
                    }
                    Err(e) => gap(&run.job, &format!("the store did not take it: {e}")),
                }
            }
        });
        (Writer { queue: Some(queue) }, Flush(Some(task)))
    }

    /// Whether runs are written (history kept, and the store takes them).
    pub(crate) fn is_on(&self) -> bool {
        self.queue.as_ref().is_some_and(|q| !q.is_closed())
    }

    /// Queues `run` for its journal, without waiting.
    pub(crate) fn write(&self, run: Run) {
        let Some(queue) = &self.queue else { return };
        if queue.is_closed() {
            return; // the store keeps no history
        }
        if let Err(e) = queue.try_send(run) {
            let (job, why) = match e {
                mpsc::error::TrySendError::Full(run) => (run.job, "the journal queue is full"),
                mpsc::error::TrySendError::Closed(run) => (run.job, "the journal writer stopped"),
            };
            gap(&job, why);
        }
    }
}

impl Flush {
    /// Waits (at most [`FLUSH`]) for the runs queued before every [`Writer`] was dropped.
    pub(crate) async fn wait(self) {
        let Some(mut task) = self.0 else { return };
        if tokio::time::timeout(FLUSH, &mut task).await.is_err() {
            task.abort();
            tracing::warn!(
                "the run journal was not written within {FLUSH:?} of the scheduler's stop; the rest is dropped"
            );
        }
    }
}

/// A run that did not reach its journal: logged and counted, never the job's failure.
fn gap(job: &str, why: &str) {
    tracing::warn!(job, "a run was not journalled: {why}");
    crate::metrics::history_gap(job);
}
