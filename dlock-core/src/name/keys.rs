//! The Redis keys of each kind of lock: all the keys of one name share its hash tag, so one
//! script may touch them all, on one server or in one cluster slot.

use super::LockName;

/// The Redis keys of one hold's name.
#[derive(Debug, Clone)]
pub(crate) struct LockKeys {
    /// What is held: a lock's hold (a string: the owner token, then the hold's fencing token,
    /// lease sequence number and turn fields; see the `protocol` module), or the sorted set of a
    /// semaphore's permits or a read-write lock's readers (`id -> expiry`).
    pub(crate) lock: String,
    /// The fencing counter's key, then the wake-up channel, in one string (one allocation for
    /// both): see [`fence`](Self::fence) and [`channel`](Self::channel).
    fence_and_channel: String,
    /// Where the channel starts in `fence_and_channel`.
    channel_at: usize,
    /// What kind of hold, with the keys that kind needs besides.
    pub(crate) kind: KeyKind,
}

/// The kinds of hold.
#[derive(Debug, Clone)]
pub(crate) enum KeyKind {
    /// A plain lock.
    Lock,
    /// A fair lock: a plain lock and a line of waiters.
    Fair(FairKeys),
    /// A semaphore's permit.
    Semaphore(SemaphoreKeys),
    /// A read-write lock's writer: a lock on its own key.
    Write(RwKeys),
    /// A read-write lock's reader: a member of its readers.
    Read(RwKeys),
}

impl KeyKind {
    /// The kind's `kind` label in metrics and spans: `lock`, `fair`, `permit`, `write` or
    /// `read`.
    pub(crate) fn label(&self) -> &'static str {
        match self {
            Self::Lock => "lock",
            Self::Fair(_) => "fair",
            Self::Semaphore(_) => "permit",
            Self::Write(_) => "write",
            Self::Read(_) => "read",
        }
    }
}

/// The keys of a fair lock's waiting line.
#[derive(Debug, Clone)]
pub(crate) struct FairKeys {
    /// `waiter -> place in line` (a sorted set).
    pub(crate) queue: String,
    /// `waiter -> until when it counts as alive`, in server milliseconds (a sorted set).
    pub(crate) alive: String,
}

/// What a semaphore's permits need besides their set.
#[derive(Debug, Clone)]
pub(crate) struct SemaphoreKeys {
    /// The permit count set at run time (a string), if any.
    pub(crate) limit: String,
    /// The count to use when none was set.
    pub(crate) permits: u32,
    /// The claim to the next free permit, of the `Locker` whose waiter has waited longest (see
    /// `ACQUIRE_PERMIT`).
    pub(crate) turn: String,
    /// How many permits the request takes at once (all or none).
    pub(crate) take: u32,
    /// How long a claim for several permits keeps free ones from others without another
    /// attempt (`None`: the request takes one, or does not wait).
    pub(crate) claim_counts: Option<std::time::Duration>,
}

/// The keys of a read-write lock, and how it treats waiting writers.
#[derive(Debug, Clone)]
pub(crate) struct RwKeys {
    /// The writer's lock (a hash, as a plain lock's).
    pub(crate) write: String,
    /// The readers: `reader id -> expiry` (server ms).
    pub(crate) readers: String,
    /// Writers waiting: `writer -> until when its wait counts` (server ms); while one does,
    /// new readers stay out (when writers are preferred).
    pub(crate) waiting: String,
    /// New readers stay out while a writer waits.
    pub(crate) prefer_writers: bool,
    /// How long a waiting writer's wait counts without another attempt (`None`: the attempt
    /// does not wait: a `try_lock`, or writers are not preferred).
    pub(crate) wait_counts: Option<std::time::Duration>,
}

/// Every key that may hold something for one name, across the kinds (a lock, fair or not, a
/// read-write lock and a semaphore of the same name live apart): what an operator looks at and
/// frees.
#[derive(Debug, Clone)]
pub(crate) struct NameKeys {
    /// The lock's: the lock, its fencing counter and its channel.
    pub(crate) lock: LockKeys,
    /// The fair lock's line.
    pub(crate) fair: FairKeys,
    /// The read-write lock's writer, readers and waiting writers.
    pub(crate) rw: RwKeys,
    /// The read-write lock's wake-up channel.
    pub(crate) rw_channel: String,
    /// The semaphore's permits.
    pub(crate) permits: String,
    /// The semaphore's permit count set at run time.
    pub(crate) permit_limit: String,
    /// The semaphore's wake-up channel.
    pub(crate) permits_channel: String,
}

impl NameKeys {
    /// The suffixes, after the name's `{name}`, of the keys that hold something: a lock, a
    /// writer, readers, permits. A name with any of them is listed.
    pub(crate) const HOLD_SUFFIXES: [&'static str; 4] = ["", ":write", ":read", ":permits"];

    pub(crate) fn new(prefix: &str, name: &LockName) -> Self {
        let lock = LockKeys::new(prefix, name);
        let base = lock.lock.as_str();
        let (rw, rw_channel) = RwKeys::of(base, false, None);
        Self {
            fair: FairKeys::of(base),
            rw,
            rw_channel,
            permits: format!("{base}:permits"),
            permit_limit: format!("{base}:permits:limit"),
            permits_channel: format!("{base}:permits:wake"),
            lock,
        }
    }
}

impl FairKeys {
    /// The line of the lock `lock`.
    fn of(lock: &str) -> Self {
        Self {
            queue: format!("{lock}:queue"),
            alive: format!("{lock}:alive"),
        }
    }
}

impl RwKeys {
    /// The keys of the read-write lock whose name's lock key is `base`, and its wake-up
    /// channel.
    fn of(
        base: &str,
        prefer_writers: bool,
        wait_counts: Option<std::time::Duration>,
    ) -> (Self, String) {
        let keys = Self {
            write: format!("{base}:write"),
            readers: format!("{base}:read"),
            waiting: format!("{base}:write:waiting"),
            prefer_writers,
            wait_counts,
        };
        (keys, format!("{base}:rw:wake"))
    }
}

impl LockKeys {
    pub(crate) fn new(prefix: &str, name: &LockName) -> Self {
        let mut lock = String::with_capacity(prefix.len() + name.as_str().len() + 2);
        lock.push_str(prefix);
        lock.push('{');
        lock.push_str(name.as_str());
        lock.push('}');
        // Every acquisition builds these: plain copies, not the formatting machinery.
        let mut both = String::with_capacity(2 * lock.len() + 11);
        both.push_str(&lock);
        both.push_str(":fence");
        let channel_at = both.len();
        both.push_str(&lock);
        both.push_str(":wake");
        Self {
            lock,
            fence_and_channel: both,
            channel_at,
            kind: KeyKind::Lock,
        }
    }

    /// Keys of `kind` with these lock, fencing counter and channel keys.
    fn of(lock: String, fence: &str, channel: &str, kind: KeyKind) -> Self {
        Self {
            lock,
            fence_and_channel: format!("{fence}{channel}"),
            channel_at: fence.len(),
            kind,
        }
    }

    /// The fencing counter.
    pub(crate) fn fence(&self) -> &str {
        &self.fence_and_channel[..self.channel_at]
    }

    /// The wake-up channel (for a fair lock, each waiter's channel is this one, `:`, and the
    /// waiter's owner token).
    pub(crate) fn channel(&self) -> &str {
        &self.fence_and_channel[self.channel_at..]
    }

    /// The keys of the semaphore `name` with `permits` permits unless a count was set: its
    /// permits (a sorted set of permit ids by expiry, in `lock`), its set count and its wake-up
    /// channel. They share the name's hash tag, but not a lock's keys. The request takes `take`
    /// permits at once; one for several that waits keeps free permits from others for
    /// `claim_counts` after each of its attempts.
    pub(crate) fn semaphore(
        prefix: &str,
        name: &LockName,
        permits: u32,
        (take, claim_counts): (u32, Option<std::time::Duration>),
    ) -> Self {
        let base = Self::new(prefix, name).lock;
        Self::of(
            format!("{base}:permits"),
            &format!("{base}:permits:fence"),
            &format!("{base}:permits:wake"),
            KeyKind::Semaphore(SemaphoreKeys {
                limit: format!("{base}:permits:limit"),
                permits,
                turn: format!("{base}:permits:turn"),
                take,
                claim_counts: claim_counts.filter(|_| take > 1),
            }),
        )
    }

    /// The keys of the fair lock `name`: the plain lock's, and its waiting line.
    pub(crate) fn fair(prefix: &str, name: &LockName) -> Self {
        let mut keys = Self::new(prefix, name);
        keys.kind = KeyKind::Fair(FairKeys::of(&keys.lock));
        keys
    }

    /// The keys of the read-write lock `name`, for a writer (`write`) or a reader. Apart from a
    /// plain lock's of the same name.
    pub(crate) fn read_write(
        prefix: &str,
        name: &LockName,
        write: bool,
        prefer_writers: bool,
        wait_counts: Option<std::time::Duration>,
    ) -> Self {
        let base = Self::new(prefix, name).lock;
        let (rw, channel) = RwKeys::of(
            &base,
            prefer_writers,
            wait_counts.filter(|_| prefer_writers && write),
        );
        if write {
            let fence = format!("{base}:write:fence");
            Self::of(rw.write.clone(), &fence, &channel, KeyKind::Write(rw))
        } else {
            let fence = format!("{base}:read:fence");
            Self::of(rw.readers.clone(), &fence, &channel, KeyKind::Read(rw))
        }
    }

    /// The channel that wakes the fair waiter `owner`.
    pub(crate) fn waiter_channel(&self, owner: &str) -> String {
        format!("{}:{owner}", self.channel())
    }

    /// A fair lock's line.
    pub(crate) fn fair_keys(&self) -> Option<&FairKeys> {
        match &self.kind {
            KeyKind::Fair(fair) => Some(fair),
            _ => None,
        }
    }

    /// A semaphore's.
    pub(crate) fn semaphore_keys(&self) -> Option<&SemaphoreKeys> {
        match &self.kind {
            KeyKind::Semaphore(sem) => Some(sem),
            _ => None,
        }
    }

    /// Whether the hold is a member of a sorted set with its own expiry (a permit, a reader),
    /// not a lock's hold.
    pub(crate) fn is_member(&self) -> bool {
        matches!(self.kind, KeyKind::Semaphore(_) | KeyKind::Read(_))
    }

    /// How many members one hold is: the permits a semaphore's request takes at once, else 1.
    pub(crate) fn members(&self) -> u32 {
        match &self.kind {
            KeyKind::Semaphore(sem) => sem.take,
            _ => 1,
        }
    }

    /// Whether a hold of this kind is re-entered inside a scope: every kind but a permit (one of
    /// several, to be counted).
    pub(crate) fn reenters(&self) -> bool {
        !matches!(self.kind, KeyKind::Semaphore(_))
    }

    /// A read-write lock's.
    pub(crate) fn rw_keys(&self) -> Option<&RwKeys> {
        match &self.kind {
            KeyKind::Write(rw) | KeyKind::Read(rw) => Some(rw),
            _ => None,
        }
    }

    /// Whether a release may hand the hold straight to a local waiter: plain locks only (a fair
    /// lock goes to the head of its line, a permit or a reader is not handed on, a writer's
    /// successor must leave the writers' waiting set).
    pub(crate) fn hands_over(&self) -> bool {
        matches!(self.kind, KeyKind::Lock)
    }

    /// Whether a waiter that finds the hold taken claims the next turn for its `Locker`, so
    /// that processes take turns (see the `protocol` module): a plain lock, a writer and a
    /// permit. A fair lock has its line; a reader shares the lock.
    pub(crate) fn claims_turns(&self) -> bool {
        matches!(
            self.kind,
            KeyKind::Lock | KeyKind::Write(_) | KeyKind::Semaphore(_)
        )
    }
}
