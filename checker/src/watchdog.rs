//! (f) The watchdog keeps healthy holds: a watchdog hold is lost only to a fault that reached it.

use std::sync::Arc;

use tokio::time::Instant;

use super::faults::{FaultKind, FaultRec};
use super::history::{GuardRec, History, locked, ms};
use super::invariants::{Invariant, Violation, describe, last_of};

/// (f): a watchdog hold that was lost while its guard lived, with no fault of any kind anywhere
/// near it (from a lease before its acquisition to its loss) and no `extend`, was let go by the
/// watchdog itself. `unreliable` lockers (a command timeout meant to expire) are left out, and
/// so are holds whose grant came back with less than two thirds of their lease left: the round
/// trip alone took more than the third of a lease the watchdog allows a renewal, so the server
/// was too slow for that hold, whatever the watchdog did (seen on a loaded machine as a
/// cluster's first grants came back after 390 ms of a 400 ms lease).
pub(super) fn check(
    history: &History,
    guards: &[Arc<GuardRec>],
    faults: &[FaultRec],
    unreliable: &[u8],
    finish: Instant,
    out: &mut Vec<Violation>,
) {
    for g in guards {
        if g.reentrant || !g.watchdog || unreliable.contains(&g.locker) {
            continue;
        }
        let Some(&lost) = g.lost_at.get() else {
            continue;
        };
        if g.end().is_some_and(|e| e.at <= lost) || !locked(&g.extends).is_empty() {
            continue;
        }
        if g.granted_until.saturating_duration_since(g.start) < g.lease * 2 / 3 {
            continue;
        }
        let from = g.call.checked_sub(g.lease).unwrap_or(g.call);
        // A stalled slot-map refresh holds up no renewal (see `FaultKind::SlotMapStall`).
        if faults.iter().any(|f| {
            f.kind != FaultKind::SlotMapStall
                && f.reach.hits_hold(g.name, g.locker)
                && f.to >= from
                && f.from <= lost
        }) {
            continue;
        }
        out.push(Violation {
            invariant: Invariant::WatchdogKeeps,
            summary: format!(
                "a watchdog hold (lease {}) was lost {} after it was acquired with no fault \
                 near it (the scheduler was up to {} late meanwhile): {}",
                ms(g.lease),
                ms(lost - g.start),
                ms(history.lags.max_within(g.start, lost)),
                describe(history, g, finish)
            ),
            window: Some((g.name, g.call, last_of(g, finish))),
            hint: "",
        });
    }
}
