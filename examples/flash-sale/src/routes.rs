//! The HTTP face: the JSON API, the pages, the health checks.
//!
//! | route | takes | answers |
//! | --- | --- | --- |
//! | `GET /` | | the shop's page |
//! | `GET /operator` | operator | the operator's page; a browser without the credential is sent to `/operator/login` (303) |
//! | `GET /operator/plots.js` | operator | the script that draws the operator's plots (`text/javascript`) |
//! | `GET /operator/login` | | the operator's sign-in page: the token, entered once |
//! | `POST /api/operator/login` | `{"token"}` | 204 and the operator's cookie; 401 wrong token |
//! | `POST /api/operator/logout` | | 204, the operator's cookie removed |
//! | `GET /healthz` | | 200 `{"status": "ok"}` while the process serves |
//! | `GET /readyz` | | 200 `{"status": "ready", "redis": "up", "database": "up"}`; 503 problem naming what is down (`"redis": "down"`, `"database": "down"`; Redis is `"unused"` with `--no-locks`) |
//! | `POST /api/login` | `{"name"}` | 200 [`User`](crate::model::User) `{"id", "name"}`, created on first login, and a session cookie ([`crate::auth`]) |
//! | `POST /api/logout` | session | 204; the session is ended on every instance and its cookie removed |
//! | `GET /api/me` | session | 200 the signed-in [`User`](crate::model::User) |
//! | `GET /api/vouchers` | | 200 `[`[`Voucher`](crate::model::Voucher)`]`: `{"id", "title", "price_cents", "currency", "stock", "starts_at_ms", "ends_at_ms"}` |
//! | `POST /api/vouchers` | operator; [`NewVoucher`] `{"title", "price_cents", "stock", "starts_at_ms", "ends_at_ms"}` | 201 the voucher |
//! | `POST /api/vouchers/{id}/orders` | session | 201 [`Order`](crate::model::Order) for the signed-in shopper; 404 unknown voucher (checked before any lock); 409 sold out, not started, ended, already ordered, busy (`Retry-After`) |
//! | `GET /api/skus` | | 200 `[`[`Sku`](crate::model::Sku)`]`: `{"id", "name", "price_cents", "currency", "stock"}` |
//! | `POST /api/skus` | operator; [`NewSku`] `{"name", "price_cents", "stock"}` | 201 the SKU |
//! | `GET /api/cart` | session | 200 [`Cart`](crate::model::Cart) `{"items": [{"sku_id", "name", "qty", "price_cents", "currency"}], "total_cents", "currency"}` |
//! | `POST /api/cart/items` | session; [`CartItem`] `{"sku_id", "qty"}` | 200 the cart; 404 unknown SKU (nothing stored); 400 qty out of bounds; 422 the cart would hold more than 100 of the SKU or more than 20 SKUs; 409 busy |
//! | `DELETE /api/cart/items/{sku}` | session | 200 the cart without that SKU |
//! | `DELETE /api/cart/items` | session | 200 the (empty) cart |
//! | `POST /api/cart/checkout` | session | 201 [`CartOrder`](crate::model::CartOrder) `{"id", "user_id", "items", "total_cents", "currency", "at_ms"}`; 400 empty cart; 409 "cart changed during checkout; nothing was bought, retry", out of stock, busy (`Retry-After`) |
//! | `GET /api/orders` | session | 200 [`Orders`](crate::model::Orders) `{"vouchers": [`[`Order`](crate::model::Order)`], "carts": [`[`CartOrder`](crate::model::CartOrder)`]}` |
//! | `GET /api/events` | | `text/event-stream`: `event: catalog` (`{"vouchers", "skus"}`) on connect and whenever the catalog or a stock changes, on any instance; with a session, also `event: cart` ([`Cart`](crate::model::Cart)) and `event: orders` ([`Orders`](crate::model::Orders)) on connect and when they change; a keep-alive comment every 15 s. `?user={id}` may name only the session's own user (401 without a session, 403 another's) |
//! | `GET /api/stats` | operator | 200 [`Stats`](crate::model::Stats), over every instance |
//! | `GET /api/stats/series?since_ms=` | operator | 200 [`Series`](crate::series::Series): every instance's samples, one a second, of the last five minutes (only those after `since_ms` when given: 0 to 2⁵³ − 1, else 400), each instance with its newest sample's time and whether it still reports |
//!
//! "session": the request carries a signed-in shopper's session cookie, else 401; the user is
//! the session's, never one named in the path or the body, so no request reaches another
//! shopper's cart, orders or stream. Every `POST`, `PUT`, `PATCH` or `DELETE` that a browser
//! says comes from another site's page is refused with 403 ([`auth::same_origin_only`]).
//! "operator": the request carries the operator's credential (`Authorization: Bearer <token>`
//! or the cookie `/operator/login` sets; [`crate::auth`]), else 401.
//!
//! A [`Voucher`](crate::model::Voucher) order is `{"id", "user_id", "voucher_id", "title",
//! "price_cents", "currency", "fencing_token", "at_ms"}`; a cart order's items are cart lines.
//!
//! **Bounds** (400 outside them): ids 1 to 2⁵³ − 1; `price_cents` 0 to 100,000,000; `stock` 0
//! to 1,000,000; `qty` 1 to 100 per addition, and at most 100 of one SKU and 20 SKUs in a cart
//! (422); user names 1 to 40 characters, SKU names 1 to 80, voucher titles 1 to 120, after
//! trimming, without control or format characters (Unicode Cc and Cf: no NUL, newline, escape,
//! bidi override or zero-width joiner); times 0 to 2⁵³ − 1 ms, the end after the start; request
//! bodies at most 16 KiB (413), arriving whole within 5 s (408, and the connection closed). Money is integer cents in one currency (`"EUR"`); times are
//! milliseconds since the epoch. Every number the API answers is a whole number at most 2⁵³ − 1,
//! exact in JavaScript (`/api/stats` clamps its counts there).
//!
//! **Errors.** Every answer that is not a success — the shop's, the lock layer's, axum's own
//! (bad JSON, bad path, 404, 405) — is `application/problem+json`:
//! `{"type": "about:blank", "title", "status", "detail"}`, as dlock-core's `ErrorResponses`
//! renders lock errors (a lock's name, which holds a user id, stays out). `detail` is meant for
//! the shopper; a 500's cause is logged under the request id (`x-request-id`, echoed on every
//! answer), never sent. A busy lock is 409 with `Retry-After` (at most 2 s); Redis unreachable
//! is 503, and so is the database down (noticed within about 1.5 s, [`crate::db::Watch`]) or
//! too busy to give a connection within 5 s (with `Retry-After: 1`; its cause is logged,
//! never sent).
//!
//! # Locks
//!
//! Buying a voucher is guarded inside the service ([`App::buy`], `#[distributed_lock]`). A cart
//! edit takes the lock `cart:<user>` in the service. Checkout is guarded at the route by a
//! `LockLayer` that locks the cart and every SKU in it, all-or-none:
//!
//! ```text
//! Router::new()
//!     .route("/api/cart/checkout", post(checkout))
//!     .route_layer(
//!         LockLayer::with_state(app.locker.clone(), app.clone())
//!             // `cart:<user>` (the session's user) and `sku:<id>` for every SKU in the cart now
//!             .key(|CheckoutLocks(names): CheckoutLocks| async move { names })
//!             .wait(LOCK_WAIT),
//!     )
//! ```
//!
//! The key function reads the cart before the locks are taken; the handler reads it again under
//! them and answers 409 "cart changed" for a SKU it doesn't hold.

use std::time::Duration;

use axum::extract::{DefaultBodyLimit, State};
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{delete, get, post};
use axum::{Extension, Json, Router};
use dlock_tower::{HeldLocks, LockLayer};
use serde::Deserialize;

use crate::auth::{self, Operator, Shopper};
use crate::extract::{AskedAt, CheckoutLocks, Input, Params, PathId};
use crate::series::Purchase;
use crate::{
    App, AppError, CartItem, Counter, Fences, NewSku, NewVoucher, health, telemetry, validate,
};

/// The shop's page, served at `/`.
pub const PAGE: &str = include_str!("../static/index.html");

/// The operator's page, served at `/operator` to the operator.
pub const OPERATOR_PAGE: &str = include_str!("../static/operator.html");

/// The script that draws the operator's plots, served at `/operator/plots.js` to the operator.
pub const OPERATOR_PLOTS: &str = include_str!("../static/plots.js");

/// The operator's sign-in page, served at `/operator/login`.
pub const OPERATOR_LOGIN_PAGE: &str = include_str!("../static/operator-login.html");

/// How long a purchase or a cart edit waits for a busy lock before it is answered 409.
pub const LOCK_WAIT: Duration = Duration::from_secs(2);

async fn list_vouchers(State(app): State<App>) -> Result<impl IntoResponse, AppError> {
    Ok(Json(app.vouchers().await?))
}

async fn create_voucher(
    State(app): State<App>,
    _: Operator,
    Input(new): Input<NewVoucher>,
) -> Result<impl IntoResponse, AppError> {
    Ok((StatusCode::CREATED, Json(app.create_voucher(&new).await?)))
}

async fn buy_voucher(
    State(app): State<App>,
    PathId(voucher): PathId,
    Shopper(user): Shopper,
) -> Result<impl IntoResponse, AppError> {
    Ok((StatusCode::CREATED, Json(app.buy(user, voucher).await?)))
}

async fn user_orders(
    State(app): State<App>,
    Shopper(user): Shopper,
) -> Result<impl IntoResponse, AppError> {
    Ok(Json(app.orders_of(user).await?))
}

async fn list_skus(State(app): State<App>) -> Result<impl IntoResponse, AppError> {
    Ok(Json(app.skus().await?))
}

async fn create_sku(
    State(app): State<App>,
    _: Operator,
    Input(new): Input<NewSku>,
) -> Result<impl IntoResponse, AppError> {
    Ok((StatusCode::CREATED, Json(app.create_sku(&new).await?)))
}

async fn cart(
    State(app): State<App>,
    Shopper(user): Shopper,
) -> Result<impl IntoResponse, AppError> {
    Ok(Json(app.cart(user).await?))
}

async fn add_to_cart(
    State(app): State<App>,
    Shopper(user): Shopper,
    Input(item): Input<CartItem>,
) -> Result<impl IntoResponse, AppError> {
    Ok(Json(app.add_to_cart(user, &item).await?))
}

async fn remove_from_cart(
    State(app): State<App>,
    Shopper(user): Shopper,
    PathId(sku): PathId,
) -> Result<impl IntoResponse, AppError> {
    Ok(Json(app.remove_from_cart(user, sku).await?))
}

async fn clear_cart(
    State(app): State<App>,
    Shopper(user): Shopper,
) -> Result<impl IntoResponse, AppError> {
    Ok(Json(app.clear_cart(user).await?))
}

async fn checkout(
    State(app): State<App>,
    Shopper(user): Shopper,
    held: Option<Extension<HeldLocks>>,
    asked: Option<Extension<AskedAt>>,
) -> Result<impl IntoResponse, AppError> {
    let fences = if app.locks {
        let Some(Extension(held)) = held else {
            return Err(AppError::Internal(
                "checkout ran without its locks".to_owned(),
            ));
        };
        let waited = asked.map_or(Duration::ZERO, |Extension(AskedAt(at))| at.elapsed());
        app.counters.ran_locked(waited);
        tracing::info!(
            locks = ?held.names(),
            waited_ms = waited.as_millis() as u64,
            "locks acquired"
        );
        // The tokens, asked for before anything is written (a plain lock's is minted by Redis
        // at its first ask; the log line above asks for none). A lost lock or an unreachable
        // Redis is answered as the lock's error, and nothing is bought.
        Some(Fences::from_held(&held).await?)
    } else {
        None
    };
    Ok((
        StatusCode::CREATED,
        Json(app.checkout(user, fences.as_ref()).await?),
    ))
}

#[derive(Debug, Deserialize)]
struct EventsQuery {
    user: Option<i64>,
}

/// The stream carries the signed-in shopper's cart and orders, and only theirs: `?user=` may
/// name the session's own user (401 without a session, 403 for anyone else's).
async fn events(
    State(app): State<App>,
    Params(query): Params<EventsQuery>,
    headers: axum::http::HeaderMap,
) -> Result<impl IntoResponse, AppError> {
    let asked = query
        .user
        .map(|user| validate::id("user", user))
        .transpose()?;
    let user = auth::session_user(&app, &headers).await?;
    match (asked, user) {
        (Some(_), None) => {
            return Err(AppError::Rejected(
                StatusCode::UNAUTHORIZED,
                "sign in first: a shopper's stream is their own (POST /api/login)".to_owned(),
            ));
        }
        (Some(asked), Some(user)) if asked != user => {
            return Err(AppError::Rejected(
                StatusCode::FORBIDDEN,
                "that is another shopper's stream".to_owned(),
            ));
        }
        _ => {}
    }
    let ends = auth::session_ends(app.clone(), &headers);
    crate::events::stream(app, user, ends).await
}

async fn stats(State(app): State<App>, _: Operator) -> Result<impl IntoResponse, AppError> {
    Ok(Json(app.stats().await?))
}

#[derive(Debug, Deserialize)]
struct SeriesQuery {
    since_ms: Option<i64>,
}

/// The credential is looked at before the query: without it, any request is a 401.
async fn stats_series(
    State(app): State<App>,
    _: Operator,
    Params(query): Params<SeriesQuery>,
) -> Result<impl IntoResponse, AppError> {
    let since = query
        .since_ms
        .map(|since| validate::within("since_ms", since, 0, validate::MAX_SAFE_INTEGER))
        .transpose()?;
    Ok(Json(app.series(since).await?))
}

async fn page() -> Html<&'static str> {
    Html(PAGE)
}

async fn operator_plots(_: Operator) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/javascript; charset=utf-8")],
        OPERATOR_PLOTS,
    )
}

async fn operator_login_page() -> Html<&'static str> {
    Html(OPERATOR_LOGIN_PAGE)
}

async fn not_found() -> AppError {
    AppError::Rejected(
        StatusCode::NOT_FOUND,
        "no such page or API route".to_owned(),
    )
}

async fn method_not_allowed() -> AppError {
    AppError::Rejected(
        StatusCode::METHOD_NOT_ALLOWED,
        "this route does not take that method".to_owned(),
    )
}

/// The database's outages, for the routes that need it: 503 at once while it is down, and a
/// request already running when it goes down is answered 503 then, rather than when the pool
/// gives up on it. The pages, the health checks, the metrics and the event stream (which says
/// so by itself) go on.
async fn database_up(
    State(app): State<App>,
    request: axum::extract::Request,
    next: Next,
) -> Response {
    let path = request.uri().path();
    let needs_database = path.starts_with("/api/")
        && !path.starts_with("/api/events")
        && !path.starts_with("/api/operator/");
    if !needs_database {
        return next.run(request).await;
    }
    if app.db_watch.is_down() {
        return crate::error::database_unavailable();
    }
    tokio::select! {
        response = next.run(request) => response,
        () = app.db_watch.down() => crate::error::database_unavailable(),
    }
}

/// Counts purchase requests, their successes and their 409s, including the lock layer's own.
async fn count(State(app): State<App>, request: axum::extract::Request, next: Next) -> Response {
    app.counters.bump(Counter::Request);
    let (purchase, label) = if request.uri().path().ends_with("/checkout") {
        (Purchase::Checkout, "checkout")
    } else {
        (Purchase::Voucher, "voucher")
    };
    let response = next.run(request).await;
    if response.status().is_success() {
        app.counters.sold(purchase);
    } else if response.status() == StatusCode::CONFLICT {
        app.counters.bump(Counter::Conflict);
    }
    crate::metrics::purchase(label, response.status());
    response
}

/// The shop's router. With locks, checkout holds the cart and every SKU in it (all-or-none)
/// through a `LockLayer`; busy after [`LOCK_WAIT`]: 409 with `Retry-After`.
pub fn router(app: App) -> Router {
    let mut checkout_route = Router::new().route("/api/cart/checkout", post(checkout));
    if app.locks {
        checkout_route = checkout_route.route_layer(
            LockLayer::with_state(app.locker.clone(), app.clone())
                .key(|CheckoutLocks(names): CheckoutLocks| async move { names })
                .wait(LOCK_WAIT)
                .on_rejection(|rejection| {
                    tracing::info!(
                        outcome = rejection.outcome(),
                        lock = rejection.name(),
                        "checkout locks refused"
                    );
                    None::<axum::http::Response<axum::body::Body>>
                }),
        );
    }
    let purchases = Router::new()
        .route("/api/vouchers/{id}/orders", post(buy_voucher))
        .merge(checkout_route)
        .route_layer(middleware::from_fn_with_state(app.clone(), count));
    Router::new()
        .route("/", get(page))
        .route("/operator", get(auth::operator_page))
        .route("/operator/plots.js", get(operator_plots))
        .route("/operator/login", get(operator_login_page))
        .route("/api/operator/login", post(auth::operator_login))
        .route("/api/operator/logout", post(auth::operator_logout))
        .route("/healthz", get(health::healthz))
        .route("/readyz", get(health::readyz))
        .route("/api/login", post(auth::login))
        .route("/api/logout", post(auth::logout))
        .route("/api/me", get(auth::me))
        .route("/api/vouchers", get(list_vouchers).post(create_voucher))
        .route("/api/orders", get(user_orders))
        .route("/api/skus", get(list_skus).post(create_sku))
        .route("/api/cart", get(cart))
        .route("/api/cart/items", post(add_to_cart).delete(clear_cart))
        .route("/api/cart/items/{sku}", delete(remove_from_cart))
        .route("/api/events", get(events))
        .route("/api/stats", get(stats))
        .route("/api/stats/series", get(stats_series))
        .route("/metrics", get(crate::metrics::metrics))
        .merge(purchases)
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(validate::MAX_BODY_BYTES))
        .layer(middleware::from_fn_with_state(app.clone(), database_up))
        .layer(middleware::from_fn(auth::same_origin_only))
        .layer(middleware::from_fn(telemetry::problem_only))
        .layer(middleware::from_fn(telemetry::request_id))
        .with_state(app)
}
