-- The contended path of a plain request, after its SET NX found the record taken: who holds it
-- and for how long, and the record marked as waited for (the waiters mark, record.lua), for
-- the caller, which is subscribed to the release channel already or about to retry: the
-- holder's release publishes only for a marked record.
-- KEYS[1] record
-- ARGV[1] the caller's token
-- Returns {} free now | {'foreign', type} | {value, pttl}
-- parse(v) and marked(v): record.lua, put before this script by scripts.rs.
local v = redis.pcall('GET', KEYS[1])
if type(v) == 'table' then
  return {'foreign', redis.call('TYPE', KEYS[1])['ok']}
end
if not v then
  return {}
end
local pttl = redis.call('PTTL', KEYS[1])
local token = parse(v)
-- A value that is no lock record is answered as it is (the caller refuses it) and left
-- untouched; the caller's own record (its SET sent again, the first send won) is not marked.
if token and token ~= ARGV[1] and not marked(v) then
  -- SET .. KEEPTTL rather than APPEND: no command beyond docs/security.md's ACL rule.
  redis.call('SET', KEYS[1], v .. '\nw', 'KEEPTTL')
end
return {v, pttl}
