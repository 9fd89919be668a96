//! One shop instance as a process: `[--port N] [--no-locks]`, with its `Locker` configured by
//! dlock's `DLOCK_*` variables (`LockerConfig::from_env`): Redis at `DLOCK_URL` (default
//! `redis://127.0.0.1:6379/`) or a Redis Cluster at `DLOCK_CLUSTER_URLS` (its seed nodes' URLs,
//! comma-separated: `redis://127.0.0.1:7000/,redis://127.0.0.1:7001/`; one reachable node is
//! enough, the client finds the others) — or PostgreSQL, with a `postgres://` URL in
//! `DLOCK_URL` (the locks as advisory locks, in the orders' database if it is the same URL),
//! `DATABASE_URL` (default: a SQLite file
//! `flash-sale.db` in the current directory; `postgres://…` for PostgreSQL),
//! `SHOP_OPERATOR_TOKEN`, the operator's token ([`crate::auth`]; unset, nobody is the operator),
//! and `SHOP_INSTANCE_NAME`, the instance's name in the operator's plots (unset: the address it
//! serves on, `127.0.0.1:8080`; instances on different hosts would all be `127.0.0.1:8080`, so
//! each sets its own, say its host's name). Setting both Redis variables is an error. The shop's own defaults — a 2 s bound on connecting and on each
//! command, a 3 s wait, connecting lazily — apply where the variables say nothing.
//!
//! The instance starts whether or not Redis (or the cluster) is up: its `Locker` connects on
//! first use and reconnects by itself ([`locker`], [`cluster_locker`]). Until Redis answers, the
//! locked routes answer 503 and `/readyz` says so; everything else works. On a cluster it follows
//! resharding and failovers once connected. The database must be there at start: the instance brings its schema
//! up to date before it serves.

use std::time::Duration;

use dlock_core::{Locker, LockerConfig};

use crate::routes::LOCK_WAIT;

/// The environment variable with the URL of one Redis server (dlock's own).
pub const REDIS_URL_ENV: &str = "DLOCK_URL";

/// The environment variable with a Redis Cluster's seed URLs, comma-separated (dlock's own).
pub const REDIS_CLUSTER_URLS_ENV: &str = "DLOCK_CLUSTER_URLS";

/// The Redis of `DLOCK_URL` when neither variable is set.
pub const DEFAULT_REDIS_URL: &str = "redis://127.0.0.1:6379/";

/// Where an instance's locks live.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LockTarget {
    /// One Redis server, by URL (`DLOCK_URL`).
    Server(String),
    /// A Redis Cluster, by its seed nodes' URLs (`DLOCK_CLUSTER_URLS`).
    Cluster(Vec<String>),
    /// A PostgreSQL database, by URL (`DLOCK_URL=postgres://…`).
    Postgres(String),
}

impl LockTarget {
    /// From the environment: `DLOCK_CLUSTER_URLS` or `DLOCK_URL` (not both), else
    /// [`DEFAULT_REDIS_URL`].
    pub fn from_env() -> Result<Self, String> {
        Self::from_config(&LockerConfig::from_env().map_err(|e| e.to_string())?)
    }

    /// From the values of `DLOCK_URL` and `DLOCK_CLUSTER_URLS` (an empty value counts as unset).
    pub fn from_vars(url: Option<String>, cluster: Option<String>) -> Result<Self, String> {
        let config = LockerConfig::from_vars(|name| match name {
            REDIS_URL_ENV => url.clone(),
            REDIS_CLUSTER_URLS_ENV => cluster.clone(),
            _ => None,
        })
        .map_err(|e| e.to_string())?;
        Self::from_config(&config)
    }

    /// The source `config` names: one server or a cluster (not both), else
    /// [`DEFAULT_REDIS_URL`]. Sentinel and independent masters are refused: the shop runs on
    /// one Redis or one Redis Cluster.
    pub fn from_config(config: &LockerConfig) -> Result<Self, String> {
        if !config.sentinels.is_empty() || !config.masters.is_empty() {
            return Err(format!(
                "the shop runs on one Redis ({REDIS_URL_ENV}) or one Redis Cluster \
                 ({REDIS_CLUSTER_URLS_ENV}): unset DLOCK_SENTINEL_URLS and DLOCK_MASTERS"
            ));
        }
        match (&config.url, config.cluster.is_empty()) {
            (Some(_), false) => Err(format!(
                "both {REDIS_URL_ENV} and {REDIS_CLUSTER_URLS_ENV} are set: set one \
                 ({REDIS_URL_ENV} for one server, {REDIS_CLUSTER_URLS_ENV} for a cluster)"
            )),
            (Some(url), true) if url.starts_with("postgres") => Ok(Self::Postgres(url.clone())),
            (Some(url), true) => Ok(Self::Server(url.clone())),
            (None, false) => Ok(Self::Cluster(config.cluster.clone())),
            (None, true) => Ok(Self::Server(DEFAULT_REDIS_URL.to_owned())),
        }
    }

    /// What it is, for people: "one Redis", "one Redis Cluster" or "PostgreSQL".
    pub fn describe(&self) -> &'static str {
        match self {
            Self::Server(_) => "one Redis",
            Self::Cluster(_) => "one Redis Cluster",
            Self::Postgres(_) => "PostgreSQL",
        }
    }
}

/// How to run one instance.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// The loopback port to listen on.
    pub port: u16,
    /// Whether the locks are on.
    pub locks: bool,
    /// Where the locks live: one Redis, a Redis Cluster or PostgreSQL.
    pub redis: LockTarget,
    /// The `Locker`'s other settings, from dlock's `DLOCK_*` variables (its source is `redis`).
    pub dlock: LockerConfig,
    /// The database.
    pub database_url: String,
    /// Buyers of one voucher let into the order path at once, across instances.
    pub buyers_per_voucher: u32,
    /// The operator's token (`SHOP_OPERATOR_TOKEN`); without it, operator requests are refused.
    pub operator: Option<crate::auth::OperatorToken>,
    /// The instance's name in the operator's plots ([`INSTANCE_NAME_ENV`]); `None`: the address
    /// it serves on.
    pub name: Option<String>,
}

/// The environment variable with the instance's name in the operator's plots.
pub const INSTANCE_NAME_ENV: &str = "SHOP_INSTANCE_NAME";

/// The longest instance name, in characters.
pub const MAX_INSTANCE_NAME: usize = 100;

/// The instance's name from the value of [`INSTANCE_NAME_ENV`]: `None` when unset or blank;
/// an error when longer than [`MAX_INSTANCE_NAME`] or with control or format characters.
fn instance_name(value: Option<String>) -> Result<Option<String>, String> {
    let Some(name) = value else {
        return Ok(None);
    };
    if name.trim().is_empty() {
        return Ok(None);
    }
    crate::validate::text(INSTANCE_NAME_ENV, &name, MAX_INSTANCE_NAME)
        .map(Some)
        .map_err(|err| err.to_string())
}

/// The instance's command line.
pub const USAGE: &str = "[--port N] [--no-locks] [--buyers-per-voucher N]   (env: DLOCK_URL, or DLOCK_CLUSTER_URLS=\
redis://127.0.0.1:7000/,redis://127.0.0.1:7001/ for a Redis Cluster, and dlock's other DLOCK_* \
settings; DATABASE_URL, SHOP_OPERATOR_TOKEN (16 characters or more), SHOP_INSTANCE_NAME, RUST_LOG, \
LOG_FORMAT=json)";

/// The bound on each Redis command and on connecting.
pub const REDIS_TIMEOUT: Duration = Duration::from_secs(2);

impl ServerConfig {
    /// Reads the arguments (after the program name) and the environment; `None` for `--help`.
    pub fn from_args(args: impl IntoIterator<Item = String>) -> Result<Option<Self>, String> {
        let dlock = LockerConfig::from_env().map_err(|e| e.to_string())?;
        let mut config = ServerConfig {
            port: 8080,
            locks: true,
            redis: LockTarget::from_config(&dlock)?,
            dlock,
            database_url: std::env::var("DATABASE_URL")
                .unwrap_or_else(|_| "sqlite://flash-sale.db?mode=rwc".to_owned()),
            buyers_per_voucher: crate::BUYERS_PER_VOUCHER,
            operator: crate::auth::OperatorToken::from_env()?,
            name: instance_name(std::env::var(INSTANCE_NAME_ENV).ok())?,
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

/// A `Locker` for `redis` with the `settings` of dlock's `DLOCK_*` variables, and the shop's
/// defaults where they say nothing: a 2 s bound on connecting and on each command, and a 3 s
/// wait. It is always built without connecting (`connect_lazily`): the first command connects
/// (on a cluster, fetches the slot map), and again after a failure, so the shop starts while
/// Redis is down and its locked routes answer 503 until Redis is back. On a cluster it follows
/// `MOVED`/`ASK` through resharding and failovers, and waiters are woken through sharded
/// pub/sub.
pub async fn locker_with(redis: &LockTarget, settings: &LockerConfig) -> Result<Locker, String> {
    let mut config = settings.clone();
    config.url = None;
    config.cluster.clear();
    match redis {
        LockTarget::Server(url) | LockTarget::Postgres(url) => config.url = Some(url.clone()),
        LockTarget::Cluster(urls) => config.cluster = urls.clone(),
    }
    config.connect_lazily = true;
    config.connect_timeout.get_or_insert(REDIS_TIMEOUT);
    config.command_timeout.get_or_insert(REDIS_TIMEOUT);
    config.default_wait.get_or_insert(LOCK_WAIT);
    config
        .build()
        .await
        .map_err(|e| format!("Locker on {}: {e}", redis.describe()))
}

/// The `Locker` for `redis` with the shop's defaults alone ([`locker_with`]).
pub async fn locker_for(redis: &LockTarget) -> Result<Locker, String> {
    locker_with(redis, &LockerConfig::default()).await
}

/// A `Locker` for one Redis server at `redis_url` ([`locker_for`]).
pub async fn locker(redis_url: &str) -> Result<Locker, String> {
    locker_for(&LockTarget::Server(redis_url.to_owned())).await
}

/// A `Locker` on the Redis Cluster reached through `seed_urls` ([`locker_for`]).
pub async fn cluster_locker(seed_urls: &[String]) -> Result<Locker, String> {
    locker_for(&LockTarget::Cluster(seed_urls.to_vec())).await
}

/// Builds the instance (schema brought up to date), then serves until the process gets Ctrl-C
/// or `SIGTERM`, letting requests in flight finish.
pub async fn serve(config: ServerConfig) -> Result<(), String> {
    crate::telemetry::init();
    crate::metrics::install();
    let locker = locker_with(&config.redis, &config.dlock).await?;
    let mut app = crate::app(&config.database_url, locker, config.locks)
        .await
        .map_err(|e| format!("database: {e}"))?;
    app.buyers_per_voucher = config.buyers_per_voucher;
    app.operator = config.operator.clone();
    if app.operator.is_none() {
        tracing::warn!(
            "no SHOP_OPERATOR_TOKEN: creating vouchers and SKUs, /operator and /api/stats are refused"
        );
    }
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", config.port))
        .await
        .map_err(|e| format!("cannot listen on port {}: {e}", config.port))?;
    // The operator's plots name each instance by the address it serves on, unless it is given
    // a name.
    match (&config.name, listener.local_addr()) {
        (Some(name), _) => app.counters.set_name(name.clone()),
        (None, Ok(address)) => app.counters.set_name(address.to_string()),
        (None, Err(_)) => {}
    }
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

    fn vars(url: Option<&str>, cluster: Option<&str>) -> Result<LockTarget, String> {
        LockTarget::from_vars(url.map(str::to_owned), cluster.map(str::to_owned))
    }

    #[test]
    fn redis_is_one_server_unless_cluster_urls_are_given() {
        let default = LockTarget::Server(DEFAULT_REDIS_URL.to_owned());
        assert_eq!(vars(None, None), Ok(default.clone()));
        assert_eq!(
            vars(Some("postgres://shop@h:5432/shop"), None),
            Ok(LockTarget::Postgres(
                "postgres://shop@h:5432/shop".to_owned()
            ))
        );
        assert_eq!(vars(Some(""), Some("  ")), Ok(default));
        assert_eq!(
            vars(Some("redis://h:1/"), None),
            Ok(LockTarget::Server("redis://h:1/".to_owned()))
        );
        assert_eq!(
            vars(None, Some(" redis://a:7000/ ,, rediss://b:7001/,")),
            Ok(LockTarget::Cluster(vec![
                "redis://a:7000/".to_owned(),
                "rediss://b:7001/".to_owned()
            ]))
        );
    }

    #[test]
    fn an_instance_name_is_trimmed_text_or_none() {
        let name = |v: &str| instance_name(Some(v.to_owned()));
        assert_eq!(instance_name(None), Ok(None));
        assert_eq!(name("  "), Ok(None));
        assert_eq!(name(" web-1:8080 "), Ok(Some("web-1:8080".to_owned())));
        let long = name(&"x".repeat(MAX_INSTANCE_NAME + 1)).unwrap_err();
        assert!(long.contains(INSTANCE_NAME_ENV), "{long}");
        assert!(name("web\u{202e}1").is_err());
        assert!(name("web\n1").is_err());
    }

    #[test]
    fn ambiguous_or_malformed_redis_settings_are_refused_with_a_reason() {
        let both = vars(Some("redis://h:1/"), Some("redis://a:7000/")).unwrap_err();
        assert!(both.contains("set one"), "{both}");
        let none = vars(None, Some(",")).unwrap_err();
        assert!(none.contains("names no URL"), "{none}");
        let bad = vars(None, Some("redis://a:7000/,http://user:secret@b:80/")).unwrap_err();
        assert!(bad.contains("entry 2 is a `http` URL"), "{bad}");
        assert!(!bad.contains("secret"), "{bad}");
    }
}
