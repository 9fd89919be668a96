//! Every function shape the attribute supports.
#![deny(warnings)]
// Public items here show that the rewrite keeps a function's visibility; they are not an API.
#![allow(missing_docs, missing_debug_implementations)]

use std::fmt::Display;

use dlock_core::{LockError, Locker, distributed_lock};

#[derive(Debug)]
pub enum AppError {
    Lock(LockError),
    Other,
}

impl From<LockError> for AppError {
    fn from(err: LockError) -> Self {
        AppError::Lock(err)
    }
}

pub struct Order {
    pub user: User,
    pub id: u64,
}

pub struct User {
    pub id: u64,
}

/// Docs, visibility and `#[must_use]` are kept.
#[must_use]
#[distributed_lock(key = "order:<user_id>:<voucher_id>", wait = "3s")]
pub async fn free_function(user_id: u64, voucher_id: u64) -> Result<u64, AppError> {
    if user_id == 0 {
        return Err(AppError::Other);
    }
    // Minted by Redis at the first ask: a lost hold or an unreachable Redis is an error.
    let token = dlock_core::scope::fencing_token().await?.get();
    Ok(voucher_id + token)
}

#[distributed_lock(key = "order:<order.user.id>:<order.id>", lease = "1m30s")]
async fn field_paths(order: &Order) -> Result<u64, AppError> {
    Ok(order.id)
}

#[distributed_lock(key = "item:<item>", wait = "250ms")]
async fn generic<T: Display + Send + Sync>(item: T) -> Result<String, LockError> {
    Ok(item.to_string())
}

#[distributed_lock(key = "item:<item>")]
async fn impl_trait(item: impl Display + Send + Sync) -> Result<String, LockError> {
    Ok(item.to_string())
}

#[distributed_lock(key = "pair:<a>:<b>")]
async fn destructured((a, b): (u64, u64)) -> Result<u64, LockError> {
    Ok(a + b)
}

#[distributed_lock(key = "sku:<skus*>", key = "cart:<user>", on_lost = "signal")]
async fn collections(user: u64, skus: Vec<String>) -> Result<usize, LockError> {
    let _ = user;
    Ok(skus.len())
}

#[distributed_lock(key = "io:<n>", reentrant = false)]
async fn std_io_result(n: u32) -> std::io::Result<u32> {
    Ok(n)
}

#[distributed_lock(key = "boxed:<n>")]
async fn boxed_error(n: u32) -> Result<u32, Box<dyn std::error::Error + Send + Sync>> {
    Ok(n)
}

pub struct Service {
    locker: Locker,
    name: String,
}

impl Service {
    #[distributed_lock(key = "svc:<self.name>", locker = self.locker)]
    pub async fn by_ref(&self) -> Result<usize, LockError> {
        Ok(self.name.len())
    }

    #[distributed_lock(key = "svc:<self.name>:<n>", locker = self.locker.clone())]
    pub async fn by_mut(&mut self, n: u32) -> Result<(), LockError> {
        self.name.push_str(&n.to_string());
        Ok(())
    }
}

pub trait Repository {
    fn save(&self, id: u64) -> impl std::future::Future<Output = Result<u64, LockError>> + Send;
}

impl Repository for Service {
    #[distributed_lock(key = "repo:<id>", locker = &self.locker, crate = "::dlock_core")]
    async fn save(&self, id: u64) -> Result<u64, LockError> {
        Ok(id)
    }
}

fn main() {
    let _ = (
        free_function(1, 2),
        field_paths,
        generic::<u8>,
        impl_trait(3),
        destructured((1, 2)),
        collections(1, vec![]),
        std_io_result(1),
        boxed_error(1),
    );
}
