//! The worker side of the soaks: real worker processes (`soak_worker`) that lock random keys
//! in some store and increment fenced counters in a resource redis-server, and the checks run
//! over what they logged and what the resource holds. The soaks bring the lock store and its
//! faults (`tests/soak.rs` for Redis, `tests/postgres_store.rs` for PostgreSQL).

use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::exclusion::{self, Failover, Holding};
use crate::fenced::counter_state;
use crate::rng::XorShift;
use crate::{FaultProxy, RedisServer};

/// Tasks in each worker process.
pub const TASKS_PER_WORKER: u64 = 4;
/// Keys the workers compete for.
pub const KEYS: u64 = 24;

/// The workers of one soak and what they share.
#[derive(Debug)]
pub struct Fleet {
    /// Where the workers lock (`redis://..` or `postgres://..`).
    pub lock_url: String,
    /// The fenced counters.
    pub resource: RedisServer,
    logs: tempfile::TempDir,
    /// Every worker ever spawned: (pid, event log).
    spawned: Vec<(u32, PathBuf)>,
    /// The fault schedule's seed, for the messages.
    pub seed: u64,
    worker_bin: PathBuf,
}

impl Fleet {
    /// A fleet whose workers (the `soak_worker` binary at `worker_bin`) lock at `lock_url`;
    /// starts the resource server.
    pub fn new(worker_bin: impl Into<PathBuf>, lock_url: String, seed: u64) -> Self {
        Fleet {
            lock_url,
            resource: RedisServer::start(),
            logs: tempfile::tempdir().expect("a temp dir for the event logs"),
            spawned: Vec::new(),
            seed,
            worker_bin: worker_bin.into(),
        }
    }

    /// Injects fault `which` (0-4) of the kinds every soak shares: a proxy stall, dropped
    /// connections or latency at `proxy`, a worker paused (SIGSTOP) or killed (SIGKILL, then
    /// respawned until `deadline`). Returns its name for the fault counts.
    pub fn common_fault(
        &mut self,
        which: u64,
        proxy: &FaultProxy,
        workers: &mut [Child],
        rng: &mut XorShift,
        deadline: Instant,
    ) -> &'static str {
        match which {
            0 => {
                proxy.stall();
                std::thread::sleep(Duration::from_millis(100 + rng.below(800)));
                proxy.resume();
                "proxy stall"
            }
            1 => {
                proxy.drop_connections();
                "connections dropped"
            }
            2 => {
                proxy.set_latency(Duration::from_millis(5 + rng.below(40)));
                std::thread::sleep(Duration::from_millis(500));
                proxy.set_latency(Duration::ZERO);
                "latency"
            }
            3 => {
                let pid = workers[rng.below(workers.len() as u64) as usize].id();
                signal(pid, "-STOP");
                std::thread::sleep(Duration::from_millis(200 + rng.below(800)));
                signal(pid, "-CONT");
                "worker SIGSTOP"
            }
            _ => {
                let i = rng.below(workers.len() as u64) as usize;
                let _ = workers[i].kill();
                let _ = workers[i].wait();
                let left = deadline
                    .saturating_duration_since(Instant::now())
                    .as_secs_f64();
                workers[i] = self.spawn_worker(left.max(0.5), rng.next_u64(), false);
                "worker SIGKILL + respawn"
            }
        }
    }

    /// Starts a worker process for `seconds` with its own seed; `careless` workers ignore
    /// their expiry (the checker's own test).
    pub fn spawn_worker(&mut self, seconds: f64, seed: u64, careless: bool) -> Child {
        let log = self
            .logs
            .path()
            .join(format!("worker-{}.log", self.spawned.len()));
        let child = Command::new(&self.worker_bin)
            .args([
                self.lock_url.clone(),
                self.resource.url(),
                KEYS.to_string(),
                format!("{seconds:.2}"),
                seed.to_string(),
                TASKS_PER_WORKER.to_string(),
                log.display().to_string(),
            ])
            .args(careless.then_some("careless"))
            .stdout(Stdio::null())
            .spawn()
            .expect("spawning a soak worker");
        self.spawned.push((child.id(), log));
        child
    }
}

impl Fleet {
    /// Worker processes whose log says their runtime shut down mid-run.
    fn shut_down(&self) -> usize {
        self.spawned
            .iter()
            .filter(|(_, log)| {
                std::fs::read_to_string(log)
                    .is_ok_and(|text| text.lines().any(|l| l.starts_with("S ")))
            })
            .count()
    }
}

/// What a run left behind, from the workers' logs and the stores.
#[derive(Debug)]
pub struct Figures {
    /// The exclusion checker's report over every worker's log.
    pub report: exclusion::Report,
    /// Consecutive leases of a key whose fences did not increase.
    pub fence_order: usize,
    /// Increments the resource accepted.
    pub increments: usize,
    /// Operations the resource refused as stale.
    pub refused: u64,
    /// Accepted writes from leases no worker logged.
    pub unknown_writers: usize,
    /// Counters that differ from their accepted increments (lost updates).
    pub counter_violations: Vec<String>,
}

impl Fleet {
    /// Runs the checker over every worker's log, and reads every counter's state.
    pub fn evaluate(&self, failovers: &[Failover]) -> Figures {
        let mut holdings: Vec<Holding> = Vec::new();
        for (pid, log) in &self.spawned {
            holdings.extend(exclusion::read_log(log, *pid).expect("reading a worker's event log"));
        }
        let tokens: HashSet<&str> = holdings.iter().map(|h| h.token.as_str()).collect();
        let mut figures = Figures {
            report: exclusion::check(&holdings, failovers),
            fence_order: exclusion::fence_order_violations(&holdings),
            increments: 0,
            refused: 0,
            unknown_writers: 0,
            counter_violations: Vec::new(),
        };
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        runtime.block_on(async {
            let mut conn = self.resource.conn().await;
            // `k<n>` keys, and `o<n>` keys taken with `once`.
            let keys = (0..KEYS).flat_map(|k| [format!("k{k}"), format!("o{k}")]);
            for key in keys {
                let state = counter_state(&mut conn, &key)
                    .await
                    .expect("reading a counter");
                figures.increments += state.accepted.len();
                figures.refused += state.refused;
                figures.unknown_writers += state
                    .accepted
                    .iter()
                    .filter(|(_, token)| !tokens.contains(token.as_str()))
                    .count();
                if state.value != state.accepted.len() as u64 {
                    figures.counter_violations.push(format!(
                        "{key}: counter {} but {} accepted increments",
                        state.value,
                        state.accepted.len()
                    ));
                }
            }
        });
        figures
    }

    /// Prints the figures, writes them to the file the variable `results_env` names if it is
    /// set, and asserts every promise.
    pub fn report(
        &self,
        figures: &Figures,
        run: &str,
        faults: &BTreeMap<&str, usize>,
        results_env: &str,
    ) {
        let Figures {
            report,
            fence_order,
            increments,
            refused,
            unknown_writers,
            counter_violations,
        } = figures;
        // One list of figures, printed and, with SOAK_RESULTS, written to a file.
        let json = format!(
            "{{\n{run},\n  \"cpus\": {},\n  \"acquisitions\": {},\n  \
             \"worker_processes\": {},\n  \"increments_accepted\": {increments},\n  \
             \"refused_as_stale\": {refused},\n  \"refused_unexplained\": {},\n  \
             \"superseded_ops\": {},\n  \"stale_writes_accepted\": {},\n  \
             \"overlaps_excused\": {:?},\n  \"violations\": {},\n  \
             \"fence_order_violations\": {fence_order},\n  \"duplicate_tokens\": {},\n  \
             \"lost_updates\": {},\n  \"min_hold_windows\": {},\n  \
             \"once_completions\": {},\n  \"processes_shut_down\": {},\n  \
             \"faults\": {:?}\n}}\n",
            std::thread::available_parallelism().map_or(0, |n| n.get()),
            report.holdings,
            self.spawned.len(),
            report.refused_unexplained,
            report.superseded_ops,
            report.superseded_accepted,
            report.excused,
            report.violations.len(),
            report.duplicate_tokens,
            counter_violations.len(),
            report.min_hold_windows,
            report.once_completions,
            self.shut_down(),
            faults,
        );
        println!("soak: {json}");
        if let Ok(path) = std::env::var(results_env) {
            std::fs::write(&path, &json).expect("writing the results file");
            println!("soak: figures written to {path}");
        }
        for v in report.violations.iter().take(10) {
            eprintln!("violation: {v}");
        }
        for v in counter_violations {
            eprintln!("{v}");
        }
        let seed = self.seed;
        // Against a soak that checked nothing: a broken one takes next to no lock. (A 10 s etcd
        // soak whose schedule restarted every member and killed the leader three times took
        // 150 on two loaded cores.)
        assert!(
            report.holdings > 100,
            "the soak did real work: {} acquisitions",
            report.holdings
        );
        assert!(report.violations.is_empty(), "seed {seed}: violations");
        assert_eq!(*fence_order, 0, "seed {seed}: fence order");
        assert_eq!(
            report.duplicate_tokens, 0,
            "seed {seed}: a token handed out twice"
        );
        assert_eq!(
            *unknown_writers, 0,
            "seed {seed}: writes accepted from leases no worker logged (the logs are incomplete)"
        );
        assert!(counter_violations.is_empty(), "seed {seed}: lost updates");
    }
}

/// The commit the run was built from, for the results file (`-dirty` with local changes).
pub fn git_commit() -> String {
    Command::new("git")
        .args(["describe", "--always", "--dirty"])
        .output()
        .ok()
        .filter(|out| out.status.success())
        .map(|out| String::from_utf8_lossy(&out.stdout).trim().to_owned())
        .unwrap_or_else(|| "unknown".to_owned())
}

/// Sends `sig` (`-STOP`, `-CONT`, ..) to the process `pid`, one the soak started.
pub fn signal(pid: u32, sig: &str) {
    let _ = Command::new("kill").args([sig, &pid.to_string()]).status();
}

/// A setting from the environment, or `default` when unset or unreadable.
pub fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

/// The workers of a store soak.
const STORE_SOAK_WORKERS: usize = 3;

/// One mixed soak of a store that replicates before it answers (PostgreSQL, etcd), so no
/// failover is excused: its length and seed from `<PREFIX>_SOAK_SECS` (10 s by default) and
/// `<PREFIX>_SOAK_SEED` (the clock by default; printed, so a run can be replayed), its figures
/// to `<PREFIX>_SOAK_RESULTS` when set.
#[derive(Debug)]
pub struct StoreSoak {
    prefix: &'static str,
    /// How long the workers run.
    seconds: f64,
    /// The fault schedule's seed.
    seed: u64,
    commit: String,
}

impl StoreSoak {
    /// Reads the settings of the soak named `name` and prints them.
    pub fn from_env(prefix: &'static str, name: &str) -> Self {
        let seconds: f64 = env_or(&format!("{prefix}_SOAK_SECS"), 10.0);
        let seed: u64 = env_or(
            &format!("{prefix}_SOAK_SEED"),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(1),
        );
        println!("{name} soak: {seconds} s, seed {seed} (replay with {prefix}_SOAK_SEED={seed})");
        StoreSoak {
            prefix,
            seconds,
            seed,
            commit: git_commit(),
        }
    }

    /// Runs the workers (`worker_bin`, the `soak_worker` binary) against `lock_url` (its store
    /// argument) while faults
    /// come every 0.3-1 s: of `store_kinds + 5` kinds, the five common ones (`proxy`, the
    /// workers), and `store_fault(i, rng)` for kind `5 + i`. Then checks exclusion, fences and
    /// counters and reports, as `store` in the results.
    pub fn run(
        self,
        worker_bin: &str,
        store: &str,
        lock_url: String,
        proxy: &FaultProxy,
        store_kinds: u64,
        mut store_fault: impl FnMut(u64, &mut XorShift) -> &'static str,
    ) {
        let StoreSoak {
            prefix,
            seconds,
            seed,
            commit,
        } = self;
        let mut rng = XorShift::new(seed);
        let mut fleet = Fleet::new(worker_bin, lock_url, seed);
        let deadline = Instant::now() + Duration::from_secs_f64(seconds);
        let mut workers: Vec<Child> = (0..STORE_SOAK_WORKERS)
            .map(|i| fleet.spawn_worker(seconds, seed.wrapping_add(i as u64 + 1), false))
            .collect();
        let mut faults: BTreeMap<&str, usize> = BTreeMap::new();
        while Instant::now() + Duration::from_millis(1500) < deadline {
            std::thread::sleep(Duration::from_millis(300 + rng.below(700)));
            let kind = match rng.below(5 + store_kinds) {
                n @ 0..=4 => fleet.common_fault(n, proxy, &mut workers, &mut rng, deadline),
                n => store_fault(n - 5, &mut rng),
            };
            *faults.entry(kind).or_default() += 1;
        }
        for mut w in workers {
            let status = w.wait().expect("reaping a worker");
            assert!(status.success(), "a worker failed: {status}");
        }
        let figures = fleet.evaluate(&[]);
        let run = format!(
            "  \"store\": \"{store}\",\n  \"commit\": \"{commit}\",\n  \"seed\": {seed},\n  \
             \"seconds\": {seconds}"
        );
        fleet.report(&figures, &run, &faults, &format!("{prefix}_SOAK_RESULTS"));
    }
}
