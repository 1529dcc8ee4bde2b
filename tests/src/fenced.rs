//! A fenced store for the tests: a resource in Redis that accepts a write only when its fence
//! is above every fence it has seen, and counts the stale writes it refused.

/// Accepts `value` under `fence` into the list `<name>:data` if the fence is new; refusals are
/// counted in `<name>:rejected`.
pub const FENCED_WRITE: &str = r"
local max = tonumber(redis.call('GET', KEYS[1]) or '0')
if tonumber(ARGV[1]) > max then
  redis.call('SET', KEYS[1], ARGV[1])
  redis.call('RPUSH', KEYS[2], ARGV[2])
  return 1
end
redis.call('INCR', KEYS[3])
return 0
";

/// Writes through the fenced store; true when accepted.
pub async fn fenced_write<C: redis::aio::ConnectionLike>(
    conn: &mut C,
    name: &str,
    fence: u64,
    value: &str,
) -> redis::RedisResult<bool> {
    let accepted: i64 = redis::Script::new(FENCED_WRITE)
        .key(format!("{name}:max"))
        .key(format!("{name}:data"))
        .key(format!("{name}:rejected"))
        .arg(fence)
        .arg(value)
        .invoke_async(conn)
        .await?;
    Ok(accepted == 1)
}

/// A counter behind a fence, the storage a careful job writes to: an operation whose fence is
/// below the highest fence the counter has seen, or equal to it from another token, is refused
/// (DESIGN.md §5: storages compare with `>` and refuse an equal fence from another token), so a
/// holder that lost its lease can neither write nor read-then-write over a newer holder. Reads
/// raise the fence too. Every accepted write is logged as `fence:token`, so the soak can tie
/// each accepted write to the lease that made it and check that the counter equals the
/// accepted increments.
pub const FENCED_READ: &str = r"
local max = tonumber(redis.call('GET', KEYS[1]) or '0')
local fence = tonumber(ARGV[1])
if fence < max or (fence == max and redis.call('GET', KEYS[4]) ~= ARGV[2]) then
  redis.call('INCR', KEYS[3])
  return false
end
redis.call('SET', KEYS[1], ARGV[1])
redis.call('SET', KEYS[4], ARGV[2])
return tonumber(redis.call('GET', KEYS[2]) or '0')
";

/// The write half of [`FENCED_READ`]: sets the counter and logs `fence:token`.
pub const FENCED_SET: &str = r"
local max = tonumber(redis.call('GET', KEYS[1]) or '0')
local fence = tonumber(ARGV[1])
if fence < max or (fence == max and redis.call('GET', KEYS[4]) ~= ARGV[2]) then
  redis.call('INCR', KEYS[3])
  return 0
end
redis.call('SET', KEYS[1], ARGV[1])
redis.call('SET', KEYS[4], ARGV[2])
redis.call('SET', KEYS[2], ARGV[3])
redis.call('RPUSH', KEYS[5], ARGV[1] .. ':' .. ARGV[2])
return 1
";

fn counter_keys(name: &str) -> [String; 5] {
    [
        format!("{{{name}}}:max"),
        format!("{{{name}}}:value"),
        format!("{{{name}}}:rejected"),
        format!("{{{name}}}:max_token"),
        format!("{{{name}}}:accepted"),
    ]
}

/// Reads the counter under `fence` for `token`; `None` when the fence is stale.
pub async fn counter_read<C: redis::aio::ConnectionLike>(
    conn: &mut C,
    name: &str,
    fence: u64,
    token: &str,
) -> redis::RedisResult<Option<u64>> {
    let [max, value, rejected, max_token, _] = counter_keys(name);
    redis::Script::new(FENCED_READ)
        .key(max)
        .key(value)
        .key(rejected)
        .key(max_token)
        .arg(fence)
        .arg(token)
        .invoke_async(conn)
        .await
}

/// Writes the counter under `fence` for `token`; false when the fence is stale.
pub async fn counter_set<C: redis::aio::ConnectionLike>(
    conn: &mut C,
    name: &str,
    fence: u64,
    token: &str,
    new_value: u64,
) -> redis::RedisResult<bool> {
    let [max, value, rejected, max_token, accepted] = counter_keys(name);
    let ok: i64 = redis::Script::new(FENCED_SET)
        .key(max)
        .key(value)
        .key(rejected)
        .key(max_token)
        .key(accepted)
        .arg(fence)
        .arg(token)
        .arg(new_value)
        .invoke_async(conn)
        .await?;
    Ok(ok == 1)
}

/// What a fenced counter holds.
#[derive(Debug, Clone, Default)]
pub struct CounterState {
    /// The counter's value.
    pub value: u64,
    /// The accepted writes in the order the store accepted them: (fence, token).
    pub accepted: Vec<(u64, String)>,
    /// Operations the store refused as stale.
    pub refused: u64,
}

/// Reads a counter's state.
pub async fn counter_state<C: redis::aio::ConnectionLike>(
    conn: &mut C,
    name: &str,
) -> redis::RedisResult<CounterState> {
    let [_, value, rejected, _, accepted] = counter_keys(name);
    let value: Option<u64> = redis::cmd("GET").arg(value).query_async(conn).await?;
    let log: Vec<String> = redis::cmd("LRANGE")
        .arg(accepted)
        .arg(0)
        .arg(-1)
        .query_async(conn)
        .await?;
    let refused: Option<u64> = redis::cmd("GET").arg(rejected).query_async(conn).await?;
    let accepted = log
        .iter()
        .filter_map(|entry| {
            let (fence, token) = entry.split_once(':')?;
            Some((fence.parse().ok()?, token.to_owned()))
        })
        .collect();
    Ok(CounterState {
        value: value.unwrap_or(0),
        accepted,
        refused: refused.unwrap_or(0),
    })
}

/// The end of a paused-holder test, once a new holder took the lock with `fence`: it writes
/// to the ledger `ledger` (accepted), then resumes the stopped `fenced_writer` helper and asks
/// it to write; the helper must already know its lease lost, and the ledger must refuse its
/// write and hold the new holder's alone (stale writes accepted: 0).
pub async fn new_holder_writes_and_the_paused_one_is_refused(
    conn: &mut redis::aio::MultiplexedConnection,
    fence: u64,
    holder: &mut crate::Helper,
    stdin: &mut tokio::process::ChildStdin,
) {
    use tokio::io::AsyncWriteExt;

    assert!(
        fenced_write(conn, "ledger", fence, "new holder")
            .await
            .expect("write"),
        "the new holder's write is accepted"
    );
    holder.signal("-CONT");
    stdin.write_all(b"write\n").await.expect("stdin");
    stdin.flush().await.expect("flush");
    let report = holder.next_line().await;
    assert_eq!(report, "lost_before=true accepted=false", "{report}");
    let rejected: Option<u64> = crate::query(conn, ("GET", "ledger:rejected")).await;
    let data: Vec<String> = crate::query(conn, ("LRANGE", "ledger:data", 0, -1)).await;
    assert_eq!(rejected, Some(1), "the stale write was counted as refused");
    assert_eq!(
        data,
        vec!["new holder".to_owned()],
        "stale writes accepted: 0"
    );
}
