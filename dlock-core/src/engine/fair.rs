//! Fair locks: waiters stand in one line in Redis and get the lock in the order they came,
//! across processes (see [`Locker::fair_lock`](crate::Locker::fair_lock)).

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::leave::Leave;
use super::waiter::{Step, Waiter};
use super::*;
use crate::backend::FairReply;
use crate::clock;
use crate::error::LockError;
use crate::name::{LockKeys, LockName};
use crate::scope;

impl Engine {
    /// One attempt at the fair lock for `owner`, joining (or staying in) the line at `place`
    /// (`owner`'s own when `None`) when `alive` is set, sent at `sent_at`. Cancellation-safe like
    /// [`attempt`](Self::attempt): a dropped or failed call is followed by a release for
    /// `owner`, which also takes `owner` (not a place of its own) out of the line.
    async fn attempt_fair(
        &self,
        keys: &Arc<LockKeys>,
        (owner, place): (&Arc<str>, Option<&str>),
        lease: Duration,
        alive: Option<Duration>,
        sent_at: Instant,
    ) -> Result<FairReply, LockError> {
        let session = self.session().await?;
        let mut in_flight = InFlight::new(self, keys, owner).sent_at(sent_at);
        in_flight.session = Some(session.clone());
        let fence_ttl = self.inner.config.fence_ttl;
        let res = (session.acquire_fair(keys, (owner, place), lease, fence_ttl, alive)).await;
        in_flight.settle(&res).await;
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
        self.inner.backend.offers(&keys.kind)?;
        if let Some(hold) = scope::find(self.inner.id, &keys.lock)
            && let Some(guard) = self.reenter(hold).await?
        {
            return Ok(Attempted::Held(guard));
        }
        let mut waiter = Waiter::new(&self, name, keys, lease, (started, deadline));

        let sent_at = Instant::now();
        let first = (&waiter.owner, None);
        let reply = (self.attempt_fair(&waiter.keys, first, lease.duration(), None, sent_at)).await;
        match waiter.step(
            &self,
            reply.map(|r| r.reply),
            Instant::now(),
            !wait.is_zero(),
        ) {
            Step::Acquired(fence) => return Ok(waiter.held(&self, fence, sent_at)),
            Step::Failed(err) => return Err(err),
            Step::Busy | Step::Retry => {}
        }
        if wait.is_zero() {
            return Ok(waiter.busy());
        }

        let alive = self.inner.config.dead_waiter_timeout;
        // Shows the waiter alive well before its time is up, whatever the round trip takes.
        let heartbeat = alive / 3;
        // The waiter's place in line: a token of its own, kept while attempts fail and their
        // owner tokens are released (scripts that name the place by the owner token make a new
        // place with each new token).
        // (Layout 1's frozen scripts name the place by the owner token.)
        let keeps_place = !self.inner.backend.runs_frozen_layout();
        let mut place_id = if keeps_place {
            self.new_owner()
        } else {
            waiter.owner.clone()
        };
        let mut place = Place::new(&self, &waiter.keys, &place_id, deadline).await;
        loop {
            let watch = place.watch.clone();
            let notified = watch.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if waiter.out_of_time() {
                return waiter.gave_up();
            }
            let sent_at = Instant::now();
            let at = (&waiter.owner, keeps_place.then_some(&*place_id));
            let reply = self
                .attempt_fair(&waiter.keys, at, lease.duration(), Some(alive), sent_at)
                .await;
            let head = matches!(&reply, Ok(r) if r.place == Some(0));
            match waiter.step(&self, reply.map(|r| r.reply), Instant::now(), true) {
                Step::Acquired(fence) => {
                    place.left();
                    return Ok(waiter.held(&self, fence, sent_at));
                }
                Step::Failed(err) => return Err(err),
                Step::Busy => {}
                // The clean-up of that attempt releases the old owner token, not the place:
                // the waiter keeps it, and tries again after a poll interval.
                Step::Retry if keeps_place => {}
                Step::Retry => {
                    // The clean-up of that attempt takes the old token, which was the place,
                    // out of the line: stand in line again with the fresh one (and its own
                    // wake-up channel).
                    place_id = waiter.owner.clone();
                    place = Place::new(&self, &waiter.keys, &place_id, deadline).await;
                    continue;
                }
            }
            if Instant::now() >= deadline {
                return waiter.gave_up();
            }
            // The head also wakes when the holder's lease would run out; everyone wakes to show
            // they are alive; without wake-ups, everyone polls.
            let mut sleep = heartbeat;
            if head {
                let lease_left = (waiter.pttl).map_or(heartbeat, |p| p + Duration::from_millis(1));
                sleep = sleep.min(lease_left);
            }
            if !watch.is_reliable() || waiter.foreign || waiter.failed.is_some() {
                sleep = sleep.min(self.inner.config.poll_interval);
            }
            let nothing_handed = std::future::pending::<Option<()>>();
            waiter.sleep(notified.as_mut(), sleep, nothing_handed).await;
        }
    }
}

/// A waiter's place in a fair lock's line: its wake-up registration, and, until it got the
/// lock, a release for the place's token that takes it out of the line when the waiter stops
/// waiting (its deadline, an error, or its future dropped).
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
