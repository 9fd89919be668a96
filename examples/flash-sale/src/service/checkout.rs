//! Checkout: the cart's SKUs, fenced, in one transaction with the order.

use std::collections::HashMap;

use dlock_core::LockName;
use sqlx::Row as _;

use super::carts::line_from_row;
use super::{Fences, cart_lock_name, sku_lock_name};
use crate::model::{CURRENCY, CartLine, CartOrder, Orders, total};
use crate::{App, AppError, now_ms};

/// The answer when the cart holds a SKU whose lock the request doesn't hold: it was added
/// between the moment the locks were chosen and the moment they were taken.
pub(crate) const CART_CHANGED: &str = "cart changed during checkout; nothing was bought, retry";

impl App {
    /// What checking out `user`'s cart locks: the cart (which decides the rest, and which every
    /// cart edit locks) and every SKU in it now. Read before the locks are taken, so the
    /// checkout reads the cart again under them and refuses any SKU it does not hold.
    pub async fn checkout_lock_names(&self, user: i64) -> Result<Vec<LockName>, AppError> {
        self.user(user).await?;
        let skus = sqlx::query("SELECT sku_id FROM cart_items WHERE user_id = $1")
            .bind(user)
            .fetch_all(&self.db)
            .await?;
        let mut names = vec![cart_lock_name(user)?];
        for row in &skus {
            names.push(sku_lock_name(row.try_get("sku_id")?)?);
        }
        Ok(names)
    }

    /// Checks out `user`'s cart. `fences` holds the tokens of the locks the request holds
    /// (`None`: the shop runs without locks).
    ///
    /// Under the locks: the cart is claimed and read, every SKU in it must be held (409
    /// "cart changed" otherwise), every SKU row is claimed and its stock read; then one
    /// transaction writes the stock (fenced), the order, its items, and takes exactly the
    /// ordered items out of the cart. Any refusal rolls all of it back.
    pub async fn checkout(
        &self,
        user: i64,
        fences: Option<&Fences>,
    ) -> Result<CartOrder, AppError> {
        self.user(user).await?;
        let held = |name: LockName| -> Result<Option<i64>, AppError> {
            match fences {
                Some(fences) => match fences.get(&name) {
                    Some(token) => Ok(Some(token)),
                    None => {
                        tracing::info!(lock = %name, "checkout refused: the cart changed");
                        Err(AppError::Conflict(CART_CHANGED.to_owned()))
                    }
                },
                None => Ok(None),
            }
        };
        let cart_token = held(cart_lock_name(user)?)?;
        if let Some(token) = cart_token {
            self.claim_cart(user, token).await?;
        }
        let lines = self.cart_lines(user).await?;
        if lines.is_empty() {
            return Err(AppError::BadRequest("the cart is empty".to_owned()));
        }
        let mut plan = Vec::with_capacity(lines.len());
        for line in lines {
            let token = held(sku_lock_name(line.sku_id)?)?;
            plan.push((line, token));
        }
        for (line, token) in &plan {
            if let Some(token) = token {
                self.claim_sku(line.sku_id, *token).await?;
            }
        }
        // Read now, under the locks: a stock read before locking would be stale.
        let mut writes = Vec::with_capacity(plan.len());
        for (line, token) in plan {
            let stock: i64 = sqlx::query("SELECT stock FROM skus WHERE id = $1")
                .bind(line.sku_id)
                .fetch_one(&self.db)
                .await?
                .try_get("stock")?;
            if stock < line.qty {
                return Err(AppError::Conflict(format!(
                    "{} is out of stock ({stock} left, {} in the cart)",
                    line.name, line.qty
                )));
            }
            let after = stock - line.qty;
            writes.push((line, token, after));
        }
        self.write_checkout(user, cart_token, writes).await
    }

    /// The write half of a checkout: one transaction.
    async fn write_checkout(
        &self,
        user: i64,
        cart_token: Option<i64>,
        writes: Vec<(CartLine, Option<i64>, i64)>,
    ) -> Result<CartOrder, AppError> {
        let mut tx = self.db.begin().await?;
        // A write first (SQLite takes the write lock now), and the cart's fence.
        let touched = match cart_token {
            Some(token) => sqlx::query(
                "UPDATE users SET cart_version = cart_version + 1,
                                  orders_version = orders_version + 1
                 WHERE id = $1 AND cart_fence = $2",
            )
            .bind(user)
            .bind(token),
            None => sqlx::query(
                "UPDATE users SET cart_version = cart_version + 1,
                                  orders_version = orders_version + 1
                 WHERE id = $1",
            )
            .bind(user),
        }
        .execute(&mut *tx)
        .await?
        .rows_affected();
        if touched == 0 {
            return Err(self.stale("your cart"));
        }
        for (line, token, after) in &writes {
            let written = match token {
                Some(token) => {
                    sqlx::query("UPDATE skus SET stock = $2 WHERE id = $1 AND fence = $3")
                        .bind(line.sku_id)
                        .bind(after)
                        .bind(token)
                }
                None => sqlx::query("UPDATE skus SET stock = $2 WHERE id = $1")
                    .bind(line.sku_id)
                    .bind(after),
            }
            .execute(&mut *tx)
            .await?
            .rows_affected();
            if written == 0 {
                return Err(self.stale(&line.name));
            }
        }
        let total_cents = writes.iter().fold(0i64, |sum, (line, ..)| {
            sum.saturating_add(line.qty.saturating_mul(line.price_cents))
        });
        let now = now_ms();
        let id: i64 = sqlx::query(
            "INSERT INTO cart_orders (user_id, total, created_at) VALUES ($1, $2, $3)
             RETURNING id",
        )
        .bind(user)
        .bind(total_cents)
        .bind(now)
        .fetch_one(&mut *tx)
        .await?
        .try_get("id")?;
        for (line, token, _) in &writes {
            sqlx::query(
                "INSERT INTO cart_order_items (order_id, sku_id, name, price, qty, fencing_token)
                 VALUES ($1, $2, $3, $4, $5, $6)",
            )
            .bind(id)
            .bind(line.sku_id)
            .bind(&line.name)
            .bind(line.price_cents)
            .bind(line.qty)
            .bind(token.unwrap_or(0))
            .execute(&mut *tx)
            .await?;
            // What was bought leaves the cart; anything added meanwhile stays.
            sqlx::query("UPDATE cart_items SET qty = qty - $3 WHERE user_id = $1 AND sku_id = $2")
                .bind(user)
                .bind(line.sku_id)
                .bind(line.qty)
                .execute(&mut *tx)
                .await?;
        }
        sqlx::query("DELETE FROM cart_items WHERE user_id = $1 AND qty <= 0")
            .bind(user)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        let items: Vec<CartLine> = writes.into_iter().map(|(line, ..)| line).collect();
        tracing::info!(
            order = id,
            lines = items.len(),
            total_cents,
            "cart checked out"
        );
        Ok(CartOrder {
            id,
            user_id: user,
            items,
            total_cents,
            currency: CURRENCY.to_owned(),
            at_ms: now,
        })
    }

    /// Registers `token` with the SKU's row: refused if a newer holder of `sku:<id>` already
    /// did (`UPDATE ... WHERE fence < $token`).
    pub(crate) async fn claim_sku(&self, sku: i64, token: i64) -> Result<(), AppError> {
        let claimed = sqlx::query("UPDATE skus SET fence = $2 WHERE id = $1 AND fence < $2")
            .bind(sku)
            .bind(token)
            .execute(&self.db)
            .await?
            .rows_affected();
        if claimed == 0 {
            return Err(self.stale(&format!("sku {sku}")));
        }
        Ok(())
    }

    /// Registers `token` with `user`'s cart: refused if a newer holder of `cart:<user>` already
    /// did.
    pub(crate) async fn claim_cart(&self, user: i64, token: i64) -> Result<(), AppError> {
        let claimed =
            sqlx::query("UPDATE users SET cart_fence = $2 WHERE id = $1 AND cart_fence < $2")
                .bind(user)
                .bind(token)
                .execute(&self.db)
                .await?
                .rows_affected();
        if claimed == 0 {
            return Err(self.stale("your cart"));
        }
        Ok(())
    }

    /// The cart orders of a user, oldest first.
    pub(crate) async fn cart_orders_of(&self, user: i64) -> Result<Vec<CartOrder>, AppError> {
        let orders =
            sqlx::query("SELECT id, created_at FROM cart_orders WHERE user_id = $1 ORDER BY id")
                .bind(user)
                .fetch_all(&self.db)
                .await?;
        let rows = sqlx::query(
            "SELECT i.order_id AS order_id, i.sku_id AS sku_id, i.name AS name, i.qty AS qty,
                    i.price AS price
             FROM cart_order_items i JOIN cart_orders o ON o.id = i.order_id
             WHERE o.user_id = $1 ORDER BY i.order_id, i.sku_id",
        )
        .bind(user)
        .fetch_all(&self.db)
        .await?;
        let mut lines: HashMap<i64, Vec<CartLine>> = HashMap::new();
        for row in &rows {
            let order: i64 = row.try_get("order_id")?;
            lines.entry(order).or_default().push(line_from_row(row)?);
        }
        let mut out = Vec::with_capacity(orders.len());
        for row in &orders {
            let id: i64 = row.try_get("id")?;
            let items = lines.remove(&id).unwrap_or_default();
            out.push(CartOrder {
                id,
                user_id: user,
                total_cents: total(&items),
                items,
                currency: CURRENCY.to_owned(),
                at_ms: row.try_get("created_at")?,
            });
        }
        Ok(out)
    }

    /// A user's orders: vouchers and carts (404 for an unknown user).
    pub async fn orders_of(&self, user: i64) -> Result<Orders, AppError> {
        self.user(user).await?;
        Ok(Orders {
            vouchers: self.voucher_orders_of(user).await?,
            carts: self.cart_orders_of(user).await?,
        })
    }
}
