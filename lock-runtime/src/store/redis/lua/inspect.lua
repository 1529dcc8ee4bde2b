-- Read a lock record for display.
-- KEYS[1] record
-- Returns {} when free | {'foreign', type}
--       | {owner, fence or '-', since_ms or '-', pttl, now_ms, holder id}
-- The holder id names one holding (one token) without revealing it: the first 16 hex digits
-- of the token's SHA1. A record kept for min_hold keeps its holder's id.
-- parse(v), the record's fields: record.lua, put before this script by scripts.rs.
local v = redis.pcall('GET', KEYS[1])
if not v then
  return {}
end
if type(v) == 'table' then
  return {'foreign', redis.call('TYPE', KEYS[1])['ok']}
end
local token, f, since, _, owner = parse(v)
if not token then
  return {'foreign', 'string'}
end
local plain = string.gsub(token, '^released:', '')
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
return {owner, f, since, redis.call('PTTL', KEYS[1]), now_ms, string.sub(redis.sha1hex(plain), 1, 16)}
