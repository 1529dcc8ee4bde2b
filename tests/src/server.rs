//! Real `redis-server` processes on free loopback ports, killed when dropped.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// One `redis-server` started for a test, in its own temp dir, on a free loopback port.
/// Killed (by its PID) when dropped; its log is printed if the test is panicking.
#[derive(Debug)]
pub struct RedisServer {
    child: Option<Child>,
    port: u16,
    dir: tempfile::TempDir,
    extra_args: Vec<String>,
    /// Set for a sentinel: its configuration file's contents.
    sentinel_conf: Option<String>,
}

/// Panics with an install hint when `redis-server` is missing: a missing server is a failure,
/// never a skipped test.
pub fn redis_server_binary() -> PathBuf {
    let path = std::env::var_os("REDIS_SERVER_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("redis-server"));
    match Command::new(&path).arg("--version").output() {
        Ok(out) if out.status.success() => path,
        _ => panic!(
            "redis-server was not found (looked for `{}`). These tests run against real Redis \
             servers: install it with `sudo apt-get install -y redis-server` (Debian/Ubuntu), \
             or point REDIS_SERVER_BIN at the binary.",
            path.display()
        ),
    }
}

pub(crate) fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("binding an ephemeral loopback port");
    listener
        .local_addr()
        .expect("a bound listener has an address")
        .port()
}

impl RedisServer {
    /// Starts a plain server.
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// Starts a server with extra `redis-server` arguments (e.g. `["--requirepass", "pw"]`).
    pub fn start_with(extra: &[&str]) -> Self {
        let dir = tempfile::tempdir().expect("creating a temp dir for redis-server");
        let mut server = RedisServer {
            child: None,
            port: 0,
            dir,
            extra_args: extra.iter().map(|s| s.to_string()).collect(),
            sentinel_conf: None,
        };
        server.start_on_a_free_port();
        server
    }

    /// Starts a sentinel monitoring the master on `master_port` as `master_name` (quorum 2).
    pub fn start_sentinel(master_name: &str, master_port: u16) -> Self {
        let dir = tempfile::tempdir().expect("creating a temp dir for redis-sentinel");
        let mut server = RedisServer {
            child: None,
            port: 0,
            dir,
            extra_args: Vec::new(),
            sentinel_conf: Some(format!(
                "sentinel monitor {master_name} 127.0.0.1 {master_port} 2\n\
                 sentinel down-after-milliseconds {master_name} 1000\n\
                 sentinel failover-timeout {master_name} 5000\n\
                 sentinel parallel-syncs {master_name} 1\n"
            )),
        };
        server.start_on_a_free_port();
        server
    }

    fn start_on_a_free_port(&mut self) {
        let server = self;
        // A port picked free can be taken before the server binds it; try a few. A cluster
        // node's bus port too: each try picks a fresh one, and forgets the node
        // configuration the failed try wrote.
        for attempt in 0..5 {
            server.port = free_port();
            if attempt > 0
                && let Some(i) = server.extra_args.iter().position(|a| a == "--cluster-port")
                && let Some(bus) = server.extra_args.get_mut(i + 1)
            {
                *bus = free_port().to_string();
                let _ = std::fs::remove_file(server.dir.path().join("nodes.conf"));
            }
            if server.spawn() {
                return;
            }
        }
        panic!("redis-server did not start; log:\n{}", server.log());
    }

    fn spawn(&mut self) -> bool {
        let binary = redis_server_binary();
        let log = self.dir.path().join("redis.log");
        let mut command = Command::new(binary);
        if let Some(conf) = &self.sentinel_conf {
            let path = self.dir.path().join("sentinel.conf");
            std::fs::write(&path, conf).expect("writing sentinel.conf");
            command.arg(path).arg("--sentinel");
        }
        command
            .arg("--port")
            .arg(self.port.to_string())
            .args(["--bind", "127.0.0.1"]);
        if self.sentinel_conf.is_none() {
            command.args(["--save", "", "--appendonly", "no"]);
        }
        let child = command
            .arg("--dir")
            .arg(self.dir.path())
            .arg("--logfile")
            .arg(&log)
            .args(&self.extra_args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawning redis-server");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(_)) = child.try_wait()
            {
                self.child = None;
                return false;
            }
            // The port answering is not enough: another test's server may have taken the same
            // "free" port a moment earlier, and ours then fails to bind and exits. Ours says
            // so in its own log once it listens.
            if std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                let log = std::fs::read_to_string(&log).unwrap_or_default();
                if log.contains("Ready to accept connections") || log.contains("Sentinel ID is") {
                    return true;
                }
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        self.kill();
        false
    }

    /// The server's port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The process id, for tests that signal the server.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// A plain redis-rs client for checks and fault injection.
    pub fn client(&self) -> redis::Client {
        redis::Client::open(self.url()).expect("a loopback URL parses")
    }

    /// Sums one field (`calls` or `usec`) of `INFO commandstats` over the commands `pick`
    /// accepts (by name, e.g. `evalsha`), so tests and the benchmark count what the server
    /// itself did.
    pub async fn command_stat(
        &self,
        field: &str,
        pick: impl Fn(&str) -> bool,
    ) -> redis::RedisResult<u64> {
        let mut conn = self.client().get_multiplexed_async_connection().await?;
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(&mut conn)
            .await?;
        let prefix = format!("{field}=");
        Ok(info
            .lines()
            .filter_map(|line| line.strip_prefix("cmdstat_")?.split_once(':'))
            .filter(|(command, _)| pick(command))
            .filter_map(|(_, stats)| {
                stats
                    .split(',')
                    .find_map(|kv| kv.strip_prefix(prefix.as_str()))?
                    .parse::<u64>()
                    .ok()
            })
            .sum())
    }

    /// True when a replica of this server confirms a fresh write of `probe` within `wait`
    /// (`SET`, then `WAIT 1`): proof that the replication stream flows, which `INFO`'s
    /// `master_link_status:up` alone is not. On a Cluster node, `probe` must hash to one of
    /// the node's slots (a `MOVED` write confirms nothing).
    pub fn replica_confirms_write(&self, probe: &str, wait: Duration) -> bool {
        let Ok(mut conn) = self
            .client()
            .get_connection_with_timeout(Duration::from_secs(1))
        else {
            return false;
        };
        let _ = conn.set_read_timeout(Some(wait + Duration::from_secs(2)));
        let wrote: redis::RedisResult<()> = redis::cmd("SET").arg(probe).arg(1).query(&mut conn);
        let acked: redis::RedisResult<i64> = redis::cmd("WAIT")
            .arg(1)
            .arg(wait.as_millis() as u64)
            .query(&mut conn);
        wrote.is_ok() && matches!(acked, Ok(n) if n >= 1)
    }

    /// Kills the server with SIGKILL and waits for it.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same port (empty: nothing is persisted).
    pub fn restart(&mut self) {
        self.kill();
        for _ in 0..50 {
            if self.spawn() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("redis-server did not restart on port {}", self.port);
    }

    /// The server's log file contents.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("redis.log")).unwrap_or_default()
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("--- redis-server :{} log ---\n{}", self.port, self.log());
        }
        self.kill();
    }
}

/// A Redis Cluster of real `redis-server` processes (masters with one replica each) on free
/// loopback ports, formed with `redis-cli --cluster create`.
#[derive(Debug)]
pub struct RedisCluster {
    /// Every node, masters and replicas; the roles change on failover.
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// Starts `masters` masters and one replica for each, and waits until the cluster is ok.
    pub fn start(masters: usize) -> Self {
        let mut nodes = Vec::new();
        for _ in 0..masters * 2 {
            let bus = free_port().to_string();
            nodes.push(RedisServer::start_with(&[
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
                "--cluster-node-timeout",
                "1000",
                "--cluster-port",
                &bus,
            ]));
        }
        let addresses: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port()))
            .collect();
        let output = Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(&addresses)
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .output()
            .expect("running redis-cli --cluster create (Debian: apt-get install -y redis-tools)");
        assert!(
            output.status.success(),
            "redis-cli --cluster create failed:\n{}\n{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        let cluster = RedisCluster { nodes };
        cluster.wait_until_ok(Duration::from_secs(30));
        cluster
    }

    /// Seed URLs of every node.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// Waits until every node reports `cluster_state:ok` and agrees on the slots.
    pub fn wait_until_ok(&self, limit: Duration) {
        let deadline = Instant::now() + limit;
        loop {
            let all_ok = self.nodes.iter().all(|node| {
                node.client()
                    .get_connection()
                    .and_then(|mut c| redis::cmd("CLUSTER").arg("INFO").query::<String>(&mut c))
                    .map(|info| {
                        info.contains("cluster_state:ok") && info.contains("cluster_slots_ok:16384")
                    })
                    .unwrap_or(false)
            });
            if all_ok {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the cluster did not become ok in {limit:?}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The index of the master serving `key`, and of one of its replicas (as node 0 sees it).
    /// Waits (up to 15 s) for the replica to be attached.
    pub fn master_and_replica_of(&self, key: &str) -> (usize, usize) {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            if let (master, Some(replica)) = self.shard_of(0, key) {
                return (master, replica);
            }
            assert!(
                Instant::now() < deadline,
                "the shard of {key} got no replica"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The master serving `key` and a replica if any, as node `asked` sees the cluster.
    pub fn shard_of(&self, asked: usize, key: &str) -> (usize, Option<usize>) {
        let mut conn = self.nodes[asked]
            .client()
            .get_connection()
            .expect("connect");
        let slot: i64 = redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(key)
            .query(&mut conn)
            .expect("CLUSTER KEYSLOT");
        let shards: redis::Value = redis::cmd("CLUSTER")
            .arg("SLOTS")
            .query(&mut conn)
            .expect("CLUSTER SLOTS");
        let port_of = |v: &redis::Value| -> Option<u16> {
            match v {
                redis::Value::Array(parts) => match parts.get(1) {
                    Some(redis::Value::Int(p)) => u16::try_from(*p).ok(),
                    _ => None,
                },
                _ => None,
            }
        };
        let redis::Value::Array(ranges) = shards else {
            panic!("CLUSTER SLOTS answered {shards:?}")
        };
        for range in ranges {
            let redis::Value::Array(parts) = range else {
                continue;
            };
            let (Some(redis::Value::Int(start)), Some(redis::Value::Int(end))) =
                (parts.first(), parts.get(1))
            else {
                continue;
            };
            if (*start..=*end).contains(&slot) {
                let master = parts.get(2).and_then(port_of).expect("a master");
                let replica = parts.get(3).and_then(port_of);
                let index = |port: u16| {
                    self.nodes
                        .iter()
                        .position(|n| n.port() == port)
                        .expect("a node of this cluster")
                };
                return (index(master), replica.map(index));
            }
        }
        panic!("no shard serves slot {slot}");
    }

    /// A redis-rs cluster client, for checks and fault injection.
    pub fn client(&self) -> redis::cluster::ClusterClient {
        redis::cluster::ClusterClient::new(self.urls()).expect("cluster URLs parse")
    }
}

/// A Sentinel setup: one master, one replica, three sentinels, all real processes.
#[derive(Debug)]
pub struct SentinelSet {
    /// The name the sentinels monitor.
    pub master_name: String,
    /// The servers, master first; roles change on failover.
    pub servers: Vec<RedisServer>,
    /// The sentinels.
    pub sentinels: Vec<RedisServer>,
}

impl SentinelSet {
    /// Starts the set and waits until the sentinels see the master and its replica.
    pub fn start() -> Self {
        let master = RedisServer::start();
        let port = master.port().to_string();
        let replica = RedisServer::start_with(&["--replicaof", "127.0.0.1", &port]);
        let master_name = "lockmaster".to_owned();
        let sentinels: Vec<RedisServer> = (0..3)
            .map(|_| RedisServer::start_sentinel(&master_name, master.port()))
            .collect();
        let set = SentinelSet {
            master_name,
            servers: vec![master, replica],
            sentinels,
        };
        set.wait_for(Duration::from_secs(20), |set| {
            set.replica_count_seen() >= 1 && set.replica_in_sync()
        });
        set
    }

    /// Sentinel URLs.
    pub fn sentinel_urls(&self) -> Vec<String> {
        self.sentinels.iter().map(RedisServer::url).collect()
    }

    /// The port the sentinels currently name as master.
    pub fn master_port(&self) -> Option<u16> {
        let mut conn = self.sentinels[0].client().get_connection().ok()?;
        let (_, port): (String, u16) = redis::cmd("SENTINEL")
            .arg("get-master-addr-by-name")
            .arg(&self.master_name)
            .query(&mut conn)
            .ok()?;
        Some(port)
    }

    fn replica_count_seen(&self) -> usize {
        self.sentinels
            .iter()
            .filter_map(|s| {
                let mut conn = s.client().get_connection().ok()?;
                let replicas: Vec<redis::Value> = redis::cmd("SENTINEL")
                    .arg("replicas")
                    .arg(&self.master_name)
                    .query(&mut conn)
                    .ok()?;
                Some(replicas.len())
            })
            .min()
            .unwrap_or(0)
    }

    /// True when a server other than the current master has an up link to it.
    pub fn replica_in_sync(&self) -> bool {
        let master = self.master_port();
        self.servers
            .iter()
            .filter(|s| Some(s.port()) != master)
            .any(|s| {
                let Ok(mut conn) = s.client().get_connection() else {
                    return false;
                };
                let info: String = redis::cmd("INFO")
                    .arg("replication")
                    .query(&mut conn)
                    .unwrap_or_default();
                info.contains("role:slave") && info.contains("master_link_status:up")
            })
    }

    /// Polls `ready` every 100 ms until it holds, or panics after `limit`.
    pub fn wait_for(&self, limit: Duration, ready: impl Fn(&Self) -> bool) {
        let deadline = Instant::now() + limit;
        while !ready(self) {
            assert!(
                Instant::now() < deadline,
                "the sentinel set was not ready in {limit:?}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Asks a sentinel to fail over and waits until they name the other server.
    pub fn failover(&self) {
        let before = self.master_port();
        let mut conn = self.sentinels[0]
            .client()
            .get_connection()
            .expect("connect");
        let _: () = redis::cmd("SENTINEL")
            .arg("FAILOVER")
            .arg(&self.master_name)
            .query(&mut conn)
            .expect("SENTINEL FAILOVER");
        self.wait_for(Duration::from_secs(20), |set| {
            set.master_port().is_some() && set.master_port() != before
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A cluster node whose bus port was taken meanwhile starts on another one (CI once
    /// failed a cluster test when all five tries reused one taken bus port).
    #[test]
    fn a_taken_cluster_bus_port_is_replaced() {
        let taken = TcpListener::bind("127.0.0.1:0").expect("binding a port");
        let port = taken.local_addr().expect("bound").port().to_string();
        let node = RedisServer::start_with(&[
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
            "--cluster-port",
            &port,
        ]);
        assert!(node.pid().is_some(), "the node runs");
        drop(taken);
    }
}
