//! Replica acknowledgement: a lock write counts once replicas have it.

use std::time::Duration;

/// Makes a [`Locker`](crate::Locker)'s lock writes wait until `replicas` replicas of the master
/// have them (Redis's `WAIT`), so that a failover to one of those replicas keeps them. Set it with
/// [`LockerBuilder::replica_ack`](crate::LockerBuilder::replica_ack).
///
/// What each operation then guarantees:
///
/// - **Acquire**: a grant counts only once `replicas` replicas acknowledged it within `timeout`.
///   One that is not acknowledged in time is rolled back — an owner-checked release follows it
///   down the same connection — and the attempt fails with a [`BackendError`](crate::BackendError) whose
///   [`is_not_replicated`](crate::BackendError::is_not_replicated) is true. A request with a
///   wait retries within it, like after any backend error; without one, the error is returned.
/// - **Renewal** (the watchdog, [`extend`](crate::LockGuard::extend)): a lease change moves the
///   guard's validity only once acknowledged; otherwise it counts as a failed renewal, and a
///   guard that gets no acknowledged renewal before its validity ends reports the loss.
/// - **Release** waits for the acknowledgement too, but a release that is not acknowledged still
///   counts as released: a failover could bring the lock back until its lease ends, which delays
///   the next holder and never lets two hold it.
/// - **Hand-over** between waiters of one `Locker` is off: every grant is an acquisition.
///
/// What it does not guarantee: the acknowledged write is kept by a failover only if the replica
/// promoted is one that acknowledged it. With `replicas` equal to the number of replicas, that is
/// any of them; with fewer, Sentinel and Cluster promote the replica with the most data, which is
/// usually but not certainly one of them. Replicas without persistence that restart lose what
/// they acknowledged. `WAIT` blocks the connection it runs on, so over a shared connection a slow
/// acknowledgement delays the commands queued behind it, up to `timeout`. Give watchdog leases
/// several times `timeout` (four or more): every renewal waits for the replicas too, and a lease
/// of one or two waits is lost to a replica that lags for that long.
///
/// [`with_fsync`](Self::with_fsync) asks for more: the replicas must have written the lock
/// writes to their append-only files (`WAITAOF`, Redis 7.2 / Valkey 7.2 or newer, replicas with
/// `appendonly yes`), so a replica that restarts keeps them too.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplicaAck {
    replicas: u32,
    timeout: Duration,
    fsync: bool,
}

impl ReplicaAck {
    /// Wait for `replicas` replicas (at least 1), for at most `timeout` each time (at least 1 ms,
    /// and less than the `Locker`'s command timeout, which bounds the write and its wait together).
    pub const fn new(replicas: u32, timeout: Duration) -> Self {
        Self {
            replicas,
            timeout,
            fsync: false,
        }
    }

    /// The replicas must also have written each lock write to their append-only file
    /// (`WAITAOF 0 <replicas> <timeout>` instead of `WAIT`). A server older than 7.2 answers
    /// every write with an error ([`LockerBuilder::build`](crate::LockerBuilder::build) refuses
    /// it up front when it connects), and replicas without `appendonly yes` never acknowledge.
    pub const fn with_fsync(mut self) -> Self {
        self.fsync = true;
        self
    }

    /// Whether the replicas must have fsynced the writes ([`with_fsync`](Self::with_fsync)).
    pub const fn fsyncs(&self) -> bool {
        self.fsync
    }

    /// How many replicas must acknowledge.
    pub const fn replicas(&self) -> u32 {
        self.replicas
    }

    /// How long a write waits for them.
    pub const fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The `timeout` in whole milliseconds, at least 1 (`WAIT 0` would wait forever).
    pub(crate) fn timeout_ms(&self) -> u64 {
        u64::try_from(self.timeout.as_millis())
            .unwrap_or(u64::MAX)
            .max(1)
    }

    /// [`command`](Self::command), waiting no longer than three quarters of `limit`: a renewal
    /// must answer within its budget, or the node's connection would be left blocked in the
    /// wait while the next renewal queues behind it.
    pub(crate) fn command_within(&self, limit: Duration) -> redis::Cmd {
        let capped = Self {
            timeout: self.timeout.min(limit.saturating_mul(3) / 4),
            ..*self
        };
        capped.command()
    }

    /// The command that waits: `WAIT <replicas> <ms>`, or `WAITAOF 0 <replicas> <ms>`.
    pub(crate) fn command(&self) -> redis::Cmd {
        let mut cmd = if self.fsync {
            let mut cmd = redis::cmd("WAITAOF");
            cmd.arg(0);
            cmd
        } else {
            redis::cmd("WAIT")
        };
        cmd.arg(self.replicas).arg(self.timeout_ms());
        cmd
    }

    /// How many replicas acknowledged, from the answer to [`command`](Self::command) (`WAIT`
    /// answers a count, `WAITAOF` a pair: local, replicas).
    pub(crate) fn count(&self, answer: redis::Value) -> redis::RedisResult<u32> {
        use redis::FromRedisValue;
        if self.fsync {
            let (_local, replicas) = <(u32, u32)>::from_redis_value(answer)?;
            Ok(replicas)
        } else {
            Ok(u32::from_redis_value(answer)?)
        }
    }
}
