-- RELEASE_PERMIT: gives a permit back and wakes waiters.
--
-- KEYS[1]  the permits
-- ARGV[1]  the permit id
-- ARGV[2]  the command that wakes waiters (PUBLISH; SPUBLISH on a cluster)
-- ARGV[3]  the wake-up channel: an argument, not a key, so the script names one key alone and
--          runs while the slot migrates (it shares the permits' hash tag)
-- KEYS[2]  optional: the claim to the next free permit (see ACQUIRE_PERMIT); named unless the
--          slot migrates
-- ARGV[4]  optional: how many permits were taken at once as ARGV[1] (default 1): all go
--
-- A permit given back while another `Locker` claims the next one is kept for that `Locker`
-- (the member `#r:<locker>`) for the time its claim asked, and the claim goes: its head
-- waiter's attempt takes the permit (as a plain lock's release keeps the lock, see `let_go`).
-- A claim of several keeps every free permit already, and stays.
--
-- Returns, as RELEASE does
--   n >= 0  given back; n subscribers got the wake-up
--   -1      gone: expired (an expired permit stays in the set until an acquisition sweeps it;
--           it is removed here, and counts as gone), or given back by an earlier try of the
--           same release
--@flags allow-oom
--@include clock
--@include sorted_sets
--@include hold
local expiry = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not expiry then
  return -1
end
on_permits('ZREM', KEYS[1], ARGV[1], 1, tonumber(ARGV[4] or '1'))
local now = now_ms()
if tonumber(expiry) <= now then
  return -1
end
if KEYS[2] then
  local claim = redis.call('GET', KEYS[2])
  local _, ms, locker = claim_of(claim)
  if locker and permits_claimed(claim) == 1 then
    add_until(KEYS[1], kept_for(locker), now, tonumber(ms))
    redis.call('DEL', KEYS[2])
  end
end
return redis.call(ARGV[2], ARGV[3], '1')
