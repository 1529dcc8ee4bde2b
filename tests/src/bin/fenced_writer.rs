//! A holder for the paused-holder tests: takes a lock, says so, then waits for `write` on
//! stdin; it then reports whether it already knew its lease was lost, and tries the fenced
//! write to the ledger in Redis anyway (as a careless job would) to show the ledger refuses
//! it. Last, it takes `KEY-again` and says so with its fence: its runtime still works.
//!
//! Usage: `fenced_writer LOCK_URL KEY TTL_MS [LEDGER_REDIS_URL]`
//! (`LOCK_URL` as `lock_tests::builder_for` reads it; the ledger defaults to `LOCK_URL`.)

use std::io::Write;
use std::time::Duration;

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let (url, key, ttl_ms, ledger) = match args.as_slice() {
        [_, url, key, ttl_ms] => (url, key, ttl_ms, url),
        [_, url, key, ttl_ms, ledger] => (url, key, ttl_ms, ledger),
        _ => anyhow::bail!("usage: fenced_writer LOCK_URL KEY TTL_MS [LEDGER_REDIS_URL]"),
    };
    let runtime = lock_tests::builder_for(url).build().await?;
    let guard = runtime
        .lock(key.as_str())
        .ttl(Duration::from_millis(ttl_ms.parse()?))
        .acquire()
        .await?;
    println!("acquired {}", guard.lease().fence().await?);
    std::io::stdout().flush()?;
    // Read without blocking the runtime: its watchdog and its store's client keep running
    // while this waits, so only the test's SIGSTOP freezes them.
    let mut stdin = tokio::io::BufReader::new(tokio::io::stdin());
    let mut line = String::new();
    tokio::io::AsyncBufReadExt::read_line(&mut stdin, &mut line).await?;
    let lost_before = guard.lease().is_lost();
    let mut conn = redis::Client::open(ledger.as_str())?
        .get_multiplexed_async_connection()
        .await?;
    let accepted = lock_tests::fenced::fenced_write(
        &mut conn,
        "ledger",
        guard.lease().fence().await.expect("a fence"),
        "paused holder",
    )
    .await?;
    println!("lost_before={lost_before} accepted={accepted}");
    std::io::stdout().flush()?;
    drop(guard);
    let again = runtime
        .lock(format!("{key}-again"))
        .acquire_timeout(Duration::from_secs(20))
        .await?;
    println!("again {}", again.lease().fence().await?);
    std::io::stdout().flush()?;
    again.release().await?;
    Ok(())
}
