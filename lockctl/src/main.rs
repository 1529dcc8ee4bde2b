//! `lockctl`: see what is locked and by whom, and force a lock free.
//!
//!     lockctl --url redis://127.0.0.1:6379 list [--match 'interest:*'] [--json]
//!     lockctl --url redis://127.0.0.1:6379 show interest-posting
//!     lockctl --url redis://127.0.0.1:6379 release interest-posting --force
//!     lockctl --cluster --url redis://10.0.0.1:7000 --url redis://10.0.0.2:7000 list

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod ops;

/// Inspect and force-release lock-runtime locks in Redis.
#[derive(Debug, Parser)]
#[command(name = "lockctl", version)]
struct Cli {
    /// Redis URL, as given to the runtime (repeat for several Cluster seed nodes).
    #[arg(long = "url", global = true)]
    urls: Vec<String>,
    /// The URLs are Redis Cluster seed nodes.
    #[arg(long, global = true)]
    cluster: bool,
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
    /// List held locks (SCAN, never KEYS): key, owner, fence, age, remaining ttl.
    List {
        /// Only keys matching this glob (Redis MATCH syntax), e.g. 'interest:*'.
        #[arg(long = "match", default_value = "*")]
        pattern: String,
    },
    /// Show one lock.
    Show {
        /// The lock key, as the application names it (without namespace).
        key: String,
    },
    /// Delete a lock record and wake its waiters. The holder is told at its next renewal.
    Release {
        /// The lock key.
        key: String,
        /// Required: force-releasing a lock lets a second holder in while the first may
        /// still be working.
        #[arg(long)]
        force: bool,
    },
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("lockctl: {e:#}");
            ExitCode::from(2)
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    if cli.namespace.is_empty() || cli.namespace.contains(['{', '}', '*', '?', '[']) {
        anyhow::bail!("invalid --namespace `{}`", cli.namespace);
    }
    let store = ops::Store::connect(&cli.urls, cli.cluster).await?;
    match cli.command {
        Action::List { pattern } => {
            let locks = store.list(&cli.namespace, &pattern).await?;
            if cli.json {
                println!("{}", serde_json::to_string_pretty(&ops::to_json(&locks))?);
            } else {
                print!("{}", ops::table(&locks));
            }
            Ok(ExitCode::SUCCESS)
        }
        Action::Show { key } => match store.show(&cli.namespace, &key).await? {
            Some(lock) => {
                if cli.json {
                    println!("{}", serde_json::to_string_pretty(&ops::to_json(&[lock]))?);
                } else {
                    print!("{}", ops::table(&[lock]));
                }
                Ok(ExitCode::SUCCESS)
            }
            None => {
                if cli.json {
                    println!("null");
                } else {
                    println!("`{key}` is not locked");
                }
                Ok(ExitCode::from(1))
            }
        },
        Action::Release { key, force } => {
            if !force {
                anyhow::bail!(
                    "refusing to release `{key}` without --force: the holder may still be working, and a second holder would run alongside it"
                );
            }
            let deleted = store.force_release(&cli.namespace, &key).await?;
            if cli.json {
                println!("{}", serde_json::json!({ "key": key, "released": deleted }));
            } else if deleted {
                println!("released `{key}`; waiters were woken");
            } else {
                println!("`{key}` was not locked");
            }
            Ok(if deleted {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            })
        }
    }
}
