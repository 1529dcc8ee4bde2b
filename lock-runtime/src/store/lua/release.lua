-- Give a lock back, only if the caller's token still owns it.
-- KEYS[1] record hash   KEYS[2] done marker
-- ARGV[1] token   ARGV[2] release channel   ARGV[3] done retention ms (0: write no marker)
-- Returns 1 released | 2 kept until min_hold passes | 0 not ours (expired or taken over)
local owner = redis.pcall('HGET', KEYS[1], 'token')
if owner ~= ARGV[1] then
  return 0
end
if tonumber(ARGV[3]) > 0 then
  redis.call('SET', KEYS[2], '1', 'PX', ARGV[3])
end
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local hold_until = tonumber(redis.call('HGET', KEYS[1], 'min_hold_until_ms'))
if hold_until and hold_until > now_ms then
  redis.call('PEXPIRE', KEYS[1], hold_until - now_ms)
  return 2
end
redis.call('DEL', KEYS[1])
redis.call('PUBLISH', ARGV[2], ARGV[1])
return 1
