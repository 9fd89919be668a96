//! Releasing a hold: inline or in its own task, with one retry that the script recognises, and
//! what the reply means for the hold.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use tracing::Instrument as _;

use super::*;
use crate::backend::ReleaseReply;
use crate::error::{BackendError, LockError, ReleaseOutcome};
use crate::guard::{HoldState, LossReason};

impl Locker {
    /// Releases one hold of `hold` (cancellation-safe: the work runs in its own task for a
    /// remote backend).
    pub(crate) async fn release_hold(&self, hold: Arc<HoldState>) -> ReleaseOutcome {
        if !self.inner.backend.is_remote() {
            return self.release_now(hold).await;
        }
        // The last hold, nobody local waiting (so no hand-over), one ordered connection: release
        // inline; if this future is dropped half-way, the plain release is sent again in the
        // background (a repeated final release is recognised by the script).
        let simple = self.inner.backend.is_ordered()
            && hold.holds.load(Ordering::Acquire) == 1
            && self.existing_queue(&hold.keys.lock).is_none();
        if simple {
            let mut in_flight = InFlight {
                backend: &self.inner.backend,
                keys: &hold.keys,
                owner: &hold.owner,
                armed: true,
            };
            let outcome = self.release_now(hold.clone()).await;
            in_flight.armed = false;
            return outcome;
        }
        let this = self.clone();
        match tokio::spawn(async move { this.release_now(hold).await }).await {
            Ok(outcome) => outcome,
            Err(err) => ReleaseOutcome::Unreachable(LockError::Backend(BackendError::protocol(
                format!("release task failed: {err}"),
            ))),
        }
    }

    pub(crate) fn release_in_background(&self, hold: Arc<HoldState>) {
        let this = self.clone();
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => {
                handle.spawn(async move {
                    let _ = this.release_now(hold).await;
                });
            }
            Err(_) => {
                // No runtime to release on: stop renewing; the lease runs out by itself.
                if hold.holds.fetch_sub(1, Ordering::AcqRel) == 1 {
                    self.inner.watchdog.deregister(hold.id);
                }
                tracing::warn!(name = %hold.name, "dlock: guard dropped outside a runtime; the lock expires at the end of its lease");
            }
        }
    }

    async fn release_now(&self, hold: Arc<HoldState>) -> ReleaseOutcome {
        let span = tracing::debug_span!("dlock.release", name = %hold.name);
        async {
            let last = hold.holds.fetch_sub(1, Ordering::AcqRel) == 1;
            if last {
                self.inner.watchdog.deregister(hold.id);
                if !hold.is_lost() {
                    hold.mark_released();
                }
                metrics::histogram!("dlock_hold_seconds")
                    .record(hold.acquired_at.elapsed().as_secs_f64());
                if let Some(outcome) = self.try_handoff(&hold).await {
                    return outcome;
                }
            }
            let mut reply = self.inner.backend.release(&hold.keys, &hold.owner).await;
            if reply.is_err() {
                // One retry: a release whose answer was lost is recognised by the script.
                reply = self.inner.backend.release(&hold.keys, &hold.owner).await;
            }
            let outcome = match reply {
                Ok(reply) => {
                    if let ReleaseReply::Released { woke } = reply {
                        self.yield_to_other_processes(&hold, woke);
                    }
                    release_outcome(&hold, reply)
                }
                Err(err) => ReleaseOutcome::Unreachable(LockError::Backend(err)),
            };
            log_release(&hold, &outcome);
            outcome
        }
        .instrument(span)
        .await
    }
}

/// What a release reply means for the hold (marking it lost when it was).
pub(super) fn release_outcome(hold: &HoldState, reply: ReleaseReply) -> ReleaseOutcome {
    match reply {
        ReleaseReply::Released { .. } | ReleaseReply::StillHeld(_) => ReleaseOutcome::Released,
        ReleaseReply::Expired => {
            hold.mark_lost(LossReason::Expired);
            ReleaseOutcome::Expired
        }
        ReleaseReply::TakenOver => {
            hold.mark_lost(LossReason::Gone);
            ReleaseOutcome::TakenOver
        }
    }
}

pub(super) fn log_release(hold: &HoldState, outcome: &ReleaseOutcome) {
    match outcome {
        ReleaseOutcome::Released => {
            metrics::counter!("dlock_released_total").increment(1);
            tracing::debug!(name = %hold.name, fencing_token = hold.fence.get(), "dlock: released");
        }
        ReleaseOutcome::Expired | ReleaseOutcome::TakenOver => {
            metrics::counter!("dlock_release_failed_total").increment(1);
            tracing::warn!(name = %hold.name, fencing_token = hold.fence.get(), outcome = ?outcome, "dlock: released a lock that was no longer held");
        }
        ReleaseOutcome::Unreachable(err) => {
            metrics::counter!("dlock_release_failed_total").increment(1);
            tracing::warn!(name = %hold.name, error = %err, "dlock: release failed; the lock expires at the end of its lease");
        }
    }
}
