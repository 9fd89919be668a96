//! Lock errors as HTTP answers: one rendering, shared by `LockError`'s `IntoResponse` (feature
//! `axum`) and dlock-tower's `LockLayer`, so that a `#[distributed_lock]` handler and a layered
//! route answer the same situation alike.

use std::fmt::Write as _;
use std::time::Duration;

use http::{HeaderValue, StatusCode, header};

use crate::error::LockError;

/// How lock errors are answered over HTTP: an `application/problem+json` body
/// ([RFC 9457](https://www.rfc-editor.org/rfc/rfc9457)) under a status chosen per situation.
///
/// | error | default status | also |
/// | --- | --- | --- |
/// | busy ([`LockError::Busy`]) | 409 ([`busy_status`](Self::busy_status)) | `Retry-After`: [`LockError::retry_after`] in whole seconds, rounded up, from 1 to [`max_retry_after`](Self::max_retry_after) (default 2) |
/// | lost while held ([`LockError::Lost`]) | 503 ([`lost_status`](Self::lost_status)) | |
/// | Redis unreachable, timed out or failing ([`LockError::Backend`]) | 503 ([`unavailable_status`](Self::unavailable_status)) | |
/// | a [`MasterSet`](crate::MasterSet) short of grants ([`LockError::Masters`]) | 409 when rivals held it, 503 when masters failed | `Retry-After: 1` when busy |
/// | invalid name ([`LockError::InvalidName`]) | 400 ([`invalid_name_status`](Self::invalid_name_status)) | |
/// | anything else (a [`LockError::Config`]) | 500 | |
///
/// The body has the fields `type` (`about:blank`), `title` (the status's reason phrase),
/// `status`, `detail` (a fixed sentence, or the reason a name is invalid) and, for a busy or lost
/// lock whose name is shown on purpose ([`hide_names(false)`](Self::hide_names)), `lock`: its
/// name. Names are left out by default: they often carry user data (`order:<user id>`), and a
/// client rarely needs them. Nothing from the backend's
/// error (hosts, ports, Redis replies) or a configuration error reaches the body: log the error
/// where you have it.
///
/// An unavailable backend gets no `Retry-After`: nothing says when Redis will be back, and a
/// made-up number would only pace clients in step; they keep their own backoff.
///
/// `LockError`'s `IntoResponse` (feature `axum`) answers with [`ErrorResponses::new`], as
/// dlock-tower's `LockLayer` does by default. With other statuses on the layer, answer the
/// handlers' errors with the same value:
///
/// ```
/// use dlock_core::{ErrorResponses, LockError};
/// use http::StatusCode;
///
/// /// The answers of every lock in this service: `LockLayer::error_responses(LOCK_ERRORS)` on
/// /// the layers, `LOCK_ERRORS.to_response(&err)` for the handlers' errors.
/// const LOCK_ERRORS: ErrorResponses =
///     ErrorResponses::new().busy_status(StatusCode::LOCKED);
///
/// let busy = LockError::Busy {
///     name: "order:7".into(),
///     waited: std::time::Duration::ZERO,
///     retry_after: Some(std::time::Duration::from_millis(1_300)),
/// };
/// let response = LOCK_ERRORS.to_response(&busy);
/// assert_eq!(response.status(), StatusCode::LOCKED);
/// assert_eq!(response.headers()["retry-after"], "2");
/// assert_eq!(response.headers()["content-type"], "application/problem+json");
/// assert!(!response.body().contains("order:7"));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ErrorResponses {
    busy: StatusCode,
    lost: StatusCode,
    unavailable: StatusCode,
    invalid_name: StatusCode,
    hide_names: bool,
    max_retry_after: Duration,
}

/// The longest `Retry-After` a busy answer gives by default.
pub const DEFAULT_MAX_RETRY_AFTER: Duration = Duration::from_secs(2);

impl Default for ErrorResponses {
    fn default() -> Self {
        Self::new()
    }
}

impl ErrorResponses {
    /// The default answers: 409, 503, 503, 400, 500, names left out, `Retry-After` at most
    /// 2 s.
    pub const fn new() -> Self {
        Self {
            busy: StatusCode::CONFLICT,
            lost: StatusCode::SERVICE_UNAVAILABLE,
            unavailable: StatusCode::SERVICE_UNAVAILABLE,
            invalid_name: StatusCode::BAD_REQUEST,
            hide_names: true,
            max_retry_after: DEFAULT_MAX_RETRY_AFTER,
        }
    }

    /// The status for a busy lock (default 409 Conflict; 423, 429 and 503 are common choices).
    pub const fn busy_status(mut self, status: StatusCode) -> Self {
        self.busy = status;
        self
    }

    /// The status for a lock lost while it was held (default 503).
    pub const fn lost_status(mut self, status: StatusCode) -> Self {
        self.lost = status;
        self
    }

    /// The status when Redis can't be reached, doesn't answer in time, or fails (default 503).
    pub const fn unavailable_status(mut self, status: StatusCode) -> Self {
        self.unavailable = status;
        self
    }

    /// The status for a name that is not a valid lock name: too long, control characters,
    /// `{` or `}` in literal text (default 400).
    pub const fn invalid_name_status(mut self, status: StatusCode) -> Self {
        self.invalid_name = status;
        self
    }

    /// Whether lock names stay out of bodies (default `true`: they often hold user data).
    /// `false` shows a busy or lost lock's name as the body's `lock` field.
    pub const fn hide_names(mut self, hide: bool) -> Self {
        self.hide_names = hide;
        self
    }

    /// The longest `Retry-After` a busy answer gives (default 2 s; whole seconds, at least 1).
    /// A busy lock's [`retry_after`](LockError::retry_after) is the holder's remaining lease,
    /// or the `Locker`'s usual hold time when shorter; a `Locker` that holds nothing itself
    /// knows only the first, which under a watchdog lease is up to its whole length.
    pub const fn max_retry_after(mut self, max: Duration) -> Self {
        self.max_retry_after = max;
        self
    }

    /// How long a client told the lock is busy should wait before it retries: `retry_after`
    /// (1 s when unknown) at most [`max_retry_after`](Self::max_retry_after), at least 1 ms.
    pub fn retry_delay(&self, retry_after: Option<Duration>) -> Duration {
        retry_after
            .unwrap_or(Duration::from_secs(1))
            .min(self.max_retry_after)
            .max(Duration::from_millis(1))
    }

    /// [`retry_delay`](Self::retry_delay) in whole seconds, rounded up: the `Retry-After`
    /// header's value.
    pub fn retry_after_secs(&self, retry_after: Option<Duration>) -> u64 {
        let millis = self.retry_delay(retry_after).as_millis();
        u64::try_from(millis.div_ceil(1000))
            .unwrap_or(u64::MAX)
            .max(1)
    }

    /// Whether lock names are left out of bodies.
    pub const fn names_hidden(&self) -> bool {
        self.hide_names
    }

    /// The status `err` is answered with.
    pub fn status_of(&self, err: &LockError) -> StatusCode {
        match err {
            LockError::Busy { .. } | LockError::HeldInForeignLayout { .. } => self.busy,
            LockError::Lost { .. } => self.lost,
            LockError::Backend(_) => self.unavailable,
            LockError::InvalidName(_) => self.invalid_name,
            LockError::Masters(m) if m.is_busy() => self.busy,
            LockError::Masters(_) => self.unavailable,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The answer to `err`: status, `Content-Type: application/problem+json`, `Retry-After` for
    /// a busy lock, and the problem body.
    pub fn to_response(&self, err: &LockError) -> http::Response<String> {
        let status = self.status_of(err);
        let (detail, name) = match err {
            LockError::Busy { name, .. } | LockError::HeldInForeignLayout { name, .. } => (
                "another request holds this lock; retry later".to_owned(),
                Some(name.as_str()),
            ),
            LockError::Lost { name, .. } => (
                "the lock was lost while the request ran; the request was cancelled".to_owned(),
                Some(name.as_str()),
            ),
            // The backend's error stays out: it can name hosts and ports.
            LockError::Backend(_) => (
                "the lock service could not be reached; retry later".to_owned(),
                None,
            ),
            LockError::Masters(m) if m.is_busy() => (
                "another request holds this lock; retry later".to_owned(),
                Some(m.name()),
            ),
            LockError::Masters(_) => (
                "too few lock servers could be reached; retry later".to_owned(),
                None,
            ),
            // Says why (length, a control character's offset), never the name itself.
            LockError::InvalidName(invalid) => (format!("invalid lock name: {invalid}"), None),
            _ => ("the lock could not be taken".to_owned(), None),
        };
        // RFC 9457: with the `about:blank` type, the title is the status's reason phrase.
        let title = status.canonical_reason().unwrap_or("Error");
        let mut body = String::with_capacity(160);
        body.push_str("{\"type\":\"about:blank\",\"title\":");
        json_string(&mut body, title);
        let _ = write!(body, ",\"status\":{}", status.as_u16());
        body.push_str(",\"detail\":");
        json_string(&mut body, &detail);
        if let (Some(name), false) = (name, self.hide_names) {
            body.push_str(",\"lock\":");
            json_string(&mut body, name);
        }
        body.push('}');
        let mut response = http::Response::new(body);
        *response.status_mut() = status;
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        let busy_retry = match err {
            LockError::Busy { retry_after, .. } => Some(*retry_after),
            LockError::HeldInForeignLayout { .. } | LockError::Masters(_) if err.is_busy() => {
                Some(None)
            }
            _ => None,
        };
        if let Some(retry_after) = busy_retry {
            let secs = self.retry_after_secs(retry_after);
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

#[cfg(feature = "axum")]
#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
impl axum_core::response::IntoResponse for LockError {
    /// Answers as [`ErrorResponses::new`] does: 409 with `Retry-After` for a busy lock, 503 for
    /// a lost lock or an unavailable backend, 400 for an invalid name, 500 otherwise; a
    /// problem+json body without the backend's error. The error is logged (`tracing`, `WARN`
    /// for a backend failure, a loss or a configuration error, `DEBUG` otherwise) without the
    /// lock's name, which may be one the application hides.
    ///
    /// ```
    /// use axum::{Router, extract::Path, routing::post};
    /// use dlock_core::{LockError, distributed_lock};
    ///
    /// // Busy after 3 s: 409 with `Retry-After`, as a `LockLayer` route would answer.
    /// #[distributed_lock(key = "order:<id>", wait = "3s")]
    /// async fn place_order(Path(id): Path<u64>) -> Result<String, LockError> {
    ///     Ok(format!("order {id} placed"))
    /// }
    ///
    /// let app: Router = Router::new().route("/orders/{id}", post(place_order));
    /// # let _ = app;
    /// ```
    fn into_response(self) -> axum_core::response::Response {
        // No lock name here: the error can't say whether its name was hidden.
        match &self {
            LockError::Backend(err) => {
                tracing::warn!(error = %err, "dlock: lock service unavailable, answered over HTTP");
            }
            LockError::Lost { fencing_token, .. } => {
                tracing::warn!(
                    fencing_token = fencing_token.map(|t| t.get()),
                    "dlock: lock lost, answered over HTTP"
                );
            }
            LockError::Busy { .. } => {
                tracing::debug!("dlock: lock busy, answered over HTTP");
            }
            LockError::HeldInForeignLayout { .. } => {
                tracing::debug!("dlock: lock held in a foreign key layout, answered over HTTP");
            }
            LockError::Masters(m) if m.is_busy() => {
                tracing::debug!("dlock: lock busy on its masters, answered over HTTP");
            }
            LockError::Masters(m) => {
                tracing::warn!(
                    granted = ?m.granted(),
                    busy = ?m.busy(),
                    failed = ?m.failed(),
                    "dlock: too few lock masters, answered over HTTP"
                );
            }
            LockError::InvalidName(invalid) => {
                tracing::debug!(reason = %invalid, "dlock: invalid lock name, answered over HTTP");
            }
            _ => tracing::warn!(error = %self, "dlock: lock error answered over HTTP"),
        }
        ErrorResponses::new()
            .to_response(&self)
            .map(axum_core::body::Body::from)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::error::{BackendError, InvalidName};
    use crate::error::{MasterOutcome, MastersError};
    use crate::fencing::FencingToken;

    fn busy(retry_after: Option<Duration>) -> LockError {
        LockError::Busy {
            name: "order:\"7\"".into(),
            waited: Duration::from_secs(3),
            retry_after,
        }
    }

    fn retry_after(err: &LockError) -> Option<String> {
        let response = ErrorResponses::new().to_response(err);
        let value = response.headers().get(header::RETRY_AFTER)?;
        Some(value.to_str().map(str::to_owned).unwrap_or_default())
    }

    #[test]
    fn retry_after_rounds_up_to_whole_seconds_and_is_capped() {
        let secs = |ms| retry_after(&busy(Some(Duration::from_millis(ms))));
        assert_eq!(secs(1).as_deref(), Some("1"));
        assert_eq!(secs(1000).as_deref(), Some("1"));
        assert_eq!(secs(1001).as_deref(), Some("2"));
        // A holder's 30 s watchdog lease is no reason to keep a client away for 30 s.
        assert_eq!(secs(29_500).as_deref(), Some("2"));
        assert_eq!(retry_after(&busy(None)).as_deref(), Some("1"));
        assert_eq!(
            retry_after(&busy(Some(Duration::MAX))).as_deref(),
            Some("2")
        );
        let longer = ErrorResponses::new().max_retry_after(Duration::from_secs(60));
        assert_eq!(
            longer.retry_after_secs(Some(Duration::from_millis(29_500))),
            30
        );
        assert_eq!(
            longer.retry_delay(Some(Duration::from_micros(10))),
            Duration::from_millis(1)
        );
    }

    #[test]
    fn a_busy_lock_is_a_conflict_that_names_the_lock_only_when_asked() {
        let hidden = ErrorResponses::new().to_response(&busy(Some(Duration::from_millis(1500))));
        assert_eq!(
            hidden.body(),
            "{\"type\":\"about:blank\",\"title\":\"Conflict\",\"status\":409,\
             \"detail\":\"another request holds this lock; retry later\"}"
        );
        let response = ErrorResponses::new()
            .hide_names(false)
            .to_response(&busy(Some(Duration::from_millis(1500))));
        assert_eq!(response.status(), StatusCode::CONFLICT);
        assert_eq!(
            response.headers()[header::CONTENT_TYPE],
            "application/problem+json"
        );
        assert_eq!(response.headers()[header::RETRY_AFTER], "2");
        assert_eq!(
            response.body(),
            "{\"type\":\"about:blank\",\"title\":\"Conflict\",\"status\":409,\
             \"detail\":\"another request holds this lock; retry later\",\"lock\":\"order:\\\"7\\\"\"}"
        );
    }

    #[test]
    fn statuses_and_hidden_names_follow_the_options() {
        let options = ErrorResponses::new()
            .busy_status(StatusCode::LOCKED)
            .lost_status(StatusCode::GONE)
            .unavailable_status(StatusCode::BAD_GATEWAY)
            .invalid_name_status(StatusCode::UNPROCESSABLE_ENTITY)
            .hide_names(true);
        assert!(options.names_hidden());
        let lost = LockError::Lost {
            name: "secret-user-42".into(),
            fencing_token: Some(FencingToken::new(9)),
        };
        let cases = [
            (busy(None), StatusCode::LOCKED),
            (lost, StatusCode::GONE),
            (
                LockError::Backend(BackendError::timeout(Duration::from_millis(5))),
                StatusCode::BAD_GATEWAY,
            ),
            (
                LockError::InvalidName(InvalidName::TooLong { len: 600, max: 512 }),
                StatusCode::UNPROCESSABLE_ENTITY,
            ),
            (
                LockError::Config("lease under 10ms".into()),
                StatusCode::INTERNAL_SERVER_ERROR,
            ),
            (
                LockError::Masters(Box::new(MastersError::new(
                    "secret-user-42".to_owned(),
                    2,
                    vec![MasterOutcome::Busy, MasterOutcome::Busy],
                ))),
                StatusCode::LOCKED,
            ),
            (
                LockError::Masters(Box::new(MastersError::new(
                    "secret-user-42".to_owned(),
                    2,
                    vec![
                        MasterOutcome::Granted,
                        MasterOutcome::Failed(LockError::Backend(BackendError::timeout(
                            Duration::from_millis(5),
                        ))),
                    ],
                ))),
                StatusCode::BAD_GATEWAY,
            ),
        ];
        for (err, status) in cases {
            let response = options.to_response(&err);
            assert_eq!(response.status(), status, "{err}");
            let body = response.body();
            assert!(
                body.contains(&format!("\"status\":{}", status.as_u16())),
                "{body}"
            );
            assert!(!body.contains("\"lock\""), "{body}");
            assert!(
                !body.contains("secret") && !body.contains("order:"),
                "{body}"
            );
            assert_eq!(
                response.headers().contains_key(header::RETRY_AFTER),
                err.is_busy(),
                "{err}"
            );
        }
    }

    #[test]
    fn internal_messages_stay_out_of_the_body() {
        let options = ErrorResponses::new();
        let backend = LockError::Backend(BackendError::pool("connect to 10.1.2.3:6379 refused"));
        let body = options.to_response(&backend).into_body();
        assert!(
            !body.contains("10.1.2.3") && !body.contains("refused"),
            "{body}"
        );
        let config = LockError::Config("no default Locker is installed".into());
        let response = options.to_response(&config);
        assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
        assert!(!response.body().contains("Locker"), "{}", response.body());
        let invalid = LockError::InvalidName(InvalidName::ControlCharacter { index: 3 });
        let response = options.to_response(&invalid);
        assert_eq!(response.status(), StatusCode::BAD_REQUEST);
        assert!(
            response
                .body()
                .contains("invalid lock name: control character at byte 3"),
            "{}",
            response.body()
        );
    }

    #[test]
    fn json_is_escaped() {
        let mut out = String::new();
        json_string(&mut out, "a\"b\\c\u{1}");
        assert_eq!(out, "\"a\\\"b\\\\c\\u0001\"");
    }
}
