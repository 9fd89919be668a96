//! A `Locker`'s diagnostics, read in one call: what its watchdog renews, what its subscriber
//! watches, what waits in the process.

use super::Locker;
use crate::backend::Backend;

/// One reading of a `Locker`'s counters, for dashboards and tests ([`Locker::stats`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockerStats {
    /// Holds the watchdog renews now.
    pub renewed_holds: usize,
    /// Renewal round trips the watchdog has made since the `Locker` was built.
    pub renewal_round_trips: u64,
    /// Names the subscriber connection is subscribed to now.
    pub watched_names: usize,
    /// Names with waiters of this `Locker` queued in the process now (zero once nobody waits).
    pub queued_names: usize,
    /// Whether the subscriber connection is up (false before the first wait; always true on a
    /// [`MemoryStore`](crate::MemoryStore)).
    pub subscriber_connected: bool,
    /// Locks a release of this `Locker` handed to one of its own waiters in the same step
    /// (one script call), since it was built.
    pub handed_over: u64,
}

impl Locker {
    /// Reads the `Locker`'s counters.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let locker = dlock_core::Locker::memory();
    /// let guard = locker.lock("report").await.unwrap();
    /// assert_eq!(locker.stats().renewed_holds, 1);
    /// # drop(guard);
    /// # }
    /// ```
    pub fn stats(&self) -> LockerStats {
        let (watched_names, subscriber_connected) = match &self.engine.inner.backend {
            Backend::Redis(backend) => (backend.watched_channels(), backend.subscriber_healthy()),
            #[cfg(feature = "postgres")]
            Backend::Postgres(backend) => (backend.watched_channels(), backend.listening()),
        };
        LockerStats {
            renewed_holds: self.engine.inner.watchdog.len(),
            renewal_round_trips: self.engine.inner.watchdog.round_trips(),
            watched_names,
            queued_names: self.engine.queue_count(),
            subscriber_connected,
            handed_over: (self.engine.inner.handed_over).load(std::sync::atomic::Ordering::Relaxed),
        }
    }
}
