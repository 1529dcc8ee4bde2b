-- Take a lock if it is free, in one round trip.
-- KEYS[1] record hash   KEYS[2] fence counter   KEYS[3] done marker
-- ARGV[1] token   ARGV[2] owner   ARGV[3] ttl ms   ARGV[4] min_hold ms
-- ARGV[5] '1' when the request uses `once` (only then is the done marker consulted)
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
local fence = redis.call('INCR', KEYS[2])
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local hold = tonumber(ARGV[4])
-- min_hold_until_ms 0 means "no min_hold", so release can skip reading the clock.
local hold_until = 0
if hold > 0 then
  hold_until = now_ms + hold
end
redis.call('HSET', KEYS[1],
  'token', ARGV[1],
  'owner', ARGV[2],
  'fence', fence,
  'acquired_at_ms', now_ms,
  'min_hold_until_ms', hold_until)
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return {1, fence}
