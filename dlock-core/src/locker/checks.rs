//! What a `LockerBuilder`'s settings must satisfy, each a typed error when they don't.

use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::backend::Backend;
use crate::error::LockError;
use crate::replication::ReplicaAck;

/// A TLS connection needs rustls's process-wide crypto provider, which is the application's to
/// choose: dlock never installs one (an application installing its own afterwards would fail).
/// Without one, the `redis` crate's TLS set-up would panic; this is the typed error instead.
#[cfg(feature = "tls-rustls")]
pub(super) fn tls_ready(at: &str) -> Result<(), LockError> {
    if rustls::crypto::CryptoProvider::get_default().is_some() {
        return Ok(());
    }
    Err(LockError::Config(format!(
        "`{at}` is a TLS connection and no rustls crypto provider is installed: install one \
         when the application starts, e.g. \
         `rustls::crypto::aws_lc_rs::default_provider().install_default()`, before building \
         the Locker"
    )))
}

#[cfg(not(feature = "tls-rustls"))]
pub(super) fn tls_ready(at: &str) -> Result<(), LockError> {
    Err(LockError::Config(format!(
        "`{at}` is a TLS connection: enable dlock-core's `tls-rustls` feature"
    )))
}

/// `WAITAOF` is there (Redis / Valkey 7.2 or newer), asked with `COMMAND INFO`; a server that
/// can't be asked now is left to answer the first write.
pub(super) async fn waitaof_supported(locker: &Locker) -> Result<(), LockError> {
    // Without the `postgres` feature the match has one arm.
    #[cfg_attr(
        not(feature = "postgres"),
        allow(clippy::infallible_destructuring_match)
    )]
    let backend = match &locker.engine.inner.backend {
        Backend::Redis(backend) => backend,
        #[cfg(feature = "postgres")]
        Backend::Postgres(_) => return Ok(()),
    };
    match backend.knows_command("WAITAOF").await {
        Ok(false) => Err(LockError::Config(
            "replica acknowledgement with fsync needs WAITAOF (Redis or Valkey 7.2 or newer); \
             this server does not know it"
                .into(),
        )),
        Ok(true) | Err(_) => Ok(()),
    }
}

/// Replica acknowledgement needs replicas (so a Redis backend), at least one, and a wait that
/// fits in one command timeout with the write it follows.
pub(super) fn check_replica_ack(
    ack: ReplicaAck,
    command_timeout: Duration,
    memory: bool,
) -> Result<(), LockError> {
    if memory {
        return Err(LockError::Config(
            "replica acknowledgement needs Redis: the in-memory store has no replicas".into(),
        ));
    }
    if ack.replicas() == 0 {
        return Err(LockError::Config(
            "replica acknowledgement needs at least one replica".into(),
        ));
    }
    if ack.timeout().is_zero() || ack.timeout() >= command_timeout {
        return Err(LockError::Config(format!(
            "replica acknowledgement timeout {:?} must be above zero and under the command \
             timeout {command_timeout:?}",
            ack.timeout()
        )));
    }
    Ok(())
}

/// A default lease is held to a request's bounds, and a watchdog lease renewed every third of it
/// to at least 30 ms.
pub(super) fn check_default_lease(lease: Lease) -> Result<(), LockError> {
    const MIN_WATCHDOG_LEASE: Duration = Duration::from_millis(30);
    if let Lease::Watchdog(watchdog_lease) = lease
        && watchdog_lease < MIN_WATCHDOG_LEASE
    {
        return Err(LockError::Config(format!(
            "watchdog lease {watchdog_lease:?} is too short; the minimum is {MIN_WATCHDOG_LEASE:?}"
        )));
    }
    check_lease(lease.duration()).map_err(|err| match err {
        LockError::Config(message) => LockError::Config(format!("default {message}")),
        other => other,
    })
}

/// The longest holder label accepted, in bytes.
const MAX_HOLDER_LABEL: usize = 64;

pub(super) fn check_holder_label(label: Option<String>) -> Result<Option<Arc<str>>, LockError> {
    let Some(label) = label else {
        return Ok(None);
    };
    if label.is_empty()
        || label.len() > MAX_HOLDER_LABEL
        || label.chars().any(|c| c.is_control() || c.is_whitespace())
    {
        return Err(LockError::Config(format!(
            "holder label {label:?}: 1 to {MAX_HOLDER_LABEL} bytes, no whitespace or control \
             characters"
        )));
    }
    Ok(Some(Arc::from(label)))
}

/// How a `Locker` learns of releases, checked against its source: a source without a
/// subscriber connection (`without`: what it is) needs one given ([`LockerBuilder::subscriber`])
/// or polling chosen on purpose ([`LockerBuilder::wake_by_polling`]), and polling is chosen
/// only where it is needed. Waiters that poll every 50 ms without anyone having asked are the
/// surprise this refuses.
pub(super) fn check_wake_ups(
    without: Option<&str>,
    cluster: bool,
    subscriber: bool,
    polling: bool,
) -> Result<(), LockError> {
    match (without, subscriber, polling) {
        (Some(_), true, true) => Err(LockError::Config(
            "both `subscriber` and `wake_by_polling` are set: waiters are woken through the \
             subscriber; drop `wake_by_polling`"
                .into(),
        )),
        (Some(source), false, false) if cluster => Err(LockError::Config(format!(
            "{source} brings no subscriber connection, so waiters could not be woken: build \
             the Locker with `cluster(seed URLs)` for wake-ups through sharded pub/sub, or \
             choose polling with `wake_by_polling()` (a waiter then retries every \
             `poll_interval`, 50 ms by default)"
        ))),
        (Some(source), false, false) => Err(LockError::Config(format!(
            "{source} brings no subscriber connection, so waiters could not be woken: pass the \
             `redis::Client` it was made from with `subscriber(client)`, or choose polling with \
             `wake_by_polling()` (a waiter then retries every `poll_interval`, 50 ms by \
             default)"
        ))),
        (None, _, true) => Err(LockError::Config(
            "`wake_by_polling` is for a connection manager, a pool, a multiplexed connection or \
             a cluster connection: this source has a subscriber connection of its own"
                .into(),
        )),
        _ => Ok(()),
    }
}
