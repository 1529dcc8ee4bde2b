-- The fence of a lease taken by the lean path, computed the first time its holder asks, and
-- only while the record is still the holder's: a holder that lost its lease cannot obtain a
-- fence, and one obtained while holding is below every later holder's (same counter and
-- clock as acquire.lua). Written into the record, so a second ask and `inspect` see it.
-- KEYS[1] record   KEYS[2] fence counter
-- ARGV[1] token   ARGV[2] how long the fence counter is kept, ms
-- Returns the fence | -1 the record is not this token's
local v = redis.pcall('GET', KEYS[1])
if type(v) ~= 'string' then
  return -1
end
local token, f, rest = string.match(v, '^(%S+) (%S+) (%S+ %d+ .*)$')
if token ~= ARGV[1] then
  return -1
end
if f ~= '-' then
  return tonumber(f)
end
local t = redis.call('TIME')
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local last = tonumber(redis.call('SET', KEYS[2], string.format('%d', now_us), 'PX', ARGV[2], 'GET')) or 0
local fence = now_us
if last >= now_us then
  fence = last + 1
  redis.call('SET', KEYS[2], string.format('%d', fence), 'PX', ARGV[2])
end
redis.call('SET', KEYS[1], string.format('%s %d %s', token, fence, rest), 'KEEPTTL')
return fence
