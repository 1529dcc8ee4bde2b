-- Remove a lock record whatever its token, if it is the holding the operator saw (by its
-- fence, or by its holder id as inspect.lua computes it), and announce it as a release is
-- announced, so waiters try at once. The condition makes a retried or late call harmless: a
-- new holder has another fence and another id.
-- KEYS[1] record
-- ARGV[1] 'fence' or 'holder'   ARGV[2] the fence or the holder id   ARGV[3] release channel
-- ARGV[4] '1': publish on the sharded channel (Cluster, 7.0 or newer)
-- Returns 1 removed | 0 no record, or another holding | -1 a value that is not a lock record
-- (left untouched). The done marker and the fence counter are separate keys and stay.
-- parse(v), the record's fields: record.lua, put before this script by scripts.rs.
local v = redis.pcall('GET', KEYS[1])
if not v then
  return 0
end
if type(v) == 'table' then
  return -1
end
local token, f = parse(v)
if not token then
  return -1
end
if ARGV[1] == 'fence' then
  if f ~= ARGV[2] then
    return 0
  end
else
  local plain = string.gsub(token, '^released:', '')
  if string.sub(redis.sha1hex(plain), 1, 16) ~= ARGV[2] then
    return 0
  end
end
redis.call('DEL', KEYS[1])
if ARGV[4] == '1' then
  redis.call('SPUBLISH', ARGV[3], 'forced')
else
  redis.call('PUBLISH', ARGV[3], 'forced')
end
return 1
