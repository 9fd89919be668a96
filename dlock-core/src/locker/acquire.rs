//! The acquire path: cancellation-safe attempts, re-entry, and waiting at the head of the local queue.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;

use super::*;
use crate::backend::{AcquireReply, Backend};
use crate::error::{BackendError, LockError};
use crate::guard::{FencingToken, HoldState, LockGuard, LossReason};
use crate::name::{LockKeys, LockName};
use crate::scope;

impl Locker {
    /// One acquisition attempt, cancellation-safe: dropping the caller's future never leaks a
    /// lock that Redis granted.
    ///
    /// Over one pipelined connection the attempt runs inline: if it is dropped (or fails, and so
    /// may have been granted), a release for its token is sent down the same connection, where
    /// it can only arrive after the attempt. Over a pool, whose connections are not ordered with
    /// each other, the attempt runs in its own task, which releases what it was granted if
    /// nobody is left to take it.
    async fn attempt(
        &self,
        keys: &Arc<LockKeys>,
        owner: &Arc<str>,
        lease: Duration,
        fresh: bool,
    ) -> Result<AcquireReply, LockError> {
        let fence_ttl = self.inner.config.fence_ttl;
        if !self.inner.backend.is_remote() {
            return self
                .inner
                .backend
                .acquire(keys, owner, lease, fence_ttl, !fresh)
                .await
                .map_err(LockError::Backend);
        }
        if self.inner.backend.is_ordered() {
            let mut in_flight = InFlight {
                backend: &self.inner.backend,
                keys,
                owner,
                armed: fresh,
            };
            let res = self
                .inner
                .backend
                .acquire(keys, owner, lease, fence_ttl, !fresh)
                .await;
            // Answered: the caller turns a grant into a guard before its next `.await`. An
            // error leaves the clean-up armed, as the script may have run.
            if res.is_ok() {
                in_flight.armed = false;
            }
            return res.map_err(LockError::Backend);
        }
        let (tx, rx) = oneshot::channel();
        let backend = self.inner.backend.clone();
        let (task_keys, task_owner) = (keys.clone(), owner.clone());
        tokio::spawn(async move {
            let (keys, owner) = (task_keys, task_owner);
            let res = backend
                .acquire(&keys, &owner, lease, fence_ttl, !fresh)
                .await;
            // On an error the script may still have run: treat the lock as possibly granted.
            let maybe_granted = matches!(res, Ok(AcquireReply::Acquired { .. }) | Err(_));
            let failed = res.is_err();
            let undelivered = tx.send(res).is_err();
            if fresh && maybe_granted && (undelivered || failed) {
                let _ = backend.release(&keys, &owner).await;
            }
        });
        let mut pending = PendingAttempt {
            rx: Some(rx),
            backend: &self.inner.backend,
            keys,
            owner,
            fresh,
        };
        let answer = match pending.rx.as_mut() {
            Some(rx) => rx.await,
            None => return Err(LockError::Config("attempt already answered".to_owned())),
        };
        pending.rx = None;
        match answer {
            Ok(res) => res.map_err(LockError::Backend),
            Err(_) => Err(LockError::Backend(BackendError::protocol(
                "acquisition task ended without an answer",
            ))),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn new_hold(
        &self,
        name: LockName,
        keys: Arc<LockKeys>,
        owner: Arc<str>,
        fence: u64,
        lease: Lease,
        sent_at: Instant,
    ) -> LockGuard {
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

    pub(super) async fn acquire(
        self,
        name: LockName,
        wait: Duration,
        lease: Lease,
    ) -> Result<Attempted, LockError> {
        let started = Instant::now();
        let deadline = started + wait;
        let keys = Arc::new(LockKeys::new(&self.inner.config.prefix, &name));

        // Re-entry inside a lock scope.
        if let Some(hold) = scope::find(self.inner.id, &keys.lock) {
            hold.holds.fetch_add(1, Ordering::AcqRel);
            let reply = self.attempt(&keys, &hold.owner, hold.lease(), false).await;
            match reply {
                Ok(AcquireReply::Acquired { .. }) => {
                    tracing::debug!(name = %name, fencing_token = hold.fence.get(), "dlock: re-entered");
                    return Ok(Attempted::Held(LockGuard {
                        state: hold,
                        locker: self.clone(),
                        reentrant: true,
                        done: false,
                    }));
                }
                Ok(AcquireReply::Busy { .. }) => {
                    hold.holds.fetch_sub(1, Ordering::AcqRel);
                    hold.mark_lost(LossReason::Gone);
                }
                Err(err) => {
                    hold.holds.fetch_sub(1, Ordering::AcqRel);
                    return Err(err);
                }
            }
        }

        let owner = new_owner();
        // A first attempt, ahead of any local queue — unless local waiters are holding back for
        // other processes right now.
        let holding_back = !wait.is_zero()
            && self
                .existing_queue(&keys.lock)
                .is_some_and(|q| q.deferred().is_some());
        let mut pttl = None;
        if !holding_back {
            let sent_at = Instant::now();
            match self.attempt(&keys, &owner, lease.duration(), true).await? {
                AcquireReply::Acquired { fence, .. } => {
                    return Ok(Attempted::Held(
                        self.acquired(name, keys, owner, fence, lease, sent_at, started),
                    ));
                }
                AcquireReply::Busy { pttl: now_pttl } => pttl = now_pttl,
            }
            if wait.is_zero() {
                return Ok(busy(&name, started, pttl));
            }
        }

        // Queue behind local waiters for the same name; only the head waits in Redis.
        let ticket = self.queue(&keys.lock);
        let Ok(_turn) = tokio::time::timeout_at(deadline, ticket.queue.turn.lock()).await else {
            return Ok(busy(&name, started, pttl));
        };
        let mut head = HeadWait::new(&self, &ticket.queue, &keys, lease.duration()).await;
        let handoff_owner = head.handoff_owner.clone();
        loop {
            let (watch, rx) = head.parts();
            let notified = watch.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if let Some(until) = ticket.queue.deferred() {
                tokio::time::sleep_until(until.min(deadline)).await;
            }
            let sent_at = Instant::now();
            match self.attempt(&keys, &owner, lease.duration(), true).await? {
                AcquireReply::Acquired { fence, .. } => {
                    return Ok(Attempted::Held(
                        self.acquired(name, keys, owner, fence, lease, sent_at, started),
                    ));
                }
                AcquireReply::Busy { pttl: now_pttl } => pttl = now_pttl,
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(busy(&name, started, pttl));
            }
            // The fallback timer: the holder's remaining lease (a lock nobody releases expires
            // then), or a short poll when wake-ups can't be delivered.
            let fallback = match (watch.is_reliable(), pttl) {
                (true, Some(pttl)) => pttl + Duration::from_millis(1),
                (true, None) => self.inner.config.poll_interval,
                (false, Some(pttl)) => pttl.min(self.inner.config.poll_interval),
                (false, None) => self.inner.config.poll_interval,
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
        metrics::counter!("dlock_acquired_total").increment(1);
        metrics::histogram!("dlock_wait_seconds").record(waited.as_secs_f64());
        tracing::debug!(
            name = %name,
            fencing_token = fence,
            waited_us = u64::try_from(waited.as_micros()).unwrap_or(u64::MAX),
            "dlock: acquired"
        );
        self.new_hold(name, keys, owner, fence, lease, sent_at)
    }
}

/// The result of an acquisition that did not fail.
pub(super) enum Attempted {
    Held(LockGuard),
    /// Still busy at the deadline; the holder's remaining lease, if known.
    Busy(Option<Duration>),
}

pub(super) fn busy(name: &LockName, started: Instant, pttl: Option<Duration>) -> Attempted {
    metrics::counter!("dlock_busy_total").increment(1);
    tracing::debug!(
        name = %name,
        waited_us = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX),
        holder_ttl_ms = pttl.map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
        "dlock: busy"
    );
    Attempted::Busy(pttl)
}

/// An inline attempt; dropped while armed, it releases its token in the background.
pub(super) struct InFlight<'a> {
    pub(super) backend: &'a Backend,
    pub(super) keys: &'a Arc<LockKeys>,
    pub(super) owner: &'a Arc<str>,
    pub(super) armed: bool,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let backend = self.backend.clone();
        let (keys, owner) = (self.keys.clone(), self.owner.clone());
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(async move {
                let _ = backend.release(&keys, &owner).await;
            });
        }
    }
}

/// The receiving end of an attempt that runs in its own task. Dropped before the answer was
/// taken (the caller's future was dropped), it releases a lock the attempt was granted.
struct PendingAttempt<'a> {
    rx: Option<oneshot::Receiver<Result<AcquireReply, BackendError>>>,
    backend: &'a Backend,
    keys: &'a Arc<LockKeys>,
    owner: &'a Arc<str>,
    fresh: bool,
}

impl Drop for PendingAttempt<'_> {
    fn drop(&mut self) {
        let granted = self
            .rx
            .as_mut()
            .and_then(reclaim)
            .is_some_and(|answer| matches!(answer, Ok(AcquireReply::Acquired { .. })));
        if granted && self.fresh {
            let backend = self.backend.clone();
            let (keys, owner) = (self.keys.clone(), self.owner.clone());
            if let Ok(handle) = tokio::runtime::Handle::try_current() {
                handle.spawn(async move {
                    let _ = backend.release(&keys, &owner).await;
                });
            }
        }
    }
}
