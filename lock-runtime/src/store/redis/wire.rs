//! The lean connection to one Redis server over plain TCP: the store's hot path (`SET NX PX`,
//! the release script) without redis-rs' multiplexer in between.
//!
//! Callers write their command straight into one shared outgoing buffer and queue a one-shot
//! slot for its reply; a writer task sends whatever has gathered in one write, and a reader
//! task parses the replies (`resp`) and hands each to the oldest waiting slot, as a server
//! answers one connection's commands in order. It behaves as the connection manager it
//! replaces where the store depends on it:
//!
//! - a request takes at most the command timeout, connecting included; one that gets no reply
//!   in that time fails, and the connection stays: its commands still run on the server in
//!   the order they were sent, so a retry or a give-back sent after a late acquire cannot
//!   overtake it;
//! - a connection that breaks fails every request queued on it, written or not (an I/O
//!   error: the store's callers may send once more, and count the first send as possibly
//!   carried out), and the next request connects again;
//! - requests that arrive while a connect is under way wait for it, and share its failure;
//! - a server that answered once is given the request's time to come back (a restart);
//!   one never reached fails at once, so a wrong address fails `build()` quickly.
//!
//! TLS (`rediss://`), Unix sockets and RESP3 stay with redis-rs' connection manager.

use std::collections::VecDeque;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use redis::{Cmd, ConnectionAddr, ConnectionInfo, Pipeline, ProtocolVersion, RedisError, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::{Notify, oneshot};
use tokio::task::AbortHandle;
use tokio::time::Instant;

use super::resp;

/// Where the connection goes and how it logs in.
#[derive(Clone)]
struct Target {
    host: String,
    port: u16,
    username: Option<String>,
    password: Option<String>,
    db: i64,
}

/// A cheap handle to the lean connection; clones share it.
#[derive(Clone)]
pub(crate) struct Wire {
    shared: Arc<Shared>,
}

struct Shared {
    target: Target,
    connect_timeout: Duration,
    command_timeout: Duration,
    live: Mutex<Option<Arc<Live>>>,
    /// Held while connecting; keeps the last failure, so the requests that waited for that
    /// attempt share it instead of each trying again.
    connecting: tokio::sync::Mutex<Option<Failure>>,
    /// How many connect attempts failed.
    failed: AtomicU64,
    /// Whether a connection was ever made.
    connected_once: AtomicBool,
}

/// A connect failure, kept to be handed to the requests that waited for the same attempt:
/// an I/O error stays one (transient), anything else (a refused login) keeps its kind.
enum Failure {
    Io(io::ErrorKind, String),
    Other(redis::ErrorKind, String),
}

impl Failure {
    fn of(e: &RedisError) -> Failure {
        if !e.is_io_error() {
            return Failure::Other(e.kind(), e.to_string());
        }
        let kind = if e.is_timeout() {
            io::ErrorKind::TimedOut
        } else if e.is_connection_refusal() {
            io::ErrorKind::ConnectionRefused
        } else {
            io::ErrorKind::ConnectionReset
        };
        Failure::Io(kind, e.to_string())
    }

    fn error(&self) -> RedisError {
        match self {
            Failure::Io(kind, text) => io::Error::new(*kind, text.clone()).into(),
            Failure::Other(kind, text) => {
                RedisError::from((*kind, "cannot connect to Redis", text.clone()))
            }
        }
    }
}

/// One TCP connection and its two tasks.
struct Live {
    out: Mutex<Outbox>,
    wake_writer: Notify,
    tasks: Mutex<Vec<AbortHandle>>,
}

struct Outbox {
    /// Commands written, not yet handed to the socket.
    buf: Vec<u8>,
    /// Who waits for the replies, oldest first.
    waiting: VecDeque<Waiter>,
    /// Set once the connection broke: nothing more goes onto it.
    broken: bool,
}

enum Waiter {
    One(oneshot::Sender<Result<Value, RedisError>>),
    /// A pipeline: `skip` replies to pass over, then `keep` to hand back together.
    Many {
        skip: usize,
        keep: usize,
        got: Vec<Value>,
        tx: oneshot::Sender<Result<Vec<Value>, RedisError>>,
    },
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

fn dropped(why: &str) -> RedisError {
    io::Error::new(io::ErrorKind::ConnectionReset, why.to_owned()).into()
}

impl Wire {
    /// A lean connection for `info` when it is plain TCP speaking RESP2; None otherwise (the
    /// caller keeps redis-rs' connection). It connects on its first request.
    pub(crate) fn for_info(
        info: &ConnectionInfo,
        connect_timeout: Duration,
        command_timeout: Duration,
    ) -> Option<Wire> {
        let ConnectionAddr::Tcp(host, port) = info.addr() else {
            return None;
        };
        let settings = info.redis_settings();
        if settings.protocol() != ProtocolVersion::RESP2 {
            return None;
        }
        Some(Wire {
            shared: Arc::new(Shared {
                target: Target {
                    // An IPv6 address is written in brackets in a URL, not in a socket address.
                    host: host
                        .strip_prefix('[')
                        .and_then(|h| h.strip_suffix(']'))
                        .unwrap_or(host)
                        .to_owned(),
                    port: *port,
                    username: settings.username().map(str::to_owned),
                    password: settings.password().map(str::to_owned),
                    db: settings.db(),
                },
                connect_timeout,
                command_timeout,
                live: Mutex::new(None),
                connecting: tokio::sync::Mutex::new(None),
                failed: AtomicU64::new(0),
                connected_once: AtomicBool::new(false),
            }),
        })
    }

    pub(crate) fn db(&self) -> i64 {
        self.shared.target.db
    }

    /// Sends one command, the one `write` appends to the outgoing buffer of the connection
    /// that takes it, and waits for its reply (a server error is a value, as redis-rs'
    /// connections give it).
    pub(crate) async fn request_with(
        &self,
        write: impl Fn(&mut Vec<u8>),
    ) -> Result<Value, RedisError> {
        let deadline = Instant::now() + self.shared.command_timeout;
        let (tx, rx) = oneshot::channel();
        let mut waiter = Some(Waiter::One(tx));
        self.send(write, &mut waiter, deadline).await?;
        self.reply(rx, deadline).await?
    }

    /// Sends a packed pipeline and waits for its `offset + count` replies, handing back the
    /// last `count`.
    pub(crate) async fn request_many(
        &self,
        pipeline: &Pipeline,
        offset: usize,
        count: usize,
    ) -> Result<Vec<Value>, RedisError> {
        if offset + count == 0 {
            return Ok(Vec::new());
        }
        let (tx, rx) = oneshot::channel();
        let mut waiter = Some(Waiter::Many {
            skip: offset,
            keep: count,
            got: Vec::with_capacity(count),
            tx,
        });
        let deadline = Instant::now() + self.shared.command_timeout;
        let packed = pipeline.get_packed_pipeline();
        self.send(|buf| buf.extend_from_slice(&packed), &mut waiter, deadline)
            .await?;
        self.reply(rx, deadline).await?
    }

    async fn reply<T>(
        &self,
        rx: oneshot::Receiver<Result<T, RedisError>>,
        deadline: Instant,
    ) -> Result<Result<T, RedisError>, RedisError> {
        match tokio::time::timeout_at(deadline, rx).await {
            Ok(Ok(result)) => Ok(result),
            Ok(Err(_)) => Err(dropped("the connection to Redis was closed")),
            Err(_) => Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "no reply from Redis within {:?}",
                    self.shared.command_timeout
                ),
            )
            .into()),
        }
    }

    /// Puts the command on a live connection, connecting first when there is none; a
    /// connection found broken before anything was written to it is replaced, once.
    async fn send(
        &self,
        write: impl Fn(&mut Vec<u8>),
        waiter: &mut Option<Waiter>,
        deadline: Instant,
    ) -> Result<(), RedisError> {
        for _ in 0..2 {
            let live = match self.current() {
                Some(live) => live,
                // Boxed: the connect path would otherwise set the size of every request's
                // future, which is moved whole on every call.
                None => Box::pin(self.connect_shared(deadline)).await?,
            };
            {
                let mut out = lock(&live.out);
                if !out.broken {
                    write(&mut out.buf);
                    out.waiting.extend(waiter.take());
                    drop(out);
                    live.wake_writer.notify_one();
                    return Ok(());
                }
            }
            self.forget(&live);
        }
        Err(dropped(
            "the connection to Redis broke as soon as it was made",
        ))
    }

    fn current(&self) -> Option<Arc<Live>> {
        lock(&self.shared.live).clone()
    }

    fn forget(&self, broken: &Arc<Live>) {
        let mut live = lock(&self.shared.live);
        if live.as_ref().is_some_and(|l| Arc::ptr_eq(l, broken)) {
            *live = None;
        }
    }

    /// A new connection, or the one another request just made; one connect at a time.
    async fn connect_shared(&self, deadline: Instant) -> Result<Arc<Live>, RedisError> {
        let seen = self.shared.failed.load(Ordering::Acquire);
        let mut last_failure = self.shared.connecting.lock().await;
        if let Some(live) = self.current() {
            return Ok(live);
        }
        if self.shared.failed.load(Ordering::Acquire) != seen {
            // The attempt this request waited for failed: its error, not another try.
            if let Some(failure) = &*last_failure {
                return Err(failure.error());
            }
        }
        // A server that answered once is given until the request's deadline to come back (a
        // restart, a failover moving an address), trying again 100 ms after a failure,
        // doubling to 1 s; one never reached fails at once.
        let mut pause = Duration::from_millis(100);
        loop {
            let result = self.connect_once(deadline).await;
            let again = self.shared.connected_once.load(Ordering::Acquire)
                && result.as_ref().is_err_and(|e| e.is_io_error())
                && Instant::now() + pause < deadline;
            match result {
                Ok(live) => {
                    self.shared.connected_once.store(true, Ordering::Release);
                    *lock(&self.shared.live) = Some(live.clone());
                    return Ok(live);
                }
                Err(_) if again => {
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_secs(1));
                }
                Err(e) => {
                    self.shared.failed.fetch_add(1, Ordering::AcqRel);
                    *last_failure = Some(Failure::of(&e));
                    return Err(e);
                }
            }
        }
    }

    /// One connect, bounded by the connect timeout and `deadline`.
    async fn connect_once(&self, deadline: Instant) -> Result<Arc<Live>, RedisError> {
        let target = &self.shared.target;
        let bound = self
            .shared
            .connect_timeout
            .min(deadline.saturating_duration_since(Instant::now()));
        match tokio::time::timeout(bound, connect(target)).await {
            Ok(result) => result,
            Err(_) => Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "cannot connect to {}:{} within {bound:?}",
                    target.host, target.port
                ),
            )
            .into()),
        }
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        if let Some(live) = lock(&self.live).take() {
            live.fail("the store was dropped");
        }
    }
}

/// Connects, logs in and selects the database, then starts the reader and writer tasks.
async fn connect(target: &Target) -> Result<Arc<Live>, RedisError> {
    let stream = TcpStream::connect((target.host.as_str(), target.port)).await?;
    let (mut rd, mut wr) = stream.into_split();
    let mut inbuf = Vec::with_capacity(16 * 1024);
    if let Some(password) = &target.password {
        let mut auth = redis::cmd("AUTH");
        if let Some(username) = &target.username {
            auth.arg(username);
        }
        auth.arg(password);
        handshake(&mut rd, &mut wr, &mut inbuf, &auth)
            .await
            .map_err(|e| {
                if e.is_io_error() {
                    return e;
                }
                RedisError::from((
                    redis::ErrorKind::AuthenticationFailed,
                    "Password authentication failed",
                    e.to_string(),
                ))
            })?;
    }
    if target.password.is_none() {
        // Something to answer, so a server (or a proxy) that closes at once is found here.
        handshake(&mut rd, &mut wr, &mut inbuf, &redis::cmd("PING")).await?;
    }
    if target.db != 0 {
        handshake(
            &mut rd,
            &mut wr,
            &mut inbuf,
            redis::cmd("SELECT").arg(target.db),
        )
        .await?;
    }
    let live = Arc::new(Live {
        out: Mutex::new(Outbox {
            buf: Vec::with_capacity(16 * 1024),
            waiting: VecDeque::new(),
            broken: false,
        }),
        wake_writer: Notify::new(),
        tasks: Mutex::new(Vec::new()),
    });
    let reader = tokio::spawn(read_replies(live.clone(), rd, inbuf));
    let writer = tokio::spawn(write_commands(live.clone(), wr));
    lock(&live.tasks).extend([reader.abort_handle(), writer.abort_handle()]);
    Ok(live)
}

/// One command of the login, its reply awaited before anything else is sent.
async fn handshake(
    rd: &mut OwnedReadHalf,
    wr: &mut OwnedWriteHalf,
    inbuf: &mut Vec<u8>,
    cmd: &Cmd,
) -> Result<(), RedisError> {
    wr.write_all(&cmd.get_packed_command()).await?;
    loop {
        if let Some((value, used)) = resp::parse(inbuf)? {
            inbuf.drain(..used);
            value.extract_error()?;
            return Ok(());
        }
        if rd.read_buf(inbuf).await? == 0 {
            return Err(dropped("Redis closed the connection while logging in"));
        }
    }
}

/// Breaks the connection when its task ends, however it ends: one stopped with its runtime
/// must not leave requests waiting on a connection nobody reads.
struct FailOnDrop(Arc<Live>);

impl Drop for FailOnDrop {
    fn drop(&mut self) {
        self.0.fail("the connection's task ended");
    }
}

async fn write_commands(live: Arc<Live>, mut wr: OwnedWriteHalf) {
    let _fail = FailOnDrop(live.clone());
    let mut sending = Vec::with_capacity(16 * 1024);
    loop {
        live.wake_writer.notified().await;
        // Tasks made ready by the same wake-up (replies just handed out) add their commands
        // first, so one write carries them all.
        tokio::task::yield_now().await;
        {
            let mut out = lock(&live.out);
            if out.broken {
                return;
            }
            std::mem::swap(&mut out.buf, &mut sending);
        }
        if sending.is_empty() {
            continue;
        }
        if let Err(e) = wr.write_all(&sending).await {
            live.fail(&format!("writing to Redis failed: {e}"));
            return;
        }
        sending.clear();
    }
}

async fn read_replies(live: Arc<Live>, mut rd: OwnedReadHalf, mut buf: Vec<u8>) {
    let _fail = FailOnDrop(live.clone());
    let why = loop {
        let mut start = 0;
        let mut replies = Vec::new();
        let parsed = loop {
            match resp::parse(&buf[start..]) {
                Ok(Some((value, used))) => {
                    start += used;
                    replies.push(value);
                }
                Ok(None) => break Ok(()),
                Err(e) => break Err(e),
            }
        };
        if !replies.is_empty() && !live.deliver(replies) {
            break "Redis sent a reply nobody asked for".to_owned();
        }
        if let Err(e) = parsed {
            break format!("cannot read Redis' reply: {e}");
        }
        buf.drain(..start);
        buf.reserve(4096);
        match rd.read_buf(&mut buf).await {
            Ok(0) => break "Redis closed the connection".to_owned(),
            Ok(_) => {}
            Err(e) => break format!("reading from Redis failed: {e}"),
        }
    };
    live.fail(&why);
}

impl Live {
    /// Hands replies to their waiters, oldest first; false for a reply nobody waits for.
    /// A waiter that gave up (its timeout) no longer listens: what it is handed is dropped.
    fn deliver(&self, replies: Vec<Value>) -> bool {
        let mut out = lock(&self.out);
        for value in replies {
            let complete = match out.waiting.front_mut() {
                None => return false,
                Some(Waiter::One(_)) => {
                    if let Some(Waiter::One(tx)) = out.waiting.pop_front() {
                        drop(tx.send(Ok(value)));
                    }
                    continue;
                }
                Some(Waiter::Many {
                    skip, keep, got, ..
                }) => {
                    if *skip > 0 {
                        *skip -= 1;
                    } else {
                        got.push(value);
                    }
                    *skip == 0 && got.len() >= *keep
                }
            };
            if complete && let Some(Waiter::Many { got, tx, .. }) = out.waiting.pop_front() {
                drop(tx.send(Ok(got)));
            }
        }
        true
    }

    /// Marks the connection broken, fails whoever waits on it, and stops its tasks.
    fn fail(&self, why: &str) {
        let waiting = {
            let mut out = lock(&self.out);
            out.broken = true;
            out.buf.clear();
            std::mem::take(&mut out.waiting)
        };
        for waiter in waiting {
            match waiter {
                Waiter::One(tx) => drop(tx.send(Err(dropped(why)))),
                Waiter::Many { tx, .. } => drop(tx.send(Err(dropped(why)))),
            }
        }
        self.wake_writer.notify_one();
        for task in lock(&self.tasks).drain(..) {
            task.abort();
        }
    }
}
