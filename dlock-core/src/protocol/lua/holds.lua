-- HOLDS: a re-entry's check, read-only: does ARGV[1] still hold KEYS[1]?
--
-- KEYS[1]  the lock
-- ARGV[1]  owner
--
-- Returns
--   {1, token}  held (`token` -1 while none was minted)
--   {0, pttl}   not held by this owner (`pttl` -2 when nobody holds it)
--@flags no-writes
--@include hold
local v = redis.call('GET', KEYS[1])
if v and who(v) == ARGV[1] then
  return {1, token_of(v)}
end
return {0, redis.call('PTTL', KEYS[1])}
