//! Local waiters: one queue per name, whose head alone waits in Redis, and the hand-over from a
//! local releaser to the head in one round trip.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;

use super::*;
use crate::backend::wait::Watch;
use crate::backend::{HandoffReply, Successor};
use crate::error::ReleaseOutcome;
use crate::hold::HoldState;
use crate::name::LockKeys;
use std::collections::HashMap;
use std::sync::atomic::AtomicU32;
use std::sync::{Mutex, MutexGuard, OnceLock};

/// After this many hand-overs in a row inside one process, a release goes through Redis so
/// waiters in other processes get their chance.
const MAX_HANDOFF_STREAK: u32 = 16;

/// After such a release, local waiters hold back this long so that a waiter in another process,
/// woken by the release, can take the lock: hand-overs must not starve other processes.
const YIELD_WINDOW: Duration = Duration::from_millis(2);

/// Local waiters for one name: only the head waits in Redis; the others queue here.
#[derive(Debug, Default)]
pub(crate) struct LocalQueue {
    pub(crate) turn: tokio::sync::Mutex<()>,
    handoff: Mutex<Option<HandoffSlot>>,
    streak: AtomicU32,
    /// The wake-up registration, passed from one head waiter to the next.
    watch: Mutex<Option<Arc<Watch>>>,
    /// Local waiters hold back until then (see [`YIELD_WINDOW`]).
    defer_until: Mutex<Option<Instant>>,
    /// The last release broke a hand-over streak.
    yield_pending: std::sync::atomic::AtomicBool,
    /// The lock was handed over inside this `Locker` and its holder has not let go through
    /// Redis since: the head waiter makes no attempt (it would find the lock taken), and waits
    /// for the next hand-over or for [`let_go`](Self::let_go).
    held_here: std::sync::atomic::AtomicBool,
    /// Wakes the head waiter when a holder of this `Locker` let go of the lock other than by a
    /// hand-over.
    let_go: tokio::sync::Notify,
}

/// The head waiter's offer to take the lock over directly from a local releaser.
#[derive(Debug)]
struct HandoffSlot {
    /// The token the lock is handed to: this offer's own, used for no other hand-over and for
    /// no grant (see [`HandoffSlot::renewed`]).
    owner: Arc<str>,
    /// The head waiter that made the offer (its grant token: one per head waiter).
    head: Arc<str>,
    lease: Duration,
    tx: oneshot::Sender<Handed>,
}

impl HandoffSlot {
    /// The same offer under a new token, after a hand-over to the old one whose answer was
    /// lost: the release sent after it frees whatever the old token holds, and must find there
    /// only what that hand-over gave — never a lock the waiter got since by another way.
    fn renewed(self, owner: Arc<str>) -> Self {
        Self { owner, ..self }
    }
}

/// A lock handed over to a head waiter: to which of its tokens, with what fencing token, and
/// when the releaser sent the hand-over.
#[derive(Debug)]
pub(crate) struct Handed {
    pub(crate) owner: Arc<str>,
    pub(crate) fence: u64,
    pub(crate) sent_at: Instant,
}

impl LocalQueue {
    fn slot(&self) -> MutexGuard<'_, Option<HandoffSlot>> {
        self.handoff.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Until when local waiters hold back, if that is still ahead.
    pub(crate) fn deferred(&self) -> Option<Instant> {
        let until = *self.defer_until.lock().unwrap_or_else(|e| e.into_inner());
        until.filter(|u| *u > Instant::now())
    }

    /// Puts back an offer that was not taken, unless the waiter left or another offer is there.
    fn offer_again(&self, slot: HandoffSlot) {
        let mut current = self.slot();
        if current.is_none() && !slot.tx.is_closed() {
            *current = Some(slot);
        }
    }

    /// Whether a hold of this `Locker`, handed over inside it, has the lock (see
    /// [`held_here`](Self::held_here)).
    pub(crate) fn is_held_here(&self) -> bool {
        self.held_here.load(Ordering::Acquire)
    }

    /// Resolves after a holder of this `Locker` let go of the lock other than by a hand-over
    /// (at once if one did since the last call).
    pub(crate) fn let_go_notified(&self) -> tokio::sync::futures::Notified<'_> {
        self.let_go.notified()
    }

    /// The lock was released in Redis (a wake-up came): whatever the hand-overs said, the head
    /// waiter attempts again.
    pub(crate) fn not_held_here(&self) {
        self.held_here.store(false, Ordering::Release);
    }

    /// A holder of this `Locker` let go of the lock through Redis (released, or found it gone):
    /// the head waiter attempts again.
    pub(crate) fn let_go(&self) {
        self.held_here.store(false, Ordering::Release);
        self.let_go.notify_one();
    }

    fn defer(&self) {
        *self.defer_until.lock().unwrap_or_else(|e| e.into_inner()) =
            Some(Instant::now() + YIELD_WINDOW);
    }
}

/// A queue in the `Locker`'s map, with the number of tickets out for it: the queue leaves the
/// map when the last one is returned (counted under the map's lock, never guessed from
/// reference counts). The queue itself is made when a ticket first needs it: a request that
/// takes the lock at its first attempt only counts itself in.
#[derive(Debug)]
pub(crate) struct QueueEntry {
    queue: Option<Arc<LocalQueue>>,
    users: usize,
}

/// A queue's place in the map: the name's keys, compared and hashed by the lock's key (so the
/// map is looked up by `&str`, and an entry costs no copy of the key).
#[derive(Debug)]
pub(crate) struct ByLock(Arc<LockKeys>);

impl PartialEq for ByLock {
    fn eq(&self, other: &Self) -> bool {
        self.0.lock == other.0.lock
    }
}

impl Eq for ByLock {}

impl std::hash::Hash for ByLock {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        // As the `str` it borrows as hashes: lookups by `&str` must find it.
        self.0.lock.as_str().hash(state);
    }
}

impl std::borrow::Borrow<str> for ByLock {
    fn borrow(&self) -> &str {
        &self.0.lock
    }
}

impl Engine {
    pub(crate) fn queues(&self) -> MutexGuard<'_, HashMap<ByLock, QueueEntry>> {
        self.inner.queues.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn queue(&self, keys: &Arc<LockKeys>) -> QueueTicket {
        self.queue_counted(keys).0
    }

    /// A place in the queue of `keys`' lock, and how many places were out before it.
    pub(crate) fn queue_counted(&self, keys: &Arc<LockKeys>) -> (QueueTicket, usize) {
        let mut queues = self.queues();
        let entry = queues
            .entry(ByLock(keys.clone()))
            .or_insert_with(|| QueueEntry {
                queue: None,
                users: 0,
            });
        let before = entry.users;
        entry.users += 1;
        let ticket = QueueTicket {
            locker: self.clone(),
            keys: keys.clone(),
            queue: entry.queue.clone().map(OnceLock::from).unwrap_or_default(),
        };
        (ticket, before)
    }

    /// The local line of `lock_key`, if one was made (see [`QueueEntry`]).
    pub(crate) fn existing_queue(&self, lock_key: &str) -> Option<Arc<LocalQueue>> {
        self.queues().get(lock_key).and_then(|e| e.queue.clone())
    }

    /// How many local waiters (tickets) the queue of `lock_key` has.
    pub(crate) fn queue_users(&self, lock_key: &str) -> usize {
        self.queues().get(lock_key).map_or(0, |e| e.users)
    }

    /// After a release that broke a hand-over streak: if the wake-up reached another process
    /// (more subscribers than this `Locker`'s own), local waiters hold back briefly so that one
    /// of those can take the lock.
    pub(crate) fn yield_to_other_processes(queue: Option<&Arc<LocalQueue>>, woke: u32) {
        let Some(queue) = queue else {
            return;
        };
        if queue.yield_pending.swap(false, Ordering::Relaxed) && woke > 1 {
            queue.defer();
        }
    }

    /// Hands the lock straight to the local head waiter of `queue` (the name's local line, if
    /// it has one), if there is one: the outcome, and whether the lock went to that waiter.
    /// `None` when the lock is to be released normally.
    pub(crate) async fn try_handoff(
        &self,
        hold: &HoldState,
        queue: Option<&Arc<LocalQueue>>,
    ) -> Option<(ReleaseOutcome, bool)> {
        // A name kept taken after the release (`at_least`) is handed to nobody.
        // Only a plain lock is handed over (see `LockKeys::hands_over`).
        let queue = queue?;
        if !self.inner.config.handoff
            || hold.is_lost()
            || hold.keep_for().is_some()
            || !hold.keys.hands_over()
        {
            return None;
        }
        if queue.streak.load(Ordering::Relaxed) >= MAX_HANDOFF_STREAK {
            // This one goes through Redis; if it wakes waiters of other processes, local
            // waiters hold back for them (see `yield_to_other_processes`).
            queue.streak.store(0, Ordering::Relaxed);
            queue.yield_pending.store(true, Ordering::Relaxed);
            return None;
        }
        let Some(slot) = queue.slot().take().filter(|s| !s.tx.is_closed()) else {
            queue.streak.store(0, Ordering::Relaxed);
            return None;
        };
        let fence_ttl = self.inner.config.fence_ttl;
        let session = match self.inner.backend.session().await {
            Ok(session) => session,
            Err(_) => {
                queue.offer_again(slot);
                return None;
            }
        };
        let sent_at = Instant::now();
        let reply = session
            .handoff(
                &hold.keys,
                &hold.owner,
                Successor {
                    owner: &slot.owner,
                    locker: &self.inner.turn_id,
                },
                slot.lease,
                fence_ttl,
            )
            .await;
        match reply {
            Ok(HandoffReply::HandedOver { fence }) => {
                queue.streak.fetch_add(1, Ordering::Relaxed);
                self.inner.handed_over.fetch_add(1, Ordering::Relaxed);
                crate::metrics::handed_over();
                queue.held_here.store(true, Ordering::Release);
                let handed = Handed {
                    owner: slot.owner.clone(),
                    fence,
                    sent_at,
                };
                if slot.tx.send(handed).is_err() {
                    // The waiter left meanwhile: release what it was given.
                    let _ = session.clean_up(&hold.keys, &slot.owner, None).await;
                    return Some((ReleaseOutcome::Released, false));
                }
                Some((ReleaseOutcome::Released, true))
            }
            Ok(HandoffReply::NotHandedOver(reply)) => {
                queue.offer_again(slot);
                Some((release_outcome(hold, reply), false))
            }
            Ok(HandoffReply::ReleasedInstead { woke }) => {
                // Waiters of another `Locker` want it (they listen for its release, or claimed the
                // next turn): released in the same step, and the local waiter waits its turn
                // with them.
                queue.streak.store(0, Ordering::Relaxed);
                queue.offer_again(slot);
                Self::yield_to_other_processes(Some(queue), woke);
                Some((ReleaseOutcome::Released, false))
            }
            Err(_) => {
                // Unknown whether it ran: the lock is ours still, or the offer's token holds
                // it. One release covers both (in either order with the hand-over, should that
                // still be on its way), and the waiter goes on waiting, offering a new token.
                let handed_to = slot.owner.clone();
                queue.offer_again(slot.renewed(self.new_owner()));
                let after = super::release::Try::AfterHandoff;
                let outcome =
                    (self.release_in_redis(hold, Some(&handed_to), after, Some(queue))).await;
                Some((outcome, false))
            }
        }
    }
}

/// The head waiter's state: its wake-up registration (kept in the queue for the next head, so
/// the subscription survives while local waiters remain) and its hand-over offer.
///
/// A hand-over gives the lock to a token of its own, never used for attempts: if the waiter
/// leaves before taking a lock handed to it, that token's hold is released, and nothing else can
/// be confused with it.
pub(crate) struct HeadWait<'a> {
    locker: &'a Engine,
    queue: &'a Arc<LocalQueue>,
    ticket: &'a QueueTicket,
    keys: Arc<LockKeys>,
    watch: Arc<Watch>,
    /// The token a release may grant the lock to when this waiter claimed the next turn.
    /// A hand-over inside the process goes to a token of its own (see [`HandoffSlot`]).
    pub(crate) handoff_owner: Arc<str>,
    rx: Option<oneshot::Receiver<Handed>>,
}

impl<'a> HeadWait<'a> {
    /// Becomes the head waiter: subscribes to wake-ups (giving up on the confirmation at
    /// `deadline`, then polling) and offers to take a hand-over.
    pub(crate) async fn new(
        locker: &'a Engine,
        ticket: &'a QueueTicket,
        keys: &Arc<LockKeys>,
        lease: Duration,
        deadline: Instant,
    ) -> HeadWait<'a> {
        let queue = ticket.queue();
        // Subscribe before the retry, so a release in between is not missed.
        let kept = queue.watch.lock().unwrap_or_else(|e| e.into_inner()).take();
        let watch = match kept {
            Some(watch) => watch,
            None => Arc::new(locker.inner.backend.watch(keys.channel(), deadline).await),
        };
        // No `.await` from here until `HeadWait` exists: once the offer is out, only its `Drop`
        // can give back a lock handed over to a waiter that was dropped.
        let handoff_owner = locker.new_owner();
        let mut rx = None;
        if locker.inner.config.handoff {
            let (tx, handoff_rx) = oneshot::channel();
            *queue.slot() = Some(HandoffSlot {
                owner: locker.new_owner(),
                head: handoff_owner.clone(),
                lease,
                tx,
            });
            rx = Some(handoff_rx);
        }
        HeadWait {
            locker,
            queue,
            ticket,
            keys: keys.clone(),
            watch,
            handoff_owner,
            rx,
        }
    }

    /// The wake-up registration and the hand-over receiver.
    pub(crate) fn parts(&mut self) -> (&Watch, &mut Option<oneshot::Receiver<Handed>>) {
        (&self.watch, &mut self.rx)
    }
}

impl Drop for HeadWait<'_> {
    fn drop(&mut self) {
        {
            let mut slot = self.queue.slot();
            if slot
                .as_ref()
                .is_some_and(|s| Arc::ptr_eq(&s.head, &self.handoff_owner))
            {
                *slot = None;
            }
        }
        if let Some(handed) = self.rx.as_mut().and_then(reclaim) {
            // Handed over after this waiter stopped waiting: give it back.
            // The hand-over was answered, so any connection reaches Redis after it.
            drop(InFlight::new(self.locker, &self.keys, &handed.owner));
            // No hold of this `Locker` will hand the lock on: the next head attempts (it finds
            // the lock free, or taken and flagged, so that the release above wakes it).
            self.queue.let_go();
        }
        // Other local waiters remain: the next head takes over the subscription.
        if self.locker.queue_users(&self.ticket.keys.lock) > 1 {
            *self.queue.watch.lock().unwrap_or_else(|e| e.into_inner()) = Some(self.watch.clone());
        }
    }
}

/// Closes `rx` and takes what was sent before it closed: after this, a sender finds the
/// receiver gone (and cleans up itself), or its value is returned here (and the caller cleans
/// up). Nothing sent falls between the two.
fn reclaim<T>(rx: &mut oneshot::Receiver<T>) -> Option<T> {
    rx.close();
    rx.try_recv().ok()
}

/// Resolves when a local releaser hands the lock over (never, with hand-over off).
pub(crate) async fn handed(rx: &mut Option<oneshot::Receiver<Handed>>) -> Option<Handed> {
    let answer = match rx.as_mut() {
        Some(receiver) => receiver.await,
        None => std::future::pending().await,
    };
    // A oneshot receiver must not be polled again once it has answered.
    *rx = None;
    answer.ok()
}

/// A place in a local queue; removes the queue from the map when its last user leaves.
pub(crate) struct QueueTicket {
    locker: Engine,
    /// The name's keys: the queue is the one of `keys.lock`.
    pub(crate) keys: Arc<LockKeys>,
    queue: OnceLock<Arc<LocalQueue>>,
}

impl QueueTicket {
    /// The queue, made now if no ticket needed it before.
    pub(crate) fn queue(&self) -> &Arc<LocalQueue> {
        self.queue.get_or_init(|| {
            let mut queues = self.locker.queues();
            // The entry lives while this ticket does (it counts as one of its users).
            match queues.get_mut(self.keys.lock.as_str()) {
                Some(entry) => entry.queue.get_or_insert_with(Arc::default).clone(),
                None => Arc::default(),
            }
        })
    }

    /// The queue, if it was made when this ticket was taken or a call to [`queue`](Self::queue)
    /// made it since.
    pub(crate) fn made(&self) -> Option<&Arc<LocalQueue>> {
        self.queue.get()
    }
}

impl Drop for QueueTicket {
    fn drop(&mut self) {
        let mut queues = self.locker.queues();
        if let Some(entry) = queues.get_mut(self.keys.lock.as_str()) {
            entry.users -= 1;
            if entry.users == 0 {
                queues.remove(self.keys.lock.as_str());
            }
        }
    }
}
