-- ACQUIRE_READ: an attempt of a read-write lock's reader. In when no writer holds the lock
-- and (when writers are preferred) none waits.
--
-- KEYS[1]  the readers
-- KEYS[2]  the write lock
-- KEYS[3]  the writers waiting
-- ARGV[1]  the reader id (fresh)
-- ARGV[2]  lease, ms
-- ARGV[3]  `1` when writers are preferred, else `0`
--
-- Returns
--   {1, 0}   in (also a retry)
--   {0, ms}  busy: the writer's PTTL, or -1 (a writer waits)
--   {2, ms}  busy, the writer's hold in a layout this one does not speak
--@include clock
--@include sorted_sets
--@include hold
local now = now_ms()
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZSCORE', KEYS[1], ARGV[1]) then
  return {1, 0}
end
local writer = redis.call('GET', KEYS[2])
if writer then
  if foreign(writer) then
    return {2, redis.call('PTTL', KEYS[2])}
  end
  return {0, redis.call('PTTL', KEYS[2])}
end
if ARGV[3] == '1' then
  redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
  if redis.call('ZCARD', KEYS[3]) > 0 then
    return {0, -1}
  end
end
add_until(KEYS[1], ARGV[1], now, tonumber(ARGV[2]))
return {1, 0}
