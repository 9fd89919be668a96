-- The hold codec: the one place a script reads or writes what a lock's key holds (the format is
-- in ARCHITECTURE.md, "What a lock's key holds"; `protocol/hold.rs` is the same codec in Rust).
--
-- who(v)              the first word: the owner token, or `#k:<owner>` / `#r:<locker>`
-- field(v, tag)       the field `tag` (`nil` when absent; a flag answers `''`)
-- token_of(v)         the hold's fencing token as a number, -1 while none was minted: what a
--                     script answers its holder (`{1, token_of(v)}`)
-- without(v, tag)     `v` without the field `tag`
-- flagged(v, locker)  `v` flagged as waited for (` l`, a waiter found it taken) by `locker`:
--                     ` l<locker>` while that `Locker`'s waiters alone found it taken, a bare
--                     ` l` once another's did too (or when `locker` is not given)
-- waited_by_others(v, locker)
--                     whether a waiter of a `Locker` other than `locker` may have found the
--                     hold taken (its ` l` flag names another, or none)
-- with_field(v, tag, value)
--                     `v` with the field `tag` added at its end (`value` nil for a flag):
--                     for a field `v` does not have
-- set_field(v, tag, value)
--                     `v` with the field `tag` set to `value`, whatever it had
-- new_hold(owner, f)  a hold of `owner` with the fencing token `f`
-- rewrite(key, v)     stores `v` at `key`, keeping its expiry
-- kept_after(owner)   the first word of a key kept taken after `owner`'s release (`at_least`)
-- kept_for(locker)    the first word of a key kept for `locker`, next in turn
-- is_kept_after(h)    whether the first word `h` is a `kept_after` one
-- is_kept_for(h)      whether the first word `h` is a `kept_for` one
-- encode_claim(since, ms, locker, grant)
--                     a claim to the next turn (the ` w` field's value); `grant`, if given, is
--                     `{at, window, fence_ttl, n, token}` of a head waiter's claim
-- claim_of(w)         `since, ms, locker, grant` of a claim (`grant` as above, or `nil`); all
--                     `nil` when `w` is `nil`, or when the claim's `Locker` is tagged with a
--                     layout this one does not speak
-- permits_claimed(w)  how many permits a semaphore's claim `w` waits for (`1` unless it says)
-- speaks(token)       whether this layout speaks the layout `token` is in: its own (tokens
--                     tagged `v2/`) and layout 1's (untagged tokens)
-- foreign(v)          whether the hold `v` is in a layout this one does not speak: such a hold
--                     is busy, and never written
local function who(v)
  return string.match(v, '^[^ ]+')
end
local function field(v, tag)
  return string.match(v, ' ' .. tag .. '([^ ]*)')
end
local function token_of(v)
  return tonumber(field(v, 'f') or '-1')
end
local function without(v, tag)
  return (string.gsub(v, ' ' .. tag .. '[^ ]*', ''))
end
local function rewrite(key, v)
  local pttl = redis.call('PTTL', key)
  if pttl > 0 then
    redis.call('PSETEX', key, pttl, v)
  end
end
local function with_field(v, tag, value)
  return v .. ' ' .. tag .. (value or '')
end
local function set_field(v, tag, value)
  return with_field(without(v, tag), tag, value)
end
local function flagged(v, locker)
  local by = field(v, 'l')
  if not by then
    return with_field(v, 'l', locker)
  end
  if by == '' or by == locker then
    return v
  end
  return set_field(v, 'l', '')
end
local function waited_by_others(v, locker)
  local by = field(v, 'l')
  return by ~= nil and by ~= locker
end
local function new_hold(owner, f)
  return with_field(owner, 'f', string.format('%d', f))
end
local function kept_after(owner)
  return '#k:' .. owner
end
local function kept_for(locker)
  return '#r:' .. locker
end
local function is_kept_after(holder)
  return string.sub(holder, 1, 3) == '#k:'
end
local function is_kept_for(holder)
  return string.sub(holder, 1, 3) == '#r:'
end
local function speaks(token)
  local n = string.match(token, '^v(%d+)/')
  return n == nil or n == '2'
end
local function foreign(v)
  local h = who(v)
  if is_kept_after(h) or is_kept_for(h) then
    h = string.sub(h, 4)
  end
  return not speaks(h)
end
local function encode_claim(since, ms, locker, grant)
  local w = since .. ':' .. ms .. ':' .. locker
  if grant then
    w = w .. ':' .. table.concat(grant, ':')
  end
  return w
end
local function claim_of(w)
  if not w then
    return nil
  end
  local since, ms, locker, rest = string.match(w, '^(%d+):(%d+):([%w/]+)(.*)$')
  if not locker or not speaks(locker) then
    return nil
  end
  local at, window, fence_ttl, n, token = string.match(rest or '', '^:(%d+):(%d+):(%d+):(%d+):(.+)$')
  if token then
    return since, ms, locker, {at, window, fence_ttl, n, token}
  end
  return since, ms, locker, nil
end
local function permits_claimed(w)
  return tonumber(w and string.match(w, '^%d+:%d+:[%w/]+:(%d+)$') or '1')
end
