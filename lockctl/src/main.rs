//! `lockctl`: see what is locked and by whom, watch it, and force a lock free, on every store
//! the runtime supports. It goes through the runtime's own API (`LockRuntime::list`,
//! `inspect`, `force_release`), so it reads each store exactly as the runtime writes it.
//!
//!     lockctl --redis redis://127.0.0.1:6379 list [--match 'interest:*'] [--json]
//!     lockctl --cluster redis://10.0.0.1:7000 --cluster redis://10.0.0.2:7000 show interest-posting
//!     lockctl --sentinel mymaster=redis://10.0.0.1:26379,redis://10.0.0.2:26379 watch
//!     lockctl --redlock redis://a:6379,redis://b:6379,redis://c:6379 list
//!     lockctl --postgres postgres://app@db/app release interest-posting --force
//!     lockctl --etcd http://10.0.0.1:2379,http://10.0.0.2:2379 list
//!     lockctl --zookeeper 10.0.0.1:2181,10.0.0.2:2181/jobs list
//!     lockctl --redis redis://127.0.0.1:6379 jobs
//!     lockctl --postgres postgres://app@db/app history interest-posting --since 7d --json
//!     lockctl --redis redis://127.0.0.1:6379 serve --listen 127.0.0.1:7878
//!     REDIS_URL=redis://127.0.0.1:6379 lockctl list

use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand};
use lock_runtime::{EtcdStore, LockRuntime, LockRuntimeBuilder, PostgresStore, ZooKeeperStore};

mod history;
mod ops;
mod page;
mod redact;
mod serve;

/// Inspect, watch and force-release lock-runtime locks in any of its stores.
#[derive(Debug, Parser)]
#[command(name = "lockctl", version)]
struct Cli {
    /// One Redis server (`redis://` or `rediss://`). Without any store option, REDIS_URL.
    #[arg(long, global = true, value_name = "URL")]
    redis: Option<String>,
    /// A Redis Cluster: seed nodes (repeat the option, or separate with commas).
    #[arg(long, global = true, value_name = "URL")]
    cluster: Vec<String>,
    /// A Sentinel-managed master: its name, `=`, then the sentinels, separated with commas.
    #[arg(long, global = true, value_name = "NAME=URL,...")]
    sentinel: Option<String>,
    /// Redlock masters (repeat the option, or separate with commas); shows how many masters
    /// hold each lock and where they disagree.
    #[arg(long, global = true, value_name = "URL")]
    redlock: Vec<String>,
    /// A PostgreSQL database (`postgres://user:password@host/db`).
    #[arg(long, global = true, value_name = "URL")]
    postgres: Option<String>,
    /// etcd endpoints (repeat the option, or separate with commas).
    #[arg(long, global = true, value_name = "URL")]
    etcd: Vec<String>,
    /// With --etcd: the user to authenticate as; the password comes from ETCD_PASSWORD (an
    /// argument would show in the process list).
    #[arg(long, global = true, value_name = "NAME")]
    etcd_user: Option<String>,
    /// A ZooKeeper ensemble's connect string, `host:port,host:port[/chroot]`.
    #[arg(long, global = true, value_name = "HOSTS")]
    zookeeper: Option<String>,
    /// With --zookeeper: digest authentication as this user; the password comes from
    /// ZOOKEEPER_PASSWORD (an argument would show in the process list).
    #[arg(long, global = true, value_name = "NAME")]
    zookeeper_user: Option<String>,
    /// With --postgres: the runtime's table, if not the default.
    #[arg(long, global = true, value_name = "NAME")]
    table: Option<String>,
    /// A PEM root certificate to trust for TLS (rediss://, PostgreSQL) instead of the system's.
    #[arg(long, global = true, value_name = "FILE")]
    tls_ca: Option<std::path::PathBuf>,
    /// The runtime's namespace (key prefix).
    #[arg(long, default_value = "lock", global = true)]
    namespace: String,
    /// Print JSON instead of a table.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Action,
}

#[derive(Debug, Subcommand)]
enum Action {
    /// List held locks: key, owner, fence, age, remaining ttl (Redlock: masters holding it).
    List {
        /// Only keys matching this pattern: `*` any run of characters, `?` one character.
        #[arg(long = "match", default_value = "*")]
        pattern: String,
    },
    /// Show one lock.
    Show {
        /// The lock key, as the application names it (without namespace).
        key: String,
    },
    /// Free a lock from its holder, whatever its token, and wake its waiters. The holder is
    /// told at its next renewal.
    Release {
        /// The lock key.
        key: String,
        /// Required: force-releasing a lock lets a second holder in while the first may
        /// still be working.
        #[arg(long)]
        force: bool,
        /// Only if the holder's fence is this one (as `list` showed it): a holder that came in
        /// since is left alone. Without it, the current holder is read first.
        #[arg(long, conflicts_with = "holder")]
        fence: Option<u64>,
        /// Only if the holding is this one (its `holder` id, as `list --json` or `show
        /// --json` showed it): a later holding, even of the same owner, is left alone.
        #[arg(long)]
        holder: Option<String>,
    },
    /// The list, refreshed every second until Ctrl-C.
    Watch {
        /// Only keys matching this pattern: `*` any run of characters, `?` one character.
        #[arg(long = "match", default_value = "*")]
        pattern: String,
        /// Seconds between refreshes.
        #[arg(long, default_value_t = 1.0)]
        interval: f64,
        /// Stop after this many refreshes (default: until Ctrl-C).
        #[arg(long)]
        count: Option<u64>,
    },
    /// The scheduled jobs with a run journal, each with its last firing: when, which
    /// instance, how it ended.
    Jobs,
    /// A scheduled job's runs, newest first: each firing, the instance that ran it (or
    /// skipped it), the outcome, how long it took, its fence. Exit code 1 when none.
    History {
        /// The job's name (`#[scheduled(name = ..)]`, or the fn's name).
        job: String,
        /// Only firings scheduled since: a duration back from now (90s, 30m, 24h, 7d) or an
        /// RFC 3339 time.
        #[arg(long)]
        since: Option<String>,
        /// At most this many runs (the newest).
        #[arg(long, default_value_t = history::DEFAULT_LIMIT)]
        limit: usize,
    },
    /// The operator's web page: the jobs with their last run, the locks held, and each job's
    /// runs with a timeline of which instance ran each firing. Read-only unless
    /// --allow-force-release. Runs until Ctrl-C.
    Serve {
        /// Where to listen. A non-loopback address needs --public (the page has no login).
        #[arg(long, default_value = "127.0.0.1:7878")]
        listen: std::net::SocketAddr,
        /// Allow listening on an address other machines can reach.
        #[arg(long)]
        public: bool,
        /// Offer a forced release of each held lock, after a confirmation that names its key.
        #[arg(long)]
        allow_force_release: bool,
    },
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match connect(&cli).await {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("lockctl: {e:#}");
            return ExitCode::from(2);
        }
    };
    let result = match cli.command {
        Action::Serve {
            listen,
            public,
            allow_force_release,
        } => {
            let options = serve::Options {
                listen,
                public,
                allow_force_release,
                store: store_label(&cli),
            };
            serve::serve(&runtime, options)
                .await
                .map(|()| ExitCode::SUCCESS)
        }
        command => ops::run(&runtime, command, cli.json).await,
    };
    let code = match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("lockctl: {e:#}");
            ExitCode::from(2)
        }
    };
    // lockctl holds no lock; this only closes the store's connections.
    runtime.shutdown().await;
    code
}

/// The store the options name, as the web page shows it: its kind and addresses, without
/// passwords.
fn store_label(cli: &Cli) -> String {
    let urls = |list: &[String]| {
        split_urls(list)
            .iter()
            .map(|u| redact::url(u))
            .collect::<Vec<_>>()
            .join(", ")
    };
    if !cli.etcd.is_empty() {
        return format!("etcd {}", urls(&cli.etcd));
    }
    if let Some(connect) = &cli.zookeeper {
        return format!("ZooKeeper {connect}");
    }
    if let Some(url) = &cli.redis {
        return format!("Redis {}", redact::url(url));
    }
    if !cli.cluster.is_empty() {
        return format!("Redis Cluster {}", urls(&cli.cluster));
    }
    if let Some(spec) = &cli.sentinel {
        let (name, list) = spec.split_once('=').unwrap_or((spec.as_str(), ""));
        return format!("Redis Sentinel `{name}` {}", urls(&[list.to_owned()]));
    }
    if !cli.redlock.is_empty() {
        return format!("Redlock {}", urls(&cli.redlock));
    }
    if let Some(url) = &cli.postgres {
        return format!("PostgreSQL {}", redact::url(url));
    }
    match std::env::var("REDIS_URL") {
        Ok(url) => format!("Redis {}", redact::url(&url)),
        Err(_) => "the store".to_owned(),
    }
}

/// The runtime over the one store the options name.
async fn connect(cli: &Cli) -> anyhow::Result<LockRuntime> {
    let builder = LockRuntime::builder()
        .namespace(cli.namespace.as_str())
        .owner("lockctl")
        .connect_timeout(Duration::from_secs(5));
    let builder = store(cli, builder)?;
    let builder = match &cli.tls_ca {
        Some(path) => builder.tls_root_cert_pem(
            std::fs::read(path).with_context(|| format!("reading --tls-ca {}", path.display()))?,
        ),
        None => builder,
    };
    Ok(builder.build().await?)
}

/// Applies the one store option given (or REDIS_URL); more than one, or none, is an error.
fn store(cli: &Cli, builder: LockRuntimeBuilder) -> anyhow::Result<LockRuntimeBuilder> {
    let given: Vec<&str> = [
        ("--redis", cli.redis.is_some()),
        ("--cluster", !cli.cluster.is_empty()),
        ("--sentinel", cli.sentinel.is_some()),
        ("--redlock", !cli.redlock.is_empty()),
        ("--postgres", cli.postgres.is_some()),
        ("--etcd", !cli.etcd.is_empty()),
        ("--zookeeper", cli.zookeeper.is_some()),
    ]
    .into_iter()
    .filter_map(|(option, set)| set.then_some(option))
    .collect();
    if given.len() > 1 {
        anyhow::bail!("name one store, not {}", given.join(" and "));
    }
    if cli.table.is_some() && cli.postgres.is_none() {
        anyhow::bail!("--table goes with --postgres");
    }
    if cli.etcd_user.is_some() && cli.etcd.is_empty() {
        anyhow::bail!("--etcd-user goes with --etcd");
    }
    if cli.zookeeper_user.is_some() && cli.zookeeper.is_none() {
        anyhow::bail!("--zookeeper-user goes with --zookeeper");
    }
    if let Some(connect) = &cli.zookeeper {
        let store = ZooKeeperStore::new(connect.as_str());
        return Ok(match &cli.zookeeper_user {
            Some(user) => {
                let password = std::env::var("ZOOKEEPER_PASSWORD")
                    .context("--zookeeper-user needs the password in ZOOKEEPER_PASSWORD")?;
                builder.store(store.digest(user.as_str(), password))
            }
            None => builder.store(store),
        });
    }
    if !cli.etcd.is_empty() {
        let store = EtcdStore::new(split_urls(&cli.etcd));
        return Ok(match &cli.etcd_user {
            Some(user) => {
                let password = std::env::var("ETCD_PASSWORD")
                    .context("--etcd-user needs the password in ETCD_PASSWORD")?;
                builder.store(store.user(user.as_str(), password))
            }
            None => builder.store(store),
        });
    }
    if let Some(url) = &cli.redis {
        return Ok(builder.redis(url.as_str()));
    }
    if !cli.cluster.is_empty() {
        return Ok(builder.redis_cluster(split_urls(&cli.cluster)));
    }
    if let Some(spec) = &cli.sentinel {
        let Some((name, urls)) = spec.split_once('=') else {
            anyhow::bail!(
                "--sentinel takes NAME=URL,URL,...: the master's name, then the sentinels"
            );
        };
        return Ok(builder.redis_sentinel(name, split_urls(&[urls.to_owned()])));
    }
    if !cli.redlock.is_empty() {
        return Ok(builder.redlock(split_urls(&cli.redlock)));
    }
    if let Some(url) = &cli.postgres {
        let store = PostgresStore::new(url.as_str());
        return Ok(match &cli.table {
            Some(table) => builder.store(store.table(table.as_str())),
            None => builder.store(store),
        });
    }
    match std::env::var("REDIS_URL") {
        Ok(url) if !url.is_empty() => Ok(builder.redis(url)),
        _ => anyhow::bail!(
            "name a store: --redis URL, --cluster URL, --sentinel NAME=URL,..., --redlock URL, \
             --postgres URL, --etcd URL or --zookeeper HOSTS (or set REDIS_URL)"
        ),
    }
}

/// The URLs of repeated options, each of which may hold several separated by commas. Split
/// only where a comma starts another URL (`scheme://`: redis, rediss, valkey, unix, ...): a
/// comma may stand unencoded in a password, and a URL cut there would show part of it in an
/// error.
fn split_urls(values: &[String]) -> Vec<String> {
    let mut urls = Vec::new();
    for value in values {
        let mut rest = value.as_str();
        loop {
            let next = rest
                .match_indices(',')
                .map(|(i, _)| i)
                .find(|&i| starts_a_url(&rest[i + 1..]));
            match next {
                Some(i) => {
                    urls.push(rest[..i].to_owned());
                    rest = &rest[i + 1..];
                }
                None => {
                    urls.push(rest.to_owned());
                    break;
                }
            }
        }
    }
    urls.retain(|u| !u.is_empty());
    urls
}

/// Whether `text` begins with `scheme://`, a scheme being a letter and then letters, digits,
/// `+`, `-` or `.`.
fn starts_a_url(text: &str) -> bool {
    let Some((scheme, _)) = text.split_once("://") else {
        return false;
    };
    let mut chars = scheme.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
}

#[cfg(test)]
mod tests {
    use super::split_urls;

    #[test]
    fn urls_split_only_where_another_url_starts() {
        let given = [
            "redis://a:1,rediss://b:2".to_owned(),
            "redis://:pa,ss@c:3".to_owned(),
            "valkey://d:4,redis+unix:///tmp/r.sock".to_owned(),
        ];
        assert_eq!(
            split_urls(&given),
            [
                "redis://a:1",
                "rediss://b:2",
                "redis://:pa,ss@c:3",
                "valkey://d:4",
                "redis+unix:///tmp/r.sock"
            ]
        );
    }
}
