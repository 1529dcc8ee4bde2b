//! The measurements. Every row is measured in the same run as its baseline.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::Context;
use lock_runtime::LockRuntime;
use lock_tests::RedisServer;
use tokio::time::Instant;

use crate::peers::Impl;
use crate::sys;

/// Pairs per second of one implementation with `tasks` tasks on distinct keys.
pub(crate) async fn throughput(
    imp: Arc<Impl>,
    tasks: usize,
    duration: Duration,
    tag: &str,
) -> anyhow::Result<(f64, u64)> {
    let started = Instant::now();
    let stop = started + duration;
    let mut handles = Vec::new();
    for t in 0..tasks {
        let imp = imp.clone();
        let key = format!("bench:{tag}:{t}");
        handles.push(tokio::spawn(async move {
            let mut pairs = 0u64;
            while Instant::now() < stop {
                imp.pair(&key).await?;
                pairs += 1;
            }
            Ok::<u64, anyhow::Error>(pairs)
        }));
    }
    let mut total = 0;
    for handle in handles {
        total += handle.await??;
    }
    Ok((total as f64 / started.elapsed().as_secs_f64(), total))
}

/// Median pairs/s of a baseline and ours over `rounds` rounds, the order rotating each round
/// (the PostgreSQL and etcd rows); `store` names the run's keys.
pub(crate) async fn pair_table(
    impls: &[Arc<Impl>; 2],
    tasks: usize,
    duration: Duration,
    rounds: usize,
    store: &str,
) -> anyhow::Result<[f64; 2]> {
    let mut samples = [Vec::new(), Vec::new()];
    for round in 0..rounds {
        for k in 0..2 {
            let i = (round + k) % 2;
            let tag = format!("{store}-t{tasks}-r{round}-i{i}");
            samples[i].push(throughput(impls[i].clone(), tasks, duration, &tag).await?.0);
        }
    }
    Ok(samples.map(median))
}

/// One implementation's figures in a throughput row: medians over the rounds, and the spread.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Throughput {
    pub(crate) pairs_per_s: f64,
    /// The slowest and the fastest round.
    pub(crate) spread: (f64, f64),
    /// The Redis server process's CPU time per pair (user + system, from INFO cpu), in
    /// microseconds.
    pub(crate) server_us_per_pair: f64,
    /// This process's CPU time per pair (every thread, user + system), in microseconds: the
    /// client's side, the implementation under test being the only one running.
    pub(crate) client_us_per_pair: f64,
}

impl Throughput {
    fn of(rates: Vec<f64>, server_us: Vec<f64>, client_us: Vec<f64>) -> Self {
        let low = rates.iter().copied().fold(f64::INFINITY, f64::min);
        let high = rates.iter().copied().fold(0.0, f64::max);
        Throughput {
            pairs_per_s: median(rates),
            spread: (if low.is_finite() { low } else { 0.0 }, high),
            server_us_per_pair: median(server_us),
            client_us_per_pair: median(client_us),
        }
    }
}

/// Median pairs/s of each implementation over `rounds` interleaved rounds, so machine noise
/// hits every implementation alike; the order rotates each round, so no implementation always
/// runs first (on a cold server) or last; with the server's own time per pair.
pub(crate) async fn throughput_table(
    server: &RedisServer,
    impls: &[Arc<Impl>],
    tasks: usize,
    duration: Duration,
    rounds: usize,
) -> anyhow::Result<Vec<Throughput>> {
    let mut samples = vec![Vec::new(); impls.len()];
    let mut server_us = vec![Vec::new(); impls.len()];
    let mut client_us = vec![Vec::new(); impls.len()];
    for round in 0..rounds {
        for i in (0..impls.len()).map(|k| (k + round) % impls.len()) {
            let imp = &impls[i];
            let tag = format!("t{tasks}-r{round}-i{i}");
            if std::env::var_os("LOCK_BENCH_SERVER_STATS").is_some() {
                redis::cmd("CONFIG")
                    .arg("RESETSTAT")
                    .query_async::<()>(
                        &mut server.client().get_multiplexed_async_connection().await?,
                    )
                    .await?;
            }
            let before = server_cpu_us(server).await?;
            let client_before = process_cpu_us()?;
            let (rate, pairs) = throughput(imp.clone(), tasks, duration, &tag).await?;
            let client_spent = process_cpu_us()? - client_before;
            let spent = server_cpu_us(server).await? - before;
            if std::env::var_os("LOCK_BENCH_SERVER_STATS").is_some() {
                let info: String = redis::cmd("INFO")
                    .arg("commandstats")
                    .query_async(&mut server.client().get_multiplexed_async_connection().await?)
                    .await?;
                eprintln!(
                    "--- {} ({tasks} tasks): {rate:.0} pairs/s\n{info}",
                    imp.name()
                );
            }
            samples[i].push(rate);
            server_us[i].push(spent as f64 / (pairs as f64).max(1.0));
            client_us[i].push(client_spent as f64 / (pairs as f64).max(1.0));
        }
    }
    Ok(samples
        .into_iter()
        .zip(server_us)
        .zip(client_us)
        .map(|((rates, us), client)| Throughput::of(rates, us, client))
        .collect())
}

/// The shared-keys row: `tasks` tasks spread over the clients of each implementation (one
/// client per runtime: `clients[i]` holds one implementation's 4 clients), each trying keys
/// of a set of `keys` in an order of its own (a seeded random walk) and releasing what it
/// got; a key another task holds is skipped (one try, no wait). Pairs/s counts the pairs that
/// got their key; the tries that found it held are counted too. Rounds interleave and rotate
/// as in `throughput_table`.
pub(crate) async fn shared_keys_table(
    server: &RedisServer,
    clients: &[Vec<Arc<Impl>>],
    tasks: usize,
    keys: usize,
    duration: Duration,
    rounds: usize,
) -> anyhow::Result<(Vec<Throughput>, Vec<[u64; 2]>)> {
    let mut samples = vec![Vec::new(); clients.len()];
    let mut server_us = vec![Vec::new(); clients.len()];
    // Per implementation, over all rounds: tries, and tries that found the key held.
    let mut tries = vec![[0u64; 2]; clients.len()];
    let mut client_us = vec![Vec::new(); clients.len()];
    for round in 0..rounds {
        for i in (0..clients.len()).map(|k| (k + round) % clients.len()) {
            let before = server_cpu_us(server).await?;
            let client_before = process_cpu_us()?;
            let started = Instant::now();
            let stop = started + duration;
            let mut handles = Vec::new();
            for t in 0..tasks {
                let client = clients[i][t % clients[i].len()].clone();
                let tag = format!("shared:r{round}:i{i}");
                handles.push(tokio::spawn(async move {
                    let (mut pairs, mut held) = (0u64, 0u64);
                    // xorshift64, seeded per task: every task walks the keys in an order of
                    // its own, so tasks meet on keys as independent clients would.
                    let mut state = (t as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
                    while Instant::now() < stop {
                        state ^= state << 13;
                        state ^= state >> 7;
                        state ^= state << 17;
                        let n = state % keys as u64;
                        if client.try_pair(&format!("{tag}:{n}")).await? {
                            pairs += 1;
                        } else {
                            held += 1;
                        }
                    }
                    Ok::<(u64, u64), anyhow::Error>((pairs, held))
                }));
            }
            let (mut total, mut held) = (0, 0);
            for handle in handles {
                let (pairs, missed) = handle.await??;
                total += pairs;
                held += missed;
            }
            let rate = total as f64 / started.elapsed().as_secs_f64();
            let client_spent = process_cpu_us()? - client_before;
            let spent = server_cpu_us(server).await? - before;
            samples[i].push(rate);
            // Every try costs the server, the held ones too: time per pair that got its key.
            server_us[i].push(spent as f64 / (total as f64).max(1.0));
            client_us[i].push(client_spent as f64 / (total as f64).max(1.0));
            tries[i][0] += total + held;
            tries[i][1] += held;
        }
    }
    let rows = samples
        .into_iter()
        .zip(server_us)
        .zip(client_us)
        .map(|((rates, us), client)| Throughput::of(rates, us, client))
        .collect();
    Ok((rows, tries))
}

/// The server process's CPU time so far (user + system, INFO cpu), in microseconds:
/// everything it did for its clients, networking included, each piece counted once. (Summing
/// INFO commandstats would count a script's inner commands twice: the script's time already
/// holds theirs.)
async fn server_cpu_us(server: &RedisServer) -> anyhow::Result<u64> {
    let mut conn = server.client().get_multiplexed_async_connection().await?;
    let info: String = redis::cmd("INFO").arg("cpu").query_async(&mut conn).await?;
    let field = |name: &str| {
        info.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    Ok(((field("used_cpu_sys:") + field("used_cpu_user:")) * 1e6) as u64)
}

/// This process's CPU time so far, every thread, user + system (`/proc/self/stat`, in clock
/// ticks of 10 ms: a 2 s round of tens of thousands of pairs reads to well under 1%), in
/// microseconds.
fn process_cpu_us() -> anyhow::Result<u64> {
    let stat = std::fs::read_to_string("/proc/self/stat")?;
    // The fields after the command name, which is in parentheses and may hold spaces:
    // utime and stime are the 14th and 15th of the line, the 12th and 13th after it.
    let after_name = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest)
        .ok_or_else(|| anyhow::anyhow!("/proc/self/stat: no command name"))?;
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    let ticks = |i: usize| -> anyhow::Result<u64> {
        Ok(fields
            .get(i)
            .ok_or_else(|| anyhow::anyhow!("/proc/self/stat: too few fields"))?
            .parse::<u64>()?)
    };
    // USER_HZ is 100 on every Linux this runs on.
    Ok((ticks(11)? + ticks(12)?) * 10_000)
}

pub(crate) fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// p50 and p99 of a latency sample.
pub(crate) fn percentiles(mut v: Vec<Duration>) -> (Duration, Duration) {
    v.sort();
    let at = |q: f64| {
        let i = ((v.len() as f64 - 1.0) * q).round() as usize;
        v.get(i).copied().unwrap_or_default()
    };
    (at(0.50), at(0.99))
}

/// Fairness: `runtimes` x `per_runtime` waiters loop on one key with a 1 ms hold; returns the
/// acquisitions of each waiter.
pub(crate) async fn fairness(
    url: &str,
    runtimes: usize,
    per_runtime: usize,
    duration: Duration,
) -> anyhow::Result<Vec<u64>> {
    let stop = Instant::now() + duration;
    let mut handles = Vec::new();
    for _ in 0..runtimes {
        let runtime = LockRuntime::builder().redis(url).build().await?;
        for _ in 0..per_runtime {
            let runtime = runtime.clone();
            handles.push(tokio::spawn(async move {
                let mut count = 0u64;
                loop {
                    let now = Instant::now();
                    if now >= stop {
                        break;
                    }
                    match runtime
                        .lock("fairness")
                        .ttl(Duration::from_secs(5))
                        .acquire_timeout(stop - now)
                        .await
                    {
                        Ok(guard) => {
                            tokio::time::sleep(Duration::from_millis(1)).await;
                            guard.release().await?;
                            count += 1;
                        }
                        Err(lock_runtime::LockError::WaitTimeout { .. }) => break,
                        Err(e) => return Err(e.into()),
                    }
                }
                Ok::<u64, anyhow::Error>(count)
            }));
        }
    }
    let mut counts = Vec::new();
    for handle in handles {
        counts.push(handle.await??);
    }
    Ok(counts)
}

/// What the watchdog row measured.
pub(crate) struct WatchdogFigures {
    pub(crate) leases: usize,
    pub(crate) ttl: Duration,
    pub(crate) held_for: Duration,
    pub(crate) lost: usize,
    pub(crate) renewal_calls_per_s: f64,
    pub(crate) leases_renewed_per_s: f64,
    pub(crate) cpu_percent: f64,
    pub(crate) peak_rss_mib: f64,
    pub(crate) rss_before_mib: f64,
}

/// `leases` leases with `ttl` held at once by one runtime for `hold`.
pub(crate) async fn watchdog_scale(
    server: &RedisServer,
    leases: usize,
    ttl: Duration,
    hold: Duration,
) -> anyhow::Result<WatchdogFigures> {
    let rss_before_mib = sys::rss_mib();
    let runtime = LockRuntime::builder().redis(server.url()).build().await?;
    let guards = Arc::new(tokio::sync::Mutex::new(Vec::with_capacity(leases)));
    let next = Arc::new(AtomicU64::new(0));
    let mut handles = Vec::new();
    for _ in 0..64 {
        let runtime = runtime.clone();
        let guards = guards.clone();
        let next = next.clone();
        handles.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed) as usize;
                if i >= leases {
                    return Ok::<(), anyhow::Error>(());
                }
                let guard = runtime
                    .lock(format!("watchdog:{}:{i}", ttl.as_secs()))
                    .ttl(ttl)
                    .try_acquire()
                    .await?
                    .context("a fresh key was held")?;
                guards.lock().await.push(guard);
            }
        }));
    }
    for handle in handles {
        handle.await??;
    }
    let calls_before = script_calls(server).await?;
    let renewed_before = renewals(server).await?;
    let cpu_before = sys::cpu_time();
    let started = Instant::now();
    tokio::time::sleep(hold).await;
    let held_for = started.elapsed();
    let cpu = sys::cpu_time().saturating_sub(cpu_before);
    let calls = script_calls(server).await? - calls_before;
    let renewed = renewals(server).await? - renewed_before;
    let guards = std::mem::take(&mut *guards.lock().await);
    let lost = guards.iter().filter(|g| g.lease().is_lost()).count();
    let peak_rss_mib = sys::peak_rss_mib();
    runtime.shutdown().await;
    drop(guards);
    Ok(WatchdogFigures {
        leases,
        ttl,
        held_for,
        lost,
        renewal_calls_per_s: calls as f64 / held_for.as_secs_f64(),
        leases_renewed_per_s: renewed as f64 / held_for.as_secs_f64(),
        cpu_percent: cpu.as_secs_f64() / held_for.as_secs_f64() * 100.0,
        peak_rss_mib,
        rss_before_mib,
    })
}

/// Leases renewed so far, as the server counts them: the renewal script runs one PEXPIRE for
/// each lease it renews (its token matched and its expiry moved on), and nothing else runs
/// PEXPIRE while the row holds its leases.
async fn renewals(server: &RedisServer) -> anyhow::Result<u64> {
    Ok(server.command_stat("calls", |c| c == "pexpire").await?)
}

/// Script calls (EVALSHA + EVAL) executed by the server so far.
pub(crate) async fn script_calls(server: &RedisServer) -> anyhow::Result<u64> {
    Ok(server
        .command_stat("calls", |c| c == "evalsha" || c == "eval")
        .await?)
}

/// Row 6 on one store: the attribute's rate over the programmatic call's, per pair of
/// back-to-back slices.
#[derive(Debug, Clone, Copy)]
pub(crate) struct MacroRatio {
    /// The median of the slices' ratios.
    pub(crate) median: f64,
    /// Their first and third quartiles: how far one pair of slices strays.
    pub(crate) quartiles: (f64, f64),
}

impl MacroRatio {
    /// Row 6 as the results files hold it: both stores' medians and quartiles, and how it
    /// was measured.
    pub(crate) fn json(found: &[MacroRatio; 2], slices: usize, slice_ms: f64) -> serde_json::Value {
        let [redis, memory] = found;
        serde_json::json!({
            "slices": slices,
            "slice_ms": slice_ms,
            "redis": redis.median,
            "memory_store": memory.median,
            "redis_quartiles": [redis.quartiles.0, redis.quartiles.1],
            "memory_store_quartiles": [memory.quartiles.0, memory.quartiles.1],
        })
    }

    fn of(mut ratios: Vec<f64>) -> Self {
        ratios.sort_by(f64::total_cmp);
        // Interpolated between the two nearest ratios: with an even count the median is the
        // mean of the middle two, not the upper one.
        let at = |q: f64| {
            let pos = (ratios.len().max(1) - 1) as f64 * q;
            let (low, high) = (pos.floor() as usize, pos.ceil() as usize);
            match (ratios.get(low), ratios.get(high)) {
                (Some(a), Some(b)) => a + (b - a) * (pos - low as f64),
                _ => 0.0,
            }
        };
        MacroRatio {
            median: at(0.5),
            quartiles: (at(0.25), at(0.75)),
        }
    }
}

/// Macro overhead: the annotated fn against the same pair through the programmatic API, one
/// task, in `slices` pairs of short back-to-back slices (which goes first alternates). Each
/// pair gives one ratio and the row is their median: at one task a pair on Redis is a round
/// trip or two, and how fast one slice runs depends on where the scheduler puts the caller
/// and the connection's tasks, by more (10% and up) than the attribute costs; a slow slice
/// then moves one ratio of many, not a sum. On Redis, then on the memory store.
pub(crate) async fn macro_overhead(
    redis_runtime: &LockRuntime,
    slices: usize,
    slice: Duration,
) -> anyhow::Result<[MacroRatio; 2]> {
    let memory_runtime = LockRuntime::builder()
        .memory(lock_runtime::MemoryStore::new())
        .build()
        .await?;
    let mut found = Vec::new();
    for runtime in [redis_runtime, &memory_runtime] {
        let programmatic = Arc::new(Impl::Ours(runtime.clone()));
        let attribute = Arc::new(Impl::OursAttributeScoped(runtime.clone()));
        let mut ratios = Vec::with_capacity(slices);
        for i in 0..slices {
            let tag = format!("macro-{i}");
            let (p, a) = if i % 2 == 0 {
                let p = throughput(programmatic.clone(), 1, slice, &tag).await?.0;
                (p, throughput(attribute.clone(), 1, slice, &tag).await?.0)
            } else {
                let a = throughput(attribute.clone(), 1, slice, &tag).await?.0;
                (throughput(programmatic.clone(), 1, slice, &tag).await?.0, a)
            };
            ratios.push(a / p.max(1.0));
        }
        found.push(MacroRatio::of(ratios));
    }
    memory_runtime.shutdown().await;
    Ok([found[0], found[1]])
}

/// Rows 1-3 of a store measured against its hand-written lock (etcd, ZooKeeper): pairs/s
/// with 1 and 64 tasks, [hand-written, ours] each, and the handoff's p50 and p99.
pub(crate) struct StoreRows {
    /// The store and its version, as the rows name it (`etcd 3.4.23`).
    pub(crate) server: String,
    pub(crate) server_version: String,
    /// What the hand-written lock does, as the table names it.
    pub(crate) baseline: &'static str,
    /// Median pairs/s, 1 task: [hand-written, ours].
    pub(crate) one: [f64; 2],
    /// Median pairs/s, 64 tasks: [hand-written, ours].
    pub(crate) many: [f64; 2],
    pub(crate) handoff_p50: Duration,
    pub(crate) handoff_p99: Duration,
}

impl StoreRows {
    /// The rows as printed by `--etcd-only` and `--zookeeper-only`.
    pub(crate) fn print(&self) {
        println!("{}:", self.server);
        for (tasks, pair) in [1, 64].into_iter().zip([self.one, self.many]) {
            println!(
                "  {tasks} task(s): hand-written {:.0} pairs/s, ours {:.0} ({:.2}x)",
                pair[0],
                pair[1],
                pair[1] / pair[0].max(1e-9)
            );
        }
        println!(
            "  handoff p50 / p99: {:.2} / {:.2} ms",
            millis(self.handoff_p50),
            millis(self.handoff_p99)
        );
    }

    /// The rows as the results file keeps them (what `table` reads).
    pub(crate) fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "server_version": self.server_version,
            "members": 1,
            "implementations": [self.baseline, "ours (programmatic)"],
            "pairs_per_s_1_task": self.one,
            "pairs_per_s_64_tasks": self.many,
            "ours_vs_hand_1_task": self.one[1] / self.one[0],
            "ours_vs_hand_64_tasks": self.many[1] / self.many[0],
            "handoff_ms": {"p50": millis(self.handoff_p50), "p99": millis(self.handoff_p99)},
        })
    }
}

fn millis(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}
