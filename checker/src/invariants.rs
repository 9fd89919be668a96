//! The checks run over a finished history: mutual exclusion (a), fair order (a, in
//! [`super::fair`]), fencing order (b), truthful release and run outcomes (c), bounded calls and
//! no panics (e). What is left behind (d) is checked by the run driver, which can see the
//! backend.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::faults::{FaultKind, FaultRec};
use super::history::{
    AcquireKind, ErrKind, Event, EventKind, GuardRec, History, Outcome, Share, locked, ms,
};

/// A `run(work)` that returned `Ok` may have finished this long after its hold's validity
/// ended (the two timers share a millisecond wheel).
pub const RUN_TIMER_TOLERANCE: Duration = Duration::from_millis(2);

/// How far past `lease` after the grant a fixed lease may still run on the server: leases and
/// server clocks count whole milliseconds.
const LEASE_ROUNDING: Duration = Duration::from_millis(5);

/// How long after the checker reads the clock for a release the library may read it to judge
/// whether its guard let go in time (plus the lateness the lag monitor saw meanwhile): a release
/// called just before `valid_until` may find its deadline passed, and says the loss truthfully.
const LET_GO_TOLERANCE: Duration = Duration::from_millis(1);

/// Which invariant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Invariant {
    /// (a) No two holds of one name with different tokens overlap (unexcused).
    MutualExclusion,
    /// (a) A re-entered guard lies inside a live hold with its token, and only an acquisition
    /// made to re-enter re-enters (never one beside it in the task, in a scope of its own).
    Reentry,
    /// (a) A guard believes no longer than Redis keeps its lock.
    BeliefWithinLease,
    /// (a) A name released within its `at_least` period is granted to nobody before it ends.
    AtLeast,
    /// (a) A fair lock goes to waiters in the order they came (see [`super::fair`]).
    FairOrder,
    /// (a) A semaphore never has more permits held than its count (see [`super::shares`]).
    PermitBound,
    /// (a) A read-write lock never has a writer beside a reader (see [`super::shares`]).
    ReadWrite,
    /// (b) Tokens rise with acquisition order; no token is handed out twice.
    FencingOrder,
    /// (c) A release outcome tells the truth.
    ReleaseTruth,
    /// (c) `run(work)` is cancelled once the hold is over.
    RunTruth,
    /// (c) A try that says busy finds the name taken by something that can be there: checked on
    /// names only a probe uses, in runs with replica acknowledgement.
    RefusalTruth,
    /// (f) The watchdog keeps a hold alive while nothing goes wrong.
    WatchdogKeeps,
    /// (d) Nothing is left behind.
    LeftBehind,
    /// (e) Every call returns within its bound.
    Bounded,
    /// (e) A release of a plain lock that someone waits for over a subscription is followed by a
    /// grant within a bound (a lost wake-up would leave the waiter asleep until the lease ends).
    WakeUp,
    /// (e) On a distributed deployment, every locker of a steady pair keeps getting its name:
    /// no long gap between its grants that no fault reaching it explains.
    Progress,
    /// (e) Every locker that follows a cluster reaches a promoted replica within 2 s of the
    /// cluster being ok again, while the master it replaced stays dead.
    Follows,
    /// (e) On a [`dlock_core::MasterSet`], a hung master costs a round one master's budget: an
    /// acquisition answers within its wait and one budget, and a grant keeps most of its lease.
    MasterBudget,
    /// (e) No task panics.
    Panic,
}

impl fmt::Display for Invariant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = match self {
            Self::MutualExclusion => "(a) mutual exclusion",
            Self::Reentry => "(a) re-entry inside a live hold",
            Self::BeliefWithinLease => "(a) a guard believes no longer than Redis keeps its lock",
            Self::AtLeast => "(a) a name stays taken for its at-least period",
            Self::FairOrder => "(a) a fair lock goes to waiters in the order they came",
            Self::PermitBound => "(a) never more permits held than the semaphore's count",
            Self::ReadWrite => "(a) no writer beside a reader",
            Self::FencingOrder => "(b) fencing order",
            Self::ReleaseTruth => "(c) release outcomes tell the truth",
            Self::RunTruth => "(c) run() is cancelled when the hold ends",
            Self::RefusalTruth => "(c) a try says busy only when the name is taken",
            Self::WatchdogKeeps => "(f) the watchdog keeps healthy holds",
            Self::LeftBehind => "(d) nothing left behind",
            Self::Bounded => "(e) bounded calls",
            Self::WakeUp => "(e) a release wakes its waiters in time",
            Self::Progress => "(e) every locker keeps reaching its locks between faults",
            Self::Follows => "(e) every locker reaches a promoted replica in time",
            Self::MasterBudget => "(e) a hung master costs a round one master budget",
            Self::Panic => "(e) no panics",
        };
        f.write_str(s)
    }
}

/// One violation: what, and where in the history to look.
#[derive(Debug, Clone)]
pub struct Violation {
    /// Which invariant.
    pub invariant: Invariant,
    /// One paragraph saying what went wrong.
    pub summary: String,
    /// The name and the window of the history that shows it.
    pub window: Option<(u8, Instant, Instant)>,
    /// What the history suggests as the cause, if anything stands out (violations are grouped
    /// by it in the report).
    pub hint: &'static str,
}

/// The hint for a hold whose lease an `extend` had shortened.
pub const HINT_SHORTENED: &str = "the earlier hold's lease had been shortened by extend()";
/// The hint for a hold with a re-entry dropped half-way.
pub const HINT_DROPPED_REENTRY: &str = "a re-entry into this hold failed or was dropped half-way";

/// One hold: a fresh guard and the guards that re-entered it.
#[derive(Debug)]
struct Hold {
    guard: Arc<GuardRec>,
    start: Instant,
    end: Instant,
    last: Instant,
}

/// The latest instant anything about a guard happened (for history windows).
pub(super) fn last_of(g: &GuardRec, finish: Instant) -> Instant {
    let mut last = g.belief_end(finish).max(g.start);
    if let Some(e) = g.end() {
        last = last.max(e.at);
        if let Some((ret, _)) = e.returned {
            last = last.max(ret);
        }
        if let Some((at, _)) = e.hget {
            last = last.max(at);
        }
    }
    if let Some(lost) = g.lost_at.get() {
        last = last.max(*lost);
    }
    last
}

pub(super) fn describe(history: &History, g: &GuardRec, finish: Instant) -> String {
    let end = g.end();
    format!(
        "g{} ({} w{}, token {}{}, called {}) believed held {} .. {}{}",
        g.id,
        history.lockers[usize::from(g.locker)],
        g.worker,
        g.token(),
        if g.reentrant { ", re-entered" } else { "" },
        history.rel(g.call),
        history.rel(g.start),
        history.rel(g.belief_end(finish)),
        match end {
            Some(e) => format!(
                " (ended by {:?} at {}, valid_until {})",
                e.how,
                history.rel(e.at),
                history.rel(e.valid_until)
            ),
            None => " (never ended)".to_owned(),
        }
    )
}

/// Whether a destructive fault on `name` may have acted within `[from, to]`.
fn destroyed_within(faults: &[FaultRec], name: u8, from: Instant, to: Instant) -> bool {
    faults
        .iter()
        .any(|f| f.kind.destructive() && f.hits(name) && f.to >= from && f.from <= to)
}

/// Groups each name's exclusive guards into holds (a read inside the writer's scope belongs to
/// the write hold); reports re-entered guards outside any live hold. Read locks and permits are
/// checked in [`super::shares`].
fn holds(
    history: &History,
    guards: &[Arc<GuardRec>],
    faults: &[FaultRec],
    finish: Instant,
    out: &mut Vec<Violation>,
) -> HashMap<u8, Vec<Hold>> {
    let mut by_name: HashMap<u8, Vec<Hold>> = HashMap::new();
    let mut fresh: HashMap<(u8, u64, u8), Vec<usize>> = HashMap::new();
    let exclusive = |g: &&Arc<GuardRec>| matches!(g.share, Share::Exclusive | Share::ReadInWrite);
    let guards: Vec<&Arc<GuardRec>> = guards.iter().filter(exclusive).collect();
    for g in guards.iter().filter(|g| !g.reentrant) {
        let holds = by_name.entry(g.name).or_default();
        fresh
            .entry((g.name, g.token(), g.locker))
            .or_default()
            .push(holds.len());
        holds.push(Hold {
            guard: (*g).clone(),
            start: g.start,
            end: g.belief_end(finish),
            last: last_of(g, finish),
        });
    }
    for r in guards.iter().filter(|g| g.reentrant) {
        // A re-entry checks that Redis still has the hold; an answer that comes back after the
        // hold's lease ran out (a server that answers late, a stalled connection) must not
        // hand out a guard of a hold this process knows is over. The library looks at the
        // hold's lease once more just before it hands the guard out: a lease that ran out
        // after that, as the call returned (within the timer tolerance and the scheduler's
        // lateness meanwhile), was not known to be over.
        let race = RUN_TIMER_TOLERANCE + history.lags.max_within(r.call, r.start);
        let ran_out_as_it_returned =
            r.granted_until <= r.start && r.granted_until + race >= r.start;
        let handed_out_lost = r.handed_out_lost && !ran_out_as_it_returned;
        if handed_out_lost || r.granted_until + crate::ops::SLACK < r.start {
            out.push(Violation {
                invariant: Invariant::Reentry,
                summary: format!(
                    "re-entry handed out a guard of a hold already over (lost: {}, valid until \
                     {:?} before it returned): {}",
                    r.handed_out_lost,
                    r.start.saturating_duration_since(r.granted_until),
                    describe(history, r, finish)
                ),
                window: Some((r.name, r.call, last_of(r, finish))),
                hint: "",
            });
            continue;
        }
        let holds = by_name.entry(r.name).or_default();
        let parent = fresh
            .get(&(r.name, r.token(), r.locker))
            .into_iter()
            .flatten()
            .copied()
            .filter(|&i| holds[i].start <= r.start)
            .max_by_key(|&i| holds[i].start);
        let Some(parent) = parent else {
            out.push(Violation {
                invariant: Invariant::Reentry,
                summary: format!(
                    "re-entered guard with no hold of its token on its locker before it: {}",
                    describe(history, r, finish)
                ),
                window: Some((r.name, r.call, last_of(r, finish))),
                hint: "",
            });
            continue;
        };
        let p = &holds[parent];
        // Once a fault destroyed the hold, nothing may re-enter it: the key is gone for good.
        // (A fault that reached one locker alone, as a PostgreSQL client's cut connections do,
        // destroyed no other locker's hold.)
        let destroyed_before = faults.iter().any(|f| {
            f.kind.destructive()
                && f.reach.hits_hold(r.name, r.locker)
                && f.from > p.start
                && f.to < r.call
        });
        if destroyed_before {
            out.push(Violation {
                invariant: Invariant::Reentry,
                summary: format!(
                    "re-entry succeeded into a hold a fault had destroyed before the call: {} \
                     re-entered {}",
                    describe(history, r, finish),
                    describe(history, &p.guard, finish)
                ),
                window: Some((r.name, p.guard.call, last_of(r, finish))),
                hint: "",
            });
        }
        let (end, last) = (r.belief_end(finish), last_of(r, finish));
        let p = &mut holds[parent];
        p.end = p.end.max(end);
        p.last = p.last.max(last);
    }
    by_name
}

fn mutual_exclusion(
    history: &History,
    name: u8,
    holds: &[&Hold],
    faults: &[FaultRec],
    finish: Instant,
    out: &mut Vec<Violation>,
) {
    let mut active: Vec<&Hold> = Vec::new();
    for b in holds {
        active.retain(|a| a.end > b.start);
        for a in &active {
            let (ta, tb) = (a.guard.token(), b.guard.token());
            if ta != 0 && ta == tb {
                continue;
            }
            // The hold granted first must have vanished from Redis before the other was
            // granted: excused only if a destructive fault may have removed it, at or after its
            // acquisition was called and before the other's belief began. With both tokens known
            // the smaller one was granted first; where a token is unknown, the earlier belief —
            // except that a multi-lock's name may have been granted long before its belief
            // began (it went on to take its other names), so the later belief may be the earlier
            // grant, and a fault that may have removed it excuses the pair too.
            let removed = |first: &Hold, second: &Hold| {
                destroyed_within(faults, name, first.guard.call, second.start)
            };
            let (first, second) = if ta != 0 && tb != 0 {
                if ta < tb { (a, b) } else { (b, a) }
            } else if b.guard.multi && removed(b, a) {
                continue;
            } else if a.start <= b.start {
                (a, b)
            } else {
                (b, a)
            };
            if removed(first, second) {
                continue;
            }
            out.push(Violation {
                invariant: Invariant::MutualExclusion,
                summary: format!(
                    "two holds of `{}` overlap by {} with no destructive fault that could have \
                     removed the first-minted one before the other was granted:\n      \
                     A: {}\n      B: {}",
                    history.names[usize::from(name)],
                    ms(a.end.min(b.end) - b.start),
                    describe(history, &a.guard, finish),
                    describe(history, &b.guard, finish)
                ),
                window: Some((name, a.guard.call.min(b.guard.call), a.last.max(b.last))),
                hint: if first.guard.shortened_before(second.start) {
                    HINT_SHORTENED
                } else {
                    ""
                },
            });
        }
        active.push(b);
    }
}

/// Redis keeps a key in whole milliseconds, and the period starts a moment before the checker
/// reads the grant's return.
const PERIOD_TOLERANCE: Duration = Duration::from_millis(3);

/// A hold released within its `at_least` period — a release that returned `Released` before the
/// guard's belief ended, so the script found the hold and kept the key — leaves the name to
/// nobody until the period ends. Excused by a fault that destroys keys or loses writes (a
/// replica-acknowledged failover too: a release is not held back for acknowledgement).
fn at_least(
    history: &History,
    name: u8,
    holds: &[&Hold],
    faults: &[FaultRec],
    finish: Instant,
    out: &mut Vec<Violation>,
) {
    for a in holds {
        let Some(period) = a.guard.at_least else {
            continue;
        };
        let Some(end) = a.guard.end() else {
            continue;
        };
        let kept = end.final_of_hold
            && matches!(end.returned, Some((ret, Outcome::Released)) if ret <= end.valid_until);
        let until = a.guard.start + period;
        if !kept || end.at >= until {
            continue;
        }
        // The period starts when the library has the guard, a moment before the checker reads
        // the call's return: that moment is as long as the machine was late to wake the task.
        let tolerance = PERIOD_TOLERANCE + history.lags.max_within(a.guard.call, a.guard.start);
        // A fault that may have removed a hold of the name between `from` and `to`.
        let removed = |from: Instant, to: Instant| {
            faults.iter().any(|f| {
                (f.kind.destructive() || f.kind == FaultKind::AckedFailover)
                    && f.hits(name)
                    && f.to >= from
                    && f.from <= to
            })
        };
        // Granted after A (a higher token): a hold granted before A and destroyed by a fault
        // may come to believe it holds only after A's release, but Redis never kept it. With
        // A's token unknown, a multi-lock's name may be such a hold too (as in
        // `mutual_exclusion`): Redis may have granted it long before its belief began (it went
        // on to take its other names), before A's grant, so a fault that may have removed it
        // before A was granted excuses it.
        let granted_before_a = |b: &Hold| {
            a.guard.token() == 0 && b.guard.multi && removed(b.guard.call, a.guard.start)
        };
        let early = holds.iter().filter(|b| {
            b.guard.token() > a.guard.token()
                && b.start >= end.at
                && b.start + tolerance < until
                && !removed(a.guard.call, b.start)
                && !granted_before_a(b)
        });
        for b in early {
            out.push(Violation {
                invariant: Invariant::AtLeast,
                summary: format!(
                    "`{}` was granted {} before the at-least period ({}) of a hold released \
                     {} into it ended:\n      A: {}\n      B: {}",
                    history.names[usize::from(name)],
                    ms(until - b.start),
                    ms(period),
                    ms(end.at - a.guard.start),
                    describe(history, &a.guard, finish),
                    describe(history, &b.guard, finish)
                ),
                window: Some((name, a.guard.call, b.last)),
                hint: "",
            });
        }
    }
}

fn fencing_order(
    history: &History,
    name: u8,
    holds: &[&Hold],
    finish: Instant,
    out: &mut Vec<Violation>,
) {
    // A before B when A's belief ended before B's acquisition was even called: B's token was
    // minted after A's, whatever happened in between (a token minted at the first ask, during
    // the hold, too). Holds whose token is unknown (never asked for) are left out.
    let holds: Vec<&Hold> = (holds.iter().copied())
        .filter(|h| h.guard.token() != 0)
        .collect();
    let mut by_end: Vec<&Hold> = holds.clone();
    by_end.sort_by_key(|h| h.end);
    let mut by_call: Vec<&Hold> = holds;
    by_call.sort_by_key(|h| h.guard.call);
    let mut max: Option<&Hold> = None;
    let mut i = 0;
    for b in by_call {
        while i < by_end.len() && by_end[i].end <= b.guard.call {
            if max.is_none_or(|m| by_end[i].guard.token() > m.guard.token()) {
                max = Some(by_end[i]);
            }
            i += 1;
        }
        if let Some(a) = max
            && a.guard.token() >= b.guard.token()
        {
            out.push(Violation {
                invariant: Invariant::FencingOrder,
                summary: format!(
                    "a later hold of `{}` has a token no greater than an earlier one:\n      \
                     A: {}\n      B: {}",
                    history.names[usize::from(name)],
                    describe(history, &a.guard, finish),
                    describe(history, &b.guard, finish)
                ),
                window: Some((name, a.guard.call, a.last.max(b.last))),
                hint: "",
            });
        }
    }
}

/// (b) A guard's token never changes: `fencing_token()` answers the token the guard had with
/// its grant or from an earlier ask (of any guard of its hold); and a guard that knew itself
/// lost when it asked gets no token at all.
fn tokens_kept(
    history: &History,
    events: &[Event],
    guards: &[Arc<GuardRec>],
    finish: Instant,
    out: &mut Vec<Violation>,
) {
    for e in events {
        let EventKind::Fenced {
            guard,
            token: Some(token),
            lost_before,
        } = e.kind
        else {
            continue;
        };
        let Some(g) = guards.iter().find(|g| g.id == guard) else {
            continue;
        };
        if lost_before {
            out.push(Violation {
                invariant: Invariant::FencingOrder,
                summary: format!(
                    "fencing_token() answered {token} to a guard that knew it was lost: {}",
                    describe(history, g, finish)
                ),
                window: Some((g.name, g.call, e.at)),
                hint: "",
            });
        }
        if g.token() != token {
            out.push(Violation {
                invariant: Invariant::FencingOrder,
                summary: format!(
                    "fencing_token() answered {token}, another token than its guard's: {}",
                    describe(history, g, finish)
                ),
                window: Some((g.name, g.call, e.at)),
                hint: "",
            });
        }
    }
}

/// (a) Only an acquisition made to re-enter (a nested `lock` in a scope, a read in a scope that
/// holds the name) may come back re-entered: two acquisitions beside each other in one task,
/// each in a scope of its own, must never re-enter one another.
fn unasked_reentry(
    history: &History,
    events: &[Event],
    guards: &[Arc<GuardRec>],
    finish: Instant,
    out: &mut Vec<Violation>,
) {
    let mut asked: HashMap<u32, AcquireKind> = HashMap::new();
    let mut ordered: Vec<&Event> = events.iter().collect();
    ordered.sort_by_key(|e| e.at);
    for e in ordered {
        match e.kind {
            EventKind::AcquireCall { kind, .. } => {
                asked.insert(e.call, kind);
            }
            EventKind::Acquired {
                guard,
                reentrant: true,
                ..
            } => {
                let kind = asked.get(&e.call).copied();
                if matches!(kind, Some(AcquireKind::Reenter | AcquireKind::Read)) {
                    continue;
                }
                let Some(g) = guards.iter().find(|g| g.id == guard) else {
                    continue;
                };
                out.push(Violation {
                    invariant: Invariant::Reentry,
                    summary: format!(
                        "an acquisition that was not asked to re-enter ({kind:?}) re-entered a \
                         hold: {}",
                        describe(history, g, finish)
                    ),
                    window: Some((g.name, g.call, last_of(g, finish))),
                    hint: "",
                });
            }
            _ => {}
        }
    }
}

fn release_truth(
    history: &History,
    events: &[Event],
    guards: &[Arc<GuardRec>],
    faults: &[FaultRec],
    finish: Instant,
    out: &mut Vec<Violation>,
) {
    // Guards with an `extend` whose answer was lost (a backend error): it may have applied.
    let maybe_extended: std::collections::HashSet<u32> = (events.iter())
        .filter_map(|e| match e.kind {
            EventKind::ExtendDone {
                guard,
                result: Err(ErrKind::Backend),
            } => Some(guard),
            _ => None,
        })
        .collect();
    for g in guards {
        let Some(end) = g.end() else { continue };
        let Some((ret, outcome)) = end.returned else {
            continue;
        };
        let window = Some((g.name, g.call, last_of(g, finish)));
        if outcome == Outcome::Released
            && end.final_of_hold
            && end.hget.is_some_and(|(_, found)| found == Some(g.token()))
        {
            let dropped_reentry = events.iter().any(|e| {
                e.worker == g.worker
                    && e.name == g.name
                    && e.at >= g.start
                    && e.at <= end.at
                    && matches!(
                        e.kind,
                        EventKind::AcquireDropped | EventKind::AcquireFailed(ErrKind::Backend)
                    )
            });
            out.push(Violation {
                invariant: Invariant::ReleaseTruth,
                summary: format!(
                    "the last release of a hold said Released, but Redis still holds it \
                     (its token {} on the key): {}",
                    g.token(),
                    describe(history, g, finish)
                ),
                window,
                hint: if dropped_reentry {
                    HINT_DROPPED_REENTRY
                } else {
                    ""
                },
            });
        }
        // A fixed lease, never extended, ends on the server by `lease` after the grant's reply
        // came back: a guard that let go later than that (and the ms rounding of leases and
        // server clocks) held nothing when it let go, whatever its kind. A re-entered guard
        // joined a hold taken earlier, with that hold's lease (the one it asked for does not
        // apply): its end is bounded by the hold's deadline it saw when it let go (which the
        // samples check against the server's PTTL).
        let never_changed =
            !g.watchdog && locked(&g.extends).is_empty() && !maybe_extended.contains(&g.id);
        let lease_end = if g.reentrant {
            end.valid_until
        } else {
            g.start + g.lease
        };
        if outcome == Outcome::Released && never_changed && end.at > lease_end + LEASE_ROUNDING {
            out.push(Violation {
                invariant: Invariant::ReleaseTruth,
                summary: format!(
                    "release said Released for a hold that let go {} after its fixed lease \
                     had run out: {}",
                    ms(end.at - lease_end),
                    describe(history, g, finish)
                ),
                window,
                hint: "",
            });
        }
        if matches!(outcome, Outcome::Expired | Outcome::TakenOver) {
            let lost = end.lost_before || g.lost_at.get().is_some_and(|l| *l <= end.at);
            let destroyed = destroyed_within(faults, g.name, g.call, ret);
            // A pause while the release is in flight delays its script past the lease: the
            // outcome is then the truth about the moment Redis ran it.
            let paused = faults
                .iter()
                .any(|f| f.kind == FaultKind::Pause && f.to >= end.at && f.from <= ret);
            let let_go = LET_GO_TOLERANCE + history.lags.max_within(end.at, ret);
            if !lost && end.at + let_go < end.valid_until && !destroyed && !paused {
                out.push(Violation {
                    invariant: Invariant::ReleaseTruth,
                    summary: format!(
                        "release said {outcome:?} for a hold that was not lost, was released \
                         {} before its valid_until, and no destructive fault hit: {}",
                        ms(end.valid_until - end.at),
                        describe(history, g, finish)
                    ),
                    window,
                    hint: if g.shortened_before(end.at) {
                        HINT_SHORTENED
                    } else {
                        ""
                    },
                });
            }
        }
    }
    for run in history.runs() {
        let g = &run.guard;
        let work_end = run.started + run.work;
        let mut over = run.valid_until_after;
        if let Some(lost) = g.lost_at.get() {
            over = over.min(*lost);
        }
        if run.ok && work_end > over + RUN_TIMER_TOLERANCE {
            out.push(Violation {
                invariant: Invariant::RunTruth,
                summary: format!(
                    "run() let its work finish {} after the hold's validity ended: {}",
                    ms(work_end - over),
                    describe(history, g, finish)
                ),
                window: Some((g.name, g.call, work_end.max(last_of(g, finish)))),
                hint: "",
            });
        }
    }
}

/// Every invariant over the history, up to `finish` (guards never ended count as held until
/// then). `unreliable` lockers are left out of (f) and never count as overtaken fair waiters.
pub fn check(history: &History, finish: Instant, unreliable: &[u8]) -> Vec<Violation> {
    let guards = history.guards();
    let faults = history.faults();
    let mut out = Vec::new();
    let by_name = holds(history, &guards, &faults, finish, &mut out);
    super::sample::check(history, &mut out);
    let mut names: Vec<&u8> = by_name.keys().collect();
    names.sort();
    for &name in names {
        let mut holds: Vec<&Hold> = by_name[&name].iter().filter(|h| h.start < h.end).collect();
        holds.sort_by_key(|h| h.start);
        mutual_exclusion(history, name, &holds, &faults, finish, &mut out);
        at_least(history, name, &holds, &faults, finish, &mut out);
        fencing_order(history, name, &holds, finish, &mut out);
        // A token handed out twice (as fresh holds) is a fencing failure whatever the times.
        let mut seen: HashMap<u64, &Hold> = HashMap::new();
        for h in by_name[&name].iter().filter(|h| h.guard.token() != 0) {
            if let Some(first) = seen.insert(h.guard.token(), h) {
                out.push(Violation {
                    invariant: Invariant::FencingOrder,
                    summary: format!(
                        "one token handed out to two fresh holds:\n      A: {}\n      B: {}",
                        describe(history, &first.guard, finish),
                        describe(history, &h.guard, finish)
                    ),
                    window: Some((name, first.guard.call, first.last.max(h.last))),
                    hint: "",
                });
            }
        }
    }
    let events = history.events();
    tokens_kept(history, &events, &guards, finish, &mut out);
    unasked_reentry(history, &events, &guards, finish, &mut out);
    release_truth(history, &events, &guards, &faults, finish, &mut out);
    super::watchdog::check(history, &guards, &faults, unreliable, finish, &mut out);
    out.extend(super::fair::check(history, &faults, unreliable).1);
    out.extend(super::shares::check(history, finish).1);
    super::bounded::check(history, &faults, &mut out);
    out
}

#[cfg(test)]
mod tests;
