//! The operation executor: runs planned sessions against the lockers and records every call,
//! guard and outcome in the history.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use dlock_core::{LockError, LockRequest, Locker, WriteGuard};
use tokio::time::Instant;

use super::actors::Actor;
use super::history::{
    AcquireKind, CallRec, ErrKind, EventKind, History, LeaseSpec, Outcome, PermitsSetRec, Share,
};
use super::plan::{Acquire, End, Nested, Session, Step, lease_of};
use super::tracked::{Held, Tracked};

/// How much longer than its bound a call may take on a noisy machine before it counts as
/// unbounded (invariant e).
pub const SLACK: Duration = Duration::from_millis(250);

/// Counters of what the run did.
#[derive(Debug, Default)]
pub struct Stats {
    /// Sessions run.
    pub sessions: AtomicU64,
    /// Lock API calls made (acquisitions, releases, extends, runs, drops).
    pub calls: AtomicU64,
    /// Guards handed out.
    pub acquired: AtomicU64,
    /// Acquisitions that found the lock busy.
    pub busy: AtomicU64,
    /// Calls that failed with a backend error.
    pub backend_errors: AtomicU64,
    /// Acquisition or release futures dropped half-way.
    pub dropped_futures: AtomicU64,
    /// Guarded runs cancelled by a loss.
    pub runs_cancelled: AtomicU64,
    /// Releases that granted the lock to a waiter of another locker in their wake-up (Redis
    /// runs; seen on a subscriber of the checker's own).
    pub grants: AtomicU64,
    /// Locks a release handed to a waiter of its own locker (every locker's
    /// `LockerStats::handed_over`, summed at the end).
    pub handed_over: AtomicU64,
}

/// Adds one to a counter.
pub(super) fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

/// Everything a worker needs.
#[derive(Debug)]
pub(crate) struct Ctx {
    pub(crate) history: Arc<History>,
    pub(crate) actors: Arc<Vec<Actor>>,
    /// An admin connection to read Redis with (`None`: memory backend).
    pub(crate) admin: Option<dlock_core::redis::aio::ConnectionManager>,
    /// The lock key of every name (a semaphore's permits, a read-write lock's write lock).
    pub(crate) keys: Vec<String>,
    /// Every key of every name, its lock key first.
    pub(crate) name_keys: Vec<Vec<String>>,
    pub(crate) stats: Stats,
    /// Set when the run is to wind down: workers start no new session.
    pub(crate) halt: std::sync::atomic::AtomicBool,
    /// The steady tasks beside the workers (distributed runs; see `steady`).
    pub(crate) steady: Vec<super::steady::Steady>,
    /// When the steady tasks were told to stop.
    pub(crate) steady_stopped: std::sync::OnceLock<Instant>,
}

impl Ctx {
    fn name(&self, name: u8) -> &str {
        &self.history.names[usize::from(name)]
    }

    /// The index of one of the run's names.
    pub(super) fn name_index(&self, name: &str) -> u8 {
        let index = self
            .history
            .names
            .iter()
            .position(|n| n == name)
            .expect("a guard names one of the run's names");
        u8::try_from(index).expect("fewer than 256 names")
    }
}

/// `$request` with the lease `$lease` asks for (any request type with `lease` and
/// `watchdog_lease`).
macro_rules! leased {
    ($request:expr, $lease:expr) => {
        match $lease {
            LeaseSpec::LockerDefault => $request,
            LeaseSpec::Watchdog(d) => $request.watchdog_lease(d),
            LeaseSpec::Fixed(d) => $request.lease(d),
        }
    };
}

fn with_lease<G>(request: LockRequest<G>, lease: LeaseSpec) -> LockRequest<G> {
    leased!(request, lease)
}

/// What a guard handed out holds, and the token to record it with (`None`: its own).
type ShareOf<'a> = &'a dyn Fn(&Held) -> (Share, Option<u64>);

/// A lock's guard: exclusive, with its own token.
fn exclusive(_: &Held) -> (Share, Option<u64>) {
    (Share::Exclusive, None)
}

/// Runs `fut`, dropping it after `cancel_after` if that is set and it has not finished.
async fn maybe_cancelled<F: Future>(fut: F, cancel_after: Option<Duration>) -> Option<F::Output> {
    match cancel_after {
        None => Some(fut.await),
        Some(d) => tokio::select! {
            biased;
            out = fut => Some(out),
            () = tokio::time::sleep(d) => None,
        },
    }
}

/// The outcome of one acquisition call, recorded.
fn record_acquired(
    ctx: &Arc<Ctx>,
    worker: u16,
    locker: u8,
    names: &[u8],
    result: Option<Result<Option<Vec<Held>>, LockError>>,
    ((call, id), lease, at_least, bound): ((Instant, u32), Duration, Option<Duration>, Duration),
    share: ShareOf<'_>,
) -> Vec<Tracked> {
    let ret = Instant::now();
    let history = &ctx.history;
    let each = |kind: EventKind| {
        for &name in names {
            history.acquisition_event(ret, worker, locker, name, id, kind);
        }
    };
    let Some(result) = result else {
        bump(&ctx.stats.dropped_futures);
        each(EventKind::AcquireDropped);
        return Vec::new();
    };
    history.call(CallRec {
        worker,
        locker,
        name: names[0],
        what: if names.len() > 1 {
            "lock_all"
        } else if history.is_semaphore(names[0]) {
            "acquire permit"
        } else {
            "acquire"
        },
        call,
        ret,
        bound,
    });
    match result {
        Ok(Some(guards)) => guards
            .into_iter()
            .map(|g| {
                let (share, token) = share(&g);
                let held = (g, share, token);
                let call = (call, id, names.len() > 1);
                Tracked::new(ctx, worker, locker, call, (lease, at_least), held)
            })
            .collect(),
        Ok(None) => {
            bump(&ctx.stats.busy);
            each(EventKind::Busy);
            Vec::new()
        }
        Err(err) => {
            if err.is_busy() {
                bump(&ctx.stats.busy);
                each(EventKind::Busy);
            } else {
                if err.is_backend() {
                    bump(&ctx.stats.backend_errors);
                }
                each(EventKind::AcquireFailed(ErrKind::of(&err)));
            }
            Vec::new()
        }
    }
}

/// Counts an acquisition call and records it (a `try_lock` as such), returning when it was made
/// and its id.
fn record_call(
    ctx: &Ctx,
    worker: u16,
    locker: u8,
    name: u8,
    acq: &Acquire,
    kind: AcquireKind,
) -> (Instant, u32) {
    bump(&ctx.stats.calls);
    let kind = if acq.try_lock {
        AcquireKind::TryLock
    } else {
        kind
    };
    let call = Instant::now();
    let event = EventKind::AcquireCall {
        kind,
        wait: acq.wait,
        lease: acq.lease,
    };
    let id = ctx.history.next_call_id();
    ctx.history
        .acquisition_event(call, worker, locker, name, id, event);
    (call, id)
}

async fn acquire_one(
    ctx: &Arc<Ctx>,
    worker: u16,
    locker: u8,
    name: u8,
    acq: &Acquire,
    kind: AcquireKind,
) -> Option<Tracked> {
    let call = record_call(ctx, worker, locker, name, acq, kind);
    let actor = &ctx.actors[usize::from(locker)];
    let l: Locker = actor.locker();
    // One attempt or a wait, with the session's lease and period; `held` makes the guard one
    // the run tracks.
    macro_rules! take {
        ($request:expr, $held:expr) => {{
            let mut request = with_lease($request.wait(acq.wait), acq.lease);
            if let Some(period) = acq.period() {
                request = request.at_least(period);
            }
            if acq.try_lock {
                request.try_lock().await.map(|g| g.map(|g| vec![$held(g)]))
            } else {
                request.await.map(|g| Some(vec![$held(g)]))
            }
        }};
    }
    // The fair name goes through `fair_lock`, a re-entry into its hold too; the read-write
    // name's lock is its write lock, tracked as the lock's guard it is.
    let fut = async {
        match ctx.history.rw {
            _ if ctx.history.is_fair(name) => take!(l.fair_lock(ctx.name(name)), Held::Lock),
            Some((rw, prefer)) if rw == name => take!(
                l.read_write_lock(ctx.name(name))
                    .prefer_writers(prefer)
                    .write(),
                |g: WriteGuard| Held::Lock(g.into_lock_guard())
            ),
            _ => take!(l.lock(ctx.name(name)), Held::Lock),
        }
    };
    let result = maybe_cancelled(fut, acq.cancel_after).await;
    let bound = acq
        .wait
        .saturating_add(actor.command_timeout)
        .saturating_add(SLACK);
    let lease = lease_of(acq.lease, actor.watchdog_lease);
    let recorded = (call, lease, acq.period(), bound);
    record_acquired(ctx, worker, locker, &[name], result, recorded, &exclusive).pop()
}

/// What a shared acquisition asks for.
#[derive(Debug, Clone, Copy)]
enum Shared {
    /// `take` permits of the semaphore, at once.
    Permit { take: u32 },
    /// A read lock of the read-write name; inside a scope that holds its write lock with this
    /// token, a re-entry into it.
    Read { in_write: Option<u64> },
}

/// A permit or a read lock, recorded as `acquire_one` records a lock.
async fn acquire_shared(
    ctx: &Arc<Ctx>,
    worker: u16,
    locker: u8,
    acq: &Acquire,
    what: Shared,
) -> Option<Tracked> {
    let history = &ctx.history;
    let (name, kind) = match what {
        Shared::Permit { .. } => (history.semaphore.map(|s| s.0), AcquireKind::Permit),
        Shared::Read { .. } => (history.rw.map(|rw| rw.0), AcquireKind::Read),
    };
    let name = name.expect("a shared session on a run with its name");
    let call = record_call(ctx, worker, locker, name, acq, kind);
    let actor = &ctx.actors[usize::from(locker)];
    let l: Locker = actor.locker();
    let fut = async {
        match what {
            Shared::Permit { take } => {
                let permits = history.semaphore.map_or(1, |s| s.1);
                let semaphore = l.semaphore(ctx.name(name), permits);
                // Layout 1's scripts take one permit at a time.
                let take = if l.runs_frozen_layout() { 1 } else { take };
                let request = semaphore.acquire_many(take.min(permits));
                let request = leased!(request.wait(acq.wait), acq.lease);
                let held = |p| vec![Held::Permit(p)];
                if acq.try_lock {
                    request.try_lock().await.map(|p| p.map(held))
                } else {
                    request.await.map(|p| Some(held(p)))
                }
            }
            Shared::Read { .. } => {
                let prefer = history.rw.is_none_or(|rw| rw.1);
                let lock = l.read_write_lock(ctx.name(name)).prefer_writers(prefer);
                let request = leased!(lock.read().wait(acq.wait), acq.lease);
                let held = |g| vec![Held::Read(g)];
                if acq.try_lock {
                    request.try_lock().await.map(|g| g.map(held))
                } else {
                    request.await.map(|g| Some(held(g)))
                }
            }
        }
    };
    let result = maybe_cancelled(fut, acq.cancel_after).await;
    let bound = acq
        .wait
        .saturating_add(actor.command_timeout)
        .saturating_add(SLACK);
    let lease = lease_of(acq.lease, actor.watchdog_lease);
    let share = |held: &Held| match what {
        Shared::Permit { .. } => (Share::Permit, None),
        // A read in the writer's scope re-enters the write hold, and lives as long as it.
        Shared::Read {
            in_write: Some(token),
        } if held.is_reentrant() => (Share::ReadInWrite, Some(token)),
        Shared::Read { .. } => (Share::Read, None),
    };
    let recorded = (call, lease, None, bound);
    record_acquired(ctx, worker, locker, &[name], result, recorded, &share).pop()
}

/// `set_permits(to)` (or `reset_permits()`), recorded.
async fn set_permits(ctx: &Arc<Ctx>, worker: u16, locker: u8, to: Option<u32>) {
    bump(&ctx.stats.calls);
    let actor = &ctx.actors[usize::from(locker)];
    let history = &ctx.history;
    let Some((name, permits)) = history.semaphore else {
        return;
    };
    let semaphore = actor.locker().semaphore(ctx.name(name), permits);
    let call = Instant::now();
    let result = match to {
        Some(n) => semaphore.set_permits(n).await,
        None => semaphore.reset_permits().await,
    };
    let ret = Instant::now();
    if result.as_ref().is_err_and(LockError::is_backend) {
        bump(&ctx.stats.backend_errors);
    }
    let ok = result.is_ok();
    history.permits_set(PermitsSetRec { call, ret, to, ok });
    history.event(ret, worker, locker, name, EventKind::PermitsSet { to, ok });
    history.call(CallRec {
        worker,
        locker,
        name,
        what: "set_permits",
        call,
        ret,
        bound: actor.command_timeout + SLACK,
    });
}

async fn acquire_all(
    ctx: &Arc<Ctx>,
    worker: u16,
    locker: u8,
    names: &[u8],
    acq: &Acquire,
) -> Vec<Tracked> {
    bump(&ctx.stats.calls);
    let actor = &ctx.actors[usize::from(locker)];
    let l: Locker = actor.locker();
    let call = (Instant::now(), ctx.history.next_call_id());
    for &name in names {
        let event = EventKind::AcquireCall {
            kind: AcquireKind::LockAll,
            wait: acq.wait,
            lease: acq.lease,
        };
        (ctx.history).acquisition_event(call.0, worker, locker, name, call.1, event);
    }
    let request = l
        .lock_all(names.iter().map(|&n| ctx.name(n)))
        .wait(acq.wait);
    let mut request = leased!(request, acq.lease);
    if let Some(period) = acq.period() {
        request = request.at_least(period);
    }
    let fut = async {
        if acq.try_lock {
            request
                .try_lock()
                .await
                .map(|g| g.map(dlock_core::MultiGuard::into_guards))
        } else {
            request.await.map(|g| Some(g.into_guards()))
        }
        .map(|g| g.map(|guards| guards.into_iter().map(Held::Lock).collect()))
    };
    let result = maybe_cancelled(fut, acq.cancel_after).await;
    let count = u32::try_from(names.len()).expect("a few names");
    // A multi-lock that did not get them all gives back what it took before it returns: one
    // release's time (two command timeouts) more.
    let gave_back = !matches!(result, Some(Ok(Some(_))));
    let count = if gave_back { count + 2 } else { count };
    let bound = acq
        .wait
        .saturating_add(actor.command_timeout * count)
        .saturating_add(SLACK);
    let lease = lease_of(acq.lease, actor.watchdog_lease);
    let recorded = (call, lease, acq.period(), bound);
    record_acquired(ctx, worker, locker, names, result, recorded, &exclusive)
}

async fn steps(guard: &Tracked, steps: &[Step]) {
    for step in steps {
        match *step {
            Step::Hold(d) => tokio::time::sleep(d).await,
            Step::HoldPastPromotion { most, after } => guard.hold_past_promotion(most, after).await,
            Step::Extend(d) => guard.extend(d).await,
            Step::Run(work) => guard.run(work).await,
            Step::Fence => guard.fence().await,
        }
    }
}

/// Runs one session.
pub(crate) async fn run_session(ctx: Arc<Ctx>, worker: u16, session: Session) {
    bump(&ctx.stats.sessions);
    match session {
        Session::Single {
            locker,
            name,
            acquire,
            steps: planned,
            end,
        } => {
            let kind = AcquireKind::Lock;
            let Some(guard) = acquire_one(&ctx, worker, locker, name, &acquire, kind).await else {
                return;
            };
            steps(&guard, &planned).await;
            guard.end(end, true).await;
        }
        Session::Reenter {
            locker,
            name,
            nested,
            outer,
            gap,
            inner,
            hold,
            inner_first,
            ends,
        } => {
            dlock_core::scope(async {
                let outer = if nested == Nested::ReadInRead {
                    let read = Shared::Read { in_write: None };
                    acquire_shared(&ctx, worker, locker, &outer, read).await
                } else {
                    acquire_one(&ctx, worker, locker, name, &outer, AcquireKind::Lock).await
                };
                let Some(outer) = outer else {
                    return;
                };
                // The outer hold's token, asked for first: the re-entered guard must carry it.
                outer.fence().await;
                tokio::time::sleep(gap).await;
                let inner = if nested == Nested::Same {
                    let kind = AcquireKind::Reenter;
                    acquire_one(&ctx, worker, locker, name, &inner, kind).await
                } else {
                    let in_write = (nested == Nested::ReadInWrite).then_some(outer.rec.token());
                    acquire_shared(&ctx, worker, locker, &inner, Shared::Read { in_write }).await
                };
                tokio::time::sleep(hold).await;
                let Some(inner) = inner else {
                    outer.end(ends[0], true).await;
                    return;
                };
                let shared = inner.rec.reentrant && inner.rec.token() == outer.rec.token();
                if !shared {
                    outer.end(ends[0], true).await;
                    inner.end(ends[1], true).await;
                    return;
                }
                let [(first, first_end), (second, second_end)] = if inner_first {
                    [(inner, ends[1]), (outer, ends[0])]
                } else {
                    [(outer, ends[0]), (inner, ends[1])]
                };
                // The second release is the hold's last only if the first one counted down.
                let counted_down = first.end(first_end, false).await == Some(Outcome::Released);
                second.end(second_end, counted_down).await;
            })
            .await;
        }
        Session::Beside {
            locker,
            outer,
            outer_acquire,
            name,
            acquires,
            stagger,
            holds,
            ends,
        } => {
            dlock_core::scope(async {
                let kind = AcquireKind::Lock;
                let Some(outer) =
                    acquire_one(&ctx, worker, locker, outer, &outer_acquire, kind).await
                else {
                    return;
                };
                let side = |i: usize| {
                    let (ctx, acquire) = (&ctx, &acquires[i]);
                    dlock_core::LockScope::nested().run(async move {
                        if i == 1 {
                            tokio::time::sleep(stagger).await;
                        }
                        let Some(guard) =
                            acquire_one(ctx, worker, locker, name, acquire, kind).await
                        else {
                            return;
                        };
                        tokio::time::sleep(holds[i]).await;
                        guard.end(ends[i + 1], true).await;
                    })
                };
                tokio::join!(side(0), side(1));
                outer.end(ends[0], true).await;
            })
            .await;
        }
        Session::Line {
            locker,
            name,
            tasks,
            rounds,
        } => {
            let kind = AcquireKind::Lock;
            let task = |(acquire, start, hold, end): (Acquire, Duration, Duration, End)| {
                let ctx = &ctx;
                async move {
                    tokio::time::sleep(start).await;
                    for _ in 0..rounds {
                        let taken = dlock_core::LockScope::nested().run(async {
                            let guard =
                                acquire_one(ctx, worker, locker, name, &acquire, kind).await?;
                            tokio::time::sleep(hold).await;
                            guard.end(end, true).await;
                            Some(())
                        });
                        if taken.await.is_none() {
                            return;
                        }
                    }
                }
            };
            futures_util::future::join_all(tasks.into_iter().map(task)).await;
        }
        Session::Multi {
            locker,
            names,
            acquire,
            hold,
            end,
        } => {
            let guards = acquire_all(&ctx, worker, locker, &names, &acquire).await;
            if guards.is_empty() {
                return;
            }
            tokio::time::sleep(hold).await;
            for guard in guards {
                guard.end(end, true).await;
            }
        }
        Session::Permit {
            locker,
            take,
            acquire,
            steps: planned,
            end,
        } => {
            let what = Shared::Permit { take };
            let Some(guard) = acquire_shared(&ctx, worker, locker, &acquire, what).await else {
                return;
            };
            steps(&guard, &planned).await;
            guard.end(end, true).await;
        }
        Session::Read {
            locker,
            acquire,
            steps: planned,
            end,
        } => {
            let what = Shared::Read { in_write: None };
            let Some(guard) = acquire_shared(&ctx, worker, locker, &acquire, what).await else {
                return;
            };
            steps(&guard, &planned).await;
            guard.end(end, true).await;
        }
        Session::SetPermits { locker, to } => set_permits(&ctx, worker, locker, to).await,
    }
}

/// Runs every session of one worker, each in its own task so that a panic is recorded against
/// its session and the worker goes on.
/// A session still running after this is hung: no call may take this long (the longest planned
/// wait and hold are well under a few seconds; a `Duration::MAX` wait only waits for leases of at
/// most 1.5 s at a time).
const HUNG_AFTER: Duration = Duration::from_secs(90);

pub(crate) async fn run_worker(ctx: Arc<Ctx>, worker: u16, sessions: Vec<Session>) {
    for (i, session) in sessions.into_iter().enumerate() {
        if ctx.halt.load(Ordering::Relaxed) {
            return;
        }
        let described = format!("{session:?}");
        let from = Instant::now();
        let mut task = tokio::spawn(run_session(ctx.clone(), worker, session));
        let Ok(done) = tokio::time::timeout(HUNG_AFTER, &mut task).await else {
            task.abort();
            let to = Instant::now();
            let name = ctx
                .history
                .events()
                .iter()
                .rev()
                .find(|e| e.worker == worker && e.at >= from)
                .map(|e| e.name);
            let mut lockers = Vec::new();
            for a in ctx.actors.iter() {
                let l = a.locker();
                // What the locker says of the name too: who holds it, as the backend sees it.
                let info = match name {
                    Some(n) => {
                        let inspect = l.inspect(ctx.name(n));
                        match tokio::time::timeout(Duration::from_secs(2), inspect).await {
                            Ok(Ok(info)) => format!(", the name: {info:?}"),
                            Ok(Err(err)) => format!(", the name: {err}"),
                            Err(_) => ", the name: no answer".to_owned(),
                        }
                    }
                    None => String::new(),
                };
                lockers.push(format!("{}: {:?}{info}", a.label, l.stats()));
            }
            let lockers = lockers.join("; ");
            ctx.history.hung(super::history::HungRec {
                worker,
                name,
                from,
                to,
                session: described,
                lockers,
            });
            continue;
        };
        if let Err(err) = done {
            let msg = if err.is_panic() {
                let payload = err.into_panic();
                payload
                    .downcast_ref::<&str>()
                    .map(|s| (*s).to_owned())
                    .or_else(|| payload.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "(non-string panic)".to_owned())
            } else {
                err.to_string()
            };
            ctx.history.panic(format!(
                "worker {worker}, session {i}: {described}\n      panicked: {msg}"
            ));
        }
    }
}
