//! `ResponseFuture`: Extracting the key → Acquiring the lock → Calling the inner service.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use dlock_core::{FencingToken, LockError, LockGuard, LockScope, Lost, MultiGuard, Scoped};
use futures_util::future::SelectAll;
use http::{Request, Response};
use tokio::time::Instant;
use tower_service::Service;

use crate::body::LockBody;
use crate::key::{ExtractFuture, KeySource, LockKeys};
use crate::layer::Shared;
use crate::rejection::LockRejection;

/// The locks a request holds; released when dropped.
pub struct Held(HeldKind);

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

    fn lost(&self) -> Option<SelectAll<Lost>> {
        let losts: Vec<Lost> = self.guards().iter().map(LockGuard::lost).collect();
        (!losts.is_empty()).then(|| futures_util::future::select_all(losts))
    }

    fn lost_rejection(&self) -> LockRejection {
        let lost = self
            .guards()
            .iter()
            .find(|g| g.is_lost())
            .or_else(|| self.guards().first());
        match lost {
            Some(guard) => LockRejection::Lost {
                name: guard.name().to_string(),
                fencing_token: guard.fencing_token(),
            },
            None => LockRejection::Unavailable(LockError::Config("no lock held".to_owned())),
        }
    }

    fn info(&self) -> HeldLocks {
        HeldLocks {
            names: self.guards().iter().map(|g| g.name().to_string()).collect(),
            fencing_tokens: self.guards().iter().map(LockGuard::fencing_token).collect(),
        }
    }
}

/// The locks held for this request, in request extensions (and, with the `axum` feature, an
/// extractor): hand the fencing token to the resource the handler writes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HeldLocks {
    /// The names held, in acquisition order.
    pub names: Vec<String>,
    /// Their fencing tokens, in the same order.
    pub fencing_tokens: Vec<FencingToken>,
}

impl HeldLocks {
    /// The fencing token of the first (for a single lock: the only) lock.
    pub fn fencing_token(&self) -> Option<FencingToken> {
        self.fencing_tokens.first().copied()
    }
}

type AcquireFuture = Pin<Box<dyn Future<Output = Result<Held, LockError>> + Send>>;

pin_project_lite::pin_project! {
    #[project = StateProj]
    enum State<Inner, ReqB, F> {
        Extracting {
            fut: ExtractFuture,
            body: Option<ReqB>,
            inner: Option<Inner>,
        },
        Acquiring {
            fut: AcquireFuture,
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
    /// The response future of [`Lock`](crate::Lock).
    pub struct ResponseFuture<Inner, ReqB>
    where
        Inner: Service<Request<ReqB>>,
    {
        #[pin]
        state: State<Inner, ReqB, Inner::Future>,
        shared: Arc<dyn Config + Send + Sync>,
        // `dlock.request`: the keys, how long the request waited, and the outcome.
        span: tracing::Span,
    }
}

/// The parts of the layer's shared state the future needs, without its state type.
trait Config {
    fn locker(&self) -> &dlock_core::Locker;
    fn config(&self) -> &crate::layer::Config;
}

impl<S> Config for Shared<S> {
    fn locker(&self) -> &dlock_core::Locker {
        &self.locker
    }

    fn config(&self) -> &crate::layer::Config {
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
        let state = match &shared.keys {
            KeySource::Parts(f) => {
                let (parts, body) = req.into_parts();
                let keys = f(&parts);
                let req = Request::from_parts(parts, body);
                start(&*shared, keys, req, inner)
            }
            KeySource::Request(f) => {
                // The same head, lent without its body and given back: nothing is copied.
                let (parts, body) = req.into_parts();
                let head = Request::from_parts(parts, ());
                let keys = f(&head);
                let (parts, ()) = head.into_parts();
                start(&*shared, keys, Request::from_parts(parts, body), inner)
            }
            KeySource::Extract(f) => {
                let (parts, body) = req.into_parts();
                State::Extracting {
                    fut: f(parts, shared.state.clone()),
                    body: Some(body),
                    inner: Some(inner),
                }
            }
        };
        let span = tracing::debug_span!(
            "dlock.request",
            keys = tracing::field::Empty,
            waited_us = tracing::field::Empty,
            outcome = tracing::field::Empty,
        );
        if let State::Rejected { .. } = &state {
            span.record("outcome", "rejected");
        }
        Self {
            state,
            shared,
            span,
        }
    }
}

/// The state after the keys are known.
fn start<Inner, ReqB>(
    shared: &dyn Config,
    keys: LockKeys,
    req: Request<ReqB>,
    inner: Inner,
) -> State<Inner, ReqB, Inner::Future>
where
    Inner: Service<Request<ReqB>>,
{
    let config = shared.config();
    let locker = shared.locker();
    let (wait, lease, watchdog) = (config.wait, config.lease, config.watchdog_lease);
    let fut: AcquireFuture = match keys {
        LockKeys::None => return call(inner, req, None),
        LockKeys::One(Err(err)) => return rejected(LockRejection::from_error(err), config),
        LockKeys::Many(names) if names.iter().any(Result::is_err) => {
            let err = names.into_iter().find_map(Result::err);
            let err = err.unwrap_or_else(|| LockError::Config("invalid key".to_owned()));
            return rejected(LockRejection::from_error(err), config);
        }
        LockKeys::One(Ok(name)) => {
            let mut request = locker.lock(name).wait(wait);
            if let Some(lease) = lease {
                request = request.lease(lease);
            } else if let Some(lease) = watchdog {
                request = request.watchdog_lease(lease);
            }
            let acquire = std::future::IntoFuture::into_future(request);
            Box::pin(async move { acquire.await.map(|g| Held(HeldKind::One(g))) })
        }
        LockKeys::Many(names) => {
            let mut request = locker.lock_all(names).wait(wait);
            if let Some(lease) = lease {
                request = request.lease(lease);
            } else if let Some(lease) = watchdog {
                request = request.watchdog_lease(lease);
            }
            let acquire = std::future::IntoFuture::into_future(request);
            Box::pin(async move { acquire.await.map(|g| Held(HeldKind::Many(g))) })
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
    rejection: LockRejection,
    config: &crate::layer::Config,
) -> State<Inner, ReqB, F> {
    match &rejection {
        LockRejection::Busy { name, .. } => {
            tracing::debug!(key = %name, outcome = "busy", "dlock-tower: rejected")
        }
        other => tracing::debug!(rejection = ?other, "dlock-tower: rejected"),
    }
    State::Rejected {
        response: Some(rejection.into_response(config)),
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
                            start(&**this.shared, keys, req, inner)
                        }
                        (Err(response), _, _) => State::Rejected {
                            response: Some(response),
                        },
                        _ => State::Rejected { response: None },
                    }
                }
                StateProj::Acquiring {
                    fut,
                    req,
                    inner,
                    started,
                } => {
                    let acquired = ready!(fut.as_mut().poll(cx));
                    let waited = started.elapsed();
                    match (acquired, req.take(), inner.take()) {
                        (Ok(held), Some(req), Some(inner)) => {
                            let waited_us = u64::try_from(waited.as_micros()).unwrap_or(u64::MAX);
                            this.span
                                .record("keys", tracing::field::debug(&held.info().names));
                            this.span.record("waited_us", waited_us);
                            this.span.record("outcome", "acquired");
                            tracing::debug!(waited_us, "dlock-tower: lock acquired");
                            call(inner, req, Some(held))
                        }
                        (Err(err), _, _) => {
                            this.span.record(
                                "waited_us",
                                u64::try_from(waited.as_micros()).unwrap_or(u64::MAX),
                            );
                            let rejection = LockRejection::from_error(err);
                            this.span.record("outcome", rejection.outcome());
                            rejected(rejection, this.shared.config())
                        }
                        _ => State::Rejected { response: None },
                    }
                }
                StateProj::Calling { fut, held, lost } => {
                    let lost_now = lost
                        .as_mut()
                        .is_some_and(|lost_fut| Pin::new(lost_fut).poll(cx).is_ready());
                    if lost_now {
                        // Cancel the handler: its future is dropped here.
                        let rejection =
                            held.as_ref().map(Held::lost_rejection).unwrap_or_else(|| {
                                LockRejection::Unavailable(LockError::Config(
                                    "lock lost".to_owned(),
                                ))
                            });
                        this.span.record("outcome", "lost");
                        tracing::warn!(rejection = ?rejection, "dlock-tower: lock lost, handler cancelled");
                        held.take();
                        this.state.set(rejected(rejection, this.shared.config()));
                        continue;
                    }
                    let response = ready!(fut.poll(cx))?;
                    let held = held.take();
                    let keep = if this.shared.config().hold_body {
                        held
                    } else {
                        // Released (in the background) as soon as the response is produced.
                        drop(held);
                        None
                    };
                    return Poll::Ready(Ok(response.map(|body| LockBody::inner(body, keep))));
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
