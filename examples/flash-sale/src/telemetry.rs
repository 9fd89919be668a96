//! Logs: `tracing` events, one span per request carrying its id, written by
//! `tracing-subscriber` to stderr — as text, or as JSON lines with `LOG_FORMAT=json`; the level
//! from `RUST_LOG` (default `info`).
//!
//! Every request gets an id: the caller's `x-request-id` when it is a sensible one (1 to 64
//! letters, digits, `-`, `_`, `.`), a new one otherwise; it is echoed in the answer's
//! `x-request-id` and is in every log line of the request.

use std::time::Instant;

use axum::extract::Request;
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use tracing::Instrument as _;
use tracing_subscriber::EnvFilter;

use crate::error::{INTERNAL_DETAIL, PROBLEM_JSON, Problem};

/// The request id header.
pub const REQUEST_ID: &str = "x-request-id";

/// Installs the process's log subscriber (once; later calls do nothing).
pub fn init() {
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new("info,sqlx=warn,dlock_core=info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let json = std::env::var("LOG_FORMAT").is_ok_and(|f| f.eq_ignore_ascii_case("json"));
    let _ = if json {
        builder.json().flatten_event(true).try_init()
    } else {
        builder.try_init()
    };
}

/// This request's id (a request extension).
#[derive(Debug, Clone)]
pub struct RequestId(pub String);

fn acceptable(id: &HeaderValue) -> Option<&str> {
    let id = id.to_str().ok()?;
    let ok = (1..=64).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    ok.then_some(id)
}

/// Gives the request its id and span, echoes the id, and logs the outcome.
pub async fn request_id(mut request: Request, next: Next) -> Response {
    let id = request
        .headers()
        .get(REQUEST_ID)
        .and_then(acceptable)
        .map_or_else(crate::counters::random_id, str::to_owned);
    let span = tracing::info_span!(
        "request",
        request_id = %id,
        method = %request.method(),
        path = %request.uri().path(),
    );
    request.extensions_mut().insert(RequestId(id.clone()));
    let started = Instant::now();
    let mut response = next.run(request).instrument(span.clone()).await;
    if let Ok(value) = HeaderValue::from_str(&id) {
        response.headers_mut().insert(REQUEST_ID, value);
    }
    let status = response.status().as_u16();
    let ms = started.elapsed().as_secs_f64() * 1e3;
    span.in_scope(|| {
        if status >= 500 {
            tracing::warn!(status, ms, "request failed");
        } else {
            tracing::info!(status, ms, "request");
        }
    });
    response
}

/// The last word on error formats: an error answer that is not problem+json by now (a
/// rejection of axum's own, a 500 from a panic or a missing extension) is replaced by one, so
/// that every 4xx and 5xx reads alike. Its body is dropped: it may hold an internal message.
pub async fn problem_only(request: Request, next: Next) -> Response {
    let response = next.run(request).await;
    let status = response.status();
    if !(status.is_client_error() || status.is_server_error()) {
        return response;
    }
    let is_problem = response
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|ct| ct.as_bytes().starts_with(PROBLEM_JSON.as_bytes()));
    if is_problem {
        return response;
    }
    let detail = if status.is_server_error() {
        tracing::error!(%status, "an error answer without a problem body; its body is not sent");
        INTERNAL_DETAIL.to_owned()
    } else {
        match status {
            StatusCode::NOT_FOUND => "no such page or API route".to_owned(),
            StatusCode::METHOD_NOT_ALLOWED => "this route does not take that method".to_owned(),
            other => other
                .canonical_reason()
                .unwrap_or("the request was refused")
                .to_owned(),
        }
    };
    let (mut parts, _) = response.into_parts();
    let mut fresh = Problem::new(status, detail).response();
    // Keep what the client may need (Allow on a 405, Retry-After); the body's headers go.
    parts.headers.remove(header::CONTENT_LENGTH);
    for (name, value) in fresh.headers() {
        parts.headers.insert(name, value.clone());
    }
    *fresh.headers_mut() = parts.headers;
    fresh.into_response()
}
