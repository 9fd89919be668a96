//! The PostgreSQL backend's sessions: the connections its holds live on, made when needed,
//! kept alive at least as long as their holds' leases, and dropped on the first failure (which
//! ends the session, and every hold on it).

use sqlx::Connection as _;
use sqlx::postgres::PgConnection;

use super::{PgBackend, SEQUENCE};
use crate::error::BackendError;

/// One connection holds are kept on.
#[derive(Default)]
pub(super) struct LockConn {
    pub(super) state: tokio::sync::Mutex<ConnState>,
}

#[derive(Default)]
pub(super) struct ConnState {
    pub(super) conn: Option<PgConnection>,
    /// Counts the sessions this connection has been: a hold of an earlier one is gone.
    pub(super) generation: u64,
    /// The session's `idle_session_timeout`, ms (0: not set yet).
    pub(super) idle_ms: u64,
    /// Whether the fencing sequence and the claims' table are known to exist.
    sequence: bool,
}

impl PgBackend {
    /// Connects the key's connection if it is not (a new session), and checks that it answers.
    pub(crate) async fn ping(&self) -> Result<(), BackendError> {
        let mut st = self.conns[0].state.lock().await;
        self.connected(&mut st).await?;
        let conn = st.conn.as_mut().ok_or_else(gone)?;
        let answer = tokio::time::timeout(self.timeout, conn.ping()).await;
        self.answered(&mut st, 0, answer)
    }

    /// `st`'s connection, made now (a new session) if there is none.
    pub(super) async fn connected(&self, st: &mut ConnState) -> Result<(), BackendError> {
        if st.conn.is_none() {
            let connect = PgConnection::connect_with(&self.options);
            let conn = match tokio::time::timeout(self.timeout, connect).await {
                Ok(Ok(conn)) => conn,
                Ok(Err(err)) => return Err(BackendError::postgres(&err)),
                Err(_) => return Err(BackendError::timeout(self.timeout)),
            };
            st.conn = Some(conn);
            st.idle_ms = 0;
        }
        if !st.sequence {
            // The fencing sequence and the claims' table (see `turns`).
            let sequence = format!("CREATE SEQUENCE IF NOT EXISTS {SEQUENCE}");
            let conn = st.conn.as_mut().ok_or_else(gone)?;
            let made = async {
                made_unless_there(sqlx::query(&sequence).execute(&mut *conn).await)?;
                made_unless_there(sqlx::query(super::turns::CREATE).execute(&mut *conn).await)
            };
            let made = tokio::time::timeout(self.timeout, made).await;
            match made {
                Ok(Ok(())) => st.sequence = true,
                Ok(Err(err)) => {
                    let err = BackendError::postgres(&err);
                    self.broke(st, usize::MAX);
                    return Err(err);
                }
                Err(_) => {
                    self.broke(st, usize::MAX);
                    return Err(BackendError::timeout(self.timeout));
                }
            }
        }
        Ok(())
    }

    /// Makes sure the session of `st` (connection `i`) ends no sooner than `lease_ms` after its
    /// last command: raises its `idle_session_timeout` if it is lower.
    pub(super) async fn outlives(
        &self,
        st: &mut ConnState,
        i: usize,
        lease_ms: u64,
    ) -> Result<(), BackendError> {
        if st.idle_ms >= lease_ms {
            return Ok(());
        }
        let conn = st.conn.as_mut().ok_or_else(gone)?;
        let set = format!("SET idle_session_timeout = {lease_ms}");
        let answer = tokio::time::timeout(self.timeout, sqlx::query(&set).execute(conn)).await;
        self.answered(st, i, answer.map(|r| r.map(|_| ())))?;
        st.idle_ms = lease_ms;
        Ok(())
    }

    /// What a query on connection `i` gave; a failure or a timeout ends its session (see
    /// [`broke`](Self::broke)).
    pub(super) fn answered<T>(
        &self,
        st: &mut ConnState,
        i: usize,
        answer: Result<Result<T, sqlx::Error>, tokio::time::error::Elapsed>,
    ) -> Result<T, BackendError> {
        match answer {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(err)) => {
                let failed = BackendError::postgres(&err);
                // An error the server sent over a working session (a missing sequence, a
                // refused right) leaves the session as it was; one it sent as it ended the
                // session (FATAL: `pg_terminate_backend`, a shutdown) does not.
                if !session_goes_on(&err) {
                    self.broke(st, i);
                }
                Err(failed)
            }
            Err(_) => {
                self.broke(st, i);
                Err(BackendError::timeout(self.timeout))
            }
        }
    }

    /// Drops connection `i`'s session: the server ends it (and unlocks its locks) at once, or
    /// when it next reads the closed socket. Its holds are gone from the map, so they are lost
    /// at their next renewal or release.
    pub(super) fn broke(&self, st: &mut ConnState, i: usize) {
        st.conn = None;
        st.idle_ms = 0;
        let ended = st.generation;
        st.generation += 1;
        if i < self.conns.len() {
            self.holds().ended(i, ended);
        }
    }
}

/// Whether the session is still there after `err`: an error the server answered a query with,
/// not one it ended the session with (severity FATAL or PANIC, as for `pg_terminate_backend`)
/// nor a broken connection.
fn session_goes_on(err: &sqlx::Error) -> bool {
    use sqlx::postgres::{PgDatabaseError, PgSeverity};
    let sqlx::Error::Database(db) = err else {
        return false;
    };
    !(db.try_downcast_ref::<PgDatabaseError>())
        .is_some_and(|pg| matches!(pg.severity(), PgSeverity::Fatal | PgSeverity::Panic))
}

/// What a `CREATE … IF NOT EXISTS` gave: made, there already, or made meanwhile by another
/// session (two at once may collide on the catalog's unique keys).
fn made_unless_there(
    made: Result<sqlx::postgres::PgQueryResult, sqlx::Error>,
) -> Result<(), sqlx::Error> {
    match made {
        Ok(_) => Ok(()),
        Err(sqlx::Error::Database(db))
            if matches!(db.code().as_deref(), Some("23505" | "42P07")) =>
        {
            Ok(())
        }
        Err(err) => Err(err),
    }
}

pub(super) fn gone() -> BackendError {
    BackendError::protocol("the postgres connection is gone")
}
