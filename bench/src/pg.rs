//! Rows 1-3 on PostgreSQL: ours against a hand-written lock on one table (`INSERT .. ON
//! CONFLICT .. DO UPDATE .. WHERE expired` + a token-checked `DELETE`, both prepared, over one
//! pipelining connection, as ours), on a private server started for the run.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use lock_runtime::LockRuntime;
use lock_tests::PostgresServer;
use tokio_postgres::{Client, NoTls, Statement};

use crate::peers::Impl;
use crate::rows;

/// The hand-written pair: what a user would write without a library.
pub(crate) struct HandPg {
    client: Client,
    acquire: Statement,
    release: Statement,
}

impl HandPg {
    pub(crate) async fn connect(url: &str) -> anyhow::Result<Self> {
        let (client, connection) = tokio_postgres::connect(url, NoTls).await?;
        tokio::spawn(connection);
        client
            .batch_execute(
                "CREATE TABLE IF NOT EXISTS hand_locks (
                    key text PRIMARY KEY, token text NOT NULL, expires_at timestamptz NOT NULL)",
            )
            .await?;
        let acquire = client
            .prepare(
                "INSERT INTO hand_locks AS l (key, token, expires_at)
                 VALUES ($1, $2, clock_timestamp() + interval '10 seconds')
                 ON CONFLICT (key) DO UPDATE SET token = EXCLUDED.token,
                     expires_at = EXCLUDED.expires_at
                 WHERE l.expires_at <= clock_timestamp()
                 RETURNING 1",
            )
            .await?;
        let release = client
            .prepare("DELETE FROM hand_locks WHERE key = $1 AND token = $2")
            .await?;
        Ok(HandPg {
            client,
            acquire,
            release,
        })
    }

    /// One uncontended acquire + release.
    pub(crate) async fn pair(&self, key: &str) -> anyhow::Result<()> {
        let token = uuid::Uuid::new_v4().simple().to_string();
        self.client
            .query_opt(&self.acquire, &[&key, &token])
            .await?
            .context("an uncontended key was held")?;
        self.client.execute(&self.release, &[&key, &token]).await?;
        Ok(())
    }
}

/// What the PostgreSQL rows measured.
pub(crate) struct PgRows {
    pub(crate) server_version: String,
    /// Median pairs/s, 1 task: [hand-written, ours].
    pub(crate) one: [f64; 2],
    /// Median pairs/s, 64 tasks: [hand-written, ours].
    pub(crate) many: [f64; 2],
    pub(crate) handoff_p50: Duration,
    pub(crate) handoff_p99: Duration,
}

pub(crate) async fn measure(
    duration: Duration,
    rounds: usize,
    handoffs: usize,
) -> anyhow::Result<PgRows> {
    let server = tokio::task::spawn_blocking(PostgresServer::start).await?;
    let url = server.url();
    let hand = HandPg::connect(&url).await?;
    let server_version: String = hand
        .client
        .query_one("SHOW server_version", &[])
        .await?
        .get(0);
    let ours = LockRuntime::builder()
        .postgres(url.as_str())
        .build()
        .await?;
    let impls = [
        Arc::new(Impl::PgHand(hand)),
        Arc::new(Impl::Ours(ours.clone())),
    ];
    let one = rows::pair_table(&impls, 1, duration, rounds, "pg").await?;
    let many = rows::pair_table(&impls, 64, duration, rounds, "pg").await?;
    let holder = LockRuntime::builder()
        .postgres(url.as_str())
        .build()
        .await?;
    let waiter = LockRuntime::builder()
        .postgres(url.as_str())
        .build()
        .await?;
    let (handoff_p50, handoff_p99) =
        rows::percentiles(crate::handoff::handoff_ours(holder, waiter, handoffs).await?);
    ours.shutdown().await;
    drop(impls);
    tokio::task::spawn_blocking(move || drop(server)).await?;
    Ok(PgRows {
        server_version,
        one,
        many,
        handoff_p50,
        handoff_p99,
    })
}
