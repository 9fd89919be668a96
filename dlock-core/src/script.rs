//! Every Lua script dlock runs, in one place.
//!
//! Key layout (all keys of one lock share the `{name}` hash tag):
//!
//! | key | type | holds |
//! | --- | --- | --- |
//! | `<prefix>{<name>}` | string | the hold (see below); lease = PTTL |
//! | `<prefix>{<name>}:fence` | hash | `n -> last fencing token` |
//! | `<prefix>{<name>}:wake` | channel | a message on every final release (sharded on a cluster) |
//! | `<prefix>{<name>}:queue` | sorted set | fair locks: `waiter -> place in line` |
//! | `<prefix>{<name>}:alive` | sorted set | fair locks: `waiter -> until when it counts as alive` (server ms) |
//! | `<prefix>{<name>}:wake:<waiter>` | channel | fair locks: wakes that waiter, once it heads the line |
//! | `<prefix>{<name>}:permits` | sorted set | semaphores: `permit id -> expiry` (server ms) |
//! | `<prefix>{<name>}:permits:limit` | string | semaphores: the permit count set at run time |
//! | `<prefix>{<name>}:permits:wake` | channel | semaphores: a message on every release |
//! | `<prefix>{<name>}:write` | string | read-write locks: the writer's hold, as a lock's |
//! | `<prefix>{<name>}:write:fence` | hash | read-write locks: the writers' fencing counter |
//! | `<prefix>{<name>}:write:waiting` | sorted set | read-write locks: `writer -> until when its wait counts` (server ms) |
//! | `<prefix>{<name>}:read` | sorted set | read-write locks: `reader id -> expiry` (server ms) |
//! | `<prefix>{<name>}:rw:wake` | channel | read-write locks: a message when the writer or the last reader leaves |
//!
//! A lock's key holds one string, its first word saying what it is:
//!
//! - `<owner token>`: held by that owner (plain, fair, all-or-none locks, a writer);
//! - `#k:<owner token>`: kept taken after that owner's release (`at_least`), until it expires;
//! - `#r:<locker id>`: kept for the `Locker` next in turn after a release, for the time it asked.
//!
//! Then fields, each one word after a space: ` f<token>` the hold's fencing token (once minted),
//! ` s<n>` the sequence number of the last lease change, ` w<waiting since>:<ms>:<locker id>`
//! the `Locker` next in turn (plain locks; a head waiter's claim goes on with
//! `:<server ms>:<grant window ms>:<fence TTL ms>:<attempt>:<hand-over token>`), ` l` a waiter
//! found the hold taken (so a release wakes the waiters; one nobody waits for publishes
//! nothing). A plain lock taken at a first
//! attempt is `SET NX PX` of its owner token: no script runs for an uncontended acquisition.
//! Scripts write a hold with `PSETEX` (the same as `SET .. PX`), so `SET` in `INFO
//! commandstats` counts first attempts only.
//!
//! Fencing tokens: a plain lock's hold taken at a first attempt gets its token when its holder
//! first asks for it ([`FENCE`], owner-checked; the token is kept on the hold as ` f`); one taken
//! after a wait, and the other kinds' holds (fair, writer, all-or-none, hand-over), get theirs
//! with the grant. Minting takes the server's
//! clock in microseconds (`TIME`), or the last token + 1 when that is not below it, and stores it
//! as the last token. So tokens
//! strictly increase on one server, and they also keep increasing when the last token is gone:
//! after the counter key expired, and after a failover to a replica that never received the
//! latest tokens (asynchronous replication). The second needs only that the new master's clock
//! is not behind the old master's by more than the time between the old master's last grant and
//! the new one's first — a failover takes seconds; NTP keeps clocks within milliseconds — and
//! that tokens do not run ahead of the clock, which takes more than one acquisition of one name
//! per microsecond. The counter key gets the configured TTL when it is created and is not
//! refreshed, so no counter key outlives its use by more than the TTL; only minting creates it
//! (a name whose holders never ask for a token has none).
//!
//! Holds are not counted in Redis: one owner token is one hold, and re-entry inside a lock scope
//! counts guards in the process (see `scope`). A re-entry only checks, read-only, that Redis still
//! has the hold, so nothing a re-entry does can be left behind by a dropped future or a timeout.
//!
//! A fair lock is a plain lock plus a waiting line: a waiter joins the line when it finds the lock
//! taken, and while anyone is in line only the head may take the free lock. Waiters prove they
//! are alive with every attempt (one per third of their timeout at least); the head of the line
//! is dropped, by whichever script next looks at it, once its time is up. Each waiter has its
//! own wake-up channel, and a release wakes only the head. Both sorted sets expire no earlier
//! than their last waiter's deadline, and Redis deletes a sorted set when its last member goes,
//! so no key outlives the line.
//!
//! Turns across processes (plain locks): a waiter that finds the lock taken claims the next turn
//! for its `Locker` (` w` on the hold), unless a claim from a waiter that has waited as long or
//! longer is there (by wall clock: hosts whose clocks are apart favour one by that much). So a
//! process farther from Redis, which loses every race to a nearer one, still gets its turn. A
//! `Locker` hands the lock from task to task only while no other `Locker`
//! listens for its release and no other `Locker` claimed the turn; otherwise it releases. A
//! release with a claim on the hold keeps the key for the claimant's `Locker` (`#r:`) for the time
//! it asked for (a few of its round trips), and wakes the waiters as usual: a waiter of that
//! `Locker` takes it, the others find it taken and claim the next turn. A claimant that never
//! comes delays the lock by that time only; the kept key's PTTL is what the others wait for.
//!
//! A claim made by the head of a `Locker`'s local line carries that waiter's hand-over token,
//! a grant window (its command timeout, at most a third of its lease, at least its claim's
//! time), its fence TTL, the server's clock and the attempt's number. A release that finds such
//! a claim no older than its window grants the lock to the token in the same step, for the
//! claim's age plus the window (its fencing token minted with the grant), and says so in the
//! wake-up (`g<attempt>:<ms>:<fencing token>:<token>`): the waiter has the lock without a round
//! trip of its own, counts that lease from when it sent the attempt (before the grant), and
//! extends it to its own lease at once (the window gives that extension the time any command
//! has). A claimant that died delays the lock by twice its window at most; an older claim gets
//! the kept key instead. A waiter that leaves lets a grant to its token go, as a release would;
//! one whose wake-up was lost finds the grant at its next attempt and takes it over (its own
//! lease and owner token).
//!
//! Lease changes (watchdog renewals, `extend`) carry a per-hold sequence number and apply only
//! if it is higher than the last one applied: a renewal that arrives late (a slow server, a
//! command that timed out but ran anyway) can't undo a later `extend`.

use std::sync::LazyLock;

use redis::Script;

/// `next_fence(fence_key, fence_ttl, known)`: the next fencing token of `fence_key` — the server
/// clock in microseconds, or the last token + 1 when the clock is not past it — stored as its last
/// token; a new counter key gets the TTL in `fence_ttl` (ms, `'0'`: none). `known`, if given, is
/// the last token the caller read already. Lua numbers are doubles: microseconds since 1970 stay
/// exact until 2255.
macro_rules! next_fence_lua {
    () => {
        r#"
local function next_fence(fence_key, fence_ttl, known)
  local t = redis.call('TIME')
  local f = tonumber(t[1]) * 1000000 + tonumber(t[2])
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
  redis.call('HSET', fence_key, 'n', string.format('%d', f))
  if not last and fence_ttl ~= '0' and redis.call('PTTL', fence_key) == -1 then
    redis.call('PEXPIRE', fence_key, fence_ttl)
  end
  return f
end
"#
    };
}

/// `now_ms()`: the server clock in ms.
macro_rules! clock_lua {
    () => {
        r#"
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
"#
    };
}

/// The helpers of the sorted-set kinds (after `clock_lua`'s `now_ms()`): `add_until(key,
/// member, now, ms)`, the member in `key` until `ms` from `now`, the key kept at least that long;
/// `fair_head(queue, alive, now)`, the first waiter of a fair lock's line still alive (those
/// ahead of it whose time is up leave the line).
macro_rules! fair_lua {
    () => {
        r#"
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
"#
    };
}

/// The helpers that read and write a hold's string (see the module docs): `who(v)`, its first
/// word (the owner, or `#k:`/`#r:` and whom a kept key is kept for); `field(v, tag)`, the field
/// `tag` (`nil` when absent; a flag answers `''`); `without(v, tag)`, the string without it;
/// `rewrite(key, v)`, stores `v` at `key` and keeps its expiry; `flagged(v)`, `v` with the
/// ` l` flag (a waiter found it taken).
macro_rules! hold_lua {
    () => {
        r#"
local function who(v)
  return string.match(v, '^[^ ]+')
end
local function field(v, tag)
  return string.match(v, ' ' .. tag .. '([^ ]*)')
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
local function flagged(v)
  if field(v, 'l') then
    return v
  end
  return v .. ' l'
end
"#
    };
}

/// `let_go(lock, claim, v, sharded)`: ends the hold `lock` (whose string was `v`) and passes the lock on to
/// the `Locker` that claimed the next turn, if `claim` (the hold's ` w` field) names one. A head
/// waiter's claim made no longer ago than its grant window is granted: the lock is held for the
/// claim's hand-over token (with `v`'s ` l` flag and a fencing token minted on the plain lock's
/// counter, `lock` and `:fence`) for the claim's age plus that window — the waiter counts its
/// hold from when it sent the claim, and extends it at once. Any other claim has the lock kept
/// for its `Locker` (`#r:`) for the time it asked, and its attempt takes it. Returns the wake-up
/// message: `g<n>:<ms>:<fencing token>:<token>` for a grant (`n` the number of the attempt whose
/// claim it was, `ms` the grant's lease), `1` otherwise. Needs `now_ms`, `next_fence` and the
/// hold helpers.
///
/// On a cluster (`sharded`) the release does not name the counter (a command naming two keys
/// of a slot on its way to another master fails until the move ends), so a grant mints only on
/// a counter that is here: read with `pcall`, as on the old master of a moving slot whose
/// counter moved already the read is refused. A counter that is not here — never made, expired,
/// or on the other side of a moving slot, where minting a new one would fork it and stop the
/// move (`BUSYKEY`) — has the claim kept for its `Locker` instead, whose attempt names the
/// counter. And a lock passed on is written over, never deleted and written again: while its
/// slot moves, a key deleted on the old master may not be written there again in the same
/// script.
macro_rules! let_go_lua {
    () => {
        r#"
local function let_go(lock, claim, v, sharded)
  local ms, locker, rest
  if claim then
    ms, locker, rest = string.match(claim, '^%d+:(%d+):(%x+)(.*)$')
  end
  if not locker then
    redis.call('DEL', lock)
    return '1'
  end
  local at, window, fence_ttl, n, token = string.match(rest, '^:(%d+):(%d+):(%d+):(%d+):(.+)$')
  if token then
    local age = now_ms() - tonumber(at)
    local fence = lock .. ':fence'
    local last = redis.pcall('HGET', fence, 'n')
    if type(last) == 'table' then
      last = nil
    end
    if (last or not sharded) and age >= 0 and age <= tonumber(window) then
      local f = string.format('%d', next_fence(fence, fence_ttl, last))
      local held = token .. ' f' .. f
      if field(v, 'l') then
        held = held .. ' l'
      end
      local px = string.format('%d', age + tonumber(window))
      redis.call('PSETEX', lock, px, held)
      return 'g' .. n .. ':' .. px .. ':' .. f .. ':' .. token
    end
  end
  redis.call('PSETEX', lock, ms, '#r:' .. locker)
  return '1'
end
"#
    };
}

mod handover;
mod operators;
mod sorted_sets;

pub(crate) use handover::*;
pub(crate) use operators::*;
pub(crate) use sorted_sets::*;

/// Acquire, when a first `SET NX PX` of the owner found the lock taken (or the attempt is the
/// head of a local line's, which mints its token with the grant).
///
/// `KEYS[1]` lock, `KEYS[2]` fence (left out while the name's slot migrates between cluster
/// nodes, so the script runs where the lock key is: the token is then minted when asked, as
/// for a first attempt); `ARGV[1]` owner (a fresh token), `ARGV[2]` lease ms, `ARGV[3]` (plain locks)
/// `0`, or the ms a release should keep the lock for the attempt's `Locker` if it finds it taken:
/// it claims the next turn for it, unless another `Locker`'s claim as old as this one or older
/// is there (`ARGV[4]`: since when its waiter waits, wall-clock ms; a claim of the same `Locker`
/// is replaced); `ARGV[5]` the id of that `Locker`, `ARGV[6]` `1` if the attempt comes from the
/// waiter at the head of its local queue (which alone takes a lock kept for its `Locker`),
/// `ARGV[7]` fence TTL ms (0 = none), `ARGV[8]` (optional) the head waiter's hand-over token, to
/// which a release may grant the lock (see `let_go`), `ARGV[9]` the attempt's number and
/// `ARGV[10]` the grant window (ms): a claim with a token also carries the server's clock, the
/// window, the fence TTL and the number. Returns `{1, token}` acquired (also when `ARGV[1]`
/// holds it already: it was handed the lock, or this is a retry — of this script or
/// of the `SET`; also when the lock was kept for `ARGV[5]`, another `Locker`'s claim made since
/// kept on the new hold; also when it was granted to `ARGV[8]`), `{0, pttl}` busy: the hold is
/// then flagged as waited for, so its release wakes the waiters.
///
/// A first attempt mints no fencing token: `token` is `-1` until the holder asks for one
/// ([`FENCE`]), so an uncontended acquisition costs no clock read and no write to the counter.
/// An attempt from the head of a local line (it waited: the name is contended, and its holder's
/// token is likely to be asked for while others wait) mints with the grant.
pub(crate) static ACQUIRE: LazyLock<Script> = LazyLock::new(|| Script::new(ACQUIRE_LUA));

pub(crate) const ACQUIRE_LUA: &str = concat!(
    clock_lua!(),
    hold_lua!(),
    r#"
local v = redis.call('GET', KEYS[1])
local value = ARGV[1]
if v then
  local holder = who(v)
  if holder == ARGV[1] then
    return {1, tonumber(field(v, 'f') or '-1')}
  end
  local token = ARGV[8] or ''
  if token ~= '' and holder == token then
    -- A release granted the lock to this waiter's hand-over token (see `let_go`): it takes the
    -- hold over, with its lease from now and a token of its own.
    value = without(without(ARGV[1] .. string.sub(v, #holder + 1), 'f'), 's')
  elseif ARGV[6] ~= '1' or holder ~= '#r:' .. ARGV[5] then
    local changed = flagged(v)
    if ARGV[3] ~= '0' then
      local claim = field(v, 'w')
      local marked = claim and tonumber(string.match(claim, '^(%d+)'))
      local mine = claim and string.match(claim, '^%d+:%d+:(%x+)') == ARGV[5]
      if not marked or mine or marked > tonumber(ARGV[4]) then
        local mark = ARGV[4] .. ':' .. ARGV[3] .. ':' .. ARGV[5]
        if token ~= '' then
          mark = mark .. ':' .. string.format('%d', now_ms()) .. ':' .. ARGV[10] .. ':' .. ARGV[7]
            .. ':' .. ARGV[9] .. ':' .. token
        end
        changed = without(changed, 'w') .. ' w' .. mark
      end
    end
    local pttl = redis.call('PTTL', KEYS[1])
    if changed ~= v and pttl > 0 then
      redis.call('PSETEX', KEYS[1], pttl, changed)
    end
    return {0, pttl}
  else
    -- Kept for this Locker: its waiter takes the lock, and another Locker that claimed a turn
    -- since stays next (and is woken at the release).
    local claim = field(v, 'w')
    if claim and string.match(claim, '^%d+:%d+:(%x+)') ~= ARGV[5] then
      value = value .. ' w' .. claim
    end
    if field(v, 'l') then
      value = value .. ' l'
    end
  end
end
local f = -1
if ARGV[6] == '1' and KEYS[2] then
  -- Defined here, not for every call: a first attempt has no use for it.
"#,
    next_fence_lua!(),
    r#"
  f = next_fence(KEYS[2], ARGV[7])
  value = value .. ' f' .. string.format('%d', f)
end
redis.call('PSETEX', KEYS[1], ARGV[2], value)
return {1, f}
"#
);

/// The fencing token of a hold, minted when its holder first asks for it.
///
/// `KEYS[1]` lock, `KEYS[2]` fence; `ARGV[1]` owner, `ARGV[2]` fence TTL ms (0 = none). Returns the
/// hold's token — the one minted for it before, or a fresh one (see the module docs), stored on
/// the hold — or `-1` when `ARGV[1]` does not hold the lock. A token minted only while its owner
/// holds the lock orders holds as one minted at the grant would: every earlier hold minted its
/// own before this one began, every later one will mint after it ends.
pub(crate) static FENCE: LazyLock<Script> = LazyLock::new(|| Script::new(FENCE_LUA));

pub(crate) const FENCE_LUA: &str = concat!(
    next_fence_lua!(),
    hold_lua!(),
    r#"
local v = redis.call('GET', KEYS[1])
if not v or who(v) ~= ARGV[1] then
  return -1
end
local f = field(v, 'f')
if f then
  return tonumber(f)
end
f = next_fence(KEYS[2], ARGV[2])
redis.call('APPEND', KEYS[1], ' f' .. string.format('%d', f))
return f
"#
);

/// All-or-none acquisition of several locks on one server (in one slot, on a cluster).
///
/// `KEYS[2i-1]` lock `i`, `KEYS[2i]` its fence; `ARGV[1]` lease ms, `ARGV[2]` fence TTL ms
/// (0 = none), `ARGV[2+i]` the owner for lock `i` (a fresh token each). Returns
/// `{1, token_1, .., token_n}` when every lock is held by its owner now (one its owner held
/// already counts: a retry), or `{0, i, pttl}` when lock `i` is busy — and then nothing was
/// written but the busy hold's flag that it is waited for.
pub(crate) static ACQUIRE_ALL: LazyLock<Script> = LazyLock::new(|| Script::new(ACQUIRE_ALL_LUA));

pub(crate) const ACQUIRE_ALL_LUA: &str = concat!(
    next_fence_lua!(),
    hold_lua!(),
    r#"
local n = #KEYS / 2
local held = {}
for i = 1, n do
  local lock = KEYS[2 * i - 1]
  local v = redis.call('GET', lock)
  if v and who(v) ~= ARGV[2 + i] then
    local changed = flagged(v)
    if changed ~= v then
      rewrite(lock, changed)
    end
    return {0, i, redis.call('PTTL', lock)}
  end
  held[i] = v
end
local out = {1}
for i = 1, n do
  local lock = KEYS[2 * i - 1]
  if held[i] then
    out[i + 1] = tonumber(field(held[i], 'f'))
  else
    local f = next_fence(KEYS[2 * i], ARGV[2])
    redis.call('PSETEX', lock, ARGV[1], ARGV[2 + i] .. ' f' .. string.format('%d', f))
    out[i + 1] = f
  end
end
return out
"#
);

/// Re-entry check, read-only: does `ARGV[1]` still hold `KEYS[1]`?
///
/// Returns `{1, token}` held (`token` -1 while none was minted), `{0, pttl}` not held by this
/// owner (`pttl` -2 when nobody holds it).
pub(crate) static HOLDS: LazyLock<Script> = LazyLock::new(|| Script::new(HOLDS_LUA));

pub(crate) const HOLDS_LUA: &str = concat!(
    hold_lua!(),
    r#"
local v = redis.call('GET', KEYS[1])
if v and who(v) == ARGV[1] then
  return {1, tonumber(field(v, 'f') or '-1')}
end
return {0, redis.call('PTTL', KEYS[1])}
"#
);

/// Owner-checked release.
///
/// `KEYS[1]` lock, `KEYS[2]` wake channel (default: the lock's key and `:wake`, a plain lock's);
/// `ARGV[1]` owner, and, when any of them is not its default (the common release of a plain
/// lock sends its key and owner alone): `ARGV[2]` the owner a
/// hand-over of `ARGV[1]`'s hold may have gone to (default empty: none), `ARGV[3]` the command
/// that wakes waiters (default `PUBLISH`; `SPUBLISH` on a cluster), `ARGV[4]` how long the name
/// stays taken after the release, in ms (default `0`: free at once; otherwise the key is kept,
/// without an owner, as `#k:<released owner>`, for that long — a hold that must last at least
/// some time), `ARGV[5]` the mode (default `0`, see below). Waiters are woken either way (they
/// learn the new expiry) — of a plain lock, only if one found the hold taken (its ` l` flag) or
/// claimed the next turn: a release nobody waits for publishes nothing.
///
/// Returns one integer (an array would cost the server a table per release): `n >= 0` released,
/// `n` subscribers got the wake-up; `-1` gone (expired, or released by an earlier try of this
/// release whose answer was lost: the caller tells them apart by when its guard let go); `-2`
/// taken by another owner; `-3` (on a cluster) released, and the wake-up published here was
/// heard by nobody: the caller sends it again, to the channel's slot's master.
///
/// For a fair lock, `ARGV[5]` is `1`, `KEYS[3]` the queue and `KEYS[4]` alive: `ARGV[1]` also
/// leaves the line (a waiter giving up sends this too), and whenever the lock is left free only
/// the head of the line is woken, on its own channel. For a read-write lock's writer, `ARGV[5]`
/// is `2` and `KEYS[3]` the writers waiting: `ARGV[1]` stops waiting too (a writer giving up
/// sends this), and readers held back by its wait are woken when the lock is free.
///
/// Mode `3` releases a fair lock's or a writer's hold by its key alone, `ARGV[6]` the wake
/// channel: on a cluster, while the lock's slot moves and its line's keys are not all on one side
/// (Redis refuses a script naming them, `TRYAGAIN`). It leaves the line as it is (its entries
/// expire by themselves) and wakes whoever listens on that channel, whether anyone waits or not.
///
/// A plain lock whose hold a waiter marked as next in turn (` w`, see [`ACQUIRE`]) and that is not
/// kept (`ARGV[4]` is `0`) stays reserved for that waiter's `Locker` (`#r:`) for the time it asked for.
pub(crate) static RELEASE: LazyLock<Script> = LazyLock::new(|| Script::new(RELEASE_LUA));

pub(crate) const RELEASE_LUA: &str = concat!(
    // The common case first, before any helper is defined: a plain hold with nothing on it
    // (no token, no lease change, nobody waiting) is deleted, and that is all.
    r#"
local v = redis.call('GET', KEYS[1])
local keep_ms, mode = ARGV[4] or '0', ARGV[5] or '0'
if v == ARGV[1] and mode == '0' and keep_ms == '0' then
  redis.call('DEL', KEYS[1])
  return 0
end
"#,
    clock_lua!(),
    fair_lua!(),
    next_fence_lua!(),
    hold_lua!(),
    let_go_lua!(),
    r#"
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
    redis.call('PSETEX', KEYS[1], keep_ms, '#k:' .. ARGV[1])
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
"#
);

/// Batched lease change: every `KEYS[i]` is paired with `ARGV[3i-2]` owner, `ARGV[3i-1]` lease ms
/// and `ARGV[3i]` sequence number — or, for a semaphore's permit, `p` and the sequence number:
/// `KEYS[i]` is then the semaphore's permits, `ARGV[3i-2]` the permit id, and the permit's
/// expiry moves to the lease from now if it has not passed. Returns one integer per key: `1` applied, `2` still held but a
/// later change was applied already (this one is stale and was ignored), `0` gone or owned by
/// someone else. A key holding something other than a lock answers `0` without failing the rest.
pub(crate) static RENEW: LazyLock<Script> = LazyLock::new(|| Script::new(RENEW_LUA));

pub(crate) const RENEW_LUA: &str = concat!(
    clock_lua!(),
    fair_lua!(),
    hold_lua!(),
    r#"
local out = {}
local now
for i = 1, #KEYS do
  if string.sub(ARGV[3 * i], 1, 1) == 'p' then
    now = now or now_ms()
    local lease = tonumber(ARGV[3 * i - 1])
    local expiry = redis.pcall('ZSCORE', KEYS[i], ARGV[3 * i - 2])
    if type(expiry) == 'string' and tonumber(expiry) > now then
      add_until(KEYS[i], ARGV[3 * i - 2], now, lease)
      out[i] = 1
    else
      out[i] = 0
    end
  else
    local v = redis.pcall('GET', KEYS[i])
    if type(v) == 'string' and who(v) == ARGV[3 * i - 2] then
      local seq = tonumber(ARGV[3 * i])
      if seq > tonumber(field(v, 's') or '0') then
        redis.call('PSETEX', KEYS[i], ARGV[3 * i - 1], without(v, 's') .. ' s' .. ARGV[3 * i])
        out[i] = 1
      else
        out[i] = 2
      end
    else
      out[i] = 0
    end
  end
end
return out
"#
);
