//! The one wait state machine every acquisition goes through: an attempt, then a step on its
//! answer (held, busy, failed for good, or failed for now), then a wait for a wake-up, a timer
//! or the deadline, and round again. The first attempt (`acquire.rs`), the local line's head
//! (`head.rs`, writers and permits included) and a fair lock's waiter (`fair.rs`) each drive a
//! [`Waiter`]; what differs between them (claims and grants, a place in a fair line) stays with
//! them.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::futures::Notified;
use tokio::time::Instant;

use super::acquire::{busy, gave_up, is_permanent};
use super::hold_times::retry_after;
use super::{Attempted, Engine, Lease, LockGuard};
use crate::backend::AcquireReply;
use crate::error::LockError;
use crate::metrics;
use crate::name::{LockKeys, LockName};

/// One acquisition's running account: what it asks for, under which owner token, until when,
/// and what the last answer said.
pub(crate) struct Waiter {
    pub(crate) name: LockName,
    pub(crate) keys: Arc<LockKeys>,
    /// The token the next attempt goes out with (a fresh one after a failed attempt, whose
    /// clean-up releases the old one).
    pub(crate) owner: Arc<str>,
    pub(crate) lease: Lease,
    pub(crate) started: Instant,
    pub(crate) deadline: Instant,
    /// The holder's remaining lease, as the last answer gave it.
    pub(crate) pttl: Option<Duration>,
    /// When the last attempt came back.
    pub(crate) came_back: Option<Instant>,
    /// The last backend error, while no attempt has answered since: what the call returns if
    /// the deadline comes first.
    pub(crate) failed: Option<LockError>,
    /// Whether the last answer found the hold in a key layout this version does not speak
    /// (see `protocol::layout`): no release will wake the waiter, so it polls.
    pub(crate) foreign: bool,
    /// Whether the waiter said so already (one warning and one count per acquisition).
    told_foreign: bool,
    /// Whether the metrics carry the name.
    labelled: bool,
    /// The `Locker`'s usual hold time when the wait began: a busy answer's `retry_after` is
    /// no later.
    typical_hold: Option<Duration>,
    /// Counts the waiter in `dlock_waiting` while it lives.
    _in_progress: InProgress,
}

/// One acquisition in progress in the `dlock_waiting` gauge, from its first attempt until it
/// holds the lock, gives up or is dropped.
struct InProgress(&'static str);

impl InProgress {
    fn start(kind: &'static str) -> Self {
        metrics::gauge_by(metrics::WAITING, kind, 1.0);
        Self(kind)
    }
}

impl Drop for InProgress {
    fn drop(&mut self) {
        metrics::gauge_by(metrics::WAITING, self.0, -1.0);
    }
}

/// What an attempt's answer means for the waiter.
pub(crate) enum Step {
    /// Granted, with this fencing token (if the grant minted one): the caller turns the waiter
    /// into a guard ([`Waiter::held`]).
    Acquired(Option<u64>),
    /// Held by another: wait.
    Busy,
    /// Failed, and trying again would not help (or the call may not wait).
    Failed(LockError),
    /// Failed for now: the waiter has a fresh owner token (re-register what names the old
    /// one), and tries again.
    Retry,
}

impl Waiter {
    /// A waiter for `name` (its `keys`), which began at `started` and waits until `deadline`.
    pub(crate) fn new(
        engine: &Engine,
        name: LockName,
        keys: Arc<LockKeys>,
        lease: Lease,
        (started, deadline): (Instant, Instant),
    ) -> Self {
        let kind = keys.kind.label();
        Self {
            owner: engine.new_owner(),
            name,
            keys,
            lease,
            started,
            deadline,
            pttl: None,
            came_back: None,
            failed: None,
            foreign: false,
            told_foreign: false,
            labelled: engine.inner.config.metrics_name_label,
            typical_hold: engine.inner.hold_times.typical(),
            _in_progress: InProgress::start(kind),
        }
    }

    /// Takes the answer of an attempt that came back at `back`. A failure is for now when the
    /// caller `may_retry` and the error is not permanent.
    pub(crate) fn step(
        &mut self,
        engine: &Engine,
        reply: Result<AcquireReply, LockError>,
        back: Instant,
        may_retry: bool,
    ) -> Step {
        self.came_back = Some(back);
        match reply {
            Ok(AcquireReply::Acquired { fence }) => Step::Acquired(fence),
            Ok(AcquireReply::Busy { pttl, foreign, .. }) => {
                self.pttl = pttl;
                self.failed = None;
                self.foreign = foreign;
                if foreign && !self.told_foreign {
                    self.told_foreign = true;
                    self.tell_foreign();
                }
                Step::Busy
            }
            Err(err) if !may_retry || is_permanent(&err) => {
                metrics::backend_error("acquire");
                Step::Failed(err)
            }
            Err(err) => {
                metrics::backend_error("acquire");
                self.owner = engine.new_owner();
                self.failed = Some(err);
                Step::Retry
            }
        }
    }

    /// Warns, once, that the name is held in a layout this version does not speak, and counts
    /// it.
    #[cold]
    fn tell_foreign(&self) {
        let kind = self.keys.kind.label();
        metrics::foreign_layout(kind);
        tracing::warn!(
            name = self.name.for_logs(),
            kind,
            "dlock: the lock is held in a key layout this version does not speak (a newer \
             version's Locker holds it); waiting by polling, and leaving that hold as it is"
        );
    }

    /// Whether the last attempt came back at or past the deadline: it was the last.
    pub(crate) fn out_of_time(&self) -> bool {
        self.came_back.is_some_and(|at| at >= self.deadline)
    }

    /// A grant to the waiter's owner token, for an attempt sent at `sent_at`.
    pub(crate) fn held(self, engine: &Engine, fence: Option<u64>, sent_at: Instant) -> Attempted {
        Attempted::Held(self.held_guard(engine, fence, sent_at))
    }

    /// The guard of a grant to the waiter's owner token, for an attempt sent at `sent_at`.
    pub(crate) fn held_guard(
        self,
        engine: &Engine,
        fence: Option<u64>,
        sent_at: Instant,
    ) -> LockGuard {
        let Self {
            name,
            keys,
            owner,
            lease,
            started,
            ..
        } = self;
        engine.acquired(name, keys, owner, fence, lease, sent_at, started)
    }

    /// The answer of a request that may not wait and found the lock held.
    pub(crate) fn busy(&self) -> Attempted {
        let kind = self.keys.kind.label();
        busy(
            (&self.name, kind),
            self.labelled,
            self.started,
            self.retry_after(),
            self.foreign,
        )
    }

    /// The answer at the deadline: busy, or the backend error if Redis failed since the last
    /// answer.
    pub(crate) fn gave_up(self) -> Result<Attempted, LockError> {
        gave_up(
            (&self.name, self.keys.kind.label()),
            self.labelled,
            self.started,
            self.retry_after(),
            self.failed,
            self.foreign,
        )
    }

    /// When a retry is likely to find the lock free, from the last answer.
    fn retry_after(&self) -> Option<Duration> {
        retry_after(self.pttl, self.typical_hold)
    }

    /// Waits for a wake-up (`notified`, enabled before the attempt it follows) or `fallback`
    /// from now, whichever comes first, and no later than the deadline — or for `handed` to
    /// give a lock over (a `None` from it ends nothing), which it returns.
    pub(crate) async fn sleep<T>(
        &self,
        notified: Pin<&mut Notified<'_>>,
        fallback: Duration,
        handed: impl Future<Output = Option<T>>,
    ) -> Option<T> {
        let until = self.deadline.min(Instant::now() + fallback);
        // In a fixed order (a lock handed over first), so a run on a paused clock replays.
        tokio::select! {
            biased;
            Some(handed) = handed => Some(handed),
            () = notified => None,
            () = tokio::time::sleep_until(until) => None,
        }
    }
}
