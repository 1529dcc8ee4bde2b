//! Real PostgreSQL servers on free loopback ports, one per test, stopped when dropped.
//!
//! `initdb` runs once into a template directory (kept for later runs); each server starts on
//! a copy of it, so a server costs a copy and a start (under a second), not an `initdb`. The
//! binaries come from Debian's `postgresql` package (`/usr/lib/postgresql/<version>/bin`) or
//! `PG_BIN_DIR`. PostgreSQL refuses to run as root: run as root, the tests start it as the
//! `postgres` user the package creates.

use crate::Built;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use std::os::unix::process::CommandExt;

/// The superuser the tests connect as, and its password (password authentication over TCP,
/// so a wrong password is really refused).
pub const PG_USER: &str = "locktest";
/// The password of [`PG_USER`].
pub const PG_PASSWORD: &str = "pg-test-secret-3141";

/// The directory of `initdb` and `postgres`. Panics with an install hint when missing: a
/// missing server is a failure, never a skipped test.
pub fn pg_bin_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("PG_BIN_DIR") {
        return PathBuf::from(dir);
    }
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let version = e.file_name().to_string_lossy().parse::<u32>().ok()?;
            let bin = e.path().join("bin");
            bin.join("postgres").exists().then_some((version, bin))
        })
        .collect();
    found.sort();
    match found.pop() {
        Some((_, bin)) => bin,
        None => panic!(
            "PostgreSQL was not found (looked in /usr/lib/postgresql/*/bin). These tests run \
             against a real server: install it with `sudo apt-get install -y postgresql` \
             (Debian/Ubuntu), or point PG_BIN_DIR at the directory holding initdb and postgres."
        ),
    }
}

/// The user the server processes run as: ourselves, or `postgres` when we are root.
#[derive(Debug, Clone, Copy)]
struct RunAs {
    uid: u32,
    gid: u32,
}

fn run_as() -> Option<RunAs> {
    if rustix::process::geteuid().as_raw() != 0 {
        return None;
    }
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
    let entry = passwd
        .lines()
        .find(|l| l.starts_with("postgres:"))
        .unwrap_or_else(|| {
            panic!(
                "running as root, and there is no `postgres` user to run PostgreSQL as \
                 (PostgreSQL refuses root): install Debian's `postgresql` package, which \
                 creates it, or run the tests as another user"
            )
        });
    let fields: Vec<&str> = entry.split(':').collect();
    let id = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse().ok())
            .expect("a uid and gid in /etc/passwd")
    };
    Some(RunAs {
        uid: id(2),
        gid: id(3),
    })
}

/// Hands `path` (recursively) to the user the server runs as.
fn give(path: &Path, to: Option<RunAs>) {
    if let Some(u) = to {
        let status = Command::new("chown")
            .arg("-R")
            .arg(format!("{}:{}", u.uid, u.gid))
            .arg(path)
            .status()
            .expect("running chown");
        assert!(status.success(), "chown of {} failed", path.display());
    }
}

fn command(program: PathBuf, as_user: Option<RunAs>) -> Command {
    let mut c = Command::new(program);
    if let Some(u) = as_user {
        c.uid(u.uid).gid(u.gid);
    }
    c
}

/// The initialized data directory every server starts from: made by `initdb` once and kept
/// in the temp dir for later runs (`lock-tests-pg-template-v1<bin dir>`, made in a scratch directory
/// and renamed into place, so concurrent test processes never see half of one). The temp dir,
/// not `target/`: the `postgres` user must be able to reach it when the tests run as root
/// from a home directory it may not enter.
fn template() -> &'static Path {
    static TEMPLATE: OnceLock<PathBuf> = OnceLock::new();
    TEMPLATE.get_or_init(|| {
        let tmp = std::env::temp_dir();
        // One template per server build: a data directory is tied to its major version.
        let bin = pg_bin_dir().to_string_lossy().replace(['/', ' '], "_");
        let done = tmp.join(format!("lock-tests-pg-template-v1{bin}"));
        if done.join("data/PG_VERSION").exists() {
            return done;
        }
        let scratch = tempfile::Builder::new()
            .prefix("lock-tests-pg-template-")
            .tempdir_in(&tmp)
            .expect("creating a scratch dir for initdb");
        let user = run_as();
        give(scratch.path(), user);
        let pwfile = scratch.path().join("pw");
        std::fs::write(&pwfile, PG_PASSWORD).expect("writing the password file");
        give(&pwfile, user);
        let out = command(pg_bin_dir().join("initdb"), user)
            .arg("-D")
            .arg(scratch.path().join("data"))
            .args([
                "-U",
                PG_USER,
                "--auth-local=trust",
                "--auth-host=scram-sha-256",
            ])
            .arg(format!("--pwfile={}", pwfile.display()))
            .args(["-E", "UTF8", "--locale=C", "--no-sync"])
            .output()
            .expect("running initdb");
        assert!(
            out.status.success(),
            "initdb failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        // Another process may have won the race; its template is as good as ours.
        let scratch = scratch.keep();
        if std::fs::rename(&scratch, &done).is_err() {
            let _ = std::fs::remove_dir_all(&scratch);
        }
        done
    })
}

/// One PostgreSQL server started for a test, on a free loopback port, in its own temp dir.
/// Stopped (by its PID) when dropped; its log is printed if the test is panicking.
#[derive(Debug)]
pub struct PostgresServer {
    child: Option<Child>,
    port: u16,
    dir: tempfile::TempDir,
    user: Option<RunAs>,
    /// Settings beyond the common ones (`-c name=value` pairs).
    settings: Vec<String>,
}

impl PostgresServer {
    /// Starts a server on a copy of the template.
    pub fn start() -> Self {
        Self::start_with(|_| Vec::new())
    }

    /// Starts a server that accepts only TLS over TCP (password authentication, as
    /// [`start`](Self::start)), with the certificate `server.crt` and key `server.key` found
    /// in `certs`. The test's own [`client`](Self::client) comes in over the Unix socket.
    pub fn start_tls(certs: &Path) -> Self {
        Self::start_with(|data| {
            for file in ["server.crt", "server.key"] {
                std::fs::copy(certs.join(file), data.join(file)).expect("copying the certificate");
            }
            let key = data.join("server.key");
            std::fs::set_permissions(&key, std::os::unix::fs::PermissionsExt::from_mode(0o600))
                .expect("chmod of the key");
            std::fs::write(
                data.join("pg_hba.conf"),
                "local all all trust\n\
                 hostssl all all 127.0.0.1/32 scram-sha-256\n\
                 hostnossl all all 127.0.0.1/32 reject\n",
            )
            .expect("writing pg_hba.conf");
            [
                "ssl=on",
                "ssl_cert_file=server.crt",
                "ssl_key_file=server.key",
            ]
            .map(String::from)
            .to_vec()
        })
    }

    /// Starts a server on a copy of the template, after `prepare` has changed its data
    /// directory; it answers the extra settings.
    fn start_with(prepare: impl FnOnce(&Path) -> Vec<String>) -> Self {
        let template = template();
        let user = run_as();
        let dir = tempfile::Builder::new()
            .prefix("pg-")
            .tempdir()
            .expect("creating a temp dir for postgres");
        let status = Command::new("cp")
            .arg("-a")
            .arg(template.join("data"))
            .arg(dir.path())
            .status()
            .expect("copying the template data directory");
        assert!(
            status.success(),
            "copying the template data directory failed"
        );
        let settings = prepare(&dir.path().join("data"));
        give(dir.path(), user);
        let mut server = PostgresServer {
            child: None,
            port: 0,
            dir,
            user,
            settings,
        };
        for _ in 0..5 {
            server.port = crate::server::free_port();
            if server.spawn() {
                return server;
            }
        }
        panic!("postgres did not start; log:\n{}", server.log());
    }

    fn spawn(&mut self) -> bool {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("postgres.log"))
            .expect("opening the postgres log");
        let child = command(pg_bin_dir().join("postgres"), self.user)
            .arg("-D")
            .arg(self.dir.path().join("data"))
            .args(["-p", &self.port.to_string()])
            .args(["-c", "listen_addresses=127.0.0.1"])
            .arg("-c")
            .arg(format!(
                "unix_socket_directories={}",
                self.dir.path().display()
            ))
            // Durability against a crash of this machine is not under test; a crash of the
            // server process is, and its WAL survives in the page cache.
            .args(["-c", "fsync=off", "-c", "synchronous_commit=on"])
            .args(["-c", "shared_buffers=16MB", "-c", "max_connections=60"])
            .args(self.settings.iter().flat_map(|s| ["-c", s.as_str()]))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawning postgres");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(30);
        let ready_before = self.log().matches("ready to accept connections").count();
        while Instant::now() < deadline {
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(_)) = child.try_wait()
            {
                self.child = None;
                return false;
            }
            if self.log().matches("ready to accept connections").count() > ready_before
                && std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok()
            {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `postgres://locktest:<password>@127.0.0.1:<port>/postgres`.
    pub fn url(&self) -> String {
        format!(
            "postgres://{PG_USER}:{PG_PASSWORD}@127.0.0.1:{}/postgres",
            self.port
        )
    }

    /// The server's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("postgres.log")).unwrap_or_default()
    }

    /// A superuser connection for the test's own statements, over the Unix socket (which
    /// every server of these tests accepts, TLS-only ones too); its driver runs on a task.
    pub async fn client(&self) -> tokio_postgres::Client {
        let (client, connection) = tokio_postgres::Config::new()
            .host_path(self.dir.path())
            .port(self.port)
            .user(PG_USER)
            .dbname("postgres")
            .connect(tokio_postgres::NoTls)
            .await
            .expect("connecting to the test PostgreSQL");
        tokio::spawn(connection);
        client
    }

    /// A runtime on this server for `owner`, with a command timeout of 2 s.
    pub async fn runtime(&self, owner: &str) -> lock_runtime::LockRuntime {
        lock_runtime::LockRuntime::builder()
            .postgres(self.url())
            .owner(owner)
            .command_timeout(Duration::from_secs(2))
            .built()
            .await
    }

    fn signal(&self, signal: &str) {
        if let Some(child) = &self.child {
            let _ = Command::new("kill")
                .args([signal, &child.id().to_string()])
                .status();
        }
    }

    /// Stops the server at once: SIGKILL to the postmaster, whose backends then exit on
    /// their own (they watch it). A crash, as far as the data directory knows.
    pub fn kill(&mut self) {
        self.signal("-KILL");
        if let Some(mut child) = self.child.take() {
            let _ = child.wait();
        }
    }

    /// Kills it and starts it again on the same port and data (crash recovery runs).
    pub fn restart(&mut self) {
        self.kill();
        // Until its orphaned backends have exited, a new postmaster refuses the data
        // directory; try for a while.
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if self.spawn() {
                return;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        panic!("postgres did not restart; log:\n{}", self.log());
    }
}

impl Drop for PostgresServer {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("--- postgres log (port {}) ---\n{}", self.port, self.log());
        }
        // A fast shutdown ends the backends too; SIGKILL if it takes long.
        self.signal("-INT");
        if let Some(mut child) = self.child.take() {
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Takes `key` for `ttl` through `rt`; it must be free.
pub async fn hold(
    rt: &lock_runtime::LockRuntime,
    key: &str,
    ttl: Duration,
) -> lock_runtime::LockGuard {
    rt.lock(key)
        .ttl(ttl)
        .try_acquire()
        .await
        .expect("acquire")
        .expect("the key is free")
}
