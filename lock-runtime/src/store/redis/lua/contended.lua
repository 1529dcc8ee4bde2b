-- The contended path of a plain request, after its SET NX found the record taken: who holds it
-- and for how long, and the waiters flag raised for the caller, which is subscribed to the
-- release channel already or about to retry (a release publishes only while the flag lives).
-- KEYS[1] record   KEYS[2] waiters flag
-- ARGV[1] the caller's token
-- Returns {} free now | {'foreign', type} | {value, pttl}
local v = redis.pcall('GET', KEYS[1])
if type(v) == 'table' then
  return {'foreign', redis.call('TYPE', KEYS[1])['ok']}
end
if not v then
  return {}
end
local pttl = redis.call('PTTL', KEYS[1])
if string.sub(v, 1, #ARGV[1] + 1) ~= ARGV[1] .. ' ' then
  -- Long enough for the caller's fallback retry (the record's pttl and a tenth) and then
  -- some; never shortened, so another runtime's waiter keeps its flag.
  local want = math.floor(math.max(pttl, 0) * 1.25) + 2000
  if redis.call('PTTL', KEYS[2]) < want then
    redis.call('SET', KEYS[2], '1', 'PX', want)
  end
end
return {v, pttl}
