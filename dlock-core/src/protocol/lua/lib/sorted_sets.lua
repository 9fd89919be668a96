-- The helpers of the sorted-set kinds (after `clock_lua`'s `now_ms()`): `add_until(key,
-- member, now, ms)`, the member in `key` until `ms` from `now`, the key kept at least that long;
-- `fair_head(queue, alive, now)`, the first waiter of a fair lock's line still alive (those
-- ahead of it whose time is up leave the line).
local function add_until(key, member, now, ms)
  redis.call('ZADD', key, now + ms, member)
  if redis.call('PTTL', key) < ms then
    redis.call('PEXPIRE', key, ms)
  end
end
local function fair_head(queue, alive, now)
  for _ = 1, 100 do
    local head = redis.call('ZRANGE', queue, 0, 0)[1]
    if not head then
      return nil
    end
    local until_ms = redis.call('ZSCORE', alive, head)
    if until_ms and tonumber(until_ms) > now then
      return head
    end
    redis.call('ZREM', queue, head)
    redis.call('ZREM', alive, head)
  end
  return redis.call('ZRANGE', queue, 0, 0)[1]
end
