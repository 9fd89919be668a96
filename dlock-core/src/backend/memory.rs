//! An in-process backend with the Redis backend's semantics: owner-checked holds with counts,
//! leases that expire, fencing tokens, and wake-ups on release.
//!
//! Time is tokio's, so tests can pause it and move it forward.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::time::Instant;

use super::{
    AcquireAllReply, AcquireReply, HandoffReply, RawInfo, ReleaseReply, RenewItem, RenewReply,
    Successor, Turn,
};
use crate::backend::wait::{Slots, Watch};
use crate::clock;
use crate::name::{KeyKind, LockKeys};

mod sorted_sets;

/// A store of locks living in this process. Several `Locker`s built on clones of one store see
/// the same locks, as several processes sharing one Redis would.
///
/// ```
/// use dlock_core::{Locker, MemoryStore};
///
/// let store = MemoryStore::new();
/// let a = Locker::memory_with(store.clone());
/// let b = Locker::memory_with(store);
/// # let _ = (a, b);
/// ```
#[derive(Clone, Default)]
pub struct MemoryStore {
    inner: Arc<StoreInner>,
}

#[derive(Default)]
struct StoreInner {
    state: Mutex<State>,
    slots: Arc<Slots>,
}

#[derive(Default)]
struct State {
    locks: HashMap<String, Held>,
    /// Fencing counter and last released owner, per lock key.
    fences: HashMap<String, (u64, Option<String>)>,
    /// Fair locks' lines, per lock key.
    lines: HashMap<String, Line>,
    /// Semaphores' permits (`id -> expiry`), per permits key.
    permits: HashMap<String, HashMap<String, Instant>>,
    /// Semaphores' counts set at run time, per count key.
    limits: HashMap<String, u32>,
    /// Read-write locks' waiting writers (`writer -> until when its wait counts`).
    waiting: HashMap<String, HashMap<String, Instant>>,
}

/// A fair lock's waiters in order: each with until when it counts as alive.
#[derive(Default)]
struct Line {
    waiters: Vec<(String, Instant)>,
}

struct Held {
    /// Empty while the name is kept after a release (`at_least`) or for the waiter next in turn.
    owner: String,
    fence: u64,
    expires: Instant,
    /// The sequence number of the last lease change applied.
    seq: u64,
    /// The waiter next in turn (see [`Turn`]).
    next: Option<NextUp>,
    /// Kept for the waiters of this `Locker` (after a release that found one next in turn).
    reserved: Option<String>,
}

/// A [`Claim`](super::Claim) kept with the hold, with its `Locker`.
struct NextUp {
    locker: String,
    window: Duration,
    since: u64,
}

impl Held {
    fn new(owner: &str, fence: u64, expires: Instant) -> Held {
        Held {
            owner: owner.to_owned(),
            fence,
            expires,
            seq: 0,
            next: None,
            reserved: None,
        }
    }
}

impl fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryStore")
            .field("locks", &self.state().locks.len())
            .finish()
    }
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.inner.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Removes a lock as an outside actor would (`DEL` on Redis): for tests of loss handling.
    /// `key` is the full key, as the `Locker` derives it (`<prefix>{<name>}`). Whatever else
    /// Redis keeps under that one key goes too: a semaphore's permits, a read-write lock's
    /// readers or waiting writers, a count set at run time (a fair lock's line has keys of its
    /// own and stays).
    pub fn delete(&self, key: &str) -> bool {
        let mut state = self.state();
        let lock = state.locks.remove(key).is_some();
        let permits = state.permits.remove(key).is_some();
        let waiting = state.waiting.remove(key).is_some();
        let limit = state.limits.remove(key).is_some();
        lock || permits || waiting || limit
    }

    /// How many unexpired holds the store holds: locks (write locks included), and permits and
    /// read locks, each counted once.
    pub fn len(&self) -> usize {
        let now = Instant::now();
        let state = self.state();
        let locks = state.locks.values().filter(|h| h.expires > now).count();
        let shared = state.permits.values().flat_map(|p| p.values());
        locks + shared.filter(|expiry| **expiry > now).count()
    }

    /// Whether the store holds no unexpired lock, permit or read lock.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The backend view of a [`MemoryStore`].
#[derive(Clone, Debug, Default)]
pub(crate) struct MemoryBackend {
    store: MemoryStore,
}

impl MemoryBackend {
    pub(crate) fn new(store: MemoryStore) -> Self {
        Self { store }
    }

    /// The live hold for `key`, dropping it if expired.
    fn live<'a>(state: &'a mut State, key: &str, now: Instant) -> Option<&'a mut Held> {
        if state.locks.get(key).is_some_and(|h| h.expires <= now) {
            state.locks.remove(key);
        }
        state.locks.get_mut(key)
    }

    fn next_fence(state: &mut State, key: &str) -> u64 {
        let entry = state.fences.entry(key.to_owned()).or_insert((0, None));
        entry.0 += 1;
        entry.0
    }

    pub(crate) fn acquire(
        &self,
        keys: &LockKeys,
        owner: &str,
        lease: Duration,
        turn: Turn<'_>,
    ) -> AcquireReply {
        match &keys.kind {
            KeyKind::Semaphore(sem) => return self.acquire_permit(keys, sem, owner, lease),
            KeyKind::Write(rw) => return self.acquire_write(keys, rw, owner, lease),
            KeyKind::Read(rw) => return self.acquire_read(rw, owner, lease),
            KeyKind::Lock => {
                if let Some(reply) = self.take_turn(keys, owner, lease, turn) {
                    return reply;
                }
            }
            KeyKind::Fair(_) => {}
        }
        match self.acquire_all(&[(keys, owner)], lease) {
            AcquireAllReply::Acquired { fences } => AcquireReply::Acquired {
                fence: fences.first().copied(),
            },
            AcquireAllReply::Busy { pttl, .. } => AcquireReply::Busy { pttl },
        }
    }

    /// A plain lock held or kept for someone else: taken by the head waiter of the `Locker` it is
    /// kept for,
    /// else busy (and marked as next in turn for it, if `turn` claims it and no claim as old or
    /// older is there). `None` when the lock is free or `owner`'s already.
    fn take_turn(
        &self,
        keys: &LockKeys,
        owner: &str,
        lease: Duration,
        turn: Turn<'_>,
    ) -> Option<AcquireReply> {
        let now = Instant::now();
        let mut state = self.store.state();
        let held = Self::live(&mut state, &keys.lock, now).filter(|h| h.owner != owner)?;
        if !turn.head || held.reserved.as_deref() != Some(turn.locker) {
            if let Some(claim) = turn.claim
                && held
                    .next
                    .as_ref()
                    .is_none_or(|next| next.since > claim.since)
            {
                held.next = Some(NextUp {
                    locker: turn.locker.to_owned(),
                    window: claim.window,
                    since: claim.since,
                });
            }
            return Some(AcquireReply::Busy {
                pttl: Some(held.expires - now),
            });
        }
        // Kept for this `Locker`: another that claimed a turn since stays next.
        let next = held.next.take().filter(|n| n.locker != turn.locker);
        let fence = Self::next_fence(&mut state, &keys.lock);
        let mut held = Held::new(owner, fence, clock::after(now, lease));
        held.next = next;
        state.locks.insert(keys.lock.clone(), held);
        Some(AcquireReply::Acquired { fence: Some(fence) })
    }

    /// A waiter of `locker` that claimed the next turn stops waiting (as the leave-turn script).
    pub(crate) fn leave_turn(&self, keys: &LockKeys, locker: &str, since: u64, last: bool) {
        let now = Instant::now();
        let mut state = self.store.state();
        let Some(held) = Self::live(&mut state, &keys.lock, now) else {
            return;
        };
        if (held.next.as_ref()).is_some_and(|n| n.locker == locker && (n.since == since || last)) {
            held.next = None;
        }
        if !last || held.reserved.as_deref() != Some(locker) {
            return;
        }
        match held.next.take() {
            Some(next) => {
                held.reserved = Some(next.locker);
                held.expires = clock::after(now, next.window);
            }
            None => {
                state.locks.remove(&keys.lock);
            }
        }
        drop(state);
        self.store.inner.slots.wake(keys.channel());
    }

    /// Every lock for its owner, or none, in one step (as the acquire-all script).
    pub(crate) fn acquire_all(
        &self,
        locks: &[(&LockKeys, &str)],
        lease: Duration,
    ) -> AcquireAllReply {
        let now = Instant::now();
        let mut state = self.store.state();
        for (index, (keys, owner)) in locks.iter().enumerate() {
            if let Some(held) = Self::live(&mut state, &keys.lock, now)
                && held.owner != *owner
            {
                return AcquireAllReply::Busy {
                    index,
                    pttl: Some(held.expires - now),
                };
            }
        }
        let mut fences = Vec::with_capacity(locks.len());
        for (keys, owner) in locks {
            if let Some(held) = Self::live(&mut state, &keys.lock, now) {
                fences.push(held.fence);
                continue;
            }
            let fence = Self::next_fence(&mut state, &keys.lock);
            let held = Held::new(owner, fence, clock::after(now, lease));
            state.locks.insert(keys.lock.clone(), held);
            fences.push(fence);
        }
        AcquireAllReply::Acquired { fences }
    }

    pub(crate) fn inspect(&self, keys: &LockKeys) -> RawInfo {
        let now = Instant::now();
        let mut state = self.store.state();
        let last_token = state.fences.get(&keys.lock).map(|f| f.0).filter(|n| *n > 0);
        let queued = state.lines.get(&keys.lock).map_or(0, |l| l.waiters.len());
        let mut info = RawInfo {
            last_token,
            queued: u64::try_from(queued).unwrap_or(u64::MAX),
            waiting: u64::try_from(self.store.inner.slots.watchers(keys.channel())).unwrap_or(0),
            ..RawInfo::default()
        };
        if let Some(held) = Self::live(&mut state, &keys.lock, now) {
            info.ttl = Some(held.expires - now);
            if held.owner.is_empty() {
                info.kept = held.reserved.is_none();
            } else {
                let prefix = held.owner.chars().take(8).collect();
                let label = held.owner.split_once('@').map(|(_, l)| l.to_owned());
                info.holders.push((prefix, label));
                info.token = Some(held.fence);
            }
        }
        info
    }

    /// Every live lock key.
    pub(crate) fn keys(&self) -> Vec<String> {
        let now = Instant::now();
        let state = self.store.state();
        (state.locks.iter())
            .filter(|(_, h)| h.expires > now)
            .map(|(k, _)| k.clone())
            .collect()
    }

    pub(crate) fn force_release(&self, keys: &LockKeys) -> bool {
        let removed = {
            let mut state = self.store.state();
            let now = Instant::now();
            Self::live(&mut state, &keys.lock, now).is_some()
                && state.locks.remove(&keys.lock).is_some()
        };
        if removed {
            self.store.inner.slots.wake(keys.channel());
            let head = Self::fair_head(&mut self.store.state(), &keys.lock, Instant::now());
            if let Some(head) = head {
                self.store.inner.slots.wake(&keys.waiter_channel(&head));
            }
        }
        removed
    }

    /// `owner`'s fencing token, if it holds the lock (the memory store mints every token with
    /// its grant).
    pub(crate) fn fence(&self, keys: &LockKeys, owner: &str) -> Option<u64> {
        match self.holds(keys, owner) {
            AcquireReply::Acquired { fence } => fence,
            AcquireReply::Busy { .. } => None,
        }
    }

    pub(crate) fn holds(&self, keys: &LockKeys, owner: &str) -> AcquireReply {
        let now = Instant::now();
        let mut state = self.store.state();
        if keys.is_member() {
            let held = (state.permits.get(&keys.lock))
                .and_then(|p| p.get(owner))
                .is_some_and(|expiry| *expiry > now);
            return if held {
                AcquireReply::Acquired { fence: Some(0) }
            } else {
                AcquireReply::Busy { pttl: None }
            };
        }
        match Self::live(&mut state, &keys.lock, now) {
            Some(held) if held.owner == owner => AcquireReply::Acquired {
                fence: Some(held.fence),
            },
            Some(held) => AcquireReply::Busy {
                pttl: Some(held.expires - now),
            },
            None => AcquireReply::Busy { pttl: None },
        }
    }

    fn release_locked(
        state: &mut State,
        keys: &LockKeys,
        owner: &str,
        handed_to: Option<&str>,
    ) -> ReleaseReply {
        let now = Instant::now();
        let holder = Self::live(state, &keys.lock, now).map(|held| held.owner.clone());
        match holder {
            Some(holder) if holder == owner || Some(holder.as_str()) == handed_to => {
                state.locks.remove(&keys.lock);
                state.fences.entry(keys.lock.clone()).or_insert((0, None)).1 =
                    Some(owner.to_owned());
                ReleaseReply::Released { woke: 0 }
            }
            holder => {
                let released_before = state
                    .fences
                    .get(&keys.lock)
                    .and_then(|f| f.1.as_deref())
                    .is_some_and(|o| o == owner);
                if released_before {
                    ReleaseReply::Released { woke: 0 }
                } else if holder.is_some() {
                    ReleaseReply::TakenOver
                } else {
                    ReleaseReply::Expired
                }
            }
        }
    }

    pub(crate) fn release(
        &self,
        keys: &LockKeys,
        owner: &str,
        handed_to: Option<&str>,
        keep: Option<Duration>,
    ) -> ReleaseReply {
        let mut state = self.store.state();
        let now = Instant::now();
        if keys.is_member() {
            let permits = state.permits.entry(keys.lock.clone()).or_default();
            let removed = permits.remove(owner);
            let given_back = removed.is_some_and(|expiry| expiry > now);
            let last = permits.is_empty();
            if last {
                state.permits.remove(&keys.lock);
            }
            drop(state);
            if removed.is_none() {
                return ReleaseReply::Expired;
            }
            // The last reader wakes the writers, even one whose lease had run out; every permit
            // given back wakes its waiters.
            let wake = if keys.semaphore_keys().is_some() {
                given_back
            } else {
                last
            };
            let woke = if wake {
                self.store.inner.slots.wake(keys.channel())
            } else {
                0
            };
            if !given_back {
                return ReleaseReply::Expired;
            }
            return ReleaseReply::Released {
                woke: u32::try_from(woke).unwrap_or(u32::MAX),
            };
        }
        // A writer that stops waiting lets the readers it held back in.
        let mut left = false;
        if let KeyKind::Write(rw) = &keys.kind
            && let Some(waiting) = state.waiting.get_mut(&rw.waiting)
        {
            left = waiting.remove(owner).is_some();
            if waiting.is_empty() {
                state.waiting.remove(&rw.waiting);
            }
        }
        if keys.fair_keys().is_some() {
            Self::leave(&mut state, &keys.lock, owner);
        }
        let released = Self::live(&mut state, &keys.lock, now)
            .filter(|h| h.owner == owner || Some(h.owner.as_str()) == handed_to)
            .map(|h| h.next.take());
        let releasing = released.is_some();
        let next = released.flatten();
        let reply = Self::release_locked(&mut state, keys, owner, handed_to);
        if releasing && let Some(keep) = keep {
            // Taken by nobody until `keep` has passed.
            let fence = state.fences.get(&keys.lock).map_or(0, |f| f.0);
            let held = Held::new("", fence, clock::after(now, keep));
            state.locks.insert(keys.lock.clone(), held);
        } else if let Some(next) = next {
            // Kept for the waiter next in turn, for the time it asked for.
            let fence = state.fences.get(&keys.lock).map_or(0, |f| f.0);
            let mut held = Held::new("", fence, clock::after(now, next.window));
            held.reserved = Some(next.locker);
            state.locks.insert(keys.lock.clone(), held);
        }
        if keys.fair_keys().is_some() {
            // Only the head of the line is woken: by every release (kept for an `at_least`
            // period, it learns the new expiry), and whenever the lock is left free.
            let free = Self::live(&mut state, &keys.lock, now).is_none();
            let head = (releasing || free).then(|| Self::fair_head(&mut state, &keys.lock, now));
            drop(state);
            let woke = match head.flatten() {
                Some(head) => self.store.inner.slots.wake(&keys.waiter_channel(&head)),
                None => 0,
            };
            return match reply {
                ReleaseReply::Released { .. } if releasing => ReleaseReply::Released {
                    woke: u32::try_from(woke).unwrap_or(u32::MAX),
                },
                reply => reply,
            };
        }
        let free = Self::live(&mut state, &keys.lock, now).is_none();
        drop(state);
        if left && free && !releasing {
            self.store.inner.slots.wake(keys.channel());
        }
        if let ReleaseReply::Released { .. } = reply {
            let woke = self.store.inner.slots.wake(keys.channel());
            return ReleaseReply::Released {
                woke: u32::try_from(woke).unwrap_or(u32::MAX),
            };
        }
        reply
    }

    pub(crate) fn handoff(
        &self,
        keys: &LockKeys,
        from: &str,
        to: Successor<'_>,
        lease: Duration,
    ) -> HandoffReply {
        let now = Instant::now();
        let mut state = self.store.state();
        match Self::live(&mut state, &keys.lock, now) {
            Some(held)
                if held.owner == from
                    && (held.next.as_ref().is_some_and(|n| n.locker != to.locker)
                        || self.store.inner.slots.watchers(keys.channel()) > 1) =>
            {
                drop(state);
                return match self.release(keys, from, None, None) {
                    ReleaseReply::Released { woke } => HandoffReply::ReleasedInstead { woke },
                    other => HandoffReply::NotHandedOver(other),
                };
            }
            Some(held) if held.owner == from => {}
            Some(_) => return HandoffReply::NotHandedOver(ReleaseReply::TakenOver),
            None => return HandoffReply::NotHandedOver(ReleaseReply::Expired),
        }
        state.fences.entry(keys.lock.clone()).or_insert((0, None)).1 = Some(from.to_owned());
        let fence = Self::next_fence(&mut state, &keys.lock);
        let held = Held::new(to.owner, fence, clock::after(now, lease));
        state.locks.insert(keys.lock.clone(), held);
        HandoffReply::HandedOver { fence }
    }

    pub(crate) fn renew(&self, items: &[RenewItem]) -> Vec<RenewReply> {
        let now = Instant::now();
        let mut state = self.store.state();
        items
            .iter()
            .map(|item| {
                if item.permit {
                    let permit = (state.permits.get_mut(&item.key))
                        .and_then(|p| p.get_mut(&item.owner))
                        .filter(|expiry| **expiry > now);
                    return match permit {
                        Some(expiry) => {
                            *expiry = clock::after(now, Duration::from_millis(item.lease_ms));
                            RenewReply::Applied
                        }
                        None => RenewReply::Gone,
                    };
                }
                Self::renew_lock(&mut state, item, now)
            })
            .collect()
    }

    fn renew_lock(state: &mut State, item: &RenewItem, now: Instant) -> RenewReply {
        match Self::live(state, &item.key, now) {
            Some(held) if held.owner == item.owner => {
                if item.seq > held.seq {
                    held.seq = item.seq;
                    held.expires = clock::after(now, Duration::from_millis(item.lease_ms));
                    RenewReply::Applied
                } else {
                    RenewReply::Stale
                }
            }
            _ => RenewReply::Gone,
        }
    }

    pub(crate) fn watch(&self, channel: &str) -> Watch {
        let (watch, _) = Watch::new(self.store.inner.slots.clone(), channel, None);
        watch.mark_confirmed();
        watch
    }
}
