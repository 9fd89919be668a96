//! Every Lua script dlock runs, in one place.
//!
//! Key layout (all keys of one lock share the `{name}` hash tag):
//!
//! | key | type | holds |
//! | --- | --- | --- |
//! | `<prefix>{<name>}` | hash | `<owner token> -> hold count`, `#f -> fencing token`; lease = PTTL |
//! | `<prefix>{<name>}:fence` | hash | `n -> last fencing token`, `r -> last released owner` |
//! | `<prefix>{<name>}:wake` | channel | a message on every final release |
//!
//! Fencing tokens: the counter starts at the server's clock in microseconds when its key does not
//! exist and counts up by one on every fresh acquisition. Its key gets the configured TTL when it
//! is created and is not refreshed: when it expires, the next counter starts from the clock again,
//! which is past every token the old one gave unless that one counted faster than one acquisition
//! per microsecond for its whole life. So tokens keep increasing across expiries, and no counter
//! key outlives its use by more than the TTL.

use std::sync::LazyLock;

use redis::Script;

/// Acquire or re-enter.
///
/// `KEYS[1]` lock, `KEYS[2]` fence; `ARGV[1]` owner, `ARGV[2]` lease ms, `ARGV[3]` fence TTL ms
/// (0 = none), `ARGV[4]` `1` to re-enter a hold of the same owner (count + 1), `0` to take it
/// as it is (a fresh owner that already holds the lock was handed it, or is retrying).
/// Returns `{1, token}` fresh, `{2, token}` re-entered, `{0, pttl}` busy.
pub(crate) static ACQUIRE: LazyLock<Script> = LazyLock::new(|| Script::new(ACQUIRE_LUA));

pub(crate) const ACQUIRE_LUA: &str = r#"
if redis.call('EXISTS', KEYS[1]) == 0 then
  local f = redis.call('HINCRBY', KEYS[2], 'n', 1)
  if f == 1 then
    local t = redis.call('TIME')
    f = tonumber(t[1]) * 1000000 + tonumber(t[2])
    redis.call('HSET', KEYS[2], 'n', string.format('%d', f))
    if ARGV[3] ~= '0' then
      redis.call('PEXPIRE', KEYS[2], ARGV[3])
    end
  end
  redis.call('HSET', KEYS[1], ARGV[1], 1, '#f', string.format('%d', f))
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {1, f}
end
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  if ARGV[4] == '1' then
    redis.call('HINCRBY', KEYS[1], ARGV[1], 1)
    return {2, tonumber(redis.call('HGET', KEYS[1], '#f'))}
  end
  return {1, tonumber(redis.call('HGET', KEYS[1], '#f'))}
end
return {0, redis.call('PTTL', KEYS[1])}
"#;

/// Owner-checked release.
///
/// `KEYS[1]` lock, `KEYS[2]` fence, `KEYS[3]` wake channel; `ARGV[1]` owner.
/// Returns `{code, woken}`: code `0` released (`woken` subscribers got the wake-up), `n > 0`
/// still held with `n` holds left, `-1` expired, `-2` taken over. A retry of a release whose reply
/// was lost answers `0` again (the last released owner is remembered next to the fencing
/// counter).
pub(crate) static RELEASE: LazyLock<Script> = LazyLock::new(|| Script::new(RELEASE_LUA));

pub(crate) const RELEASE_LUA: &str = r#"
local c = redis.call('HGET', KEYS[1], ARGV[1])
if not c then
  if redis.call('HGET', KEYS[2], 'r') == ARGV[1] then
    return {0, 0}
  end
  if redis.call('EXISTS', KEYS[1]) == 1 then
    return {-2, 0}
  end
  return {-1, 0}
end
c = tonumber(c) - 1
if c > 0 then
  redis.call('HSET', KEYS[1], ARGV[1], c)
  return {c, 0}
end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[2], 'r', ARGV[1])
return {0, redis.call('PUBLISH', KEYS[3], '1')}
"#;

/// Batched renewal: every `KEYS[i]` is paired with `ARGV[2i-1]` owner and `ARGV[2i]` lease ms.
/// Returns one integer per key: `1` renewed, `0` gone or owned by someone else.
pub(crate) static RENEW: LazyLock<Script> = LazyLock::new(|| Script::new(RENEW_LUA));

pub(crate) const RENEW_LUA: &str = r#"
local out = {}
for i = 1, #KEYS do
  if redis.call('HEXISTS', KEYS[i], ARGV[2 * i - 1]) == 1 then
    redis.call('PEXPIRE', KEYS[i], ARGV[2 * i])
    out[i] = 1
  else
    out[i] = 0
  end
end
return out
"#;

/// Hand-over inside one process: release `ARGV[1]`'s last hold and, in the same step, acquire for
/// `ARGV[2]` with a fresh fencing token, so a local waiter takes over without a wake-up round trip.
///
/// `KEYS` as for [`ACQUIRE`] plus `KEYS[3]` wake channel; `ARGV[1]` old owner, `ARGV[2]` new
/// owner, `ARGV[3]` lease ms, `ARGV[4]` fence TTL ms. Returns `{1, token}` handed over,
/// `{0, code}` not handed over (`code` as [`RELEASE`]'s reply; the lock was released normally if
/// `code` is `0`).
pub(crate) static HANDOFF: LazyLock<Script> = LazyLock::new(|| Script::new(HANDOFF_LUA));

pub(crate) const HANDOFF_LUA: &str = r#"
local c = redis.call('HGET', KEYS[1], ARGV[1])
if not c then
  if redis.call('EXISTS', KEYS[1]) == 1 then
    return {0, -2}
  end
  return {0, -1}
end
c = tonumber(c) - 1
if c > 0 then
  redis.call('HSET', KEYS[1], ARGV[1], c)
  return {0, c}
end
local f = redis.call('HINCRBY', KEYS[2], 'n', 1)
if f == 1 then
  local t = redis.call('TIME')
  f = tonumber(t[1]) * 1000000 + tonumber(t[2])
  redis.call('HSET', KEYS[2], 'n', string.format('%d', f))
  if ARGV[4] ~= '0' then
    redis.call('PEXPIRE', KEYS[2], ARGV[4])
  end
end
redis.call('HSET', KEYS[2], 'r', ARGV[1])
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], ARGV[2], 1, '#f', string.format('%d', f))
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return {1, f}
"#;
