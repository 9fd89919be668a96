-- INSPECT: what a name holds, for operators (read-only): its lock, its read-write lock and its
-- semaphore, which live apart under the one name.
--
-- KEYS[1]  the lock
-- KEYS[2]  its fencing counter
-- KEYS[3]  its wake-up channel
-- KEYS[4]  the fair lock's queue
-- KEYS[5]  the read-write lock's writer
-- KEYS[6]  the read-write lock's readers
-- KEYS[7]  the semaphore's permits
-- KEYS[8]  the semaphore's permit count set at run time
-- ARGV[1]  the PUBSUB subcommand that counts a channel's subscribers (NUMSUB; SHARDNUMSUB on a
--          cluster)
--
-- Returns {pttl, holders, token, kept, foreign, last, subscribers, queued,
--          writer_pttl, writer, readers, permits, limit}:
--   pttl         the lock key's PTTL (-2: gone)
--   holders      each holder as its owner token's first 8 hex digits (after the layout's tag)
--                and its label (the part after `@`, or ''): never the whole token
--   token        the current hold's fencing token ('': none)
--   kept         1 if the key is kept after a release (`at_least`)
--   foreign      1 if the lock's or the writer's key holds something other than a hold (not an
--                owner token of 32 hex digits after an optional layout tag, nor a kept key)
--   last         the last fencing token handed out ('': none)
--   subscribers  the wake-up channel's subscribers (one per waiting `Locker`)
--   queued       the number of waiters in a fair lock's line
--   writer_pttl  the writer's key PTTL (-2: none)
--   writer       the writer, as `holders` gives the lock's holder
--   readers      the readers whose lease has not run out
--   permits      the permits taken whose lease has not run out
--   limit        the permit count set at run time ('': none)
--@flags no-writes
--@include hold
--@include clock

-- What a hold's key holds: its PTTL, then 'none', 'kept', 'reserved', 'foreign', or 'held'
-- with the holder (its token's first 8 characters and its label) and its fencing token.
local function read_hold(key)
  local pttl = redis.call('PTTL', key)
  if pttl == -2 then
    return pttl, 'none'
  end
  local v = redis.call('TYPE', key)['ok'] == 'string' and redis.call('GET', key)
  local holder = v and who(v) or ''
  -- A token's layout tag (`v2/`, …) comes before its 32 hex digits.
  holder = string.match(holder, '^v%d+/(.*)$') or holder
  local hex = string.match(holder, '^%x+')
  if is_kept_after(holder) then
    return pttl, 'kept'
  elseif is_kept_for(holder) then
    return pttl, 'reserved'
  elseif hex and #hex == 32 and (#holder == 32 or string.sub(holder, 33, 33) == '@') then
    local shown = {string.sub(holder, 1, 8), string.match(holder, '@(.*)$') or ''}
    return pttl, 'held', shown, field(v, 'f') or ''
  end
  return pttl, 'foreign'
end

-- How many members of a sorted set of `id -> expiry` have not expired.
local function live(key, now)
  if redis.call('TYPE', key)['ok'] ~= 'zset' then
    return 0
  end
  return redis.call('ZCOUNT', key, '(' .. now, '+inf')
end

local pttl, state, holder, token = read_hold(KEYS[1])
local writer_pttl, writer_state, writer = read_hold(KEYS[5])
local foreign = 0
if state == 'foreign' or writer_state == 'foreign' then
  foreign = 1
end
local last = ''
if redis.call('TYPE', KEYS[2])['ok'] == 'hash' then
  last = redis.call('HGET', KEYS[2], 'n') or ''
end
local subscribers = redis.call('PUBSUB', ARGV[1], KEYS[3])[2]
local queued = 0
if redis.call('TYPE', KEYS[4])['ok'] == 'zset' then
  queued = redis.call('ZCARD', KEYS[4])
end
local now = now_ms()
local limit = ''
if redis.call('TYPE', KEYS[8])['ok'] == 'string' then
  limit = redis.call('GET', KEYS[8])
end
return {pttl, holder or {}, token or '', state == 'kept' and 1 or 0, foreign, last, subscribers,
  queued, writer_pttl, writer or {}, live(KEYS[6], now), live(KEYS[7], now), limit}
