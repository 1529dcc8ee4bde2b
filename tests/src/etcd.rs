//! etcd clusters of real `etcd` processes (Debian's `etcd-server`), one member or several, on
//! free loopback ports in a temp dir; stopped by their PIDs when dropped, their logs printed
//! if the test is panicking.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::server::binary_from_env;

/// The `etcd` the tests run: ETCD_BIN, or `etcd` from the PATH. Panics with an install hint
/// when it is missing.
pub fn etcd_binary() -> PathBuf {
    binary_from_env(
        "ETCD_BIN",
        "etcd",
        "The etcd tests run against real etcd servers: install them with `sudo apt-get install \
         -y etcd-server` (Debian/Ubuntu)",
    )
}

/// One member of an [`EtcdCluster`].
#[derive(Debug)]
pub struct EtcdMember {
    name: String,
    client_port: u16,
    peer_port: u16,
    /// Plain HTTP, for `/health` (also when clients must use TLS).
    metrics_port: u16,
    /// Clients must use TLS.
    tls: bool,
    child: Option<Child>,
}

impl EtcdMember {
    /// `http://127.0.0.1:<client port>` (`https://` for a TLS cluster).
    pub fn url(&self) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        format!("{scheme}://127.0.0.1:{}", self.client_port)
    }

    /// The client port.
    pub fn port(&self) -> u16 {
        self.client_port
    }

    /// The process id while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }
}

/// An etcd cluster started for a test.
#[derive(Debug)]
pub struct EtcdCluster {
    /// The members, in the order they were started.
    pub members: Vec<EtcdMember>,
    dir: tempfile::TempDir,
    initial: String,
    /// For a TLS cluster: the directory holding `server.crt` and `server.key`.
    certs: Option<PathBuf>,
}

impl EtcdCluster {
    /// Starts a cluster of `size` members and waits until it has a leader. A port taken by
    /// someone else between choosing it and binding it (members bind late) means a new try on
    /// other ports, up to five.
    pub fn start(size: usize) -> Self {
        Self::start_with(size, None)
    }

    /// Like [`start`](Self::start), the members accepting clients over TLS only, with the
    /// certificate `server.crt` and key `server.key` found in `certs`.
    pub fn start_tls(size: usize, certs: &Path) -> Self {
        Self::start_with(size, Some(certs.to_owned()))
    }

    fn start_with(size: usize, certs: Option<PathBuf>) -> Self {
        let mut last_log = String::new();
        for _ in 0..5 {
            match Self::try_start(size, certs.clone()) {
                Ok(cluster) => return cluster,
                Err(log) => last_log = log,
            }
        }
        panic!("etcd did not start in 5 tries; last log:\n{last_log}");
    }

    fn try_start(size: usize, certs: Option<PathBuf>) -> Result<Self, String> {
        let binary = etcd_binary();
        // On the RAM disk when the machine has one: every etcd write waits for its fsync, and
        // under the test run's parallel load a disk's fsync took over a second, long enough
        // for a three-member cluster to miss heartbeats and a 3 s lease to end at its grant.
        let shm = std::path::Path::new("/dev/shm");
        let parent = if shm.is_dir() {
            shm.to_path_buf()
        } else {
            std::env::temp_dir()
        };
        let dir = tempfile::Builder::new()
            .prefix("etcd-")
            .tempdir_in(parent)
            .expect("creating a temp dir for etcd");
        let ports = distinct_free_ports(3 * size);
        let members: Vec<EtcdMember> = (0..size)
            .map(|i| EtcdMember {
                name: format!("m{i}"),
                client_port: ports[3 * i],
                peer_port: ports[3 * i + 1],
                metrics_port: ports[3 * i + 2],
                tls: certs.is_some(),
                child: None,
            })
            .collect();
        let initial = members
            .iter()
            .map(|m| format!("{}=http://127.0.0.1:{}", m.name, m.peer_port))
            .collect::<Vec<_>>()
            .join(",");
        let mut cluster = EtcdCluster {
            members,
            dir,
            initial,
            certs,
        };
        for i in 0..size {
            cluster.spawn(&binary, i);
        }
        let started = cluster.healthy_within(Duration::from_secs(30));
        // Every member still running and taking clients (a member that lost a port race can
        // exit after the others formed a majority).
        let started = started.and_then(|()| {
            for i in 0..cluster.members.len() {
                let port = cluster.members[i].client_port;
                let alive = cluster.members[i]
                    .child
                    .as_mut()
                    .is_some_and(|c| matches!(c.try_wait(), Ok(None)));
                if !alive || TcpStream::connect(("127.0.0.1", port)).is_err() {
                    return Err(format!("member {} is not running", cluster.members[i].name));
                }
            }
            Ok(())
        });
        match started {
            Ok(()) => Ok(cluster),
            Err(why) => {
                // A port taken by someone else between choosing and binding, on any member,
                // is worth another try on other ports (dropping the cluster stops the members
                // that did start); anything else is a failure.
                let logs: String = (0..cluster.members.len()).map(|i| cluster.log(i)).collect();
                if logs.contains("address already in use") || logs.contains("duplicate url") {
                    Err(logs)
                } else {
                    panic!("etcd did not start: {why}; logs:\n{logs}")
                }
            }
        }
    }

    /// The client URLs of every member.
    pub fn endpoints(&self) -> Vec<String> {
        self.members.iter().map(EtcdMember::url).collect()
    }

    fn log_path(&self, i: usize) -> PathBuf {
        self.dir
            .path()
            .join(format!("{}.log", self.members[i].name))
    }

    fn spawn(&mut self, binary: &Path, i: usize) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path(i))
            .expect("opening an etcd log");
        let member = &self.members[i];
        let client = member.url();
        let peer = format!("http://127.0.0.1:{}", member.peer_port);
        let metrics = format!("http://127.0.0.1:{}", member.metrics_port);
        let mut command = Command::new(binary);
        if let Some(certs) = &self.certs {
            command
                .arg("--cert-file")
                .arg(certs.join("server.crt"))
                .arg("--key-file")
                .arg(certs.join("server.key"));
        }
        let child = command
            .args(["--name", &member.name])
            .arg("--data-dir")
            .arg(self.dir.path().join(&member.name))
            .args(["--listen-client-urls", &client])
            .args(["--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer])
            .args(["--listen-metrics-urls", &metrics])
            .args(["--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &self.initial])
            .args(["--initial-cluster-state", "new"])
            .args(["--initial-cluster-token", "lock-tests"])
            // Elections in a few hundred ms (the minimum lease ttl is 1.5 election timeouts,
            // rounded up to whole seconds: 1 s here), slow enough for a busy 2-core machine.
            .args(["--heartbeat-interval", "50", "--election-timeout", "500"])
            .args(["--logger", "zap", "--log-level", "warn"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawning etcd");
        self.members[i].child = Some(child);
    }

    /// Waits until every running member reports itself healthy (it has a leader).
    pub fn wait_healthy(&mut self, limit: Duration) {
        if let Err(log) = self.healthy_within(limit) {
            panic!("etcd did not become healthy within {limit:?}; log:\n{log}");
        }
    }

    /// Waits until every running member reports itself healthy; the failing member's log
    /// when one exits or the time runs out.
    fn healthy_within(&mut self, limit: Duration) -> Result<(), String> {
        let deadline = Instant::now() + limit;
        for i in 0..self.members.len() {
            let port = self.members[i].metrics_port;
            while let Some(child) = self.members[i].child.as_mut() {
                if healthy(port) {
                    break;
                }
                let exited = matches!(child.try_wait(), Ok(Some(_)));
                if exited || Instant::now() >= deadline {
                    return Err(format!("member {}:\n{}", self.members[i].name, self.log(i)));
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        Ok(())
    }

    /// Member `i`'s log.
    pub fn log(&self, i: usize) -> String {
        std::fs::read_to_string(self.log_path(i)).unwrap_or_default()
    }

    /// Stops member `i` (SIGKILL) and waits for it.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut child) = self.members[i].child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts member `i` again on its data directory and waits until the cluster is healthy.
    pub fn restart(&mut self, i: usize) {
        self.kill(i);
        self.spawn(&etcd_binary(), i);
        self.wait_healthy(Duration::from_secs(30));
    }

    /// Stops every member (SIGKILL), then starts them all again on their data directories
    /// and waits until the cluster is healthy.
    pub fn restart_all(&mut self) {
        for i in 0..self.members.len() {
            self.kill(i);
        }
        let binary = etcd_binary();
        for i in 0..self.members.len() {
            self.spawn(&binary, i);
        }
        self.wait_healthy(Duration::from_secs(30));
    }

    /// The index of the member that leads now (asked of each running member in turn).
    pub async fn leader(&self) -> usize {
        for member in self.members.iter().filter(|m| m.child.is_some()) {
            let Ok(mut client) = etcd_client::Client::connect([member.url()], None).await else {
                continue;
            };
            let Ok(status) = client.status().await else {
                continue;
            };
            let me = status.header().map(|h| h.member_id());
            if me == Some(status.leader()) {
                return self
                    .members
                    .iter()
                    .position(|m| m.client_port == member.client_port)
                    .expect("a member of the cluster");
            }
        }
        panic!("no running member says it leads");
    }
}

/// `count` free loopback ports, all different: each is held until all are found (one port
/// chosen, freed and chosen again would give a cluster two members on one URL).
pub(crate) fn distinct_free_ports(count: usize) -> Vec<u16> {
    let listeners: Vec<std::net::TcpListener> = (0..count)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").expect("binding a loopback port"))
        .collect();
    listeners
        .iter()
        .map(|l| {
            l.local_addr()
                .expect("a bound listener has an address")
                .port()
        })
        .collect()
}

/// GET /health on a member's metrics port answers `"health":"true"` once it has a leader.
fn healthy(port: u16) -> bool {
    let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    let request = "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
    if stream.write_all(request.as_bytes()).is_err() {
        return false;
    }
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    answer.contains("\"health\":\"true\"")
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        if std::thread::panicking() {
            for i in 0..self.members.len() {
                eprintln!("--- etcd {} log ---\n{}", self.members[i].name, self.log(i));
            }
        }
        for i in 0..self.members.len() {
            self.kill(i);
        }
    }
}
