//! The plain lock's scripts (acquire, all-or-none, re-entry check, release, clean-up, hand-over)
//! and the operators' (inspect, force release), over any Redis connection.

use std::time::Duration;

use redis::{RedisResult, Value};

use super::{OpConn, RedisBackend, ScriptCall};
use crate::backend::{
    AcquireAllReply, AcquireReply, HandoffReply, RawInfo, ReleaseReply, Successor, Turn,
};
use crate::error::BackendError;
use crate::name::{KeyKind, LockKeys, NameKeys};
use crate::protocol::{self, Publish, Released, millis};

/// A release script's answer when it released and published a wake-up that nobody heard on a
/// cluster node (see [`RedisBackend::wake_again`]).
const UNHEARD: i64 = -3;

impl RedisBackend {
    pub(crate) async fn acquire(
        &self,
        conn: &OpConn,
        keys: &LockKeys,
        owner: &str,
        lease: Duration,
        fence_ttl: Option<Duration>,
        turn: Turn<'_>,
    ) -> Result<AcquireReply, BackendError> {
        // The other kinds boxed: their larger futures would size every lock's attempt too.
        match &keys.kind {
            KeyKind::Semaphore(sem) => {
                let permit = self.acquire_permit(conn, keys, sem, owner, lease, turn);
                return Box::pin(permit).await;
            }
            KeyKind::Write(rw) => {
                let write = self.acquire_write(conn, keys, rw, owner, (lease, fence_ttl), turn);
                return Box::pin(write).await;
            }
            KeyKind::Read(rw) => return Box::pin(self.acquire_read(conn, rw, owner, lease)).await,
            KeyKind::Lock | KeyKind::Fair(_) => {}
        }
        // One attempt is one command timeout, however many commands it takes.
        let until = tokio::time::Instant::now() + self.timeout;
        if matches!(keys.kind, KeyKind::Lock) && !turn.head {
            // A first attempt: most find the lock free, and `SET NX PX` takes it without a
            // script. Found taken (or taken by an earlier send of this very command, whose
            // answer was lost), the script below answers: it knows the owner, claims the next
            // turn, and says how long the holder has.
            let call = ScriptCall::set_nx(&keys.lock, owner, millis(lease));
            let (reply, acknowledged): (Value, _) =
                self.invoke_until(conn, call, true, self.ack, until).await?;
            if matches!(reply, Value::Okay) {
                // Not acknowledged in time: the caller's clean-up releases the grant.
                self.acknowledged(acknowledged)?;
                return Ok(AcquireReply::Acquired { fence: None });
            }
        }
        let claim = turn.claim.filter(|_| keys.hands_over());
        // A grant inside another's release is not waited for by a replica: with replicas to
        // acknowledge grants, claims are kept for the `Locker` and its attempt takes them.
        let grant = turn
            .grant
            .filter(|_| keys.hands_over() && self.ack.is_none());
        let mut attempt = protocol::Acquire {
            lock: &keys.lock,
            fence: Some(keys.fence()),
            owner,
            lease,
            fence_ttl,
            turn: Turn {
                claim,
                grant,
                ..turn
            },
        };
        let call = self.script_call(&attempt);
        let (reply, acknowledged) = match self.invoke_until(conn, call, true, self.ack, until).await
        {
            // The lock's slot is moving and its keys are on both sides (the fencing counter
            // still on the old master, the lock key gone from it): a script naming both can't
            // run until the move ends. Naming the lock's key alone, it goes where that key is
            // and does all the same — takes a lock kept or granted for this waiter, claims the
            // next turn — except mint a token: that is minted when asked, as for a first attempt.
            Err(err) if err.is_migrating() && matches!(keys.kind, KeyKind::Lock) => {
                attempt.fence = None;
                let call = self.script_call(&attempt);
                self.invoke_until(conn, call, true, self.ack, until).await?
            }
            other => other?,
        };
        let reply = acquire_reply(reply)?;
        if matches!(reply, AcquireReply::Acquired { .. }) {
            // Not acknowledged in time: the caller's clean-up releases the grant.
            self.acknowledged(acknowledged)?;
        }
        Ok(reply)
    }

    pub(crate) async fn acquire_all(
        &self,
        conn: &OpConn,
        locks: &[(&LockKeys, &str)],
        lease: Duration,
        fence_ttl: Option<Duration>,
    ) -> Result<AcquireAllReply, BackendError> {
        let named: Vec<(&str, &str, &str)> = (locks.iter())
            .map(|(keys, owner)| (keys.lock.as_str(), keys.fence(), *owner))
            .collect();
        let call = self.script_call(&protocol::AcquireAll {
            locks: &named,
            lease,
            fence_ttl,
        });
        let (reply, acknowledged): (Vec<i64>, _) = self.invoke(conn, call, true, self.ack).await?;
        let reply = acquire_all_reply(&reply, locks.len())?;
        if matches!(reply, AcquireAllReply::Acquired { .. }) {
            // Not acknowledged in time: the caller's clean-up releases every grant.
            self.acknowledged(acknowledged)?;
        }
        Ok(reply)
    }

    pub(crate) async fn inspect(
        &self,
        conn: &OpConn,
        keys: &NameKeys,
    ) -> Result<RawInfo, BackendError> {
        let call = self.script_call(&protocol::Inspect {
            lock: &keys.lock.lock,
            fence: keys.lock.fence(),
            channel: keys.lock.channel(),
            queue: &keys.fair.queue,
            writer: &keys.rw.write,
            readers: &keys.rw.readers,
            permits: &keys.permits,
            permit_limit: &keys.permit_limit,
            publish: self.publish(),
        });
        type Lock = (i64, Vec<String>, String, i64, i64, String, i64, i64);
        type Others = (i64, Vec<String>, i64, i64, String);
        let (reply, _): (redis::Value, _) = self.invoke(conn, call, true, None).await?;
        let bad_shape = |e: redis::ParsingError| {
            BackendError::protocol(format!("inspect script answered an unexpected reply: {e}"))
        };
        let redis::Value::Array(mut items) = reply else {
            return Err(BackendError::protocol("inspect script answered no array"));
        };
        if items.len() != 13 {
            return Err(BackendError::protocol(
                "inspect script answered a short array",
            ));
        }
        let others = items.split_off(8);
        let (pttl, holders, token, kept, foreign, last, waiting, queued): Lock =
            redis::FromRedisValue::from_redis_value(redis::Value::Array(items))
                .map_err(bad_shape)?;
        let (writer_pttl, writer, readers, permits, limit): Others =
            redis::FromRedisValue::from_redis_value(redis::Value::Array(others))
                .map_err(bad_shape)?;
        let number = |s: String| (!s.is_empty()).then(|| s.parse::<u64>()).transpose();
        let bad = |_| BackendError::protocol("inspect script answered a bad fencing token");
        let holder = |h: Vec<String>| {
            let mut h = h.into_iter();
            let prefix = h.next()?;
            Some((prefix, h.next().filter(|l| !l.is_empty())))
        };
        Ok(RawInfo {
            ttl: u64::try_from(pttl).ok().map(Duration::from_millis),
            holders: holder(holders).into_iter().collect(),
            token: number(token).map_err(bad)?,
            kept: kept == 1,
            foreign: foreign == 1,
            last_token: number(last).map_err(bad)?,
            waiting: u64::try_from(waiting).unwrap_or(0),
            queued: u64::try_from(queued).unwrap_or(0),
            writer: holder(writer),
            writer_ttl: u64::try_from(writer_pttl).ok().map(Duration::from_millis),
            readers: u64::try_from(readers).unwrap_or(0),
            permits: u64::try_from(permits).unwrap_or(0),
            permit_limit: (!limit.is_empty()).then(|| limit.parse().ok()).flatten(),
        })
    }

    pub(crate) async fn force_release(
        &self,
        conn: &OpConn,
        keys: &NameKeys,
    ) -> Result<u64, BackendError> {
        let call = self.script_call(&protocol::ForceRelease {
            lock: &keys.lock.lock,
            channel: keys.lock.channel(),
            queue: &keys.fair.queue,
            alive: &keys.fair.alive,
            writer: &keys.rw.write,
            readers: &keys.rw.readers,
            rw_channel: &keys.rw_channel,
            permits: &keys.permits,
            permits_channel: &keys.permits_channel,
            publish: self.publish(),
        });
        let (removed, _): (i64, _) = self.invoke(conn, call, true, self.ack).await?;
        Ok(u64::try_from(removed).unwrap_or(0))
    }

    pub(crate) async fn leave_turn(
        &self,
        conn: &OpConn,
        keys: &LockKeys,
        locker: &str,
        since: u64,
        last: bool,
        granted_to: Option<&str>,
    ) -> Result<(), BackendError> {
        let call = self.script_call(&protocol::LeaveTurn {
            lock: &keys.lock,
            channel: keys.channel(),
            permit_turn: keys.semaphore_keys().map(|sem| sem.turn.as_str()),
            since,
            locker,
            last,
            publish: self.publish(),
            granted_to,
        });
        let (_left, _): (i64, _) = self.invoke(conn, call, true, self.ack).await?;
        Ok(())
    }

    /// The cluster slot of `key` on a cluster; `None` on one server.
    pub(crate) fn slot(&self, key: &str) -> Option<u16> {
        match &self.conn {
            #[cfg(feature = "cluster")]
            super::RedisConn::Cluster(_) => Some(crate::backend::cluster::key_slot(key.as_bytes())),
            _ => {
                let _ = key;
                None
            }
        }
    }

    pub(crate) async fn fence(
        &self,
        conn: &OpConn,
        keys: &LockKeys,
        owner: &str,
        fence_ttl: Option<Duration>,
    ) -> Result<Option<u64>, BackendError> {
        // Nothing to acknowledge: a token is worth as much after a failover that lost it (the
        // next one minted is above it still, see the `protocol` module).
        let call = self.script_call(&protocol::Fence {
            lock: &keys.lock,
            fence: keys.fence(),
            owner,
            fence_ttl,
        });
        let (token, _): (i64, _) = self.invoke(conn, call, true, None).await?;
        Ok(u64::try_from(token).ok())
    }

    pub(crate) async fn holds(
        &self,
        conn: &OpConn,
        keys: &LockKeys,
        owner: &str,
    ) -> Result<AcquireReply, BackendError> {
        // Read-only: nothing to acknowledge.
        let call = self.script_call(&protocol::Holds {
            key: &keys.lock,
            owner,
            member: keys.is_member(),
        });
        let (reply, _) = self.invoke(conn, call, true, None).await?;
        acquire_reply(reply)
    }

    pub(crate) async fn release(
        &self,
        conn: &OpConn,
        keys: &LockKeys,
        owner: &str,
        handed_to: Option<&str>,
        keep: Option<Duration>,
    ) -> Result<ReleaseReply, BackendError> {
        let call = self.script_call(&self.release_of(keys, owner, handed_to, keep));
        // A release naming its line's keys on a cluster gets half the command timeout: while its
        // slot moves, Redis refuses it (`TRYAGAIN`) until the move ends, and an application's
        // cluster connection may go on retrying that for seconds (redis-rs's defaults) instead
        // of saying so. The lock's key alone, in the other half, goes where that key is.
        let started = tokio::time::Instant::now();
        let line = matches!(self.publish(), Publish::Sharded) && names_line(keys);
        let first_until = started + if line { self.timeout / 2 } else { self.timeout };
        // Not resent here when the connection drops: the engine sends it again itself, and so
        // knows that a hold found gone then may have been let go by the first try (which the
        // server may have run before it saw the connection close).
        let alone = |until| {
            let alone = self.release_alone(keys, owner, handed_to, keep);
            async move {
                let call = self.script_call(&alone);
                self.invoke_until::<i64>(conn, call, false, self.ack, until)
                    .await
            }
        };
        let (mut reply, acknowledged): (i64, _) =
            match (self.invoke_until(conn, call, false, self.ack, first_until)).await {
                // Refused: the first did not run.
                Err(err) if moving_line(&err, keys) => alone(started + self.timeout).await?,
                // Unanswered: the first may have run (and only its answer, or its wait for a
                // replica, is late). A hold the second finds gone then says nothing, and the
                // timeout goes back to the engine, which judges a hold gone after a try whose
                // answer was lost (see `Engine::release_in_redis`).
                Err(err) if line && err.is_timeout() => {
                    let (reply, acknowledged) = alone(started + self.timeout).await?;
                    if matches!(
                        ReleaseReply::from_reply(reply),
                        ReleaseReply::Expired | ReleaseReply::TakenOver
                    ) {
                        return Err(err);
                    }
                    (reply, acknowledged)
                }
                other => other?,
            };
        if reply == UNHEARD {
            reply = self.wake_again(conn, keys).await;
        }
        if let Err(err) = self.acknowledged(acknowledged) {
            // Released all the same: a failover could only bring the lock back until its
            // lease ends (see `ReplicaAck`).
            tracing::debug!(error = %err, "dlock: release not acknowledged by replicas");
        }
        Ok(ReleaseReply::from_reply(reply))
    }

    /// Sends a release's wake-up again, from here: the script published it on a cluster node
    /// where nobody listened — the master a moving slot goes to (a release of a key that moved
    /// already runs there), while the channel's subscribers are on the slot's master until the
    /// move ends. Returns how many heard it this time (0 if the send failed: the waiters'
    /// timers remain).
    async fn wake_again(&self, conn: &OpConn, keys: &LockKeys) -> i64 {
        #[cfg(feature = "cluster")]
        {
            let call = ScriptCall::spublish(keys.channel(), "1");
            match self.invoke::<i64>(conn, call, true, None).await {
                Ok((woke, _)) => woke,
                Err(err) => {
                    tracing::debug!(error = %err, "dlock: a release's wake-up failed");
                    0
                }
            }
        }
        #[cfg(not(feature = "cluster"))]
        {
            let _ = (conn, keys);
            0
        }
    }

    /// A release sent after a command whose answer didn't come (it may still run): sent as
    /// `EVAL` with the script's text, so it runs even if it reaches a server whose script cache
    /// is empty — it may itself time out, and then nobody would be left to load the script.
    pub(crate) async fn clean_up(
        &self,
        conn: &OpConn,
        keys: &LockKeys,
        owner: &str,
        keep: Option<Duration>,
    ) -> Result<ReleaseReply, BackendError> {
        let eval = |cmd: redis::Cmd| {
            self.bounded(async move {
                let res: RedisResult<i64> = match conn {
                    OpConn::Manager(c) => cmd.query_async(&mut c.clone()).await,
                    #[cfg(feature = "sentinel")]
                    OpConn::Sentinel(c) => cmd.query_async(&mut c.clone()).await,
                    #[cfg(feature = "cluster")]
                    OpConn::Cluster(c) => cmd.query_async(&mut c.clone()).await,
                    OpConn::Multiplexed(c) | OpConn::Pooled(c, _) => {
                        cmd.query_async(&mut c.clone()).await
                    }
                    OpConn::Memory(c) => cmd.query_async(&mut c.clone()).await,
                };
                res.map_err(BackendError::redis)
            })
        };
        let mut reply =
            match eval(self.script_eval(&self.release_of(keys, owner, None, keep))).await {
                Err(err) if moving_line(&err, keys) => {
                    eval(self.script_eval(&self.release_alone(keys, owner, None, keep))).await?
                }
                other => other?,
            };
        if reply == UNHEARD {
            reply = self.wake_again(conn, keys).await;
        }
        Ok(ReleaseReply::from_reply(reply))
    }

    /// The release of `owner`'s hold, for its kind: a lock's (plain, fair, a writer's), a
    /// permit's or a reader's.
    fn release_of<'k>(
        &self,
        keys: &'k LockKeys,
        owner: &'k str,
        handed_to: Option<&'k str>,
        keep: Option<Duration>,
    ) -> protocol::Release<'k> {
        let channel = keys.channel();
        let kind = match &keys.kind {
            KeyKind::Semaphore(sem) => Released::Permit {
                channel,
                turn: Some(&sem.turn),
                taken: sem.take,
            },
            KeyKind::Read(_) => Released::Reader { channel },
            KeyKind::Lock => {
                // The script's default channel: the key's `:wake`.
                debug_assert_eq!(channel.strip_suffix(":wake"), Some(keys.lock.as_str()));
                Released::Lock
            }
            KeyKind::Fair(fair) => Released::Fair {
                channel,
                queue: &fair.queue,
                alive: &fair.alive,
            },
            KeyKind::Write(rw) => Released::Writer {
                channel,
                waiting: &rw.waiting,
            },
        };
        protocol::Release {
            key: &keys.lock,
            owner,
            kind,
            handed_to,
            keep,
            publish: self.publish(),
        }
    }

    /// A fair lock's or a writer's release by the lock's key alone, the channel an argument:
    /// for a slot that is moving.
    fn release_alone<'k>(
        &self,
        keys: &'k LockKeys,
        owner: &'k str,
        handed_to: Option<&'k str>,
        keep: Option<Duration>,
    ) -> protocol::Release<'k> {
        let channel = keys.channel();
        let kind = match &keys.kind {
            KeyKind::Semaphore(sem) => Released::Permit {
                channel,
                turn: None,
                taken: sem.take,
            },
            _ => Released::Alone { channel },
        };
        protocol::Release {
            kind,
            ..self.release_of(keys, owner, handed_to, keep)
        }
    }

    pub(crate) async fn handoff(
        &self,
        conn: &OpConn,
        keys: &LockKeys,
        from: &str,
        to: Successor<'_>,
        lease: Duration,
        fence_ttl: Option<Duration>,
    ) -> Result<HandoffReply, BackendError> {
        let call = self.script_call(&protocol::Handoff {
            lock: &keys.lock,
            fence: keys.fence(),
            channel: keys.channel(),
            from,
            to: to.owner,
            locker: to.locker,
            lease,
            fence_ttl,
            publish: self.publish(),
        });
        // Hand-over is off when replicas must acknowledge (see `ReplicaAck`).
        let ((code, value), _): ((i64, i64), _) = self.invoke(conn, call, false, self.ack).await?;
        if code == 1 {
            Ok(HandoffReply::HandedOver {
                fence: u64::try_from(value)
                    .map_err(|_| BackendError::protocol("negative fencing token"))?,
            })
        } else if code == 2 {
            Ok(HandoffReply::ReleasedInstead {
                woke: u32::try_from(value).unwrap_or(0),
            })
        } else {
            Ok(HandoffReply::NotHandedOver(ReleaseReply::from_reply(value)))
        }
    }
}

/// Whether a release failed because `keys`' slot is moving and the line's keys of a fair lock
/// or a writer, or a semaphore's permits and claim, are not all on one side: such a hold is
/// released by its key alone (see the release script's mode 3; a permit given back then is
/// kept for no claimant).
fn moving_line(err: &BackendError, keys: &LockKeys) -> bool {
    err.is_migrating() && names_line(keys)
}

/// Whether `keys`' release names keys besides the hold's own: a fair lock's or a writer's
/// line, a semaphore's claim.
fn names_line(keys: &LockKeys) -> bool {
    matches!(
        keys.kind,
        KeyKind::Fair(_) | KeyKind::Write(_) | KeyKind::Semaphore(_)
    )
}

fn acquire_all_reply(reply: &[i64], n: usize) -> Result<AcquireAllReply, BackendError> {
    match reply {
        [1, fences @ ..] if fences.len() == n => Ok(AcquireAllReply::Acquired {
            fences: (fences.iter())
                .map(|f| u64::try_from(*f))
                .collect::<Result<_, _>>()
                .map_err(|_| BackendError::protocol("negative fencing token"))?,
        }),
        // 2: the lock is held in a layout this version does not speak; busy all the same (the
        // waiter then waits on that one lock alone, which says so).
        [0 | 2, index, pttl] => Ok(AcquireAllReply::Busy {
            index: usize::try_from(*index - 1)
                .ok()
                .filter(|i| *i < n)
                .ok_or_else(|| BackendError::protocol("acquire-all named no lock"))?,
            pttl: u64::try_from(*pttl).ok().map(Duration::from_millis),
        }),
        other => Err(BackendError::protocol(format!(
            "acquire-all script answered {other:?}"
        ))),
    }
}

/// `ACQUIRE`'s (or `HOLDS`') answer: `{1, token}`, or busy as `{0 | 2, pttl}` with the fencing
/// token of the hold found after them (this layout's `ACQUIRE`; layout 1's answered without it).
fn acquire_reply(reply: Vec<i64>) -> Result<AcquireReply, BackendError> {
    match reply[..] {
        [1, value] => Ok(AcquireReply::Acquired {
            fence: super::sorted_sets::minted(value)?,
        }),
        [code @ (0 | 2), pttl] => Ok(AcquireReply::busy(code, pttl, None)),
        [code @ (0 | 2), pttl, fence] => Ok(AcquireReply::busy(code, pttl, Some(fence))),
        _ => Err(BackendError::protocol(format!(
            "acquire script answered {reply:?}"
        ))),
    }
}
