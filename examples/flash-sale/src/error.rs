//! One error format for every answer that is not a success: `application/problem+json`
//! ([RFC 9457](https://www.rfc-editor.org/rfc/rfc9457)) with `type`, `title`, `status` and
//! `detail`, as dlock-core's `ErrorResponses` renders lock errors.
//!
//! `detail` is always safe to show a shopper: database and socket errors are logged with the
//! request id and never put in a body.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use dlock_core::LockError;
use serde::{Deserialize, Serialize};

/// The content type of every error answer.
pub const PROBLEM_JSON: &str = "application/problem+json";

/// The body of every error answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Problem {
    /// Always `about:blank`: the status says what kind of problem it is.
    #[serde(rename = "type")]
    pub kind: String,
    /// The status's reason phrase.
    pub title: String,
    /// The HTTP status.
    pub status: u16,
    /// What went wrong, for a person.
    pub detail: String,
}

impl Problem {
    /// A problem with `status` and `detail`.
    pub fn new(status: StatusCode, detail: impl Into<String>) -> Self {
        Self {
            kind: "about:blank".to_owned(),
            title: status.canonical_reason().unwrap_or("Error").to_owned(),
            status: status.as_u16(),
            detail: detail.into(),
        }
    }

    /// The answer: this status, `Content-Type: application/problem+json`, this body.
    pub fn response(&self) -> Response {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        problem_response(status, self)
    }
}

/// `body` (a problem, perhaps with extension fields) as a problem+json answer.
pub(crate) fn problem_response<T: Serialize>(status: StatusCode, body: &T) -> Response {
    let bytes = serde_json::to_vec(body).unwrap_or_else(|_| {
        format!(r#"{{"type":"about:blank","status":{}}}"#, status.as_u16()).into_bytes()
    });
    let mut response = (status, bytes).into_response();
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
    response
}

/// Why a request failed.
#[derive(Debug)]
#[non_exhaustive]
pub enum AppError {
    /// No such thing (404).
    NotFound(String),
    /// The request conflicts with the shop's state: sale window, stock, one order per user, a
    /// cart that changed while it was being checked out (409).
    Conflict(String),
    /// A fenced write was refused: a newer holder of the lock has been at the row (409).
    Stale(String),
    /// The request is malformed or out of bounds (400).
    BadRequest(String),
    /// The request is well-formed but can't be applied: a cart line beyond its bound (422).
    Unprocessable(String),
    /// A request the router or an extractor refused, with its status (404, 405, 413, 415, …).
    Rejected(StatusCode, String),
    /// The lock could not be taken: answered as dlock-core renders it (409 with `Retry-After`
    /// when busy, 503 when Redis is unreachable).
    Lock(LockError),
    /// The database failed: logged with its cause, answered without it — 503 with
    /// `Retry-After` when it is down or busy ([`crate::db::unavailable`]), else 500.
    Db(sqlx::Error),
    /// Anything else that must not happen: logged, answered 500.
    Internal(String),
}

impl std::fmt::Display for AppError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AppError::NotFound(m)
            | AppError::Conflict(m)
            | AppError::Stale(m)
            | AppError::BadRequest(m)
            | AppError::Unprocessable(m)
            | AppError::Rejected(_, m) => f.write_str(m),
            AppError::Lock(err) => write!(f, "lock: {err}"),
            AppError::Db(err) => write!(f, "database: {err}"),
            AppError::Internal(m) => write!(f, "internal: {m}"),
        }
    }
}

impl std::error::Error for AppError {}

impl From<LockError> for AppError {
    fn from(err: LockError) -> Self {
        AppError::Lock(err)
    }
}

impl From<sqlx::Error> for AppError {
    fn from(err: sqlx::Error) -> Self {
        AppError::Db(err)
    }
}

impl AppError {
    /// The status this error is answered with.
    pub fn status(&self) -> StatusCode {
        match self {
            AppError::NotFound(_) => StatusCode::NOT_FOUND,
            AppError::Conflict(_) | AppError::Stale(_) => StatusCode::CONFLICT,
            AppError::BadRequest(_) => StatusCode::BAD_REQUEST,
            AppError::Unprocessable(_) => StatusCode::UNPROCESSABLE_ENTITY,
            AppError::Rejected(status, _) => *status,
            AppError::Lock(err) => dlock_core::ErrorResponses::new().status_of(err),
            AppError::Db(err) if crate::db::unavailable(err) => StatusCode::SERVICE_UNAVAILABLE,
            AppError::Db(_) | AppError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

/// The detail of a 503 when the database is down or too busy.
pub const DATABASE_UNAVAILABLE: &str =
    "the shop's database is unavailable right now; nothing was bought, please try again shortly";

/// The answer while the database is down or too busy: 503 problem+json, `Retry-After: 1`.
pub(crate) fn database_unavailable() -> Response {
    let mut response =
        Problem::new(StatusCode::SERVICE_UNAVAILABLE, DATABASE_UNAVAILABLE).response();
    response
        .headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    response
}

/// The detail of every 500: the cause is in the log, under the request id.
pub const INTERNAL_DETAIL: &str =
    "something went wrong on our side; nothing was bought (the request id is in the log)";

impl IntoResponse for AppError {
    fn into_response(self) -> Response {
        let status = self.status();
        let detail = match self {
            AppError::NotFound(m)
            | AppError::Conflict(m)
            | AppError::Stale(m)
            | AppError::BadRequest(m)
            | AppError::Unprocessable(m)
            | AppError::Rejected(_, m) => m,
            AppError::Lock(err) => {
                // dlock-core's own rendering (and its log line), as the layer answers.
                if err.is_backend() {
                    tracing::warn!(error = %err, "lock service unavailable");
                } else if err.is_busy() {
                    tracing::info!(lock = %err, "lock busy");
                }
                return err.into_response();
            }
            AppError::Db(err) if crate::db::unavailable(&err) => {
                tracing::error!(error = %err, "database unavailable");
                return database_unavailable();
            }
            AppError::Db(err) => {
                tracing::error!(error = %err, "database error");
                INTERNAL_DETAIL.to_owned()
            }
            AppError::Internal(cause) => {
                tracing::error!(%cause, "internal error");
                INTERNAL_DETAIL.to_owned()
            }
        };
        let mut response = Problem::new(status, detail).response();
        if status == StatusCode::REQUEST_TIMEOUT {
            // The rest of the body is not read: the connection can't carry another request.
            response
                .headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        response
    }
}
