//! The PostgreSQL backend's semaphores and read-write locks.
//!
//! - **A semaphore of N permits** is N advisory keys, its *permit slots* (see ARCHITECTURE.md):
//!   of the block of 65,536 keys that share the first 48 bits of the advisory key of the
//!   semaphore's permits (see [`first_slot`]), the first N. A permit is an exclusive lock on one free
//!   slot; a request for several takes that many in one query, or none. So no more than N are
//!   ever held, whoever asks: each slot has one holder at most. A semaphore's count is the one
//!   its handle gives; one set at run time (`set_permits`) is Redis's alone.
//! - **A read-write lock** is one advisory key, the writer's: a writer takes it exclusively,
//!   a reader shared. With writers preferred (the default), a writer that waits also holds
//!   the lock's *gate* (the advisory key of its waiting writers), and a reader takes the gate
//!   shared for the length of its query only (`pg_try_advisory_xact_lock_shared`): while a
//!   writer waits, no new reader gets in. The gate goes when the writer gets the lock, gives
//!   up, or makes no attempt for as long as its wait counts.
//!
//! A session never conflicts with itself in PostgreSQL, so the holds of one `Locker` (one
//! session per name) are kept apart by the backend's own books (see [`super::holds`]): a reader
//! of this `Locker` keeps its writers out, its writer its readers, and its waiting writer its
//! new readers; a permit this `Locker` holds is not tried again.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::holds::{GATE, Held, Locks};
use super::keys::advisory_key;
use super::sessions::{ConnState, gone};
use super::{PgBackend, Place, busy, millis};
use crate::backend::AcquireReply;
use crate::error::BackendError;
use crate::name::{KeyKind, LockKeys, RwKeys, SemaphoreKeys};

/// The most permits a semaphore has on PostgreSQL: the slots of one block.
pub(crate) const MAX_PERMITS: u32 = 1 << 16;

/// Takes `$4` free slots of the `$2` from `$1`, but for those of `$3` (this session's already),
/// or fewer when fewer are free: the slots taken. A slot is tried only while more are needed.
const TAKE_SLOTS: &str = "SELECT coalesce(array_agg(k), '{}') FROM ( \
                            SELECT k FROM generate_series($1::bigint, $1::bigint + $2 - 1) k \
                            WHERE CASE WHEN k = ANY($3::bigint[]) THEN false \
                                       ELSE pg_try_advisory_lock(k) END \
                            LIMIT $4) taken";

/// Lets slots taken by a request that got too few of them go again.
const UNTAKE_SLOTS: &str = "SELECT count(pg_advisory_unlock(k)) FROM unnest($1::bigint[]) k";

/// How many of the slots from `$1`'s block are held, by any session.
const SLOTS_HELD: &str = "SELECT count(*) FROM pg_locks \
                          WHERE locktype = 'advisory' AND objsubid = 1 AND granted \
                          AND classid = (($1 >> 32) & 4294967295)::oid \
                          AND (objid::bigint >> 16) = (($1 >> 16) & 65535)";

/// A reader's attempt: the writer's key `$1` shared, unless a writer holds it.
const READ: &str = "SELECT pg_try_advisory_lock_shared($1)";

/// A reader's attempt with writers preferred: as [`READ`], unless a writer waits (holds the
/// gate `$2`), which it asks for the length of the query only.
const READ_UNLESS_WAITING: &str = "SELECT CASE WHEN pg_try_advisory_xact_lock_shared($2) \
                                   THEN pg_try_advisory_lock_shared($1) ELSE false END";

/// A waiting writer's gate, taken.
const GATE_TAKE: &str = "SELECT pg_try_advisory_lock($1)";

/// The first of the permit slots of the semaphore whose permits' advisory key is `key`.
pub(super) fn first_slot(key: i64) -> i64 {
    key & !0xFFFF
}

impl PgBackend {
    /// A semaphore's attempt: `sem.take` free slots, all or none.
    pub(super) async fn acquire_permit(
        self: &Arc<Self>,
        st: &mut ConnState,
        at: Place,
        (keys, sem): (&LockKeys, &SemaphoreKeys),
        owner: &str,
        lease: Duration,
    ) -> Result<AcquireReply, BackendError> {
        // This session's slots already: its session would take them again.
        let ours: Vec<i64> = (self.holds().of(at.hold, st.generation))
            .flat_map(|h| h.locks.keys().iter().copied())
            .collect();
        let free = i64::from(sem.permits) - i64::try_from(ours.len()).unwrap_or(i64::MAX);
        if free < i64::from(sem.take) {
            return Ok(busy());
        }
        self.connected(st).await?;
        self.outlives(st, at.conn, millis(lease)).await?;
        let conn = st.conn.as_mut().ok_or_else(gone)?;
        let query = sqlx::query_scalar::<_, Vec<i64>>(TAKE_SLOTS)
            .bind(at.lock)
            .bind(i64::from(sem.permits.min(MAX_PERMITS)))
            .bind(ours)
            .bind(i64::from(sem.take));
        let answer = tokio::time::timeout(self.timeout, query.fetch_one(conn)).await;
        let taken = self.answered(st, at.conn, answer)?;
        if taken.len() < usize::try_from(sem.take).unwrap_or(usize::MAX) {
            if !taken.is_empty() {
                let conn = st.conn.as_mut().ok_or_else(gone)?;
                let query = sqlx::query_scalar::<_, i64>(UNTAKE_SLOTS).bind(taken);
                let answer = tokio::time::timeout(self.timeout, query.fetch_one(conn)).await;
                self.answered(st, at.conn, answer)?;
            }
            return Ok(busy());
        }
        let locks = Locks::Slots(taken.into());
        self.taken(at, keys, st, (owner, 0), lease, locks);
        Ok(AcquireReply::Acquired { fence: Some(0) })
    }

    /// A reader's attempt: the writer's key shared, unless a writer holds it or (with writers
    /// preferred) one waits.
    pub(super) async fn acquire_read(
        self: &Arc<Self>,
        st: &mut ConnState,
        at: Place,
        (keys, rw): (&LockKeys, &RwKeys),
        owner: &str,
        lease: Duration,
    ) -> Result<AcquireReply, BackendError> {
        let gate = advisory_key(&rw.waiting);
        {
            let holds = self.holds();
            let writer_here = holds.any(advisory_key(&rw.write), st.generation);
            if writer_here || (rw.prefer_writers && holds.any(gate, st.generation)) {
                return Ok(busy());
            }
        }
        self.connected(st).await?;
        self.outlives(st, at.conn, millis(lease)).await?;
        let conn = st.conn.as_mut().ok_or_else(gone)?;
        let sql = if rw.prefer_writers {
            READ_UNLESS_WAITING
        } else {
            READ
        };
        let query = sqlx::query_scalar::<_, bool>(sql).bind(at.lock).bind(gate);
        let answer = tokio::time::timeout(self.timeout, query.fetch_one(conn)).await;
        if !self.answered(st, at.conn, answer)? {
            return Ok(busy());
        }
        self.taken(at, keys, st, (owner, 0), lease, Locks::Shared(at.lock));
        Ok(AcquireReply::Acquired { fence: Some(0) })
    }

    /// A writer's attempt: the writer's key exclusively, with a fencing token. A writer that
    /// waits holds the gate meanwhile (with writers preferred), and lets it go once it has the
    /// lock.
    pub(super) async fn acquire_write(
        self: &Arc<Self>,
        st: &mut ConnState,
        at: Place,
        (keys, rw): (&LockKeys, &RwKeys),
        owner: &str,
        lease: Duration,
    ) -> Result<AcquireReply, BackendError> {
        let taken = {
            let holds = self.holds();
            holds.any(at.hold, st.generation) || holds.any(advisory_key(&rw.readers), st.generation)
        };
        let fence = if taken {
            None
        } else {
            self.take_exclusive(st, at, lease).await?
        };
        let gate = advisory_key(&rw.waiting);
        let Some(fence) = fence else {
            if let Some(counts) = rw.wait_counts.filter(|_| rw.prefer_writers) {
                self.hold_gate(st, at, gate, keys.channel(), counts).await?;
            }
            return Ok(busy());
        };
        self.taken(
            at,
            keys,
            st,
            (owner, fence),
            lease,
            Locks::Exclusive(at.lock),
        );
        // Readers are kept out by the lock itself now. A gate that can't be let go now goes
        // when its time is up — unless the session ended, and the lock with it.
        let generation = st.generation;
        if let Err(err) = self.unlock(st, at.conn, (gate, GATE), keys.channel()).await
            && st.generation != generation
        {
            return Err(err);
        }
        Ok(AcquireReply::Acquired { fence: Some(fence) })
    }

    /// Holds the gate `gate` for this `Locker`'s waiting writers for `counts` more; when
    /// another session's writer holds it, a writer waits there already.
    async fn hold_gate(
        self: &Arc<Self>,
        st: &mut ConnState,
        at: Place,
        gate: i64,
        channel: &str,
        counts: Duration,
    ) -> Result<(), BackendError> {
        let until = Instant::now() + counts;
        if let Some(held) = self.holds().find_mut(gate, GATE, st.generation) {
            held.expires = until;
            return Ok(());
        }
        let conn = st.conn.as_mut().ok_or_else(gone)?;
        let query = sqlx::query_scalar::<_, bool>(GATE_TAKE).bind(gate);
        let answer = tokio::time::timeout(self.timeout, query.fetch_one(conn)).await;
        if self.answered(st, at.conn, answer)? {
            let held = Held {
                owner: GATE.into(),
                conn: at.conn,
                generation: st.generation,
                fence: 0,
                expires: until,
                locks: Locks::Exclusive(gate),
            };
            self.holds().insert(gate, held.clone());
            self.expire_later(gate, &held, channel);
        }
        Ok(())
    }

    /// A writer of this `Locker` stops waiting without the lock: with no other left (`last`),
    /// the gate goes (the next one's attempt takes it again).
    pub(crate) async fn leave_gate(&self, keys: &LockKeys, last: bool) -> Result<(), BackendError> {
        let KeyKind::Write(rw) = &keys.kind else {
            return Ok(());
        };
        if !last {
            return Ok(());
        }
        let at = self.place(keys);
        let mut st = self.conns[at.conn].state.lock().await;
        let gate = advisory_key(&rw.waiting);
        self.unlock(&mut st, at.conn, (gate, GATE), keys.channel())
            .await
            .map(|_| ())
    }

    /// How many of the semaphore's permits are held, by any session.
    pub(crate) async fn permits_held(&self, keys: &LockKeys) -> Result<u32, BackendError> {
        self.slots_held(first_slot(advisory_key(&keys.lock))).await
    }

    /// How many slots of the block `first` begins are held, by any session.
    pub(super) async fn slots_held(&self, first: i64) -> Result<u32, BackendError> {
        let held = self.query_any(SLOTS_HELD, first).await?;
        let held = held.first().copied().unwrap_or(0);
        Ok(u32::try_from(held).unwrap_or(u32::MAX))
    }
}
