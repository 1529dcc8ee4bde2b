//! A holder process for fault tests: takes a lock in Redis, says so on stdout, then keeps it
//! (watchdog renewing) until killed, or for at most two minutes. On SIGTERM or Ctrl-C it shuts
//! its runtime down gracefully (releasing what it holds) and exits 0.
//!
//! Usage: lock_holder REDIS_URL KEY TTL_MS

use std::io::Write;
use std::time::Duration;

use lock_runtime::LockRuntime;

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let [_, url, key, ttl_ms] = args.as_slice() else {
        anyhow::bail!("usage: lock_holder REDIS_URL KEY TTL_MS");
    };
    let ttl = Duration::from_millis(ttl_ms.parse()?);
    let runtime = LockRuntime::builder().redis(url.as_str()).build().await?;
    let guard = runtime.lock(key.as_str()).ttl(ttl).acquire().await?;
    println!("acquired {}", guard.lease().fence());
    std::io::stdout().flush()?;
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = guard.lease().lost() => println!("lost"),
        _ = terminate.recv() => {
            runtime.shutdown().await;
            println!("shut down");
        }
        _ = tokio::signal::ctrl_c() => {
            runtime.shutdown().await;
            println!("shut down");
        }
        _ = tokio::time::sleep(Duration::from_secs(120)) => {}
    }
    drop(guard);
    Ok(())
}
