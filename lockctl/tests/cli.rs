//! lockctl end to end on every topology, against real servers: locks taken by a runtime are
//! listed, shown, watched and force-released (waiters woken), with the same options for every
//! store; on Redlock the masters' disagreement is shown.

use std::process::Command;
use std::time::Duration;

use lock_runtime::{LockGuard, LockRuntime};
use lock_tests::{PostgresServer, RedisCluster, RedisServer, SentinelSet};

/// Runs lockctl with `args` (and `env`) off the async threads; exit code, stdout, stderr.
async fn lockctl_env(args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    let env: Vec<(String, String)> = env
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    tokio::task::spawn_blocking(move || {
        let out = Command::new(env!("CARGO_BIN_EXE_lockctl"))
            .args(&args)
            .env_remove("REDIS_URL")
            .envs(env)
            .output()
            .expect("running lockctl");
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    })
    .await
    .expect("join")
}

async fn lockctl(args: &[&str]) -> (i32, String, String) {
    lockctl_env(args, &[]).await
}

async fn hold(runtime: &LockRuntime, key: &str) -> LockGuard {
    runtime
        .lock(key)
        .ttl(Duration::from_secs(30))
        .try_acquire()
        .await
        .expect("acquire")
        .expect("free")
}

fn json(out: &str) -> serde_json::Value {
    serde_json::from_str(out).unwrap_or_else(|e| panic!("JSON expected ({e}): {out}"))
}

/// `store` names one store in lockctl's options. On it: `list` (table and JSON, with a
/// pattern), `show`, `release` refused without `--force`, and a forced release that wakes a
/// waiter of `other` long before the holder's 30 s ttl.
async fn lists_shows_and_force_releases(store: &[&str], holder: &LockRuntime, other: LockRuntime) {
    let a = hold(holder, "job-a").await;
    // Asked before listing: a store that fences on demand (Redis) shows a fence only once
    // its holder asked; job-b's holder never asks.
    let a_fence = a.lease().fence().await.expect("a fence");
    let b = hold(holder, "job-b").await;
    let _c = hold(holder, "report").await;
    let with = |rest: &[&str]| -> Vec<String> {
        store.iter().chain(rest).map(|s| s.to_string()).collect()
    };
    let run = |args: Vec<String>| async move {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        lockctl(&args).await
    };

    let (code, out, err) = run(with(&["list"])).await;
    assert_eq!(code, 0, "{err}");
    assert!(out.starts_with("KEY"), "{out}");
    for shown in ["job-a", "job-b", "report", holder.owner()] {
        assert!(out.contains(shown), "{shown} missing: {out}");
    }
    let (code, out, err) = run(with(&["--json", "list", "--match", "job-?"])).await;
    assert_eq!(code, 0, "{err}");
    let rows = json(&out);
    let keys: Vec<&str> = rows
        .as_array()
        .expect("an array")
        .iter()
        .filter_map(|r| r["key"].as_str())
        .collect();
    assert_eq!(keys, ["job-a", "job-b"], "{out}");
    assert_eq!(rows[0]["fence"], a_fence);
    // What the holder knows without asking is what the store has: a fence issued at
    // acquire (PostgreSQL, etcd) or none yet (Redis).
    assert_eq!(
        rows[1]["fence"],
        serde_json::to_value(b.lease().known_fence()).expect("json"),
        "{out}"
    );
    assert_eq!(rows[0]["owner"], holder.owner());
    let first_holding = rows[0]["holder"].as_str().expect("a holder id").to_owned();
    assert!(
        rows[0]["ttl_ms"]
            .as_u64()
            .is_some_and(|t| t > 20_000 && t <= 30_000),
        "{out}"
    );

    let (code, out, _) = run(with(&["show", "job-a"])).await;
    assert_eq!(code, 0);
    assert!(
        out.contains("job-a") && out.contains(holder.owner()),
        "{out}"
    );
    let (code, out, _) = run(with(&["show", "nothing-here"])).await;
    assert_eq!(code, 1);
    assert!(out.contains("not locked"), "{out}");

    let waiter = tokio::spawn(async move {
        let guard = other.lock("job-a").acquire().await.expect("acquire");
        guard.lease().fence().await.expect("a fence")
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (code, _, err) = run(with(&["release", "job-a"])).await;
    assert_eq!(code, 2);
    assert!(err.contains("--force"), "{err}");
    assert!(!waiter.is_finished());
    let (code, out, err) = run(with(&["release", "job-a", "--force"])).await;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("released"), "{out}");
    let fence = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("the waiter woke at the forced release")
        .expect("task");
    assert!(fence > a.lease().fence().await.expect("a fence"));
    let old = a.lease().fence().await.expect("a fence").to_string();
    assert!(
        !a.release().await.expect("release"),
        "the forced-out holder no longer owns it"
    );
    // Named by the fence `list` showed: a holder that came in since is left alone.
    // (The waiter's guard is released as its task ended; wait for that.)
    let now = holder
        .lock("job-a")
        .ttl(Duration::from_secs(30))
        .acquire_timeout(Duration::from_secs(5))
        .await
        .expect("job-a again");
    let now_fence = now.lease().fence().await.expect("a fence");
    let held_now = format!("held with fence {now_fence}");
    let (code, out, err) = run(with(&["release", "job-a", "--force", "--fence", &old])).await;
    assert_eq!(code, 1, "{err}");
    assert!(out.contains(&held_now), "{out}");
    // Named by the holder id: the first holding's id leaves the holder of now alone, its own
    // id frees it.
    let (code, out, err) = run(with(&[
        "release",
        "job-a",
        "--force",
        "--holder",
        &first_holding,
    ]))
    .await;
    assert_eq!(code, 1, "{err}");
    assert!(out.contains(&held_now), "{out}");
    let (code, out, err) = run(with(&["--json", "show", "job-a"])).await;
    assert_eq!(code, 0, "{err}");
    let now_holding = json(&out)[0]["holder"]
        .as_str()
        .expect("a holder id")
        .to_owned();
    assert_ne!(now_holding, first_holding, "{out}");
    let (code, _, err) = run(with(&[
        "release",
        "job-a",
        "--force",
        "--fence",
        &old,
        "--holder",
        &now_holding,
    ]))
    .await;
    assert_eq!(code, 2, "--fence and --holder together are refused: {err}");
    let (code, out, err) = run(with(&[
        "release",
        "job-a",
        "--force",
        "--holder",
        &now_holding,
    ]))
    .await;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("released"), "{out}");
    let (code, out, _) = run(with(&["release", "job-a-never", "--force"])).await;
    assert_eq!(code, 1);
    assert!(out.contains("was not locked"), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_server_with_redis_url_fallback_watch_and_errors() {
    let server = RedisServer::start();
    let url = server.url();
    let runtime = || LockRuntime::builder().redis(url.as_str()).build();
    let holder = runtime().await.expect("build");
    let other = runtime().await.expect("build");
    lists_shows_and_force_releases(&["--redis", &url], &holder, other).await;

    // REDIS_URL when no store is named.
    let _held = hold(&holder, "held-on").await;
    let (code, out, err) = lockctl_env(&["list"], &[("REDIS_URL", &url)]).await;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("held-on"), "{out}");
    // watch: one JSON array per refresh.
    let (code, out, err) = lockctl(&[
        "--redis",
        &url,
        "--json",
        "watch",
        "--interval",
        "0.2",
        "--count",
        "3",
    ])
    .await;
    assert_eq!(code, 0, "{err}");
    let refreshes: Vec<&str> = out.lines().collect();
    assert_eq!(refreshes.len(), 3, "{out}");
    assert!(
        refreshes
            .iter()
            .all(|line| json(line).as_array().is_some_and(|rows| !rows.is_empty()))
    );

    let (code, _, err) = lockctl(&["--redis", "redis://127.0.0.1:1", "list"]).await;
    assert_eq!(code, 2);
    assert!(err.contains("cannot connect"), "{err}");
    let (code, _, err) = lockctl(&["list"]).await;
    assert_eq!(code, 2);
    assert!(
        err.contains("name a store") && err.contains("REDIS_URL"),
        "{err}"
    );
    let (code, _, err) = lockctl(&["--redis", &url, "--redlock", &url, "list"]).await;
    assert_eq!(code, 2);
    assert!(err.contains("--redis and --redlock"), "{err}");
    let (code, _, err) = lockctl(&["--redis", &url, "show", "a{b}"]).await;
    assert_eq!(code, 2);
    assert!(err.contains("brace"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_lists_every_master() {
    let cluster = RedisCluster::start(3);
    let urls = cluster.urls();
    let runtime = || LockRuntime::builder().redis_cluster(urls.clone()).build();
    let holder = runtime().await.expect("build");
    let seeds = format!("{},{}", urls[0], urls[1]);
    lists_shows_and_force_releases(
        &["--cluster", &seeds],
        &holder,
        runtime().await.expect("build"),
    )
    .await;
    // Enough keys that every master holds some.
    let mut guards = Vec::new();
    for i in 0..12 {
        guards.push(hold(&holder, &format!("shard-{i}")).await);
    }
    let (code, out, err) = lockctl(&[
        "--cluster",
        &urls[2],
        "--json",
        "list",
        "--match",
        "shard-*",
    ])
    .await;
    assert_eq!(code, 0, "{err}");
    assert_eq!(json(&out).as_array().map(Vec::len), Some(12), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_follows_the_named_master() {
    let set = SentinelSet::start();
    let urls = set.sentinel_urls();
    let runtime = || {
        LockRuntime::builder()
            .redis_sentinel(&set.master_name, urls.clone())
            .build()
    };
    let holder = runtime().await.expect("build");
    let spec = format!("{}={}", set.master_name, urls.join(","));
    lists_shows_and_force_releases(
        &["--sentinel", &spec],
        &holder,
        runtime().await.expect("build"),
    )
    .await;
    let (code, _, err) = lockctl(&["--sentinel", "no-equals-sign", "list"]).await;
    assert_eq!(code, 2);
    assert!(err.contains("NAME=URL"), "{err}");
}

/// Redlock: the MASTERS column counts the masters holding each lock, and says where they
/// disagree: a record removed from two of three masters behind the runtime's back leaves the
/// lock without a quorum, which `list` shows and `show` does not call held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_shows_where_the_masters_disagree() {
    let masters: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let urls: Vec<String> = masters.iter().map(RedisServer::url).collect();
    let runtime = || LockRuntime::builder().redlock(urls.clone()).build();
    let holder = runtime().await.expect("build");
    let all = urls.join(",");
    lists_shows_and_force_releases(
        &["--redlock", &all],
        &holder,
        runtime().await.expect("build"),
    )
    .await;

    let _split = hold(&holder, "split").await;
    let (code, out, err) = lockctl(&["--redlock", &all, "list", "--match", "split"]).await;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("MASTERS") && out.contains("3/3"), "{out}");
    for master in &masters[..2] {
        let mut conn = master.client().get_connection().expect("connect");
        let _: () = redis::cmd("DEL")
            .arg("lock:{split}")
            .query(&mut conn)
            .expect("DEL");
    }
    let (code, out, err) =
        lockctl(&["--redlock", &all, "--json", "list", "--match", "split"]).await;
    assert_eq!(code, 0, "{err}");
    let rows = json(&out);
    assert_eq!(rows[0]["masters"]["agreeing"], 1, "{out}");
    assert_eq!(rows[0]["masters"]["total"], 3, "{out}");
    assert_eq!(rows[0]["masters"]["quorum"], false, "{out}");
    let (code, out, _) = lockctl(&["--redlock", &all, "list", "--match", "split"]).await;
    assert_eq!(code, 0);
    assert!(out.contains("1/3 no quorum"), "{out}");
    let (code, out, _) = lockctl(&["--redlock", &all, "show", "split"]).await;
    assert_eq!(code, 1, "without a quorum the lock is not held: {out}");
    // What is left on the one master still keeps a new quorum out (2 of 3 needed, 2 free
    // only if that one is cleared too): a forced release clears it.
    let (code, out, err) = lockctl(&["--redlock", &all, "release", "split", "--force"]).await;
    assert_eq!(code, 0, "{out}{err}");
    let (code, out, _) = lockctl(&["--redlock", &all, "--json", "list", "--match", "split"]).await;
    assert_eq!(code, 0);
    assert_eq!(json(&out).as_array().map(Vec::len), Some(0), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_through_the_same_options() {
    let cluster = lock_tests::EtcdCluster::start(1);
    let endpoints = cluster.endpoints().join(",");
    let runtime = |owner: &str| {
        LockRuntime::builder()
            .etcd(cluster.endpoints())
            .owner(owner)
            .build()
    };
    let holder = runtime("billing-1").await.expect("build");
    let other = runtime("billing-2").await.expect("build");
    lists_shows_and_force_releases(&["--etcd", &endpoints], &holder, other).await;
    let (code, _, err) =
        lockctl(&["--redis", "redis://127.0.0.1:1", "--etcd-user", "u", "list"]).await;
    assert_eq!(code, 2);
    assert!(err.contains("--etcd-user goes with --etcd"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper_through_the_same_options() {
    let ensemble = lock_tests::ZooKeeperEnsemble::start(1);
    let connect = format!("{}/lockctl-test", ensemble.connect_string());
    let runtime = |owner: &str| {
        LockRuntime::builder()
            .zookeeper(connect.clone())
            .owner(owner)
            .build()
    };
    let holder = runtime("billing-1").await.expect("build");
    let other = runtime("billing-2").await.expect("build");
    lists_shows_and_force_releases(&["--zookeeper", &connect], &holder, other).await;
    let (code, _, err) = lockctl(&[
        "--redis",
        "redis://127.0.0.1:1",
        "--zookeeper-user",
        "u",
        "list",
    ])
    .await;
    assert_eq!(code, 2);
    assert!(
        err.contains("--zookeeper-user goes with --zookeeper"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_through_the_same_options() {
    let server = PostgresServer::start();
    let url = server.url();
    let holder = server.runtime("billing-1").await;
    let other = server.runtime("billing-2").await;
    lists_shows_and_force_releases(&["--postgres", &url], &holder, other).await;
    let (code, _, err) = lockctl(&["--postgres", &url, "--table", "bad name", "list"]).await;
    assert_eq!(code, 2);
    assert!(err.contains("table"), "{err}");
    let (code, _, err) = lockctl(&["--redis", "redis://127.0.0.1:1", "--table", "t", "list"]).await;
    assert_eq!(code, 2);
    assert!(err.contains("--table goes with --postgres"), "{err}");
}

#[lock_runtime::scheduled(every = "1s", name = "cli-nightly")]
#[lock_runtime::distributed_lock(key = "cli-nightly", ttl = "10s")]
async fn nightly() -> Result<(), lock_runtime::LockError> {
    // The body asks for its fence, so each run is journalled with it (a Redis lease has one
    // only once asked).
    if let Some(lease) = lock_runtime::current_lease() {
        lease.fence().await?;
    }
    tokio::time::sleep(Duration::from_millis(20)).await;
    Ok(())
}

/// Two instances run a scheduled job for a few seconds; `lockctl history` shows each firing
/// once, with the instance that ran it, and `lockctl jobs` lists the job with its last run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_and_jobs_show_who_ran_each_firing() {
    let server = RedisServer::start();
    let url = server.url();
    let instance = |owner: &str| {
        LockRuntime::builder()
            .redis(url.as_str())
            .owner(owner)
            .build()
    };
    let (a, b) = (
        instance("night-a").await.expect("build"),
        instance("night-b").await.expect("build"),
    );
    let run = |runtime: LockRuntime| {
        lock_runtime::Scheduler::new(runtime)
            .only(["cli-nightly"])
            .run_until(tokio::time::sleep(Duration::from_millis(3_600)))
    };
    let (ran_a, ran_b) = tokio::join!(run(a), run(b));
    ran_a.expect("scheduler a");
    ran_b.expect("scheduler b");

    let (code, out, err) = lockctl(&["--redis", &url, "--json", "history", "cli-nightly"]).await;
    assert_eq!(code, 0, "{err}");
    let runs = json(&out);
    let runs = runs.as_array().expect("an array");
    assert!(runs.len() >= 3, "{} runs in 3.6 s: {out}", runs.len());
    let mut firings: Vec<&str> = runs
        .iter()
        .map(|r| r["scheduled_at"].as_str().expect("scheduled_at"))
        .collect();
    let newest_first = firings.windows(2).all(|w| w[0] > w[1]);
    firings.dedup();
    assert_eq!(
        firings.len(),
        runs.len(),
        "a firing journalled twice: {out}"
    );
    assert!(newest_first, "not newest first: {out}");
    for r in runs {
        assert_eq!(r["outcome"], "ok", "{out}");
        assert!(
            r["owner"] == "night-a" || r["owner"] == "night-b",
            "run by {}: {out}",
            r["owner"]
        );
        assert!(r["fence"].as_u64().is_some(), "{out}");
    }

    let (code, table, _) =
        lockctl(&["--redis", &url, "history", "cli-nightly", "--limit", "2"]).await;
    assert_eq!(code, 0);
    assert_eq!(table.lines().count(), 3, "a header and two runs: {table}");
    assert!(table.starts_with("SCHEDULED"), "{table}");

    let (code, out, _) = lockctl(&["--redis", &url, "--json", "jobs"]).await;
    assert_eq!(code, 0);
    let jobs = json(&out);
    assert_eq!(jobs[0]["job"], "cli-nightly", "{out}");
    assert_eq!(jobs[0]["schedule"], "every 1s", "{out}");
    assert!(jobs[0]["holder"].is_null(), "{out}");
    let next = jobs[0]["next_firing"].as_str().expect("a next firing");
    assert!(
        next > jobs[0]["last_run"]["scheduled_at"]
            .as_str()
            .expect("a firing"),
        "{out}"
    );
    // The job's lock held now: `jobs` names its holder.
    let holder = instance("night-holder").await.expect("build");
    let held = hold(&holder, "cli-nightly").await;
    let held_fence = held.lease().fence().await.expect("a fence");
    let (code, table, _) = lockctl(&["--redis", &url, "jobs"]).await;
    assert_eq!(code, 0);
    assert!(table.starts_with("JOB  "), "{table}");
    let row = table.lines().nth(1).unwrap_or_default();
    assert!(
        row.starts_with("cli-nightly")
            && row.contains("every 1s")
            && row.ends_with(&format!("night-holder (fence {held_fence})")),
        "{table}"
    );
    drop(held);
    assert_eq!(
        jobs[0]["last_run"]["scheduled_at"], runs[0]["scheduled_at"],
        "{out}"
    );

    let (code, out, _) = lockctl(&["--redis", &url, "history", "no-such-job"]).await;
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("no runs of `no-such-job`"), "{out}");
    let since = |when: &str| {
        let url = url.clone();
        let when = when.to_owned();
        async move {
            lockctl(&[
                "--redis",
                &url,
                "--json",
                "history",
                "cli-nightly",
                "--since",
                &when,
            ])
            .await
        }
    };
    let (code, out, _) = since("1h").await;
    assert_eq!(code, 0);
    assert_eq!(
        json(&out).as_array().map(Vec::len),
        Some(runs.len()),
        "{out}"
    );
    let (code, out, _) = since("2099-01-01T00:00:00Z").await;
    assert_eq!(code, 1, "runs scheduled after 2099: {out}");
    let (code, _, err) = lockctl(&[
        "--redis",
        &url,
        "history",
        "cli-nightly",
        "--since",
        "yesterday",
    ])
    .await;
    assert_eq!(code, 2);
    assert!(err.contains("--since takes a duration"), "{err}");
}
