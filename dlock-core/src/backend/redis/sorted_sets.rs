//! The kinds of hold kept in sorted sets — fair locks' lines, semaphores' permits, read-write
//! locks' readers and waiting writers — over any Redis connection.

use std::time::Duration;

use super::{OpConn, RedisBackend};
use crate::backend::{AcquireReply, Claim, FairReply, Turn};
use crate::error::BackendError;
use crate::name::{LockKeys, RwKeys, SemaphoreKeys};
use crate::protocol;

impl RedisBackend {
    /// A semaphore's attempt: a permit `owner` (its id) if fewer than the count are held;
    /// otherwise the next free one claimed for this `Locker`, if `turn` claims.
    pub(super) async fn acquire_permit(
        &self,
        conn: &OpConn,
        keys: &LockKeys,
        sem: &SemaphoreKeys,
        owner: &str,
        lease: Duration,
        turn: Turn<'_>,
    ) -> Result<AcquireReply, BackendError> {
        // A claim for several permits keeps free ones from others: it lasts as long as its
        // waiter's wait counts, which says it again in time.
        let turn = match (turn.claim, sem.claim_counts) {
            (Some(claim), Some(counts)) => Turn {
                claim: Some(Claim {
                    window: counts,
                    ..claim
                }),
                ..turn
            },
            _ => turn,
        };
        let call = self.script_call(&protocol::AcquirePermit {
            permits: &keys.lock,
            limit: &sem.limit,
            turn_key: &sem.turn,
            id: owner,
            lease,
            count: sem.permits,
            turn,
            take: sem.take,
            channel: keys.channel(),
            publish: self.publish(),
        });
        let ((code, ms), acknowledged): ((i64, i64), _) =
            self.invoke(conn, call, true, self.ack).await?;
        if code == 1 {
            // Not acknowledged in time: the caller's clean-up gives the permit back.
            self.acknowledged(acknowledged)?;
            return Ok(AcquireReply::Acquired { fence: Some(0) });
        }
        Ok(AcquireReply::busy(code, ms, None))
    }

    /// A read-write lock's writer's attempt (its wait recorded, if `rw` says so); the next turn
    /// claimed for this `Locker`, if `turn` claims and another writer holds the lock.
    pub(super) async fn acquire_write(
        &self,
        conn: &OpConn,
        keys: &LockKeys,
        rw: &RwKeys,
        owner: &str,
        (lease, fence_ttl): (Duration, Option<Duration>),
        turn: Turn<'_>,
    ) -> Result<AcquireReply, BackendError> {
        let call = self.script_call(&protocol::AcquireWrite {
            write: &rw.write,
            fence: keys.fence(),
            readers: &rw.readers,
            waiting: &rw.waiting,
            owner,
            lease,
            fence_ttl,
            wait_counts: rw.wait_counts,
            turn,
        });
        let ((code, value), acknowledged): ((i64, i64), _) =
            self.invoke(conn, call, true, self.ack).await?;
        if code == 1 {
            self.acknowledged(acknowledged)?;
            return Ok(AcquireReply::Acquired {
                fence: minted(value)?,
            });
        }
        Ok(AcquireReply::busy(code, value, None))
    }

    /// A read-write lock's reader's attempt.
    pub(super) async fn acquire_read(
        &self,
        conn: &OpConn,
        rw: &RwKeys,
        owner: &str,
        lease: Duration,
    ) -> Result<AcquireReply, BackendError> {
        let call = self.script_call(&protocol::AcquireRead {
            readers: &rw.readers,
            write: &rw.write,
            waiting: &rw.waiting,
            id: owner,
            lease,
            prefer_writers: rw.prefer_writers,
        });
        let ((code, value), acknowledged): ((i64, i64), _) =
            self.invoke(conn, call, true, self.ack).await?;
        if code == 1 {
            self.acknowledged(acknowledged)?;
            return Ok(AcquireReply::Acquired { fence: Some(0) });
        }
        Ok(AcquireReply::busy(code, value, None))
    }

    pub(crate) async fn set_permits(
        &self,
        conn: &OpConn,
        keys: &LockKeys,
        permits: Option<u32>,
    ) -> Result<(), BackendError> {
        let limit = semaphore_limit(keys)?;
        let call = self.script_call(&protocol::SetPermits {
            limit,
            channel: keys.channel(),
            count: permits,
            publish: self.publish(),
        });
        let (_, acknowledged): (i64, _) = self.invoke(conn, call, true, self.ack).await?;
        self.acknowledged(acknowledged)
    }

    pub(crate) async fn permits(
        &self,
        conn: &OpConn,
        keys: &LockKeys,
    ) -> Result<(u32, Option<u32>), BackendError> {
        let limit = semaphore_limit(keys)?;
        let call = self.script_call(&protocol::Permits {
            permits: &keys.lock,
            limit,
        });
        let ((held, set), _): ((i64, i64), _) = self.invoke(conn, call, true, None).await?;
        Ok((
            u32::try_from(held).unwrap_or(u32::MAX),
            u32::try_from(set).ok(),
        ))
    }

    /// A fair lock's attempt: the lock, or (with `alive`) a place in line kept for `alive`.
    pub(crate) async fn acquire_fair(
        &self,
        conn: &OpConn,
        keys: &LockKeys,
        (owner, place): (&str, Option<&str>),
        lease: Duration,
        fence_ttl: Option<Duration>,
        alive: Option<Duration>,
    ) -> Result<FairReply, BackendError> {
        let fair = keys
            .fair_keys()
            .ok_or_else(|| BackendError::protocol("a fair attempt on a plain lock"))?;
        let call = self.script_call(&protocol::AcquireFair {
            lock: &keys.lock,
            fence: keys.fence(),
            channel: keys.channel(),
            queue: &fair.queue,
            alive: &fair.alive,
            owner,
            lease,
            fence_ttl,
            alive_for: alive,
            publish: self.publish(),
            place,
        });
        let (reply, acknowledged): (Vec<i64>, _) = self.invoke(conn, call, true, self.ack).await?;
        let reply = match reply.as_slice() {
            [1, fence] => FairReply {
                reply: AcquireReply::Acquired {
                    fence: minted(*fence)?,
                },
                place: None,
            },
            [code @ (0 | 2), pttl, place] => FairReply {
                reply: AcquireReply::busy(*code, *pttl, None),
                place: u64::try_from(*place).ok(),
            },
            _ => return Err(BackendError::protocol("fair acquire script answered badly")),
        };
        if matches!(reply.reply, AcquireReply::Acquired { .. }) {
            // Not acknowledged in time: the caller's clean-up releases the grant.
            self.acknowledged(acknowledged)?;
        }
        Ok(reply)
    }
}

/// A semaphore's count key (an error for a lock's keys).
fn semaphore_limit(keys: &LockKeys) -> Result<&str, BackendError> {
    match keys.semaphore_keys() {
        Some(sem) => Ok(&sem.limit),
        None => Err(BackendError::protocol("a semaphore command on a lock")),
    }
}

/// A grant's fencing token as a script answers it: `-1` none minted yet.
pub(super) fn minted(value: i64) -> Result<Option<u64>, BackendError> {
    if value == -1 {
        return Ok(None);
    }
    u64::try_from(value)
        .map(Some)
        .map_err(|_| BackendError::protocol("negative fencing token"))
}
