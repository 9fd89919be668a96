//! `ResponseFuture`: Extracting the key → Acquiring the lock → Calling the inner service.

use std::fmt;
use std::future::{Future, IntoFuture as _};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use dlock_core::{LockError, LockGuard, LockScope, Locker, Lost, MultiGuard, Scoped};
use futures_util::future::SelectAll;
use http::{Request, Response};
use tokio::time::Instant;
use tower_service::Service;

use crate::body::LockBody;
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
                fencing_token: guard.fencing_token(),
            },
            None => LockError::Config("no lock is held".to_owned()),
        }
    }

    /// Whether the layer keeps these names out of logs ([`crate::LockLayer::hide_names`]).
    pub(crate) fn names_hidden(&self) -> bool {
        self.guards().iter().any(|g| g.name().is_hidden())
    }

    fn info(&self) -> HeldLocks {
        HeldLocks::new(
            self.guards().iter().map(|g| g.name().to_string()).collect(),
            self.guards().iter().map(LockGuard::fencing_token).collect(),
        )
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
        let span = tracing::debug_span!(
            "dlock.request",
            keys = tracing::field::Empty,
            waited_us = tracing::field::Empty,
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

fn micros(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
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
    let hidden = config.responses.names_hidden();
    let fut = match keys {
        LockKeys::None => {
            span.record("outcome", "unlocked");
            return call(inner, req, None);
        }
        LockKeys::One(Err(err)) => return rejected(span, LockRejection::from(err), config, grpc),
        LockKeys::Many(names) if names.iter().any(Result::is_err) => {
            let err = names.into_iter().find_map(Result::err);
            let err = err.unwrap_or_else(|| LockError::Config("invalid key".to_owned()));
            return rejected(span, LockRejection::from(err), config, grpc);
        }
        LockKeys::One(Ok(name)) => {
            span.record("keys", if hidden { HIDDEN } else { name.as_str() });
            let request = if config.fair {
                locker.fair_lock(name)
            } else {
                locker.lock(name)
            };
            let mut request = request.hide_name(hidden);
            if let Some(wait) = config.wait {
                request = request.wait(wait);
            }
            if let Some(lease) = config.lease {
                request = request.lease(lease);
            } else if let Some(lease) = config.watchdog_lease {
                request = request.watchdog_lease(lease);
            }
            Acquire::One(request.into_future())
        }
        LockKeys::Many(_) if config.fair => {
            let err = LockError::Config("a fair lock layer's key names several locks".to_owned());
            return rejected(span, LockRejection::from(err), config, grpc);
        }
        LockKeys::Many(names) => {
            let names: Vec<_> = names.into_iter().filter_map(Result::ok).collect();
            if hidden {
                span.record("keys", HIDDEN);
            } else {
                span.record("keys", tracing::field::debug(&names));
            }
            let mut request = locker.lock_all(names).hide_names(hidden);
            if let Some(wait) = config.wait {
                request = request.wait(wait);
            }
            if let Some(lease) = config.lease {
                request = request.lease(lease);
            } else if let Some(lease) = config.watchdog_lease {
                request = request.watchdog_lease(lease);
            }
            Acquire::Many(request.into_future())
        }
    };
    State::Acquiring {
        fut,
        req: Some(req),
        inner: Some(inner),
        started: Instant::now(),
    }
}

fn rejected<Inner, ReqB, F>(
    span: &tracing::Span,
    rejection: LockRejection,
    config: &Config,
    grpc: Option<Grpc>,
) -> State<Inner, ReqB, F> {
    span.record("outcome", rejection.outcome());
    // The backend's error names no lock; the others may, and stay out of logs when hidden.
    let hidden = config.responses.names_hidden();
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
fn call<Inner, ReqB>(
    mut inner: Inner,
    mut req: Request<ReqB>,
    held: Option<Held>,
) -> State<Inner, ReqB, Inner::Future>
where
    Inner: Service<Request<ReqB>>,
{
    let scope = LockScope::new();
    let mut lost = None;
    if let Some(held) = &held {
        for guard in held.guards() {
            scope.adopt(guard);
        }
        req.extensions_mut().insert(held.info());
        lost = held.lost();
    }
    State::Calling {
        fut: scope.run(inner.call(req)),
        held,
        lost,
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
                            this.span.record("outcome", "key_rejected");
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
                    let waited_us = micros(started.elapsed());
                    this.span.record("waited_us", waited_us);
                    match (acquired, req.take(), inner.take()) {
                        (Ok(held), Some(req), Some(inner)) => {
                            this.span.record("outcome", "acquired");
                            tracing::debug!(waited_us, "dlock-tower: lock acquired");
                            call(inner, req, Some(held))
                        }
                        (Err(err), _, _) => {
                            let rejection = LockRejection::from(err);
                            rejected(this.span, rejection, this.shared.config(), *this.grpc)
                        }
                        _ => State::Rejected { response: None },
                    }
                }
                StateProj::Calling { fut, held, lost } => {
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
                        // Cancel the handler (its future is dropped with this state), then let
                        // go of what is left of the hold.
                        this.state.set(rejected(
                            this.span,
                            rejection,
                            this.shared.config(),
                            *this.grpc,
                        ));
                        drop(held);
                        continue;
                    }
                    let response = ready!(fut.poll(cx))?;
                    let (held, lost) = (held.take(), lost.take());
                    let hold = if this.shared.config().hold_body {
                        held.map(|held| (held, lost))
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
