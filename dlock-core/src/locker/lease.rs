//! Leases: fixed or renewed by the watchdog, and `extend`.

use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::time::Instant;

use super::*;
use crate::backend::RenewItem;
use crate::error::LockError;
use crate::guard::{HoldState, LossReason};

/// How long a lock is leased for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Lease {
    /// Renewed by the watchdog every third of this lease while the guard lives.
    Watchdog(Duration),
    /// Never renewed; the lock expires after this lease.
    Fixed(Duration),
}

impl Lease {
    pub(crate) fn duration(self) -> Duration {
        match self {
            Self::Watchdog(d) | Self::Fixed(d) => d,
        }
    }
}

impl Locker {
    pub(crate) async fn extend(&self, hold: &HoldState, lease: Duration) -> Result<(), LockError> {
        let item = RenewItem {
            key: hold.keys.lock.clone(),
            owner: hold.owner.to_string(),
            lease_ms: u64::try_from(lease.as_millis()).unwrap_or(u64::MAX).max(1),
        };
        let sent_at = Instant::now();
        let renewed = self
            .inner
            .backend
            .renew(std::slice::from_ref(&item))
            .await
            .map_err(LockError::Backend)?;
        if renewed.first().copied().unwrap_or(false) {
            hold.lease_ms.store(item.lease_ms, Ordering::Relaxed);
            hold.renewed(sent_at, lease);
            tracing::debug!(name = %hold.name, lease_ms = item.lease_ms, "dlock: extended");
            Ok(())
        } else {
            hold.mark_lost(LossReason::Gone);
            Err(hold.lost_error())
        }
    }
}
