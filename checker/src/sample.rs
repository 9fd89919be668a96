//! A guard never believes it holds its lock past the moment Redis will let the lock go.
//!
//! After every `extend` that returns `Ok`, and just before every release, the lock key is read
//! (`GET` for its fencing token and `PTTL`, in one round trip): while it still holds this guard's token, Redis keeps
//! it until at most `read + PTTL`, and the guard's `valid_until()` must not lie beyond that.
//! This is what catches a belief that outlives the lease before anyone else acquires (a lease
//! shortened by `extend`, a renewal landing after it) — the overlap check (a) sees it only when
//! another acquisition happens to fall into the gap.

use std::sync::Arc;
use std::time::Duration;

use dlock_core::LockGuard;
use dlock_core::redis;
use tokio::time::Instant;

use super::history::{GuardRec, History, ms};
use super::invariants::{Invariant, Violation};
use super::ops::Ctx;
use crate::hold::HoldValue;

/// PTTL is read in whole milliseconds, and two clocks are read around it.
const TOLERANCE: Duration = Duration::from_millis(3);

/// One reading of a guard's belief against the key's lease.
#[derive(Debug, Clone)]
pub(crate) struct SampleRec {
    /// The guard.
    pub(crate) guard: Arc<GuardRec>,
    /// What the sample followed (`"extend"`, `"release"`).
    pub(crate) after: &'static str,
    /// `valid_until()`, read first.
    pub(crate) valid_until: Instant,
    /// When the reply with the PTTL came back.
    pub(crate) read_by: Instant,
    /// The key's PTTL in ms.
    pub(crate) pttl_ms: i64,
}

/// Reads the key of `rec`'s name and records a sample if it still holds `rec`'s token.
pub(crate) async fn sample(ctx: &Ctx, rec: &Arc<GuardRec>, guard: &LockGuard, after: &'static str) {
    let Some(admin) = &ctx.admin else {
        return;
    };
    let valid_until = guard.valid_until();
    if guard.is_lost() {
        return;
    }
    let key = &ctx.keys[usize::from(rec.name)];
    let mut pipe = redis::pipe();
    pipe.cmd("GET").arg(key).cmd("PTTL").arg(key);
    let mut con = admin.clone();
    let read = pipe.query_async::<(Option<String>, i64)>(&mut con);
    let Ok(Ok((hold, pttl_ms))) = tokio::time::timeout(Duration::from_secs(2), read).await else {
        return;
    };
    let token = hold
        .and_then(|v| HoldValue::try_parse(&v).ok())
        .and_then(|h| h.token);
    let read_by = Instant::now();
    if token == Some(rec.token()) && pttl_ms >= 0 {
        ctx.history.sample(SampleRec {
            guard: rec.clone(),
            after,
            valid_until,
            read_by,
            pttl_ms,
        });
    }
}

/// Every sample whose guard believed beyond the key's expiry.
pub(crate) fn check(history: &History, out: &mut Vec<Violation>) {
    for s in history.samples() {
        let expires_by = s.read_by + Duration::from_millis(u64::try_from(s.pttl_ms).unwrap_or(0));
        if s.valid_until > expires_by + TOLERANCE {
            let g = &s.guard;
            out.push(Violation {
                invariant: Invariant::BeliefWithinLease,
                summary: format!(
                    "after {}, g{} (token {}) believed it held the lock until {} but Redis \
                     lets it go by {} ({} earlier)",
                    s.after,
                    g.id,
                    g.token(),
                    history.rel(s.valid_until),
                    history.rel(expires_by),
                    ms(s.valid_until - expires_by)
                ),
                window: Some((g.name, g.call, s.read_by)),
                hint: "",
            });
        }
    }
}
