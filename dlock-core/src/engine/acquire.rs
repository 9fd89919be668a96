//! The acquire path: cancellation-safe attempts (see [`super::in_flight`]), re-entry, a place
//! in the local line (its head waits in Redis: [`super::head`]), multi-lock attempts, and
//! turning a grant into a guard.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::time::Instant;

use super::head::Waiting;
use super::leave::{Leave, LeaveTurn};
use super::waiter::{Step, Waiter};
use super::*;
use crate::backend::{AcquireAllReply, AcquireReply, Claim, GrantTo, Turn};
use crate::clock;
use crate::error::LockError;
use crate::fencing::FencingToken;
use crate::hold::{HoldState, LossReason};
use crate::metrics::{self, Labels};
use crate::name::{LockKeys, LockName};
use crate::scope;

impl Engine {
    /// One acquisition attempt for `owner`, cancellation-safe: if the caller's future is dropped
    /// while the script is in flight, or the call fails (so the script may have run), a release
    /// for `owner` follows it down the same connection, where it can only arrive after it.
    ///
    /// `head`: the attempt comes from the waiter at the head of the local queue (which may take
    /// a lock kept for this `Locker`); `claim`: a plain lock found taken is claimed as next in
    /// turn for this `Locker` (see the `protocol` module), and, with `grant`, offered to be granted
    /// to the head waiter's hand-over token by the release. `sent_at`: when the caller sent it
    /// (read for its own timing): a roll-back awaited after it ends one command timeout later.
    pub(crate) async fn attempt(
        &self,
        keys: &Arc<LockKeys>,
        owner: &Arc<str>,
        lease: Duration,
        head: bool,
        (claim, grant): (Option<Claim>, Option<GrantTo<'_>>),
        sent_at: Instant,
    ) -> Result<AcquireReply, LockError> {
        let session = self.session().await?;
        let mut in_flight = InFlight::new(self, keys, owner).sent_at(sent_at);
        // The one session the command goes out on, kept where the in-flight guard needs it.
        let res = (in_flight.session.insert(session))
            .acquire(
                keys,
                owner,
                lease,
                self.inner.config.fence_ttl,
                Turn {
                    locker: &self.inner.turn_id,
                    head,
                    claim,
                    grant,
                },
            )
            .await;
        // Answered: the caller turns a grant into a guard before its next `.await`.
        in_flight.settle(&res).await;
        res.map_err(LockError::Backend)
    }

    /// Notes how long an answered attempt, sent at `sent_at`, took to come back at `came_back`
    /// (claims size their window by it).
    pub(crate) fn note_round_trip(&self, sent_at: Instant, came_back: Instant) {
        let us = u64::try_from((came_back - sent_at).as_micros()).unwrap_or(u64::MAX);
        self.inner.round_trip_us.store(us, Ordering::Relaxed);
    }

    /// Milliseconds since 1970 on the clock that orders this `Locker`'s claims to the next turn
    /// and dates their attempts: the backend's wall clock (see `RedisBackend::wall_ms`), set
    /// apart in tests of clocks that disagree (`LockerBuilder::clock_apart`).
    pub(crate) fn wall_ms(&self) -> u64 {
        let ms = self.inner.backend.wall_ms();
        ms.saturating_add_signed(self.inner.config.clock_apart_ms)
    }

    /// A claim to be next in turn for a request waiting since `since` (wall-clock ms). A release
    /// keeps the lock for this `Locker` long enough for the wake-up, a subscription and an
    /// attempt: four of its round trips and 2 ms (at least 5 ms, at most 1 s).
    pub(crate) fn claim(&self, since: u64) -> Claim {
        let us = self.inner.round_trip_us.load(Ordering::Relaxed).max(1_000);
        let window = Duration::from_micros(us.saturating_mul(4)) + Duration::from_millis(2);
        Claim {
            window: window.clamp(Duration::from_millis(5), Duration::from_secs(1)),
            since,
        }
    }

    /// Re-enters `hold`, which this task holds in the current scope: checks (read-only) that
    /// Redis still has it, then counts one more guard in. `Ok(None)` when the hold was released
    /// meanwhile (the caller acquires afresh); the loss when it was lost.
    pub(crate) async fn reenter(
        &self,
        hold: Arc<HoldState>,
    ) -> Result<Option<LockGuard>, LockError> {
        if hold.is_lost() {
            return Err(hold.lost_error());
        }
        let session = self.session().await?;
        let reply = session
            .holds(&hold.keys, &hold.owner)
            .await
            .map_err(LockError::Backend)?;
        // No `.await` from here on: nothing below can be left half-done by a dropped future.
        // Redis had the hold when it ran the check, but the answer may come back after the
        // hold's lease ran out (a slow server, a failover): a guard is never handed out for a
        // hold known to be over.
        if hold.is_lost() {
            return Err(hold.lost_error());
        }
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
                    fencing_token = hold.known_fence(),
                    "dlock: re-entered"
                );
                Ok(Some(LockGuard {
                    state: hold,
                    engine: self.clone(),
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

    /// A plain lock's acquisition (a plain `fn`: see [`LockRequest::run`]).
    pub(crate) fn acquire(
        self,
        name: LockName,
        wait: Duration,
        lease: Lease,
    ) -> impl Future<Output = Result<Attempted, LockError>> + Send {
        let keys = Arc::new(LockKeys::new(&self.inner.config.prefix, &name));
        self.acquire_keys(name, keys, wait, lease)
    }

    /// Acquires what `keys` hold for `name`: its lock, or one of its semaphore's permits.
    pub(crate) async fn acquire_keys(
        self,
        name: LockName,
        keys: Arc<LockKeys>,
        wait: Duration,
        lease: Lease,
    ) -> Result<Attempted, LockError> {
        self.inner.backend.offers(&keys.kind)?;
        // Set once a claim to the next turn has gone out. A request that gave up with Redis
        // answering takes its claim back before it returns, still within its wait plus one
        // command timeout; one that failed leaves that to the background (the claim's `Drop`).
        let mut turn: Option<LeaveTurn> = None;
        let started = Instant::now();
        let deadline = clock::after(started, wait);
        let bound = clock::after(deadline, self.inner.backend.command_timeout());
        // One block rather than an `async fn` of its own: each layer of `async fn` keeps its
        // arguments beside the future it awaits, and thousands of waiters hold this one.
        let attempted: Result<Attempted, LockError> = 'body: {
            // Re-entry inside a lock scope: a hold this task has (even a lost one, whose loss is
            // reported rather than papered over with a new lock).
            if keys.reenters()
                && let Some(hold) = scope::find(self.inner.id, &keys.lock)
            {
                match Box::pin(self.reenter(hold)).await {
                    Ok(Some(guard)) => break 'body Ok(Attempted::Held(guard)),
                    Ok(None) => {}
                    Err(err) => break 'body Err(err),
                }
            }

            let mut waiter = Waiter::new(&self, name, keys, lease, (started, deadline));
            // A writer's recorded wait (it keeps new readers out) goes when it stops waiting.
            let wait_counts = waiter.keys.rw_keys().and_then(|rw| rw.wait_counts);
            let mut leave = Leave::new(&self, &waiter.keys, &waiter.owner);
            if wait_counts.is_none() {
                leave.disarm();
            }
            // When this request began to wait, on the wall clock: claims to the next turn go to the
            // one that has waited longest, whichever process it is in.
            let since = self.wall_ms();
            // A request that will wait for a lock that hands over takes its place in the local
            // queue at once. One that finds others there (waiting, or making their own first
            // attempt) waits its turn behind them without a first attempt of its own: the lock
            // passes to them first anyway, and ten thousand waiters on a thousand names send a
            // thousand first attempts, not ten thousand.
            let early = (!wait.is_zero() && waiter.keys.hands_over())
                .then(|| self.queue_counted(&waiter.keys));
            let behind_others = early.as_ref().is_some_and(|(_, before)| *before > 0);
            // A first attempt, ahead of the local queue — unless it waits behind others, or local
            // waiters are holding back for other processes right now, or the name's wake-ups are
            // heard already (a wait for it ended moments ago, as when two processes take turns):
            // then the head's attempt, which claims the turn and offers the hand-over token, is
            // the first, with no `SET` and no claim before it.
            let holding_back = behind_others
                || (early.is_some() && self.inner.backend.hears(waiter.keys.channel()))
                || (!wait.is_zero()
                    && match &early {
                        Some((ticket, _)) => ticket.made().is_some_and(|q| q.deferred().is_some()),
                        None => (self.existing_queue(&waiter.keys.lock))
                            .is_some_and(|q| q.deferred().is_some()),
                    });
            if !holding_back {
                // A request that will wait asks to be next in turn at once: the holder's process
                // may hand the lock between tasks of its own while this one subscribes.
                let claim =
                    (!wait.is_zero() && waiter.keys.claims_turns()).then(|| self.claim(since));
                if claim.is_some() {
                    turn.get_or_insert_with(|| LeaveTurn::new(&self, &waiter.keys, since));
                }
                let sent_at = Instant::now();
                let attempt = self.attempt(
                    &waiter.keys,
                    &waiter.owner,
                    lease.duration(),
                    false,
                    (claim, None),
                    sent_at,
                );
                let reply = Box::pin(attempt).await;
                let back = Instant::now();
                if reply.is_ok() {
                    self.note_round_trip(sent_at, back);
                }
                match waiter.step(&self, reply, back, !wait.is_zero()) {
                    Step::Acquired(fence) => {
                        leave.disarm();
                        break 'body Ok(waiter.held(&self, fence, sent_at));
                    }
                    Step::Busy => {}
                    Step::Failed(err) => break 'body Err(err),
                    // The clean-up of that attempt releases the old token: never reuse it.
                    Step::Retry => leave.set_owner(&waiter.owner),
                }
                if wait.is_zero() {
                    break 'body Ok(waiter.busy());
                }
            }

            // Queue behind local waiters for the same name; only the head waits in Redis.
            let ticket = match early {
                Some((ticket, _)) => ticket,
                None => self.queue(&waiter.keys),
            };
            let Ok(_turn) = tokio::time::timeout_at(deadline, ticket.queue().turn.lock()).await
            else {
                break 'body waiter.gave_up();
            };
            // At the head of the line. Boxed: the waiters behind it, many more of them, hold a
            // future without the head's state. A claim for several permits keeps free ones
            // from others for a while only, as a writer's recorded wait: it is said again in time.
            let wait_counts = wait_counts
                .or_else(|| (waiter.keys.semaphore_keys()).and_then(|sem| sem.claim_counts));
            let waiting = Waiting {
                waiter,
                since,
                leave,
                wait_counts,
            };
            Box::pin(self.wait_at_head(waiting, &ticket, &mut turn)).await
        };
        if let Some(mut turn) = turn {
            match attempted {
                Ok(Attempted::Held(_)) => turn.disarm(),
                Ok(Attempted::Busy(..)) => {
                    let _ = tokio::time::timeout_at(bound, Box::pin(turn.leave())).await;
                }
                Err(_) => drop(turn),
            }
        }
        attempted
    }

    /// `names` (in key order) cut into runs of neighbours that one script may take together:
    /// every name on one server, names in one slot on a cluster.
    pub(crate) fn runs_together<'a>(&self, names: &'a [LockName]) -> Vec<&'a [LockName]> {
        let prefix = &self.inner.config.prefix;
        let slots: Vec<Option<u16>> = (names.iter())
            .map(|name| self.inner.backend.slot(&LockKeys::new(prefix, name).lock))
            .collect();
        let mut runs = Vec::new();
        let mut start = 0;
        for i in 1..=names.len() {
            if i == names.len() || slots[i] != slots[start] {
                runs.push(&names[start..i]);
                start = i;
            }
        }
        runs
    }

    /// One all-or-none attempt at `names` (sorted, distinct, all on one server or in one slot)
    /// for a multi-lock: one script for all of them. Not tried when a name is one this task
    /// holds in its scope (re-entry) or local waiters are holding back for other processes:
    /// the caller takes them one by one then. Like [`attempt`](Self::attempt),
    /// cancellation-safe: a dropped or failed call releases every grant it may have made.
    pub(crate) async fn try_all(
        &self,
        names: &[LockName],
        lease: Lease,
    ) -> Result<TriedAll, LockError> {
        super::lease::check_lease(lease.duration())?;
        let started = Instant::now();
        let prefix = &self.inner.config.prefix;
        let keys: Vec<Arc<LockKeys>> = (names.iter())
            .map(|name| Arc::new(LockKeys::new(prefix, name)))
            .collect();
        let not_for_us = keys.iter().any(|k| {
            scope::find(self.inner.id, &k.lock).is_some()
                || (self.existing_queue(&k.lock)).is_some_and(|q| q.deferred().is_some())
        });
        if not_for_us {
            return Ok(TriedAll::NotTried);
        }
        let owners: Vec<Arc<str>> = names.iter().map(|_| self.new_owner()).collect();
        let session = self.session().await?;
        let holds = keys.iter().cloned().zip(owners.iter().cloned()).collect();
        let sent_at = Instant::now();
        let mut in_flight = InFlight::many(self, holds).sent_at(sent_at);
        in_flight.session = Some(session.clone());
        let locks: Vec<(&LockKeys, &str)> = (keys.iter().zip(&owners))
            .map(|(keys, owner)| (&**keys, &**owner))
            .collect();
        let reply = session
            .acquire_all(&locks, lease.duration(), self.inner.config.fence_ttl)
            .await;
        in_flight.settle(&reply).await;
        // Answered: no `.await` from here on.
        let reply = reply.map_err(LockError::Backend)?;
        let fences = match reply {
            AcquireAllReply::Acquired { fences } => fences,
            AcquireAllReply::Busy { index, pttl } => {
                let name = names.get(index).or(names.first()).cloned();
                return Ok(name.map_or(TriedAll::NotTried, |name| TriedAll::Busy(name, pttl)));
            }
        };
        let grants = names.iter().cloned().zip(keys).zip(owners).zip(fences);
        Ok(TriedAll::Taken(
            grants
                .map(|(((name, keys), owner), fence)| {
                    self.acquired(name, keys, owner, Some(fence), lease, sent_at, started)
                })
                .collect(),
        ))
    }

    /// The error of a multi-lock whose one attempt found `name` busy: counted and logged as a
    /// request that timed out on it would be.
    pub(crate) fn busy_at_once(
        &self,
        name: &LockName,
        started: Instant,
        retry_after: Option<Duration>,
    ) -> LockError {
        let labelled = self.inner.config.metrics_name_label;
        let retry_after = self.inner.hold_times.retry_after(retry_after);
        // The multi-lock's holds are plain locks.
        busy((name, "lock"), labelled, started, retry_after, false);
        timed_out(labelled, (name, "lock"), started, (retry_after, false))
    }

    /// Turns a grant into a guard: the hold's state, the watchdog, the scope; no `.await`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn acquired(
        &self,
        name: LockName,
        keys: Arc<LockKeys>,
        owner: Arc<str>,
        fence: Option<u64>,
        lease: Lease,
        sent_at: Instant,
        started: Instant,
    ) -> LockGuard {
        let now = Instant::now();
        let waited = now.saturating_duration_since(started);
        let labels = Labels::new(
            keys.kind.label(),
            self.inner.config.metrics_name_label,
            &name,
        );
        metrics::count(metrics::ACQUIRED, &labels, 1);
        metrics::seconds(metrics::WAIT_SECONDS, &labels, waited);
        tracing::debug!(
            name = name.for_logs(),
            fencing_token = fence,
            wait_ms = crate::engine::spans::ms(waited),
            "dlock: acquired"
        );
        let watchdog = matches!(lease, Lease::Watchdog(_));
        let state = Arc::new(HoldState::new(
            next_id(),
            name,
            keys,
            owner,
            fence.map(FencingToken::new),
            (self.inner.backend.downgrade(), self.inner.config.fence_ttl),
            watchdog,
            lease.duration(),
            (sent_at, now),
            labels,
        ));
        metrics::gauge_by(metrics::HELD, state.keys.kind.label(), 1.0);
        if watchdog {
            self.inner
                .watchdog
                .register(&self.inner.backend, state.clone());
        }
        if state.keys.reenters() {
            scope::record(self.inner.id, &state);
        }
        LockGuard {
            state,
            engine: self.clone(),
            reentrant: false,
            done: false,
        }
    }
}

/// What one all-or-none attempt at several locks did.
pub(crate) enum TriedAll {
    /// Every lock, in the order asked.
    Taken(Vec<LockGuard>),
    /// This one was busy (its holder has this much lease left, if known); nothing was taken.
    Busy(LockName, Option<Duration>),
    /// Not tried (see [`Locker::try_all`](crate::Locker::try_all)).
    NotTried,
}

/// The result of an acquisition that did not fail.
pub(crate) enum Attempted {
    Held(LockGuard),
    /// Still busy at the deadline; when a retry is likely to find it free, if known, the kind
    /// of hold asked for (its `kind` label), and whether the last answer found the hold in a
    /// key layout this version does not speak.
    Busy(Option<Duration>, &'static str, bool),
}

/// A busy answer on `name`, counted and logged; `retry_after`: when a retry is likely to find
/// it free (see `hold_times`).
pub(crate) fn busy(
    (name, kind): (&LockName, &'static str),
    labelled: bool,
    started: Instant,
    retry_after: Option<Duration>,
    foreign: bool,
) -> Attempted {
    metrics::count(metrics::BUSY, &Labels::new(kind, labelled, name), 1);
    tracing::debug!(
        name = name.for_logs(),
        wait_ms = crate::engine::spans::ms(started.elapsed()),
        retry_after_ms = retry_after.map(crate::engine::spans::ms),
        "dlock: busy"
    );
    Attempted::Busy(retry_after, kind, foreign)
}

/// A request's [`LockError::Busy`] on `name`, counted in the timeout metric.
pub(crate) fn timed_out(
    labelled: bool,
    (name, kind): (&LockName, &'static str),
    started: Instant,
    (retry_after, foreign): (Option<Duration>, bool),
) -> LockError {
    metrics::count(metrics::TIMEOUT, &Labels::new(kind, labelled, name), 1);
    if foreign {
        return LockError::HeldInForeignLayout {
            name: name.to_string(),
            waited: started.elapsed(),
        };
    }
    LockError::Busy {
        name: name.to_string(),
        waited: started.elapsed(),
        retry_after,
    }
}

/// A request's guard, or its [`LockError::Busy`] when it was still busy at its deadline
/// (`started` when it was called).
pub(crate) fn held_or_timed_out(
    (attempted, name): (Attempted, LockName),
    labelled: bool,
    started: Instant,
) -> Result<LockGuard, LockError> {
    match attempted {
        Attempted::Held(guard) => Ok(guard),
        Attempted::Busy(retry_after, kind, foreign) => Err(timed_out(
            labelled,
            (&name, kind),
            started,
            (retry_after, foreign),
        )),
    }
}

/// Whether retrying can't cure `err` (see [`crate::BackendError::is_permanent`]).
pub(crate) fn is_permanent(err: &LockError) -> bool {
    matches!(err, LockError::Backend(e) if e.is_permanent())
}

/// The deadline came: busy, or the backend error if Redis failed since the last answer.
pub(crate) fn gave_up(
    name: (&LockName, &'static str),
    labelled: bool,
    started: Instant,
    pttl: Option<Duration>,
    failed: Option<LockError>,
    foreign: bool,
) -> Result<Attempted, LockError> {
    match failed {
        Some(err) => Err(err),
        None => Ok(busy(name, labelled, started, pttl, foreign)),
    }
}
