-- Take a lock if it is free, with its fence, in one round trip: the path of requests that need
-- the server's clock or the done marker (min_hold, once), of replicated acquires and of Redlock
-- members. Plain requests take the lean path instead: SET NX PX from the client.
-- The record is a string: "<token> <fence> <since_ms> <hold_until_ms> <owner>", where fence
-- and since_ms are '-' while unknown (a lean acquire), hold_until_ms is 0 without min_hold,
-- and the owner is everything after the fourth space. A kept record's token is
-- "released:<token>", which no holder's token equals.
-- KEYS[1] record   KEYS[2] fence counter   KEYS[3] done marker
-- ARGV[1] token   ARGV[2] owner   ARGV[3] ttl ms   ARGV[4] min_hold ms
-- ARGV[5] '1' when the request uses `once` (only then is the done marker consulted)
-- ARGV[6] how long the fence counter is kept, ms (at least the ttl)
-- ARGV[7] release channel   ARGV[8] '1': publish on the sharded channel (Cluster, 7.0 or newer)
-- Returns {1, fence} acquired | {0, pttl} held | {2, pttl} done marker present
--       | {3, type} a foreign value sits at the record key
-- parse(v) and marked(v): record.lua, put before this script by scripts.rs.
local v = redis.pcall('GET', KEYS[1])
if type(v) == 'table' then
  return {3, redis.call('TYPE', KEYS[1])['ok']}
end
if ARGV[5] == '1' and redis.call('EXISTS', KEYS[3]) == 1 then
  -- The record this very token was granted: a send whose reply was lost, sent again after
  -- the work was done elsewhere. Given back (and announced, as a release is) before the
  -- answer "done", on which the caller gives nothing back.
  if v and parse(v) == ARGV[1] then
    redis.call('DEL', KEYS[1])
    if ARGV[8] == '1' then
      redis.call('SPUBLISH', ARGV[7], ARGV[1])
    else
      redis.call('PUBLISH', ARGV[7], ARGV[1])
    end
  end
  return {2, redis.call('PTTL', KEYS[3])}
end
if v then
  local token, f = parse(v)
  if not token then
    return {3, 'string'}
  end
  -- The same token again: a retry of an acquire whose reply was lost. Grant it again, so
  -- retrying after a broken connection can never leave an orphaned lock.
  if token == ARGV[1] and f ~= '-' then
    redis.call('PEXPIRE', KEYS[1], ARGV[3])
    return {1, tonumber(f)}
  end
  -- Held: the record marked as waited for, as contended.lua does (the caller may wait).
  if not marked(v) then
    redis.call('SET', KEYS[1], v .. '\nw', 'KEEPTTL')
  end
  return {0, redis.call('PTTL', KEYS[1])}
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
local hold_until = 0
if hold > 0 then
  hold_until = now_ms + hold
end
redis.call('SET', KEYS[1],
  string.format('%s %d %d %d %s', ARGV[1], fence, now_ms, hold_until, ARGV[2]),
  'PX', ARGV[3])
return {1, fence}
