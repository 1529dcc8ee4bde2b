//! `lockctl jobs` and `lockctl history JOB`: the run journals of scheduled jobs, read through
//! `LockRuntime::journalled_jobs` and `LockRuntime::history`.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use chrono::{DateTime, SecondsFormat, Utc};
use lock_runtime::{LockError, LockInfo, LockRuntime, Run, RunOutcome};

/// How many runs `history` shows at most by default.
pub(crate) const DEFAULT_LIMIT: usize = 50;

/// `--since`: a duration back from now (`90s`, `30m`, `24h`, `7d`) or an RFC 3339 instant.
pub(crate) fn parse_since(text: &str, now: SystemTime) -> anyhow::Result<SystemTime> {
    if let Ok(at) = DateTime::parse_from_rfc3339(text) {
        return Ok(SystemTime::from(at));
    }
    let (digits, unit) = text.split_at(
        text.find(|c: char| !c.is_ascii_digit())
            .unwrap_or(text.len()),
    );
    let n: u64 = digits.parse().map_err(|_| {
        anyhow::anyhow!(
            "--since takes a duration (90s, 30m, 24h, 7d) or an RFC 3339 time, not `{text}`"
        )
    })?;
    let per = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => anyhow::bail!(
            "--since takes a duration (90s, 30m, 24h, 7d) or an RFC 3339 time, not `{text}`"
        ),
    };
    Ok(n.checked_mul(per)
        .and_then(|secs| now.checked_sub(Duration::from_secs(secs)))
        .unwrap_or(UNIX_EPOCH))
}

pub(crate) fn rfc3339(t: SystemTime) -> String {
    DateTime::<Utc>::from(t).to_rfc3339_opts(SecondsFormat::Millis, true)
}

pub(crate) fn took_ms(run: &Run) -> u64 {
    run.finished_at()
        .duration_since(run.started_at())
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

fn detail(outcome: &RunOutcome) -> Option<String> {
    match outcome {
        RunOutcome::Failed { error } => Some(error.clone()),
        RunOutcome::Skipped { holder } => holder.clone(),
        _ => None,
    }
}

fn run_json(run: &Run) -> serde_json::Value {
    serde_json::json!({
        "job": run.job(),
        "scheduled_at": rfc3339(run.scheduled_at()),
        "owner": run.owner(),
        "started_at": rfc3339(run.started_at()),
        "finished_at": rfc3339(run.finished_at()),
        "took_ms": took_ms(run),
        "fence": run.fence(),
        "outcome": run.outcome().label(),
        "detail": detail(run.outcome()),
    })
}

/// The runs of `job` scheduled at or after `since`, newest first, at most `limit`.
pub(crate) async fn history(
    runtime: &LockRuntime,
    job: &str,
    limit: usize,
    since: Option<SystemTime>,
    json: bool,
) -> anyhow::Result<(String, usize)> {
    let mut runs = runtime.history(job, limit).await?;
    if let Some(since) = since {
        runs.retain(|r| r.scheduled_at() >= since);
    }
    let text = if json {
        let all: Vec<_> = runs.iter().map(run_json).collect();
        format!("{}\n", serde_json::Value::Array(all))
    } else if runs.is_empty() {
        format!("no runs of `{job}` in its journal\n")
    } else {
        let rows: Vec<[String; 5]> = runs
            .iter()
            .map(|r| {
                [
                    rfc3339(r.scheduled_at()),
                    r.owner().to_owned(),
                    r.outcome().to_string(),
                    format!("{} ms", took_ms(r)),
                    r.fence()
                        .map(|f| f.to_string())
                        .unwrap_or_else(|| "-".into()),
                ]
            })
            .collect();
        table(["SCHEDULED", "INSTANCE", "OUTCOME", "TOOK", "FENCE"], &rows)
    };
    Ok((text, runs.len()))
}

/// A job with a journal, as `jobs` and the web page show it.
pub(crate) struct JobRow {
    pub(crate) job: String,
    /// Its newest run.
    pub(crate) last: Option<Run>,
    /// Its schedule and next firing, as the newest run that says them has them.
    pub(crate) schedule: Option<String>,
    pub(crate) next: Option<SystemTime>,
    /// Who holds the job's lock now (the key from its newest run that has one).
    pub(crate) holder: Option<LockInfo>,
}

/// How many of a job's newest runs are read to find its schedule and lock key (a missed
/// firing's run has no key).
const RECENT: usize = 20;

/// Every job with a journal in the namespace, with its newest run and its lock's holder.
pub(crate) async fn job_rows(runtime: &LockRuntime) -> Result<Vec<JobRow>, LockError> {
    let mut rows = Vec::new();
    for job in runtime.journalled_jobs().await? {
        let recent = runtime.history(&job, RECENT).await?;
        let described = recent.iter().find(|r| r.schedule().is_some());
        let holder = match recent.iter().find_map(Run::key) {
            Some(key) => runtime.inspect(key).await?,
            None => None,
        };
        rows.push(JobRow {
            schedule: described.and_then(|r| r.schedule().map(str::to_owned)),
            next: described.and_then(Run::next_firing),
            last: recent.into_iter().next(),
            holder,
            job,
        });
    }
    Ok(rows)
}

/// The holder as a cell: `owner (fence N)`, or `-`.
pub(crate) fn holder_text(holder: Option<&LockInfo>) -> String {
    holder.map_or_else(
        || "-".to_owned(),
        |h| match h.fence {
            Some(fence) => format!("{} (fence {fence})", h.owner),
            None => h.owner.clone(),
        },
    )
}

/// Every job with a journal: its schedule, next firing, last run and the lock's holder.
pub(crate) async fn jobs(runtime: &LockRuntime, json: bool) -> anyhow::Result<String> {
    let rows = job_rows(runtime).await?;
    if json {
        let all: Vec<_> = rows
            .iter()
            .map(|r| {
                serde_json::json!({
                    "job": r.job,
                    "schedule": r.schedule,
                    "next_firing": r.next.map(rfc3339),
                    "last_run": r.last.as_ref().map(run_json),
                    "holder": r.holder.as_ref().map(|h| serde_json::json!({
                        "owner": h.owner,
                        "fence": h.fence,
                    })),
                })
            })
            .collect();
        return Ok(format!("{}\n", serde_json::Value::Array(all)));
    }
    if rows.is_empty() {
        return Ok("no scheduled job has a journal in this namespace\n".to_owned());
    }
    let cells: Vec<[String; 7]> = rows
        .into_iter()
        .map(|r| {
            let dash = || "-".to_owned();
            let (at, owner, outcome) = match &r.last {
                Some(l) => (
                    rfc3339(l.scheduled_at()),
                    l.owner().to_owned(),
                    l.outcome().to_string(),
                ),
                None => (dash(), dash(), dash()),
            };
            [
                r.job,
                r.schedule.unwrap_or_else(dash),
                r.next.map_or_else(dash, rfc3339),
                at,
                owner,
                outcome,
                holder_text(r.holder.as_ref()),
            ]
        })
        .collect();
    Ok(table(
        [
            "JOB",
            "SCHEDULE",
            "NEXT FIRING",
            "LAST FIRING",
            "INSTANCE",
            "OUTCOME",
            "HOLDER",
        ],
        &cells,
    ))
}

/// Left-aligned columns, two spaces apart.
fn table<const N: usize>(head: [&str; N], rows: &[[String; N]]) -> String {
    let mut widths: [usize; N] = head.map(|h| h.chars().count());
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let mut out = String::new();
        for (i, (cell, w)) in cells.iter().zip(widths).enumerate() {
            if i + 1 == N {
                out.push_str(cell);
            } else {
                out.push_str(&format!("{cell:<w$}  "));
            }
        }
        out.push('\n');
        out
    };
    let mut out = line(head.to_vec());
    for row in rows {
        out.push_str(&line(row.iter().map(String::as_str).collect()));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn since_reads_durations_and_instants_and_refuses_the_rest() {
        let now = UNIX_EPOCH + Duration::from_secs(10 * 86_400);
        assert_eq!(
            parse_since("90s", now).ok(),
            Some(now - Duration::from_secs(90))
        );
        assert_eq!(
            parse_since("2d", now).ok(),
            Some(now - Duration::from_secs(2 * 86_400))
        );
        assert_eq!(
            parse_since("1970-01-02T00:00:00Z", now).ok(),
            Some(UNIX_EPOCH + Duration::from_secs(86_400))
        );
        assert_eq!(
            parse_since("99999999999999999d", now).ok(),
            Some(UNIX_EPOCH)
        );
        for bad in ["", "5", "5w", "h", "yesterday"] {
            assert!(parse_since(bad, now).is_err(), "`{bad}` was accepted");
        }
    }
}
