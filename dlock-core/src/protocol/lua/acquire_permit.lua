-- ACQUIRE_PERMIT: takes a semaphore's permit when fewer than its count are held. Expired
-- permits are dropped first.
--
-- KEYS[1]  the permits: permit id -> expiry (server ms)
-- KEYS[2]  the count set at run time (SET_PERMITS)
-- ARGV[1]  the permit id (fresh)
-- ARGV[2]  lease, ms
-- ARGV[3]  the count to use when none was set
--
-- Returns
--   {1, 0}   taken (also when ARGV[1] holds it already: a retry)
--   {0, ms}  all taken, the first of them expiring in `ms` at the latest (-1: none is held,
--            the count is 0)
--@include clock
--@include sorted_sets
local now = now_ms()
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZSCORE', KEYS[1], ARGV[1]) then
  return {1, 0}
end
local limit = tonumber(redis.call('GET', KEYS[2]) or ARGV[3]) or 0
if redis.call('ZCARD', KEYS[1]) < limit then
  add_until(KEYS[1], ARGV[1], now, tonumber(ARGV[2]))
  return {1, 0}
end
local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
if first[2] then
  return {0, tonumber(first[2]) - now}
end
return {0, -1}
