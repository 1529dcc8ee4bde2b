-- Read a lock record for display.
-- KEYS[1] record hash
-- Returns {} when free | {'foreign', type} | {owner, fence, acquired_at_ms, pttl, now_ms}
local pttl = redis.call('PTTL', KEYS[1])
if pttl == -2 then
  return {}
end
local kind = redis.call('TYPE', KEYS[1])['ok']
if kind ~= 'hash' then
  return {'foreign', kind}
end
local r = redis.call('HMGET', KEYS[1], 'owner', 'fence', 'acquired_at_ms')
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
return {r[1] or '', tonumber(r[2]) or 0, tonumber(r[3]) or 0, pttl, now_ms}
