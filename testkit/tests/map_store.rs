//! Writing a store: a complete lock store over a `tokio::sync::Mutex<HashMap>`, plugged in
//! through `LockStore` and proved by the whole conformance kit (docs/stores/writing-a-store.md
//! walks through it). A real store keeps the same shape: each method one atomic step
//! on the backing storage, times from the storage's clock, a fence counter that never goes
//! back, and a `ReleaseHub` (or the storage's own notifications) to wake waiters.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use lock_runtime::store::{
    AcquireOutcome, AcquireRequest, ExtendItem, KeyNames, LockStore, RecordView, ReleaseHub,
    ReleaseOutcome, ReleaseWatch, Renewal, key_matches, key_of_record,
};
use lock_runtime::{LockError, LockRuntime};
use tokio::sync::Mutex;
use tokio::time::Instant;

struct Record {
    /// `None` once released but kept for `min_hold`: no token matches it, not even the `""`
    /// the runtime releases with when it only writes a `once` marker.
    token: Option<String>,
    owner: String,
    fence: u64,
    acquired: Instant,
    min_hold_until: Instant,
    expires: Instant,
}

#[derive(Default)]
struct Tables {
    locks: HashMap<String, Record>,
    done_until: HashMap<String, Instant>,
    /// One counter for all locks: fences strictly increase per lock, and never repeat.
    fence: u64,
}

/// The store; clones share one map, as runtimes of several instances share one database.
#[derive(Clone, Default)]
struct MapStore {
    tables: Arc<Mutex<Tables>>,
    hub: Arc<ReleaseHub>,
}

impl LockStore for MapStore {
    async fn acquire(&self, req: AcquireRequest<'_>) -> Result<AcquireOutcome, LockError> {
        let mut t = self.tables.lock().await;
        // Read the clock once the tables are ours: the call acts at this instant.
        let now = Instant::now();
        // Nothing expired stays behind (keys with arguments in them would pile up). A sweep
        // per acquire is fine for an example; a real store expires rows in the storage.
        t.locks.retain(|_, r| r.expires > now);
        t.done_until.retain(|_, until| *until > now);
        let done = t
            .done_until
            .get(req.names.done())
            .filter(|&&until| until > now);
        if let (true, Some(&until)) = (req.once, done) {
            return Ok(AcquireOutcome::Done {
                pttl: Some(until - now),
            });
        }
        if let Some(held) = t.locks.get(req.names.record()).filter(|r| r.expires > now) {
            return Ok(AcquireOutcome::Held {
                pttl: Some(held.expires - now),
            });
        }
        t.fence += 1;
        let fence = t.fence;
        let record = Record {
            token: Some(req.token.to_owned()),
            owner: req.owner.to_owned(),
            fence,
            acquired: now,
            min_hold_until: now + req.min_hold,
            expires: now + req.ttl,
        };
        t.locks.insert(req.names.record().to_owned(), record);
        Ok(AcquireOutcome::Acquired { fence })
    }

    async fn release(
        &self,
        names: &KeyNames,
        token: &str,
        done_retention: Option<Duration>,
    ) -> Result<ReleaseOutcome, LockError> {
        let mut t = self.tables.lock().await;
        let now = Instant::now();
        if let Some(retention) = done_retention {
            t.done_until
                .insert(names.done().to_owned(), now + retention);
        }
        let Some(record) = t.locks.get_mut(names.record()) else {
            return Ok(ReleaseOutcome::NotOwner);
        };
        if record.token.as_deref() != Some(token) || record.expires <= now {
            return Ok(ReleaseOutcome::NotOwner);
        }
        if record.min_hold_until > now {
            // Kept until min_hold passes, under a value no token equals.
            record.expires = record.expires.min(record.min_hold_until);
            record.token = None;
            drop(t);
            // Waiters ask again and learn that the lock frees when min_hold ends.
            self.hub.notify(names.channel());
            return Ok(ReleaseOutcome::KeptForMinHold);
        }
        t.locks.remove(names.record());
        drop(t);
        self.hub.notify(names.channel());
        Ok(ReleaseOutcome::Released)
    }

    async fn extend(&self, items: &[ExtendItem]) -> Result<Vec<Renewal>, LockError> {
        let mut t = self.tables.lock().await;
        let now = Instant::now();
        let renewals = items
            .iter()
            .map(|item| match t.locks.get_mut(&item.record) {
                Some(r) if r.token.as_deref() == Some(item.token.as_str()) && r.expires > now => {
                    r.expires = r.expires.max(now + item.ttl);
                    Renewal::Renewed
                }
                _ => Renewal::NotOurs,
            });
        Ok(renewals.collect())
    }

    async fn inspect(&self, names: &KeyNames) -> Result<Option<RecordView>, LockError> {
        let t = self.tables.lock().await;
        let now = Instant::now();
        let live = t.locks.get(names.record()).filter(|r| r.expires > now);
        Ok(live
            .map(|r| RecordView::new(&r.owner, r.fence, Some(r.expires - now), now - r.acquired)))
    }

    async fn watch_releases(&self, names: &KeyNames) -> Result<ReleaseWatch, LockError> {
        Ok(self.hub.subscribe(names.channel()))
    }

    async fn list(
        &self,
        namespace: &str,
        pattern: &str,
    ) -> Result<Vec<(String, RecordView)>, LockError> {
        let t = self.tables.lock().await;
        let now = Instant::now();
        let live = t.locks.iter().filter(|(_, r)| r.expires > now);
        Ok(live
            .filter_map(|(record, r)| Some((key_of_record(namespace, record)?, r)))
            .filter(|(key, _)| key_matches(pattern, key))
            .map(|(key, r)| {
                let view =
                    RecordView::new(&r.owner, r.fence, Some(r.expires - now), now - r.acquired);
                (key, view)
            })
            .collect())
    }

    async fn force_release(&self, names: &KeyNames, fence: u64) -> Result<bool, LockError> {
        let removed = {
            let mut t = self.tables.lock().await;
            let now = Instant::now();
            let seen = t.locks.get(names.record());
            let ours = seen.is_some_and(|r| r.expires > now && r.fence == fence);
            ours && t.locks.remove(names.record()).is_some()
        };
        if removed {
            self.hub.notify(names.channel());
        }
        Ok(removed)
    }
}

/// What the kit needs: runtimes on one shared store, and a way to lose a record.
struct MapHarness(MapStore);

static INSTANCE: AtomicUsize = AtomicUsize::new(0);

/// The namespace of the harness's runtimes; `delete_record` must use the same.
const NAMESPACE: &str = "map-store-kit";

impl lock_testkit::Harness for MapHarness {
    async fn runtime(&self) -> LockRuntime {
        let instance = INSTANCE.fetch_add(1, Ordering::Relaxed);
        LockRuntime::builder()
            .owner(format!("map-instance-{instance}"))
            .namespace(NAMESPACE)
            .store(self.0.clone())
            .build()
            .await
            .expect("a runtime on the map store")
    }

    async fn delete_record(&self, key: &str) {
        let names = KeyNames::new(NAMESPACE, key);
        self.0.tables.lock().await.locks.remove(names.record());
    }

    /// The example store leaves the run journal to the trait's default: declined.
    fn keeps_history(&self) -> bool {
        false
    }
}

lock_testkit::conformance_suite!(map_store, MapHarness(MapStore::default()));
