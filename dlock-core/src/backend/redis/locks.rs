//! The plain lock's scripts (acquire, all-or-none, re-entry check, release, clean-up, hand-over)
//! and the operators' (inspect, force release), over any Redis connection.

use std::time::Duration;

use redis::{RedisResult, Value};

use super::{OpConn, RedisBackend, ScriptCall, millis, millis_up};
use crate::backend::{
    AcquireAllReply, AcquireReply, HandoffReply, RawInfo, ReleaseReply, Successor, Turn,
};
use crate::error::BackendError;
use crate::name::{FairKeys, KeyKind, LockKeys};
use crate::script;

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
                let permit = self.acquire_permit(conn, keys, &sem.limit, sem.permits, owner, lease);
                return Box::pin(permit).await;
            }
            KeyKind::Write(rw) => {
                let write = self.acquire_write(conn, keys, rw, owner, lease, fence_ttl);
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
        let attempt = |keys_named: &[&str]| {
            let call = ScriptCall::new(&script::ACQUIRE, keys_named)
                .arg(owner)
                .arg(millis(lease))
                .arg(claim.map_or(0, |c| millis_up(c.window)))
                .arg(claim.map_or(0, |c| c.since))
                .arg(turn.locker)
                .arg(if turn.head { "1" } else { "0" })
                .arg(fence_ttl.map_or(0, millis));
            match grant {
                Some(grant) => {
                    (call.arg(grant.token).arg(grant.attempt)).arg(millis_up(grant.window))
                }
                None => call,
            }
        };
        let call = attempt(&[&keys.lock, keys.fence()]);
        let (reply, acknowledged) = match self.invoke_until(conn, call, true, self.ack, until).await
        {
            // The lock's slot is moving and its keys are on both sides (the fencing counter
            // still on the old master, the lock key gone from it): a script naming both can't
            // run until the move ends. Naming the lock's key alone, it goes where that key is
            // and does all the same — takes a lock kept or granted for this waiter, claims the
            // next turn — except mint a token: that is minted when asked, as for a first attempt.
            Err(err) if err.is_migrating() && matches!(keys.kind, KeyKind::Lock) => {
                let call = attempt(&[&keys.lock]);
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
        let keys: Vec<&str> = (locks.iter())
            .flat_map(|(keys, _)| [keys.lock.as_str(), keys.fence()])
            .collect();
        let mut call = ScriptCall::new(&script::ACQUIRE_ALL, &keys)
            .arg(millis(lease))
            .arg(fence_ttl.map_or(0, millis));
        for (_, owner) in locks {
            call = call.arg(*owner);
        }
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
        keys: &LockKeys,
    ) -> Result<RawInfo, BackendError> {
        let queue = format!("{}:queue", keys.lock);
        let call = ScriptCall::new(
            &script::INSPECT,
            &[&keys.lock, keys.fence(), keys.channel(), &queue],
        )
        .arg(self.numsub());
        type Reply = (i64, Vec<String>, String, i64, i64, String, i64, i64);
        let ((pttl, holders, token, kept, foreign, last, waiting, queued), _): (Reply, _) =
            self.invoke(conn, call, true, None).await?;
        let number = |s: String| (!s.is_empty()).then(|| s.parse::<u64>()).transpose();
        let bad = |_| BackendError::protocol("inspect script answered a bad fencing token");
        Ok(RawInfo {
            ttl: u64::try_from(pttl).ok().map(Duration::from_millis),
            holders: (holders.chunks(2))
                .map(|h| {
                    let label = h.get(1).filter(|l| !l.is_empty()).cloned();
                    (h[0].clone(), label)
                })
                .collect(),
            token: number(token).map_err(bad)?,
            kept: kept == 1,
            foreign: foreign == 1,
            last_token: number(last).map_err(bad)?,
            waiting: u64::try_from(waiting).unwrap_or(0),
            queued: u64::try_from(queued).unwrap_or(0),
        })
    }

    pub(crate) async fn force_release(
        &self,
        conn: &OpConn,
        keys: &LockKeys,
    ) -> Result<bool, BackendError> {
        let fair = fair_keys(keys)?;
        let call = ScriptCall::new(
            &script::FORCE_RELEASE,
            &[&keys.lock, keys.channel(), &fair.queue, &fair.alive],
        )
        .arg(self.publish());
        let (removed, _): (i64, _) = self.invoke(conn, call, true, self.ack).await?;
        Ok(removed == 1)
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
        let call = ScriptCall::new(&script::LEAVE_TURN, &[&keys.lock, keys.channel()])
            .arg(since)
            .arg(locker)
            .arg(if last { "1" } else { "0" })
            .arg(self.publish())
            .arg(granted_to.unwrap_or(""));
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
        // next one minted is above it still, see the `script` module).
        let call = ScriptCall::new(&script::FENCE, &[&keys.lock, keys.fence()])
            .arg(owner)
            .arg(fence_ttl.map_or(0, millis));
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
        let check = if keys.is_member() {
            &script::HOLDS_MEMBER
        } else {
            &script::HOLDS
        };
        let call = ScriptCall::new(check, &[&keys.lock]).arg(owner);
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
        let call = self.release_of(keys, owner, handed_to, keep).call();
        let (mut reply, acknowledged): (i64, _) =
            match self.invoke(conn, call, true, self.ack).await {
                Err(err) if moving_line(&err, keys) => {
                    let alone = release_alone(keys, owner, handed_to, keep, self.publish());
                    self.invoke(conn, alone.call(), true, self.ack).await?
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
                };
                res.map_err(BackendError::redis)
            })
        };
        let mut reply = match eval(self.release_of(keys, owner, None, keep).eval()).await {
            Err(err) if moving_line(&err, keys) => {
                eval(release_alone(keys, owner, None, keep, self.publish()).eval()).await?
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
    ) -> Release<'k> {
        let (lock, channel) = (keys.lock.as_str(), keys.channel());
        // A permit's or a reader's set is named alone, its channel passed as an argument: on a
        // cluster a command naming two keys of a migrating slot fails (`TRYAGAIN`) until the
        // migration ends unless both are on the same side, and a channel is never a key that
        // exists. (The channel shares the set's hash tag, so the script may publish on it.)
        let member = |script, lua| Release {
            script,
            lua,
            keys: ([lock, "", "", ""], 1),
            args: (
                [
                    Arg::Text(owner),
                    Arg::Text(self.publish()),
                    Arg::Text(channel),
                    Arg::Text(""),
                    Arg::Text(""),
                    Arg::Text(""),
                ],
                3,
            ),
        };
        let (mode, keys) = match &keys.kind {
            KeyKind::Semaphore(_) => {
                return member(&script::RELEASE_PERMIT, script::RELEASE_PERMIT_LUA);
            }
            KeyKind::Read(_) => return member(&script::RELEASE_READ, script::RELEASE_READ_LUA),
            // The common release: the lock's key and owner alone, every other key and argument
            // its default (on a cluster, the channel is named: it must be in the key's slot).
            KeyKind::Lock if handed_to.is_none() && keep.is_none() && !self.sharded() => {
                debug_assert_eq!(channel.strip_suffix(":wake"), Some(lock));
                return Release {
                    script: &script::RELEASE,
                    lua: script::RELEASE_LUA,
                    keys: ([lock, "", "", ""], 1),
                    args: (
                        [
                            Arg::Text(owner),
                            Arg::Number(0),
                            Arg::Number(0),
                            Arg::Number(0),
                            Arg::Number(0),
                            Arg::Number(0),
                        ],
                        1,
                    ),
                };
            }
            // The channel is the script's default (the key's `:wake`), so the key is named alone:
            // on a cluster a command naming two keys of a migrating slot fails (`TRYAGAIN`) until
            // the migration ends unless both are on the same side, and a channel is never a key
            // that exists.
            KeyKind::Lock => {
                debug_assert_eq!(channel.strip_suffix(":wake"), Some(lock));
                ("0", ([lock, "", "", ""], 1))
            }
            KeyKind::Fair(fair) => ("1", ([lock, channel, &fair.queue, &fair.alive], 4)),
            KeyKind::Write(rw) => ("2", ([lock, channel, &rw.waiting, ""], 3)),
        };
        Release {
            script: &script::RELEASE,
            lua: script::RELEASE_LUA,
            keys,
            args: (
                [
                    Arg::Text(owner),
                    Arg::Text(handed_to.unwrap_or("")),
                    Arg::Text(self.publish()),
                    Arg::Number(keep.map_or(0, millis_up)),
                    Arg::Text(mode),
                    Arg::Text(""),
                ],
                5,
            ),
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
        let call = ScriptCall::new(
            &script::HANDOFF,
            &[&keys.lock, keys.fence(), keys.channel()],
        )
        .arg(from)
        .arg(to.owner)
        .arg(millis(lease))
        .arg(fence_ttl.map_or(0, millis))
        .arg(self.numsub())
        .arg(to.locker)
        .arg(self.publish());
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

/// A fair lock's or a writer's release by the lock's key alone, the channel an argument (the
/// script's mode 3): for a slot that is moving.
fn release_alone<'k>(
    keys: &'k LockKeys,
    owner: &'k str,
    handed_to: Option<&'k str>,
    keep: Option<Duration>,
    publish: &'k str,
) -> Release<'k> {
    Release {
        script: &script::RELEASE,
        lua: script::RELEASE_LUA,
        keys: ([keys.lock.as_str(), "", "", ""], 1),
        args: (
            [
                Arg::Text(owner),
                Arg::Text(handed_to.unwrap_or("")),
                Arg::Text(publish),
                Arg::Number(keep.map_or(0, millis_up)),
                Arg::Text("3"),
                Arg::Text(keys.channel()),
            ],
            6,
        ),
    }
}

/// A release's script, as `EVALSHA` ([`script`](Release::script)) or `EVAL` (its `lua`), with
/// its keys and arguments — the first so many of each, kept in place (a release is on every
/// lock's path, and needs no `Vec` for them).
struct Release<'k> {
    script: &'static redis::Script,
    lua: &'static str,
    keys: ([&'k str; 4], usize),
    args: ([Arg<'k>; 6], usize),
}

impl<'k> Release<'k> {
    fn keys(&self) -> &[&'k str] {
        &self.keys.0[..self.keys.1]
    }

    fn args(&self) -> &[Arg<'k>] {
        &self.args.0[..self.args.1]
    }

    /// The release as `EVALSHA` (the script loaded if the server lacks it).
    fn call(&self) -> ScriptCall {
        let mut call = ScriptCall::new(self.script, self.keys());
        for arg in self.args() {
            call = call.arg(arg);
        }
        call
    }

    /// The release as `EVAL` with the script's text: it runs even on a server whose script
    /// cache is empty.
    fn eval(&self) -> redis::Cmd {
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(self.lua).arg(self.keys().len()).arg(self.keys());
        for arg in self.args() {
            cmd.arg(arg);
        }
        cmd
    }
}

/// Whether a release failed because `keys`' slot is moving and the line's keys of a fair lock
/// or a writer are not all on one side: such a hold is released by its key alone (see the
/// script's mode 3).
fn moving_line(err: &BackendError, keys: &LockKeys) -> bool {
    err.is_migrating() && matches!(keys.kind, KeyKind::Fair(_) | KeyKind::Write(_))
}

/// An argument of a release: borrowed text or a number, written into the command as it is
/// (no string of its own for each).
enum Arg<'k> {
    Text(&'k str),
    Number(u64),
}

impl redis::ToRedisArgs for Arg<'_> {
    fn write_redis_args<W>(&self, out: &mut W)
    where
        W: ?Sized + redis::RedisWrite,
    {
        match self {
            Arg::Text(text) => text.write_redis_args(out),
            Arg::Number(n) => n.write_redis_args(out),
        }
    }
}

fn acquire_all_reply(reply: &[i64], n: usize) -> Result<AcquireAllReply, BackendError> {
    match reply {
        [1, fences @ ..] if fences.len() == n => Ok(AcquireAllReply::Acquired {
            fences: (fences.iter())
                .map(|f| u64::try_from(*f))
                .collect::<Result<_, _>>()
                .map_err(|_| BackendError::protocol("negative fencing token"))?,
        }),
        [0, index, pttl] => Ok(AcquireAllReply::Busy {
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

fn acquire_reply((code, value): (i64, i64)) -> Result<AcquireReply, BackendError> {
    match code {
        1 => Ok(AcquireReply::Acquired {
            fence: super::sorted_sets::minted(value)?,
        }),
        0 => Ok(AcquireReply::Busy {
            pttl: u64::try_from(value).ok().map(Duration::from_millis),
        }),
        other => Err(BackendError::protocol(format!(
            "acquire script answered {other}"
        ))),
    }
}

/// The line of a fair lock's keys (every forced release wakes its head, if the name has one).
fn fair_keys(keys: &LockKeys) -> Result<&FairKeys, BackendError> {
    keys.fair_keys()
        .ok_or_else(|| BackendError::protocol("a forced release without the name's line"))
}
