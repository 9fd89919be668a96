//! `HeldLocks`: what a handler learns about the locks held for its request.

use std::fmt;

use dlock_core::{FencingToken, HeldLock, LockError};

/// The locks held for this request, in request extensions (and, with the `axum` feature, an
/// extractor): hand the fencing token to the resource the handler writes.
///
/// It is there only when a layer took a lock: a route whose key function returned no key (`None`,
/// or an empty `Vec`) sees no `HeldLocks`, so take `Option<HeldLocks>` there.
///
/// Under stacked layers it lists the outer layer's locks first, then the inner layer's (a name
/// both took, the inner one re-entering the outer hold, is listed once).
///
/// The fencing tokens are the holds' own, as `dlock_core::LockGuard::fencing_token` gives them:
/// a plain lock's first ask, from here or from the guards of the same hold, asks Redis for it
/// (one round trip), and every later ask gets the same token without one. An ask fails with
/// [`LockError::Lost`] if Redis no longer has the hold and with [`LockError::Backend`] if Redis
/// can't be asked; either way the handler must not go on with the lock's authority.
///
/// ```
/// use axum::{Router, extract::Path, routing::post};
/// use dlock_core::LockError;
/// use dlock_tower::{HeldLocks, LockLayer};
///
/// async fn pay(Path(id): Path<u64>, held: HeldLocks) -> Result<String, LockError> {
///     // `UPDATE invoices SET paid = true, fence = $token WHERE id = $id AND fence < $token`
///     // (a lost lock answers 503, as the layer does, and nothing is written)
///     let token = held.fencing_token().await?.get();
///     Ok(format!("invoice {id} paid under token {token}"))
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
///
/// It is a view of the holds and neither holds nor releases anything: the locks are released
/// when the response is produced (or its body sent), whatever becomes of a clone kept longer.
#[derive(Clone, Default)]
#[non_exhaustive]
pub struct HeldLocks {
    /// The holds' names, in the same order as `locks`.
    names: Vec<String>,
    locks: Vec<HeldLock>,
}

impl fmt::Debug for HeldLocks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let minted: Vec<Option<FencingToken>> = self
            .locks
            .iter()
            .map(HeldLock::minted_fencing_token)
            .collect();
        f.debug_struct("HeldLocks")
            .field("names", &self.names)
            .field("minted_fencing_tokens", &minted)
            .finish()
    }
}

impl HeldLocks {
    /// The holds, in acquisition order.
    pub(crate) fn new(locks: Vec<HeldLock>) -> Self {
        let names = locks.iter().map(|lock| lock.name().to_string()).collect();
        Self { names, locks }
    }

    /// These locks, then those of `inner` whose names are not among them already: an inner
    /// layer that locked a name the outer one holds re-entered the outer hold.
    pub(crate) fn followed_by(mut self, inner: HeldLocks) -> Self {
        for (name, lock) in inner.names.into_iter().zip(inner.locks) {
            if !self.names.contains(&name) {
                self.names.push(name);
                self.locks.push(lock);
            }
        }
        self
    }

    /// The names held, in acquisition order.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// Their fencing tokens, in the same order as [`names`](HeldLocks::names).
    ///
    /// Fails as soon as one of them can't be had (see [`HeldLocks`]): the lock is lost, or Redis
    /// can't be asked.
    pub async fn fencing_tokens(&self) -> Result<Vec<FencingToken>, LockError> {
        let mut tokens = Vec::with_capacity(self.locks.len());
        for lock in &self.locks {
            tokens.push(lock.fencing_token().await?);
        }
        Ok(tokens)
    }

    /// The holds, in acquisition order, as [`HeldLock`] views: each one's name, fencing token
    /// (awaited, as from [`fencing_tokens`](HeldLocks::fencing_tokens)) and loss.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = &HeldLock> + '_ {
        self.locks.iter()
    }

    /// The fencing token of the first (for a single lock: the only) lock; under stacked layers,
    /// the outer layer's first lock. With no lock held, a [`LockError::Config`].
    pub async fn fencing_token(&self) -> Result<FencingToken, LockError> {
        match self.locks.first() {
            Some(lock) => lock.fencing_token().await,
            None => Err(LockError::Config("this request holds no lock".to_owned())),
        }
    }

    /// The fencing token of the lock called `name`; a [`LockError::Config`] if this request
    /// does not hold it.
    pub async fn fencing_token_of(&self, name: &str) -> Result<FencingToken, LockError> {
        let index = self.names.iter().position(|n| n == name);
        match index.and_then(|i| self.locks.get(i)) {
            Some(lock) => lock.fencing_token().await,
            None => Err(LockError::Config(format!(
                "this request does not hold a lock called {name:?}"
            ))),
        }
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
    use dlock_core::{LockGuard, LockScope, Locker};

    use super::*;

    async fn lock(locker: &Locker, name: &str) -> LockGuard {
        locker
            .lock(name)
            .await
            .unwrap_or_else(|e| panic!("lock {name}: {e}"))
    }

    /// Takes and releases `name` `times` times: each name's tokens count up on their own, so
    /// this tells its tokens from another name's.
    async fn advance(locker: &Locker, name: &str, times: usize) {
        for _ in 0..times {
            assert!(lock(locker, name).await.release().await.is_released());
        }
    }

    async fn token(guard: &LockGuard) -> FencingToken {
        guard
            .fencing_token()
            .await
            .unwrap_or_else(|e| panic!("token of {}: {e}", guard.name()))
    }

    #[tokio::test]
    async fn accessors_pair_names_with_their_tokens() {
        let locker = Locker::memory();
        advance(&locker, "sku:2", 3).await;
        let (one, two) = (lock(&locker, "sku:1").await, lock(&locker, "sku:2").await);
        let (t1, t2) = (token(&one).await, token(&two).await);
        assert_ne!(t1, t2);

        let held = HeldLocks::new(vec![one.held_lock(), two.held_lock()]);
        assert_eq!(held.names(), ["sku:1", "sku:2"]);
        assert_eq!(held.fencing_tokens().await.ok(), Some(vec![t1, t2]));
        assert_eq!(
            held.iter()
                .map(|lock| (lock.name().to_string(), lock.minted_fencing_token()))
                .collect::<Vec<_>>(),
            [
                ("sku:1".to_owned(), Some(t1)),
                ("sku:2".to_owned(), Some(t2))
            ]
        );
        assert_eq!(held.fencing_token().await.ok(), Some(t1));
        assert_eq!(held.fencing_token_of("sku:2").await.ok(), Some(t2));
        assert!(
            held.fencing_token_of("sku:3")
                .await
                .is_err_and(|e| e.is_config())
        );
        assert!(format!("{held:?}").contains("sku:2"));

        let none = HeldLocks::default();
        assert!(none.names().is_empty());
        assert!(none.fencing_token().await.is_err_and(|e| e.is_config()));
        assert_eq!(none.fencing_tokens().await.ok(), Some(Vec::new()));
        assert_eq!(none.iter().len(), 0);
    }

    #[tokio::test]
    async fn an_outer_layers_locks_come_first_and_a_re_entered_one_once() {
        let locker = Locker::memory();
        advance(&locker, "order:2", 2).await;
        let scope = LockScope::new();
        scope
            .run(async {
                let tenant = lock(&locker, "tenant:1").await;
                let again = lock(&locker, "tenant:1").await;
                assert!(again.is_reentrant());
                let order = lock(&locker, "order:2").await;
                let (tenant_token, order_token) = (token(&tenant).await, token(&order).await);
                assert_eq!(token(&again).await, tenant_token);
                assert_ne!(order_token, tenant_token);

                let outer = HeldLocks::new(vec![tenant.held_lock()]);
                let inner = HeldLocks::new(vec![again.held_lock(), order.held_lock()]);
                let held = outer.followed_by(inner);
                assert_eq!(held.names(), ["tenant:1", "order:2"]);
                assert_eq!(
                    held.fencing_tokens().await.ok(),
                    Some(vec![tenant_token, order_token])
                );
                assert_eq!(
                    held.fencing_token_of("order:2").await.ok(),
                    Some(order_token)
                );

                // Under an outer layer that locked nothing of its own, the inner layer's locks.
                let only_inner =
                    HeldLocks::default().followed_by(HeldLocks::new(vec![order.held_lock()]));
                assert_eq!(only_inner.names(), ["order:2"]);
                assert_eq!(only_inner.fencing_token().await.ok(), Some(order_token));
            })
            .await;
    }
}
