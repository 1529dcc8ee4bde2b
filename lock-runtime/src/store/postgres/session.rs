//! The command connection of the PostgreSQL store: opening and preparing it, the table,
//! re-opening it after a break (retiring the broken one's server process first), and the
//! sweep of rows that hold nothing.

use std::sync::Arc;
use std::time::Duration;

use tokio_postgres::Client;
use tokio_postgres::error::SqlState;

use super::sql::SWEEP_BATCH;
use super::{SWEEP_EVERY, Session, Shared, lock, pg_error};
use crate::{BackendError, LockError};

impl Shared {
    pub(super) fn error(&self, context: &str, e: tokio_postgres::Error) -> LockError {
        pg_error(
            &format!("{context} (PostgreSQL at `{}`)", self.shown),
            e,
            &self.secret,
        )
        .into()
    }

    /// Opens a connection and prepares it, bounded by the connect and command timeouts (the
    /// driver bounds only the TCP connect; the handshake and the statements would wait on a
    /// server that accepts and then says nothing).
    pub(super) async fn open_session(&self) -> Result<Session, LockError> {
        let bound = self.connect_timeout + self.command_timeout;
        match tokio::time::timeout(bound, async {
            let client = self.open().await?;
            self.prepare(client).await
        })
        .await
        {
            Ok(session) => session,
            Err(_) => Err(BackendError::transient(format!(
                "cannot connect (PostgreSQL at `{}`): no ready connection within {bound:?}",
                self.shown
            ))
            .into()),
        }
    }

    /// Opens a command connection; its driver runs on its own task until the client drops.
    pub(super) async fn open(&self) -> Result<Client, LockError> {
        let (client, connection) = self
            .endpoint
            .connect()
            .await
            .map_err(|e| self.error("cannot connect", e))?;
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "PostgreSQL command connection ended");
            }
        });
        // statement_timeout: the server gives up on a statement when the runtime does, so
        // nothing it cut off keeps a row locked behind its back. lock_timeout: a statement of
        // ours never waits long on a row lock (ours last microseconds; a foreign transaction
        // holding one must not stall the renewals queued behind it on this connection).
        // synchronous_commit: a grant is on disk before the holder is told, whatever the
        // server's or role's default (off would let a crash forget a granted lock).
        let timeout_ms = self.command_timeout.as_millis().max(1);
        let lock_ms = (timeout_ms / 4).clamp(1, 1000);
        // Only `off` lets a crash forget a commit; stronger settings (remote_apply) stay.
        client
            .batch_execute(&format!(
                "SET statement_timeout = {timeout_ms}; SET lock_timeout = {lock_ms}; \
                 DO $$ BEGIN IF current_setting('synchronous_commit') = 'off' THEN \
                 SET synchronous_commit = on; END IF; END $$"
            ))
            .await
            .map_err(|e| self.error("cannot set the session's timeouts", e))?;
        Ok(client)
    }

    /// Creates the table and its sequence unless both exist (and adds the columns an older
    /// table lacks); a user who may not is told what to run instead.
    pub(super) async fn ensure_table(&self, client: &Client) -> Result<(), LockError> {
        if self
            .table_ready(client)
            .await
            .map_err(|e| self.error("cannot look up the lock table", e))?
        {
            self.ensure_journal(client).await;
            return self.check_sequence(client).await;
        }
        match client.batch_execute(&self.table.create()).await {
            Ok(()) => Ok(()),
            // Another runtime created it at the same moment.
            Err(_) if self.table_ready(client).await.unwrap_or(false) => Ok(()),
            Err(e) if e.code() == Some(&SqlState::INSUFFICIENT_PRIVILEGE) => {
                Err(LockError::config(format!(
                    "the lock table `{}` is missing (or an older one lacks the `wanted` \
                     column) and this user may not create or change it (PostgreSQL at `{}`): \
                     run this SQL once as its owner: {}",
                    self.table.name,
                    self.shown,
                    self.table
                        .create()
                        .split_whitespace()
                        .collect::<Vec<_>>()
                        .join(" ")
                )))
            }
            Err(e) => Err(self.error("cannot create the lock table", e)),
        }
    }

    /// Creates the run journal's table when a lock table made by an earlier version lacks it.
    /// Best effort: without it the locks work as before, and each run the scheduler cannot
    /// journal is logged and counted.
    async fn ensure_journal(&self, client: &Client) {
        let present = client
            .query_one("SELECT to_regclass($1) IS NOT NULL", &[&self.table.runs])
            .await
            .and_then(|row| row.try_get::<_, bool>(0));
        if matches!(present, Ok(true)) {
            return;
        }
        if let Err(e) = client.batch_execute(&self.table.create_journal()).await {
            tracing::warn!(
                table = %self.table.runs,
                error = %self.error("creating the run journal's table", e),
                "the run journal's table is missing and could not be created: scheduled jobs \
                 run, but keep no history until its owner runs: {}",
                self.table.create_journal().split_whitespace().collect::<Vec<_>>().join(" ")
            );
        }
    }

    /// A sequence made beforehand with `CACHE` above 1 hands each connection its own block
    /// of values, so fences drawn by different runtimes would not follow the order of the
    /// grants: refused.
    pub(super) async fn check_sequence(&self, client: &Client) -> Result<(), LockError> {
        let cache: i64 = client
            .query_one(
                "SELECT seqcache FROM pg_sequence WHERE seqrelid = to_regclass($1)",
                &[&self.table.sequence],
            )
            .await
            .and_then(|row| row.try_get(0))
            .map_err(|e| self.error("cannot look up the fence sequence", e))?;
        if cache > 1 {
            return Err(LockError::config(format!(
                "the fence sequence `{}` has CACHE {cache}: fences must come from one \
                 counter in order; ALTER SEQUENCE {} CACHE 1",
                self.table.sequence, self.table.sequence
            )));
        }
        Ok(())
    }

    /// Whether the table (with every column this version uses) and its sequence exist.
    pub(super) async fn table_ready(&self, client: &Client) -> Result<bool, tokio_postgres::Error> {
        let t = &self.table;
        client
            .query_one(
                "SELECT to_regclass($2) IS NOT NULL AND EXISTS (
                     SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass($1)
                     AND attname = 'wanted' AND NOT attisdropped)",
                &[&t.name, &t.sequence],
            )
            .await?
            .try_get(0)
    }

    /// Readies a command connection: its planner settings, its statements, its identity.
    pub(super) async fn prepare(&self, client: Client) -> Result<Session, LockError> {
        // Every statement of this connection finds its rows by key. A lock table is often
        // empty when it is vacuumed, and statistics of zero pages make a full scan look free:
        // plans cached then read every row, dead or alive, on each acquire and release once
        // the table fills (a busy table: thousands). The sweep, which must scan, runs on a
        // connection of its own with the server's defaults.
        client
            .batch_execute("SET enable_seqscan = off")
            .await
            .map_err(|e| self.error("cannot set the session's planner settings", e))?;
        let t = &self.table;
        let prepare = |sql: String| {
            let client = &client;
            async move { client.prepare(&sql).await }
        };
        let statements = async {
            Ok::<_, tokio_postgres::Error>((
                prepare(t.acquire()).await?,
                prepare(t.mark()).await?,
                prepare(t.release_plain()).await?,
                prepare(t.release()).await?,
                prepare(t.extend()).await?,
                prepare(t.inspect()).await?,
                prepare(t.owns()).await?,
            ))
        };
        let (acquire, mark, release_plain, release, extend, inspect, owns) = statements
            .await
            .map_err(|e| self.error("cannot prepare the lock statements", e))?;
        let identify = async {
            let row = client
                .query_one(
                    "SELECT pid, (extract(epoch FROM backend_start) * 1000000)::bigint
                     FROM pg_stat_activity WHERE pid = pg_backend_pid()",
                    &[],
                )
                .await?;
            Ok::<_, tokio_postgres::Error>(BackendId {
                pid: row.try_get(0)?,
                started: row.try_get(1)?,
            })
        };
        let backend = identify
            .await
            .map_err(|e| self.error("cannot identify the connection", e))?;
        Ok(Session {
            client,
            backend,
            owns,
            acquire,
            mark,
            release_plain,
            release,
            extend,
            inspect,
        })
    }

    /// The open command connection, re-opened if it broke.
    pub(super) async fn session(self: &Arc<Self>) -> Result<Arc<Session>, LockError> {
        if let Some(s) = lock(&self.session)
            .as_ref()
            .filter(|s| !s.client.is_closed())
        {
            return Ok(s.clone());
        }
        // On a task of its own: a caller cut off by the command timeout leaves the reconnect
        // to finish (it may take longer than one call may wait), and the next caller finds
        // the new connection instead of starting over.
        let shared = self.clone();
        match tokio::spawn(async move { shared.reconnect().await }).await {
            Ok(session) => session,
            Err(_) => Err(BackendError::transient("the PostgreSQL reconnect task failed").into()),
        }
    }

    /// Opens a new command connection unless another caller just did, retiring the broken
    /// one's server process first.
    pub(super) async fn reconnect(&self) -> Result<Arc<Session>, LockError> {
        let _one = self.reconnect.lock().await;
        let old = {
            let current = lock(&self.session);
            match current.as_ref() {
                Some(s) if !s.client.is_closed() => return Ok(s.clone()),
                Some(s) => Some(s.backend.clone()),
                None => None,
            }
        };
        let session = self.open_session().await?;
        if let Some(old) = old {
            self.retire(&session, &old).await?;
        }
        let session = Arc::new(session);
        *lock(&self.session) = Some(session.clone());
        Ok(session)
    }

    /// Ends the server process of a connection that broke, and waits until it is gone,
    /// before another connection takes over. A statement it was still running (an acquire)
    /// could otherwise commit after a call sent on the new connection (the release that gives
    /// that acquire back), and leave a grant nobody holds.
    pub(super) async fn retire(&self, session: &Session, old: &BackendId) -> Result<(), LockError> {
        let gone = async {
            session
                .client
                .query(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
                     WHERE pid = $1 AND (extract(epoch FROM backend_start) * 1000000)::bigint = $2",
                    &[&old.pid, &old.started],
                )
                .await?;
            loop {
                let alive: bool = session
                    .client
                    .query_one(
                        "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1
                         AND (extract(epoch FROM backend_start) * 1000000)::bigint = $2)",
                        &[&old.pid, &old.started],
                    )
                    .await?
                    .try_get(0)?;
                if !alive {
                    return Ok::<(), tokio_postgres::Error>(());
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        };
        match tokio::time::timeout(self.command_timeout, gone).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(self.error("cannot end the broken connection's server process", e)),
            Err(_) => Err(BackendError::transient(format!(
                "the server process {} of a broken connection did not end within {:?} \
                 (PostgreSQL at `{}`)",
                old.pid, self.command_timeout, self.shown
            ))
            .into()),
        }
    }

    /// Deletes rows that hold nothing any more, on a connection of its own (a long scan must
    /// not hold up the renewals queued on the command connection), a batch at a time through
    /// the key order until none is left: a table that gains more expired rows a minute than
    /// one batch (kept for min_hold, expired done markers, crashed holders) must not grow
    /// without bound. Bounded all the same: by `budget` (what is left waits for the next
    /// round), [`SWEEP_ROUNDS`] batches, and each batch by the command timeout; a failure only
    /// waits for the next round.
    pub(super) async fn sweep(&self, budget: Duration) {
        let started = tokio::time::Instant::now();
        let client = match tokio::time::timeout(self.connect_timeout, self.open()).await {
            Ok(Ok(client)) => client,
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "sweeping expired locks failed");
                return;
            }
            Err(_) => {
                tracing::debug!("sweeping expired locks timed out");
                return;
            }
        };
        let statement = self.table.sweep();
        let mut after = String::new();
        let mut swept = 0;
        for _ in 0..SWEEP_ROUNDS {
            let round =
                tokio::time::timeout(self.command_timeout, client.query(&statement, &[&after]))
                    .await;
            match round {
                Ok(Ok(rows)) => {
                    swept += rows.len();
                    if let Some(last) = rows
                        .iter()
                        .filter_map(|r| r.try_get::<_, String>(0).ok())
                        .max()
                    {
                        after = last;
                    }
                    if rows.len() < SWEEP_BATCH || started.elapsed() >= budget {
                        break;
                    }
                }
                Ok(Err(e)) => {
                    tracing::debug!(error = %self.error("sweep failed", e), "sweeping expired locks failed");
                    break;
                }
                Err(_) => {
                    tracing::debug!("sweeping expired locks timed out");
                    break;
                }
            }
        }
        if swept > 0 {
            tracing::debug!(rows = swept, table = %self.table.name, "swept expired locks");
        }
    }
}

/// Batches one sweep deletes at most (a million rows).
const SWEEP_ROUNDS: usize = 1000;

/// Which server process serves a connection (a pid alone may be reused).
#[derive(Debug, Clone)]
pub(super) struct BackendId {
    pid: i32,
    /// `backend_start` in microseconds since the epoch (its text form depends on the
    /// session's time zone and date style).
    started: i64,
}

pub(super) async fn sweep_loop(shared: std::sync::Weak<Shared>) {
    loop {
        tokio::time::sleep(SWEEP_EVERY).await;
        let Some(shared) = shared.upgrade() else {
            return;
        };
        // Half the pause at most: what is left waits for the next round.
        shared.sweep(SWEEP_EVERY / 2).await;
    }
}
