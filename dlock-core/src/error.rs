//! Errors and outcomes.

use std::fmt;
use std::time::Duration;

use crate::fencing::FencingToken;

mod masters;

pub use masters::{MasterOutcome, MastersError};

/// Why acquiring, holding or releasing a lock failed.
///
/// Use the predicates ([`is_timeout`](LockError::is_timeout), [`is_lost`](LockError::is_lost),
/// [`is_backend`](LockError::is_backend), …) rather than matching exhaustively: new variants may
/// be added.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LockError {
    /// The lock stayed busy until the wait deadline (immediately, with no wait).
    #[error("lock `{name}` is busy (waited {waited:?})")]
    Busy {
        /// The lock's name.
        name: String,
        /// How long this call waited.
        waited: Duration,
        /// When a retry is likely to find the lock free, if known: the holder's remaining
        /// lease when this call gave up, or, when shorter, how long this `Locker`'s holds
        /// have lasted lately (a watchdog lease is renewed long before it ends, so its
        /// remaining time says little). What `Retry-After` is made from.
        retry_after: Option<Duration>,
    },
    /// The lock stayed held until the wait deadline by a `Locker` of a version whose key layout
    /// this one does not speak (a newer version's, during a rolling deploy): the hold was left
    /// exactly as it was, and the wait polled. Busy, as far as the caller is concerned
    /// ([`is_busy`](LockError::is_busy)); see `docs/UPGRADING.md` in the repository for which
    /// versions may run side by side.
    #[error(
        "lock `{name}` is held in a key layout this version of dlock does not speak (waited {waited:?})"
    )]
    HeldInForeignLayout {
        /// The lock's name.
        name: String,
        /// How long this call waited.
        waited: Duration,
    },
    /// The lock was lost while held: it expired, was deleted, or was taken over.
    #[error("lock `{name}` was lost{}", token_note(*fencing_token))]
    Lost {
        /// The lock's name.
        name: String,
        /// The fencing token of the hold that was lost (`None`: it never asked for one).
        fencing_token: Option<FencingToken>,
    },
    /// The lock name is not acceptable.
    #[error("invalid lock name: {0}")]
    InvalidName(#[from] InvalidName),
    /// Redis could not be reached, timed out, or answered with an error.
    #[error("lock backend unavailable: {0}")]
    Backend(#[from] BackendError),
    /// The `Locker` or the request is misconfigured.
    #[error("lock configuration error: {0}")]
    Config(String),
    /// A [`MasterSet`](crate::MasterSet) got too few grants before its wait ran out; says what
    /// each master answered.
    #[error("{0}")]
    Masters(Box<MastersError>),
}

/// ` (fencing token N)`, or nothing for a hold that never had one.
fn token_note(token: Option<FencingToken>) -> String {
    token.map_or_else(String::new, |t| format!(" (fencing token {t})"))
}

impl LockError {
    /// The lock was busy until the deadline: another holder kept it past the wait (on a
    /// [`MasterSet`](crate::MasterSet): enough masters answered, but rivals held it on too many
    /// of them). A backend that did not answer in time is [`is_backend`](Self::is_backend)
    /// instead. A lock held in a key layout this version does not speak
    /// ([`HeldInForeignLayout`](LockError::HeldInForeignLayout)) is busy too.
    pub fn is_busy(&self) -> bool {
        match self {
            Self::Busy { .. } | Self::HeldInForeignLayout { .. } => true,
            Self::Masters(err) => err.is_busy(),
            _ => false,
        }
    }

    /// The old name of [`is_busy`](Self::is_busy), which says what it means: the lock was held
    /// by another, not that something timed out.
    #[deprecated(note = "renamed `is_busy`")]
    pub fn is_timeout(&self) -> bool {
        self.is_busy()
    }

    /// The lock was lost while held.
    pub fn is_lost(&self) -> bool {
        matches!(self, Self::Lost { .. })
    }

    /// The backend could not be reached or failed (on a [`MasterSet`](crate::MasterSet): too
    /// many masters failed for the rest to make the count).
    pub fn is_backend(&self) -> bool {
        match self {
            Self::Backend(_) => true,
            Self::Masters(err) => !err.is_busy(),
            _ => false,
        }
    }

    /// The name was rejected.
    pub fn is_invalid_name(&self) -> bool {
        matches!(self, Self::InvalidName(_))
    }

    /// The configuration was rejected.
    pub fn is_config(&self) -> bool {
        matches!(self, Self::Config(_))
    }

    /// When a retry is likely to find the lock free, for [`Busy`](LockError::Busy).
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::Busy { retry_after, .. } => *retry_after,
            _ => None,
        }
    }
}

impl From<LockError> for std::io::Error {
    /// For functions that return `std::io::Result`: busy is `ResourceBusy`, an invalid name is
    /// `InvalidInput`, an unreachable backend is `NotConnected`, anything else `Other`.
    fn from(err: LockError) -> Self {
        let kind = match &err {
            LockError::Busy { .. } | LockError::HeldInForeignLayout { .. } => {
                std::io::ErrorKind::ResourceBusy
            }
            LockError::InvalidName(_) => std::io::ErrorKind::InvalidInput,
            LockError::Backend(_) => std::io::ErrorKind::NotConnected,
            LockError::Masters(m) if m.is_busy() => std::io::ErrorKind::ResourceBusy,
            LockError::Masters(_) => std::io::ErrorKind::NotConnected,
            _ => std::io::ErrorKind::Other,
        };
        std::io::Error::new(kind, err)
    }
}

/// Why a lock name was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum InvalidName {
    /// The name is empty.
    #[error("the name is empty")]
    Empty,
    /// The name holds a control character.
    #[error("control character at byte {index}")]
    ControlCharacter {
        /// Byte offset in the (escaped) name.
        index: usize,
    },
    /// Literal text holds a character reserved for the hash tag.
    #[error("`{ch}` is reserved in literal text (values are escaped)")]
    ReservedCharacter {
        /// The character.
        ch: char,
    },
    /// The escaped name is longer than the limit.
    #[error("{len} bytes is longer than the limit of {max}")]
    TooLong {
        /// The escaped length.
        len: usize,
        /// The limit, [`MAX_NAME_LEN`](crate::MAX_NAME_LEN).
        max: usize,
    },
}

/// The backend failed: Redis unreachable, timed out, or an error reply.
#[derive(Debug, Clone)]
pub struct BackendError {
    kind: BackendErrorKind,
    /// Retrying can't help: the one connection the `Locker` was given is gone.
    permanent: bool,
}

#[derive(Debug, Clone)]
enum BackendErrorKind {
    Timeout(Duration),
    Redis(redis::RedisError),
    #[cfg_attr(not(any(feature = "bb8", feature = "deadpool")), allow(dead_code))]
    Pool(String),
    Protocol(String),
    /// PostgreSQL refused, failed or could not be reached (what sqlx said of it).
    #[cfg(feature = "postgres")]
    Postgres(String),
    /// The backend does not offer this kind of lock (a fair lock on PostgreSQL).
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    Unsupported {
        kind: &'static str,
        backend: &'static str,
    },
    /// Fewer replicas than required acknowledged a write in time (see [`crate::ReplicaAck`]).
    NotReplicated {
        acknowledged: u32,
        required: u32,
        within: Duration,
    },
}

impl BackendError {
    pub(crate) fn timeout(after: Duration) -> Self {
        Self {
            kind: BackendErrorKind::Timeout(after),
            permanent: false,
        }
    }

    pub(crate) fn redis(err: redis::RedisError) -> Self {
        Self {
            kind: BackendErrorKind::Redis(err),
            permanent: false,
        }
    }

    #[cfg_attr(not(any(feature = "bb8", feature = "deadpool")), allow(dead_code))]
    pub(crate) fn pool(msg: impl fmt::Display) -> Self {
        Self {
            kind: BackendErrorKind::Pool(msg.to_string()),
            permanent: false,
        }
    }

    pub(crate) fn protocol(msg: impl fmt::Display) -> Self {
        Self {
            kind: BackendErrorKind::Protocol(msg.to_string()),
            permanent: false,
        }
    }

    /// What sqlx said of a PostgreSQL failure. Its messages name what failed (a refused
    /// connection, a server error and its code), never the connection's password.
    #[cfg(feature = "postgres")]
    pub(crate) fn postgres(err: &sqlx::Error) -> Self {
        let message = match err {
            sqlx::Error::Database(db) => match db.code() {
                Some(code) => format!("{} (SQLSTATE {code})", db.message()),
                None => db.message().to_owned(),
            },
            other => other.to_string(),
        };
        Self {
            kind: BackendErrorKind::Postgres(message),
            permanent: false,
        }
    }

    /// `backend` does not offer locks of `kind` (its label): retrying can't help.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) fn unsupported(kind: &'static str, backend: &'static str) -> Self {
        Self {
            kind: BackendErrorKind::Unsupported { kind, backend },
            permanent: true,
        }
    }

    pub(crate) fn not_replicated(acknowledged: u32, required: u32, within: Duration) -> Self {
        Self {
            kind: BackendErrorKind::NotReplicated {
                acknowledged,
                required,
                within,
            },
            permanent: false,
        }
    }

    /// Marks the error as one that retrying can't cure.
    pub(crate) fn permanent(mut self) -> Self {
        self.permanent = true;
        self
    }

    /// Retrying can't help: the `Locker` runs over one multiplexed connection
    /// ([`LockerBuilder::multiplexed`](crate::LockerBuilder::multiplexed)), which is not
    /// reconnected, and that connection is gone. A waiter gives up at once on such an error
    /// instead of retrying until its deadline.
    pub fn is_permanent(&self) -> bool {
        self.permanent
    }

    /// A cluster node answered `TRYAGAIN`: the command named keys of a slot on its way to
    /// another master, some on each side.
    #[cfg_attr(not(feature = "cluster"), allow(dead_code))]
    pub(crate) fn is_migrating(&self) -> bool {
        matches!(&self.kind, BackendErrorKind::Redis(e)
            if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::TryAgain))
    }

    /// The command did not complete within the configured timeout.
    pub fn is_timeout(&self) -> bool {
        match &self.kind {
            BackendErrorKind::Timeout(_) => true,
            BackendErrorKind::Redis(e) => e.is_timeout(),
            _ => false,
        }
    }

    /// Fewer replicas than the `Locker`'s [`ReplicaAck`](crate::ReplicaAck) asks for
    /// acknowledged the write in time (the write was rolled back if it was a grant).
    pub fn is_not_replicated(&self) -> bool {
        matches!(self.kind, BackendErrorKind::NotReplicated { .. })
    }

    /// For a write that was [not replicated](Self::is_not_replicated): how many replicas
    /// acknowledged it, and how many were required.
    pub fn acknowledgements(&self) -> Option<(u32, u32)> {
        match self.kind {
            BackendErrorKind::NotReplicated {
                acknowledged,
                required,
                ..
            } => Some((acknowledged, required)),
            _ => None,
        }
    }

    /// The underlying Redis error, if there is one.
    pub fn redis_error(&self) -> Option<&redis::RedisError> {
        match &self.kind {
            BackendErrorKind::Redis(e) => Some(e),
            _ => None,
        }
    }
}

impl fmt::Display for BackendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            BackendErrorKind::Timeout(d) => write!(f, "no answer from the backend within {d:?}"),
            #[cfg(feature = "postgres")]
            BackendErrorKind::Postgres(m) => write!(f, "postgres: {m}"),
            BackendErrorKind::Redis(e) => write!(f, "{e}"),
            BackendErrorKind::Pool(m) => write!(f, "connection pool: {m}"),
            BackendErrorKind::Protocol(m) => write!(f, "unexpected reply: {m}"),
            BackendErrorKind::Unsupported { kind, backend } => {
                write!(f, "a {backend} `Locker` does not offer `{kind}` locks")
            }
            BackendErrorKind::NotReplicated {
                acknowledged,
                required,
                within,
            } => write!(
                f,
                "{acknowledged} of {required} replicas acknowledged the write within {within:?}"
            ),
        }
    }
}

impl std::error::Error for BackendError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.kind {
            BackendErrorKind::Redis(e) => Some(e),
            _ => None,
        }
    }
}

impl From<redis::RedisError> for BackendError {
    fn from(err: redis::RedisError) -> Self {
        Self::redis(err)
    }
}

/// What [`LockGuard::release`](crate::LockGuard::release) found.
#[derive(Debug)]
#[must_use = "a failed release may mean the lock was lost while held"]
#[non_exhaustive]
pub enum ReleaseOutcome {
    /// The guard held the lock until it let go: the lock was released, or this guard re-entered
    /// a hold and counted itself out (the enclosing guard still holds it). Also when the release
    /// reached Redis only after the lease could have run out by itself, having been sent while
    /// it still ran: nothing was unprotected.
    Released,
    /// The lock was gone before the guard let go: it expired, or was deleted, while the guard
    /// still counted on it. The work it guarded ran, at least in part, unprotected.
    Expired,
    /// Another owner held the lock before the guard let go: this hold was lost and someone else
    /// acquired it. A safety incident worth logging; the fencing token is what protects the
    /// resource.
    TakenOver,
    /// The backend could not be reached; the lock will expire at the end of its lease. A guard
    /// whose hold was lost before it let go (as [`lost`](crate::LockGuard::lost) said) reports
    /// that loss instead, `Expired` or `TakenOver`, whether Redis answered the release or not.
    Unreachable(LockError),
}

impl ReleaseOutcome {
    /// The lock was released as expected.
    pub fn is_released(&self) -> bool {
        matches!(self, Self::Released)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn busy_is_not_a_timeout_of_the_backend() {
        let busy = LockError::Busy {
            name: "a".to_owned(),
            waited: Duration::from_millis(5),
            retry_after: Some(Duration::from_secs(1)),
        };
        assert!(busy.is_busy() && !busy.is_backend());
        assert_eq!(busy.retry_after(), Some(Duration::from_secs(1)));
        assert_eq!(
            std::io::Error::from(busy).kind(),
            std::io::ErrorKind::ResourceBusy
        );

        let slow = LockError::Backend(BackendError::timeout(Duration::from_millis(5)));
        assert!(slow.is_backend() && !slow.is_busy());
        assert_eq!(
            std::io::Error::from(slow).kind(),
            std::io::ErrorKind::NotConnected
        );
        let name = LockError::InvalidName(InvalidName::Empty);
        assert_eq!(
            std::io::Error::from(name).kind(),
            std::io::ErrorKind::InvalidInput
        );
    }
}
