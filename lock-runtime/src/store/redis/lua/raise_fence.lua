-- Redlock: after a quorum granted a lock, lift this node's fence counter (and the record's
-- fence) to the fence the lease carries, the largest among the quorum. Any later quorum
-- shares a node with this one, so its largest fence is then strictly larger.
-- KEYS[1] record hash   KEYS[2] fence counter
-- ARGV[1] token   ARGV[2] fence   ARGV[3] how long the fence counter is kept, ms
-- Returns 1 when the record here is ours and now carries the fence, else 0
local fence = tonumber(ARGV[2])
local current = tonumber(redis.call('GET', KEYS[2]) or '0') or 0
if current < fence then
  redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[3])
end
local r = redis.pcall('HGET', KEYS[1], 'token')
if r ~= ARGV[1] then
  return 0
end
redis.call('HSET', KEYS[1], 'fence', ARGV[2])
return 1
