//! The benchmark harness: starts a private redis-server on a free loopback port and measures
//! lock-runtime side by side with raw redis-rs, rslock and async-redis-lock, every row against
//! a baseline measured in the same run.
//!
//! ```text
//! cargo run --release -p lock-bench              # full run (a few minutes)
//! cargo run --release -p lock-bench -- --quick   # seconds; what CI runs
//! cargo run --release -p lock-bench -- --json results.json
//! cargo run --release -p lock-bench -- --postgres-only  # the PostgreSQL rows alone
//! cargo run --release -p lock-bench -- --etcd-only [--quick]  # the etcd rows alone, printed
//! cargo run --release -p lock-bench -- --zookeeper-only [--quick] [--json PATH]  # the ZooKeeper rows alone
//! cargo run -p lock-bench -- --table results.json       # the table of docs/benchmarks.md from a results file
//! cargo run --release -p lock-bench -- --throughput [--ours-only] [--quick]  # rows 1 and 2 alone, printed
//! cargo run --release -p lock-bench -- --macro-overhead [--redis] [--quick] [--json PATH]  # row 6 taken apart (with --redis: and row 6 itself)
//! cargo run --release -p lock-bench -- --script-costs [--quick] [--json PATH]  # where a pair's server time goes
//! cargo run --release -p lock-bench -- --profile ours|attribute|raw [SECONDS]  # row 2 of one implementation, for perf
//! ```

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use lock_runtime::LockRuntime;
use lock_tests::RedisServer;
use serde_json::json;

mod costs;
mod etcd;
mod handoff;
mod overhead;
mod peers;
mod pg;
mod rows;
mod sys;
mod table;
mod zookeeper;

use peers::{Impl, RawLock, rslock_once};

struct Mode {
    name: &'static str,
    pair_duration: Duration,
    rounds: usize,
    handoffs: usize,
    poll_handoffs: usize,
    fairness: Duration,
    watchdog_leases: usize,
    watchdog_hold: Duration,
    macro_slices: usize,
    macro_slice: Duration,
    many_leases: usize,
    many_leases_hold: Duration,
}

const FULL: Mode = Mode {
    name: "full",
    pair_duration: Duration::from_secs(2),
    rounds: 5,
    handoffs: 200,
    poll_handoffs: 100,
    fairness: Duration::from_secs(10),
    watchdog_leases: 10_000,
    watchdog_hold: Duration::from_secs(30),
    macro_slices: 60,
    macro_slice: Duration::from_millis(200),
    many_leases: 100_000,
    many_leases_hold: Duration::from_secs(60),
};

const QUICK: Mode = Mode {
    name: "quick",
    pair_duration: Duration::from_millis(300),
    rounds: 1,
    handoffs: 20,
    poll_handoffs: 10,
    fairness: Duration::from_secs(2),
    watchdog_leases: 1_000,
    watchdog_hold: Duration::from_secs(4),
    macro_slices: 4,
    macro_slice: Duration::from_millis(100),
    many_leases: 5_000,
    many_leases_hold: Duration::from_secs(4),
};

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// The shared-keys row: tasks, clients per implementation, keys.
const SHARED_TASKS: usize = 256;
const SHARED_CLIENTS: usize = 4;
const SHARED_KEYS: usize = 1000;

/// A watchdog row as JSON.
fn watchdog_json(w: &rows::WatchdogFigures) -> serde_json::Value {
    json!({
        "leases": w.leases,
        "ttl_s": w.ttl.as_secs_f64(),
        "held_s": w.held_for.as_secs_f64(),
        "lost": w.lost,
        "renewal_calls_per_s": w.renewal_calls_per_s,
        "leases_renewed_per_s": w.leases_renewed_per_s,
        "cpu_percent": w.cpu_percent,
        "peak_rss_mib": w.peak_rss_mib,
        "rss_before_mib": w.rss_before_mib,
    })
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut mode = &FULL;
    let mut json_path = None;
    let mut postgres_only = false;
    let mut script_costs = false;
    let mut throughput_only = false;
    let mut macro_overhead = false;
    let mut on_redis = false;
    let mut ours_only = false;
    let mut etcd_only = false;
    let mut zookeeper_only = false;
    let mut profile: Option<(usize, f64)> = None;
    let mut iter = args.iter();
    while let Some(arg) = iter.next() {
        match arg.as_str() {
            "--quick" => mode = &QUICK,
            "--postgres-only" => postgres_only = true,
            "--script-costs" => script_costs = true,
            "--throughput" => throughput_only = true,
            "--macro-overhead" => macro_overhead = true,
            "--redis" => on_redis = true,
            "--ours-only" => ours_only = true,
            "--etcd-only" => etcd_only = true,
            "--zookeeper-only" => zookeeper_only = true,
            "--profile" => {
                let which = match iter.next().map(String::as_str) {
                    Some("raw") => 0,
                    Some("ours") => 1,
                    Some("attribute") => 2,
                    other => {
                        anyhow::bail!("--profile needs `ours`, `attribute` or `raw`, not {other:?}")
                    }
                };
                let seconds = match iter.clone().next().map(|s| s.parse::<f64>()) {
                    Some(Ok(seconds)) if seconds > 0.0 && seconds <= 600.0 => {
                        iter.next();
                        seconds
                    }
                    Some(Ok(seconds)) => {
                        anyhow::bail!("--profile: {seconds} s is outside 0-600 s")
                    }
                    _ => 10.0,
                };
                profile = Some((which, seconds));
            }
            "--table" => {
                let path = iter.next().context("--table needs a results file")?;
                let text =
                    std::fs::read_to_string(path).with_context(|| format!("reading {path}"))?;
                let report: serde_json::Value =
                    serde_json::from_str(&text).with_context(|| format!("parsing {path}"))?;
                print!("{}", table::markdown(&report)?);
                return Ok(());
            }
            "--json" => json_path = Some(iter.next().context("--json needs a file path")?.clone()),
            other => anyhow::bail!(
                "unknown argument `{other}`; use --quick, --postgres-only, --etcd-only, --zookeeper-only, --script-costs, --throughput, --macro-overhead [--redis] or --profile ours|attribute|raw [SECONDS], and/or --json PATH, or --table PATH"
            ),
        }
    }
    if cfg!(debug_assertions) {
        eprintln!("note: a debug build; run with --release for numbers worth quoting");
    }
    if script_costs {
        let (pairs, rounds) = if mode.name == "quick" {
            (costs::QUICK_PAIRS, 1)
        } else {
            (costs::FULL_PAIRS, costs::FULL_ROUNDS)
        };
        let mut report = costs::script_costs(pairs, rounds).await?;
        report["provenance"] = sys::provenance();
        if let Some(path) = json_path {
            std::fs::write(&path, serde_json::to_string_pretty(&report)?)?;
            println!("\nwrote {path}");
        }
        return Ok(());
    }
    if macro_overhead {
        let (rounds, slice) = if mode.name == "quick" {
            (3, Duration::from_millis(100))
        } else {
            (15, Duration::from_millis(500))
        };
        let server = if on_redis {
            Some(RedisServer::start())
        } else {
            None
        };
        let found = overhead::breakdown(rounds, slice, server.as_ref()).await?;
        // With Redis at hand, row 6 itself as the full run measures it.
        let row6 = match &server {
            Some(server) => {
                let runtime = LockRuntime::builder().redis(server.url()).build().await?;
                let found =
                    rows::macro_overhead(&runtime, mode.macro_slices, mode.macro_slice).await?;
                runtime.shutdown().await;
                println!(
                    "row 6 ({} pairs of {:?} slices, attribute / programmatic rate, median and quartiles):",
                    mode.macro_slices, mode.macro_slice
                );
                for (store, ratio) in ["Redis", "memory store"].iter().zip(&found) {
                    println!(
                        "  {store:<13} {:.3}x  ({:.3}-{:.3})",
                        ratio.median, ratio.quartiles.0, ratio.quartiles.1
                    );
                }
                Some(found)
            }
            None => None,
        };
        if let Some(path) = json_path {
            let report = json!({
                "mode": mode.name,
                "store": if on_redis { "redis" } else { "memory" },
                "rounds": rounds,
                "slice_ms": ms(slice),
                "try_acquire_future_bytes": found.acquire_future_bytes,
                "ns_per_pair": found.medians.iter().map(|(label, ns)| json!({"variant": label, "ns": ns})).collect::<Vec<_>>(),
                "row6": row6.map(|found| rows::MacroRatio::json(&found, mode.macro_slices, ms(mode.macro_slice))),
                "provenance": sys::provenance(),
            });
            std::fs::write(&path, serde_json::to_string_pretty(&report)?)?;
            println!("\nwrote {path}");
        }
        return Ok(());
    }
    if zookeeper_only {
        let rows = zookeeper::measure(mode.pair_duration, mode.rounds, mode.handoffs).await?;
        rows.print();
        if let Some(path) = json_path {
            let report = json!({"zookeeper": rows.json(), "provenance": sys::provenance()});
            std::fs::write(&path, serde_json::to_string_pretty(&report)?)?;
            println!("\nwrote {path}");
        }
        return Ok(());
    }
    if etcd_only {
        etcd::measure(mode.pair_duration, mode.rounds, mode.handoffs)
            .await?
            .print();
        return Ok(());
    }
    if postgres_only {
        let pg = pg::measure(mode.pair_duration, mode.rounds, mode.handoffs).await?;
        let report = json!({
            "mode": mode.name,
            "rounds": mode.rounds,
            "provenance": sys::provenance(),
            "postgres": pg_json(&pg),
        });
        print!("{}", table::markdown(&report)?);
        if let Some(path) = json_path {
            std::fs::write(&path, serde_json::to_string_pretty(&report)?)?;
            println!("\nwrote {path}");
        }
        return Ok(());
    }
    let server = RedisServer::start();
    let url = server.url();
    let redis_version: String = {
        let mut conn = server.client().get_multiplexed_async_connection().await?;
        let info: String = redis::cmd("INFO")
            .arg("server")
            .query_async(&mut conn)
            .await?;
        info.lines()
            .find_map(|l| l.strip_prefix("redis_version:"))
            .unwrap_or("unknown")
            .trim()
            .to_owned()
    };
    println!("lock-bench ({} mode), redis-server at {url}\n", mode.name);

    if let Some((which, seconds)) = profile {
        // One implementation alone on row 2's 64 tasks, so a profiler attached to this
        // process (`perf record -g -p PID`) sees only its pairs.
        let (ours_runtime, impls) = implementations(&url).await?;
        let imp = impls[which].clone();
        println!(
            "profiling {} with 64 tasks for {seconds} s; pid {}",
            imp.name(),
            std::process::id()
        );
        let (rate, pairs) =
            rows::throughput(imp, 64, Duration::from_secs_f64(seconds), "profile").await?;
        println!("{pairs} pairs, {rate:.0} pairs/s");
        ours_runtime.shutdown().await;
        return Ok(());
    }
    if throughput_only {
        // For iterating on the hot path: rows 1 and 2 with their ratios, nothing written.
        let (ours_runtime, mut impls) = implementations(&url).await?;
        if ours_only {
            // Raw redis-rs (the baseline) and ours (programmatic) only.
            impls.truncate(2);
        }
        for tasks in [1, 64] {
            let row =
                rows::throughput_table(&server, &impls, tasks, mode.pair_duration, mode.rounds)
                    .await?;
            println!("{tasks} task(s):");
            for (imp, t) in impls.iter().zip(row.iter()) {
                println!(
                    "  {:<28} {:>9.0} pairs/s ({:.2}x raw; spread {:.0}-{:.0}), server {:.2} us/pair, client {:.2} us/pair",
                    imp.name(),
                    t.pairs_per_s,
                    t.pairs_per_s / row[0].pairs_per_s.max(1.0),
                    t.spread.0,
                    t.spread.1,
                    t.server_us_per_pair,
                    t.client_us_per_pair
                );
            }
        }
        ours_runtime.shutdown().await;
        return Ok(());
    }

    // Row 5 first, so its peak RSS is not inflated by the other rows.
    let wd = rows::watchdog_scale(
        &server,
        mode.watchdog_leases,
        Duration::from_secs(3),
        mode.watchdog_hold,
    )
    .await?;
    // Row 7 next: its peak RSS is the process's peak so far, which row 5 stays under.
    let big = rows::watchdog_scale(
        &server,
        mode.many_leases,
        Duration::from_secs(10),
        mode.many_leases_hold,
    )
    .await?;

    let (ours_runtime, impls) = implementations(&url).await?;
    let one_t = rows::throughput_table(&server, &impls, 1, mode.pair_duration, mode.rounds).await?;
    let many_t =
        rows::throughput_table(&server, &impls, 64, mode.pair_duration, mode.rounds).await?;
    let one: Vec<f64> = one_t.iter().map(|t| t.pairs_per_s).collect();
    let many: Vec<f64> = many_t.iter().map(|t| t.pairs_per_s).collect();

    // The shared-keys row: 256 tasks on 4 clients (runtimes, connections, managers) of each
    // implementation, 1,000 keys.
    let mut shared_clients: Vec<Vec<Arc<Impl>>> = vec![Vec::new(), Vec::new(), Vec::new()];
    for _ in 0..SHARED_CLIENTS {
        shared_clients[0].push(Arc::new(Impl::Raw(RawLock::connect(&url).await?)));
        shared_clients[1].push(Arc::new(Impl::Ours(
            LockRuntime::builder().redis(url.as_str()).build().await?,
        )));
        shared_clients[2].push(Arc::new(Impl::Rslock(rslock_once(&url))));
    }
    let shared_names: Vec<&str> = shared_clients.iter().map(|c| c[0].name()).collect();
    let (shared_t, shared_tries) = rows::shared_keys_table(
        &server,
        &shared_clients,
        SHARED_TASKS,
        SHARED_KEYS,
        mode.pair_duration,
        mode.rounds,
    )
    .await?;
    for client in shared_clients.iter().flatten() {
        if let Impl::Ours(runtime) = &**client {
            runtime.shutdown().await;
        }
    }

    let (ours_p50, ours_p99) = {
        let holder = LockRuntime::builder().redis(url.as_str()).build().await?;
        let waiter = LockRuntime::builder().redis(url.as_str()).build().await?;
        rows::percentiles(handoff::handoff_ours(holder, waiter, mode.handoffs).await?)
    };
    let (rs_p50, rs_p99) = rows::percentiles(handoff::handoff_rslock(&url, mode.handoffs).await?);
    let (arl_p50, arl_p99) =
        rows::percentiles(handoff::handoff_async_redis_lock(&url, mode.poll_handoffs).await?);
    let (poll5_p50, poll5_p99) = rows::percentiles(
        handoff::handoff_poll(&url, mode.poll_handoffs, Duration::from_millis(5)).await?,
    );
    let (poll_p50, poll_p99) = rows::percentiles(
        handoff::handoff_poll(&url, mode.poll_handoffs, Duration::from_millis(50)).await?,
    );

    let macro_found =
        rows::macro_overhead(&ours_runtime, mode.macro_slices, mode.macro_slice).await?;
    let (macro_ratio, macro_ratio_memory) = (macro_found[0].median, macro_found[1].median);

    let counts = rows::fairness(&url, 4, 4, mode.fairness).await?;

    let pg = pg::measure(mode.pair_duration, mode.rounds, mode.handoffs).await?;
    let etcd_rows = etcd::measure(mode.pair_duration, mode.rounds, mode.handoffs).await?;
    let zookeeper_rows = zookeeper::measure(mode.pair_duration, mode.rounds, mode.handoffs).await?;
    let min = counts.iter().copied().min().unwrap_or(0);
    let max = counts.iter().copied().max().unwrap_or(0);
    let mean = counts.iter().sum::<u64>() as f64 / counts.len().max(1) as f64;

    // The targets: DESIGN section 7 (rows 1-3, 2b) and the earlier benchmark issues.
    let checks = [
        (
            "row 1: ours >= 0.95x raw",
            one[1] / one[0] >= 0.95,
            format!("{:.2}x", one[1] / one[0]),
        ),
        (
            "row 2: ours >= 1.0x raw",
            many[1] / many[0] >= 1.0,
            format!("{:.2}x", many[1] / many[0]),
        ),
        (
            "row 2: attribute >= 1.0x raw",
            many[2] / many[0] >= 1.0,
            format!("{:.2}x", many[2] / many[0]),
        ),
        (
            "row 2: ours >= 1.15x rslock",
            many[1] / many[3] >= 1.15,
            format!("{:.2}x", many[1] / many[3]),
        ),
        (
            "row 2: attribute >= 1.15x rslock",
            many[2] / many[3] >= 1.15,
            format!("{:.2}x", many[2] / many[3]),
        ),
        (
            "row 2: server time per pair <= 1.3x raw's",
            many_t[1].server_us_per_pair <= 1.3 * many_t[0].server_us_per_pair,
            format!(
                "{:.1}x",
                many_t[1].server_us_per_pair / many_t[0].server_us_per_pair.max(0.001)
            ),
        ),
        (
            "row 2b: ours >= 1.0x raw",
            shared_t[1].pairs_per_s >= shared_t[0].pairs_per_s,
            format!(
                "{:.2}x",
                shared_t[1].pairs_per_s / shared_t[0].pairs_per_s.max(1e-9)
            ),
        ),
        (
            "row 2b: ours >= 1.15x rslock",
            shared_t[1].pairs_per_s >= 1.15 * shared_t[2].pairs_per_s,
            format!(
                "{:.2}x",
                shared_t[1].pairs_per_s / shared_t[2].pairs_per_s.max(1e-9)
            ),
        ),
        (
            "row 2b: server time per pair <= 1.3x raw's",
            shared_t[1].server_us_per_pair <= 1.3 * shared_t[0].server_us_per_pair,
            format!(
                "{:.1}x",
                shared_t[1].server_us_per_pair / shared_t[0].server_us_per_pair.max(0.001)
            ),
        ),
        (
            "row 3: handoff p50 <= 0.3 ms",
            ours_p50 <= Duration::from_micros(300),
            format!("{:.2} ms", ms(ours_p50)),
        ),
        (
            "row 3: >= 20x better than rslock at p50",
            ms(rs_p50) >= 20.0 * ms(ours_p50),
            format!("{:.0}x", ms(rs_p50) / ms(ours_p50).max(0.001)),
        ),
        (
            "row 4: min >= 25% of mean",
            min as f64 >= 0.25 * mean,
            format!("{:.0}%", min as f64 / mean.max(1.0) * 100.0),
        ),
        ("row 5: 0 leases lost", wd.lost == 0, format!("{}", wd.lost)),
        (
            "row 5: peak RSS < 64 MiB",
            wd.peak_rss_mib < 64.0,
            format!("{:.1} MiB", wd.peak_rss_mib),
        ),
        (
            "row 6: macro ratio >= 0.97 on Redis",
            macro_ratio >= 0.97,
            format!("{macro_ratio:.3}"),
        ),
        (
            "row 6: macro ratio >= 0.9 on the memory store",
            macro_ratio_memory >= 0.9,
            format!("{macro_ratio_memory:.3}"),
        ),
        (
            "row 7: 0 leases lost",
            big.lost == 0,
            format!("{}", big.lost),
        ),
        (
            "row 7: peak RSS < 256 MiB",
            big.peak_rss_mib < 256.0,
            format!("{:.1} MiB", big.peak_rss_mib),
        ),
        (
            "row 7: under one core",
            big.cpu_percent < 100.0,
            format!("{:.1}% CPU", big.cpu_percent),
        ),
        (
            "PostgreSQL row 1: ours >= 0.9x hand-written",
            pg.one[1] / pg.one[0] >= 0.9,
            format!("{:.2}x", pg.one[1] / pg.one[0]),
        ),
        (
            "PostgreSQL row 2: ours >= 0.9x hand-written",
            pg.many[1] / pg.many[0] >= 0.9,
            format!("{:.2}x", pg.many[1] / pg.many[0]),
        ),
        (
            "PostgreSQL row 3: handoff p50 <= 2 ms",
            pg.handoff_p50 <= Duration::from_millis(2),
            format!("{:.2} ms", ms(pg.handoff_p50)),
        ),
    ];
    let names: Vec<&str> = impls.iter().map(|i| i.name()).collect();
    let spread = |rows: &[rows::Throughput]| {
        rows.iter()
            .map(|t| [t.spread.0, t.spread.1])
            .collect::<Vec<_>>()
    };
    let report = json!({
        "mode": mode.name,
        "release_build": !cfg!(debug_assertions),
        "redis_version": redis_version,
        "rounds": mode.rounds,
        "round_seconds": mode.pair_duration.as_secs_f64(),
        "implementations": names,
        "pairs_per_s_1_task": one,
        "pairs_per_s_64_tasks": many,
        "pairs_per_s_1_task_spread": spread(&one_t),
        "pairs_per_s_64_tasks_spread": spread(&many_t),
        "server_time": "the Redis process's CPU time (user + system, INFO cpu) per pair",
        "server_us_per_pair_1_task": one_t.iter().map(|t| t.server_us_per_pair).collect::<Vec<_>>(),
        "server_us_per_pair_64_tasks": many_t.iter().map(|t| t.server_us_per_pair).collect::<Vec<_>>(),
        "client_time": "this process's CPU time (every thread, user + system, /proc/self/stat) per pair",
        "client_us_per_pair_1_task": one_t.iter().map(|t| t.client_us_per_pair).collect::<Vec<_>>(),
        "client_us_per_pair_64_tasks": many_t.iter().map(|t| t.client_us_per_pair).collect::<Vec<_>>(),
        "shared_keys": {
            "tasks": SHARED_TASKS,
            "clients": SHARED_CLIENTS,
            "keys": SHARED_KEYS,
            "implementations": shared_names,
            "pairs_per_s": shared_t.iter().map(|t| t.pairs_per_s).collect::<Vec<_>>(),
            "pairs_per_s_spread": spread(&shared_t),
            "server_us_per_pair": shared_t.iter().map(|t| t.server_us_per_pair).collect::<Vec<_>>(),
            "client_us_per_pair": shared_t.iter().map(|t| t.client_us_per_pair).collect::<Vec<_>>(),
            "tries": shared_tries.iter().map(|t| t[0]).collect::<Vec<_>>(),
            "tries_held": shared_tries.iter().map(|t| t[1]).collect::<Vec<_>>(),
        },
        "handoff_ms": {
            "ours": {"p50": ms(ours_p50), "p99": ms(ours_p99), "n": mode.handoffs},
            "rslock": {"p50": ms(rs_p50), "p99": ms(rs_p99), "n": mode.handoffs},
            "async_redis_lock": {"p50": ms(arl_p50), "p99": ms(arl_p99), "n": mode.poll_handoffs},
            "poll_5ms": {"p50": ms(poll5_p50), "p99": ms(poll5_p99), "n": mode.poll_handoffs},
            "poll_50ms": {"p50": ms(poll_p50), "p99": ms(poll_p99), "n": mode.poll_handoffs},
        },
        "fairness": {"seconds": mode.fairness.as_secs_f64(), "counts": counts, "min": min, "mean": mean, "max": max},
        "watchdog": watchdog_json(&wd),
        "many_leases": watchdog_json(&big),
        "macro_overhead": rows::MacroRatio::json(&macro_found, mode.macro_slices, ms(mode.macro_slice)),
        "provenance": sys::provenance(),
        "postgres": pg_json(&pg),
        "etcd": etcd_rows.json(),
        "zookeeper": zookeeper_rows.json(),
        "targets": checks.iter().map(|(w, ok, v)| json!({"target": w, "met": ok, "value": v})).collect::<Vec<_>>(),
    });
    println!();
    print!("{}", table::markdown(&report)?);
    if let Some(path) = json_path {
        std::fs::write(&path, serde_json::to_string_pretty(&report)?)?;
        println!("\nwrote {path}");
    }
    ours_runtime.shutdown().await;
    Ok(())
}

/// The implementations of rows 1 and 2, raw first; ours is installed as the attribute's
/// runtime.
async fn implementations(url: &str) -> anyhow::Result<(LockRuntime, Vec<Arc<Impl>>)> {
    let ours_runtime = LockRuntime::builder().redis(url).build().await?;
    ours_runtime.clone().install()?;
    let impls: Vec<Arc<Impl>> = vec![
        Arc::new(Impl::Raw(RawLock::connect(url).await?)),
        Arc::new(Impl::Ours(ours_runtime.clone())),
        Arc::new(Impl::OursAttribute),
        Arc::new(Impl::Rslock(rslock::LockManager::new(vec![url.to_owned()]))),
        Arc::new(Impl::AsyncRedisLock(
            async_redis_lock::Locker::from_redis_url(url)
                .await
                .map_err(|e| anyhow::anyhow!("async-redis-lock: {e:?}"))?,
        )),
    ];
    Ok((ours_runtime, impls))
}

/// The PostgreSQL rows as JSON.
fn pg_json(pg: &pg::PgRows) -> serde_json::Value {
    json!({
        "server_version": pg.server_version,
        "implementations": ["hand-written INSERT .. ON CONFLICT + DELETE", "ours (programmatic)"],
        "pairs_per_s_1_task": pg.one,
        "pairs_per_s_64_tasks": pg.many,
        "ours_vs_hand_1_task": pg.one[1] / pg.one[0],
        "ours_vs_hand_64_tasks": pg.many[1] / pg.many[0],
        "handoff_ms": {"p50": ms(pg.handoff_p50), "p99": ms(pg.handoff_p99)},
    })
}
