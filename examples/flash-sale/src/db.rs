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
        .acquire_timeout(Duration::from_secs(5))
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
