//! `HeldLocks`: what a handler learns about the locks held for its request.

use dlock_core::FencingToken;

/// The locks held for this request, in request extensions (and, with the `axum` feature, an
/// extractor): hand the fencing token to the resource the handler writes.
///
/// It is there only when the layer took a lock: a route whose key function returned no key sees
/// no `HeldLocks`, so take `Option<HeldLocks>` there.
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

    /// The fencing token of the first (for a single lock: the only) lock.
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
    type Rejection = (http::StatusCode, &'static str);

    async fn from_request_parts(
        parts: &mut http::request::Parts,
        _state: &S,
    ) -> Result<Self, Self::Rejection> {
        parts.extensions.get::<HeldLocks>().cloned().ok_or((
            http::StatusCode::INTERNAL_SERVER_ERROR,
            "no lock is held for this request: LockLayer is not applied to this route, or its \
             key function returned no key (take `Option<HeldLocks>` for that)",
        ))
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
}
