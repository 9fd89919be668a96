//! (c) A refusal tells the truth: a try that says a name is taken finds it taken by something
//! that can be there.
//!
//! In a run with replica acknowledgement, one probe per master tries a name of its own, one no
//! other task uses, through two `Locker`s of the probes' own in turn (see [`spawn`]), with a
//! short fixed lease. A grant is released at once. A grant no replica acknowledged (the error
//! says so) has been rolled back by the time the call returns (see [`dlock_core::ReplicaAck`]),
//! so the probe looks at the name at once (`inspect`, through the same `Locker`) and tries it
//! again at once from the other `Locker`; a look that finds the name taken counts as a refusal.
//! Only the probe's own tries can hold its name, so a try that finds it busy is a violation
//! unless one of them could still be there:
//!
//! - an attempt that failed another way (a timeout, a lost connection): its grant may have been
//!   made and be left to its lease;
//! - a grant whose release did not say `Released`;
//! - any try that a fault reaching the name overlapped, or came within its lease of (a failover
//!   may bring back a grant or a release that no replica had yet; a hung master runs a command
//!   late), until its lease, counted from the fault's end. A paused replica, one that is still
//!   syncing, a mute sentinel and an external `DEL` excuse nothing: none of them can leave a
//!   grant in place, and the first two are what makes grants go unacknowledged.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dlock_core::{LockError, Locker, LockerBuilder, ReleaseOutcome};
use tokio::time::Instant;

use super::faults::{FaultKind, FaultRec};
use super::history::{locked, ms};
use super::invariants::{Invariant, Violation};
use super::ops::Ctx;

/// The probes' lease: short, so that what excuses a refusal covers little of the run.
const LEASE: Duration = Duration::from_millis(500);

/// Room for the scheduler and the server's clock beyond a lease.
const SLACK: Duration = Duration::from_millis(100);

/// How long a probe rests after a try that needs no second one at once.
const REST: Duration = Duration::from_millis(10);

/// What one try came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tried {
    /// Granted, then released; `released`: the release said `Released`.
    Granted { released: bool },
    /// Found the name taken.
    Busy,
    /// Granted but acknowledged by no replica: rolled back before the call returned.
    NotReplicated,
    /// Failed another way.
    Failed,
}

/// One try: sent, answered, and done with (its release returned).
#[derive(Debug, Clone, Copy)]
struct Try {
    sent: Instant,
    back: Instant,
    done: Instant,
    tried: Tried,
}

/// One probe: its name (and the name's index in the history, which faults reach by), the run's
/// locker whose faults reach it (its own `Locker`s are configured as that one), and its tries.
pub(crate) struct Probe {
    name: String,
    index: u8,
    locker: u8,
    tries: Mutex<Vec<Try>>,
}

impl Probe {
    /// A probe of `name` (the history's name `index`), reached by the faults of the run's locker
    /// `locker`.
    pub(crate) fn new(name: String, index: u8, locker: u8) -> Arc<Self> {
        Arc::new(Self {
            name,
            index,
            locker,
            tries: Mutex::default(),
        })
    }
}

/// Runs `probes` until the run halts, through two `Locker`s of their own (built by `builders`,
/// each configured as the run's locker the probes name), taken in turn: a try after a
/// not-replicated grant comes from another instance, which a roll-back left to the background
/// may not have reached yet. They run on a runtime of one thread of their own, as many services
/// do: there, what a call leaves to the background runs only once its caller waits on
/// something.
pub(crate) fn spawn(
    ctx: Arc<Ctx>,
    probes: Vec<Arc<Probe>>,
    builders: [LockerBuilder; 2],
) -> tokio::task::JoinHandle<()> {
    tokio::task::spawn_blocking(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("the probes' runtime");
        runtime.block_on(async move {
            let mut lockers = Vec::new();
            for builder in builders {
                lockers.push(builder.build().await.expect("a probes' locker"));
            }
            let tries: Vec<_> = (probes.into_iter())
                .map(|probe| tokio::spawn(run(ctx.clone(), probe, lockers.clone())))
                .collect();
            for t in tries {
                if let Err(err) = t.await {
                    ctx.history.panic(format!("a probe died: {err}"));
                }
            }
        });
    })
}

/// Tries the probe's name until the run halts, through each of `lockers` in turn.
async fn run(ctx: Arc<Ctx>, probe: Arc<Probe>, lockers: Vec<Locker>) {
    for locker in lockers.iter().cycle() {
        if ctx.halt.load(Ordering::Relaxed) {
            break;
        }
        let sent = Instant::now();
        let reply = locker
            .lock(probe.name.as_str())
            .lease(LEASE)
            .try_lock()
            .await;
        let back = Instant::now();
        let tried = match reply {
            Ok(Some(guard)) => {
                let outcome = guard.release().await;
                Tried::Granted {
                    released: matches!(outcome, ReleaseOutcome::Released),
                }
            }
            Ok(None) => Tried::Busy,
            Err(LockError::Backend(err)) if err.is_not_replicated() => Tried::NotReplicated,
            Err(_) => Tried::Failed,
        };
        let done = Instant::now();
        locked(&probe.tries).push(Try {
            sent,
            back,
            done,
            tried,
        });
        if tried != Tried::NotReplicated {
            tokio::time::sleep(REST).await;
            continue;
        }
        // The roll-back is done when the call returns: a look at once, through the same
        // `Locker`, finds the name free. A look that finds it taken counts as a refusal.
        let sent = Instant::now();
        let looked = locker.inspect(probe.name.as_str()).await;
        let back = Instant::now();
        if looked.is_ok_and(|info| !info.holders.is_empty() || info.kept) {
            locked(&probe.tries).push(Try {
                sent,
                back,
                done: back,
                tried: Tried::Busy,
            });
        }
    }
}

/// What the probes tried, for the run's report: how many tries, and what each came to.
pub(crate) fn tally(probes: &[Arc<Probe>]) -> String {
    let (mut granted, mut busy, mut unreplicated, mut failed) = (0, 0, 0, 0);
    for probe in probes {
        for t in locked(&probe.tries).iter() {
            match t.tried {
                Tried::Granted { .. } => granted += 1,
                Tried::Busy => busy += 1,
                Tried::NotReplicated => unreplicated += 1,
                Tried::Failed => failed += 1,
            }
        }
    }
    let tries = granted + busy + unreplicated + failed;
    format!(
        "{} probes, {tries} tries: {granted} granted, {unreplicated} not replicated (rolled \
         back), {busy} busy, {failed} failed",
        probes.len()
    )
}

/// Every refusal of a probe's name that none of its own tries can explain.
pub(crate) fn check(
    probes: &[Arc<Probe>],
    faults: &[FaultRec],
    origin: Instant,
    out: &mut Vec<Violation>,
) {
    for probe in probes {
        let tries = locked(&probe.tries).clone();
        let left: Vec<(Instant, Instant, &Try)> = (tries.iter())
            .filter(|t| t.tried != Tried::Busy)
            .map(|t| (t.sent, left_until(t, probe, faults), t))
            .collect();
        for busy in tries.iter().filter(|t| t.tried == Tried::Busy) {
            let explained =
                (left.iter()).any(|&(from, until, _)| from < busy.back && until > busy.sent);
            if explained {
                continue;
            }
            let before = (left.iter())
                .filter(|(from, _, _)| *from < busy.sent)
                .max_by_key(|(from, _, _)| *from);
            let before = before.map_or_else(
                || "nothing".to_owned(),
                |(_, _, t)| {
                    format!(
                        "{:?} (sent at +{}, answered at +{}, done at +{})",
                        t.tried,
                        ms(t.sent - origin),
                        ms(t.back - origin),
                        ms(t.done - origin)
                    )
                },
            );
            out.push(Violation {
                invariant: Invariant::RefusalTruth,
                summary: format!(
                    "a try of `{}`, a name only its probe uses, said busy (sent at +{}, \
                     answered at +{}) with nothing of the probe's left on it; the try before: \
                     {before}",
                    probe.name,
                    ms(busy.sent - origin),
                    ms(busy.back - origin),
                ),
                window: Some((probe.index, busy.sent, busy.back)),
                hint: "a grant left in Redis after its call returned",
            });
        }
    }
}

/// Until when what `t` did may still hold `probe`'s name: when the call was done with, for a
/// grant released and a grant rolled back; its lease past its answer for anything else, or
/// past the end of a fault that reaches the name and overlaps the try or comes within its
/// lease.
fn left_until(t: &Try, probe: &Probe, faults: &[FaultRec]) -> Instant {
    let uncertain = match t.tried {
        Tried::Granted { released } => !released,
        Tried::NotReplicated | Tried::Busy => false,
        Tried::Failed => true,
    };
    let mut end = if uncertain {
        t.back + LEASE + SLACK
    } else {
        t.done
    };
    let reach = t.done + LEASE + SLACK;
    let excusing = faults.iter().filter(|f| {
        let harmless = matches!(
            f.kind,
            FaultKind::Del | FaultKind::ReplicaPaused | FaultKind::Resync | FaultKind::SentinelMute
        );
        !harmless && f.reach.hits_hold(probe.index, probe.locker)
    });
    for f in excusing.filter(|f| f.from < reach && f.to > t.sent) {
        end = end.max(f.to.max(t.back) + LEASE + SLACK);
    }
    end
}
