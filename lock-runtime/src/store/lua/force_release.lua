-- Remove a lock record whatever its token (an operator's forced release), and announce it as
-- a release is announced, so waiters try at once.
-- KEYS[1] record hash
-- ARGV[1] release channel   ARGV[2] '1': publish on the sharded channel (Cluster, 7.0 or newer)
-- Returns 1 removed | 0 no record | -1 a value that is not a lock record (left untouched)
-- The done marker and the fence counter are separate keys and stay.
local kind = redis.call('TYPE', KEYS[1])['ok']
if kind == 'none' then
  return 0
end
if kind ~= 'hash' then
  return -1
end
redis.call('DEL', KEYS[1])
if ARGV[2] == '1' then
  redis.call('SPUBLISH', ARGV[1], 'forced')
else
  redis.call('PUBLISH', ARGV[1], 'forced')
end
return 1
