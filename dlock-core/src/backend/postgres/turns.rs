//! Turns across processes on PostgreSQL: a waiter's *claim to the next turn* (defined in
//! ARCHITECTURE.md) for a plain lock, kept in the table `dlock_turns`.
//!
//! After a release every waiter races for the lock, and without claims the process nearest the
//! server wins nearly every race. So a waiting attempt that finds the lock taken also claims
//! the next turn for its `Locker`: a row `(key, locker, since, until)`, where `since` is when
//! its waiter began waiting (wall-clock ms) and an earlier claim replaces a later one, as on
//! Redis. While another `Locker`'s claim is live, an attempt does not take the lock even if it
//! is free; the claimant's attempt takes it and removes the claim in the same statement.
//!
//! A claim lives [`CLAIM_LIFE`] after the claimant's last attempt (each one says it again): a
//! claimant that stops attempting — it crashed, or its process is paused — holds the name up
//! that long at most. A waiter that gives up takes its `Locker`'s claim back and wakes the
//! others. The table is `UNLOGGED` (claims need not survive a crash), made at the first
//! connection beside the fencing sequence; a name keeps one row at most, reused by its next
//! claims.

use std::time::Duration;

use super::sessions::{ConnState, gone};
use super::{PgBackend, Place, millis};
use crate::backend::Claim;
use crate::error::BackendError;
use crate::name::LockKeys;

/// How long a claim lasts after the claimant's last attempt.
pub(super) const CLAIM_LIFE: Duration = Duration::from_secs(1);

/// Makes the claims' table.
pub(super) const CREATE: &str = "CREATE UNLOGGED TABLE IF NOT EXISTS dlock_turns (\
    key bigint PRIMARY KEY, locker text NOT NULL, since bigint NOT NULL, \
    until timestamptz NOT NULL)";

/// An attempt that claims nothing: the lock `$1` with a fencing token (a positive answer),
/// unless another `Locker` than `$2` has a live claim (`-3 - ms`, with `ms` of the claim's life
/// left) or the lock is taken (`-2`).
const TAKE: &str = "SELECT coalesce(\
    (SELECT -3 - (extract(epoch FROM until - clock_timestamp()) * 1000)::bigint \
     FROM dlock_turns WHERE key = $1 AND locker <> $2 AND until > clock_timestamp()), \
    CASE WHEN pg_try_advisory_lock($1) THEN nextval('dlock_fencing_tokens') ELSE -2 END)";

/// A waiting attempt, or any of a `Locker` that claimed: as [`TAKE`]; found taken (or another's
/// turn), it claims the next turn for `$2` since `$3` (unless `NULL`) for `$4` ms unless an
/// earlier live claim is there; taken, it removes `$2`'s claim. The attempt runs once, before
/// either. The second column says whether it claimed: an attempt kept out by a later claim
/// that its own then replaced finds the turn its own.
const TAKE_OR_CLAIM: &str = "WITH attempt AS MATERIALIZED (SELECT coalesce(\
        (SELECT -3 - (extract(epoch FROM until - clock_timestamp()) * 1000)::bigint \
         FROM dlock_turns WHERE key = $1 AND locker <> $2 AND until > clock_timestamp()), \
        CASE WHEN pg_try_advisory_lock($1) THEN nextval('dlock_fencing_tokens') ELSE -2 END) \
        AS r), \
    claimed AS (INSERT INTO dlock_turns AS t (key, locker, since, until) \
        SELECT $1, $2, $3, clock_timestamp() + $4 * interval '1 millisecond' \
        FROM attempt WHERE r < 0 AND $3::bigint IS NOT NULL \
        ON CONFLICT (key) DO UPDATE \
        SET locker = excluded.locker, since = excluded.since, until = excluded.until \
        WHERE t.locker = excluded.locker OR t.until <= clock_timestamp() \
              OR excluded.since < t.since \
        RETURNING 1), \
    served AS (DELETE FROM dlock_turns WHERE key = $1 AND locker = $2 \
        AND (SELECT r FROM attempt) > 0 RETURNING 1) \
    SELECT r, (SELECT count(*) FROM claimed) FROM attempt";

/// Takes `$2`'s claim on `$1` back, and wakes the name's waiters (`$3`: its channel).
const LEAVE: &str = "WITH gone AS (DELETE FROM dlock_turns WHERE key = $1 AND locker = $2 \
                     RETURNING 1) \
                     SELECT count(*) FROM gone, pg_notify('dlock_released', $3)";

/// What an attempt in turn gave.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Attempt {
    /// The lock, with this fencing token.
    Took(u64),
    /// Taken, or (`claim_left`: for that much longer) another `Locker`'s turn.
    Busy { claim_left: Option<Duration> },
}

/// What an attempt says of the turn: the `Locker` it is made for, and its waiter's claim.
#[derive(Debug, Clone, Copy)]
pub(crate) struct InTurn<'a> {
    pub(crate) locker: &'a str,
    pub(crate) claim: Option<Claim>,
}

impl PgBackend {
    /// Takes `at`'s lock exclusively with a fencing token, if no other session holds it and no
    /// other `Locker` has a claim to the next turn; with a claim, claims the turn when it can't.
    pub(super) async fn take_in_turn(
        &self,
        st: &mut ConnState,
        at: Place,
        lease: Duration,
        turn: InTurn<'_>,
    ) -> Result<Attempt, BackendError> {
        self.connected(st).await?;
        self.outlives(st, at.conn, millis(lease)).await?;
        // A `Locker` that claimed may take the lock with an attempt that claims nothing (a
        // request's first): its claim goes with it all the same.
        let claim = (turn.claim).and_then(|c| i64::try_from(c.since).ok());
        // Twice at most: an attempt kept out by another `Locker`'s claim, whose own claim then
        // replaced it (it waited longer), is next in turn now — with the lock free, no release
        // would come to wake it, so it tries again at once.
        for _ in 0..2 {
            let reply = self.attempt_in_turn(st, at, turn.locker, claim).await?;
            if let Ok(token) = u64::try_from(reply.0) {
                self.set_claimed(at.hold, false);
                return Ok(Attempt::Took(token));
            }
            if claim.is_some() {
                // Claimed, or an earlier claim is there: one of this `Locker`'s may be.
                self.set_claimed(at.hold, true);
            }
            let kept_out = reply.0 <= -3;
            if !(kept_out && reply.1 > 0) {
                let claim_left = (kept_out)
                    .then(|| u64::try_from(-3 - reply.0).ok())
                    .flatten()
                    .map(Duration::from_millis);
                return Ok(Attempt::Busy { claim_left });
            }
        }
        Ok(Attempt::Busy { claim_left: None })
    }

    /// One attempt in turn (see [`TAKE`] and [`TAKE_OR_CLAIM`]): its answer, and whether it
    /// claimed the turn.
    async fn attempt_in_turn(
        &self,
        st: &mut ConnState,
        at: Place,
        locker: &str,
        claim: Option<i64>,
    ) -> Result<(i64, i64), BackendError> {
        let claimed = self.claimed(at.hold);
        let conn = st.conn.as_mut().ok_or_else(gone)?;
        let answer = if claim.is_none() && !claimed {
            let query = sqlx::query_scalar::<_, i64>(TAKE)
                .bind(at.lock)
                .bind(locker.to_owned());
            let answer = tokio::time::timeout(self.timeout, query.fetch_one(conn)).await;
            answer.map(|r| r.map(|r| (r, 0)))
        } else {
            let query = sqlx::query_as::<_, (i64, i64)>(TAKE_OR_CLAIM)
                .bind(at.lock)
                .bind(locker.to_owned())
                .bind(claim)
                .bind(i64::try_from(CLAIM_LIFE.as_millis()).unwrap_or(1_000));
            tokio::time::timeout(self.timeout, query.fetch_one(conn)).await
        };
        self.answered(st, at.conn, answer)
    }

    /// A waiter of this `Locker` (`last`: the last for the name) stops waiting without the
    /// lock: its writers' gate (see `shared`) or its claim goes.
    pub(crate) async fn leave_turn(
        &self,
        keys: &LockKeys,
        locker: &str,
        last: bool,
    ) -> Result<(), BackendError> {
        Box::pin(self.leave_gate(keys, last)).await?;
        Box::pin(self.leave_claim(keys, locker, last)).await
    }

    /// A waiter of this `Locker` stops waiting for a plain lock without it: the last takes the
    /// `Locker`'s claim back, if it made one, and wakes the others.
    pub(crate) async fn leave_claim(
        &self,
        keys: &LockKeys,
        locker: &str,
        last: bool,
    ) -> Result<(), BackendError> {
        let at = self.place(keys);
        if !last || !self.claimed(at.hold) {
            return Ok(());
        }
        let mut st = self.conns[at.conn].state.lock().await;
        self.connected(&mut st).await?;
        let conn = st.conn.as_mut().ok_or_else(gone)?;
        let query = sqlx::query_scalar::<_, i64>(LEAVE)
            .bind(at.lock)
            .bind(locker.to_owned())
            .bind(keys.channel().to_owned());
        let answer = tokio::time::timeout(self.timeout, query.fetch_one(conn)).await;
        self.answered(&mut st, at.conn, answer)?;
        self.set_claimed(at.hold, false);
        Ok(())
    }

    fn claimed(&self, key: i64) -> bool {
        let claims = self.claims.lock().unwrap_or_else(|e| e.into_inner());
        claims.contains(&key)
    }

    fn set_claimed(&self, key: i64, claimed: bool) {
        let mut claims = self.claims.lock().unwrap_or_else(|e| e.into_inner());
        if claimed {
            claims.insert(key);
        } else {
            claims.remove(&key);
        }
    }
}
