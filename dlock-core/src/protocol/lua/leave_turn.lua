-- LEAVE_TURN: a waiter that claimed the next turn (see ACQUIRE) stops waiting without the
-- lock. Its claim goes (any claim of its `Locker`'s, if it was the last waiter there), and so
-- does a lock kept for its `Locker` if no other waiter of it is left, or granted to its
-- hand-over token: nobody waits for a turn that will not be taken. A lock kept for the `Locker`
-- or granted to the token passes on as a release passes it (see `let_go`), and waiters are
-- woken.
--
-- KEYS[1]  the lock (a plain lock's, or a writer's); a semaphore's permits with KEYS[3]
-- KEYS[2]  its wake-up channel
-- KEYS[3]  optional: a semaphore's claim to the next free permit (see ACQUIRE_PERMIT): the
--          claim there goes, and a permit kept for the `Locker` (its last waiter gone); a
--          claim of several kept free permits from others, who are woken
-- ARGV[1]  since when the waiter waited (as in its claim)
-- ARGV[2]  the id of its `Locker`
-- ARGV[3]  `1` if it was that `Locker`'s last waiter for the name, else `0`
-- ARGV[4]  the command that wakes waiters (PUBLISH; SPUBLISH on a cluster)
-- ARGV[5]  optional: the waiter's hand-over token
--
-- Returns 1 if it removed anything, else 0.
--@flags allow-oom
--@include clock
--@include hold
--@include fence
--@include let_go
if KEYS[3] then
  local left = 0
  local claim = redis.call('GET', KEYS[3])
  local since, _, locker = claim_of(claim)
  if locker == ARGV[2] and (since == ARGV[1] or ARGV[3] == '1') then
    redis.call('DEL', KEYS[3])
    left = permits_claimed(claim)
  end
  if ARGV[3] == '1' and redis.call('ZREM', KEYS[1], kept_for(ARGV[2])) == 1 then
    left = 2
  end
  if left > 1 then
    redis.call(ARGV[4], KEYS[2], '1')
  end
  return math.min(left, 1)
end
local v = redis.call('GET', KEYS[1])
if not v then
  return 0
end
local claim = field(v, 'w')
local left = 0
if claim then
  local since, _, locker = claim_of(claim)
  if locker == ARGV[2] and (since == ARGV[1] or ARGV[3] == '1') then
    claim = nil
    left = 1
  end
end
local holder = who(v)
local granted = (ARGV[5] or '') ~= '' and holder == ARGV[5]
if granted or (holder == kept_for(ARGV[2]) and ARGV[3] == '1') then
  redis.call(ARGV[4], KEYS[2], let_go(KEYS[1], claim, v, ARGV[4] == 'SPUBLISH'))
  return 1
end
if left == 1 then
  rewrite(KEYS[1], without(v, 'w'))
end
return left
