//! Releasing a hold: inline or in its own task, with one retry that the script recognises, and
//! what the reply means for the hold.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use tokio::time::Instant;
use tracing::Instrument as _;

use super::queue::LocalQueue;
use super::*;
use crate::backend::ReleaseReply;
use crate::error::{BackendError, LockError, ReleaseOutcome};
use crate::hold::{HoldState, LossReason};
use crate::metrics;

impl Engine {
    /// Releases one guard of `hold`. A guard that re-entered the hold only counts down here
    /// (Redis has one hold per owner); the last one releases in Redis, cancellation-safe.
    pub(crate) async fn release_hold(&self, hold: Arc<HoldState>) -> ReleaseOutcome {
        if !self.count_down(&hold) {
            return inner_outcome(&hold);
        }
        let queue = self.existing_queue(&hold.keys.lock);
        if !self.inner.backend.is_remote() {
            return self.finish_release(hold, queue).await;
        }
        if queue.is_none() {
            // Nobody local waits, so no hand-over: release inline. If this future is dropped
            // half-way, the same release is sent again in the background (a repeated release is
            // recognised by the script).
            let mut in_flight =
                InFlight::new(self, &hold.keys, &hold.owner).keeping(hold.keep_until.get());
            let outcome = self.finish_release(hold.clone(), None).await;
            in_flight.disarm();
            return outcome;
        }
        // A hand-over is a two-party exchange that must not stop half-way: it runs in a task of
        // its own, which finishes even if the caller stops waiting.
        let this = self.clone();
        match tokio::spawn(async move { this.finish_release(hold, queue).await }).await {
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
                    let _ = this.release_hold(hold).await;
                });
            }
            Err(_) => {
                // No runtime to release on: stop renewing; the lease runs out by itself.
                if self.count_down(&hold) {
                    tracing::warn!(
                        name = hold.name.for_logs(),
                        "dlock: guard dropped outside a runtime; the lock expires at the end of its lease"
                    );
                }
            }
        }
    }

    /// Counts one guard of `hold` out; for the last one, ends the hold here (no more renewals,
    /// no loss reported from now on) and returns true.
    fn count_down(&self, hold: &HoldState) -> bool {
        if hold.holds.fetch_sub(1, Ordering::AcqRel) != 1 {
            return false;
        }
        self.inner.watchdog.deregister(hold.id);
        metrics::gauge_by(metrics::HELD, hold.keys.kind.label(), -1.0);
        let (let_go, lost) = hold.mark_let_go();
        if !lost {
            hold.mark_released();
        }
        let held = let_go.saturating_duration_since(hold.acquired_at);
        metrics::seconds(metrics::HOLD_SECONDS, &hold.labels, held);
        self.inner.hold_times.record(held);
        true
    }

    /// The Redis part of a final release: a hand-over to the local head waiter (in `queue`, the
    /// name's local line as it was when the last guard let go), or a release.
    async fn finish_release(
        &self,
        hold: Arc<HoldState>,
        queue: Option<Arc<LocalQueue>>,
    ) -> ReleaseOutcome {
        let span = crate::engine::spans::release(
            self.inner.config.span_level,
            &hold.name,
            hold.keys.kind.label(),
        );
        let recorded = span.clone();
        async {
            let queue = queue.as_ref();
            // The hand-over, boxed: only a name with local waiters needs its larger future.
            let handed = match queue {
                Some(_) => Box::pin(self.try_handoff(&hold, queue)).await,
                None => None,
            };
            let (outcome, handed_here) = match handed {
                Some(handed) => handed,
                None => (
                    self.release_in_redis(&hold, None, Try::First, queue).await,
                    false,
                ),
            };
            if let Some(queue) = queue.filter(|_| !handed_here) {
                queue.let_go();
            }
            let outcome = judged_at_let_go(&hold, outcome);
            log_release(&hold, &outcome);
            let held = hold.let_go().0.saturating_duration_since(hold.acquired_at);
            crate::engine::spans::released(&recorded, &outcome, held, hold.known_fence());
            outcome
        }
        .instrument(span)
        .await
    }

    /// Releases `hold` in Redis (or the hold of `handed_to`, if a hand-over to it may have
    /// happened): as a first try with `Try::First` (sent once more if its answer was lost), or
    /// after a hand-over whose answer was lost with `Try::AfterHandoff` (which may have let the
    /// lock go already; a release takes at most two command timeouts, whatever went before it).
    /// `queue`: the name's local line, whose waiters may hold back for other processes.
    pub(crate) async fn release_in_redis(
        &self,
        hold: &HoldState,
        handed_to: Option<&str>,
        first: Try,
        queue: Option<&Arc<LocalQueue>>,
    ) -> ReleaseOutcome {
        let release = || async {
            let session = self.inner.backend.session().await?;
            (session.release(&hold.keys, &hold.owner, handed_to, hold.keep_for())).await
        };
        // When the holder let go, and what it believed then.
        let (let_go, deadline, lost) = hold.let_go();
        let mut reply = release().await;
        let mut retried = first == Try::AfterHandoff;
        if reply.is_err() && first == Try::First {
            // One retry: the first try may have run.
            reply = release().await;
            retried = true;
        }
        let gone = matches!(reply, Ok(ReleaseReply::Expired | ReleaseReply::TakenOver));
        if gone && retried && !lost && let_go < deadline {
            // Not our hold any more: the command before this one (the first try, or a hand-over
            // that released instead) let it go, and someone may have taken it since; or the
            // lease ran out after the guard let go (see `judged_at_let_go`). Either way the lock
            // was this guard's until it let go.
            reply = Ok(ReleaseReply::Released { woke: 0 });
        }
        match reply {
            Ok(reply) => {
                if let ReleaseReply::Released { woke } = reply {
                    Self::yield_to_other_processes(queue, woke);
                }
                release_outcome(hold, reply)
            }
            Err(err) => ReleaseOutcome::Unreachable(LockError::Backend(err)),
        }
    }
}

/// A final release's outcome, judged from the moment the guard let go: if it let go while the
/// lease still ran, and the answer came only after the lease could have run out by itself (slow
/// commands, a stalled connection, a hand-over that went unanswered first), finding the lock
/// gone is no loss: the lock was this guard's until it let go. Found gone *before* the lease
/// could end, it is a loss, and said so.
/// And the other way: a guard that let go after its hold was lost (its lease ran out as this
/// process counts it, or a renewal found it gone) was told so already; Redis still finding the
/// hold (a lease that Redis started a moment later than this process counts it) does not make
/// it held all along, and the release says the loss. So does a release that got no answer: the
/// hold was over before it, and nothing is left for its lease to keep from others.
fn judged_at_let_go(hold: &HoldState, outcome: ReleaseOutcome) -> ReleaseOutcome {
    let (let_go, deadline, lost) = hold.let_go();
    let gone = matches!(outcome, ReleaseOutcome::Expired | ReleaseOutcome::TakenOver);
    if gone && !lost && let_go < deadline && Instant::now() >= deadline {
        ReleaseOutcome::Released
    } else if lost && let ReleaseOutcome::Unreachable(err) = &outcome {
        metrics::backend_error("release");
        tracing::debug!(
            name = hold.name.for_logs(),
            error = %err,
            "dlock: the release of a lost hold got no answer"
        );
        loss_outcome(hold)
    } else if lost && matches!(outcome, ReleaseOutcome::Released) {
        loss_outcome(hold)
    } else {
        outcome
    }
}

/// The outcome that reports `hold`'s loss.
fn loss_outcome(hold: &HoldState) -> ReleaseOutcome {
    match hold.loss() {
        Some(LossReason::Expired) => ReleaseOutcome::Expired,
        _ => ReleaseOutcome::TakenOver,
    }
}

/// What releasing a guard that re-entered a hold reports: the hold's state, as far as this
/// process knows (the enclosing guard still holds the lock in Redis).
fn inner_outcome(hold: &HoldState) -> ReleaseOutcome {
    if hold.is_lost() {
        loss_outcome(hold)
    } else {
        ReleaseOutcome::Released
    }
}

/// What a release reply means for the hold (marking it lost when it was).
pub(crate) fn release_outcome(hold: &HoldState, reply: ReleaseReply) -> ReleaseOutcome {
    match reply {
        ReleaseReply::Released { .. } => ReleaseOutcome::Released,
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

fn log_release(hold: &HoldState, outcome: &ReleaseOutcome) {
    match outcome {
        ReleaseOutcome::Released => {
            metrics::count(metrics::RELEASED, &hold.labels, 1);
            tracing::debug!(
                name = hold.name.for_logs(),
                fencing_token = hold.known_fence(),
                "dlock: released"
            );
        }
        ReleaseOutcome::Expired | ReleaseOutcome::TakenOver => {
            let outcome_label = if matches!(outcome, ReleaseOutcome::Expired) {
                "expired"
            } else {
                "taken_over"
            };
            metrics::count_with(
                metrics::RELEASE_FAILED,
                "outcome",
                outcome_label,
                &hold.labels,
            );
            tracing::warn!(name = hold.name.for_logs(), fencing_token = hold.known_fence(), outcome = ?outcome, "dlock: released a lock that was no longer held");
        }
        ReleaseOutcome::Unreachable(err) => {
            metrics::backend_error("release");
            metrics::count_with(
                metrics::RELEASE_FAILED,
                "outcome",
                "unreachable",
                &hold.labels,
            );
            tracing::warn!(name = hold.name.for_logs(), error = %err, "dlock: release failed; the lock expires at the end of its lease");
        }
    }
}

/// What went before a release in Redis (see [`Locker::release_in_redis`](crate::Locker::release_in_redis)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Try {
    /// Nothing: the release is the first command to let the hold go.
    First,
    /// A hand-over whose answer was lost: it may have let the hold go (handed to the waiter, or
    /// released because others wait), and someone may have taken the lock since.
    AfterHandoff,
}
