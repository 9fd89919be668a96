//! A `Locker` on the master Redis Sentinel reports (feature `sentinel`).

use std::sync::Arc;
use std::time::Duration;

use super::connect::url_error;
use super::url::redact_url;
use super::{Config, Locker};
use crate::backend::Backend;
use crate::backend::redis::{RedisBackend, RedisConn};
use crate::backend::wait::SubscriberSource;
use crate::error::{BackendError, LockError};
use crate::replication::ReplicaAck;

pub(super) fn client(
    urls: Vec<String>,
    name: &str,
) -> Result<redis::sentinel::SentinelClient, LockError> {
    if urls.is_empty() {
        return Err(LockError::Config("no sentinel URLs".into()));
    }
    let display: Vec<String> = urls.iter().map(|u| redact_url(u)).collect();
    // A `String`: what `build` takes with and without TLS.
    let service: String = name.to_owned();
    redis::sentinel::SentinelClient::build(
        urls,
        service,
        None,
        redis::sentinel::SentinelServerType::Master,
    )
    .map_err(|e| {
        LockError::Config(format!(
            "bad sentinel URLs {}: {}",
            display.join(", "),
            url_error(&e)
        ))
    })
}

/// A client for each sentinel, to ask and listen to it on its own.
pub(super) fn each(urls: &[String]) -> Result<Vec<redis::Client>, LockError> {
    (urls.iter())
        .map(|url| {
            redis::Client::open(url.as_str()).map_err(|e| {
                LockError::Config(format!(
                    "bad sentinel URL {}: {}",
                    redact_url(url),
                    url_error(&e)
                ))
            })
        })
        .collect()
}

/// A `Locker` on the master the sentinels report; unless `lazy`, it connects (and so asks the
/// sentinels) before returning.
#[allow(clippy::too_many_arguments)]
pub(super) async fn locker(
    client: redis::sentinel::SentinelClient,
    sentinels: Vec<redis::Client>,
    name: String,
    subscriber: Option<redis::Client>,
    lazy: bool,
    config: Config,
    ack: Option<ReplicaAck>,
    command_timeout: Duration,
    connect_timeout: Duration,
) -> Result<Locker, LockError> {
    use crate::backend::sentinel::{SentinelConnection, SentinelMaster};
    let at = format!("sentinel master `{name}`");
    let master = Arc::new(SentinelMaster::new(
        name,
        client,
        sentinels,
        connect_timeout,
    ));
    let conn = SentinelConnection::new(master.clone());
    let subscriber =
        subscriber.map_or(SubscriberSource::Sentinel(master), SubscriberSource::client);
    let backend = RedisBackend::new(RedisConn::Sentinel(conn), Some(subscriber), command_timeout)
        .with_ack(ack);
    if !lazy {
        let ping = backend.ping();
        match tokio::time::timeout(connect_timeout * 2, ping).await {
            Ok(Ok(())) => {}
            Ok(Err(err)) => {
                tracing::debug!(at = at.as_str(), error = %err, "dlock: cannot connect");
                return Err(LockError::Backend(err));
            }
            Err(_) => {
                return Err(LockError::Backend(BackendError::timeout(
                    connect_timeout * 2,
                )));
            }
        }
    }
    Ok(Locker::from_parts(
        Backend::Redis(Arc::new(backend)),
        config,
        at,
    ))
}
