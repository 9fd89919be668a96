-- `let_go(lock, claim, v, sharded)`: ends the hold `lock` (whose string was `v`) and passes the lock on to
-- the `Locker` that claimed the next turn, if `claim` (the hold's ` w` field) names one. A head
-- waiter's claim made no longer ago than its grant window is granted: the lock is held for the
-- claim's hand-over token (with `v`'s ` l` flag and a fencing token minted on the plain lock's
-- counter, `lock` and `:fence`) for twice that window — the waiter counts its hold from when it
-- sent the claim, so a claim no older than the window leaves it at least the window, and it
-- extends the hold after a grace. The claim's age is read on the waiter's clock (its send time)
-- against the server's: clocks apart by some milliseconds only move which claims count as
-- fresh, never how long the waiter believes it holds the lock, which ends before the server's
-- grant does whatever the clocks say. Any other claim has the lock kept for its `Locker` (`#r:`)
-- for the time it asked, and its attempt takes it. Returns the wake-up
-- message: `g<n>:<ms>:<fencing token>:<token>` for a grant (`n` the number of the attempt whose
-- claim it was, `ms` the grant's lease), `1` otherwise. Needs `now_ms`, `next_fence` and the
-- hold codec.
--
-- On a cluster (`sharded`) the release does not name the counter (a command naming two keys
-- of a slot on its way to another master fails until the move ends), so a grant mints only on
-- a counter that is here: read with `pcall`, as on the old master of a moving slot whose
-- counter moved already the read is refused. A counter that is not here — never made, expired,
-- or on the other side of a moving slot, where minting a new one would fork it and stop the
-- move (`BUSYKEY`) — has the claim kept for its `Locker` instead, whose attempt names the
-- counter. And a lock passed on is written over, never deleted and written again: while its
-- slot moves, a key deleted on the old master may not be written there again in the same
-- script.
local function let_go(lock, claim, v, sharded)
  local _, ms, locker, grant = claim_of(claim)
  if not locker then
    redis.call('DEL', lock)
    return '1'
  end
  if grant then
    local at, window, fence_ttl, n, token = unpack(grant)
    -- One reading of the clock for the claim's age and the token.
    local t = redis.call('TIME')
    local age = now_ms(t) - tonumber(at)
    local fence = lock .. ':fence'
    -- The hold's own token, if it has one, is the counter's last (a token is minted only for
    -- the holder of the lock), so the counter is not read again — but on a cluster, where the
    -- read also says whether the counter is here.
    local last
    if sharded then
      last = redis.pcall('HGET', fence, 'n')
      if type(last) == 'table' then
        last = nil
      end
    else
      last = field(v, 'f')
    end
    if (last or not sharded) and age <= tonumber(window) then
      local f = string.format('%d', next_fence(fence, fence_ttl, last, t))
      local held = with_field(token, 'f', f)
      local by = field(v, 'l')
      if by then
        held = with_field(held, 'l', by)
      end
      local px = string.format('%d', 2 * tonumber(window))
      redis.call('PSETEX', lock, px, held)
      return 'g' .. n .. ':' .. px .. ':' .. f .. ':' .. token
    end
  end
  redis.call('PSETEX', lock, ms, kept_for(locker))
  return '1'
end
