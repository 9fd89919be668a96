//! The run's history on one monotonic clock (`tokio::time::Instant`, the clock of
//! `LockGuard::valid_until`): every call and its outcome, every guard's belief interval, every
//! fault, and the rendering of a minimal history around a violation.

use std::fmt;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use super::faults::{FaultRec, Reach};

/// Locks a mutex, tolerating poison: a panicking worker must not hide the history.
pub(crate) fn locked<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// How a request leases its lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseSpec {
    /// The locker's own watchdog lease.
    LockerDefault,
    /// `.watchdog_lease(d)`.
    Watchdog(Duration),
    /// `.lease(d)`.
    Fixed(Duration),
}

impl fmt::Display for LeaseSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::LockerDefault => f.write_str("watchdog(default)"),
            Self::Watchdog(d) => write!(f, "watchdog({})", ms(*d)),
            Self::Fixed(d) => write!(f, "fixed({})", ms(*d)),
        }
    }
}

/// Which acquisition call (on the run's fair name, `fair_lock` stands for `lock`; on its
/// read-write name, `write()`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AcquireKind {
    /// `lock(name).wait(..)`.
    Lock,
    /// `lock(name).try_lock()` (`try_lock` of the other kinds too).
    TryLock,
    /// `lock(name)` again inside a `scope` that holds the name.
    Reenter,
    /// `lock_all([..])`.
    LockAll,
    /// `read().wait(..)` on the read-write name (inside a scope that holds it, a re-entry).
    Read,
    /// `acquire().wait(..)` on the semaphore.
    Permit,
}

/// What a guard holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Share {
    /// A lock, alone: a plain or fair lock, or the read-write name's write lock.
    Exclusive,
    /// A read lock, beside other readers.
    Read,
    /// A read inside a scope that holds the write lock: a re-entry into the write hold.
    ReadInWrite,
    /// One of the semaphore's permits.
    Permit,
}

/// A release outcome, reduced to its kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// `ReleaseOutcome::Released`.
    Released,
    /// `ReleaseOutcome::Expired`.
    Expired,
    /// `ReleaseOutcome::TakenOver`.
    TakenOver,
    /// `ReleaseOutcome::Unreachable`.
    Unreachable,
    /// A variant added after this checker was written.
    Other,
}

impl Outcome {
    /// The kind of a release outcome.
    pub fn of(outcome: &dlock_core::ReleaseOutcome) -> Self {
        match outcome {
            dlock_core::ReleaseOutcome::Released => Self::Released,
            dlock_core::ReleaseOutcome::Expired => Self::Expired,
            dlock_core::ReleaseOutcome::TakenOver => Self::TakenOver,
            dlock_core::ReleaseOutcome::Unreachable(_) => Self::Unreachable,
            _ => Self::Other,
        }
    }
}

/// An error, reduced to its kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrKind {
    /// Busy until the deadline.
    Busy,
    /// Lost while held.
    Lost,
    /// Redis unreachable or timed out.
    Backend,
    /// A configuration error.
    Config,
    /// Anything else.
    Other,
}

impl ErrKind {
    /// The kind of a lock error.
    pub fn of(err: &dlock_core::LockError) -> Self {
        if err.is_busy() {
            Self::Busy
        } else if err.is_lost() {
            Self::Lost
        } else if err.is_backend() {
            Self::Backend
        } else if err.is_config() {
            Self::Config
        } else {
            Self::Other
        }
    }
}

/// What happened.
#[derive(Debug, Clone, Copy)]
pub enum EventKind {
    /// An acquisition was called.
    AcquireCall {
        /// Which call.
        kind: AcquireKind,
        /// Its wait.
        wait: Duration,
        /// Its lease.
        lease: LeaseSpec,
    },
    /// An acquisition returned a guard.
    Acquired {
        /// The guard's id in the history.
        guard: u32,
        /// Its fencing token, if it had one with the grant (0: none yet).
        token: u64,
        /// Whether it re-entered a hold.
        reentrant: bool,
    },
    /// An acquisition found the lock busy.
    Busy,
    /// An acquisition failed.
    AcquireFailed(ErrKind),
    /// An acquisition future was dropped before it finished.
    AcquireDropped,
    /// The guard's `lost()` future resolved.
    Lost {
        /// The guard.
        guard: u32,
    },
    /// `extend` was called.
    ExtendCall {
        /// The guard.
        guard: u32,
        /// The new lease.
        lease: Duration,
    },
    /// `extend` returned.
    ExtendDone {
        /// The guard.
        guard: u32,
        /// Its result.
        result: Result<(), ErrKind>,
    },
    /// `run(work)` returned.
    RunDone {
        /// The guard.
        guard: u32,
        /// How long the work was meant to take.
        work: Duration,
        /// Whether it was cancelled with `LockError::Lost`.
        cancelled: bool,
    },
    /// `release` was called.
    ReleaseCall {
        /// The guard.
        guard: u32,
    },
    /// `release` returned.
    ReleaseDone {
        /// The guard.
        guard: u32,
        /// What it said.
        outcome: Outcome,
    },
    /// A `release` future was dropped before it finished.
    ReleaseDropped {
        /// The guard.
        guard: u32,
    },
    /// The guard was dropped (released in the background).
    Dropped {
        /// The guard.
        guard: u32,
    },
    /// `set_permits(n)` (`None`: `reset_permits()`) returned.
    PermitsSet {
        /// The count asked for.
        to: Option<u32>,
        /// Whether it returned `Ok`.
        ok: bool,
    },
    /// `fencing_token()` asked of the guard returned.
    Fenced {
        /// The guard.
        guard: u32,
        /// The token, or `None` if the ask failed.
        token: Option<u64>,
        /// The guard said it was lost when the ask was made.
        lost_before: bool,
    },
    /// The fencing token on the lock key (`GET`) right after a final release.
    Hget {
        /// The guard.
        guard: u32,
        /// The token found, if any.
        found: Option<u64>,
    },
}

/// A history's fingerprint (see [`History::digest`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HistoryDigest {
    /// How many events.
    pub events: usize,
    /// A hash of every event, in order.
    pub hash: u64,
}

/// One event of the history.
#[derive(Debug, Clone, Copy)]
pub struct Event {
    /// When.
    pub at: Instant,
    /// Which worker task.
    pub worker: u16,
    /// Which locker.
    pub locker: u8,
    /// Which name.
    pub name: u8,
    /// The acquisition call this event makes or answers (its `AcquireCall` and the event that
    /// ends it share the id), or 0 for an event of no acquisition. A worker may have two
    /// acquisitions of one name under way at once (two scopes beside each other), so an end is
    /// paired with its call by this id, never by the worker.
    pub call: u32,
    /// What.
    pub kind: EventKind,
}

/// How a guard's belief ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EndHow {
    /// `release().await` ran to its end.
    Released,
    /// The release future was dropped half-way.
    ReleaseDropped,
    /// The guard was dropped.
    Dropped,
}

/// The end of one guard.
#[derive(Debug, Clone, Copy)]
pub struct GuardEnd {
    /// When the release was called or the guard dropped.
    pub at: Instant,
    /// How.
    pub how: EndHow,
    /// `valid_until()` read just before.
    pub valid_until: Instant,
    /// `is_lost()` read just before.
    pub lost_before: bool,
    /// When the release returned, and what it said.
    pub returned: Option<(Instant, Outcome)>,
    /// Whether this release ended the last guard of its hold (so Redis must let the hold go).
    pub final_of_hold: bool,
    /// When `HGET` ran right after a final `Released`, and the token it found (Redis only;
    /// `None`: unchecked).
    pub hget: Option<(Instant, Option<u64>)>,
}

/// Everything known about one guard.
#[derive(Debug)]
pub struct GuardRec {
    /// Its id in the history.
    pub id: u32,
    /// The worker that took it.
    pub worker: u16,
    /// The locker.
    pub locker: u8,
    /// The name.
    pub name: u8,
    /// The fencing token, once known (0 until then): with the grant, or when the guard asked
    /// for it (see [`GuardRec::token`]).
    pub fencing_token: AtomicU64,
    /// Whether it re-entered a hold.
    pub reentrant: bool,
    /// What it holds.
    pub share: Share,
    /// How many of the semaphore's permits it holds (taken at once); 1 for any other hold.
    pub permits: u32,
    /// Whether the watchdog renews it.
    pub watchdog: bool,
    /// When its acquisition was called.
    pub call: Instant,
    /// Whether a multi-lock took it: it took its names one after another once one was busy,
    /// so Redis may have granted this one long before the call returned.
    pub multi: bool,
    /// When its acquisition returned: its belief starts.
    pub start: Instant,
    /// `valid_until()` when it was handed out.
    pub granted_until: Instant,
    /// Whether it was lost already when it was handed out: its hold known to be over.
    pub handed_out_lost: bool,
    /// When its `lost()` future was seen resolved.
    pub lost_at: OnceLock<Instant>,
    /// Its lease when acquired.
    pub lease: Duration,
    /// The `at_least` period it was asked for (a re-entered guard leaves it to its hold).
    pub at_least: Option<Duration>,
    /// Every successful `extend`: when it was called and to what lease.
    pub extends: Mutex<Vec<(Instant, Duration)>>,
    /// How it ended (`None`: never ended before the run's end).
    pub end: Mutex<Option<GuardEnd>>,
}

impl GuardRec {
    /// The hold's fencing token, once known (0: not yet, or never: a permit, a read lock, a
    /// plain lock whose holder never asked or whose ask failed).
    pub fn token(&self) -> u64 {
        self.fencing_token.load(Ordering::Acquire)
    }

    /// The end of its belief interval: the earliest of the release call or drop, the observed
    /// loss, and the last `valid_until`; `finish` for a guard that never ended.
    pub fn belief_end(&self, finish: Instant) -> Instant {
        let end = *locked(&self.end);
        let mut at = end.map_or(finish, |e| e.at.min(e.valid_until));
        if let Some(lost) = self.lost_at.get() {
            at = at.min(*lost);
        }
        at
    }

    /// Whether a successful `extend` before `before` shortened its lease.
    pub fn shortened_before(&self, before: Instant) -> bool {
        let mut lease = self.lease;
        for &(at, to) in locked(&self.extends).iter() {
            if at <= before && to < lease {
                return true;
            }
            lease = to;
        }
        false
    }

    /// The guard's end record.
    pub fn end(&self) -> Option<GuardEnd> {
        *locked(&self.end)
    }
}

/// A `set_permits` or `reset_permits` call on the semaphore.
#[derive(Debug, Clone, Copy)]
pub struct PermitsSetRec {
    /// When it was called.
    pub call: Instant,
    /// When it returned.
    pub ret: Instant,
    /// The count asked for (`None`: reset to the handles' own).
    pub to: Option<u32>,
    /// Whether it returned `Ok` (otherwise it may or may not have taken effect).
    pub ok: bool,
}

/// The names of a run that are not plain locks.
#[derive(Debug, Clone, Copy, Default)]
pub struct Special {
    /// The name taken with `fair_lock`.
    pub fair: Option<u8>,
    /// The semaphore's name and the permit count every handle on it is made with.
    pub semaphore: Option<(u8, u32)>,
    /// The read-write lock's name, and whether its handles prefer writers.
    pub rw: Option<(u8, bool)>,
}

/// A finished call with a bound on its duration (invariant e).
#[derive(Debug, Clone, Copy)]
pub struct CallRec {
    /// The worker.
    pub worker: u16,
    /// The locker.
    pub locker: u8,
    /// The (first) name.
    pub name: u8,
    /// What was called.
    pub what: &'static str,
    /// When.
    pub call: Instant,
    /// When it returned.
    pub ret: Instant,
    /// Its bound.
    pub bound: Duration,
}

/// A session that did not finish in time: a call that never returned.
#[derive(Debug, Clone)]
pub(crate) struct HungRec {
    /// The worker.
    pub(crate) worker: u16,
    /// The name it touched last, if any.
    pub(crate) name: Option<u8>,
    /// When the session started.
    pub(crate) from: Instant,
    /// When it was given up on.
    pub(crate) to: Instant,
    /// The session, as planned.
    pub(crate) session: String,
    /// What each locker said of itself then ([`dlock_core::LockerStats`]).
    pub(crate) lockers: String,
}

/// A guarded `run(work)` (for the check that it was cancelled when the hold ended).
#[derive(Debug, Clone)]
pub struct RunRec {
    /// The guard.
    pub guard: Arc<GuardRec>,
    /// When the work started.
    pub started: Instant,
    /// How long the work sleeps.
    pub work: Duration,
    /// Whether `run` returned `Ok` (the work finished).
    pub ok: bool,
    /// `valid_until()` read after `run` returned.
    pub valid_until_after: Instant,
}

/// The whole history of a run.
#[derive(Debug)]
pub struct History {
    /// The run's start.
    pub origin: Instant,
    /// The lock names.
    pub names: Vec<String>,
    /// The lockers' labels.
    pub lockers: Vec<String>,
    /// The name taken with `fair_lock` (every other name with `lock`), if any.
    pub fair: Option<u8>,
    /// The semaphore's name and its handles' permit count, if any.
    pub semaphore: Option<(u8, u32)>,
    /// The read-write lock's name and whether its handles prefer writers, if any.
    pub rw: Option<(u8, bool)>,
    /// The lockers' dead-waiter timeout (how long a fair lock's waiter keeps its place in line
    /// without an attempt).
    pub dead_waiter_timeout: Duration,
    events: Mutex<Vec<Event>>,
    guards: Mutex<Vec<Arc<GuardRec>>>,
    faults: Mutex<Vec<FaultRec>>,
    calls: Mutex<Vec<CallRec>>,
    runs: Mutex<Vec<RunRec>>,
    permit_sets: Mutex<Vec<PermitsSetRec>>,
    samples: Mutex<Vec<super::sample::SampleRec>>,
    hung: Mutex<Vec<HungRec>>,
    /// How late the machine woke tasks during the run (Redis runs only).
    pub(crate) lags: super::lag::LagLog,
    /// Told the names whose slots a failover's replica has just taken over, as it does: the
    /// steady holds on them let go soon after (see [`Step::HoldPastPromotion`]).
    ///
    /// [`Step::HoldPastPromotion`]: super::plan::Step::HoldPastPromotion
    pub(crate) promotions: tokio::sync::watch::Sender<Option<Reach>>,
    panics: Mutex<Vec<String>>,
    /// Lockers that ran layout 1's frozen scripts at some point: their fair waiters lose their
    /// place in line when an attempt fails.
    frozen: Mutex<Vec<u8>>,
    next_guard: AtomicU32,
    next_call: AtomicU32,
}

/// Milliseconds with three decimals.
pub(crate) fn ms(d: Duration) -> String {
    format!("{:.3}ms", d.as_secs_f64() * 1e3)
}

impl History {
    /// A new, empty history starting now; `special` names the names that are not plain locks,
    /// taken by lockers with this dead-waiter timeout.
    pub fn new(
        names: Vec<String>,
        lockers: Vec<String>,
        special: Special,
        dead_waiter_timeout: Duration,
    ) -> Self {
        Self {
            origin: Instant::now(),
            names,
            lockers,
            fair: special.fair,
            semaphore: special.semaphore,
            rw: special.rw,
            dead_waiter_timeout,
            permit_sets: Mutex::default(),
            events: Mutex::default(),
            guards: Mutex::default(),
            faults: Mutex::default(),
            samples: Mutex::default(),
            hung: Mutex::default(),
            lags: super::lag::LagLog::default(),
            promotions: tokio::sync::watch::Sender::new(None),
            calls: Mutex::default(),
            runs: Mutex::default(),
            panics: Mutex::default(),
            frozen: Mutex::default(),
            next_guard: AtomicU32::new(0),
            next_call: AtomicU32::new(1),
        }
    }

    /// Records an event at `at`.
    pub fn event(&self, at: Instant, worker: u16, locker: u8, name: u8, kind: EventKind) {
        self.acquisition_event(at, worker, locker, name, 0, kind);
    }

    /// Records an event at `at` of the acquisition call `call` (see `Event::call`).
    pub fn acquisition_event(
        &self,
        at: Instant,
        worker: u16,
        locker: u8,
        name: u8,
        call: u32,
        kind: EventKind,
    ) {
        locked(&self.events).push(Event {
            at,
            worker,
            locker,
            name,
            call,
            kind,
        });
    }

    /// Whether `name` is taken with `fair_lock`.
    pub fn is_fair(&self, name: u8) -> bool {
        self.fair == Some(name)
    }

    /// Whether `name` is the semaphore's.
    pub fn is_semaphore(&self, name: u8) -> bool {
        self.semaphore.is_some_and(|(n, _)| n == name)
    }

    /// Whether `name` is the read-write lock's.
    pub fn is_rw(&self, name: u8) -> bool {
        self.rw.is_some_and(|(n, _)| n == name)
    }

    /// Records a `set_permits` or `reset_permits` call.
    pub fn permits_set(&self, rec: PermitsSetRec) {
        locked(&self.permit_sets).push(rec);
    }

    /// Every `set_permits` and `reset_permits` call so far.
    pub fn permit_sets(&self) -> Vec<PermitsSetRec> {
        locked(&self.permit_sets).clone()
    }

    /// A fresh guard id.
    pub fn next_guard_id(&self) -> u32 {
        self.next_guard.fetch_add(1, Ordering::Relaxed)
    }

    /// A fresh acquisition call id (never 0).
    pub fn next_call_id(&self) -> u32 {
        self.next_call.fetch_add(1, Ordering::Relaxed)
    }

    /// Records a guard.
    pub fn guard(&self, rec: Arc<GuardRec>) {
        locked(&self.guards).push(rec);
    }

    /// Records a fault.
    pub fn fault(&self, rec: FaultRec) {
        locked(&self.faults).push(rec);
    }

    /// Records a bounded call.
    pub fn call(&self, rec: CallRec) {
        locked(&self.calls).push(rec);
    }

    /// Records a guarded run.
    pub fn run(&self, rec: RunRec) {
        locked(&self.runs).push(rec);
    }

    /// Every guarded run so far.
    pub fn runs(&self) -> Vec<RunRec> {
        locked(&self.runs).clone()
    }

    /// Records a reading of a guard's belief against its key's lease.
    pub(crate) fn sample(&self, rec: super::sample::SampleRec) {
        locked(&self.samples).push(rec);
    }

    /// Every reading so far.
    pub(crate) fn samples(&self) -> Vec<super::sample::SampleRec> {
        locked(&self.samples).clone()
    }

    /// Records a panic of a task.
    pub fn panic(&self, what: String) {
        locked(&self.panics).push(what);
    }

    /// Records a session that did not finish in time (and was abandoned).
    pub(crate) fn hung(&self, rec: HungRec) {
        locked(&self.hung).push(rec);
    }

    /// Every session that did not finish in time.
    pub(crate) fn hangs(&self) -> Vec<HungRec> {
        locked(&self.hung).clone()
    }

    /// Every event so far, in time order.
    pub fn events(&self) -> Vec<Event> {
        let mut events = locked(&self.events).clone();
        events.sort_by_key(|e| e.at);
        events
    }

    /// A fingerprint of the history: how many events, and a hash of each (what, by whom, on
    /// which name, when, counted from the run's start) in order. Two runs of one seed on a
    /// memory store and a paused clock have the same one: they replay each other exactly.
    pub fn digest(&self) -> HistoryDigest {
        use std::hash::{Hash as _, Hasher as _};
        let events = self.events();
        // Keys fixed, not drawn: the same history hashes the same in every process.
        let mut hasher = std::hash::DefaultHasher::new();
        for e in &events {
            let at = e.at.saturating_duration_since(self.origin).as_nanos();
            let line = format!("{at} {} {} {} {:?}", e.worker, e.locker, e.name, e.kind);
            (line, e.call).hash(&mut hasher);
        }
        HistoryDigest {
            events: events.len(),
            hash: hasher.finish(),
        }
    }

    /// Every guard so far.
    pub fn guards(&self) -> Vec<Arc<GuardRec>> {
        locked(&self.guards).clone()
    }

    /// Every fault so far.
    pub fn faults(&self) -> Vec<FaultRec> {
        locked(&self.faults).clone()
    }

    /// Every bounded call so far.
    pub fn calls(&self) -> Vec<CallRec> {
        locked(&self.calls).clone()
    }

    /// Records that `locker` ran layout 1's frozen scripts.
    pub(crate) fn ran_frozen_layout(&self, locker: u8) {
        locked(&self.frozen).push(locker);
    }

    /// Whether `locker` ran layout 1's frozen scripts.
    pub(crate) fn runs_frozen_layout(&self, locker: u8) -> bool {
        locked(&self.frozen).contains(&locker)
    }

    /// Every panic so far.
    pub fn panics(&self) -> Vec<String> {
        locked(&self.panics).clone()
    }
}
