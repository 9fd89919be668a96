//! The memory store's kinds of hold that Redis keeps in sorted sets: fair locks' lines,
//! semaphores' permits, read-write locks' readers and waiting writers.

use std::time::Duration;

use tokio::time::Instant;

use super::{Held, MemoryBackend, State};
use crate::backend::{AcquireReply, FairReply};
use crate::clock;
use crate::name::{LockKeys, RwKeys, SemaphoreKeys};

impl MemoryBackend {
    /// The first waiter in `lock_key`'s line still alive (those ahead of it whose time is up
    /// leave the line), as the fair scripts find it.
    pub(super) fn fair_head(state: &mut State, lock_key: &str, now: Instant) -> Option<String> {
        let line = state.lines.get_mut(lock_key)?;
        let dead = line.waiters.iter().take_while(|(_, alive)| *alive <= now);
        let dead = dead.count();
        line.waiters.drain(..dead);
        let head = line.waiters.first().map(|(owner, _)| owner.clone());
        if head.is_none() {
            state.lines.remove(lock_key);
        }
        head
    }

    /// `owner` leaves `lock_key`'s line (if it is in it).
    pub(super) fn leave(state: &mut State, lock_key: &str, owner: &str) {
        if let Some(line) = state.lines.get_mut(lock_key) {
            line.waiters.retain(|(o, _)| o != owner);
            if line.waiters.is_empty() {
                state.lines.remove(lock_key);
            }
        }
    }

    /// A fair lock's attempt, as the fair acquire script.
    pub(crate) fn acquire_fair(
        &self,
        keys: &LockKeys,
        owner: &str,
        lease: Duration,
        alive: Option<Duration>,
    ) -> FairReply {
        let now = Instant::now();
        let mut state = self.store.state();
        let join = |state: &mut State| {
            let alive = alive?;
            let line = state.lines.entry(keys.lock.clone()).or_default();
            let until = clock::after(now, alive);
            match line.waiters.iter().position(|(o, _)| o == owner) {
                Some(place) => {
                    line.waiters[place].1 = until;
                    u64::try_from(place).ok()
                }
                None => {
                    line.waiters.push((owner.to_owned(), until));
                    u64::try_from(line.waiters.len() - 1).ok()
                }
            }
        };
        if let Some(held) = Self::live(&mut state, &keys.lock, now) {
            if held.owner == owner {
                return FairReply {
                    reply: AcquireReply::Acquired {
                        fence: Some(held.fence),
                    },
                    place: None,
                };
            }
            let pttl = Some(held.expires - now);
            let place = join(&mut state);
            return FairReply {
                reply: AcquireReply::Busy { pttl },
                place,
            };
        }
        match Self::fair_head(&mut state, &keys.lock, now) {
            Some(head) if head != owner => {
                let place = join(&mut state);
                drop(state);
                self.store.inner.slots.wake(&keys.waiter_channel(&head));
                FairReply {
                    reply: AcquireReply::Busy { pttl: None },
                    place,
                }
            }
            _ => {
                Self::leave(&mut state, &keys.lock, owner);
                let fence = Self::next_fence(&mut state, &keys.lock);
                let held = Held::new(owner, fence, clock::after(now, lease));
                state.locks.insert(keys.lock.clone(), held);
                FairReply {
                    reply: AcquireReply::Acquired { fence: Some(fence) },
                    place: None,
                }
            }
        }
    }

    pub(super) fn acquire_permit(
        &self,
        keys: &LockKeys,
        sem: &SemaphoreKeys,
        owner: &str,
        lease: Duration,
    ) -> AcquireReply {
        let now = Instant::now();
        let mut state = self.store.state();
        let limit = state.limits.get(&sem.limit).copied().unwrap_or(sem.permits);
        let permits = state.permits.entry(keys.lock.clone()).or_default();
        permits.retain(|_, expiry| *expiry > now);
        let reply = if permits.contains_key(owner) || permits.len() < limit as usize {
            permits.insert(owner.to_owned(), clock::after(now, lease));
            AcquireReply::Acquired { fence: Some(0) }
        } else {
            let first = permits.values().min().map(|e| *e - now);
            AcquireReply::Busy { pttl: first }
        };
        Self::drop_empty(&mut state, &keys.lock, None);
        reply
    }

    /// Removes the sets of `members` and `waiting` if they are empty, as Redis deletes a sorted
    /// set with its last member: a name nobody holds or waits for keeps nothing in memory.
    fn drop_empty(state: &mut State, members: &str, waiting: Option<&str>) {
        if state.permits.get(members).is_some_and(|m| m.is_empty()) {
            state.permits.remove(members);
        }
        if let Some(waiting) = waiting
            && state.waiting.get(waiting).is_some_and(|w| w.is_empty())
        {
            state.waiting.remove(waiting);
        }
    }

    /// A writer's attempt, as the write script: its wait recorded while it is kept out.
    pub(super) fn acquire_write(
        &self,
        keys: &LockKeys,
        rw: &RwKeys,
        owner: &str,
        lease: Duration,
    ) -> AcquireReply {
        let mut state = self.store.state();
        let reply = Self::write_attempt(&mut state, keys, rw, owner, lease);
        Self::drop_empty(&mut state, &rw.readers, Some(&rw.waiting));
        reply
    }

    fn write_attempt(
        state: &mut State,
        keys: &LockKeys,
        rw: &RwKeys,
        owner: &str,
        lease: Duration,
    ) -> AcquireReply {
        let now = Instant::now();
        let readers = state.permits.entry(rw.readers.clone()).or_default();
        readers.retain(|_, expiry| *expiry > now);
        let first_reader = readers.values().min().map(|e| *e - now);
        let waiting = state.waiting.entry(rw.waiting.clone()).or_default();
        waiting.retain(|_, until| *until > now);
        let busy = |state: &mut State, pttl| {
            if let Some(counts) = rw.wait_counts {
                let waiting = state.waiting.entry(rw.waiting.clone()).or_default();
                waiting.insert(owner.to_owned(), clock::after(now, counts));
            }
            AcquireReply::Busy { pttl }
        };
        if let Some(held) = Self::live(state, &keys.lock, now) {
            if held.owner == owner {
                return AcquireReply::Acquired {
                    fence: Some(held.fence),
                };
            }
            let pttl = Some(held.expires - now);
            return busy(state, pttl);
        }
        if first_reader.is_some() {
            return busy(state, first_reader);
        }
        if let Some(waiting) = state.waiting.get_mut(&rw.waiting) {
            waiting.remove(owner);
        }
        let fence = Self::next_fence(state, &keys.lock);
        let held = Held::new(owner, fence, clock::after(now, lease));
        state.locks.insert(keys.lock.clone(), held);
        AcquireReply::Acquired { fence: Some(fence) }
    }

    /// A reader's attempt, as the read script.
    pub(super) fn acquire_read(&self, rw: &RwKeys, owner: &str, lease: Duration) -> AcquireReply {
        let mut state = self.store.state();
        let reply = Self::read_attempt(&mut state, rw, owner, lease);
        Self::drop_empty(&mut state, &rw.readers, Some(&rw.waiting));
        reply
    }

    fn read_attempt(state: &mut State, rw: &RwKeys, owner: &str, lease: Duration) -> AcquireReply {
        let now = Instant::now();
        let readers = state.permits.entry(rw.readers.clone()).or_default();
        readers.retain(|_, expiry| *expiry > now);
        if readers.contains_key(owner) {
            return AcquireReply::Acquired { fence: Some(0) };
        }
        if let Some(held) = Self::live(state, &rw.write, now) {
            return AcquireReply::Busy {
                pttl: Some(held.expires - now),
            };
        }
        let waiting = state.waiting.entry(rw.waiting.clone()).or_default();
        waiting.retain(|_, until| *until > now);
        if rw.prefer_writers && !waiting.is_empty() {
            return AcquireReply::Busy { pttl: None };
        }
        let readers = state.permits.entry(rw.readers.clone()).or_default();
        readers.insert(owner.to_owned(), clock::after(now, lease));
        AcquireReply::Acquired { fence: Some(0) }
    }

    /// Sets (or, with `None`, removes) a semaphore's count and wakes its waiters.
    pub(crate) fn set_permits(&self, keys: &LockKeys, permits: Option<u32>) {
        if let Some(sem) = keys.semaphore_keys() {
            let mut state = self.store.state();
            match permits {
                Some(n) => state.limits.insert(sem.limit.clone(), n),
                None => state.limits.remove(&sem.limit),
            };
        }
        self.store.inner.slots.wake(keys.channel());
    }

    /// A semaphore's unexpired permits, and the count set at run time.
    pub(crate) fn permits(&self, keys: &LockKeys) -> (u32, Option<u32>) {
        let now = Instant::now();
        let state = self.store.state();
        let held =
            (state.permits.get(&keys.lock)).map_or(0, |p| p.values().filter(|e| **e > now).count());
        let set = keys
            .semaphore_keys()
            .and_then(|sem| state.limits.get(&sem.limit).copied());
        (u32::try_from(held).unwrap_or(u32::MAX), set)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::ReleaseReply;
    use crate::name::LockName;

    /// Writers and readers that come and go (kept out, waiting, let in) leave no set behind in
    /// memory, as Redis deletes a sorted set with its last member.
    #[test]
    fn read_write_attempts_leave_no_empty_set_behind() {
        let backend = MemoryBackend::default();
        let name = LockName::new("rw").expect("name");
        let wait = Some(Duration::from_secs(5));
        let write = LockKeys::read_write("p:", &name, true, true, wait);
        let read = LockKeys::read_write("p:", &name, false, true, None);
        let (Some(rw), lease) = (write.rw_keys(), Duration::from_secs(5)) else {
            panic!("a writer's keys have the read-write keys");
        };
        let reader = backend.acquire_read(rw, "r1", lease);
        assert!(matches!(reader, AcquireReply::Acquired { .. }));
        // Kept out by the reader: its wait is recorded.
        let kept_out = backend.acquire_write(&write, rw, "w1", lease);
        assert!(matches!(kept_out, AcquireReply::Busy { .. }));
        assert!(backend.store.state().waiting.contains_key(&rw.waiting));
        assert!(matches!(
            backend.release(&read, "r1", None, None),
            ReleaseReply::Released { .. }
        ));
        let writer = backend.acquire_write(&write, rw, "w1", lease);
        assert!(matches!(writer, AcquireReply::Acquired { .. }));
        // A reader kept out by the writer.
        let reader = backend.acquire_read(rw, "r2", lease);
        assert!(matches!(reader, AcquireReply::Busy { .. }));
        assert!(matches!(
            backend.release(&write, "w1", None, None),
            ReleaseReply::Released { .. }
        ));
        let state = backend.store.state();
        assert!(state.permits.is_empty(), "a readers' set is left");
        assert!(state.waiting.is_empty(), "a waiting writers' set is left");
        assert!(state.locks.is_empty());
    }
}
