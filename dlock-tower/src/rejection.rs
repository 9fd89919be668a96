//! What the layer answers when it can't (or can no longer) hold the lock.

use std::fmt;
use std::time::Duration;

use dlock_core::{ErrorResponses, FencingToken, LockError};

use crate::body::LockBody;
use crate::grpc::Grpc;
use crate::layer::Config;

/// Why a request did not run (or stopped running) under its lock.
///
/// The layer answers it as `dlock_core::ErrorResponses` renders the error (the layer's statuses
/// and [`hide_names`](crate::LockLayer::hide_names)), or as a gRPC status for a gRPC request.
/// With the `axum` feature it is also an `IntoResponse` with the default answers, for your own
/// [`on_rejection`](crate::LockLayer::on_rejection) handlers and extractors; `From<LockError>`
/// makes one from an error.
///
/// ```
/// use axum::{extract::FromRequestParts, http::request::Parts};
/// use dlock_core::{LockGuard, Locker};
/// use dlock_tower::LockRejection;
///
/// /// Holds the caller's account lock for as long as the handler keeps it.
/// struct AccountLock(LockGuard);
///
/// impl FromRequestParts<Locker> for AccountLock {
///     // Answers 409 + `Retry-After` when busy, 503 when Redis is down, and so on.
///     type Rejection = LockRejection;
///
///     async fn from_request_parts(parts: &mut Parts, locker: &Locker) -> Result<Self, LockRejection> {
///         let account = parts.headers.get("x-account").map(|v| v.as_bytes().to_vec());
///         let name = dlock_core::LockName::builder()
///             .literal("account:")
///             .value(String::from_utf8_lossy(&account.unwrap_or_default()))
///             .build()?;
///         Ok(AccountLock(locker.lock(name).await?))
///     }
/// }
/// ```
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
        /// The fencing token of the lost hold (`None`: it never asked for one).
        fencing_token: Option<FencingToken>,
    },
    /// The lock could not be taken for another reason, such as a lease the core refuses (a
    /// fixed lease under 10 ms): a server-side problem, answered 500.
    Internal(LockError),
}

impl From<LockError> for LockRejection {
    /// Busy, lost, an invalid name, an unavailable backend; anything else is
    /// [`Internal`](LockRejection::Internal).
    fn from(err: LockError) -> Self {
        match err {
            LockError::Busy {
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
}

impl fmt::Display for LockRejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Busy { name, .. } => write!(f, "lock `{name}` is busy"),
            Self::InvalidKey(_) => f.write_str("the request's lock key is not a valid lock name"),
            Self::Unavailable(_) => f.write_str("lock backend unavailable"),
            Self::Lost { name, .. } => write!(f, "lock `{name}` was lost while the request ran"),
            Self::Internal(_) => f.write_str("lock could not be taken"),
        }
    }
}

impl std::error::Error for LockRejection {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.error().map(|err| err as _)
    }
}

impl LockRejection {
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

    /// When to retry in whole seconds (rounded up, at least 1), for a busy lock, before the
    /// cap the answer applies ([`ErrorResponses::max_retry_after`]).
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

    /// The HTTP answer under `responses`: the error this rejection stands for, rendered by
    /// dlock-core, as a `#[distributed_lock]` handler's `LockError` is.
    pub(crate) fn render(&self, responses: &ErrorResponses) -> http::Response<String> {
        match self {
            Self::Busy { name, retry_after } => responses.to_response(&LockError::Busy {
                name: name.clone(),
                waited: Duration::ZERO,
                retry_after: *retry_after,
            }),
            Self::Lost {
                name,
                fencing_token,
            } => responses.to_response(&LockError::Lost {
                name: name.clone(),
                fencing_token: *fencing_token,
            }),
            Self::InvalidKey(err) | Self::Unavailable(err) | Self::Internal(err) => {
                responses.to_response(err)
            }
        }
    }

    /// The layer's answer: a gRPC status for a gRPC request; otherwise the error handler's
    /// answer, or the default one under `config`.
    pub(crate) fn respond(
        self,
        config: &Config,
        grpc: Option<Grpc>,
    ) -> http::Response<LockBody<()>> {
        if let Some(grpc) = grpc {
            return crate::grpc::response(&self, &config.responses, grpc);
        }
        if let Some(response) = config.handler.as_ref().and_then(|handler| handler(&self)) {
            return response;
        }
        self.render(&config.responses).map(LockBody::full)
    }
}

#[cfg(feature = "axum")]
#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
impl axum_core::response::IntoResponse for LockRejection {
    /// The layer's default answer (`dlock_core::ErrorResponses::new`): 409 with `Retry-After`,
    /// 400, 503 or 500 as problem+json. A layer's own statuses are not known here; to keep
    /// them in an [`on_rejection`](crate::LockLayer::on_rejection) handler, return `None` for
    /// the rejections it leaves alone.
    fn into_response(self) -> axum_core::response::Response {
        self.render(&ErrorResponses::new())
            .map(axum_core::body::Body::from)
    }
}

#[cfg(test)]
mod tests {
    use std::error::Error as _;

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
    fn messages_are_lower_case_without_a_period_and_sources_are_the_errors() {
        let rejections = [
            LockRejection::Busy {
                name: "a".into(),
                retry_after: None,
            },
            LockRejection::from(LockError::InvalidName(dlock_core::InvalidName::Empty)),
            LockRejection::Unavailable(LockError::Config("x".into())),
            LockRejection::Lost {
                name: "a".into(),
                fencing_token: Some(FencingToken::new(1)),
            },
            LockRejection::Internal(LockError::Config("x".into())),
        ];
        for rejection in &rejections {
            let message = rejection.to_string();
            assert!(!message.ends_with('.'), "{message}");
            assert!(message.starts_with(|c: char| c.is_lowercase()), "{message}");
            assert_eq!(
                rejection.source().is_some(),
                rejection.error().is_some(),
                "{message}"
            );
        }
        assert_eq!(rejections[0].to_string(), "lock `a` is busy");
        assert_eq!(rejections[1].outcome(), "invalid_key");
    }

    #[test]
    fn a_lost_error_keeps_its_token_or_its_absence() {
        for fencing_token in [Some(FencingToken::new(7)), None] {
            let rejection = LockRejection::from(LockError::Lost {
                name: "order:7".into(),
                fencing_token,
            });
            match &rejection {
                LockRejection::Lost {
                    name,
                    fencing_token: token,
                } => {
                    assert_eq!(name, "order:7");
                    assert_eq!(*token, fencing_token);
                }
                other => panic!("not a lost rejection: {other:?}"),
            }
            assert_eq!(rejection.outcome(), "lost");
            assert_eq!(
                rejection.to_string(),
                "lock `order:7` was lost while the request ran"
            );
            let response = rejection.render(&ErrorResponses::new());
            assert_eq!(
                response.status(),
                ErrorResponses::new()
                    .to_response(&LockError::Lost {
                        name: "order:7".into(),
                        fencing_token,
                    })
                    .status()
            );
        }
    }
}
