//! A `Locker` on a Redis Cluster (feature `cluster`).

use std::sync::Arc;
use std::time::Duration;

use super::checks::tls_ready;
use super::connect::url_error;
use super::url::redact_url;
use super::{Config, Locker};
use crate::backend::Backend;
use crate::backend::cluster::{ClusterSeeds, LazyCluster, Masters};
use crate::backend::redis::{RedisBackend, RedisConn};
use crate::backend::wait::SubscriberSource;
use crate::error::{BackendError, LockError};
use crate::replication::ReplicaAck;

/// Connects to the cluster through `urls` (within twice the connect timeout; unless `lazy`: then
/// the first command connects) and builds a `Locker` whose waiters are woken through sharded
/// pub/sub.
pub(super) async fn locker(
    urls: Vec<String>,
    lazy: bool,
    config: Config,
    ack: Option<ReplicaAck>,
    command_timeout: Duration,
    connect_timeout: Duration,
) -> Result<Locker, LockError> {
    if urls.is_empty() {
        return Err(LockError::Config("no cluster seed URLs".into()));
    }
    let shown: Vec<String> = urls.iter().map(|u| redact_url(u)).collect();
    let at = format!("redis cluster ({})", shown.join(", "));
    if urls.iter().any(|u| u.starts_with("rediss://")) {
        tls_ready(&at)?;
    }
    let masters = Masters::new(&urls, connect_timeout)
        .map_err(|e| LockError::Config(format!("bad cluster URLs {at}: {}", url_error(&e))))?;
    let seeds = ClusterSeeds {
        urls,
        connect_timeout,
        ack_wait: ack.map(|a| a.timeout()),
    };
    let client = (seeds.builder().build())
        .map_err(|e| LockError::Config(format!("bad cluster URLs {at}: {}", url_error(&e))))?;
    let conn = LazyCluster::new(Some(client), connect_timeout);
    if !lazy {
        match tokio::time::timeout(connect_timeout * 2, conn.connection()).await {
            Ok(Ok(_)) => {}
            Ok(Err(err)) => {
                tracing::debug!(at = at.as_str(), error = %err, "dlock: cannot connect");
                return Err(LockError::Backend(BackendError::redis(err)));
            }
            Err(_) => {
                return Err(LockError::Backend(BackendError::timeout(
                    connect_timeout * 2,
                )));
            }
        }
        // The masters' replicas, for the first writes' acknowledgement to wait for.
        if ack.is_some_and(|a| a.is_up_to_listed()) {
            masters.refresh(connect_timeout).await;
        }
    }
    let backend = RedisBackend::new(
        RedisConn::Cluster(conn.clone()),
        Some(SubscriberSource::Cluster(seeds, conn)),
        command_timeout,
    )
    .with_ack(ack)
    .with_masters(masters);
    // Releases wake waiters with SPUBLISH: without it every release would fail half-way.
    if !lazy && let Ok(false) = backend.knows_command("SPUBLISH").await {
        return Err(LockError::Config(format!(
            "{at}: locks on a cluster need sharded pub/sub (SPUBLISH, Redis 7.0 or newer)"
        )));
    }
    Ok(Locker::from_parts(
        Backend::Redis(Arc::new(backend)),
        config,
        at,
    ))
}

/// A `Locker` over an application's cluster connection; without seeds for a subscriber, its
/// waiters poll. The masters' replicas, which writes wait for by default, are listed through
/// the same connection.
pub(super) fn over_connection(
    conn: redis::cluster_async::ClusterConnection,
    config: Config,
    ack: Option<ReplicaAck>,
    (command_timeout, connect_timeout): (Duration, Duration),
) -> Locker {
    let masters = Masters::over(conn.clone(), connect_timeout);
    let backend = RedisBackend::new(
        RedisConn::Cluster(LazyCluster::open(conn)),
        None,
        command_timeout,
    )
    .with_ack(ack)
    .with_masters(masters);
    Locker::from_parts(
        Backend::Redis(Arc::new(backend)),
        config,
        "redis cluster connection".to_owned(),
    )
}
