-- Give back several locks at once, each only if its record is exactly as its lean acquire
-- wrote it (no fence asked, nobody waiting, no min_hold): the group commit of plain releases.
-- KEYS[i] record   ARGV[i] the value the lean acquire of its releasing token wrote
-- Returns, per record: 1 deleted | 0 left alone (the full release script decides about it)
-- pcall: a foreign value at a key is simply "not as written".
local out = {}
for i = 1, #KEYS do
  local v = redis.pcall('GET', KEYS[i])
  if v == ARGV[i] and v ~= '' then
    redis.call('DEL', KEYS[i])
    out[i] = 1
  else
    out[i] = 0
  end
end
return out
