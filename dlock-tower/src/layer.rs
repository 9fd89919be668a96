//! `LockLayer`: the configuration, applied to a service.

use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use dlock_core::{ErrorResponses, Locker};
use http::StatusCode;
use http::request::Parts;
use tower_layer::Layer;

use crate::body::{BoxError, LockBody};
use crate::key::{IntoLockKeys, KeySource, LockKeys};
use crate::rejection::LockRejection;
use crate::service::Lock;

pub(crate) type Handler =
    Arc<dyn Fn(&LockRejection) -> Option<http::Response<LockBody<()>>> + Send + Sync>;

/// How the layer locks and answers.
#[derive(Clone)]
pub(crate) struct Config {
    /// `None`: the `Locker`'s default wait.
    pub(crate) wait: Option<Duration>,
    pub(crate) lease: Option<Duration>,
    pub(crate) watchdog_lease: Option<Duration>,
    /// Fair locks (`Locker::fair_lock`).
    pub(crate) fair: bool,
    /// Statuses and hidden names, as `#[distributed_lock]` handlers' errors can be answered.
    pub(crate) responses: ErrorResponses,
    /// Whether lock names stay out of dlock's logs and spans too ([`LockLayer::hide_names`]).
    pub(crate) hide_in_logs: bool,
    /// The level of the `dlock.request` span ([`LockLayer::span_level`]).
    pub(crate) span_level: tracing::Level,
    pub(crate) hold_body: bool,
    pub(crate) handler: Option<Handler>,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            wait: None,
            lease: None,
            watchdog_lease: None,
            fair: false,
            responses: ErrorResponses::new(),
            hide_in_logs: false,
            span_level: tracing::Level::INFO,
            hold_body: false,
            handler: None,
        }
    }
}

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Config")
            .field("wait", &self.wait)
            .field("lease", &self.lease)
            .field("watchdog_lease", &self.watchdog_lease)
            .field("fair", &self.fair)
            .field("responses", &self.responses)
            .field("hide_in_logs", &self.hide_in_logs)
            .field("span_level", &self.span_level)
            .field("hold_body", &self.hold_body)
            .field("handler", &self.handler.is_some())
            .finish()
    }
}

/// What every service made by one layer shares.
pub(crate) struct Shared<S> {
    pub(crate) locker: Locker,
    pub(crate) keys: KeySource<S>,
    pub(crate) state: S,
    pub(crate) config: Config,
}

/// Marks a [`LockLayer`] that has no key function yet: it is not a [`Layer`] until it gets one,
/// since it would lock nothing.
#[derive(Debug, Clone, Copy, Default)]
#[non_exhaustive]
pub struct NoKey;

/// Marks a [`LockLayer`] with a key function: a [`Layer`].
#[derive(Debug, Clone, Copy, Default)]
#[non_exhaustive]
pub struct WithKey;

/// The key state of a [`LockLayer`] that can be applied: [`WithKey`].
///
/// Applying a layer that has no key function is a compile error that says so, rather than a
/// layer that silently locks nothing.
#[diagnostic::on_unimplemented(
    message = "this `LockLayer` has no key function, so it would lock nothing",
    label = "a `LockLayer` without a key function is not a `Layer`",
    note = "give it one: `.key(|Path(id): Path<u64>| async move {{ .. }})`, `.sync_key(..)`, \
            `.key_from_parts(..)` or `.key_from_request(..)`"
)]
pub trait HasKey {}

impl HasKey for WithKey {}

/// Guards the wrapped service with a distributed lock whose name comes from the request.
///
/// `S` is the router state the key's extractors run with (`()` for [`LockLayer::new`]). `K` says
/// whether the key function is set: [`LockLayer::new`] makes a [`NoKey`] layer, and a key
/// function ([`key`](LockLayer::key), [`key_from_parts`](LockLayer::key_from_parts), …) makes
/// it a [`WithKey`] one, which is a [`Layer`]: a layer without a key is a compile error, not a
/// layer that locks nothing.
///
/// Apply it with `Router::route_layer`, `Router::layer`, `ServiceBuilder::layer` or
/// [`Layer::layer`]; clones are cheap (the key function and the error handler are shared, the
/// state is cloned). See the [crate documentation](crate) for examples.
pub struct LockLayer<S = (), K = WithKey> {
    locker: Locker,
    keys: KeySource<S>,
    state: S,
    config: Config,
    key_state: PhantomData<fn() -> K>,
}

impl<S: Clone, K> Clone for LockLayer<S, K> {
    fn clone(&self) -> Self {
        Self {
            locker: self.locker.clone(),
            keys: self.keys.clone(),
            state: self.state.clone(),
            config: self.config.clone(),
            key_state: PhantomData,
        }
    }
}

impl<S, K> fmt::Debug for LockLayer<S, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockLayer")
            .field("locker", &self.locker)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl LockLayer<(), NoKey> {
    /// A layer over `locker` for extractors that need no router state. Give it a key with
    /// [`key`](LockLayer::key) (extractors) or [`key_from_parts`](LockLayer::key_from_parts)
    /// before applying it.
    pub fn new(locker: Locker) -> Self {
        Self::with_state(locker, ())
    }
}

impl<S> LockLayer<S, NoKey> {
    /// A layer whose key extractors run with the router state `state` (as
    /// `axum::middleware::from_fn_with_state` does): `State<T>` and extractors implemented for
    /// your state type. `Router::route_layer` runs before `Router::with_state` supplies the
    /// state, hence the explicit value. See the [crate documentation](crate#router-state).
    pub fn with_state(locker: Locker, state: S) -> Self {
        Self {
            locker,
            // Never run: a layer without a key is not a `Layer`.
            keys: KeySource::Parts(Arc::new(|_: &Parts| LockKeys::None)),
            state,
            config: Config::default(),
            key_state: PhantomData,
        }
    }

    /// A layer over the `Locker` the router state holds (`Locker: FromRef<S>`, as
    /// `#[derive(FromRef)]` gives), whose key extractors run with that state: one value for
    /// both, as `axum::middleware::from_fn_with_state` takes it.
    ///
    /// ```
    /// use axum::{Router, extract::{FromRef, Path}, routing::post};
    /// use dlock_core::Locker;
    /// use dlock_tower::LockLayer;
    ///
    /// #[derive(Clone)]
    /// struct AppState {
    ///     locker: Locker,
    /// }
    ///
    /// impl FromRef<AppState> for Locker {
    ///     fn from_ref(state: &AppState) -> Locker {
    ///         state.locker.clone()
    ///     }
    /// }
    ///
    /// let state = AppState { locker: Locker::memory() };
    /// let app: Router = Router::new()
    ///     .route("/vouchers/{id}/orders", post(|| async { "ordered" }))
    ///     .route_layer(
    ///         LockLayer::from_state(state.clone())
    ///             .key(|Path(id): Path<u64>| async move { format!("voucher:{id}") }),
    ///     )
    ///     .with_state(state);
    /// # let _ = app;
    /// ```
    #[cfg(feature = "axum")]
    #[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
    pub fn from_state(state: S) -> Self
    where
        Locker: axum_core::extract::FromRef<S>,
    {
        let locker = <Locker as axum_core::extract::FromRef<S>>::from_ref(&state);
        Self::with_state(locker, state)
    }
}

impl<S, K> LockLayer<S, K> {
    /// The same layer, with its key function set to `keys`.
    fn keyed(self, keys: KeySource<S>) -> LockLayer<S, WithKey> {
        LockLayer {
            locker: self.locker,
            keys,
            state: self.state,
            config: self.config,
            key_state: PhantomData,
        }
    }

    /// The key from axum extractors (up to twelve), computed by an `async` function:
    /// `|Path(id): Path<u64>, user: User| async move { format!("order:{}:{id}", user.id) }`.
    /// It may return a name, an `Option` of one (`None`: no lock for this request) or a `Vec`
    /// of names (all locked, all-or-none). A failing extractor's rejection is returned as it is,
    /// and the handler doesn't run.
    ///
    /// The extractors run on the request head only; the body goes to the handler untouched.
    #[cfg(feature = "axum")]
    #[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
    pub fn key<F, T>(self, f: F) -> LockLayer<S, WithKey>
    where
        F: crate::key::extract::KeyFn<S, T>,
    {
        self.keyed(KeySource::Extract(Arc::new(move |parts, state| {
            f.call(parts, state)
        })))
    }

    /// As [`key`](LockLayer::key), with a plain (non-`async`) function.
    ///
    /// ```
    /// use axum::{Router, extract::Query, http::HeaderMap, routing::post};
    /// use dlock_core::LockName;
    /// use dlock_tower::LockLayer;
    ///
    /// #[derive(serde::Deserialize)]
    /// struct Import {
    ///     tenant: Option<String>,
    /// }
    ///
    /// let app: Router = Router::new()
    ///     .route("/imports", post(|| async { "started" }))
    ///     .route_layer(LockLayer::new(dlock_core::Locker::memory()).sync_key(
    ///         |Query(import): Query<Import>, headers: HeaderMap| {
    ///             // No tenant, or a dry run: no lock.
    ///             if headers.contains_key("x-dry-run") {
    ///                 return None;
    ///             }
    ///             let tenant = import.tenant?;
    ///             Some(LockName::builder().literal("import:").value(tenant).build())
    ///         },
    ///     ));
    /// # let _ = app;
    /// ```
    #[cfg(feature = "axum")]
    #[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
    pub fn sync_key<F, T>(self, f: F) -> LockLayer<S, WithKey>
    where
        F: crate::key::extract::SyncKeyFn<S, T>,
    {
        self.keyed(KeySource::Extract(Arc::new(move |parts, state| {
            crate::key::extract::SyncKeyFn::call(&f, parts, state)
        })))
    }

    /// The key from the request head (method, URI, headers, extensions — never the body): the
    /// plain tower form, no axum needed. [`KeyFrom`](crate::KeyFrom) has ready-made ones.
    pub fn key_from_parts<F, R>(self, f: F) -> LockLayer<S, WithKey>
    where
        F: Fn(&Parts) -> R + Send + Sync + 'static,
        R: IntoLockKeys,
    {
        self.keyed(KeySource::Parts(Arc::new(move |parts| {
            f(parts).into_lock_keys()
        })))
    }

    /// The key from the request, seen without its body (`http::Request<()>`: method, URI,
    /// headers, extensions): the plain tower form for code written against `&http::Request`.
    /// The head is lent as it is, not copied, and the body is given back to the request.
    ///
    /// ```
    /// use std::convert::Infallible;
    ///
    /// use dlock_tower::LockLayer;
    /// use http::{Request, Response};
    /// use tower::{ServiceBuilder, ServiceExt as _};
    ///
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// let service = ServiceBuilder::new()
    ///     .layer(
    ///         LockLayer::new(dlock_core::Locker::memory())
    ///             // One write at a time per resource; reads take no lock.
    ///             .key_from_request(|req: &Request<()>| {
    ///                 (req.method() != http::Method::GET).then(|| format!("res:{}", req.uri().path()))
    ///             }),
    ///     )
    ///     .service_fn(|_req: Request<String>| async {
    ///         Ok::<_, Infallible>(Response::new(String::from("done")))
    ///     });
    /// let response = service.oneshot(Request::put("/a").body(String::new()).unwrap()).await;
    /// assert_eq!(response.unwrap().status(), 200);
    /// # });
    /// ```
    pub fn key_from_request<F, R>(self, f: F) -> LockLayer<S, WithKey>
    where
        F: Fn(&http::Request<()>) -> R + Send + Sync + 'static,
        R: IntoLockKeys,
    {
        self.keyed(KeySource::Request(Arc::new(move |req| {
            f(req).into_lock_keys()
        })))
    }

    /// How long a request waits for a busy lock before it is answered busy (default: the
    /// `Locker`'s [default wait](dlock_core::LockerBuilder::default_wait), which is one
    /// attempt, no waiting, unless set). Waiting is a pub/sub wake-up in the core, not polling.
    pub fn wait(mut self, wait: Duration) -> Self {
        self.config.wait = Some(wait);
        self
    }

    /// A fixed lease (no renewal; at least 10 ms): the lock expires after it even if the
    /// request still runs, and the request is then cancelled as lost. By default the watchdog
    /// renews the lock while the request runs.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.config.lease = Some(lease);
        self
    }

    /// Watchdog mode with this lease (renewed every third of it; the `Locker`'s watchdog lease
    /// by default).
    pub fn watchdog_lease(mut self, lease: Duration) -> Self {
        self.config.watchdog_lease = Some(lease);
        self
    }

    /// Takes fair locks ([`Locker::fair_lock`](dlock_core::Locker::fair_lock)): requests waiting
    /// for one key get it in the order they came, across instances, and a release wakes only the
    /// next in line (default off). Give the layer a [`wait`](Self::wait) for a line to form. A
    /// `Vec` key that names one lock (once or more) is that lock, taken fairly; a key that names
    /// several locks can't be fair: such a request is answered as a configuration error (500,
    /// without details), and its handler does not run.
    pub fn fair(mut self, fair: bool) -> Self {
        self.config.fair = fair;
        self
    }

    /// The status for a busy lock (default 409 Conflict; 423, 429 and 503 are common choices).
    pub fn with_status_code(mut self, status: StatusCode) -> Self {
        self.config.responses = self.config.responses.busy_status(status);
        self
    }

    /// The status when the lock is lost while the handler runs (default 503).
    pub fn lost_status_code(mut self, status: StatusCode) -> Self {
        self.config.responses = self.config.responses.lost_status(status);
        self
    }

    /// The status when Redis can't be reached or doesn't answer in time (default 503).
    pub fn unavailable_status_code(mut self, status: StatusCode) -> Self {
        self.config.responses = self.config.responses.unavailable_status(status);
        self
    }

    /// The status when the key is not a valid lock name: too long, control characters, `{` or
    /// `}` in literal text (default 400).
    pub fn invalid_key_status_code(mut self, status: StatusCode) -> Self {
        self.config.responses = self.config.responses.invalid_name_status(status);
        self
    }

    /// `true`: leave the lock's name out of rejection bodies and gRPC messages, and out of
    /// dlock's logs and spans as well. `false`: show it in rejection bodies (the `lock` field)
    /// and gRPC messages, on purpose.
    ///
    /// By default names stay out of bodies and messages — they often hold user data, and a
    /// client rarely needs them — and go into logs and spans as the `Locker` says. A `Locker`
    /// built with `LockerBuilder::hide_names(true)`, or a name made
    /// [`hidden`](dlock_core::LockName::hidden), stays out of logs and spans whatever this
    /// says. The `Retry-After` header and the status stay either way.
    pub fn hide_names(mut self, hide: bool) -> Self {
        self.config.responses = self.config.responses.hide_names(hide);
        self.config.hide_in_logs = hide;
        self
    }

    /// Every status and [`hide_names`](LockLayer::hide_names) at once, from the value that
    /// also answers your handlers' `LockError`s, so that a `#[distributed_lock]` handler and a
    /// layered route answer alike. Replaces what the single setters set before it.
    ///
    /// ```
    /// use axum::http::StatusCode;
    /// use dlock_core::ErrorResponses;
    /// use dlock_tower::LockLayer;
    ///
    /// const LOCK_ERRORS: ErrorResponses = ErrorResponses::new().busy_status(StatusCode::LOCKED);
    ///
    /// let layer = LockLayer::new(dlock_core::Locker::memory())
    ///     .key(|| async { "report" })
    ///     .error_responses(LOCK_ERRORS);
    /// # let _ = layer;
    /// ```
    pub fn error_responses(mut self, responses: ErrorResponses) -> Self {
        self.config.responses = responses;
        self
    }

    /// The level of each request's `dlock.request` span (default INFO, as the core's
    /// `dlock.acquire` and `dlock.release`).
    pub fn span_level(mut self, level: tracing::Level) -> Self {
        self.config.span_level = level;
        self
    }

    /// Hold the lock until the response body has been sent (or dropped), not just until the
    /// response head is produced: for streamed bodies whose production is the guarded work.
    ///
    /// The body is wrapped ([`LockBody`](crate::LockBody)) and produced inside the request's
    /// lock scope, as the handler ran: `dlock_core::scope::fencing_token().await` answers there, and a
    /// nested acquisition of the same key re-enters. It releases the lock when it yields its
    /// last frame, fails, or is dropped (the client went away). If the lock is lost while the
    /// body is being sent, the body ends with an error; a gRPC response ends with trailers
    /// `grpc-status: 10` (`ABORTED`) and a `grpc-message` instead.
    pub fn hold_until_body_ends(mut self, hold: bool) -> Self {
        self.config.hold_body = hold;
        self
    }

    /// Replaces the layer's own rejections: return `Some(response)` to answer with it, `None`
    /// to keep the default. Extractor rejections are never passed here; they are returned as
    /// the extractor made them. Nor are the rejections of gRPC requests, which are always
    /// answered with a gRPC status (see the [crate documentation](crate#grpc)).
    ///
    /// ```
    /// use axum::{Json, Router, http::StatusCode, response::IntoResponse, routing::post};
    /// use dlock_tower::{LockLayer, LockRejection};
    ///
    /// let layer = LockLayer::new(dlock_core::Locker::memory())
    ///     .key(|| async { "report" })
    ///     .on_rejection(|rejection| match rejection {
    ///         // The application's own error shape for a busy lock; the defaults for the rest.
    ///         LockRejection::Busy { .. } => Some(
    ///             (
    ///                 StatusCode::TOO_MANY_REQUESTS,
    ///                 [("retry-after", rejection.retry_after_secs().unwrap_or(1).to_string())],
    ///                 Json(serde_json::json!({ "error": "report_running" })),
    ///             )
    ///                 .into_response(),
    ///         ),
    ///         _ => None,
    ///     });
    /// let app: Router = Router::new().route("/reports", post(|| async { "ok" })).route_layer(layer);
    /// # let _ = app;
    /// ```
    pub fn on_rejection<F, B>(mut self, handler: F) -> Self
    where
        F: Fn(&LockRejection) -> Option<http::Response<B>> + Send + Sync + 'static,
        B: http_body::Body<Data = Bytes> + Send + 'static,
        B::Error: Into<BoxError>,
    {
        self.config.handler = Some(Arc::new(move |rejection| {
            handler(rejection).map(|r| r.map(LockBody::boxed))
        }));
        self
    }
}

impl<Inner, S: Clone, K: HasKey> Layer<Inner> for LockLayer<S, K> {
    type Service = Lock<Inner, S>;

    fn layer(&self, inner: Inner) -> Self::Service {
        Lock::new(
            inner,
            Arc::new(Shared {
                locker: self.locker.clone(),
                keys: self.keys.clone(),
                state: self.state.clone(),
                config: self.config.clone(),
            }),
        )
    }
}
