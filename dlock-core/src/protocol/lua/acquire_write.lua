-- ACQUIRE_WRITE: an attempt of a read-write lock's writer. Takes the write lock when no writer
-- holds it and no reader is in; otherwise (when asked) records the writer's wait, so new
-- readers stay out.
--
-- KEYS[1]  the write lock
-- KEYS[2]  its fencing counter
-- KEYS[3]  the readers: reader id -> expiry (server ms)
-- KEYS[4]  the writers waiting: writer -> until when its wait counts (server ms)
-- ARGV[1]  owner
-- ARGV[2]  lease, ms
-- ARGV[3]  fence TTL, ms (`0`: none)
-- ARGV[4]  how long the wait counts without another attempt, ms (`0`: not recorded)
--
-- Returns
--   {1, token}  acquired (also a retry)
--   {0, ms}     busy: the writer's PTTL, or when the first reader's lease ends
--   {2, ms}     busy, the writer's hold in a layout this one does not speak (not written)
--@include clock
--@include sorted_sets
--@include hold
--@include fence
local now = now_ms()
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', now)
local function waits()
  if ARGV[4] ~= '0' then
    add_until(KEYS[4], ARGV[1], now, tonumber(ARGV[4]))
  end
end
local v = redis.call('GET', KEYS[1])
if v then
  if who(v) == ARGV[1] then
    return {1, token_of(v)}
  end
  waits()
  if foreign(v) then
    return {2, redis.call('PTTL', KEYS[1])}
  end
  return {0, redis.call('PTTL', KEYS[1])}
end
local first = redis.call('ZRANGE', KEYS[3], 0, 0, 'WITHSCORES')
if first[2] then
  waits()
  return {0, tonumber(first[2]) - now}
end
redis.call('ZREM', KEYS[4], ARGV[1])
return {1, take_fenced(KEYS[1], KEYS[2], ARGV[3], ARGV[1], ARGV[2])}
