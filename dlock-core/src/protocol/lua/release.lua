-- RELEASE: an owner-checked release of a lock (plain or fair) or a writer's hold.
--
-- KEYS[1]  the lock
-- KEYS[2]  optional: its wake-up channel (default: the lock's key and `:wake`, a plain lock's)
-- KEYS[3]  mode 1: the fair lock's queue; mode 2: the writers waiting
-- KEYS[4]  mode 1: the fair lock's alive set
-- ARGV[1]  owner
-- The rest are optional; the common release of a plain lock sends its key and owner alone:
-- ARGV[2]  the owner a hand-over of ARGV[1]'s hold may have gone to (default empty: none)
-- ARGV[3]  the command that wakes waiters (default PUBLISH; SPUBLISH on a cluster)
-- ARGV[4]  how long the name stays taken after the release, ms (default `0`: free at once;
--          otherwise the key is kept, without an owner, for that long: `at_least`)
-- ARGV[5]  the mode: `0` plain (default), `1` fair, `2` writer, `3` a fair lock's or a
--          writer's hold by its key alone
-- ARGV[6]  mode 3: the wake-up channel
--
-- Returns one integer (an array would cost the server a table per release)
--   n >= 0  released; n subscribers got the wake-up
--   -1      gone: expired, or released by an earlier try of this release whose answer was lost
--           (the caller tells them apart by when its guard let go)
--   -2      held by another owner
--   -3      (on a cluster) released, and the wake-up published here was heard by nobody: the
--           caller sends it again, to the channel's slot's master
--
-- Waiters are woken whether or not the release found its hold (they learn the new expiry); a
-- plain lock's only if one found the hold taken (its ` l` flag) or claimed the next turn: a
-- release nobody waits for publishes nothing. A plain lock with a claim to the next turn on it
-- (` w`, see ACQUIRE) and not kept passes on to the claimant (see `let_go`).
--
-- Mode 1: ARGV[1] also leaves the line (a waiter giving up sends this too), and whenever the
-- lock is left free only the head of the line is woken, on its own channel. Mode 2: ARGV[1]
-- stops waiting too (a writer giving up sends this), and readers held back by its wait are
-- woken when the lock is free. Mode 3 is for a cluster whose slot moves while the line's keys
-- are not all on one side (Redis refuses a script naming them: TRYAGAIN): it leaves the line as
-- it is (its entries expire by themselves) and wakes whoever listens on ARGV[6].
--@flags allow-oom

-- The common case first, before any helper is defined: a plain hold with nothing on it
-- (no token, no lease change, nobody waiting) is deleted, and that is all.
local v = redis.call('GET', KEYS[1])
local keep_ms, mode = ARGV[4] or '0', ARGV[5] or '0'
if v == ARGV[1] and mode == '0' and keep_ms == '0' then
  redis.call('DEL', KEYS[1])
  return 0
end
--@include clock
--@include sorted_sets
--@include hold
--@include fence
--@include let_go
local handed_to, publish = ARGV[2] or '', ARGV[3] or 'PUBLISH'
local channel = KEYS[2] or ARGV[6] or (KEYS[1] .. ':wake')
local fair = mode == '1'
local writer = mode == '2'
local function wake(message)
  if not fair then
    local heard = redis.call(publish, channel, message or '1')
    -- Heard by nobody on a cluster node: this may be the master a moving slot goes to, whose
    -- channel has its subscribers on the slot's master until the move ends. The client sends
    -- it again, to the slot's master.
    if heard == 0 and publish == 'SPUBLISH' then
      return -3
    end
    return heard
  end
  local head = fair_head(KEYS[3], KEYS[4], now_ms())
  if head then
    return redis.call(publish, channel .. ':' .. head, '1')
  end
  return 0
end
local left = 0
if fair then
  redis.call('ZREM', KEYS[3], ARGV[1])
  redis.call('ZREM', KEYS[4], ARGV[1])
elseif writer then
  left = redis.call('ZREM', KEYS[3], ARGV[1])
end
local holder = v and who(v)
if holder and (holder == ARGV[1] or (handed_to ~= '' and holder == handed_to)) then
  local keep = keep_ms ~= '0'
  local claim = field(v, 'w')
  -- Kept: written over (see `let_go`).
  local message = '1'
  if keep then
    redis.call('PSETEX', KEYS[1], keep_ms, kept_after(ARGV[1]))
  else
    message = let_go(KEYS[1], claim, v, publish == 'SPUBLISH')
  end
  if mode == '0' and not claim and not field(v, 'l') then
    return 0
  end
  return wake(message)
end
if (fair or left == 1) and not v then
  wake()
end
if v then
  return -2
end
return -1
