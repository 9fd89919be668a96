//! (a) for the primitives whose holders share a name: the semaphore never has more permits
//! believed held than its count allows, and the read-write lock never has a writer beside a
//! reader.
//!
//! # Permits
//!
//! Take any moment a permit was handed out, and every permit whose belief covers it (the
//! *active* ones, the new one included). Of those, the one Redis granted last found all the
//! others in its set: each was granted before it and is still believed held, so its lease has
//! not run out (a belief never outlives the lease, [`Invariant::BeliefWithinLease`]) and its
//! release has not been called. So that grant saw at least as many permits as are active, and
//! the count in force when it ran allowed them all. It ran somewhere between the earliest call
//! among the active permits and the moment looked at; the count in force then is one of those
//! the run's `set_permits` and `reset_permits` calls may have left (see `counts_between`). More
//! active permits than the largest of those is a violation, unless a fault that destroys keys
//! hit the semaphore in that span (its set gone, the old holders still believe).
//!
//! # Readers and writers
//!
//! Writers are plain exclusive holds (checked with every other lock for mutual exclusion,
//! fencing order and re-entry). A read inside the writer's scope re-enters the write hold and is
//! part of it. Every other read lock's belief must not overlap a write hold, unless a fault that
//! destroys keys hit the name between the earlier of the two calls and the later grant.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use tokio::time::Instant;

use super::faults::FaultRec;
use super::history::{GuardRec, History, PermitsSetRec, Share, ms};
use super::invariants::{Invariant, Violation};

/// What the shared-name checks looked at in one run.
#[derive(Debug, Clone, Copy, Default)]
pub struct ShareFigures {
    /// Permits handed out.
    pub permits: usize,
    /// Of them, handed out several at once: how many times.
    pub permits_at_once: usize,
    /// The most permits believed held at once.
    pub most_permits_at_once: usize,
    /// `set_permits` and `reset_permits` calls.
    pub permit_sets: usize,
    /// Read locks handed out (re-entries included, reads inside the writer's scope not).
    pub reads: usize,
    /// The most read locks believed held at once.
    pub most_reads_at_once: usize,
    /// Write locks handed out (re-entries included).
    pub writes: usize,
    /// Reads inside the writer's scope that re-entered its hold.
    pub reads_in_write: usize,
}

impl fmt::Display for ShareFigures {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "semaphore: {} permits ({} times several at once), at most {} at once, {} count \
             changes; read-write: {} reads (at most {} at once), {} writes, {} reads re-entering \
             a write",
            self.permits,
            self.permits_at_once,
            self.most_permits_at_once,
            self.permit_sets,
            self.reads,
            self.most_reads_at_once,
            self.writes,
            self.reads_in_write
        )
    }
}

/// One belief interval.
#[derive(Debug, Clone)]
struct Span {
    guard: Arc<GuardRec>,
    start: Instant,
    end: Instant,
}

fn spans(guards: &[Arc<GuardRec>], name: u8, share: Share, finish: Instant) -> Vec<Span> {
    let mut spans: Vec<Span> = guards
        .iter()
        .filter(|g| g.name == name && g.share == share)
        .map(|g| Span {
            guard: g.clone(),
            start: g.start,
            end: g.belief_end(finish),
        })
        .filter(|s| s.start < s.end)
        .collect();
    spans.sort_by_key(|s| s.start);
    spans
}

/// At every grant, in order, the spans believed then (the new one included; of grants seen at
/// one instant, the last one's list has them all).
fn at_each_grant(spans: &[Span], mut each: impl FnMut(&[&Span])) {
    let mut active: Vec<&Span> = Vec::new();
    for b in spans {
        active.retain(|a| a.end > b.start);
        active.push(b);
        each(&active);
    }
}

/// The largest count that may have been in force at some moment of `[from, to]`: the handles'
/// own `default` unless a set certainly ran before `from`; every set that may have been the last
/// to run before `from` (called by then, and not certainly followed by another that ran before
/// `from`); every set that may have run within the span (called by `to`). A call that failed
/// may have run or not, and at any time after it was called: a command held up in a stalled
/// connection runs when the connection moves again, after calls made since, so a failed call is
/// never superseded. A reset stands for `default`. A set that `undone` says a fault may have
/// undone since it was called (a failover that lost the write, the count's key deleted) is
/// never certain either: what was in force before it may be again.
pub(crate) fn counts_between(
    sets: &[PermitsSetRec],
    default: u32,
    (from, to): (Instant, Instant),
    undone: impl Fn(&PermitsSetRec) -> bool,
) -> u32 {
    // Certainly ran before `from`, and stays: returned Ok before it (at the same instant, on a
    // paused clock, it may have run after), with no fault since that could have undone it.
    let certainly_before = |s: &PermitsSetRec| s.ok && s.ret < from && !undone(s);
    // A set is superseded by a later one that certainly ran before `from`: one called after it
    // returned. Such a later one exists when the latest call among the certain ones is after
    // it returned, so one pass finds that call, and the check of each set is a comparison
    // (a run has thousands of sets and asks this at every grant).
    let latest_certain = (sets.iter().filter(|s| certainly_before(s)))
        .map(|s| s.call)
        .max();
    let mut max = if latest_certain.is_some() { 0 } else { default };
    for s in sets.iter().filter(|s| s.call <= to) {
        let superseded = s.ok && s.call <= from && latest_certain.is_some_and(|call| call > s.ret);
        if !superseded {
            max = max.max(s.to.unwrap_or(default));
        }
    }
    max
}

/// The faults that destroy keys and hit one name, for asking many times over whether one hit
/// it in a span: sorted by their end, with the earliest start among those that end later.
struct LostAfter {
    /// Each fault's end, in order.
    ends: Vec<Instant>,
    /// The earliest start among the faults from this one on.
    earliest_from: Vec<Instant>,
}

impl LostAfter {
    fn new(faults: &[FaultRec], name: u8) -> Self {
        let mut hits: Vec<(Instant, Instant)> = (faults.iter())
            .filter(|f| f.kind.destructive() && f.hits(name))
            .map(|f| (f.to, f.from))
            .collect();
        hits.sort();
        let mut earliest_from: Vec<Instant> = hits.iter().map(|h| h.1).collect();
        for i in (0..earliest_from.len().saturating_sub(1)).rev() {
            earliest_from[i] = earliest_from[i].min(earliest_from[i + 1]);
        }
        Self {
            ends: hits.into_iter().map(|h| h.0).collect(),
            earliest_from,
        }
    }

    /// Whether one of the faults overlaps `[from, to]` (as [`destroyed`] says).
    fn between(&self, from: Instant, to: Instant) -> bool {
        let first = self.ends.partition_point(|end| *end < from);
        self.earliest_from
            .get(first)
            .is_some_and(|start| *start <= to)
    }
}

fn destroyed(faults: &[FaultRec], name: u8, from: Instant, to: Instant) -> bool {
    faults
        .iter()
        .any(|f| f.kind.destructive() && f.hits(name) && f.to >= from && f.from <= to)
}

fn describe(history: &History, g: &GuardRec, finish: Instant) -> String {
    format!(
        "g{} ({} w{}{}{}, called {}) believed held {} .. {}{}",
        g.id,
        history.lockers[usize::from(g.locker)],
        g.worker,
        if g.reentrant { ", re-entered" } else { "" },
        if g.permits > 1 {
            format!(", {} permits", g.permits)
        } else {
            String::new()
        },
        history.rel(g.call),
        history.rel(g.start),
        history.rel(g.belief_end(finish)),
        if g.token() != 0 {
            format!(", token {}", g.token())
        } else {
            String::new()
        }
    )
}

fn permits(
    history: &History,
    guards: &[Arc<GuardRec>],
    faults: &[FaultRec],
    finish: Instant,
    figures: &mut ShareFigures,
    out: &mut Vec<Violation>,
) {
    let Some((name, default)) = history.semaphore else {
        return;
    };
    let sets = history.permit_sets();
    figures.permit_sets = sets.len();
    let spans = spans(guards, name, Share::Permit, finish);
    figures.permits = spans.iter().map(|s| s.guard.permits as usize).sum();
    figures.permits_at_once = spans.iter().filter(|s| s.guard.permits > 1).count();
    let lost = LostAfter::new(faults, name);
    at_each_grant(&spans, |active| {
        // Permits taken at once count as many.
        let held_now: usize = active.iter().map(|s| s.guard.permits as usize).sum();
        figures.most_permits_at_once = figures.most_permits_at_once.max(held_now);
        let Some(last) = active.last() else { return };
        let at = last.start;
        let from = active.iter().map(|s| s.guard.call).min().unwrap_or(at);
        // Within the count it was made with, nothing to look up.
        if held_now <= default as usize {
            return;
        }
        let undone = |s: &PermitsSetRec| lost.between(s.call, at);
        let allowed = counts_between(&sets, default, (from, at), undone);
        if held_now <= allowed as usize || destroyed(faults, name, from, at) {
            return;
        }
        let mut held: Vec<String> = active
            .iter()
            .map(|s| describe(history, &s.guard, finish))
            .collect();
        // The count changes that could have been in force, for whoever reads the violation.
        held.extend(sets.iter().filter(|s| s.call <= at).map(|s| {
            format!(
                "{} called {}, returned {} {}",
                s.to.map_or("reset_permits()".to_owned(), |n| format!(
                    "set_permits({n})"
                )),
                history.rel(s.call),
                history.rel(s.ret),
                if s.ok { "Ok" } else { "with an error" }
            )
        }));
        out.push(Violation {
            invariant: Invariant::PermitBound,
            summary: format!(
                "{} permits of `{}` believed held at {}, where the count in force since {} \
                 was at most {allowed}, with no destructive fault:\n      {}",
                held_now,
                history.names[usize::from(name)],
                history.rel(at),
                history.rel(from),
                held.join("\n      ")
            ),
            window: Some((name, from, active.iter().map(|s| s.end).max().unwrap_or(at))),
            hint: "",
        });
    });
}

fn read_write(
    history: &History,
    guards: &[Arc<GuardRec>],
    faults: &[FaultRec],
    finish: Instant,
    figures: &mut ShareFigures,
    out: &mut Vec<Violation>,
) {
    let Some((name, _)) = history.rw else {
        return;
    };
    let reads = spans(guards, name, Share::Read, finish);
    figures.reads = reads.len();
    at_each_grant(&reads, |active| {
        figures.most_reads_at_once = figures.most_reads_at_once.max(active.len());
    });
    // A write hold runs from its fresh guard's grant to the last belief of any guard in it.
    let mut writes: Vec<Span> = Vec::new();
    let mut inside: HashMap<(u64, u8), Instant> = HashMap::new();
    for g in guards.iter().filter(|g| g.name == name) {
        match g.share {
            Share::Exclusive => figures.writes += 1,
            Share::ReadInWrite => figures.reads_in_write += 1,
            _ => continue,
        }
        if g.reentrant {
            let end = inside.entry((g.token(), g.locker)).or_insert(g.start);
            *end = (*end).max(g.belief_end(finish));
        } else {
            writes.push(Span {
                guard: g.clone(),
                start: g.start,
                end: g.belief_end(finish),
            });
        }
    }
    for w in &mut writes {
        if let Some(end) = inside.get(&(w.guard.token(), w.guard.locker)) {
            w.end = w.end.max(*end);
        }
    }
    writes.retain(|w| w.start < w.end);
    writes.sort_by_key(|w| w.start);
    for r in &reads {
        // The writes granted before the read's belief ended and still believed when it began.
        let before = writes.partition_point(|w| w.start < r.end);
        let overlapping = writes[..before].iter().rev().filter(|w| r.start < w.end);
        for w in overlapping {
            let from = r.guard.call.min(w.guard.call);
            if destroyed(faults, name, from, r.start.max(w.start)) {
                continue;
            }
            out.push(Violation {
                invariant: Invariant::ReadWrite,
                summary: format!(
                    "a read lock and a write lock of `{}` overlap by {} with no destructive \
                     fault that could have removed the first before the other was granted:\n      \
                     read: {}\n      write: {}",
                    history.names[usize::from(name)],
                    ms(r.end.min(w.end) - r.start.max(w.start)),
                    describe(history, &r.guard, finish),
                    describe(history, &w.guard, finish)
                ),
                window: Some((name, from, r.end.max(w.end))),
                hint: "",
            });
        }
    }
}

/// The permit bound and reader-writer exclusion over the history, up to `finish`.
pub(crate) fn check(history: &History, finish: Instant) -> (ShareFigures, Vec<Violation>) {
    let guards = history.guards();
    let faults = history.faults();
    let mut figures = ShareFigures::default();
    let mut out = Vec::new();
    permits(history, &guards, &faults, finish, &mut figures, &mut out);
    read_write(history, &guards, &faults, finish, &mut figures, &mut out);
    (figures, out)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn set(origin: Instant, call: u64, ret: u64, to: Option<u32>, ok: bool) -> PermitsSetRec {
        PermitsSetRec {
            call: origin + Duration::from_millis(call),
            ret: origin + Duration::from_millis(ret),
            to,
            ok,
        }
    }

    /// `counts_between` as first written, a set superseded when any later certain set was
    /// called after it returned: the reference the faster one is held to.
    fn counts_between_by_pairs(
        sets: &[PermitsSetRec],
        default: u32,
        (from, to): (Instant, Instant),
        undone: impl Fn(&PermitsSetRec) -> bool,
    ) -> u32 {
        let certainly_before = |s: &PermitsSetRec| s.ok && s.ret < from && !undone(s);
        let mut max = if sets.iter().any(certainly_before) {
            0
        } else {
            default
        };
        for s in sets.iter().filter(|s| s.call <= to) {
            let superseded = s.ok
                && s.call <= from
                && (sets.iter()).any(|later| certainly_before(later) && later.call > s.ret);
            if !superseded {
                max = max.max(s.to.unwrap_or(default));
            }
        }
        max
    }

    #[test]
    fn counts_between_says_what_the_pairwise_reading_says() {
        let o = Instant::now();
        // A small linear congruential generator: the same sets on every run.
        let mut state: u64 = 0x2545_f491_4f6c_dd1d;
        let mut next = |n: u64| {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1);
            (state >> 33) % n
        };
        for _ in 0..300 {
            let sets: Vec<PermitsSetRec> = (0..next(12))
                .map(|_| {
                    let call = next(100);
                    let to = (next(4) > 0).then(|| u32::try_from(next(6)).unwrap_or(0));
                    set(o, call, call + next(30), to, next(5) > 0)
                })
                .collect();
            let lost_from = next(150);
            let undone = |s: &PermitsSetRec| s.call >= o + Duration::from_millis(lost_from);
            let from = next(120);
            let span = (
                o + Duration::from_millis(from),
                o + Duration::from_millis(from + next(40)),
            );
            assert_eq!(
                counts_between(&sets, 2, span, undone),
                counts_between_by_pairs(&sets, 2, span, undone),
            );
        }
    }

    #[test]
    fn lost_after_says_what_destroyed_says() {
        use crate::faults::{FaultKind, Reach};
        let o = Instant::now();
        let at = |ms| o + Duration::from_millis(ms);
        let fault = |kind, name, from, to| FaultRec {
            kind,
            reach: Reach::name(name),
            from: at(from),
            to: at(to),
        };
        let faults = [
            fault(FaultKind::Del, 1, 10, 20),
            fault(FaultKind::Del, 2, 30, 40),
            fault(FaultKind::Pause, 1, 45, 60),
            fault(FaultKind::Restart, 1, 70, 90),
            fault(FaultKind::Del, 1, 75, 80),
        ];
        let lost = LostAfter::new(&faults, 1);
        for from in (0..100).step_by(5) {
            for to in (from..105).step_by(5) {
                assert_eq!(
                    lost.between(at(from), at(to)),
                    destroyed(&faults, 1, at(from), at(to)),
                    "[{from}, {to}]"
                );
            }
        }
    }

    #[test]
    fn counts_in_force_are_read_conservatively() {
        let o = Instant::now();
        let at = |ms| o + Duration::from_millis(ms);
        let kept = |_: &PermitsSetRec| false;
        // Nothing set: the handles' own count.
        assert_eq!(counts_between(&[], 2, (at(0), at(100)), kept), 2);
        // A set to 1 that returned before the span: only 1.
        let lowered = [set(o, 10, 20, Some(1), true)];
        assert_eq!(counts_between(&lowered, 2, (at(30), at(100)), kept), 1);
        // ... while it is in flight, either.
        assert_eq!(counts_between(&lowered, 2, (at(15), at(100)), kept), 2);
        // A failed set may have run: its count counts too, and the old one.
        let failed = [set(o, 10, 20, Some(4), false)];
        assert_eq!(counts_between(&failed, 2, (at(30), at(100)), kept), 4);
        // A raise to 4 superseded by a reset before the span: the default again.
        let reset = [set(o, 10, 20, Some(4), true), set(o, 30, 40, None, true)];
        assert_eq!(counts_between(&reset, 2, (at(50), at(100)), kept), 2);
        // A raise called within the span counts.
        let raise = [set(o, 60, 70, Some(3), true)];
        assert_eq!(counts_between(&raise, 2, (at(50), at(100)), kept), 3);
        // ... but not one called after it.
        assert_eq!(counts_between(&raise, 2, (at(0), at(50)), kept), 2);
        // A raise that failed (held up in a stalled connection) may run after a later set to 1
        // that succeeded: the raise still counts.
        let stalled = [
            set(o, 10, 20, Some(4), false),
            set(o, 30, 40, Some(1), true),
        ];
        assert_eq!(counts_between(&stalled, 2, (at(50), at(100)), kept), 4);
        // A lowering that a failover may have lost after it returned: the count before it may
        // be in force again, and with no set left certain, the handles' own.
        let lowered = [set(o, 10, 20, Some(4), true), set(o, 30, 40, Some(3), true)];
        let lost = |s: &PermitsSetRec| s.call >= at(30);
        assert_eq!(counts_between(&lowered, 2, (at(50), at(100)), lost), 4);
        let lost_all = |_: &PermitsSetRec| true;
        let lowered = [set(o, 10, 20, Some(1), true)];
        assert_eq!(counts_between(&lowered, 2, (at(50), at(100)), lost_all), 2);
    }
}
