//! The generated code is lint-clean.
//!
//! Every argument and every supported function shape is used below under `deny` of rustc's
//! warnings and clippy's `all`, `pedantic` and `nursery` groups. `cargo clippy --all-targets --
//! -D warnings` (run in CI) lints this file, so a lint that fires on an expansion fails the build;
//! the test itself only checks that the expansions run (over the in-memory backend).
#![deny(warnings, clippy::all, clippy::pedantic, clippy::nursery)]
// Lock-guarded functions are async by definition, even when their bodies never await.
#![allow(clippy::unused_async)]

use std::collections::BTreeSet;
use std::fmt::Display;
use std::sync::Arc;
use std::time::Duration;

use dlock_core::{LockError, Locker, OnLost, distributed_lock};

#[derive(Debug)]
enum AppError {
    Lock(LockError),
    Empty,
}

impl From<LockError> for AppError {
    fn from(err: LockError) -> Self {
        Self::Lock(err)
    }
}

/// Docs and `#[must_use]` are kept.
#[must_use = "the order id"]
#[distributed_lock(key = "order:<user_id>:<voucher_id>", wait = "1s", lease = "10s")]
async fn create_order(user_id: u64, voucher_id: u64) -> Result<u64, AppError> {
    if voucher_id == 0 {
        return Err(AppError::Empty);
    }
    Ok(user_id * 1000 + voucher_id)
}

#[distributed_lock(
    key = "item:<item>",
    wait = "1m30s",
    on_lost = "signal",
    reentrant = false
)]
async fn generic<T: Display + Send + Sync>(item: T) -> Result<String, LockError> {
    let held = dlock_core::scope::held_lock().ok_or_else(|| LockError::Config("no lock".into()))?;
    assert!(!held.is_lost());
    Ok(item.to_string())
}

#[distributed_lock(key = "item:<item>")]
async fn impl_trait(item: impl Display + Send) -> Result<String, LockError> {
    Ok(item.to_string())
}

#[distributed_lock(key = "pair:<a>:<b>")]
async fn destructured((a, b): (u64, u64)) -> Result<u64, LockError> {
    Ok(a + b)
}

#[distributed_lock(key = "sku:<skus*>", key = "cart:<user>", locker = locker, wait = "250ms")]
async fn checkout(
    locker: Arc<Locker>,
    user: u64,
    skus: &BTreeSet<String>,
) -> Result<usize, AppError> {
    let _ = user;
    Ok(skus.len())
}

#[distributed_lock(key = "io:<n>", locker = locker, crate = "::dlock_core")]
async fn io_result(locker: &Locker, n: u32) -> std::io::Result<u32> {
    Ok(n)
}

const ORDER_WAIT: Duration = Duration::from_secs(1);

#[distributed_lock(
    key = "expr:<n>",
    locker = locker,
    wait = ORDER_WAIT,
    lease = Duration::from_secs(u64::from(n)) + Duration::from_secs(10),
    on_lost = policy
)]
async fn expressions(locker: &Locker, n: u32, policy: OnLost) -> Result<u32, LockError> {
    Ok(n)
}

#[distributed_lock(key = "opaque:<n>", locker = locker)]
async fn opaque(locker: &Locker, n: u32) -> Result<impl Display, LockError> {
    Ok(n)
}

struct Shop {
    locker: Locker,
    name: String,
    wait: Duration,
}

impl Shop {
    #[distributed_lock(key = "shop:<self.name>", locker = self.locker, wait = self.wait)]
    async fn by_ref(&self) -> Result<usize, LockError> {
        Ok(self.name.len())
    }

    #[distributed_lock(key = "shop:<self.name>:<n>", locker = self.locker.clone())]
    async fn by_mut(&mut self, n: u32) -> Result<(), LockError> {
        self.name.push_str(&n.to_string());
        Ok(())
    }
}

trait Repository {
    fn save(&self, id: u64) -> impl Future<Output = Result<u64, LockError>> + Send;
}

impl Repository for Shop {
    #[distributed_lock(key = "repo:<id>", locker = &self.locker)]
    async fn save(&self, id: u64) -> Result<u64, LockError> {
        Ok(id)
    }
}

#[test]
fn the_expansions_run() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let locker = Locker::memory();
        // No default locker is installed in this test binary: a configuration error.
        assert!(matches!(
            create_order(1, 2).await,
            Err(AppError::Lock(err)) if err.is_config()
        ));
        assert!(generic(1).await.is_err());
        assert!(impl_trait(1).await.is_err());
        assert!(destructured((1, 2)).await.is_err());

        let skus: BTreeSet<String> = ["a", "b"].into_iter().map(String::from).collect();
        assert_eq!(
            checkout(Arc::new(locker.clone()), 7, &skus).await.ok(),
            Some(2)
        );
        assert_eq!(io_result(&locker, 3).await.ok(), Some(3));
        assert_eq!(expressions(&locker, 5, OnLost::Signal).await.ok(), Some(5));
        assert_eq!(
            opaque(&locker, 4).await.ok().map(|n| n.to_string()),
            Some("4".to_owned())
        );

        let mut shop = Shop {
            locker,
            name: "north".to_owned(),
            wait: Duration::ZERO,
        };
        assert_eq!(shop.by_ref().await.ok(), Some(5));
        assert!(shop.by_mut(1).await.is_ok());
        assert_eq!(shop.name, "north1");
        assert_eq!(shop.save(9).await.ok(), Some(9));
    });
}
