//! A tower [`Layer`](tower_layer::Layer) that guards routes with dlock distributed locks, the lock
//! key derived from the request.
//!
//! ```no_run
//! use std::time::Duration;
//!
//! use axum::{Router, extract::Path, routing::post};
//! use dlock_tower::{HeldLocks, LockLayer};
//!
//! async fn place_order(Path(id): Path<u64>, held: HeldLocks) -> String {
//!     // Hand the fencing token to the database write.
//!     format!("order for voucher {id}, token {:?}", held.fencing_token())
//! }
//!
//! # async fn demo() -> Result<(), dlock_core::LockError> {
//! let locker = dlock_core::Locker::connect("redis://127.0.0.1:6379/").await?;
//! let app: Router = Router::new()
//!     .route("/vouchers/{id}/orders", post(place_order))
//!     .route_layer(
//!         LockLayer::new(locker.clone())
//!             .key(|Path(id): Path<u64>| async move { format!("voucher:{id}") })
//!             .wait(Duration::from_secs(3)),
//!     );
//! # let _ = app;
//! # Ok(())
//! # }
//! ```
//!
//! The same layer, run for real over the in-memory backend (a second request for a held key
//! is answered 409 with `Retry-After`):
//!
//! ```
//! use std::time::Duration;
//!
//! use axum::{Router, body::Body, extract::Path, http::{Request, StatusCode}, routing::get};
//! use dlock_tower::LockLayer;
//! use tower::ServiceExt as _;
//!
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! let locker = dlock_core::Locker::memory();
//! let app = Router::new()
//!     .route("/carts/{user}/checkout", get(|| async { "checked out" }))
//!     .route_layer(
//!         LockLayer::new(locker.clone())
//!             .key(|Path(user): Path<u64>| async move { format!("cart:{user}") }),
//!     );
//!
//! let held = locker.lock("cart:7").await.unwrap();
//! let request = || Request::get("/carts/7/checkout").body(Body::empty()).unwrap();
//! let busy = app.clone().oneshot(request()).await.unwrap();
//! assert_eq!(busy.status(), StatusCode::CONFLICT);
//! assert!(busy.headers().contains_key("retry-after"));
//!
//! assert!(held.release().await.is_released());
//! let ok = app.oneshot(request()).await.unwrap();
//! assert_eq!(ok.status(), StatusCode::OK);
//! # });
//! ```
//!
//! # Keys
//!
//! - [`LockLayer::key`] takes an `async` function of up to twelve axum extractors (anything that
//!   implements `FromRequestParts`: `Path`, `Query`, `HeaderMap`, `State`, your own auth
//!   extractor…); [`LockLayer::sync_key`] a plain one. For extractors that need the router
//!   state, build the layer with [`LockLayer::with_state`]. The body is never read.
//! - [`LockLayer::key_from_parts`] is the plain tower form: a function of the request head.
//!   [`KeyFrom`] has ready-made ones (a header, a path segment).
//!
//! A key function returns a name, an `Option` of one (`None`: this request takes no lock), or a
//! `Vec` of names, locked all-or-none.
//!
//! # Responses
//!
//! | situation | default answer |
//! | --- | --- |
//! | busy after the wait | 409 ([`LockLayer::with_status_code`]), `Retry-After` from the holder's remaining lease, `application/problem+json` naming the lock ([`LockLayer::hide_names`] leaves the name out) |
//! | key not derivable | the extractor's own rejection |
//! | invalid key (too long, control characters) | 400 |
//! | Redis unreachable or timed out | 503, within the `Locker`'s command timeout |
//! | lock lost while the handler runs | the handler is cancelled; 503 ([`LockLayer::lost_status_code`]) |
//!
//! [`LockLayer::on_rejection`] can replace any of the layer's own answers.
//!
//! # While the handler runs
//!
//! The lock is held in the response future and released as soon as the response is produced,
//! or when its body ends with [`LockLayer::hold_until_body_ends`]. The handler runs inside a
//! `dlock_core` lock scope that holds the lock, so a `#[distributed_lock]` function it calls
//! with the same key re-enters instead of deadlocking. [`HeldLocks`] (a request extension, and an
//! extractor) carries the names and fencing tokens.

mod body;
mod future;
mod key;
mod layer;
mod rejection;
mod service;

pub use body::{BoxError, LockBody};
pub use future::{Held, HeldLocks, ResponseFuture};
#[cfg(feature = "axum")]
pub use key::extract::{KeyFn, SyncKeyFn};
pub use key::{IntoLockKeys, KeyFrom, LockKeys};
pub use layer::LockLayer;
pub use rejection::LockRejection;
pub use service::Lock;

#[cfg(feature = "axum")]
impl<S: Send + Sync> axum_core::extract::FromRequestParts<S> for HeldLocks {
    type Rejection = (http::StatusCode, &'static str);

    async fn from_request_parts(
        parts: &mut http::request::Parts,
        _state: &S,
    ) -> Result<Self, Self::Rejection> {
        parts.extensions.get::<HeldLocks>().cloned().ok_or((
            http::StatusCode::INTERNAL_SERVER_ERROR,
            "no lock is held for this request: is LockLayer applied to this route?",
        ))
    }
}
