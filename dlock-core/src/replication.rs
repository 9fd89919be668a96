//! Replica acknowledgement: a lock write counts once replicas have it.

use std::time::Duration;

/// Makes a [`Locker`](crate::Locker)'s lock writes wait until `replicas` replicas of the master
/// have them (Redis's `WAIT`), so that a failover to one of those replicas keeps them. Set it with
/// [`LockerBuilder::replica_ack`](crate::LockerBuilder::replica_ack). A `Locker` on Sentinel or a
/// Cluster waits for one replica by default, [up to the replicas listed](Self::up_to_listed)
/// (turn it off with [`ReplicaAck::none`]).
///
/// What each operation then guarantees:
///
/// - **Acquire**: a grant counts only once `replicas` replicas acknowledged it within `timeout`.
///   One that is not acknowledged in time is rolled back — an owner-checked release follows it
///   down the same connection, answered before the call returns, so the caller's next try finds
///   the name as it was — and the attempt fails with a [`BackendError`](crate::BackendError) whose
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
    up_to_listed: bool,
    /// Writes wait for no replica at all ([`none`](Self::none)).
    none: bool,
}

impl ReplicaAck {
    /// Wait for `replicas` replicas (at least 1), for at most `timeout` each time (at least 1 ms,
    /// and less than the `Locker`'s command timeout, which bounds the write and its wait together).
    pub const fn new(replicas: u32, timeout: Duration) -> Self {
        Self {
            replicas,
            timeout,
            fsync: false,
            up_to_listed: false,
            none: false,
        }
    }

    /// No acknowledgement: lock writes count once the master has them, also on Sentinel and a
    /// Cluster, where waiting for one replica is the default. The fastest choice there, and
    /// the one that gives up a guarantee: a failover to a replica that had not received a lock
    /// write yet loses it, and two holders may then overlap until the lost holder's lease ends.
    pub const fn none() -> Self {
        Self {
            replicas: 0,
            timeout: Duration::ZERO,
            fsync: false,
            up_to_listed: false,
            none: true,
        }
    }

    /// Whether this is [`none`](Self::none).
    pub const fn is_none(&self) -> bool {
        self.none
    }

    /// Wait for no more replicas than the deployment lists as healthy for the master a write
    /// goes to: on a Cluster, the replicas `CLUSTER SLOTS` gives for the write's slot (a
    /// replica marked failed, or not yet synced, is left out); on Sentinel, the replicas the
    /// sentinels report neither down nor still a master out of sync with this one (the old
    /// master after a failover, until it follows: a replica that is syncing again, or cut off
    /// from its master, still counts).
    /// Both are read again every second, after a command failed, and after a write fell
    /// short. A master listed with none — after a failover whose old master is dead, until a
    /// replica is back — writes without waiting, where it would otherwise refuse every grant
    /// until one is back; a replica paused or cut off while still listed is waited for, and a
    /// write it does not acknowledge fails, so a master cut off from its replica does not go
    /// on granting alone. Until the list is known (while a cluster reports itself failing, and
    /// on one server, where there is no list), writes wait for all `replicas`. The default on
    /// Sentinel and a Cluster.
    ///
    /// What it gives up: a write made while the master had no replica listed is kept by no
    /// replica, and lost if that master dies before a replica has copied it.
    pub const fn up_to_listed(mut self) -> Self {
        self.up_to_listed = true;
        self
    }

    /// Whether writes wait only for the replicas listed ([`up_to_listed`](Self::up_to_listed)).
    pub const fn is_up_to_listed(&self) -> bool {
        self.up_to_listed
    }

    /// The acknowledgement one write waits for when its master has `listed` healthy replicas
    /// (`None`: not known): all [`replicas`](Self::replicas) unless this waits
    /// [up to the listed](Self::up_to_listed) ones; then no more than are listed, and no wait
    /// at all (`None`) when none are.
    pub(crate) fn for_listed(self, listed: Option<u32>) -> Option<Self> {
        match listed {
            Some(listed) if self.up_to_listed => (listed > 0).then(|| Self {
                replicas: self.replicas.min(listed),
                ..self
            }),
            _ => Some(self),
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

/// How long a write waits for its replica by default (see [`AckChoice::Default`]), at most: a
/// replica on the same network answers within a few milliseconds, and a loaded machine can
/// hold one up for tens; one that takes longer than this is lagging, and the write fails
/// rather than count on it. Short, too, because a write can wait for a replica that is gone:
/// in the moment after a failover, before the list of replicas says so, a write to the new
/// master waits for its old replica for this long (twice, if the new master had to be sent
/// the script first).
const DEFAULT_ACK_TIMEOUT: Duration = Duration::from_millis(250);

/// Whether a `Locker`'s lock writes wait for replicas, as its builder was told.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) enum AckChoice {
    /// Not told: on Sentinel and a Cluster, one replica acknowledges every write, up to the
    /// replicas listed (see [`AckChoice::resolve`]); elsewhere, none.
    #[default]
    Default,
    /// Writes count once the master has them.
    Off,
    /// As given.
    On(ReplicaAck),
}

impl AckChoice {
    /// The acknowledgement a `Locker`'s writes wait for (`None`: none), on a deployment that
    /// `lists_replicas` (Sentinel, or a Cluster) or not: by default
    /// there, one replica [up to the listed ones](ReplicaAck::up_to_listed), within a quarter
    /// of the command timeout and at most [`DEFAULT_ACK_TIMEOUT`].
    pub(crate) fn resolve(
        self,
        command_timeout: Duration,
        lists_replicas: bool,
    ) -> Option<ReplicaAck> {
        match self {
            Self::Default if lists_replicas => {
                let timeout = DEFAULT_ACK_TIMEOUT
                    .min(command_timeout / 4)
                    .max(Duration::from_millis(1));
                Some(ReplicaAck::new(1, timeout).up_to_listed())
            }
            Self::Default | Self::Off => None,
            Self::On(ack) => Some(ack),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wait_up_to_the_listed_replicas_shrinks_to_them_and_drops_at_none() {
        let ack = ReplicaAck::new(2, Duration::from_millis(100)).up_to_listed();
        assert_eq!(ack.for_listed(None), Some(ack));
        assert_eq!(ack.for_listed(Some(3)), Some(ack));
        assert_eq!(ack.for_listed(Some(1)).map(|a| a.replicas()), Some(1));
        assert_eq!(ack.for_listed(Some(0)), None);
        let strict = ReplicaAck::new(2, Duration::from_millis(100));
        assert_eq!(strict.for_listed(Some(0)), Some(strict));
    }

    #[test]
    fn the_default_waits_where_replicas_are_listed_and_only_there() {
        let second = Duration::from_millis(800);
        let ack = AckChoice::Default.resolve(second, true).unwrap();
        assert_eq!((ack.replicas(), ack.timeout()), (1, second / 4));
        assert!(ack.is_up_to_listed());
        let long = AckChoice::Default.resolve(second * 10, true).unwrap();
        assert_eq!(long.timeout(), DEFAULT_ACK_TIMEOUT);
        assert_eq!(AckChoice::Default.resolve(second, false), None);
        assert_eq!(AckChoice::Off.resolve(second, true), None);
    }
}
