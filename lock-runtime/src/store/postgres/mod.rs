//! Locks in one PostgreSQL table (cargo feature `postgres`).
//!
//! One row per lock (`key` is the record name `<ns>:{<key>}`), written by one statement per
//! operation on the database's clock; fences come from one sequence, so they strictly
//! increase per lock across restarts although released rows are deleted. Commands go over one
//! pipelining connection, re-opened when it breaks; releases are announced with `NOTIFY` on
//! one channel per table, which one `LISTEN`ing connection per runtime fans out to waiters.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_postgres::error::SqlState;
use tokio_postgres::{Client, Statement};

use super::hub::lock;
use super::{
    AcquireOutcome, AcquireRequest, ExtendItem, KeyNames, LockStore, RecordView, ReleaseHub,
    ReleaseOutcome, ReleaseWatch, Renewal, Retention,
};
use crate::config::millis_ceil;
use crate::error::scrub;
use crate::{BackendError, LockError};

mod listener;
mod operator;
mod session;
mod sql;
mod tls;

use listener::Listener;
use session::{BackendId, sweep_loop};
use sql::Table;

/// The table a runtime locks in unless `postgres_table` names another.
pub(crate) const DEFAULT_TABLE: &str = "lock_records";

/// How often each runtime deletes rows that hold nothing any more (crashed holders' locks;
/// released ones are deleted at once).
const SWEEP_EVERY: Duration = Duration::from_secs(60);

/// Where the store connects: a connection string, or the driver's configuration.
#[derive(Clone)]
pub(crate) enum PostgresTarget {
    Url(String),
    Config(Box<tokio_postgres::Config>),
}

impl std::fmt::Debug for PostgresTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.shown())
    }
}

impl PostgresTarget {
    /// For messages: the user, hosts, ports and database, never a password.
    pub(crate) fn shown(&self) -> String {
        match self {
            PostgresTarget::Url(url) => shown_url(url),
            PostgresTarget::Config(config) => shown_config(config),
        }
    }
}

/// What `build()` needs to open the store. (Its `Debug` shows the target without a password.)
#[derive(Debug)]
pub(crate) struct PostgresOptions {
    pub(crate) target: PostgresTarget,
    pub(crate) table: String,
    pub(crate) connect_timeout: Duration,
    pub(crate) command_timeout: Duration,
    /// A PEM root certificate to trust instead of the system's; asks for TLS.
    pub(crate) tls_root_cert: Option<Vec<u8>>,
}

/// The PostgreSQL store of one runtime.
pub(crate) struct PostgresBackend {
    shared: Arc<Shared>,
    listener: Listener,
    sweeper: JoinHandle<()>,
}

impl std::fmt::Debug for PostgresBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresBackend")
            .field("url", &self.shared.shown)
            .field("table", &self.shared.table.name)
            .finish_non_exhaustive()
    }
}

impl Drop for PostgresBackend {
    fn drop(&mut self) {
        self.sweeper.abort();
    }
}

/// What the store's calls and its background tasks share.
struct Shared {
    endpoint: tls::Endpoint,
    /// The URL with its password replaced, for messages.
    shown: String,
    /// The password (if any), scrubbed from every driver message.
    secret: Vec<String>,
    table: Table,
    connect_timeout: Duration,
    command_timeout: Duration,
    /// The open command connection; `None` after it broke, until the next call re-opens it.
    session: Mutex<Option<Arc<Session>>>,
    /// One re-connect at a time.
    reconnect: tokio::sync::Mutex<()>,
}

/// One command connection with its statements prepared.
struct Session {
    client: Client,
    /// Its server process, to make sure it is gone before another connection takes over.
    backend: BackendId,
    owns: Statement,
    acquire: Statement,
    mark: Statement,
    release_plain: Statement,
    release: Statement,
    extend: Statement,
    inspect: Statement,
}

impl PostgresBackend {
    /// Connects, creates the table if it is missing, prepares the statements and starts
    /// listening for releases; every failure is reported here, not at the first lock.
    pub(crate) async fn connect(options: PostgresOptions) -> Result<Self, LockError> {
        let mut config = match options.target {
            PostgresTarget::Url(url) => {
                check_url(&url)?;
                // The driver's message is left out: it can quote a piece of a mistyped
                // password.
                tls::parse(&url).ok_or_else(|| {
                    LockError::config(
                        "cannot read the PostgreSQL URL: expected \
                         postgres://user:password@host:port/db (special characters \
                         percent-encoded) or libpq's key=value pairs",
                    )
                })?
            }
            PostgresTarget::Config(config) => *config,
        };
        if config.get_hosts().is_empty() {
            // The driver would only fail at connect, every time: a transient-looking error
            // that a caller retrying build() would retry for ever.
            return Err(LockError::config(
                "the PostgreSQL URL names no host: give one (postgres://user@host/db, or \
                 host=/run/postgresql for a Unix socket)",
            ));
        }
        let tls = tls::connector(&mut config, options.tls_root_cert.as_deref())?;
        let shown = shown_config(&config);
        // A peer that vanished without a word (a host crash, a moved address) is noticed in
        // seconds, not after the kernel's two hours of keepalive idleness; the listening
        // connection is idle by design and depends on it.
        config
            .connect_timeout(options.connect_timeout)
            .keepalives(true)
            .keepalives_idle(Duration::from_secs(5))
            .keepalives_interval(Duration::from_secs(2))
            .keepalives_retries(3)
            .tcp_user_timeout(options.command_timeout.max(Duration::from_secs(5)))
            .application_name("lock-runtime");
        let secret: Vec<String> = config
            .get_password()
            .map(|p| String::from_utf8_lossy(p).into_owned())
            .into_iter()
            .collect();
        let table = Table::new(&options.table).map_err(LockError::config)?;
        let shared = Arc::new(Shared {
            endpoint: tls::Endpoint::new(config, tls),
            shown,
            secret,
            table,
            connect_timeout: options.connect_timeout,
            command_timeout: options.command_timeout,
            session: Mutex::new(None),
            reconnect: tokio::sync::Mutex::new(()),
        });
        let client = shared.open().await?;
        shared.ensure_table(&client).await?;
        let session = shared.prepare(client).await?;
        *lock(&shared.session) = Some(Arc::new(session));
        // At build, one command timeout's worth: what is left waits for the next round.
        shared.sweep(options.command_timeout).await;
        let listener = Listener::start(
            shared.endpoint.clone(),
            shared.table.channel.clone(),
            options.connect_timeout,
        )
        .await
        .map_err(|e| shared.error("cannot LISTEN for releases", e))?;
        let sweeper = tokio::spawn(sweep_loop(Arc::downgrade(&shared)));
        Ok(PostgresBackend {
            shared,
            listener,
            sweeper,
        })
    }

    fn hub(&self) -> &Arc<ReleaseHub> {
        self.listener.hub()
    }
}

impl LockStore for PostgresBackend {
    async fn acquire(&self, r: AcquireRequest<'_>) -> Result<AcquireOutcome, LockError> {
        let s = self.shared.session().await?;
        let ttl = millis(r.ttl);
        let min_hold = millis(r.min_hold);
        // Refused, then marked: a release between the two (no row to mark) or an expiry
        // (nothing left to wait for) is met by asking again at once.
        for _ in 0..3 {
            let granted = s
                .client
                .query_opt(
                    &s.acquire,
                    &[
                        &r.names.record(),
                        &r.token,
                        &r.owner,
                        &ttl,
                        &min_hold,
                        &r.once,
                    ],
                )
                .await;
            match granted {
                Ok(Some(row)) => {
                    let fence: i64 = row.try_get(0).map_err(|e| self.decode(e))?;
                    return Ok(AcquireOutcome::Acquired {
                        fence: u64::try_from(fence).unwrap_or(0),
                    });
                }
                Ok(None) => {}
                // Another caller kept this lock's row (or its advisory lock) past lock_timeout:
                // nothing was granted (the statement rolled back), and the lock is busy.
                Err(e) if e.code() == Some(&SqlState::LOCK_NOT_AVAILABLE) => {
                    return Ok(AcquireOutcome::Held { pttl: None });
                }
                Err(e) => return Err(self.shared.error("acquire failed", e)),
            }
            let row = match s.client.query_opt(&s.mark, &[&r.names.record()]).await {
                Ok(Some(row)) => row,
                Ok(None) => continue,
                Err(e) if e.code() == Some(&SqlState::LOCK_NOT_AVAILABLE) => {
                    return Ok(AcquireOutcome::Held { pttl: None });
                }
                Err(e) => return Err(self.shared.error("acquire failed", e)),
            };
            let remaining = |i: usize| -> Result<Option<Duration>, LockError> {
                let ms: Option<i64> = row.try_get(i).map_err(|e| self.decode(e))?;
                Ok(ms.filter(|&ms| ms > 0).map(duration))
            };
            let (held, done) = (remaining(0)?, remaining(1)?);
            if r.once && done.is_some() {
                return Ok(AcquireOutcome::Done { pttl: done });
            }
            if held.is_some() {
                return Ok(AcquireOutcome::Held { pttl: held });
            }
        }
        Ok(AcquireOutcome::Held { pttl: None })
    }

    async fn release(
        &self,
        names: &KeyNames,
        token: &str,
        done_retention: Option<Duration>,
    ) -> Result<ReleaseOutcome, LockError> {
        let s = self.shared.session().await?;
        let retention = done_retention.map(millis);
        // Most releases have nothing to keep: one plain DELETE. Anything else (min_hold, a
        // done marker, not ours, a row lock in the way) is left to the full statement.
        if retention.is_none() {
            match s
                .client
                .query_opt(
                    &s.release_plain,
                    &[&names.record(), &token, &names.channel()],
                )
                .await
            {
                Ok(Some(_)) => return Ok(ReleaseOutcome::Released),
                Ok(None) => {}
                Err(e) if e.code() == Some(&SqlState::LOCK_NOT_AVAILABLE) => {}
                Err(e) => return Err(self.shared.error("release failed", e)),
            }
        }
        // The statement decides its branch on its snapshot: a change committed meanwhile
        // (another caller's done marker on this row) can hide the row from every branch. A
        // "not ours" is therefore checked on a fresh snapshot, and the release asked again
        // while the row still carries the token.
        for _ in 0..3 {
            let row = match s
                .client
                .query_one(
                    &s.release,
                    &[&names.record(), &token, &retention, &names.channel()],
                )
                .await
            {
                Ok(row) => row,
                // A lock wait cut off by lock_timeout (a row lock, or the server's lock on
                // its NOTIFY queue at commit) rolled the release back: ask again.
                Err(e) if e.code() == Some(&SqlState::LOCK_NOT_AVAILABLE) => continue,
                Err(e) => return Err(self.shared.error("release failed", e)),
            };
            let outcome: &str = row.try_get(0).map_err(|e| self.decode(e))?;
            match outcome {
                "released" => return Ok(ReleaseOutcome::Released),
                "kept" => return Ok(ReleaseOutcome::KeptForMinHold),
                _ if token.is_empty() => return Ok(ReleaseOutcome::NotOwner),
                _ => {}
            }
            let still_ours: bool = s
                .client
                .query_one(&s.owns, &[&names.record(), &token])
                .await
                .map_err(|e| self.shared.error("release failed", e))?
                .try_get(0)
                .map_err(|e| self.decode(e))?;
            if !still_ours {
                return Ok(ReleaseOutcome::NotOwner);
            }
        }
        Err(BackendError::transient(format!(
            "release of `{}` kept meeting concurrent changes; retrying",
            names.key()
        ))
        .into())
    }

    async fn extend(&self, items: &[ExtendItem]) -> Result<Vec<Renewal>, LockError> {
        let s = self.shared.session().await?;
        let keys: Vec<&str> = items.iter().map(|i| i.record.as_str()).collect();
        let tokens: Vec<&str> = items.iter().map(|i| i.token.as_str()).collect();
        let ttls: Vec<i64> = items.iter().map(|i| millis(i.ttl)).collect();
        let rows = match s.client.query(&s.extend, &[&keys, &tokens, &ttls]).await {
            Ok(rows) => rows,
            // One row locked by a foreign transaction fails the whole batch at lock_timeout;
            // lease by lease, only that one goes unanswered.
            Err(e) if items.len() > 1 && e.code() == Some(&SqlState::LOCK_NOT_AVAILABLE) => {
                return Ok(self.extend_one_by_one(&s, items).await);
            }
            Err(e) => return Err(self.shared.error("renewal failed", e)),
        };
        let mut renewed = std::collections::HashSet::with_capacity(rows.len());
        for row in &rows {
            let key: String = row.try_get(0).map_err(|e| self.decode(e))?;
            let token: String = row.try_get(1).map_err(|e| self.decode(e))?;
            renewed.insert((key, token));
        }
        Ok(items
            .iter()
            .map(|i| Renewal::from(renewed.contains(&(i.record.clone(), i.token.clone()))))
            .collect())
    }

    async fn inspect(&self, names: &KeyNames) -> Result<Option<RecordView>, LockError> {
        let s = self.shared.session().await?;
        let row = s
            .client
            .query_opt(&s.inspect, &[&names.record()])
            .await
            .map_err(|e| self.shared.error("inspect failed", e))?;
        let Some(row) = row else {
            return Ok(None);
        };
        let owner: String = row.try_get(0).map_err(|e| self.decode(e))?;
        let fence: i64 = row.try_get(1).map_err(|e| self.decode(e))?;
        let left: i64 = row.try_get(2).map_err(|e| self.decode(e))?;
        let held: i64 = row.try_get(3).map_err(|e| self.decode(e))?;
        Ok(Some(RecordView::new(
            owner,
            u64::try_from(fence).unwrap_or(0),
            Some(duration(left)),
            duration(held),
        )))
    }

    async fn watch_releases(&self, names: &KeyNames) -> Result<ReleaseWatch, LockError> {
        // Registered before the check, so a release announced once the listener is live
        // cannot slip between the two.
        let watch = self.hub().subscribe(names.channel());
        if self.listener.wait_live(self.shared.command_timeout).await {
            Ok(watch)
        } else {
            Err(BackendError::transient(format!(
                "cannot wait for `{}`: not listening for releases (PostgreSQL at `{}` \
                 unreachable); retrying",
                names.key(),
                self.shared.shown
            ))
            .into())
        }
    }

    async fn list(
        &self,
        namespace: &str,
        pattern: &str,
    ) -> Result<Vec<(String, RecordView)>, LockError> {
        self.list_records(namespace, pattern).await
    }

    async fn force_release(&self, names: &KeyNames, fence: u64) -> Result<bool, LockError> {
        self.force_release_record(names, fence).await
    }

    async fn append_run(
        &self,
        namespace: &str,
        job: &str,
        entry: &str,
        keep: &Retention,
    ) -> Result<(), LockError> {
        self.append_run_row(namespace, job, entry, keep).await
    }

    async fn runs(
        &self,
        namespace: &str,
        job: &str,
        limit: usize,
    ) -> Result<Vec<String>, LockError> {
        self.run_rows(namespace, job, limit).await
    }

    async fn journalled_jobs(&self, namespace: &str) -> Result<Vec<String>, LockError> {
        self.journal_jobs(namespace).await
    }
}

impl PostgresBackend {
    /// Renews each item with a statement of its own: an item whose row stays locked, or whose
    /// statement fails, answers [`Renewal::Unknown`] and costs the others nothing.
    async fn extend_one_by_one(&self, s: &Session, items: &[ExtendItem]) -> Vec<Renewal> {
        let mut answers = Vec::with_capacity(items.len());
        for item in items {
            let (key, token, ttl) = (
                vec![item.record.as_str()],
                vec![item.token.as_str()],
                vec![millis(item.ttl)],
            );
            let answer = s.client.query(&s.extend, &[&key, &token, &ttl]).await;
            answers.push(match answer {
                Ok(rows) => Renewal::from(!rows.is_empty()),
                Err(e) => Renewal::Unknown(self.shared.error("renewal failed", e).to_string()),
            });
        }
        answers
    }

    fn decode(&self, e: tokio_postgres::Error) -> LockError {
        self.shared.error("unexpected answer", e)
    }
}

/// Whole milliseconds, rounded up, as PostgreSQL's `bigint`.
fn millis(d: Duration) -> i64 {
    i64::try_from(millis_ceil(d)).unwrap_or(i64::MAX)
}

fn duration(ms: i64) -> Duration {
    Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}

/// A driver error as a [`BackendError`] with the password removed. Transient: no connection,
/// a connection that broke, the server shutting down or restarting, a statement cut off by
/// `statement_timeout`, a deadlock or serialization failure (both retryable by definition).
fn pg_error(context: &str, e: tokio_postgres::Error, secrets: &[String]) -> BackendError {
    let transient = match e.code() {
        None => true,
        Some(code) => [
            SqlState::QUERY_CANCELED,
            SqlState::LOCK_NOT_AVAILABLE,
            SqlState::ADMIN_SHUTDOWN,
            SqlState::CRASH_SHUTDOWN,
            SqlState::CANNOT_CONNECT_NOW,
            SqlState::T_R_SERIALIZATION_FAILURE,
            SqlState::T_R_DEADLOCK_DETECTED,
            SqlState::TOO_MANY_CONNECTIONS,
            SqlState::CONNECTION_FAILURE,
        ]
        .contains(code),
    };
    // A server's message ("password authentication failed ...") is clearer than the driver's
    // summary ("db error").
    let text = match e.as_db_error() {
        Some(db) => format!("{}: {}", db.code().code(), db.message()),
        // The driver's summary ("error performing TLS handshake") names no cause; its
        // sources do ("invalid peer certificate: UnknownIssuer").
        None => {
            let mut text = e.to_string();
            let mut source = std::error::Error::source(&e);
            while let Some(cause) = source {
                let said = cause.to_string();
                if !text.contains(&said) {
                    text = format!("{text}: {said}");
                }
                source = cause.source();
            }
            text
        }
    };
    let text = scrub(&text, secrets);
    let message = format!("{context}: {text}");
    if transient {
        BackendError::transient(message)
    } else {
        BackendError::new(message)
    }
}

/// Where a configuration connects, for messages: `postgres://user@host:port/dbname`, built
/// from the parsed parts, so no form of password (in the user part, a `password=` parameter,
/// quoted, spaced) can appear.
fn shown_config(config: &tokio_postgres::Config) -> String {
    let hosts: Vec<String> = config
        .get_hosts()
        .iter()
        .enumerate()
        .map(|(i, host)| {
            let host = match host {
                tokio_postgres::config::Host::Tcp(name) => name.clone(),
                tokio_postgres::config::Host::Unix(path) => path.display().to_string(),
            };
            match config.get_ports().get(i).or(config.get_ports().first()) {
                Some(port) => format!("{host}:{port}"),
                None => host,
            }
        })
        .collect();
    let user = config
        .get_user()
        .map(|u| format!("{u}@"))
        .unwrap_or_default();
    let db = config.get_dbname().unwrap_or("");
    format!("postgres://{user}{}/{db}", hosts.join(","))
}

/// Refuses a URL whose user part holds an `@` that is not percent-encoded: it would be read
/// as the end of the password, and the rest of the password shown as the host.
fn check_url(url: &str) -> Result<(), LockError> {
    if let Some(rest) = url
        .strip_prefix("postgres://")
        .or_else(|| url.strip_prefix("postgresql://"))
    {
        let authority = &rest[..rest.find(['/', '?']).unwrap_or(rest.len())];
        if authority.matches('@').count() > 1 {
            return Err(LockError::config(
                "the PostgreSQL URL has more than one `@` before the host: percent-encode an \
                 `@` in the user name or password as %40",
            ));
        }
    }
    Ok(())
}

/// A PostgreSQL connection string for messages: parsed and shown by its parts, or, when it
/// does not parse, nothing of it.
pub(crate) fn shown_url(url: &str) -> String {
    match tls::parse(url) {
        Some(config) => shown_config(&config),
        None => "<an unparsable PostgreSQL URL>".to_owned(),
    }
}

#[cfg(test)]
mod tests;
