//! Steady holds on a distributed deployment: names spread over every master, each taken in
//! turn by a pair of lockers for a second or two at a time, with the watchdog, for the whole
//! run.
//!
//! The workers' sessions hold their names for milliseconds: few of their holds live through a
//! failover, and their names are so contended that a waiter whose wake-up was lost is covered
//! by another that was woken. The steady pairs are the other case, the one a scaled-out
//! deployment is for: holds that live on every master while one of them dies, migrates a slot
//! or fails over, and one waiter per release. Three checks read them:
//!
//! - (f) a steady hold on a node no fault reached is never lost (the watchdog check, with each
//!   fault's reach: a master's death reaches the names of its slots, not the others);
//! - (e) the release of a steady name wakes its waiting partner within the wake-up bound (see
//!   [`super::wakeups`]): the releasing side pauses longer than that bound before it asks again;
//! - (e) every steady locker keeps getting its name: no gap between its grants longer than
//!   [`PROGRESS_WITHIN`], unless a fault reached that name or that locker meanwhile — a locker
//!   that never reaches a promoted replica stops here.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{RngExt as _, SeedableRng as _};
use tokio::time::Instant;

use super::faults::FaultRec;
use super::history::{History, LeaseSpec, ms};
use super::invariants::{Invariant, Violation};
use super::ops::{Ctx, run_session};
use super::plan::{Acquire, End, Session, Step};

/// One steady task: a worker id of its own, its locker, its name.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Steady {
    pub(crate) worker: u16,
    pub(crate) locker: u8,
    pub(crate) name: u8,
}

/// How long a steady acquisition waits: past a partner's longest hold.
const WAIT: Duration = Duration::from_secs(5);

/// The steady holds' watchdog lease: long, as a service's are (the default is 30 s), so that a
/// waiter whose wake-up was lost sleeps for seconds, until its timer at the holder's lease,
/// where the wake-up bound is a second; and a release that fails leaves its partner waiting as
/// long. With the workers' leases of a second or less, either would go unseen.
pub(crate) const STEADY_LEASE: Duration = Duration::from_secs(4);

/// The longest gap between two grants of one steady task outside faults: its partner's hold,
/// its own, and the pause between them, with room.
pub(super) const PROGRESS_WITHIN: Duration = Duration::from_secs(8);

/// One steady task: acquire, hold for 1–2.5 s, release, pause 1.5–1.8 s (longer than the
/// wake-up bound, the one just after a fault too, so that the partner's grant is the only one
/// that can come in time), again, until the run winds down.
pub(crate) async fn run(ctx: Arc<Ctx>, task: Steady, seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed ^ u64::from(task.worker).wrapping_mul(0x9e37));
    while !ctx.halt.load(Ordering::Relaxed) {
        let hold = Step::HoldPastPromotion {
            most: Duration::from_millis(rng.random_range(1_000..=2_500)),
            after: Duration::from_millis(rng.random_range(0..=400)),
        };
        let session = Session::Single {
            locker: task.locker,
            name: task.name,
            acquire: Acquire {
                try_lock: false,
                wait: WAIT,
                lease: LeaseSpec::Watchdog(STEADY_LEASE),
                cancel_after: None,
                at_least: None,
            },
            steps: vec![hold],
            end: End::Release,
        };
        run_session(ctx.clone(), task.worker, session).await;
        let pause = Duration::from_millis(rng.random_range(1_500..=1_800));
        tokio::time::sleep(pause).await;
    }
}

/// Every steady task's gaps between grants longer than [`PROGRESS_WITHIN`] (and the
/// scheduler's lag) that no fault reaching its name or locker overlaps, from `begin` to `end`.
pub(super) fn check(
    history: &History,
    faults: &[FaultRec],
    tasks: &[Steady],
    (begin, end): (Instant, Instant),
    out: &mut Vec<Violation>,
) {
    let guards = history.guards();
    for t in tasks {
        let mut grants: Vec<Instant> = (guards.iter())
            .filter(|g| g.worker == t.worker)
            .map(|g| g.start)
            .collect();
        grants.sort();
        let marks = std::iter::once(begin)
            .chain(grants.iter().copied())
            .chain(std::iter::once(end));
        let mut last = None;
        for at in marks {
            let Some(prev) = last.replace(at) else {
                continue;
            };
            let gap = at.saturating_duration_since(prev);
            let lag = history.lags.max_within(prev, at);
            if gap <= PROGRESS_WITHIN + lag {
                continue;
            }
            let reached = faults
                .iter()
                .any(|f| f.reach.hits_hold(t.name, t.locker) && f.from <= at && f.to >= prev);
            if reached {
                continue;
            }
            out.push(Violation {
                invariant: Invariant::Progress,
                summary: format!(
                    "{} went {} without a grant of its steady name `{}` (from +{} to +{}), \
                     with no fault reaching that name or that locker meanwhile (bound {}, \
                     the scheduler late by {})",
                    history.lockers[usize::from(t.locker)],
                    ms(gap),
                    history.names[usize::from(t.name)],
                    ms(prev - history.origin),
                    ms(at - history.origin),
                    ms(PROGRESS_WITHIN),
                    ms(lag)
                ),
                window: Some((t.name, prev, at)),
                hint: "a locker that no longer reaches the node serving the name",
            });
        }
    }
}
