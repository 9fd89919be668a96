-- FORCE_RELEASE: an operator's release of whatever holds a name, owner or not (its holders
-- learn of the loss at their next renewal): its lock, its read-write lock's writer and readers,
-- and its semaphore's permits. Wakes the waiters of each kind it freed: a plain lock's on the
-- name's channel and the head of a fair lock's line on its own; the read-write lock's and the
-- semaphore's on theirs.
--
-- KEYS[1]  the lock
-- KEYS[2]  its wake-up channel
-- KEYS[3]  the fair lock's queue
-- KEYS[4]  the fair lock's alive set
-- KEYS[5]  the read-write lock's writer
-- KEYS[6]  the read-write lock's readers
-- KEYS[7]  the read-write lock's wake-up channel
-- KEYS[8]  the semaphore's permits
-- KEYS[9]  the semaphore's wake-up channel
-- ARGV[1]  the command that wakes waiters (PUBLISH; SPUBLISH on a cluster)
--
-- Returns how many of the lock, the writer, the readers and the permits it removed (0: there
-- was nothing to remove).
--@flags allow-oom
--@include clock
--@include sorted_sets
local removed = 0
if redis.call('DEL', KEYS[1]) == 1 then
  removed = removed + 1
  redis.call(ARGV[1], KEYS[2], '1')
  local head = fair_head(KEYS[3], KEYS[4], now_ms())
  if head then
    redis.call(ARGV[1], KEYS[2] .. ':' .. head, '1')
  end
end
local rw = redis.call('DEL', KEYS[5], KEYS[6])
if rw > 0 then
  removed = removed + rw
  redis.call(ARGV[1], KEYS[7], '1')
end
if redis.call('DEL', KEYS[8]) == 1 then
  removed = removed + 1
  redis.call(ARGV[1], KEYS[9], '1')
end
return removed
