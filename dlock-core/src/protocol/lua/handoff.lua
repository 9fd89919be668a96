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
--          a cluster): unused here (whether another `Locker` waits is read from the hold),
--          kept for layout 1's script, which the same call drives
-- ARGV[6]  the id of the `Locker` handing over
-- ARGV[7]  the command that wakes waiters (PUBLISH; SPUBLISH on a cluster)
--
-- Returns
--   {1, token}  handed over
--   {0, code}   not handed over: -1 expired, -2 held by another owner (as RELEASE answers)
--   {2, woken}  waiters elsewhere want it (a waiter of another `Locker` found the hold taken,
--               or is next in turn), so it was released instead, as RELEASE does; `woken`
--               subscribers got the wake-up
-- Whether another `Locker` waits is read from the hold, not from the channel's subscribers (a
-- subscription may linger after its last waiter): every attempt that finds the hold taken
-- flags it with its `Locker` (` l<locker id>`, a bare ` l` once several did), and a hold is
-- handed over only while no other `Locker`'s waiter flagged it or claims the next turn. A
-- waiter of another `Locker` woken by an earlier release flags the hold its attempt finds.
-- The common case first, before any helper but the fencing counter's is defined: the hold is
-- ARGV[1]'s, nobody of another `Locker` flagged it or claims the next turn, so it passes to
-- ARGV[2] with the next token. The hold's own token, if it has one, is the counter's last (a
-- token is minted only for the holder of the lock), so the counter is not read again, and the
-- next token is that one + 1, so neither is the clock (see `next_fence`).
-- (`take_fenced` needs the hold codec, defined after it here: it is not called.)
--@flags allow-oom
--@include fence
local v = redis.call('GET', KEYS[1])
if not v then
  return {0, -1}
end
local space = string.find(v, ' ', 1, true)
local holder = v
if space then
  holder = string.sub(v, 1, space - 1)
end
if holder ~= ARGV[1] then
  return {0, -2}
end
local claim = space and string.match(v, ' w([^ ]*)', space)
local waited = space and string.match(v, ' l([^ ]*)', space)
if (not claim or string.match(claim, '^%d+:%d+:([^:]+)') == ARGV[6])
  and (not waited or waited == ARGV[6]) then
  local known = space and string.match(v, ' f(%d+)', space)
  local f = next_fence(KEYS[2], ARGV[4], known)
  redis.call('PSETEX', KEYS[1], ARGV[3], ARGV[2] .. ' f' .. string.format('%d', f))
  return {1, f}
end
--@include clock
--@include hold
--@include let_go
local _, _, next_in = claim_of(claim)
if (next_in and next_in ~= ARGV[6]) or waited_by_others(v, ARGV[6]) then
  return {2, redis.call(ARGV[7], KEYS[3], let_go(KEYS[1], claim, v, ARGV[7] == 'SPUBLISH'))}
end
local f = next_fence(KEYS[2], ARGV[4])
redis.call('PSETEX', KEYS[1], ARGV[3], new_hold(ARGV[2], f))
return {1, f}
