//! The watchdog: one task per `Locker` renews every watchdog-mode hold in one batched round trip
//! per tick (a tick is a third of the shortest lease held), and marks holds lost when a renewal
//! finds them gone or their validity deadline passes without a successful renewal.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::backend::{Backend, RenewItem, RenewReply, WeakBackend};
use crate::hold::{HoldState, LossReason};

/// A `Locker`'s watchdog: the holds it renews, and the task that renews them. The task lives
/// while the watchdog does.
#[derive(Debug, Default)]
pub(crate) struct Watchdog {
    state: Arc<State>,
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        // Lets the task see that the watchdog is gone and end.
        self.state.closed.store(true, Ordering::Release);
        self.state.wake.notify_one();
    }
}

/// What the watchdog and its task share.
#[derive(Debug, Default)]
struct State {
    /// By hold id, in the order the holds were taken: a tick renews them in that order, the
    /// same on every run (a paused test replays).
    holds: Mutex<BTreeMap<u64, Arc<HoldState>>>,
    /// Wakes the task: a first hold, a shorter lease, or the `Locker` going away.
    wake: Arc<Notify>,
    /// The lease the current tick period is based on, in ms (0: idle).
    basis_ms: AtomicU64,
    /// Whether the task runs; cleared by the task itself when it ends or is dropped.
    started: Arc<AtomicBool>,
    /// Renewal round trips made (for tests and benchmarks).
    round_trips: AtomicU64,
    /// Set when the watchdog goes away: the task ends even while a tick in flight keeps the
    /// state alive.
    closed: AtomicBool,
}

impl Watchdog {
    /// Starts renewing `hold`, over `backend`.
    pub(crate) fn register(&self, backend: &Backend, hold: Arc<HoldState>) {
        let lease_ms = hold.lease_ms.load(Ordering::Relaxed);
        self.state.holds().insert(hold.id, hold);
        self.ensure_running(backend);
        self.replan(lease_ms);
    }

    /// Starts the task on the current runtime if it isn't running: a runtime that shuts down
    /// drops its tasks, and a `Locker` may be used from another runtime afterwards.
    pub(crate) fn ensure_running(&self, backend: &Backend) {
        let state = &self.state;
        if !state.started.swap(true, Ordering::AcqRel) {
            let running = Running(state.started.clone());
            tokio::spawn(run(
                Arc::downgrade(state),
                backend.downgrade(),
                state.wake.clone(),
                running,
            ));
        }
    }

    /// A hold's lease is now `lease_ms`: plan the next tick again if it must come sooner.
    pub(crate) fn replan(&self, lease_ms: u64) {
        let basis = self.state.basis_ms.load(Ordering::Relaxed);
        if basis == 0 || lease_ms < basis {
            self.state.wake.notify_one();
        }
    }

    /// Stops renewing the hold `id`.
    pub(crate) fn deregister(&self, id: u64) {
        self.state.deregister(id);
    }

    /// How many holds are renewed.
    pub(crate) fn len(&self) -> usize {
        self.state.holds().len()
    }

    /// Renewal round trips made (for tests and benchmarks).
    pub(crate) fn round_trips(&self) -> u64 {
        self.state.round_trips.load(Ordering::Relaxed)
    }
}

impl State {
    fn holds(&self) -> MutexGuard<'_, BTreeMap<u64, Arc<HoldState>>> {
        self.holds.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn deregister(&self, id: u64) {
        self.holds().remove(&id);
    }

    /// The tick period: a third of the shortest lease held.
    fn period(&self) -> Option<Duration> {
        let holds = self.holds();
        let min = holds
            .values()
            .map(|h| h.lease_ms.load(Ordering::Relaxed))
            .min();
        self.basis_ms.store(min.unwrap_or(0), Ordering::Relaxed);
        min.map(|ms| Duration::from_millis(ms / 3).max(Duration::from_millis(1)))
    }

    /// One tick: renew everything in one round trip, then apply the answers and the deadlines.
    async fn tick(&self, backend: &Backend) {
        let snapshot: Vec<Arc<HoldState>> = self.holds().values().cloned().collect();
        if snapshot.is_empty() {
            return;
        }
        let sent_at = Instant::now();
        let items: Vec<RenewItem> = snapshot
            .iter()
            .map(|h| {
                let lease = h.lease();
                RenewItem {
                    key: h.keys.lock.clone(),
                    owner: h.owner.to_string(),
                    lease_ms: u64::try_from(lease.as_millis()).unwrap_or(u64::MAX),
                    seq: h.begin_change(lease, sent_at),
                    permit: h.keys.is_member(),
                    members: h.keys.members(),
                }
            })
            .collect();
        self.round_trips.fetch_add(1, Ordering::Relaxed);
        // A node that has not answered within a tick is asked again by the next one: a slow or
        // dead node must not hold back the renewals of the others past their leases.
        let within = (items.iter().map(|i| i.lease_ms).min()).map_or(Duration::MAX, |ms| {
            Duration::from_millis(ms / 3).max(Duration::from_millis(1))
        });
        match backend.renew(&items, within).await {
            Ok(replies) => {
                let mut renewed = 0u64;
                let mut unanswered = 0u64;
                for ((hold, item), reply) in snapshot.iter().zip(&items).zip(replies) {
                    match reply {
                        RenewReply::Applied => {
                            hold.change_applied(item.seq);
                            renewed += 1;
                        }
                        RenewReply::Stale => hold.change_ignored(item.seq),
                        RenewReply::Gone => {
                            if hold.holds.load(Ordering::Acquire) > 0 {
                                hold.mark_lost(LossReason::Gone);
                            }
                            self.deregister(hold.id);
                        }
                        // Kept: the hold's deadline stands, and the next tick tries again.
                        RenewReply::Unanswered => unanswered += 1,
                    }
                }
                crate::metrics::count_all(crate::metrics::RENEWED, renewed);
                if unanswered > 0 {
                    crate::metrics::count_all(crate::metrics::RENEW_ERRORS, 1);
                }
                tracing::trace!(held = snapshot.len(), renewed, "dlock: watchdog renewed");
            }
            Err(err) => {
                crate::metrics::count_all(crate::metrics::RENEW_ERRORS, 1);
                tracing::warn!(held = snapshot.len(), error = %err, "dlock: watchdog renewal failed");
            }
        }
        let now = Instant::now();
        for hold in &snapshot {
            if now >= hold.deadline() {
                hold.mark_lost(LossReason::Expired);
                self.deregister(hold.id);
            }
        }
    }
}

/// Clears the running flag when the task ends, however it ends.
#[derive(Debug)]
struct Running(Arc<AtomicBool>);

impl Drop for Running {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

/// How many ticks may wait for answers at once. A tick waits at most a third of the shortest
/// lease it carries (a little more when it must read the slot map first), so this is only
/// reached when nodes hang and leases are short.
const TICKS_IN_FLIGHT: usize = 4;

/// The watchdog's task. Ticks come a period apart, counted from when each tick started, and
/// one still waiting on a slow or hung node does not hold back the next: a hold taken while a
/// tick waits (perhaps with a shorter lease than that tick's) is renewed on time. Overlapping
/// ticks are harmless: every change carries a sequence number, Redis ignores a lock's change
/// older than one it has applied, and the lease book counts only the latest answered (a
/// permit's renewal sets its expiry from when it runs, never earlier than a later one would).
async fn run(state: Weak<State>, backend: WeakBackend, wake: Arc<Notify>, _running: Running) {
    let mut ticks = futures_util::stream::FuturesUnordered::new();
    // When the last tick started; `None` while idle.
    let mut last: Option<Instant> = None;
    loop {
        let period = match state.upgrade() {
            Some(state) if !state.closed.load(Ordering::Acquire) => state.period(),
            _ => return,
        };
        if period.is_none() {
            last = None;
        }
        let due = period.map(|p| last.unwrap_or_else(Instant::now) + p);
        let room = ticks.len() < TICKS_IN_FLIGHT;
        tokio::select! {
            biased;
            Some(()) = futures_util::StreamExt::next(&mut ticks), if !ticks.is_empty() => {}
            () = sleep_until_some(due), if room => {
                // Only a due tick ends this sleep.
                let due = due.unwrap_or_else(Instant::now);
                crate::metrics::watchdog_lag(Instant::now().saturating_duration_since(due));
                let (Some(state), Some(backend)) = (state.upgrade(), backend.upgrade()) else {
                    return;
                };
                last = Some(Instant::now());
                ticks.push(async move { state.tick(&backend).await });
            }
            () = wake.notified() => {}
        }
    }
}

/// Sleeps until `due`, or for ever when there is nothing to renew.
async fn sleep_until_some(due: Option<Instant>) {
    match due {
        Some(due) => tokio::time::sleep_until(due).await,
        None => std::future::pending().await,
    }
}
