//! Fair locks: waiters stand in one line in Redis and get the lock in the order they came,
//! across processes (see [`Locker::fair_lock`](crate::Locker::fair_lock)).

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::acquire::{busy, gave_up};
use super::leave::Leave;
use super::*;
use crate::backend::{AcquireReply, FairReply};
use crate::clock;
use crate::error::LockError;
use crate::name::{LockKeys, LockName};
use crate::scope;

impl Engine {
    /// One attempt at the fair lock for `owner`, joining (or staying in) the line when `alive`
    /// is set. Cancellation-safe like [`attempt`](Self::attempt): a dropped or failed call is
    /// followed by a release for `owner`, which also takes it out of the line.
    async fn attempt_fair(
        &self,
        keys: &Arc<LockKeys>,
        owner: &Arc<str>,
        lease: Duration,
        alive: Option<Duration>,
    ) -> Result<FairReply, LockError> {
        let session = self.session().await?;
        let mut in_flight = InFlight::new(self, keys, owner);
        in_flight.session = Some(session.clone());
        let fence_ttl = self.inner.config.fence_ttl;
        let res = (session.acquire_fair(keys, owner, lease, fence_ttl, alive)).await;
        if res.is_ok() {
            in_flight.disarm();
        }
        res.map_err(LockError::Backend)
    }

    /// Acquires the fair lock `name`: one attempt that does not join the line, then, if it may
    /// wait, a place in line, renewed by an attempt at least every third of the dead-waiter
    /// timeout, until the head's wake-up or the deadline.
    pub(crate) async fn acquire_fair(
        self,
        name: LockName,
        wait: Duration,
        lease: Lease,
    ) -> Result<Attempted, LockError> {
        let started = Instant::now();
        let deadline = clock::after(started, wait);
        let keys = Arc::new(LockKeys::fair(&self.inner.config.prefix, &name));
        let labelled = self.inner.config.metrics_name_label;
        if let Some(hold) = scope::find(self.inner.id, &keys.lock)
            && let Some(guard) = self.reenter(hold).await?
        {
            return Ok(Attempted::Held(guard));
        }
        let mut owner = self.new_owner();
        let mut failed: Option<LockError> = None;
        let mut pttl = None;

        let sent_at = Instant::now();
        let reply = self
            .attempt_fair(&keys, &owner, lease.duration(), None)
            .await;
        let mut came_back = Instant::now();
        match reply {
            Ok(FairReply {
                reply: AcquireReply::Acquired { fence },
                ..
            }) => {
                let guard = self.acquired(name, keys, owner, fence, lease, sent_at, started);
                return Ok(Attempted::Held(guard));
            }
            Ok(FairReply {
                reply: AcquireReply::Busy { pttl: now_pttl },
                ..
            }) => pttl = now_pttl,
            Err(err) if wait.is_zero() || is_permanent(&err) => return Err(err),
            Err(err) => {
                owner = self.new_owner();
                failed = Some(err);
            }
        }
        if wait.is_zero() {
            return Ok(busy(&name, labelled, started, pttl));
        }

        let alive = self.inner.config.dead_waiter_timeout;
        // Shows the waiter alive well before its time is up, whatever the round trip takes.
        let heartbeat = alive / 3;
        let mut place = Place::new(&self, &keys, &owner, deadline).await;
        loop {
            let watch = place.watch.clone();
            let notified = watch.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if came_back >= deadline {
                return gave_up(&name, labelled, started, pttl, failed);
            }
            let sent_at = Instant::now();
            let reply = self
                .attempt_fair(&keys, &owner, lease.duration(), Some(alive))
                .await;
            came_back = Instant::now();
            let head;
            match reply {
                Ok(FairReply {
                    reply: AcquireReply::Acquired { fence },
                    ..
                }) => {
                    place.left();
                    let guard = self.acquired(name, keys, owner, fence, lease, sent_at, started);
                    return Ok(Attempted::Held(guard));
                }
                Ok(FairReply {
                    reply: AcquireReply::Busy { pttl: now_pttl },
                    place: at,
                }) => {
                    pttl = now_pttl;
                    head = at == Some(0);
                    failed = None;
                }
                Err(err) if is_permanent(&err) => return Err(err),
                Err(err) => {
                    // The clean-up of that attempt takes `owner` out of the line: stand in line
                    // again with a fresh token (and its own wake-up channel).
                    owner = self.new_owner();
                    place = Place::new(&self, &keys, &owner, deadline).await;
                    failed = Some(err);
                    continue;
                }
            }
            let now = Instant::now();
            if now >= deadline {
                return gave_up(&name, labelled, started, pttl, failed);
            }
            // The head also wakes when the holder's lease would run out; everyone wakes to show
            // they are alive; without wake-ups, everyone polls.
            let mut sleep = heartbeat;
            if head {
                let lease_left = pttl.map_or(heartbeat, |p| p + Duration::from_millis(1));
                sleep = sleep.min(lease_left);
            }
            if !watch.is_reliable() {
                sleep = sleep.min(self.inner.config.poll_interval);
            }
            tokio::select! {
                biased;
                () = &mut notified => {}
                () = tokio::time::sleep_until(deadline.min(now + sleep)) => {}
            }
        }
    }
}

/// A waiter's place in a fair lock's line: its wake-up registration, and, until it got the
/// lock, a release for its token that takes it out of the line when the waiter stops waiting
/// (its deadline, an error, or its future dropped).
struct Place {
    watch: Arc<crate::backend::wait::Watch>,
    leave: Leave,
}

impl Place {
    /// Subscribes to `owner`'s wake-up channel (before the first attempt that joins the line,
    /// so no wake-up is missed).
    async fn new(
        locker: &Engine,
        keys: &Arc<LockKeys>,
        owner: &Arc<str>,
        deadline: Instant,
    ) -> Self {
        let leave = Leave::new(locker, keys, owner);
        let channel = keys.waiter_channel(owner);
        let watch = Arc::new(locker.inner.backend.watch(&channel, deadline).await);
        Self { watch, leave }
    }

    /// The waiter got the lock, which took it out of the line.
    fn left(&mut self) {
        self.leave.disarm();
    }
}
