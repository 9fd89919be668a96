//! The head of a local line: the one waiter of a `Locker` that waits in Redis for a name,
//! woken by releases, handed the lock by local releasers, and claiming the next turn across
//! processes.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::acquire::Attempted;
use super::leave::{Leave, LeaveTurn};
use super::queue::{Handed, QueueTicket};
use super::waiter::{Step, Waiter};
use super::*;
use crate::backend::GrantTo;
use crate::clock;
use crate::error::LockError;
use crate::hold::HoldState;

/// A waiting request's state, from the local line to the head of it.
pub(crate) struct Waiting {
    pub(crate) waiter: Waiter,
    /// When it began to wait, on the wall clock (for its claims).
    pub(crate) since: u64,
    pub(crate) leave: Leave,
    /// How long a writer's recorded wait, or a claim for several permits, counts (those
    /// requests only).
    pub(crate) wait_counts: Option<Duration>,
}

impl Engine {
    /// The head waiter's wait in Redis: an attempt after every wake-up or timer, a hand-over
    /// from a local releaser, until the deadline.
    pub(crate) async fn wait_at_head(
        &self,
        waiting: Waiting,
        ticket: &QueueTicket,
        turn: &mut Option<LeaveTurn>,
    ) -> Result<Attempted, LockError> {
        let Waiting {
            mut waiter,
            since,
            mut leave,
            wait_counts,
        } = waiting;
        let keys = waiter.keys.clone();
        let lease = waiter.lease;
        let deadline = waiter.deadline;
        let mut head = Box::pin(HeadWait::new(
            self,
            ticket,
            &keys,
            lease.duration(),
            deadline,
        ))
        .await;
        let handoff_owner = head.handoff_owner.clone();
        // The attempts that offered the hand-over token to a release, by number.
        let mut offers = Offers::default();
        // When the answer to the last attempt that claimed the next turn came back.
        let mut last_claim: Option<Instant> = None;
        loop {
            let (watch, rx) = head.parts();
            let notified = watch.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            // The channel's wake-ups so far: one that comes during the attempt only to say
            // what the attempt saw is slept through (see below).
            let mut wakes_seen = watch.wakes();
            // A release granted the lock to the hand-over token: held since before the claim's
            // attempt went out. A grant to an attempt no longer known, or heard of when half of
            // it is gone as counted from that send (the attempt waited long in Redis or on its
            // way, so the grant would leave a guard about to be lost), is taken over by the next
            // attempt instead, with a lease of its own.
            let granted = watch.take_grant(&handoff_owner);
            let fresh = |sent_at: Instant, g: &crate::backend::wait::Granted| {
                Instant::now().saturating_duration_since(sent_at) < g.lease / 2
            };
            let taken = granted.and_then(|g| Some((offers.sent(g.attempt)?, g)));
            if let Some((sent_at, g)) = taken.filter(|(sent_at, g)| fresh(*sent_at, g)) {
                leave.disarm();
                waiter.owner = handoff_owner;
                let guard = waiter.held_guard(self, Some(g.fence), sent_at);
                let (_, grace) = self.grant_window(lease.duration());
                self.settle_grant(&guard.state, sent_at, g.lease, grace);
                return Ok(Attempted::Held(guard));
            }
            if let Some(until) = ticket.queue().deferred() {
                tokio::time::sleep_until(until.min(deadline)).await;
            }
            if waiter.out_of_time() {
                return waiter.gave_up();
            }
            let queue = ticket.queue();
            if queue.is_held_here() && waiter.failed.is_none() && Instant::now() < deadline {
                // A hold of this `Locker`, handed over inside it, has the lock: it hands the
                // lock on to this waiter, or wakes it when it lets go through Redis (see
                // `LocalQueue::let_go`); an attempt now would only find the lock taken. A
                // release that passes the lock to another process wakes it by pub/sub too.
                let let_go = queue.let_go_notified();
                let until = deadline.min(Instant::now() + self.inner.config.dead_waiter_timeout);
                tokio::select! {
                    biased;
                    Some(handed) = handed(rx) => {
                        let held = self.take_handed(waiter, &mut leave, handed, turn, last_claim);
                        return Ok(held.await);
                    }
                    () = let_go => {}
                    // A release in Redis: only a holder releases, so the lock is not (or no
                    // longer) held by a hold handed over here.
                    () = notified.as_mut() => queue.not_held_here(),
                    () = tokio::time::sleep_until(until) => {}
                }
                if Instant::now() >= deadline {
                    return waiter.gave_up();
                }
                continue;
            }
            // The head waiter claims the next turn whenever it finds the lock taken — where
            // wake-ups arrive: the release's is its cue to come and take it.
            let next_turn = self.claim(since);
            let claim = (waiter.failed.is_none() && watch.is_reliable() && keys.claims_turns())
                .then_some(next_turn);
            if claim.is_some() {
                let turn = turn.get_or_insert_with(|| LeaveTurn::new(self, &keys, since));
                turn.offered(&handoff_owner);
            }
            // Every attempt of a plain lock's head names the hand-over token: with a claim, a
            // release may grant the lock to it; without, the attempt takes over a grant whose
            // wake-up was lost.
            let grant = keys.hands_over().then(|| GrantTo {
                token: &handoff_owner,
                attempt: offers.next(),
                window: self.grant_window(lease.duration()).0,
                sent_ms: self.wall_ms(),
            });
            let sent_at = Instant::now();
            if let Some(grant) = grant {
                offers.record(grant.attempt, sent_at);
            }
            let offer = (claim, grant);
            let reply = Box::pin(self.attempt(
                &keys,
                &waiter.owner,
                lease.duration(),
                true,
                offer,
                sent_at,
            ))
            .await;
            let back = Instant::now();
            if reply.is_ok() {
                self.note_round_trip(sent_at, back);
            }
            if claim.is_some() {
                last_claim = Some(back);
            }
            let found_fence = match &reply {
                Ok(crate::backend::AcquireReply::Busy { fence, .. }) => *fence,
                _ => None,
            };
            match waiter.step(self, reply, back, true) {
                Step::Acquired(fence) => {
                    leave.disarm();
                    return Ok(waiter.held(self, fence, sent_at));
                }
                Step::Busy => {}
                Step::Failed(err) => return Err(err),
                Step::Retry => leave.set_owner(&waiter.owner),
            }
            if Instant::now() >= deadline {
                return waiter.gave_up();
            }
            // The fallback timer: the holder's remaining lease (a lock nobody releases expires
            // then), or a short poll when wake-ups can't be delivered or Redis just failed — or
            // when the hold is in a layout this version does not speak, whose release may wake
            // nobody here (this attempt did not flag it).
            let poll = self.inner.config.poll_interval;
            // Held back with nothing expiring (a reader behind a waiting writer, a semaphore
            // with no permits): a release or a new count wakes the waiter; it checks now and
            // then that the writer it waits behind is alive.
            let behind = if keys.is_member() {
                self.inner.config.dead_waiter_timeout / 3
            } else {
                poll
            };
            let wakes = waiter.failed.is_none() && !waiter.foreign && watch.is_reliable();
            let mut fallback = match (wakes, waiter.pttl) {
                (true, Some(pttl)) => pttl + Duration::from_millis(1),
                (true, None) => behind,
                (false, Some(pttl)) => pttl.min(poll),
                (false, None) => poll,
            };
            // A waiting writer's wait, or a claim for several permits, counts for a while only:
            // it says so again in time.
            if let Some(counts) = wait_counts {
                fallback = fallback.min(counts / 3);
            }
            let slept_from = Instant::now();
            loop {
                let left = fallback.saturating_sub(slept_from.elapsed());
                if let Some(handed) = waiter.sleep(notified.as_mut(), left, handed(rx)).await {
                    let held = self.take_handed(waiter, &mut leave, handed, turn, last_claim);
                    return Ok(held.await);
                }
                // Woken only by a grant to another waiter, made before this attempt found the
                // hold taken (the hold it found has that grant's fencing token, or a later
                // one), as when this `Locker`'s own release granted the lock to another
                // process just before this request's attempt: the attempt claimed the turn
                // after that grant already, and another would find the same. Sleep on.
                if !watch.only_granted_elsewhere(wakes_seen, &handoff_owner, found_fence) {
                    break;
                }
                wakes_seen += 1;
                notified.set(watch.notified());
                notified.as_mut().enable();
                // Another came before the new wait was armed: attempt.
                if watch.wakes() != wakes_seen {
                    break;
                }
            }
        }
    }
}

impl Engine {
    /// The head waiter `waiter` was handed the lock by a release of its own `Locker`: its
    /// guard, made before anything else is awaited (see
    /// [`take_back_late_claim`](Self::take_back_late_claim)).
    async fn take_handed(
        &self,
        mut waiter: Waiter,
        leave: &mut Leave,
        handed: Handed,
        turn: &mut Option<LeaveTurn>,
        last_claim: Option<Instant>,
    ) -> Attempted {
        leave.disarm();
        let sent_at = handed.sent_at;
        waiter.owner = handed.owner;
        let held = waiter.held(self, Some(handed.fence), sent_at);
        self.take_back_late_claim(turn, last_claim, sent_at).await;
        held
    }

    /// A head waiter was handed the lock by a hand-over inside its `Locker` sent at
    /// `handed_at`. An attempt of its own that claimed the next turn and answered after that
    /// may have reached Redis after the hand-over too: its claim then sits on the hold the
    /// waiter now has, and the waiter's own release would grant the lock to its old hand-over
    /// token, which nobody waits on, keeping the name taken for the grant's window. The claim is
    /// taken back before the waiter returns (one round trip, on this rare path only); the
    /// caller's later commands go after it. The caller has made the guard first: dropped during
    /// this wait, the request releases the lock it was handed (no `.await` may come between
    /// taking a hand-over and making its guard). A claim that answered before the hand-over
    /// went out reached Redis before it, and the hand-over took it away.
    async fn take_back_late_claim(
        &self,
        turn: &mut Option<LeaveTurn>,
        last_claim: Option<Instant>,
        handed_at: Instant,
    ) {
        // In process, commands run at once and a grant's window is a few milliseconds: a claim
        // left there delays the name that long at most, and is not worth a command.
        if !self.inner.backend.is_remote() || last_claim.is_none_or(|back| back < handed_at) {
            return;
        }
        if let Some(turn) = turn.take() {
            let bound = clock::after(Instant::now(), self.inner.backend.command_timeout());
            let _ = tokio::time::timeout_at(bound, Box::pin(turn.leave())).await;
        }
    }

    /// A hold granted to a head waiter by another's release lasts `held_for` from the grant, and
    /// the waiter sent the claim at `sent_at`, before it: its belief ends that long after
    /// `sent_at` until its own lease applies. That lease is asked for in the background (the
    /// caller has its guard now), `grace` after the grant came: a hold given back sooner never
    /// asks — most hand-overs under contention are that short — and one kept longer still has
    /// the time the grant was sized for (see [`grant_window`]) for the extension to answer.
    fn settle_grant(
        &self,
        hold: &Arc<HoldState>,
        sent_at: Instant,
        held_for: Duration,
        grace: Duration,
    ) {
        hold.believe_until(sent_at, held_for);
        let (locker, hold) = (self.clone(), hold.clone());
        let due = Instant::now() + grace;
        tokio::spawn(async move {
            tokio::select! {
                biased;
                () = hold.ended() => return,
                () = tokio::time::sleep_until(due) => {}
            }
            // A watchdog's hold asks for its lease; a fixed lease still ends where it would
            // have from the attempt, as it does for a hold taken by the waiter's own attempt.
            let lease = if hold.watchdog {
                hold.lease()
            } else {
                hold.lease().saturating_sub(sent_at.elapsed())
            };
            if lease < crate::engine::lease::MIN_LEASE {
                return;
            }
            // Refused (lost, released meanwhile) or failed: the guard's belief ends as it was.
            let _ = locker.extend(&hold, lease).await;
        });
    }

    /// How old a head waiter's claim may be when a release grants it the lock, and how long
    /// past that age the grant lasts (see the `protocol` module); and the grace before a granted
    /// hold asks for its own lease (see [`settle_grant`](Self::settle_grant)).
    fn grant_window(&self, lease: Duration) -> (Duration, Duration) {
        grant_window(
            self.claim(0).window,
            lease,
            self.inner.backend.command_timeout(),
        )
    }
}

/// [`Engine::grant_window`]: the time the extension to the waiter's own lease needs — the
/// command timeout, at most a third of the lease, no less than the time a release keeps the
/// lock for the claimant otherwise — and a quarter of it more as the grace before the extension
/// is sent (so a waiter that died after its claim delays the lock by that quarter more); never
/// past the lease.
fn grant_window(
    claim_window: Duration,
    lease: Duration,
    command_timeout: Duration,
) -> (Duration, Duration) {
    let needed = command_timeout.min(lease / 3).max(claim_window).min(lease);
    let window = (needed + needed / 4).min(lease);
    (window, window - needed)
}

/// How many of a head waiter's latest offers it remembers.
const OFFERS_KEPT: usize = 8;

/// The send times of a head waiter's latest attempts that offered its hand-over token to be
/// granted the lock: a grant made for one of them is held from that moment on (the release that
/// granted it came after the attempt's claim, which came after it was sent).
#[derive(Debug, Default)]
struct Offers {
    count: u64,
    sent: [Option<(u64, Instant)>; OFFERS_KEPT],
}

impl Offers {
    /// The number the next offer goes out with.
    fn next(&mut self) -> u64 {
        self.count += 1;
        self.count
    }

    fn record(&mut self, n: u64, sent_at: Instant) {
        let i = usize::try_from(n % OFFERS_KEPT as u64).unwrap_or(0);
        self.sent[i] = Some((n, sent_at));
    }

    /// When offer `n` was sent, if it is one of the latest.
    fn sent(&self, n: u64) -> Option<Instant> {
        let i = usize::try_from(n % OFFERS_KEPT as u64).unwrap_or(0);
        self.sent[i].filter(|(m, _)| *m == n).map(|(_, at)| at)
    }
}
