//! (a) A fair lock goes to its waiters in the order they came.
//!
//! One name of every run is taken with `fair_lock`. For that name, take two waiting
//! acquisitions A and B — `fair_lock(..).wait(w)` with `w > 0`, neither a `try_lock` nor a
//! re-entry, neither dropped half-way, A not on a locker whose commands are meant to time out,
//! A not failed with an error — where A was called more than [`SLACK`] before B. If B was
//! granted while A was still waiting, B overtook A, and that is a violation unless something
//! listed below excuses it.
//!
//! "While A was still waiting" is read conservatively from what the checker sees:
//!
//! - A granted: A's grant was seen after B's (`B.start < A.start`), and A's lease had not run out
//!   when its grant was seen. Then Redis granted B first: A's hold could not have come and gone
//!   before B's grant without A releasing it (which it does only after `A.start`) or a fault.
//! - A gave up (busy at its deadline): B's grant was seen before `A.call + w`. A waiter stays in
//!   line until its deadline (it leaves only when its call returns, which is no earlier).
//!
//! What may legitimately let B overtake A, and how each is excused:
//!
//! - A had not joined the line yet: a waiter's first attempt does not join; it joins one
//!   subscription and one more attempt later, a few round trips after its call. [`SLACK`]
//!   between the calls covers that (strictly more: on a paused clock, instants can be equal).
//!   The subscription waits for the subscriber's acknowledgement longer only while the
//!   subscriber connects again, after a fault (see below).
//! - A lost its place: A's place in line is a token of its own, kept while its attempts fail (a
//!   backend error, a command timeout), so A loses it only when none of its attempts lands for
//!   the whole dead-waiter timeout (next point). Backend errors mostly come from faults; a locker
//!   with a command timeout meant to expire is never taken as A. They also come without one — a
//!   grant the replica did not acknowledge in time (replica-acknowledged runs), a command slowed
//!   past its timeout on a loaded machine — and A's failed attempts are not in the history (its
//!   call goes on), so backend errors on A's locker between A's call and B's grant that span a
//!   third of the dead-waiter timeout or more excuse the pair. (On layout 1's frozen scripts a
//!   failed attempt's clean-up took A out of the line: there, any such error excuses it.)
//! - A was dropped as a dead waiter: A renews its place at least every third of the dead-waiter
//!   timeout, and loses it only when no attempt lands for the whole timeout — a fault that
//!   delays or drops commands, or a scheduler that leaves A's task unpolled for two thirds of
//!   the timeout.
//! - Any fault that may touch the fair name (one aimed at another name cannot reorder its line)
//!   from [`AFTERMATH`] before A's call to B's grant being seen excuses the pair — pauses and
//!   stalls included: a stalled waiter may have been dropped as dead. A fault that ended just
//!   before A's call still counts: a connection it broke fails the next command sent on it, and
//!   a subscriber it cut reconnects, after it ended.
//! - A scheduler that woke tasks more than [`STARVED`] late (as the lag monitor saw it) in that
//!   span excuses the pair: A's few awaits before joining, or its heartbeats, may each have
//!   slipped that much.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::faults::FaultRec;
use super::history::{AcquireKind, ErrKind, Event, EventKind, GuardRec, History, ms};
use super::invariants::{Invariant, Violation};
use super::ops::SLACK;

/// A scheduler lag past this (or past a third of the dead-waiter timeout, if shorter) excuses
/// an overtake: about a quarter of [`SLACK`], so that the few awaits before a waiter joins the
/// line fit in [`SLACK`] even when each is that late, and well under the two thirds of a
/// dead-waiter timeout a heartbeat must slip to lose its place.
pub const STARVED: Duration = Duration::from_millis(60);

/// How long before A's call a fault that ended may still have cost A its place (see the module
/// docs).
pub const AFTERMATH: Duration = Duration::from_millis(500);

/// How one acquisition of the fair name ended.
#[derive(Debug, Clone, Copy)]
enum Ended {
    /// A guard, handed out at `at`.
    Granted { guard: u32, at: Instant },
    /// Busy at its deadline, returned at `at`.
    Busy { at: Instant },
    /// Failed with an error other than a timeout, or dropped half-way.
    Failed { at: Instant },
}

/// One acquisition call on the fair name, with its end.
#[derive(Debug, Clone, Copy)]
struct Wait {
    worker: u16,
    locker: u8,
    kind: AcquireKind,
    wait: Duration,
    call: Instant,
    ended: Option<Ended>,
}

impl Wait {
    /// A waiting acquisition (it may stand in line): not a `try_lock`, not a re-entry, a wait.
    fn waits(&self) -> bool {
        self.kind == AcquireKind::Lock && !self.wait.is_zero()
    }

    /// Until when, at least, it stood in line (once it had joined), if that can be told.
    fn in_line_until(&self, guards: &HashMap<u32, Arc<GuardRec>>) -> Option<Instant> {
        match self.ended? {
            Ended::Granted { guard, at } => {
                let g = guards.get(&guard)?;
                (!g.reentrant && g.granted_until > at).then_some(at)
            }
            Ended::Busy { .. } => self.call.checked_add(self.wait),
            Ended::Failed { .. } => None,
        }
    }
}

/// What the fair-order check looked at in one run.
#[derive(Debug, Clone, Copy, Default)]
pub struct FairFigures {
    /// The fair name's index, if the run had one.
    pub name: Option<u8>,
    /// Guards handed out on it (re-entries included).
    pub guards: usize,
    /// Waiting acquisitions on it.
    pub waits: usize,
    /// Pairs where B was called more than [`SLACK`] after A while A still waited, and B was
    /// granted.
    pub contested: usize,
    /// Of those, pairs where B was granted first, excused by a fault near the fair name.
    pub excused_by_faults: usize,
    /// Of those, pairs where B was granted first, excused by scheduler lag.
    pub excused_by_lag: usize,
    /// Pairs where B was granted first with nothing to excuse it.
    pub overtakes: usize,
}

impl fmt::Display for FairFigures {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Some(name) = self.name else {
            return f.write_str("no fair name");
        };
        write!(
            f,
            "fair name #{name}: {} guards, {} waiting acquisitions, {} contested pairs, \
             overtaken {} times ({} excused by faults, {} by scheduler lag)",
            self.guards,
            self.waits,
            self.contested,
            self.overtakes + self.excused_by_faults + self.excused_by_lag,
            self.excused_by_faults,
            self.excused_by_lag
        )
    }
}

/// Every acquisition call on `name`, paired with its end by the call's id (a worker may make two
/// calls on one name at once, in scopes beside each other).
fn waits_of(events: &[Event], name: u8) -> Vec<Wait> {
    let mut out: Vec<Wait> = Vec::new();
    let mut pending: HashMap<u32, usize> = HashMap::new();
    for e in events.iter().filter(|e| e.name == name) {
        let ended = match e.kind {
            EventKind::AcquireCall { kind, wait, .. } => {
                pending.insert(e.call, out.len());
                out.push(Wait {
                    worker: e.worker,
                    locker: e.locker,
                    kind,
                    wait,
                    call: e.at,
                    ended: None,
                });
                continue;
            }
            EventKind::Acquired { guard, .. } => Ended::Granted { guard, at: e.at },
            EventKind::Busy | EventKind::AcquireFailed(ErrKind::Busy) => Ended::Busy { at: e.at },
            EventKind::AcquireFailed(_) | EventKind::AcquireDropped => Ended::Failed { at: e.at },
            _ => continue,
        };
        if let Some(i) = pending.remove(&e.call) {
            out[i].ended = Some(ended);
        }
    }
    out
}

fn describe(history: &History, w: &Wait) -> String {
    let ended = match w.ended {
        Some(Ended::Granted { guard, at }) => format!("granted g{guard} at {}", history.rel(at)),
        Some(Ended::Busy { at }) => format!("busy at {}", history.rel(at)),
        Some(Ended::Failed { at }) => format!("failed at {}", history.rel(at)),
        None => "never returned".to_owned(),
    };
    format!(
        "w{} ({}) called {} with wait {}, {ended}",
        w.worker,
        history.lockers[usize::from(w.locker)],
        history.rel(w.call),
        ms(w.wait)
    )
}

/// The fair-order check over a finished history; `unreliable` lockers are never taken as the
/// overtaken waiter.
pub(crate) fn check(
    history: &History,
    faults: &[FaultRec],
    unreliable: &[u8],
) -> (FairFigures, Vec<Violation>) {
    let mut figures = FairFigures {
        name: history.fair,
        ..FairFigures::default()
    };
    let mut out = Vec::new();
    let Some(name) = history.fair else {
        return (figures, out);
    };
    let guards: HashMap<u32, Arc<GuardRec>> = (history.guards().into_iter())
        .filter(|g| g.name == name)
        .map(|g| (g.id, g))
        .collect();
    figures.guards = guards.len();
    let events = history.events();
    let all = waits_of(&events, name);
    // When each locker's calls failed on the backend (Redis unreachable, a command timed out, a
    // grant not acknowledged): an attempt of a waiter that failed so is cleaned up with its
    // owner, and the waiter comes back under a new owner at the back of the line.
    let mut backend_errors: HashMap<u8, Vec<Instant>> = HashMap::new();
    for e in &events {
        if matches!(e.kind, EventKind::AcquireFailed(ErrKind::Backend)) {
            backend_errors.entry(e.locker).or_default().push(e.at);
        }
    }
    // A waiter keeps its place through a failed attempt (its place is a token of its own), and
    // loses it only when none of its attempts lands for the whole dead-waiter timeout: the
    // locker's calls failing on and off for a third of it at least. A locker on layout 1's
    // frozen scripts loses the place with any failed attempt.
    let lasting = history.dead_waiter_timeout / 3;
    let errored = |locker: u8, from: Instant, to: Instant| {
        let mut within = (backend_errors.get(&locker).into_iter().flatten())
            .filter(|at| **at >= from && **at <= to);
        let Some(first) = within.next() else {
            return false;
        };
        let last = within.next_back().unwrap_or(first);
        history.runs_frozen_layout(locker) || last.saturating_duration_since(*first) >= lasting
    };
    // The overtaken: waiting, and with a known time it stood in line until.
    let mut ahead: Vec<(Wait, Instant)> = (all.iter())
        .filter(|w| w.waits() && !unreliable.contains(&w.locker))
        .filter_map(|w| Some((*w, w.in_line_until(&guards)?)))
        .collect();
    ahead.sort_by_key(|(w, _)| w.call);
    figures.waits = all.iter().filter(|w| w.waits()).count();
    let longest = (ahead.iter())
        .map(|(w, until)| until.saturating_duration_since(w.call))
        .max()
        .unwrap_or_default();
    let starved = STARVED.min(history.dead_waiter_timeout / 3);
    let faulted = |from: Instant, to: Instant| {
        (faults.iter()).any(|f| f.hits(name) && f.to >= from && f.from <= to)
    };
    for b in all.iter().filter(|w| w.waits()) {
        let Some(Ended::Granted { guard, at: granted }) = b.ended else {
            continue;
        };
        if guards.get(&guard).is_none_or(|g| g.reentrant) {
            continue;
        }
        // A called more than SLACK before B, and still in line when B was called.
        let lo = ahead.partition_point(|(a, _)| a.call + longest < b.call);
        let mut overtaken: Vec<&Wait> = Vec::new();
        for (a, until) in ahead[lo..]
            .iter()
            .take_while(|(a, _)| a.call + SLACK < b.call)
        {
            if *until <= b.call {
                continue;
            }
            figures.contested += 1;
            if granted >= *until {
                continue;
            }
            let since = a.call.checked_sub(AFTERMATH).unwrap_or(a.call);
            if faulted(since, granted) || errored(a.locker, a.call, granted) {
                figures.excused_by_faults += 1;
            } else if history.lags.max_within(a.call, granted) > starved {
                figures.excused_by_lag += 1;
            } else {
                figures.overtakes += 1;
                overtaken.push(a);
            }
        }
        let Some(first) = overtaken.first() else {
            continue;
        };
        out.push(Violation {
            invariant: Invariant::FairOrder,
            summary: format!(
                "fair `{}` was granted to B {} after B's call while {} waiter(s) called more \
                 than {} before B still waited in line (A: the first of them, called {} before \
                 B), with no fault near the name from {} before A's call on and no scheduler \
                 lag over {} meanwhile:\n      \
                 A: {}\n      B: {}",
                history.names[usize::from(name)],
                ms(granted - b.call),
                overtaken.len(),
                ms(SLACK),
                ms(b.call - first.call),
                ms(AFTERMATH),
                ms(starved),
                describe(history, first),
                describe(history, b)
            ),
            window: Some((name, first.call, granted)),
            hint: "",
        });
    }
    (figures, out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::LeaseSpec;

    fn at(origin: Instant, ms: u64) -> Instant {
        origin + Duration::from_millis(ms)
    }

    /// Two acquisitions of one name by one worker, under way at once (scopes beside each
    /// other): each end answers its own call, whichever came last.
    #[test]
    fn ends_pair_with_their_own_calls() {
        let t = Instant::now();
        let event = |ms: u64, call: u32, kind: EventKind| Event {
            at: at(t, ms),
            worker: 15,
            locker: 1,
            name: 3,
            call,
            kind,
        };
        let asked = EventKind::AcquireCall {
            kind: AcquireKind::Lock,
            wait: Duration::from_millis(100),
            lease: LeaseSpec::LockerDefault,
        };
        let granted = EventKind::Acquired {
            guard: 7,
            token: 0,
            reentrant: false,
        };
        let events = [
            event(0, 1, asked),
            event(10, 2, asked),
            event(100, 1, EventKind::Busy),
            event(170, 2, granted),
        ];
        let waits = waits_of(&events, 3);
        assert_eq!(waits.len(), 2);
        assert!(matches!(waits[0].ended, Some(Ended::Busy { at: a }) if a == at(t, 100)));
        assert!(
            matches!(waits[1].ended, Some(Ended::Granted { guard: 7, at: a }) if a == at(t, 170))
        );
    }
}
