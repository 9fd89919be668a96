//! One shop instance as a process: `[--port N] [--no-locks]`, with `REDIS_URL` (default
//! `redis://127.0.0.1:6379/`) and `DATABASE_URL` (default: a SQLite file `flash-sale.db` in the
//! current directory; `postgres://…` for PostgreSQL).
//!
//! The instance starts whether or not Redis is up: its `Locker` runs over a connection manager
//! that connects on first use and reconnects by itself ([`locker`]). Until Redis answers, the
//! locked routes answer 503 and `/readyz` says so; everything else works. The database must be
//! there at start: the instance brings its schema up to date before it serves.

use std::time::Duration;

use dlock_core::Locker;

use crate::routes::LOCK_WAIT;

/// How to run one instance.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// The loopback port to listen on.
    pub port: u16,
    /// Whether the locks are on.
    pub locks: bool,
    /// Redis.
    pub redis_url: String,
    /// The database.
    pub database_url: String,
}

/// The instance's command line.
pub const USAGE: &str =
    "[--port N] [--no-locks]   (env: REDIS_URL, DATABASE_URL, RUST_LOG, LOG_FORMAT=json)";

/// The bound on each Redis command and on connecting.
pub const REDIS_TIMEOUT: Duration = Duration::from_secs(2);

impl ServerConfig {
    /// Reads the arguments (after the program name) and the environment; `None` for `--help`.
    pub fn from_args(args: impl IntoIterator<Item = String>) -> Result<Option<Self>, String> {
        let mut config = ServerConfig {
            port: 8080,
            locks: true,
            redis_url: std::env::var("REDIS_URL")
                .unwrap_or_else(|_| "redis://127.0.0.1:6379/".to_owned()),
            database_url: std::env::var("DATABASE_URL")
                .unwrap_or_else(|_| "sqlite://flash-sale.db?mode=rwc".to_owned()),
        };
        let mut args = args.into_iter();
        while let Some(arg) = args.next() {
            match arg.as_str() {
                "--port" => {
                    config.port = args
                        .next()
                        .and_then(|p| p.parse().ok())
                        .ok_or("--port needs a number")?;
                }
                "--no-locks" => config.locks = false,
                "--help" | "-h" => return Ok(None),
                other => return Err(format!("unknown argument `{other}`; usage: {USAGE}")),
            }
        }
        Ok(Some(config))
    }
}

/// A `Locker` for `redis_url` that does not need Redis up to be built: `connect_lazily` opens
/// the connection at the first command and again after a failure, so the shop starts while
/// Redis is down and its locked routes answer 503 until Redis is back.
pub async fn locker(redis_url: &str) -> Result<Locker, String> {
    Locker::builder()
        .url(redis_url)
        .connect_lazily(true)
        .connect_timeout(REDIS_TIMEOUT)
        .command_timeout(REDIS_TIMEOUT)
        .default_wait(LOCK_WAIT)
        .build()
        .await
        .map_err(|e| format!("Locker: {e}"))
}

/// Builds the instance (schema brought up to date), then serves until the process gets Ctrl-C
/// or `SIGTERM`, letting requests in flight finish.
pub async fn serve(config: ServerConfig) -> Result<(), String> {
    crate::telemetry::init();
    let locker = locker(&config.redis_url).await?;
    let app = crate::app(&config.database_url, locker, config.locks)
        .await
        .map_err(|e| format!("database: {e}"))?;
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", config.port))
        .await
        .map_err(|e| format!("cannot listen on port {}: {e}", config.port))?;
    tracing::info!(
        url = %format!("http://127.0.0.1:{}/", config.port),
        locks = config.locks,
        instance = app.counters.instance(),
        "flash-sale: listening"
    );
    axum::serve(listener, crate::router(app))
        .with_graceful_shutdown(shutdown())
        .await
        .map_err(|e| format!("server: {e}"))
}

async fn shutdown() {
    let interrupt = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(term) => term,
                Err(_) => {
                    let _ = interrupt.await;
                    return;
                }
            };
        tokio::select! {
            _ = interrupt => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = interrupt.await;
    tracing::info!("flash-sale: shutting down");
}
