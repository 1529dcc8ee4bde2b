//! Renewal: keep-alive of the lease a lock's key is attached to, then a read that confirms the
//! key still carries the token on that lease, so a key deleted between the two is never
//! reported renewed. Leases are renewed concurrently, each under the runtime's bound on the
//! whole call, so many held locks do not add up to one long call.

use std::sync::Arc;

use etcd_client::{Compare, CompareOp, KeyValue, Txn, TxnOp};
use tokio::task::JoinSet;

use super::conn::Conn;
use super::{MAX_TXN_OPS, gets, parse_value, put};
use crate::store::{ExtendItem, Renewal};
use crate::{BackendError, LockError};

/// Renewals in flight at once.
const CONCURRENT: usize = 32;

/// One answer per item, in order.
pub(super) async fn extend(conn: &Arc<Conn>, items: &[ExtendItem]) -> Vec<Renewal> {
    let context = "lease renewal failed";
    let mut renewed = Vec::with_capacity(items.len());
    for chunk in items.chunks(MAX_TXN_OPS) {
        let ops: Vec<TxnOp> = chunk
            .iter()
            .map(|item| TxnOp::get(item.record.as_str(), None))
            .collect();
        let read = match conn.txn(Txn::new().and_then(ops), context).await {
            Ok(answer) => gets(&answer),
            Err(e) => {
                // This chunk is unknown; the others still answer for themselves.
                let why = e.to_string();
                renewed.extend(chunk.iter().map(|_| Renewal::Unknown(why.clone())));
                continue;
            }
        };
        let mut answers = vec![Renewal::NotOurs; chunk.len()];
        let mut tasks = JoinSet::new();
        for (i, (item, kv)) in chunk.iter().zip(read).enumerate() {
            let Some(kv) = kv.filter(|kv| ours(kv, &item.token)) else {
                continue;
            };
            if tasks.len() >= CONCURRENT
                && let Some(Ok((j, answer))) = tasks.join_next().await
            {
                answers[j] = answer;
            }
            // Unknown until its task answers: a task that panicked or was aborted says nothing
            // about the lease.
            answers[i] = Renewal::Unknown("the renewal did not finish".to_owned());
            let (conn, item) = (conn.clone(), item.clone());
            tasks.spawn(async move { (i, renew(&conn, &item, kv).await) });
        }
        while let Some(joined) = tasks.join_next().await {
            if let Ok((j, answer)) = joined {
                answers[j] = answer;
            }
        }
        renewed.extend(answers);
    }
    renewed
}

fn ours(kv: &KeyValue, token: &str) -> bool {
    parse_value(kv.value()).is_some_and(|v| v.0 == token) && kv.lease() != 0
}

/// Renews one lease. When the confirming read fails because the key moved to another lease
/// that still carries the token (a concurrent `extend` with a longer ttl moved it), that
/// lease is renewed instead: the lock is still ours.
async fn renew(conn: &Conn, item: &ExtendItem, mut kv: KeyValue) -> Renewal {
    let _one_at_a_time = conn.renewal_lock(&item.record).lock().await;
    for _ in 0..3 {
        match renew_on(conn, item, &kv).await {
            Ok(true) => return Renewal::Renewed,
            Ok(false) => {}
            Err(e) => return Renewal::Unknown(e.to_string()),
        }
        let record = item.record.as_str();
        let fresh = conn
            .send(|mut c| async move { c.get(record, None).await })
            .await;
        match fresh {
            Ok(answer) => match answer.kvs().first() {
                Some(now) if ours(now, &item.token) && now.lease() != kv.lease() => {
                    kv = now.clone();
                }
                _ => return Renewal::NotOurs,
            },
            Err(e) => return Renewal::Unknown(conn.error("lease renewal failed", e).to_string()),
        }
    }
    // Still ours, but moved on every look: say nothing rather than "lost".
    Renewal::Unknown("the key kept moving to other leases".to_owned())
}

/// Makes `kv`'s lease last at least the asked ttl from now, never shortening it (as on every
/// store), then the confirming read; true when the key carries the token on that lease.
/// A keep-alive renews a lease to the ttl it was granted, which may be longer than asked (a
/// longer `extend` before, while the watchdog's last renewal asks only for what is left of
/// max_hold): so the lease's time to live is read first, and
/// - a lease with more than the asked time left is left alone;
/// - one granted the asked ttl is kept alive;
/// - otherwise the key moves onto a new lease of the asked ttl, which lasts longer than
///   what is left of the old one.
async fn renew_on(conn: &Conn, item: &ExtendItem, kv: &KeyValue) -> Result<bool, LockError> {
    let context = "lease renewal failed";
    let mut lease = kv.lease();
    let asked = conn.lease_secs_for(item.ttl);
    let now = conn
        .send(|mut c| async move { c.lease_time_to_live(lease, None).await })
        .await
        .map_err(|e| conn.error(context, e))?;
    // -1: the lease, and so the key, is gone. (0 is less than a second left: the time to live
    // is rounded down.)
    if now.ttl() < 0 {
        return Ok(false);
    }
    let record = item.record.as_str();
    if now.ttl() > asked && now.granted_ttl() >= asked {
        // Long enough already. (Strictly more: the time to live comes in whole seconds, and
        // only more than asked proves at least the asked time is left. And granted at least
        // the ask: a leader not yet settled after an election answers "forever" for every
        // lease, then gives each its granted ttl again.)
    } else if now.granted_ttl() == asked {
        let (mut keeper, mut answers) = conn
            .send(|mut c| async move { c.lease_keep_alive(lease).await })
            .await
            .map_err(|e| conn.error(context, e))?;
        keeper
            .keep_alive()
            .await
            .map_err(|e| conn.error(context, e))?;
        let renewed = match answers
            .message()
            .await
            .map_err(|e| conn.error(context, e))?
        {
            Some(answer) => answer.ttl(),
            None => return Err(BackendError::transient(format!("{context}: no answer")).into()),
        };
        if renewed <= 0 {
            return Ok(false);
        }
    } else {
        // Move the key onto a new lease of the asked ttl, and give the old one back.
        let moved_to = conn.grant(item.ttl, context).await?;
        let moved = conn
            .txn(
                Txn::new()
                    .when(held(record, kv.value(), lease))
                    .and_then([put(record, kv.value(), moved_to)]),
                context,
            )
            .await?;
        if !moved.succeeded() {
            conn.revoke_later(vec![moved_to]);
            return Ok(false);
        }
        conn.revoke_later(vec![lease]);
        lease = moved_to;
    }
    let confirmed = conn
        .txn(Txn::new().when(held(record, kv.value(), lease)), context)
        .await?;
    Ok(confirmed.succeeded())
}

/// The comparisons true while `record` holds exactly `value` on `lease`.
fn held(record: &str, value: &[u8], lease: i64) -> [Compare; 2] {
    [
        Compare::value(record, CompareOp::Equal, value),
        Compare::lease(record, CompareOp::Equal, lease),
    ]
}
