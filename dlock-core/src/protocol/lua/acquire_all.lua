-- ACQUIRE_ALL: all-or-none acquisition of several locks on one server (in one slot, on a
-- cluster).
--
-- KEYS[2i-1]  lock i
-- KEYS[2i]    its fencing counter
-- ARGV[1]     lease, ms
-- ARGV[2]     fence TTL, ms (`0`: none)
-- ARGV[2+i]   the owner for lock i (a fresh token each)
--
-- Returns
--   {1, token_1, .., token_n}  every lock is held by its owner now (one its owner held already
--                              counts: a retry)
--   {0, i, pttl}               lock i is busy; nothing was written but the busy hold's flag
--                              that it is waited for
--   {2, i, pttl}               lock i is held in a layout this one does not speak: nothing
--                              was written at all
--@include hold
--@include fence
local n = #KEYS / 2
local held = {}
for i = 1, n do
  local lock = KEYS[2 * i - 1]
  local v = redis.call('GET', lock)
  if v and who(v) ~= ARGV[2 + i] then
    if foreign(v) then
      return {2, i, redis.call('PTTL', lock)}
    end
    local changed = flagged(v)
    if changed ~= v then
      rewrite(lock, changed)
    end
    return {0, i, redis.call('PTTL', lock)}
  end
  held[i] = v
end
local out = {1}
for i = 1, n do
  local lock = KEYS[2 * i - 1]
  if held[i] then
    out[i + 1] = tonumber(field(held[i], 'f'))
  else
    out[i + 1] = take_fenced(lock, KEYS[2 * i], ARGV[2], ARGV[2 + i], ARGV[1])
  end
end
return out
