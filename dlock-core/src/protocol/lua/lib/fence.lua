-- `next_fence(fence_key, fence_ttl, known, t)`: the next fencing token of `fence_key` — the
-- server clock in microseconds, or the last token + 1 when the clock is not past it — stored as
-- its last token; a new counter key gets the TTL in `fence_ttl` (ms, `'0'`: none). `known`, if
-- given, is the last token the caller read already; `t`, the `TIME` reply it read already.
-- Given `known` and no `t` (a hand-over from the hold that minted `known`), the token is
-- `known` + 1 and the clock is not read: a token minted from the clock, then raised by one per
-- hand-over, stays below the clock, since hand-overs come more than a microsecond apart — so a
-- promoted replica's clock still mints above it. Lua numbers are doubles: microseconds since
-- 1970 stay exact until 2255.
-- `take_fenced(lock, fence_key, fence_ttl, owner, lease_ms)`: `lock` held by `owner` for
-- `lease_ms`, with a fresh fencing token of `fence_key`, which it returns. Needs the hold codec
-- (scripts include `hold` before `fence`).
local function next_fence(fence_key, fence_ttl, known, t)
  local f = 0
  if t or not known then
    t = t or redis.call('TIME')
    f = tonumber(t[1]) * 1000000 + tonumber(t[2])
  end
  local last = known
  if last == nil then
    last = redis.call('HGET', fence_key, 'n')
  end
  if last then
    last = tonumber(last)
    if f <= last then
      f = last + 1
    end
  end
  -- A counter made here (none was there, or the one `known` came from is gone) gets its TTL.
  if redis.call('HSET', fence_key, 'n', string.format('%d', f)) == 1
    and fence_ttl ~= '0' and redis.call('PTTL', fence_key) == -1 then
    redis.call('PEXPIRE', fence_key, fence_ttl)
  end
  return f
end
local function take_fenced(lock, fence_key, fence_ttl, owner, lease_ms)
  local f = next_fence(fence_key, fence_ttl)
  redis.call('PSETEX', lock, lease_ms, new_hold(owner, f))
  return f
end
