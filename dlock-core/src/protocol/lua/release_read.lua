-- RELEASE_READ: a reader leaves; the last one wakes the waiters (writers).
--
-- KEYS[1]  the readers
-- ARGV[1]  the reader id
-- ARGV[2]  the command that wakes waiters (PUBLISH; SPUBLISH on a cluster)
-- ARGV[3]  the wake-up channel: an argument, not a key (see RELEASE_PERMIT)
--
-- Returns, as RELEASE does
--   n >= 0  left; n subscribers got the wake-up
--   -1      gone: expired (an expired reader stays in the set until an acquisition sweeps it;
--           it is removed here, counts as gone, and wakes the writers if it was the last), or
--           an earlier try of the same release
--@flags allow-oom
--@include clock
--@include sorted_sets
local expiry = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not expiry then
  return -1
end
redis.call('ZREM', KEYS[1], ARGV[1])
local woken = 0
if redis.call('EXISTS', KEYS[1]) == 0 then
  woken = redis.call(ARGV[2], ARGV[3], '1')
end
if tonumber(expiry) <= now_ms() then
  return -1
end
return woken
