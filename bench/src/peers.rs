//! The implementations compared, behind one enum: each does one uncontended acquire + release
//! pair, or waits for a held lock.

use std::time::Duration;

use anyhow::{Context, bail};
use lock_runtime::{LockRuntime, distributed_lock};
use redis::aio::ConnectionManager;

const TTL: Duration = Duration::from_secs(10);

/// The attribute's side of the macro-overhead row: the same pair as `Impl::Ours`.
#[distributed_lock(key = "{key}", ttl = "10s")]
async fn attribute_pair(key: &str) -> Option<()> {
    Some(())
}

/// Raw redis-rs: SET NX PX and a compare-and-delete script, over one multiplexed connection.
pub(crate) struct RawLock {
    conn: ConnectionManager,
    release: redis::Script,
}

impl RawLock {
    pub(crate) async fn connect(url: &str) -> anyhow::Result<Self> {
        let conn = redis::Client::open(url)?.get_connection_manager().await?;
        Ok(RawLock {
            conn,
            release: redis::Script::new(
                "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) else return 0 end",
            ),
        })
    }

    /// One SET NX PX; true when taken.
    pub(crate) async fn try_lock(&self, key: &str, token: &str) -> anyhow::Result<bool> {
        let mut conn = self.conn.clone();
        let reply: Option<String> = redis::cmd("SET")
            .arg(key)
            .arg(token)
            .arg("NX")
            .arg("PX")
            .arg(TTL.as_millis() as u64)
            .query_async(&mut conn)
            .await?;
        Ok(reply.is_some())
    }

    pub(crate) async fn unlock(&self, key: &str, token: &str) -> anyhow::Result<()> {
        let mut conn = self.conn.clone();
        let _: i64 = self
            .release
            .key(key)
            .arg(token)
            .invoke_async(&mut conn)
            .await?;
        Ok(())
    }
}

/// An rslock manager that tries once per `lock` call (its default retries three times with
/// up to 200 ms between tries), so a held key costs it one round trip, as it does the others.
pub(crate) fn rslock_once(url: &str) -> rslock::LockManager {
    let mut manager = rslock::LockManager::new(vec![url.to_owned()]);
    manager.set_retry(1, Duration::ZERO);
    manager
}

/// One implementation under test.
pub(crate) enum Impl {
    Ours(LockRuntime),
    OursAttribute,
    /// The attribute on a given runtime (through `scope`), for the macro-overhead row.
    OursAttributeScoped(LockRuntime),
    Raw(RawLock),
    Rslock(rslock::LockManager),
    AsyncRedisLock(async_redis_lock::Locker),
    /// A hand-written lock on a PostgreSQL table.
    PgHand(crate::pg::HandPg),
    /// A hand-written lock on etcd.
    EtcdHand(Box<crate::etcd::HandEtcd>),
    /// A hand-written lock on ZooKeeper (an ephemeral node).
    ZooKeeperHand(Box<crate::zookeeper::HandZooKeeper>),
}

impl Impl {
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Impl::Ours(_) => "ours (programmatic)",
            Impl::OursAttribute => "ours (attribute)",
            Impl::OursAttributeScoped(_) => "ours (attribute, scoped)",
            Impl::Raw(_) => "raw redis-rs (baseline)",
            Impl::Rslock(_) => "rslock 0.10",
            Impl::AsyncRedisLock(_) => "async-redis-lock 0.4",
            Impl::PgHand(_) => "hand-written INSERT .. ON CONFLICT + DELETE (baseline)",
            Impl::EtcdHand(_) => "hand-written lease + txn put + txn delete (baseline)",
            Impl::ZooKeeperHand(_) => "hand-written ephemeral node create + delete (baseline)",
        }
    }

    /// One try for `key` and, when it was free, its release: true when taken and released,
    /// false when another holder had it (no retry, no wait). For the shared-keys row.
    pub(crate) async fn try_pair(&self, key: &str) -> anyhow::Result<bool> {
        match self {
            Impl::Ours(runtime) => match runtime.lock(key).ttl(TTL).try_acquire().await? {
                Some(guard) => Ok(guard.release().await?),
                None => Ok(false),
            },
            Impl::Raw(raw) => {
                let token = uuid::Uuid::new_v4().simple().to_string();
                if !raw.try_lock(key, &token).await? {
                    return Ok(false);
                }
                raw.unlock(key, &token).await?;
                Ok(true)
            }
            // Built with one try and no retry delay (see `rslock_once`).
            Impl::Rslock(manager) => match manager.lock(key.as_bytes(), TTL).await {
                Ok(lock) => {
                    manager.unlock(&lock).await;
                    Ok(true)
                }
                Err(rslock::LockError::Unavailable) => Ok(false),
                Err(e) => bail!("rslock: {e:?}"),
            },
            other => bail!("{} is not in the shared-keys row", other.name()),
        }
    }

    /// One uncontended acquire + release of `key`.
    pub(crate) async fn pair(&self, key: &str) -> anyhow::Result<()> {
        match self {
            Impl::Ours(runtime) => {
                let guard = runtime
                    .lock(key)
                    .ttl(TTL)
                    .try_acquire()
                    .await?
                    .context("an uncontended key was held")?;
                guard.release().await?;
            }
            // Uses the installed global runtime, as a service would.
            Impl::OursAttribute => {
                attribute_pair(key)
                    .await
                    .context("an uncontended key was held")?;
            }
            Impl::OursAttributeScoped(runtime) => {
                runtime
                    .scope(attribute_pair(key))
                    .await
                    .context("an uncontended key was held")?;
            }
            Impl::Raw(raw) => {
                let token = uuid::Uuid::new_v4().simple().to_string();
                if !raw.try_lock(key, &token).await? {
                    bail!("an uncontended key was held");
                }
                raw.unlock(key, &token).await?;
            }
            Impl::Rslock(manager) => {
                let lock = manager
                    .lock(key.as_bytes(), TTL)
                    .await
                    .map_err(|e| anyhow::anyhow!("rslock: {e:?}"))?;
                manager.unlock(&lock).await;
            }
            Impl::AsyncRedisLock(locker) => {
                let options = async_redis_lock::Options::new().ttl(TTL);
                let lock = locker
                    .acquire_with_options(&options, key)
                    .await
                    .map_err(|e| anyhow::anyhow!("async-redis-lock: {e:?}"))?;
                lock.release()
                    .await
                    .map_err(|e| anyhow::anyhow!("async-redis-lock: {e:?}"))?;
            }
            Impl::PgHand(hand) => hand.pair(key).await?,
            Impl::EtcdHand(hand) => hand.pair(key).await?,
            Impl::ZooKeeperHand(hand) => hand.pair(key).await?,
        }
        Ok(())
    }
}
