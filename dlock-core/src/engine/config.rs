//! A `Locker`'s settings, as the builder left them, and their defaults.

use std::sync::Arc;
use std::time::Duration;

use super::Lease;

/// The default lease of a watchdog-mode lock; it is renewed every third of it.
pub const DEFAULT_WATCHDOG_LEASE: Duration = Duration::from_secs(30);
/// The default key prefix.
pub const DEFAULT_PREFIX: &str = "dlock:";
/// The default bound on every Redis command.
pub const DEFAULT_COMMAND_TIMEOUT: Duration = Duration::from_secs(2);
/// The default bound on connecting to Redis.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// The default lifetime of an idle fencing counter.
pub const DEFAULT_FENCE_TTL: Duration = Duration::from_secs(7 * 24 * 3600);
/// How often a waiter retries when wake-ups cannot be delivered (no subscriber connection).
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_millis(50);
/// How long a fair lock's waiter keeps its place in line without showing that it is alive
/// (see [`LockerBuilder::dead_waiter_timeout`](crate::LockerBuilder::dead_waiter_timeout)).
pub const DEFAULT_DEAD_WAITER_TIMEOUT: Duration = Duration::from_secs(5);
/// The shortest dead-waiter timeout accepted.
pub(crate) const MIN_DEAD_WAITER_TIMEOUT: Duration = Duration::from_millis(30);

/// A `Locker`'s settings.
#[derive(Debug, Clone)]
pub(crate) struct Config {
    pub(crate) prefix: String,
    pub(crate) default_wait: Duration,
    pub(crate) default_lease: Lease,
    pub(crate) fence_ttl: Option<Duration>,
    pub(crate) poll_interval: Duration,
    /// How long a fair waiter keeps its place without an attempt.
    pub(crate) dead_waiter_timeout: Duration,
    pub(crate) handoff: bool,
    /// Label metrics with the lock's name (see [`crate::metrics`]).
    pub(crate) metrics_name_label: bool,
    /// Keep every name of this `Locker` out of logs, spans and metric labels.
    pub(crate) hide_names: bool,
    /// Carried in every owner token this `Locker` mints, for `inspect` to show.
    pub(crate) holder_label: Option<Arc<str>>,
    /// The level of the `dlock.acquire` and `dlock.release` spans.
    pub(crate) span_level: tracing::Level,
    /// What every token this `Locker` mints starts with: its key layout's tag.
    pub(crate) token_tag: &'static str,
    /// How far the clock of this `Locker`'s claims is set from the backend's wall clock, ms
    /// (`LockerBuilder::clock_apart`, for tests; 0 otherwise).
    pub(crate) clock_apart_ms: i64,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            prefix: DEFAULT_PREFIX.to_owned(),
            default_wait: Duration::ZERO,
            default_lease: Lease::Watchdog(DEFAULT_WATCHDOG_LEASE),
            fence_ttl: Some(DEFAULT_FENCE_TTL),
            poll_interval: DEFAULT_POLL_INTERVAL,
            dead_waiter_timeout: DEFAULT_DEAD_WAITER_TIMEOUT,
            handoff: true,
            metrics_name_label: false,
            hide_names: false,
            holder_label: None,
            span_level: tracing::Level::INFO,
            token_tag: crate::protocol::layout::TAG,
            clock_apart_ms: 0,
        }
    }
}
