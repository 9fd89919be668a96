//! The PostgreSQL backend (feature `postgres`): a lock is a session-level advisory lock
//! (`pg_try_advisory_lock`) held on a connection this backend owns.
//!
//! - **Where holds live.** A `Locker` opens a few connections of its own (not the application's
//!   pool: a session lock on a pooled connection would pass to its next user) and keeps each
//!   name's holds on one of them, chosen by the name's [advisory key](keys). PostgreSQL lets a
//!   session take a lock it holds already, so the backend keeps its own map of what its
//!   sessions hold, and answers busy for a name another owner of the same `Locker` holds.
//! - **Leases.** A session lock has no expiry: PostgreSQL keeps it until the session unlocks it
//!   or ends. The lease is mapped onto the session's life: each connection runs with
//!   `idle_session_timeout` at least the longest lease of the holds on it, so a session that
//!   says nothing for that long — its process paused, crashed or cut off — is ended by the
//!   server, and its locks with it. The watchdog's renewals are what the session says; each
//!   checks, in `pg_locks`, that the session still holds the lock. A guard believes its hold
//!   until the last renewal's send plus the lease (less the drift), which is before the server
//!   could have ended a silent session. A fixed lease is unlocked by the backend when it runs
//!   out.
//! - **Loss.** A connection that fails, or a query that does not answer within the command
//!   timeout, is dropped: the server ends the session (at once, or when it notices the socket
//!   closed), and every hold on it is lost — the next renewal says so, and guarded work is
//!   cancelled as on Redis. A killed backend (`pg_terminate_backend`) or a server restart ends
//!   the session the same way.
//! - **Fencing tokens** come from one sequence, `dlock_fencing_tokens`, made at the first
//!   connection (`CREATE SEQUENCE IF NOT EXISTS`: the database user needs the right to create
//!   it, or it must be made beforehand), taken in the same query as the lock: strictly
//!   increasing for every name (they increase across names), and across server restarts
//!   (a sequence never goes back, even after a crash).
//! - **Waking** is by `NOTIFY` (see [`listen`]): a release unlocks and notifies in one query.
//! - **Turns across processes** are taken by claims to the next turn, kept in a table made
//!   beside the sequence, with the same right (see [`turns`]): a far process is not beaten to a
//!   plain lock after every release.
//! - **What is offered:** plain locks (waiting, try-lock, re-entry in a scope, multi-locks taken
//!   name by name, in order, all or none, `at_least`), semaphores (permit slots, several at
//!   once all or none) and read-write locks (shared and exclusive locks on one key, with a gate
//!   for waiting writers): see [`shared`]. Fair locks are refused with
//!   [`LockError::Config`](crate::LockError::Config) when a request for one is made, and so is
//!   a semaphore count set at run time; hand-overs inside the process are not made (each
//!   release unlocks, and the next waiter's attempt takes the lock).

use std::collections::HashSet;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use sqlx::postgres::PgConnectOptions;
use tokio::time::Instant;

mod holds;
pub(crate) mod keys;
mod listen;
mod operator;
mod sessions;
pub(crate) mod shared;
mod turns;

use super::wait::{Slots, Watch};
use super::{AcquireAllReply, AcquireReply, ReleaseReply, RenewItem, RenewReply};
use crate::error::BackendError;
use crate::name::{KeyKind, LockKeys};
use holds::{Held, Holds, Locks};
use keys::advisory_key;
use listen::Listening;
use sessions::{ConnState, LockConn, gone};
use turns::Attempt;
pub(crate) use turns::InTurn;

/// How many connections a `Locker` keeps its holds on (each name always on the same one).
const CONNECTIONS: usize = 4;

/// The sequence fencing tokens are taken from.
const SEQUENCE: &str = "dlock_fencing_tokens";

/// Takes the lock if it is free, with a fencing token; `NULL` when another session holds it.
const ACQUIRE: &str =
    "SELECT CASE WHEN pg_try_advisory_lock($1) THEN nextval('dlock_fencing_tokens') END";

/// Unlocks, and wakes the name's waiters in every `Locker` (`$2`: its wake-up channel; the
/// notification goes out as the statement ends, after the unlock).
const RELEASE: &str = "SELECT pg_advisory_unlock($1) FROM pg_notify('dlock_released', $2)";

/// [`RELEASE`] of a shared lock.
const RELEASE_SHARED: &str =
    "SELECT pg_advisory_unlock_shared($1) FROM pg_notify('dlock_released', $2)";

/// [`RELEASE`] of several exclusive locks: whether the session had every one.
const RELEASE_ALL: &str = "SELECT (SELECT bool_and(pg_advisory_unlock(k)) FROM unnest($1::bigint[]) k) \
                           FROM pg_notify('dlock_released', $2)";

/// The advisory keys (of the one-number form) this session holds.
const HELD: &str = "SELECT (classid::bigint << 32) | objid::bigint FROM pg_locks \
                    WHERE locktype = 'advisory' AND objsubid = 1 AND granted \
                    AND pid = pg_backend_pid()";

/// Locks as PostgreSQL session advisory locks (see the module docs).
pub(crate) struct PgBackend {
    options: PgConnectOptions,
    conns: Vec<LockConn>,
    /// What this backend's sessions hold. Changed only under the hold's connection's lock, so
    /// it and the session agree.
    holds: Mutex<Holds>,
    /// The plain locks (by advisory key) whose next turn a waiter of this `Locker` claimed
    /// (see [`turns`]).
    claims: Mutex<HashSet<i64>>,
    slots: Arc<Slots>,
    listening: Arc<Listening>,
    timeout: Duration,
}

impl std::fmt::Debug for PgBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgBackend")
            .field("connections", &self.conns.len())
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

/// Where the holds of some keys live.
#[derive(Debug, Clone, Copy)]
struct Place {
    /// The advisory key the holds are kept under (see [`Holds`]): the lock key's.
    hold: i64,
    /// The advisory key the session locks: the lock's own (a plain lock, a writer), the
    /// writer's (a reader, shared), or the first of a semaphore's permit slots.
    lock: i64,
    /// The connection whose session takes them.
    conn: usize,
}

impl PgBackend {
    pub(crate) fn new(options: PgConnectOptions, timeout: Duration) -> Self {
        let options = options.application_name("dlock");
        Self {
            options,
            conns: (0..CONNECTIONS).map(|_| LockConn::default()).collect(),
            holds: Mutex::new(Holds::default()),
            claims: Mutex::new(HashSet::new()),
            slots: Arc::new(Slots::default()),
            listening: Arc::new(Listening::default()),
            timeout,
        }
    }

    fn holds(&self) -> MutexGuard<'_, Holds> {
        self.holds.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The connection the locks of advisory key `key` are taken on.
    fn conn_of(&self, key: i64) -> usize {
        usize::try_from(key.unsigned_abs() % CONNECTIONS as u64).unwrap_or(0)
    }

    /// Where the holds of `keys` live: a read-write lock's readers and writer on one session,
    /// and a semaphore's permits on one.
    fn place(&self, keys: &LockKeys) -> Place {
        let hold = advisory_key(&keys.lock);
        let lock = match &keys.kind {
            KeyKind::Lock | KeyKind::Fair(_) | KeyKind::Write(_) => hold,
            KeyKind::Read(rw) => advisory_key(&rw.write),
            KeyKind::Semaphore(_) => shared::first_slot(hold),
        };
        Place {
            hold,
            lock,
            conn: self.conn_of(lock),
        }
    }

    pub(crate) fn command_timeout(&self) -> Duration {
        self.timeout
    }

    pub(crate) async fn acquire(
        self: &Arc<Self>,
        keys: &LockKeys,
        owner: &str,
        lease: Duration,
        turn: InTurn<'_>,
    ) -> Result<AcquireReply, BackendError> {
        offered(keys)?;
        let at = self.place(keys);
        let mut st = self.conns[at.conn].state.lock().await;
        if let Some(held) = self.holds().find(at.hold, owner, st.generation) {
            // Its own already: an earlier try whose answer was lost.
            return Ok(AcquireReply::Acquired {
                fence: Some(held.fence),
            });
        }
        let st = &mut st;
        match &keys.kind {
            KeyKind::Semaphore(sem) => {
                return self.acquire_permit(st, at, (keys, sem), owner, lease).await;
            }
            KeyKind::Read(rw) => return self.acquire_read(st, at, (keys, rw), owner, lease).await,
            KeyKind::Write(rw) => {
                return self.acquire_write(st, at, (keys, rw), owner, lease).await;
            }
            KeyKind::Lock | KeyKind::Fair(_) => {}
        }
        if self.holds().any(at.hold, st.generation) {
            // Another owner's of this `Locker`: its session would take the lock a second time.
            return Ok(busy());
        }
        match self.take_in_turn(st, at, lease, turn).await? {
            Attempt::Took(fence) => {
                let locks = Locks::Exclusive(at.lock);
                self.taken(at, keys, st, (owner, fence), lease, locks);
                Ok(AcquireReply::Acquired { fence: Some(fence) })
            }
            // Another's turn: its waiter wakes when that claim would lapse, if no release
            // wakes it first.
            Attempt::Busy { claim_left } => Ok(AcquireReply::Busy {
                pttl: claim_left,
                foreign: false,
                fence: None,
            }),
        }
    }

    /// Takes `at`'s lock exclusively with a fencing token, if no other session holds it.
    async fn take_exclusive(
        &self,
        st: &mut ConnState,
        at: Place,
        lease: Duration,
    ) -> Result<Option<u64>, BackendError> {
        self.connected(st).await?;
        self.outlives(st, at.conn, millis(lease)).await?;
        let conn = st.conn.as_mut().ok_or_else(gone)?;
        let query = sqlx::query_scalar::<_, Option<i64>>(ACQUIRE).bind(at.lock);
        let answer = tokio::time::timeout(self.timeout, query.fetch_one(conn)).await;
        match self.answered(st, at.conn, answer)? {
            Some(token) => u64::try_from(token)
                .map(Some)
                .map_err(|_| BackendError::protocol("negative fencing token")),
            None => Ok(None),
        }
    }

    /// Records a hold its session just took, and unlocks it when its lease runs out.
    fn taken(
        self: &Arc<Self>,
        at: Place,
        keys: &LockKeys,
        st: &ConnState,
        (owner, fence): (&str, u64),
        lease: Duration,
        locks: Locks,
    ) {
        let held = Held {
            owner: owner.into(),
            conn: at.conn,
            generation: st.generation,
            fence,
            expires: Instant::now() + lease,
            locks,
        };
        // In the map first: the watch ends when it finds the hold gone.
        self.holds().insert(at.hold, held.clone());
        self.expire_later(at.hold, &held, keys.channel());
    }

    /// Unlocks `held` (kept under `key`) when its lease runs out, as Redis lets a key expire:
    /// a fixed lease, or a watchdog's whose renewals stopped. A renewal moves the time on; a
    /// release, a loss or an `at_least` keep ends the watch.
    fn expire_later(self: &Arc<Self>, key: i64, held: &Held, channel: &str) {
        let backend = Arc::downgrade(self);
        let (owner, generation, i, channel) = (
            held.owner.clone(),
            held.generation,
            held.conn,
            channel.to_owned(),
        );
        tokio::spawn(async move {
            loop {
                let at = {
                    let Some(b) = backend.upgrade() else { return };
                    let holds = b.holds();
                    let Some(at) = holds.find(key, &owner, generation).map(|h| h.expires) else {
                        return;
                    };
                    at
                };
                tokio::time::sleep_until(at).await;
                let Some(b) = backend.upgrade() else { return };
                let mut st = b.conns[i].state.lock().await;
                let due = (b.holds().find(key, &owner, generation))
                    .filter(|_| st.generation == generation)
                    .map(|h| h.expires <= Instant::now());
                match due {
                    None => return,
                    Some(false) => {}
                    Some(true) => {
                        let _ = b.unlock(&mut st, i, (key, &owner), &channel).await;
                        return;
                    }
                }
            }
        });
    }

    /// Takes every lock of `locks` in their order, or none: a busy one has those taken before
    /// it unlocked again.
    pub(crate) async fn acquire_all(
        self: &Arc<Self>,
        locks: &[(&LockKeys, &str)],
        lease: Duration,
    ) -> Result<AcquireAllReply, BackendError> {
        let mut fences = Vec::with_capacity(locks.len());
        for (index, (keys, owner)) in locks.iter().enumerate() {
            // Taken name by name, whoever claimed their next turns: it waits for them.
            let turn = InTurn {
                locker: "",
                claim: None,
            };
            let reply = self.acquire(keys, owner, lease, turn).await;
            match reply {
                Ok(AcquireReply::Acquired { fence }) => fences.push(fence.unwrap_or(0)),
                other => {
                    for (keys, owner) in &locks[..index] {
                        let _ = self.release(keys, owner, None, None).await;
                    }
                    return match other {
                        Ok(_) => Ok(AcquireAllReply::Busy { index, pttl: None }),
                        Err(err) => Err(err),
                    };
                }
            }
        }
        Ok(AcquireAllReply::Acquired { fences })
    }

    /// The fencing token of `owner`'s hold; `None` when it does not hold the lock.
    pub(crate) async fn fence(&self, keys: &LockKeys, owner: &str) -> Option<u64> {
        let at = self.place(keys);
        let st = self.conns[at.conn].state.lock().await;
        let holds = self.holds();
        holds.find(at.hold, owner, st.generation).map(|h| h.fence)
    }

    /// Whether `owner` still holds the lock: this backend says so, and so does the session's
    /// entry in `pg_locks`.
    pub(crate) async fn holds_lock(
        &self,
        keys: &LockKeys,
        owner: &str,
    ) -> Result<AcquireReply, BackendError> {
        let at = self.place(keys);
        let mut st = self.conns[at.conn].state.lock().await;
        let Some(ours) = self.holds().find(at.hold, owner, st.generation).cloned() else {
            return Ok(busy());
        };
        let conn = st.conn.as_mut().ok_or_else(gone)?;
        let held = sqlx::query_scalar::<_, i64>(HELD).fetch_all(conn);
        let answer = tokio::time::timeout(self.timeout, held).await;
        let held: HashSet<i64> = self
            .answered(&mut st, at.conn, answer)?
            .into_iter()
            .collect();
        if ours.locks.keys().iter().all(|k| held.contains(k)) {
            Ok(AcquireReply::Acquired {
                fence: Some(ours.fence),
            })
        } else {
            Ok(busy())
        }
    }

    /// Unlocks `owner`'s hold (or `handed_to`'s: a hand-over is never made here, but the caller
    /// may name one) and wakes the name's waiters; with `keep`, the lock stays taken, by
    /// nobody, for that long (`at_least`).
    pub(crate) async fn release(
        self: &Arc<Self>,
        keys: &LockKeys,
        owner: &str,
        handed_to: Option<&str>,
        keep: Option<Duration>,
    ) -> Result<ReleaseReply, BackendError> {
        let at = self.place(keys);
        let i = at.conn;
        let mut st = self.conns[i].state.lock().await;
        let generation = st.generation;
        let whose = {
            let holds = self.holds();
            let whose = [Some(owner), handed_to]
                .into_iter()
                .flatten()
                .find(|o| holds.find(at.hold, o, generation).is_some());
            match whose {
                Some(whose) => whose,
                // A lock or a writer held by another owner of this `Locker`; a permit or a
                // reader is its own hold, and someone else's is no news of this one.
                None if !keys.is_member() && holds.any(at.hold, generation) => {
                    return Ok(ReleaseReply::TakenOver);
                }
                None => return Ok(ReleaseReply::Expired),
            }
        };
        if let Some(keep) = keep.filter(|k| !k.is_zero()) {
            let kept: Arc<str> = format!("#k:{owner}").into();
            if let Some(h) = self.holds().find_mut(at.hold, whose, generation) {
                h.owner = kept.clone();
            }
            let (backend, channel) = (Arc::downgrade(self), keys.channel().to_owned());
            tokio::spawn(async move {
                tokio::time::sleep(keep).await;
                if let Some(backend) = backend.upgrade() {
                    let mut st = backend.conns[i].state.lock().await;
                    if st.generation == generation {
                        let _ = backend.unlock(&mut st, i, (at.hold, &kept), &channel).await;
                    }
                }
            });
            return Ok(ReleaseReply::Released { woke: 0 });
        }
        if self
            .unlock(&mut st, i, (at.hold, whose), keys.channel())
            .await?
        {
            Ok(ReleaseReply::Released { woke: 0 })
        } else {
            // The session no longer had it: it can only have ended meanwhile.
            Ok(ReleaseReply::Expired)
        }
    }

    /// Unlocks the hold of `owner` kept under `key` on connection `i` (whose state is `st`),
    /// wakes the waiters of `channel`, and forgets the hold; whether the session had it (and
    /// `false` when there was no such hold).
    async fn unlock(
        &self,
        st: &mut ConnState,
        i: usize,
        (key, owner): (i64, &str),
        channel: &str,
    ) -> Result<bool, BackendError> {
        let Some(locks) = (self.holds().find(key, owner, st.generation)).map(|h| h.locks.clone())
        else {
            return Ok(false);
        };
        let conn = st.conn.as_mut().ok_or_else(gone)?;
        let query = match &locks {
            Locks::Exclusive(k) => sqlx::query_scalar::<_, Option<bool>>(RELEASE).bind(*k),
            Locks::Shared(k) => sqlx::query_scalar(RELEASE_SHARED).bind(*k),
            Locks::Slots(slots) => sqlx::query_scalar(RELEASE_ALL).bind(slots.to_vec()),
        };
        let answer = tokio::time::timeout(self.timeout, query.bind(channel).fetch_one(conn)).await;
        let unlocked = self.answered(st, i, answer)?;
        self.holds().remove(key, owner, st.generation);
        Ok(unlocked.unwrap_or(true))
    }

    /// Confirms each hold of `items` (a watchdog tick, or an `extend`): applied while its
    /// session still holds it, gone otherwise. Each connection's holds are confirmed by one
    /// query; every session is made to outlive the longest lease asked for.
    pub(crate) async fn renew(&self, items: &[RenewItem]) -> Result<Vec<RenewReply>, BackendError> {
        let mut replies = vec![RenewReply::Gone; items.len()];
        let homes: Vec<Option<usize>> = {
            let holds = self.holds();
            let home = |item: &RenewItem| holds.conn_of(advisory_key(&item.key), &item.owner);
            items.iter().map(home).collect()
        };
        let mut answered = false;
        let mut last_error = None;
        for i in 0..self.conns.len() {
            let mine: Vec<usize> = (0..items.len()).filter(|n| homes[*n] == Some(i)).collect();
            if mine.is_empty() {
                continue;
            }
            let mut st = self.conns[i].state.lock().await;
            if st.conn.is_none() {
                // Its session ended: every hold on it is gone.
                answered = true;
                continue;
            }
            let longest = mine.iter().map(|n| items[*n].lease_ms).max().unwrap_or(0);
            let held: Result<HashSet<i64>, BackendError> = async {
                self.outlives(&mut st, i, longest).await?;
                let conn = st.conn.as_mut().ok_or_else(gone)?;
                let held = sqlx::query_scalar::<_, i64>(HELD).fetch_all(conn);
                let answer = tokio::time::timeout(self.timeout, held).await;
                Ok(self.answered(&mut st, i, answer)?.into_iter().collect())
            }
            .await;
            let held = match held {
                Ok(held) => held,
                Err(err) => {
                    last_error = Some(err);
                    continue;
                }
            };
            answered = true;
            let mut holds = self.holds();
            for n in mine {
                let (key, item) = (advisory_key(&items[n].key), &items[n]);
                let ours = (holds.find_mut(key, &item.owner, st.generation))
                    .filter(|h| h.locks.keys().iter().all(|k| held.contains(k)));
                if let Some(h) = ours {
                    h.expires = Instant::now() + Duration::from_millis(item.lease_ms);
                    replies[n] = RenewReply::Applied;
                }
            }
        }
        match last_error {
            Some(err) if !answered => Err(err),
            _ => Ok(replies),
        }
    }

    /// Registers a waiter for the wake-ups of `channel` (a name's wake-up channel): the
    /// listener is started if it is not running; until it listens, the waiter polls.
    pub(crate) fn watch(&self, channel: &str) -> Watch {
        Listening::start(&self.listening, &self.options, &self.slots);
        let (watch, _) = Watch::new(self.slots.clone(), channel, None);
        if self.listening.is_up() {
            watch.mark_confirmed();
        }
        watch
    }

    /// Whether the listener is connected (for diagnostics).
    pub(crate) fn listening(&self) -> bool {
        self.listening.is_up()
    }

    /// How many names have waiters now (for diagnostics).
    pub(crate) fn watched_channels(&self) -> usize {
        self.slots.len()
    }
}

/// Whether the kind of `keys` is one this backend offers: all but the fair lock.
pub(crate) fn offered(keys: &LockKeys) -> Result<(), BackendError> {
    match keys.kind {
        KeyKind::Fair(_) => Err(BackendError::unsupported(keys.kind.label(), "postgres")),
        _ => Ok(()),
    }
}

fn busy() -> AcquireReply {
    AcquireReply::Busy {
        pttl: None,
        foreign: false,
        fence: None,
    }
}

/// Milliseconds since 1970 on this host's clock: what orders claims to the next turn (see
/// [`turns`]; each waiter's `since` comes from its own host).
pub(crate) fn wall_ms() -> u64 {
    let since_1970 = (std::time::SystemTime::now())
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    u64::try_from(since_1970.as_millis()).unwrap_or(u64::MAX)
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
