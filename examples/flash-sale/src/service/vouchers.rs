//! Vouchers: on sale in a window, one order per user, under the lock `order:<user>:<voucher>`.

use std::time::Instant;

use dlock_core::{LockName, distributed_lock};
use sqlx::Row as _;
use sqlx::any::AnyRow;

use super::db_token;
use crate::model::{CURRENCY, NewVoucher, Order, Voucher};
use crate::{App, AppError, now_ms, validate};

/// How long a buyer waits to be let into a voucher's order path.
const SALE_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

const VOUCHER_COLUMNS: &str = "id, title, price, stock, begin_at, end_at";

fn voucher_from_row(row: &AnyRow) -> Result<Voucher, sqlx::Error> {
    Ok(Voucher {
        id: row.try_get("id")?,
        title: row.try_get("title")?,
        price_cents: row.try_get("price")?,
        currency: CURRENCY.to_owned(),
        stock: row.try_get("stock")?,
        starts_at_ms: row.try_get("begin_at")?,
        ends_at_ms: row.try_get("end_at")?,
    })
}

fn order_from_row(row: &AnyRow) -> Result<Order, sqlx::Error> {
    Ok(Order {
        id: row.try_get("id")?,
        user_id: row.try_get("user_id")?,
        voucher_id: row.try_get("voucher_id")?,
        title: row.try_get("title")?,
        price_cents: row.try_get("price")?,
        currency: CURRENCY.to_owned(),
        fencing_token: row.try_get("fencing_token")?,
        at_ms: row.try_get("created_at")?,
    })
}

/// The sale window, as a shopper is told.
fn on_sale(voucher: &Voucher, now: i64) -> Result<(), AppError> {
    if now < voucher.starts_at_ms {
        return Err(AppError::Conflict("the sale has not started".to_owned()));
    }
    if now >= voucher.ends_at_ms {
        return Err(AppError::Conflict("the sale has ended".to_owned()));
    }
    Ok(())
}

fn already_ordered() -> AppError {
    AppError::Conflict("one order per user: you already hold this voucher".to_owned())
}

impl App {
    /// Buys voucher `voucher_id` for `user_id`: at most one order per user and voucher, under
    /// the lock `order:<user_id>:<voucher_id>`, with at most
    /// [`buyers_per_voucher`](App::buyers_per_voucher) buyers of the voucher in the order path
    /// at once across instances (unless the shop runs with `--no-locks`).
    ///
    /// The user and the voucher are looked up before any lock: a request for something that
    /// doesn't exist (or isn't on sale) is answered without touching Redis, and leaves no key
    /// there.
    pub async fn buy(&self, user_id: i64, voucher_id: i64) -> Result<Order, AppError> {
        self.user(user_id).await?;
        let voucher = self.voucher(voucher_id).await?;
        on_sale(&voucher, now_ms())?;
        // Stock never comes back and orders never go: a sold-out answer needs no lock.
        if voucher.stock <= 0 {
            return Err(if self.has_ordered(user_id, voucher_id).await? {
                already_ordered()
            } else {
                AppError::Conflict("sold out".to_owned())
            });
        }
        if !self.locks {
            return self.place_order(user_id, voucher_id, None).await;
        }
        // At most `buyers_per_voucher` buyers of this voucher in the order path at once, on
        // every instance together; the others wait for a permit (409 busy after the wait).
        let asked = Instant::now();
        let sale = LockName::builder()
            .literal("sale:")
            .value(voucher_id)
            .build()?;
        let permit = (self
            .locker
            .semaphore(sale, self.buyers_per_voucher)
            .acquire())
        .wait(SALE_WAIT)
        .await?;
        let order = permit
            .run(async {
                let _buying = self.counters.buying();
                self.buy_locked(user_id, voucher_id, asked).await
            })
            .await;
        // Given back either way; a permit that could not be given back expires with its lease.
        let _ = permit.release().await;
        order?
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
        let waited = asked.elapsed();
        self.counters.ran_locked(waited);
        // Minted by Redis at this first ask. A lost lock (`LockError::Lost`) or an unreachable
        // Redis (`LockError::Backend`) is answered as the lock's own error, and nothing is
        // written: without a token this request has no authority over the order.
        let token = match dlock_core::scope::fencing_token().await {
            Ok(token) => token,
            // No lock in this task's scope: a mistake in this code, not in the request.
            Err(err) if err.is_config() => {
                return Err(AppError::Internal(
                    "the order ran outside its lock's scope".to_owned(),
                ));
            }
            Err(err) => return Err(err.into()),
        };
        tracing::info!(
            lock = "order",
            fencing_token = token.get(),
            waited_ms = waited.as_millis() as u64,
            "lock acquired"
        );
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
        on_sale(&voucher, now)?;
        if let Some(token) = token {
            self.claim_order_slot(user_id, voucher_id, token).await?;
        }
        if self.has_ordered(user_id, voucher_id).await? {
            return Err(already_ordered());
        }
        self.write_order(user_id, &voucher, token, now).await
    }

    /// Whether `user_id` holds an order for `voucher_id`.
    async fn has_ordered(&self, user_id: i64, voucher_id: i64) -> Result<bool, AppError> {
        let existing: i64 = sqlx::query(
            "SELECT COUNT(*) AS n FROM voucher_orders WHERE user_id = $1 AND voucher_id = $2",
        )
        .bind(user_id)
        .bind(voucher_id)
        .fetch_one(&self.db)
        .await?
        .try_get("n")?;
        Ok(existing > 0)
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
            return Err(self.stale("your order for this voucher"));
        }
        Ok(())
    }

    /// The write half of an order, in one transaction: the slot must still carry `token`, the
    /// stock must remain.
    pub(crate) async fn write_order(
        &self,
        user_id: i64,
        voucher: &Voucher,
        token: Option<i64>,
        now: i64,
    ) -> Result<Order, AppError> {
        let mut tx = self.db.begin().await?;
        // A write first: on SQLite the transaction takes the write lock now, not halfway.
        sqlx::query("UPDATE users SET orders_version = orders_version + 1 WHERE id = $1")
            .bind(user_id)
            .execute(&mut *tx)
            .await?;
        if let Some(token) = token {
            let still_ours = sqlx::query(
                "UPDATE order_slots SET fence = $3
                 WHERE user_id = $1 AND voucher_id = $2 AND fence = $3",
            )
            .bind(user_id)
            .bind(voucher.id)
            .bind(token)
            .execute(&mut *tx)
            .await?
            .rows_affected();
            if still_ours == 0 {
                return Err(self.stale("your order for this voucher"));
            }
        }
        let taken =
            sqlx::query("UPDATE vouchers SET stock = stock - 1 WHERE id = $1 AND stock > 0")
                .bind(voucher.id)
                .execute(&mut *tx)
                .await?
                .rows_affected();
        if taken == 0 {
            return Err(AppError::Conflict("sold out".to_owned()));
        }
        let fencing_token = token.unwrap_or(0);
        let id: i64 = sqlx::query(
            "INSERT INTO voucher_orders (user_id, voucher_id, fencing_token, created_at)
             VALUES ($1, $2, $3, $4) RETURNING id",
        )
        .bind(user_id)
        .bind(voucher.id)
        .bind(fencing_token)
        .bind(now)
        .fetch_one(&mut *tx)
        .await?
        .try_get("id")?;
        tx.commit().await?;
        tracing::info!(order = id, voucher = voucher.id, "voucher ordered");
        Ok(Order {
            id,
            user_id,
            voucher_id: voucher.id,
            title: voucher.title.clone(),
            price_cents: voucher.price_cents,
            currency: CURRENCY.to_owned(),
            fencing_token,
            at_ms: now,
        })
    }

    /// One voucher: 404 if there is none.
    pub async fn voucher(&self, id: i64) -> Result<Voucher, AppError> {
        let id = validate::id("voucher id", id)?;
        let row = sqlx::query(&format!(
            "SELECT {VOUCHER_COLUMNS} FROM vouchers WHERE id = $1"
        ))
        .bind(id)
        .fetch_optional(&self.db)
        .await?;
        match row {
            Some(row) => Ok(voucher_from_row(&row)?),
            None => Err(AppError::NotFound(format!("no voucher {id}"))),
        }
    }

    /// Every voucher.
    pub async fn vouchers(&self) -> Result<Vec<Voucher>, AppError> {
        let rows = sqlx::query(&format!(
            "SELECT {VOUCHER_COLUMNS} FROM vouchers ORDER BY id"
        ))
        .fetch_all(&self.db)
        .await?;
        Ok(rows
            .iter()
            .map(voucher_from_row)
            .collect::<Result<_, _>>()?)
    }

    /// Puts a voucher on sale.
    pub async fn create_voucher(&self, new: &NewVoucher) -> Result<Voucher, AppError> {
        let title = validate::text("title", &new.title, validate::MAX_TITLE)?;
        let price = validate::within("price_cents", new.price_cents, 0, validate::MAX_PRICE_CENTS)?;
        let stock = validate::within("stock", new.stock, 0, validate::MAX_STOCK)?;
        let max = validate::MAX_SAFE_INTEGER;
        let begin_at = validate::within("starts_at_ms", new.starts_at_ms, 0, max)?;
        let end_at = validate::within("ends_at_ms", new.ends_at_ms, 0, max)?;
        if end_at <= begin_at {
            return Err(AppError::BadRequest(
                "the sale must end after it begins (ends_at_ms > starts_at_ms)".to_owned(),
            ));
        }
        let id: i64 = sqlx::query(
            "INSERT INTO vouchers (title, price, stock, initial_stock, begin_at, end_at)
             VALUES ($1, $2, $3, $4, $5, $6) RETURNING id",
        )
        .bind(&title)
        .bind(price)
        .bind(stock)
        .bind(stock)
        .bind(begin_at)
        .bind(end_at)
        .fetch_one(&self.db)
        .await?
        .try_get("id")?;
        tracing::info!(voucher = id, stock, "voucher created");
        self.voucher(id).await
    }

    /// The voucher orders of a user, oldest first.
    pub(crate) async fn voucher_orders_of(&self, user: i64) -> Result<Vec<Order>, AppError> {
        let rows = sqlx::query(
            "SELECT o.id AS id, o.user_id AS user_id, o.voucher_id AS voucher_id,
                    v.title AS title, v.price AS price, o.fencing_token AS fencing_token,
                    o.created_at AS created_at
             FROM voucher_orders o JOIN vouchers v ON v.id = o.voucher_id
             WHERE o.user_id = $1 ORDER BY o.id",
        )
        .bind(user)
        .fetch_all(&self.db)
        .await?;
        Ok(rows.iter().map(order_from_row).collect::<Result<_, _>>()?)
    }
}
