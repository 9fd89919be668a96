//! What an operator sees of a PostgreSQL database's advisory locks ([`Locker::advisory_locks`]):
//! PostgreSQL keeps a lock as the number made from its name, so this is what stands in for
//! [`Locker::list`] there.

use std::time::Duration;

use super::Locker;
use crate::backend::Backend;
use crate::error::LockError;

/// One advisory lock a PostgreSQL session holds, as `pg_locks` shows it (the one-number form
/// dlock takes: `pg_advisory_lock(bigint)`).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct AdvisoryLock {
    /// The lock's advisory key: for dlock's, a number made from the name (see
    /// [`Locker::advisory_key`]).
    pub key: i64,
    /// Held shared (a read-write lock's reader), not exclusively.
    pub shared: bool,
    /// The holding session's server process id (what `pg_terminate_backend` takes).
    pub pid: i32,
    /// The session's `application_name` (`dlock` for a `Locker`'s sessions).
    pub application: String,
    /// The client's address, if it connected over TCP.
    pub client: Option<String>,
    /// How long the session has been connected.
    pub session_age: Option<Duration>,
}

/// Every advisory lock of the one-number form held now, with its session.
#[cfg(feature = "postgres")]
const ADVISORY_LOCKS: &str = "SELECT (l.classid::bigint << 32) | l.objid::bigint, \
       l.mode = 'ShareLock', l.pid, coalesce(a.application_name, ''), host(a.client_addr), \
       extract(epoch FROM now() - a.backend_start)::float8 \
    FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid \
    WHERE l.locktype = 'advisory' AND l.objsubid = 1 AND l.granted \
    ORDER BY 1, 3";

impl Locker {
    /// Every advisory lock held in a PostgreSQL `Locker`'s database now, by any session, sorted
    /// by key: what `dlock list` shows there. A name can't be listed — PostgreSQL keeps only
    /// the number made from it — but [`advisory_key`](Self::advisory_key) tells which number
    /// is a name's, and [`inspect`](Self::inspect) reads a name you know. On Redis this is a
    /// [`LockError::Config`]: use [`list`](Self::list).
    pub async fn advisory_locks(&self) -> Result<Vec<AdvisoryLock>, LockError> {
        match &self.engine.inner.backend {
            #[cfg(feature = "postgres")]
            Backend::Postgres(p) => (p.rows_of(ADVISORY_LOCKS).await)
                .map(|rows| rows.into_iter().map(to_lock).collect())
                .map_err(LockError::Backend),
            Backend::Redis(_) => Err(LockError::Config(
                "advisory locks are PostgreSQL's: on Redis, `list` names the locks".to_owned(),
            )),
        }
    }

    /// The advisory key a PostgreSQL `Locker` locks for `name`'s plain lock (what
    /// [`advisory_locks`](Self::advisory_locks) shows); `None` on Redis, or for a name that
    /// is not valid.
    pub fn advisory_key(&self, name: impl crate::IntoLockName) -> Option<i64> {
        match &self.engine.inner.backend {
            #[cfg(feature = "postgres")]
            Backend::Postgres(_) => {
                let key = self.key_of(name).ok()?;
                Some(crate::backend::postgres::keys::advisory_key(&key))
            }
            Backend::Redis(_) => {
                let _ = name;
                None
            }
        }
    }
}

/// A row of [`ADVISORY_LOCKS`].
#[cfg(feature = "postgres")]
type Row = (i64, bool, i32, String, Option<String>, Option<f64>);

#[cfg(feature = "postgres")]
fn to_lock((key, shared, pid, application, client, age): Row) -> AdvisoryLock {
    AdvisoryLock {
        key,
        shared,
        pid,
        application,
        client,
        session_age: age.and_then(|s| Duration::try_from_secs_f64(s).ok()),
    }
}
