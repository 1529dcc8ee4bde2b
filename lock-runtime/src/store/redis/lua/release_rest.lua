-- The rest of release.lua (which see), after record.lua: the record read field by field.
-- parse(v) and marked(v): record.lua.
if type(v) ~= 'string' then
  return 0
end
local token, _, _, hold = parse(v)
if token ~= ARGV[1] then
  return 0
end
local function announce()
  if not marked(v) then
    return
  end
  if ARGV[3] == '1' then
    redis.call('SPUBLISH', KEYS[1] .. ':released', ARGV[1])
  else
    redis.call('PUBLISH', KEYS[1] .. ':released', ARGV[1])
  end
end
local hold_until = tonumber(hold) or 0
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
