//! A holder for the paused-holder test: takes a lock, says so, then waits for `write` on stdin;
//! it then reports whether it already knew its lease was lost, and tries the fenced write
//! anyway (as a careless job would) to show the store refuses it.
//!
//! Usage: fenced_writer REDIS_URL KEY TTL_MS

use std::io::{BufRead, Write};
use std::time::Duration;

use lock_runtime::LockRuntime;

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let [_, url, key, ttl_ms] = args.as_slice() else {
        anyhow::bail!("usage: fenced_writer REDIS_URL KEY TTL_MS");
    };
    let runtime = LockRuntime::builder().redis(url.as_str()).build().await?;
    let guard = runtime
        .lock(key.as_str())
        .ttl(Duration::from_millis(ttl_ms.parse()?))
        .acquire()
        .await?;
    println!("acquired {}", guard.lease().fence().await?);
    std::io::stdout().flush()?;
    let mut line = String::new();
    // Blocking read on purpose: this process is stopped with SIGSTOP while it waits here.
    std::io::stdin().lock().read_line(&mut line)?;
    let lost_before = guard.lease().is_lost();
    let mut conn = redis::Client::open(url.as_str())?
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
    Ok(())
}
