-- ACQUIRE_PERMIT: takes a semaphore's permit when fewer than its count are held. Expired
-- permits are dropped first.
--
-- KEYS[1]  the permits: permit id -> expiry (server ms)
-- KEYS[2]  the count set at run time (SET_PERMITS)
-- ARGV[1]  the permit id (fresh)
-- ARGV[2]  lease, ms
-- KEYS[3]  optional: the claim to the next free permit (a claim, as a plain lock's ` w` field
--          holds one: see ACQUIRE)
-- ARGV[3]  the count to use when none was set
-- ARGV[4]  optional: `0`, or the ms a release should keep a permit for this attempt's
--          `Locker` if all are taken: the attempt then claims the next free permit for that
--          `Locker` in KEYS[3], unless another `Locker`'s claim as old as this one or older is
--          there (a claim of the same `Locker` is replaced)
-- ARGV[5]  with ARGV[4]: since when the waiter waits (wall-clock ms)
-- ARGV[6]  with ARGV[4]: the id of the attempt's `Locker`
-- ARGV[7]  with ARGV[4]: `1` if the attempt comes from the head of its local line (which
--          alone takes a permit kept for its `Locker`), else `0`
--
-- A permit kept for a `Locker` is the member `#r:<locker>`, until its score: it counts as held.
--
-- Returns
--   {1, 0}   taken (also when ARGV[1] holds it already: a retry); taken by a head waiter, a
--            claim of its `Locker` is served, and goes
--   {0, ms}  all taken, the first of them expiring in `ms` at the latest (-1: none is held,
--            the count is 0)
--@include clock
--@include sorted_sets
--@include hold
local now = now_ms()
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZSCORE', KEYS[1], ARGV[1]) then
  return {1, 0}
end
local claim_ms, locker = ARGV[4] or '0', ARGV[6] or ''
-- A permit kept for this Locker is its head waiter's: given up here, and taken below unless
-- the count went down meanwhile.
local head = ARGV[7] == '1'
if head then
  redis.call('ZREM', KEYS[1], kept_for(locker))
end
local limit = tonumber(redis.call('GET', KEYS[2]) or ARGV[3]) or 0
if redis.call('ZCARD', KEYS[1]) < limit then
  add_until(KEYS[1], ARGV[1], now, tonumber(ARGV[2]))
  -- The head waiter's claim is served (a first attempt leaves the claim of another waiter of
  -- its Locker where it is).
  if head and KEYS[3] then
    local _, _, claimant = claim_of(redis.call('GET', KEYS[3]))
    if claimant == locker then
      redis.call('DEL', KEYS[3])
    end
  end
  return {1, 0}
end
if KEYS[3] and claim_ms ~= '0' then
  local since, _, claimant = claim_of(redis.call('GET', KEYS[3]))
  if not since or claimant == locker or tonumber(since) > tonumber(ARGV[5]) then
    -- The claim lasts as long as the permits may (a waiter's next attempt says it again).
    local px = math.max(redis.call('PTTL', KEYS[1]), 0) + tonumber(claim_ms)
    redis.call('PSETEX', KEYS[3], px, encode_claim(ARGV[5], claim_ms, locker))
  end
end
local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
if first[2] then
  return {0, tonumber(first[2]) - now}
end
return {0, -1}
