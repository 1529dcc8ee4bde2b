//! What the store does with one lock's nodes: read them, judge their expiry on the server's
//! clock, take a record, pin an idle one before writing it at a version, renew it, show it.

use std::time::Duration;

use tokio::time::Instant;
use zookeeper_client::{Client, CreateMode, CreateOptions, Error, Stat};

use super::record::{Record, Value, done_expiry};
use super::{
    PIN_AFTER_IDLE, PIN_TTL, RECORD_NODE_TTL, TRIES, ZooKeeperBackend, done_path, duration_ms,
    fence_of, ms, record_path,
};
use crate::LockError;
use crate::store::{ExtendItem, KeyNames, RecordView, Renewal};

/// A lock's record node as read: its value and its stat.
pub(super) struct Read {
    pub(super) value: Value,
    pub(super) stat: Stat,
}

impl Read {
    /// The holder's record, when there is one.
    pub(super) fn held(&self) -> Option<&Record> {
        match &self.value {
            Value::Held(record) => Some(record),
            Value::Free { .. } => None,
        }
    }

    /// The record, when `token` holds it.
    pub(super) fn of(&self, token: &str) -> Option<&Record> {
        self.held().filter(|r| r.token == token)
    }
}

impl ZooKeeperBackend {
    pub(super) fn error(&self, what: &str, e: Error, client: &Client) -> LockError {
        self.session.error(what, e, client)
    }

    /// Catches this session's member up with the leader (`sync`): a read after it sees every
    /// write another session made before it, as an operator's view of a lock (`inspect`,
    /// `list`, `force_release`) must. A session always sees its own writes without it.
    pub(super) async fn catch_up(&self, client: &Client, path: &str) -> Result<(), LockError> {
        client
            .sync(path)
            .await
            .map_err(|e| self.error(&format!("syncing `{path}` failed"), e, client))
    }

    /// The record node at `path`; None when there is none. A value this store did not write
    /// is an error, and nothing is touched.
    pub(super) async fn read(
        &self,
        client: &Client,
        path: &str,
    ) -> Result<Option<Read>, LockError> {
        match client.get_data(path).await {
            Ok((value, stat)) => match Value::decode(&value) {
                Some(value) => Ok(Some(Read { value, stat })),
                None => Err(LockError::config(format!(
                    "ZooKeeper node `{path}` holds something that is no lock record; it was left untouched"
                ))),
            },
            Err(Error::NoNode) => Ok(None),
            Err(e) => Err(self.error(&format!("reading `{path}` failed"), e, client)),
        }
    }

    /// How long until `expiry` (server time), or None once it has passed: from the last
    /// write's reading when that settles it, else by reading the server's clock.
    pub(super) async fn left_until(&self, expiry: i64) -> Result<Option<Duration>, LockError> {
        if let Some(latest) = self.session.server_now_at_most()
            && expiry > latest
        {
            return Ok(Some(duration_ms(expiry - latest)));
        }
        let now = self.session.server_now().await?;
        Ok((expiry > now).then(|| duration_ms(expiry - now)))
    }

    /// The time left of the record read, None when nobody holds it (free, or expired).
    pub(super) async fn live(&self, read: &Read) -> Result<Option<Duration>, LockError> {
        match read.held() {
            Some(record) => self.left_until(record.expiry(read.stat.mtime)).await,
            None => Ok(None),
        }
    }

    /// True when the record read has certainly expired, by the last write's reading alone.
    pub(super) fn surely_expired(&self, record: &Record, stat: &Stat) -> bool {
        self.session
            .server_now_at_least()
            .is_some_and(|now| record.expiry(stat.mtime) <= now)
    }

    /// The done marker's time left, None when there is none (or it has ended).
    pub(super) async fn done_left(
        &self,
        client: &Client,
        names: &KeyNames,
    ) -> Result<Option<Duration>, LockError> {
        let path = done_path(names.record());
        let expiry = match client.get_data(&path).await {
            Ok((value, stat)) => done_expiry(&value, stat.mtime),
            Err(Error::NoNode) => return Ok(None),
            Err(e) => return Err(self.error(&format!("reading `{path}` failed"), e, client)),
        };
        match expiry {
            Some(expiry) => self.left_until(expiry).await,
            None => Err(LockError::config(format!(
                "ZooKeeper node `{path}` holds something that is no done marker; it was left untouched"
            ))),
        }
    }

    /// Writes `value` at `path` at `version`: the node's stat after the write, or None when
    /// the node was not as expected (changed or gone meanwhile).
    pub(super) async fn write(
        &self,
        client: &Client,
        path: &str,
        value: &[u8],
        version: i32,
    ) -> Result<Option<Stat>, LockError> {
        let sent = Instant::now();
        match client.set_data(path, value, Some(version)).await {
            Ok(stat) => {
                self.session.note_time(stat.mtime, sent);
                Ok(Some(stat))
            }
            Err(Error::BadVersion | Error::NoNode) => Ok(None),
            Err(e) => Err(self.error(&format!("writing `{path}` failed"), e, client)),
        }
    }

    /// The acquiring write: our record at `path`, created where there is no node (`version`
    /// None), else written at `version` (after [`ready_to_write`](Self::ready_to_write)). The
    /// node's stat after the write, or None when someone else wrote first.
    pub(super) async fn take(
        &self,
        client: &Client,
        path: &str,
        value: &[u8],
        version: Option<i32>,
    ) -> Result<Option<Stat>, LockError> {
        if let Some(version) = version {
            return self.write(client, path, value, version).await;
        }
        let record_node = self
            .session
            .create_options(CreateMode::Persistent)
            .with_ttl(RECORD_NODE_TTL);
        let sent = Instant::now();
        match client.create(path, value, &record_node).await {
            Ok((stat, _)) if !stat.is_invalid() => {
                self.session.note_time(stat.mtime, sent);
                Ok(Some(stat))
            }
            Ok(_) => Err(LockError::config(format!(
                "ZooKeeper at `{}` answered a create without its stat: the lock store needs \
                 ZooKeeper 3.5.3 or newer",
                self.session.shown
            ))),
            Err(Error::NodeExists) => Ok(None),
            Err(e) => Err(self.error(&format!("creating `{path}` failed"), e, client)),
        }
    }

    /// Whether a write at the version of `read` may go now (true), or the node must be read
    /// again first (false). The servers' sweep of TTL nodes lists the nodes idle past their
    /// ttl, then deletes each without looking at it again (it refuses only a node with
    /// children), and a node made again numbers its versions from 0 again: a write "at the
    /// version read" of a node that may be on that list could land on a node made again
    /// since, another holder's. So a node idle for more than [`PIN_AFTER_IDLE`] is first
    /// pinned by a child of ours (a TTL node of [`PIN_TTL`], longer than any sweep's pass
    /// takes): from then on the node at `path` is the one pinned, and a read after the pin (on
    /// this session, which sees its own writes) is one to write at. A node idle for less
    /// cannot be on the list until 7 days later (it is listed only past
    /// [`RECORD_NODE_TTL`]), and the write follows its read within one call, a few round
    /// trips, each answered on a live session or failed with it. `pinned` says this call
    /// pinned `path` already.
    pub(super) async fn ready_to_write(
        &self,
        client: &Client,
        path: &str,
        read: &Read,
        pinned: &mut bool,
    ) -> Result<bool, LockError> {
        if *pinned {
            return Ok(true);
        }
        let now = match self.session.server_now_at_most() {
            Some(now) => now,
            None => {
                self.session.server_now().await?;
                self.session.server_now_at_most().unwrap_or(i64::MAX)
            }
        };
        if now.saturating_sub(read.stat.mtime) <= ms(PIN_AFTER_IDLE) {
            return Ok(true);
        }
        let (pin, options) = self.pin_of(path);
        match client.create(&pin, b"", &options).await {
            Ok(_) => *pinned = true,
            // Gone meanwhile: read again, and make it anew.
            Err(Error::NoNode) => {}
            Err(e) => return Err(self.error(&format!("pinning `{path}` failed"), e, client)),
        }
        Ok(false)
    }

    /// A new pin child of `node` (`p-<id>`, a TTL node of [`PIN_TTL`]) and how to create it:
    /// while it is there, the servers' sweep cannot delete `node`.
    pub(super) fn pin_of(&self, node: &str) -> (String, CreateOptions<'static>) {
        let options = self
            .session
            .create_options(CreateMode::Persistent)
            .with_ttl(PIN_TTL);
        (
            format!("{node}/p-{}", uuid::Uuid::new_v4().simple()),
            options,
        )
    }

    pub(super) async fn renew(&self, item: &ExtendItem) -> Renewal {
        let client = self.session.client();
        let path = record_path(&item.record);
        let mut pinned = false;
        for _ in 0..TRIES {
            let read = match self.read(&client, &path).await {
                Ok(Some(read)) => read,
                Ok(None) | Err(LockError::Config(_)) => return Renewal::NotOurs,
                Err(e) => return Renewal::Unknown(e.to_string()),
            };
            let Some(record) = read.of(&item.token) else {
                return Renewal::NotOurs;
            };
            if self.surely_expired(record, &read.stat) {
                // Another acquire may take it over at any moment.
                return Renewal::NotOurs;
            }
            match self
                .ready_to_write(&client, &path, &read, &mut pinned)
                .await
            {
                Ok(true) => {}
                Ok(false) => continue,
                Err(e) => return Renewal::Unknown(e.to_string()),
            }
            let renewed = Record {
                ttl_ms: ms(item.ttl),
                floor_ms: record.expiry(read.stat.mtime),
                since_ms: Some(record.since(read.stat.mtime)),
                fence: Some(record.fence(read.stat.mzxid)),
                ..record.clone()
            };
            match self
                .write(&client, &path, &renewed.encode(), read.stat.version)
                .await
            {
                Ok(Some(_)) => return Renewal::Renewed,
                Ok(None) => continue, // written meanwhile: read again
                Err(e) => return Renewal::Unknown(e.to_string()),
            }
        }
        Renewal::Unknown(format!("`{path}` kept changing while it was renewed"))
    }

    pub(super) async fn view(&self, read: &Read) -> Result<Option<RecordView>, LockError> {
        let (Some(record), Some(remaining)) = (read.held(), self.live(read).await?) else {
            return Ok(None);
        };
        let now = self.session.server_now_at_most().unwrap_or(read.stat.mtime);
        Ok(Some(RecordView::new(
            record.owner.clone(),
            fence_of(record.fence(read.stat.mzxid)),
            Some(remaining),
            duration_ms(now - record.since(read.stat.mtime)),
        )))
    }
}
