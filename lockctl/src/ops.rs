//! The commands, and how their answers are shown: a table for people, JSON for scripts.

use std::io::{IsTerminal, Write};
use std::process::ExitCode;
use std::time::Duration;

use lock_runtime::store::QuorumView;
use lock_runtime::{LockInfo, LockRuntime};

use crate::Action;

/// Writes to stdout; false when the reader went away (`lockctl list | head -1`), which ends
/// the output quietly rather than with a panic.
pub(crate) fn emit(text: &str) -> anyhow::Result<bool> {
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// Runs one command; exit codes: 0 done, 1 not locked, 2 error (from the caller).
pub(crate) async fn run(
    runtime: &LockRuntime,
    action: Action,
    json: bool,
) -> anyhow::Result<ExitCode> {
    match action {
        Action::List { pattern } => {
            let locks = runtime.list(&pattern).await?;
            emit(&render(&locks, json))?;
            Ok(ExitCode::SUCCESS)
        }
        Action::Show { key } => match runtime.inspect(&key).await? {
            Some(lock) => {
                emit(&render(&[lock], json))?;
                Ok(ExitCode::SUCCESS)
            }
            None => {
                emit(&if json {
                    "null\n".to_owned()
                } else {
                    format!("`{key}` is not locked\n")
                })?;
                Ok(ExitCode::from(1))
            }
        },
        Action::Release {
            key,
            force,
            fence,
            holder,
        } => {
            if !force {
                anyhow::bail!(
                    "refusing to release `{key}` without --force: the holder may still be \
                     working, and a second holder would run alongside it"
                );
            }
            let released = match (fence, holder) {
                (Some(fence), _) => runtime.force_release_fence(&key, fence).await?,
                (None, Some(holder)) => runtime.force_release_holder(&key, &holder).await?,
                (None, None) => runtime.force_release(&key).await?,
            };
            // Not released: say whether the lock is free or has another holder now.
            let holder = if released {
                None
            } else {
                runtime.inspect(&key).await?
            };
            if json {
                let now = holder.as_ref().and_then(|h| h.fence);
                let holding = holder.as_ref().map(|h| h.holder.as_str());
                emit(&format!(
                    "{}\n",
                    serde_json::json!({
                        "key": key,
                        "released": released,
                        "held_with_fence": now,
                        "held_by_holder": holding,
                    })
                ))?;
            } else if released {
                emit(&format!("released `{key}`; waiters were woken\n"))?;
            } else if let Some(holder) = holder {
                emit(&match holder.fence {
                    Some(fence) => format!(
                        "`{key}` was not released: it is held with fence {fence} by {}\n",
                        holder.owner
                    ),
                    None => format!(
                        "`{key}` was not released: it is held by {} (holding {}, no fence \
                         issued)\n",
                        holder.owner, holder.holder
                    ),
                })?;
            } else {
                emit(&format!("`{key}` was not locked\n"))?;
            }
            Ok(if released {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            })
        }
        Action::Watch {
            pattern,
            interval,
            count,
        } => {
            let interval = Duration::try_from_secs_f64(interval)
                .ok()
                .filter(|d| *d >= Duration::from_millis(100))
                .ok_or_else(|| anyhow::anyhow!("--interval must be at least 0.1 seconds"))?;
            watch(runtime, &pattern, interval, count, json).await?;
            Ok(ExitCode::SUCCESS)
        }
        Action::Jobs => {
            emit(&crate::history::jobs(runtime, json).await?)?;
            Ok(ExitCode::SUCCESS)
        }
        Action::Serve { .. } => anyhow::bail!("serve is started by main"),
        Action::History { job, since, limit } => {
            let since = since
                .map(|s| crate::history::parse_since(&s, std::time::SystemTime::now()))
                .transpose()?;
            let (text, shown) = crate::history::history(runtime, &job, limit, since, json).await?;
            emit(&text)?;
            Ok(if shown > 0 {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            })
        }
    }
}

/// Prints the list every `interval` until Ctrl-C (or `count` refreshes): on a terminal the
/// screen is redrawn; otherwise (and with --json, one array per line) each refresh follows the
/// last, so the output can be piped. A refresh that fails (the store restarting, a failover)
/// is reported on stderr and the watch goes on.
async fn watch(
    runtime: &LockRuntime,
    pattern: &str,
    interval: Duration,
    count: Option<u64>,
    json: bool,
) -> anyhow::Result<()> {
    let redraw = !json && std::io::stdout().is_terminal();
    let mut ticks = tokio::time::interval(interval);
    let mut shown = 0u64;
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    while count.is_none_or(|count| shown < count) {
        tokio::select! {
            _ = &mut ctrl_c => break,
            _ = ticks.tick() => {}
        }
        let listed = tokio::select! {
            _ = &mut ctrl_c => break,
            listed = runtime.list(pattern) => listed,
        };
        shown += 1;
        let locks = match listed {
            Ok(locks) => locks,
            Err(e) => {
                eprintln!("lockctl: refresh failed: {e}");
                continue;
            }
        };
        let mut text = String::new();
        if redraw {
            // Clear the screen and go home, then the table under a heading.
            text.push_str("\x1b[2J\x1b[H");
            text.push_str(&format!(
                "{} locks matching `{pattern}`, every {interval:?} (Ctrl-C stops)\n\n",
                locks.len()
            ));
        }
        if json {
            text.push_str(&serde_json::to_string(&to_json(&locks))?);
            text.push('\n');
        } else {
            text.push_str(&table(&locks));
            if !redraw {
                text.push('\n');
            }
        }
        if !emit(&text)? {
            break;
        }
    }
    Ok(())
}

fn render(locks: &[LockInfo], json: bool) -> String {
    if json {
        // Serialising plain JSON values cannot fail; fall back to `null` rather than panic.
        let text = serde_json::to_string_pretty(&to_json(locks)).unwrap_or_else(|_| "null".into());
        format!("{text}\n")
    } else {
        table(locks)
    }
}

/// A fence as a cell: the number, or `-` when none was issued.
pub(crate) fn fence_text(fence: Option<u64>) -> String {
    fence.map_or_else(|| "-".to_owned(), |f| f.to_string())
}

fn secs(d: Option<Duration>) -> String {
    d.map_or_else(|| "-".to_owned(), |d| format!("{:.1}s", d.as_secs_f64()))
}

/// `3/5`, flagged where the masters disagree or no majority holds the lock.
fn masters(q: &QuorumView) -> String {
    let mut text = format!("{}/{}", q.agreeing, q.masters);
    if !q.has_quorum() {
        text.push_str(" no quorum");
    }
    if q.disagreeing > 0 {
        text.push_str(&format!(", {} disagree", q.disagreeing));
    }
    if q.unanswered > 0 {
        text.push_str(&format!(", {} unanswered", q.unanswered));
    }
    text
}

/// A plain-text table; a MASTERS column on Redlock.
pub(crate) fn table(rows: &[LockInfo]) -> String {
    let redlock = rows.iter().any(|r| r.quorum.is_some());
    let mut header = vec!["KEY", "OWNER", "FENCE", "AGE", "TTL"];
    if redlock {
        header.push("MASTERS");
    }
    let mut cells: Vec<Vec<String>> = vec![header.into_iter().map(str::to_owned).collect()];
    for r in rows {
        let mut row = vec![
            r.key.clone(),
            r.owner.clone(),
            fence_text(r.fence),
            secs(r.held_for),
            secs(r.remaining),
        ];
        if redlock {
            row.push(r.quorum.as_ref().map_or_else(|| "-".to_owned(), masters));
        }
        cells.push(row);
    }
    let columns = cells[0].len();
    let widths: Vec<usize> = (0..columns)
        .map(|c| {
            cells
                .iter()
                .map(|row| row[c].chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for row in &cells {
        let line: Vec<String> = row
            .iter()
            .zip(&widths)
            .map(|(cell, w)| format!("{cell:<w$}"))
            .collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    out
}

/// JSON rows: key, owner, fence, age_ms, ttl_ms, and on Redlock `masters` (agreeing,
/// disagreeing, unanswered, total, quorum).
pub(crate) fn to_json(rows: &[LockInfo]) -> serde_json::Value {
    serde_json::Value::Array(
        rows.iter()
            .map(|r| {
                let mut row = serde_json::json!({
                    "key": r.key,
                    "owner": r.owner,
                    "fence": r.fence,
                    "holder": r.holder,
                    "age_ms": r.held_for.map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
                    "ttl_ms": r.remaining.map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
                });
                if let Some(q) = &r.quorum {
                    row["masters"] = serde_json::json!({
                        "agreeing": q.agreeing,
                        "disagreeing": q.disagreeing,
                        "unanswered": q.unanswered,
                        "total": q.masters,
                        "quorum": q.has_quorum(),
                    });
                }
                row
            })
            .collect(),
    )
}
