//! (e) A release wakes its waiters in time: when a plain lock (or the read-write name's write
//! lock) is released while someone waits for it over a subscription, the name is granted again
//! within a bound — not when the released hold's lease would have run out.
//!
//! A waiter that sleeps until the lease ends is still correct, which is why no safety invariant
//! sees a lost wake-up: after a slot moved or a master failed over, a subscription the client
//! believes in may be gone on the server, and every waiter on that channel sleeps its fallback
//! out. This check looks at each successful final release of a plain lock while an acquisition
//! of the name by a subscribing locker waited: some acquisition (that one or another) must
//! return a guard of the name within [`WAKE_WITHIN`] of the release's answer (within
//! [`WAKE_WITHIN_AFTER_A_FAULT`] just after a fault that reached the name), plus the scheduler's
//! lag, unless a fault reached the name (or that waiter's locker) meanwhile — a slot migration
//! never does: the lock's key, its channel and a kept lock stay reachable all along; nor does a
//! failover once its replica has taken over.
//!
//! The same bound holds after a waiting acquisition is dropped half-way with no guard of the
//! name held after it: the lock may have been handed to it, and its clean-up gives it back.

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

use super::faults::{FaultKind, FaultRec};
use super::history::{AcquireKind, EventKind, GuardRec, History, Outcome, Share, ms};
use super::invariants::{Invariant, Violation};

/// How soon after a release's answer a waiting name must be granted again.
pub(super) const WAKE_WITHIN: Duration = Duration::from_millis(250);

/// How soon, for a release made within [`SETTLING`] of the end of a fault that reached the name
/// (a failover, a slot moved, a master back): subscriptions follow the new owner of the
/// channel meanwhile.
pub(super) const WAKE_WITHIN_AFTER_A_FAULT: Duration = Duration::from_secs(1);

/// How long after a fault a release counts as made while things settle.
const SETTLING: Duration = Duration::from_secs(2);

/// One waiting acquisition: who, from when, until when (`None`: never returned).
struct Waiter {
    locker: u8,
    name: u8,
    called: Instant,
    ended: Option<Instant>,
}

/// One multi-lock call: its names, from when, until when (`None`: never returned).
struct Multi {
    names: Vec<u8>,
    called: Instant,
    ended: Option<Instant>,
}

/// Every release of a plain lock that left a subscribing waiter asleep past the bound.
/// `polling` lockers wait without a subscription: their waits are left out. `acknowledged`: how
/// long a grant may wait for replicas to acknowledge it, added to the bound.
pub(super) fn check(
    history: &History,
    faults: &[FaultRec],
    (polling, acknowledged): (&[u8], Duration),
    out: &mut Vec<Violation>,
) {
    let mut waiters: HashMap<u32, Waiter> = HashMap::new();
    let mut multis: HashMap<u32, Multi> = HashMap::new();
    // Waiting acquisitions dropped half-way: name, locker, when.
    let mut dropped: Vec<(u8, u8, Instant)> = Vec::new();
    for e in history.events() {
        match e.kind {
            EventKind::AcquireCall {
                kind: AcquireKind::LockAll,
                ..
            } => {
                let multi = multis.entry(e.call).or_insert_with(|| Multi {
                    names: Vec::new(),
                    called: e.at,
                    ended: None,
                });
                multi.names.push(e.name);
            }
            EventKind::AcquireCall {
                kind: AcquireKind::Lock,
                wait,
                ..
            } if !wait.is_zero() && !polling.contains(&e.locker) => {
                let waiter = Waiter {
                    locker: e.locker,
                    name: e.name,
                    called: e.at,
                    ended: None,
                };
                waiters.insert(e.call, waiter);
            }
            EventKind::Acquired { .. }
            | EventKind::Busy
            | EventKind::AcquireFailed(_)
            | EventKind::AcquireDropped => {
                if let Some(w) = waiters.get_mut(&e.call) {
                    w.ended = Some(e.at);
                    if matches!(e.kind, EventKind::AcquireDropped) {
                        dropped.push((w.name, w.locker, e.at));
                    }
                }
                if let Some(m) = multis.get_mut(&e.call) {
                    m.ended.get_or_insert(e.at);
                }
            }
            _ => {}
        }
    }
    let guards = history.guards();
    let mut granted: HashMap<u8, Vec<Instant>> = HashMap::new();
    for g in guards.iter().filter(|g| !g.reentrant) {
        granted.entry(g.name).or_default().push(g.start);
    }
    // Plain locks, and the read-write name's write lock: writers take turns as plain locks'
    // waiters do (a reader granted after the release counts as the name granted again).
    let turns = |g: &GuardRec| {
        let plain = !history.is_fair(g.name) && !history.is_semaphore(g.name);
        plain && (!history.is_rw(g.name) || g.share == Share::Exclusive)
    };
    for g in guards.iter().filter(|g| !g.reentrant && turns(g)) {
        // A release kept for an at-least period frees the name later, by design.
        if g.at_least.is_some() {
            continue;
        }
        let Some(end) = g.end() else { continue };
        let Some((answered, Outcome::Released)) = end.returned else {
            continue;
        };
        if !end.final_of_hold {
            continue;
        }
        let settling = faults.iter().filter(|f| f.hits(g.name)).any(|f| {
            (f.to <= end.at && end.at - f.to < SETTLING)
                || (f.kind == FaultKind::Promoted && f.from <= end.at && f.to >= end.at)
        });
        let bound = acknowledged
            + if settling {
                WAKE_WITHIN_AFTER_A_FAULT
            } else {
                WAKE_WITHIN
            };
        let deadline = answered + bound;
        // A slot on its way to another master excuses nothing: its keys and its channel stay
        // reachable all along (a lock kept for a claimant's `Locker` is taken by an attempt
        // that names its key alone). Nor does a failover once its replica took over: the
        // release ran on the new master, which published its wake-up.
        let reached = |locker: u8| {
            faults.iter().any(|f| {
                !matches!(f.kind, FaultKind::Migration | FaultKind::Promoted)
                    && f.reach.hits_hold(g.name, locker)
                    && f.from <= deadline
                    && f.to >= end.at
            })
        };
        // Waiting since before the release, still waiting at the deadline, and reachable.
        let asleep: Vec<&Waiter> = (waiters.values())
            .filter(|w| w.name == g.name && w.called < end.at)
            .filter(|w| w.ended.is_none_or(|t| t > deadline))
            .filter(|w| !reached(w.locker))
            .collect();
        let Some(first) = asleep.iter().min_by_key(|w| w.called) else {
            continue;
        };
        let lag = history.lags.max_within(answered, deadline);
        let by = deadline + lag;
        let next = (granted.get(&g.name).into_iter().flatten())
            .filter(|&&s| s >= end.at)
            .min()
            .copied();
        if next.is_some_and(|s| s <= by) {
            continue;
        }
        // A multi-lock at work after the release may have held the name meanwhile.
        if multi_held(multis.values(), g.name, (end.at, deadline)) {
            continue;
        }
        let next = next.map_or_else(
            || "never, in the run".to_owned(),
            |s| format!("{} after the release answered", ms(s - answered)),
        );
        out.push(Violation {
            invariant: Invariant::WakeUp,
            summary: format!(
                "{} released `{}` (answered Released) while {} acquisition(s) waited on it \
                 over a subscription (the first on {}, waiting since {} before); the name was \
                 granted again {next}, past the bound of {} and the {} the scheduler was late",
                history.lockers[usize::from(g.locker)],
                history.names[usize::from(g.name)],
                asleep.len(),
                history.lockers[usize::from(first.locker)],
                ms(end.at - first.called),
                ms(bound),
                ms(lag)
            ),
            window: Some((g.name, first.called, by)),
            hint: "a lost wake-up: the waiter slept its fallback out",
        });
    }
    dropped_waiters(
        history,
        faults,
        (&waiters, &multis, &granted),
        &dropped,
        acknowledged,
        out,
    );
}

/// Whether a multi-lock call that named `name` was at work some time in `from..to`: a
/// multi-lock takes its names one after another, and holds those it has while it waits for the
/// next, a hold the history cannot see (it records the guards a multi-lock returns, not what it
/// gave back).
fn multi_held<'a>(
    mut multis: impl Iterator<Item = &'a Multi>,
    name: u8,
    (from, to): (Instant, Instant),
) -> bool {
    multis.any(|m| m.names.contains(&name) && m.called < to && m.ended.is_none_or(|t| t > from))
}

/// What the wake-up check gathered from the history: the waiting acquisitions and multi-locks
/// by call, and each name's grants.
type Seen<'a> = (
    &'a HashMap<u32, Waiter>,
    &'a HashMap<u32, Multi>,
    &'a HashMap<u8, Vec<Instant>>,
);

/// A waiting acquisition dropped half-way may have been handed the lock by a release of its own
/// `Locker` just before: its clean-up gives the lock back, which the waiters left must hear of
/// as they hear of a release. So after such a drop, with no guard of the name held from the
/// drop to the bound, a waiter that waited since before the drop and still waits at the bound is
/// a lost wake-up (the history records no guard for a lock handed to a dropped waiter).
fn dropped_waiters(
    history: &History,
    faults: &[FaultRec],
    (waiters, multis, granted): Seen<'_>,
    dropped: &[(u8, u8, Instant)],
    acknowledged: Duration,
    out: &mut Vec<Violation>,
) {
    let plain =
        |name: u8| !history.is_fair(name) && !history.is_semaphore(name) && !history.is_rw(name);
    let guards = history.guards();
    for &(name, locker, at) in dropped.iter().filter(|(name, ..)| plain(*name)) {
        // The drop itself may be a fault's doing, or come after one that reached the name.
        let settling = faults
            .iter()
            .any(|f| f.hits(name) && f.from <= at && at - f.to.min(at) < SETTLING);
        let bound = acknowledged
            + if settling {
                WAKE_WITHIN_AFTER_A_FAULT
            } else {
                WAKE_WITHIN
            };
        let deadline = at + bound;
        let held = guards.iter().any(|g| {
            g.name == name && g.start <= deadline && g.end().is_none_or(|end| end.at >= at)
        });
        if held {
            continue;
        }
        let reached = |locker: u8| {
            faults.iter().any(|f| {
                !matches!(f.kind, FaultKind::Migration | FaultKind::Promoted)
                    && f.reach.hits_hold(name, locker)
                    && f.from <= deadline
                    && f.to >= at
            })
        };
        if reached(locker) {
            continue;
        }
        let asleep: Vec<&Waiter> = (waiters.values())
            .filter(|w| w.name == name && w.called < at)
            .filter(|w| w.ended.is_none_or(|t| t > deadline))
            .filter(|w| !reached(w.locker))
            .collect();
        let Some(first) = asleep.iter().min_by_key(|w| w.called) else {
            continue;
        };
        let by = deadline + history.lags.max_within(at, deadline);
        let next = (granted.get(&name).into_iter().flatten())
            .filter(|&&s| s >= at)
            .min()
            .copied();
        if next.is_some_and(|s| s <= by) {
            continue;
        }
        if multi_held(multis.values(), name, (at, deadline)) {
            continue;
        }
        let next = next.map_or_else(
            || "never, in the run".to_owned(),
            |s| format!("{} after the drop", ms(s - at)),
        );
        out.push(Violation {
            invariant: Invariant::WakeUp,
            summary: format!(
                "a waiting acquisition of `{}` on {} was dropped, no guard of the name was held \
                 after it, and {} acquisition(s) that waited since before it (the first on {}, \
                 since {} before) still waited {} later; the name was granted again {next}",
                history.names[usize::from(name)],
                history.lockers[usize::from(locker)],
                asleep.len(),
                history.lockers[usize::from(first.locker)],
                ms(at - first.called),
                ms(by - at),
            ),
            window: Some((name, first.called, by)),
            hint: "a lock handed to a dropped waiter was given back without waking the next",
        });
    }
}

/// Every final release answered `Unreachable` while its name's slot was migrating and no other
/// fault reached it or its locker: a migration loses nothing and leaves every key reachable (on
/// one side or the other), so a release must be answered; one that fails leaves its waiters
/// asleep until the hold's lease runs out.
pub(super) fn migrating_releases(history: &History, faults: &[FaultRec], out: &mut Vec<Violation>) {
    for g in history.guards().iter().filter(|g| !g.reentrant) {
        let Some(end) = g.end() else { continue };
        let Some((answered, Outcome::Unreachable)) = end.returned else {
            continue;
        };
        if !end.final_of_hold {
            continue;
        }
        let during = |f: &&FaultRec| f.from <= answered && f.to >= end.at;
        let migrating = faults
            .iter()
            .filter(during)
            .any(|f| f.kind == FaultKind::Migration && f.hits(g.name));
        let other = faults
            .iter()
            .filter(during)
            .any(|f| f.kind != FaultKind::Migration && f.reach.hits_hold(g.name, g.locker));
        if !migrating || other {
            continue;
        }
        out.push(Violation {
            invariant: Invariant::WakeUp,
            summary: format!(
                "{} released `{}` while its slot was migrating, and the release failed \
                 (Unreachable, after {}) though no other fault reached it",
                history.lockers[usize::from(g.locker)],
                history.names[usize::from(g.name)],
                ms(answered - end.at)
            ),
            window: Some((g.name, g.call, answered)),
            hint: "a release during a slot migration failed: its waiters sleep until the lease ends",
        });
    }
}
