//! Where a request's lock key comes from.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use dlock_core::{IntoLockName, LockError, LockName};
use http::request::Parts;

use crate::body::LockBody;

/// The names a request locks: none, one, or several (all-or-none).
#[derive(Debug)]
pub enum LockKeys {
    /// No lock for this request.
    None,
    /// One name.
    One(Result<LockName, LockError>),
    /// Several names, locked all-or-none.
    Many(Vec<Result<LockName, LockError>>),
}

/// What a key function may return: a name (`String`, `&'static str`, [`LockName`], or a
/// `Result` of one), an `Option` of one (`None`: no lock), or a `Vec` of names (all-or-none).
pub trait IntoLockKeys {
    /// Converts into the names to lock.
    fn into_lock_keys(self) -> LockKeys;
}

impl IntoLockKeys for LockKeys {
    fn into_lock_keys(self) -> LockKeys {
        self
    }
}

impl IntoLockKeys for String {
    fn into_lock_keys(self) -> LockKeys {
        LockKeys::One(self.into_lock_name())
    }
}

impl IntoLockKeys for &'static str {
    fn into_lock_keys(self) -> LockKeys {
        LockKeys::One(self.into_lock_name())
    }
}

impl IntoLockKeys for LockName {
    fn into_lock_keys(self) -> LockKeys {
        LockKeys::One(Ok(self))
    }
}

impl IntoLockKeys for Result<LockName, LockError> {
    fn into_lock_keys(self) -> LockKeys {
        LockKeys::One(self)
    }
}

impl<T: IntoLockKeys> IntoLockKeys for Option<T> {
    fn into_lock_keys(self) -> LockKeys {
        match self {
            Some(keys) => keys.into_lock_keys(),
            None => LockKeys::None,
        }
    }
}

impl<T: IntoLockName> IntoLockKeys for Vec<T> {
    fn into_lock_keys(self) -> LockKeys {
        LockKeys::Many(self.into_iter().map(IntoLockName::into_lock_name).collect())
    }
}

/// The request head going through an extractor, and what came out.
pub(crate) type Extracted = (Parts, Result<LockKeys, http::Response<LockBody<()>>>);

pub(crate) type ExtractFuture = Pin<Box<dyn Future<Output = Extracted> + Send>>;

/// A key function of the request head.
pub(crate) type PartsKeyFn = dyn Fn(&Parts) -> LockKeys + Send + Sync;
/// A key function of the request without its body.
pub(crate) type RequestKeyFn = dyn Fn(&http::Request<()>) -> LockKeys + Send + Sync;
/// A key function over extractors: owns the head while it runs and gives it back.
pub(crate) type ExtractKeyFn<S> = dyn Fn(Parts, S) -> ExtractFuture + Send + Sync;

/// How the layer derives keys.
pub(crate) enum KeySource<S> {
    /// From the request head, synchronously (the plain tower form).
    Parts(Arc<PartsKeyFn>),
    /// From the request without its body, synchronously (the plain tower form).
    Request(Arc<RequestKeyFn>),
    /// From extractors (the axum form): owns the head while it runs and gives it back.
    Extract(Arc<ExtractKeyFn<S>>),
}

impl<S> Clone for KeySource<S> {
    fn clone(&self) -> Self {
        match self {
            Self::Parts(f) => Self::Parts(f.clone()),
            Self::Request(f) => Self::Request(f.clone()),
            Self::Extract(f) => Self::Extract(f.clone()),
        }
    }
}

/// Named key sources for the plain tower form.
#[derive(Debug, Clone, Copy)]
pub struct KeyFrom;

impl KeyFrom {
    /// The value of header `name`, after `prefix` (no header: no lock).
    pub fn header(
        name: &'static str,
        prefix: &'static str,
    ) -> impl Fn(&Parts) -> LockKeys + Clone + Send + Sync + 'static {
        move |parts: &Parts| match parts.headers.get(name) {
            Some(value) => LockKeys::One(
                LockName::builder()
                    .literal(prefix)
                    .value(String::from_utf8_lossy(value.as_bytes()))
                    .build(),
            ),
            None => LockKeys::None,
        }
    }

    /// The `index`-th segment of the path (0 is the first after the leading `/`), after
    /// `prefix` (no such segment: no lock). `/vouchers/42/orders` has segment 1 = `42`.
    pub fn path_segment(
        index: usize,
        prefix: &'static str,
    ) -> impl Fn(&Parts) -> LockKeys + Clone + Send + Sync + 'static {
        move |parts: &Parts| match parts.uri.path().split('/').skip(1).nth(index) {
            Some(segment) if !segment.is_empty() => {
                LockKeys::One(LockName::builder().literal(prefix).value(segment).build())
            }
            _ => LockKeys::None,
        }
    }
}

#[cfg(feature = "axum")]
pub(crate) mod extract {
    //! Key functions over axum extractors, for every arity from 0 to 12.

    use std::future::Future;

    use axum_core::extract::FromRequestParts;
    use axum_core::response::IntoResponse;
    use http::request::Parts;

    use super::{ExtractFuture, IntoLockKeys};
    use crate::body::LockBody;

    /// A key function over axum extractors: `|Path(id): Path<u64>, user: User| async move { .. }`
    /// (async) or, through [`LockLayer::sync_key`](crate::LockLayer::sync_key), a plain closure.
    ///
    /// `T` names the extractors; it is inferred.
    pub trait KeyFn<S, T>: Clone + Send + Sync + 'static {
        /// Runs the extractors on `parts` and the function on their values.
        fn call(&self, parts: Parts, state: S) -> ExtractFuture;
    }

    /// A synchronous key function over axum extractors. See [`KeyFn`].
    pub trait SyncKeyFn<S, T>: Clone + Send + Sync + 'static {
        /// Runs the extractors on `parts` and the function on their values.
        fn call(&self, parts: Parts, state: S) -> ExtractFuture;
    }

    fn rejection<R: IntoResponse>(rejection: R) -> http::Response<LockBody<()>> {
        rejection.into_response().map(LockBody::boxed)
    }

    macro_rules! key_fn {
        ($($ty:ident),*) => {
            #[allow(non_snake_case, unused_mut, unused_variables)]
            impl<F, Fut, R, S, $($ty,)*> KeyFn<S, ($($ty,)*)> for F
            where
                F: Fn($($ty,)*) -> Fut + Clone + Send + Sync + 'static,
                Fut: Future<Output = R> + Send + 'static,
                R: IntoLockKeys,
                S: Send + Sync + 'static,
                $($ty: FromRequestParts<S> + Send + 'static,)*
            {
                fn call(&self, mut parts: Parts, state: S) -> ExtractFuture {
                    let f = self.clone();
                    Box::pin(async move {
                        $(
                            let $ty = match $ty::from_request_parts(&mut parts, &state).await {
                                Ok(value) => value,
                                Err(err) => return (parts, Err(rejection(err))),
                            };
                        )*
                        let keys = f($($ty,)*).await.into_lock_keys();
                        (parts, Ok(keys))
                    })
                }
            }

            #[allow(non_snake_case, unused_mut, unused_variables)]
            impl<F, R, S, $($ty,)*> SyncKeyFn<S, ($($ty,)*)> for F
            where
                F: Fn($($ty,)*) -> R + Clone + Send + Sync + 'static,
                R: IntoLockKeys + Send + 'static,
                S: Send + Sync + 'static,
                $($ty: FromRequestParts<S> + Send + 'static,)*
            {
                fn call(&self, mut parts: Parts, state: S) -> ExtractFuture {
                    let f = self.clone();
                    Box::pin(async move {
                        $(
                            let $ty = match $ty::from_request_parts(&mut parts, &state).await {
                                Ok(value) => value,
                                Err(err) => return (parts, Err(rejection(err))),
                            };
                        )*
                        let keys = f($($ty,)*).into_lock_keys();
                        (parts, Ok(keys))
                    })
                }
            }
        };
    }

    key_fn!();
    key_fn!(T1);
    key_fn!(T1, T2);
    key_fn!(T1, T2, T3);
    key_fn!(T1, T2, T3, T4);
    key_fn!(T1, T2, T3, T4, T5);
    key_fn!(T1, T2, T3, T4, T5, T6);
    key_fn!(T1, T2, T3, T4, T5, T6, T7);
    key_fn!(T1, T2, T3, T4, T5, T6, T7, T8);
    key_fn!(T1, T2, T3, T4, T5, T6, T7, T8, T9);
    key_fn!(T1, T2, T3, T4, T5, T6, T7, T8, T9, T10);
    key_fn!(T1, T2, T3, T4, T5, T6, T7, T8, T9, T10, T11);
    key_fn!(T1, T2, T3, T4, T5, T6, T7, T8, T9, T10, T11, T12);
}
