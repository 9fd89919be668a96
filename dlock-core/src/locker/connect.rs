//! Opening a `Locker`'s connections, and what a failure to connect says.

use std::time::Duration;

use crate::error::{BackendError, LockError};

/// Opens the connection manager's first connection, within twice the connect timeout.
pub(super) async fn connect(
    client: redis::Client,
    config: redis::aio::ConnectionManagerConfig,
    connect_timeout: Duration,
    display: &str,
) -> Result<redis::aio::ConnectionManager, LockError> {
    let connecting = redis::aio::ConnectionManager::new_with_config(client, config);
    match tokio::time::timeout(connect_timeout * 2, connecting).await {
        Ok(Ok(manager)) => Ok(manager),
        Ok(Err(err)) => Err(connect_error(display, err)),
        Err(_) => Err(LockError::Backend(BackendError::timeout(
            connect_timeout * 2,
        ))),
    }
}

pub(super) fn url_error(err: &redis::RedisError) -> String {
    let msg = err.to_string();
    if msg.to_ascii_lowercase().contains("tls") {
        format!("{msg} (enable dlock-core's `tls-rustls` feature for rediss:// URLs)")
    } else {
        msg
    }
}

pub(super) fn connect_error(at: &str, err: redis::RedisError) -> LockError {
    if err.kind() == redis::ErrorKind::InvalidClientConfig {
        return LockError::Config(format!("cannot connect to `{at}`: {}", url_error(&err)));
    }
    tracing::debug!(at, error = %err, "dlock: cannot connect");
    LockError::Backend(BackendError::redis(err))
}

pub(super) fn describe_client(client: &redis::Client) -> String {
    let info = client.get_connection_info();
    format!("{}", info.addr())
}
