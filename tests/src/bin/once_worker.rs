//! One service instance for the run-once test: waits `SKEW_MS` (its clock runs late), then
//! calls the nightly job for `DATE` once. The job counts its runs in Redis and takes 200 ms;
//! with `FAIL` it fails after counting.
//!
//! Usage: `once_worker REDIS_URL DATE SKEW_MS [FAIL]`

use std::time::Duration;

use lock_runtime::{LockRuntime, distributed_lock};
use redis::AsyncCommands;

#[distributed_lock(key = "interest:{date}", ttl = "10s", once = "7d")]
async fn post_interest(date: &str, redis: &redis::Client, fail: bool) -> anyhow::Result<()> {
    let mut conn = redis.get_multiplexed_async_connection().await?;
    let _: u64 = conn.incr(format!("runs:{date}"), 1).await?;
    tokio::time::sleep(Duration::from_millis(200)).await;
    if fail {
        anyhow::bail!("posting failed");
    }
    Ok(())
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let (url, date, skew) = match args.as_slice() {
        [_, url, date, skew, ..] => (url.clone(), date.clone(), skew.parse::<u64>()?),
        _ => anyhow::bail!("usage: once_worker REDIS_URL DATE SKEW_MS [FAIL]"),
    };
    let fail = args.get(4).is_some_and(|a| a == "FAIL");
    let runtime = LockRuntime::builder().redis(url.as_str()).build().await?;
    runtime.clone().install()?;
    let client = redis::Client::open(url.as_str())?;
    tokio::time::sleep(Duration::from_millis(skew)).await;
    let outcome = post_interest(&date, &client, fail).await;
    println!("{}", if outcome.is_ok() { "ok" } else { "failed" });
    runtime.shutdown().await;
    Ok(())
}
