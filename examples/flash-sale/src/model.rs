//! What the API reads and answers. Prices are integer cents in the shop's one currency
//! ([`CURRENCY`]); times are milliseconds since the epoch.

use serde::{Deserialize, Serialize};

/// The shop's currency (ISO 4217): every price and total is in it.
pub const CURRENCY: &str = "EUR";

fn currency() -> String {
    CURRENCY.to_owned()
}

/// `POST /api/login`.
#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct Login {
    /// 1 to 40 characters after trimming, no control or format characters.
    pub name: String,
}

/// A shopper.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
pub struct User {
    /// Its id.
    pub id: i64,
    /// Its name, trimmed.
    pub name: String,
}

/// A new voucher (`POST /api/vouchers`).
#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct NewVoucher {
    /// What it is: 1 to 120 characters, no control or format characters.
    pub title: String,
    /// Price in cents, 0 to 100,000,000.
    pub price_cents: i64,
    /// Stock, 0 to 1,000,000.
    pub stock: i64,
    /// Sale start, ms since the epoch.
    pub starts_at_ms: i64,
    /// Sale end, ms since the epoch, after the start.
    pub ends_at_ms: i64,
}

/// A voucher on sale.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
pub struct Voucher {
    /// Its id.
    pub id: i64,
    /// What it is.
    pub title: String,
    /// Price in cents.
    pub price_cents: i64,
    /// [`CURRENCY`].
    #[serde(default = "currency")]
    pub currency: String,
    /// Left in stock.
    pub stock: i64,
    /// Sale start, ms since the epoch.
    pub starts_at_ms: i64,
    /// Sale end, ms since the epoch.
    pub ends_at_ms: i64,
}

/// A new SKU (`POST /api/skus`).
#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct NewSku {
    /// Its name: 1 to 80 characters, no control or format characters.
    pub name: String,
    /// Price in cents, 0 to 100,000,000.
    pub price_cents: i64,
    /// Stock, 0 to 1,000,000.
    pub stock: i64,
}

/// A SKU that carts hold.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
pub struct Sku {
    /// Its id.
    pub id: i64,
    /// Its name.
    pub name: String,
    /// Price in cents.
    pub price_cents: i64,
    /// [`CURRENCY`].
    #[serde(default = "currency")]
    pub currency: String,
    /// Left in stock.
    pub stock: i64,
}

/// An addition to the shopper's cart (`POST /api/cart/items`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
pub struct CartItem {
    /// The SKU.
    pub sku_id: i64,
    /// How many to add, 1 to 100 (a cart holds at most 100 of one SKU).
    pub qty: i64,
}

/// One line of a cart or a cart order.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
pub struct CartLine {
    /// The SKU.
    pub sku_id: i64,
    /// Its name (at the time of the order, for an order).
    pub name: String,
    /// How many.
    pub qty: i64,
    /// Unit price in cents (at the time of the order, for an order).
    pub price_cents: i64,
    /// [`CURRENCY`].
    #[serde(default = "currency")]
    pub currency: String,
}

/// A user's cart.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
pub struct Cart {
    /// Its lines, by SKU id.
    pub items: Vec<CartLine>,
    /// Σ qty × price, in cents.
    pub total_cents: i64,
    /// [`CURRENCY`].
    #[serde(default = "currency")]
    pub currency: String,
}

impl Cart {
    /// A cart of `items`, totalled.
    pub fn of(items: Vec<CartLine>) -> Self {
        let total_cents = total(&items);
        Self {
            items,
            total_cents,
            currency: currency(),
        }
    }
}

/// Σ qty × price. Bounded by the API's limits (20 lines × 100 × 100,000,000 cents), far below
/// 2⁵³; saturating all the same.
pub(crate) fn total(items: &[CartLine]) -> i64 {
    items.iter().fold(0i64, |sum, line| {
        sum.saturating_add(line.qty.saturating_mul(line.price_cents))
    })
}

/// A voucher order.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
pub struct Order {
    /// Its id.
    pub id: i64,
    /// The buyer.
    pub user_id: i64,
    /// The voucher.
    pub voucher_id: i64,
    /// The voucher's title.
    pub title: String,
    /// What it cost, in cents.
    pub price_cents: i64,
    /// [`CURRENCY`].
    #[serde(default = "currency")]
    pub currency: String,
    /// The fencing token of the lock it was placed under (0 without locks).
    pub fencing_token: i64,
    /// When, ms since the epoch.
    pub at_ms: i64,
}

/// A checked-out cart.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
pub struct CartOrder {
    /// Its id.
    pub id: i64,
    /// The buyer.
    pub user_id: i64,
    /// What was bought, as it was in the cart.
    pub items: Vec<CartLine>,
    /// Σ qty × price, in cents.
    pub total_cents: i64,
    /// [`CURRENCY`].
    #[serde(default = "currency")]
    pub currency: String,
    /// When, ms since the epoch.
    pub at_ms: i64,
}

/// A user's orders (`GET /api/orders`, the signed-in shopper's), oldest first.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
pub struct Orders {
    /// Voucher orders.
    pub vouchers: Vec<Order>,
    /// Cart orders.
    pub carts: Vec<CartOrder>,
}

/// The shop's numbers, over every instance (`GET /api/stats`). Every number is a whole number
/// from 0 to 2⁵³ − 1 (larger ones are clamped), exact in JavaScript.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stats {
    /// Whether the instance that answered runs with locks.
    pub locks: bool,
    /// Purchase requests (voucher orders and checkouts), all instances.
    pub requests: u64,
    /// Purchase requests that ran under their lock(s).
    pub locked: u64,
    /// Of those, how many waited for a lock (at least [`crate::LOCK_WAIT_THRESHOLD`]).
    pub lock_waits: u64,
    /// 409 answers to purchase requests.
    pub conflicts: u64,
    /// Fenced writes refused because a newer lock holder had been at the row.
    pub stale_refused: u64,
    /// Voucher orders in the database.
    pub voucher_orders: u64,
    /// Voucher stock at creation, all vouchers.
    pub voucher_initial_stock: u64,
    /// Users holding more than one order for one voucher.
    pub duplicate_orders: u64,
    /// Vouchers with more orders than stock.
    pub oversold_vouchers: u64,
    /// SKU units sold through checkouts.
    pub units_sold: u64,
    /// SKU stock at creation, all SKUs.
    pub sku_initial_stock: u64,
    /// SKU units sold beyond a SKU's initial stock.
    pub units_oversold: u64,
    /// Units that left the stock without being in an order (initial − remaining − ordered,
    /// where positive; vouchers and SKUs). 0 when the shop is right.
    pub units_lost: u64,
    /// Units in orders that never left the stock (where that difference is negative: lost
    /// updates of the stock). 0 when the shop is right.
    pub units_double_sold: u64,
    /// Rows whose stock went negative.
    pub negative_stock_rows: u64,
}
