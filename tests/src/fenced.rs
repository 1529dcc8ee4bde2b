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
