//! A guard as the run tracks it: its record in the history, a side task watching its `lost()`
//! future, and the calls made on it (`extend`, `run`, release, drop), each recorded.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use dlock_core::{LockError, LockGuard, Lost, Permit, ReadGuard, ReleaseOutcome};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::history::{
    CallRec, EndHow, ErrKind, EventKind, GuardEnd, GuardRec, Outcome, RunRec, Share, locked,
};
use super::ops::{Ctx, SLACK, bump};
use super::plan::End;
use crate::hold::HoldValue;

/// How long an admin command (`HGET`) may take before its check is skipped.
const ADMIN_TIMEOUT: Duration = Duration::from_secs(1);

/// Whatever an acquisition handed out: a lock's guard, a read lock's, a permit.
#[derive(Debug)]
pub(crate) enum Held {
    Lock(LockGuard),
    Read(ReadGuard),
    Permit(Permit),
}

impl Held {
    fn name(&self) -> &str {
        match self {
            Self::Lock(g) => g.name().as_str(),
            Self::Read(g) => g.name().as_str(),
            Self::Permit(p) => p.name().as_str(),
        }
    }

    /// How many permits it holds: those of a permit taken at once, else 1.
    fn permits(&self) -> u32 {
        match self {
            Self::Permit(p) => p.permits(),
            _ => 1,
        }
    }

    /// The token a lock's guard has without asking (a read lock or a permit has none).
    fn minted_token(&self) -> Option<u64> {
        self.lock()
            .and_then(LockGuard::minted_fencing_token)
            .map(|t| t.get())
    }

    fn lock(&self) -> Option<&LockGuard> {
        match self {
            Self::Lock(g) => Some(g),
            _ => None,
        }
    }

    /// Whether it re-entered a hold of its task.
    pub(super) fn is_reentrant(&self) -> bool {
        match self {
            Self::Lock(g) => g.is_reentrant(),
            Self::Read(g) => g.is_reentrant(),
            Self::Permit(_) => false,
        }
    }

    fn is_watchdog(&self) -> bool {
        match self {
            Self::Lock(g) => g.is_watchdog(),
            Self::Read(g) => g.is_watchdog(),
            Self::Permit(p) => p.is_watchdog(),
        }
    }

    fn valid_until(&self) -> Instant {
        match self {
            Self::Lock(g) => g.valid_until(),
            Self::Read(g) => g.valid_until(),
            Self::Permit(p) => p.valid_until(),
        }
    }

    fn is_lost(&self) -> bool {
        match self {
            Self::Lock(g) => g.is_lost(),
            Self::Read(g) => g.is_lost(),
            Self::Permit(p) => p.is_lost(),
        }
    }

    fn lost(&self) -> Lost {
        match self {
            Self::Lock(g) => g.lost(),
            Self::Read(g) => g.lost(),
            Self::Permit(p) => p.lost(),
        }
    }

    async fn run(&self, work: Duration) -> Result<(), LockError> {
        let work = tokio::time::sleep(work);
        match self {
            Self::Lock(g) => g.run(work).await,
            Self::Read(g) => g.run(work).await,
            Self::Permit(p) => p.run(work).await,
        }
    }

    async fn release(self) -> ReleaseOutcome {
        match self {
            Self::Lock(g) => g.release().await,
            Self::Read(g) => g.release().await,
            Self::Permit(p) => p.release().await,
        }
    }
}

/// A guard and its record; its `lost()` future is watched by a side task while it lives.
#[derive(Debug)]
pub(crate) struct Tracked {
    guard: Option<Held>,
    pub(super) rec: Arc<GuardRec>,
    watcher: JoinHandle<()>,
    ctx: Arc<Ctx>,
}

impl Tracked {
    /// Records a guard just handed out and starts watching its `lost()` future. `share` says
    /// what it holds; a read that re-entered a write hold is recorded with the write's `token`.
    pub(super) fn new(
        ctx: &Arc<Ctx>,
        worker: u16,
        locker: u8,
        (call, call_id, multi): (Instant, u32, bool),
        (lease, at_least): (Duration, Option<Duration>),
        (guard, share, token): (Held, Share, Option<u64>),
    ) -> Self {
        let start = Instant::now();
        let name = ctx.name_index(guard.name());
        let token = token.or_else(|| guard.minted_token());
        let rec = Arc::new(GuardRec {
            id: ctx.history.next_guard_id(),
            worker,
            locker,
            name,
            fencing_token: AtomicU64::new(token.unwrap_or(0)),
            reentrant: guard.is_reentrant(),
            share,
            permits: guard.permits(),
            watchdog: guard.is_watchdog(),
            call,
            multi,
            start,
            granted_until: guard.valid_until(),
            handed_out_lost: guard.is_lost(),
            lost_at: Default::default(),
            lease,
            at_least,
            extends: Default::default(),
            end: Default::default(),
        });
        ctx.history.guard(rec.clone());
        ctx.history.acquisition_event(
            start,
            worker,
            locker,
            name,
            call_id,
            EventKind::Acquired {
                guard: rec.id,
                token: rec.token(),
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

    fn guard(&self) -> &Held {
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

    /// Holds for `most`, or until `after` past a failover's promotion that reached this name.
    pub(super) async fn hold_past_promotion(&self, most: Duration, after: Duration) {
        let mut promotions = self.ctx.history.promotions.subscribe();
        let name = self.rec.name;
        let promoted = async {
            loop {
                if promotions.changed().await.is_err() {
                    std::future::pending::<()>().await;
                }
                if promotions.borrow_and_update().is_some_and(|r| r.hits(name)) {
                    return;
                }
            }
        };
        tokio::select! {
            biased;
            () = tokio::time::sleep(most) => {}
            () = promoted => tokio::time::sleep(after).await,
        }
    }

    /// `extend(lease)`, recorded.
    pub(super) async fn extend(&self, lease: Duration) {
        bump(&self.ctx.stats.calls);
        let guard = (self.guard().lock()).expect("only a lock's guard is extended");
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

    /// `fencing_token()`, recorded (a lock's guard only): the token becomes the guard's (it must
    /// be the one the guard had already, if it had one: see the fencing check).
    pub(super) async fn fence(&self) {
        let Some(guard) = self.guard().lock() else {
            return;
        };
        bump(&self.ctx.stats.calls);
        let lost_before = guard.is_lost();
        let call = Instant::now();
        let result = guard.fencing_token().await;
        let ret = Instant::now();
        let token = result.as_ref().ok().map(|t| t.get());
        if let Some(token) = token {
            // A token other than the one the guard had already is reported from the event.
            let _ = (self.rec.fencing_token).compare_exchange(
                0,
                token,
                Ordering::AcqRel,
                Ordering::Acquire,
            );
        }
        if result.as_ref().is_err_and(LockError::is_backend) {
            bump(&self.ctx.stats.backend_errors);
        }
        self.event(
            ret,
            EventKind::Fenced {
                guard: self.rec.id,
                token,
                lost_before,
            },
        );
        self.bounded("fencing_token", call, ret, self.command_timeout() + SLACK);
    }

    /// `run(sleep(work))`, recorded.
    pub(super) async fn run(&self, work: Duration) {
        bump(&self.ctx.stats.calls);
        let started = Instant::now();
        let result = self.guard().run(work).await;
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
    pub(super) async fn end(mut self, end: End, final_of_hold: bool) -> Option<Outcome> {
        let within = match end {
            End::Drop => {
                drop(self);
                return None;
            }
            End::Release => None,
            End::ReleaseWithin(d) => Some(d),
        };
        bump(&self.ctx.stats.calls);
        if let Some(guard) = self.guard.as_ref().and_then(Held::lock) {
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
        // A read lock or a permit has no token to look for.
        let exclusive = matches!(self.rec.share, Share::Exclusive | Share::ReadInWrite);
        let hget = match (&self.ctx.admin, final_of_hold && exclusive, outcome) {
            (Some(admin), true, Outcome::Released) => {
                let key = &self.ctx.keys[usize::from(self.rec.name)];
                let mut con = admin.clone();
                let read = HoldValue::token_on(&mut con, key);
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
