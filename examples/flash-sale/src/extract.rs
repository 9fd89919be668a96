//! Extractors whose rejections are answered like every other error (problem+json), and the
//! checkout's lock key.

use std::time::Instant;

use axum::Json;
use axum::extract::{FromRequest, FromRequestParts, Path, Query, Request};
use axum::http::StatusCode;
use axum::http::request::Parts;
use axum::response::{IntoResponse, Response};
use dlock_core::LockName;
use serde::de::DeserializeOwned;

use crate::auth::Shopper;
use crate::validate::BODY_TIMEOUT;
use crate::{App, AppError, validate};

/// A JSON body: 400 malformed, 408 not all there within [`BODY_TIMEOUT`] (its connection is
/// closed: a client that stops sending holds neither a connection nor a task), 413 too large, 415
/// not JSON, 422 wrong shape.
#[derive(Debug)]
pub(crate) struct Input<T>(pub(crate) T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for Input<T> {
    type Rejection = AppError;

    async fn from_request(req: Request, state: &S) -> Result<Self, AppError> {
        match tokio::time::timeout(BODY_TIMEOUT, Json::<T>::from_request(req, state)).await {
            Ok(Ok(Json(value))) => Ok(Input(value)),
            Ok(Err(rejection)) => Err(AppError::Rejected(
                rejection.status(),
                rejection.body_text(),
            )),
            Err(_) => {
                tracing::info!("request body stalled: 408");
                Err(AppError::Rejected(
                    StatusCode::REQUEST_TIMEOUT,
                    format!(
                        "the request body did not arrive within {} s",
                        BODY_TIMEOUT.as_secs()
                    ),
                ))
            }
        }
    }
}

/// The one id in the path (`/api/cart/items/{sku}`, `/api/vouchers/{id}/orders`): 1 to
/// 2⁵³ − 1, else 400.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PathId(pub(crate) i64);

impl<S: Send + Sync> FromRequestParts<S> for PathId {
    type Rejection = AppError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, AppError> {
        let Path(id) = Path::<i64>::from_request_parts(parts, state)
            .await
            .map_err(|r| AppError::Rejected(r.status(), r.body_text()))?;
        Ok(PathId(validate::id("the id in the path", id)?))
    }
}

/// A query string: 400 when it doesn't parse.
#[derive(Debug)]
pub(crate) struct Params<T>(pub(crate) T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequestParts<S> for Params<T> {
    type Rejection = AppError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, AppError> {
        let Query(value) = Query::<T>::from_request_parts(parts, state)
            .await
            .map_err(|r| AppError::Rejected(r.status(), r.body_text()))?;
        Ok(Params(value))
    }
}

/// The checkout's locks: the signed-in shopper's cart and every SKU in it now
/// ([`App::checkout_lock_names`]). Rejects like the other extractors (no session: 401, database
/// down: 500), so a failure is never "no lock".
#[derive(Debug)]
pub(crate) struct CheckoutLocks(pub(crate) Vec<LockName>);

/// When a request asked for its locks (set by [`CheckoutLocks`]), to count lock waits.
#[derive(Debug, Clone, Copy)]
pub(crate) struct AskedAt(pub(crate) Instant);

impl FromRequestParts<App> for CheckoutLocks {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, app: &App) -> Result<Self, Response> {
        let Shopper(user) = Shopper::from_request_parts(parts, app)
            .await
            .map_err(IntoResponse::into_response)?;
        let names = app
            .checkout_lock_names(user)
            .await
            .map_err(IntoResponse::into_response)?;
        parts.extensions.insert(AskedAt(Instant::now()));
        Ok(CheckoutLocks(names))
    }
}
