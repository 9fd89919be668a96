-- HOLDS_MEMBER: whether a member (a permit, a reader) of a set is still in (read-only).
--
-- KEYS[1]  the set
-- ARGV[1]  the member
--
-- Returns {1, 0} in, {0, -2} gone.
--@flags no-writes
--@include clock
--@include sorted_sets
local expiry = redis.call('ZSCORE', KEYS[1], ARGV[1])
if expiry and tonumber(expiry) > now_ms() then
  return {1, 0}
end
return {0, -2}
