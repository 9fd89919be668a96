//! A `Locker` on PostgreSQL (feature `postgres`): see `backend::postgres`.

use std::sync::Arc;
use std::time::Duration;

use sqlx::postgres::PgConnectOptions;

use super::url::redact_url;
use super::{Config, Locker};
use crate::backend::Backend;
use crate::backend::postgres::PgBackend;
use crate::error::LockError;

/// Where a PostgreSQL `Locker` connects.
pub(super) enum PgSource {
    Url(String),
    /// An application's pool: the `Locker` connects as it does, on connections of its own.
    Pool(sqlx::PgPool),
}

impl PgSource {
    /// The source as it may be shown (a URL without its password).
    pub(super) fn display(&self) -> String {
        match self {
            Self::Url(url) => redact_url(url),
            Self::Pool(_) => "postgres (sqlx pool)".to_owned(),
        }
    }
}

/// Builds a `Locker` on `source`; unless `lazy`, it connects once first, so a wrong address or
/// password fails here.
pub(super) async fn locker(
    source: PgSource,
    lazy: bool,
    config: Config,
    command_timeout: Duration,
) -> Result<Locker, LockError> {
    let display = source.display();
    let options = match source {
        PgSource::Url(url) => url.parse::<PgConnectOptions>().map_err(|err| {
            // sqlx's reason names the part that is wrong, not the URL.
            LockError::Config(format!("bad postgres url `{display}`: {err}"))
        })?,
        PgSource::Pool(pool) => (*pool.connect_options()).clone(),
    };
    let backend = Arc::new(PgBackend::new(options, command_timeout));
    if !lazy {
        backend.ping().await.map_err(LockError::Backend)?;
    }
    Ok(Locker::from_parts(
        Backend::Postgres(backend),
        config,
        display,
    ))
}
