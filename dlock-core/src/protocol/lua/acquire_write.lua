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
-- ARGV[5]  optional: `0`, or the ms a release should keep the write lock for this attempt's
--          `Locker` if another writer holds it: the attempt claims the next turn on that hold,
--          as a plain lock's attempt does (see ACQUIRE)
-- ARGV[6]  with ARGV[5]: since when the waiter waits (wall-clock ms)
-- ARGV[7]  with ARGV[5]: the id of the attempt's `Locker`
-- ARGV[8]  with ARGV[5]: `1` if the attempt comes from the head of its local line (which
--          alone takes a write lock kept for its `Locker`), else `0`
--
-- Returns
--   {1, token}  acquired (also a retry, and a write lock kept for ARGV[7] taken by its head)
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
local claim_ms, locker = ARGV[5] or '0', ARGV[7] or ''
local v = redis.call('GET', KEYS[1])
if v then
  local holder = who(v)
  if holder == ARGV[1] then
    return {1, token_of(v)}
  end
  if ARGV[8] == '1' and holder == kept_for(locker) then
    -- Kept for this Locker by the last writer's release: its head waiter takes it, and
    -- another Locker's claim made since stays on the new hold.
    local claim = field(v, 'w')
    local _, _, claimant = claim_of(claim)
    redis.call('ZREM', KEYS[4], ARGV[1])
    local f = next_fence(KEYS[2], ARGV[3])
    local value = new_hold(ARGV[1], f)
    if claim and claimant ~= locker then
      value = with_field(value, 'w', claim)
    end
    redis.call('PSETEX', KEYS[1], ARGV[2], value)
    return {1, f}
  end
  waits()
  local pttl = redis.call('PTTL', KEYS[1])
  if foreign(v) then
    return {2, pttl}
  end
  if claim_ms ~= '0' then
    local since, _, claimant = claim_of(field(v, 'w'))
    if (not since or claimant == locker or tonumber(since) > tonumber(ARGV[6])) and pttl > 0 then
      redis.call('PSETEX', KEYS[1], pttl, set_field(v, 'w', encode_claim(ARGV[6], claim_ms, locker)))
    end
  end
  return {0, pttl}
end
local first = redis.call('ZRANGE', KEYS[3], 0, 0, 'WITHSCORES')
if first[2] then
  waits()
  return {0, tonumber(first[2]) - now}
end
redis.call('ZREM', KEYS[4], ARGV[1])
return {1, take_fenced(KEYS[1], KEYS[2], ARGV[3], ARGV[1], ARGV[2])}
