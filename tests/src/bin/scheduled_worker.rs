//! One instance of the scheduled-jobs process test: a `#[scheduled(every = "1s")]` +
//! `#[distributed_lock]` job that runs 50 ms, fired by a `Scheduler` for a given time, on the
//! store at `LOCK_URL`. Run under `faketime` to give the instance a clock of its own. Each run
//! appends `run <firing ms> <owner>` to the log (one `write` of a short line on a file opened
//! for appending, so lines of several processes never mix), and the worker writes
//! `start <owner> <its wall clock in ms>` and `pid <owner> <its pid>` first and
//! `done <owner>` last.
//!
//! Usage: `scheduled_worker LOCK_URL OWNER RUN_MS LOG_PATH [JOB SLEEP_MS]`
//! (`LOCK_URL`: `redis://..`, `postgres://..`, or `etcd:` and the endpoints separated by
//! commas). `JOB` is `tick` (the default), or `crashy` / `crashy_retry`: a job of every 10 s
//! (ttl 2 s; the second with `retry_crashed = true`) whose run logs and then sleeps
//! `SLEEP_MS`, for the test that kills a process mid-run. The runtime's default ttl is 2 s, so
//! a `retry_crashed` marker left by a killed process is gone 2 s after it.

use std::io::Write;
use std::sync::OnceLock;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use lock_runtime::{
    LockError, LockRuntime, Scheduler, current_firing, distributed_lock, scheduled,
};

static LOG: OnceLock<std::fs::File> = OnceLock::new();
static SLEEP: OnceLock<Duration> = OnceLock::new();

fn log_line(line: &str) -> std::io::Result<()> {
    let mut file = LOG.get().ok_or_else(|| std::io::Error::other("no log"))?;
    file.write_all(format!("{line}\n").as_bytes())
}

fn unix_ms(t: SystemTime) -> u128 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis())
}

#[scheduled(every = "1s")]
#[distributed_lock(key = "faketime-firing", ttl = "10s")]
async fn tick() -> Result<(), LockError> {
    let firing = current_firing().ok_or_else(|| LockError::Config("no firing".into()))?;
    let owner = LockRuntime::current()?.owner().to_owned();
    log_line(&format!("run {} {owner}", unix_ms(firing.scheduled_at())))
        .map_err(|e| LockError::Config(format!("log: {e}")))?;
    tokio::time::sleep(Duration::from_millis(50)).await;
    Ok(())
}

/// Asks for its fence (as a run that writes to fenced storage does), logs the run, then
/// sleeps `SLEEP_MS`.
async fn crashy_run() -> Result<(), LockError> {
    let firing = current_firing().ok_or_else(|| LockError::Config("no firing".into()))?;
    if let Some(lease) = lock_runtime::current_lease() {
        lease.fence().await?;
    }
    let owner = LockRuntime::current()?.owner().to_owned();
    log_line(&format!("run {} {owner}", unix_ms(firing.scheduled_at())))
        .map_err(|e| LockError::Config(format!("log: {e}")))?;
    tokio::time::sleep(SLEEP.get().copied().unwrap_or_default()).await;
    Ok(())
}

#[scheduled(every = "10s")]
#[distributed_lock(key = "crashy", ttl = "2s")]
async fn crashy() -> Result<(), LockError> {
    crashy_run().await
}

#[scheduled(every = "10s", retry_crashed = true)]
#[distributed_lock(key = "crashy-retry", ttl = "2s")]
async fn crashy_retry() -> Result<(), LockError> {
    crashy_run().await
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let (lock_url, owner, run_ms, log, job, sleep_ms) = match args.as_slice() {
        [_, lock_url, owner, run_ms, log] => (lock_url, owner, run_ms, log, "tick", "0"),
        [_, lock_url, owner, run_ms, log, job, sleep_ms] => (
            lock_url,
            owner,
            run_ms,
            log,
            job.as_str(),
            sleep_ms.as_str(),
        ),
        _ => anyhow::bail!("usage: scheduled_worker LOCK_URL OWNER RUN_MS LOG_PATH [JOB SLEEP_MS]"),
    };
    let _ = SLEEP.set(Duration::from_millis(sleep_ms.parse().context("SLEEP_MS")?));
    let run_for = Duration::from_millis(run_ms.parse().context("RUN_MS")?);
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .context("the log")?;
    let _ = LOG.set(file);
    let runtime = lock_tests::builder_for(lock_url)
        .owner(owner.as_str())
        .default_ttl(Duration::from_secs(2))
        .connect_timeout(Duration::from_secs(5))
        .build()
        .await
        .context("the runtime")?;
    log_line(&format!("start {owner} {}", unix_ms(SystemTime::now())))?;
    // faketime runs the worker as its child: a test that kills an instance needs this pid.
    log_line(&format!("pid {owner} {}", std::process::id()))?;
    Scheduler::new(runtime)
        .only([job])
        .run_until(tokio::time::sleep(run_for))
        .await?;
    log_line(&format!("done {owner}"))?;
    Ok(())
}
