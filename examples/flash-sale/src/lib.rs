//! The flash-sale shop: vouchers sold one per user, carts checked out without overselling, several
//! app instances behind one Redis and one database.
//!
//! - Buying a voucher checks "has this user ordered it already?" and then inserts the order:
//!   exactly the race a per-user lock exists for. The service function is guarded with
//!   `#[distributed_lock(key = "order:<user_id>:<voucher_id>")]`.
//! - Checking out a cart locks every SKU in it, all-or-none, with a `LockLayer` whose key comes from
//!   the request (the user's cart). Stock is re-read once the locks are held, and every stock
//!   write carries the lock's fencing token: the row keeps the last token it accepted and refuses
//!   older ones, so a holder paused past its lease can't write stale stock.
//! - `--no-locks` runs the same code without the locks, to show what they prevent.

pub mod db;
pub mod demo;
pub mod loadgen;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::extract::{Path, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use dlock_core::{LockError, LockName, Locker, distributed_lock};
use dlock_tower::{HeldLocks, LockLayer};
use serde::{Deserialize, Serialize};
use sqlx::{AnyPool, Row};

use crate::db::{DbError, Sku, Voucher};

/// The shop's state, shared by every request of one instance.
#[derive(Clone)]
pub struct App {
    /// The database.
    pub db: AnyPool,
    /// The lock service.
    pub locker: Locker,
    /// Whether the locks are on (`--no-locks` turns them off).
    pub locks: bool,
    /// Live counters.
    pub counters: Arc<Counters>,
}

impl std::fmt::Debug for App {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("App")
            .field("locker", &self.locker)
            .field("locks", &self.locks)
            .finish_non_exhaustive()
    }
}

/// Requests, locked requests and rejections seen by one instance.
#[derive(Debug, Default)]
pub struct Counters {
    requests: AtomicU64,
    locked: AtomicU64,
    conflicts: AtomicU64,
}

/// Why a request failed.
#[derive(Debug)]
pub enum AppError {
    /// No such thing.
    NotFound(String),
    /// The request conflicts with the shop's rules (sale window, stock, one order per user).
    Conflict(String),
    /// The request is malformed.
    BadRequest(String),
    /// The lock could not be taken or was lost.
    Lock(LockError),
    /// The database failed.
    Db(DbError),
}

impl From<LockError> for AppError {
    fn from(err: LockError) -> Self {
        AppError::Lock(err)
    }
}

impl From<DbError> for AppError {
    fn from(err: DbError) -> Self {
        AppError::Db(err)
    }
}

#[derive(Serialize)]
struct ErrorBody {
    error: String,
}

impl IntoResponse for AppError {
    fn into_response(self) -> Response {
        let (status, message, retry) = match self {
            AppError::NotFound(m) => (StatusCode::NOT_FOUND, m, None),
            AppError::Conflict(m) => (StatusCode::CONFLICT, m, None),
            AppError::BadRequest(m) => (StatusCode::BAD_REQUEST, m, None),
            AppError::Lock(err) if err.is_timeout() => (
                StatusCode::CONFLICT,
                "another request of this user is in progress".to_owned(),
                Some(err.retry_after().map_or(1, |d| d.as_secs().max(1))),
            ),
            AppError::Lock(err) if err.is_invalid_name() => {
                (StatusCode::BAD_REQUEST, err.to_string(), None)
            }
            AppError::Lock(err) => (StatusCode::SERVICE_UNAVAILABLE, err.to_string(), None),
            AppError::Db(err) => (StatusCode::INTERNAL_SERVER_ERROR, err.to_string(), None),
        };
        let mut response = (status, Json(ErrorBody { error: message })).into_response();
        if let Some(secs) = retry {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        response
    }
}

/// Milliseconds since the epoch.
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// A new voucher.
#[derive(Debug, Deserialize, Serialize)]
pub struct NewVoucher {
    /// What it is.
    pub title: String,
    /// Price in cents.
    pub price: i64,
    /// Stock.
    pub stock: i64,
    /// Sale start, ms since the epoch.
    pub begin_at: i64,
    /// Sale end, ms since the epoch.
    pub end_at: i64,
}

/// A new SKU.
#[derive(Debug, Deserialize, Serialize)]
pub struct NewSku {
    /// Its name.
    pub name: String,
    /// Stock.
    pub stock: i64,
}

/// Who buys.
#[derive(Debug, Deserialize, Serialize)]
pub struct Buyer {
    /// The user.
    pub user_id: i64,
}

/// An item for a cart.
#[derive(Debug, Deserialize, Serialize)]
pub struct CartItem {
    /// The SKU.
    pub sku_id: i64,
    /// How many.
    pub qty: i64,
}

/// A voucher order.
#[derive(Debug, Serialize, Deserialize)]
pub struct Order {
    /// Its id.
    pub id: i64,
    /// The buyer.
    pub user_id: i64,
    /// The voucher.
    pub voucher_id: i64,
    /// The fencing token of the lock it was placed under (0 without locks).
    pub fencing_token: i64,
}

/// The shop's invariants and counters, read from the database.
#[derive(Debug, Default, Clone, Serialize, Deserialize)]
pub struct Stats {
    /// Whether this instance runs with locks.
    pub locks: bool,
    /// Requests seen by this instance.
    pub requests: u64,
    /// Requests that ran under a lock on this instance.
    pub locked: u64,
    /// 409 answers of this instance.
    pub conflicts: u64,
    /// Voucher orders in the database.
    pub voucher_orders: i64,
    /// Voucher stock at creation, all vouchers.
    pub voucher_initial_stock: i64,
    /// Users holding more than one order for one voucher.
    pub duplicate_orders: i64,
    /// Vouchers with more orders than stock.
    pub oversold_vouchers: i64,
    /// SKU units sold through checkouts.
    pub sku_units_sold: i64,
    /// SKU units sold beyond the initial stock, all SKUs.
    pub sku_units_oversold: i64,
    /// Rows whose stock went negative.
    pub negative_stock_rows: i64,
}

impl App {
    /// Buys voucher `voucher_id` for `user_id`: at most one order per user and voucher.
    pub async fn buy(&self, user_id: i64, voucher_id: i64) -> Result<Order, AppError> {
        if self.locks {
            self.buy_locked(user_id, voucher_id).await
        } else {
            self.place_order(user_id, voucher_id, 0).await
        }
    }

    #[distributed_lock(key = "order:<user_id>:<voucher_id>", wait = "2s", locker = self.locker)]
    async fn buy_locked(&self, user_id: i64, voucher_id: i64) -> Result<Order, AppError> {
        self.counters.locked.fetch_add(1, Ordering::Relaxed);
        let token = dlock_core::fencing_token().map_or(0, |t| i64::try_from(t.get()).unwrap_or(0));
        self.place_order(user_id, voucher_id, token).await
    }

    /// Check, then write — across `.await`s, as real code does; safe only under the user's lock.
    async fn place_order(
        &self,
        user_id: i64,
        voucher_id: i64,
        fencing_token: i64,
    ) -> Result<Order, AppError> {
        let voucher = self.voucher(voucher_id).await?;
        let now = now_ms();
        if now < voucher.begin_at {
            return Err(AppError::Conflict("the sale has not started".to_owned()));
        }
        if now >= voucher.end_at {
            return Err(AppError::Conflict("the sale has ended".to_owned()));
        }
        let existing: i64 = sqlx::query(
            "SELECT COUNT(*) AS n FROM voucher_orders WHERE user_id = $1 AND voucher_id = $2",
        )
        .bind(user_id)
        .bind(voucher_id)
        .fetch_one(&self.db)
        .await?
        .try_get("n")?;
        if existing > 0 {
            return Err(AppError::Conflict(
                "one order per user: this user already holds this voucher".to_owned(),
            ));
        }
        if voucher.stock <= 0 {
            return Err(AppError::Conflict("out of stock".to_owned()));
        }
        let taken =
            sqlx::query("UPDATE vouchers SET stock = stock - 1 WHERE id = $1 AND stock > 0")
                .bind(voucher_id)
                .execute(&self.db)
                .await?
                .rows_affected();
        if taken == 0 {
            return Err(AppError::Conflict("out of stock".to_owned()));
        }
        let row = sqlx::query(
            "INSERT INTO voucher_orders (user_id, voucher_id, fencing_token, created_at)
             VALUES ($1, $2, $3, $4) RETURNING id",
        )
        .bind(user_id)
        .bind(voucher_id)
        .bind(fencing_token)
        .bind(now)
        .fetch_one(&self.db)
        .await?;
        Ok(Order {
            id: row.try_get("id")?,
            user_id,
            voucher_id,
            fencing_token,
        })
    }

    async fn voucher(&self, id: i64) -> Result<Voucher, AppError> {
        let row = sqlx::query(
            "SELECT id, title, price, stock, initial_stock, begin_at, end_at FROM vouchers WHERE id = $1",
        )
        .bind(id)
        .fetch_optional(&self.db)
        .await?;
        match row {
            Some(row) => Ok(Voucher::from_row(&row)?),
            None => Err(AppError::NotFound(format!("no voucher {id}"))),
        }
    }

    /// The lock names of the SKUs in `user`'s cart.
    pub async fn cart_lock_names(&self, user: i64) -> Result<Vec<LockName>, AppError> {
        let rows = sqlx::query("SELECT sku_id FROM cart_items WHERE user_id = $1")
            .bind(user)
            .fetch_all(&self.db)
            .await?;
        rows.iter()
            .map(|row| {
                let sku: i64 = row.try_get("sku_id")?;
                Ok(sku_lock_name(sku)?)
            })
            .collect()
    }

    /// Checks out `user`'s cart: stock re-read under the SKU locks, fenced writes.
    async fn checkout(&self, user: i64, held: Option<&HeldLocks>) -> Result<i64, AppError> {
        let tokens: HashMap<&str, i64> = held
            .map(|h| {
                h.names
                    .iter()
                    .map(String::as_str)
                    .zip(
                        h.fencing_tokens
                            .iter()
                            .map(|t| i64::try_from(t.get()).unwrap_or(0)),
                    )
                    .collect()
            })
            .unwrap_or_default();
        if held.is_some() {
            self.counters.locked.fetch_add(1, Ordering::Relaxed);
        }
        let items = sqlx::query("SELECT sku_id, qty FROM cart_items WHERE user_id = $1")
            .bind(user)
            .fetch_all(&self.db)
            .await?;
        if items.is_empty() {
            return Err(AppError::BadRequest("the cart is empty".to_owned()));
        }
        let mut plan = Vec::new();
        for item in &items {
            let sku: i64 = item.try_get("sku_id")?;
            let qty: i64 = item.try_get("qty")?;
            // Read now, under the locks: a stock read before locking would be stale.
            let stock: i64 = sqlx::query("SELECT stock FROM skus WHERE id = $1")
                .bind(sku)
                .fetch_optional(&self.db)
                .await?
                .ok_or_else(|| AppError::NotFound(format!("no sku {sku}")))?
                .try_get("stock")?;
            if stock < qty {
                return Err(AppError::Conflict(format!("sku {sku} is out of stock")));
            }
            plan.push((sku, qty, stock - qty));
        }
        for (sku, _, new_stock) in &plan {
            let written = if self.locks {
                let name = sku_lock_name(*sku)?;
                let token = tokens.get(name.as_str()).copied().unwrap_or(0);
                sqlx::query("UPDATE skus SET stock = $1, fence = $2 WHERE id = $3 AND fence < $2")
                    .bind(new_stock)
                    .bind(token)
                    .bind(sku)
                    .execute(&self.db)
                    .await?
                    .rows_affected()
            } else {
                sqlx::query("UPDATE skus SET stock = $1 WHERE id = $2")
                    .bind(new_stock)
                    .bind(sku)
                    .execute(&self.db)
                    .await?
                    .rows_affected()
            };
            if written == 0 {
                return Err(AppError::Conflict(format!(
                    "sku {sku}: a newer lock holder wrote first (stale fencing token)"
                )));
            }
        }
        let order: i64 = sqlx::query(
            "INSERT INTO cart_orders (user_id, created_at) VALUES ($1, $2) RETURNING id",
        )
        .bind(user)
        .bind(now_ms())
        .fetch_one(&self.db)
        .await?
        .try_get("id")?;
        for (sku, qty, _) in &plan {
            sqlx::query("INSERT INTO cart_order_items (order_id, sku_id, qty) VALUES ($1, $2, $3)")
                .bind(order)
                .bind(sku)
                .bind(qty)
                .execute(&self.db)
                .await?;
        }
        sqlx::query("DELETE FROM cart_items WHERE user_id = $1")
            .bind(user)
            .execute(&self.db)
            .await?;
        Ok(order)
    }

    /// The invariants, read from the database.
    pub async fn stats(&self) -> Result<Stats, AppError> {
        let one = |sql: &'static str| async move {
            let row = sqlx::query(sql).fetch_one(&self.db).await?;
            Ok::<i64, AppError>(row.try_get::<Option<i64>, _>("n")?.unwrap_or(0))
        };
        Ok(Stats {
            locks: self.locks,
            requests: self.counters.requests.load(Ordering::Relaxed),
            locked: self.counters.locked.load(Ordering::Relaxed),
            conflicts: self.counters.conflicts.load(Ordering::Relaxed),
            voucher_orders: one("SELECT COUNT(*) AS n FROM voucher_orders").await?,
            voucher_initial_stock: one("SELECT CAST(SUM(initial_stock) AS BIGINT) AS n FROM vouchers").await?,
            duplicate_orders: one(
                "SELECT COUNT(*) AS n FROM (SELECT user_id, voucher_id FROM voucher_orders
                 GROUP BY user_id, voucher_id HAVING COUNT(*) > 1) AS d",
            )
            .await?,
            oversold_vouchers: one(
                "SELECT COUNT(*) AS n FROM vouchers v WHERE
                 (SELECT COUNT(*) FROM voucher_orders o WHERE o.voucher_id = v.id) > v.initial_stock",
            )
            .await?,
            sku_units_sold: one("SELECT CAST(SUM(qty) AS BIGINT) AS n FROM cart_order_items").await?,
            sku_units_oversold: one(
                "SELECT CAST(SUM(CASE WHEN sold > initial_stock THEN sold - initial_stock ELSE 0 END)
                        AS BIGINT) AS n
                 FROM (SELECT s.initial_stock AS initial_stock,
                              (SELECT CAST(COALESCE(SUM(i.qty), 0) AS BIGINT) FROM cart_order_items i
                               WHERE i.sku_id = s.id) AS sold
                       FROM skus s) AS t",
            )
            .await?,
            negative_stock_rows: one(
                "SELECT (SELECT COUNT(*) FROM vouchers WHERE stock < 0)
                      + (SELECT COUNT(*) FROM skus WHERE stock < 0) AS n",
            )
            .await?,
        })
    }
}

/// The lock name of a SKU.
pub fn sku_lock_name(sku: i64) -> Result<LockName, LockError> {
    LockName::builder().literal("sku:").value(sku).build()
}

fn count(app: &App, status: StatusCode) {
    if status == StatusCode::CONFLICT {
        app.counters.conflicts.fetch_add(1, Ordering::Relaxed);
    }
}

async fn list_vouchers(State(app): State<App>) -> Result<Json<Vec<Voucher>>, AppError> {
    let rows = sqlx::query(
        "SELECT id, title, price, stock, initial_stock, begin_at, end_at FROM vouchers ORDER BY id",
    )
    .fetch_all(&app.db)
    .await?;
    Ok(Json(
        rows.iter()
            .map(Voucher::from_row)
            .collect::<Result<_, _>>()?,
    ))
}

async fn create_voucher(
    State(app): State<App>,
    Json(new): Json<NewVoucher>,
) -> Result<(StatusCode, Json<Voucher>), AppError> {
    if new.stock < 0 || new.end_at <= new.begin_at || new.title.trim().is_empty() {
        return Err(AppError::BadRequest(
            "a voucher needs a title, stock ≥ 0 and end_at after begin_at".to_owned(),
        ));
    }
    let id: i64 = sqlx::query(
        "INSERT INTO vouchers (title, price, stock, initial_stock, begin_at, end_at)
         VALUES ($1, $2, $3, $4, $5, $6) RETURNING id",
    )
    .bind(&new.title)
    .bind(new.price)
    .bind(new.stock)
    .bind(new.stock)
    .bind(new.begin_at)
    .bind(new.end_at)
    .fetch_one(&app.db)
    .await?
    .try_get("id")?;
    Ok((StatusCode::CREATED, Json(app.voucher(id).await?)))
}

async fn list_skus(State(app): State<App>) -> Result<Json<Vec<Sku>>, AppError> {
    let rows = sqlx::query("SELECT id, name, stock, initial_stock FROM skus ORDER BY id")
        .fetch_all(&app.db)
        .await?;
    Ok(Json(
        rows.iter().map(Sku::from_row).collect::<Result<_, _>>()?,
    ))
}

async fn create_sku(
    State(app): State<App>,
    Json(new): Json<NewSku>,
) -> Result<(StatusCode, Json<i64>), AppError> {
    if new.stock < 0 {
        return Err(AppError::BadRequest("stock must be ≥ 0".to_owned()));
    }
    let id: i64 = sqlx::query(
        "INSERT INTO skus (name, stock, initial_stock) VALUES ($1, $2, $3) RETURNING id",
    )
    .bind(&new.name)
    .bind(new.stock)
    .bind(new.stock)
    .fetch_one(&app.db)
    .await?
    .try_get("id")?;
    Ok((StatusCode::CREATED, Json(id)))
}

async fn buy_voucher(
    State(app): State<App>,
    Path(voucher_id): Path<i64>,
    Json(buyer): Json<Buyer>,
) -> Response {
    app.counters.requests.fetch_add(1, Ordering::Relaxed);
    let response = match app.buy(buyer.user_id, voucher_id).await {
        Ok(order) => (StatusCode::CREATED, Json(order)).into_response(),
        Err(err) => err.into_response(),
    };
    count(&app, response.status());
    response
}

async fn user_orders(
    State(app): State<App>,
    Path(user): Path<i64>,
) -> Result<Json<Vec<Order>>, AppError> {
    let rows = sqlx::query(
        "SELECT id, user_id, voucher_id, fencing_token FROM voucher_orders WHERE user_id = $1 ORDER BY id",
    )
    .bind(user)
    .fetch_all(&app.db)
    .await?;
    let orders = rows
        .iter()
        .map(|row| {
            Ok(Order {
                id: row.try_get("id")?,
                user_id: row.try_get("user_id")?,
                voucher_id: row.try_get("voucher_id")?,
                fencing_token: row.try_get("fencing_token")?,
            })
        })
        .collect::<Result<_, DbError>>()?;
    Ok(Json(orders))
}

async fn add_to_cart(
    State(app): State<App>,
    Path(user): Path<i64>,
    Json(item): Json<CartItem>,
) -> Result<StatusCode, AppError> {
    if item.qty <= 0 {
        return Err(AppError::BadRequest("qty must be positive".to_owned()));
    }
    sqlx::query(
        "INSERT INTO cart_items (user_id, sku_id, qty) VALUES ($1, $2, $3)
         ON CONFLICT (user_id, sku_id) DO UPDATE SET qty = cart_items.qty + excluded.qty",
    )
    .bind(user)
    .bind(item.sku_id)
    .bind(item.qty)
    .execute(&app.db)
    .await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn checkout(
    State(app): State<App>,
    Path(user): Path<i64>,
    held: Option<Extension<HeldLocks>>,
) -> Response {
    app.counters.requests.fetch_add(1, Ordering::Relaxed);
    let response = match app.checkout(user, held.as_ref().map(|e| &e.0)).await {
        Ok(order) => (StatusCode::CREATED, Json(order)).into_response(),
        Err(err) => err.into_response(),
    };
    count(&app, response.status());
    response
}

async fn stats(State(app): State<App>) -> Result<Json<Stats>, AppError> {
    Ok(Json(app.stats().await?))
}

async fn page() -> Html<&'static str> {
    Html(include_str!("../static/index.html"))
}

/// The shop's router.
pub fn router(app: App) -> Router {
    let mut checkout_route = Router::new().route("/api/carts/{user}/checkout", post(checkout));
    if app.locks {
        // Every SKU in the cart, all-or-none; busy after 2 s: 409 with Retry-After.
        checkout_route = checkout_route.route_layer(
            LockLayer::with_state(app.locker.clone(), app.clone())
                .key(|State(app): State<App>, Path(user): Path<i64>| async move {
                    app.cart_lock_names(user).await.unwrap_or_default()
                })
                .wait(Duration::from_secs(2)),
        );
    }
    Router::new()
        .route("/", get(page))
        .route("/api/vouchers", get(list_vouchers).post(create_voucher))
        .route("/api/vouchers/{id}/orders", post(buy_voucher))
        .route("/api/skus", get(list_skus).post(create_sku))
        .route("/api/users/{user}/orders", get(user_orders))
        .route("/api/carts/{user}/items", post(add_to_cart))
        .route("/api/stats", get(stats))
        .merge(checkout_route)
        .with_state(app)
}

/// Builds the app over `database_url` and `locker`.
pub async fn app(database_url: &str, locker: Locker, locks: bool) -> Result<App, DbError> {
    Ok(App {
        db: db::connect(database_url).await?,
        locker,
        locks,
        counters: Arc::default(),
    })
}
