//! Where a request's lock key comes from.

use std::fmt::Write as _;
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

/// Ready-made key functions for the plain tower form ([`LockLayer::key_from_parts`]).
///
/// Each puts a value from the request after a literal `prefix`, escaped (see
/// [`LockName::builder`]), and takes no lock when the value is missing. Distinct values always
/// give distinct names: a value that is not UTF-8 keeps its bytes (`%XX`), never a replacement
/// character that other values share.
///
/// ```
/// use dlock_tower::{KeyFrom, LockLayer};
///
/// let locker = dlock_core::Locker::memory();
/// // One request at a time per idempotency key.
/// let by_header = LockLayer::new(locker.clone())
///     .key_from_parts(KeyFrom::header("idempotency-key", "payment:"));
/// // `/accounts/42/transfers`: one transfer at a time per account.
/// let by_segment = LockLayer::new(locker.clone())
///     .key_from_parts(KeyFrom::path_segment(1, "account:"));
/// // `?tenant=acme`: one import at a time per tenant.
/// let by_query = LockLayer::new(locker).key_from_parts(KeyFrom::query("tenant", "import:"));
/// # let _ = (by_header, by_segment, by_query);
/// ```
///
/// # The text as sent
///
/// These keys are the text the client sent (percent-decoded), not a parsed value: `42`, `042`
/// and `+42` are three keys, so `/accounts/042/transfers` does not wait for
/// `/accounts/42/transfers`. When the handler parses the value (`Path<u64>`, a UUID, a
/// case-insensitive name), build the key from the same parse, so that every spelling the
/// handler treats as one resource takes one lock — with the extractor form (feature `axum`):
///
/// ```
/// use axum::{Router, extract::Path, routing::post};
/// use dlock_tower::LockLayer;
///
/// let app: Router = Router::new()
///     .route(
///         "/accounts/{id}/transfers",
///         post(|Path(id): Path<u64>| async move { format!("transfer from {id}") }),
///     )
///     // `42`, `042` and `+42` are all account 42: one lock, `account:42`.
///     .route_layer(
///         LockLayer::new(dlock_core::Locker::memory())
///             .sync_key(|Path(id): Path<u64>| format!("account:{id}")),
///     );
/// # let _ = app;
/// ```
///
/// or, in the plain tower form, by parsing in your own `key_from_parts` function as the
/// handler does.
///
/// [`LockLayer::key_from_parts`]: crate::LockLayer::key_from_parts
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct KeyFrom;

impl KeyFrom {
    /// The value of header `name` (the first one, if repeated), after `prefix`. No header: no
    /// lock.
    ///
    /// The value is keyed as its bytes: a UTF-8 value as its text (escaped), and bytes that are
    /// not UTF-8 as `%XX`, so two different values never share a lock.
    pub fn header(
        name: &'static str,
        prefix: &'static str,
    ) -> impl Fn(&Parts) -> LockKeys + Clone + Send + Sync + 'static {
        move |parts: &Parts| match parts.headers.get(name) {
            Some(value) => LockKeys::One(name_of(prefix, value.as_bytes())),
            None => LockKeys::None,
        }
    }

    /// The `index`-th segment of the path, percent-decoded, after `prefix` (0 is the segment
    /// after the leading `/`: `/vouchers/42/orders` has segment 1 = `42`). No such segment, or
    /// an empty one: no lock.
    ///
    /// Decoding matters: `/vouchers/%34%32/orders` names the same voucher as
    /// `/vouchers/42/orders`, and must take the same lock. Decoded bytes that are not UTF-8
    /// are keyed as `%XX`, each value to a lock of its own.
    ///
    /// The key is the segment's text as sent, not a number: `/vouchers/042/orders` and
    /// `/vouchers/+42/orders` take other locks than `/vouchers/42/orders`, though a
    /// `Path<u64>` handler reads all three as voucher 42. When the handler parses the segment,
    /// build the key from the same parse (`.sync_key(|Path(id): Path<u64>| ..)`; see
    /// [the text as sent](KeyFrom#the-text-as-sent)).
    pub fn path_segment(
        index: usize,
        prefix: &'static str,
    ) -> impl Fn(&Parts) -> LockKeys + Clone + Send + Sync + 'static {
        move |parts: &Parts| match parts.uri.path().split('/').skip(1).nth(index) {
            Some(segment) if !segment.is_empty() => {
                LockKeys::One(name_of(prefix, &percent_decode(segment, false)))
            }
            _ => LockKeys::None,
        }
    }

    /// The value of query parameter `name` (the first one, if repeated; `+` and `%XX`
    /// decoded), after `prefix`. No such parameter, or an empty value: no lock. Decoded bytes
    /// that are not UTF-8 are keyed as `%XX`, each value to a lock of its own.
    ///
    /// As with [`path_segment`](KeyFrom::path_segment), the key is the value's text as sent:
    /// `?account=42` and `?account=042` take different locks. When the handler parses the
    /// value (`Query<T>` with a number field), build the key from the same parse
    /// (`.sync_key(|Query(q): Query<T>| ..)`; see [the text as sent](KeyFrom#the-text-as-sent)).
    pub fn query(
        name: &'static str,
        prefix: &'static str,
    ) -> impl Fn(&Parts) -> LockKeys + Clone + Send + Sync + 'static {
        move |parts: &Parts| {
            let value = parts.uri.query().and_then(|query| {
                query.split('&').find_map(|pair| {
                    let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
                    (percent_decode(key, true) == name.as_bytes())
                        .then(|| percent_decode(value, true))
                })
            });
            match value {
                Some(value) if !value.is_empty() => LockKeys::One(name_of(prefix, &value)),
                _ => LockKeys::None,
            }
        }
    }
}

/// The name `prefix` + the escaped `value`. A UTF-8 value is escaped as
/// [`NameBuilder::value`](dlock_core::NameBuilder::value) escapes text (every byte outside
/// `[A-Za-z0-9_.-]` as `%XX`); the bytes of any other value are escaped the same way, byte for
/// byte, so the name is one-to-one with the value's bytes.
fn name_of(prefix: &'static str, value: &[u8]) -> Result<LockName, LockError> {
    if let Ok(text) = std::str::from_utf8(value) {
        return LockName::builder().literal(prefix).value(text).build();
    }
    let mut escaped = String::with_capacity(value.len() * 3);
    for chunk in value.utf8_chunks() {
        if !chunk.valid().is_empty() {
            // The text between the stray bytes, escaped (and checked) by the core.
            escaped.push_str(LockName::builder().value(chunk.valid()).build()?.as_str());
        }
        for byte in chunk.invalid() {
            let _ = write!(escaped, "%{byte:02X}");
        }
    }
    // Only `[A-Za-z0-9_.-]` and `%XX` escapes: valid literal text.
    LockName::builder()
        .literal(prefix)
        .literal(&escaped)
        .build()
}

/// Decodes `%XX` escapes (and, in a query, `+` as a space) into bytes, which may not be UTF-8.
/// A malformed escape is kept as it is.
fn percent_decode(s: &str, plus_is_space: bool) -> Vec<u8> {
    if plus_is_space && s.contains('+') {
        // Before decoding: an escaped `%2B` is a plus.
        percent_encoding::percent_decode_str(&s.replace('+', " ")).collect()
    } else {
        percent_encoding::percent_decode_str(s).collect()
    }
}

#[cfg(feature = "axum")]
#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
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

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(uri: &str) -> Parts {
        let (parts, ()) = http::Request::get(uri)
            .header("x-account", "7:a")
            .body(())
            .map(http::Request::into_parts)
            .unwrap_or_else(|e| panic!("{e}"));
        parts
    }

    fn one(keys: LockKeys) -> Option<String> {
        match keys {
            LockKeys::None => None,
            LockKeys::One(name) => Some(
                name.map(|n| n.to_string())
                    .unwrap_or_else(|e| e.to_string()),
            ),
            LockKeys::Many(_) => panic!("several keys"),
        }
    }

    #[test]
    fn percent_decoding() {
        assert_eq!(percent_decode("%34%32", false), b"42");
        assert_eq!(percent_decode("a+b%2", false), b"a+b%2");
        assert_eq!(percent_decode("a+b%zz", true), b"a b%zz");
        assert_eq!(percent_decode("%C3%A9", false), "é".as_bytes());
        assert_eq!(percent_decode("%FF", false), b"\xff");
        assert_eq!(percent_decode("a%2Bb+c", true), b"a+b c");
    }

    #[test]
    fn names_are_one_to_one_with_the_values_bytes() {
        let name = |bytes: &[u8]| name_of("p:", bytes).map(|n| n.to_string());
        // UTF-8 values: exactly what the builder gives their text.
        for text in ["42", "ac me", "é", "7:a", "%FF", "a%2Fb", ""] {
            let expected = LockName::builder().literal("p:").value(text).build();
            assert_eq!(
                name(text.as_bytes()).ok(),
                expected.map(|n| n.to_string()).ok()
            );
        }
        // Other bytes keep their value: no two share a name, nor with any text.
        let values: [&[u8]; 7] = [
            b"pay-\xff",
            b"pay-\xfe",
            b"pay-%FF",
            "pay-\u{fffd}".as_bytes(),
            b"\xc3",
            b"\xc3\xa9\xff",
            b"\xffa:b\xfe",
        ];
        let names: Vec<_> = values
            .iter()
            .map(|v| name(v).unwrap_or_else(|e| panic!("{e}")))
            .collect();
        for (i, a) in names.iter().enumerate() {
            for b in &names[i + 1..] {
                assert_ne!(a, b);
            }
        }
        assert_eq!(names[0], "p:pay-%FF");
        assert_eq!(names[2], "p:pay-%25FF");
        assert_eq!(names[6], "p:%FFa%3Ab%FE");
        // Control characters are refused in any value.
        assert!(name(b"a\tb\xff").is_err());
    }

    #[test]
    fn ready_made_keys() {
        let segment = KeyFrom::path_segment(1, "voucher:");
        assert_eq!(
            one(segment(&parts("/vouchers/42/orders"))).as_deref(),
            Some("voucher:42")
        );
        assert_eq!(
            one(segment(&parts("/vouchers/%34%32/orders"))),
            one(segment(&parts("/vouchers/42/orders")))
        );
        assert_eq!(one(segment(&parts("/vouchers"))), None);
        // The text as sent, not a number.
        assert_eq!(
            one(segment(&parts("/vouchers/042/orders"))).as_deref(),
            Some("voucher:042")
        );
        assert_eq!(
            one(segment(&parts("/vouchers/%FF/orders"))).as_deref(),
            Some("voucher:%FF")
        );
        assert_ne!(
            one(segment(&parts("/vouchers/%FF/orders"))),
            one(segment(&parts("/vouchers/%FE/orders")))
        );
        assert_eq!(one(segment(&parts("/vouchers//orders"))), None);

        let header = KeyFrom::header("x-account", "account:");
        assert_eq!(one(header(&parts("/"))).as_deref(), Some("account:7%3Aa"));
        assert_eq!(one(KeyFrom::header("x-other", "o:")(&parts("/"))), None);

        let query = KeyFrom::query("tenant", "tenant:");
        assert_eq!(
            one(query(&parts("/?a=1&tenant=ac+me"))).as_deref(),
            Some("tenant:ac%20me")
        );
        assert_eq!(
            one(query(&parts("/?tenant=ac%20me"))).as_deref(),
            Some("tenant:ac%20me")
        );
        assert_eq!(one(query(&parts("/?tenant="))), None);
        assert_eq!(one(query(&parts("/?tenants=x"))), None);
        assert_eq!(
            one(query(&parts("/?tenant=%FF"))).as_deref(),
            Some("tenant:%FF")
        );
        assert_eq!(
            one(query(&parts("/?%74enant=acme"))).as_deref(),
            Some("tenant:acme")
        );
        assert_eq!(one(query(&parts("/"))), None);
    }
}
