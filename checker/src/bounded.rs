//! (e) Bounded calls and no panics: every call returns within its bound, every session
//! finishes, no task panics.

use std::time::Duration;

use tokio::time::Instant;

use super::faults::{FaultKind, FaultRec};
use super::history::{History, ms};
use super::invariants::{Invariant, Violation};

/// How much of `[from, to]` virtual-time jumps took.
fn jumped(faults: &[FaultRec], from: Instant, to: Instant) -> Duration {
    faults
        .iter()
        .filter(|f| f.kind == FaultKind::Jump)
        .map(|f| {
            let (a, b) = (f.from.max(from), f.to.min(to));
            b.saturating_duration_since(a)
        })
        .sum()
}

/// Every call over its bound (less virtual-time jumps and the scheduler's lag), every session
/// that never finished, every panic.
pub(super) fn check(history: &History, faults: &[FaultRec], out: &mut Vec<Violation>) {
    for c in history.calls() {
        let took = (c.ret - c.call).saturating_sub(jumped(faults, c.call, c.ret));
        // What the scheduler took is not dlock's.
        let lag = history.lags.max_within(c.call, c.ret);
        if took > c.bound.saturating_add(lag) {
            out.push(Violation {
                invariant: Invariant::Bounded,
                summary: format!(
                    "{} on {} (w{}) took {}, over its bound of {} (slack included) and the \
                     {} the scheduler was late meanwhile",
                    c.what,
                    history.lockers[usize::from(c.locker)],
                    c.worker,
                    ms(took),
                    ms(c.bound),
                    ms(lag)
                ),
                window: Some((c.name, c.call, c.ret)),
                hint: "",
            });
        }
    }
    for h in history.hangs() {
        out.push(Violation {
            invariant: Invariant::Bounded,
            summary: format!(
                "worker w{} never finished its session (given up after {}): {}\n      \
                 the lockers then: {}",
                h.worker,
                ms(h.to - h.from),
                h.session,
                h.lockers
            ),
            // Where it got stuck: the first seconds of the session.
            window: h
                .name
                .map(|n| (n, h.from, (h.from + Duration::from_secs(5)).min(h.to))),
            hint: "a call never returned",
        });
    }
    for p in history.panics() {
        out.push(Violation {
            invariant: Invariant::Panic,
            summary: format!("a task panicked: {p}"),
            window: None,
            hint: "",
        });
    }
}
