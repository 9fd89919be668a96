//! The flash-sale shop: vouchers sold one per user, carts checked out without overselling, several
//! app instances behind one Redis and one database.
//!
//! - Buying a voucher checks "has this user ordered it already?" and then inserts the order:
//!   exactly the race a per-user lock exists for. The service function is guarded with
//!   `#[distributed_lock(key = "order:<user_id>:<voucher_id>")]` ([`App::buy`]). The voucher is
//!   looked up first: a request for one that doesn't exist never reaches Redis.
//! - A hot voucher must not take every database connection from the rest of the shop: at most
//!   [`App::buyers_per_voucher`] buyers of one voucher are in the order path at once, on every
//!   instance together — a semaphore `sale:<voucher_id>` with expiring permits
//!   (`Locker::semaphore`); the others wait for a permit, and a permit whose instance crashed
//!   comes back when its lease ends.
//! - Checking out a cart locks the cart and every SKU in it, all-or-none, with a `LockLayer`
//!   ([`routes`]). A key function can't see the future: the SKUs it names were read before the
//!   locks were taken, and the cart may have changed meanwhile. So it locks what decides the
//!   key set — the cart, which every cart edit locks too — and the SKUs it read; under the
//!   locks the checkout reads the cart again and refuses (409 "cart changed, retry") any SKU it
//!   does not hold. Stock, the order and the removal of exactly the ordered items are one
//!   database transaction.
//! - Writes are fenced. Each lock guards one kind of row, and that row keeps the newest fencing
//!   token of its lock: a SKU row (lock `sku:<id>`), a user's cart (lock `cart:<user>`, in the
//!   user's row) and a user's order slot for a voucher (lock `order:<user>:<voucher>`). A
//!   holder first registers its token with the row (`UPDATE ... SET fence = $token WHERE ...
//!   AND fence < $token`), then reads, then writes only if the row still carries its token. A
//!   holder paused past its lease finds a newer token there and is refused, whichever of the
//!   two got to the row first. The voucher's stock is shared by every user's lock, whose
//!   tokens don't compare across users, so it is not fenced: it is decremented in one
//!   statement (`stock = stock - 1 WHERE stock > 0`) that can't oversell.
//! - `--no-locks` runs the same code without the locks (and so without tokens to fence with),
//!   to show what they prevent.
//! - The locks live on one Redis server (`DLOCK_URL`) or on a Redis Cluster
//!   (`DLOCK_CLUSTER_URLS`, its seed URLs comma-separated), as [`server`] describes; each lock
//!   lives in its name's slot, so the shop's locks spread over the cluster's masters.
//! - Each instance exports its metrics at `GET /metrics` in Prometheus's format ([`metrics`]):
//!   dlock's, the lock layer's and the shop's purchase counters. `grafana/flash-sale.json` is a
//!   Grafana dashboard of them, per instance; a test checks every query of it against what an
//!   instance exports.
//! - The operator's page plots the same story without Prometheus: each instance writes what
//!   it answered, second by second, to the database, and the page draws every instance's
//!   last five minutes ([`series`]).
//!
//! - Shoppers sign in by name (it's a demo) and get a session: an `HttpOnly`, `SameSite=Strict`
//!   cookie whose digest the database keeps, so every instance knows it. A shopper's routes take
//!   the user from the session, never from the path or the body; changing the catalogue and the
//!   operator's view need the operator's token ([`auth`]).
//!
//! The API, its bounds and its one error format are in [`routes`].

pub mod auth;
pub mod counters;
pub mod db;
pub mod demo;
pub mod error;
pub mod events;
mod extract;
mod health;
pub mod loadgen;
pub mod metrics;
pub mod model;
pub mod routes;
pub mod series;
pub mod server;
mod service;
pub mod telemetry;
pub mod validate;

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::Router;
use dlock_core::Locker;
use sqlx::AnyPool;

pub use crate::counters::{Counter, Counters, LOCK_WAIT_THRESHOLD};
pub use crate::db::DbError;
pub use crate::error::{AppError, Problem};
pub use crate::model::{
    CURRENCY, Cart, CartItem, CartLine, CartOrder, Login, NewSku, NewVoucher, Order, Orders, Sku,
    Stats, User, Voucher,
};
pub use crate::service::{Fences, cart_lock_name, sku_lock_name};

/// The shop's state, shared by every request of one instance.
#[derive(Clone)]
pub struct App {
    /// The database.
    pub db: AnyPool,
    /// The lock service.
    pub locker: Locker,
    /// Whether the locks are on (`--no-locks` turns them off).
    pub locks: bool,
    /// How many buyers of one voucher may be in the order path at once, across every instance
    /// (a semaphore `sale:<voucher>` in Redis; [`BUYERS_PER_VOUCHER`] unless set).
    pub buyers_per_voucher: u32,
    /// This instance's request counters.
    pub counters: Arc<Counters>,
    /// The operator's token ([`auth`]): `None` refuses every operator request.
    pub operator: Option<auth::OperatorToken>,
    /// Whether the database answers ([`db::Watch`]).
    pub(crate) db_watch: db::Watch,
    /// Changes of the catalog and of users' carts and orders, for the event stream.
    pub(crate) events: events::Events,
}

impl std::fmt::Debug for App {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("App")
            .field("locker", &self.locker)
            .field("locks", &self.locks)
            .field("instance", &self.counters.instance())
            .finish_non_exhaustive()
    }
}

/// Milliseconds since the epoch.
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// Builds the app over `database_url` (migrated to the current schema) and `locker`, and starts
/// its background tasks (counters, change watching, samples for the plots) on the current
/// runtime.
pub async fn app(database_url: &str, locker: Locker, locks: bool) -> Result<App, DbError> {
    let db = db::connect(database_url).await?;
    let db_watch = db::Watch::start(database_url);
    let counters = Arc::new(Counters::new(counters::random_id()));
    let events = events::Events::start(db.clone(), counters.clone());
    series::start(db.clone(), Arc::downgrade(&counters));
    Ok(App {
        db,
        locker,
        locks,
        buyers_per_voucher: BUYERS_PER_VOUCHER,
        operator: None,
        db_watch,
        counters,
        events,
    })
}

/// How many buyers of one voucher are let into the order path at once, across instances, by
/// default: enough to keep the database busy, few enough that a hot voucher can't take every
/// database connection from the rest of the shop.
pub const BUYERS_PER_VOUCHER: u32 = 16;

/// The shop's router: the JSON API under `/api`, the pages, the health checks.
pub fn router(app: App) -> Router {
    routes::router(app)
}
