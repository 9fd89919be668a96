//! The scripts' calls, typed: one struct per script (or per form of one), its fields named,
//! which writes its keys and arguments in the order the script's file lists them. A call site
//! fills the struct; only this file and `calls/sorted_sets.rs` (the kinds kept in sorted sets)
//! know which `ARGV[n]` is which.

use std::time::Duration;

use super::{
    ACQUIRE, FENCE, FORCE_RELEASE, HANDOFF, HOLDS, HOLDS_MEMBER, INSPECT, LEAVE_TURN, Lua, RELEASE,
    RELEASE_PERMIT, RELEASE_READ, RENEW,
};

mod sorted_sets;
pub(crate) use sorted_sets::*;

/// A script's call: which script, and its keys and arguments in the script's order.
pub(crate) trait Call {
    /// The script.
    fn lua(&self) -> &'static Lua;
    /// How many keys [`write`](Call::write) writes.
    fn key_count(&self) -> usize;
    /// Writes the keys, then the arguments.
    fn write(&self, out: &mut impl Out);
}

/// Where a call writes its keys and arguments (a command being built).
pub(crate) trait Out {
    /// A key, or an argument that is text.
    fn text(&mut self, text: &str);
    /// An argument that is a number.
    fn number(&mut self, n: u64);
}

/// `d` in whole milliseconds, rounded up: a period kept in Redis must not end early.
pub(crate) fn millis_up(d: Duration) -> u64 {
    u64::try_from(d.as_nanos().div_ceil(1_000_000))
        .unwrap_or(u64::MAX)
        .max(1)
}

/// `d` in whole milliseconds, at least 1 (Redis refuses a lease of 0).
pub(crate) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}

/// A fence TTL as the scripts take it: ms, `0` for none.
fn fence_ttl_ms(ttl: Option<Duration>) -> u64 {
    ttl.map_or(0, millis)
}

fn flag(on: bool) -> &'static str {
    if on { "1" } else { "0" }
}

/// Turns across processes (plain locks): the `Locker` an attempt comes from, whether it comes
/// from the waiter at the head of that `Locker`'s local queue (only that one takes a lock kept
/// for its `Locker`), and its claim to be next in turn, if it makes one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Turn<'a> {
    pub(crate) locker: &'a str,
    pub(crate) head: bool,
    pub(crate) claim: Option<Claim>,
    /// A head waiter's hand-over token, which a release may grant the lock to (with a claim)
    /// and which the attempt takes a grant over from.
    pub(crate) grant: Option<GrantTo<'a>>,
}

/// A head waiter's offer to be granted the lock by a release: its hand-over token, and the
/// number of the attempt that carries the claim (the wake-up names it, so the waiter knows when
/// it sent the claim that was granted).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct GrantTo<'a> {
    pub(crate) token: &'a str,
    pub(crate) attempt: u64,
    /// How old the claim may be when granted; the grant lasts twice this from the release.
    pub(crate) window: Duration,
    /// When the attempt is sent, on the clock that orders claims (`Backend::wall_ms`): a
    /// release reads the claim's age from it.
    pub(crate) sent_ms: u64,
}

/// A claim to be next in turn: how long a release keeps the lock for the claimant's `Locker`,
/// and since when its waiter waits (wall-clock ms: the earlier claim wins).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Claim {
    pub(crate) window: Duration,
    pub(crate) since: u64,
}

/// `ACQUIRE`: a plain lock's attempt.
pub(crate) struct Acquire<'a> {
    pub(crate) lock: &'a str,
    /// The fencing counter; `None` while the name's slot migrates (see the script).
    pub(crate) fence: Option<&'a str>,
    pub(crate) owner: &'a str,
    pub(crate) lease: Duration,
    pub(crate) fence_ttl: Option<Duration>,
    pub(crate) turn: Turn<'a>,
}

impl Call for Acquire<'_> {
    fn lua(&self) -> &'static Lua {
        &ACQUIRE
    }

    fn key_count(&self) -> usize {
        1 + usize::from(self.fence.is_some())
    }

    fn write(&self, out: &mut impl Out) {
        out.text(self.lock);
        if let Some(fence) = self.fence {
            out.text(fence);
        }
        let turn = &self.turn;
        out.text(self.owner);
        out.number(millis(self.lease));
        out.number(turn.claim.map_or(0, |c| millis_up(c.window)));
        out.number(turn.claim.map_or(0, |c| c.since));
        out.text(turn.locker);
        out.text(flag(turn.head));
        out.number(fence_ttl_ms(self.fence_ttl));
        if let Some(grant) = turn.grant {
            out.text(grant.token);
            out.number(grant.attempt);
            out.number(millis_up(grant.window));
            out.number(grant.sent_ms);
        }
    }
}

/// One lease change in a batch (a watchdog renewal or an `extend`).
#[derive(Debug, Clone)]
pub(crate) struct RenewItem {
    pub(crate) key: String,
    pub(crate) owner: String,
    pub(crate) lease_ms: u64,
    /// The hold's sequence number for this change: applied only above the last one applied.
    pub(crate) seq: u64,
    /// A semaphore's permit (`key` its permits, `owner` the permit id): the lease moves
    /// whenever the permit has not expired.
    pub(crate) permit: bool,
    /// How many members the hold is: the permits taken at once as `owner` (else 1).
    pub(crate) members: u32,
}

/// `RENEW`: a batch of lease changes, all in one slot on a cluster.
pub(crate) struct Renew<'a> {
    pub(crate) items: &'a [RenewItem],
}

impl Call for Renew<'_> {
    fn lua(&self) -> &'static Lua {
        &RENEW
    }

    fn key_count(&self) -> usize {
        self.items.len()
    }

    fn write(&self, out: &mut impl Out) {
        for item in self.items {
            out.text(&item.key);
        }
        for item in self.items {
            out.text(&item.owner);
            out.number(item.lease_ms);
            if item.permit && item.members > 1 {
                out.text(&format!("p{}x{}", item.seq, item.members));
            } else if item.permit {
                out.text(&format!("p{}", item.seq));
            } else {
                out.number(item.seq);
            }
        }
    }
}

/// `ACQUIRE_ALL`: all-or-none acquisition of several locks, each with its own owner.
pub(crate) struct AcquireAll<'a> {
    /// Each lock's key, its fencing counter and its owner.
    pub(crate) locks: &'a [(&'a str, &'a str, &'a str)],
    pub(crate) lease: Duration,
    pub(crate) fence_ttl: Option<Duration>,
}

impl Call for AcquireAll<'_> {
    fn lua(&self) -> &'static Lua {
        &super::ACQUIRE_ALL
    }

    fn key_count(&self) -> usize {
        2 * self.locks.len()
    }

    fn write(&self, out: &mut impl Out) {
        for (lock, fence, _) in self.locks {
            out.text(lock);
            out.text(fence);
        }
        out.number(millis(self.lease));
        out.number(fence_ttl_ms(self.fence_ttl));
        for (_, _, owner) in self.locks {
            out.text(owner);
        }
    }
}

/// `FENCE`: a plain lock's hold's fencing token, minted if it has none.
pub(crate) struct Fence<'a> {
    pub(crate) lock: &'a str,
    pub(crate) fence: &'a str,
    pub(crate) owner: &'a str,
    pub(crate) fence_ttl: Option<Duration>,
}

impl Call for Fence<'_> {
    fn lua(&self) -> &'static Lua {
        &FENCE
    }

    fn key_count(&self) -> usize {
        2
    }

    fn write(&self, out: &mut impl Out) {
        out.text(self.lock);
        out.text(self.fence);
        out.text(self.owner);
        out.number(fence_ttl_ms(self.fence_ttl));
    }
}

/// `HOLDS` (a lock) or `HOLDS_MEMBER` (a permit, a reader): does `owner` still hold `key`?
pub(crate) struct Holds<'a> {
    pub(crate) key: &'a str,
    pub(crate) owner: &'a str,
    /// A member of a sorted set (a permit, a reader), not a lock's key.
    pub(crate) member: bool,
}

impl Call for Holds<'_> {
    fn lua(&self) -> &'static Lua {
        if self.member { &HOLDS_MEMBER } else { &HOLDS }
    }

    fn key_count(&self) -> usize {
        1
    }

    fn write(&self, out: &mut impl Out) {
        out.text(self.key);
        out.text(self.owner);
    }
}

/// How a release wakes waiters: with `PUBLISH`, or on a cluster `SPUBLISH` (and its
/// subscribers are counted with `PUBSUB SHARDNUMSUB`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Publish {
    Plain,
    #[cfg_attr(not(feature = "cluster"), allow(dead_code))]
    Sharded,
}

impl Publish {
    /// The command that wakes waiters.
    pub(crate) fn command(self) -> &'static str {
        match self {
            Publish::Plain => "PUBLISH",
            Publish::Sharded => "SPUBLISH",
        }
    }

    /// The `PUBSUB` subcommand that counts a channel's subscribers.
    pub(crate) fn numsub(self) -> &'static str {
        match self {
            Publish::Plain => "NUMSUB",
            Publish::Sharded => "SHARDNUMSUB",
        }
    }
}

/// Which release a hold takes, by its kind (`RELEASE`'s modes, and the members' scripts).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Released<'a> {
    /// A plain lock (mode 0); its channel is the script's default.
    Lock,
    /// A fair lock (mode 1): it leaves the line, and the head is woken.
    Fair {
        channel: &'a str,
        queue: &'a str,
        alive: &'a str,
    },
    /// A writer (mode 2): it stops waiting too.
    Writer { channel: &'a str, waiting: &'a str },
    /// A fair lock's or a writer's hold by its key alone (mode 3), while its slot moves.
    Alone { channel: &'a str },
    /// A semaphore's permit (`RELEASE_PERMIT`): the key is the permits; `turn`, the claim to
    /// the next free permit, is named unless the slot moves; `taken`, the permits taken at
    /// once as the owner.
    Permit {
        channel: &'a str,
        turn: Option<&'a str>,
        taken: u32,
    },
    /// A reader (`RELEASE_READ`): the key is the readers.
    Reader { channel: &'a str },
}

/// A release of `owner`'s hold of `key`.
pub(crate) struct Release<'a> {
    pub(crate) key: &'a str,
    pub(crate) owner: &'a str,
    pub(crate) kind: Released<'a>,
    /// The owner a hand-over of this hold may have gone to.
    pub(crate) handed_to: Option<&'a str>,
    /// How long the name stays taken after the release (`at_least`).
    pub(crate) keep: Option<Duration>,
    pub(crate) publish: Publish,
}

impl Release<'_> {
    /// The common release, of a plain lock on one server: its key and owner alone, every other
    /// key and argument the script's default.
    fn is_common(&self) -> bool {
        matches!(self.kind, Released::Lock)
            && self.handed_to.is_none()
            && self.keep.is_none()
            && self.publish == Publish::Plain
    }
}

impl Call for Release<'_> {
    fn lua(&self) -> &'static Lua {
        match self.kind {
            Released::Permit { .. } => &RELEASE_PERMIT,
            Released::Reader { .. } => &RELEASE_READ,
            _ => &RELEASE,
        }
    }

    fn key_count(&self) -> usize {
        match self.kind {
            Released::Fair { .. } => 4,
            Released::Writer { .. } => 3,
            Released::Permit { turn: Some(_), .. } => 2,
            _ => 1,
        }
    }

    fn write(&self, out: &mut impl Out) {
        out.text(self.key);
        let (mode, channel) = match self.kind {
            // A reader's set is named alone (a permit's with its claim key, or alone while
            // its slot moves), its channel passed as an argument:
            // on a cluster a command naming two keys of a migrating slot fails (`TRYAGAIN`)
            // until the migration ends unless both are on the same side, and a channel is
            // never a key that exists. (The channel shares the set's hash tag, so the script
            // may publish on it.)
            Released::Permit {
                channel,
                turn,
                taken,
            } => {
                if let Some(turn) = turn {
                    out.text(turn);
                }
                out.text(self.owner);
                out.text(self.publish.command());
                out.text(channel);
                if taken > 1 {
                    out.number(u64::from(taken));
                }
                return;
            }
            Released::Reader { channel } => {
                out.text(self.owner);
                out.text(self.publish.command());
                out.text(channel);
                return;
            }
            Released::Lock if self.is_common() => {
                out.text(self.owner);
                return;
            }
            // The channel is the script's default (the key's `:wake`), so the key is named
            // alone, for the same reason as a permit's.
            Released::Lock => ("0", None),
            Released::Fair {
                channel,
                queue,
                alive,
            } => {
                out.text(channel);
                out.text(queue);
                out.text(alive);
                ("1", None)
            }
            Released::Writer { channel, waiting } => {
                out.text(channel);
                out.text(waiting);
                ("2", None)
            }
            Released::Alone { channel } => ("3", Some(channel)),
        };
        out.text(self.owner);
        out.text(self.handed_to.unwrap_or(""));
        out.text(self.publish.command());
        out.number(self.keep.map_or(0, millis_up));
        out.text(mode);
        if let Some(channel) = channel {
            out.text(channel);
        }
    }
}

/// `HANDOFF`: a hand-over inside one process.
pub(crate) struct Handoff<'a> {
    pub(crate) lock: &'a str,
    pub(crate) fence: &'a str,
    pub(crate) channel: &'a str,
    pub(crate) from: &'a str,
    pub(crate) to: &'a str,
    /// The `Locker` handing over.
    pub(crate) locker: &'a str,
    pub(crate) lease: Duration,
    pub(crate) fence_ttl: Option<Duration>,
    pub(crate) publish: Publish,
}

impl Call for Handoff<'_> {
    fn lua(&self) -> &'static Lua {
        &HANDOFF
    }

    fn key_count(&self) -> usize {
        3
    }

    fn write(&self, out: &mut impl Out) {
        out.text(self.lock);
        out.text(self.fence);
        out.text(self.channel);
        out.text(self.from);
        out.text(self.to);
        out.number(millis(self.lease));
        out.number(fence_ttl_ms(self.fence_ttl));
        // Read by layout 1's script only (it counts the channel's subscribers); this layout's
        // reads whether another `Locker` waits from the hold.
        out.text(self.publish.numsub());
        out.text(self.locker);
        out.text(self.publish.command());
    }
}

/// `LEAVE_TURN`: a waiter that claimed the next turn leaves without the lock.
pub(crate) struct LeaveTurn<'a> {
    /// The lock (a writer's too), or a semaphore's permits.
    pub(crate) lock: &'a str,
    pub(crate) channel: &'a str,
    /// A semaphore's claim to the next free permit.
    pub(crate) permit_turn: Option<&'a str>,
    /// Since when the waiter waited, as in its claim.
    pub(crate) since: u64,
    pub(crate) locker: &'a str,
    /// It was its `Locker`'s last waiter for the name.
    pub(crate) last: bool,
    pub(crate) publish: Publish,
    /// The waiter's hand-over token, if it offered one.
    pub(crate) granted_to: Option<&'a str>,
}

impl Call for LeaveTurn<'_> {
    fn lua(&self) -> &'static Lua {
        &LEAVE_TURN
    }

    fn key_count(&self) -> usize {
        2 + usize::from(self.permit_turn.is_some())
    }

    fn write(&self, out: &mut impl Out) {
        out.text(self.lock);
        out.text(self.channel);
        if let Some(turn) = self.permit_turn {
            out.text(turn);
        }
        out.number(self.since);
        out.text(self.locker);
        out.text(flag(self.last));
        out.text(self.publish.command());
        out.text(self.granted_to.unwrap_or(""));
    }
}

/// `INSPECT`: what a name holds, for operators: its lock, read-write lock and semaphore.
pub(crate) struct Inspect<'a> {
    pub(crate) lock: &'a str,
    pub(crate) fence: &'a str,
    pub(crate) channel: &'a str,
    pub(crate) queue: &'a str,
    pub(crate) writer: &'a str,
    pub(crate) readers: &'a str,
    pub(crate) permits: &'a str,
    pub(crate) permit_limit: &'a str,
    pub(crate) publish: Publish,
}

impl Call for Inspect<'_> {
    fn lua(&self) -> &'static Lua {
        &INSPECT
    }

    fn key_count(&self) -> usize {
        8
    }

    fn write(&self, out: &mut impl Out) {
        for key in [
            self.lock,
            self.fence,
            self.channel,
            self.queue,
            self.writer,
            self.readers,
            self.permits,
            self.permit_limit,
        ] {
            out.text(key);
        }
        out.text(self.publish.numsub());
    }
}

/// `FORCE_RELEASE`: an operator's release of whatever holds a name, of every kind.
pub(crate) struct ForceRelease<'a> {
    pub(crate) lock: &'a str,
    pub(crate) channel: &'a str,
    pub(crate) queue: &'a str,
    pub(crate) alive: &'a str,
    pub(crate) writer: &'a str,
    pub(crate) readers: &'a str,
    pub(crate) rw_channel: &'a str,
    pub(crate) permits: &'a str,
    pub(crate) permits_channel: &'a str,
    pub(crate) publish: Publish,
}

impl Call for ForceRelease<'_> {
    fn lua(&self) -> &'static Lua {
        &FORCE_RELEASE
    }

    fn key_count(&self) -> usize {
        9
    }

    fn write(&self, out: &mut impl Out) {
        for key in [
            self.lock,
            self.channel,
            self.queue,
            self.alive,
            self.writer,
            self.readers,
            self.rw_channel,
            self.permits,
            self.permits_channel,
        ] {
            out.text(key);
        }
        out.text(self.publish.command());
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{Call, Out, Publish, Release, Released};

    #[derive(Default)]
    struct Words(Vec<String>);

    impl Out for Words {
        fn text(&mut self, text: &str) {
            self.0.push(text.to_owned());
        }

        fn number(&mut self, n: u64) {
            self.0.push(n.to_string());
        }
    }

    fn written(call: &impl Call) -> Vec<String> {
        let mut words = Words::default();
        call.write(&mut words);
        words.0
    }

    /// The common release sends the key and the owner alone; another release of a plain lock
    /// names its key alone too, its channel the script's default.
    #[test]
    fn a_plain_release_names_its_key_alone() {
        let mut release = Release {
            key: "{a}",
            owner: "o",
            kind: Released::Lock,
            handed_to: None,
            keep: None,
            publish: Publish::Plain,
        };
        assert_eq!(written(&release), ["{a}", "o"]);
        release.keep = Some(Duration::from_millis(1500));
        release.publish = Publish::Sharded;
        assert_eq!(release.key_count(), 1);
        assert_eq!(written(&release), ["{a}", "o", "", "SPUBLISH", "1500", "0"]);
        release.kind = Released::Alone {
            channel: "{a}:wake",
        };
        assert_eq!(
            written(&release),
            ["{a}", "o", "", "SPUBLISH", "1500", "3", "{a}:wake"]
        );
    }
}
