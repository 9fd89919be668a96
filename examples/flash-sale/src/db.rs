//! The database: SQLite by default, PostgreSQL when the URL says so, through `sqlx`'s `Any`
//! driver. The SQL is written once, with `$n` parameters both accept. The schema comes from the
//! migrations under `migrations/` (one folder per database), applied at start-up.
//!
//! Replicas that start together migrate safely: on PostgreSQL, sqlx holds an advisory lock
//! while it migrates, so one applies and the others find the work done. SQLite has no such
//! lock; there a migration is one transaction, and an instance that loses the race (its
//! transaction fails, or finds the version already recorded) tries again and finds the work
//! done.

use std::time::Duration;

use sqlx::any::AnyPoolOptions;
use sqlx::migrate::Migrator;
use sqlx::{AnyPool, Executor as _};

/// An error talking to the database.
pub type DbError = sqlx::Error;

static SQLITE: Migrator = sqlx::migrate!("migrations/sqlite");
static POSTGRES: Migrator = sqlx::migrate!("migrations/postgres");

/// How long a request waits for a database connection (opening one included) before it is
/// answered 503. Under a burst the shop's own requests queue for connections for a second or
/// two (SQLite takes one writer at a time), so this is not how an outage is noticed: the
/// [`Watch`] is.
pub const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(5);

/// How often the [`Watch`] asks the database, and how long it waits for an answer.
pub const WATCH_EVERY: Duration = Duration::from_millis(500);
/// How long the [`Watch`] waits for the database to answer before it calls it down.
pub const WATCH_TIMEOUT: Duration = Duration::from_secs(1);

/// Whether the database answers, asked every [`WATCH_EVERY`] on a connection of its own (not
/// one of the pool's, which a busy shop may all have in use): down when it can't connect or the
/// ping fails or takes longer than [`WATCH_TIMEOUT`]. Requests that need the database are
/// answered 503 while it is down, and those already waiting are answered 503 as soon as it goes
/// down ([`crate::routes`]), so an outage is a 503 within about 2 s, not a 500 after the pool's
/// wait. A SQLite file is never down: there is no server to lose.
#[derive(Debug, Clone)]
pub struct Watch(tokio::sync::watch::Receiver<bool>);

impl Watch {
    /// Starts watching the database at `url` on the current runtime; the task ends when the
    /// last `Watch` is dropped.
    pub fn start(url: &str) -> Self {
        let (tx, rx) = tokio::sync::watch::channel(false);
        if !is_sqlite(url) {
            tokio::spawn(watch(url.to_owned(), tx));
        }
        Self(rx)
    }

    /// Whether the database was down at the last look.
    pub fn is_down(&self) -> bool {
        *self.0.borrow()
    }

    /// Resolves when the database is (or goes) down.
    pub async fn down(&self) {
        let mut rx = self.0.clone();
        if rx.wait_for(|down| *down).await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

async fn watch(url: String, tx: tokio::sync::watch::Sender<bool>) {
    use sqlx::Connection as _;
    let mut connection: Option<sqlx::AnyConnection> = None;
    loop {
        let answered = tokio::time::timeout(WATCH_TIMEOUT, async {
            if connection.is_none() {
                connection = Some(sqlx::AnyConnection::connect(&url).await?);
            }
            match connection.as_mut() {
                Some(connection) => connection.ping().await,
                None => Ok(()),
            }
        })
        .await;
        let down = !matches!(answered, Ok(Ok(())));
        if down {
            // A broken or half-made connection is not asked again: the next look opens anew.
            connection = None;
        }
        let changed = tx.send_if_modified(|was| std::mem::replace(was, down) != down);
        if changed && down {
            match answered {
                Ok(Err(err)) => tracing::error!(error = %err, "the database is down"),
                _ => tracing::error!("the database is down: no answer within 1 s"),
            }
        } else if changed {
            tracing::info!("the database answers again");
        }
        if tx.is_closed() {
            return;
        }
        tokio::time::sleep(WATCH_EVERY).await;
    }
}

/// How many times an instance that lost a migration race on SQLite looks again.
const MIGRATION_TRIES: u32 = 20;

/// Whether `url` is a SQLite database.
pub fn is_sqlite(url: &str) -> bool {
    url.starts_with("sqlite:")
}

/// Opens the pool and brings the schema up to date.
///
/// `sqlite://path?mode=rwc` (the default of the server) or `postgres://user@host/db`.
pub async fn connect(url: &str) -> Result<AnyPool, DbError> {
    sqlx::any::install_default_drivers();
    let sqlite = is_sqlite(url);
    let mut tries = 0;
    let pool = loop {
        tries += 1;
        match open(url, sqlite).await {
            // Instances starting together on a new SQLite file: opening it can meet another
            // one switching its journal, which SQLite answers at once with "database is locked".
            Err(err) if sqlite && busy(&err) && tries < MIGRATION_TRIES => {
                tracing::debug!(error = %err, tries, "opening raced another instance; again");
                tokio::time::sleep(Duration::from_millis(50 * u64::from(tries))).await;
            }
            other => break other?,
        }
    };
    migrate(&pool, sqlite).await?;
    Ok(pool)
}

/// Whether `err` says the database can't be reached or can't serve now, rather than that the
/// request or the shop is wrong: no connection in time, the connection broke, the server is
/// shutting down or refusing connections (PostgreSQL's classes 08 and 57P), SQLite busy or
/// locked past its wait. Answered 503; anything else is a 500.
pub fn unavailable(err: &DbError) -> bool {
    match err {
        DbError::PoolTimedOut
        | DbError::PoolClosed
        | DbError::Io(_)
        | DbError::Tls(_)
        | DbError::WorkerCrashed => true,
        DbError::Database(db) => db.code().is_some_and(|code| {
            code.starts_with("08")
                || code.starts_with("57P")
                || code
                    .parse::<i32>()
                    .is_ok_and(|code| matches!(code & 0xff, 5 | 6))
        }),
        _ => false,
    }
}

/// SQLite's "database is locked" (`SQLITE_BUSY`, code 5, or one of its extended codes).
fn busy(err: &DbError) -> bool {
    err.as_database_error()
        .and_then(|e| e.code())
        .and_then(|code| code.parse::<i32>().ok())
        .is_some_and(|code| code & 0xff == 5)
}

/// Opens the pool (and, on SQLite, the write-ahead log).
async fn open(url: &str, sqlite: bool) -> Result<AnyPool, DbError> {
    let pool = AnyPoolOptions::new()
        .max_connections(if sqlite { 4 } else { 16 })
        .acquire_timeout(ACQUIRE_TIMEOUT)
        .after_connect(|conn, _| {
            Box::pin(async move {
                if conn.backend_name().eq_ignore_ascii_case("sqlite") {
                    // Several app processes share one file: a busy writer is waited for rather
                    // than failed, and WAL commits need no fsync each.
                    conn.execute("PRAGMA busy_timeout = 10000; PRAGMA synchronous = NORMAL")
                        .await?;
                }
                Ok(())
            })
        })
        .connect(url)
        .await?;
    if sqlite {
        // Readers don't block the writer. Persistent in the file; the first instance sets it.
        sqlx::query("PRAGMA journal_mode = WAL")
            .execute(&pool)
            .await?;
    }
    Ok(pool)
}

async fn migrate(pool: &AnyPool, sqlite: bool) -> Result<(), DbError> {
    let migrator = if sqlite { &SQLITE } else { &POSTGRES };
    let mut tries = 0;
    loop {
        tries += 1;
        match migrator.run(pool).await {
            Ok(()) => return Ok(()),
            // PostgreSQL serializes migrations itself: an error there is a real one.
            Err(err) if !sqlite || tries >= MIGRATION_TRIES => {
                return Err(DbError::Migrate(Box::new(err)));
            }
            Err(err) => {
                tracing::debug!(error = %err, tries, "migration raced another instance; again");
                tokio::time::sleep(Duration::from_millis(50 * u64::from(tries))).await;
            }
        }
    }
}
