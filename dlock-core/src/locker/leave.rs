//! A waiter's trace in Redis — a fair lock's place in line, a writer's recorded wait — that must
//! go when the waiter stops waiting without the hold.

use std::sync::Arc;

use super::*;
use crate::name::LockKeys;

/// Until disarmed (the waiter got the hold, which took its trace away), dropping this sends a
/// release for the waiter's token: on Redis in the background, after anything sent before it
/// on the same connection; on the memory store at once.
pub(super) struct Leave {
    locker: Locker,
    keys: Arc<LockKeys>,
    owner: Arc<str>,
    armed: bool,
}

impl Leave {
    pub(super) fn new(locker: &Locker, keys: &Arc<LockKeys>, owner: &Arc<str>) -> Self {
        Self {
            locker: locker.clone(),
            keys: keys.clone(),
            owner: owner.clone(),
            armed: true,
        }
    }

    /// The waiter goes on with a new token (its old one is cleaned up by the attempt that
    /// failed with it).
    pub(super) fn set_owner(&mut self, owner: &Arc<str>) {
        self.owner = owner.clone();
    }

    /// The waiter got the hold.
    pub(super) fn disarm(&mut self) {
        self.armed = false;
    }
}

impl Drop for Leave {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        match &self.locker.inner.backend {
            Backend::Memory(m) => {
                let _ = m.release(&self.keys, &self.owner, None, None);
            }
            Backend::Redis(_) => drop(InFlight::new(&self.locker, &self.keys, &self.owner)),
        }
    }
}
