//! Renewal: keep-alive of the lease a lock's key is attached to, then a read that confirms the
//! key still carries the token on that lease, so a key deleted between the two is never
//! reported renewed.
//!
//! A batch is read and confirmed a chunk of keys per transaction, and each lease costs one
//! keep-alive (plus, when the lease was not granted for the asked ttl, a read of its time to
//! live); leases are renewed concurrently, and a batch answers what it renewed within the
//! command timeout, so many held locks never add up to one call that fails whole.

use std::collections::HashMap;
use std::sync::Arc;

use etcd_client::{Compare, CompareOp, KeyValue, Txn, TxnOp};
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::conn::Conn;
use super::step::{LeaseStep, lease_step};
use super::{MAX_TXN_OPS, gets, parse_value, put};
use crate::LockError;
use crate::store::{ExtendItem, Renewal};

/// Keep-alives in flight at once, over all chunks.
const CONCURRENT: usize = 64;

/// Chunks of a batch in flight at once.
const CHUNKS_AT_ONCE: usize = 4;

/// One answer per item, in order. A batch too large to renew within the command timeout (many
/// leases, a slow link) answers what it could: the call returns at three quarters of the
/// command timeout, before the runtime's bound on the whole call would throw every answer
/// away, and the leases not answered by then read `Unknown` (the watchdog tries them again
/// soon) instead of the whole batch failing, which would lose every lease in it.
pub(super) async fn extend(conn: &Arc<Conn>, items: &[ExtendItem]) -> Vec<Renewal> {
    let started = Instant::now();
    let deadline = started + conn.options.command_timeout * 3 / 4;
    // A chunk stops waiting for its slowest keep-alives here and confirms those that finished,
    // so one slow key cannot make its whole chunk unknown.
    let confirm_by = started + conn.options.command_timeout / 2;
    let mut answers =
        vec![
            Renewal::Unknown("the renewal was not answered within the command timeout".to_owned());
            items.len()
        ];
    let _ =
        tokio::time::timeout_at(deadline, renew_all(conn, items, confirm_by, &mut answers)).await;
    answers
}

/// Fills `answers` chunk by chunk as the chunks finish, a few chunks at once.
async fn renew_all(
    conn: &Arc<Conn>,
    items: &[ExtendItem],
    confirm_by: Instant,
    answers: &mut [Renewal],
) {
    let keep_alives = Arc::new(tokio::sync::Semaphore::new(CONCURRENT));
    let mut chunks = JoinSet::new();
    for (chunk_no, chunk) in items.chunks(MAX_TXN_OPS).enumerate() {
        while chunks.len() >= CHUNKS_AT_ONCE {
            if let Some(Ok((first, renewed))) = chunks.join_next().await {
                fill(answers, first, renewed);
            }
        }
        let (conn, chunk, keep_alives) = (conn.clone(), chunk.to_vec(), keep_alives.clone());
        chunks.spawn(async move {
            let first = chunk_no * MAX_TXN_OPS;
            (
                first,
                renew_chunk(&conn, &chunk, &keep_alives, confirm_by).await,
            )
        });
    }
    while let Some(joined) = chunks.join_next().await {
        if let Ok((first, renewed)) = joined {
            fill(answers, first, renewed);
        }
    }
}

fn fill(answers: &mut [Renewal], first: usize, renewed: Vec<Renewal>) {
    for (answer, renewed) in answers[first..].iter_mut().zip(renewed) {
        *answer = renewed;
    }
}

/// What renewing one key's lease came to, before the confirming read.
enum Step {
    /// The key was found on this lease, which now lasts at least the asked ttl.
    Confirm(i64),
    /// Decided without the confirming read.
    Answer(Renewal),
}

/// One chunk: one read of its keys, the keep-alives of those still ours, one confirming read.
async fn renew_chunk(
    conn: &Arc<Conn>,
    chunk: &[ExtendItem],
    keep_alives: &Arc<tokio::sync::Semaphore>,
    confirm_by: Instant,
) -> Vec<Renewal> {
    let context = "lease renewal failed";
    let read = match conn.txn(read_all(chunk), context).await {
        Ok(answer) => gets(&answer),
        Err(e) => {
            let why = e.to_string();
            return chunk
                .iter()
                .map(|_| Renewal::Unknown(why.clone()))
                .collect();
        }
    };
    let mut steps: Vec<Step> = Vec::with_capacity(chunk.len());
    let mut tasks = JoinSet::new();
    for (i, (item, kv)) in chunk.iter().zip(read).enumerate() {
        let Some(kv) = kv.filter(|kv| ours(kv, &item.token)) else {
            steps.push(Step::Answer(Renewal::NotOurs));
            continue;
        };
        // Unknown until its task answers: a task that panicked or was aborted says nothing
        // about the lease.
        steps.push(Step::Answer(Renewal::Unknown(
            "the renewal did not finish".to_owned(),
        )));
        let (conn, item, keep_alives) = (conn.clone(), item.clone(), keep_alives.clone());
        tasks.spawn(async move {
            let Ok(permit) = keep_alives.acquire_owned().await else {
                return (
                    i,
                    Step::Answer(Renewal::Unknown("shutting down".to_owned())),
                );
            };
            // Detached: a renewal cut off by the deadline still finishes (each of its calls is
            // bounded by the command timeout) while holding its key's renewal lock. Cut off
            // mid-move, its move could otherwise land after a later renewal had read the key
            // and answered for the old lease, leaving the key on a shorter one.
            let renewal = tokio::spawn(async move {
                let step = renew(&conn, &item, kv).await;
                drop(permit);
                step
            });
            let step = renewal.await.unwrap_or_else(|_| {
                Step::Answer(Renewal::Unknown("the renewal did not finish".to_owned()))
            });
            (i, step)
        });
    }
    let finished = async {
        while let Some(joined) = tasks.join_next().await {
            if let Ok((i, step)) = joined {
                steps[i] = step;
            }
        }
    };
    let _ = tokio::time::timeout_at(confirm_by, finished).await;
    // Confirm every lease renewed above in one read, made after all their keep-alives.
    let to_confirm: Vec<usize> = steps
        .iter()
        .enumerate()
        .filter_map(|(i, s)| matches!(s, Step::Confirm(_)).then_some(i))
        .collect();
    let mut confirmed: HashMap<usize, Option<KeyValue>> = HashMap::new();
    if !to_confirm.is_empty() {
        let items: Vec<ExtendItem> = to_confirm.iter().map(|&i| chunk[i].clone()).collect();
        match conn.txn(read_all(&items), context).await {
            Ok(answer) => {
                confirmed.extend(to_confirm.iter().copied().zip(gets(&answer)));
            }
            Err(e) => {
                let why = e.to_string();
                for &i in &to_confirm {
                    steps[i] = Step::Answer(Renewal::Unknown(why.clone()));
                }
            }
        }
    }
    steps
        .into_iter()
        .enumerate()
        .map(|(i, step)| match step {
            Step::Answer(answer) => answer,
            Step::Confirm(lease) => match confirmed.remove(&i) {
                Some(Some(kv)) if ours(&kv, &chunk[i].token) && kv.lease() == lease => {
                    Renewal::Renewed
                }
                // Moved to another lease of ours meanwhile: the next renewal follows it.
                Some(Some(kv)) if ours(&kv, &chunk[i].token) => {
                    Renewal::Unknown("the key moved to another lease meanwhile".to_owned())
                }
                Some(_) => Renewal::NotOurs,
                // No answer for it: etcd answers every read, so this says nothing.
                None => Renewal::Unknown("the confirming read did not answer for it".to_owned()),
            },
        })
        .collect()
}

/// One transaction reading every item's key.
fn read_all(items: &[ExtendItem]) -> Txn {
    let ops: Vec<TxnOp> = items
        .iter()
        .map(|item| TxnOp::get(item.record.as_str(), None))
        .collect();
    Txn::new().and_then(ops)
}

fn ours(kv: &KeyValue, token: &str) -> bool {
    parse_value(kv.value()).is_some_and(|v| v.0 == token) && kv.lease() != 0
}

/// Renews one key's lease. When the lease turns out to be gone because the key moved to
/// another lease that still carries the token (a concurrent `extend` with a longer ttl moved
/// it), that lease is renewed instead: the lock is still ours.
async fn renew(conn: &Conn, item: &ExtendItem, mut kv: KeyValue) -> Step {
    let _one_at_a_time = conn.renewal_lock(&item.record).lock().await;
    for _ in 0..3 {
        match renew_on(conn, item, &kv).await {
            Ok(Some(lease)) => return Step::Confirm(lease),
            Ok(None) => {}
            Err(e) => return Step::Answer(Renewal::Unknown(e.to_string())),
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
                // Still ours on the same lease, which etcd says is gone (expired, its revoke
                // not applied yet): not a word that it is someone else's.
                Some(now) if ours(now, &item.token) => {
                    return Step::Answer(Renewal::Unknown(
                        "the key's lease is gone but the key is still there".to_owned(),
                    ));
                }
                _ => return Step::Answer(Renewal::NotOurs),
            },
            Err(e) => {
                return Step::Answer(Renewal::Unknown(
                    conn.error("lease renewal failed", e).to_string(),
                ));
            }
        }
    }
    // Still ours, but moved on every look: say nothing rather than "lost".
    Step::Answer(Renewal::Unknown(
        "the key kept moving to other leases".to_owned(),
    ))
}

/// Makes `kv`'s lease last at least the asked ttl from now, never shortening it (as on every
/// store); the lease the key is then on, to be confirmed, or None when the lease is gone.
/// A keep-alive renews a lease to the ttl it was granted, which may be longer than asked (a
/// longer `extend` before, while the watchdog's last renewal asks only for what is left of
/// max_hold):
/// - a lease this store granted for the asked ttl is kept alive (the common case: one call);
/// - otherwise its time to live is read first, and a lease with more than the asked time
///   left is left alone; one granted the asked ttl is kept alive;
/// - otherwise the key moves onto a new lease of the asked ttl (or, when etcd's whole seconds
///   cannot prove that ends after the old one, of what is left of the old one at most, rounded
///   up), so no key ever ends before the validity its holder was told.
async fn renew_on(conn: &Conn, item: &ExtendItem, kv: &KeyValue) -> Result<Option<i64>, LockError> {
    let context = "lease renewal failed";
    let lease = kv.lease();
    let asked = conn.lease_secs_for(item.ttl);
    if conn.granted_secs(lease) == Some(asked) {
        return keep_alive(conn, lease).await;
    }
    let now = conn
        .send(|mut c| async move { c.lease_time_to_live(lease, None).await })
        .await
        .map_err(|e| conn.error(context, e))?;
    if now.ttl() >= 0 && now.ttl() <= now.granted_ttl() {
        // (Not an answer of a leader mid-election, whose time to live reads "forever".)
        conn.remember_granted(lease, now.granted_ttl());
    }
    let new_ttl = match lease_step(item.ttl, asked, now.ttl(), now.granted_ttl()) {
        LeaseStep::Gone => return Ok(None),
        LeaseStep::LeaveAlone => return Ok(Some(lease)),
        LeaseStep::KeepAlive => return keep_alive(conn, lease).await,
        LeaseStep::MoveTo(ttl) => ttl,
    };
    // Move the key onto a new lease, and give the old one back.
    let record = item.record.as_str();
    let moved_to = conn.grant_record(new_ttl, context).await?;
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
        return Ok(None);
    }
    conn.revoke_later(vec![lease]);
    Ok(Some(moved_to))
}

/// One keep-alive of `lease`: opening the keep-alive stream sends it and waits for etcd's
/// answer. None when etcd no longer has the lease.
async fn keep_alive(conn: &Conn, lease: i64) -> Result<Option<i64>, LockError> {
    let kept = conn
        .send(|mut c| async move { c.lease_keep_alive(lease).await })
        .await;
    match kept {
        Ok(_) => Ok(Some(lease)),
        // etcd-client's word for a keep-alive answered with a ttl of 0 or less.
        Err(etcd_client::Error::LeaseKeepAliveError(why)) if why == "lease not found" => Ok(None),
        Err(e) => Err(conn.error("lease renewal failed", e)),
    }
}

/// The comparisons true while `record` holds exactly `value` on `lease`.
fn held(record: &str, value: &[u8], lease: i64) -> [Compare; 2] {
    [
        Compare::value(record, CompareOp::Equal, value),
        Compare::lease(record, CompareOp::Equal, lease),
    ]
}
