//! The database: SQLite by default, PostgreSQL when the URL says so, through `sqlx`'s `Any`
//! driver. The SQL is written once, with `$n` parameters both accept; the tables are created at
//! start-up.

use sqlx::any::{AnyPoolOptions, AnyRow};
use sqlx::{AnyPool, Executor as _, Row};

/// An error talking to the database.
pub type DbError = sqlx::Error;

/// Opens the pool and creates the tables.
///
/// `sqlite://path?mode=rwc` (the default of the server) or `postgres://user@host/db`.
pub async fn connect(url: &str) -> Result<AnyPool, DbError> {
    sqlx::any::install_default_drivers();
    let sqlite = url.starts_with("sqlite:");
    let pool = AnyPoolOptions::new()
        .max_connections(if sqlite { 4 } else { 16 })
        .after_connect(|conn, _| {
            Box::pin(async move {
                if conn.backend_name().eq_ignore_ascii_case("sqlite") {
                    // Several app processes share one file: a busy writer is waited for rather
                    // than failed, and WAL commits need no fsync each.
                    conn.execute("PRAGMA busy_timeout = 10000; PRAGMA synchronous = NORMAL")
                        .await?;
                }
                Ok(())
            })
        })
        .connect(url)
        .await?;
    if sqlite {
        // Readers don't block the writer. Persistent in the file; the first instance sets it.
        sqlx::query("PRAGMA journal_mode = WAL")
            .execute(&pool)
            .await?;
    }
    migrate(&pool, sqlite).await?;
    Ok(pool)
}

async fn migrate(pool: &AnyPool, sqlite: bool) -> Result<(), DbError> {
    let id = if sqlite {
        "INTEGER PRIMARY KEY AUTOINCREMENT"
    } else {
        "BIGSERIAL PRIMARY KEY"
    };
    let statements = [
        format!(
            "CREATE TABLE IF NOT EXISTS vouchers (
                id {id}, title TEXT NOT NULL, price BIGINT NOT NULL, stock BIGINT NOT NULL,
                initial_stock BIGINT NOT NULL, begin_at BIGINT NOT NULL, end_at BIGINT NOT NULL)"
        ),
        format!(
            "CREATE TABLE IF NOT EXISTS voucher_orders (
                id {id}, user_id BIGINT NOT NULL, voucher_id BIGINT NOT NULL,
                fencing_token BIGINT NOT NULL, created_at BIGINT NOT NULL)"
        ),
        // The resource the per-user lock `order:<user>:<voucher>` guards: one row per user and
        // voucher, holding the newest fencing token of that lock it has seen.
        "CREATE TABLE IF NOT EXISTS order_slots (
            user_id BIGINT NOT NULL, voucher_id BIGINT NOT NULL, fence BIGINT NOT NULL,
            PRIMARY KEY (user_id, voucher_id))"
            .to_owned(),
        // `fence`: the newest fencing token of the lock `sku:<id>` this row has seen.
        format!(
            "CREATE TABLE IF NOT EXISTS skus (
                id {id}, name TEXT NOT NULL, stock BIGINT NOT NULL, initial_stock BIGINT NOT NULL,
                fence BIGINT NOT NULL DEFAULT 0)"
        ),
        "CREATE TABLE IF NOT EXISTS cart_items (
            user_id BIGINT NOT NULL, sku_id BIGINT NOT NULL, qty BIGINT NOT NULL,
            PRIMARY KEY (user_id, sku_id))"
            .to_owned(),
        format!(
            "CREATE TABLE IF NOT EXISTS cart_orders (
                id {id}, user_id BIGINT NOT NULL, created_at BIGINT NOT NULL)"
        ),
        "CREATE TABLE IF NOT EXISTS cart_order_items (
            order_id BIGINT NOT NULL, sku_id BIGINT NOT NULL, qty BIGINT NOT NULL,
            fencing_token BIGINT NOT NULL)"
            .to_owned(),
    ];
    for statement in statements {
        sqlx::query(&statement).execute(pool).await?;
    }
    Ok(())
}

/// A voucher on sale.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Voucher {
    /// Its id.
    pub id: i64,
    /// What it is.
    pub title: String,
    /// Price in cents.
    pub price: i64,
    /// Left in stock.
    pub stock: i64,
    /// Stock at creation.
    pub initial_stock: i64,
    /// Sale start, ms since the epoch.
    pub begin_at: i64,
    /// Sale end, ms since the epoch.
    pub end_at: i64,
}

impl Voucher {
    pub(crate) fn from_row(row: &AnyRow) -> Result<Self, DbError> {
        Ok(Self {
            id: row.try_get("id")?,
            title: row.try_get("title")?,
            price: row.try_get("price")?,
            stock: row.try_get("stock")?,
            initial_stock: row.try_get("initial_stock")?,
            begin_at: row.try_get("begin_at")?,
            end_at: row.try_get("end_at")?,
        })
    }
}

/// A SKU that carts hold.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Sku {
    /// Its id.
    pub id: i64,
    /// Its name.
    pub name: String,
    /// Left in stock.
    pub stock: i64,
    /// Stock at creation.
    pub initial_stock: i64,
}

impl Sku {
    pub(crate) fn from_row(row: &AnyRow) -> Result<Self, DbError> {
        Ok(Self {
            id: row.try_get("id")?,
            name: row.try_get("name")?,
            stock: row.try_get("stock")?,
            initial_stock: row.try_get("initial_stock")?,
        })
    }
}
