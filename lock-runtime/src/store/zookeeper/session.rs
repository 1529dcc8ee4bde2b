//! The ZooKeeper session of a store: one client, replaced when its session expires; the
//! store's paths; what the server's clock reads; and errors as the runtime wants them.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;
use zookeeper_client::{Acls, Client, CreateMode, CreateOptions, Error};

use crate::{BackendError, LockError};

/// Where the store keeps its nodes, under the connect string's chroot: `records/<name>` (one
/// per held lock), `done/<name>` (`once` markers) and `clock` (a node whose writes tell the
/// server's time). These four nodes stay; every node under them goes by itself.
pub(super) const BASE: &str = "/distributed-locks";
/// How long a ZooKeeper session lives without a heartbeat unless the store is told otherwise
/// (the servers clamp it to their tickTime x 2..20 by default). Leases do not depend on it:
/// nothing this store writes is ephemeral. When one expires, what this store knew of the
/// server's clock is dropped with it (see [`Session::renew`]).
const SESSION_TIMEOUT: Duration = Duration::from_secs(30);
/// The longest session timeout the store asks for (ZooKeeper counts it in i32 milliseconds).
const MAX_SESSION_TIMEOUT: Duration = Duration::from_secs(86_400);

/// The session timeout to ask for: `asked`, or the default; zero or over a day is refused.
pub(crate) fn checked_session_timeout(asked: Option<Duration>) -> Result<Duration, LockError> {
    let timeout = asked.unwrap_or(SESSION_TIMEOUT);
    if timeout.is_zero() || timeout > MAX_SESSION_TIMEOUT {
        return Err(LockError::config(format!(
            "the ZooKeeper session_timeout of {timeout:?} is outside 1 ms..1 day"
        )));
    }
    Ok(timeout)
}

/// How the builder asked to connect (no `Debug`: it holds the password).
#[derive(Clone)]
pub(crate) struct ZooKeeperOptions {
    /// `host:port,host:port[/chroot]`.
    pub(crate) connect: String,
    /// Digest authentication: `user:password` (never printed).
    pub(crate) digest: Option<String>,
    pub(crate) connect_timeout: Duration,
    /// What the client asks the servers for as its session timeout.
    pub(crate) session_timeout: Duration,
}

/// The latest write this store made whose answer carried the server's time: what the
/// server's clock read (`mtime`, ms since the epoch), and when it was sent and answered here.
#[derive(Debug, Clone, Copy)]
struct Reading {
    server_ms: i64,
    sent: Instant,
    answered: Instant,
}

pub(super) struct Session {
    pub(super) options: ZooKeeperOptions,
    /// The connect string without a password, for errors.
    pub(super) shown: String,
    client: Mutex<Client>,
    /// Serialises the replacement of an expired session.
    renewing: tokio::sync::Mutex<()>,
    reading: Mutex<Option<Reading>>,
}

/// Acls of every node this store creates: with digest authentication, its user's alone
/// (every runtime and lockctl given the same user may act on them); without, open, like the
/// client's default.
pub(super) fn create_options(mode: CreateMode, authenticated: bool) -> CreateOptions<'static> {
    if authenticated {
        mode.with_acls(Acls::creator_all())
    } else {
        mode.with_acls(Acls::anyone_all())
    }
}

impl Session {
    pub(super) async fn open(options: ZooKeeperOptions) -> Result<Session, LockError> {
        let shown = options.connect.clone();
        let client = connect(&options, &shown).await?;
        Ok(Session {
            options,
            shown,
            client: Mutex::new(client),
            renewing: tokio::sync::Mutex::new(()),
            reading: Mutex::new(None),
        })
    }

    /// How this store creates a node of `mode` (see [`create_options`]).
    pub(super) fn create_options(&self, mode: CreateMode) -> CreateOptions<'static> {
        create_options(mode, self.options.digest.is_some())
    }

    /// The current client (a cheap clone sharing its session).
    pub(super) fn client(&self) -> Client {
        self.client
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// After `failed` (a client this session gave out) reported its session gone: a new
    /// session, unless another caller made one already.
    pub(super) async fn renew(&self, failed: &Client) -> Result<(), LockError> {
        let _one_at_a_time = self.renewing.lock().await;
        if self.client().session_id() != failed.session_id() {
            return Ok(());
        }
        let client = connect(&self.options, &self.shown).await?;
        // A new session may be served by a member behind the one the old session saw: catch
        // up before anything is read through it.
        client
            .sync(BASE)
            .await
            .map_err(|e| error("syncing a new session failed", &self.shown, e))?;
        // The old session expired because this process went unheard for its timeout (paused,
        // suspended, cut off): the local clock may not have counted all of that time (a
        // suspended machine's monotonic clock stops), so the server time read before it is
        // no base to count from any more.
        *self.reading.lock().unwrap_or_else(PoisonError::into_inner) = None;
        *self.client.lock().unwrap_or_else(PoisonError::into_inner) = client;
        tracing::warn!(connect = %self.shown, "ZooKeeper session expired; a new one was opened");
        Ok(())
    }

    /// Notes the server time a write answered with (`mtime` of the node it wrote).
    pub(super) fn note_time(&self, server_ms: i64, sent: Instant) {
        let reading = Reading {
            server_ms,
            sent,
            answered: Instant::now(),
        };
        let mut latest = self.reading.lock().unwrap_or_else(PoisonError::into_inner);
        if latest.is_none_or(|l| l.sent <= sent) {
            *latest = Some(reading);
        }
    }

    /// The latest time the server's clock can read now, from the latest write (None before
    /// any): its `mtime` plus what has passed here since it was sent, plus 1% for clocks that
    /// run at different rates.
    pub(super) fn server_now_at_most(&self) -> Option<i64> {
        let r = (*self.reading.lock().unwrap_or_else(PoisonError::into_inner))?;
        let passed = Instant::now().saturating_duration_since(r.sent);
        Some(r.server_ms + ms(passed + passed / 100) + 1)
    }

    /// The earliest time the server's clock can read now (None before any write): the latest
    /// `mtime` plus what has passed here since its answer, less 1%.
    pub(super) fn server_now_at_least(&self) -> Option<i64> {
        let r = (*self.reading.lock().unwrap_or_else(PoisonError::into_inner))?;
        let passed = Instant::now().saturating_duration_since(r.answered);
        Some(r.server_ms + ms(passed - passed / 100))
    }

    /// Reads the server's clock by a write of the clock node: its `mtime` is the server's time
    /// when the write was applied, which is no later than now.
    pub(super) async fn server_now(self: &Arc<Self>) -> Result<i64, LockError> {
        let client = self.client();
        let sent = Instant::now();
        let stat = client
            .set_data(&format!("{BASE}/clock"), b"", None)
            .await
            .map_err(|e| self.error("reading the server's clock failed", e, &client))?;
        self.note_time(stat.mtime, sent);
        Ok(stat.mtime)
    }

    /// A ZooKeeper error as a lock error, without the password: transient when a retry may
    /// cure it. An expired session is replaced in the background (the caller retries).
    pub(super) fn error(self: &Arc<Self>, what: &str, e: Error, client: &Client) -> LockError {
        if matches!(e, Error::SessionExpired | Error::ClientClosed) {
            let (session, failed) = (self.clone(), client.clone());
            if let Ok(handle) = tokio::runtime::Handle::try_current() {
                handle.spawn(async move {
                    if let Err(e) = session.renew(&failed).await {
                        tracing::warn!(error = %e, "could not open a new ZooKeeper session yet");
                    }
                });
            }
        }
        error(what, &self.shown, e)
    }
}

/// A ZooKeeper error as a lock error (transient when a retry may cure it).
pub(super) fn error(what: &str, shown: &str, e: Error) -> LockError {
    let transient = matches!(
        e,
        // ZooKeeper's operation timeout, and a reconfiguration in progress.
        Error::UnexpectedErrorCode(-7 | -13 | -14)
            | Error::ConnectionLoss
            | Error::Timeout
            | Error::NoHosts
            | Error::SessionExpired
            | Error::SessionMoved
            | Error::Throttled
            | Error::ClientClosed
            | Error::NotReadOnly
    );
    let message = format!("{what} (ZooKeeper at `{shown}`): {e}");
    if transient {
        BackendError::transient(message).into()
    } else {
        BackendError::new(message).into()
    }
}

fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

async fn connect(options: &ZooKeeperOptions, shown: &str) -> Result<Client, LockError> {
    let mut connector = Client::connector()
        .with_session_timeout(options.session_timeout)
        .with_connection_timeout(options.connect_timeout);
    if let Some(digest) = &options.digest {
        connector = connector.with_auth("digest", digest.as_bytes());
    }
    let connecting = async {
        let client = connector.clone().connect(&options.connect).await?;
        // A chroot that does not exist yet is made, from the ensemble's root.
        if let Some(at) = options.connect.find('/')
            && client.check_stat("/").await?.is_none()
        {
            let root = connector.connect(&options.connect[..at]).await?;
            let acls = create_options(CreateMode::Persistent, options.digest.is_some());
            root.mkdir(&options.connect[at..], &acls).await?;
        }
        Ok(client)
    };
    match tokio::time::timeout(options.connect_timeout, connecting).await {
        Ok(Ok(client)) => Ok(client),
        Ok(Err(Error::BadArguments(why))) => Err(LockError::config(format!(
            "`{shown}` is no ZooKeeper connect string (host:port,host:port[/chroot]): {why}"
        ))),
        Ok(Err(Error::AuthFailed)) => Err(LockError::config(format!(
            "ZooKeeper at `{shown}` refused the credentials"
        ))),
        Ok(Err(e)) => Err(error("cannot connect", shown, e)),
        Err(_) => Err(BackendError::transient(format!(
            "cannot connect to ZooKeeper at `{shown}`: no session within {:?}",
            options.connect_timeout
        ))
        .into()),
    }
}
