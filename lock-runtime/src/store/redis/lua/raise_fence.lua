-- Redlock: after a quorum granted a lock, lift this node's fence counter (and the record's
-- fence) to the fence the lease carries, the largest among the quorum. Any later quorum
-- shares a node with this one, so its largest fence is then strictly larger.
-- KEYS[1] record   KEYS[2] fence counter
-- ARGV[1] token   ARGV[2] fence   ARGV[3] how long the fence counter is kept, ms
-- Returns 1 when the record here is ours and now carries the fence, else 0
local fence = tonumber(ARGV[2])
local current = tonumber(redis.call('GET', KEYS[2]) or '0') or 0
if current < fence then
  redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[3])
end
local v = redis.pcall('GET', KEYS[1])
if type(v) ~= 'string' then
  return 0
end
local token, rest = string.match(v, '^(%S+) %S+ (%S+ %d+ .*)$')
if token ~= ARGV[1] then
  return 0
end
redis.call('SET', KEYS[1], token .. ' ' .. ARGV[2] .. ' ' .. rest, 'KEEPTTL')
return 1
