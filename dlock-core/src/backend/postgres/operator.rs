//! What the PostgreSQL backend tells operators: who holds a name (`inspect`), and the end of
//! the sessions that do (`force_release`).

use super::PgBackend;
use super::keys::advisory_key;
use super::sessions::gone;
use super::shared::first_slot;
use crate::backend::RawInfo;
use crate::error::BackendError;
use crate::name::NameKeys;

/// What picks the sessions that hold the advisory key `$1` (split as `pg_locks` shows it: the
/// high and the low 32 bits, each unsigned).
macro_rules! holding {
    () => {
        "locktype = 'advisory' AND objsubid = 1 AND granted \
         AND classid = (($1 >> 32) & 4294967295)::oid \
         AND objid = ($1 & 4294967295)::oid"
    };
}

/// The sessions that hold the advisory key `$1`, in any mode.
const HOLDERS: &str = concat!("SELECT pid::bigint FROM pg_locks WHERE ", holding!());

/// The sessions that hold `$1` shared: a read-write lock's readers.
const SHARING: &str = concat!(
    "SELECT pid::bigint FROM pg_locks WHERE mode = 'ShareLock' AND ",
    holding!()
);

/// Ends the sessions that hold any of the advisory keys `$1`, or a permit slot of the block
/// that `$2` begins: the one way to free another session's advisory lock. The session's other
/// locks go with it.
const TERMINATE: &str = "SELECT count(pg_terminate_backend(pid)) FROM ( \
                           SELECT DISTINCT pid FROM pg_locks \
                           WHERE locktype = 'advisory' AND objsubid = 1 AND granted AND ( \
                             ((classid::bigint << 32) | objid::bigint) = ANY($1) \
                             OR (classid = (($2 >> 32) & 4294967295)::oid \
                                 AND (objid::bigint >> 16) = (($2 >> 16) & 65535)))) holders";

impl PgBackend {
    /// What `pg_locks` says of the name: the sessions that hold its lock (as `pid <n>`) and its
    /// read-write lock's writer, how many sessions read, how many of its semaphore's permits
    /// are held; and, of this backend's own holds, the lock's fencing token and whether an
    /// `at_least` release keeps it.
    pub(crate) async fn inspect(&self, keys: &NameKeys) -> Result<RawInfo, BackendError> {
        let key = advisory_key(&keys.lock.lock);
        let mut info = RawInfo::default();
        for pid in self.query_any(HOLDERS, key).await? {
            info.holders.push((format!("pid {pid}"), None));
        }
        if let Some(held) = self.holds().first(key) {
            info.token = Some(held.fence);
            info.kept = held.owner.starts_with("#k:");
        }
        let writer = advisory_key(&keys.rw.write);
        let sharing = self.query_any(SHARING, writer).await?;
        let holders = self.query_any(HOLDERS, writer).await?;
        info.readers = u64::try_from(sharing.len()).unwrap_or(u64::MAX);
        info.writer = (holders.iter().find(|pid| !sharing.contains(pid)))
            .map(|pid| (format!("pid {pid}"), None));
        let slots = first_slot(advisory_key(&keys.permits));
        info.permits = u64::from(self.slots_held(slots).await?);
        Ok(info)
    }

    /// Ends the sessions that hold anything of the name: its lock, its read-write lock (or
    /// its gate), its semaphore's permits (see [`TERMINATE`]); how many there were.
    pub(crate) async fn force_release(&self, keys: &NameKeys) -> Result<u64, BackendError> {
        let held: Vec<i64> = [&keys.lock.lock, &keys.rw.write, &keys.rw.waiting]
            .into_iter()
            .map(|k| advisory_key(k))
            .collect();
        let slots = first_slot(advisory_key(&keys.permits));
        let mut st = self.conns[0].state.lock().await;
        self.connected(&mut st).await?;
        let conn = st.conn.as_mut().ok_or_else(gone)?;
        let query = (sqlx::query_scalar::<_, i64>(TERMINATE)
            .bind(held)
            .bind(slots))
        .fetch_one(conn);
        let answer = tokio::time::timeout(self.timeout, query).await;
        let ended = self.answered(&mut st, 0, answer)?;
        Ok(u64::try_from(ended).unwrap_or(0))
    }

    /// Runs a query of one `bigint` argument and `bigint` rows on the first connection.
    pub(super) async fn query_any(&self, sql: &str, key: i64) -> Result<Vec<i64>, BackendError> {
        let mut st = self.conns[0].state.lock().await;
        self.connected(&mut st).await?;
        let conn = st.conn.as_mut().ok_or_else(gone)?;
        let query = sqlx::query_scalar::<_, i64>(sql).bind(key).fetch_all(conn);
        let answer = tokio::time::timeout(self.timeout, query).await;
        self.answered(&mut st, 0, answer)
    }

    /// Runs a query of no argument on the first connection: its rows.
    pub(crate) async fn rows_of<T>(&self, sql: &'static str) -> Result<Vec<T>, BackendError>
    where
        T: for<'r> sqlx::FromRow<'r, sqlx::postgres::PgRow> + Send + Unpin,
    {
        let mut st = self.conns[0].state.lock().await;
        self.connected(&mut st).await?;
        let conn = st.conn.as_mut().ok_or_else(gone)?;
        let query = sqlx::query_as::<_, T>(sql).fetch_all(conn);
        let answer = tokio::time::timeout(self.timeout, query).await;
        self.answered(&mut st, 0, answer)
    }
}
