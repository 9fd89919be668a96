//! The acquire path: cancellation-safe attempts, re-entry, and waiting at the head of the local
//! queue.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::time::Instant;

use super::*;
use crate::backend::{AcquireReply, Backend, Session};
use crate::clock;
use crate::error::LockError;
use crate::guard::{FencingToken, HoldState, LockGuard, LossReason};
use crate::metrics;
use crate::name::{LockKeys, LockName};
use crate::scope;

impl Locker {
    /// One acquisition attempt for `owner`, cancellation-safe: if the caller's future is dropped
    /// while the script is in flight, or the call fails (so the script may have run), a release
    /// for `owner` follows it down the same connection, where it can only arrive after it.
    async fn attempt(
        &self,
        keys: &Arc<LockKeys>,
        owner: &Arc<str>,
        lease: Duration,
    ) -> Result<AcquireReply, LockError> {
        let session = self
            .inner
            .backend
            .session()
            .await
            .map_err(LockError::Backend)?;
        let mut in_flight = InFlight::new(self, keys, owner);
        in_flight.session = Some(session.clone());
        let res = session
            .acquire(keys, owner, lease, self.inner.config.fence_ttl)
            .await;
        // Answered: the caller turns a grant into a guard before its next `.await`.
        if res.is_ok() {
            in_flight.disarm();
        }
        res.map_err(LockError::Backend)
    }

    /// Re-enters `hold`, which this task holds in the current scope: checks (read-only) that
    /// Redis still has it, then counts one more guard in. `Ok(None)` when the hold was released
    /// meanwhile (the caller acquires afresh); the loss when it was lost.
    async fn reenter(&self, hold: Arc<HoldState>) -> Result<Option<LockGuard>, LockError> {
        if hold.is_lost() {
            return Err(hold.lost_error());
        }
        let session = self
            .inner
            .backend
            .session()
            .await
            .map_err(LockError::Backend)?;
        let reply = session
            .holds(&hold.keys, &hold.owner)
            .await
            .map_err(LockError::Backend)?;
        // No `.await` from here on: nothing below can be left half-done by a dropped future.
        let counted_in = hold
            .holds
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n > 0).then_some(n + 1)
            })
            .is_ok();
        if !counted_in {
            return Ok(None);
        }
        match reply {
            AcquireReply::Acquired { .. } => {
                tracing::debug!(
                    name = hold.name.for_logs(),
                    fencing_token = hold.fence.get(),
                    "dlock: re-entered"
                );
                Ok(Some(LockGuard {
                    state: hold,
                    locker: self.clone(),
                    reentrant: true,
                    done: false,
                }))
            }
            AcquireReply::Busy { .. } => {
                hold.holds.fetch_sub(1, Ordering::AcqRel);
                hold.mark_lost(LossReason::Gone);
                Err(hold.lost_error())
            }
        }
    }

    pub(super) async fn acquire(
        self,
        name: LockName,
        wait: Duration,
        lease: Lease,
    ) -> Result<Attempted, LockError> {
        let started = Instant::now();
        let deadline = clock::after(started, wait);
        let keys = Arc::new(LockKeys::new(&self.inner.config.prefix, &name));
        let labelled = self.inner.config.metrics_name_label;

        // Re-entry inside a lock scope: a hold this task has (even a lost one, whose loss is
        // reported rather than papered over with a new lock).
        if let Some(hold) = scope::find(self.inner.id, &keys.lock)
            && let Some(guard) = self.reenter(hold).await?
        {
            return Ok(Attempted::Held(guard));
        }

        let mut owner = new_owner();
        // The last backend error, while no attempt has answered since: what the call returns
        // if the deadline comes first.
        let mut failed: Option<LockError> = None;
        let mut pttl = None;
        // When the last attempt came back: one that came back past the deadline is the last (the
        // call returns within its wait plus one command timeout).
        let mut came_back: Option<Instant> = None;
        // A first attempt, ahead of any local queue — unless local waiters are holding back for
        // other processes right now.
        let holding_back = !wait.is_zero()
            && self
                .existing_queue(&keys.lock)
                .is_some_and(|q| q.deferred().is_some());
        if !holding_back {
            let sent_at = Instant::now();
            let reply = self.attempt(&keys, &owner, lease.duration()).await;
            came_back = Some(Instant::now());
            match reply {
                Ok(AcquireReply::Acquired { fence }) => {
                    return Ok(Attempted::Held(
                        self.acquired(name, keys, owner, fence, lease, sent_at, started),
                    ));
                }
                Ok(AcquireReply::Busy { pttl: now_pttl }) => pttl = now_pttl,
                Err(err) if wait.is_zero() || is_permanent(&err) => return Err(err),
                Err(err) => {
                    // The clean-up of that attempt releases `owner`: never reuse it.
                    owner = new_owner();
                    failed = Some(err);
                }
            }
            if wait.is_zero() {
                return Ok(busy(&name, labelled, started, pttl));
            }
        }

        // Queue behind local waiters for the same name; only the head waits in Redis.
        let ticket = self.queue(&keys.lock);
        let Ok(_turn) = tokio::time::timeout_at(deadline, ticket.queue.turn.lock()).await else {
            return gave_up(&name, labelled, started, pttl, failed);
        };
        let mut head = HeadWait::new(&self, &ticket, &keys, lease.duration(), deadline).await;
        let handoff_owner = head.handoff_owner.clone();
        loop {
            let (watch, rx) = head.parts();
            let notified = watch.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if let Some(until) = ticket.queue.deferred() {
                tokio::time::sleep_until(until.min(deadline)).await;
            }
            if came_back.is_some_and(|at| at >= deadline) {
                return gave_up(&name, labelled, started, pttl, failed);
            }
            let sent_at = Instant::now();
            let reply = self.attempt(&keys, &owner, lease.duration()).await;
            came_back = Some(Instant::now());
            match reply {
                Ok(AcquireReply::Acquired { fence }) => {
                    return Ok(Attempted::Held(
                        self.acquired(name, keys, owner, fence, lease, sent_at, started),
                    ));
                }
                Ok(AcquireReply::Busy { pttl: now_pttl }) => {
                    pttl = now_pttl;
                    failed = None;
                }
                Err(err) if is_permanent(&err) => return Err(err),
                Err(err) => {
                    owner = new_owner();
                    failed = Some(err);
                }
            }
            let now = Instant::now();
            if now >= deadline {
                return gave_up(&name, labelled, started, pttl, failed);
            }
            // The fallback timer: the holder's remaining lease (a lock nobody releases expires
            // then), or a short poll when wake-ups can't be delivered or Redis just failed.
            let poll = self.inner.config.poll_interval;
            let fallback = match (failed.is_none() && watch.is_reliable(), pttl) {
                (true, Some(pttl)) => pttl + Duration::from_millis(1),
                (true, None) => poll,
                (false, Some(pttl)) => pttl.min(poll),
                (false, None) => poll,
            };
            let until = deadline.min(now + fallback);
            tokio::select! {
                () = &mut notified => {}
                () = tokio::time::sleep_until(until) => {}
                Some((fence, sent_at)) = handed(rx) => {
                    return Ok(Attempted::Held(
                        self.acquired(name, keys, handoff_owner, fence, lease, sent_at, started),
                    ));
                }
            }
        }
    }

    /// Turns a grant into a guard: the hold's state, the watchdog, the scope; no `.await`.
    #[allow(clippy::too_many_arguments)]
    fn acquired(
        &self,
        name: LockName,
        keys: Arc<LockKeys>,
        owner: Arc<str>,
        fence: u64,
        lease: Lease,
        sent_at: Instant,
        started: Instant,
    ) -> LockGuard {
        let waited = started.elapsed();
        let label = metrics::name_label(self.inner.config.metrics_name_label, &name);
        metrics::count(metrics::ACQUIRED, label.as_deref(), 1);
        metrics::seconds(metrics::WAIT_SECONDS, label.as_deref(), waited);
        tracing::debug!(
            name = name.for_logs(),
            fencing_token = fence,
            waited_us = u64::try_from(waited.as_micros()).unwrap_or(u64::MAX),
            "dlock: acquired"
        );
        let watchdog = matches!(lease, Lease::Watchdog(_));
        let state = Arc::new(HoldState::new(
            next_id(),
            name,
            keys,
            owner,
            FencingToken::new(fence),
            watchdog,
            lease.duration(),
            sent_at,
            label,
        ));
        if watchdog {
            self.inner.watchdog.register(&self.inner, state.clone());
        }
        scope::record(self.inner.id, &state);
        LockGuard {
            state,
            locker: self.clone(),
            reentrant: false,
            done: false,
        }
    }
}

/// The result of an acquisition that did not fail.
pub(super) enum Attempted {
    Held(LockGuard),
    /// Still busy at the deadline; the holder's remaining lease, if known.
    Busy(Option<Duration>),
}

pub(super) fn busy(
    name: &LockName,
    labelled: bool,
    started: Instant,
    pttl: Option<Duration>,
) -> Attempted {
    let label = metrics::name_label(labelled, name);
    metrics::count(metrics::BUSY, label.as_deref(), 1);
    tracing::debug!(
        name = name.for_logs(),
        waited_us = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX),
        holder_ttl_ms = pttl.map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
        "dlock: busy"
    );
    Attempted::Busy(pttl)
}

/// Whether retrying can't cure `err` (see [`crate::BackendError::is_permanent`]).
fn is_permanent(err: &LockError) -> bool {
    matches!(err, LockError::Backend(e) if e.is_permanent())
}

/// The deadline came: busy, or the backend error if Redis failed since the last answer.
fn gave_up(
    name: &LockName,
    labelled: bool,
    started: Instant,
    pttl: Option<Duration>,
    failed: Option<LockError>,
) -> Result<Attempted, LockError> {
    match failed {
        Some(err) => Err(err),
        None => Ok(busy(name, labelled, started, pttl)),
    }
}

/// A command whose reply may not have come: dropped while armed, it sends a release for its
/// owner in the background — on the command's own connection when there is one, so the release
/// arrives after it.
pub(super) struct InFlight {
    backend: Backend,
    pub(super) session: Option<Session>,
    keys: Arc<LockKeys>,
    owner: Arc<str>,
    fence_ttl: Option<Duration>,
    armed: bool,
}

impl InFlight {
    pub(super) fn new(locker: &Locker, keys: &Arc<LockKeys>, owner: &Arc<str>) -> Self {
        Self {
            backend: locker.inner.backend.clone(),
            session: None,
            keys: keys.clone(),
            owner: owner.clone(),
            fence_ttl: locker.inner.config.fence_ttl,
            armed: true,
        }
    }

    pub(super) fn disarm(&mut self) {
        self.armed = false;
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if !self.armed || !self.backend.is_remote() {
            return;
        }
        let (backend, session) = (self.backend.clone(), self.session.take());
        let (keys, owner, fence_ttl) = (self.keys.clone(), self.owner.clone(), self.fence_ttl);
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(async move {
                let session = match session {
                    Some(session) => session,
                    None => match backend.session().await {
                        Ok(session) => session,
                        Err(_) => return,
                    },
                };
                let _ = session.clean_up(&keys, &owner, fence_ttl).await;
            });
        }
    }
}
