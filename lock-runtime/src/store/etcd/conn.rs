//! The store's connection to etcd: the client, and the calls every operation makes through
//! it (sent again when the connection to a member could not be made, errors named and
//! scrubbed, leases granted, read and revoked).

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, PoisonError};
use std::time::Duration;

use etcd_client::{Client, Txn, TxnResponse};

use super::{EtcdOptions, error, lease_secs, unsent};
use crate::LockError;

/// How long past twice the ttl a cut-off acquire's leases are still revoked (elections).
const REVOKE_MARGIN: Duration = Duration::from_secs(10);

/// What every operation of the store needs; shared with the renewal tasks.
pub(super) struct Conn {
    pub(super) client: Client,
    pub(super) options: EtcdOptions,
    /// The endpoints as errors show them.
    pub(super) shown: String,
    /// Texts that must never appear in an error (the password).
    pub(super) secrets: Vec<String>,
    /// The shortest lease etcd grants, in seconds, as learned from a grant that came back
    /// longer than asked (etcd raises every ttl to its minimum, about 1.5 s rounded up); 0
    /// until then. A renewal uses it to tell a lease that cannot be shorter from one that
    /// outlives what the renewal asks.
    pub(super) min_lease_secs: AtomicI64,
    /// Renewals of one key run one at a time (keys share these by hash): a renewal decides
    /// between leaving a lease, keeping it alive and moving the key on what it read, and a
    /// concurrent one (the watchdog's and an `extend`) could act on a read the other made
    /// stale, moving the key onto a shorter lease after the other kept the old one alive
    /// and answered for it.
    pub(super) renewing: [tokio::sync::Mutex<()>; RENEWAL_STRIPES],
    /// The ttl each lease this store granted was granted (etcd never changes it), so a renewal
    /// of a lease granted for the asked ttl is one keep-alive, without reading the lease's
    /// time to live first. Bounded: emptied when full (renewals then read the ttl again).
    pub(super) granted: std::sync::Mutex<HashMap<i64, i64>>,
}

/// How many leases [`Conn::granted`] remembers.
const GRANTED_REMEMBERED: usize = 100_000;

/// How many locks the renewals of all keys share.
const RENEWAL_STRIPES: usize = 64;

impl Conn {
    pub(super) fn error(&self, context: &str, e: etcd_client::Error) -> LockError {
        error(&self.shown, &self.secrets, context, e)
    }

    /// Runs `call` on the client; again (up to twice per endpoint) while it fails without
    /// having been sent. The client spreads requests over the endpoints, and one whose member
    /// is down refuses the connection: such a request never reached etcd, so sending it again
    /// is safe for every call, and without it a third of the calls would fail while one
    /// member of three is down.
    pub(super) async fn send<T, F, Fut>(&self, call: F) -> Result<T, etcd_client::Error>
    where
        F: Fn(Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        let mut tries = 0;
        loop {
            match call(self.client.clone()).await {
                Err(e) if unsent(&e) && tries < 2 * self.options.endpoints.len() => {
                    tries += 1;
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                answer => return answer,
            }
        }
    }

    pub(super) async fn grant(&self, ttl: Duration, what: &str) -> Result<i64, LockError> {
        self.granted_lease(ttl, what).await.map(|(id, _)| id)
    }

    /// A lease for a lock's record (the acquire's, or one a renewal moves the key onto), as
    /// [`grant`](Self::grant), remembered with the ttl it was granted.
    pub(super) async fn grant_record(&self, ttl: Duration, what: &str) -> Result<i64, LockError> {
        let (id, secs) = self.granted_lease(ttl, what).await?;
        self.remember_granted(id, secs);
        Ok(id)
    }

    /// A new lease of `ttl` (whole seconds, rounded up), and the ttl etcd granted it.
    async fn granted_lease(&self, ttl: Duration, what: &str) -> Result<(i64, i64), LockError> {
        let secs = lease_secs(ttl);
        let granted = self
            .send(|mut c| async move { c.lease_grant(secs, None).await })
            .await
            .map_err(|e| self.error(&format!("{what}: lease grant failed"), e))?;
        if granted.ttl() > secs {
            self.min_lease_secs
                .fetch_max(granted.ttl(), Ordering::Relaxed);
        }
        Ok((granted.id(), granted.ttl()))
    }

    /// Remembers the ttl `lease` was granted (from its grant, or a read of its time to live).
    pub(super) fn remember_granted(&self, lease: i64, secs: i64) {
        let mut remembered = self.granted.lock().unwrap_or_else(PoisonError::into_inner);
        if remembered.len() >= GRANTED_REMEMBERED {
            remembered.clear();
        }
        remembered.insert(lease, secs);
    }

    /// The ttl `lease` was granted, when this store granted it and still remembers.
    pub(super) fn granted_secs(&self, lease: i64) -> Option<i64> {
        self.granted
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&lease)
            .copied()
    }

    fn forget_granted(&self, leases: &[i64]) {
        let mut remembered = self.granted.lock().unwrap_or_else(PoisonError::into_inner);
        for lease in leases {
            remembered.remove(lease);
        }
    }

    /// The lock the renewals of `record` take.
    pub(super) fn renewal_lock(&self, record: &str) -> &tokio::sync::Mutex<()> {
        use std::hash::{Hash, Hasher};
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        record.hash(&mut hasher);
        let i = usize::try_from(hasher.finish() % RENEWAL_STRIPES as u64).unwrap_or(0);
        &self.renewing[i]
    }

    /// The whole seconds a lease for `ttl` lasts once granted: `ttl` rounded up, at least
    /// etcd's minimum as far as it is known.
    pub(super) fn lease_secs_for(&self, ttl: Duration) -> i64 {
        lease_secs(ttl).max(self.min_lease_secs.load(Ordering::Relaxed))
    }

    /// Gives leases nobody uses back, in the background (they would expire by themselves).
    pub(super) fn revoke_later(&self, leases: Vec<i64>) {
        self.forget_granted(&leases);
        let mut client = self.client.clone();
        tokio::spawn(async move {
            for lease in leases {
                let _ = client.lease_revoke(lease).await;
            }
        });
    }

    /// Revokes `leases` one by one, each again every 200 ms until etcd confirms it is gone.
    /// Bounded: a lease outlives its ttl by the server's minimum lease ttl at most, and a new
    /// leader gives every lease its whole ttl again when it takes over (acquires are cut off
    /// mostly during elections, when revokes fail too), so twice the ttl and a margin for
    /// elections.
    pub(super) async fn revoke_until_gone(self: Arc<Self>, leases: Vec<i64>, ttl: Duration) {
        self.forget_granted(&leases);
        let give_up =
            tokio::time::Instant::now() + 2 * ttl.max(Duration::from_secs(2)) + REVOKE_MARGIN;
        for lease in leases {
            loop {
                let revoked = self
                    .send(|mut c| async move { c.lease_revoke(lease).await })
                    .await;
                match revoked {
                    Ok(_) => break,
                    Err(etcd_client::Error::GRpcStatus(s)) if s.code() == tonic::Code::NotFound => {
                        break;
                    }
                    Err(_) if tokio::time::Instant::now() < give_up => {
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                    Err(_) => return,
                }
            }
        }
    }

    /// The time left on `lease` (None: no lease, or unknown).
    pub(super) async fn remaining(&self, lease: i64) -> Option<Duration> {
        if lease == 0 {
            return None;
        }
        let answer = self
            .send(|mut c| async move { c.lease_time_to_live(lease, None).await })
            .await
            .ok()?;
        // Whole seconds, rounded down: up to a second more is left. A lease that is gone
        // (-1) has nothing left.
        match u64::try_from(answer.ttl()) {
            Ok(secs) => Some(Duration::from_secs(secs + 1)),
            Err(_) => Some(Duration::ZERO),
        }
    }

    pub(super) async fn txn(&self, txn: Txn, context: &str) -> Result<TxnResponse, LockError> {
        self.send(|mut c| {
            let txn = txn.clone();
            async move { c.txn(txn).await }
        })
        .await
        .map_err(|e| self.error(context, e))
    }
}
