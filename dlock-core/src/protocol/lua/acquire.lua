-- ACQUIRE: an attempt at a plain lock, when a first `SET NX PX` of the owner found it taken,
-- or when the attempt comes from the head of its `Locker`'s local line (which mints its fencing
-- token with the grant).
--
-- KEYS[1]   the lock
-- KEYS[2]   its fencing counter; left out while the name's slot migrates between cluster nodes,
--           so the script runs where the lock's key is (the token is then minted when asked,
--           as for a first attempt)
-- ARGV[1]   owner: a fresh owner token
-- ARGV[2]   lease, ms
-- ARGV[3]   `0`, or the ms a release should keep the lock for this attempt's `Locker` if it
--           finds the lock taken: the attempt then claims the next turn for that `Locker`,
--           unless another `Locker`'s claim as old as this one or older is there (a claim of
--           the same `Locker` is replaced)
-- ARGV[4]   since when the waiter waits (wall-clock ms): the claim's age
-- ARGV[5]   the id of the attempt's `Locker`
-- ARGV[6]   `1` if the attempt comes from the head of its local line (which alone takes a lock
--           kept for its `Locker`), else `0`
-- ARGV[7]   fence TTL, ms (`0`: none)
-- ARGV[8]   optional: the head waiter's hand-over token, to which a release may grant the lock
--           (see `let_go`); the claim then also carries the attempt's send time, the grant
--           window, the fence TTL and the attempt's number
-- ARGV[9]   with ARGV[8]: the attempt's number
-- ARGV[10]  with ARGV[8]: the grant window, ms
-- ARGV[11]  with ARGV[8]: when the attempt was sent (wall-clock ms, on the clock of ARGV[4]):
--           how old the claim is when a release comes, give or take the clocks' difference
--
-- Returns
--   {1, token}  acquired: also when ARGV[1] holds it already (it was handed the lock, or this is
--               a retry of this script or of the `SET`: its lease then lasts at least the lease
--               asked for, from now),
--               when the lock was kept for ARGV[5]
--               (another `Locker`'s claim made since stays on the new hold), and when it was
--               granted to ARGV[8]; `token` is -1 when none was minted
--   {0, pttl, token}
--               busy: the hold is then flagged as waited for (by ARGV[5]), so its release wakes
--               the waiters, and a hand-over inside the holder's `Locker` knows whether another
--               `Locker` waits; `token` is the hold's fencing token (-1 when none was minted): a
--               wake-up that announces a grant with that token or an earlier one came from a
--               release before this attempt
--   {2, pttl}   busy, held in a layout this one does not speak: nothing is written (no flag,
--               no claim), so nothing wakes the waiter at its release
--
-- A first attempt mints no fencing token: the holder's first ask does (FENCE), so an
-- uncontended acquisition costs no clock read and no write to the counter. An attempt from the
-- head of a local line mints with the grant: its name is contended, and its holder's token is
-- likely to be asked for while others wait.
--@include hold
local owner, locker, head, token = ARGV[1], ARGV[5], ARGV[6] == '1', ARGV[8] or ''
local v = redis.call('GET', KEYS[1])
local value = owner
if v then
  local holder = who(v)
  if holder == owner then
    -- Its own already: an earlier send of this attempt, or of its `SET NX PX`, ran and its
    -- answer was lost. The lease counts from this attempt, as the caller counts it; never
    -- shortened (a late copy of an attempt must not undo a longer lease set since).
    if redis.call('PTTL', KEYS[1]) < tonumber(ARGV[2]) then
      redis.call('PEXPIRE', KEYS[1], ARGV[2])
    end
    return {1, token_of(v)}
  end
  if token ~= '' and holder == token then
    -- A release granted the lock to this waiter's hand-over token (see `let_go`): it takes the
    -- hold over, with its lease from now and a token of its own.
    value = without(without(owner .. string.sub(v, #holder + 1), 'f'), 's')
  elseif not head or holder ~= kept_for(locker) then
    if foreign(v) then
      return {2, redis.call('PTTL', KEYS[1])}
    end
    local changed = flagged(v, locker)
    if ARGV[3] ~= '0' then
      local since, _, claimant = claim_of(field(v, 'w'))
      if not since or claimant == locker or tonumber(since) > tonumber(ARGV[4]) then
        local grant
        if token ~= '' then
          grant = {ARGV[11], ARGV[10], ARGV[7], ARGV[9], token}
        end
        changed = set_field(changed, 'w', encode_claim(ARGV[4], ARGV[3], locker, grant))
      end
    end
    local pttl = redis.call('PTTL', KEYS[1])
    if changed ~= v and pttl > 0 then
      redis.call('PSETEX', KEYS[1], pttl, changed)
    end
    return {0, pttl, token_of(v)}
  else
    -- Kept for this Locker: its waiter takes the lock, and another Locker that claimed a turn
    -- since stays next (and is woken at the release).
    local claim = field(v, 'w')
    local _, _, claimant = claim_of(claim)
    if claim and claimant ~= locker then
      value = with_field(value, 'w', claim)
    end
    local by = field(v, 'l')
    if by then
      value = with_field(value, 'l', by)
    end
  end
end
local f = -1
if head and KEYS[2] then
  -- Defined here, not for every call: a first attempt has no use for it.
--@include fence
  f = next_fence(KEYS[2], ARGV[7])
  value = with_field(value, 'f', string.format('%d', f))
end
redis.call('PSETEX', KEYS[1], ARGV[2], value)
return {1, f}
