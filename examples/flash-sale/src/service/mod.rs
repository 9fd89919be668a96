//! What the shop does, over the database: users, vouchers, carts, checkout, the audit.

mod carts;
mod checkout;
mod stats;
mod vouchers;

use std::collections::HashMap;

use dlock_core::{FencingToken, LockError, LockName};
use dlock_tower::HeldLocks;
use sqlx::Row as _;

use crate::model::User;
use crate::{App, AppError, Counter, validate};

/// The fencing tokens a request holds, by lock name.
#[derive(Debug, Clone, Default)]
pub struct Fences(HashMap<String, i64>);

impl Fences {
    /// The tokens of the locks a `LockLayer` holds for the request, asked for now: a plain
    /// lock's token is minted by Redis at its first ask. Fails with [`LockError::Lost`] if Redis
    /// no longer has one of the holds, and with [`LockError::Backend`] if Redis can't be asked;
    /// either way the request must not write with these locks' authority.
    pub async fn from_held(held: &HeldLocks) -> Result<Self, LockError> {
        let tokens = held.fencing_tokens().await?;
        Ok(Self(
            held.names()
                .iter()
                .cloned()
                .zip(tokens.into_iter().map(db_token))
                .collect(),
        ))
    }

    /// Adds the token of `name`.
    pub fn insert(&mut self, name: &LockName, token: FencingToken) {
        self.0.insert(name.to_string(), db_token(token));
    }

    /// The token of `name`, if the request holds it.
    pub(crate) fn get(&self, name: &LockName) -> Option<i64> {
        self.0.get(name.as_str()).copied()
    }
}

/// A fencing token as the database stores it.
pub(crate) fn db_token(token: FencingToken) -> i64 {
    i64::try_from(token.get()).unwrap_or(i64::MAX)
}

/// The lock name of a SKU: `sku:<id>`.
pub fn sku_lock_name(sku: i64) -> Result<LockName, LockError> {
    LockName::builder().literal("sku:").value(sku).build()
}

/// The lock name of a user's cart: `cart:<user>`. Every cart edit takes it, and so does a
/// checkout: what decides which SKUs a checkout locks.
pub fn cart_lock_name(user: i64) -> Result<LockName, LockError> {
    LockName::builder().literal("cart:").value(user).build()
}

impl App {
    /// A refused fenced write: counted, and answered 409.
    pub(crate) fn stale(&self, what: &str) -> AppError {
        self.counters.bump(Counter::StaleRefused);
        crate::metrics::stale_refused();
        tracing::warn!(what, "stale fencing token: write refused");
        AppError::Stale(format!(
            "{what}: a newer holder of its lock has been there (stale fencing token); nothing \
             was written"
        ))
    }

    /// Logs in as `name`: the user called so, created on first login.
    pub async fn login(&self, name: &str) -> Result<User, AppError> {
        let name = validate::text("name", name, validate::MAX_USER_NAME)?;
        sqlx::query("INSERT INTO users (name) VALUES ($1) ON CONFLICT (name) DO NOTHING")
            .bind(&name)
            .execute(&self.db)
            .await?;
        let id: i64 = sqlx::query("SELECT id FROM users WHERE name = $1")
            .bind(&name)
            .fetch_one(&self.db)
            .await?
            .try_get("id")?;
        tracing::info!(user = id, "login");
        Ok(User { id, name })
    }

    /// The user `id`: 404 if there is none.
    pub async fn user(&self, id: i64) -> Result<User, AppError> {
        let id = validate::id("user id", id)?;
        let row = sqlx::query("SELECT id, name FROM users WHERE id = $1")
            .bind(id)
            .fetch_optional(&self.db)
            .await?;
        match row {
            Some(row) => Ok(User {
                id: row.try_get("id")?,
                name: row.try_get("name")?,
            }),
            None => Err(AppError::NotFound(format!(
                "no user {id}: log in first (POST /api/login)"
            ))),
        }
    }
}

#[cfg(test)]
mod tests;
