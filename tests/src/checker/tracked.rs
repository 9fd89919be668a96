//! A guard as the run tracks it: its record in the history, a side task watching its `lost()`
//! future, and the calls made on it (`extend`, `run`, release, drop), each recorded.

use std::sync::Arc;
use std::time::Duration;

use dlock_core::redis::AsyncCommands as _;
use dlock_core::{LockError, LockGuard};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::history::{
    CallRec, EndHow, ErrKind, EventKind, GuardEnd, GuardRec, Outcome, RunRec, locked,
};
use super::ops::{Ctx, SLACK, bump};
use super::plan::End;

/// How long an admin command (`HGET`) may take before its check is skipped.
const ADMIN_TIMEOUT: Duration = Duration::from_secs(1);

/// A guard and its record; its `lost()` future is watched by a side task while it lives.
#[derive(Debug)]
pub(crate) struct Tracked {
    guard: Option<LockGuard>,
    pub(super) rec: Arc<GuardRec>,
    watcher: JoinHandle<()>,
    ctx: Arc<Ctx>,
}

impl Tracked {
    /// Records a guard just handed out and starts watching its `lost()` future.
    pub(super) fn new(
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
            granted_until: guard.valid_until(),
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

    /// `extend(lease)`, recorded.
    pub(super) async fn extend(&self, lease: Duration) {
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

    /// `run(sleep(work))`, recorded.
    pub(super) async fn run(&self, work: Duration) {
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
