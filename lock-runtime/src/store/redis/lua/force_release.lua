-- Remove a lock record whatever its token, if it carries the fence the operator saw (an
-- operator's forced release), and announce it as a release is announced, so waiters try at
-- once. The fence condition makes a retried or late call harmless: a new holder has another.
-- KEYS[1] record hash
-- ARGV[1] fence   ARGV[2] release channel
-- ARGV[3] '1': publish on the sharded channel (Cluster, 7.0 or newer)
-- Returns 1 removed | 0 no record, or another fence | -1 a value that is not a lock record
-- (left untouched). The done marker and the fence counter are separate keys and stay.
local kind = redis.call('TYPE', KEYS[1])['ok']
if kind == 'none' then
  return 0
end
if kind ~= 'hash' then
  return -1
end
if redis.call('HGET', KEYS[1], 'fence') ~= ARGV[1] then
  return 0
end
redis.call('DEL', KEYS[1])
if ARGV[3] == '1' then
  redis.call('SPUBLISH', ARGV[2], 'forced')
else
  redis.call('PUBLISH', ARGV[2], 'forced')
end
return 1
