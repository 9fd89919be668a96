-- ACQUIRE_FAIR: an attempt at a fair lock. Takes the lock when it is free and nobody alive is
-- ahead in line; otherwise (when asked) gives the waiter a place in line, or refreshes its place.
--
-- KEYS[1]  the lock
-- KEYS[2]  its fencing counter
-- KEYS[3]  its wake-up channel (the head's own is this and `:<waiter>`)
-- KEYS[4]  the queue: waiter -> place in line
-- KEYS[5]  the alive set: waiter -> until when it counts as alive (server ms)
-- ARGV[1]  owner (the waiter)
-- ARGV[2]  lease, ms
-- ARGV[3]  fence TTL, ms (`0`: none)
-- ARGV[4]  how long the waiter counts as alive without another attempt, ms (`0`: do not join
--          the line)
-- ARGV[5]  the command that wakes a waiter (PUBLISH; SPUBLISH on a cluster)
-- ARGV[6]  optional: the waiter's place in line, when it is not ARGV[1]: a waiter keeps one
--          place while its owner token changes (a failed attempt's token is released, and
--          never used again), so an attempt that fails does not cost it its place
--
-- The line, and the head's wake-up channel, name the place.
--
-- Returns
--   {1, token}           acquired (also a retry of a grant)
--   {0, pttl, place}     busy: the holder's PTTL (-2: free, but another waiter heads the line,
--                        and was woken), and the waiter's place in line (0: the head; -1: not
--                        in line)
--   {2, pttl, place}     busy, the lock held in a layout this one does not speak: the
--                        hold is not written (the waiter's place in line is its own)
--@include clock
--@include sorted_sets
--@include hold
--@include fence
local now = now_ms()
local place = ARGV[6] or ARGV[1]
local function join()
  if ARGV[4] == '0' then
    return -1
  end
  if not redis.call('ZSCORE', KEYS[4], place) then
    local last = redis.call('ZRANGE', KEYS[4], -1, -1, 'WITHSCORES')
    local place_no = 1
    if last[2] then
      place_no = tonumber(last[2]) + 1
    end
    redis.call('ZADD', KEYS[4], place_no, place)
  end
  local alive_ms = tonumber(ARGV[4])
  add_until(KEYS[5], place, now, alive_ms)
  if redis.call('PTTL', KEYS[4]) < alive_ms then
    redis.call('PEXPIRE', KEYS[4], alive_ms)
  end
  return redis.call('ZRANK', KEYS[4], place)
end
local v = redis.call('GET', KEYS[1])
if v then
  if who(v) == ARGV[1] then
    return {1, token_of(v)}
  end
  local pttl = redis.call('PTTL', KEYS[1])
  if foreign(v) then
    return {2, pttl, join()}
  end
  return {0, pttl, join()}
end
local head = fair_head(KEYS[4], KEYS[5], now)
if head == nil or head == place then
  if head then
    redis.call('ZREM', KEYS[4], place)
    redis.call('ZREM', KEYS[5], place)
  end
  return {1, take_fenced(KEYS[1], KEYS[2], ARGV[3], ARGV[1], ARGV[2])}
end
redis.call(ARGV[5], KEYS[3] .. ':' .. head, '1')
return {0, -2, join()}
