//! The flash-sale shop: vouchers sold one per user, carts checked out without overselling, several
//! app instances behind one Redis and one database.
//!
//! - Buying a voucher checks "has this user ordered it already?" and then inserts the order:
//!   exactly the race a per-user lock exists for. The service function is guarded with
//!   `#[distributed_lock(key = "order:<user_id>:<voucher_id>")]` ([`App::buy`]).
//! - Checking out a cart locks every SKU in it, all-or-none, with a `LockLayer` whose keys come
//!   from the request (the SKUs in the user's cart, [`routes`]). Stock is re-read once the locks
//!   are held.
//! - Writes are fenced. Each lock guards one kind of row, and that row keeps the newest fencing
//!   token of its lock: a SKU row (lock `sku:<id>`) and a user's order slot for a voucher (lock
//!   `order:<user>:<voucher>`). A holder first registers its token with the row
//!   (`UPDATE ... SET fence = $token WHERE ... AND fence < $token`), then reads, then writes only
//!   if the row still carries its token. A holder paused past its lease finds a newer token there
//!   and is refused, whichever of the two got to the row first. The voucher's stock is shared by
//!   every user's lock, whose tokens don't compare across users, so it is not fenced: it is
//!   decremented in one statement (`stock = stock - 1 WHERE stock > 0`) that can't oversell.
//! - `--no-locks` runs the same code without the locks (and so without tokens to fence with),
//!   to show what they prevent.

pub mod db;
pub mod demo;
pub mod loadgen;
pub mod routes;
pub mod server;
mod service;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::{Json, Router};
use dlock_core::{LockError, Locker};
use serde::{Deserialize, Serialize};
use sqlx::AnyPool;

pub use crate::db::{DbError, Sku, Voucher};
pub use crate::service::{Fences, sku_lock_name};

/// A lock acquisition that took longer than this counts as a lock wait on the page and in
/// [`Stats::lock_waits`] (an uncontended acquisition is one Redis round trip).
pub const LOCK_WAIT_THRESHOLD: Duration = Duration::from_millis(5);

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

/// What one instance has seen: purchase requests, locks, waits, rejections.
#[derive(Debug, Default)]
pub struct Counters {
    requests: AtomicU64,
    locked: AtomicU64,
    lock_waits: AtomicU64,
    conflicts: AtomicU64,
    stale_refused: AtomicU64,
}

impl Counters {
    fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// A request ran under its lock(s), after waiting `waited` for them.
    fn ran_locked(&self, waited: Duration) {
        Self::bump(&self.locked);
        if waited >= LOCK_WAIT_THRESHOLD {
            Self::bump(&self.lock_waits);
        }
    }
}

/// Why a request failed.
#[derive(Debug)]
#[non_exhaustive]
pub enum AppError {
    /// No such thing (404).
    NotFound(String),
    /// The request conflicts with the shop's rules: sale window, stock, one order per user (409).
    Conflict(String),
    /// A fenced write was refused: a newer holder of the lock has been at the row (409).
    Stale(String),
    /// The request is malformed (400).
    BadRequest(String),
    /// The request body was refused with this status (400, 415, 422).
    Rejected(StatusCode, String),
    /// The lock could not be taken (409 with `Retry-After` when busy, 503 otherwise).
    Lock(LockError),
    /// The database failed (500).
    Db(DbError),
}

impl std::fmt::Display for AppError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AppError::NotFound(m)
            | AppError::Conflict(m)
            | AppError::Stale(m)
            | AppError::BadRequest(m)
            | AppError::Rejected(_, m) => f.write_str(m),
            AppError::Lock(err) => write!(f, "lock: {err}"),
            AppError::Db(err) => write!(f, "database: {err}"),
        }
    }
}

impl std::error::Error for AppError {}

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

/// The body of every error answer: `{"error": "..."}`.
#[derive(Debug, Serialize, Deserialize)]
pub struct ErrorBody {
    /// What went wrong.
    pub error: String,
}

impl IntoResponse for AppError {
    fn into_response(self) -> Response {
        let (status, message, retry) = match self {
            AppError::NotFound(m) => (StatusCode::NOT_FOUND, m, None),
            AppError::Conflict(m) | AppError::Stale(m) => (StatusCode::CONFLICT, m, None),
            AppError::BadRequest(m) => (StatusCode::BAD_REQUEST, m, None),
            AppError::Rejected(status, m) => (status, m, None),
            AppError::Lock(err) if err.is_timeout() => (
                StatusCode::CONFLICT,
                "another request of this user is in progress; try again".to_owned(),
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
#[derive(Debug, Clone, Deserialize, Serialize)]
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
#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct NewSku {
    /// Its name.
    pub name: String,
    /// Stock.
    pub stock: i64,
}

/// Who buys.
#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct Buyer {
    /// The user.
    pub user_id: i64,
}

/// An item of a cart.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
pub struct CartItem {
    /// The SKU.
    pub sku_id: i64,
    /// How many.
    pub qty: i64,
}

/// A voucher order.
#[derive(Debug, Clone, Serialize, Deserialize)]
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

/// A checked-out cart.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CartOrder {
    /// Its id.
    pub id: i64,
    /// The buyer.
    pub user_id: i64,
    /// What was bought: a snapshot of the cart.
    pub items: Vec<CartItem>,
}

/// The shop's invariants, read from the database, and one instance's counters.
#[derive(Debug, Default, Clone, Serialize, Deserialize)]
pub struct Stats {
    /// Whether this instance runs with locks.
    pub locks: bool,
    /// Purchase requests (voucher orders and checkouts) seen by this instance.
    pub requests: u64,
    /// Requests that ran under their lock(s) on this instance.
    pub locked: u64,
    /// Of those, how many waited for a lock (at least [`LOCK_WAIT_THRESHOLD`]).
    pub lock_waits: u64,
    /// 409 answers to purchase requests of this instance.
    pub conflicts: u64,
    /// Fenced writes this instance refused because a newer lock holder had been at the row.
    pub stale_writes_refused: u64,
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
    /// SKU stock at creation, all SKUs.
    pub sku_initial_stock: i64,
    /// SKU units sold beyond the initial stock, all SKUs.
    pub sku_units_oversold: i64,
    /// Rows whose stock went negative.
    pub negative_stock_rows: i64,
}

/// Builds the app over `database_url` (tables created if missing) and `locker`.
pub async fn app(database_url: &str, locker: Locker, locks: bool) -> Result<App, DbError> {
    Ok(App {
        db: db::connect(database_url).await?,
        locker,
        locks,
        counters: Arc::default(),
    })
}

/// The shop's router: the JSON API under `/api` and the page at `/`.
pub fn router(app: App) -> Router {
    routes::router(app)
}
