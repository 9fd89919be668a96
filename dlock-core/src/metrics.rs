//! The metrics dlock records, through the [`metrics`](https://docs.rs/metrics) facade.
//!
//! Nothing is recorded until the application installs a recorder (a Prometheus exporter, say).
//! Call [`describe`] once after installing it, so each metric gets its type, unit and help text.
//!
//! | metric | type | unit | labels | what it counts |
//! |---|---|---|---|---|
//! | `dlock_acquired_total` | counter | | `kind`, `key`, `name`¹ | acquisitions (re-entries not counted) |
//! | `dlock_busy_total` | counter | | `kind`, `key`, `name`¹ | calls that ended with the lock still busy: `try_lock` finding it held, and waits that ran out |
//! | `dlock_timeout_total` | counter | | `kind`, `key`, `name`¹ | waits that ran out, returned as `LockError::Busy` (a subset of `dlock_busy_total`) |
//! | `dlock_wait_seconds` | histogram | seconds | `kind`, `key`, `name`¹ | time from the call to the acquisition |
//! | `dlock_hold_seconds` | histogram | seconds | `kind`, `key`, `name`¹ | time from the acquisition to the last guard letting go |
//! | `dlock_released_total` | counter | | `kind`, `key`, `name`¹ | final releases that found the lock still held |
//! | `dlock_release_failed_total` | counter | | `outcome`, `kind`, `key`, `name`¹ | final releases that did not: `outcome` is `expired`, `taken_over` or `unreachable` |
//! | `dlock_lost_total` | counter | | `reason`, `kind`, `key`, `name`¹ | holds lost while held: `reason` is `expired` (no renewal in time) or `gone` (deleted or taken over) |
//! | `dlock_renewed_total` | counter | | | lease renewals applied by the watchdog |
//! | `dlock_renew_errors_total` | counter | | | watchdog rounds that could not reach Redis |
//! | `dlock_backend_errors_total` | counter | | `operation` | commands that failed or timed out: `operation` is `acquire`, `release`, `extend`, `fence` (minting a token when first asked) or `inspect` (`list`, `inspect`, `force_release`); the watchdog's are `dlock_renew_errors_total` |
//! | `dlock_held` | gauge | | `kind` | holds held in the process now (a re-entered hold counts once) |
//! | `dlock_waiting` | gauge | | `kind` | acquisitions waiting in the process now |
//! | `dlock_subscribers_connected` | gauge | | | subscriber connections (one per `Locker` that waits for wake-ups) up now |
//! | `dlock_watchdog_lag_seconds` | gauge | seconds | | how late the last watchdog round started after it was due (a busy runtime shows here first) |
//! | `dlock_handovers_total` | counter | | | locks a release handed to a waiter of the same `Locker` in the same step (a release that lets the lock go and wakes the waiter is not one) |
//! | `dlock_foreign_layout_total` | counter | | `kind` | acquisitions that found their name held in a key layout this version does not speak (a newer version's; once per acquisition): they wait by polling and never write that hold |
//!
//! `key` is the template a name was made from (`order:<user_id>`), on the metrics of names
//! `#[distributed_lock]` builds (or marked with
//! [`LockName::with_template`](crate::LockName::with_template)): one series per template, where
//! the name would make one per user.
//!
//! `kind` says what was held: `lock` (a plain lock, one of a multi-lock's locks too), `fair`,
//! `write` and `read` (a read-write lock's writer and readers) or `permit` (a semaphore's).
//!
//! ¹ Only when the `Locker` was built with
//! [`metrics_name_label(true)`](crate::LockerBuilder::metrics_name_label), and never for a
//! [hidden](crate::LockName::hidden) name. Lock names are usually unbounded (`order:<id>`), and
//! each label value is a new time series in the recorder: the label is for a small, fixed set
//! of names.
//!
//! Logs and spans go through [`tracing`](https://docs.rs/tracing). Every acquisition runs in a
//! `dlock.acquire` span and every final release in a `dlock.release` span, at INFO unless
//! [`LockerBuilder::span_level`](crate::LockerBuilder::span_level) says otherwise:
//!
//! | span | fields |
//! |---|---|
//! | `dlock.acquire` | `name`, `kind`, `outcome` (`acquired`, `busy`, `failed`), `wait_ms`, `fencing_token` (when the grant minted one), `reentered` |
//! | `dlock.release` | `name`, `kind`, `outcome` (`released`, `expired`, `taken_over`, `unreachable`), `held_ms`, `fencing_token` (when one was minted) |
//!
//! Acquisitions, re-entries, busy answers and releases are DEBUG events; a lock lost while
//! held, a release that found the lock gone, a release that could not reach Redis and a
//! watchdog round that failed are WARN events. Durations in fields are whole milliseconds
//! (`_ms`). Hidden names show as `<hidden>`.

use ::metrics::{
    Unit, counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram,
};

use crate::name::LockName;

/// `dlock_acquired_total`.
pub const ACQUIRED: &str = "dlock_acquired_total";
/// `dlock_busy_total`.
pub const BUSY: &str = "dlock_busy_total";
/// `dlock_timeout_total`.
pub const TIMEOUT: &str = "dlock_timeout_total";
/// `dlock_wait_seconds`.
pub const WAIT_SECONDS: &str = "dlock_wait_seconds";
/// `dlock_hold_seconds`.
pub const HOLD_SECONDS: &str = "dlock_hold_seconds";
/// `dlock_released_total`.
pub const RELEASED: &str = "dlock_released_total";
/// `dlock_release_failed_total`.
pub const RELEASE_FAILED: &str = "dlock_release_failed_total";
/// `dlock_lost_total`.
pub const LOST: &str = "dlock_lost_total";
/// `dlock_renewed_total`.
pub const RENEWED: &str = "dlock_renewed_total";
/// `dlock_renew_errors_total`.
pub const RENEW_ERRORS: &str = "dlock_renew_errors_total";
/// `dlock_backend_errors_total`.
pub const BACKEND_ERRORS: &str = "dlock_backend_errors_total";
/// `dlock_held`.
pub const HELD: &str = "dlock_held";
/// `dlock_waiting`.
pub const WAITING: &str = "dlock_waiting";
/// `dlock_subscribers_connected`.
pub const SUBSCRIBERS_CONNECTED: &str = "dlock_subscribers_connected";
/// `dlock_watchdog_lag_seconds`.
pub const WATCHDOG_LAG_SECONDS: &str = "dlock_watchdog_lag_seconds";

/// `dlock_foreign_layout_total`.
pub const FOREIGN_LAYOUT: &str = "dlock_foreign_layout_total";
/// `dlock_handovers_total`.
pub const HANDOVERS: &str = "dlock_handovers_total";

/// Every metric dlock records, by name.
pub const ALL: [&str; 17] = [
    ACQUIRED,
    BUSY,
    TIMEOUT,
    WAIT_SECONDS,
    HOLD_SECONDS,
    RELEASED,
    RELEASE_FAILED,
    LOST,
    RENEWED,
    RENEW_ERRORS,
    BACKEND_ERRORS,
    HELD,
    WAITING,
    SUBSCRIBERS_CONNECTED,
    WATCHDOG_LAG_SECONDS,
    FOREIGN_LAYOUT,
    HANDOVERS,
];

/// Describes every metric (type, unit, help text) to the installed recorder. Call it once after
/// installing the recorder; metrics recorded before it are still counted.
pub fn describe() {
    describe_counter!(ACQUIRED, "Locks acquired (re-entries not counted).");
    describe_counter!(
        BUSY,
        "Lock calls that ended with the lock still busy (try_lock, or a wait that ran out)."
    );
    describe_counter!(TIMEOUT, "Waits that ran out, returned as LockError::Busy.");
    describe_histogram!(
        WAIT_SECONDS,
        Unit::Seconds,
        "Time from a lock call to its acquisition."
    );
    describe_histogram!(
        HOLD_SECONDS,
        Unit::Seconds,
        "Time from an acquisition to the last guard letting go."
    );
    describe_counter!(RELEASED, "Final releases that found the lock still held.");
    describe_counter!(
        RELEASE_FAILED,
        "Final releases that found the lock expired or taken over, or could not reach Redis."
    );
    describe_counter!(LOST, "Locks lost while held.");
    describe_counter!(RENEWED, "Lease renewals applied by the watchdog.");
    describe_counter!(RENEW_ERRORS, "Watchdog rounds that could not reach Redis.");
    describe_counter!(
        BACKEND_ERRORS,
        "Commands that failed or timed out, by operation (the watchdog's excepted)."
    );
    describe_gauge!(HELD, "Holds held in the process now.");
    describe_gauge!(WAITING, "Acquisitions waiting in the process now.");
    describe_gauge!(SUBSCRIBERS_CONNECTED, "Subscriber connections up now.");
    describe_gauge!(
        WATCHDOG_LAG_SECONDS,
        Unit::Seconds,
        "How late the last watchdog round started after it was due."
    );
    describe_counter!(
        FOREIGN_LAYOUT,
        "Acquisitions that found their name held in a key layout this version does not speak."
    );
    describe_counter!(
        HANDOVERS,
        "Locks a release handed to a waiter of the same Locker in the same step."
    );
}

/// The labels of one hold's or request's metrics: its kind, and its name when the `Locker`
/// asked for the name label and the name is shown.
#[derive(Debug, Clone)]
pub(crate) struct Labels {
    kind: &'static str,
    /// The template the name was made from (`order:<user_id>`), when it says.
    key: Option<&'static str>,
    name: Option<String>,
}

impl Labels {
    /// The labels of a hold of `kind` on `name`; the name only when `with_name` and the name is
    /// not hidden.
    pub(crate) fn new(kind: &'static str, with_name: bool, name: &LockName) -> Self {
        Self {
            kind,
            key: name.template(),
            name: (with_name && !name.is_hidden()).then(|| name.as_str().to_owned()),
        }
    }

    /// The labels as a list, for a metric whose key can't be static (a `key` or a `name`), with
    /// `extra` first.
    fn list(&self, extra: Option<(&'static str, &'static str)>) -> Vec<::metrics::Label> {
        let mut labels = Vec::with_capacity(4);
        if let Some((key, value)) = extra {
            labels.push(::metrics::Label::from_static_parts(key, value));
        }
        labels.push(::metrics::Label::from_static_parts("kind", self.kind));
        if let Some(key) = self.key {
            labels.push(::metrics::Label::from_static_parts("key", key));
        }
        if let Some(name) = &self.name {
            labels.push(::metrics::Label::new("name", name.clone()));
        }
        labels
    }

    /// Whether every label is static: only the kind.
    fn only_kind(&self) -> bool {
        self.key.is_none() && self.name.is_none()
    }
}

/// `$register!(metric, "kind" => <kind>)` with the kind as a literal, so that the metric's key
/// is static and recording it allocates nothing (a label value known only at run time makes
/// the `metrics` macros build a `Vec` on every call).
macro_rules! by_kind {
    ($register:ident, $metric:expr, $kind:expr) => {
        match $kind {
            "fair" => $register!($metric, "kind" => "fair"),
            "write" => $register!($metric, "kind" => "write"),
            "read" => $register!($metric, "kind" => "read"),
            "permit" => $register!($metric, "kind" => "permit"),
            _ => $register!($metric, "kind" => "lock"),
        }
    };
}

/// Adds `by` to `metric`, labelled.
pub(crate) fn count(metric: &'static str, labels: &Labels, by: u64) {
    if labels.only_kind() {
        by_kind!(counter, metric, labels.kind).increment(by);
    } else {
        counter!(metric, labels.list(None)).increment(by);
    }
}

/// Adds one to `metric`, labelled, with one more label (`key` = `value`).
pub(crate) fn count_with(
    metric: &'static str,
    key: &'static str,
    value: &'static str,
    labels: &Labels,
) {
    counter!(metric, labels.list(Some((key, value)))).increment(1);
}

/// Adds `by` to `metric`, which has no labels (the watchdog's: it renews every kind at once).
pub(crate) fn count_all(metric: &'static str, by: u64) {
    counter!(metric).increment(by);
}

/// Records `value` in the histogram `metric`, labelled.
pub(crate) fn seconds(metric: &'static str, labels: &Labels, value: std::time::Duration) {
    if labels.only_kind() {
        by_kind!(histogram, metric, labels.kind).record(value.as_secs_f64());
    } else {
        histogram!(metric, labels.list(None)).record(value.as_secs_f64());
    }
}

/// Moves the gauge `metric` of `kind` by `by` (one hold or waiter more, or fewer).
pub(crate) fn gauge_by(metric: &'static str, kind: &'static str, by: f64) {
    by_kind!(gauge, metric, kind).increment(by);
}

/// Counts one acquisition of `kind` that found its name held in a foreign layout.
pub(crate) fn foreign_layout(kind: &'static str) {
    by_kind!(counter, FOREIGN_LAYOUT, kind).increment(1);
}

/// Counts one failed command of `operation`.
pub(crate) fn backend_error(operation: &'static str) {
    counter!(BACKEND_ERRORS, "operation" => operation).increment(1);
}

/// Counts one lock handed to a waiter of the same `Locker`.
pub(crate) fn handed_over() {
    counter!(HANDOVERS).increment(1);
}

/// Sets the watchdog's lag.
pub(crate) fn watchdog_lag(lag: std::time::Duration) {
    gauge!(WATCHDOG_LAG_SECONDS).set(lag.as_secs_f64());
}

/// One subscriber connection more (`true`) or fewer.
pub(crate) fn subscriber_connected(up: bool) {
    let gauge = gauge!(SUBSCRIBERS_CONNECTED);
    if up {
        gauge.increment(1.0);
    } else {
        gauge.decrement(1.0);
    }
}
