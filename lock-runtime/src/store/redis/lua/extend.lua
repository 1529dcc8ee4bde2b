-- Renew many leases in one call; each only if its token still owns the record.
-- A lease is never shortened: the new expiry is max(current, now + ttl), which also keeps
-- a min_hold promise intact.
-- KEYS[i] record   ARGV[2i-1] token   ARGV[2i] ttl ms
-- Returns one integer per key: 1 renewed, 0 not ours
local out = {}
for i = 1, #KEYS do
  local v = redis.pcall('GET', KEYS[i])
  local token = ARGV[2 * i - 1]
  if type(v) == 'string' and string.sub(v, 1, #token + 1) == token .. ' ' then
    local ttl = tonumber(ARGV[2 * i])
    if redis.call('PTTL', KEYS[i]) < ttl then
      redis.call('PEXPIRE', KEYS[i], ttl)
    end
    out[i] = 1
  else
    out[i] = 0
  end
end
return out
