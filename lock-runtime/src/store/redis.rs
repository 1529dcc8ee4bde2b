//! The Redis store: one multiplexed connection that reconnects by itself, four Lua scripts run
//! by SHA (reloaded on NOSCRIPT), and a lazily started subscriber connection for waiters.

use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{Client, IntoConnectionInfo, ProtocolVersion, PushKind, Script, Value};
use tokio::sync::{OnceCell, mpsc, oneshot};

use super::{
    AcquireOutcome, ExtendItem, KeyNames, RecordView, ReleaseHub, ReleaseOutcome, ReleaseWatch,
};
use crate::config::{millis_ceil, redact_url, url_secret};
use crate::{BackendError, LockError};

/// How the builder asked to connect.
#[derive(Debug, Clone)]
pub(crate) struct RedisOptions {
    pub(crate) url: String,
    pub(crate) connect_timeout: Duration,
    pub(crate) command_timeout: Duration,
}

/// A store on one Redis server (standalone, or the master a URL points at).
pub(crate) struct RedisBackend {
    conn: ConnectionManager,
    client: Client,
    options: RedisOptions,
    /// Texts that must never appear in an error: the URL's password, raw and decoded.
    secrets: Vec<String>,
    shown_url: String,
    scripts: Scripts,
    subscriber: OnceCell<Subscriber>,
    hub: Arc<ReleaseHub>,
}

impl std::fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisBackend")
            .field("url", &self.shown_url)
            .finish_non_exhaustive()
    }
}

struct Scripts {
    acquire: Script,
    release: Script,
    extend: Script,
    inspect: Script,
}

impl Scripts {
    fn new() -> Self {
        Scripts {
            acquire: Script::new(include_str!("lua/acquire.lua")),
            release: Script::new(include_str!("lua/release.lua")),
            extend: Script::new(include_str!("lua/extend.lua")),
            inspect: Script::new(include_str!("lua/inspect.lua")),
        }
    }
}

/// The shared subscription connection of one runtime (RESP3, pushes fed to the hub), owned by
/// its task; this is the way to talk to it.
struct Subscriber {
    commands: mpsc::UnboundedSender<SubscriberCommand>,
}

impl RedisBackend {
    /// Connects, checks the server answers and loads the scripts; bounded by the connect
    /// timeout so an unreachable server fails `build()` quickly.
    pub(crate) async fn connect(options: RedisOptions) -> Result<Self, LockError> {
        let shown_url = redact_url(&options.url);
        let mut secrets = Vec::new();
        if let Some(secret) = url_secret(&options.url) {
            let decoded = percent_decode(&secret);
            if decoded != secret {
                secrets.push(decoded);
            }
            secrets.push(secret);
        }
        let client = Client::open(options.url.as_str()).map_err(|e| {
            LockError::config(format!(
                "cannot use Redis URL `{shown_url}`: {}",
                scrub(&e.to_string(), &secrets)
            ))
        })?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(options.connect_timeout))
            .set_response_timeout(Some(options.command_timeout))
            .set_number_of_retries(3)
            .set_max_delay(Duration::from_secs(1));
        let connect = async {
            let mut conn = ConnectionManager::new_with_config(client.clone(), config).await?;
            redis::cmd("PING").query_async::<()>(&mut conn).await?;
            Ok::<_, redis::RedisError>(conn)
        };
        let conn = match tokio::time::timeout(options.connect_timeout, connect).await {
            Ok(Ok(conn)) => conn,
            Ok(Err(e)) => {
                return Err(BackendError::redis(
                    &format!("cannot connect to Redis at `{shown_url}`"),
                    e,
                    &secrets,
                )
                .into());
            }
            Err(_) => {
                return Err(BackendError::msg(format!(
                    "cannot connect to Redis at `{shown_url}`: no answer within {:?}",
                    options.connect_timeout
                ))
                .into());
            }
        };
        let backend = RedisBackend {
            conn,
            client,
            options,
            secrets,
            shown_url,
            scripts: Scripts::new(),
            subscriber: OnceCell::new(),
            hub: Arc::new(ReleaseHub::default()),
        };
        backend.load_scripts().await?;
        Ok(backend)
    }

    async fn load_scripts(&self) -> Result<(), LockError> {
        let mut conn = self.conn.clone();
        for script in [
            &self.scripts.acquire,
            &self.scripts.release,
            &self.scripts.extend,
            &self.scripts.inspect,
        ] {
            script
                .prepare_invoke()
                .load_async(&mut conn)
                .await
                .map_err(|e| self.error("cannot load the lock scripts", e))?;
        }
        Ok(())
    }

    fn error(&self, context: &str, e: redis::RedisError) -> LockError {
        BackendError::redis(
            &format!("{context} (Redis at `{}`)", self.shown_url),
            e,
            &self.secrets,
        )
        .into()
    }

    pub(crate) async fn acquire(
        &self,
        names: &KeyNames,
        token: &str,
        owner: &str,
        ttl: Duration,
        min_hold: Duration,
        once: bool,
    ) -> Result<AcquireOutcome, LockError> {
        let mut conn = self.conn.clone();
        let reply: Vec<Value> = self
            .scripts
            .acquire
            .key(&names.record)
            .key(&names.fence)
            .key(&names.done)
            .arg(token)
            .arg(owner)
            .arg(millis_ceil(ttl))
            .arg(millis_ceil(min_hold))
            .arg(if once { "1" } else { "0" })
            .invoke_async(&mut conn)
            .await
            .map_err(|e| self.error(&format!("acquire of `{}` failed", names.key), e))?;
        let bad = || {
            LockError::from(BackendError::msg(format!(
                "acquire of `{}` got an unexpected reply from Redis",
                names.key
            )))
        };
        match reply.as_slice() {
            [Value::Int(1), Value::Int(fence)] => Ok(AcquireOutcome::Acquired {
                fence: u64::try_from(*fence).map_err(|_| bad())?,
            }),
            [Value::Int(0), Value::Int(pttl)] => Ok(AcquireOutcome::Held { pttl: pttl_of(*pttl) }),
            [Value::Int(2), Value::Int(pttl)] => Ok(AcquireOutcome::Done { pttl: pttl_of(*pttl) }),
            [Value::Int(3), kind] => Err(BackendError::msg(format!(
                "Redis key `{}` holds a value of type `{}`, not a lock record; it was left untouched",
                names.record,
                value_text(kind)
            ))
            .into()),
            _ => Err(bad()),
        }
    }

    pub(crate) async fn release(
        &self,
        names: &KeyNames,
        token: &str,
        done_retention: Option<Duration>,
    ) -> Result<ReleaseOutcome, LockError> {
        let mut conn = self.conn.clone();
        let reply: i64 = self
            .scripts
            .release
            .key(&names.record)
            .key(&names.done)
            .arg(token)
            .arg(&names.channel)
            .arg(done_retention.map_or(0, millis_ceil))
            .invoke_async(&mut conn)
            .await
            .map_err(|e| self.error(&format!("release of `{}` failed", names.key), e))?;
        Ok(match reply {
            1 => ReleaseOutcome::Released,
            2 => ReleaseOutcome::KeptForMinHold,
            _ => ReleaseOutcome::NotOwner,
        })
    }

    pub(crate) async fn extend(&self, items: &[ExtendItem]) -> Result<Vec<bool>, LockError> {
        if items.is_empty() {
            return Ok(Vec::new());
        }
        let mut invocation = self.scripts.extend.prepare_invoke();
        for item in items {
            invocation
                .key(&item.record)
                .arg(&item.token)
                .arg(millis_ceil(item.ttl));
        }
        let mut conn = self.conn.clone();
        let reply: Vec<i64> = invocation
            .invoke_async(&mut conn)
            .await
            .map_err(|e| self.error("lease renewal failed", e))?;
        if reply.len() != items.len() {
            return Err(BackendError::msg(format!(
                "lease renewal answered {} results for {} leases",
                reply.len(),
                items.len()
            ))
            .into());
        }
        Ok(reply.into_iter().map(|r| r == 1).collect())
    }

    pub(crate) async fn inspect(&self, names: &KeyNames) -> Result<Option<RecordView>, LockError> {
        let mut conn = self.conn.clone();
        let reply: Vec<Value> = self
            .scripts
            .inspect
            .key(&names.record)
            .invoke_async(&mut conn)
            .await
            .map_err(|e| self.error(&format!("inspect of `{}` failed", names.key), e))?;
        match reply.as_slice() {
            [] => Ok(None),
            [tag, kind] if value_text(tag) == "foreign" => Err(BackendError::msg(format!(
                "Redis key `{}` holds a value of type `{}`, not a lock record",
                names.record,
                value_text(kind)
            ))
            .into()),
            [
                owner,
                Value::Int(fence),
                Value::Int(acquired),
                Value::Int(pttl),
                Value::Int(now),
            ] => Ok(Some(RecordView {
                owner: value_text(owner),
                fence: u64::try_from(*fence).unwrap_or(0),
                remaining: pttl_of(*pttl),
                held_for: Duration::from_millis(u64::try_from(now - acquired).unwrap_or(0)),
            })),
            _ => Err(BackendError::msg(format!(
                "inspect of `{}` got an unexpected reply from Redis",
                names.key
            ))
            .into()),
        }
    }

    pub(crate) async fn watch_releases(&self, names: &KeyNames) -> Result<ReleaseWatch, LockError> {
        let subscriber = self
            .subscriber
            .get_or_try_init(|| self.start_subscriber())
            .await?;
        let (notify, first) = self.hub.watch(&names.channel);
        let commands = subscriber.commands.clone();
        if first {
            let (ack_tx, ack_rx) = oneshot::channel();
            let sent = commands.send(SubscriberCommand::Subscribe(names.channel.clone(), ack_tx));
            let acked = match sent {
                Ok(()) => ack_rx.await.ok(),
                Err(_) => None,
            };
            match acked {
                Some(Ok(())) => {}
                Some(Err(e)) => {
                    return Err(self.error(&format!("cannot wait for `{}`", names.key), e));
                }
                None => {
                    return Err(BackendError::msg(format!(
                        "cannot wait for `{}`: the subscriber connection has stopped",
                        names.key
                    ))
                    .into());
                }
            }
        }
        let channel = names.channel.clone();
        let requeue_commands = commands.clone();
        let requeue_channel = channel.clone();
        Ok(ReleaseWatch::new(
            notify,
            Some(Box::new(move || {
                let _ = commands.send(SubscriberCommand::Unsubscribe(channel));
            })),
        )
        .with_requeue(Box::new(move || {
            let _ = requeue_commands.send(SubscriberCommand::Requeue(requeue_channel.clone()));
        })))
    }

    /// Opens the runtime's one subscription connection and the task that owns it: it turns
    /// pushes into wake-ups and performs every (un)subscription in order, so a waiter arriving
    /// as the last one leaves can never be unsubscribed by mistake. The task ends when the
    /// backend is dropped.
    async fn start_subscriber(&self) -> Result<Subscriber, LockError> {
        let info = self
            .client
            .get_connection_info()
            .clone()
            .into_connection_info()
            .map_err(|e| self.error("cannot set up the subscriber", e))?;
        let settings = info
            .redis_settings()
            .clone()
            .set_protocol(ProtocolVersion::RESP3);
        let client = Client::open(info.set_redis_settings(settings))
            .map_err(|e| self.error("cannot set up the subscriber", e))?;
        let (push_tx, mut push_rx) = mpsc::unbounded_channel();
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(self.options.connect_timeout))
            .set_response_timeout(Some(self.options.command_timeout))
            .set_push_sender(push_tx)
            .set_automatic_resubscription();
        let mut conn = ConnectionManager::new_with_config(client, config)
            .await
            .map_err(|e| self.error("cannot open the subscriber connection", e))?;
        let (commands, mut command_rx) = mpsc::unbounded_channel::<SubscriberCommand>();
        let hub = Arc::downgrade(&self.hub);
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    push = push_rx.recv() => {
                        let Some(push) = push else { break };
                        let Some(hub) = hub.upgrade() else { break };
                        match push.kind {
                            PushKind::Message => {
                                if let Some(channel) = push.data.first() {
                                    hub.notify(&value_text(channel));
                                }
                            }
                            // Releases published while we were disconnected are lost: let every
                            // waiter retry now instead of sleeping out the lease's ttl.
                            PushKind::Disconnection => hub.notify_all(),
                            _ => {}
                        }
                    }
                    command = command_rx.recv() => {
                        let Some(command) = command else { break };
                        let Some(hub) = hub.upgrade() else { break };
                        match command {
                            SubscriberCommand::Subscribe(channel, ack) => {
                                let _ = ack.send(conn.subscribe(&channel).await);
                            }
                            SubscriberCommand::Unsubscribe(channel) => {
                                // A waiter may have come back for it meanwhile.
                                if hub.forget_if_unwatched(&channel) {
                                    let _ = conn.unsubscribe(&channel).await;
                                }
                            }
                            SubscriberCommand::Requeue(channel) => {
                                // Redis delivers a message to subscribers in subscription order,
                                // so the first subscriber's waiters would always win the race
                                // for a released lock. Moving to the back after each win rotates
                                // the advantage between runtimes.
                                let _ = conn.unsubscribe(&channel).await;
                                let _ = conn.subscribe(&channel).await;
                                // A release published between the two was not heard: retry.
                                hub.notify(&channel);
                            }
                        }
                    }
                }
            }
        });
        Ok(Subscriber { commands })
    }
}

/// Work for the subscriber task.
enum SubscriberCommand {
    Subscribe(String, oneshot::Sender<redis::RedisResult<()>>),
    Unsubscribe(String),
    Requeue(String),
}

fn pttl_of(pttl: i64) -> Option<Duration> {
    u64::try_from(pttl).ok().map(Duration::from_millis)
}

fn value_text(v: &Value) -> String {
    match v {
        Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        Value::SimpleString(s) => s.clone(),
        Value::Okay => "OK".to_owned(),
        Value::Int(i) => i.to_string(),
        other => format!("{other:?}"),
    }
}

fn scrub(text: &str, secrets: &[String]) -> String {
    secrets
        .iter()
        .fold(text.to_owned(), |t, s| t.replace(s.as_str(), "***"))
}

fn percent_decode(s: &str) -> String {
    fn hex(b: u8) -> Option<u8> {
        (b as char).to_digit(16).and_then(|d| u8::try_from(d).ok())
    }
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && i + 2 < bytes.len()
            && let (Some(hi), Some(lo)) = (hex(bytes[i + 1]), hex(bytes[i + 2]))
        {
            out.push(hi * 16 + lo);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}
