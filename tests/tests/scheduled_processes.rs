//! Five OS processes whose wall clocks really differ (Debian's `faketime` shifts each one's
//! clock by 0, +0.4, -0.7, +1.2 and -1.9 s) fire the same `every = "1s"` job that runs 50 ms,
//! with neither `min_hold` nor `once`, for about thirty firings, on Redis, PostgreSQL and etcd:
//! every firing that all five reached ran exactly once, and none ran twice; the job's journal
//! names, for each firing, the instance that ran it.

use std::collections::BTreeMap;
use std::process::Command;
use std::time::{SystemTime, UNIX_EPOCH};

use lock_runtime::RunOutcome;
use lock_tests::{EtcdCluster, PostgresServer, RedisServer};

/// The instances' clock offsets, in ms.
const OFFSETS_MS: [i64; 5] = [0, 400, -700, 1200, -1900];
/// How long each instance fires the job.
const RUN_MS: u64 = 35_000;

fn faketime_offset(ms: i64) -> String {
    // libfaketime's relative offset in seconds, with a '.' (the tests run in the C locale).
    format!(
        "{}{}.{:03}",
        if ms < 0 { '-' } else { '+' },
        ms.abs() / 1000,
        ms.abs() % 1000
    )
}

/// Runs the five instances against `lock_url` and checks the log.
fn five_skewed_instances(lock_url: &str) {
    let version = Command::new("faketime").arg("--version").output();
    assert!(
        version.is_ok_and(|o| o.status.success()),
        "faketime is missing: apt-get install -y faketime"
    );
    let dir = tempfile::tempdir().expect("temp dir");
    let log = dir.path().join("runs.log");
    let real_start = SystemTime::now();
    let children: Vec<_> = OFFSETS_MS
        .iter()
        .enumerate()
        .map(|(i, &ms)| {
            Command::new("faketime")
                .env("LC_ALL", "C")
                .args(["-m", "-f", &faketime_offset(ms)])
                .arg(env!("CARGO_BIN_EXE_scheduled_worker"))
                .arg(lock_url)
                .arg(format!("instance-{i}"))
                .arg(RUN_MS.to_string())
                .arg(&log)
                .spawn()
                .expect("start a worker under faketime")
        })
        .collect();
    for mut child in children {
        let status = child.wait().expect("a worker ends");
        assert!(status.success(), "a worker failed: {status}");
    }
    let text = std::fs::read_to_string(&log).expect("the log");
    let real_start_ms = real_start
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_millis() as i64;

    // Each instance's clock, as it reported it at its start, against this process's: the
    // offsets were applied (within the start-up time of a process).
    let mut starts: BTreeMap<String, i64> = BTreeMap::new();
    let mut runs: BTreeMap<i64, Vec<String>> = BTreeMap::new();
    let mut done = 0;
    for line in text.lines() {
        let words: Vec<&str> = line.split(' ').collect();
        match words.as_slice() {
            ["start", owner, ms] => {
                starts.insert((*owner).to_owned(), ms.parse().expect("a start time"));
            }
            ["run", firing, owner] => runs
                .entry(firing.parse().expect("a firing"))
                .or_default()
                .push((*owner).to_owned()),
            ["done", _] => done += 1,
            ["pid", _, _] => {}
            other => panic!("an unexpected log line: {other:?}"),
        }
    }
    assert_eq!(done, 5, "{text}");
    for (i, &offset) in OFFSETS_MS.iter().enumerate() {
        let seen = starts[&format!("instance-{i}")] - real_start_ms;
        assert!(
            seen >= offset - 200 && seen <= offset + 5_000,
            "instance-{i} started {seen} ms from the test's clock, its offset is {offset} ms"
        );
    }
    let twice: Vec<_> = runs.iter().filter(|(_, by)| by.len() > 1).collect();
    assert!(
        twice.is_empty(),
        "firings that ran twice: {twice:?}\n{text}"
    );
    // The firings every instance's scheduler reached: from the latest start (by the clock of
    // each) to the earliest end, with a second of margin on each side.
    let latest_start = OFFSETS_MS
        .iter()
        .enumerate()
        .map(|(i, _)| starts[&format!("instance-{i}")])
        .max()
        .expect("five");
    let earliest_end = OFFSETS_MS
        .iter()
        .enumerate()
        .map(|(i, _)| starts[&format!("instance-{i}")] + RUN_MS as i64)
        .min()
        .expect("five");
    let first = (latest_start / 1000 + 2) * 1000;
    let last = (earliest_end / 1000 - 1) * 1000;
    let missed: Vec<i64> = (first / 1000..=last / 1000)
        .map(|s| s * 1000)
        .filter(|ms| !runs.contains_key(ms))
        .collect();
    assert!(missed.is_empty(), "firings nobody ran: {missed:?}\n{text}");
    let reached = (last - first) / 1000 + 1;
    assert!(
        reached >= 25,
        "only {reached} firings in the window\n{text}"
    );
    let mut by_instance: BTreeMap<&str, usize> = BTreeMap::new();
    for by in runs.values() {
        *by_instance.entry(by[0].as_str()).or_default() += 1;
    }
    println!(
        "{} firings ran, each once ({reached} in the window all five reached); runs by instance: {by_instance:?}",
        runs.len()
    );
    journal_agrees(lock_url, &runs);
}

/// The job's journal, as `lockctl history` reads it (`LockRuntime::history`), says what the
/// log says: each firing that ran is journalled once, ok, by the instance that ran it, and a
/// firing nobody ran is journalled only as skipped or missed, if at all.
fn journal_agrees(lock_url: &str, runs: &BTreeMap<i64, Vec<String>>) {
    let journal = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime")
        .block_on(async {
            let reader = lock_tests::builder_for(lock_url)
                .owner("journal-reader")
                .build()
                .await
                .expect("a runtime");
            reader.history("tick", 1_000).await.expect("the journal")
        });
    let mut journalled: BTreeMap<i64, Vec<(String, RunOutcome)>> = BTreeMap::new();
    for run in &journal {
        let ms = run
            .scheduled_at()
            .duration_since(UNIX_EPOCH)
            .expect("after 1970")
            .as_millis() as i64;
        journalled
            .entry(ms)
            .or_default()
            .push((run.owner().to_owned(), run.outcome().clone()));
    }
    for (firing, by) in runs {
        assert_eq!(
            journalled.get(firing).map(Vec::as_slice),
            Some(&[(by[0].clone(), RunOutcome::Ok)][..]),
            "firing {firing}, run by {}: journalled as {:?}",
            by[0],
            journalled.get(firing)
        );
    }
    for (firing, entries) in &journalled {
        if !runs.contains_key(firing) {
            assert!(
                entries.len() == 1
                    && matches!(
                        entries[0].1,
                        RunOutcome::Skipped { .. } | RunOutcome::Missed
                    ),
                "firing {firing} did not run, yet is journalled as {entries:?}"
            );
        }
    }
    println!(
        "the journal holds {} runs, one per firing, each by the instance that ran it",
        journal.len()
    );
}

#[test]
fn five_skewed_processes_run_each_firing_once_on_redis() {
    let server = RedisServer::start();
    five_skewed_instances(&server.url());
}

#[test]
fn five_skewed_processes_run_each_firing_once_on_postgres() {
    let server = PostgresServer::start();
    five_skewed_instances(&server.url());
}

#[test]
fn five_skewed_processes_run_each_firing_once_on_etcd() {
    let cluster = EtcdCluster::start(1);
    five_skewed_instances(&format!("etcd:{}", cluster.endpoints().join(",")));
}

/// Runs `job` of the worker on two processes, A with its clock 1.5 s ahead and B `b_offset_ms`
/// off (for `b_run_ms`), kills A (SIGKILL) as soon as it has begun a run, and returns the
/// firings each ran, in log order: `(firing ms, owner)`.
fn kill_mid_run(lock_url: &str, job: &str, b_offset_ms: i64, b_run_ms: u64) -> Vec<(i64, String)> {
    let dir = tempfile::tempdir().expect("temp dir");
    let log = dir.path().join("runs.log");
    let start = |owner: &str, offset_ms: i64, sleep_ms: u64, run_ms: u64| {
        Command::new("faketime")
            .env("LC_ALL", "C")
            .args(["-m", "-f", &faketime_offset(offset_ms)])
            .arg(env!("CARGO_BIN_EXE_scheduled_worker"))
            .arg(lock_url)
            .arg(owner)
            .arg(run_ms.to_string())
            .arg(&log)
            .arg(job)
            .arg(sleep_ms.to_string())
            .spawn()
            .expect("start a worker under faketime")
    };
    // A's first firing is at most 10 s away; B, 5 s behind, reaches it 6.5 s after A did,
    // and runs long enough to reach the firing after it.
    let mut a = start("A", 1_500, 20_000, 25_000);
    let mut b = start("B", b_offset_ms, 0, b_run_ms);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if text
            .lines()
            .any(|l| l.starts_with("run ") && l.ends_with(" A"))
        {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "A never began a run:\n{text}"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    // faketime runs A as its child: SIGKILL to A's own pid, then faketime ends with it.
    let text = std::fs::read_to_string(&log).expect("the log");
    let pid = text
        .lines()
        .find_map(|l| l.strip_prefix("pid A "))
        .expect("A logged its pid")
        .to_owned();
    let killed = Command::new("kill")
        .args(["-9", &pid])
        .status()
        .expect("run kill");
    assert!(killed.success(), "kill -9 {pid}");
    let _ = a.wait();
    let status = b.wait().expect("B ends");
    assert!(status.success(), "B failed: {status}");
    let text = std::fs::read_to_string(&log).expect("the log");
    text.lines()
        .filter_map(|l| {
            let words: Vec<&str> = l.split(' ').collect();
            match words.as_slice() {
                ["run", firing, owner] => {
                    Some((firing.parse().expect("a firing"), (*owner).to_owned()))
                }
                _ => None,
            }
        })
        .collect()
}

/// A process killed mid-run: without `retry_crashed` its firing stays done (the instance
/// whose clock is behind skips it); with it, the killed run's marker goes with its lease and
/// the instance behind runs the firing when it reaches it. Either way no firing runs twice
/// at once, and B runs the later firings.
#[test]
fn a_run_killed_mid_way_is_retried_only_with_retry_crashed() {
    let server = RedisServer::start();
    for (job, retried) in [("crashy", false), ("crashy_retry", true)] {
        let runs = kill_mid_run(&server.url(), job, -5_000, 35_000);
        let (killed, _) = runs
            .iter()
            .find(|(_, owner)| owner == "A")
            .cloned()
            .expect("A's run");
        let by_b: Vec<i64> = runs
            .iter()
            .filter(|(_, owner)| owner == "B")
            .map(|(f, _)| *f)
            .collect();
        assert_eq!(
            by_b.contains(&killed),
            retried,
            "{job}: the killed run's firing {killed} was {} by B: {runs:?}",
            if retried {
                "not run again"
            } else {
                "run again"
            }
        );
        assert!(
            by_b.iter().any(|f| *f > killed),
            "{job}: B runs the later firings: {runs:?}"
        );
    }
}

/// A process killed mid-run, its lock then running out unreleased: B, which found the firing
/// claimed 0.5 s after A, follows A's lease and journals the firing as crashed, naming A and
/// its fence, once, on each store.
#[test]
fn a_run_killed_mid_way_is_journalled_crashed_once_its_lease_runs_out() {
    let redis = RedisServer::start();
    let postgres = PostgresServer::start();
    let etcd = EtcdCluster::start(1);
    let stores = [
        ("Redis", redis.url()),
        ("PostgreSQL", postgres.url()),
        ("etcd", format!("etcd:{}", etcd.endpoints().join(","))),
    ];
    for (store, url) in stores {
        // A's first firing is at most 10 s away; its lease (2 s) runs out 2 s after the
        // kill, B's report follows 3 s later: 20 s of B cover it.
        let runs = kill_mid_run(&url, "crashy", 1_000, 20_000);
        let (killed, _) = runs
            .iter()
            .find(|(_, owner)| owner == "A")
            .cloned()
            .expect("A's run");
        let journal = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a tokio runtime")
            .block_on(async {
                let reader = lock_tests::builder_for(&url)
                    .owner("journal-reader")
                    .build()
                    .await
                    .expect("a runtime");
                reader.history("crashy", 100).await.expect("the journal")
            });
        let of_killed: Vec<_> = journal
            .iter()
            .filter(|r| {
                r.scheduled_at()
                    .duration_since(UNIX_EPOCH)
                    .map_or(0, |d| d.as_millis() as i64)
                    == killed
            })
            .collect();
        assert!(
            matches!(of_killed.as_slice(), [r] if *r.outcome() == RunOutcome::Crashed
                && r.owner() == "A" && r.fence().is_some()),
            "{store}: A's killed firing {killed} is journalled as {of_killed:?}"
        );
        println!(
            "{store}: A's killed run of firing {killed} is journalled crashed, fence {:?}",
            of_killed[0].fence()
        );
    }
}
