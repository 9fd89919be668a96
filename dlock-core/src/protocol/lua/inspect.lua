-- INSPECT: what a name holds, for operators (read-only).
--
-- KEYS[1]  the lock
-- KEYS[2]  its fencing counter
-- KEYS[3]  its wake-up channel
-- KEYS[4]  the fair lock's queue
-- ARGV[1]  the PUBSUB subcommand that counts a channel's subscribers (NUMSUB; SHARDNUMSUB on a
--          cluster)
--
-- Returns {pttl, holders, token, kept, foreign, last, subscribers, queued}:
--   pttl         the lock key's PTTL (-2: gone)
--   holders      each holder as its owner token's first 8 characters and its label (the part
--                after `@`, or ''): never the whole token
--   token        the current hold's fencing token ('': none)
--   kept         1 if the key is kept after a release (`at_least`)
--   foreign      1 if the key holds something other than a lock (not an owner token of 32 hex
--                digits, nor a kept key)
--   last         the last fencing token handed out ('': none)
--   subscribers  the wake-up channel's subscribers (one per waiting `Locker`)
--   queued       the number of waiters in a fair lock's line
--@include hold
local pttl = redis.call('PTTL', KEYS[1])
local holders = {}
local token = ''
local kept = 0
local foreign = 0
if pttl ~= -2 then
  local v = redis.call('TYPE', KEYS[1])['ok'] == 'string' and redis.call('GET', KEYS[1])
  local holder = v and who(v) or ''
  local hex = string.match(holder, '^%x+')
  if is_kept_after(holder) then
    kept = 1
  elseif is_kept_for(holder) then
    kept = 0
  elseif hex and #hex == 32 and (#holder == 32 or string.sub(holder, 33, 33) == '@') then
    holders[1] = string.sub(holder, 1, 8)
    holders[2] = string.match(holder, '@(.*)$') or ''
    token = field(v, 'f') or ''
  else
    foreign = 1
  end
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
return {pttl, holders, token, kept, foreign, last, subscribers, queued}
