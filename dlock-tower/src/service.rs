//! `Lock<S>`: the middleware service.

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use tower_service::Service;

use crate::body::LockBody;
use crate::future::ResponseFuture;
use crate::layer::Shared;

/// The service [`LockLayer`](crate::LockLayer) wraps around another.
pub struct Lock<Inner, S = ()> {
    inner: Inner,
    shared: Arc<Shared<S>>,
}

impl<Inner, S> Lock<Inner, S> {
    pub(crate) fn new(inner: Inner, shared: Arc<Shared<S>>) -> Self {
        Self { inner, shared }
    }

    /// The wrapped service.
    pub fn get_ref(&self) -> &Inner {
        &self.inner
    }

    /// The wrapped service, mutably.
    pub fn get_mut(&mut self) -> &mut Inner {
        &mut self.inner
    }

    /// The wrapped service, unwrapped.
    pub fn into_inner(self) -> Inner {
        self.inner
    }
}

impl<Inner: Clone, S> Clone for Lock<Inner, S> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            shared: self.shared.clone(),
        }
    }
}

impl<Inner: fmt::Debug, S> fmt::Debug for Lock<Inner, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lock")
            .field("inner", &self.inner)
            .field("locker", &self.shared.locker)
            .field("config", &self.shared.config)
            .finish()
    }
}

impl<Inner, S, ReqB, ResB> Service<Request<ReqB>> for Lock<Inner, S>
where
    Inner: Service<Request<ReqB>, Response = Response<ResB>> + Clone,
    S: Clone + Send + Sync + 'static,
{
    type Response = Response<LockBody<ResB>>;
    type Error = Inner::Error;
    type Future = ResponseFuture<Inner, ReqB>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqB>) -> Self::Future {
        // The readied service goes with this request; the clone waits for the next `poll_ready`.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        ResponseFuture::new(self.shared.clone(), inner, req)
    }
}

#[cfg(test)]
mod tests {
    use tower_layer::Layer as _;

    use crate::LockLayer;

    #[tokio::test]
    async fn the_wrapped_service_can_be_reached_and_taken_back() {
        let layer = LockLayer::new(dlock_core::Locker::memory()).key_from_parts(|_: &_| "k");
        let mut service = layer.layer(5_u32);
        *service.get_mut() += 1;
        assert_eq!(*service.get_ref(), 6);
        assert_eq!(service.into_inner(), 6);
    }
}
