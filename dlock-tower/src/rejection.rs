//! What the layer answers when it can't (or can no longer) hold the lock.

use std::fmt::Write as _;
use std::time::Duration;

use dlock_core::{FencingToken, LockError};
use http::{HeaderValue, StatusCode, header};

use crate::body::LockBody;
use crate::layer::Config;

/// Why a request did not run (or stopped running) under its lock.
#[derive(Debug)]
#[non_exhaustive]
pub enum LockRejection {
    /// Another request held the lock until the wait ran out.
    Busy {
        /// The lock's name.
        name: String,
        /// The holder's remaining lease, if known.
        retry_after: Option<Duration>,
    },
    /// The key derived from the request is not a valid lock name (too long, control
    /// characters).
    InvalidKey(LockError),
    /// Redis could not be reached or timed out.
    Unavailable(LockError),
    /// The lock was lost while the handler ran; the handler was cancelled.
    Lost {
        /// The lock's name.
        name: String,
        /// The fencing token of the lost hold.
        fencing_token: FencingToken,
    },
    /// The lock could not be taken for another reason, such as a lease the core refuses (a
    /// fixed lease under 10 ms): a server-side problem, answered 500.
    Internal(LockError),
}

impl LockRejection {
    pub(crate) fn from_error(err: LockError) -> Self {
        match err {
            LockError::Timeout {
                name, retry_after, ..
            } => Self::Busy { name, retry_after },
            LockError::Lost {
                name,
                fencing_token,
            } => Self::Lost {
                name,
                fencing_token,
            },
            err if err.is_invalid_name() => Self::InvalidKey(err),
            err if err.is_backend() => Self::Unavailable(err),
            err => Self::Internal(err),
        }
    }

    /// A short word for logs and spans: `busy`, `invalid_key`, `unavailable`, `lost`,
    /// `internal`.
    pub fn outcome(&self) -> &'static str {
        match self {
            Self::Busy { .. } => "busy",
            Self::InvalidKey(_) => "invalid_key",
            Self::Unavailable(_) => "unavailable",
            Self::Lost { .. } => "lost",
            Self::Internal(_) => "internal",
        }
    }

    /// The lock's name, for a busy or lost lock.
    pub fn name(&self) -> Option<&str> {
        match self {
            Self::Busy { name, .. } | Self::Lost { name, .. } => Some(name),
            _ => None,
        }
    }

    /// The underlying error, for an invalid key, an unavailable backend or an internal failure.
    pub fn error(&self) -> Option<&LockError> {
        match self {
            Self::InvalidKey(err) | Self::Unavailable(err) | Self::Internal(err) => Some(err),
            _ => None,
        }
    }

    /// The `Retry-After` value in whole seconds (rounded up, at least 1), for a busy lock.
    pub fn retry_after_secs(&self) -> Option<u64> {
        match self {
            Self::Busy { retry_after, .. } => Some(
                retry_after
                    .map_or(1, |d| d.as_millis().div_ceil(1000))
                    .max(1)
                    .try_into()
                    .unwrap_or(u64::MAX),
            ),
            _ => None,
        }
    }

    /// The response: the error handler's, or the default one under `config`.
    pub(crate) fn into_response(self, config: &Config) -> http::Response<LockBody<()>> {
        if let Some(response) = config.handler.as_ref().and_then(|handler| handler(&self)) {
            return response;
        }
        let (status, detail, name) = match &self {
            Self::Busy { name, .. } => (
                config.busy_status,
                "another request holds this lock; retry later".to_owned(),
                Some(name.as_str()),
            ),
            Self::InvalidKey(err) => (config.invalid_status, err.to_string(), None),
            // The backend's error stays in the logs (and with the error handler): it can name
            // hosts and ports.
            Self::Unavailable(_) => (
                config.unavailable_status,
                "the lock service could not be reached; retry later".to_owned(),
                None,
            ),
            Self::Internal(_) => (
                StatusCode::INTERNAL_SERVER_ERROR,
                "the lock could not be taken".to_owned(),
                None,
            ),
            Self::Lost { name, .. } => (
                config.lost_status,
                "the lock was lost while the request ran; the request was cancelled".to_owned(),
                Some(name.as_str()),
            ),
        };
        // RFC 9457: with the `about:blank` type, the title is the status's reason phrase.
        let title = status.canonical_reason().unwrap_or("Error");
        let mut body = String::with_capacity(160);
        body.push_str("{\"type\":\"about:blank\",\"title\":");
        json_string(&mut body, title);
        let _ = write!(body, ",\"status\":{}", status.as_u16());
        body.push_str(",\"detail\":");
        json_string(&mut body, &detail);
        if let (Some(name), false) = (name, config.hide_names) {
            body.push_str(",\"lock\":");
            json_string(&mut body, name);
        }
        body.push('}');
        let mut response = http::Response::new(LockBody::full(body));
        *response.status_mut() = status;
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        if let Some(secs) = self.retry_after_secs() {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        response
    }
}

/// Appends `s` as a JSON string literal.
fn json_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// The default status for a busy lock.
pub(crate) const DEFAULT_BUSY_STATUS: StatusCode = StatusCode::CONFLICT;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_rounds_up() {
        let busy = |ms| LockRejection::Busy {
            name: "n".into(),
            retry_after: Some(Duration::from_millis(ms)),
        };
        assert_eq!(busy(1).retry_after_secs(), Some(1));
        assert_eq!(busy(1000).retry_after_secs(), Some(1));
        assert_eq!(busy(1001).retry_after_secs(), Some(2));
        assert_eq!(busy(29_500).retry_after_secs(), Some(30));
    }

    #[test]
    fn json_is_escaped() {
        let mut out = String::new();
        json_string(&mut out, "a\"b\\c\u{1}");
        assert_eq!(out, "\"a\\\"b\\\\c\\u0001\"");
    }
}
