//! One shop instance as a process: `[--port N] [--no-locks]`, with `REDIS_URL` (default
//! `redis://127.0.0.1:6379/`) and `DATABASE_URL` (default: a SQLite file `flash-sale.db` in the
//! current directory; `postgres://…` for PostgreSQL).

use std::time::Duration;

use dlock_core::Locker;

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
pub const USAGE: &str = "[--port N] [--no-locks]   (env: REDIS_URL, DATABASE_URL)";

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

/// Connects to Redis and the database (creating the tables), then serves until the process
/// ends.
pub async fn serve(config: ServerConfig) -> Result<(), String> {
    let locker = Locker::builder()
        .url(config.redis_url.as_str())
        .command_timeout(Duration::from_secs(2))
        .build()
        .await
        .map_err(|e| format!("cannot reach Redis at {}: {e}", config.redis_url))?;
    let app = crate::app(&config.database_url, locker, config.locks)
        .await
        .map_err(|e| format!("database {}: {e}", config.database_url))?;
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", config.port))
        .await
        .map_err(|e| format!("cannot listen on port {}: {e}", config.port))?;
    println!(
        "flash-sale: listening on http://127.0.0.1:{}/ (locks {})",
        config.port,
        if config.locks { "on" } else { "off" }
    );
    axum::serve(listener, crate::router(app))
        .await
        .map_err(|e| format!("server: {e}"))
}
