//! One process of the mixed soak: until its deadline, takes random keys through the runtime
//! and increments each key's counter by a read-sleep-write through the fenced counter, skipping
//! the write when its lease is already known lost. Prints `done` at the end.
//!
//! Usage: soak_worker REDIS_URL KEYS SECONDS SEED

use std::time::{Duration, Instant};

use lock_runtime::LockRuntime;
use lock_tests::fenced::{counter_read, counter_set};
use lock_tests::rng::XorShift;

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let [_, url, keys, seconds, seed] = args.as_slice() else {
        anyhow::bail!("usage: soak_worker REDIS_URL KEYS SECONDS SEED");
    };
    let keys: u64 = keys.parse()?;
    let deadline = Instant::now() + Duration::from_secs_f64(seconds.parse()?);
    let mut rng = XorShift::new(seed.parse::<u64>()?);
    let runtime = LockRuntime::builder()
        .redis(url.as_str())
        .connect_timeout(Duration::from_secs(2))
        .command_timeout(Duration::from_millis(500))
        .build()
        .await?;
    let client = redis::Client::open(url.as_str())?;
    let mut conn = client.get_connection_manager().await?;
    while Instant::now() < deadline {
        let key = format!("k{}", rng.next_u64() % keys);
        let Ok(guard) = runtime
            .lock(key.as_str())
            .ttl(Duration::from_millis(600))
            .acquire_timeout(Duration::from_secs(1))
            .await
        else {
            continue;
        };
        let fence = guard.lease().fence();
        let Ok(Some(value)) = counter_read(&mut conn, &key, fence).await else {
            continue;
        };
        tokio::time::sleep(Duration::from_millis(rng.next_u64() % 10)).await;
        if guard.lease().is_lost() {
            continue;
        }
        let _ = counter_set(&mut conn, &key, fence, value + 1).await;
        let _ = guard.release().await;
    }
    runtime.shutdown().await;
    println!("done");
    Ok(())
}
