//! lockctl end to end against real Redis: locks taken by a runtime are listed, shown and
//! force-released, with waiters woken.

use std::process::Command;
use std::time::Duration;

use lock_runtime::LockRuntime;
use lock_tests::{RedisCluster, RedisServer};

fn lockctl(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_lockctl"))
        .args(args)
        .output()
        .expect("running lockctl");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_show_and_force_release_on_one_server() {
    let server = RedisServer::start();
    let url = server.url();
    let runtime = LockRuntime::builder()
        .redis(url.as_str())
        .owner("billing-1")
        .build()
        .await
        .expect("build");
    let a = runtime
        .lock("job-a")
        .ttl(Duration::from_secs(30))
        .try_acquire()
        .await
        .expect("acquire")
        .expect("free");
    let _b = runtime
        .lock("job-b")
        .ttl(Duration::from_secs(30))
        .try_acquire()
        .await
        .expect("acquire")
        .expect("free");

    let (code, out, err) = tokio::task::spawn_blocking({
        let url = url.clone();
        move || lockctl(&["--url", &url, "list"])
    })
    .await
    .expect("join");
    assert_eq!(code, 0, "{err}");
    assert!(out.starts_with("KEY"), "{out}");
    assert!(
        out.contains("job-a") && out.contains("job-b") && out.contains("billing-1"),
        "{out}"
    );

    let (code, out, _) = lockctl(&["--url", &url, "--json", "list", "--match", "job-a"]);
    assert_eq!(code, 0);
    let rows: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(rows.as_array().map(Vec::len), Some(1), "{out}");
    assert_eq!(rows[0]["key"], "job-a");
    assert_eq!(rows[0]["fence"], a.lease().fence());
    assert!(
        rows[0]["ttl_ms"]
            .as_u64()
            .is_some_and(|t| t > 20_000 && t <= 30_000),
        "{out}"
    );

    let (code, out, _) = lockctl(&["--url", &url, "show", "job-a"]);
    assert_eq!(code, 0);
    assert!(out.contains("job-a") && out.contains("billing-1"), "{out}");
    let (code, out, _) = lockctl(&["--url", &url, "show", "nothing-here"]);
    assert_eq!(code, 1);
    assert!(out.contains("not locked"), "{out}");

    // A waiter in another runtime, woken by the forced release long before the 30 s ttl.
    let other = LockRuntime::builder()
        .redis(url.as_str())
        .build()
        .await
        .expect("build");
    let waiter = tokio::spawn(async move {
        let guard = other.lock("job-a").acquire().await.expect("acquire");
        guard.lease().fence()
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (code, _, err) = lockctl(&["--url", &url, "release", "job-a"]);
    assert_eq!(code, 2);
    assert!(err.contains("--force"), "{err}");
    assert!(!waiter.is_finished());
    let (code, out, err) = lockctl(&["--url", &url, "release", "job-a", "--force"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("released"), "{out}");
    let fence = tokio::time::timeout(Duration::from_secs(3), waiter)
        .await
        .expect("the waiter woke at the forced release")
        .expect("task");
    assert!(fence > a.lease().fence());
    // The old holder finds out at its next renewal (ttl/3 = 10 s): check the record instead.
    assert!(
        !a.release().await.expect("release"),
        "the forced-out holder no longer owns it"
    );

    let (code, _, err) = lockctl(&["--url", "redis://127.0.0.1:1", "list"]);
    assert_eq!(code, 2);
    assert!(err.contains("cannot connect"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_on_a_cluster_covers_every_master() {
    let cluster = RedisCluster::start(3);
    let urls = cluster.urls();
    let runtime = LockRuntime::builder()
        .redis_cluster(urls.clone())
        .owner("clustered")
        .build()
        .await
        .expect("build");
    let mut guards = Vec::new();
    for i in 0..12 {
        guards.push(
            runtime
                .lock(format!("shard-{i}"))
                .try_acquire()
                .await
                .expect("acquire")
                .expect("free"),
        );
    }
    let args = [
        "--cluster".to_owned(),
        "--url".to_owned(),
        urls[0].clone(),
        "--json".to_owned(),
        "list".to_owned(),
    ];
    let (code, out, err) = tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        lockctl(&args)
    })
    .await
    .expect("join");
    assert_eq!(code, 0, "{err}");
    let rows: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(rows.as_array().map(Vec::len), Some(12), "{out}");

    let (code, _, err) = lockctl(&[
        "--cluster",
        "--url",
        &urls[1],
        "release",
        "shard-3",
        "--force",
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(runtime.inspect("shard-3").await.expect("inspect").is_none());
}
