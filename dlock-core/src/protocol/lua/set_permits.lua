-- SET_PERMITS: sets a semaphore's permit count at run time, and wakes waiters.
--
-- KEYS[1]  the count
-- KEYS[2]  the wake-up channel
-- ARGV[1]  the count; '' removes it, so each handle's own count applies again
-- ARGV[2]  the command that wakes waiters (PUBLISH; SPUBLISH on a cluster)
--
-- Returns 1.
if ARGV[1] == '' then
  redis.call('DEL', KEYS[1])
else
  redis.call('SET', KEYS[1], ARGV[1])
end
redis.call(ARGV[2], KEYS[2], '1')
return 1
