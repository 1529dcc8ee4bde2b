//! A holder process for fault tests: takes a lock (in Redis or another store), says so on stdout, then keeps it
//! (watchdog renewing) until killed, or for at most two minutes. On SIGTERM or Ctrl-C its job
//! stops (the guard is released) while the runtime shuts down gracefully, which returns as soon
//! as nothing is held any more; then it exits 0.
//!
//! Usage: lock_holder LOCK_URL KEY TTL_MS (`LOCK_URL` as `lock_tests::builder_for` reads it)

use std::io::Write;
use std::time::Duration;

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let [_, url, key, ttl_ms] = args.as_slice() else {
        anyhow::bail!("usage: lock_holder LOCK_URL KEY TTL_MS");
    };
    let ttl = Duration::from_millis(ttl_ms.parse()?);
    let runtime = lock_tests::builder_for(url).build().await?;
    let guard = runtime.lock(key.as_str()).ttl(ttl).acquire().await?;
    println!("acquired {}", guard.lease().fence().await?);
    std::io::stdout().flush()?;
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let lease = guard.lease().clone();
    let stop = tokio::select! {
        _ = lease.lost() => {
            println!("lost");
            false
        }
        _ = terminate.recv() => true,
        _ = tokio::signal::ctrl_c() => true,
        _ = tokio::time::sleep(Duration::from_secs(120)) => false,
    };
    if stop {
        // The job ends as the shutdown begins; the shutdown waits for its release.
        let (released, ()) = tokio::join!(guard.release(), runtime.shutdown());
        released?;
        println!("shut down");
    } else {
        drop(guard);
    }
    Ok(())
}
