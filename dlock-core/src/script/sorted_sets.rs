//! The scripts of the kinds of hold kept in sorted sets: fair locks' lines, semaphores'
//! permits, read-write locks' readers and waiting writers (the key layout is in the parent
//! module).

use std::sync::LazyLock;

use redis::Script;

/// Fair acquire: the lock when it is free and nobody alive is ahead in line; otherwise (when
/// asked) a place in line, or a refreshed one.
///
/// `KEYS[1]` lock, `KEYS[2]` fence, `KEYS[3]` wake channel, `KEYS[4]` queue, `KEYS[5]` alive;
/// `ARGV[1]` owner (the waiter), `ARGV[2]` lease ms, `ARGV[3]` fence TTL ms (0 = none), `ARGV[4]`
/// how long the waiter counts as alive without another attempt, ms (`0`: do not join the line),
/// `ARGV[5]` the command that wakes a waiter. Returns `{1, token}` acquired (also a retry of a
/// grant), `{0, pttl, place}` busy: the holder's PTTL (-2: free, but another waiter heads the line,
/// and was woken), and the waiter's place in line (0: the head; -1: not in line).
pub(crate) static ACQUIRE_FAIR: LazyLock<Script> = LazyLock::new(|| Script::new(ACQUIRE_FAIR_LUA));

pub(crate) const ACQUIRE_FAIR_LUA: &str = concat!(
    next_fence_lua!(),
    clock_lua!(),
    fair_lua!(),
    hold_lua!(),
    r#"
local now = now_ms()
local function join()
  if ARGV[4] == '0' then
    return -1
  end
  if not redis.call('ZSCORE', KEYS[4], ARGV[1]) then
    local last = redis.call('ZRANGE', KEYS[4], -1, -1, 'WITHSCORES')
    local place = 1
    if last[2] then
      place = tonumber(last[2]) + 1
    end
    redis.call('ZADD', KEYS[4], place, ARGV[1])
  end
  local alive_ms = tonumber(ARGV[4])
  add_until(KEYS[5], ARGV[1], now, alive_ms)
  if redis.call('PTTL', KEYS[4]) < alive_ms then
    redis.call('PEXPIRE', KEYS[4], alive_ms)
  end
  return redis.call('ZRANK', KEYS[4], ARGV[1])
end
local v = redis.call('GET', KEYS[1])
if v then
  if who(v) == ARGV[1] then
    return {1, tonumber(field(v, 'f') or '-1')}
  end
  local pttl = redis.call('PTTL', KEYS[1])
  return {0, pttl, join()}
end
local head = fair_head(KEYS[4], KEYS[5], now)
if head == nil or head == ARGV[1] then
  if head then
    redis.call('ZREM', KEYS[4], ARGV[1])
    redis.call('ZREM', KEYS[5], ARGV[1])
  end
  local f = next_fence(KEYS[2], ARGV[3])
  redis.call('PSETEX', KEYS[1], ARGV[2], ARGV[1] .. ' f' .. string.format('%d', f))
  return {1, f}
end
redis.call(ARGV[5], KEYS[3] .. ':' .. head, '1')
return {0, -2, join()}
"#
);

/// Takes a semaphore's permit when fewer than its count are held.
///
/// `KEYS[1]` permits, `KEYS[2]` the count set at run time; `ARGV[1]` the permit id (fresh),
/// `ARGV[2]` lease ms, `ARGV[3]` the count to use when none was set. Expired permits are dropped
/// first. Returns `{1, 0}` taken (also when `ARGV[1]` holds it already: a retry), `{0, ms}` all
/// taken, the first of them expiring in `ms` at the latest.
pub(crate) static ACQUIRE_PERMIT: LazyLock<Script> =
    LazyLock::new(|| Script::new(ACQUIRE_PERMIT_LUA));

pub(crate) const ACQUIRE_PERMIT_LUA: &str = concat!(
    clock_lua!(),
    fair_lua!(),
    r#"
local now = now_ms()
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZSCORE', KEYS[1], ARGV[1]) then
  return {1, 0}
end
local limit = tonumber(redis.call('GET', KEYS[2]) or ARGV[3]) or 0
if redis.call('ZCARD', KEYS[1]) < limit then
  add_until(KEYS[1], ARGV[1], now, tonumber(ARGV[2]))
  return {1, 0}
end
local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
if first[2] then
  return {0, tonumber(first[2]) - now}
end
return {0, -1}
"#
);

/// Gives a permit back and wakes waiters.
///
/// `KEYS[1]` permits; `ARGV[1]` the permit id, `ARGV[2]` the command that wakes waiters, `ARGV[3]`
/// the wake channel (an argument, not a key: see `release_of`). Returns, as [`RELEASE`](crate::script::RELEASE) does, `woken >= 0` given back,
/// `-1` it was gone: expired (an expired permit stays in the set until an acquisition sweeps
/// it; it is removed here, and counts as gone), or given back by an earlier try of the same
/// release.
pub(crate) static RELEASE_PERMIT: LazyLock<Script> =
    LazyLock::new(|| Script::new(RELEASE_PERMIT_LUA));

pub(crate) const RELEASE_PERMIT_LUA: &str = concat!(
    clock_lua!(),
    fair_lua!(),
    r#"
local expiry = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not expiry then
  return -1
end
redis.call('ZREM', KEYS[1], ARGV[1])
if tonumber(expiry) <= now_ms() then
  return -1
end
return redis.call(ARGV[2], ARGV[3], '1')
"#
);

/// Sets a semaphore's permit count (`ARGV[1]`; `''` removes it, so each handle's own count
/// applies again) and wakes waiters. `KEYS[1]` the count, `KEYS[2]` wake channel; `ARGV[2]` the
/// command that wakes waiters.
pub(crate) static SET_PERMITS: LazyLock<Script> = LazyLock::new(|| Script::new(SET_PERMITS_LUA));

pub(crate) const SET_PERMITS_LUA: &str = r#"
if ARGV[1] == '' then
  redis.call('DEL', KEYS[1])
else
  redis.call('SET', KEYS[1], ARGV[1])
end
redis.call(ARGV[2], KEYS[2], '1')
return 1
"#;

/// A semaphore's permits now (read-only): `KEYS[1]` permits, `KEYS[2]` the count set at run time.
/// Returns `{held, set}`: the unexpired permits, and the count set (`-1`: none).
pub(crate) static PERMITS: LazyLock<Script> = LazyLock::new(|| Script::new(PERMITS_LUA));

pub(crate) const PERMITS_LUA: &str = concat!(
    clock_lua!(),
    fair_lua!(),
    r#"
local held = redis.call('ZCOUNT', KEYS[1], '(' .. now_ms(), '+inf')
return {held, tonumber(redis.call('GET', KEYS[2]) or '-1') or -1}
"#
);

/// A read-write lock's writer: the write lock when no writer holds it and no reader is in;
/// otherwise (when asked) the writer's wait is recorded, so new readers stay out.
///
/// `KEYS[1]` write lock, `KEYS[2]` its fence, `KEYS[3]` readers, `KEYS[4]` writers waiting;
/// `ARGV[1]` owner, `ARGV[2]` lease ms, `ARGV[3]` fence TTL ms (0 = none), `ARGV[4]` how long the
/// wait counts without another attempt, ms (`0`: not recorded). Returns `{1, token}` acquired
/// (also a retry), `{0, ms}` busy: the writer's PTTL, or when the first reader's lease ends.
pub(crate) static ACQUIRE_WRITE: LazyLock<Script> =
    LazyLock::new(|| Script::new(ACQUIRE_WRITE_LUA));

pub(crate) const ACQUIRE_WRITE_LUA: &str = concat!(
    next_fence_lua!(),
    clock_lua!(),
    fair_lua!(),
    hold_lua!(),
    r#"
local now = now_ms()
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', now)
local function waits()
  if ARGV[4] ~= '0' then
    add_until(KEYS[4], ARGV[1], now, tonumber(ARGV[4]))
  end
end
local v = redis.call('GET', KEYS[1])
if v then
  if who(v) == ARGV[1] then
    return {1, tonumber(field(v, 'f') or '-1')}
  end
  waits()
  return {0, redis.call('PTTL', KEYS[1])}
end
local first = redis.call('ZRANGE', KEYS[3], 0, 0, 'WITHSCORES')
if first[2] then
  waits()
  return {0, tonumber(first[2]) - now}
end
redis.call('ZREM', KEYS[4], ARGV[1])
local f = next_fence(KEYS[2], ARGV[3])
redis.call('PSETEX', KEYS[1], ARGV[2], ARGV[1] .. ' f' .. string.format('%d', f))
return {1, f}
"#
);

/// A read-write lock's reader: in when no writer holds the lock and (when writers are
/// preferred) none waits.
///
/// `KEYS[1]` readers, `KEYS[2]` write lock, `KEYS[3]` writers waiting; `ARGV[1]` reader id
/// (fresh), `ARGV[2]` lease ms, `ARGV[3]` `1` when writers are preferred. Returns `{1, 0}` in
/// (also a retry), `{0, ms}` busy: the writer's PTTL, or `-1` (a writer waits).
pub(crate) static ACQUIRE_READ: LazyLock<Script> = LazyLock::new(|| Script::new(ACQUIRE_READ_LUA));

pub(crate) const ACQUIRE_READ_LUA: &str = concat!(
    clock_lua!(),
    fair_lua!(),
    r#"
local now = now_ms()
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZSCORE', KEYS[1], ARGV[1]) then
  return {1, 0}
end
if redis.call('EXISTS', KEYS[2]) == 1 then
  return {0, redis.call('PTTL', KEYS[2])}
end
if ARGV[3] == '1' then
  redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
  if redis.call('ZCARD', KEYS[3]) > 0 then
    return {0, -1}
  end
end
add_until(KEYS[1], ARGV[1], now, tonumber(ARGV[2]))
return {1, 0}
"#
);

/// A reader leaves; the last one wakes the waiters (writers).
///
/// `KEYS[1]` readers; `ARGV[1]` reader id, `ARGV[2]` the command that wakes waiters, `ARGV[3]`
/// the wake channel (an argument, not a key). Returns, as [`RELEASE`](crate::script::RELEASE) does, `woken >= 0` left, `-1`
/// it was gone: expired (an expired reader stays in the set until an acquisition sweeps it; it
/// is removed here, counts as gone, and wakes the writers if it was the last), or an earlier try
/// of the same release.
pub(crate) static RELEASE_READ: LazyLock<Script> = LazyLock::new(|| Script::new(RELEASE_READ_LUA));

pub(crate) const RELEASE_READ_LUA: &str = concat!(
    clock_lua!(),
    fair_lua!(),
    r#"
local expiry = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not expiry then
  return -1
end
redis.call('ZREM', KEYS[1], ARGV[1])
local woken = 0
if redis.call('EXISTS', KEYS[1]) == 0 then
  woken = redis.call(ARGV[2], ARGV[3], '1')
end
if tonumber(expiry) <= now_ms() then
  return -1
end
return woken
"#
);

/// Whether the member `ARGV[1]` (a permit, a reader) of `KEYS[1]` is still in (read-only):
/// `{1, 0}` in, `{0, -2}` gone.
pub(crate) static HOLDS_MEMBER: LazyLock<Script> = LazyLock::new(|| Script::new(HOLDS_MEMBER_LUA));

pub(crate) const HOLDS_MEMBER_LUA: &str = concat!(
    clock_lua!(),
    fair_lua!(),
    r#"
local expiry = redis.call('ZSCORE', KEYS[1], ARGV[1])
if expiry and tonumber(expiry) > now_ms() then
  return {1, 0}
end
return {0, -2}
"#
);
