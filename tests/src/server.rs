//! Real `redis-server` processes on free loopback ports, killed when dropped.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
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
    /// Set for a TLS-only server: the directory of its `server.crt`, `server.key` and the
    /// `ca.crt` that signed them (see `certs::server_cert`).
    tls: Option<PathBuf>,
}

/// Panics with an install hint when `redis-server` is missing: a missing server is a failure,
/// never a skipped test. REDIS_SERVER_BIN points the tests at another build.
pub fn redis_server_binary() -> PathBuf {
    binary_from_env(
        "REDIS_SERVER_BIN",
        "redis-server",
        "These tests run against real Redis servers: install it with `sudo apt-get install -y \
         redis-server` (Debian/Ubuntu)",
    )
}

/// The `redis-cli` the tests use (cluster creation): REDIS_CLI_BIN, or `redis-cli` from the
/// PATH. Panics with an install hint when it is missing.
pub fn redis_cli_binary() -> PathBuf {
    binary_from_env(
        "REDIS_CLI_BIN",
        "redis-cli",
        "Install it with `sudo apt-get install -y redis-tools` (Debian/Ubuntu)",
    )
}

/// `variable`'s path, or `name` from the PATH, once it answers `--version`.
pub(crate) fn binary_from_env(variable: &str, name: &str, hint: &str) -> PathBuf {
    let path = std::env::var_os(variable)
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(name));
    match Command::new(&path).arg("--version").output() {
        Ok(out) if out.status.success() => path,
        _ => panic!(
            "{name} was not found (looked for `{}`). {hint}, or point {variable} at the binary.",
            path.display()
        ),
    }
}

/// The major and minor version of the server binary the tests run, from its `--version`
/// (`Redis server v=7.0.15 ...`, `Valkey server v=8.1.8 ...`).
pub fn server_version() -> (u32, u32) {
    static VERSION: std::sync::OnceLock<(u32, u32)> = std::sync::OnceLock::new();
    *VERSION.get_or_init(|| {
        let out = Command::new(redis_server_binary())
            .arg("--version")
            .output()
            .expect("running redis-server --version");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        parse_server_version(&text)
            .unwrap_or_else(|| panic!("no version in `redis-server --version`: {text}"))
    })
}

fn parse_server_version(text: &str) -> Option<(u32, u32)> {
    let version = text
        .split_whitespace()
        .find_map(|word| word.strip_prefix("v="))?;
    let mut parts = version.split('.').map(|p| p.parse::<u32>().ok());
    Some((parts.next()??, parts.next()??))
}

/// The arguments of a cluster node. From 7.0 the bus port is an option, picked free like the
/// data port; before (6.2) it is always the data port + 10000, so the node's port is picked
/// with a free port 10000 above it (see `free_port_with_bus`).
fn cluster_node_args() -> Vec<String> {
    let mut args: Vec<String> = [
        "--cluster-enabled",
        "yes",
        "--cluster-config-file",
        "nodes.conf",
        "--cluster-node-timeout",
        "1000",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    if server_version() >= (7, 0) {
        args.push("--cluster-port".to_owned());
        args.push(free_port().to_string());
    }
    args
}

/// A free loopback port whose bus port (+10000, Redis before 7.0) is free too.
fn free_port_with_bus() -> u16 {
    for _ in 0..200 {
        let port = free_port();
        if let Some(bus) = port.checked_add(10_000)
            && TcpListener::bind(("127.0.0.1", bus)).is_ok()
        {
            return port;
        }
    }
    panic!("found no free loopback port with a free port 10000 above it in 200 tries");
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
        Self::start_tls_with(None, extra)
    }

    /// With `tls`, a TLS-only server (no plain port) whose replication and cluster bus use
    /// TLS too, with the certificates in that directory; else a plain one.
    pub fn start_tls_with(tls: Option<&Path>, extra: &[&str]) -> Self {
        let dir = tempfile::tempdir().expect("creating a temp dir for redis-server");
        let mut server = RedisServer {
            child: None,
            port: 0,
            dir,
            extra_args: extra.iter().map(|s| s.to_string()).collect(),
            sentinel_conf: None,
            tls: tls.map(Path::to_path_buf),
        };
        server.start_on_a_free_port();
        server
    }

    /// Starts a sentinel monitoring the master on `master_port` as `master_name` (quorum 2).
    pub fn start_sentinel(master_name: &str, master_port: u16) -> Self {
        Self::start_sentinel_tls(None, master_name, master_port)
    }

    /// A sentinel as `start_sentinel`, TLS-only with `tls` (and talking TLS to the servers).
    pub fn start_sentinel_tls(tls: Option<&Path>, master_name: &str, master_port: u16) -> Self {
        let dir = tempfile::tempdir().expect("creating a temp dir for redis-sentinel");
        let mut server = RedisServer {
            child: None,
            port: 0,
            dir,
            extra_args: Vec::new(),
            tls: tls.map(Path::to_path_buf),
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
        // A cluster node of a server before 7.0 listens on its port + 10000 for the bus.
        let bus_beside = server.extra_args.iter().any(|a| a == "--cluster-enabled")
            && !server.extra_args.iter().any(|a| a == "--cluster-port");
        for attempt in 0..5 {
            server.port = if bus_beside {
                free_port_with_bus()
            } else {
                free_port()
            };
            if attempt > 0
                && let Some(i) = server.extra_args.iter().position(|a| a == "--cluster-port")
                && let Some(bus) = server.extra_args.get_mut(i + 1)
            {
                *bus = free_port().to_string();
            }
            if attempt > 0 {
                // The failed try may have written its node configuration, with its ports.
                let _ = std::fs::remove_file(server.dir.path().join("nodes.conf"));
            }
            if server.spawn() {
                return;
            }
        }
        let hint = if server.tls.is_some() {
            " (a TLS-only server: was the binary built with TLS? Debian's redis-server is; the \
             server matrix's 6.2 and Valkey builds are not)"
        } else {
            ""
        };
        panic!("redis-server did not start{hint}; log:\n{}", server.log());
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
        let port = self.port.to_string();
        match &self.tls {
            None => {
                command.args(["--port", &port]);
            }
            Some(certs) => {
                command
                    .args(["--port", "0", "--tls-port", &port])
                    .arg("--tls-cert-file")
                    .arg(certs.join("server.crt"))
                    .arg("--tls-key-file")
                    .arg(certs.join("server.key"))
                    .arg("--tls-ca-cert-file")
                    .arg(certs.join("ca.crt"))
                    .args(["--tls-auth-clients", "no", "--tls-replication", "yes"]);
                if self.extra_args.iter().any(|a| a == "--cluster-enabled") {
                    command.args(["--tls-cluster", "yes"]);
                }
            }
        }
        command.args(["--bind", "127.0.0.1"]);
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

    /// `redis://127.0.0.1:<port>` (`rediss://` for a TLS-only server).
    pub fn url(&self) -> String {
        let scheme = if self.tls.is_some() {
            "rediss"
        } else {
            "redis"
        };
        format!("{scheme}://127.0.0.1:{}", self.port)
    }

    /// The CA certificate (PEM) a TLS-only server's certificate chains to.
    pub fn tls_ca(&self) -> Option<Vec<u8>> {
        let certs = self.tls.as_ref()?;
        Some(std::fs::read(certs.join("ca.crt")).expect("reading ca.crt"))
    }

    /// The process id, for tests that signal the server.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// A plain redis-rs client for checks and fault injection (over TLS, trusting the test
    /// CA, for a TLS-only server).
    pub fn client(&self) -> redis::Client {
        match self.tls_ca() {
            None => redis::Client::open(self.url()).expect("a loopback URL parses"),
            Some(ca) => redis::Client::build_with_tls(
                self.url(),
                redis::TlsCertificates {
                    client_tls: None,
                    root_cert: Some(ca),
                },
            )
            .expect("a loopback URL and the test CA"),
        }
    }

    /// A connection of [`RedisServer::client`]'s, for the tests' own commands.
    pub async fn conn(&self) -> redis::aio::MultiplexedConnection {
        self.client()
            .get_multiplexed_async_connection()
            .await
            .unwrap_or_else(|e| panic!("connecting to the test server {}: {e}", self.url()))
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
        Self::start_tls(None, masters)
    }

    /// As `start`, every node TLS-only (clients, replication and the cluster bus) with `tls`.
    pub fn start_tls(tls: Option<&Path>, masters: usize) -> Self {
        let mut nodes = Vec::new();
        for _ in 0..masters * 2 {
            let args = cluster_node_args();
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            nodes.push(RedisServer::start_tls_with(tls, &args));
        }
        let addresses: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port()))
            .collect();
        let mut create = Command::new(redis_cli_binary());
        if let Some(certs) = tls {
            create
                .arg("--tls")
                .arg("--cacert")
                .arg(certs.join("ca.crt"));
        }
        let output = create
            .arg("--cluster")
            .arg("create")
            .args(&addresses)
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .output()
            .expect("running redis-cli --cluster create");
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

    /// Moves the slot of `key` from its master to the master `to` by hand, as a resharding
    /// does: IMPORTING / MIGRATING, MIGRATE of the slot's keys, then SETSLOT NODE on every
    /// master. Returns the slot.
    pub fn migrate_slot_of(&self, key: &str, to: usize) -> i64 {
        let query = |node: usize, args: &[&str]| -> redis::Value {
            let mut conn = self.nodes[node].client().get_connection().expect("connect");
            let mut cmd = redis::cmd(args[0]);
            for arg in &args[1..] {
                cmd.arg(*arg);
            }
            cmd.query(&mut conn)
                .unwrap_or_else(|e| panic!("{args:?} on node {node}: {e}"))
        };
        let text = |v: redis::Value| match v {
            redis::Value::BulkString(b) => String::from_utf8_lossy(&b).into_owned(),
            redis::Value::SimpleString(s) => s,
            other => panic!("not a text: {other:?}"),
        };
        let (from, _) = self.shard_of(0, key);
        assert_ne!(from, to, "the slot is already there");
        let slot = match query(from, &["CLUSTER", "KEYSLOT", key]) {
            redis::Value::Int(slot) => slot,
            other => panic!("CLUSTER KEYSLOT answered {other:?}"),
        };
        let slot_text = slot.to_string();
        let from_id = text(query(from, &["CLUSTER", "MYID"]));
        let to_id = text(query(to, &["CLUSTER", "MYID"]));
        query(
            to,
            &["CLUSTER", "SETSLOT", &slot_text, "IMPORTING", &from_id],
        );
        query(
            from,
            &["CLUSTER", "SETSLOT", &slot_text, "MIGRATING", &to_id],
        );
        loop {
            let keys = match query(from, &["CLUSTER", "GETKEYSINSLOT", &slot_text, "100"]) {
                redis::Value::Array(keys) => keys.into_iter().map(text).collect::<Vec<_>>(),
                other => panic!("CLUSTER GETKEYSINSLOT answered {other:?}"),
            };
            if keys.is_empty() {
                break;
            }
            let port = self.nodes[to].port().to_string();
            let mut args = vec!["MIGRATE", "127.0.0.1", &port, "", "0", "5000", "KEYS"];
            args.extend(keys.iter().map(String::as_str));
            query(from, &args);
        }
        let masters: Vec<usize> = (0..self.nodes.len())
            .filter(|&n| {
                let info = text(query(n, &["INFO", "replication"]));
                info.contains("role:master")
            })
            .collect();
        // The two ends first, then the other masters.
        for node in [to, from]
            .into_iter()
            .chain(masters.into_iter().filter(|&n| n != to && n != from))
        {
            query(node, &["CLUSTER", "SETSLOT", &slot_text, "NODE", &to_id]);
        }
        slot
    }

    /// A redis-rs cluster client, for checks and fault injection.
    pub fn client(&self) -> redis::cluster::ClusterClient {
        let builder = redis::cluster::ClusterClientBuilder::new(self.urls());
        let builder = match self.nodes.first().and_then(RedisServer::tls_ca) {
            Some(ca) => builder.certs(redis::TlsCertificates {
                client_tls: None,
                root_cert: Some(ca),
            }),
            None => builder,
        };
        builder.build().expect("cluster URLs parse")
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
        Self::start_tls(None)
    }

    /// As `start`, every server and sentinel TLS-only with `tls` (replication and the
    /// sentinels' links to the servers too).
    pub fn start_tls(tls: Option<&Path>) -> Self {
        let master = RedisServer::start_tls_with(tls, &[]);
        let port = master.port().to_string();
        let replica = RedisServer::start_tls_with(tls, &["--replicaof", "127.0.0.1", &port]);
        let master_name = "lockmaster".to_owned();
        let sentinels: Vec<RedisServer> = (0..3)
            .map(|_| RedisServer::start_sentinel_tls(tls, &master_name, master.port()))
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

    /// Turns authentication on everywhere with `password`: the servers require it (and the
    /// replica authenticates to its master with it), the sentinels require it for the default
    /// user and use it to reach the servers. The set's own helpers (`master_port`, ...)
    /// connect without a password, so they no longer work afterwards.
    pub fn protect(&self, password: &str) {
        for server in &self.servers {
            let mut conn = server
                .client()
                .get_connection()
                .expect("connect to a server");
            for (name, value) in [("masterauth", password), ("requirepass", password)] {
                let _: () = redis::cmd("CONFIG")
                    .arg("SET")
                    .arg(name)
                    .arg(value)
                    .query(&mut conn)
                    .expect("CONFIG SET");
            }
        }
        self.configure("auth-pass", password);
        for sentinel in &self.sentinels {
            let mut conn = sentinel
                .client()
                .get_connection()
                .expect("connect to a sentinel");
            let _: () = redis::cmd("ACL")
                .arg("SETUSER")
                .arg("default")
                .arg("resetpass")
                .arg(format!(">{password}"))
                .query(&mut conn)
                .expect("ACL SETUSER on a sentinel");
        }
    }

    /// `SENTINEL SET <master> <option> <value>` on every sentinel.
    pub fn configure(&self, option: &str, value: impl redis::ToRedisArgs + Copy) {
        for sentinel in &self.sentinels {
            let mut conn = sentinel
                .client()
                .get_connection()
                .expect("connect to a sentinel");
            let _: () = redis::cmd("SENTINEL")
                .arg("SET")
                .arg(&self.master_name)
                .arg(option)
                .arg(value)
                .query(&mut conn)
                .unwrap_or_else(|e| panic!("SENTINEL SET {option}: {e}"));
        }
    }

    /// Sentinel URLs.
    pub fn sentinel_urls(&self) -> Vec<String> {
        self.sentinels.iter().map(RedisServer::url).collect()
    }

    /// The port the sentinels currently name as master (the first sentinel asked).
    pub fn master_port(&self) -> Option<u16> {
        self.master_port_named_by(&self.sentinels[0])
    }

    /// The port `sentinel` names as master; `None` if it does not answer within a second (a
    /// stopped sentinel, in the crash trials).
    pub fn master_port_named_by(&self, sentinel: &RedisServer) -> Option<u16> {
        let limit = Duration::from_secs(1);
        let mut conn = sentinel.client().get_connection_with_timeout(limit).ok()?;
        conn.set_read_timeout(Some(limit)).ok()?;
        conn.set_write_timeout(Some(limit)).ok()?;
        let (_, port): (String, u16) = redis::cmd("SENTINEL")
            .arg("get-master-addr-by-name")
            .arg(&self.master_name)
            .query(&mut conn)
            .ok()?;
        Some(port)
    }

    /// The index in `servers` of the server on `port`.
    pub fn index_of(&self, port: u16) -> usize {
        self.servers
            .iter()
            .position(|s| s.port() == port)
            .unwrap_or_else(|| panic!("no server of the set is on port {port}"))
    }

    /// How many replicas every sentinel would promote: the fewest, over the sentinels, of
    /// replicas whose flags are just `slave` and whose link to the master is `ok` by their
    /// `INFO` as the sentinel last read it (a sentinel marks a replica's link down until it
    /// has read that `INFO`; `SENTINEL FAILOVER` refuses such a replica with `NOGOODSLAVE`).
    fn replica_count_seen(&self) -> usize {
        self.sentinels
            .iter()
            .filter_map(|s| {
                let mut conn = s.client().get_connection().ok()?;
                let replicas: Vec<Vec<String>> = redis::cmd("SENTINEL")
                    .arg("replicas")
                    .arg(&self.master_name)
                    .query(&mut conn)
                    .ok()?;
                Some(replicas.iter().filter(|r| promotable(r)).count())
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
        self.wait_for(Duration::from_secs(20), |set| set.replica_count_seen() >= 1);
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

/// True when a `SENTINEL replicas` entry (field, value, field, value, ...) describes a replica
/// a sentinel would promote now while the master is up (its `INFO` read in the last 30 s,
/// the sentinels' own limit then).
fn promotable(entry: &[String]) -> bool {
    let field = |name: &str| {
        entry
            .chunks(2)
            .find(|pair| pair[0] == name)
            .and_then(|pair| pair.get(1))
            .map(String::as_str)
    };
    field("flags") == Some("slave")
        && field("master-link-status") == Some("ok")
        && field("info-refresh")
            .and_then(|ms| ms.parse::<u64>().ok())
            .is_some_and(|ms| ms < 30_000)
}

/// Sends `signal` (e.g. "-STOP", "-CONT") to a running server's process.
pub fn send_signal(server: &RedisServer, signal: &str) {
    let pid = server.pid().expect("a running server");
    let status = Command::new("kill")
        .args([signal, &pid.to_string()])
        .status()
        .expect("kill");
    assert!(status.success(), "kill {signal} {pid}");
}

/// Runs one of the tests' own commands, given with its arguments as a tuple
/// (`("CONFIG", "SET", "maxmemory", "1")`, `("TIME",)`), and panics with the command's words
/// if it fails.
pub async fn query<T: redis::FromRedisValue>(
    conn: &mut impl redis::aio::ConnectionLike,
    words: impl redis::ToRedisArgs,
) -> T {
    let mut cmd = redis::Cmd::new();
    cmd.arg(&words);
    match cmd.query_async(conn).await {
        Ok(reply) => reply,
        Err(e) => {
            let words: Vec<String> = words
                .to_redis_args()
                .iter()
                .map(|w| String::from_utf8_lossy(w).into_owned())
                .collect();
            panic!("`{}` failed: {e}", words.join(" "))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A cluster node whose bus port was taken meanwhile starts on another one (CI once
    /// failed a cluster test when all five tries reused one taken bus port). Before 7.0 the
    /// bus port is not an option: the node's port is picked with its bus port free.
    #[test]
    fn a_taken_cluster_bus_port_is_replaced() {
        let taken = TcpListener::bind("127.0.0.1:0").expect("binding a port");
        let port = taken.local_addr().expect("bound").port().to_string();
        let mut args = vec![
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
        ];
        if server_version() >= (7, 0) {
            args.extend(["--cluster-port", &port]);
        }
        let node = RedisServer::start_with(&args);
        assert!(node.pid().is_some(), "the node runs");
        if server_version() < (7, 0) {
            let bus = node.port() + 10_000;
            assert!(
                std::net::TcpStream::connect(("127.0.0.1", bus)).is_ok(),
                "the node listens on its bus port {bus}"
            );
        }
        drop(taken);
    }

    #[test]
    fn server_versions_parse() {
        assert_eq!(
            parse_server_version("Redis server v=6.2.14 sha=40305114:0 malloc=libc bits=64"),
            Some((6, 2))
        );
        assert_eq!(
            parse_server_version("Valkey server v=8.1.8 sha=00000000:1 malloc=libc"),
            Some((8, 1))
        );
        assert_eq!(parse_server_version("redis-server, no version"), None);
    }
}
