//! The response body: the inner service's, optionally holding the lock until it ends, or the
//! layer's own small bodies.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};

use crate::future::Held;

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

pin_project_lite::pin_project! {
    #[project = KindProj]
    enum Kind<B> {
        /// The inner service's body; with `hold_until_body_ends`, the locks are released when
        /// it ends or is dropped.
        Inner {
            #[pin]
            body: B,
            held: Option<Held>,
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
            Kind::Inner { held, .. } => f
                .debug_struct("LockBody::Inner")
                .field("holds_lock", &held.is_some())
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
    pub(crate) fn inner(body: B, held: Option<Held>) -> Self {
        Self {
            kind: Kind::Inner { body, held },
        }
    }

    pub(crate) fn full(data: impl Into<Bytes>) -> Self {
        Self {
            kind: Kind::Full {
                data: Some(data.into()),
            },
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
            KindProj::Inner { body, held } => match body.poll_frame(cx) {
                Poll::Ready(None) => {
                    // The body ended: the locks go now, not when the connection lets go of it.
                    held.take();
                    Poll::Ready(None)
                }
                Poll::Ready(Some(Err(err))) => {
                    held.take();
                    Poll::Ready(Some(Err(err.into())))
                }
                other => other.map(|frame| frame.map(|f| f.map_err(Into::into))),
            },
            KindProj::Full { data } => Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
            KindProj::Boxed { body } => body.as_mut().poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Inner { body, .. } => body.is_end_stream(),
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
