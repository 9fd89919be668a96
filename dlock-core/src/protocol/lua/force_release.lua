-- FORCE_RELEASE: an operator's release of whatever holds a name, owner or not (its holders
-- learn of the loss at their next renewal). Wakes the waiters of a plain lock on the name's
-- channel, and the head of a fair lock's line, if the name has one, on its own.
--
-- KEYS[1]  the lock
-- KEYS[2]  its wake-up channel
-- KEYS[3]  the fair lock's queue
-- KEYS[4]  the fair lock's alive set
-- ARGV[1]  the command that wakes waiters (PUBLISH; SPUBLISH on a cluster)
--
-- Returns 1 if a key was removed, 0 if there was none.
--@include clock
--@include sorted_sets
if redis.call('DEL', KEYS[1]) == 1 then
  redis.call(ARGV[1], KEYS[2], '1')
  local head = fair_head(KEYS[3], KEYS[4], now_ms())
  if head then
    redis.call(ARGV[1], KEYS[2] .. ':' .. head, '1')
  end
  return 1
end
return 0
