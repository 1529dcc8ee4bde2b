//! The renewal's decision about the lease a key is on, apart from the calls that carry it out,
//! so the simulation can run the same rule against its model of etcd's whole-second leases.

use std::time::Duration;

/// What a renewal does with the lease a key is on, given what etcd said of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseStep {
    /// The lease, and so the key, is gone.
    Gone,
    /// The lease has more than the asked time left: nothing to do.
    LeaveAlone,
    /// Keep the lease alive (it returns to its granted ttl, which is the asked one).
    KeepAlive,
    /// Move the key onto a new lease of this ttl, and give the old one back.
    MoveTo(Duration),
}

/// A ttl in etcd's whole seconds: rounded up, at least 1.
pub fn lease_secs(ttl: Duration) -> i64 {
    let secs = ttl.as_millis().div_ceil(1000).max(1);
    i64::try_from(secs).unwrap_or(i64::MAX)
}

/// The step that makes a lease last at least `asked` from now without ever ending before it
/// could have ended anyway. `asked_secs` is `asked` in etcd's seconds (the server's minimum
/// lease ttl included); `ttl_left` and `granted` are what etcd's time-to-live read answered:
/// the time left rounded *down* to whole seconds (-1 when the lease is gone) and the ttl the
/// lease was granted.
///
/// The holder's validity was counted from the old lease, which may have up to a second more
/// than `ttl_left` says: a new lease gets the asked ttl or `ttl_left` plus that second,
/// whichever is longer, so a key never moves onto a lease that ends earlier.
pub fn lease_step(asked: Duration, asked_secs: i64, ttl_left: i64, granted: i64) -> LeaseStep {
    if ttl_left < 0 {
        return LeaseStep::Gone;
    }
    if ttl_left > asked_secs && granted >= asked_secs {
        // Long enough already. (Strictly more: only more than asked, in whole seconds rounded
        // down, proves at least the asked time is left. And granted at least the ask: a leader
        // not yet settled after an election answers "forever" for every lease, then gives each
        // its granted ttl again.)
        return LeaseStep::LeaveAlone;
    }
    if granted == asked_secs {
        return LeaseStep::KeepAlive;
    }
    let left_at_most = Duration::from_secs(u64::try_from(ttl_left).unwrap_or(0) + 1);
    LeaseStep::MoveTo(asked.max(left_at_most))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shorter_ask_never_moves_the_key_onto_an_earlier_end() {
        // Granted 10 s, 6.9 s really left (etcd says 6), asked 6 s: a 6 s lease would end
        // up to 0.9 s early.
        let step = lease_step(Duration::from_secs(6), 6, 6, 10);
        assert_eq!(step, LeaseStep::MoveTo(Duration::from_secs(7)));
    }

    #[test]
    fn the_common_cases() {
        let ask = Duration::from_secs(10);
        assert_eq!(lease_step(ask, 10, -1, 10), LeaseStep::Gone);
        assert_eq!(lease_step(ask, 10, 7, 10), LeaseStep::KeepAlive);
        assert_eq!(lease_step(ask, 10, 14, 20), LeaseStep::LeaveAlone);
        assert_eq!(
            lease_step(ask, 10, 10, 20),
            LeaseStep::MoveTo(Duration::from_secs(11))
        );
        assert_eq!(lease_step(ask, 10, 3, 5), LeaseStep::MoveTo(ask));
        assert_eq!(
            lease_step(Duration::from_millis(300), 1, 0, 1),
            LeaseStep::KeepAlive
        );
    }
}
