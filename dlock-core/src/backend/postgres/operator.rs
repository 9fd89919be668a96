//! What the PostgreSQL backend tells operators: who holds a name (`inspect`), and the end of
//! the sessions that do (`force_release`).

use super::PgBackend;
use super::keys::advisory_key;
use super::sessions::gone;
use crate::backend::RawInfo;
use crate::error::BackendError;
use crate::name::NameKeys;

/// The sessions that hold the advisory key `$1` (split as `pg_locks` shows it: the high and
/// the low 32 bits, each unsigned).
const HOLDERS: &str = "SELECT pid::bigint FROM pg_locks \
                       WHERE locktype = 'advisory' AND objsubid = 1 AND granted \
                       AND classid = (($1 >> 32) & 4294967295)::oid \
                       AND objid = ($1 & 4294967295)::oid";

/// Ends the sessions that hold the advisory key `$1`: the one way to free another session's
/// advisory lock. The session's other locks go with it.
const TERMINATE: &str = "SELECT count(pg_terminate_backend(pid)) FROM pg_locks \
                         WHERE locktype = 'advisory' AND objsubid = 1 AND granted \
                         AND classid = (($1 >> 32) & 4294967295)::oid \
                         AND objid = ($1 & 4294967295)::oid";

impl PgBackend {
    /// What `pg_locks` says of the name's lock: the sessions that hold it, as `pid <n>`, or
    /// this backend's owner when it is this backend's.
    pub(crate) async fn inspect(&self, keys: &NameKeys) -> Result<RawInfo, BackendError> {
        let key = advisory_key(&keys.lock.lock);
        let pids = self.query_any(HOLDERS, key).await?;
        let mut info = RawInfo::default();
        let ours = self.holds().get(&key).cloned();
        for pid in pids {
            info.holders.push((format!("pid {pid}"), None));
        }
        if let Some(held) = ours {
            info.token = Some(held.fence);
            info.kept = held.owner.starts_with("#k:");
        }
        Ok(info)
    }

    /// Ends the sessions that hold the name's lock (see [`TERMINATE`]); how many there were.
    pub(crate) async fn force_release(&self, keys: &NameKeys) -> Result<u64, BackendError> {
        let key = advisory_key(&keys.lock.lock);
        let ended = self.query_any(TERMINATE, key).await?;
        Ok(ended
            .first()
            .copied()
            .map_or(0, |n| u64::try_from(n).unwrap_or(0)))
    }

    /// Runs a query of one `bigint` argument and `bigint` rows on the first connection.
    async fn query_any(&self, sql: &str, key: i64) -> Result<Vec<i64>, BackendError> {
        let mut st = self.conns[0].state.lock().await;
        self.connected(&mut st).await?;
        let conn = st.conn.as_mut().ok_or_else(gone)?;
        let query = sqlx::query_scalar::<_, i64>(sql).bind(key).fetch_all(conn);
        let answer = tokio::time::timeout(self.timeout, query).await;
        self.answered(&mut st, 0, answer)
    }
}
