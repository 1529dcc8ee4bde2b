//! The HTML of `lockctl serve`: a few pages built from escaped strings, and the timeline of a
//! job's runs as an SVG drawn here, so the page needs no script.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use chrono::{DateTime, Utc};
use lock_runtime::{LockInfo, Run, RunOutcome};

use crate::history::{JobRow, holder_text, rfc3339, took_ms};
use crate::ops::fence_text;

/// `text` safe inside HTML text and attribute values.
pub(crate) fn esc(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// `text` as one path segment of a link: every byte but the unreserved ones percent-encoded.
pub(crate) fn segment(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

/// The page around `body`, titled `title`, under a header naming the store and namespace.
pub(crate) fn layout(title: &str, store: &str, namespace: &str, body: &str) -> String {
    format!(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>{title} · lockctl</title><style>{STYLE}</style></head><body>\
         <header><a href=\"/\">lockctl</a> <span class=\"where\">{store} · namespace \
         <code>{namespace}</code></span></header><main>{body}</main></body></html>\n",
        title = esc(title),
        store = esc(store),
        namespace = esc(namespace),
    )
}

const STYLE: &str = "body{font-family:system-ui,sans-serif;margin:0;color:#1b1b1b}\
header{background:#263238;color:#eceff1;padding:.6em 1em}header a{color:#fff;font-weight:bold;\
text-decoration:none;margin-right:1em}.where{opacity:.8}main{padding:1em}\
table{border-collapse:collapse;margin:.5em 0 1.5em}th,td{padding:.3em .8em;border-bottom:1px \
solid #ddd;text-align:left}th{background:#f5f5f5}td.num{text-align:right}\
.ok{color:#2e7d32}.failed,.lost,.crashed{color:#c62828}.skipped,.already_done,.missed{color:#757575}\
.note{color:#555}form{margin:1em 0}input{font:inherit;padding:.2em}button{font:inherit}";

/// The colour of an outcome on the timeline.
fn colour(outcome: &RunOutcome) -> &'static str {
    match outcome {
        RunOutcome::Ok => "#2e7d32",
        RunOutcome::Failed { .. } => "#c62828",
        RunOutcome::Lost => "#ef6c00",
        RunOutcome::Crashed => "#6a1b9a",
        RunOutcome::Skipped { .. } | RunOutcome::AlreadyDone => "#9e9e9e",
        RunOutcome::Missed => "#546e7a",
        _ => "#9e9e9e",
    }
}

/// Whether a run did work (a bar on the timeline) rather than only say why not (a tick).
fn ran(outcome: &RunOutcome) -> bool {
    matches!(
        outcome,
        RunOutcome::Ok | RunOutcome::Failed { .. } | RunOutcome::Lost | RunOutcome::Crashed
    )
}

/// One job per row: its name (a link to its runs), schedule, next firing, last run and the
/// holder of its lock.
pub(crate) fn jobs_table(jobs: &[JobRow]) -> String {
    if jobs.is_empty() {
        return "<p class=\"note\" id=\"no-jobs\">No scheduled job has a journal in this \
                namespace yet.</p>"
            .to_owned();
    }
    let mut out = String::from(
        "<table id=\"jobs\"><thead><tr><th>Job</th><th>Schedule</th><th>Next firing</th>\
         <th>Last firing</th><th>Instance</th><th>Outcome</th><th>Took</th><th>Holder now</th>\
         </tr></thead><tbody>",
    );
    for row in jobs {
        let _ = write!(
            out,
            "<tr data-job=\"{job}\"><td><a href=\"/jobs/{link}\">{job}</a></td><td>{schedule}</td>\
             <td>{next}</td>",
            job = esc(&row.job),
            link = esc(&segment(&row.job)),
            schedule = esc(row.schedule.as_deref().unwrap_or("-")),
            next = row.next.map_or_else(|| "-".to_owned(), rfc3339),
        );
        match &row.last {
            Some(r) => {
                let _ = write!(
                    out,
                    "<td>{at}</td><td>{owner}</td><td class=\"{label}\">{outcome}</td>\
                     <td class=\"num\">{took} ms</td>",
                    at = rfc3339(r.scheduled_at()),
                    owner = esc(r.owner()),
                    label = r.outcome().label(),
                    outcome = esc(&r.outcome().to_string()),
                    took = took_ms(r),
                );
            }
            None => out.push_str("<td>-</td><td>-</td><td>-</td><td>-</td>"),
        }
        let _ = write!(
            out,
            "<td class=\"holder\">{}</td></tr>",
            esc(&holder_text(row.holder.as_ref()))
        );
    }
    out.push_str("</tbody></table>");
    out
}

fn secs(d: Option<Duration>) -> String {
    d.map_or_else(|| "-".to_owned(), |d| format!("{:.1} s", d.as_secs_f64()))
}

/// The locks held now; each with a link to force its release when the server allows it.
pub(crate) fn locks_table(locks: &[LockInfo], releasing: bool) -> String {
    if locks.is_empty() {
        return "<p class=\"note\" id=\"no-locks\">No lock is held.</p>".to_owned();
    }
    let mut out = String::from(
        "<table id=\"locks\"><thead><tr><th>Key</th><th>Owner</th><th>Fence</th><th>Held for</th>\
         <th>Time left</th>",
    );
    if releasing {
        out.push_str("<th></th>");
    }
    out.push_str("</tr></thead><tbody>");
    for l in locks {
        let _ = write!(
            out,
            "<tr data-key=\"{key}\"><td>{key}</td><td>{owner}</td><td class=\"num\">{fence}</td>\
             <td class=\"num\">{age}</td><td class=\"num\">{left}</td>",
            key = esc(&l.key),
            owner = esc(&l.owner),
            fence = fence_text(l.fence),
            age = secs(l.held_for),
            left = secs(l.remaining),
        );
        if releasing {
            let _ = write!(
                out,
                "<td><a href=\"/locks/{}/release?holder={}\">force release…</a></td>",
                esc(&segment(&l.key)),
                esc(&segment(&l.holder))
            );
        }
        out.push_str("</tr>");
    }
    out.push_str("</tbody></table>");
    out
}

/// A job's runs, newest first.
pub(crate) fn runs_table(runs: &[Run]) -> String {
    let mut out = String::from(
        "<table id=\"runs\"><thead><tr><th>Firing</th><th>Instance</th><th>Outcome</th>\
         <th>Started</th><th>Took</th><th>Fence</th></tr></thead><tbody>",
    );
    for r in runs {
        let _ = write!(
            out,
            "<tr data-firing=\"{at}\"><td>{at}</td><td>{owner}</td><td class=\"{label}\">{outcome}</td>\
             <td>{started}</td><td class=\"num\">{took} ms</td><td class=\"num\">{fence}</td></tr>",
            at = rfc3339(r.scheduled_at()),
            owner = esc(r.owner()),
            label = r.outcome().label(),
            outcome = esc(&r.outcome().to_string()),
            started = rfc3339(r.started_at()),
            took = took_ms(r),
            fence = r.fence().map_or_else(|| "-".to_owned(), |f| f.to_string()),
        );
    }
    out.push_str("</tbody></table>");
    out
}

fn ms(t: SystemTime) -> i128 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| i128::try_from(d.as_millis()).unwrap_or(i128::MAX))
}

/// The timeline: one lane per instance, time from left to right; a run is a bar from its
/// start to its end, coloured by outcome; a firing skipped or missed is a tick at its
/// scheduled instant. Every mark carries its firing, instance and outcome as data
/// attributes, and a tooltip.
pub(crate) fn timeline(runs: &[Run]) -> String {
    const WIDTH: i128 = 960;
    const LEFT: i128 = 170;
    const LANE: i128 = 30;
    const TOP: i128 = 10;
    // Room for the last time label, centred on the axis's end.
    const RIGHT: i128 = 60;
    let instances: Vec<&str> = runs
        .iter()
        .map(Run::owner)
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let lanes = i128::try_from(instances.len()).unwrap_or(0);
    let height = TOP + lanes * LANE + 40;
    let from = runs
        .iter()
        .map(|r| ms(r.scheduled_at()).min(ms(r.started_at())))
        .min()
        .unwrap_or(0);
    let to = runs
        .iter()
        .map(|r| ms(r.finished_at()).max(ms(r.scheduled_at())))
        .max()
        .unwrap_or(0)
        .max(from + 1_000);
    let span = to - from;
    let x = |t: i128| LEFT + (t - from) * (WIDTH - LEFT - RIGHT) / span;
    let mut out = format!(
        "<svg id=\"timeline\" xmlns=\"http://www.w3.org/2000/svg\" width=\"{WIDTH}\" \
         height=\"{height}\" viewBox=\"0 0 {WIDTH} {height}\" role=\"img\" \
         aria-label=\"runs per instance over time\" font-family=\"system-ui,sans-serif\" \
         font-size=\"12\">"
    );
    for (i, name) in instances.iter().enumerate() {
        let y = TOP + i128::try_from(i).unwrap_or(0) * LANE;
        let _ = write!(
            out,
            "<rect x=\"0\" y=\"{y}\" width=\"{WIDTH}\" height=\"{LANE}\" fill=\"{}\"/>\
             <text x=\"6\" y=\"{}\" class=\"lane\">{}</text>",
            if i % 2 == 0 { "#fafafa" } else { "#f0f0f0" },
            y + LANE / 2 + 4,
            esc(name)
        );
    }
    for r in runs {
        let lane = instances.iter().position(|i| *i == r.owner()).unwrap_or(0);
        let y = TOP + i128::try_from(lane).unwrap_or(0) * LANE;
        let tip = format!(
            "{} · {} · {} · {} ms",
            rfc3339(r.scheduled_at()),
            r.owner(),
            r.outcome(),
            took_ms(r)
        );
        let data = format!(
            "class=\"mark\" data-firing=\"{}\" data-instance=\"{}\" data-outcome=\"{}\"",
            rfc3339(r.scheduled_at()),
            esc(r.owner()),
            r.outcome().label()
        );
        if ran(r.outcome()) {
            let x0 = x(ms(r.started_at()));
            let w = (x(ms(r.finished_at())) - x0).max(3);
            let _ = write!(
                out,
                "<rect {data} x=\"{x0}\" y=\"{}\" width=\"{w}\" height=\"{}\" fill=\"{}\" \
                 rx=\"2\"><title>{}</title></rect>",
                y + 6,
                LANE - 12,
                colour(r.outcome()),
                esc(&tip)
            );
        } else {
            let x0 = x(ms(r.scheduled_at()));
            let _ = write!(
                out,
                "<rect {data} x=\"{}\" y=\"{}\" width=\"2\" height=\"{}\" fill=\"{}\">\
                 <title>{}</title></rect>",
                x0 - 1,
                y + 3,
                LANE - 6,
                colour(r.outcome()),
                esc(&tip)
            );
        }
    }
    // The time axis: five instants, as time of day (UTC).
    let axis = TOP + lanes * LANE + 4;
    let _ = write!(
        out,
        "<line x1=\"{LEFT}\" y1=\"{axis}\" x2=\"{}\" y2=\"{axis}\" stroke=\"#888\"/>",
        WIDTH - RIGHT
    );
    for k in 0..5i128 {
        let t = from + span * k / 4;
        let label = DateTime::<Utc>::from(
            UNIX_EPOCH + Duration::from_millis(u64::try_from(t).unwrap_or(0)),
        )
        .format("%H:%M:%S%.3f")
        .to_string();
        let _ = write!(
            out,
            "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\" fill=\"#555\">{label}</text>",
            x(t),
            axis + 16
        );
    }
    out.push_str("</svg>");
    out
}

/// The legend of the timeline's colours.
pub(crate) fn legend() -> String {
    let items = [
        ("ok", "#2e7d32"),
        ("failed", "#c62828"),
        ("lost", "#ef6c00"),
        ("crashed", "#6a1b9a"),
        ("skipped / already done", "#9e9e9e"),
        ("missed", "#546e7a"),
    ];
    let mut out = String::from("<p class=\"note\">");
    for (name, c) in items {
        let _ = write!(
            out,
            "<span style=\"display:inline-block;width:.8em;height:.8em;background:{c};\
             margin:0 .3em 0 1em\"></span>{name}"
        );
    }
    out.push_str(
        "<br>Bars: from a run's start to its end, on its instance's clock. Ticks: a firing \
         skipped or missed, at its scheduled instant. Times are UTC.</p>",
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_and_links_are_escaped() {
        assert_eq!(
            esc("<a href=\"x\">&'</a>"),
            "&lt;a href=&quot;x&quot;&gt;&amp;&#39;&lt;/a&gt;"
        );
        assert_eq!(segment("post interest/2?#"), "post%20interest%2F2%3F%23");
        assert_eq!(segment("nächtlich"), "n%C3%A4chtlich");
    }

    #[test]
    fn an_empty_history_draws_an_empty_timeline() {
        let svg = timeline(&[]);
        assert!(svg.starts_with("<svg id=\"timeline\""), "{svg}");
        assert!(!svg.contains("class=\"mark\""), "{svg}");
    }
}
