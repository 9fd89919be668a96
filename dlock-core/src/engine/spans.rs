//! The spans dlock opens: `dlock.acquire` around every acquisition and `dlock.release` around
//! every final release, at the `Locker`'s span level (INFO unless
//! [`LockerBuilder::span_level`](crate::LockerBuilder::span_level) says otherwise). Each records
//! what happened on itself, so that a trace or an OpenTelemetry exporter sees the outcome, the
//! wait and the fencing token without reading the events inside. Durations are in milliseconds
//! (`wait_ms`, `held_ms`), as in dlock's events.

use std::time::Duration;

use tokio::time::Instant;
use tracing::field::Empty;
use tracing::{Level, Span};

use super::Attempted;
use crate::error::{LockError, ReleaseOutcome};
use crate::name::LockName;

/// `tracing::span!` at a level known only at run time (tracing's levels are part of each call
/// site, so there is one call site per level). For dlock's crates only.
#[doc(hidden)]
#[macro_export]
macro_rules! __span_at {
    ($level:expr, $($rest:tt)*) => {{
        use $crate::__tracing::{Level, span};
        let level: Level = $level;
        if level == Level::ERROR {
            span!(Level::ERROR, $($rest)*)
        } else if level == Level::WARN {
            span!(Level::WARN, $($rest)*)
        } else if level == Level::INFO {
            span!(Level::INFO, $($rest)*)
        } else if level == Level::DEBUG {
            span!(Level::DEBUG, $($rest)*)
        } else {
            span!(Level::TRACE, $($rest)*)
        }
    }};
}

/// Whole milliseconds, for a span field.
pub(crate) fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// The span of one acquisition, and when it began (read only when the span is recorded: an
/// acquisition nobody traces reads no clock for it).
pub(crate) struct AcquireSpan {
    pub(crate) span: Span,
    started: Option<Instant>,
}

impl AcquireSpan {
    /// Records on the span how the acquisition ended (see [`acquired`]).
    pub(crate) fn acquired(&self, result: &Result<Attempted, LockError>) {
        if let Some(started) = self.started {
            acquired(&self.span, result, started.elapsed());
        }
    }
}

/// The span of one acquisition of `name`, a hold of `kind` (`lock`, `fair`, `write`, `read`,
/// `permit`, `multi`).
pub(crate) fn acquire(level: Level, name: &LockName, kind: &'static str) -> AcquireSpan {
    let span = crate::__span_at!(
        level,
        "dlock.acquire",
        name = name.for_logs(),
        kind,
        outcome = Empty,
        wait_ms = Empty,
        fencing_token = Empty,
        reentered = Empty,
    );
    let started = (!span.is_disabled()).then(Instant::now);
    AcquireSpan { span, started }
}

/// Records on `span` how the acquisition that began `waited` ago ended: `acquired` (with the
/// fencing token if the grant minted one, and whether it re-entered a hold of the task),
/// `busy`, or `failed`.
fn acquired(span: &Span, result: &Result<Attempted, LockError>, waited: Duration) {
    span.record("wait_ms", ms(waited));
    match result {
        Ok(Attempted::Held(guard)) => {
            span.record("outcome", "acquired");
            span.record("reentered", guard.is_reentrant());
            if let Some(token) = guard.minted_fencing_token() {
                span.record("fencing_token", token.get());
            }
        }
        Ok(Attempted::Busy(..)) => {
            span.record("outcome", "busy");
        }
        Err(_) => {
            span.record("outcome", "failed");
        }
    }
}

/// The span of one final release of `name`, a hold of `kind`.
pub(crate) fn release(level: Level, name: &LockName, kind: &'static str) -> Span {
    crate::__span_at!(
        level,
        "dlock.release",
        name = name.for_logs(),
        kind,
        outcome = Empty,
        held_ms = Empty,
        fencing_token = Empty,
    )
}

/// Records on `span` how the release of a hold kept `held` ended: `released`, `expired`,
/// `taken_over` or `unreachable`.
pub(crate) fn released(
    span: &Span,
    outcome: &ReleaseOutcome,
    held: Duration,
    fencing_token: Option<u64>,
) {
    if span.is_disabled() {
        return;
    }
    span.record("held_ms", ms(held));
    if let Some(token) = fencing_token {
        span.record("fencing_token", token);
    }
    span.record(
        "outcome",
        match outcome {
            ReleaseOutcome::Released => "released",
            ReleaseOutcome::Expired => "expired",
            ReleaseOutcome::TakenOver => "taken_over",
            ReleaseOutcome::Unreachable(_) => "unreachable",
        },
    );
}
