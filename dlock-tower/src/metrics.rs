//! The metrics a `LockLayer` records, through the [`metrics`](https://docs.rs/metrics) facade,
//! beside dlock-core's own (`dlock_core::metrics`). Call [`describe`] once after installing a
//! recorder.
//!
//! | metric | type | unit | labels | what it counts |
//! |---|---|---|---|---|
//! | `dlock_layer_requests_total` | counter | | `outcome` | requests the layer decided on: `acquired` (run under the lock), `unlocked` (the key named no lock), `key_rejected` (the extractor refused), `busy` (409), `invalid_key` (400), `unavailable` (503), `internal` (500) |
//! | `dlock_layer_lost_total` | counter | | | requests whose lock was lost while the handler ran or the held body was sent (cancelled, 503) |

use ::metrics::{counter, describe_counter};

/// `dlock_layer_requests_total`.
pub const REQUESTS: &str = "dlock_layer_requests_total";
/// `dlock_layer_lost_total`.
pub const LOST: &str = "dlock_layer_lost_total";

/// Every metric the layer records, by name.
pub const ALL: [&str; 2] = [REQUESTS, LOST];

/// Describes every metric to the installed recorder.
pub fn describe() {
    describe_counter!(
        REQUESTS,
        "Requests a LockLayer decided on, by outcome (acquired, unlocked, key_rejected, busy, \
         invalid_key, unavailable, internal)."
    );
    describe_counter!(
        LOST,
        "Requests whose lock was lost while the handler ran or the body was sent."
    );
}

/// Counts one request's `outcome` (a loss goes to [`LOST`]).
pub(crate) fn outcome(outcome: &'static str) {
    if outcome == "lost" {
        counter!(LOST).increment(1);
    } else {
        counter!(REQUESTS, "outcome" => outcome).increment(1);
    }
}
