//! Event-driven waiting on a real Redis: a release wakes few acquire attempts, not one per
//! waiting task. Attempts are counted by the server (INFO commandstats), not by the client.

use std::time::Duration;

use lock_runtime::LockRuntime;
use lock_tests::RedisServer;

/// Script calls (EVALSHA and EVAL) the server has executed so far.
async fn script_calls(server: &RedisServer) -> u64 {
    server
        .command_stat("calls", |c| c == "evalsha" || c == "eval")
        .await
        .expect("INFO commandstats")
}

/// `runtimes` runtimes x `tasks` tasks each take the one key `rounds` times, holding it 2 ms.
/// Returns store acquire attempts per acquisition.
async fn attempts_per_acquisition(runtimes: usize, tasks: usize, rounds: usize) -> f64 {
    let server = RedisServer::start();
    let mut handles = Vec::new();
    let mut all = Vec::new();
    for _ in 0..runtimes {
        all.push(
            LockRuntime::builder()
                .redis(server.url())
                .build()
                .await
                .expect("build"),
        );
    }
    let before = script_calls(&server).await;
    for runtime in &all {
        for _ in 0..tasks {
            let runtime = runtime.clone();
            handles.push(tokio::spawn(async move {
                for _ in 0..rounds {
                    let guard = runtime
                        .lock("herd")
                        .ttl(Duration::from_secs(10))
                        .acquire_timeout(Duration::from_secs(60))
                        .await
                        .expect("acquire");
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    assert!(guard.release().await.expect("release"));
                }
            }));
        }
    }
    for handle in handles {
        handle.await.expect("task");
    }
    let calls = script_calls(&server).await - before;
    let acquisitions = (runtimes * tasks * rounds) as u64;
    // Every acquisition is followed by exactly one release script call.
    let attempts = calls - acquisitions;
    attempts as f64 / acquisitions as f64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_runtime_sixteen_waiters_make_few_attempts_per_handoff() {
    let per = attempts_per_acquisition(1, 16, 10).await;
    println!("1 runtime x 16 waiters: {per:.2} acquire attempts per acquisition");
    // Without the per-runtime queue every release would wake all 15 other waiters.
    assert!(per <= 3.0, "{per:.2} attempts per acquisition");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_runtimes_wake_about_one_attempt_each_per_handoff() {
    let per = attempts_per_acquisition(4, 4, 10).await;
    println!("4 runtimes x 4 waiters: {per:.2} acquire attempts per acquisition");
    assert!(per <= 2.0 * 4.0 + 1.0, "{per:.2} attempts per acquisition");
}
