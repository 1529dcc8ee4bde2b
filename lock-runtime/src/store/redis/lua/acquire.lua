-- Take a lock if it is free, in one round trip.
-- KEYS[1] record hash   KEYS[2] fence counter   KEYS[3] done marker
-- ARGV[1] token   ARGV[2] owner   ARGV[3] ttl ms   ARGV[4] min_hold ms
-- ARGV[5] '1' when the request uses `once` (only then is the done marker consulted)
-- ARGV[6] how long the fence counter is kept, ms (at least the ttl)
-- Returns {1, fence} acquired | {0, pttl} held | {2, pttl} done marker present
--       | {3, type} a foreign value sits at the record key
if ARGV[5] == '1' and redis.call('EXISTS', KEYS[3]) == 1 then
  return {2, redis.call('PTTL', KEYS[3])}
end
local pttl = redis.call('PTTL', KEYS[1])
if pttl ~= -2 then
  local kind = redis.call('TYPE', KEYS[1])['ok']
  if kind ~= 'hash' then
    return {3, kind}
  end
  -- The same token again: a retry of an acquire whose reply was lost. Grant it again, so
  -- retrying after a broken connection can never leave an orphaned lock.
  local mine = redis.call('HMGET', KEYS[1], 'token', 'fence')
  if mine[1] == ARGV[1] then
    redis.call('PEXPIRE', KEYS[1], ARGV[3])
    return {1, tonumber(mine[2])}
  end
  return {0, pttl}
end
-- The hybrid fence: one more than the last fence, and never below the server clock in
-- microseconds. A counter that expired, or an INCR lost in a failover, cannot make a fence
-- repeat as long as server clocks are closer together than a failover takes. Integers stay
-- below 2^53, exact in Lua's doubles; '%d' writes them without an exponent.
-- One SET .. GET writes the clock part and reads the last fence (Redis 6.2+); only when the
-- last fence is not below the clock (a clock step back) is the counter written again.
local t = redis.call('TIME')
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local now_ms = math.floor(now_us / 1000)
local last = tonumber(redis.call('SET', KEYS[2], string.format('%d', now_us), 'PX', ARGV[6], 'GET')) or 0
local fence = now_us
if last >= now_us then
  fence = last + 1
  redis.call('SET', KEYS[2], string.format('%d', fence), 'PX', ARGV[6])
end
local hold = tonumber(ARGV[4])
-- min_hold_until_ms 0 means "no min_hold", so release can skip reading the clock.
local hold_until = 0
if hold > 0 then
  hold_until = now_ms + hold
end
redis.call('HSET', KEYS[1],
  'token', ARGV[1],
  'owner', ARGV[2],
  'fence', string.format('%d', fence),
  'acquired_at_ms', now_ms,
  'min_hold_until_ms', hold_until)
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return {1, fence}
