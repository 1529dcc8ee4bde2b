//! Rows 1-3 on etcd: ours against a hand-written etcd lock (a lease, a transaction that puts
//! the key only while it does not exist, a transaction that deletes it only while it carries
//! the token), on a private one-member etcd started for the run.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use etcd_client::{Client, Compare, CompareOp, PutOptions, Txn, TxnOp};
use lock_runtime::LockRuntime;
use lock_tests::EtcdCluster;

use crate::peers::Impl;
use crate::rows;

/// The hand-written lock: what a user would write on etcd without a library.
pub(crate) struct HandEtcd {
    client: Client,
}

impl HandEtcd {
    pub(crate) async fn connect(endpoints: &[String]) -> anyhow::Result<Self> {
        Ok(HandEtcd {
            client: Client::connect(endpoints, None).await?,
        })
    }

    /// One uncontended acquire + release.
    pub(crate) async fn pair(&self, key: &str) -> anyhow::Result<()> {
        let mut client = self.client.clone();
        let token = uuid::Uuid::new_v4().simple().to_string();
        let lease = client.lease_grant(10, None).await?.id();
        let taken = client
            .txn(
                Txn::new()
                    .when([Compare::create_revision(key, CompareOp::Equal, 0)])
                    .and_then([TxnOp::put(
                        key,
                        token.as_str(),
                        Some(PutOptions::new().with_lease(lease)),
                    )]),
            )
            .await?;
        anyhow::ensure!(taken.succeeded(), "an uncontended key was held");
        client
            .txn(
                Txn::new()
                    .when([Compare::value(key, CompareOp::Equal, token.as_str())])
                    .and_then([TxnOp::delete(key, None)]),
            )
            .await?;
        Ok(())
    }
}

pub(crate) async fn measure(
    duration: Duration,
    rounds: usize,
    handoffs: usize,
) -> anyhow::Result<rows::StoreRows> {
    let cluster = tokio::task::spawn_blocking(|| EtcdCluster::start(1)).await?;
    let endpoints = cluster.endpoints();
    let hand = HandEtcd::connect(&endpoints).await?;
    let server_version = hand
        .client
        .clone()
        .status()
        .await
        .context("etcd status")?
        .version()
        .to_owned();
    let ours = LockRuntime::builder()
        .etcd(endpoints.clone())
        .build()
        .await?;
    let impls = [
        Arc::new(Impl::EtcdHand(Box::new(hand))),
        Arc::new(Impl::Ours(ours.clone())),
    ];
    let one = rows::pair_table(&impls, 1, duration, rounds, "etcd").await?;
    let many = rows::pair_table(&impls, 64, duration, rounds, "etcd").await?;
    let holder = LockRuntime::builder()
        .etcd(endpoints.clone())
        .build()
        .await?;
    let waiter = LockRuntime::builder().etcd(endpoints).build().await?;
    let (handoff_p50, handoff_p99) =
        rows::percentiles(crate::handoff::handoff_ours(holder, waiter, handoffs).await?);
    ours.shutdown().await;
    drop(impls);
    tokio::task::spawn_blocking(move || drop(cluster)).await?;
    Ok(rows::StoreRows {
        server: format!("etcd {server_version}"),
        server_version,
        baseline: "hand-written lease + txn put + txn delete",
        one,
        many,
        handoff_p50,
        handoff_p99,
    })
}
