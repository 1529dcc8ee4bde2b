//! N operating-system processes of this one binary compete through a real Redis at every tick;
//! the parent counts how many ran each tick (the answer should be 1 every time).
//!
//!     REDIS_URL=redis://127.0.0.1:6379 cargo run -p lock-examples --example multi_process
//!
//! Without REDIS_URL it starts a private `redis-server` on a free loopback port (Debian:
//! `apt-get install -y redis-server`) and stops it at the end. With DATABASE_URL the processes
//! lock in PostgreSQL instead (the demo still counts the runs in Redis):
//!
//!     DATABASE_URL=postgres://user:password@127.0.0.1:5432/db \
//!         cargo run -p lock-examples --example multi_process
//!
//! and with ETCD_ENDPOINTS (separated by commas) in etcd:
//!
//!     ETCD_ENDPOINTS=http://127.0.0.1:2379 cargo run -p lock-examples --example multi_process
//!
//! and with ZOOKEEPER_CONNECT in ZooKeeper (its servers must take TTL nodes):
//!
//!     ZOOKEEPER_CONNECT=127.0.0.1:2181 cargo run -p lock-examples --example multi_process

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail};
use lock_runtime::{LockRuntime, distributed_lock};
use redis::AsyncCommands;

const PROCESSES: usize = 4;
const TICKS: u64 = 3;
const TICK_MS: u64 = 1000;

/// The scheduled job: counts its runs per tick in Redis so the parent can check them.
#[distributed_lock(key = "multi-process:{run}:{tick}", ttl = "10s", min_hold = "500ms")]
async fn scheduled_job(run: u64, tick: u64, redis: &redis::Client) -> anyhow::Result<()> {
    let mut conn = redis.get_multiplexed_async_connection().await?;
    let _: u64 = conn
        .incr(format!("multi-process-runs:{run}:{tick}"), 1)
        .await?;
    println!("pid {} ran tick {tick}", std::process::id());
    Ok(())
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or_default()
}

async fn child(url: String, run: u64) -> anyhow::Result<()> {
    // DATABASE_URL reaches the children through their environment.
    let builder = LockRuntime::builder();
    let builder = match (
        std::env::var("DATABASE_URL"),
        std::env::var("ETCD_ENDPOINTS"),
        std::env::var("ZOOKEEPER_CONNECT"),
    ) {
        (Ok(database), ..) => builder.postgres(database),
        (_, Ok(endpoints), _) => builder.etcd(endpoints.split(',').map(str::to_owned)),
        (.., Ok(connect)) => builder.zookeeper(connect),
        _ => builder.redis(url.as_str()),
    };
    let runtime = builder.build().await?;
    let client = redis::Client::open(url.as_str())?;
    for tick in 0..TICKS {
        let at = run + tick * TICK_MS;
        tokio::time::sleep(Duration::from_millis(at.saturating_sub(now_ms()))).await;
        runtime.scope(scheduled_job(run, tick, &client)).await?;
    }
    runtime.shutdown().await;
    Ok(())
}

/// A private redis-server, killed (by its PID) when dropped.
struct PrivateRedis(Child);

impl Drop for PrivateRedis {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_private_redis() -> anyhow::Result<(String, PrivateRedis)> {
    let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    // REDIS_SERVER_BIN: another server build, as the test suite's server matrix uses.
    let binary = std::env::var_os("REDIS_SERVER_BIN").unwrap_or_else(|| "redis-server".into());
    let child = Command::new(binary)
        .args([
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .stdout(Stdio::null())
        .spawn()
        .context("starting redis-server (Debian: apt-get install -y redis-server)")?;
    let server = PrivateRedis(child);
    for _ in 0..200 {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return Ok((format!("redis://127.0.0.1:{port}"), server));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    bail!("redis-server did not start on port {port}")
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    if let [_, flag, url, run] = args.as_slice()
        && flag == "--child"
    {
        return child(url.clone(), run.parse()?).await;
    }

    let (url, _private) = match std::env::var("REDIS_URL") {
        Ok(url) => (url, None),
        Err(_) => {
            let (url, server) = start_private_redis()?;
            println!("started a private redis-server at {url}");
            (url, Some(server))
        }
    };
    if std::env::var("DATABASE_URL").is_ok() {
        println!("locking in PostgreSQL (DATABASE_URL); counting the runs in Redis");
    } else if std::env::var("ETCD_ENDPOINTS").is_ok() {
        println!("locking in etcd (ETCD_ENDPOINTS); counting the runs in Redis");
    } else if std::env::var("ZOOKEEPER_CONNECT").is_ok() {
        println!("locking in ZooKeeper (ZOOKEEPER_CONNECT); counting the runs in Redis");
    }
    // Every process fires its ticks at the same wall-clock instants.
    let run = now_ms() + 1000;
    let exe = std::env::current_exe()?;
    let mut children = Vec::new();
    for _ in 0..PROCESSES {
        children.push(
            Command::new(&exe)
                .args(["--child", &url, &run.to_string()])
                .spawn()
                .context("spawning a competing process")?,
        );
    }
    for mut child in children {
        let status = child.wait()?;
        anyhow::ensure!(status.success(), "a competing process failed: {status}");
    }
    let mut conn = redis::Client::open(url.as_str())?
        .get_multiplexed_async_connection()
        .await?;
    let mut all_one = true;
    for tick in 0..TICKS {
        let runs: Option<u64> = conn.get(format!("multi-process-runs:{run}:{tick}")).await?;
        let runs = runs.unwrap_or(0);
        println!("tick {tick}: {runs} run(s) across {PROCESSES} processes");
        all_one &= runs == 1;
    }
    anyhow::ensure!(all_one, "expected exactly one run per tick");
    println!("exactly one run per tick.");
    Ok(())
}
