//! Where locks live: Redis (single server, over a connection manager, a multiplexed connection or
//! a bb8 pool, or an in-process memory store that runs the same scripts), or PostgreSQL's
//! advisory locks (feature `postgres`); and how a waiter hears that a lock was let go (`wait`).

use std::time::Duration;

use crate::error::BackendError;
use crate::name::{LockKeys, NameKeys};
pub(crate) use crate::protocol::{Claim, GrantTo, RenewItem, Turn};
use wait::Watch;

#[cfg(feature = "cluster")]
pub(crate) mod cluster;
pub(crate) mod memory;
#[cfg(feature = "postgres")]
pub(crate) mod postgres;
pub(crate) mod redis;
#[cfg(feature = "sentinel")]
pub(crate) mod sentinel;
pub(crate) mod wait;

pub use memory::MemoryStore;

/// The answer to one acquisition attempt, or to a re-entry check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AcquireReply {
    /// Held by this owner now, with this fencing token (`None`: none minted yet, see
    /// [`Session::fence`]; `Some(0)` for the kinds that have none: permits, read locks).
    Acquired { fence: Option<u64> },
    /// Not held by this owner; the holder, if any, has this much lease left (`None`: unknown,
    /// no expiry, or nobody holds it); `foreign`: the hold is in a key layout this version
    /// does not speak (see `protocol::layout`), and was left as it was; `fence`: the fencing
    /// token of the plain hold found, when it has one and the script says.
    Busy {
        pttl: Option<Duration>,
        foreign: bool,
        fence: Option<u64>,
    },
}

impl AcquireReply {
    /// A script's busy answer: `code` 0, or 2 when the hold is in a layout this version does
    /// not speak; `ms` the holder's PTTL (negative: none); `fence` the hold's fencing token,
    /// if the script said (negative: none minted).
    pub(crate) fn busy(code: i64, ms: i64, fence: Option<i64>) -> Self {
        Self::Busy {
            pttl: u64::try_from(ms).ok().map(Duration::from_millis),
            foreign: code == 2,
            fence: fence.and_then(|f| u64::try_from(f).ok()),
        }
    }
}

/// The answer to an all-or-none acquisition of several locks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum AcquireAllReply {
    /// Every lock is held by its owner now, with these fencing tokens (in the order asked).
    Acquired { fences: Vec<u64> },
    /// The lock at `index` is busy (its holder has `pttl` left, if known); nothing was taken.
    Busy {
        index: usize,
        pttl: Option<Duration>,
    },
}

/// The answer to a fair lock's attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FairReply {
    pub(crate) reply: AcquireReply,
    /// The waiter's place in line when busy (0: the head; `None`: not in line).
    pub(crate) place: Option<u64>,
}

/// What a name holds, as [`Session::inspect`] reads it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct RawInfo {
    /// The lock key's remaining lease (`None`: no key, or no expiry).
    pub(crate) ttl: Option<Duration>,
    /// Each holder: its owner token's first characters, and its label if any.
    pub(crate) holders: Vec<(String, Option<String>)>,
    /// The current hold's fencing token.
    pub(crate) token: Option<u64>,
    /// Kept, by nobody, after a release within an `at_least` period.
    pub(crate) kept: bool,
    /// The key holds something other than a lock.
    pub(crate) foreign: bool,
    /// The last fencing token handed out for the name.
    pub(crate) last_token: Option<u64>,
    /// Lockers waiting for a release (subscribers of the wake-up channel).
    pub(crate) waiting: u64,
    /// Waiters in a fair lock's line.
    pub(crate) queued: u64,
    /// The read-write lock's writer, as `holders` gives the lock's.
    pub(crate) writer: Option<(String, Option<String>)>,
    /// The writer's key's remaining lease (`None`: no key, or no expiry).
    pub(crate) writer_ttl: Option<Duration>,
    /// The read-write lock's readers whose lease has not run out.
    pub(crate) readers: u64,
    /// The semaphore's permits taken whose lease has not run out.
    pub(crate) permits: u64,
    /// The semaphore's permit count set at run time.
    pub(crate) permit_limit: Option<u32>,
}

/// The answer to one release.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReleaseReply {
    /// Released (now, or by an earlier try of the same release); `woke` subscribers received the
    /// wake-up (0 when none listened, or unknown).
    Released { woke: u32 },
    /// The lock was gone.
    Expired,
    /// The lock was held by another owner.
    TakenOver,
}

impl ReleaseReply {
    /// A release script's answer: `n >= 0` released (`n` subscribers woken), `-1` gone, `-2`
    /// taken by another owner.
    pub(crate) fn from_reply(reply: i64) -> Self {
        match reply {
            -1 => Self::Expired,
            -2 => Self::TakenOver,
            woke => Self::Released {
                woke: u32::try_from(woke).unwrap_or(0),
            },
        }
    }
}

/// Who a hand-over goes to: the local head waiter's hand-over token, and the `Locker` it waits
/// in (a waiter of that `Locker` next in turn lets the hand-over through).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Successor<'a> {
    pub(crate) owner: &'a str,
    pub(crate) locker: &'a str,
}

/// The answer to a hand-over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HandoffReply {
    HandedOver {
        fence: u64,
    },
    NotHandedOver(ReleaseReply),
    /// Waiters elsewhere want it (a waiter of another `Locker` found the hold taken, or is next
    /// in turn): released instead, as a release does (`woke` subscribers got the wake-up).
    ReleasedInstead {
        woke: u32,
    },
}

/// What became of one lease change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RenewReply {
    /// Applied: the lease runs from when Redis ran it.
    Applied,
    /// Still held, but a later change was applied first; this one was ignored.
    Stale,
    /// Gone, or owned by someone else.
    Gone,
    /// Not answered: the node that keeps it failed or was too slow, while the batch's other
    /// nodes answered. Nothing is known; the hold keeps its deadline and the next renewal tries
    /// again. (Only a cluster's renewals are answered node by node.)
    #[cfg_attr(not(feature = "cluster"), allow(dead_code))]
    Unanswered,
}

#[derive(Debug, Clone)]
pub(crate) enum Backend {
    Redis(std::sync::Arc<redis::RedisBackend>),
    #[cfg(feature = "postgres")]
    Postgres(std::sync::Arc<postgres::PgBackend>),
}

/// One connection for the commands of one operation, in order: a clean-up sent on it after a
/// command that timed out always reaches the server after that command, even over a pool.
#[derive(Debug, Clone)]
pub(crate) enum Session {
    Redis(std::sync::Arc<redis::RedisBackend>, redis::OpConn),
    /// Each name's commands go to its own connection, in order (see `postgres`).
    #[cfg(feature = "postgres")]
    Postgres(std::sync::Arc<postgres::PgBackend>),
}

/// A [`Backend`] that does not keep its connections alive: for what may outlive its `Locker`.
#[derive(Debug, Clone)]
pub(crate) enum WeakBackend {
    Redis(std::sync::Weak<redis::RedisBackend>),
    #[cfg(feature = "postgres")]
    Postgres(std::sync::Weak<postgres::PgBackend>),
}

impl WeakBackend {
    /// The backend, if its `Locker` still lives.
    pub(crate) fn upgrade(&self) -> Option<Backend> {
        match self {
            Self::Redis(r) => r.upgrade().map(Backend::Redis),
            #[cfg(feature = "postgres")]
            Self::Postgres(p) => p.upgrade().map(Backend::Postgres),
        }
    }
}

impl Backend {
    /// A handle that does not keep the backend alive.
    pub(crate) fn downgrade(&self) -> WeakBackend {
        match self {
            Self::Redis(r) => WeakBackend::Redis(std::sync::Arc::downgrade(r)),
            #[cfg(feature = "postgres")]
            Self::Postgres(p) => WeakBackend::Postgres(std::sync::Arc::downgrade(p)),
        }
    }

    /// A connection to run one operation's commands on, in order.
    pub(crate) async fn session(&self) -> Result<Session, BackendError> {
        match self {
            Self::Redis(r) => Ok(Session::Redis(r.clone(), r.op_conn().await?)),
            #[cfg(feature = "postgres")]
            Self::Postgres(p) => Ok(Session::Postgres(p.clone())),
        }
    }

    /// Applies every lease change of `items`. On a cluster each node's share is bounded by
    /// `within` (at most the command timeout) and answered on its own: a failing node leaves
    /// its items [`RenewReply::Unanswered`] and costs the others nothing. `Err` when no item
    /// was answered.
    pub(crate) async fn renew(
        &self,
        items: &[RenewItem],
        within: Duration,
    ) -> Result<Vec<RenewReply>, BackendError> {
        if items.is_empty() {
            return Ok(Vec::new());
        }
        match self {
            Self::Redis(r) => r.renew(items, within).await,
            #[cfg(feature = "postgres")]
            Self::Postgres(p) => p.renew(items).await,
        }
    }

    /// Registers interest in wake-ups on `channel`. Subscribes (and waits for the confirmation,
    /// until `deadline` at the latest) before returning, so a release published after a
    /// confirmed watch returns is never missed.
    pub(crate) async fn watch(&self, channel: &str, deadline: tokio::time::Instant) -> Watch {
        match self {
            Self::Redis(r) => r.watch(channel, deadline).await,
            #[cfg(feature = "postgres")]
            Self::Postgres(p) => p.watch(channel),
        }
    }

    /// Whether wake-ups on `channel` are heard now, with no subscription to make first.
    pub(crate) fn hears(&self, channel: &str) -> bool {
        match self {
            Self::Redis(r) => r.hears(channel),
            #[cfg(feature = "postgres")]
            Self::Postgres(_) => false,
        }
    }

    /// The cluster slot of `key`, on a cluster; `None` where every key lives on one server (so
    /// one script may touch any of them).
    pub(crate) fn slot(&self, key: &str) -> Option<u16> {
        match self {
            Self::Redis(r) => r.slot(key),
            // All on one server: a multi-lock is taken in one call (name by name inside it).
            #[cfg(feature = "postgres")]
            Self::Postgres(_) => None,
        }
    }

    /// Whether this backend runs commands over the network (and so needs cancellation-safe
    /// operations).
    pub(crate) fn is_remote(&self) -> bool {
        match self {
            Self::Redis(r) => !r.is_memory(),
            #[cfg(feature = "postgres")]
            Self::Postgres(_) => true,
        }
    }

    /// Whether this runs an earlier layout's frozen scripts (see
    /// [`redis::RedisBackend::runs_frozen_layout`]).
    pub(crate) fn runs_frozen_layout(&self) -> bool {
        match self {
            Self::Redis(r) => r.runs_frozen_layout(),
            #[cfg(feature = "postgres")]
            Self::Postgres(_) => false,
        }
    }

    /// Milliseconds since 1970 on the clock that orders claims to the next turn (see
    /// [`redis::RedisBackend::wall_ms`]).
    pub(crate) fn wall_ms(&self) -> u64 {
        match self {
            Self::Redis(r) => r.wall_ms(),
            #[cfg(feature = "postgres")]
            Self::Postgres(_) => postgres::wall_ms(),
        }
    }

    /// How long one command may take before it fails.
    pub(crate) fn command_timeout(&self) -> Duration {
        match self {
            Self::Redis(r) => r.command_timeout(),
            #[cfg(feature = "postgres")]
            Self::Postgres(p) => p.command_timeout(),
        }
    }

    /// Whether locks of `kind` can be taken here: a [`LockError::Config`] naming what is not.
    #[cfg_attr(not(feature = "postgres"), allow(unused_variables))]
    pub(crate) fn offers(&self, kind: &crate::name::KeyKind) -> Result<(), crate::LockError> {
        match self {
            Self::Redis(_) => Ok(()),
            #[cfg(feature = "postgres")]
            Self::Postgres(_) => match kind {
                crate::name::KeyKind::Fair(_) => Err(crate::LockError::Config(
                    "a postgres `Locker` does not offer `fair` locks: PostgreSQL's advisory locks \
                     keep no line of waiters to take turns by (see `Locker::lock`)"
                        .to_owned(),
                )),
                crate::name::KeyKind::Semaphore(sem)
                    if sem.permits > postgres::shared::MAX_PERMITS =>
                {
                    Err(crate::LockError::Config(format!(
                        "a postgres semaphore has at most {} permits, not {}",
                        postgres::shared::MAX_PERMITS,
                        sem.permits
                    )))
                }
                _ => Ok(()),
            },
        }
    }

    /// Whether a semaphore's count can be set at run time here (see `Semaphore::set_permits`):
    /// a [`LockError::Config`](crate::LockError::Config) where it can't.
    pub(crate) fn sets_permits(&self) -> Result<(), crate::LockError> {
        match self {
            Self::Redis(_) => Ok(()),
            #[cfg(feature = "postgres")]
            Self::Postgres(_) => Err(crate::LockError::Config(
                "a postgres semaphore's count is the one its handle gives: \
                 it can't be set at run time"
                    .to_owned(),
            )),
        }
    }

    pub(crate) fn kind(&self) -> &'static str {
        match self {
            Self::Redis(r) => r.kind(),
            #[cfg(feature = "postgres")]
            Self::Postgres(_) => "postgres",
        }
    }
}

impl Session {
    pub(crate) async fn acquire(
        &self,
        keys: &LockKeys,
        owner: &str,
        lease: Duration,
        fence_ttl: Option<Duration>,
        turn: Turn<'_>,
    ) -> Result<AcquireReply, BackendError> {
        match self {
            Self::Redis(r, c) => r.acquire(c, keys, owner, lease, fence_ttl, turn).await,
            #[cfg(feature = "postgres")]
            Self::Postgres(p) => {
                let plain = matches!(keys.kind, crate::name::KeyKind::Lock);
                let claim = if plain { turn.claim } else { None };
                let turn = postgres::InTurn {
                    locker: turn.locker,
                    claim,
                };
                p.acquire(keys, owner, lease, turn).await
            }
        }
    }

    /// Sets the permit count of the semaphore `keys` (`None`: removes it) and wakes waiters.
    pub(crate) async fn set_permits(
        &self,
        keys: &LockKeys,
        permits: Option<u32>,
    ) -> Result<(), BackendError> {
        match self {
            Self::Redis(r, c) => r.set_permits(c, keys, permits).await,
            #[cfg(feature = "postgres")]
            Self::Postgres(_) => Err(unsupported("run-time permit count")),
        }
    }

    /// The semaphore's unexpired permits, and the count set at run time (if any).
    pub(crate) async fn permits(
        &self,
        keys: &LockKeys,
    ) -> Result<(u32, Option<u32>), BackendError> {
        match self {
            Self::Redis(r, c) => r.permits(c, keys).await,
            #[cfg(feature = "postgres")]
            Self::Postgres(p) => Ok((p.permits_held(keys).await?, None)),
        }
    }

    /// A fair lock's attempt for `owner` (`keys` must be a fair lock's): the lock when it is
    /// free and nobody alive is ahead in line; with `alive`, a place in line otherwise (`place`,
    /// if it is not `owner`), which counts for `alive` after this attempt.
    pub(crate) async fn acquire_fair(
        &self,
        keys: &LockKeys,
        (owner, place): (&str, Option<&str>),
        lease: Duration,
        fence_ttl: Option<Duration>,
        alive: Option<Duration>,
    ) -> Result<FairReply, BackendError> {
        match self {
            Self::Redis(r, c) => {
                r.acquire_fair(c, keys, (owner, place), lease, fence_ttl, alive)
                    .await
            }
            #[cfg(feature = "postgres")]
            Self::Postgres(_) => Err(unsupported("fair")),
        }
    }

    /// Takes every lock in `locks` for its owner, or none (all on one server, or in one slot).
    pub(crate) async fn acquire_all(
        &self,
        locks: &[(&LockKeys, &str)],
        lease: Duration,
        fence_ttl: Option<Duration>,
    ) -> Result<AcquireAllReply, BackendError> {
        match self {
            Self::Redis(r, c) => r.acquire_all(c, locks, lease, fence_ttl).await,
            #[cfg(feature = "postgres")]
            Self::Postgres(p) => p.acquire_all(locks, lease).await,
        }
    }

    /// What the name holds now (read-only).
    pub(crate) async fn inspect(&self, keys: &NameKeys) -> Result<RawInfo, BackendError> {
        match self {
            Self::Redis(r, c) => r.inspect(c, keys).await,
            #[cfg(feature = "postgres")]
            Self::Postgres(p) => p.inspect(keys).await,
        }
    }

    /// Removes whatever holds the name, of every kind, and wakes their waiters; how many of
    /// its lock, writer, readers and permits there were.
    pub(crate) async fn force_release(&self, keys: &NameKeys) -> Result<u64, BackendError> {
        match self {
            Self::Redis(r, c) => r.force_release(c, keys).await,
            #[cfg(feature = "postgres")]
            Self::Postgres(p) => p.force_release(keys).await,
        }
    }

    /// The fencing token of `owner`'s hold, minted now if it has none yet; `None` when `owner`
    /// does not hold the lock.
    pub(crate) async fn fence(
        &self,
        keys: &LockKeys,
        owner: &str,
        fence_ttl: Option<Duration>,
    ) -> Result<Option<u64>, BackendError> {
        match self {
            Self::Redis(r, c) => r.fence(c, keys, owner, fence_ttl).await,
            #[cfg(feature = "postgres")]
            Self::Postgres(p) => Ok(p.fence(keys, owner).await),
        }
    }

    /// Whether `owner` still holds the lock (read-only).
    pub(crate) async fn holds(
        &self,
        keys: &LockKeys,
        owner: &str,
    ) -> Result<AcquireReply, BackendError> {
        match self {
            Self::Redis(r, c) => r.holds(c, keys, owner).await,
            #[cfg(feature = "postgres")]
            Self::Postgres(p) => p.holds_lock(keys, owner).await,
        }
    }

    /// Releases `owner`'s hold, or the hold of `handed_to` if a hand-over of `owner`'s hold to it
    /// may have happened; with `keep`, the name stays taken (by nobody) for that long.
    pub(crate) async fn release(
        &self,
        keys: &LockKeys,
        owner: &str,
        handed_to: Option<&str>,
        keep: Option<Duration>,
    ) -> Result<ReleaseReply, BackendError> {
        match self {
            Self::Redis(r, c) => r.release(c, keys, owner, handed_to, keep).await,
            #[cfg(feature = "postgres")]
            Self::Postgres(p) => p.release(keys, owner, handed_to, keep).await,
        }
    }

    /// Releases `owner`'s hold after a command for it whose answer didn't come; runs even on a
    /// server that lost its script cache.
    pub(crate) async fn clean_up(
        &self,
        keys: &LockKeys,
        owner: &str,
        keep: Option<Duration>,
    ) -> Result<ReleaseReply, BackendError> {
        match self {
            Self::Redis(r, c) => r.clean_up(c, keys, owner, keep).await,
            #[cfg(feature = "postgres")]
            Self::Postgres(p) => p.release(keys, owner, None, keep).await,
        }
    }

    /// A waiter of `locker` that claimed the next turn since `since` stops waiting without the
    /// lock (`last`: no other waiter of `locker` is left for the name; `granted_to`: the
    /// hand-over token its claims offered, whose grant goes too); see the `protocol` module's
    /// `LEAVE_TURN`.
    pub(crate) async fn leave_turn(
        &self,
        keys: &LockKeys,
        locker: &str,
        since: u64,
        last: bool,
        granted_to: Option<&str>,
    ) -> Result<(), BackendError> {
        match self {
            Self::Redis(r, c) => r.leave_turn(c, keys, locker, since, last, granted_to).await,
            #[cfg(feature = "postgres")]
            Self::Postgres(p) => p.leave_turn(keys, locker, last).await,
        }
    }

    pub(crate) async fn handoff(
        &self,
        keys: &LockKeys,
        from: &str,
        to: Successor<'_>,
        lease: Duration,
        fence_ttl: Option<Duration>,
    ) -> Result<HandoffReply, BackendError> {
        match self {
            Self::Redis(r, c) => r.handoff(c, keys, from, to, lease, fence_ttl).await,
            #[cfg(feature = "postgres")]
            Self::Postgres(_) => Err(unsupported("hand-over")),
        }
    }
}

/// What a PostgreSQL `Locker` answers a call for a kind it does not offer.
#[cfg(feature = "postgres")]
fn unsupported(kind: &'static str) -> BackendError {
    BackendError::unsupported(kind, "postgres")
}
