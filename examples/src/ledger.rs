//! The bank's ledger of the interest-posting demo: one posting per date, and no write from a
//! holder whose fence is older than one already seen (a holder paused past its lease writes
//! after a newer one did).
//!
//! In memory by default; with PostgreSQL, in the same database as the locks, the fence checked
//! in the transaction that writes the posting: the pattern fencing tokens exist for.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use lock_runtime::store::tokio_postgres::{self, Client, NoTls};

/// What the ledger did with a posting.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Posting {
    /// Written.
    Posted {
        /// The writer's fence.
        fence: u64,
    },
    /// The date was posted already.
    AlreadyPosted {
        /// Who posted it.
        by: String,
    },
    /// Refused: a newer holder wrote already, or the same fence came with another token (two
    /// holders handed one fence).
    StaleFence {
        /// The refused writer's fence.
        fence: u64,
        /// The highest fence that wrote.
        highest: u64,
    },
}

/// The ledger; clones share it.
#[derive(Debug, Clone)]
pub enum Ledger {
    /// A map in this process.
    Memory(Arc<Mutex<MemoryLedger>>),
    /// Two tables in PostgreSQL, written through one connection.
    Postgres(Arc<tokio::sync::Mutex<Client>>),
}

/// The in-memory ledger's state.
#[derive(Debug, Default)]
pub struct MemoryLedger {
    posted: HashMap<String, String>,
    /// The highest fence seen per date (fences increase per lock key, so a date's writers
    /// are ordered by theirs), with the lock token that wrote it.
    highest_fence: HashMap<String, (u64, String)>,
}

/// Whether a write with `fence` and `token` may follow the highest seen so far. An equal fence
/// is only ever the same holder again; from another token it means two holders got one fence.
fn fresh(fence: u64, token: &str, highest: (u64, &str)) -> bool {
    fence > highest.0 || (fence == highest.0 && token == highest.1)
}

impl Ledger {
    /// An empty ledger in this process.
    pub fn memory() -> Self {
        Ledger::Memory(Arc::default())
    }

    /// The ledger in PostgreSQL at `url`: its two tables are created if missing and emptied
    /// of the demo's dates, so every run starts from nothing.
    pub async fn postgres(url: &str) -> anyhow::Result<Self> {
        let (client, connection) = tokio_postgres::connect(url, NoTls).await?;
        tokio::spawn(connection);
        client
            .batch_execute(
                "CREATE TABLE IF NOT EXISTS demo_interest_fences (
                     date text PRIMARY KEY, fence bigint NOT NULL, token text NOT NULL);
                 CREATE TABLE IF NOT EXISTS demo_interest_postings (
                     date text PRIMARY KEY, posted_by text NOT NULL);
                 DELETE FROM demo_interest_fences WHERE date LIKE 'night-%';
                 DELETE FROM demo_interest_postings WHERE date LIKE 'night-%';",
            )
            .await?;
        Ok(Ledger::Postgres(Arc::new(tokio::sync::Mutex::new(client))))
    }

    /// Posts the interest of `date` for the holder `by` of the lock with `fence` and `token`.
    pub async fn post_interest(
        &self,
        date: &str,
        by: &str,
        fence: u64,
        token: &str,
    ) -> anyhow::Result<Posting> {
        match self {
            Ledger::Memory(state) => {
                let mut state = state.lock().unwrap_or_else(|e| e.into_inner());
                let highest = state
                    .highest_fence
                    .entry(date.to_owned())
                    .or_insert((0, String::new()));
                if !fresh(fence, token, (highest.0, &highest.1)) {
                    return Ok(Posting::StaleFence {
                        fence,
                        highest: highest.0,
                    });
                }
                *highest = (fence, token.to_owned());
                if let Some(by) = state.posted.get(date) {
                    return Ok(Posting::AlreadyPosted { by: by.clone() });
                }
                state.posted.insert(date.to_owned(), by.to_owned());
                Ok(Posting::Posted { fence })
            }
            Ledger::Postgres(client) => {
                let mut client = client.lock().await;
                let tx = client.transaction().await?;
                // The date's fence row, locked until commit: writers of one date take turns,
                // and each sees the fence of the one before.
                tx.execute(
                    "INSERT INTO demo_interest_fences VALUES ($1, 0, '')
                     ON CONFLICT (date) DO NOTHING",
                    &[&date],
                )
                .await?;
                let row = tx
                    .query_one(
                        "SELECT fence, token FROM demo_interest_fences WHERE date = $1
                         FOR UPDATE",
                        &[&date],
                    )
                    .await?;
                let seen: String = row.get(1);
                let highest = (
                    u64::try_from(row.get::<_, i64>(0)).unwrap_or(0),
                    seen.as_str(),
                );
                if !fresh(fence, token, highest) {
                    return Ok(Posting::StaleFence {
                        fence,
                        highest: highest.0,
                    });
                }
                let stored = i64::try_from(fence).unwrap_or(i64::MAX);
                tx.execute(
                    "UPDATE demo_interest_fences SET fence = $2, token = $3 WHERE date = $1",
                    &[&date, &stored, &token],
                )
                .await?;
                let posted = tx
                    .execute(
                        "INSERT INTO demo_interest_postings VALUES ($1, $2)
                         ON CONFLICT (date) DO NOTHING",
                        &[&date, &by],
                    )
                    .await?;
                let outcome = if posted == 1 {
                    Posting::Posted { fence }
                } else {
                    let by = tx
                        .query_one(
                            "SELECT posted_by FROM demo_interest_postings WHERE date = $1",
                            &[&date],
                        )
                        .await?
                        .get(0);
                    Posting::AlreadyPosted { by }
                };
                tx.commit().await?;
                Ok(outcome)
            }
        }
    }

    /// The highest fence that wrote for `date` (0: none).
    pub async fn highest_fence(&self, date: &str) -> anyhow::Result<u64> {
        Ok(match self {
            Ledger::Memory(state) => state
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .highest_fence
                .get(date)
                .map_or(0, |(fence, _)| *fence),
            Ledger::Postgres(client) => client
                .lock()
                .await
                .query_opt(
                    "SELECT fence FROM demo_interest_fences WHERE date = $1",
                    &[&date],
                )
                .await?
                .map_or(0, |row| u64::try_from(row.get::<_, i64>(0)).unwrap_or(0)),
        })
    }

    /// How many dates are posted.
    pub async fn postings(&self) -> anyhow::Result<usize> {
        Ok(match self {
            Ledger::Memory(state) => state.lock().unwrap_or_else(|e| e.into_inner()).posted.len(),
            Ledger::Postgres(client) => {
                let n: i64 = client
                    .lock()
                    .await
                    .query_one(
                        "SELECT count(*) FROM demo_interest_postings WHERE date LIKE 'night-%'",
                        &[],
                    )
                    .await?
                    .get(0);
                usize::try_from(n).unwrap_or(0)
            }
        })
    }
}
