-- PERMITS: a semaphore's permits now (read-only).
--
-- KEYS[1]  the permits
-- KEYS[2]  the count set at run time
--
-- Returns {held, set}: the unexpired permits, and the count set (-1: none).
--@flags no-writes
--@include clock
--@include sorted_sets
local held = redis.call('ZCOUNT', KEYS[1], '(' .. now_ms(), '+inf')
return {held, tonumber(redis.call('GET', KEYS[2]) or '-1') or -1}
