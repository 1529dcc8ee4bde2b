-- Put before the scripts that read a lock record's fields (acquire, inspect, force_release;
-- scripts.rs joins them), so that they agree on what a record is.
-- The record is a string: "<token> <fence> <since_ms> <hold_until_ms> <owner>", where fence
-- and since_ms are '-' while unknown (a lean acquire), hold_until_ms is 0 without min_hold,
-- and the owner is everything after the fourth space.
-- A lock record's fields, or nil for a string that is no lock record.
local function parse(v)
  local token, f, since, hold, owner = string.match(v, '^(%S+) (%S+) (%S+) (%d+) (.*)$')
  if not token then
    return nil
  end
  if (f ~= '-' and not string.match(f, '^%d+$')) or (since ~= '-' and not string.match(since, '^%d+$')) then
    return nil
  end
  return token, f, since, hold, owner
end
