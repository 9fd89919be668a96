-- HANDOFF: a hand-over inside one process. Releases ARGV[1]'s hold and, in the same step,
-- acquires for ARGV[2] with a fresh fencing token, so a local waiter takes over without a
-- wake-up round trip.
--
-- KEYS[1]  the lock
-- KEYS[2]  its fencing counter
-- KEYS[3]  its wake-up channel
-- ARGV[1]  the owner handing over
-- ARGV[2]  the new owner
-- ARGV[3]  lease, ms
-- ARGV[4]  fence TTL, ms (`0`: none)
-- ARGV[5]  the PUBSUB subcommand that counts a channel's subscribers (NUMSUB; SHARDNUMSUB on
--          a cluster)
-- ARGV[6]  the id of the `Locker` handing over
-- ARGV[7]  the command that wakes waiters (PUBLISH; SPUBLISH on a cluster)
--
-- Returns
--   {1, token}  handed over
--   {0, code}   not handed over: -1 expired, -2 held by another owner (as RELEASE answers)
--   {2, woken}  waiters elsewhere want it (another `Locker` listens for its release, or a
--               waiter of another `Locker` is next in turn), so it was released instead, as
--               RELEASE does; `woken` subscribers got the wake-up
--@include clock
--@include hold
--@include fence
--@include let_go
local v = redis.call('GET', KEYS[1])
if not v or who(v) ~= ARGV[1] then
  if v then
    return {0, -2}
  end
  return {0, -1}
end
local claim = field(v, 'w')
local _, _, next_in = claim_of(claim)
if (next_in and next_in ~= ARGV[6]) or redis.call('PUBSUB', ARGV[5], KEYS[3])[2] > 1 then
  return {2, redis.call(ARGV[7], KEYS[3], let_go(KEYS[1], claim, v, ARGV[7] == 'SPUBLISH'))}
end
return {1, take_fenced(KEYS[1], KEYS[2], ARGV[4], ARGV[2], ARGV[3])}
