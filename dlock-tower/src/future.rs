//! `ResponseFuture`: Extracting the key → Acquiring the lock → Calling the inner service.

use std::fmt;
use std::future::{Future, IntoFuture as _};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use dlock_core::{LockError, LockGuard, LockName, LockScope, Locker, Lost, MultiGuard, Scoped};
use futures_util::future::SelectAll;
use http::{Request, Response};
use tokio::time::Instant;
use tower_service::Service;

use crate::body::{Hold, LockBody};
use crate::grpc::Grpc;
use crate::held::HeldLocks;
use crate::key::{ExtractFuture, KeySource, LockKeys};
use crate::layer::{Config, Shared};
use crate::rejection::LockRejection;

/// What logs and spans show instead of a hidden lock name.
const HIDDEN: &str = "<hidden>";

/// The locks a request holds; released when dropped.
pub(crate) struct Held(HeldKind);

enum HeldKind {
    One(LockGuard),
    Many(MultiGuard),
}

impl fmt::Debug for Held {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            HeldKind::One(guard) => f.debug_tuple("Held").field(guard).finish(),
            HeldKind::Many(guard) => f.debug_tuple("Held").field(guard).finish(),
        }
    }
}

impl Held {
    fn guards(&self) -> &[LockGuard] {
        match &self.0 {
            HeldKind::One(guard) => std::slice::from_ref(guard),
            HeldKind::Many(guard) => guard.guards(),
        }
    }

    /// Resolves when any of the locks is lost (`None` for an empty set: never).
    pub(crate) fn lost(&self) -> Option<SelectAll<Lost>> {
        let losts: Vec<Lost> = self.guards().iter().map(LockGuard::lost).collect();
        (!losts.is_empty()).then(|| futures_util::future::select_all(losts))
    }

    /// The error for a loss: the lock that was lost (or, if none says so yet, the first one).
    pub(crate) fn lost_error(&self) -> LockError {
        let guards = self.guards();
        match guards
            .iter()
            .find(|g| g.is_lost())
            .or_else(|| guards.first())
        {
            Some(guard) => LockError::Lost {
                name: guard.name().to_string(),
                fencing_token: guard.minted_fencing_token(),
            },
            None => LockError::Config("no lock is held".to_owned()),
        }
    }

    /// Whether these names stay out of logs: the layer's [`crate::LockLayer::hide_names`], the
    /// `Locker`'s own setting, or the name's, which the guards carry.
    pub(crate) fn names_hidden(&self) -> bool {
        self.guards().iter().any(|g| g.name().is_hidden())
    }

    fn info(&self) -> HeldLocks {
        HeldLocks::new(self.guards().iter().map(LockGuard::held_lock).collect())
    }
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = Result<T, LockError>> + Send>>;

/// The core's acquisition future, one lock or several.
enum Acquire {
    One(BoxFuture<LockGuard>),
    Many(BoxFuture<MultiGuard>),
}

impl Acquire {
    fn poll(&mut self, cx: &mut Context<'_>) -> Poll<Result<Held, LockError>> {
        match self {
            Self::One(fut) => fut.as_mut().poll(cx).map_ok(|g| Held(HeldKind::One(g))),
            Self::Many(fut) => fut.as_mut().poll(cx).map_ok(|g| Held(HeldKind::Many(g))),
        }
    }
}

pin_project_lite::pin_project! {
    #[project = StateProj]
    enum State<Inner, ReqB, F> {
        Extracting {
            fut: ExtractFuture,
            body: Option<ReqB>,
            inner: Option<Inner>,
        },
        Acquiring {
            fut: Acquire,
            req: Option<Request<ReqB>>,
            inner: Option<Inner>,
            started: Instant,
        },
        Calling {
            #[pin]
            fut: Scoped<F>,
            held: Option<Held>,
            lost: Option<SelectAll<Lost>>,
            // The handler's scope, for a held body to be produced in.
            scope: LockScope,
        },
        Rejected {
            response: Option<Response<LockBody<()>>>,
        },
    }
}

pin_project_lite::pin_project! {
    /// The response future of [`Lock`](crate::Lock): extracts the key, acquires the lock, then
    /// calls the inner service while holding it (the last stage unboxed).
    pub struct ResponseFuture<Inner, ReqB>
    where
        Inner: Service<Request<ReqB>>,
    {
        #[pin]
        state: State<Inner, ReqB, Inner::Future>,
        shared: Arc<dyn Settings + Send + Sync>,
        // Whether the request is a gRPC one: its rejections are gRPC statuses.
        grpc: Option<Grpc>,
        // `dlock.request`: the keys, how long the request waited, and the outcome.
        span: tracing::Span,
    }
}

/// The parts of the layer's shared state the future needs, without its state type.
trait Settings {
    fn locker(&self) -> &Locker;
    fn config(&self) -> &Config;
}

impl<S> Settings for Shared<S> {
    fn locker(&self) -> &Locker {
        &self.locker
    }

    fn config(&self) -> &Config {
        &self.config
    }
}

impl<Inner, ReqB> fmt::Debug for ResponseFuture<Inner, ReqB>
where
    Inner: Service<Request<ReqB>>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Extracting { .. } => "extracting",
            State::Acquiring { .. } => "acquiring",
            State::Calling { .. } => "calling",
            State::Rejected { .. } => "rejected",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .finish_non_exhaustive()
    }
}

impl<Inner, ReqB> ResponseFuture<Inner, ReqB>
where
    Inner: Service<Request<ReqB>>,
{
    pub(crate) fn new<S>(shared: Arc<Shared<S>>, inner: Inner, req: Request<ReqB>) -> Self
    where
        S: Clone + Send + Sync + 'static,
    {
        let span = dlock_core::__span_at!(
            shared.config.span_level,
            "dlock.request",
            keys = tracing::field::Empty,
            wait_ms = tracing::field::Empty,
            outcome = tracing::field::Empty,
        );
        let grpc = Grpc::of(req.headers());
        let state = {
            let _entered = span.enter();
            match &shared.keys {
                KeySource::Parts(f) => {
                    let (parts, body) = req.into_parts();
                    let keys = f(&parts);
                    let req = Request::from_parts(parts, body);
                    start(&*shared, &span, grpc, keys, req, inner)
                }
                KeySource::Request(f) => {
                    // The same head, lent without its body and given back: nothing is copied.
                    let (parts, body) = req.into_parts();
                    let head = Request::from_parts(parts, ());
                    let keys = f(&head);
                    let (parts, ()) = head.into_parts();
                    start(
                        &*shared,
                        &span,
                        grpc,
                        keys,
                        Request::from_parts(parts, body),
                        inner,
                    )
                }
                KeySource::Extract(f) => {
                    let (parts, body) = req.into_parts();
                    State::Extracting {
                        fut: f(parts, shared.state.clone()),
                        body: Some(body),
                        inner: Some(inner),
                    }
                }
            }
        };
        Self {
            state,
            shared,
            grpc,
            span,
        }
    }
}

/// Records the request's `outcome` on its span and counts it.
fn decided(span: &tracing::Span, outcome: &'static str) {
    span.record("outcome", outcome);
    crate::metrics::outcome(outcome);
}

fn millis(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// `$request` (a single or a multi-lock request) with the layer's wait and lease.
macro_rules! configured {
    ($request:ident, $config:expr) => {{
        let mut request = $request;
        if let Some(wait) = $config.wait {
            request = request.wait(wait);
        }
        if let Some(lease) = $config.lease {
            request = request.lease(lease);
        } else if let Some(lease) = $config.watchdog_lease {
            request = request.watchdog_lease(lease);
        }
        request
    }};
}

/// The state after the keys are known.
fn start<Inner, ReqB>(
    shared: &dyn Settings,
    span: &tracing::Span,
    grpc: Option<Grpc>,
    keys: LockKeys,
    req: Request<ReqB>,
    inner: Inner,
) -> State<Inner, ReqB, Inner::Future>
where
    Inner: Service<Request<ReqB>>,
{
    let config = shared.config();
    let locker = shared.locker();
    // Hidden if the layer or the `Locker` asks; the layer never un-hides what the `Locker` or a
    // name hides.
    let hidden = names_hidden(shared);
    let fut = match keys {
        LockKeys::None => {
            decided(span, "unlocked");
            return call(inner, req, None);
        }
        // An empty set names no lock: the same as no key.
        LockKeys::Many(names) if names.is_empty() => {
            decided(span, "unlocked");
            return call(inner, req, None);
        }
        LockKeys::One(Err(err)) => {
            return rejected(span, LockRejection::from(err), config, grpc, hidden);
        }
        LockKeys::Many(names) if names.iter().any(Result::is_err) => {
            let err = names.into_iter().find_map(Result::err);
            let err = err.unwrap_or_else(|| LockError::Config("invalid key".to_owned()));
            return rejected(span, LockRejection::from(err), config, grpc, hidden);
        }
        LockKeys::One(Ok(name)) => acquire_one(config, locker, span, hidden, name),
        LockKeys::Many(names) => {
            let mut names: Vec<_> = names.into_iter().filter_map(Result::ok).collect();
            match names.first() {
                // A set that names one lock (however often) is that lock, which a fair layer
                // takes as it takes a single name.
                Some(first) if config.fair && names.iter().all(|name| name == first) => {
                    let name = names.swap_remove(0);
                    acquire_one(config, locker, span, hidden, name)
                }
                _ if config.fair => {
                    let err =
                        LockError::Config("a fair lock layer's key names several locks".to_owned());
                    return rejected(span, LockRejection::from(err), config, grpc, hidden);
                }
                _ => {
                    if hidden || names.iter().any(LockName::is_hidden) {
                        span.record("keys", HIDDEN);
                    } else {
                        span.record("keys", tracing::field::debug(&names));
                    }
                    let mut request = locker.lock_all(names);
                    if hidden {
                        request = request.hide_names(true);
                    }
                    Acquire::Many(configured!(request, config).into_future())
                }
            }
        }
    };
    State::Acquiring {
        fut,
        req: Some(req),
        inner: Some(inner),
        started: Instant::now(),
    }
}

/// Whether the layer keeps lock names out of logs and spans: its own
/// [`hide_names(true)`](crate::LockLayer::hide_names) or the `Locker`'s.
fn names_hidden(shared: &dyn Settings) -> bool {
    shared.config().hide_in_logs || shared.locker().names_hidden()
}

/// The acquisition of one lock, plain or fair.
fn acquire_one(
    config: &Config,
    locker: &Locker,
    span: &tracing::Span,
    hidden: bool,
    name: LockName,
) -> Acquire {
    let shown = if hidden || name.is_hidden() {
        HIDDEN
    } else {
        name.as_str()
    };
    span.record("keys", shown);
    let mut request = if config.fair {
        locker.fair_lock(name)
    } else {
        locker.lock(name)
    };
    if hidden {
        request = request.hide_name(true);
    }
    Acquire::One(configured!(request, config).into_future())
}

/// The rejected state; `hidden`: whether the lock's name stays out of the log line.
fn rejected<Inner, ReqB, F>(
    span: &tracing::Span,
    rejection: LockRejection,
    config: &Config,
    grpc: Option<Grpc>,
    hidden: bool,
) -> State<Inner, ReqB, F> {
    decided(span, rejection.outcome());
    // The backend's error names no lock; the others may, and stay out of logs when hidden.
    match &rejection {
        LockRejection::Busy { .. } => tracing::debug!("dlock-tower: busy"),
        LockRejection::Lost { .. } if hidden => {
            tracing::warn!("dlock-tower: lock lost, handler cancelled")
        }
        LockRejection::Lost { .. } => {
            tracing::warn!(rejection = %rejection, "dlock-tower: lock lost, handler cancelled")
        }
        LockRejection::Unavailable(err) => {
            tracing::warn!(error = %err, "dlock-tower: lock backend unavailable")
        }
        other if hidden => {
            tracing::debug!(outcome = other.outcome(), "dlock-tower: rejected")
        }
        other => tracing::debug!(rejection = %other, "dlock-tower: rejected"),
    }
    State::Rejected {
        response: Some(rejection.respond(config, grpc)),
    }
}

/// Calls the inner service inside a lock scope that holds `held`.
///
/// The scope is nested: run inside an outer layer's scope, it keeps that scope's holds, and the
/// [`HeldLocks`] the handler sees lists the outer layer's locks, then this layer's.
fn call<Inner, ReqB>(
    mut inner: Inner,
    mut req: Request<ReqB>,
    held: Option<Held>,
) -> State<Inner, ReqB, Inner::Future>
where
    Inner: Service<Request<ReqB>>,
{
    let scope = LockScope::nested();
    let mut lost = None;
    if let Some(held) = &held {
        for guard in held.guards() {
            scope.adopt(guard);
        }
        let info = match req.extensions_mut().remove::<HeldLocks>() {
            Some(outer) => outer.followed_by(held.info()),
            None => held.info(),
        };
        req.extensions_mut().insert(info);
        lost = held.lost();
    }
    State::Calling {
        fut: scope.run(inner.call(req)),
        held,
        lost,
        scope,
    }
}

impl<Inner, ReqB, ResB> Future for ResponseFuture<Inner, ReqB>
where
    Inner: Service<Request<ReqB>, Response = Response<ResB>>,
{
    type Output = Result<Response<LockBody<ResB>>, Inner::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        let _entered = this.span.enter();
        loop {
            let next = match this.state.as_mut().project() {
                StateProj::Extracting { fut, body, inner } => {
                    let (parts, keys) = ready!(fut.as_mut().poll(cx));
                    match (keys, body.take(), inner.take()) {
                        (Ok(keys), Some(body), Some(inner)) => {
                            let req = Request::from_parts(parts, body);
                            start(&**this.shared, this.span, *this.grpc, keys, req, inner)
                        }
                        (Err(response), _, _) => {
                            // The extractor's own rejection, as it made it.
                            decided(this.span, "key_rejected");
                            State::Rejected {
                                response: Some(response),
                            }
                        }
                        _ => State::Rejected { response: None },
                    }
                }
                StateProj::Acquiring {
                    fut,
                    req,
                    inner,
                    started,
                } => {
                    let acquired = ready!(fut.poll(cx));
                    let wait_ms = millis(started.elapsed());
                    this.span.record("wait_ms", wait_ms);
                    match (acquired, req.take(), inner.take()) {
                        (Ok(held), Some(req), Some(inner)) => {
                            decided(this.span, "acquired");
                            tracing::debug!(wait_ms, "dlock-tower: lock acquired");
                            call(inner, req, Some(held))
                        }
                        (Err(err), _, _) => {
                            let rejection = LockRejection::from(err);
                            let hidden = names_hidden(&**this.shared);
                            rejected(
                                this.span,
                                rejection,
                                this.shared.config(),
                                *this.grpc,
                                hidden,
                            )
                        }
                        _ => State::Rejected { response: None },
                    }
                }
                StateProj::Calling {
                    fut,
                    held,
                    lost,
                    scope,
                } => {
                    let lost_now = lost
                        .as_mut()
                        .is_some_and(|lost| Pin::new(lost).poll(cx).is_ready());
                    if lost_now {
                        let held = held.take();
                        let err = held
                            .as_ref()
                            .map(Held::lost_error)
                            .unwrap_or_else(|| LockError::Config("lock lost".to_owned()));
                        let rejection = LockRejection::from(err);
                        let hidden = names_hidden(&**this.shared)
                            || held.as_ref().is_some_and(Held::names_hidden);
                        // Cancel the handler (its future is dropped with this state), then let
                        // go of what is left of the hold.
                        this.state.set(rejected(
                            this.span,
                            rejection,
                            this.shared.config(),
                            *this.grpc,
                            hidden,
                        ));
                        drop(held);
                        continue;
                    }
                    let response = ready!(fut.poll(cx))?;
                    let (held, lost) = (held.take(), lost.take());
                    let config = this.shared.config();
                    let hold = if config.hold_body {
                        held.map(|held| Hold {
                            held,
                            lost,
                            scope: scope.clone(),
                            grpc: *this.grpc,
                            hide_names: config.responses.names_hidden(),
                        })
                    } else {
                        // Released (in the background) as soon as the response is produced.
                        None
                    };
                    return Poll::Ready(Ok(response.map(|body| LockBody::inner(body, hold))));
                }
                StateProj::Rejected { response } => {
                    let response = response.take().unwrap_or_else(|| {
                        let mut r = Response::new(LockBody::full(""));
                        *r.status_mut() = http::StatusCode::INTERNAL_SERVER_ERROR;
                        r
                    });
                    return Poll::Ready(Ok(response.map(LockBody::cast)));
                }
            };
            this.state.set(next);
        }
    }
}
