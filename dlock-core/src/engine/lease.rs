//! Leases: fixed or renewed by the watchdog, and `extend`.

use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::time::Instant;

use super::*;
use crate::backend::{RenewItem, RenewReply};
use crate::error::{BackendError, LockError};
use crate::hold::{HoldState, LossReason};

/// How a lock is leased: renewed by the watchdog, or fixed.
///
/// A `Locker` starts every request from its default lease
/// ([`LockerBuilder::default_lease`](crate::LockerBuilder::default_lease), a 30 s watchdog lease
/// unless configured); [`LockRequest::lease`](crate::LockRequest::lease) and
/// [`LockRequest::watchdog_lease`](crate::LockRequest::watchdog_lease) override it per request.
/// A lease is accepted from 10 ms to about ten years; anything else is a
/// [`LockError::Config`].
///
/// ```
/// use std::time::Duration;
/// use dlock_core::Lease;
///
/// let lease = Lease::fixed(Duration::from_secs(10));
/// assert!(!lease.is_watchdog());
/// assert_eq!(lease.duration(), Duration::from_secs(10));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Lease {
    /// Renewed by the watchdog every third of this lease while the guard lives.
    Watchdog(Duration),
    /// Never renewed; the lock expires after this lease unless released first.
    Fixed(Duration),
}

impl Lease {
    /// A lease the watchdog renews every third of `lease` while the guard lives.
    pub const fn watchdog(lease: Duration) -> Self {
        Self::Watchdog(lease)
    }

    /// A lease that is never renewed: the lock expires `lease` after it was acquired.
    pub const fn fixed(lease: Duration) -> Self {
        Self::Fixed(lease)
    }

    /// The lease's length (for a watchdog lease, the length each renewal sets).
    pub const fn duration(self) -> Duration {
        match self {
            Self::Watchdog(d) | Self::Fixed(d) => d,
        }
    }

    /// Whether the watchdog renews it.
    pub const fn is_watchdog(self) -> bool {
        matches!(self, Self::Watchdog(_))
    }
}

/// The shortest lease accepted.
pub(crate) const MIN_LEASE: Duration = Duration::from_millis(10);
/// The longest lease accepted (about ten years): Redis takes leases in milliseconds, and longer
/// ones mean nothing for a lock.
pub(crate) const MAX_LEASE: Duration = Duration::from_secs(10 * 365 * 24 * 3600);

/// Rejects a lease outside [`MIN_LEASE`, `MAX_LEASE`].
pub(crate) fn check_lease(lease: Duration) -> Result<(), LockError> {
    if lease < MIN_LEASE {
        return Err(LockError::Config(format!(
            "lease {lease:?} is too short; the minimum is {MIN_LEASE:?}"
        )));
    }
    if lease > MAX_LEASE {
        return Err(LockError::Config(format!(
            "lease {lease:?} is too long; the maximum is {} days",
            MAX_LEASE.as_secs() / 86_400
        )));
    }
    Ok(())
}

/// Rejects an `at_least` period beyond [`MAX_LEASE`], or beyond a fixed lease (the name would be
/// free before the period ends anyway if the holder crashed).
pub(crate) fn check_at_least(at_least: Duration, lease: Lease) -> Result<(), LockError> {
    if at_least > MAX_LEASE {
        return Err(LockError::Config(format!(
            "at_least {at_least:?} is too long; the maximum is {} days",
            MAX_LEASE.as_secs() / 86_400
        )));
    }
    match lease {
        Lease::Fixed(lease) if at_least > lease => Err(LockError::Config(format!(
            "at_least {at_least:?} is longer than the fixed lease {lease:?}"
        ))),
        _ => Ok(()),
    }
}

impl Engine {
    /// Sets `hold`'s lease to `lease` from now, owner-checked. The change carries the hold's next
    /// sequence number, so a renewal still in flight can't undo it, and the validity deadline
    /// follows it whether it moves later or earlier.
    pub(crate) async fn extend(&self, hold: &HoldState, lease: Duration) -> Result<(), LockError> {
        check_lease(lease)?;
        let lease_ms = u64::try_from(lease.as_millis()).unwrap_or(u64::MAX);
        // Renewals from now on carry the new lease, whatever becomes of this call.
        hold.lease_ms.store(lease_ms, Ordering::Relaxed);
        if hold.watchdog {
            self.inner.watchdog.ensure_running(&self.inner.backend);
            self.inner.watchdog.replan(lease_ms);
        }
        let sent_at = Instant::now();
        let item = RenewItem {
            key: hold.keys.lock.clone(),
            owner: hold.owner.to_string(),
            lease_ms,
            seq: hold.begin_change(lease, sent_at),
            permit: hold.keys.is_member(),
            members: hold.keys.members(),
        };
        let replies = self
            .inner
            .backend
            .renew(std::slice::from_ref(&item), Duration::MAX)
            .await
            .map_err(|err| {
                crate::metrics::backend_error("extend");
                LockError::Backend(err)
            })?;
        match replies.first() {
            Some(RenewReply::Applied) => {
                hold.change_applied(item.seq);
                tracing::debug!(name = hold.name.for_logs(), lease_ms, "dlock: extended");
                Ok(())
            }
            // A later renewal, which carries this lease too, was applied first.
            Some(RenewReply::Stale) => {
                hold.change_ignored(item.seq);
                Ok(())
            }
            // One item is answered or fails as a whole (an error above); kept for the match.
            Some(RenewReply::Unanswered) => Err(LockError::Backend(BackendError::protocol(
                "the extension went unanswered",
            ))),
            Some(RenewReply::Gone) | None => {
                hold.mark_lost(LossReason::Gone);
                Err(hold.lost_error())
            }
        }
    }
}
