-- Give a lock back, only if the caller's token still owns it.
-- KEYS[1] record   KEYS[2] done marker, only when one is to be written
-- ARGV[1] token   ARGV[2] the record's value as a lean acquire of this token wrote it, or ''
-- ARGV[3] '1' on a Redis Cluster of 7.0 or newer: publish on the sharded channel of the lock's
--   slot ('0': classic PUBLISH, which a 6.2 Cluster broadcasts to every node)
-- ARGV[4] with KEYS[2]: how long the done marker is kept, ms
-- Returns 1 released | 2 kept until min_hold passes | 0 not ours (expired or taken over)
-- The common case costs one comparison: the record is exactly what the lean acquire wrote (no
-- fence asked, nobody waiting), so it is this token's, without min_hold: deleted, nothing
-- published. Otherwise the record is read field by field (record.lua). Both 1 and 2 are
-- published on `<record>:released` when the record carries the waiters mark (a caller that
-- found the lock taken marked it, subscribed first or retrying after: a release before the
-- mark precedes that retry, which finds the lock free); after 2, waiters ask again and learn
-- that the lock frees when min_hold ends (they were told the holder's whole ttl).
-- The done marker is written whether or not the lock is still ours: it records that the work
-- succeeded, and a lease that lapsed while the work ran must not make the work run again.
-- This part runs before record.lua's functions are defined (scripts.rs joins release.lua,
-- record.lua and release_rest.lua), so the common case does not pay for them.
if KEYS[2] then
  redis.call('SET', KEYS[2], '1', 'PX', ARGV[4])
end
-- pcall: a foreign value at the key is simply "not ours".
local v = redis.pcall('GET', KEYS[1])
if v == ARGV[2] and v ~= '' then
  redis.call('DEL', KEYS[1])
  return 1
end
