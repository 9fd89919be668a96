//! The calls of the kinds kept in sorted sets: a fair lock's line, a semaphore's permits, a
//! read-write lock's readers and waiting writers (`ACQUIRE_FAIR`, `ACQUIRE_PERMIT`,
//! `SET_PERMITS`, `PERMITS`, `ACQUIRE_WRITE`, `ACQUIRE_READ`).

use std::time::Duration;

use super::super::{
    ACQUIRE_FAIR, ACQUIRE_PERMIT, ACQUIRE_READ, ACQUIRE_WRITE, PERMITS, SET_PERMITS,
};
use super::{Call, Lua, Out, Publish, Turn, fence_ttl_ms, flag, millis, millis_up};

/// `ACQUIRE_FAIR`: a fair lock's attempt.
pub(crate) struct AcquireFair<'a> {
    pub(crate) lock: &'a str,
    pub(crate) fence: &'a str,
    pub(crate) channel: &'a str,
    pub(crate) queue: &'a str,
    pub(crate) alive: &'a str,
    pub(crate) owner: &'a str,
    pub(crate) lease: Duration,
    pub(crate) fence_ttl: Option<Duration>,
    /// How long the waiter counts as alive without another attempt (`None`: it does not join
    /// the line).
    pub(crate) alive_for: Option<Duration>,
    pub(crate) publish: Publish,
    /// The waiter's place in line, when it is not `owner`.
    pub(crate) place: Option<&'a str>,
}

impl Call for AcquireFair<'_> {
    fn lua(&self) -> &'static Lua {
        &ACQUIRE_FAIR
    }

    fn key_count(&self) -> usize {
        5
    }

    fn write(&self, out: &mut impl Out) {
        for key in [self.lock, self.fence, self.channel, self.queue, self.alive] {
            out.text(key);
        }
        out.text(self.owner);
        out.number(millis(self.lease));
        out.number(fence_ttl_ms(self.fence_ttl));
        out.number(self.alive_for.map_or(0, millis));
        out.text(self.publish.command());
        if let Some(place) = self.place {
            out.text(place);
        }
    }
}

/// `ACQUIRE_PERMIT`: a semaphore's attempt.
pub(crate) struct AcquirePermit<'a> {
    pub(crate) permits: &'a str,
    pub(crate) limit: &'a str,
    /// The claim to the next free permit.
    pub(crate) turn_key: &'a str,
    pub(crate) id: &'a str,
    pub(crate) lease: Duration,
    /// The count when none was set at run time.
    pub(crate) count: u32,
    /// Where the attempt comes from, and its claim to the next free permit, if it makes one.
    pub(crate) turn: Turn<'a>,
    /// How many permits it takes at once.
    pub(crate) take: u32,
    /// The wake-up channel, for those a served claim of several kept out.
    pub(crate) channel: &'a str,
    pub(crate) publish: Publish,
}

impl Call for AcquirePermit<'_> {
    fn lua(&self) -> &'static Lua {
        &ACQUIRE_PERMIT
    }

    fn key_count(&self) -> usize {
        3
    }

    fn write(&self, out: &mut impl Out) {
        out.text(self.permits);
        out.text(self.limit);
        out.text(self.turn_key);
        out.text(self.id);
        out.number(millis(self.lease));
        out.number(u64::from(self.count));
        write_turn(out, &self.turn);
        out.number(u64::from(self.take));
        out.text(self.publish.command());
        out.text(self.channel);
    }
}

/// A claim to the next turn, as `ACQUIRE_PERMIT` and `ACQUIRE_WRITE` take it after their own
/// arguments: the ms it asks a release to keep the hold for (`0`: no claim), since when the
/// waiter waits, the `Locker`'s id and whether the attempt comes from its local line's head.
fn write_turn(out: &mut impl Out, turn: &Turn<'_>) {
    out.number(turn.claim.map_or(0, |c| millis_up(c.window)));
    out.number(turn.claim.map_or(0, |c| c.since));
    out.text(turn.locker);
    out.text(flag(turn.head));
}

/// `SET_PERMITS`: a semaphore's count set at run time (`None`: each handle's own again).
pub(crate) struct SetPermits<'a> {
    pub(crate) limit: &'a str,
    pub(crate) channel: &'a str,
    pub(crate) count: Option<u32>,
    pub(crate) publish: Publish,
}

impl Call for SetPermits<'_> {
    fn lua(&self) -> &'static Lua {
        &SET_PERMITS
    }

    fn key_count(&self) -> usize {
        2
    }

    fn write(&self, out: &mut impl Out) {
        out.text(self.limit);
        out.text(self.channel);
        match self.count {
            Some(n) => out.number(u64::from(n)),
            None => out.text(""),
        }
        out.text(self.publish.command());
    }
}

/// `PERMITS`: a semaphore's permits now.
pub(crate) struct Permits<'a> {
    pub(crate) permits: &'a str,
    pub(crate) limit: &'a str,
}

impl Call for Permits<'_> {
    fn lua(&self) -> &'static Lua {
        &PERMITS
    }

    fn key_count(&self) -> usize {
        2
    }

    fn write(&self, out: &mut impl Out) {
        out.text(self.permits);
        out.text(self.limit);
    }
}

/// `ACQUIRE_WRITE`: a read-write lock's writer's attempt.
pub(crate) struct AcquireWrite<'a> {
    pub(crate) write: &'a str,
    pub(crate) fence: &'a str,
    pub(crate) readers: &'a str,
    pub(crate) waiting: &'a str,
    pub(crate) owner: &'a str,
    pub(crate) lease: Duration,
    pub(crate) fence_ttl: Option<Duration>,
    /// How long the writer's wait counts without another attempt (`None`: not recorded).
    pub(crate) wait_counts: Option<Duration>,
    /// Where the attempt comes from, and its claim to the next turn, if it makes one.
    pub(crate) turn: Turn<'a>,
}

impl Call for AcquireWrite<'_> {
    fn lua(&self) -> &'static Lua {
        &ACQUIRE_WRITE
    }

    fn key_count(&self) -> usize {
        4
    }

    fn write(&self, out: &mut impl Out) {
        for key in [self.write, self.fence, self.readers, self.waiting] {
            out.text(key);
        }
        out.text(self.owner);
        out.number(millis(self.lease));
        out.number(fence_ttl_ms(self.fence_ttl));
        out.number(self.wait_counts.map_or(0, millis));
        write_turn(out, &self.turn);
    }
}

/// `ACQUIRE_READ`: a read-write lock's reader's attempt.
pub(crate) struct AcquireRead<'a> {
    pub(crate) readers: &'a str,
    pub(crate) write: &'a str,
    pub(crate) waiting: &'a str,
    pub(crate) id: &'a str,
    pub(crate) lease: Duration,
    pub(crate) prefer_writers: bool,
}

impl Call for AcquireRead<'_> {
    fn lua(&self) -> &'static Lua {
        &ACQUIRE_READ
    }

    fn key_count(&self) -> usize {
        3
    }

    fn write(&self, out: &mut impl Out) {
        for key in [self.readers, self.write, self.waiting] {
            out.text(key);
        }
        out.text(self.id);
        out.number(millis(self.lease));
        out.text(flag(self.prefer_writers));
    }
}
