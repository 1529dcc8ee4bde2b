//! Crash failovers, measured. In each trial a runtime A takes a fresh key, the master serving
//! it is killed with SIGKILL (not handed over), the automatic failover promotes its replica,
//! and a fresh runtime B tries the key. A *double grant* is B getting the lock while A still
//! believes its lease valid; a *repeated fence* is B's fence not above A's. Two ways to race:
//!
//! - `racing`: the kill follows A's acquire by 0-3000 us (seeded), so the grant may or may not
//!   have been answered, and may or may not have reached the replica;
//! - `link cut`: the master drops its replica's link (`CLIENT KILL TYPE replica`, a network
//!   blip) just before A acquires and dies just after, so the grant reaches only the master.
//!   (A replica paused with SIGSTOP would not do: its kernel still takes the stream in.)
//!
//! Redlock has no failover; its trials restart a majority or a minority of its 5 masters
//! (without persistence, and with `appendfsync always`), or step their clocks forward past the
//! ttl (emulated on the records, see `redlock_trial`).
//!
//! Each trial's outcome is printed; the counts per topology x option x race are docs/reliability.md's
//! crash-failover table. `CRASH_TRIALS=50` for the full run (default 2 per row);
//! `CRASH_RESULTS=<file>` appends the rows as JSON lines. Asserted: with `replicated_acquire`
//! no double grant; Redlock safe (A granted, B refused, every trial) when only a minority is
//! hit or the restarted masters kept their data; and in every trial where both A and B were
//! granted and A was handed a fence (racing, A asks for it as soon as it is granted), B's
//! fence is above A's (the hybrid fence of DESIGN.md §5). The rows where
//! double grants are expected (no `replicated_acquire`, a Redlock majority losing the record)
//! are counted, not asserted: they are what docs/reliability.md warns about.

use lock_tests::Built;
use std::time::{Duration, Instant};

use lock_runtime::{LockGuard, LockRuntime, RedisStore};
use lock_tests::rng::XorShift;
use lock_tests::{RedisCluster, RedisServer, SentinelSet};

fn trials() -> usize {
    std::env::var("CRASH_TRIALS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2)
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Race {
    Racing,
    LinkCut,
}

impl Race {
    fn name(self) -> &'static str {
        match self {
            Race::Racing => "racing",
            Race::LinkCut => "link cut",
        }
    }
}

/// What one row of trials counted.
#[derive(Debug, Default)]
struct Row {
    trials: usize,
    a_granted: usize,
    b_granted: usize,
    double_grants: usize,
    fences_repeated: usize,
    /// Neither A nor B got the lock: A's acquire landed but its answer was lost in the crash
    /// (A gives the grant back in the background; B tried first).
    neither: usize,
}

impl Row {
    fn report(&self, topology: &str, option: &str, race: Race) {
        self.write(&format!(
            "\"topology\": \"{topology}\", \"option\": \"{option}\", \"race\": \"{}\"",
            race.name()
        ));
    }

    fn report_redlock(&self, fault: &str) {
        self.write(&format!(
            "\"topology\": \"redlock\", \"option\": \"none\", \"race\": \"{fault}\""
        ));
    }

    fn write(&self, what: &str) {
        let line = format!(
            "{{{what}, \"trials\": {}, \"a_granted\": {}, \"b_granted\": {}, \
             \"double_grants\": {}, \"fences_repeated\": {}, \"neither\": {}}}",
            self.trials,
            self.a_granted,
            self.b_granted,
            self.double_grants,
            self.fences_repeated,
            self.neither
        );
        println!("crash failover: {line}");
        if let Ok(path) = std::env::var("CRASH_RESULTS") {
            use std::io::Write as _;
            let mut file = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&path)
                .expect("opening CRASH_RESULTS");
            writeln!(file, "{line}").expect("writing CRASH_RESULTS");
        }
    }
}

/// Spins for `us` microseconds (a sleep's granularity is too coarse for the race).
fn spin_us(us: u64) {
    let until = Instant::now() + Duration::from_micros(us);
    while Instant::now() < until {
        std::hint::spin_loop();
    }
}

/// A's side of a trial: acquire `key` racing the kill of `master`, with the replication link
/// cut first for [`Race::LinkCut`]. Returns A's guard if A was granted the lock.
async fn acquire_racing_the_kill(
    a: &LockRuntime,
    key: &str,
    race: Race,
    master: &mut RedisServer,
    rng: &mut XorShift,
) -> Option<LockGuard> {
    // Warm up: connections made and scripts loaded, so the race is about the grant alone.
    if let Ok(Some(warm)) = a.lock(format!("{key}-warm-up")).try_acquire().await {
        let _ = warm.release().await;
    }
    // 30 s: A's first renewal (at 10 s) comes after B's try, so a lost record is counted as a
    // double grant rather than noticed by A first.
    let request = a.lock(key).ttl(Duration::from_secs(30));
    let guard = match race {
        Race::Racing => {
            // A asks for its fence as soon as it is granted (fences are handed on demand), so
            // that a fence handed before the crash is there to compare with B's.
            let attempt = tokio::spawn(async move {
                let result = request.try_acquire().await;
                if let Ok(Some(guard)) = &result {
                    let _ = guard.lease().fence().await;
                }
                result
            });
            spin_us(rng.below(3000));
            master.kill();
            attempt.await.ok()
        }
        Race::LinkCut => {
            let mut conn = master.conn().await;
            let cut: redis::RedisResult<i64> = redis::cmd("CLIENT")
                .arg("KILL")
                .arg("TYPE")
                .arg("replica")
                .query_async(&mut conn)
                .await;
            assert_eq!(cut, Ok(1), "the master had one replica link to cut");
            // No fence asked here: the ask's round trip is long enough for the replica to
            // come back and take the record in (measured: no double grant in 12 trials with
            // it, half the trials without), and this race is about a grant only the master had.
            let result = request.try_acquire().await;
            master.kill();
            Some(result)
        }
    };
    match guard {
        Some(Ok(Some(guard))) => Some(guard),
        other => {
            println!("  {key}: A not granted: {other:?}");
            None
        }
    }
}

/// B's side: a fresh runtime tries the key (retrying errors for a few seconds while the new
/// master settles) and the trial is counted.
async fn count_b(b: &LockRuntime, key: &str, a: Option<&LockGuard>, row: &mut Row) {
    row.trials += 1;
    row.a_granted += usize::from(a.is_some());
    let deadline = Instant::now() + Duration::from_secs(5);
    let b_guard = loop {
        match b.lock(key).ttl(Duration::from_secs(10)).try_acquire().await {
            Ok(guard) => break guard,
            Err(_) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await
            }
            Err(e) => panic!("B could not reach the new master: {e}"),
        }
    };
    let Some(b_guard) = b_guard else {
        row.neither += usize::from(a.is_none());
        return;
    };
    row.b_granted += 1;
    if let Some(a) = a {
        if !a.lease().is_lost() {
            row.double_grants += 1;
        }
        // B holds the lock it was just granted, so its fence is there to be had. A's is the one
        // it was handed before the crash, if its ask was answered; A asking now could only be
        // refused (the record is B's).
        let b_fence = b_guard
            .lease()
            .fence()
            .await
            .expect("B's fence while B holds");
        let a_fence = a.lease().known_fence();
        if a_fence.is_some_and(|a_fence| b_fence <= a_fence) {
            row.fences_repeated += 1;
        }
        let a_fence = a_fence.map_or_else(|| "none handed".to_string(), |f| f.to_string());
        println!(
            "  {key}: A fence {a_fence} (lost: {}), B fence {b_fence}",
            a.lease().is_lost(),
        );
    }
    let _ = b_guard.release().await;
}

/// True when a replica of `master` confirms a fresh write of `probe` within half a second.
fn replica_confirmed(master: &RedisServer, probe: &str) -> bool {
    master.replica_confirms_write(probe, Duration::from_millis(500))
}

/// Waits until `master`'s replica confirms a fresh write, so the next trial starts with a
/// replica in sync.
async fn replica_confirms(master: &RedisServer, probe: &str, limit: Duration) {
    let deadline = Instant::now() + limit;
    while !replica_confirmed(master, probe) {
        assert!(
            Instant::now() < deadline,
            "the replica did not sync in {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn sentinel_runtime(set: &SentinelSet, replicated: bool) -> LockRuntime {
    let mut store = RedisStore::sentinel(set.master_name.clone(), set.sentinel_urls());
    if replicated {
        store = store.replicated_acquire(1, Duration::from_millis(500));
    }
    let builder = LockRuntime::builder()
        .store(store)
        .command_timeout(Duration::from_millis(500));
    builder.build().await.expect("a sentinel runtime")
}

async fn sentinel_trial(
    set: &mut SentinelSet,
    i: usize,
    replicated: bool,
    race: Race,
    row: &mut Row,
    rng: &mut XorShift,
) {
    let m = settle(set).await;
    let master_port = set.servers[m].port();
    let key = format!("sentinel-{}-{i}", race.name().replace(' ', "-"));
    let a = sentinel_runtime(set, replicated).await;
    let a_guard = acquire_racing_the_kill(&a, &key, race, &mut set.servers[m], rng).await;
    set.wait_for(Duration::from_secs(30), |set| {
        set.master_port().is_some_and(|p| p != master_port)
    });
    let b = sentinel_runtime(set, false).await;
    count_b(&b, &key, a_guard.as_ref(), row).await;
    drop(a_guard);
    b.shutdown().await;
    a.shutdown().await;
    // The dead master comes back; the next trial settles the set with it as the replica.
    set.servers[m].restart();
}

/// A plain connection with 1 s connect, read and write timeouts, so no check can hang.
fn connect(server: &RedisServer) -> Option<redis::Connection> {
    let timeout = Some(Duration::from_secs(1));
    let conn = server
        .client()
        .get_connection_with_timeout(Duration::from_secs(1))
        .ok()?;
    conn.set_read_timeout(timeout).ok()?;
    conn.set_write_timeout(timeout).ok()?;
    Some(conn)
}

/// `INFO replication` of `server` as field -> value.
fn replication_info(server: &RedisServer) -> std::collections::HashMap<String, String> {
    let info: String = connect(server)
        .and_then(|mut c| redis::cmd("INFO").arg("replication").query(&mut c).ok())
        .unwrap_or_default();
    info.lines()
        .filter_map(|line| line.trim().split_once(':'))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

/// The master every sentinel names, as an index into `set.servers`.
fn agreed_master(set: &SentinelSet) -> Option<usize> {
    let mut named = set.sentinels.iter().map(|s| set.master_port_named_by(s));
    let first = named.next()??;
    if !named.all(|p| p == Some(first)) {
        return None;
    }
    set.servers.iter().position(|s| s.port() == first)
}

/// Waits until the set is ready for a trial and returns the master's index: the sentinels
/// agree on a master that says it is one, the other server replicates it (told to, if it
/// follows no one or another), a `WAIT` confirms a write, and every sentinel sees the replica
/// healthy. Sentinels may fail over again meanwhile (one whose view lagged); the set is then
/// settled around whichever master they agree on.
async fn settle(set: &SentinelSet) -> usize {
    let deadline = Instant::now() + Duration::from_secs(90);
    let mut waiting_for = "the sentinels to agree on a master";
    loop {
        if let Some(m) = agreed_master(set) {
            let (master, replica) = (&set.servers[m], &set.servers[1 - m]);
            let info = replication_info(replica);
            let field = |name: &str| info.get(name).map(String::as_str);
            let follows = field("role") == Some("slave")
                && field("master_port") == Some(master.port().to_string().as_str());
            let master_role = replication_info(master).get("role").cloned();
            waiting_for = if master_role.as_deref() != Some("master") {
                "the named master to take the role"
            } else if !follows {
                if let Some(mut conn) = connect(replica) {
                    let _: redis::RedisResult<()> = redis::cmd("REPLICAOF")
                        .arg("127.0.0.1")
                        .arg(master.port())
                        .query(&mut conn);
                }
                "the other server to follow the master"
            } else if field("master_link_status") != Some("up")
                || !replica_confirmed(master, "probe")
            {
                "the replica to confirm a write"
            } else if !sentinels_see_replica(set, replica.port()) {
                "every sentinel to see the replica healthy"
            } else {
                return m;
            };
        }
        assert!(
            Instant::now() < deadline,
            "the sentinel set did not settle in 90 s: waiting for {waiting_for}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// True when every sentinel lists the server on `port` as a healthy replica (flags exactly
/// `slave`): only then can the next failover promote it.
fn sentinels_see_replica(set: &SentinelSet, port: u16) -> bool {
    set.sentinels.iter().all(|s| {
        let Some(mut conn) = connect(s) else {
            return false;
        };
        let replicas: Vec<Vec<String>> = redis::cmd("SENTINEL")
            .arg("REPLICAS")
            .arg(&set.master_name)
            .query(&mut conn)
            .unwrap_or_default();
        replicas.iter().any(|fields| {
            let field = |name: &str| {
                fields
                    .chunks(2)
                    .find(|kv| kv[0] == name)
                    .and_then(|kv| kv.get(1))
                    .map(String::as_str)
            };
            field("port") == Some(port.to_string().as_str()) && field("flags") == Some("slave")
        })
    })
}

/// Sentinel: the master killed under A's fresh lock, with and without `replicated_acquire`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_crash_failovers_are_counted() {
    let mut set = SentinelSet::start();
    // A sentinel starts no new failover of a master within twice this timeout of the last;
    // the harness's 5 s would make each trial last 10 s. (1.5 s proved too short: a sentinel
    // gave up waiting for its promoted replica and promoted the other server.)
    set.configure("failover-timeout", 3000);
    let mut rng = XorShift::new(7);
    let mut replicated_doubles = 0;
    let mut repeated = 0;
    for replicated in [false, true] {
        for race in [Race::Racing, Race::LinkCut] {
            let mut row = Row::default();
            for i in 0..trials() {
                sentinel_trial(&mut set, i, replicated, race, &mut row, &mut rng).await;
            }
            let option = if replicated {
                "replicated_acquire(1)"
            } else {
                "none"
            };
            row.report("sentinel", option, race);
            if replicated {
                replicated_doubles += row.double_grants;
            }
            repeated += row.fences_repeated;
        }
    }
    assert_eq!(
        replicated_doubles, 0,
        "replicated_acquire let a second holder in"
    );
    assert_eq!(repeated, 0, "a fence repeated across a failover");
}

async fn cluster_runtime(cluster: &RedisCluster, dead: Option<usize>) -> LockRuntime {
    let urls: Vec<String> = (0..cluster.nodes.len())
        .filter(|i| Some(*i) != dead)
        .map(|i| cluster.nodes[i].url())
        .collect();
    LockRuntime::builder()
        .redis_cluster(urls)
        .command_timeout(Duration::from_millis(500))
        .built()
        .await
}

async fn cluster_trial(
    cluster: &mut RedisCluster,
    i: usize,
    race: Race,
    row: &mut Row,
    rng: &mut XorShift,
) {
    let key = format!("cluster-{}-{i}", race.name().replace(' ', "-"));
    // The record's slot is the hash tag's: the runtime's record key is `<ns>:{key}`.
    let (m, r) = cluster.master_and_replica_of(&key);
    let a = cluster_runtime(cluster, None).await;
    let a_guard = acquire_racing_the_kill(&a, &key, race, &mut cluster.nodes[m], rng).await;
    // The replica takes over the slot once the other masters agree the master failed.
    let deadline = Instant::now() + Duration::from_secs(30);
    while cluster.shard_of(r, &key).0 != r {
        assert!(
            Instant::now() < deadline,
            "the replica of {key} was not promoted"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let b = cluster_runtime(cluster, Some(m)).await;
    count_b(&b, &key, a_guard.as_ref(), row).await;
    drop(a_guard);
    b.shutdown().await;
    a.shutdown().await;
    // The dead master restarts from its nodes.conf and rejoins as the new master's replica.
    cluster.nodes[m].restart();
    cluster.wait_until_ok(Duration::from_secs(30));
    let deadline = Instant::now() + Duration::from_secs(30);
    while cluster.shard_of(r, &key).1 != Some(m) {
        assert!(
            Instant::now() < deadline,
            "node {m} did not rejoin as a replica"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The probe shares the trial key's slot, which the new master serves.
    let probe = format!("{{{key}}}:probe");
    replica_confirms(&cluster.nodes[r], &probe, Duration::from_secs(30)).await;
}

/// Cluster: the master of A's fresh lock's slot killed; its replica is promoted by the
/// cluster itself. (`replicated_acquire` is not offered on Cluster.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_crash_failovers_are_counted() {
    let mut cluster = RedisCluster::start(3);
    let mut rng = XorShift::new(11);
    let mut repeated = 0;
    for race in [Race::Racing, Race::LinkCut] {
        let mut row = Row::default();
        for i in 0..trials() {
            cluster_trial(&mut cluster, i, race, &mut row, &mut rng).await;
        }
        row.report("cluster", "none", race);
        repeated += row.fences_repeated;
    }
    assert_eq!(repeated, 0, "a fence repeated across a failover");
}

/// What happens to a Redlock majority in a trial.
#[derive(Debug, Clone, Copy)]
enum RedlockFault {
    /// `n` masters killed and restarted.
    Restart(usize),
    /// `n` masters' clocks stepped forward past the ttl.
    ClockStep(usize),
}

async fn redlock_runtime(masters: &[RedisServer]) -> LockRuntime {
    LockRuntime::builder()
        .redlock(masters.iter().map(RedisServer::url))
        .command_timeout(Duration::from_millis(500))
        .built()
        .await
}

/// One Redlock trial: A holds a fresh key (ttl 30 s) on 5 masters, the fault hits some of
/// them, and B tries the key.
async fn redlock_trial(masters: &mut [RedisServer], i: usize, fault: RedlockFault, row: &mut Row) {
    let key = format!("redlock-{fault:?}-{i}").replace(['(', ')'], "");
    let a = redlock_runtime(masters).await;
    let a_guard = match a
        .lock(key.as_str())
        .ttl(Duration::from_secs(30))
        .try_acquire()
        .await
    {
        Ok(guard) => guard,
        Err(e) => {
            println!("  {key}: A not granted: {e}");
            None
        }
    };
    match fault {
        RedlockFault::Restart(n) => masters[..n].iter_mut().for_each(RedisServer::restart),
        RedlockFault::ClockStep(n) => {
            // No tool here can move one process's clock (libfaketime clashes with the
            // server's allocator), so the step is applied where it acts: a clock stepped
            // forward by more than the remaining ttl expires the record at once. The servers'
            // TIME, which feeds the hybrid fence, is not stepped: a clock stepped backwards
            // is not covered by these trials.
            let record = lock_runtime::store::KeyNames::new("lock", &key);
            for master in &masters[..n] {
                let mut conn = master.conn().await;
                let _: () = lock_tests::query(&mut conn, ("PEXPIRE", record.record(), 1)).await;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    let b = redlock_runtime(masters).await;
    count_b(&b, &key, a_guard.as_ref(), row).await;
    drop(a_guard);
    b.shutdown().await;
    a.shutdown().await;
}

/// Redlock over 5 masters: a majority (3) or a minority (2) restarted, without persistence
/// and with `appendfsync always`; a majority's or a minority's clocks stepped forward.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_restarts_and_clock_steps_are_counted() {
    let mut repeated = 0;
    for (persistence, args) in [
        ("none", &[][..]),
        (
            "appendfsync always",
            &["--appendonly", "yes", "--appendfsync", "always"][..],
        ),
    ] {
        let mut masters: Vec<RedisServer> = (0..5).map(|_| RedisServer::start_with(args)).collect();
        let mut faults = vec![RedlockFault::Restart(3), RedlockFault::Restart(2)];
        if persistence == "none" {
            faults.extend([RedlockFault::ClockStep(3), RedlockFault::ClockStep(2)]);
        }
        for fault in faults {
            let mut row = Row::default();
            for i in 0..trials() {
                redlock_trial(&mut masters, i, fault, &mut row).await;
            }
            let what = match fault {
                RedlockFault::Restart(n) => {
                    format!("{n} of 5 restarted, persistence {persistence}")
                }
                RedlockFault::ClockStep(n) => {
                    format!("{n} of 5 clocks stepped forward past the ttl (emulated)")
                }
            };
            row.report_redlock(&what);
            repeated += row.fences_repeated;
            let expect_safe =
                matches!(fault, RedlockFault::Restart(2) | RedlockFault::ClockStep(2))
                    || persistence != "none";
            if expect_safe {
                // A held the lock in every trial and B never got it: stronger than counting
                // double grants, which a failed acquire of A would make zero.
                assert_eq!(row.a_granted, row.trials, "{what}: A was not granted");
                assert_eq!(row.b_granted, 0, "{what}: a second holder got in");
            }
        }
    }
    assert_eq!(repeated, 0, "a fence repeated");
}
