//! The instance's metrics in Prometheus's text format at `GET /metrics`: dlock's own (holds,
//! waits, busy answers, gauges; `dlock_core::metrics`), the lock layer's
//! (`dlock_tower::metrics`), and the shop's purchase counters. Histograms have buckets from
//! 0.5 ms to 5 s, so that `histogram_quantile` gives lock wait percentiles. The Grafana
//! dashboard in `grafana/flash-sale.json` plots them per instance.

use std::sync::OnceLock;

use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

use crate::error::AppError;

/// Purchase requests, by `purchase` (`voucher`, `checkout`) and `status` (`2xx`, `409`, `4xx`,
/// `5xx`).
pub const PURCHASES: &str = "flash_sale_purchase_requests_total";
/// Fenced writes the database refused (a stale holder's).
pub const STALE_REFUSED: &str = "flash_sale_stale_writes_refused_total";

/// The buckets of every `_seconds` histogram. 2 s is the shop's longest lock wait: a bucket
/// there keeps a p99 of waits that ran out from being read as 2.4 s.
const BUCKETS: [f64; 14] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 2.5, 5.0,
];

static HANDLE: OnceLock<Option<PrometheusHandle>> = OnceLock::new();

/// Installs the process's Prometheus recorder (once; later calls return the same handle), and
/// describes every metric. `None` if another recorder was installed first.
pub fn install() -> Option<PrometheusHandle> {
    HANDLE
        .get_or_init(|| {
            let installed = PrometheusBuilder::new()
                .set_buckets_for_metric(Matcher::Suffix("_seconds".to_owned()), &BUCKETS)
                .and_then(PrometheusBuilder::install_recorder);
            match installed {
                Ok(handle) => {
                    dlock_core::metrics::describe();
                    dlock_tower::metrics::describe();
                    ::metrics::describe_counter!(
                        PURCHASES,
                        "Purchase requests, by purchase (voucher, checkout) and status."
                    );
                    ::metrics::describe_counter!(
                        STALE_REFUSED,
                        "Fenced writes the database refused: a stale lock holder's."
                    );
                    // Exported from the start: a dashboard shows 0, not "no data".
                    ::metrics::counter!(STALE_REFUSED).increment(0);
                    Some(handle)
                }
                Err(err) => {
                    tracing::warn!(error = %err, "flash-sale: no metrics recorder");
                    None
                }
            }
        })
        .clone()
}

/// Counts one purchase request of `purchase` answered `status`.
pub(crate) fn purchase(purchase: &'static str, status: StatusCode) {
    let status = match status.as_u16() {
        200..=299 => "2xx",
        409 => "409",
        400..=499 => "4xx",
        _ => "5xx",
    };
    ::metrics::counter!(PURCHASES, "purchase" => purchase, "status" => status).increment(1);
}

/// Counts one fenced write refused.
pub(crate) fn stale_refused() {
    ::metrics::counter!(STALE_REFUSED).increment(1);
}

/// `GET /metrics`: the process's metrics, or 503 when no recorder is installed (an instance
/// built in-process, as tests do, without [`install`]).
pub(crate) async fn metrics() -> Response {
    match HANDLE.get().cloned().flatten() {
        Some(handle) => (
            [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
            handle.render(),
        )
            .into_response(),
        None => AppError::Rejected(
            StatusCode::SERVICE_UNAVAILABLE,
            "metrics are not recorded in this process".to_owned(),
        )
        .into_response(),
    }
}
