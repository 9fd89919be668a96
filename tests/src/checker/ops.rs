//! The operation executor: runs planned sessions against the lockers and records every call,
//! guard and outcome in the history.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use dlock_core::redis::AsyncCommands as _;
use dlock_core::{LockError, LockGuard, LockRequest, Locker};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::actors::Actor;
use super::history::{
    AcquireKind, CallRec, EndHow, ErrKind, EventKind, GuardEnd, GuardRec, History, LeaseSpec,
    Outcome, RunRec, locked,
};
use super::plan::{Acquire, End, Session, Step, lease_of};

/// How much longer than its bound a call may take on a noisy machine before it counts as
/// unbounded (invariant e).
pub const SLACK: Duration = Duration::from_millis(250);

/// How long an admin command (`HGET`) may take before its check is skipped.
const ADMIN_TIMEOUT: Duration = Duration::from_secs(1);

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
}

fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

/// Everything a worker needs.
#[derive(Debug)]
pub(crate) struct Ctx {
    pub(crate) history: Arc<History>,
    pub(crate) actors: Arc<Vec<Actor>>,
    /// An admin connection to read Redis with (`None`: memory backend).
    pub(crate) admin: Option<dlock_core::redis::aio::ConnectionManager>,
    /// The lock key of every name.
    pub(crate) keys: Vec<String>,
    pub(crate) stats: Stats,
}

impl Ctx {
    fn name(&self, name: u8) -> &str {
        &self.history.names[usize::from(name)]
    }

    fn name_index(&self, name: &str) -> u8 {
        let index = self
            .history
            .names
            .iter()
            .position(|n| n == name)
            .expect("a guard names one of the run's names");
        u8::try_from(index).expect("fewer than 256 names")
    }
}

/// A guard and its record; its `lost()` future is watched by a side task while it lives.
#[derive(Debug)]
pub(crate) struct Tracked {
    guard: Option<LockGuard>,
    rec: Arc<GuardRec>,
    watcher: JoinHandle<()>,
    ctx: Arc<Ctx>,
}

impl Tracked {
    fn new(
        ctx: &Arc<Ctx>,
        worker: u16,
        locker: u8,
        call: Instant,
        (lease, at_least): (Duration, Option<Duration>),
        guard: LockGuard,
    ) -> Self {
        let start = Instant::now();
        let name = ctx.name_index(guard.name().as_str());
        let rec = Arc::new(GuardRec {
            id: ctx.history.next_guard_id(),
            worker,
            locker,
            name,
            token: guard.fencing_token().get(),
            reentrant: guard.is_reentrant(),
            watchdog: guard.is_watchdog(),
            call,
            start,
            lost_at: Default::default(),
            lease,
            at_least,
            extends: Default::default(),
            end: Default::default(),
        });
        ctx.history.guard(rec.clone());
        ctx.history.event(
            start,
            worker,
            locker,
            name,
            EventKind::Acquired {
                guard: rec.id,
                token: rec.token,
                reentrant: rec.reentrant,
            },
        );
        bump(&ctx.stats.acquired);
        let lost = guard.lost();
        let watcher = tokio::spawn({
            let (rec, history) = (rec.clone(), ctx.history.clone());
            async move {
                lost.await;
                let at = Instant::now();
                let _ = rec.lost_at.set(at);
                history.event(at, worker, locker, name, EventKind::Lost { guard: rec.id });
            }
        });
        Self {
            guard: Some(guard),
            rec,
            watcher,
            ctx: ctx.clone(),
        }
    }

    fn guard(&self) -> &LockGuard {
        self.guard
            .as_ref()
            .expect("a tracked guard is used only before it ends")
    }

    fn event(&self, at: Instant, kind: EventKind) {
        let r = &self.rec;
        self.ctx.history.event(at, r.worker, r.locker, r.name, kind);
    }

    fn bounded(&self, what: &'static str, call: Instant, ret: Instant, bound: Duration) {
        let r = &self.rec;
        self.ctx.history.call(CallRec {
            worker: r.worker,
            locker: r.locker,
            name: r.name,
            what,
            call,
            ret,
            bound,
        });
    }

    fn command_timeout(&self) -> Duration {
        self.ctx.actors[usize::from(self.rec.locker)].command_timeout
    }

    async fn extend(&self, lease: Duration) {
        bump(&self.ctx.stats.calls);
        let guard = self.guard.as_ref().expect("extend before the end");
        let call = Instant::now();
        self.event(
            call,
            EventKind::ExtendCall {
                guard: self.rec.id,
                lease,
            },
        );
        let result = guard.extend(lease).await;
        let ret = Instant::now();
        if result.is_ok() {
            locked(&self.rec.extends).push((call, lease));
            super::sample::sample(&self.ctx, &self.rec, guard, "extend").await;
        }
        if result.as_ref().is_err_and(LockError::is_backend) {
            bump(&self.ctx.stats.backend_errors);
        }
        self.event(
            ret,
            EventKind::ExtendDone {
                guard: self.rec.id,
                result: result.map_err(|e| ErrKind::of(&e)),
            },
        );
        self.bounded("extend", call, ret, self.command_timeout() + SLACK);
    }

    async fn run(&self, work: Duration) {
        bump(&self.ctx.stats.calls);
        let started = Instant::now();
        let result = self.guard().run(tokio::time::sleep(work)).await;
        let ret = Instant::now();
        let cancelled = result.as_ref().is_err_and(LockError::is_lost);
        if cancelled {
            bump(&self.ctx.stats.runs_cancelled);
        }
        self.event(
            ret,
            EventKind::RunDone {
                guard: self.rec.id,
                work,
                cancelled,
            },
        );
        self.ctx.history.run(RunRec {
            guard: self.rec.clone(),
            started,
            work,
            ok: result.is_ok(),
            valid_until_after: self.guard().valid_until(),
        });
    }

    /// Ends the guard; returns the release outcome if a release ran to its end.
    async fn end(mut self, end: End, final_of_hold: bool) -> Option<Outcome> {
        let within = match end {
            End::Drop => {
                drop(self);
                return None;
            }
            End::Release => None,
            End::ReleaseWithin(d) => Some(d),
        };
        bump(&self.ctx.stats.calls);
        if let Some(guard) = &self.guard {
            super::sample::sample(&self.ctx, &self.rec, guard, "release").await;
        }
        let guard = self.guard.take().expect("a tracked guard ends once");
        let (valid_until, lost_before) = (guard.valid_until(), guard.is_lost());
        let at = Instant::now();
        *locked(&self.rec.end) = Some(GuardEnd {
            at,
            how: EndHow::Released,
            valid_until,
            lost_before,
            returned: None,
            final_of_hold,
            hget: None,
        });
        self.event(at, EventKind::ReleaseCall { guard: self.rec.id });
        let release = guard.release();
        let outcome = match within {
            None => Some(release.await),
            Some(d) => tokio::time::timeout(d, release).await.ok(),
        };
        let ret = Instant::now();
        let id = self.rec.id;
        let Some(outcome) = outcome else {
            bump(&self.ctx.stats.dropped_futures);
            if let Some(e) = locked(&self.rec.end).as_mut() {
                e.how = EndHow::ReleaseDropped;
            }
            self.event(ret, EventKind::ReleaseDropped { guard: id });
            return None;
        };
        let outcome = Outcome::of(&outcome);
        if outcome == Outcome::Unreachable {
            bump(&self.ctx.stats.backend_errors);
        }
        self.event(ret, EventKind::ReleaseDone { guard: id, outcome });
        self.bounded("release", at, ret, 2 * self.command_timeout() + SLACK);
        let hget = match (&self.ctx.admin, final_of_hold, outcome) {
            (Some(admin), true, Outcome::Released) => {
                let key = &self.ctx.keys[usize::from(self.rec.name)];
                let mut con = admin.clone();
                let read = con.hget::<_, _, Option<u64>>(key, "#f");
                match tokio::time::timeout(ADMIN_TIMEOUT, read).await {
                    Ok(Ok(found)) => {
                        let at = Instant::now();
                        self.event(at, EventKind::Hget { guard: id, found });
                        Some((at, found))
                    }
                    _ => None,
                }
            }
            _ => None,
        };
        if let Some(e) = locked(&self.rec.end).as_mut() {
            e.returned = Some((ret, outcome));
            e.hget = hget;
        }
        Some(outcome)
    }
}

impl Drop for Tracked {
    fn drop(&mut self) {
        if let Some(guard) = self.guard.take() {
            bump(&self.ctx.stats.calls);
            let at = Instant::now();
            *locked(&self.rec.end) = Some(GuardEnd {
                at,
                how: EndHow::Dropped,
                valid_until: guard.valid_until(),
                lost_before: guard.is_lost(),
                returned: None,
                final_of_hold: false,
                hget: None,
            });
            self.event(at, EventKind::Dropped { guard: self.rec.id });
            drop(guard);
        }
        self.watcher.abort();
    }
}

fn with_lease(request: LockRequest, lease: LeaseSpec) -> LockRequest {
    match lease {
        LeaseSpec::LockerDefault => request,
        LeaseSpec::Watchdog(d) => request.watchdog_lease(d),
        LeaseSpec::Fixed(d) => request.lease(d),
    }
}

/// Runs `fut`, dropping it after `cancel_after` if that is set and it has not finished.
async fn maybe_cancelled<F: Future>(fut: F, cancel_after: Option<Duration>) -> Option<F::Output> {
    match cancel_after {
        None => Some(fut.await),
        Some(d) => tokio::select! {
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
    result: Option<Result<Option<Vec<LockGuard>>, LockError>>,
    (call, lease, at_least, bound): (Instant, Duration, Option<Duration>, Duration),
) -> Vec<Tracked> {
    let ret = Instant::now();
    let history = &ctx.history;
    let each = |kind: EventKind| {
        for &name in names {
            history.event(ret, worker, locker, name, kind);
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
            .map(|g| Tracked::new(ctx, worker, locker, call, (lease, at_least), g))
            .collect(),
        Ok(None) => {
            bump(&ctx.stats.busy);
            each(EventKind::Busy);
            Vec::new()
        }
        Err(err) => {
            if err.is_timeout() {
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

async fn acquire_one(
    ctx: &Arc<Ctx>,
    worker: u16,
    locker: u8,
    name: u8,
    acq: &Acquire,
    kind: AcquireKind,
) -> Option<Tracked> {
    bump(&ctx.stats.calls);
    let actor = &ctx.actors[usize::from(locker)];
    let l: Locker = actor.locker();
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
    ctx.history.event(call, worker, locker, name, event);
    let mut request = with_lease(l.lock(ctx.name(name)).wait(acq.wait), acq.lease);
    if let Some(period) = acq.period() {
        request = request.at_least(period);
    }
    let fut = async {
        if acq.try_lock {
            request.try_lock().await.map(|g| g.map(|g| vec![g]))
        } else {
            request.await.map(|g| Some(vec![g]))
        }
    };
    let result = maybe_cancelled(fut, acq.cancel_after).await;
    let bound = acq
        .wait
        .saturating_add(actor.command_timeout)
        .saturating_add(SLACK);
    let lease = lease_of(acq.lease, actor.watchdog_lease);
    let recorded = (call, lease, acq.period(), bound);
    record_acquired(ctx, worker, locker, &[name], result, recorded).pop()
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
    let call = Instant::now();
    for &name in names {
        let event = EventKind::AcquireCall {
            kind: AcquireKind::LockAll,
            wait: acq.wait,
            lease: acq.lease,
        };
        ctx.history.event(call, worker, locker, name, event);
    }
    let mut request = l
        .lock_all(names.iter().map(|&n| ctx.name(n)))
        .wait(acq.wait);
    request = match acq.lease {
        LeaseSpec::LockerDefault => request,
        LeaseSpec::Watchdog(d) => request.watchdog_lease(d),
        LeaseSpec::Fixed(d) => request.lease(d),
    };
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
    record_acquired(ctx, worker, locker, names, result, recorded)
}

async fn steps(guard: &Tracked, steps: &[Step]) {
    for step in steps {
        match *step {
            Step::Hold(d) => tokio::time::sleep(d).await,
            Step::Extend(d) => guard.extend(d).await,
            Step::Run(work) => guard.run(work).await,
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
            outer,
            gap,
            inner,
            hold,
            inner_first,
            ends,
        } => {
            dlock_core::scope(async {
                let kind = AcquireKind::Lock;
                let Some(outer) = acquire_one(&ctx, worker, locker, name, &outer, kind).await
                else {
                    return;
                };
                tokio::time::sleep(gap).await;
                let kind = AcquireKind::Reenter;
                let inner = acquire_one(&ctx, worker, locker, name, &inner, kind).await;
                tokio::time::sleep(hold).await;
                let Some(inner) = inner else {
                    outer.end(ends[0], true).await;
                    return;
                };
                let shared = inner.rec.reentrant && inner.rec.token == outer.rec.token;
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
            ctx.history.hung(super::history::HungRec {
                worker,
                name,
                from,
                to,
                session: described,
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
