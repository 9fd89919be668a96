//! The HTTP face: the JSON API and the page.
//!
//! | route | what |
//! | --- | --- |
//! | `GET /` | the page |
//! | `GET /api/vouchers`, `POST /api/vouchers` | list, create ([`NewVoucher`]) |
//! | `POST /api/vouchers/{id}/orders` | buy one ([`Buyer`]): 201 [`Order`](crate::Order); 404, 409 with a message |
//! | `GET /api/users/{user}/orders` | a user's voucher orders |
//! | `GET /api/skus`, `POST /api/skus` | list, create ([`NewSku`]) |
//! | `GET /api/carts/{user}`, `POST /api/carts/{user}/items` | a cart, add to it ([`CartItem`]) |
//! | `POST /api/carts/{user}/checkout` | check out: 201 [`CartOrder`](crate::CartOrder); 409 when busy or out of stock |
//! | `GET /api/stats` | the invariants and this instance's counters ([`Stats`](crate::Stats)) |
//!
//! Buying is guarded inside the service ([`App::buy`], `#[distributed_lock]`); checkout at the
//! route, by a `LockLayer` that locks every SKU in the cart:
//!
//! ```text
//! Router::new()
//!     .route("/api/carts/{user}/checkout", post(checkout))
//!     .route_layer(
//!         LockLayer::with_state(app.locker.clone(), app.clone())
//!             .key(|CartLocks(skus): CartLocks| async move { skus }) // all-or-none
//!             .wait(Duration::from_secs(2)),
//!     )
//! ```

use std::time::{Duration, Instant};

use axum::extract::rejection::JsonRejection;
use axum::extract::{FromRequest, FromRequestParts, Path, Request, State};
use axum::http::StatusCode;
use axum::http::request::Parts;
use axum::middleware::{self, Next};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use dlock_core::LockName;
use dlock_tower::{HeldLocks, LockLayer};
use serde::de::DeserializeOwned;

use crate::{App, AppError, Buyer, CartItem, Counters, Fences, NewSku, NewVoucher};

/// The page, served at `/`.
pub const PAGE: &str = include_str!("../static/index.html");

/// How long a purchase waits for a busy lock before it is answered 409.
pub const LOCK_WAIT: Duration = Duration::from_secs(2);

/// A JSON body whose rejections are answered like every other error: `{"error": "..."}` with
/// the rejection's status (400 malformed, 415 not JSON, 422 wrong shape).
#[derive(Debug)]
pub struct Input<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for Input<T> {
    type Rejection = AppError;

    async fn from_request(req: Request, state: &S) -> Result<Self, AppError> {
        match Json::<T>::from_request(req, state).await {
            Ok(Json(value)) => Ok(Input(value)),
            Err(rejection) => Err(json_rejection(&rejection)),
        }
    }
}

fn json_rejection(rejection: &JsonRejection) -> AppError {
    AppError::Rejected(rejection.status(), rejection.body_text())
}

/// The lock names of every SKU in the cart of the user in the path: the checkout's keys.
#[derive(Debug)]
pub struct CartLocks(pub Vec<LockName>);

/// When a request asked for its locks (set by [`CartLocks`]), to count lock waits.
#[derive(Debug, Clone, Copy)]
struct AskedAt(Instant);

impl FromRequestParts<App> for CartLocks {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, app: &App) -> Result<Self, Response> {
        let Path(user) = Path::<i64>::from_request_parts(parts, app)
            .await
            .map_err(IntoResponse::into_response)?;
        // A database error is an error answer here, never "no lock".
        let names = app
            .cart_lock_names(user)
            .await
            .map_err(IntoResponse::into_response)?;
        parts.extensions.insert(AskedAt(Instant::now()));
        Ok(CartLocks(names))
    }
}

async fn list_vouchers(State(app): State<App>) -> Result<impl IntoResponse, AppError> {
    Ok(Json(app.vouchers().await?))
}

async fn create_voucher(
    State(app): State<App>,
    Input(new): Input<NewVoucher>,
) -> Result<impl IntoResponse, AppError> {
    Ok((StatusCode::CREATED, Json(app.create_voucher(&new).await?)))
}

async fn buy_voucher(
    State(app): State<App>,
    Path(voucher_id): Path<i64>,
    Input(buyer): Input<Buyer>,
) -> Result<impl IntoResponse, AppError> {
    Ok((
        StatusCode::CREATED,
        Json(app.buy(buyer.user_id, voucher_id).await?),
    ))
}

async fn user_orders(
    State(app): State<App>,
    Path(user): Path<i64>,
) -> Result<impl IntoResponse, AppError> {
    Ok(Json(app.orders_of(user).await?))
}

async fn list_skus(State(app): State<App>) -> Result<impl IntoResponse, AppError> {
    Ok(Json(app.skus().await?))
}

async fn create_sku(
    State(app): State<App>,
    Input(new): Input<NewSku>,
) -> Result<impl IntoResponse, AppError> {
    Ok((StatusCode::CREATED, Json(app.create_sku(&new).await?)))
}

async fn cart(
    State(app): State<App>,
    Path(user): Path<i64>,
) -> Result<impl IntoResponse, AppError> {
    Ok(Json(app.cart(user).await?))
}

async fn add_to_cart(
    State(app): State<App>,
    Path(user): Path<i64>,
    Input(item): Input<CartItem>,
) -> Result<impl IntoResponse, AppError> {
    app.add_to_cart(user, &item).await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn checkout(
    State(app): State<App>,
    Path(user): Path<i64>,
    held: Option<Extension<HeldLocks>>,
    asked: Option<Extension<AskedAt>>,
) -> Result<impl IntoResponse, AppError> {
    let fences = if app.locks {
        let held = held.map(|Extension(held)| held).unwrap_or_default();
        let waited = asked.map_or(Duration::ZERO, |Extension(AskedAt(at))| at.elapsed());
        app.counters.ran_locked(waited);
        Some(Fences::from_held(&held))
    } else {
        None
    };
    Ok((
        StatusCode::CREATED,
        Json(app.checkout(user, fences.as_ref()).await?),
    ))
}

async fn stats(State(app): State<App>) -> Result<impl IntoResponse, AppError> {
    Ok(Json(app.stats().await?))
}

async fn page() -> Html<&'static str> {
    Html(PAGE)
}

/// Counts purchase requests and their 409s, including the lock layer's own.
async fn count(State(app): State<App>, request: Request, next: Next) -> Response {
    Counters::bump(&app.counters.requests);
    let response = next.run(request).await;
    if response.status() == StatusCode::CONFLICT {
        Counters::bump(&app.counters.conflicts);
    }
    response
}

/// The shop's router. With locks, checkout holds every SKU of the cart (all-or-none) through a
/// `LockLayer`; busy after [`LOCK_WAIT`]: 409 with `Retry-After`.
pub fn router(app: App) -> Router {
    let mut checkout_route = Router::new().route("/api/carts/{user}/checkout", post(checkout));
    if app.locks {
        checkout_route = checkout_route.route_layer(
            LockLayer::with_state(app.locker.clone(), app.clone())
                .key(|CartLocks(skus): CartLocks| async move { skus })
                .wait(LOCK_WAIT),
        );
    }
    let purchases = Router::new()
        .route("/api/vouchers/{id}/orders", post(buy_voucher))
        .merge(checkout_route)
        .route_layer(middleware::from_fn_with_state(app.clone(), count));
    Router::new()
        .route("/", get(page))
        .route("/api/vouchers", get(list_vouchers).post(create_voucher))
        .route("/api/users/{user}/orders", get(user_orders))
        .route("/api/skus", get(list_skus).post(create_sku))
        .route("/api/carts/{user}", get(cart))
        .route("/api/carts/{user}/items", post(add_to_cart))
        .route("/api/stats", get(stats))
        .merge(purchases)
        .with_state(app)
}
