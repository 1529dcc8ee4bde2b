//! ZooKeeper ensembles of real servers (Debian's `zookeeper` package, run with the system's
//! Java), one member or several, on free loopback ports in a temp dir; stopped by their PIDs
//! when dropped, their logs printed if the test is panicking.
//!
//! The servers take TTL nodes (`zookeeper.extendedTypesEnabled`) and remove expired ones
//! every 100 ms (`znode.container.checkIntervalMs`), as the lock store's docs ask of an
//! operator's ensemble.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The ZooKeeper jar the tests run: ZOOKEEPER_JAR, or Debian's. Panics with an install hint
/// when it or `java` is missing.
pub fn zookeeper_jar() -> PathBuf {
    let jar = std::env::var_os("ZOOKEEPER_JAR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/share/java/zookeeper.jar"));
    let java = Command::new("java").arg("-version").output();
    if !jar.is_file() || !java.is_ok_and(|out| out.status.success()) {
        panic!(
            "The ZooKeeper tests run real ZooKeeper servers: install them with `sudo apt-get \
             install -y zookeeper` (Debian/Ubuntu; it brings Java), or point ZOOKEEPER_JAR at \
             a zookeeper.jar whose manifest names its libraries (looked for `{}`)",
            jar.display()
        );
    }
    jar
}

/// One member of a [`ZooKeeperEnsemble`].
#[derive(Debug)]
pub struct ZooKeeperMember {
    id: usize,
    client_port: u16,
    quorum_port: u16,
    election_port: u16,
    child: Option<Child>,
}

impl ZooKeeperMember {
    /// `127.0.0.1:<client port>`.
    pub fn address(&self) -> String {
        format!("127.0.0.1:{}", self.client_port)
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

/// A ZooKeeper ensemble started for a test.
#[derive(Debug)]
pub struct ZooKeeperEnsemble {
    /// The members, in the order they were started.
    pub members: Vec<ZooKeeperMember>,
    dir: tempfile::TempDir,
    /// The servers take TTL nodes (as the lock store needs).
    ttl_nodes: bool,
    /// With [`start_with_clock`](Self::start_with_clock): the libfaketime timestamp file the
    /// servers' wall clock reads its offset from.
    clock: Option<PathBuf>,
}

/// libfaketime's preload library (Debian: `faketime`).
fn libfaketime() -> PathBuf {
    let found = std::fs::read_dir("/usr/lib")
        .into_iter()
        .flatten()
        .flatten()
        .map(|arch| arch.path().join("faketime/libfaketime.so.1"))
        .find(|lib| lib.is_file());
    found.unwrap_or_else(|| panic!("libfaketime is missing (Debian: apt-get install -y faketime)"))
}

impl ZooKeeperEnsemble {
    /// Starts an ensemble of `size` members (1: a standalone server) and waits until every
    /// member serves (a leader, its followers). A port taken by someone else between choosing
    /// it and binding it means a new try on other ports, up to five.
    pub fn start(size: usize) -> Self {
        Self::start_with(size, true, false)
    }

    /// Like [`start`](Self::start), with the servers' wall clock (node times, and so every
    /// expiry the lock store reads) under the test's control: see
    /// [`set_clock_offset`](Self::set_clock_offset). Their monotonic clock (session timeouts)
    /// is left alone.
    pub fn start_with_clock(size: usize) -> Self {
        Self::start_with(size, true, true)
    }

    /// Moves the servers' wall clock to `offset` from the real one (libfaketime's syntax:
    /// `+0`, `+2d`, `-30m`), read by them from the next reading of the clock on.
    pub fn set_clock_offset(&self, offset: &str) {
        let file = self
            .clock
            .as_ref()
            .expect("an ensemble started with start_with_clock");
        std::fs::write(file, format!("{offset}\n")).expect("writing the clock offset");
    }

    /// A one-member server that refuses TTL nodes (ZooKeeper's default), which the lock
    /// store cannot work with.
    pub fn start_without_ttl_nodes() -> Self {
        Self::start_with(1, false, false)
    }

    fn start_with(size: usize, ttl_nodes: bool, clock: bool) -> Self {
        let mut last_log = String::new();
        for _ in 0..5 {
            match Self::try_start(size, ttl_nodes, clock) {
                Ok(ensemble) => return ensemble,
                Err(log) => last_log = log,
            }
        }
        panic!("ZooKeeper did not start in 5 tries; last log:\n{last_log}");
    }

    fn try_start(size: usize, ttl_nodes: bool, clock: bool) -> Result<Self, String> {
        let jar = zookeeper_jar();
        // On the RAM disk when the machine has one: every write waits for its fsync.
        let shm = Path::new("/dev/shm");
        let parent = if shm.is_dir() {
            shm.to_path_buf()
        } else {
            std::env::temp_dir()
        };
        let dir = tempfile::Builder::new()
            .prefix("zookeeper-")
            .tempdir_in(parent)
            .expect("creating a temp dir for ZooKeeper");
        let ports = crate::etcd::distinct_free_ports(3 * size);
        let members: Vec<ZooKeeperMember> = (0..size)
            .map(|i| ZooKeeperMember {
                id: i + 1,
                client_port: ports[3 * i],
                quorum_port: ports[3 * i + 1],
                election_port: ports[3 * i + 2],
                child: None,
            })
            .collect();
        let clock = clock.then(|| {
            let file = dir.path().join("clock-offset");
            std::fs::write(&file, "+0\n").expect("writing the clock offset");
            file
        });
        let mut ensemble = ZooKeeperEnsemble {
            members,
            dir,
            ttl_nodes,
            clock,
        };
        for i in 0..size {
            ensemble.configure(i);
            ensemble.spawn(&jar, i);
        }
        match ensemble.serving_within(Duration::from_secs(60)) {
            Ok(()) => Ok(ensemble),
            Err(why) => {
                let logs: String = (0..ensemble.members.len())
                    .map(|i| ensemble.log(i))
                    .collect();
                if logs.contains("Address already in use") {
                    Err(logs)
                } else {
                    panic!("ZooKeeper did not start: {why}; logs:\n{logs}")
                }
            }
        }
    }

    /// The connect string of every member, `host:port,host:port`.
    pub fn connect_string(&self) -> String {
        self.members
            .iter()
            .map(ZooKeeperMember::address)
            .collect::<Vec<_>>()
            .join(",")
    }

    fn member_dir(&self, i: usize) -> PathBuf {
        self.dir.path().join(format!("m{}", self.members[i].id))
    }

    fn log_path(&self, i: usize) -> PathBuf {
        self.member_dir(i).join("server.log")
    }

    fn configure(&self, i: usize) {
        let dir = self.member_dir(i);
        std::fs::create_dir_all(dir.join("data")).expect("creating a ZooKeeper data dir");
        let member = &self.members[i];
        // Ticks of 200 ms: sessions between 0.4 and 4 s, elections in about a second.
        let mut config = format!(
            "tickTime=200\ninitLimit=25\nsyncLimit=10\ndataDir={}\nclientPort={}\n\
             clientPortAddress=127.0.0.1\nadmin.enableServer=false\n4lw.commands.whitelist=srvr,ruok\n\
             maxSessionTimeout=60000\n",
            dir.join("data").display(),
            member.client_port,
        );
        if self.members.len() > 1 {
            for m in &self.members {
                config.push_str(&format!(
                    "server.{}=127.0.0.1:{}:{}\n",
                    m.id, m.quorum_port, m.election_port
                ));
            }
            std::fs::write(dir.join("data").join("myid"), format!("{}\n", member.id))
                .expect("writing myid");
        }
        std::fs::write(dir.join("zoo.cfg"), config).expect("writing zoo.cfg");
    }

    fn spawn(&mut self, jar: &Path, i: usize) {
        let dir = self.member_dir(i);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path(i))
            .expect("opening a ZooKeeper log");
        let mut classpath = jar.as_os_str().to_owned();
        // A logger for slf4j, so the log says why a server stopped.
        let simple = Path::new("/usr/share/java/slf4j-simple.jar");
        if simple.is_file() {
            classpath.push(":");
            classpath.push(simple);
        }
        let mut java = Command::new("java");
        if let Some(clock) = &self.clock {
            java.env("LD_PRELOAD", libfaketime())
                .env("FAKETIME_TIMESTAMP_FILE", clock)
                .env("FAKETIME_NO_CACHE", "1")
                .env("FAKETIME_DONT_FAKE_MONOTONIC", "1");
        }
        let child = java
            .args(["-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1"])
            .arg(format!(
                "-Dzookeeper.extendedTypesEnabled={}",
                self.ttl_nodes
            ))
            .arg("-Dznode.container.checkIntervalMs=100")
            .arg("-Dzookeeper.admin.enableServer=false")
            .arg("-cp")
            .arg(classpath)
            .arg("org.apache.zookeeper.server.quorum.QuorumPeerMain")
            .arg(dir.join("zoo.cfg"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawning java for ZooKeeper");
        self.members[i].child = Some(child);
    }

    /// Waits until every running member serves clients.
    pub fn wait_serving(&mut self, limit: Duration) {
        if let Err(log) = self.serving_within(limit) {
            panic!("ZooKeeper did not serve within {limit:?}; log:\n{log}");
        }
    }

    fn serving_within(&mut self, limit: Duration) -> Result<(), String> {
        let deadline = Instant::now() + limit;
        for i in 0..self.members.len() {
            let port = self.members[i].client_port;
            while let Some(child) = self.members[i].child.as_mut() {
                if mode(port).is_some() {
                    break;
                }
                let exited = matches!(child.try_wait(), Ok(Some(_)));
                if exited || Instant::now() >= deadline {
                    return Err(format!("member {}:\n{}", self.members[i].id, self.log(i)));
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        Ok(())
    }

    /// Member `i`'s log.
    pub fn log(&self, i: usize) -> String {
        std::fs::read_to_string(self.log_path(i)).unwrap_or_default()
    }

    /// The index of the member that leads now (the standalone server of a one-member
    /// ensemble).
    pub fn leader(&self) -> Option<usize> {
        self.members.iter().position(|m| {
            m.child.is_some()
                && matches!(
                    mode(m.client_port).as_deref(),
                    Some("leader" | "standalone")
                )
        })
    }

    /// Stops member `i` (SIGKILL) and waits for it.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut child) = self.members[i].child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts member `i` again on its data directory and waits until it serves.
    pub fn restart(&mut self, i: usize) {
        self.kill(i);
        self.spawn(&zookeeper_jar(), i);
        self.wait_serving(Duration::from_secs(60));
    }
}

/// What `srvr` says of a member's role (`leader`, `follower`, `standalone`), once it serves.
fn mode(port: u16) -> Option<String> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    stream.write_all(b"srvr").ok()?;
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    answer
        .lines()
        .find_map(|line| line.strip_prefix("Mode: "))
        .map(|mode| mode.trim().to_owned())
}

impl Drop for ZooKeeperEnsemble {
    fn drop(&mut self) {
        if std::thread::panicking() {
            for i in 0..self.members.len() {
                eprintln!(
                    "--- ZooKeeper {} log ---\n{}",
                    self.members[i].id,
                    self.log(i)
                );
            }
        }
        for i in 0..self.members.len() {
            self.kill(i);
        }
    }
}

/// The node of `record` (`<ns>:{<key>}`) where the store keeps it, as the store names it.
pub fn record_node(record: &str) -> String {
    let mut name = String::new();
    for byte in record.bytes() {
        if byte.is_ascii_alphanumeric() || b"-_:{}".contains(&byte) {
            name.push(char::from(byte));
        } else {
            name.push_str(&format!("%{byte:02X}"));
        }
    }
    format!("/distributed-locks/records/{name}")
}
