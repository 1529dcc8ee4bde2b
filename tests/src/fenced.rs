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

/// A counter behind a fence: a read or write whose fence is below the highest fence the
/// counter has seen (on reads and writes) is refused, so a holder that lost its lease can
/// neither write nor read-then-write over a newer holder. Accepted writes are logged with their
/// fence, so the soak can check that the counter equals the accepted increments.
pub const FENCED_READ: &str = r"
local max = tonumber(redis.call('GET', KEYS[1]) or '0')
local fence = tonumber(ARGV[1])
if fence < max then
  redis.call('INCR', KEYS[3])
  return false
end
redis.call('SET', KEYS[1], fence)
return tonumber(redis.call('GET', KEYS[2]) or '0')
";

/// The write half of [`FENCED_READ`]: sets the counter and logs the fence.
pub const FENCED_SET: &str = r"
local max = tonumber(redis.call('GET', KEYS[1]) or '0')
local fence = tonumber(ARGV[1])
if fence < max then
  redis.call('INCR', KEYS[3])
  return 0
end
redis.call('SET', KEYS[1], fence)
redis.call('SET', KEYS[2], ARGV[2])
redis.call('RPUSH', KEYS[4], fence)
return 1
";

fn counter_keys(name: &str) -> [String; 4] {
    [
        format!("{{{name}}}:max"),
        format!("{{{name}}}:value"),
        format!("{{{name}}}:rejected"),
        format!("{{{name}}}:accepted"),
    ]
}

/// Reads the counter under `fence`; `None` when the fence is stale.
pub async fn counter_read<C: redis::aio::ConnectionLike>(
    conn: &mut C,
    name: &str,
    fence: u64,
) -> redis::RedisResult<Option<u64>> {
    let [max, value, rejected, _] = counter_keys(name);
    redis::Script::new(FENCED_READ)
        .key(max)
        .key(value)
        .key(rejected)
        .arg(fence)
        .invoke_async(conn)
        .await
}

/// Writes the counter under `fence`; false when the fence is stale.
pub async fn counter_set<C: redis::aio::ConnectionLike>(
    conn: &mut C,
    name: &str,
    fence: u64,
    new_value: u64,
) -> redis::RedisResult<bool> {
    let [max, value, rejected, accepted] = counter_keys(name);
    let ok: i64 = redis::Script::new(FENCED_SET)
        .key(max)
        .key(value)
        .key(rejected)
        .key(accepted)
        .arg(fence)
        .arg(new_value)
        .invoke_async(conn)
        .await?;
    Ok(ok == 1)
}

/// What the counter holds: (value, fences of the accepted writes in order, refused ops).
pub async fn counter_state<C: redis::aio::ConnectionLike>(
    conn: &mut C,
    name: &str,
) -> redis::RedisResult<(u64, Vec<u64>, u64)> {
    let [_, value, rejected, accepted] = counter_keys(name);
    let value: Option<u64> = redis::cmd("GET").arg(value).query_async(conn).await?;
    let fences: Vec<u64> = redis::cmd("LRANGE")
        .arg(accepted)
        .arg(0)
        .arg(-1)
        .query_async(conn)
        .await?;
    let refused: Option<u64> = redis::cmd("GET").arg(rejected).query_async(conn).await?;
    Ok((value.unwrap_or(0), fences, refused.unwrap_or(0)))
}
