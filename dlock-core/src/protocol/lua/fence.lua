-- FENCE: the fencing token of a plain lock's hold, minted when its holder first asks for it.
--
-- KEYS[1]  the lock
-- KEYS[2]  its fencing counter
-- ARGV[1]  owner
-- ARGV[2]  fence TTL, ms (`0`: none)
--
-- Returns the hold's token (the one minted for it before, or a fresh one, stored on the hold),
-- or -1 when ARGV[1] does not hold the lock.
--
-- A token minted only while its owner holds the lock orders holds as one minted at the grant
-- would: every earlier hold minted its own before this one began, every later one will mint
-- after it ends.
--@include hold
--@include fence
local v = redis.call('GET', KEYS[1])
if not v or who(v) ~= ARGV[1] then
  return -1
end
local f = field(v, 'f')
if f then
  return tonumber(f)
end
f = next_fence(KEYS[2], ARGV[2])
redis.call('APPEND', KEYS[1], with_field('', 'f', string.format('%d', f)))
return f
