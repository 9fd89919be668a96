//! One shop instance as a process: `[--port N] [--no-locks]`, with Redis at `REDIS_URL` (default
//! `redis://127.0.0.1:6379/`) or a Redis Cluster at `REDIS_CLUSTER_URLS` (its seed nodes' URLs,
//! comma-separated: `redis://127.0.0.1:7000/,redis://127.0.0.1:7001/`; one reachable node is
//! enough, the client finds the others), and `DATABASE_URL` (default: a SQLite file
//! `flash-sale.db` in the current directory; `postgres://…` for PostgreSQL). Setting both Redis
//! variables is an error.
//!
//! The instance starts whether or not Redis (or the cluster) is up: its `Locker` connects on
//! first use and reconnects by itself ([`locker`], [`cluster_locker`]). Until Redis answers, the
//! locked routes answer 503 and `/readyz` says so; everything else works. On a cluster it follows
//! resharding and failovers once connected. The database must be there at start: the instance brings its schema
//! up to date before it serves.

use std::time::Duration;

use dlock_core::Locker;

use crate::routes::LOCK_WAIT;

/// The environment variable with the URL of one Redis server.
pub const REDIS_URL_ENV: &str = "REDIS_URL";

/// The environment variable with a Redis Cluster's seed URLs, comma-separated.
pub const REDIS_CLUSTER_URLS_ENV: &str = "REDIS_CLUSTER_URLS";

/// The Redis of `REDIS_URL` when neither variable is set.
pub const DEFAULT_REDIS_URL: &str = "redis://127.0.0.1:6379/";

/// Where an instance's locks live.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RedisTarget {
    /// One Redis server, by URL (`REDIS_URL`).
    Server(String),
    /// A Redis Cluster, by its seed nodes' URLs (`REDIS_CLUSTER_URLS`).
    Cluster(Vec<String>),
}

impl RedisTarget {
    /// From the environment: `REDIS_CLUSTER_URLS` or `REDIS_URL` (not both), else
    /// [`DEFAULT_REDIS_URL`].
    pub fn from_env() -> Result<Self, String> {
        Self::from_vars(
            std::env::var(REDIS_URL_ENV).ok(),
            std::env::var(REDIS_CLUSTER_URLS_ENV).ok(),
        )
    }

    /// From the values of `REDIS_URL` and `REDIS_CLUSTER_URLS` (an empty value counts as unset).
    pub fn from_vars(url: Option<String>, cluster: Option<String>) -> Result<Self, String> {
        let url = url.filter(|u| !u.trim().is_empty());
        let cluster = cluster.filter(|c| !c.trim().is_empty());
        match (url, cluster) {
            (Some(_), Some(_)) => Err(format!(
                "both {REDIS_URL_ENV} and {REDIS_CLUSTER_URLS_ENV} are set: set one \
                 ({REDIS_URL_ENV} for one server, {REDIS_CLUSTER_URLS_ENV} for a cluster)"
            )),
            (Some(url), None) => Ok(Self::Server(url.trim().to_owned())),
            (None, Some(urls)) => Self::cluster_from(&urls),
            (None, None) => Ok(Self::Server(DEFAULT_REDIS_URL.to_owned())),
        }
    }

    /// A cluster from a comma-separated list of seed URLs (`redis://` or `rediss://`).
    fn cluster_from(list: &str) -> Result<Self, String> {
        let urls: Vec<String> = list
            .split(',')
            .map(str::trim)
            .filter(|u| !u.is_empty())
            .map(str::to_owned)
            .collect();
        if urls.is_empty() {
            return Err(format!(
                "{REDIS_CLUSTER_URLS_ENV} names no URL; give the seed nodes' URLs, \
                 comma-separated: redis://127.0.0.1:7000/,redis://127.0.0.1:7001/"
            ));
        }
        if let Some(bad) = urls
            .iter()
            .find(|u| !(u.starts_with("redis://") || u.starts_with("rediss://")))
        {
            return Err(format!(
                "{REDIS_CLUSTER_URLS_ENV}: `{}` is not a redis:// or rediss:// URL",
                shown(bad)
            ));
        }
        Ok(Self::Cluster(urls))
    }

    /// What it is, for people: "one Redis" or "one Redis Cluster".
    pub fn describe(&self) -> &'static str {
        match self {
            Self::Server(_) => "one Redis",
            Self::Cluster(_) => "one Redis Cluster",
        }
    }
}

/// `entry` as it may be shown in an error: without what could be a password (anything before
/// an `@`).
fn shown(entry: &str) -> String {
    match entry.rsplit_once('@') {
        Some((_, host)) => format!("…@{host}"),
        None => entry.to_owned(),
    }
}

/// How to run one instance.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// The loopback port to listen on.
    pub port: u16,
    /// Whether the locks are on.
    pub locks: bool,
    /// Redis: one server or a cluster.
    pub redis: RedisTarget,
    /// The database.
    pub database_url: String,
    /// Buyers of one voucher let into the order path at once, across instances.
    pub buyers_per_voucher: u32,
}

/// The instance's command line.
pub const USAGE: &str = "[--port N] [--no-locks] [--buyers-per-voucher N]   (env: REDIS_URL, or REDIS_CLUSTER_URLS=\
redis://127.0.0.1:7000/,redis://127.0.0.1:7001/ for a Redis Cluster; DATABASE_URL, RUST_LOG, \
LOG_FORMAT=json)";

/// The bound on each Redis command and on connecting.
pub const REDIS_TIMEOUT: Duration = Duration::from_secs(2);

impl ServerConfig {
    /// Reads the arguments (after the program name) and the environment; `None` for `--help`.
    pub fn from_args(args: impl IntoIterator<Item = String>) -> Result<Option<Self>, String> {
        let mut config = ServerConfig {
            port: 8080,
            locks: true,
            redis: RedisTarget::from_env()?,
            database_url: std::env::var("DATABASE_URL")
                .unwrap_or_else(|_| "sqlite://flash-sale.db?mode=rwc".to_owned()),
            buyers_per_voucher: crate::BUYERS_PER_VOUCHER,
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
                "--buyers-per-voucher" => {
                    config.buyers_per_voucher = args
                        .next()
                        .and_then(|n| n.parse().ok())
                        .filter(|n| *n > 0)
                        .ok_or("--buyers-per-voucher needs a number from 1")?;
                }
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

/// A `Locker` on the Redis Cluster reached through `seed_urls`, built without connecting: the
/// first command fetches the cluster's slot map (and the next one again, if that failed), so the
/// shop starts while the cluster is down. It follows `MOVED`/`ASK` through resharding and
/// failovers, and waiters are woken through sharded pub/sub.
pub async fn cluster_locker(seed_urls: &[String]) -> Result<Locker, String> {
    Locker::builder()
        .cluster(seed_urls)
        .connect_lazily(true)
        .connect_timeout(REDIS_TIMEOUT)
        .command_timeout(REDIS_TIMEOUT)
        .default_wait(LOCK_WAIT)
        .build()
        .await
        .map_err(|e| format!("Locker on the Redis Cluster: {e}"))
}

/// The `Locker` for `redis`: [`locker`] or [`cluster_locker`].
pub async fn locker_for(redis: &RedisTarget) -> Result<Locker, String> {
    match redis {
        RedisTarget::Server(url) => locker(url).await,
        RedisTarget::Cluster(urls) => cluster_locker(urls).await,
    }
}

/// Builds the instance (schema brought up to date), then serves until the process gets Ctrl-C
/// or `SIGTERM`, letting requests in flight finish.
pub async fn serve(config: ServerConfig) -> Result<(), String> {
    crate::telemetry::init();
    let locker = locker_for(&config.redis).await?;
    let mut app = crate::app(&config.database_url, locker, config.locks)
        .await
        .map_err(|e| format!("database: {e}"))?;
    app.buyers_per_voucher = config.buyers_per_voucher;
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

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(url: Option<&str>, cluster: Option<&str>) -> Result<RedisTarget, String> {
        RedisTarget::from_vars(url.map(str::to_owned), cluster.map(str::to_owned))
    }

    #[test]
    fn redis_is_one_server_unless_cluster_urls_are_given() {
        let default = RedisTarget::Server(DEFAULT_REDIS_URL.to_owned());
        assert_eq!(vars(None, None), Ok(default.clone()));
        assert_eq!(vars(Some(""), Some("  ")), Ok(default));
        assert_eq!(
            vars(Some("redis://h:1/"), None),
            Ok(RedisTarget::Server("redis://h:1/".to_owned()))
        );
        assert_eq!(
            vars(None, Some(" redis://a:7000/ ,, rediss://b:7001/,")),
            Ok(RedisTarget::Cluster(vec![
                "redis://a:7000/".to_owned(),
                "rediss://b:7001/".to_owned()
            ]))
        );
    }

    #[test]
    fn ambiguous_or_malformed_redis_settings_are_refused_with_a_reason() {
        let both = vars(Some("redis://h:1/"), Some("redis://a:7000/")).unwrap_err();
        assert!(both.contains("set one"), "{both}");
        let none = vars(None, Some(",")).unwrap_err();
        assert!(none.contains("names no URL"), "{none}");
        let bad = vars(None, Some("redis://a:7000/,http://user:secret@b:80/")).unwrap_err();
        assert!(bad.contains("is not a redis:// or rediss:// URL"), "{bad}");
        assert!(!bad.contains("secret"), "{bad}");
    }
}
