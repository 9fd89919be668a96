-- RELEASE_PERMIT: gives a permit back and wakes waiters.
--
-- KEYS[1]  the permits
-- ARGV[1]  the permit id
-- ARGV[2]  the command that wakes waiters (PUBLISH; SPUBLISH on a cluster)
-- ARGV[3]  the wake-up channel: an argument, not a key, so the script names one key alone and
--          runs while the slot migrates (it shares the permits' hash tag)
--
-- Returns, as RELEASE does
--   n >= 0  given back; n subscribers got the wake-up
--   -1      gone: expired (an expired permit stays in the set until an acquisition sweeps it;
--           it is removed here, and counts as gone), or given back by an earlier try of the
--           same release
--@include clock
--@include sorted_sets
local expiry = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not expiry then
  return -1
end
redis.call('ZREM', KEYS[1], ARGV[1])
if tonumber(expiry) <= now_ms() then
  return -1
end
return redis.call(ARGV[2], ARGV[3], '1')
