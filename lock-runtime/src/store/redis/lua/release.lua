-- Give a lock back, only if the caller's token still owns it.
-- KEYS[1] record   KEYS[2] done marker   KEYS[3] waiters flag
-- ARGV[1] token   ARGV[2] release channel   ARGV[3] done retention ms (0: write no marker)
-- ARGV[4] '1' on a Redis Cluster of 7.0 or newer: publish on the sharded channel of the lock's
--   slot ('0': classic PUBLISH, which a 6.2 Cluster broadcasts to every node)
-- Returns 1 released | 2 kept until min_hold passes | 0 not ours (expired or taken over)
-- Both 1 and 2 are published while the waiters flag lives (a caller that found the lock taken
-- raised it, subscribed first or retrying after: a release before the flag precedes that
-- retry, which finds the lock free); with nobody waiting nothing is published. After 2,
-- waiters ask again and learn that the lock frees when min_hold ends (they were told the
-- holder's whole ttl).
-- The done marker is written whether or not the lock is still ours: it records that the work
-- succeeded, and a lease that lapsed while the work ran must not make the work run again.
local function announce()
  if redis.call('EXISTS', KEYS[3]) == 0 then
    return
  end
  if ARGV[4] == '1' then
    redis.call('SPUBLISH', ARGV[2], ARGV[1])
  else
    redis.call('PUBLISH', ARGV[2], ARGV[1])
  end
end
if ARGV[3] ~= '0' then
  redis.call('SET', KEYS[2], '1', 'PX', ARGV[3])
end
-- pcall: a foreign value at the key is simply "not ours".
local v = redis.pcall('GET', KEYS[1])
if type(v) ~= 'string' or string.sub(v, 1, #ARGV[1] + 1) ~= ARGV[1] .. ' ' then
  return 0
end
local hold_until = tonumber(string.match(v, '^%S+ %S+ %S+ (%d+) ')) or 0
if hold_until > 0 then
  local t = redis.call('TIME')
  local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  if hold_until > now_ms then
    -- Kept until min_hold passes, but no longer the holder's: a renewal or a retried acquire
    -- with the old token that arrives after this must not find it theirs.
    redis.call('SET', KEYS[1], 'released:' .. v, 'PX', hold_until - now_ms)
    announce()
    return 2
  end
end
redis.call('DEL', KEYS[1])
announce()
return 1
