//! The ZooKeeper store (cargo feature `zookeeper`): one node per held lock, written by
//! ZooKeeper's own atomic operations, every time on the server's clock.
//!
//! - **Record**: `/distributed-locks/records/<name>`, a TTL node (ZooKeeper 3.5.3+, servers
//!   started with `-Dzookeeper.extendedTypesEnabled=true`) holding the token, the ttl, the
//!   expiry it must not fall below, min_hold and the owner ([`record`]), or `free`. Taken by a
//!   create where there is no node, else by a write at the version read of a node found free
//!   or expired. The store never deletes a record node: ZooKeeper numbers versions from 0
//!   again for a node made again, so only on a node that stays does "at the version read"
//!   mean "the record I read" (a deleting design let eight takeovers of one expired record
//!   all succeed). Not ephemeral: a lease's life is its ttl, chosen per lock, while a session
//!   is one per process and lives by heartbeats; a node tied to the session would outlive a
//!   stuck job's lease or vanish under a running one. The servers' own removal of idle
//!   nodes is the one delete left: their sweep deletes what it listed (nodes idle past
//!   [`RECORD_NODE_TTL`]) without looking again, refusing only nodes with children, so a node
//!   idle for more than [`PIN_AFTER_IDLE`] is pinned by a child of ours (a TTL node of
//!   [`PIN_TTL`]) before it is written at a version (`ready_to_write` in [`nodes`]; failed
//!   first with two holders in `an_idle_record_deleted_under_a_takeover_goes_to_one_holder`).
//! - **Expiry**: at `max(mtime + ttl, floor)` of the node, on the server's clock (its
//!   `mtime` is the leader's time at the write). An acquire that finds a record compares its
//!   expiry with the server's time: known to be later from the last write this store made
//!   (that write's `mtime` plus what has passed since it was sent), or read by a write of the
//!   clock node. A node unwritten for [`RECORD_NODE_TTL`] is removed by the server (the TTL
//!   node's own expiry): nothing stays per key.
//! - **Fence**: the zxid of the write that acquired (`mzxid`). zxids increase across the
//!   ensemble, leader changes included (the epoch is their high half), so no later holder
//!   gets a smaller one.
//! - **Renewal**: a write of the record at the version read, with the new ttl and the old
//!   expiry as its floor (a renewal never shortens a lease).
//! - **Release**: a write of `free` at the version read. **min_hold**: counted from the
//!   acquiring write's `mtime`; a release before it ends writes the record as released,
//!   expiring when min_hold ends.
//! - **once**: `/distributed-locks/done/<name>`, a TTL node of the retention, written in the
//!   same transaction as the release, which also writes the marker's end into the record's
//!   value (carried on by every later write): an acquire checks both, the record in the read
//!   its write is conditional on, so a marker written just before cannot be missed.
//! - **Waiting**: a persistent watch on the record of each lock waited for ([`watch`]).
//! - **Run history**: a sequential TTL node per run under a container per job ([`journal`]).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::OnceCell;
use zookeeper_client::{CreateMode, Error, MultiWriteError};

mod journal;
mod nodes;
mod record;
mod session;
mod watch;

use self::record::{RELEASED, Record, Value, done_value, node_name, record_of_node};
use self::session::{BASE, Session};
pub(crate) use self::session::{ZooKeeperOptions, checked_session_timeout};
use super::{
    AcquireOutcome, AcquireRequest, ExtendItem, KeyNames, LockStore, RecordView, ReleaseHub,
    ReleaseOutcome, ReleaseWatch, Renewal, Retention, Subscriber, key_matches, key_of_record,
};
use crate::LockError;

/// The longest lease (ttl, or an extend) this store grants.
pub(crate) const MAX_LEASE: Duration = Duration::from_secs(7 * 86_400);
/// How long a record's node outlives its last write before the server removes it: longer
/// than any lease it can carry, so only a record nobody holds any more is removed.
const RECORD_NODE_TTL: Duration = Duration::from_secs(8 * 86_400);
/// A record node idle longer than this is pinned before it is written at a version (see
/// `ZooKeeperBackend::ready_to_write`): the sweep lists a node only once it is idle for
/// [`RECORD_NODE_TTL`], 7 days more than this.
const PIN_AFTER_IDLE: Duration = Duration::from_secs(86_400);
/// How long a pin child lasts (a TTL node the servers remove after it, never the store): longer
/// than a pass of the servers' sweep takes (one that listed the node must reach it while the
/// pin is there), and than a call takes from its pin to its write.
const PIN_TTL: Duration = Duration::from_secs(7 * 86_400);
/// How many times a call starts again after the record changed under it.
const TRIES: usize = 5;

fn record_path(record: &str) -> String {
    format!("{BASE}/records/{}", node_name(record))
}

fn done_path(record: &str) -> String {
    format!("{BASE}/done/{}", node_name(record))
}

fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

fn duration_ms(ms: i64) -> Duration {
    Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}

fn fence_of(zxid: i64) -> u64 {
    u64::try_from(zxid).unwrap_or(0)
}

/// A store in ZooKeeper.
pub(crate) struct ZooKeeperBackend {
    session: Arc<Session>,
    hub: Arc<ReleaseHub>,
    subscriber: OnceCell<Subscriber>,
}

impl std::fmt::Debug for ZooKeeperBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ZooKeeperBackend")
            .field("connect", &self.session.shown)
            .finish_non_exhaustive()
    }
}

impl ZooKeeperBackend {
    /// Connects, creates the store's four fixed nodes where missing, and checks that the
    /// servers take TTL nodes and that this client may write.
    pub(crate) async fn connect(options: ZooKeeperOptions) -> Result<Self, LockError> {
        let session = Arc::new(Session::open(options).await?);
        let client = session.client();
        for path in [
            BASE.to_owned(),
            format!("{BASE}/records"),
            format!("{BASE}/done"),
            format!("{BASE}/clock"),
            format!("{BASE}/runs"),
        ] {
            match client
                .create(&path, b"", &session.create_options(CreateMode::Persistent))
                .await
            {
                Ok(_) | Err(Error::NodeExists) => {}
                Err(Error::NoAuth) => {
                    return Err(LockError::config(format!(
                        "ZooKeeper at `{}` does not let this client create `{path}`",
                        session.shown
                    )));
                }
                Err(e) => {
                    return Err(session.error(&format!("creating `{path}` failed"), e, &client));
                }
            }
        }
        let probe = format!("{BASE}/ttl-probe-{}", session.client().session_id().0);
        let ttl_node = session
            .create_options(CreateMode::Persistent)
            .with_ttl(Duration::from_secs(60));
        match client.create(&probe, b"", &ttl_node).await {
            Ok(_) | Err(Error::NodeExists) => {
                let _ = client.delete(&probe, None).await;
            }
            Err(Error::Unimplemented | Error::UnexpectedErrorCode(_) | Error::BadArguments(_)) => {
                return Err(LockError::config(format!(
                    "ZooKeeper at `{}` does not take TTL nodes, which the lock store needs: run \
                     ZooKeeper 3.5.3 or newer with -Dzookeeper.extendedTypesEnabled=true",
                    session.shown
                )));
            }
            Err(e) => return Err(session.error("creating a TTL node failed", e, &client)),
        }
        session.server_now().await?;
        Ok(ZooKeeperBackend {
            session,
            hub: Arc::new(ReleaseHub::default()),
            subscriber: OnceCell::new(),
        })
    }
}

impl LockStore for ZooKeeperBackend {
    async fn acquire(&self, request: AcquireRequest<'_>) -> Result<AcquireOutcome, LockError> {
        let AcquireRequest {
            names,
            token,
            owner,
            ttl,
            min_hold,
            once,
        } = request;
        if ttl > MAX_LEASE {
            return Err(LockError::config(format!(
                "a ZooKeeper lease lasts at most {MAX_LEASE:?}; `{}` asked for {ttl:?}",
                names.key()
            )));
        }
        let client = self.session.client();
        if once && let Some(pttl) = self.done_left(&client, names).await? {
            return Ok(AcquireOutcome::Done { pttl: Some(pttl) });
        }
        let path = record_path(names.record());
        let mut record = Record {
            token: token.to_owned(),
            ttl_ms: ms(ttl),
            floor_ms: 0,
            hold_ms: ms(min_hold),
            since_ms: None,
            fence: None,
            done_until_ms: 0,
            owner: owner.to_owned(),
        };
        let (mut synced, mut pinned) = (false, false);
        for _ in 0..TRIES {
            let version = match self.read(&client, &path).await? {
                None => None,
                Some(read) => {
                    if once
                        && read.value.done_until() > 0
                        && let Some(pttl) = self.left_until(read.value.done_until()).await?
                    {
                        return Ok(AcquireOutcome::Done { pttl: Some(pttl) });
                    }
                    if let Some(record) = read.of(token) {
                        // Ours already: an answer lost, and the same acquire sent again.
                        return Ok(AcquireOutcome::Acquired {
                            fence: fence_of(record.fence(read.stat.mzxid)),
                        });
                    }
                    if let Some(pttl) = self.live(&read).await? {
                        // The member this session reads from may not have applied a release
                        // yet: before answering "held", catch up with the leader once.
                        if !synced {
                            synced = true;
                            self.catch_up(&client, &path).await?;
                            continue;
                        }
                        return Ok(AcquireOutcome::Held { pttl: Some(pttl) });
                    }
                    if !self
                        .ready_to_write(&client, &path, &read, &mut pinned)
                        .await?
                    {
                        continue;
                    }
                    // The marker's end goes on with the record (see `Value`).
                    record.done_until_ms = read.value.done_until();
                    Some(read.stat.version)
                }
            };
            let Some(stat) = self.take(&client, &path, &record.encode(), version).await? else {
                continue; // someone else wrote it first: look again
            };
            return Ok(AcquireOutcome::Acquired {
                fence: fence_of(stat.mzxid),
            });
        }
        Ok(AcquireOutcome::Held { pttl: None })
    }

    async fn release(
        &self,
        names: &KeyNames,
        token: &str,
        done_retention: Option<Duration>,
    ) -> Result<ReleaseOutcome, LockError> {
        let client = self.session.client();
        let path = record_path(names.record());
        let done = done_path(names.record());
        let mut pinned = false;
        for _ in 0..TRIES {
            let read = self.read(&client, &path).await?;
            let ours = read.as_ref().and_then(|read| {
                let record = read.of(token)?;
                (!self.surely_expired(record, &read.stat)).then_some((record, &read.stat))
            });
            let mut writer = client.new_multi_writer();
            let mut outcome = ReleaseOutcome::NotOwner;
            let mut ops = 0;
            // When the marker ends (server time, at least `retention` from now), 0 for none.
            let mut done_until = 0;
            if let Some(retention) = done_retention {
                let now = match self.session.server_now_at_most() {
                    Some(now) => now,
                    None => self.session.server_now().await?,
                };
                done_until = now.saturating_add(ms(retention));
                // A fresh marker, so its node's own expiry is this retention's.
                let existing = client
                    .check_stat(&done)
                    .await
                    .map_err(|e| self.error(&format!("reading `{done}` failed"), e, &client))?;
                let options = self
                    .session
                    .create_options(CreateMode::Persistent)
                    .with_ttl(retention.max(Duration::from_millis(1)));
                // A child pins the new marker for PIN_TTL: a pass of the servers' sweep that
                // listed the old one (expired, at the same path) cannot delete the new one.
                let (pin_path, pin) = self.pin_of(&done);
                if let Some(stat) = existing {
                    // The old marker goes with its pins (a pin added meanwhile fails the
                    // transaction, which is tried again).
                    let pins = match client.list_children(&done).await {
                        Ok(pins) => pins,
                        Err(Error::NoNode) => continue,
                        Err(e) => {
                            return Err(self.error(
                                &format!("listing `{done}` failed"),
                                e,
                                &client,
                            ));
                        }
                    };
                    for old_pin in pins {
                        writer
                            .add_delete(&format!("{done}/{old_pin}"), None)
                            .map_err(|e| self.error("building a transaction failed", e, &client))?;
                    }
                    writer
                        .add_delete(&done, Some(stat.version))
                        .map_err(|e| self.error("building a transaction failed", e, &client))?;
                }
                writer
                    .add_create(&done, &done_value(ms(retention)), &options)
                    .and_then(|()| writer.add_create(&pin_path, b"", &pin))
                    .map_err(|e| self.error("building a transaction failed", e, &client))?;
                ops += 1;
            }
            // The record's new value: ours released (or kept for min_hold), or, for a marker
            // alone, the record as it is with the marker's end carried in.
            let value = match (&read, ours) {
                (_, Some((record, stat))) => {
                    let hold_until = record.hold_until(stat.mtime);
                    let done_until = done_until.max(record.done_until_ms);
                    if record.hold_ms > 0 && self.left_until(hold_until).await?.is_some() {
                        outcome = ReleaseOutcome::KeptForMinHold;
                        Some(
                            Record {
                                token: RELEASED.to_owned(),
                                ttl_ms: 0,
                                floor_ms: hold_until,
                                since_ms: Some(record.since(stat.mtime)),
                                fence: Some(record.fence(stat.mzxid)),
                                done_until_ms: done_until,
                                ..record.clone()
                            }
                            .encode(),
                        )
                    } else {
                        outcome = ReleaseOutcome::Released;
                        Some(Value::free(done_until))
                    }
                }
                (Some(read), None) if done_until > 0 => Some(match &read.value {
                    // Another holding's record: its expiry, fence and start stay as they are.
                    Value::Held(other) => Record {
                        ttl_ms: 0,
                        floor_ms: other.expiry(read.stat.mtime),
                        since_ms: Some(other.since(read.stat.mtime)),
                        fence: Some(other.fence(read.stat.mzxid)),
                        done_until_ms: done_until.max(other.done_until_ms),
                        ..other.clone()
                    }
                    .encode(),
                    Value::Free { done_until_ms } => Value::free(done_until.max(*done_until_ms)),
                }),
                (None, None) if done_until > 0 => {
                    let options = self
                        .session
                        .create_options(CreateMode::Persistent)
                        .with_ttl(RECORD_NODE_TTL);
                    writer
                        .add_create(&path, &Value::free(done_until), &options)
                        .map_err(|e| self.error("building a transaction failed", e, &client))?;
                    ops += 1;
                    None
                }
                _ => None,
            };
            if let (Some(value), Some(read)) = (value, &read) {
                if !self
                    .ready_to_write(&client, &path, read, &mut pinned)
                    .await?
                {
                    continue;
                }
                writer
                    .add_set_data(&path, &value, Some(read.stat.version))
                    .map_err(|e| self.error("building a transaction failed", e, &client))?;
                ops += 1;
            }
            if ops == 0 {
                return Ok(ReleaseOutcome::NotOwner);
            }
            match writer.commit().await {
                Ok(_) => {
                    if outcome != ReleaseOutcome::NotOwner {
                        self.hub.notify(names.channel());
                    }
                    return Ok(outcome);
                }
                Err(MultiWriteError::OperationFailed {
                    source: Error::BadVersion | Error::NoNode | Error::NodeExists | Error::NotEmpty,
                    ..
                }) => continue,
                Err(e) => {
                    return Err(self.error(
                        &format!("releasing `{path}` failed"),
                        e.into(),
                        &client,
                    ));
                }
            }
        }
        Err(
            crate::BackendError::transient(format!("`{path}` kept changing while it was released"))
                .into(),
        )
    }

    async fn extend(&self, items: &[ExtendItem]) -> Result<Vec<Renewal>, LockError> {
        if let Some(long) = items.iter().find(|item| item.ttl > MAX_LEASE) {
            return Err(LockError::config(format!(
                "a ZooKeeper lease lasts at most {MAX_LEASE:?}; an extend asked for {:?}",
                long.ttl
            )));
        }
        // One after another: renewals come at a third of a ttl, not on any hot path.
        let mut renewals = Vec::with_capacity(items.len());
        for item in items {
            renewals.push(self.renew(item).await);
        }
        Ok(renewals)
    }

    async fn inspect(&self, names: &KeyNames) -> Result<Option<RecordView>, LockError> {
        let client = self.session.client();
        let path = record_path(names.record());
        self.catch_up(&client, &path).await?;
        match self.read(&client, &path).await? {
            Some(read) => self.view(&read).await,
            None => Ok(None),
        }
    }

    async fn watch_releases(&self, names: &KeyNames) -> Result<ReleaseWatch, LockError> {
        let subscriber = self
            .subscriber
            .get_or_init(|| async { watch::subscriber(self.session.clone(), self.hub.clone()) })
            .await;
        subscriber.watch(names.channel()).await
    }

    async fn list(
        &self,
        namespace: &str,
        pattern: &str,
    ) -> Result<Vec<(String, RecordView)>, LockError> {
        let client = self.session.client();
        let dir = format!("{BASE}/records");
        self.catch_up(&client, &dir).await?;
        let names = client
            .list_children(&dir)
            .await
            .map_err(|e| self.error(&format!("listing `{dir}` failed"), e, &client))?;
        let mut found = Vec::new();
        for name in names {
            let Some(record) = record_of_node(&name) else {
                continue;
            };
            let Some(key) = key_of_record(namespace, &record) else {
                continue;
            };
            if !key_matches(pattern, &key) {
                continue;
            }
            let path = format!("{dir}/{name}");
            let read = match self.read(&client, &path).await {
                Ok(Some(read)) => read,
                Ok(None) => continue,
                // Someone else's node in our directory: not a lock of ours.
                Err(LockError::Config(_)) => continue,
                Err(e) => return Err(e),
            };
            if let Some(view) = self.view(&read).await? {
                found.push((key, view));
            }
        }
        Ok(found)
    }

    async fn append_run(
        &self,
        namespace: &str,
        job: &str,
        entry: &str,
        keep: &Retention,
    ) -> Result<(), LockError> {
        self.append_run_node(namespace, job, entry, keep).await
    }

    async fn runs(
        &self,
        namespace: &str,
        job: &str,
        limit: usize,
    ) -> Result<Vec<String>, LockError> {
        self.run_nodes(namespace, job, limit).await
    }

    async fn journalled_jobs(&self, namespace: &str) -> Result<Vec<String>, LockError> {
        self.journalled_job_nodes(namespace).await
    }

    async fn force_release(&self, names: &KeyNames, fence: u64) -> Result<bool, LockError> {
        let client = self.session.client();
        let path = record_path(names.record());
        self.catch_up(&client, &path).await?;
        let mut pinned = false;
        for _ in 0..TRIES {
            let Some(read) = self.read(&client, &path).await? else {
                return Ok(false);
            };
            let Some(record) = read.held() else {
                return Ok(false);
            };
            if fence_of(record.fence(read.stat.mzxid)) != fence || self.live(&read).await?.is_none()
            {
                return Ok(false);
            }
            if !self
                .ready_to_write(&client, &path, &read, &mut pinned)
                .await?
            {
                continue;
            }
            let free = Value::free(read.value.done_until());
            if self
                .write(&client, &path, &free, read.stat.version)
                .await?
                .is_some()
            {
                self.hub.notify(names.channel());
                return Ok(true);
            }
            // Written meanwhile (a renewal, or another holding): look again.
        }
        Err(crate::BackendError::transient(format!(
            "`{path}` kept changing while it was force-released"
        ))
        .into())
    }
}
