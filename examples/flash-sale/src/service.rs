//! What the shop does, over the database: buying vouchers, carts, checkout, the audit.

use std::collections::HashMap;
use std::time::Instant;

use dlock_core::{FencingToken, LockError, LockName, distributed_lock};
use dlock_tower::HeldLocks;
use sqlx::Row as _;

use crate::db::{Sku, Voucher};
use crate::{
    App, AppError, CartItem, CartOrder, Counters, NewSku, NewVoucher, Order, Stats, now_ms,
};

/// The fencing tokens a request holds, by lock name.
#[derive(Debug, Clone, Default)]
pub struct Fences(HashMap<String, i64>);

impl Fences {
    /// The tokens of the locks a `LockLayer` holds for the request.
    pub fn from_held(held: &HeldLocks) -> Self {
        Self(
            held.names()
                .iter()
                .cloned()
                .zip(held.fencing_tokens().iter().map(|t| db_token(*t)))
                .collect(),
        )
    }

    /// Adds the token of `name`.
    pub fn insert(&mut self, name: &LockName, token: FencingToken) {
        self.0.insert(name.to_string(), db_token(token));
    }

    fn get(&self, name: &LockName) -> Option<i64> {
        self.0.get(name.as_str()).copied()
    }
}

/// A fencing token as the database stores it.
fn db_token(token: FencingToken) -> i64 {
    i64::try_from(token.get()).unwrap_or(i64::MAX)
}

/// The lock name of a SKU: `sku:<id>`.
pub fn sku_lock_name(sku: i64) -> Result<LockName, LockError> {
    LockName::builder().literal("sku:").value(sku).build()
}

fn stale(counters: &Counters, what: String) -> AppError {
    Counters::bump(&counters.stale_refused);
    AppError::Stale(format!(
        "{what}: a newer holder of its lock has been there (stale fencing token); nothing written"
    ))
}

impl App {
    /// Buys voucher `voucher_id` for `user_id`: at most one order per user and voucher, under
    /// the lock `order:<user_id>:<voucher_id>` (unless the shop runs with `--no-locks`).
    pub async fn buy(&self, user_id: i64, voucher_id: i64) -> Result<Order, AppError> {
        if self.locks {
            self.buy_locked(user_id, voucher_id, Instant::now()).await
        } else {
            self.place_order(user_id, voucher_id, None).await
        }
    }

    /// The order under the user's lock, which every instance of the shop takes through the
    /// same Redis; `asked` is when the caller asked for it, to count lock waits.
    #[distributed_lock(key = "order:<user_id>:<voucher_id>", wait = "2s", locker = self.locker)]
    async fn buy_locked(
        &self,
        user_id: i64,
        voucher_id: i64,
        asked: Instant,
    ) -> Result<Order, AppError> {
        self.counters.ran_locked(asked.elapsed());
        let token = dlock_core::fencing_token()
            .ok_or_else(|| LockError::Config("no fencing token in the lock scope".to_owned()))?;
        self.place_order(user_id, voucher_id, Some(db_token(token)))
            .await
    }

    /// Check, then write — across `.await`s, as real code does. Safe only under the user's lock;
    /// `token` is that lock's fencing token (`None` without locks).
    pub(crate) async fn place_order(
        &self,
        user_id: i64,
        voucher_id: i64,
        token: Option<i64>,
    ) -> Result<Order, AppError> {
        let voucher = self.voucher(voucher_id).await?;
        let now = now_ms();
        if now < voucher.begin_at {
            return Err(AppError::Conflict("the sale has not started".to_owned()));
        }
        if now >= voucher.end_at {
            return Err(AppError::Conflict("the sale has ended".to_owned()));
        }
        if let Some(token) = token {
            self.claim_order_slot(user_id, voucher_id, token).await?;
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
        self.write_order(user_id, voucher_id, token, now).await
    }

    /// Registers `token` with the user's order slot for the voucher: refused if a newer holder
    /// of the lock already did.
    pub(crate) async fn claim_order_slot(
        &self,
        user_id: i64,
        voucher_id: i64,
        token: i64,
    ) -> Result<(), AppError> {
        let claimed = sqlx::query(
            "INSERT INTO order_slots (user_id, voucher_id, fence) VALUES ($1, $2, $3)
             ON CONFLICT (user_id, voucher_id) DO UPDATE SET fence = excluded.fence
             WHERE order_slots.fence < excluded.fence",
        )
        .bind(user_id)
        .bind(voucher_id)
        .bind(token)
        .execute(&self.db)
        .await?
        .rows_affected();
        if claimed == 0 {
            return Err(stale(
                &self.counters,
                format!("the order of user {user_id} for voucher {voucher_id}"),
            ));
        }
        Ok(())
    }

    /// The write half of an order, in one transaction: the slot must still carry `token`, the
    /// stock must remain.
    pub(crate) async fn write_order(
        &self,
        user_id: i64,
        voucher_id: i64,
        token: Option<i64>,
        now: i64,
    ) -> Result<Order, AppError> {
        let mut tx = self.db.begin().await?;
        if let Some(token) = token {
            let still_ours = sqlx::query(
                "UPDATE order_slots SET fence = $3
                 WHERE user_id = $1 AND voucher_id = $2 AND fence = $3",
            )
            .bind(user_id)
            .bind(voucher_id)
            .bind(token)
            .execute(&mut *tx)
            .await?
            .rows_affected();
            if still_ours == 0 {
                return Err(stale(
                    &self.counters,
                    format!("the order of user {user_id} for voucher {voucher_id}"),
                ));
            }
        }
        let taken =
            sqlx::query("UPDATE vouchers SET stock = stock - 1 WHERE id = $1 AND stock > 0")
                .bind(voucher_id)
                .execute(&mut *tx)
                .await?
                .rows_affected();
        if taken == 0 {
            return Err(AppError::Conflict("out of stock".to_owned()));
        }
        let fencing_token = token.unwrap_or(0);
        let id: i64 = sqlx::query(
            "INSERT INTO voucher_orders (user_id, voucher_id, fencing_token, created_at)
             VALUES ($1, $2, $3, $4) RETURNING id",
        )
        .bind(user_id)
        .bind(voucher_id)
        .bind(fencing_token)
        .bind(now)
        .fetch_one(&mut *tx)
        .await?
        .try_get("id")?;
        tx.commit().await?;
        Ok(Order {
            id,
            user_id,
            voucher_id,
            fencing_token,
        })
    }

    /// One voucher.
    pub async fn voucher(&self, id: i64) -> Result<Voucher, AppError> {
        let row = sqlx::query(
            "SELECT id, title, price, stock, initial_stock, begin_at, end_at FROM vouchers
             WHERE id = $1",
        )
        .bind(id)
        .fetch_optional(&self.db)
        .await?;
        match row {
            Some(row) => Ok(Voucher::from_row(&row)?),
            None => Err(AppError::NotFound(format!("no voucher {id}"))),
        }
    }

    /// Every voucher.
    pub async fn vouchers(&self) -> Result<Vec<Voucher>, AppError> {
        let rows = sqlx::query(
            "SELECT id, title, price, stock, initial_stock, begin_at, end_at FROM vouchers
             ORDER BY id",
        )
        .fetch_all(&self.db)
        .await?;
        Ok(rows
            .iter()
            .map(Voucher::from_row)
            .collect::<Result<_, _>>()?)
    }

    /// Puts a voucher on sale.
    pub async fn create_voucher(&self, new: &NewVoucher) -> Result<Voucher, AppError> {
        if new.title.trim().is_empty() || new.stock < 0 || new.price < 0 {
            return Err(AppError::BadRequest(
                "a voucher needs a title, a price ≥ 0 and a stock ≥ 0".to_owned(),
            ));
        }
        if new.end_at <= new.begin_at {
            return Err(AppError::BadRequest(
                "the sale must end after it begins".to_owned(),
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
        .fetch_one(&self.db)
        .await?
        .try_get("id")?;
        self.voucher(id).await
    }

    /// The voucher orders of a user.
    pub async fn orders_of(&self, user: i64) -> Result<Vec<Order>, AppError> {
        let rows = sqlx::query(
            "SELECT id, user_id, voucher_id, fencing_token FROM voucher_orders WHERE user_id = $1
             ORDER BY id",
        )
        .bind(user)
        .fetch_all(&self.db)
        .await?;
        Ok(rows
            .iter()
            .map(|row| {
                Ok(Order {
                    id: row.try_get("id")?,
                    user_id: row.try_get("user_id")?,
                    voucher_id: row.try_get("voucher_id")?,
                    fencing_token: row.try_get("fencing_token")?,
                })
            })
            .collect::<Result<_, sqlx::Error>>()?)
    }

    /// Every SKU.
    pub async fn skus(&self) -> Result<Vec<Sku>, AppError> {
        let rows = sqlx::query("SELECT id, name, stock, initial_stock FROM skus ORDER BY id")
            .fetch_all(&self.db)
            .await?;
        Ok(rows.iter().map(Sku::from_row).collect::<Result<_, _>>()?)
    }

    /// Adds a SKU.
    pub async fn create_sku(&self, new: &NewSku) -> Result<Sku, AppError> {
        if new.name.trim().is_empty() || new.stock < 0 {
            return Err(AppError::BadRequest(
                "a SKU needs a name and a stock ≥ 0".to_owned(),
            ));
        }
        let id: i64 = sqlx::query(
            "INSERT INTO skus (name, stock, initial_stock) VALUES ($1, $2, $3) RETURNING id",
        )
        .bind(&new.name)
        .bind(new.stock)
        .bind(new.stock)
        .fetch_one(&self.db)
        .await?
        .try_get("id")?;
        Ok(Sku {
            id,
            name: new.name.clone(),
            stock: new.stock,
            initial_stock: new.stock,
        })
    }

    /// Adds `item` to `user`'s cart (quantities of one SKU add up).
    pub async fn add_to_cart(&self, user: i64, item: &CartItem) -> Result<(), AppError> {
        if item.qty <= 0 {
            return Err(AppError::BadRequest("qty must be positive".to_owned()));
        }
        let known = sqlx::query("SELECT id FROM skus WHERE id = $1")
            .bind(item.sku_id)
            .fetch_optional(&self.db)
            .await?;
        if known.is_none() {
            return Err(AppError::NotFound(format!("no sku {}", item.sku_id)));
        }
        sqlx::query(
            "INSERT INTO cart_items (user_id, sku_id, qty) VALUES ($1, $2, $3)
             ON CONFLICT (user_id, sku_id) DO UPDATE SET qty = cart_items.qty + excluded.qty",
        )
        .bind(user)
        .bind(item.sku_id)
        .bind(item.qty)
        .execute(&self.db)
        .await?;
        Ok(())
    }

    /// `user`'s cart.
    pub async fn cart(&self, user: i64) -> Result<Vec<CartItem>, AppError> {
        let rows =
            sqlx::query("SELECT sku_id, qty FROM cart_items WHERE user_id = $1 ORDER BY sku_id")
                .bind(user)
                .fetch_all(&self.db)
                .await?;
        Ok(rows
            .iter()
            .map(|row| {
                Ok(CartItem {
                    sku_id: row.try_get("sku_id")?,
                    qty: row.try_get("qty")?,
                })
            })
            .collect::<Result<_, sqlx::Error>>()?)
    }

    /// The lock names of the SKUs in `user`'s cart: what checking it out locks.
    pub async fn cart_lock_names(&self, user: i64) -> Result<Vec<LockName>, AppError> {
        self.cart(user)
            .await?
            .iter()
            .map(|item| Ok(sku_lock_name(item.sku_id)?))
            .collect()
    }

    /// Checks out `user`'s cart. `fences` holds the tokens of the SKU locks the request holds
    /// (`None`: the shop runs without locks). The stock is read after the locks are taken, every
    /// stock write is fenced, and the order, its items, the stock and the cart change in one
    /// transaction.
    pub async fn checkout(
        &self,
        user: i64,
        fences: Option<&Fences>,
    ) -> Result<CartOrder, AppError> {
        let items = self.cart(user).await?;
        if items.is_empty() {
            return Err(AppError::BadRequest("the cart is empty".to_owned()));
        }
        // (item, token, stock after)
        let mut plan = Vec::with_capacity(items.len());
        for item in items {
            let sku = item.sku_id;
            let token = match fences {
                Some(fences) => Some(fences.get(&sku_lock_name(sku)?).ok_or_else(|| {
                    AppError::Conflict(
                        "the cart changed while checking out (its SKUs were locked before the \
                         change); try again"
                            .to_owned(),
                    )
                })?),
                None => None,
            };
            if let Some(token) = token {
                self.claim_sku(sku, token).await?;
            }
            // Read now, under the locks: a stock read before locking would be stale.
            let stock: i64 = sqlx::query("SELECT stock FROM skus WHERE id = $1")
                .bind(sku)
                .fetch_optional(&self.db)
                .await?
                .ok_or_else(|| AppError::NotFound(format!("no sku {sku}")))?
                .try_get("stock")?;
            if stock < item.qty {
                return Err(AppError::Conflict(format!("sku {sku} is out of stock")));
            }
            let after = stock - item.qty;
            plan.push((item, token, after));
        }

        let mut tx = self.db.begin().await?;
        for (item, token, after) in &plan {
            let written = match token {
                Some(token) => {
                    sqlx::query("UPDATE skus SET stock = $2 WHERE id = $1 AND fence = $3")
                        .bind(item.sku_id)
                        .bind(after)
                        .bind(token)
                        .execute(&mut *tx)
                        .await?
                }
                None => {
                    sqlx::query("UPDATE skus SET stock = $2 WHERE id = $1")
                        .bind(item.sku_id)
                        .bind(after)
                        .execute(&mut *tx)
                        .await?
                }
            }
            .rows_affected();
            if written == 0 {
                return Err(stale(&self.counters, format!("sku {}", item.sku_id)));
            }
        }
        let id: i64 = sqlx::query(
            "INSERT INTO cart_orders (user_id, created_at) VALUES ($1, $2) RETURNING id",
        )
        .bind(user)
        .bind(now_ms())
        .fetch_one(&mut *tx)
        .await?
        .try_get("id")?;
        for (item, token, _) in &plan {
            sqlx::query(
                "INSERT INTO cart_order_items (order_id, sku_id, qty, fencing_token)
                 VALUES ($1, $2, $3, $4)",
            )
            .bind(id)
            .bind(item.sku_id)
            .bind(item.qty)
            .bind(token.unwrap_or(0))
            .execute(&mut *tx)
            .await?;
            // What was bought leaves the cart; anything added meanwhile stays.
            sqlx::query("UPDATE cart_items SET qty = qty - $3 WHERE user_id = $1 AND sku_id = $2")
                .bind(user)
                .bind(item.sku_id)
                .bind(item.qty)
                .execute(&mut *tx)
                .await?;
        }
        sqlx::query("DELETE FROM cart_items WHERE user_id = $1 AND qty <= 0")
            .bind(user)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(CartOrder {
            id,
            user_id: user,
            items: plan.into_iter().map(|(item, _, _)| item).collect(),
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
        if claimed == 1 {
            return Ok(());
        }
        let exists = sqlx::query("SELECT id FROM skus WHERE id = $1")
            .bind(sku)
            .fetch_optional(&self.db)
            .await?;
        match exists {
            Some(_) => Err(stale(&self.counters, format!("sku {sku}"))),
            None => Err(AppError::NotFound(format!("no sku {sku}"))),
        }
    }

    /// The invariants, read from the database, and this instance's counters.
    pub async fn stats(&self) -> Result<Stats, AppError> {
        let one = |sql: &'static str| async move {
            let row = sqlx::query(sql).fetch_one(&self.db).await?;
            Ok::<i64, AppError>(row.try_get::<Option<i64>, _>("n")?.unwrap_or(0))
        };
        let counter =
            |c: &std::sync::atomic::AtomicU64| c.load(std::sync::atomic::Ordering::Relaxed);
        let c = &self.counters;
        Ok(Stats {
            locks: self.locks,
            requests: counter(&c.requests),
            locked: counter(&c.locked),
            lock_waits: counter(&c.lock_waits),
            conflicts: counter(&c.conflicts),
            stale_writes_refused: counter(&c.stale_refused),
            voucher_orders: one("SELECT COUNT(*) AS n FROM voucher_orders").await?,
            voucher_initial_stock: one(
                "SELECT CAST(SUM(initial_stock) AS BIGINT) AS n FROM vouchers",
            )
            .await?,
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
            sku_units_sold: one("SELECT CAST(SUM(qty) AS BIGINT) AS n FROM cart_order_items")
                .await?,
            sku_initial_stock: one("SELECT CAST(SUM(initial_stock) AS BIGINT) AS n FROM skus")
                .await?,
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

#[cfg(test)]
mod tests {
    //! The fences, deterministically: a holder paused past its lease is refused, whichever of it
    //! and its successor reaches the row first.

    use super::*;

    async fn shop() -> (App, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}?mode=rwc", dir.path().join("shop.db").display());
        let app = crate::app(&url, dlock_core::Locker::memory(), true)
            .await
            .unwrap();
        (app, dir)
    }

    async fn open_voucher(app: &App, stock: i64) -> i64 {
        let new = NewVoucher {
            title: "v".into(),
            price: 1,
            stock,
            begin_at: now_ms() - 1_000,
            end_at: now_ms() + 60_000,
        };
        app.create_voucher(&new).await.unwrap().id
    }

    #[tokio::test]
    async fn a_stale_order_writer_is_refused_after_its_successor_claimed_the_slot() {
        let (app, _dir) = shop().await;
        let voucher = open_voucher(&app, 10).await;
        // Holder 5 claims and checks, then pauses; its lease runs out and holder 6 takes over.
        app.claim_order_slot(1, voucher, 5).await.unwrap();
        app.claim_order_slot(1, voucher, 6).await.unwrap();
        // Holder 5 wakes up and writes: refused, nothing written.
        let err = app
            .write_order(1, voucher, Some(5), now_ms())
            .await
            .unwrap_err();
        assert!(matches!(err, AppError::Stale(_)), "{err:?}");
        // Holder 6 writes: accepted. One order, one unit of stock.
        let order = app
            .write_order(1, voucher, Some(6), now_ms())
            .await
            .unwrap();
        assert_eq!(order.fencing_token, 6);
        // A holder with an older token can't even claim any more.
        let err = app.claim_order_slot(1, voucher, 4).await.unwrap_err();
        assert!(matches!(err, AppError::Stale(_)), "{err:?}");
        let stats = app.stats().await.unwrap();
        assert_eq!(stats.voucher_orders, 1);
        assert_eq!(stats.stale_writes_refused, 2);
        assert_eq!(app.voucher(voucher).await.unwrap().stock, 9);
    }

    #[tokio::test]
    async fn a_stale_order_writer_that_wrote_first_is_seen_by_its_successor() {
        let (app, _dir) = shop().await;
        let voucher = open_voucher(&app, 10).await;
        app.claim_order_slot(1, voucher, 5).await.unwrap();
        app.write_order(1, voucher, Some(5), now_ms())
            .await
            .unwrap();
        // The successor claims after that write, so its check sees the order.
        let err = app.place_order(1, voucher, Some(6)).await.unwrap_err();
        assert!(err.to_string().contains("one order per user"), "{err:?}");
        assert_eq!(app.stats().await.unwrap().voucher_orders, 1);
    }

    #[tokio::test]
    async fn a_stale_stock_writer_is_refused_and_writes_nothing() {
        let (app, _dir) = shop().await;
        let a = app
            .create_sku(&NewSku {
                name: "a".into(),
                stock: 5,
            })
            .await
            .unwrap()
            .id;
        let b = app
            .create_sku(&NewSku {
                name: "b".into(),
                stock: 5,
            })
            .await
            .unwrap()
            .id;
        for user in [1, 2] {
            for sku in [a, b] {
                app.add_to_cart(
                    user,
                    &CartItem {
                        sku_id: sku,
                        qty: 1,
                    },
                )
                .await
                .unwrap();
            }
        }
        let fences = |token: u64| {
            let mut fences = Fences::default();
            for sku in [a, b] {
                fences.insert(&sku_lock_name(sku).unwrap(), FencingToken::new(token));
            }
            fences
        };
        // User 2's checkout holds newer tokens for both SKUs and goes through.
        app.checkout(2, Some(&fences(8))).await.unwrap();
        // User 1's checkout under older tokens (a holder paused past its lease) is refused.
        let err = app.checkout(1, Some(&fences(7))).await.unwrap_err();
        assert!(matches!(err, AppError::Stale(_)), "{err:?}");
        let skus = app.skus().await.unwrap();
        assert!(skus.iter().all(|s| s.stock == 4), "{skus:?}");
        assert_eq!(app.cart(1).await.unwrap().len(), 2, "the cart is kept");
        assert!(app.cart(2).await.unwrap().is_empty());
    }

    #[tokio::test]
    async fn checkout_refuses_a_sku_it_holds_no_lock_for() {
        let (app, _dir) = shop().await;
        let sku = app
            .create_sku(&NewSku {
                name: "a".into(),
                stock: 5,
            })
            .await
            .unwrap()
            .id;
        app.add_to_cart(
            1,
            &CartItem {
                sku_id: sku,
                qty: 2,
            },
        )
        .await
        .unwrap();
        let err = app.checkout(1, Some(&Fences::default())).await.unwrap_err();
        assert!(err.to_string().contains("cart changed"), "{err:?}");
        assert_eq!(app.skus().await.unwrap()[0].stock, 5);
        // Without locks the same cart goes through, unfenced.
        let order = app.checkout(1, None).await.unwrap();
        assert_eq!(
            order.items,
            vec![CartItem {
                sku_id: sku,
                qty: 2
            }]
        );
        assert_eq!(app.skus().await.unwrap()[0].stock, 3);
    }
}
