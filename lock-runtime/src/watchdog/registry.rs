//! The registry where a new lease waits until it first needs the watchdog's driver.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use crate::lease::LeaseState;

/// Leases registered and not yet taken over by the driver. A lease is only the driver's
/// business from its first event on (its first renewal, or the end of its validity), so it
/// waits here until then: a lock released before that (the common case for short jobs) is
/// added and removed under one mutex, and the driver never hears of it.
#[derive(Default)]
pub(crate) struct Pending {
    pub(super) leases: BTreeMap<u64, Arc<LeaseState>>,
    /// The earliest first event among `leases` the driver has been told of: its timer fires
    /// no later than this. None when nothing is waiting (or the driver took everything).
    pub(super) told: Option<Instant>,
    /// Set when the driver stops for good: no lease is taken any more.
    pub(super) closed: bool,
}

impl std::fmt::Debug for Pending {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pending")
            .field("leases", &self.leases.len())
            .field("told", &self.told)
            .field("closed", &self.closed)
            .finish()
    }
}

/// When a lease with a watchdog is first renewed: counted from the acquire's send, like the
/// validity, so an acquire that took long is renewed at once rather than after another third
/// of the ttl. None without a watchdog.
pub(super) fn first_renewal(lease: &LeaseState) -> Option<Instant> {
    lease
        .watchdog
        .then(|| lease.acquired_at + renew_interval(lease.ttl))
}

/// When `lease` first needs the driver: its first renewal, or the end of its validity.
pub(super) fn first_event(lease: &LeaseState) -> Instant {
    let valid_until = lease.valid_until();
    first_renewal(lease).map_or(valid_until, |renew| renew.min(valid_until))
}

pub(super) fn lock(pending: &Mutex<Pending>) -> MutexGuard<'_, Pending> {
    pending.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Renew at a third of the ttl: two more chances before the lease runs out.
pub(super) fn renew_interval(ttl: Duration) -> Duration {
    (ttl / 3).max(Duration::from_millis(1))
}
