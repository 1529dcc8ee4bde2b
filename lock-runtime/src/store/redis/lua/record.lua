-- Put before the scripts that read a lock record's fields (acquire, contended, inspect,
-- force_release; scripts.rs joins them), so that they agree on what a record is.
-- The record is a string: "<token> <fence> <since_ms> <hold_until_ms> <owner>", where fence
-- and since_ms are '-' while unknown (a lean acquire), hold_until_ms is 0 without min_hold,
-- and the owner is everything after the fourth space, up to the waiters mark: "\nw" at the
-- very end, appended by a caller that found the lock taken (it may wait; the release then
-- publishes). An owner has no control character, so the mark cannot be part of one.
-- Whether a record carries the waiters mark.
local function marked(v)
  return string.sub(v, -2) == '\nw'
end
-- A lock record's fields, or nil for a string that is no lock record.
local function parse(v)
  if marked(v) then
    v = string.sub(v, 1, -3)
  end
  local token, f, since, hold, owner = string.match(v, '^(%S+) (%S+) (%S+) (%d+) (.*)$')
  if not token then
    return nil
  end
  if (f ~= '-' and not string.match(f, '^%d+$')) or (since ~= '-' and not string.match(since, '^%d+$')) then
    return nil
  end
  return token, f, since, hold, owner
end
