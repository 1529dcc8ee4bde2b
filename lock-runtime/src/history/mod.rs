//! Run history: every firing's outcome, journalled in the lock's own store by the instance
//! that knows it, and read back newest first ([`crate::LockRuntime::history`], `lockctl
//! history`).
//!
//! A journal write never fails or delays the job: the scheduler hands each run to a writer
//! task through a bounded queue; a write that fails (or finds the queue full) is logged and
//! counted (`scheduled_history_gaps_total`), and the job goes on.

mod entry;
mod writer;

use std::time::{Duration, SystemTime};

pub(crate) use entry::{decode, encode};
pub(crate) use writer::Writer;

/// The longest error text a run keeps, in bytes: the rest is cut at a character boundary and
/// marked with `…`.
pub const MAX_ERROR_TEXT: usize = 512;

/// How long a journal keeps runs by default: 30 days.
pub(crate) const DEFAULT_MAX_AGE: Duration = Duration::from_secs(30 * 24 * 3600);

/// How many runs per job a journal keeps by default.
pub(crate) const DEFAULT_MAX_RUNS: usize = 1_000;

/// One firing of a scheduled job as its journal keeps it: who ran it, when, how it ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Run {
    pub(crate) job: String,
    pub(crate) scheduled_at: SystemTime,
    pub(crate) owner: String,
    pub(crate) started_at: SystemTime,
    pub(crate) finished_at: SystemTime,
    pub(crate) fence: Option<u64>,
    pub(crate) outcome: RunOutcome,
    /// The job's lock key, when the firing got as far as its locked call.
    pub(crate) key: Option<String>,
    /// The job's schedule, as [`crate::JobInfo::schedule`] says it.
    pub(crate) schedule: Option<String>,
    /// The job's next firing after this one, by the writer's schedule.
    pub(crate) next_firing: Option<SystemTime>,
}

impl Run {
    /// The job's name.
    pub fn job(&self) -> &str {
        &self.job
    }

    /// The firing's scheduled instant.
    pub fn scheduled_at(&self) -> SystemTime {
        self.scheduled_at
    }

    /// The instance (its runtime's owner name) the run is of: the one that ran the firing
    /// (for a `crashed` run too, though another instance wrote it), or, for a skipped
    /// firing, the one that claimed it and found the lock held.
    pub fn owner(&self) -> &str {
        &self.owner
    }

    /// When the instance began the firing, on its clock.
    pub fn started_at(&self) -> SystemTime {
        self.started_at
    }

    /// When the firing ended, on the same clock.
    pub fn finished_at(&self) -> SystemTime {
        self.finished_at
    }

    /// The fence of the lease the run held (`None` when it held none: skipped, missed, or a
    /// `local = true` job).
    pub fn fence(&self) -> Option<u64> {
        self.fence
    }

    /// How the firing ended.
    pub fn outcome(&self) -> &RunOutcome {
        &self.outcome
    }

    /// The job's lock key (`#[distributed_lock(key = ..)]`), when the firing reached its
    /// locked call; `None` for a missed firing or a `local = true` job.
    pub fn key(&self) -> Option<&str> {
        self.key.as_deref()
    }

    /// The job's schedule when this run was written, e.g. `cron "0 0 2 * * *" in
    /// Europe/Berlin` or `every 5s`.
    pub fn schedule(&self) -> Option<&str> {
        self.schedule.as_deref()
    }

    /// The job's next firing after this one, by that schedule (`None`: it has none).
    pub fn next_firing(&self) -> Option<SystemTime> {
        self.next_firing
    }
}

/// How a firing ended, as its journal says.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum RunOutcome {
    /// It ran and succeeded.
    Ok,
    /// It ran and failed (or panicked): the error's text, at most [`MAX_ERROR_TEXT`] bytes.
    Failed {
        /// What the job returned or panicked with.
        error: String,
    },
    /// Nobody ran it: the job's lock was held (the previous run still ran), by this owner when
    /// the store could say.
    Skipped {
        /// The lock's holder, when known.
        holder: Option<String>,
    },
    /// Nobody ran it: the job's own `once` marker said the work was done.
    AlreadyDone,
    /// The instance woke too late for it (the process was stopped or starved, or the clock
    /// jumped): it was not run.
    Missed,
    /// It ran, lost its lock mid-run, and was stopped.
    Lost,
    /// Its holder vanished mid-run (the process died) and its lease expired unreleased, as
    /// an instance that followed the lease saw it.
    Crashed,
}

impl RunOutcome {
    /// The outcome's name, as `lockctl` and the metrics write it: `ok`, `failed`, `skipped`,
    /// `already_done`, `missed`, `lost`, `crashed`.
    pub fn label(&self) -> &'static str {
        match self {
            RunOutcome::Ok => "ok",
            RunOutcome::Failed { .. } => "failed",
            RunOutcome::Skipped { .. } => "skipped",
            RunOutcome::AlreadyDone => "already_done",
            RunOutcome::Missed => "missed",
            RunOutcome::Lost => "lost",
            RunOutcome::Crashed => "crashed",
        }
    }
}

impl std::fmt::Display for RunOutcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RunOutcome::Failed { error } => write!(f, "failed: {error}"),
            RunOutcome::Skipped { holder: Some(h) } => write!(f, "skipped: held by {h}"),
            RunOutcome::Skipped { holder: None } => f.write_str("skipped: held"),
            other => f.write_str(other.label()),
        }
    }
}

/// Cuts `text` to at most [`MAX_ERROR_TEXT`] bytes, at a character boundary.
pub(crate) fn bounded(text: &str) -> String {
    if text.len() <= MAX_ERROR_TEXT {
        return text.to_owned();
    }
    let mut end = MAX_ERROR_TEXT - '…'.len_utf8();
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}
