//! The operators' scripts: what a name holds, and a release of whatever holds it (the key
//! layout is in the parent module).

use std::sync::LazyLock;

use redis::Script;

/// What a name holds, for operators (read-only).
///
/// `KEYS[1]` lock, `KEYS[2]` fence, `KEYS[3]` wake channel, `KEYS[4]` the fair queue; `ARGV[1]`
/// the `PUBSUB` subcommand that counts a channel's subscribers (`NUMSUB`, or `SHARDNUMSUB` on a
/// cluster). Returns `{pttl, holders, token, kept, foreign, last, subscribers, queued}`: the lock
/// key's PTTL (-2 gone), each holder as its owner token's first 8 characters and its label (the
/// part after `@`, or `''`) — never the whole token —, the current hold's fencing token (`''`:
/// none), 1 if the key is kept after a release (`#k:`), 1 if the key holds something other than
/// a lock (not an owner token of 32 hex digits, nor a kept key), the last fencing token handed
/// out (`''`: none), the wake-up channel's subscribers (one per waiting `Locker`), and the
/// number of waiters in a fair lock's line.
pub(crate) static INSPECT: LazyLock<Script> = LazyLock::new(|| Script::new(INSPECT_LUA));

pub(crate) const INSPECT_LUA: &str = concat!(
    hold_lua!(),
    r#"
local pttl = redis.call('PTTL', KEYS[1])
local holders = {}
local token = ''
local kept = 0
local foreign = 0
if pttl ~= -2 then
  local v = redis.call('TYPE', KEYS[1])['ok'] == 'string' and redis.call('GET', KEYS[1])
  local holder = v and who(v) or ''
  local hex = string.match(holder, '^%x+')
  if string.sub(holder, 1, 3) == '#k:' then
    kept = 1
  elseif string.sub(holder, 1, 3) == '#r:' then
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
"#
);

/// An operator's release of whatever holds a name, owner or not (its holders learn of the loss
/// at their next renewal); wakes waiters — those of a plain lock on the name's channel, and the
/// head of a fair lock's line, if the name has one, on its own.
///
/// `KEYS[1]` lock, `KEYS[2]` wake channel, `KEYS[3]` the fair queue, `KEYS[4]` alive; `ARGV[1]`
/// the command that wakes waiters. Returns 1 if a key was removed, 0 if there was none.
pub(crate) static FORCE_RELEASE: LazyLock<Script> =
    LazyLock::new(|| Script::new(FORCE_RELEASE_LUA));

pub(crate) const FORCE_RELEASE_LUA: &str = concat!(
    clock_lua!(),
    fair_lua!(),
    r#"
if redis.call('DEL', KEYS[1]) == 1 then
  redis.call(ARGV[1], KEYS[2], '1')
  local head = fair_head(KEYS[3], KEYS[4], now_ms())
  if head then
    redis.call(ARGV[1], KEYS[2] .. ':' .. head, '1')
  end
  return 1
end
return 0
"#
);
