//! A run against a server the checker does not own (`dlock check`): the user's own Redis, for a
//! given time, on keys of its own under a fresh prefix that it deletes at the end.
//!
//! Non-destructive: nothing but the run's own keys is written, and without faults
//! ([`FaultFamily::Quiet`]) nothing is injected at all. With [`FaultFamily::Remote`] the faults
//! touch only what the run owns: its lock keys (deleted, or overwritten with a foreign value) and
//! its own connections (cut or stalled by a loopback proxy between one of its lockers and the
//! server). The server is never paused or restarted.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use dlock_core::redis::{self, AsyncCommands as _, ConnectionAddr};
use dlock_core::{Locker, MemoryStore};
use tokio::time::Instant;

use super::actors::RedisSetup;
use super::faults::{RedisTargets, Targets};
use super::leftovers::redis_leftovers;
use super::run::{Report, ctx, drive, finish, params, settle, watchdog_probe};
use super::{Config, FaultFamily};
use crate::Proxy;

/// How long connecting to the server may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// Where a remote run goes, and how it is watched from outside.
#[derive(Debug, Clone)]
pub struct Remote {
    /// The server: `redis://[user:password@]host:port[/db]`.
    pub url: String,
    /// The run's keys go under this prefix and a fresh suffix (the applications' prefix, so that
    /// key ACLs written for them let the run in).
    pub prefix: String,
    /// Set from outside to wind the run down early: no new session starts, and the run settles,
    /// checks and cleans up as if its time were up.
    pub halt: Arc<AtomicBool>,
    /// Sessions run so far, updated while the run goes on (for a progress display).
    pub sessions: Arc<AtomicU64>,
}

/// Why a remote run could not start.
#[derive(Debug)]
pub enum RemoteError {
    /// The URL does not parse, or names something the run cannot put a proxy in front of.
    Url(String),
    /// The server could not be reached, or did not answer.
    Unreachable(String),
    /// A setting dlock refuses, such as a key prefix with braces.
    Config(String),
}

impl std::fmt::Display for RemoteError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Url(m) | Self::Unreachable(m) | Self::Config(m) => f.write_str(m),
        }
    }
}

impl std::error::Error for RemoteError {}

/// `url` with its host and port replaced by `127.0.0.1:port` (user, password, database and
/// parameters kept).
fn through(url: &str, port: u16) -> Option<String> {
    let (scheme, rest) = url.split_once("://")?;
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, path) = rest.split_at(end);
    let host_at = authority.rfind('@').map_or(0, |i| i + 1);
    Some(format!(
        "{scheme}://{}127.0.0.1:{port}{path}",
        &authority[..host_at]
    ))
}

/// The server's TCP address, resolved.
async fn address(client: &redis::Client) -> Result<SocketAddr, RemoteError> {
    let (host, port) = match client.get_connection_info().addr() {
        ConnectionAddr::Tcp(host, port) => (host.clone(), *port),
        ConnectionAddr::TcpTls { .. } => {
            return Err(RemoteError::Url(
                "TLS (rediss://) is not supported by the check yet: its faults and one of its \
                 lockers go through a plain TCP proxy"
                    .to_owned(),
            ));
        }
        _ => {
            return Err(RemoteError::Url(
                "the check needs a TCP server (redis://host:port), not a Unix socket".to_owned(),
            ));
        }
    };
    let found = tokio::net::lookup_host((host.as_str(), port)).await;
    found
        .ok()
        .and_then(|mut addrs| addrs.next())
        .ok_or_else(|| RemoteError::Unreachable(format!("cannot resolve {host}:{port}")))
}

/// Deletes every key under `prefix`; returns how many.
async fn clean_up(admin: &redis::aio::ConnectionManager, prefix: &str) -> usize {
    let mut con = admin.clone();
    let mut keys: Vec<String> = Vec::new();
    if let Ok(mut iter) = con
        .scan_match::<_, String>(format!("{}*", dlock_core::escape_glob(prefix)))
        .await
    {
        while let Some(Ok(key)) = futures_util::StreamExt::next(&mut iter).await {
            keys.push(key);
        }
    }
    let mut deleted = 0;
    for chunk in keys.chunks(100) {
        let mut con = admin.clone();
        deleted += con.del::<_, usize>(chunk).await.unwrap_or(0);
    }
    deleted
}

/// One run of `config` (its `duration`, or its `ops`) against the server at `remote.url`, with
/// [`FaultFamily::Quiet`] or [`FaultFamily::Remote`]; the keys it wrote are deleted at the end.
///
/// Call it on a multi-threaded runtime. Errors only if the run cannot start (a bad URL, a server
/// out of reach); what it found is in the [`Report`].
pub async fn run_remote(config: Config, remote: &Remote) -> Result<Report, RemoteError> {
    assert!(
        matches!(config.family, FaultFamily::Quiet | FaultFamily::Remote),
        "a remote run injects no fault, or only those that touch its own keys and connections"
    );
    let wall = std::time::Instant::now();
    let p = params(config.seed);
    let client = redis::Client::open(remote.url.as_str())
        .map_err(|e| RemoteError::Url(format!("bad URL: {e}")))?;
    let addr = address(&client).await?;
    let unreachable = |e: String| RemoteError::Unreachable(format!("cannot reach Redis: {e}"));
    let admin = tokio::time::timeout(
        CONNECT_TIMEOUT,
        redis::aio::ConnectionManager::new(client.clone()),
    )
    .await
    .map_err(|_| unreachable(format!("no answer within {CONNECT_TIMEOUT:?}")))?
    .map_err(|e| unreachable(e.to_string()))?;
    let mut con = admin.clone();
    let ping = redis::cmd("PING");
    let ping = tokio::time::timeout(CONNECT_TIMEOUT, ping.query_async::<String>(&mut con));
    match ping.await {
        Ok(Ok(_)) => {}
        Ok(Err(e)) => return Err(unreachable(e.to_string())),
        Err(_) => return Err(unreachable("PING timed out".to_owned())),
    }
    let proxy = Arc::new(Proxy::start(addr).await);
    let proxy_url = through(&remote.url, proxy.port())
        .ok_or_else(|| RemoteError::Url("bad URL: no scheme".to_owned()))?;
    let prefix = format!("{}check-{:016x}:", remote.prefix, rand::random::<u64>());
    // A prefix dlock refuses is the user's mistake: say so before any locker is built.
    let probe = Locker::builder()
        .memory(MemoryStore::new())
        .prefix(prefix.clone());
    if let Err(e) = probe.build().await {
        return Err(RemoteError::Config(e.to_string()));
    }
    let setup = RedisSetup {
        url: remote.url.clone(),
        proxy_url,
        far_url: None,
        prefix: prefix.clone(),
        watchdog_lease: p.watchdog_lease,
        command_timeout: p.command_timeout,
        tiny_timeout: p.tiny_timeout,
        fence_ttl: p.fence_ttl,
        dead_waiter_timeout: p.dead_waiter_timeout,
        mixed_layouts: false,
        built: std::sync::Arc::default(),
    };
    let actors = setup.actors("warm-up").await;
    let ctx = ctx(actors, p, Some(admin.clone()));
    // The outside halt, and the progress counter, follow the run while it goes on.
    let follow = tokio::spawn({
        let (ctx, remote) = (ctx.clone(), remote.clone());
        async move {
            loop {
                if remote.halt.load(Ordering::Relaxed) {
                    ctx.halt.store(true, Ordering::Relaxed);
                }
                let done = ctx.stats.sessions.load(Ordering::Relaxed);
                remote.sessions.store(done, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    });
    let targets = Targets::Redis(RedisTargets {
        server: None,
        proxy,
        admin: admin.clone(),
        keys: ctx.name_keys.clone(),
        setup,
        actors: ctx.actors.clone(),
    });
    let faults = drive(&ctx, &targets, config, p).await;
    follow.abort();
    let mut leftovers = redis_leftovers(&ctx, &admin, &prefix, settle(p)).await;
    watchdog_probe(&ctx.actors, Some(&admin), &mut leftovers).await;
    let report = finish(config, wall, &ctx, faults, leftovers);
    let since = Instant::now();
    let deleted = clean_up(&admin, &prefix).await;
    tracing::debug!(deleted, took = ?since.elapsed(), "the check's keys deleted");
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_proxy_url_keeps_credentials_database_and_parameters() {
        let cases = [
            ("redis://10.0.0.5:6379/", "redis://127.0.0.1:7/"),
            ("redis://host", "redis://127.0.0.1:7"),
            ("redis://:pw@host:6380/2", "redis://:pw@127.0.0.1:7/2"),
            (
                "redis://user:p%40ss@h:1/0?protocol=resp3",
                "redis://user:p%40ss@127.0.0.1:7/0?protocol=resp3",
            ),
            ("redis://[::1]:6379", "redis://127.0.0.1:7"),
        ];
        for (url, want) in cases {
            assert_eq!(through(url, 7).as_deref(), Some(want), "{url}");
        }
        assert_eq!(through("localhost:6379", 7), None);
    }
}
