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
-- ARGV[8]  optional: how many permits the attempt takes at once, all or none (default 1); the
--          first is the member ARGV[1], the others `permit_member(ARGV[1], k)`
-- ARGV[9]  with ARGV[8]: the command that wakes waiters (PUBLISH; SPUBLISH on a cluster)
-- ARGV[10] with ARGV[8]: the wake-up channel
--
-- A permit kept for a `Locker` is the member `#r:<locker>`, until its score: it counts as held.
--
-- A claim for several permits (`<since>:<ms>:<locker>:<n>`, made by an attempt for n > 1) keeps
-- every free permit for its `Locker`'s head waiter while it stands: no other attempt takes one
-- (a release keeps none for it: the permits it frees wait, free, until the claimant has
-- enough). It lasts `ms`, which its waiter says again in time; served, it goes, and waiters
-- are woken for the permits left free.
--
-- Returns
--   {1, 0}   taken (also when ARGV[1] holds it already: a retry); taken by a head waiter, a
--            claim of its `Locker` is served, and goes
--   {0, ms}  not enough free (or they are kept for a claim of several), the first permit
--            expiring (or the claim of several ending) in `ms` at the latest (-1: none is held,
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
local n = tonumber(ARGV[8] or '1')
-- A permit kept for this Locker is its head waiter's: given up here, and taken below unless
-- the count went down meanwhile.
local head = ARGV[7] == '1'
if head then
  redis.call('ZREM', KEYS[1], kept_for(locker))
end
local limit = tonumber(redis.call('GET', KEYS[2]) or ARGV[3]) or 0
local claim = KEYS[3] and redis.call('GET', KEYS[3])
local since, _, claimant = claim_of(claim)
local claimed = permits_claimed(claim)
-- Free permits kept for a claim of several: only its own head waiter takes them.
local kept = claimant and claimed > 1 and not (head and claimant == locker)
if not kept and redis.call('ZCARD', KEYS[1]) + n <= limit then
  local lease = tonumber(ARGV[2])
  if n == 1 then
    add_until(KEYS[1], ARGV[1], now, lease)
  else
    on_permits('ZADD', KEYS[1], ARGV[1], 1, n, now + lease)
    if redis.call('PTTL', KEYS[1]) < lease then
      redis.call('PEXPIRE', KEYS[1], lease)
    end
  end
  -- The head waiter's claim is served (a first attempt leaves the claim of another waiter of
  -- its Locker where it is); a claim of several kept others out, who may come now.
  if head and claimant == locker then
    redis.call('DEL', KEYS[3])
    if claimed > 1 and redis.call('ZCARD', KEYS[1]) < limit then
      redis.call(ARGV[9], ARGV[10], '1')
    end
  end
  return {1, 0}
end
-- More than the count is never claimed: it would keep the permits from everyone for nothing.
if KEYS[3] and claim_ms ~= '0' and n <= limit then
  -- A claim of this Locker's is replaced, except a claim of several by another of its waiters
  -- than the head.
  local own = claimant == locker and (head or claimed == 1)
  if not since or own or tonumber(since) > tonumber(ARGV[5]) then
    -- A claim of one lasts as long as the permits may (a waiter's next attempt says it again);
    -- a claim of several keeps permits from others, and lasts the time it asks.
    local px = tonumber(claim_ms)
    local value = encode_claim(ARGV[5], claim_ms, locker)
    if n > 1 then
      value = value .. ':' .. n
    else
      px = math.max(redis.call('PTTL', KEYS[1]), 0) + px
    end
    redis.call('PSETEX', KEYS[3], px, value)
    kept = false
  end
end
local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
local ms = -1
if first[2] then
  ms = tonumber(first[2]) - now
end
-- Kept out by another's claim of several: come again when it ends, if sooner.
if kept then
  local left = redis.call('PTTL', KEYS[3])
  if left > 0 and (ms < 0 or left < ms) then
    ms = left
  end
end
return {0, ms}
