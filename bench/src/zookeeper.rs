//! Rows 1-3 on ZooKeeper: ours against a hand-written ZooKeeper lock (the classic one: an
//! ephemeral node created for the lock, deleted at its version to release), on a private
//! one-member ZooKeeper started for the run (with TTL nodes, as the store needs).

use std::sync::Arc;
use std::time::Duration;

use lock_runtime::LockRuntime;
use lock_tests::ZooKeeperEnsemble;
use zookeeper_client::{Acls, Client, CreateMode};

use crate::peers::Impl;
use crate::rows;

/// The hand-written lock: what a user would write on ZooKeeper without a library.
pub(crate) struct HandZooKeeper {
    client: Client,
}

impl HandZooKeeper {
    pub(crate) async fn connect(connect: &str) -> anyhow::Result<Self> {
        let client = Client::connect(connect).await?;
        match client
            .create(
                "/hand-locks",
                b"",
                &CreateMode::Persistent.with_acls(Acls::anyone_all()),
            )
            .await
        {
            Ok(_) | Err(zookeeper_client::Error::NodeExists) => {}
            Err(e) => return Err(e.into()),
        }
        Ok(HandZooKeeper { client })
    }

    /// One uncontended acquire + release.
    pub(crate) async fn pair(&self, key: &str) -> anyhow::Result<()> {
        let path = format!("/hand-locks/{}", key.replace('/', "_"));
        let token = uuid::Uuid::new_v4().simple().to_string();
        let (stat, _) = self
            .client
            .create(
                &path,
                token.as_bytes(),
                &CreateMode::Ephemeral.with_acls(Acls::anyone_all()),
            )
            .await?;
        self.client.delete(&path, Some(stat.version)).await?;
        Ok(())
    }
}

/// The version of the ZooKeeper the rows run on (Debian's package).
fn server_version() -> String {
    std::process::Command::new("dpkg-query")
        .args(["-W", "-f", "${Version}", "zookeeper"])
        .output()
        .ok()
        .filter(|out| out.status.success())
        .map(|out| String::from_utf8_lossy(&out.stdout).into_owned())
        .unwrap_or_else(|| "(version unknown)".to_owned())
}

pub(crate) async fn measure(
    duration: Duration,
    rounds: usize,
    handoffs: usize,
) -> anyhow::Result<rows::StoreRows> {
    let ensemble = tokio::task::spawn_blocking(|| ZooKeeperEnsemble::start(1)).await?;
    let connect = ensemble.connect_string();
    let hand = HandZooKeeper::connect(&connect).await?;
    let runtime = || LockRuntime::builder().zookeeper(connect.clone()).build();
    let ours = runtime().await?;
    let impls = [
        Arc::new(Impl::ZooKeeperHand(Box::new(hand))),
        Arc::new(Impl::Ours(ours.clone())),
    ];
    let one = rows::pair_table(&impls, 1, duration, rounds, "zookeeper").await?;
    let many = rows::pair_table(&impls, 64, duration, rounds, "zookeeper").await?;
    let (holder, waiter) = (runtime().await?, runtime().await?);
    let (handoff_p50, handoff_p99) =
        rows::percentiles(crate::handoff::handoff_ours(holder, waiter, handoffs).await?);
    ours.shutdown().await;
    drop(impls);
    tokio::task::spawn_blocking(move || drop(ensemble)).await?;
    let server_version = server_version();
    Ok(rows::StoreRows {
        server: format!("ZooKeeper {server_version} (1 member)"),
        server_version,
        baseline: "hand-written ephemeral node create + delete",
        one,
        many,
        handoff_p50,
        handoff_p99,
    })
}
