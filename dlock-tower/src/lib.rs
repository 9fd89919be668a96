//! A tower [`Layer`](tower_layer::Layer) that guards routes with dlock distributed locks, the lock
//! key derived from the request.
//!
//! ```no_run
//! use std::time::Duration;
//!
//! use axum::{Router, extract::Path, routing::post};
//! use dlock_tower::{HeldLocks, LockLayer};
//!
//! async fn place_order(
//!     Path(id): Path<u64>,
//!     held: HeldLocks,
//! ) -> Result<String, dlock_core::LockError> {
//!     // Hand the fencing token to the database write (a lost lock answers 503).
//!     let token = held.fencing_token().await?;
//!     Ok(format!("order for voucher {id}, token {token:?}"))
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
//! # Feature flags
//!
//! - `axum` (default): key functions over axum extractors ([`LockLayer::key`],
//!   [`LockLayer::sync_key`]), [`LockLayer::from_state`], the [`HeldLocks`] extractor,
//!   `IntoResponse` for [`LockRejection`], and dlock-core's `axum` feature (`IntoResponse` for
//!   `LockError`). Without it, axum is not a dependency and keys come from the request head
//!   ([`LockLayer::key_from_parts`], [`LockLayer::key_from_request`], [`KeyFrom`]).
//!
//! The minimum supported Rust version is 1.88.
//!
//! # Keys
//!
//! - [`LockLayer::key`] takes an `async` function of up to twelve axum extractors (anything that
//!   implements `FromRequestParts`: `Path`, `Query`, `HeaderMap`, typed headers, `State`, your
//!   own auth extractor…); [`LockLayer::sync_key`] a plain one. The extractors run on the
//!   request head; the body is never read, and reaches the handler untouched.
//! - [`LockLayer::key_from_parts`] and [`LockLayer::key_from_request`] are the plain tower form:
//!   a function of the request head. [`KeyFrom`] has ready-made ones (a header, a path segment, a
//!   query parameter). They key on the text as sent: `/accounts/42` and `/accounts/042` take
//!   different locks, though a `Path<u64>` handler reads both as account 42. When the handler
//!   parses the value, build the key from the same parse, as the extractor form does with
//!   `.key(|Path(id): Path<u64>| async move { format!("account:{id}") })` (see
//!   [`KeyFrom`](KeyFrom#the-text-as-sent)).
//!
//! A layer is a `Layer` only once it has a key function: `LockLayer::new(locker)` alone would
//! lock nothing, so applying it is a compile error ("this `LockLayer` has no key function, so
//! it would lock nothing"), as [`NoKey`] and [`HasKey`] spell out.
//!
//! A key function returns a name (`String`, `&'static str`, [`LockName`](dlock_core::LockName)),
//! an `Option` of one (`None`: this request takes no lock), or a `Vec` of names, locked
//! all-or-none. An empty `Vec` names no lock and is the same as `None`: the handler runs
//! without a lock and without [`HeldLocks`], and the span's outcome is `unlocked`. A `String` is taken as trusted text; build names that embed user input with
//! [`LockName::builder`](dlock_core::LockName::builder), which escapes values.
//!
//! ## Router state
//!
//! `Router::route_layer` runs before `Router::with_state` hands the state to the routes, so a
//! layer whose extractors need the state is given it, as `axum::middleware::from_fn_with_state`
//! is: [`LockLayer::with_state`], or [`LockLayer::from_state`] when the state holds the
//! `Locker` (`Locker: FromRef<S>`). Extractors that work for any state (`Path`, `Query`,
//! `HeaderMap`, most auth extractors) need nothing: [`LockLayer::new`].
//!
//! ```
//! use std::time::Duration;
//!
//! use axum::{
//!     Router,
//!     body::Body,
//!     extract::{FromRequestParts, Path},
//!     http::{Request, StatusCode, request::Parts},
//!     routing::post,
//! };
//! use dlock_core::{LockName, Locker};
//! use dlock_tower::LockLayer;
//! use tower::ServiceExt as _;
//!
//! #[derive(Clone)]
//! struct AppState {
//!     locker: Locker,
//!     api_keys: Vec<(&'static str, u64)>,
//! }
//!
//! /// The caller, from its API key: an extractor that needs the state.
//! struct CurrentUser {
//!     id: u64,
//! }
//!
//! impl FromRequestParts<AppState> for CurrentUser {
//!     type Rejection = StatusCode;
//!
//!     async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, StatusCode> {
//!         let key = parts.headers.get("x-api-key").ok_or(StatusCode::UNAUTHORIZED)?;
//!         let (_, id) = state
//!             .api_keys
//!             .iter()
//!             .find(|(k, _)| k.as_bytes() == key.as_bytes())
//!             .ok_or(StatusCode::UNAUTHORIZED)?;
//!         Ok(CurrentUser { id: *id })
//!     }
//! }
//!
//! async fn place_order(Path(voucher): Path<u64>, user: CurrentUser) -> String {
//!     format!("user {} ordered voucher {voucher}", user.id)
//! }
//!
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! let state = AppState { locker: Locker::memory(), api_keys: vec![("k-7", 7)] };
//! let app = Router::new()
//!     .route("/vouchers/{id}/orders", post(place_order))
//!     .route_layer(
//!         LockLayer::with_state(state.locker.clone(), state.clone())
//!             .key(|Path(id): Path<u64>, user: CurrentUser| async move {
//!                 // One order at a time per user and voucher.
//!                 LockName::builder().literal("order:").value(user.id).literal(":").value(id).build()
//!             })
//!             .wait(Duration::from_secs(3)),
//!     )
//!     .with_state(state);
//!
//! let request = |key: &str| {
//!     Request::post("/vouchers/3/orders").header("x-api-key", key).body(Body::empty()).unwrap()
//! };
//! let response = app.clone().oneshot(request("k-7")).await.unwrap();
//! assert_eq!(response.status(), StatusCode::OK);
//! // The extractor's rejection, untouched: no key, no lock, no handler.
//! let response = app.oneshot(request("wrong")).await.unwrap();
//! assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
//! # });
//! ```
//!
//! ## `route_layer` or `layer`
//!
//! Prefer `Router::route_layer`: it runs after routing, so `Path` sees the route's parameters,
//! and unmatched paths answer 404 without touching Redis. Under `Router::layer` the key function
//! runs before routing; `Path` then fails (axum answers 500), and keys should come from the
//! head (headers, query, [`KeyFrom`]).
//!
//! # Responses
//!
//! | situation | default answer |
//! | --- | --- |
//! | busy after the wait | 409 ([`LockLayer::with_status_code`]), `Retry-After`: when the lock is likely free — the holder's remaining lease, or the `Locker`'s usual hold time when shorter — in whole seconds, rounded up, at most 2 ([`ErrorResponses::max_retry_after`](dlock_core::ErrorResponses::max_retry_after)); `application/problem+json`, without the lock's name unless shown on purpose ([`LockLayer::hide_names`]`(false)`) |
//! | key not derivable | the extractor's own rejection |
//! | invalid key (too long, control characters) | 400 ([`LockLayer::invalid_key_status_code`]) |
//! | Redis unreachable or timed out | 503 ([`LockLayer::unavailable_status_code`]); without a wait, within the `Locker`'s command timeout; with a [`LockLayer::wait`], the request keeps trying (Redis may be back in a moment) and answers within the wait plus one command timeout |
//! | lock lost while the handler runs | the handler is cancelled; 503 ([`LockLayer::lost_status_code`]) |
//! | the core refuses the request (a fixed lease under 10 ms) | 500 |
//!
//! The bodies are `application/problem+json` with `type`, `title`, `status`, `detail` and, for a
//! busy or lost lock, `lock`; the backend's error (hosts, ports, Redis replies) never reaches
//! them. An unavailable backend gets no `Retry-After`, since nothing says when it will be back.
//!
//! [`LockLayer::on_rejection`] can replace any of the layer's own answers; it sees a
//! [`LockRejection`], which is also an `IntoResponse` with the default answers.
//!
//! ## The same answers from handlers
//!
//! The layer's answers are rendered by `dlock_core::ErrorResponses`, and `LockError` is an
//! axum `IntoResponse` that uses it, so a `#[distributed_lock]` handler returning
//! `Result<_, LockError>`, or an application error that wraps one with `?` and answers it with
//! `err.into_response()`, answers exactly as a layered route does in the same situation. With
//! other statuses, give the layer and the application error one value:
//!
//! ```
//! use axum::{Router, extract::Path, http::StatusCode, response::{IntoResponse, Response}, routing::post};
//! use dlock_core::{ErrorResponses, LockError, distributed_lock};
//! use dlock_tower::LockLayer;
//!
//! const LOCK_ERRORS: ErrorResponses = ErrorResponses::new().busy_status(StatusCode::LOCKED);
//!
//! enum AppError {
//!     Lock(LockError),
//! }
//!
//! impl From<LockError> for AppError {
//!     fn from(err: LockError) -> Self {
//!         Self::Lock(err)
//!     }
//! }
//!
//! impl IntoResponse for AppError {
//!     fn into_response(self) -> Response {
//!         match self {
//!             Self::Lock(err) => LOCK_ERRORS.to_response(&err).into_response(),
//!         }
//!     }
//! }
//!
//! #[distributed_lock(key = "report:<id>", wait = "1s")]
//! async fn build_report(Path(id): Path<u64>) -> Result<String, AppError> {
//!     Ok(format!("report {id}"))
//! }
//!
//! let app: Router = Router::new()
//!     .route(
//!         "/exports/{id}",
//!         post(|Path(id): Path<u64>| async move { format!("export {id}") }),
//!     )
//!     // Busy exports and busy reports both answer 423.
//!     .route_layer(
//!         LockLayer::new(dlock_core::Locker::memory())
//!             .key(|Path(id): Path<u64>| async move { format!("export:{id}") })
//!             .error_responses(LOCK_ERRORS),
//!     )
//!     .route("/reports/{id}", post(build_report));
//! # let _ = app;
//! ```
//!
//! # gRPC
//!
//! A request whose content type is `application/grpc` (or `application/grpc+proto`,
//! `application/grpc-web`, …) is answered with a gRPC status instead: HTTP 200, trailers-only
//! (`grpc-status` and `grpc-message` in the headers, no body), so that a tonic service behind
//! the layer (`tonic::transport::Server::builder().layer(..)`) fails its calls the way clients
//! expect. No tonic dependency is involved.
//!
//! | situation | `grpc-status` |
//! | --- | --- |
//! | busy after the wait | `ABORTED` (10), with `grpc-retry-pushback-ms` (when to retry, as `Retry-After` above, in ms), `retry-after` (seconds) and a `google.rpc.RetryInfo` in `grpc-status-details-bin` |
//! | Redis unreachable or timed out | `UNAVAILABLE` (14) |
//! | lock lost while the call runs | `ABORTED` (10); the call is cancelled. Lost while a held stream is sent ([`LockLayer::hold_until_body_ends`]): the stream ends with `grpc-status: 10` and `grpc-message` in its trailers (in the body's trailer frame for gRPC-Web) |
//! | invalid key | `INVALID_ARGUMENT` (3) |
//! | anything else | `INTERNAL` (13) |
//!
//! `grpc-message` is one of the sentences of the HTTP answers' `detail`, percent-encoded, with
//! the lock's name for a busy or lost lock unless [`LockLayer::hide_names`]; never the
//! backend's error. [`LockLayer::on_rejection`] is not consulted for gRPC requests. The handler
//! finds [`HeldLocks`] in `request.extensions()`. Keys come from metadata (which are headers:
//! [`KeyFrom::header`], or `HeaderMap` in an extractor key function); the body is never read.
//!
//! # While the handler runs
//!
//! The lock is held in the response future and released as soon as the response is produced,
//! or, with [`LockLayer::hold_until_body_ends`], when its body has been sent (or dropped). The
//! release is handed to a background task so that it adds no round trip to the response; a
//! request that follows within that round trip may still find the lock held, which a small
//! [`LockLayer::wait`] absorbs.
//!
//! The handler runs inside a `dlock_core` lock scope that holds the lock, so a
//! `#[distributed_lock]` function it calls with the same key re-enters instead of deadlocking,
//! and `dlock_core::scope::fencing_token().await` answers there. [`HeldLocks`] (a request extension,
//! and an extractor) carries the names and gives the fencing tokens (`.await`ed: a plain lock's
//! token is minted by Redis at the first ask, from there or from the guard). With
//! [`LockLayer::hold_until_body_ends`], the body is produced inside the same scope: a stream
//! that does the guarded work sees the fencing token and re-enters the lock as the handler does.
//!
//! Layers stack: under an outer `LockLayer`, an inner layer's scope keeps the outer one's holds
//! (the handler re-enters the outer key too, and `dlock_core::scope::fencing_token().await` gives the
//! innermost lock's token), and [`HeldLocks`] lists the outer layer's locks, then the inner
//! layer's.
//!
//! If the lock is lost while the handler runs (its lease ran out without renewal, someone
//! deleted it), the handler's future is dropped at its next `.await` and the lost response is
//! returned. If it is lost while a held body is being sent, the body ends with an error and the
//! connection is cut rather than letting the rest go out unprotected; a gRPC response ends with
//! `ABORTED` trailers instead (see [gRPC](#grpc)).
//!
//! # Metrics
//!
//! Each request the layer decides on is counted in `dlock_layer_requests_total` under its
//! outcome, and a loss while the handler runs or the body is sent in `dlock_layer_lost_total`;
//! see [`metrics`]. dlock-core's metrics (`dlock_acquired_total`, `dlock_held`, ...) count the
//! locks themselves.
//!
//! # Tracing
//!
//! Each request runs in a `dlock.request` span (level INFO, [`LockLayer::span_level`]) with the
//! fields `keys`, `wait_ms` and `outcome` (`acquired`, `unlocked`, `key_rejected`, `busy`, `invalid_key`,
//! `unavailable`, `lost`, `internal`); the core's own `dlock.acquire` span nests inside it.
//! `unlocked` means the key named no lock (`None`, an empty `Vec`) and none was taken.
//!
//! A lock name stays out of these spans and of the layer's log lines (they show `<hidden>`)
//! when the layer's [`LockLayer::hide_names`] asks, when the `Locker` was built with
//! `LockerBuilder::hide_names(true)`, or when the name itself is
//! [`hidden`](dlock_core::LockName::hidden); the layer never shows a name that the `Locker` or
//! the name hides.

// The links to the extractor form go nowhere when it is compiled out.
#![cfg_attr(not(feature = "axum"), allow(rustdoc::broken_intra_doc_links))]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod body;
mod future;
mod grpc;
mod held;
mod key;
mod layer;
pub mod metrics;
mod rejection;
mod service;

pub use body::{BoxError, LockBody};
pub use future::ResponseFuture;
pub use held::{HeldLocks, NoHeldLocks};
#[cfg(feature = "axum")]
#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
pub use key::extract::{KeyFn, SyncKeyFn};
pub use key::{IntoLockKeys, KeyFrom, LockKeys};
pub use layer::{HasKey, LockLayer, NoKey, WithKey};
pub use rejection::LockRejection;
pub use service::Lock;
