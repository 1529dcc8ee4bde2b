//! A run as one line of text, the form every store keeps it in: stores need not know its
//! fields, and a store plugged in by a user stores a string.
//!
//! `r1`, then the fields, separated by U+001F (unit separator): job, firing, owner, started,
//! finished, fence, outcome, its detail, then lock key, schedule and next firing (empty when
//! unknown; lines written before these three had only the first eight, and still read). `%`,
//! U+001F and NUL (which PostgreSQL's `text` refuses) inside a text field are written `%25`,
//! `%1F` and `%00`. Times are milliseconds since the Unix epoch.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::{Run, RunOutcome};
use crate::config::unix_ms as ms;

const SEP: char = '\u{1f}';
const VERSION: &str = "r1";

fn escape(text: &str) -> String {
    text.replace('%', "%25")
        .replace(SEP, "%1F")
        .replace('\0', "%00")
}

fn unescape(text: &str) -> String {
    text.replace("%1F", "\u{1f}")
        .replace("%00", "\0")
        .replace("%25", "%")
}

fn time(field: &str) -> Option<SystemTime> {
    field
        .parse::<u64>()
        .ok()
        .map(|ms| UNIX_EPOCH + Duration::from_millis(ms))
}

/// The run as its journal line.
pub(crate) fn encode(run: &Run) -> String {
    let detail = match &run.outcome {
        RunOutcome::Failed { error } => escape(error),
        RunOutcome::Skipped { holder: Some(h) } => escape(h),
        _ => String::new(),
    };
    let fence = run.fence.map(|f| f.to_string()).unwrap_or_default();
    let text = |t: &Option<String>| t.as_deref().map(escape).unwrap_or_default();
    [
        VERSION.to_owned(),
        escape(&run.job),
        ms(run.scheduled_at).to_string(),
        escape(&run.owner),
        ms(run.started_at).to_string(),
        ms(run.finished_at).to_string(),
        fence,
        run.outcome.label().to_owned(),
        detail,
        text(&run.key),
        text(&run.schedule),
        run.next_firing
            .map(|t| ms(t).to_string())
            .unwrap_or_default(),
    ]
    .join(&SEP.to_string())
}

/// The run a journal line holds; `None` for a line this version cannot read (written by a
/// later one, or not by the runtime).
pub(crate) fn decode(line: &str) -> Option<Run> {
    let fields: Vec<&str> = line.split(SEP).collect();
    let (fields, [key, schedule, next]) = match fields.as_slice() {
        [first @ .., key, schedule, next] if first.len() == 9 => (first, [*key, *schedule, *next]),
        all if all.len() == 9 => (all, ["", "", ""]),
        _ => return None,
    };
    let [
        version,
        job,
        scheduled,
        owner,
        started,
        finished,
        fence,
        label,
        detail,
    ] = fields
    else {
        return None;
    };
    if *version != VERSION {
        return None;
    }
    let detail = unescape(detail);
    let outcome = match *label {
        "ok" => RunOutcome::Ok,
        "failed" => RunOutcome::Failed { error: detail },
        "skipped" => RunOutcome::Skipped {
            holder: (!detail.is_empty()).then_some(detail),
        },
        "already_done" => RunOutcome::AlreadyDone,
        "missed" => RunOutcome::Missed,
        "lost" => RunOutcome::Lost,
        "crashed" => RunOutcome::Crashed,
        _ => return None,
    };
    let fence = match *fence {
        "" => None,
        f => Some(f.parse().ok()?),
    };
    Some(Run {
        job: unescape(job),
        scheduled_at: time(scheduled)?,
        owner: unescape(owner),
        started_at: time(started)?,
        finished_at: time(finished)?,
        fence,
        outcome,
        key: (!key.is_empty()).then(|| unescape(key)),
        schedule: (!schedule.is_empty()).then(|| unescape(schedule)),
        next_firing: match next {
            "" => None,
            t => Some(time(t)?),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(outcome: RunOutcome, fence: Option<u64>) -> Run {
        let at = UNIX_EPOCH + Duration::from_millis(1_764_640_800_000);
        Run {
            job: "post%interest\u{1f}".to_owned(),
            scheduled_at: at,
            owner: "host-1:42".to_owned(),
            started_at: at + Duration::from_millis(3),
            finished_at: at + Duration::from_millis(53),
            fence,
            outcome,
            key: Some("interest%posting".to_owned()),
            schedule: Some("cron \"0 0 2 * * *\" in Europe/Berlin".to_owned()),
            next_firing: Some(at + Duration::from_secs(86_400)),
        }
    }

    #[test]
    fn every_outcome_reads_back_as_written() {
        let outcomes = [
            RunOutcome::Ok,
            RunOutcome::Failed {
                error: "100% \u{1f} gone %1F \0 %00 %%2500".to_owned(),
            },
            RunOutcome::Skipped {
                holder: Some("b".to_owned()),
            },
            RunOutcome::Skipped { holder: None },
            RunOutcome::AlreadyDone,
            RunOutcome::Missed,
            RunOutcome::Lost,
            RunOutcome::Crashed,
        ];
        for outcome in outcomes {
            for fence in [None, Some(0), Some(u64::MAX)] {
                let written = run(outcome.clone(), fence);
                assert_eq!(decode(&encode(&written)), Some(written));
            }
        }
    }

    #[test]
    fn a_line_of_another_version_or_shape_is_not_read() {
        let line = encode(&run(RunOutcome::Ok, Some(7)));
        assert!(decode(&line.replacen("r1", "r2", 1)).is_none());
        assert!(decode(&line.replace("\u{1f}ok\u{1f}", "\u{1f}fine\u{1f}")).is_none());
        assert!(decode("").is_none());
        assert!(decode("r1\u{1f}job").is_none());
    }

    #[test]
    fn a_line_without_key_schedule_and_next_firing_still_reads() {
        let full = run(RunOutcome::Ok, Some(7));
        let line = encode(&full);
        let short: Vec<&str> = line.split('\u{1f}').take(9).collect();
        let read = decode(&short.join("\u{1f}")).expect("read");
        assert_eq!(
            read,
            Run {
                key: None,
                schedule: None,
                next_firing: None,
                ..full.clone()
            }
        );
        let none = Run {
            key: None,
            schedule: None,
            next_firing: None,
            ..full
        };
        assert_eq!(decode(&encode(&none)), Some(none));
    }
}
