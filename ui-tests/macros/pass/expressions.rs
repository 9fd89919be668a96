//! `wait`, `lease`, `at_least` and `on_lost` as constants and expressions, evaluated in the function's scope.
#![deny(warnings)]
// Public items here show that the rewrite keeps a function's visibility; they are not an API.
#![allow(missing_docs, missing_debug_implementations)]

use std::time::Duration;

use dlock_core::{LockError, Locker, OnLost, distributed_lock};

const ORDER_WAIT: Duration = Duration::from_secs(3);
const EXPORT_LEASE: Duration = Duration::from_secs(30);

pub struct Config {
    pub wait: Duration,
    pub lease: Duration,
    pub on_lost: OnLost,
}

#[distributed_lock(key = "order:<id>", wait = ORDER_WAIT, lease = EXPORT_LEASE)]
async fn constants(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

#[distributed_lock(key = "order:<id>", wait = cfg.wait, lease = cfg.lease, on_lost = cfg.on_lost)]
async fn fields(id: u64, cfg: Config) -> Result<u64, LockError> {
    let _ = cfg;
    Ok(id)
}

#[distributed_lock(
    key = "order:<id>",
    wait = Duration::from_millis(wait_ms),
    on_lost = if watch { OnLost::Signal } else { OnLost::Cancel },
)]
async fn arguments(id: u64, wait_ms: u64, watch: bool) -> Result<u64, LockError> {
    let _ = watch;
    Ok(id + wait_ms)
}

#[distributed_lock(key = "order:<id>", wait = *wait, lease = "10s", on_lost = "signal")]
async fn mixed(id: u64, wait: &Duration) -> Result<u64, LockError> {
    Ok(id + wait.as_secs())
}

#[distributed_lock(key = "job:<id>", lease = "1m", at_least = "30s")]
async fn once_per_period(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

#[distributed_lock(key = "job:<id>", at_least = Duration::from_secs(period_s))]
async fn once_per_given_period(id: u64, period_s: u64) -> Result<u64, LockError> {
    Ok(id + period_s)
}

pub struct Service {
    locker: Locker,
    wait: Duration,
    on_lost: OnLost,
}

impl Service {
    #[distributed_lock(key = "svc:<n>", locker = self.locker, wait = self.wait, on_lost = self.on_lost)]
    pub async fn by_ref(&self, n: u32) -> Result<u32, LockError> {
        Ok(n)
    }

    #[distributed_lock(key = "svc:<n>", locker = self.locker.clone(), wait = self.wait * 2)]
    pub async fn by_mut(&mut self, n: u32) -> Result<(), LockError> {
        self.wait += Duration::from_secs(u64::from(n));
        Ok(())
    }
}

fn main() {
    let cfg = Config {
        wait: Duration::ZERO,
        lease: Duration::from_secs(1),
        on_lost: OnLost::default(),
    };
    let _ = (
        constants(1),
        fields(1, cfg),
        arguments(1, 2, true),
        mixed(1, &Duration::ZERO),
        once_per_period(1),
        once_per_given_period(1, 30),
    );
    let _ = |service: Service| async move { service.by_ref(1).await };
}
