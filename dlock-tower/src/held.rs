//! `HeldLocks`: what a handler learns about the locks held for its request.

use dlock_core::FencingToken;

/// The locks held for this request, in request extensions (and, with the `axum` feature, an
/// extractor): hand the fencing token to the resource the handler writes.
///
/// It is there only when a layer took a lock: a route whose key function returned no key (`None`,
/// or an empty `Vec`) sees no `HeldLocks`, so take `Option<HeldLocks>` there.
///
/// Under stacked layers it lists the outer layer's locks first, then the inner layer's (a name
/// both took, the inner one re-entering the outer hold, is listed once).
///
/// ```
/// use axum::{Router, extract::Path, routing::post};
/// use dlock_tower::{HeldLocks, LockLayer};
///
/// async fn pay(Path(id): Path<u64>, held: HeldLocks) -> String {
///     // `UPDATE invoices SET paid = true, fence = $token WHERE id = $id AND fence < $token`
///     let token = held.fencing_token().map_or(0, |t| t.get());
///     format!("invoice {id} paid under token {token}")
/// }
///
/// let app: Router = Router::new()
///     .route("/invoices/{id}/pay", post(pay))
///     .route_layer(
///         LockLayer::new(dlock_core::Locker::memory())
///             .key(|Path(id): Path<u64>| async move { format!("invoice:{id}") }),
///     );
/// # let _ = app;
/// ```
///
/// A gRPC service behind the layer finds it in its request's extensions:
/// `request.extensions().get::<HeldLocks>()`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct HeldLocks {
    names: Vec<String>,
    fencing_tokens: Vec<FencingToken>,
}

impl HeldLocks {
    pub(crate) fn new(names: Vec<String>, fencing_tokens: Vec<FencingToken>) -> Self {
        Self {
            names,
            fencing_tokens,
        }
    }

    /// These locks, then those of `inner` that are not among them already.
    pub(crate) fn followed_by(mut self, inner: HeldLocks) -> Self {
        for (name, token) in inner.names.into_iter().zip(inner.fencing_tokens) {
            if self.fencing_token_of(&name) != Some(token) {
                self.names.push(name);
                self.fencing_tokens.push(token);
            }
        }
        self
    }

    /// The names held, in acquisition order.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// Their fencing tokens, in the same order as [`names`](HeldLocks::names).
    pub fn fencing_tokens(&self) -> &[FencingToken] {
        &self.fencing_tokens
    }

    /// Each name held with its fencing token, in acquisition order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = (&str, FencingToken)> + '_ {
        self.names
            .iter()
            .map(String::as_str)
            .zip(self.fencing_tokens.iter().copied())
    }

    /// The fencing token of the first (for a single lock: the only) lock; under stacked layers,
    /// the outer layer's first lock.
    pub fn fencing_token(&self) -> Option<FencingToken> {
        self.fencing_tokens.first().copied()
    }

    /// The fencing token of the lock called `name`, if this request holds it.
    pub fn fencing_token_of(&self, name: &str) -> Option<FencingToken> {
        let index = self.names.iter().position(|n| n == name)?;
        self.fencing_tokens.get(index).copied()
    }
}

#[cfg(feature = "axum")]
#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
impl<S: Send + Sync> axum_core::extract::FromRequestParts<S> for HeldLocks {
    type Rejection = NoHeldLocks;

    async fn from_request_parts(
        parts: &mut http::request::Parts,
        _state: &S,
    ) -> Result<Self, Self::Rejection> {
        parts
            .extensions
            .get::<HeldLocks>()
            .cloned()
            .ok_or(NoHeldLocks)
    }
}

/// The rejection of the [`HeldLocks`] extractor on a request that holds no lock: the route has
/// no `LockLayer`, or its key function returned no key (take `Option<HeldLocks>` there).
///
/// A mistake in the server, not in the request: it answers 500 with an
/// `application/problem+json` body that says nothing about the server's set-up, and logs the
/// cause at ERROR.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct NoHeldLocks;

impl std::fmt::Display for NoHeldLocks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(
            "no lock is held for this request: no LockLayer on this route, or its key function \
             returned no key",
        )
    }
}

impl std::error::Error for NoHeldLocks {}

#[cfg(feature = "axum")]
#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
impl axum_core::response::IntoResponse for NoHeldLocks {
    fn into_response(self) -> axum_core::response::Response {
        tracing::error!(cause = %self, "dlock-tower: a handler asked for HeldLocks");
        let body = "{\"type\":\"about:blank\",\"title\":\"Internal Server Error\",\"status\":500,\
                    \"detail\":\"the server could not handle this request\"}";
        let mut response = axum_core::response::Response::new(axum_core::body::Body::from(body));
        *response.status_mut() = http::StatusCode::INTERNAL_SERVER_ERROR;
        response.headers_mut().insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("application/problem+json"),
        );
        response
    }
}

#[cfg(feature = "axum")]
#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
impl<S: Send + Sync> axum_core::extract::OptionalFromRequestParts<S> for HeldLocks {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(
        parts: &mut http::request::Parts,
        _state: &S,
    ) -> Result<Option<Self>, Self::Rejection> {
        Ok(parts.extensions.get::<HeldLocks>().cloned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accessors_pair_names_with_their_tokens() {
        let held = HeldLocks::new(
            vec!["sku:1".into(), "sku:2".into()],
            vec![FencingToken::new(4), FencingToken::new(9)],
        );
        assert_eq!(held.names(), ["sku:1", "sku:2"]);
        assert_eq!(
            held.fencing_tokens(),
            [FencingToken::new(4), FencingToken::new(9)]
        );
        assert_eq!(
            held.iter().collect::<Vec<_>>(),
            [
                ("sku:1", FencingToken::new(4)),
                ("sku:2", FencingToken::new(9))
            ]
        );
        assert_eq!(held.fencing_token(), Some(FencingToken::new(4)));
        assert_eq!(held.fencing_token_of("sku:2"), Some(FencingToken::new(9)));
        assert_eq!(held.fencing_token_of("sku:3"), None);
        assert_eq!(HeldLocks::default().fencing_token(), None);
    }

    #[test]
    fn an_outer_layers_locks_come_first_and_a_re_entered_one_once() {
        let outer = HeldLocks::new(vec!["tenant:1".into()], vec![FencingToken::new(3)]);
        let inner = HeldLocks::new(
            vec!["tenant:1".into(), "order:2".into()],
            vec![FencingToken::new(3), FencingToken::new(8)],
        );
        let held = outer.followed_by(inner);
        assert_eq!(held.names(), ["tenant:1", "order:2"]);
        assert_eq!(
            held.fencing_tokens(),
            [FencingToken::new(3), FencingToken::new(8)]
        );
    }
}
