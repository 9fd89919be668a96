//! The plain lock's scripts (acquire, all-or-none, re-entry check, release, clean-up, hand-over)
//! and the operators' (inspect, force release), over any Redis connection.

use std::time::Duration;

use redis::RedisResult;

use super::{OpConn, RedisBackend, ScriptCall, millis, millis_up};
use crate::backend::{AcquireAllReply, AcquireReply, HandoffReply, RawInfo, ReleaseReply};
use crate::error::BackendError;
use crate::name::LockKeys;
use crate::script;

impl RedisBackend {
    pub(crate) async fn acquire(
        &self,
        conn: &OpConn,
        keys: &LockKeys,
        owner: &str,
        lease: Duration,
        fence_ttl: Option<Duration>,
    ) -> Result<AcquireReply, BackendError> {
        if let Some(sem) = &keys.semaphore {
            return self
                .acquire_permit(conn, keys, &sem.limit, sem.permits, owner, lease)
                .await;
        }
        let call = ScriptCall::new(&script::ACQUIRE, &[&keys.lock, &keys.fence])
            .arg(owner)
            .arg(millis(lease))
            .arg(fence_ttl.map_or(0, millis));
        let (reply, acknowledged) = self.invoke(conn, &call, true, self.ack).await?;
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
            .flat_map(|(keys, _)| [keys.lock.as_str(), keys.fence.as_str()])
            .collect();
        let mut call = ScriptCall::new(&script::ACQUIRE_ALL, &keys)
            .arg(millis(lease))
            .arg(fence_ttl.map_or(0, millis));
        for (_, owner) in locks {
            call = call.arg(*owner);
        }
        let (reply, acknowledged): (Vec<i64>, _) = self.invoke(conn, &call, true, self.ack).await?;
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
            &[&keys.lock, &keys.fence, &keys.channel, &queue],
        )
        .arg(self.numsub());
        type Reply = (i64, Vec<String>, String, i64, i64, String, i64, i64);
        let ((pttl, holders, token, kept, foreign, last, waiting, queued), _): (Reply, _) =
            self.invoke(conn, &call, true, None).await?;
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
        let call = ScriptCall::new(&script::FORCE_RELEASE, &[&keys.lock, &keys.channel])
            .arg(self.publish());
        let (removed, _): (i64, _) = self.invoke(conn, &call, true, self.ack).await?;
        Ok(removed == 1)
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

    pub(crate) async fn holds(
        &self,
        conn: &OpConn,
        keys: &LockKeys,
        owner: &str,
    ) -> Result<AcquireReply, BackendError> {
        // Read-only: nothing to acknowledge.
        let call = ScriptCall::new(&script::HOLDS, &[&keys.lock]).arg(owner);
        let (reply, _) = self.invoke(conn, &call, true, None).await?;
        acquire_reply(reply)
    }

    pub(crate) async fn release(
        &self,
        conn: &OpConn,
        keys: &LockKeys,
        owner: &str,
        handed_to: Option<&str>,
        fence_ttl: Option<Duration>,
        keep: Option<Duration>,
    ) -> Result<ReleaseReply, BackendError> {
        if keys.semaphore.is_some() {
            let call = ScriptCall::new(&script::RELEASE_PERMIT, &[&keys.lock, &keys.channel])
                .arg(owner)
                .arg(self.publish());
            let ((code, woke), acknowledged): ((i64, i64), _) =
                self.invoke(conn, &call, true, self.ack).await?;
            if let Err(err) = self.acknowledged(acknowledged) {
                tracing::debug!(error = %err, "dlock: release not acknowledged by replicas");
            }
            return Ok(ReleaseReply::from_code(code, woke));
        }
        let call = ScriptCall::new(&script::RELEASE, &release_keys(keys))
            .arg(owner)
            .arg(handed_to.unwrap_or(""))
            .arg(fence_ttl.map_or(0, millis))
            .arg(self.publish())
            .arg(keep.map_or(0, millis_up))
            .arg(u8::from(keys.fair.is_some()));
        let ((code, woke), acknowledged): ((i64, i64), _) =
            self.invoke(conn, &call, true, self.ack).await?;
        if let Err(err) = self.acknowledged(acknowledged) {
            // Released all the same: a failover could only bring the lock back until its
            // lease ends (see `ReplicaAck`).
            tracing::debug!(error = %err, "dlock: release not acknowledged by replicas");
        }
        Ok(ReleaseReply::from_code(code, woke))
    }

    /// A release sent after a command whose answer didn't come (it may still run): sent as
    /// `EVAL` with the script's text, so it runs even if it reaches a server whose script cache
    /// is empty — it may itself time out, and then nobody would be left to load the script.
    pub(crate) async fn clean_up(
        &self,
        conn: &OpConn,
        keys: &LockKeys,
        owner: &str,
        fence_ttl: Option<Duration>,
        keep: Option<Duration>,
    ) -> Result<ReleaseReply, BackendError> {
        let mut cmd = redis::cmd("EVAL");
        let release_keys = release_keys(keys);
        if keys.semaphore.is_some() {
            cmd.arg(script::RELEASE_PERMIT_LUA)
                .arg(2)
                .arg(&keys.lock)
                .arg(&keys.channel)
                .arg(owner)
                .arg(self.publish());
        } else {
            cmd.arg(script::RELEASE_LUA)
                .arg(release_keys.len())
                .arg(&release_keys)
                .arg(owner)
                .arg("")
                .arg(fence_ttl.map_or(0, millis))
                .arg(self.publish())
                .arg(keep.map_or(0, millis_up))
                .arg(u8::from(keys.fair.is_some()));
        }
        let (code, woke): (i64, i64) = self
            .bounded(async {
                let res: RedisResult<(i64, i64)> = match conn {
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
            .await?;
        Ok(ReleaseReply::from_code(code, woke))
    }

    pub(crate) async fn handoff(
        &self,
        conn: &OpConn,
        keys: &LockKeys,
        from: &str,
        to: &str,
        lease: Duration,
        fence_ttl: Option<Duration>,
    ) -> Result<HandoffReply, BackendError> {
        let call = ScriptCall::new(&script::HANDOFF, &[&keys.lock, &keys.fence, &keys.channel])
            .arg(from)
            .arg(to)
            .arg(millis(lease))
            .arg(fence_ttl.map_or(0, millis));
        // Hand-over is off when replicas must acknowledge (see `ReplicaAck`).
        let ((code, value), _): ((i64, i64), _) = self.invoke(conn, &call, false, self.ack).await?;
        if code == 1 {
            Ok(HandoffReply::HandedOver {
                fence: u64::try_from(value)
                    .map_err(|_| BackendError::protocol("negative fencing token"))?,
            })
        } else {
            Ok(HandoffReply::NotHandedOver(ReleaseReply::from_code(
                value, 0,
            )))
        }
    }
}

/// The keys the release script takes: the lock's, and a fair lock's line.
fn release_keys(keys: &LockKeys) -> Vec<&str> {
    let mut out = vec![
        keys.lock.as_str(),
        keys.fence.as_str(),
        keys.channel.as_str(),
    ];
    if let Some(fair) = &keys.fair {
        out.push(&fair.queue);
        out.push(&fair.alive);
    }
    out
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
            fence: u64::try_from(value)
                .map_err(|_| BackendError::protocol("negative fencing token"))?,
        }),
        0 => Ok(AcquireReply::Busy {
            pttl: u64::try_from(value).ok().map(Duration::from_millis),
        }),
        other => Err(BackendError::protocol(format!(
            "acquire script answered {other}"
        ))),
    }
}
