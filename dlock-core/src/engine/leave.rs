//! A waiter's trace in Redis — a fair lock's place in line, a writer's recorded wait — that must
//! go when the waiter stops waiting without the hold.

use std::sync::Arc;

use super::*;
use crate::name::LockKeys;

/// Until disarmed (the waiter got the hold, which took its trace away), dropping this sends a
/// release for the waiter's token: on Redis in the background, after anything sent before it
/// on the same connection; on the memory store at once.
pub(crate) struct Leave {
    locker: Engine,
    keys: Arc<LockKeys>,
    owner: Arc<str>,
    armed: bool,
}

impl Leave {
    pub(crate) fn new(locker: &Engine, keys: &Arc<LockKeys>, owner: &Arc<str>) -> Self {
        Self {
            locker: locker.clone(),
            keys: keys.clone(),
            owner: owner.clone(),
            armed: true,
        }
    }

    /// The waiter goes on with a new token (its old one is cleaned up by the attempt that
    /// failed with it).
    pub(crate) fn set_owner(&mut self, owner: &Arc<str>) {
        self.owner = owner.clone();
    }

    /// The waiter got the hold.
    pub(crate) fn disarm(&mut self) {
        self.armed = false;
    }
}

impl Drop for Leave {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        if self.locker.inner.backend.is_remote() {
            drop(InFlight::new(&self.locker, &self.keys, &self.owner));
            return;
        }
        let (backend, keys, owner) = (
            self.locker.inner.backend.clone(),
            self.keys.clone(),
            self.owner.clone(),
        );
        at_once(async move {
            if let Ok(session) = backend.session().await {
                let _ = session.release(&keys, &owner, None, None).await;
            }
        });
    }
}

/// A plain-lock waiter's claim to the next turn (see the `protocol` module): once it has sent
/// one, a waiter that stops waiting without the lock takes it back — awaited when the request
/// gives up (so the next request sees the name as the holder left it), in the background when
/// the request is dropped.
pub(crate) struct LeaveTurn {
    locker: Engine,
    keys: Arc<LockKeys>,
    /// Since when the request waits (wall-clock ms), as in its claims.
    since: u64,
    /// The hand-over token its claims offered to be granted the lock, if any: a grant made to
    /// it goes too.
    offered: Option<Arc<str>>,
    claimed: bool,
}

impl LeaveTurn {
    pub(crate) fn new(locker: &Engine, keys: &Arc<LockKeys>, since: u64) -> Self {
        Self {
            locker: locker.clone(),
            keys: keys.clone(),
            since,
            offered: None,
            claimed: true,
        }
    }

    /// Its claims offer `token` to be granted the lock (a request is a head waiter once, with
    /// one token).
    pub(crate) fn offered(&mut self, token: &Arc<str>) {
        self.offered.get_or_insert_with(|| token.clone());
    }

    /// The request got the lock: its claim went with the hold it replaced.
    pub(crate) fn disarm(&mut self) {
        self.claimed = false;
    }

    /// The request gave up: its claim goes now (best effort; a claim left behind delays the
    /// lock by the time it asked for at most).
    pub(crate) async fn leave(mut self) {
        if !std::mem::take(&mut self.claimed) {
            return;
        }
        let (locker, keys, since) = (self.locker.clone(), self.keys.clone(), self.since);
        leave_turn(locker, keys, since, self.offered.take()).await;
    }
}

/// Takes back the claim of `locker`'s waiter since `since`, and lets go a grant to the token it
/// `offered`; its last waiter for the name also gives up a lock kept for `locker`.
async fn leave_turn(locker: Engine, keys: Arc<LockKeys>, since: u64, offered: Option<Arc<str>>) {
    let Ok(session) = locker.inner.backend.session().await else {
        return;
    };
    let last = locker.queue_users(&keys.lock) == 0;
    let id = &locker.inner.turn_id;
    let granted_to = offered.as_deref();
    if let Err(err) = session.leave_turn(&keys, id, since, last, granted_to).await {
        tracing::debug!(error = %err, "dlock: a waiter's claim to the next turn stays until it expires");
    }
}

impl Drop for LeaveTurn {
    fn drop(&mut self) {
        if !self.claimed {
            return;
        }
        let (locker, keys, since) = (self.locker.clone(), self.keys.clone(), self.since);
        let leave = leave_turn(locker.clone(), keys, since, self.offered.take());
        if locker.inner.backend.is_remote() {
            if let Ok(handle) = tokio::runtime::Handle::try_current() {
                handle.spawn(leave);
            }
        } else {
            at_once(leave);
        }
    }
}

/// Runs `work` to its end now, when every command it sends completes at once (an in-process
/// store): the next request sees the name as `work` leaves it. Should it wait after all, it
/// goes on in the background.
fn at_once(work: impl Future<Output = ()> + Send + 'static) {
    // Commands are bounded by tokio's timer, which needs the runtime.
    let Ok(handle) = tokio::runtime::Handle::try_current() else {
        return;
    };
    let mut work = Box::pin(work);
    if futures_util::FutureExt::now_or_never(&mut work).is_none() {
        handle.spawn(work);
    }
}
