//! The audit: the shop's invariants read from the database, and the request counters of every
//! instance.

use sqlx::Row as _;

use crate::model::Stats;
use crate::validate::MAX_SAFE_INTEGER;
use crate::{App, AppError};

/// A count as the API answers it: 0 to 2⁵³ − 1.
fn clamp(n: i64) -> u64 {
    n.clamp(0, MAX_SAFE_INTEGER) as u64
}

impl App {
    /// The invariants and the counters of every instance (this one's flushed first, so that
    /// it reads its own requests).
    pub async fn stats(&self) -> Result<Stats, AppError> {
        self.counters.flush(&self.db).await?;
        let one = |sql: &'static str| async move {
            let row = sqlx::query(sql).fetch_one(&self.db).await?;
            Ok::<u64, AppError>(clamp(row.try_get::<Option<i64>, _>("n")?.unwrap_or(0)))
        };
        let mut stats = Stats {
            locks: self.locks,
            ..Stats::default()
        };
        let counters =
            sqlx::query("SELECT name, CAST(SUM(value) AS BIGINT) AS n FROM counters GROUP BY name")
                .fetch_all(&self.db)
                .await?;
        for row in &counters {
            let name: String = row.try_get("name")?;
            let n = clamp(row.try_get::<Option<i64>, _>("n")?.unwrap_or(0));
            match name.as_str() {
                "requests" => stats.requests = n,
                "locked" => stats.locked = n,
                "lock_waits" => stats.lock_waits = n,
                "conflicts" => stats.conflicts = n,
                "stale_refused" => stats.stale_refused = n,
                _ => {}
            }
        }
        stats.voucher_orders = one("SELECT COUNT(*) AS n FROM voucher_orders").await?;
        stats.voucher_initial_stock =
            one("SELECT CAST(SUM(initial_stock) AS BIGINT) AS n FROM vouchers").await?;
        stats.duplicate_orders = one(
            "SELECT COUNT(*) AS n FROM (SELECT user_id, voucher_id FROM voucher_orders
             GROUP BY user_id, voucher_id HAVING COUNT(*) > 1) AS d",
        )
        .await?;
        stats.oversold_vouchers = one("SELECT COUNT(*) AS n FROM vouchers v WHERE
             (SELECT COUNT(*) FROM voucher_orders o WHERE o.voucher_id = v.id) > v.initial_stock")
        .await?;
        stats.units_sold =
            one("SELECT CAST(SUM(qty) AS BIGINT) AS n FROM cart_order_items").await?;
        stats.sku_initial_stock =
            one("SELECT CAST(SUM(initial_stock) AS BIGINT) AS n FROM skus").await?;
        stats.units_oversold = one(
            "SELECT CAST(SUM(CASE WHEN sold > initial_stock THEN sold - initial_stock ELSE 0 END)
                    AS BIGINT) AS n
             FROM (SELECT s.initial_stock AS initial_stock,
                          (SELECT CAST(COALESCE(SUM(i.qty), 0) AS BIGINT) FROM cart_order_items i
                           WHERE i.sku_id = s.id) AS sold
                   FROM skus s) AS t",
        )
        .await?;
        // initial − remaining − ordered, per SKU and per voucher: positive = units gone without
        // an order, negative = units ordered that never left the stock.
        let drift = "SELECT s.initial_stock - s.stock
                        - (SELECT CAST(COALESCE(SUM(i.qty), 0) AS BIGINT) FROM cart_order_items i
                           WHERE i.sku_id = s.id) AS d
                     FROM skus s
                     UNION ALL
                     SELECT v.initial_stock - v.stock
                        - (SELECT COUNT(*) FROM voucher_orders o WHERE o.voucher_id = v.id) AS d
                     FROM vouchers v";
        let row = sqlx::query(&format!(
            "SELECT CAST(COALESCE(SUM(CASE WHEN d > 0 THEN d ELSE 0 END), 0) AS BIGINT) AS lost,
                    CAST(COALESCE(SUM(CASE WHEN d < 0 THEN 0 - d ELSE 0 END), 0) AS BIGINT)
                        AS double_sold
             FROM ({drift}) AS t"
        ))
        .fetch_one(&self.db)
        .await?;
        stats.units_lost = clamp(row.try_get("lost")?);
        stats.units_double_sold = clamp(row.try_get("double_sold")?);
        stats.negative_stock_rows = one("SELECT (SELECT COUNT(*) FROM vouchers WHERE stock < 0)
                  + (SELECT COUNT(*) FROM skus WHERE stock < 0) AS n")
        .await?;
        Ok(stats)
    }
}
