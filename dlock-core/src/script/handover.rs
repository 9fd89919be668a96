//! The scripts that pass a plain lock on: the hand-over inside one process, and a waiter's
//! leaving its turn across processes (the key layout and the turns are in the parent module).

use std::sync::LazyLock;

use redis::Script;

/// Hand-over inside one process: release `ARGV[1]`'s hold and, in the same step, acquire for
/// `ARGV[2]` with a fresh fencing token, so a local waiter takes over without a wake-up round trip.
///
/// `KEYS[1]` lock, `KEYS[2]` fence, `KEYS[3]` wake channel; `ARGV[1]` old owner, `ARGV[2]` new owner, `ARGV[3]` lease ms,
/// `ARGV[4]` fence TTL ms, `ARGV[5]` the `PUBSUB` subcommand that counts a channel's subscribers
/// (`NUMSUB`, or `SHARDNUMSUB` on a cluster), `ARGV[6]` the id of the `Locker` handing over,
/// `ARGV[7]` the command that wakes waiters (`PUBLISH`, or `SPUBLISH` on a cluster).
/// Returns `{1, token}` handed over, `{0, code}` not handed over (`code` as
/// [`RELEASE`](super::RELEASE)'s: `-1` expired, `-2` taken over), or `{2, woken}`: waiters
/// elsewhere want it — another `Locker`
/// listens for its release, or a waiter of another `Locker` is next in turn —, so it was
/// released instead, as [`RELEASE`](super::RELEASE) does (`woken` subscribers got the wake-up).
pub(crate) static HANDOFF: LazyLock<Script> = LazyLock::new(|| Script::new(HANDOFF_LUA));

pub(crate) const HANDOFF_LUA: &str = concat!(
    clock_lua!(),
    next_fence_lua!(),
    hold_lua!(),
    let_go_lua!(),
    r#"
local v = redis.call('GET', KEYS[1])
if not v or who(v) ~= ARGV[1] then
  if v then
    return {0, -2}
  end
  return {0, -1}
end
local claim = field(v, 'w')
local next_in = claim and string.match(claim, '^%d+:%d+:(%x+)')
if (next_in and next_in ~= ARGV[6]) or redis.call('PUBSUB', ARGV[5], KEYS[3])[2] > 1 then
  return {2, redis.call(ARGV[7], KEYS[3], let_go(KEYS[1], claim, v, ARGV[7] == 'SPUBLISH'))}
end
local f = next_fence(KEYS[2], ARGV[4])
redis.call('PSETEX', KEYS[1], ARGV[3], ARGV[2] .. ' f' .. string.format('%d', f))
return {1, f}
"#
);

/// A waiter that claimed the next turn (see [`ACQUIRE`](super::ACQUIRE)) stops waiting without
/// the lock: its claim goes (any claim of its `Locker`'s, if it was the last waiter there), and so does a lock
/// kept for its `Locker` if no other waiter of it is left, or granted to its hand-over token, so
/// nobody waits for a turn that will not be taken.
///
/// `KEYS[1]` lock, `KEYS[2]` wake channel; `ARGV[1]` since when the waiter waited (as in its
/// claim), `ARGV[2]` the id of its `Locker`, `ARGV[3]` `1` if it was that `Locker`'s last
/// waiter for the name, `ARGV[4]` the command that wakes waiters, `ARGV[5]` (optional) the
/// waiter's hand-over token. A lock kept for the `Locker` or granted to the token passes on as a
/// release passes it (see `let_go`); waiters are woken. Returns 1 if it removed anything, else 0.
pub(crate) static LEAVE_TURN: LazyLock<Script> = LazyLock::new(|| Script::new(LEAVE_TURN_LUA));

pub(crate) const LEAVE_TURN_LUA: &str = concat!(
    clock_lua!(),
    next_fence_lua!(),
    hold_lua!(),
    let_go_lua!(),
    r#"
local v = redis.call('GET', KEYS[1])
if not v then
  return 0
end
local claim = field(v, 'w')
local left = 0
if claim then
  local since, locker = string.match(claim, '^(%d+):%d+:(%x+)')
  if locker == ARGV[2] and (since == ARGV[1] or ARGV[3] == '1') then
    claim = nil
    left = 1
  end
end
local holder = who(v)
local granted = (ARGV[5] or '') ~= '' and holder == ARGV[5]
if granted or (holder == '#r:' .. ARGV[2] and ARGV[3] == '1') then
  redis.call(ARGV[4], KEYS[2], let_go(KEYS[1], claim, v, ARGV[4] == 'SPUBLISH'))
  return 1
end
if left == 1 then
  rewrite(KEYS[1], without(v, 'w'))
end
return left
"#
);

#[cfg(test)]
mod tests {
    use super::{HANDOFF_LUA, LEAVE_TURN_LUA};

    /// A script that publishes what `let_go` returns tells it whether it runs on a cluster by the
    /// very argument it publishes with: another argument would leave a cluster's grant rules
    /// (a token minted only where the name's fence is) to whatever that argument holds.
    #[test]
    fn let_go_is_told_of_a_cluster_by_the_publishing_argument() {
        for lua in [HANDOFF_LUA, LEAVE_TURN_LUA] {
            let call = lua
                .lines()
                .find(|l| l.contains("let_go(KEYS[1]"))
                .expect("the script lets go");
            let published = call
                .split("redis.call(")
                .nth(1)
                .and_then(|rest| rest.split(',').next())
                .expect("the publish command's argument");
            assert!(
                call.contains(&format!("{published} == 'SPUBLISH'")),
                "{call}"
            );
        }
    }
}
