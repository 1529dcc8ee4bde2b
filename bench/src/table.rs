//! The benchmark table of docs/benchmarks.md, made from a results file and nothing else: the figures a
//! reader sees are the figures the run wrote (`scripts/bench-table.sh` puts it in docs/benchmarks.md
//! and CI checks that it still matches).

use std::fmt::Write;

use anyhow::Context;
use serde_json::Value;

fn num(v: &Value, path: &str) -> anyhow::Result<f64> {
    v.pointer(path)
        .and_then(Value::as_f64)
        .with_context(|| format!("the results file has no number at {path}"))
}

fn text<'a>(v: &'a Value, path: &str) -> &'a str {
    v.pointer(path).and_then(Value::as_str).unwrap_or("unknown")
}

/// `low-high` pairs/s of the rounds.
fn spread(v: &Value, path: &str, i: usize) -> String {
    let low = v.pointer(&format!("{path}/{i}/0")).and_then(Value::as_f64);
    let high = v.pointer(&format!("{path}/{i}/1")).and_then(Value::as_f64);
    match (low, high) {
        (Some(low), Some(high)) => format!("{low:.0}-{high:.0}"),
        _ => "-".to_owned(),
    }
}

/// The markdown: provenance, the Redis rows (if measured), the PostgreSQL rows (if measured),
/// and the targets.
pub(crate) fn markdown(r: &Value) -> anyhow::Result<String> {
    let mut out = String::new();
    let rounds = r.get("rounds").and_then(Value::as_u64).unwrap_or(0);
    writeln!(
        out,
        "Run of commit {} on {} ({} mode, {} build; {}, {} cores; {}; Redis {}); medians of \
         {rounds} rounds, implementations rotating their order each round.\n",
        text(r, "/provenance/commit"),
        text(r, "/provenance/date"),
        text(r, "/mode"),
        if r.pointer("/provenance/release_build") == Some(&Value::Bool(true)) {
            "release"
        } else {
            "debug"
        },
        text(r, "/provenance/cpu_model"),
        r.pointer("/provenance/cores")
            .and_then(Value::as_u64)
            .unwrap_or(0),
        text(r, "/provenance/rustc"),
        text(r, "/redis_version"),
    )?;
    writeln!(out, "| row | implementation | result | vs baseline |")?;
    writeln!(out, "|---|---|---|---|")?;
    if r.get("pairs_per_s_1_task").is_some() {
        redis_rows(r, &mut out)?;
    }
    if r.get("postgres").is_some() {
        postgres_rows(r, &mut out)?;
    }
    if r.get("etcd").is_some() {
        store_rows(r, "etcd", "etcd", &mut out)?;
    }
    if r.get("zookeeper").is_some() {
        store_rows(r, "zookeeper", "ZooKeeper", &mut out)?;
    }
    if let Some(targets) = r.get("targets").and_then(Value::as_array) {
        writeln!(out, "\n```text\ntargets:")?;
        for t in targets {
            let met = t.get("met").and_then(Value::as_bool).unwrap_or(false);
            writeln!(
                out,
                "  {:<48} {:<7} {}",
                text(t, "/target"),
                if met { "met" } else { "MISSED" },
                text(t, "/value")
            )?;
        }
        writeln!(out, "```")?;
    }
    Ok(out)
}

fn redis_rows(r: &Value, out: &mut String) -> anyhow::Result<()> {
    // Files before `server_time` summed INFO commandstats (which counts a script's inner
    // commands twice); later ones record the server process's CPU time. Say which.
    let server = if r.get("server_time").is_some() {
        "server CPU"
    } else {
        "server, commandstats"
    };
    let names: Vec<&str> = r
        .get("implementations")
        .and_then(Value::as_array)
        .context("no implementations")?
        .iter()
        .filter_map(Value::as_str)
        .collect();
    for (label, key) in [
        ("1. pairs/s, 1 task", "1_task"),
        ("2. pairs/s, 64 tasks", "64_tasks"),
    ] {
        let base = num(r, &format!("/pairs_per_s_{key}/0"))?;
        for (i, name) in names.iter().enumerate() {
            let rate = num(r, &format!("/pairs_per_s_{key}/{i}"))?;
            writeln!(
                out,
                "| {label} | {name} | {rate:.0} (rounds {}; {server} {:.1} us/pair) | {:.2}x |",
                spread(r, &format!("/pairs_per_s_{key}_spread"), i),
                num(r, &format!("/server_us_per_pair_{key}/{i}"))?,
                rate / base.max(1e-9)
            )?;
        }
    }
    if let Some(shared) = r.get("shared_keys") {
        let label = format!(
            "2b. pairs/s, {} tasks on {} clients, {} keys",
            num(shared, "/tasks")?,
            num(shared, "/clients")?,
            num(shared, "/keys")?
        );
        let base = num(shared, "/pairs_per_s/0")?;
        let names = shared
            .get("implementations")
            .and_then(Value::as_array)
            .context("no shared-keys implementations")?;
        for (i, name) in names.iter().enumerate() {
            let rate = num(shared, &format!("/pairs_per_s/{i}"))?;
            // Files before `tries` did not count the tries that found a key held.
            let held = match (
                shared
                    .pointer(&format!("/tries/{i}"))
                    .and_then(Value::as_f64),
                shared
                    .pointer(&format!("/tries_held/{i}"))
                    .and_then(Value::as_f64),
            ) {
                (Some(tries), Some(held)) => {
                    format!(
                        "; {:.1}% of tries found the key held",
                        held / tries.max(1.0) * 100.0
                    )
                }
                _ => String::new(),
            };
            writeln!(
                out,
                "| {label} | {} | {rate:.0} (rounds {}; {server} {:.1} us/pair{held}) | {:.2}x |",
                name.as_str().unwrap_or("?"),
                spread(shared, "/pairs_per_s_spread", i),
                num(shared, &format!("/server_us_per_pair/{i}"))?,
                rate / base.max(1e-9)
            )?;
        }
    }
    let rs = num(r, "/handoff_ms/rslock/p50")?;
    for (name, key) in [
        ("ours (event-driven wait)", "ours"),
        ("rslock 0.10 acquire (0-200 ms retries)", "rslock"),
        ("async-redis-lock 0.4 (100 ms retries)", "async_redis_lock"),
        ("5 ms poll loop", "poll_5ms"),
        ("50 ms poll loop", "poll_50ms"),
    ] {
        let Some(p50) = r
            .pointer(&format!("/handoff_ms/{key}/p50"))
            .and_then(Value::as_f64)
        else {
            continue;
        };
        let p99 = num(r, &format!("/handoff_ms/{key}/p99"))?;
        let vs = if key == "rslock" {
            "baseline".to_owned()
        } else if p50 <= rs {
            format!("{:.1}x faster than rslock at p50", rs / p50.max(1e-9))
        } else {
            format!("{:.1}x slower than rslock at p50", p50 / rs.max(1e-9))
        };
        writeln!(
            out,
            "| 3. handoff p50 / p99 | {name} | {p50:.2} / {p99:.2} ms | {vs} |"
        )?;
    }
    let mean = num(r, "/fairness/mean")?;
    let min = num(r, "/fairness/min")?;
    writeln!(
        out,
        "| 4. fairness, 16 waiters (4 runtimes x 4), {:.0} s | ours | acquisitions per waiter min {min:.0} / mean {mean:.1} / max {:.0} | min = {:.0}% of mean |",
        r.pointer("/fairness/seconds")
            .and_then(Value::as_f64)
            .unwrap_or(0.0),
        num(r, "/fairness/max")?,
        min / mean.max(1e-9) * 100.0
    )?;
    watchdog_row(r, out, "5. watchdog", "watchdog")?;
    let quartiles = |store: &str| -> Option<(f64, f64)> {
        let q = r.pointer(&format!("/macro_overhead/{store}_quartiles"))?;
        Some((q.get(0)?.as_f64()?, q.get(1)?.as_f64()?))
    };
    let slices = num(r, "/macro_overhead/slices")?;
    let slice_ms = num(r, "/macro_overhead/slice_ms")?;
    let (method, redis_spread, memory_spread) =
        match (quartiles("redis"), quartiles("memory_store")) {
            // Since 6c93806: the median of paired slices' ratios, with their quartiles.
            (Some(redis), Some(memory)) => (
                format!("median of {slices:.0} pairs of back-to-back slices of {slice_ms:.0} ms"),
                format!(" (quartiles {:.3}-{:.3})", redis.0, redis.1),
                format!(" ({:.3}-{:.3})", memory.0, memory.1),
            ),
            // Older files: the ratio of the summed rates.
            _ => (
                format!("{slices:.0} alternating slices of {slice_ms:.0} ms"),
                String::new(),
                String::new(),
            ),
        };
    writeln!(
        out,
        "| 6. macro overhead, {method} | attribute vs programmatic, 1 task | {:.3}x on Redis{redis_spread}, {:.3}x on the memory store{memory_spread} | |",
        num(r, "/macro_overhead/redis")?,
        num(r, "/macro_overhead/memory_store")?,
    )?;
    watchdog_row(r, out, "7. many leases", "many_leases")?;
    Ok(())
}

fn watchdog_row(r: &Value, out: &mut String, row: &str, key: &str) -> anyhow::Result<()> {
    let w = r.get(key).context("no watchdog row")?;
    writeln!(
        out,
        "| {row}, {:.0} leases ttl {:.0} s for {:.0} s | ours | lost {:.0}; {:.1} renewal script calls/s, {:.0} leases renewed/s (counted by the server); CPU {:.1}%; peak RSS {:.1} MiB | |",
        num(w, "/leases")?,
        num(w, "/ttl_s")?,
        num(w, "/held_s")?,
        num(w, "/lost")?,
        num(w, "/renewal_calls_per_s")?,
        num(w, "/leases_renewed_per_s")?,
        num(w, "/cpu_percent")?,
        num(w, "/peak_rss_mib")?,
    )?;
    Ok(())
}

/// Rows 1-3 of a store against its hand-written lock (`etcd`, `zookeeper`), named `name`;
/// the baseline's label is the results file's own.
fn store_rows(r: &Value, key: &str, name: &str, out: &mut String) -> anyhow::Result<()> {
    let rows = r.get(key).with_context(|| format!("no {name} rows"))?;
    let version = text(rows, "/server_version");
    let baseline = text(rows, "/implementations/0");
    for (label, key, tasks) in [("1", "1_task", "1 task"), ("2", "64_tasks", "64 tasks")] {
        let hand = num(rows, &format!("/pairs_per_s_{key}/0"))?;
        let ours = num(rows, &format!("/pairs_per_s_{key}/1"))?;
        writeln!(
            out,
            "| {label}. pairs/s, {tasks}, {name} {version} (1 member) | {baseline} | {hand:.0} | baseline |"
        )?;
        writeln!(
            out,
            "| {label}. pairs/s, {tasks}, {name} {version} (1 member) | ours (programmatic) | {ours:.0} | {:.2}x |",
            ours / hand.max(1e-9)
        )?;
    }
    writeln!(
        out,
        "| 3. handoff p50 / p99, {name} {version} (1 member) | ours (watch) | {:.2} / {:.2} ms | |",
        num(rows, "/handoff_ms/p50")?,
        num(rows, "/handoff_ms/p99")?,
    )?;
    Ok(())
}

fn postgres_rows(r: &Value, out: &mut String) -> anyhow::Result<()> {
    let pg = r.get("postgres").context("no PostgreSQL rows")?;
    let version = text(pg, "/server_version");
    for (label, key) in [("1", "1_task"), ("2", "64_tasks")] {
        let tasks = if key == "1_task" {
            "1 task"
        } else {
            "64 tasks"
        };
        let hand = num(pg, &format!("/pairs_per_s_{key}/0"))?;
        let ours = num(pg, &format!("/pairs_per_s_{key}/1"))?;
        writeln!(
            out,
            "| {label}. pairs/s, {tasks}, PostgreSQL {version} | hand-written INSERT .. ON CONFLICT + DELETE | {hand:.0} | baseline |"
        )?;
        writeln!(
            out,
            "| {label}. pairs/s, {tasks}, PostgreSQL {version} | ours (programmatic) | {ours:.0} | {:.2}x |",
            ours / hand.max(1e-9)
        )?;
    }
    writeln!(
        out,
        "| 3. handoff p50 / p99, PostgreSQL {version} | ours (LISTEN/NOTIFY) | {:.2} / {:.2} ms | |",
        num(pg, "/handoff_ms/p50")?,
        num(pg, "/handoff_ms/p99")?,
    )?;
    Ok(())
}
