//! The response body: the inner service's, optionally holding the lock until it ends, or the
//! layer's own small bodies.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};

use dlock_core::{LockError, LockScope, Lost};
use futures_util::future::SelectAll;

use crate::future::Held;
use crate::grpc::Grpc;
use crate::rejection::LockRejection;

/// A boxed error, as bodies report them.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

pin_project_lite::pin_project! {
    /// The body of a response that went through [`Lock`](crate::Lock): the inner service's
    /// (holding the lock until it ends, with `hold_until_body_ends`), or the layer's own.
    pub struct LockBody<B> {
        #[pin]
        kind: Kind<B>,
    }
}

/// What the body of a request holds with `hold_until_body_ends`.
pub(crate) struct Hold {
    /// The locks, released when the body ends or is dropped.
    pub(crate) held: Held,
    /// Resolves when any of them is lost.
    pub(crate) lost: Option<SelectAll<Lost>>,
    /// The handler's lock scope, which the body is produced in.
    pub(crate) scope: LockScope,
    /// Whether the request is a gRPC one: a loss ends its body with `ABORTED` trailers.
    pub(crate) grpc: Option<Grpc>,
    /// Whether the lock's name stays out of the `grpc-message` ([`crate::LockLayer::hide_names`]).
    pub(crate) hide_names: bool,
}

pin_project_lite::pin_project! {
    #[project = KindProj]
    enum Kind<B> {
        /// The inner service's body; with `hold_until_body_ends`, it is produced inside the
        /// request's lock scope, the locks are released when it ends or is dropped, and their
        /// loss ends it (with an error, or for gRPC with `ABORTED` trailers).
        Inner {
            #[pin]
            body: B,
            held: Option<Held>,
            lost: Option<SelectAll<Lost>>,
            scope: Option<LockScope>,
            grpc: Option<Grpc>,
            hide_names: bool,
            aborted: bool,
        },
        /// A small body made by the layer (a rejection).
        Full {
            data: Option<Bytes>,
        },
        /// Another body, boxed (an axum extractor's rejection, an error handler's response).
        Boxed {
            body: Pin<Box<dyn Body<Data = Bytes, Error = BoxError> + Send + 'static>>,
        },
    }
}

impl<B> std::fmt::Debug for LockBody<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.kind {
            Kind::Inner { held, aborted, .. } => f
                .debug_struct("LockBody::Inner")
                .field("holds_lock", &held.is_some())
                .field("aborted", aborted)
                .finish_non_exhaustive(),
            Kind::Full { data } => f
                .debug_struct("LockBody::Full")
                .field("data", data)
                .finish(),
            Kind::Boxed { .. } => f.debug_struct("LockBody::Boxed").finish_non_exhaustive(),
        }
    }
}

impl<B> LockBody<B> {
    pub(crate) fn inner(body: B, hold: Option<Hold>) -> Self {
        let kind = match hold {
            Some(hold) => Kind::Inner {
                body,
                held: Some(hold.held),
                lost: hold.lost,
                scope: Some(hold.scope),
                grpc: hold.grpc,
                hide_names: hold.hide_names,
                aborted: false,
            },
            None => Kind::Inner {
                body,
                held: None,
                lost: None,
                scope: None,
                grpc: None,
                hide_names: false,
                aborted: false,
            },
        };
        Self { kind }
    }

    pub(crate) fn full(data: impl Into<Bytes>) -> Self {
        Self {
            kind: Kind::Full {
                data: Some(data.into()),
            },
        }
    }

    /// A body with no data at all: the end of the stream from the start (a gRPC trailers-only
    /// answer).
    pub(crate) fn empty() -> Self {
        Self {
            kind: Kind::Full { data: None },
        }
    }

    /// Boxes any body with `Bytes` data.
    pub fn boxed<T>(body: T) -> Self
    where
        T: Body<Data = Bytes> + Send + 'static,
        T::Error: Into<BoxError>,
    {
        Self {
            kind: Kind::Boxed {
                body: Box::pin(http_body_map_err(body)),
            },
        }
    }
}

impl LockBody<()> {
    /// Re-types a body the layer made itself (never an inner body).
    pub(crate) fn cast<B>(self) -> LockBody<B> {
        let kind = match self.kind {
            Kind::Inner { .. } => Kind::Full { data: None },
            Kind::Full { data } => Kind::Full { data },
            Kind::Boxed { body } => Kind::Boxed { body },
        };
        LockBody { kind }
    }
}

impl<B> Body for LockBody<B>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.project().kind.project() {
            KindProj::Inner {
                body,
                held,
                lost,
                scope,
                grpc,
                hide_names,
                aborted,
            } => {
                if *aborted {
                    return Poll::Ready(None);
                }
                if lost
                    .as_mut()
                    .is_some_and(|lost| Pin::new(lost).poll(cx).is_ready())
                {
                    // The lock went while the body was being sent: stop sending it, as the
                    // handler would have been stopped.
                    *aborted = true;
                    lost.take();
                    crate::metrics::outcome("lost");
                    let held = held.take();
                    let hidden = held.as_ref().is_some_and(Held::names_hidden);
                    let err = held.as_ref().map_or_else(
                        || LockError::Config("lock lost".to_owned()),
                        Held::lost_error,
                    );
                    if hidden {
                        tracing::warn!("dlock-tower: lock lost while sending the body");
                    } else {
                        tracing::warn!(error = %err, "dlock-tower: lock lost while sending the body");
                    }
                    drop(held);
                    return Poll::Ready(Some(match grpc {
                        // The status the call ends with, in its trailers.
                        Some(grpc) => Ok(crate::grpc::trailers(
                            &LockRejection::from(err),
                            *hide_names,
                            *grpc,
                        )),
                        None => Err(Box::new(err)),
                    }));
                }
                let polled = match scope {
                    Some(scope) => scope.enter(|| body.poll_frame(cx)),
                    None => body.poll_frame(cx),
                };
                match polled {
                    Poll::Ready(None) => {
                        // The body ended: the locks go now, not when the connection lets go of it.
                        lost.take();
                        held.take();
                        Poll::Ready(None)
                    }
                    Poll::Ready(Some(Err(err))) => {
                        lost.take();
                        held.take();
                        Poll::Ready(Some(Err(err.into())))
                    }
                    other => other.map(|frame| frame.map(|f| f.map_err(Into::into))),
                }
            }
            KindProj::Full { data } => Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
            KindProj::Boxed { body } => body.as_mut().poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Inner { body, aborted, .. } => *aborted || body.is_end_stream(),
            Kind::Full { data } => data.is_none(),
            Kind::Boxed { body } => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Inner { body, .. } => body.size_hint(),
            Kind::Full { data } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
            Kind::Boxed { body } => body.size_hint(),
        }
    }
}

pin_project_lite::pin_project! {
    /// Maps a body's error into [`BoxError`].
    struct MapErr<T> {
        #[pin]
        body: T,
    }
}

fn http_body_map_err<T>(body: T) -> MapErr<T> {
    MapErr { body }
}

impl<T> Body for MapErr<T>
where
    T: Body<Data = Bytes>,
    T::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        self.project().body.poll_frame(cx).map_err(Into::into)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}
