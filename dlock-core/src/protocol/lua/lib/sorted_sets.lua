-- The helpers of the sorted-set kinds (after `clock_lua`'s `now_ms()`): `add_until(key,
-- member, now, ms)`, the member in `key` until `ms` from `now`, the key kept at least that long;
-- `fair_head(queue, alive, now)`, the first waiter of a fair lock's line still alive (those
-- ahead of it whose time is up leave the line); `permit_member(id, k)`, the member of the `k`th
-- permit of the permits taken at once as `id` (the first is `id` itself, the others `id*k`);
-- `on_permits(command, key, id, from, to, score)`, `command` (`ZADD`, `ZADD XX` with `score`,
-- or `ZREM`) on the members of permits `from` to `to` of `id`, a thousand per call (Lua's
-- `unpack` has a bound).
local function add_until(key, member, now, ms)
  redis.call('ZADD', key, now + ms, member)
  if redis.call('PTTL', key) < ms then
    redis.call('PEXPIRE', key, ms)
  end
end
local function permit_member(id, k)
  if k == 1 then
    return id
  end
  return id .. '*' .. k
end
local function on_permits(command, key, id, from, to, score)
  for first = from, to, 1000 do
    local args = {}
    if command == 'ZADD XX' then
      args[1] = 'XX'
    end
    for k = first, math.min(to, first + 999) do
      if score then
        args[#args + 1] = score
      end
      args[#args + 1] = permit_member(id, k)
    end
    redis.call(string.sub(command, 1, 4), key, unpack(args))
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
