//! SKUs and carts. Every cart edit holds the lock `cart:<user>` (with locks on) and is fenced
//! by it, so a checkout that holds that lock sees a cart nobody changes.

use std::future::Future;

use sqlx::Row as _;
use sqlx::any::AnyRow;

use super::cart_lock_name;
use crate::model::{CURRENCY, Cart, CartItem, CartLine, NewSku, Sku};
use crate::routes::LOCK_WAIT;
use crate::{App, AppError, validate};

fn sku_from_row(row: &AnyRow) -> Result<Sku, sqlx::Error> {
    Ok(Sku {
        id: row.try_get("id")?,
        name: row.try_get("name")?,
        price_cents: row.try_get("price")?,
        currency: CURRENCY.to_owned(),
        stock: row.try_get("stock")?,
    })
}

pub(crate) fn line_from_row(row: &AnyRow) -> Result<CartLine, sqlx::Error> {
    Ok(CartLine {
        sku_id: row.try_get("sku_id")?,
        name: row.try_get("name")?,
        qty: row.try_get("qty")?,
        price_cents: row.try_get("price")?,
        currency: CURRENCY.to_owned(),
    })
}

impl App {
    /// Every SKU.
    pub async fn skus(&self) -> Result<Vec<Sku>, AppError> {
        let rows = sqlx::query("SELECT id, name, price, stock FROM skus ORDER BY id")
            .fetch_all(&self.db)
            .await?;
        Ok(rows.iter().map(sku_from_row).collect::<Result<_, _>>()?)
    }

    /// One SKU: 404 if there is none.
    pub async fn sku(&self, id: i64) -> Result<Sku, AppError> {
        let id = validate::id("sku id", id)?;
        let row = sqlx::query("SELECT id, name, price, stock FROM skus WHERE id = $1")
            .bind(id)
            .fetch_optional(&self.db)
            .await?;
        match row {
            Some(row) => Ok(sku_from_row(&row)?),
            None => Err(AppError::NotFound(format!("no sku {id}"))),
        }
    }

    /// Adds a SKU.
    pub async fn create_sku(&self, new: &NewSku) -> Result<Sku, AppError> {
        let name = validate::text("name", &new.name, validate::MAX_SKU_NAME)?;
        let price = validate::within("price_cents", new.price_cents, 0, validate::MAX_PRICE_CENTS)?;
        let stock = validate::within("stock", new.stock, 0, validate::MAX_STOCK)?;
        let id: i64 = sqlx::query(
            "INSERT INTO skus (name, price, stock, initial_stock) VALUES ($1, $2, $3, $4)
             RETURNING id",
        )
        .bind(&name)
        .bind(price)
        .bind(stock)
        .bind(stock)
        .fetch_one(&self.db)
        .await?
        .try_get("id")?;
        tracing::info!(sku = id, stock, "sku created");
        self.sku(id).await
    }

    /// `user`'s cart (404 for an unknown user).
    pub async fn cart(&self, user: i64) -> Result<Cart, AppError> {
        self.user(user).await?;
        Ok(Cart::of(self.cart_lines(user).await?))
    }

    /// The lines of `user`'s cart, by SKU id.
    pub(crate) async fn cart_lines(&self, user: i64) -> Result<Vec<CartLine>, AppError> {
        let rows = sqlx::query(
            "SELECT c.sku_id AS sku_id, s.name AS name, c.qty AS qty, s.price AS price
             FROM cart_items c JOIN skus s ON s.id = c.sku_id
             WHERE c.user_id = $1 ORDER BY c.sku_id",
        )
        .bind(user)
        .fetch_all(&self.db)
        .await?;
        Ok(rows.iter().map(line_from_row).collect::<Result<_, _>>()?)
    }

    /// Runs the cart edit `edit` under the lock `cart:<user>` (with locks on), handing it the
    /// lock's fencing token.
    async fn edit_cart<T, F, Fut>(&self, user: i64, edit: F) -> Result<T, AppError>
    where
        F: FnOnce(Option<i64>) -> Fut,
        Fut: Future<Output = Result<T, AppError>>,
    {
        if !self.locks {
            return edit(None).await;
        }
        let guard = self
            .locker
            .lock(cart_lock_name(user)?)
            .wait(LOCK_WAIT)
            .await?;
        // Minted by Redis at this first ask. Lost, or Redis unreachable: the edit must not run,
        // and the lock's error is the answer (problem+json, as every lock error).
        let token = match guard.fencing_token().await {
            Ok(token) => super::db_token(token),
            Err(err) => {
                let released = guard.release().await;
                if !released.is_released() {
                    tracing::debug!(?released, "cart lock given up without its token");
                }
                return Err(err.into());
            }
        };
        let edited = edit(Some(token)).await;
        let released = guard.release().await;
        if !released.is_released() {
            tracing::warn!(?released, "cart lock not released cleanly");
        }
        edited
    }

    /// The first statement of every cart edit's transaction: bumps the cart's version (what
    /// the event stream watches) and, under the cart lock, checks the fence. A write first, so
    /// that SQLite takes the write lock at once.
    async fn touch_cart(
        &self,
        tx: &mut sqlx::Transaction<'_, sqlx::Any>,
        user: i64,
        token: Option<i64>,
    ) -> Result<(), AppError> {
        let touched = match token {
            Some(token) => {
                sqlx::query(
                    "UPDATE users SET cart_version = cart_version + 1, cart_fence = $2
                     WHERE id = $1 AND cart_fence <= $2",
                )
                .bind(user)
                .bind(token)
                .execute(&mut **tx)
                .await?
            }
            None => {
                sqlx::query("UPDATE users SET cart_version = cart_version + 1 WHERE id = $1")
                    .bind(user)
                    .execute(&mut **tx)
                    .await?
            }
        }
        .rows_affected();
        if touched == 0 {
            return Err(self.stale("your cart"));
        }
        Ok(())
    }

    /// Adds `item` to `user`'s cart (quantities of one SKU add up, to at most 100; a cart holds
    /// at most 20 different SKUs). An unknown SKU is a 404 and nothing is stored.
    pub async fn add_to_cart(&self, user: i64, item: &CartItem) -> Result<Cart, AppError> {
        let sku = validate::id("sku_id", item.sku_id)?;
        let qty = validate::within("qty", item.qty, 1, validate::MAX_QTY)?;
        self.user(user).await?;
        self.sku(sku).await?;
        self.edit_cart(user, |token| async move {
            let mut tx = self.db.begin().await?;
            self.touch_cart(&mut tx, user, token).await?;
            let row = sqlx::query(
                "SELECT COUNT(*) AS lines,
                        CAST(COALESCE(SUM(CASE WHEN sku_id = $2 THEN qty ELSE 0 END), 0) AS BIGINT)
                            AS qty
                 FROM cart_items WHERE user_id = $1",
            )
            .bind(user)
            .bind(sku)
            .fetch_one(&mut *tx)
            .await?;
            let (lines, held): (i64, i64) = (row.try_get("lines")?, row.try_get("qty")?);
            if held == 0 && lines >= validate::MAX_CART_LINES {
                return Err(AppError::Unprocessable(format!(
                    "a cart holds at most {} different SKUs",
                    validate::MAX_CART_LINES
                )));
            }
            if held + qty > validate::MAX_QTY {
                return Err(AppError::Unprocessable(format!(
                    "a cart holds at most {} of one SKU ({held} in the cart already)",
                    validate::MAX_QTY
                )));
            }
            sqlx::query(
                "INSERT INTO cart_items (user_id, sku_id, qty) VALUES ($1, $2, $3)
                 ON CONFLICT (user_id, sku_id) DO UPDATE SET qty = cart_items.qty + excluded.qty",
            )
            .bind(user)
            .bind(sku)
            .bind(qty)
            .execute(&mut *tx)
            .await?;
            tx.commit().await?;
            Ok(())
        })
        .await?;
        self.cart(user).await
    }

    /// Takes SKU `sku` out of `user`'s cart (nothing to do if it isn't there).
    pub async fn remove_from_cart(&self, user: i64, sku: i64) -> Result<Cart, AppError> {
        let sku = validate::id("sku id", sku)?;
        self.user(user).await?;
        self.edit_cart(user, |token| async move {
            let mut tx = self.db.begin().await?;
            self.touch_cart(&mut tx, user, token).await?;
            sqlx::query("DELETE FROM cart_items WHERE user_id = $1 AND sku_id = $2")
                .bind(user)
                .bind(sku)
                .execute(&mut *tx)
                .await?;
            tx.commit().await?;
            Ok(())
        })
        .await?;
        self.cart(user).await
    }

    /// Empties `user`'s cart.
    pub async fn clear_cart(&self, user: i64) -> Result<Cart, AppError> {
        self.user(user).await?;
        self.edit_cart(user, |token| async move {
            let mut tx = self.db.begin().await?;
            self.touch_cart(&mut tx, user, token).await?;
            sqlx::query("DELETE FROM cart_items WHERE user_id = $1")
                .bind(user)
                .execute(&mut *tx)
                .await?;
            tx.commit().await?;
            Ok(())
        })
        .await?;
        self.cart(user).await
    }
}
